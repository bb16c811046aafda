/* A llama.h of before the llama_memory_* API (crate llama-cpp-sys-2 0.1.108 and older): the
 * shim cannot drive it, and kvaudit says so before building anything. */
#define LLAMA_STATE_SEQ_VERSION 2
LLAMA_API void llama_kv_self_seq_cp(struct llama_context * ctx, int src, int dst, int p0, int p1);
