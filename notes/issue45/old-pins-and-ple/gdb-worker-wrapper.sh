#!/bin/sh
exec gdb -q -batch -nx -x /tmp/h6/gdb/cmds --args /tmp/h6/bin/kvaudit-llama-worker "$@" 2>>/tmp/h6/gdb/gdb.err
