/* The prelude kvaudit 0.1.0 writes at the top of every C reproducer (`kvaudit repro FILE --emit c`),
 * once for the C programs of notes/issue45/ (old-pins-and-ple/, ple/), which include it after their own header comment. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

/* What llama_init_from_model logged about the memory it allocated for the audited context, the
 * lines the allocation check reads (the shim keeps the same ones); nothing else is printed. */
static char memlog[8192];
static size_t memlog_len;
static int memlog_done;

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (memlog_done || level != GGML_LOG_LEVEL_INFO || text == NULL) return;
    if (!strstr(text, " cells") && !strstr(text, "KV cache")) return;
    size_t n = strlen(text);
    if (n > sizeof memlog - 1 - memlog_len) n = sizeof memlog - 1 - memlog_len;
    memcpy(memlog + memlog_len, text, n);
    memlog_len += n;
    memlog[memlog_len] = '\0';
}

/* Decodes feed embeddings of this width instead of token ids when it is not 0 (kvaudit's
 * embd_input): token t becomes n_embd_input values token_embd(t, d), the shim's own. */
static int n_embd_input;

static float token_embd(int32_t t, int32_t d) {
    return (float)(((uint32_t)t * 131u + (uint32_t)d * 7u) % 17u) / 8.0f - 1.0f;
}

/* One llama_decode; pos == NULL lets llama.cpp choose each sequence's next position. */
static int decode(struct llama_context *ctx, int n, const llama_token *toks, const llama_pos *pos,
                  int n_seq, const llama_seq_id *seqs) {
    struct llama_batch b = llama_batch_init(n, n_embd_input, n_seq);
    llama_pos *own_pos = b.pos;
    for (int i = 0; i < n; i++) {
        if (n_embd_input) {
            for (int d = 0; d < n_embd_input; d++) b.embd[i * n_embd_input + d] = token_embd(toks[i], d);
        } else {
            b.token[i] = toks[i];
        }
        if (pos) b.pos[i] = pos[i];
        b.n_seq_id[i] = n_seq;
        for (int s = 0; s < n_seq; s++) b.seq_id[i][s] = seqs[s];
        b.logits[i] = i == n - 1;
    }
    b.n_tokens = n;
    if (!pos) b.pos = NULL;
    int rc = llama_decode(ctx, b);
    b.pos = own_pos;
    llama_batch_free(b);
    return rc;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The bytes of llama_state_seq_get_data(seq) and llama_state_get_data, malloc'd. */
static inline uint8_t *dump_seq(struct llama_context *ctx, llama_seq_id seq, size_t *len) {
    size_t size = llama_state_seq_get_size(ctx, seq);
    uint8_t *buf = malloc(size ? size : 1);
    *len = buf ? llama_state_seq_get_data(ctx, buf, size, seq) : 0;
    return buf;
}

static inline uint8_t *dump_whole(struct llama_context *ctx, size_t *len) {
    size_t size = llama_state_get_size(ctx);
    uint8_t *buf = malloc(size ? size : 1);
    *len = buf ? llama_state_get_data(ctx, buf, size) : 0;
    return buf;
}

/* Reads n cells (pos, n_seq_id, with ext a llama_kv_cell_ext (x, y, token: 12 bytes), seq ids)
 * at *at into out (up to cap); the new count. A cache of an M-RoPE model writes the ext
 * (has_cell_ext, src/llama-kv-cache.cpp:1846-1849, state_write_meta :2238-2241 in 0.1.161). */
static inline int read_cells_ext(const uint8_t *buf, size_t got, size_t *at, uint32_t count, int *out, int n, int cap, int ext) {
    for (uint32_t c = 0; c < count && *at + 8 <= got; c++) {
        int32_t p; uint32_t ns; memcpy(&p, buf + *at, 4); memcpy(&ns, buf + *at + 4, 4);
        *at += 8 + (ext ? 12 : 0) + 4 * (size_t)ns;
        if (n < cap) out[n++] = p;
    }
    return n;
}

static inline int read_cells(const uint8_t *buf, size_t got, size_t *at, uint32_t count, int *out, int n, int cap) {
    return read_cells_ext(buf, got, at, count, out, n, cap, 0);
}

/* The positions of seq's cells in llama_state_seq_get_data (magic, seq id, n_stream, then per
 * stream a cell count and (pos, n_seq_id, seq ids) per cell), sorted. */
static int resident(struct llama_context *ctx, llama_seq_id seq, int *out, int cap) {
    size_t got = 0;
    uint8_t *buf = dump_seq(ctx, seq, &got);
    size_t at = 8; /* magic, seq id */
    int n = 0;
    uint32_t n_stream = 0;
    if (got >= 12) { memcpy(&n_stream, buf + at, 4); at += 4; }
    for (uint32_t s = 0; s < n_stream && at + 4 <= got; s++) {
        uint32_t count; memcpy(&count, buf + at, 4); at += 4;
        if (count == 0) continue;
        n = read_cells(buf, got, &at, count, out, n, cap);
        break; /* one unified stream: the K/V data that follows is not needed */
    }
    free(buf);
    qsort(out, n, sizeof out[0], cmp_int);
    return n;
}

/* A dsv4 memory's dump (llama-kv-cache-dsv4.cpp `state_write`): magic, seq id, the dsv4 magic,
 * version and mode, then the raw pair's base cache, which holds every cell of seq (as
 * resident's first cache), sorted. */
static inline int resident_dsv4(struct llama_context *ctx, llama_seq_id seq, int *out, int cap) {
    size_t got = 0;
    uint8_t *buf = dump_seq(ctx, seq, &got);
    size_t at = 20; /* magic, seq id, dsv4 magic, version, mode */
    int n = 0;
    uint32_t n_stream = 0;
    if (got >= 24) { memcpy(&n_stream, buf + at, 4); at += 4; }
    for (uint32_t s = 0; s < n_stream && at + 4 <= got; s++) {
        uint32_t count; memcpy(&count, buf + at, 4); at += 4;
        if (count == 0) continue;
        n = read_cells(buf, got, &at, count, out, n, cap);
        break;
    }
    free(buf);
    qsort(out, n, sizeof out[0], cmp_int);
    return n;
}

/* Skips one stream's K and V data of an attention cache (v_trans, n_layer, the n_rot fields of
 * state format 4, then per layer K rows and, unless k_only (an MLA model's caches keep no V),
 * V rows or transposed V elements). */
static inline void skip_cache_data(const uint8_t *buf, size_t got, size_t *at, uint32_t count, int k_only) {
    uint32_t v_trans = 0, n_layer = 0;
    if (*at + 8 > got) { *at = got; return; }
    memcpy(&v_trans, buf + *at, 4); memcpy(&n_layer, buf + *at + 4, 4); *at += 8;
#if LLAMA_STATE_SEQ_VERSION >= 4
    *at += 8; /* n_rot_k, n_rot_v */
#endif
    for (uint32_t l = 0; l < n_layer && *at + 12 <= got; l++) { /* K */
        uint64_t row; memcpy(&row, buf + *at + 4, 8); *at += 12 + (size_t)(row * count);
    }
    for (uint32_t l = 0; !k_only && l < n_layer && *at + 12 <= got; l++) { /* V */
        if (!v_trans) { uint64_t row; memcpy(&row, buf + *at + 4, 8); *at += 12 + (size_t)(row * count); }
        else { uint32_t el, n_embd; memcpy(&el, buf + *at + 4, 4); memcpy(&n_embd, buf + *at + 8, 4);
               *at += 12 + (size_t)el * n_embd * count; }
    }
}

static inline void skip_kv_data(const uint8_t *buf, size_t got, size_t *at, uint32_t count) {
    skip_cache_data(buf, got, at, count, 0);
}

/* The positions present for seq in a recurrent memory's dump (magic, seq id, then the
 * recurrent section: a cell count and (pos, n_seq_id, seq ids) per cell, no streams), sorted. */
static inline int resident_recurrent(struct llama_context *ctx, llama_seq_id seq, int *out, int cap) {
    size_t got = 0;
    uint8_t *buf = dump_seq(ctx, seq, &got);
    size_t at = 8;
    uint32_t count = 0;
    if (got >= 12) { memcpy(&count, buf + at, 4); at += 4; }
    int n = read_cells(buf, got, &at, count, out, 0, cap);
    free(buf);
    qsort(out, n, sizeof out[0], cmp_int);
    return n;
}

/* A hybrid memory's dump: the attention cache (streams of cells, with cell exts when ext, each
 * stream followed by its K/V data) then the recurrent section; a hybrid-idx memory's indexer
 * cache after it is not read (it mirrors the attention cells). The attention cells into out,
 * sorted; with within_states only the positions present, those within the recurrent states'
 * range (what llama_memory_hybrid's accessors combine), else all of them (the observation's
 * cells, after whose last the probes decode: running/probe.rs). */
static inline int hybrid_cells(struct llama_context *ctx, llama_seq_id seq, int *out, int cap, int ext, int within_states) {
    size_t got = 0;
    uint8_t *buf = dump_seq(ctx, seq, &got);
    size_t at = 8;
    int n = 0;
    uint32_t n_stream = 0;
    if (got >= 12) { memcpy(&n_stream, buf + at, 4); at += 4; }
    for (uint32_t s = 0; s < n_stream && at + 4 <= got; s++) {
        uint32_t count; memcpy(&count, buf + at, 4); at += 4;
        if (count == 0) continue;
        n = read_cells_ext(buf, got, &at, count, out, n, cap, ext);
        skip_kv_data(buf, got, &at, count);
    }
    int rec[64]; int nr = 0;
    uint32_t rcount = 0;
    if (at + 4 <= got) { memcpy(&rcount, buf + at, 4); at += 4; nr = read_cells(buf, got, &at, rcount, rec, 0, 64); }
    free(buf);
    int lo = 1, hi = 0; /* an empty range when the recurrent part holds nothing */
    for (int i = 0; i < nr; i++) { if (i == 0 || rec[i] < lo) lo = rec[i]; if (i == 0 || rec[i] > hi) hi = rec[i]; }
    int m = 0;
    for (int i = 0; i < n; i++) if (!within_states || (out[i] >= lo && out[i] <= hi)) out[m++] = out[i];
    qsort(out, m, sizeof out[0], cmp_int);
    return m;
}

/* The positions present for seq in a hybrid memory's dump (hybrid_cells), sorted. */
static inline int resident_hybrid(struct llama_context *ctx, llama_seq_id seq, int *out, int cap) {
    return hybrid_cells(ctx, seq, out, cap, 0, 1);
}

/* The positions present for seq in a hybrid-idx memory's dump (src/llama-memory-hybrid-idx.cpp
 * `state_write`: the hybrid's, then the indexer cache): qwen4exp ropes with IMRoPE, so its
 * attention cells carry exts; sorted. */
static inline int resident_hybrid_idx(struct llama_context *ctx, llama_seq_id seq, int *out, int cap) {
    return hybrid_cells(ctx, seq, out, cap, 1, 1);
}

/* A dump of attention caches: the first cache's positions for seq into base (*nb), the last's
 * into win; returns the last count. Both sorted. k_only: K records only (DSA); skip: caches
 * between the two, read past (a DSA-iSWA memory's indexer key cache). */
static inline int resident_pair(struct llama_context *ctx, llama_seq_id seq, int *base, int *nb, int *win, int cap, int k_only, int skip) {
    size_t got = 0;
    uint8_t *buf = dump_seq(ctx, seq, &got);
    size_t at = 8;
    int counts[2] = {0, 0};
    for (int part = 0; part < 2 + skip; part++) {
        int mid[4096]; int nmid = 0;
        int *out = part == 0 ? base : part <= skip ? mid : win;
        int *n_out = part == 0 ? &counts[0] : part <= skip ? &nmid : &counts[1];
        uint32_t n_stream = 0;
        if (at + 4 <= got) { memcpy(&n_stream, buf + at, 4); at += 4; }
        for (uint32_t s = 0; s < n_stream && at + 4 <= got; s++) {
            uint32_t count; memcpy(&count, buf + at, 4); at += 4;
            if (count == 0) continue;
            *n_out = read_cells(buf, got, &at, count, out, *n_out, cap);
            skip_cache_data(buf, got, &at, count, k_only);
        }
        qsort(out, *n_out, sizeof out[0], cmp_int);
    }
    free(buf);
    *nb = counts[0];
    return counts[1];
}

/* An iSWA memory's dump: the base cache into base (*nb), the windowed cache into win. */
static inline int resident_iswa(struct llama_context *ctx, llama_seq_id seq, int *base, int *nb, int *win, int cap) {
    return resident_pair(ctx, seq, base, nb, win, cap, 0, 0);
}

/* A DSA memory's dump: the K-only MLA cache into base (*nb), the indexer key cache into win. */
static inline int resident_dsa(struct llama_context *ctx, llama_seq_id seq, int *base, int *nb, int *win, int cap) {
    return resident_pair(ctx, seq, base, nb, win, cap, 1, 0);
}

/* A DSA-iSWA memory's dump: the K-only MLA cache into base (*nb), past the indexer key cache,
 * the windowed cache into win. */
static inline int resident_dsa_iswa(struct llama_context *ctx, llama_seq_id seq, int *base, int *nb, int *win, int cap) {
    return resident_pair(ctx, seq, base, nb, win, cap, 1, 1);
}

/* A hybrid-iSWA memory's dump: the iSWA pair (as resident_iswa), then the recurrent cells.
 * Keeps the base positions within the states' range in base (*nb) and returns the windowed
 * count, its first position raised to the states' minimum (src/oracles/memory.rs, `allowed`). */
static inline int resident_hybrid_iswa(struct llama_context *ctx, llama_seq_id seq, int *base, int *nb, int *win, int cap) {
    size_t got = 0;
    uint8_t *buf = dump_seq(ctx, seq, &got);
    size_t at = 8;
    int counts[2] = {0, 0};
    for (int part = 0; part < 2; part++) {
        int *out = part ? win : base;
        uint32_t n_stream = 0;
        if (at + 4 <= got) { memcpy(&n_stream, buf + at, 4); at += 4; }
        for (uint32_t s = 0; s < n_stream && at + 4 <= got; s++) {
            uint32_t count; memcpy(&count, buf + at, 4); at += 4;
            if (count == 0) continue;
            counts[part] = read_cells(buf, got, &at, count, out, counts[part], cap);
            skip_kv_data(buf, got, &at, count);
        }
        qsort(out, counts[part], sizeof out[0], cmp_int);
    }
    int rec[64]; int nr = 0;
    uint32_t rcount = 0;
    if (at + 4 <= got) { memcpy(&rcount, buf + at, 4); at += 4; nr = read_cells(buf, got, &at, rcount, rec, 0, 64); }
    free(buf);
    int lo = 1, hi = 0; /* an empty range when the recurrent part holds nothing */
    for (int i = 0; i < nr; i++) { if (i == 0 || rec[i] < lo) lo = rec[i]; if (i == 0 || rec[i] > hi) hi = rec[i]; }
    int m = 0;
    for (int i = 0; i < counts[0]; i++) if (base[i] >= lo && base[i] <= hi) base[m++] = base[i];
    *nb = m;
    if (counts[1] && win[0] < lo) win[0] = lo;
    return counts[1];
}

static inline int has_pos(const int *v, int n, int p) {
    for (int i = 0; i < n; i++) if (v[i] == p) return 1;
    return 0;
}

/* The used cells of a whole dump (u32 length and the architecture name, then the first cache:
 * n_stream, per stream a cell count, the cells (pos, n_seq_id, seq ids), then its K and V
 * data, skipped). Keeps the positions of the cells that list seq (every cell: seq = -1),
 * sorted, and counts cells that list no sequence into *orphans (may be NULL). */
static inline int whole_cells(const uint8_t *buf, size_t got, llama_seq_id seq, int *out,
                              int cap, int *orphans) {
    size_t at = 0;
    int n = 0;
    uint32_t u, n_stream = 0;
    if (orphans) *orphans = 0;
#define TAKE(dst, k) do { if (at + (k) > got) goto done; memcpy((dst), buf + at, (k)); at += (k); } while (0)
    TAKE(&u, 4); at += u;
    TAKE(&n_stream, 4);
    for (uint32_t s = 0; s < n_stream; s++) {
        uint32_t count; TAKE(&count, 4);
        if (count == 0) continue;
        for (uint32_t c = 0; c < count; c++) {
            int32_t p; uint32_t ns; TAKE(&p, 4); TAKE(&ns, 4);
            int listed = seq < 0;
            for (uint32_t i = 0; i < ns; i++) { int32_t id; TAKE(&id, 4); listed |= id == seq; }
            if (ns == 0 && orphans) (*orphans)++;
            if (listed && n < cap) out[n++] = p;
        }
        uint32_t v_trans, n_layer; TAKE(&v_trans, 4); TAKE(&n_layer, 4);
#if LLAMA_STATE_SEQ_VERSION >= 4
        at += 8; /* n_rot_k, n_rot_v */
#endif
        for (uint32_t l = 0; l < n_layer; l++) { int32_t t; uint64_t row; TAKE(&t, 4); TAKE(&row, 8); at += row * count; }
        for (uint32_t l = 0; l < n_layer; l++) {
            int32_t t; TAKE(&t, 4);
            if (!v_trans) { uint64_t row; TAKE(&row, 8); at += row * count; }
            else { uint32_t el, n_embd; TAKE(&el, 4); TAKE(&n_embd, 4); at += (size_t)el * n_embd * count; }
        }
    }
#undef TAKE
done:
    qsort(out, n, sizeof out[0], cmp_int);
    return n;
}

