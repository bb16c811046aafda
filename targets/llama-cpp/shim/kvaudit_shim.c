/*
 * kvaudit_shim.c: the implementation of kvaudit_shim.h over one pin's llama.h.
 *
 * Valid C and valid C++. src/llama/build.rs compiles it as C++ (`-x c++`), so the SHIM_TRY /
 * SHIM_CATCH guards below turn any exception thrown inside llama.cpp into an error code
 * instead of unwinding into the Rust caller. It must compile unchanged against the llama.h of
 * every pin in pins.toml: use only API that all of them have (llama_model_load_from_file,
 * llama_init_from_model, llama_memory_*, llama_state_*), and set struct fields by name after
 * llama_*_default_params() so that added fields keep their defaults.
 *
 * Compile-time input: KVAUDIT_SHIM_PIN, the pin label as a string literal
 * (-DKVAUDIT_SHIM_PIN="\"llama.cpp@0.1.156\""), and KVAUDIT_SHIM_NO_KV_UNIFIED when the tree's
 * llama_context_params has no kv_unified field (crate versions before 0.1.113, whose cache has
 * one stream for every sequence: src/targets/llama/tree.rs reads it from llama.h).
 *
 * Older API, adapted here (docs/versions.md): before crate 0.1.122 llama.h has `bool flash_attn`
 * instead of `enum llama_flash_attn_type flash_attn_type`, and no llama_state_seq_flags nor the
 * *_ext state functions; LLAMA_STATE_SEQ_FLAGS_SWA_ONLY, which came with both, tells them apart.
 */
#include "kvaudit_shim.h"

#include "llama.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KVAUDIT_SHIM_PIN
#define KVAUDIT_SHIM_PIN "llama.cpp@unknown"
#endif

#ifdef LLAMA_STATE_SEQ_FLAGS_SWA_ONLY
#define SHIM_HAS_STATE_SEQ_FLAGS 1
#else
#define SHIM_HAS_STATE_SEQ_FLAGS 0
#endif

#ifdef __cplusplus
#define SHIM_TRY try {
#define SHIM_CATCH(on_exception)                                                                   \
    }                                                                                              \
    catch (...) {                                                                                  \
        shim_note("kvaudit_shim: caught a C++ exception from llama.cpp\n");                        \
        on_exception;                                                                              \
    }
#else
#define SHIM_TRY {
#define SHIM_CATCH(on_exception) }
#endif

struct kvaudit_shim {
    struct llama_model *model;
    struct llama_context *ctx;
    llama_memory_t mem;
    int32_t n_vocab;
    /* What the context was made with, for kvaudit_shim_setting_value. */
    struct llama_context_params cparams;
    /* The setting embd_input: decodes feed llama_batch.embd (shim_token_embd of each token,
     * n_embd floats) instead of token ids; 0 when off. */
    int32_t n_embd_input;
    /* What llama_init_from_model logged about the memory it allocated (see
     * kvaudit_shim_memory_log); NUL-terminated, may be empty. */
    char *memory_log;
};

/* What a decode with embd_input feeds for token t at element d: small values, exact in float,
 * the same in the C reproducer's prelude (src/outputs/c_repro/prelude.rs, token_embd), so that a
 * program replays the very batch. */
static float shim_token_embd(int32_t t, int32_t d) {
    return (float)(((uint32_t)t * 131u + (uint32_t)d * 7u) % 17u) / 8.0f - 1.0f;
}

/* ---- log capture -------------------------------------------------------------------------- */

/* Error-level text logged on this thread since the last shim call. Thread-local so that two
 * contexts driven from two threads do not mix their messages. */
#define SHIM_ERR_CAP 4096
static __thread char shim_err[SHIM_ERR_CAP];
static __thread size_t shim_err_len;
static __thread int shim_last_level_was_error;

static int shim_log_to_stderr;

/* The memory's allocation lines logged while kvaudit_shim_open creates the context: llama.h
 * has no C call that says what the memory allocated (llama_memory_breakdown_print rounds to
 * whole MiB, and llama_get_memory_breakdown is C++), so the shim keeps the info-level lines of
 * the memory's constructors, "... KV cache ..." and "size = ... (N cells, L layers, ...)".
 * Thread-local as shim_err is. */
#define SHIM_MEMLOG_CAP 4096
static __thread char shim_memlog[SHIM_MEMLOG_CAP];
static __thread size_t shim_memlog_len;
static __thread int shim_memlog_on;

/* Appends text to the NUL-terminated buf of cap bytes, *len of them used, cutting what does
 * not fit. */
static void shim_append(char *buf, size_t *len, size_t cap, const char *text) {
    size_t n = strlen(text);
    size_t room = cap - 1 - *len;
    if (n > room) {
        n = room;
    }
    memcpy(buf + *len, text, n);
    *len += n;
    buf[*len] = '\0';
}

static void shim_memlog_note(const char *text) {
    if (strstr(text, " cells") != NULL || strstr(text, "KV cache") != NULL) {
        shim_append(shim_memlog, &shim_memlog_len, SHIM_MEMLOG_CAP, text);
    }
}

static void shim_note(const char *text) {
    shim_append(shim_err, &shim_err_len, SHIM_ERR_CAP, text);
}

static void shim_clear_error(void) {
    shim_err_len = 0;
    shim_err[0] = '\0';
    shim_last_level_was_error = 0;
}

static void shim_log(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    if (text == NULL) {
        return;
    }
    if (shim_log_to_stderr) {
        fputs(text, stderr);
    }
    if (shim_memlog_on && level == GGML_LOG_LEVEL_INFO) {
        shim_memlog_note(text);
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        shim_last_level_was_error = 1;
        shim_note(text);
    } else if (level == GGML_LOG_LEVEL_CONT) {
        if (shim_last_level_was_error) {
            shim_note(text);
        }
    } else {
        shim_last_level_was_error = 0;
    }
}

static pthread_once_t shim_once = PTHREAD_ONCE_INIT;

/* A test hook (KVAUDIT_TEST_SHIM_OVERFLOW set): each decode writes one byte past an 8-byte heap
 * block, the positive control of +asan. glibc's block holds 24 usable bytes, so a release build
 * corrupts nothing and carries on; AddressSanitizer reports a heap-buffer-overflow here. */
static int shim_test_overflow = 0;

static void shim_test_overflow_write(void) {
    volatile unsigned char *block = (volatile unsigned char *)malloc(8);
    if (block != NULL) {
        block[8] = 1;
        free((void *)block);
    }
}

static void shim_init_once(void) {
    const char *env = getenv("KVAUDIT_SHIM_LOG");
    shim_log_to_stderr = env != NULL && env[0] != '\0' && strcmp(env, "0") != 0;
    shim_test_overflow = getenv("KVAUDIT_TEST_SHIM_OVERFLOW") != NULL;
    /* llama_log_set also calls ggml_log_set: one call silences both. */
    llama_log_set(shim_log, NULL);
    llama_backend_init();
}

static void shim_copy_error(char *err, size_t err_cap, const char *fallback) {
    if (err == NULL || err_cap == 0) {
        return;
    }
    const char *src = shim_err_len > 0 ? shim_err : fallback;
    size_t n = strlen(src);
    if (n >= err_cap) {
        n = err_cap - 1;
    }
    memcpy(err, src, n);
    err[n] = '\0';
}

/* ---- identity ----------------------------------------------------------------------------- */

KVAUDIT_SHIM_API int kvaudit_shim_abi_version(void) { return KVAUDIT_SHIM_ABI; }

KVAUDIT_SHIM_API const char *kvaudit_shim_version(void) { return KVAUDIT_SHIM_PIN; }

KVAUDIT_SHIM_API int32_t kvaudit_shim_state_seq_format(void) { return LLAMA_STATE_SEQ_VERSION; }

KVAUDIT_SHIM_API int32_t kvaudit_shim_assertions_enabled(void) {
#ifdef NDEBUG
    return 0;
#else
    return 1;
#endif
}

/* ---- lifetime ----------------------------------------------------------------------------- */

/* Applies one setting to cparams: the one place each key of src/base/setting.rs meets its
 * llama_context_params field. Returns 0, or 1 with a reason in err for a key this shim does not
 * know or a value its field cannot hold. */
static int shim_apply_setting(struct llama_context_params *cparams, int32_t *embd_input,
                              const kvaudit_shim_setting *s, char *err, size_t err_cap) {
    const char *k = s->key;
    int64_t v = s->value;
    char why[256];
    if (k == NULL) {
        shim_copy_error(err, err_cap, "kvaudit_shim_open: a setting without a key");
        return 1;
    }
    if (v < INT32_MIN || v > (int64_t)UINT32_MAX) {
        snprintf(why, sizeof why, "kvaudit_shim_open: setting %s = %lld is out of range", k,
                 (long long)v);
        shim_copy_error(err, err_cap, why);
        return 1;
    }
    if (strcmp(k, "n_ctx") == 0) {
        cparams->n_ctx = (uint32_t)v;
    } else if (strcmp(k, "n_seq_max") == 0) {
        cparams->n_seq_max = (uint32_t)v;
    } else if (strcmp(k, "n_batch") == 0) {
        cparams->n_batch = (uint32_t)v;
    } else if (strcmp(k, "n_ubatch") == 0) {
        cparams->n_ubatch = (uint32_t)v;
    } else if (strcmp(k, "n_threads") == 0) {
        cparams->n_threads = (int32_t)v;
        cparams->n_threads_batch = (int32_t)v;
    } else if (strcmp(k, "kv_unified") == 0) {
#ifdef KVAUDIT_SHIM_NO_KV_UNIFIED
        /* One stream for every sequence is all this llama.cpp has: a request for a stream per
         * sequence is refused as llama_init_from_model would refuse it (an unsupported setup). */
        if (v == 0) {
            shim_copy_error(err, err_cap,
                            "llama_init_from_model: kv_unified = false (a stream per sequence) is "
                            "not in this llama.cpp version, whose cache is always unified");
            return 1;
        }
#else
        cparams->kv_unified = v != 0;
#endif
    } else if (strcmp(k, "swa_full") == 0) {
        cparams->swa_full = v != 0;
    } else if (strcmp(k, "n_rs_seq") == 0) {
#ifdef KVAUDIT_SHIM_NO_RS_SEQ
        /* No recurrent rollback in this llama.cpp: a request for it is refused as an unsupported
         * setup (the name says llama_init_from_model so that the target reads it as one). */
        if (v != 0) {
            shim_copy_error(err, err_cap,
                            "llama_init_from_model: n_rs_seq (recurrent rollback) is not in this "
                            "llama.cpp version's llama_context_params");
            return 1;
        }
#else
        cparams->n_rs_seq = (uint32_t)v;
#endif
    } else if (strcmp(k, "flash_attn") == 0) {
#if SHIM_HAS_STATE_SEQ_FLAGS
        cparams->flash_attn_type = v != 0 ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
#else
        /* A bool before llama_flash_attn_type. */
        cparams->flash_attn = v != 0;
#endif
    } else if (strcmp(k, "embd_input") == 0) {
        /* Not a context parameter: how kvaudit_shim_decode fills its batches. */
        *embd_input = v != 0;
    } else if (strcmp(k, "type_k") == 0) {
        cparams->type_k = (enum ggml_type)v;
    } else if (strcmp(k, "type_v") == 0) {
        cparams->type_v = (enum ggml_type)v;
    } else {
        snprintf(why, sizeof why, "kvaudit_shim_open: unknown setting %.64s", k);
        shim_copy_error(err, err_cap, why);
        return 1;
    }
    return 0;
}

KVAUDIT_SHIM_API kvaudit_shim *kvaudit_shim_open(const char *model_path,
                                                 const kvaudit_shim_setting *settings,
                                                 size_t n_settings, char *err, size_t err_cap) {
    pthread_once(&shim_once, shim_init_once);
    shim_clear_error();
    if (model_path == NULL || (settings == NULL && n_settings > 0)) {
        shim_copy_error(err, err_cap, "kvaudit_shim_open: model_path and settings must not be NULL");
        return NULL;
    }
    kvaudit_shim *h = NULL;
    SHIM_TRY
    struct llama_context_params cparams = llama_context_default_params();
    int32_t embd_input = 0;
    for (size_t i = 0; i < n_settings; i++) {
        if (shim_apply_setting(&cparams, &embd_input, &settings[i], err, err_cap) != 0) {
            return NULL;
        }
    }

    struct llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;

    struct llama_model *model = llama_model_load_from_file(model_path, mparams);
    if (model == NULL) {
        shim_copy_error(err, err_cap, "llama_model_load_from_file returned NULL");
        return NULL;
    }

    cparams.no_perf = true;

    shim_memlog_len = 0;
    shim_memlog[0] = '\0';
    shim_memlog_on = 1;
    struct llama_context *ctx = llama_init_from_model(model, cparams);
    shim_memlog_on = 0;
    if (ctx == NULL) {
        shim_copy_error(err, err_cap, "llama_init_from_model returned NULL");
        llama_model_free(model);
        return NULL;
    }
#ifndef KVAUDIT_SHIM_NO_RS_SEQ
    /* llama_init_from_model clamps n_rs_seq to 0 for an architecture without recurrent rollback
     * (src/llama-context.cpp: llm_arch_supports_rs_rollback) and says so only at debug level: a
     * setting that does not reach the context is an unsupported setup, not a silent one. */
    if (llama_n_rs_seq(ctx) != cparams.n_rs_seq) {
        char why[256];
        snprintf(why, sizeof why,
                 "llama_init_from_model: n_rs_seq = %u requested, the context has %u (this "
                 "architecture has no recurrent rollback)",
                 (unsigned)cparams.n_rs_seq, (unsigned)llama_n_rs_seq(ctx));
        shim_copy_error(err, err_cap, why);
        llama_free(ctx);
        llama_model_free(model);
        return NULL;
    }
#endif

    h = (kvaudit_shim *)calloc(1, sizeof(kvaudit_shim));
    if (h == NULL) {
        shim_copy_error(err, err_cap, "kvaudit_shim_open: out of memory");
        llama_free(ctx);
        llama_model_free(model);
        return NULL;
    }
    h->model = model;
    h->ctx = ctx;
    h->mem = llama_get_memory(ctx);
    h->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    h->cparams = cparams;
    h->n_embd_input = embd_input ? llama_model_n_embd(model) : 0;
    h->memory_log = strdup(shim_memlog);
    SHIM_CATCH(shim_copy_error(err, err_cap, shim_err); return NULL)
    return h;
}

KVAUDIT_SHIM_API void kvaudit_shim_close(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return;
    }
    SHIM_TRY
    llama_free(h->ctx);
    llama_model_free(h->model);
    SHIM_CATCH((void)0)
    free(h->memory_log);
    free(h);
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_setting_value(kvaudit_shim *h, const char *key,
                                                    int64_t *out) {
    shim_clear_error();
    if (h == NULL || key == NULL || out == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    const struct llama_context_params *c = &h->cparams;
    if (strcmp(key, "n_ctx") == 0) {
        *out = (int64_t)llama_n_ctx(h->ctx);
    } else if (strcmp(key, "n_seq_max") == 0) {
        *out = (int64_t)llama_n_seq_max(h->ctx);
    } else if (strcmp(key, "n_batch") == 0) {
        *out = (int64_t)llama_n_batch(h->ctx);
    } else if (strcmp(key, "n_ubatch") == 0) {
        *out = (int64_t)llama_n_ubatch(h->ctx);
    } else if (strcmp(key, "n_threads") == 0) {
        *out = (int64_t)llama_n_threads(h->ctx);
    } else if (strcmp(key, "kv_unified") == 0) {
#ifdef KVAUDIT_SHIM_NO_KV_UNIFIED
        *out = 1;
#else
        *out = c->kv_unified ? 1 : 0;
#endif
    } else if (strcmp(key, "swa_full") == 0) {
        *out = c->swa_full ? 1 : 0;
    } else if (strcmp(key, "n_rs_seq") == 0) {
#ifdef KVAUDIT_SHIM_NO_RS_SEQ
        *out = 0;
#else
        *out = (int64_t)llama_n_rs_seq(h->ctx);
#endif
    } else if (strcmp(key, "flash_attn") == 0) {
#if SHIM_HAS_STATE_SEQ_FLAGS
        *out = c->flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED ? 1 : 0;
#else
        *out = c->flash_attn ? 1 : 0;
#endif
    } else if (strcmp(key, "embd_input") == 0) {
        *out = h->n_embd_input > 0 ? 1 : 0;
    } else if (strcmp(key, "type_k") == 0) {
        *out = (int64_t)c->type_k;
    } else if (strcmp(key, "type_v") == 0) {
        *out = (int64_t)c->type_v;
    } else {
        return KVAUDIT_SHIM_E_LLAMA;
    }
    return KVAUDIT_SHIM_OK;
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_model_arch(kvaudit_shim *h, char *buf, size_t cap) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && cap > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    int32_t n = llama_model_meta_val_str(h->model, "general.architecture", buf, cap);
    return n < 0 ? KVAUDIT_SHIM_E_LLAMA : n;
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_memory_log(kvaudit_shim *h, char *buf, size_t cap) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && cap > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    const char *log = h->memory_log != NULL ? h->memory_log : "";
    size_t n = strlen(log);
    if (cap > 0) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(buf, log, k);
        buf[k] = '\0';
    }
    return (int32_t)n;
}

/* ---- decode ------------------------------------------------------------------------------- */

KVAUDIT_SHIM_API int32_t kvaudit_shim_decode(kvaudit_shim *h, int32_t n_tokens,
                                             const int32_t *tokens, const int32_t *pos,
                                             const int32_t *n_seq_id, const int32_t *seq_ids_flat,
                                             int32_t logits_last) {
    shim_clear_error();
    if (h == NULL || (n_tokens > 0 && tokens == NULL) ||
        ((n_seq_id == NULL) != (seq_ids_flat == NULL))) {
        return KVAUDIT_SHIM_E_NULL;
    }
    size_t n = n_tokens > 0 ? (size_t)n_tokens : 0;
    /* One allocation for the embeddings (embd_input), the per-token seq id pointers and the
     * output flags, in that order (the floats first keep their alignment). */
    size_t embd_bytes = n * (size_t)h->n_embd_input * sizeof(float);
    size_t ptr_bytes = n_seq_id != NULL ? n * sizeof(llama_seq_id *) : 0;
    unsigned char *scratch = (unsigned char *)malloc(embd_bytes + ptr_bytes + n + 1);
    if (scratch == NULL) {
        return KVAUDIT_SHIM_E_NOMEM;
    }
    float *embd = h->n_embd_input > 0 ? (float *)scratch : NULL;
    llama_seq_id **seq_id = n_seq_id != NULL ? (llama_seq_id **)(scratch + embd_bytes) : NULL;
    int8_t *logits = (int8_t *)(scratch + embd_bytes + ptr_bytes);
    if (shim_test_overflow) {
        shim_test_overflow_write();
    }

    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        if (seq_id != NULL) {
            seq_id[i] = (llama_seq_id *)(seq_ids_flat + offset);
            if (n_seq_id[i] > 0) {
                offset += (size_t)n_seq_id[i];
            }
        }
        logits[i] = (int8_t)(logits_last != 0 && i + 1 == n);
        for (int32_t d = 0; embd != NULL && d < h->n_embd_input; d++) {
            embd[i * (size_t)h->n_embd_input + (size_t)d] = shim_token_embd(tokens[i], d);
        }
    }

    struct llama_batch batch;
    memset(&batch, 0, sizeof(batch));
    batch.n_tokens = n_tokens;
    /* llama_batch: token ids or embeddings, not both. */
    batch.token = embd != NULL ? NULL : (llama_token *)tokens;
    batch.embd = embd;
    batch.pos = (llama_pos *)pos;
    batch.n_seq_id = (int32_t *)n_seq_id;
    batch.seq_id = seq_id;
    batch.logits = logits;

    int32_t rc = KVAUDIT_SHIM_E_EXCEPTION;
    SHIM_TRY
    rc = llama_decode(h->ctx, batch);
    SHIM_CATCH(rc = KVAUDIT_SHIM_E_EXCEPTION)
    free(scratch);
    return rc;
}

/* ---- memory operations -------------------------------------------------------------------- */

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_rm(kvaudit_shim *h, int32_t seq_id, int32_t p0,
                                             int32_t p1) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return llama_memory_seq_rm(h->mem, seq_id, p0, p1) ? 1 : 0;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_cp(kvaudit_shim *h, int32_t seq_id_src,
                                             int32_t seq_id_dst, int32_t p0, int32_t p1) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    llama_memory_seq_cp(h->mem, seq_id_src, seq_id_dst, p0, p1);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_keep(kvaudit_shim *h, int32_t seq_id) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    llama_memory_seq_keep(h->mem, seq_id);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_add(kvaudit_shim *h, int32_t seq_id, int32_t p0,
                                              int32_t p1, int32_t delta) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    llama_memory_seq_add(h->mem, seq_id, p0, p1, delta);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_div(kvaudit_shim *h, int32_t seq_id, int32_t p0,
                                              int32_t p1, int32_t d) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    llama_memory_seq_div(h->mem, seq_id, p0, p1, d);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_clear(kvaudit_shim *h, int32_t data) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    llama_memory_clear(h->mem, data != 0);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_pos_min(kvaudit_shim *h, int32_t seq_id, int32_t *out) {
    shim_clear_error();
    if (h == NULL || out == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    *out = llama_memory_seq_pos_min(h->mem, seq_id);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_seq_pos_max(kvaudit_shim *h, int32_t seq_id, int32_t *out) {
    shim_clear_error();
    if (h == NULL || out == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    *out = llama_memory_seq_pos_max(h->mem, seq_id);
    return KVAUDIT_SHIM_OK;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

/* ---- state -------------------------------------------------------------------------------- */

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_size(kvaudit_shim *h, int32_t seq_id) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return (int64_t)llama_state_seq_get_size(h->ctx, seq_id);
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_get(kvaudit_shim *h, int32_t seq_id, uint8_t *buf,
                                                    size_t cap) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && cap > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return (int64_t)llama_state_seq_get_data(h->ctx, buf, cap, seq_id);
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_set(kvaudit_shim *h, int32_t seq_id,
                                                    const uint8_t *buf, size_t len) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && len > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return (int64_t)llama_state_seq_set_data(h->ctx, buf, len, seq_id);
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

#if !SHIM_HAS_STATE_SEQ_FLAGS
/* Flags before llama_state_seq_flags existed: none is the plain call; any other is refused with
 * a logged reason, since this llama.cpp cannot do what they ask. */
static int shim_no_state_seq_flags(uint32_t flags) {
    if (flags == 0) {
        return 0;
    }
    shim_note("kvaudit_shim: llama_state_seq_flags are not in this llama.cpp version\n");
    return 1;
}
#endif

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_size_ext(kvaudit_shim *h, int32_t seq_id,
                                                         uint32_t flags) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
#if SHIM_HAS_STATE_SEQ_FLAGS
    return (int64_t)llama_state_seq_get_size_ext(h->ctx, seq_id, (llama_state_seq_flags)flags);
#else
    return shim_no_state_seq_flags(flags) ? KVAUDIT_SHIM_E_LLAMA
                                          : (int64_t)llama_state_seq_get_size(h->ctx, seq_id);
#endif
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_get_ext(kvaudit_shim *h, int32_t seq_id,
                                                        uint8_t *buf, size_t cap, uint32_t flags) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && cap > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
#if SHIM_HAS_STATE_SEQ_FLAGS
    return (int64_t)llama_state_seq_get_data_ext(h->ctx, buf, cap, seq_id,
                                                 (llama_state_seq_flags)flags);
#else
    return shim_no_state_seq_flags(flags)
               ? KVAUDIT_SHIM_E_LLAMA
               : (int64_t)llama_state_seq_get_data(h->ctx, buf, cap, seq_id);
#endif
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_seq_set_ext(kvaudit_shim *h, int32_t seq_id,
                                                        const uint8_t *buf, size_t len,
                                                        uint32_t flags) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && len > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
#if SHIM_HAS_STATE_SEQ_FLAGS
    return (int64_t)llama_state_seq_set_data_ext(h->ctx, buf, len, seq_id,
                                                 (llama_state_seq_flags)flags);
#else
    return shim_no_state_seq_flags(flags)
               ? KVAUDIT_SHIM_E_LLAMA
               : (int64_t)llama_state_seq_set_data(h->ctx, buf, len, seq_id);
#endif
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_n_ctx(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    return (int64_t)llama_n_ctx(h->ctx);
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_n_seq_max(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    return (int64_t)llama_n_seq_max(h->ctx);
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_n_batch(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    return (int64_t)llama_n_batch(h->ctx);
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_n_ubatch(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    return (int64_t)llama_n_ubatch(h->ctx);
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_size(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return (int64_t)llama_state_get_size(h->ctx);
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_get(kvaudit_shim *h, uint8_t *buf, size_t cap) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && cap > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return (int64_t)llama_state_get_data(h->ctx, buf, cap);
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API int64_t kvaudit_shim_state_set(kvaudit_shim *h, const uint8_t *buf, size_t len) {
    shim_clear_error();
    if (h == NULL || (buf == NULL && len > 0)) {
        return KVAUDIT_SHIM_E_NULL;
    }
    SHIM_TRY
    return (int64_t)llama_state_set_data(h->ctx, buf, len);
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

/* ---- outputs ------------------------------------------------------------------------------ */

KVAUDIT_SHIM_API int32_t kvaudit_shim_n_vocab(kvaudit_shim *h) {
    shim_clear_error();
    if (h == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    return h->n_vocab;
}

KVAUDIT_SHIM_API int32_t kvaudit_shim_get_logits_ith(kvaudit_shim *h, int32_t i, float *out,
                                                     int32_t cap) {
    shim_clear_error();
    if (h == NULL || out == NULL) {
        return KVAUDIT_SHIM_E_NULL;
    }
    if (cap < h->n_vocab) {
        return KVAUDIT_SHIM_E_BUFFER;
    }
    SHIM_TRY
    const float *logits = llama_get_logits_ith(h->ctx, i);
    if (logits == NULL) {
        return KVAUDIT_SHIM_E_LLAMA;
    }
    memcpy(out, logits, (size_t)h->n_vocab * sizeof(float));
    return h->n_vocab;
    SHIM_CATCH(return KVAUDIT_SHIM_E_EXCEPTION)
}

KVAUDIT_SHIM_API size_t kvaudit_shim_last_error(char *buf, size_t cap) {
    if (buf != NULL && cap > 0) {
        size_t n = shim_err_len < cap - 1 ? shim_err_len : cap - 1;
        memcpy(buf, shim_err, n);
        buf[n] = '\0';
    }
    return shim_err_len;
}
