/* placeholder: a llama.cpp tree has ggml/include/ggml.h */
