#!/bin/sh
# build.sh BUILD_DIR SRC OUT
B=$1; S=$2; O=$3
cc -std=gnu11 -O2 -Wall -I $B/include -DNDEBUG -c $S -o $O.o && c++ $O.o $B/libllama_all.a -lpthread -lm -fopenmp -o $O && rm -f $O.o
