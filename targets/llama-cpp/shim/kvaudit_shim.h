/*
 * kvaudit_shim.h: a small flat C ABI over llama.h, one build per llama.cpp pin.
 *
 * Why a shim: `llama_model_params` is passed by value and differs in size between pins
 * (0.1.161 adds `lazy_mode`), so binding llama.h's structs from Rust would tie kvaudit to one
 * version. This shim is compiled against each pin's own llama.h and linked with that pin's
 * static llama + ggml objects into one `libkvaudit_shim.so` that exports only the
 * `kvaudit_shim_*` symbols below; two pins' shims therefore load side by side in one process.
 *
 * Conventions
 * - Everything here is plain C: fixed-width integers, opaque handle, caller-owned buffers.
 * - Functions that can fail return an int status: 0 (or a count) on success, a negative
 *   KVAUDIT_SHIM_E_* on failure of the shim itself. `kvaudit_shim_decode` returns
 *   llama_decode's own return code unchanged (0, 1, 2, -1, -2, -3, ...), and only uses
 *   KVAUDIT_SHIM_E_* (all <= -1000) for failures that never reached llama_decode.
 * - No C++ exception escapes: kvaudit_shim.c is compiled as C++ (it is also valid C) and
 *   every entry point catches everything; a caught exception becomes KVAUDIT_SHIM_E_EXCEPTION.
 * - The shim never aborts by itself. llama.cpp does, on GGML_ASSERT (and on `assert` in
 *   builds without NDEBUG): callers that must survive that run the shim in a child process.
 *   Set the environment variable GGML_NO_BACKTRACE=1 in that process, otherwise ggml's abort
 *   handler tries to attach gdb/lldb to print a backtrace. That is the caller's business.
 * - llama.cpp and ggml logging is silenced (llama_log_set with a callback that prints nothing).
 *   Error-level messages logged on the calling thread during the last shim call are kept and
 *   can be read with kvaudit_shim_last_error (e.g. "inconsistent sequence positions" after
 *   a failing decode). With KVAUDIT_SHIM_LOG=1 in the environment at the first
 *   kvaudit_shim_open, all log text also goes to stderr.
 * - Seq ids and positions are passed to llama.cpp as given, without validation: negative seq
 *   ids in seq_cp/keep/add/div/pos_min/pos_max and seq_div with d = 0 abort inside llama.cpp
 *   (see LLAMA-FACTS "Aborts reachable from the public API"). Checking them is the caller's
 *   choice, not the shim's, so that the shim reports llama.cpp's behaviour and not its own.
 */
#ifndef KVAUDIT_SHIM_H
#define KVAUDIT_SHIM_H

#include <stddef.h>
#include <stdint.h>

/* Bump when any signature, struct or meaning below changes. Checked by src/llama/ffi.rs. */
#define KVAUDIT_SHIM_ABI 5

#define KVAUDIT_SHIM_OK 0
/* A NULL handle, or a NULL pointer where data is required. */
#define KVAUDIT_SHIM_E_NULL (-1001)
/* llama.cpp threw a C++ exception; the shim caught it. */
#define KVAUDIT_SHIM_E_EXCEPTION (-1002)
/* The caller's buffer is smaller than the data. */
#define KVAUDIT_SHIM_E_BUFFER (-1003)
/* llama.cpp returned NULL (or 0 bytes) where data was expected; see kvaudit_shim_last_error. */
#define KVAUDIT_SHIM_E_LLAMA (-1004)
/* Out of memory in the shim itself. */
#define KVAUDIT_SHIM_E_NOMEM (-1005)

#if defined(__GNUC__)
#define KVAUDIT_SHIM_API __attribute__((visibility("default")))
#else
#define KVAUDIT_SHIM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One context setting: a key as kvaudit names it (src/base/setting.rs, the one list of
 * settings) and its value. kvaudit_shim_open applies an array of them to
 * llama_context_default_params() one by one; a key not listed here fails the open.
 *   n_ctx       context size (0 = from the model; llama.cpp pads it to a multiple of 256)
 *   n_seq_max   number of sequences; seq ids 0..n_seq_max-1
 *   n_batch     logical batch size
 *   n_ubatch    physical batch size
 *   n_threads   sets n_threads and n_threads_batch
 *   kv_unified  bool: one KV stream shared by all sequences
 *   swa_full    bool: full-size SWA cache
 *   flash_attn  bool: flash attention on (LLAMA_FLASH_ATTN_TYPE_ENABLED) or off (_DISABLED)
 *   type_k      enum ggml_type of the K cache
 *   type_v      enum ggml_type of the V cache
 *   n_rs_seq    recurrent-state snapshots per sequence (rollback)
 *   embd_input  bool: kvaudit_shim_decode feeds embeddings (llama_batch.embd, n_embd floats
 *               per token, a fixed function of the token id) instead of token ids; not a
 *               context parameter
 * A setting not given keeps llama.cpp's default. The key must stay valid during the call only. */
typedef struct kvaudit_shim_setting {
    const char *key;
    int64_t value;
} kvaudit_shim_setting;

/* One loaded model with one context. Opaque. */
typedef struct kvaudit_shim kvaudit_shim;

/* KVAUDIT_SHIM_ABI of the compiled shim. */
KVAUDIT_SHIM_API int kvaudit_shim_abi_version(void);

/* The pin label this shim was built for, e.g. "llama.cpp@0.1.156+assert" (static string). */
KVAUDIT_SHIM_API const char *kvaudit_shim_version(void);

/* LLAMA_STATE_SEQ_VERSION of the llama.h the shim was compiled against. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_state_seq_format(void);

/* 1 if the shim was compiled without NDEBUG (the "+assert" variant), else 0. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_assertions_enabled(void);

/* Loads the model (CPU only) and creates a context with the n_settings settings. On failure
 * returns NULL and writes a NUL-terminated reason into err (at most err_cap bytes, may be
 * NULL); an unknown key or a value out of its field's range is such a failure. */
KVAUDIT_SHIM_API kvaudit_shim *kvaudit_shim_open(const char *model_path,
                                                 const kvaudit_shim_setting *settings,
                                                 size_t n_settings, char *err, size_t err_cap);

/* The value a setting has in the open context, read back through llama.h where llama.h can
 * tell (n_ctx: llama_n_ctx, n_seq_max: llama_n_seq_max, n_batch: llama_n_batch, n_ubatch:
 * llama_n_ubatch, n_threads: llama_n_threads), else as the shim passed it to
 * llama_init_from_model (kv_unified, swa_full, flash_attn: 1 when enabled, type_k, type_v),
 * or as the shim keeps it (embd_input), into *out. Returns KVAUDIT_SHIM_OK, or
 * KVAUDIT_SHIM_E_LLAMA for an unknown key. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_setting_value(kvaudit_shim *h, const char *key,
                                                    int64_t *out);

/* The model's general.architecture (llama_model_meta_val_str) as a NUL-terminated string of at
 * most cap bytes in buf; returns its full length, or KVAUDIT_SHIM_E_LLAMA if it has none. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_model_arch(kvaudit_shim *h, char *buf, size_t cap);

/* What llama_init_from_model logged at info level about the memory it allocated, as it
 * logged it: the lines holding " cells" or "KV cache" (each cache's "size = X MiB (N cells,
 * L layers, S/T seqs)", a recurrent memory's "(N cells, L layers, S seqs ...)", the composite
 * memories' "creating ... KV cache, size = N cells"), at most 4095 bytes. Written into buf as
 * a NUL-terminated string of at most cap bytes; returns its full length. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_memory_log(kvaudit_shim *h, char *buf, size_t cap);

/* Frees the context and the model. NULL is a no-op. */
KVAUDIT_SHIM_API void kvaudit_shim_close(kvaudit_shim *h);

/* One llama_decode of n_tokens tokens. Token i belongs to the n_seq_id[i] sequences
 * seq_ids_flat[o_i .. o_i + n_seq_id[i]) with o_i = n_seq_id[0] + ... + n_seq_id[i-1].
 * pos may be NULL: llama.cpp's batch allocator then picks positions from seq_pos_max + 1.
 * n_seq_id and seq_ids_flat may both be NULL: every token goes to sequence 0.
 * logits_last != 0 requests logits for the last token only, 0 requests none.
 * Returns llama_decode's return code. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_decode(kvaudit_shim *h, int32_t n_tokens,
                                             const int32_t *tokens, const int32_t *pos,
                                             const int32_t *n_seq_id, const int32_t *seq_ids_flat,
                                             int32_t logits_last);

/* The memory operations, on llama_get_memory(ctx). p0 < 0: from 0; p1 < 0: to infinity. */
/* llama_memory_seq_rm: returns 1 (true) or 0 (false), or a KVAUDIT_SHIM_E_*. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_rm(kvaudit_shim *h, int32_t seq_id, int32_t p0,
                                             int32_t p1);
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_cp(kvaudit_shim *h, int32_t seq_id_src,
                                             int32_t seq_id_dst, int32_t p0, int32_t p1);
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_keep(kvaudit_shim *h, int32_t seq_id);
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_add(kvaudit_shim *h, int32_t seq_id, int32_t p0,
                                              int32_t p1, int32_t delta);
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_div(kvaudit_shim *h, int32_t seq_id, int32_t p0,
                                              int32_t p1, int32_t d);
/* llama_memory_clear(mem, data != 0). */
KVAUDIT_SHIM_API int32_t kvaudit_shim_clear(kvaudit_shim *h, int32_t data);

/* llama_memory_seq_pos_min/max into *out (-1 when the sequence is empty). */
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_pos_min(kvaudit_shim *h, int32_t seq_id, int32_t *out);
KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_pos_max(kvaudit_shim *h, int32_t seq_id, int32_t *out);

/* llama_state_seq_get_size / llama_state_seq_get_data: bytes, or KVAUDIT_SHIM_E_*.
 * state_seq_get writes at most cap bytes and returns the number written (0: llama.cpp failed). */
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_size(kvaudit_shim *h, int32_t seq_id);
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_get(kvaudit_shim *h, int32_t seq_id, uint8_t *buf,
                                                    size_t cap);

/* llama_state_seq_set_data: loads a per-sequence state (from kvaudit_shim_state_seq_get, or
 * any bytes) into seq_id. Returns the number of bytes llama.cpp read (0: it rejected the data;
 * llama.cpp may have changed the cache before rejecting), or KVAUDIT_SHIM_E_*. */
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_set(kvaudit_shim *h, int32_t seq_id,
                                                    const uint8_t *buf, size_t len);

/* The same three with llama_state_seq_flags (LLAMA_STATE_SEQ_FLAGS_*: 1 SWA_ONLY /
 * PARTIAL_ONLY, 2 ON_DEVICE), over llama_state_seq_get_size_ext / get_data_ext /
 * set_data_ext. flags are passed to llama.cpp as given. */
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_size_ext(kvaudit_shim *h, int32_t seq_id,
                                                         uint32_t flags);
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_get_ext(kvaudit_shim *h, int32_t seq_id,
                                                        uint8_t *buf, size_t cap, uint32_t flags);
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_set_ext(kvaudit_shim *h, int32_t seq_id,
                                                        const uint8_t *buf, size_t len,
                                                        uint32_t flags);

/* The context's actual sizes, after llama.cpp's padding and clamping: llama_n_ctx,
 * llama_n_seq_max, llama_n_batch, llama_n_ubatch. Values, or KVAUDIT_SHIM_E_*. */
KVAUDIT_SHIM_API int64_t kvaudit_shim_n_ctx(kvaudit_shim *h);
KVAUDIT_SHIM_API int64_t kvaudit_shim_n_seq_max(kvaudit_shim *h);
KVAUDIT_SHIM_API int64_t kvaudit_shim_n_batch(kvaudit_shim *h);
KVAUDIT_SHIM_API int64_t kvaudit_shim_n_ubatch(kvaudit_shim *h);

/* Full context state: llama_state_get_size / llama_state_get_data / llama_state_set_data.
 * state_set returns the number of bytes llama.cpp read (0: it rejected the data). */
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_size(kvaudit_shim *h);
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_get(kvaudit_shim *h, uint8_t *buf, size_t cap);
KVAUDIT_SHIM_API int64_t kvaudit_shim_state_set(kvaudit_shim *h, const uint8_t *buf, size_t len);

/* llama_vocab_n_tokens of the model's vocabulary. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_n_vocab(kvaudit_shim *h);

/* Copies llama_get_logits_ith(ctx, i) (i = -1: the last output) into out, which must hold
 * n_vocab floats. Returns n_vocab, KVAUDIT_SHIM_E_LLAMA if llama.cpp has no such output, or
 * KVAUDIT_SHIM_E_BUFFER if cap < n_vocab. */
KVAUDIT_SHIM_API int32_t kvaudit_shim_get_logits_ith(kvaudit_shim *h, int32_t i, float *out,
                                                     int32_t cap);

/* Error-level log text llama.cpp or ggml emitted on this thread during the last shim call
 * (plus the shim's own notes, e.g. a caught exception). Writes a NUL-terminated copy of at
 * most cap bytes into buf and returns the full length (0: nothing was logged). */
KVAUDIT_SHIM_API size_t kvaudit_shim_last_error(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KVAUDIT_SHIM_H */
