/*
 * bare_loop.c: the physical limit of a llama.cpp audit, as a plain loop over llama.h.
 *
 * `cargo bench --bench llama` compiles this file against a pin's static archive and prints its
 * figures beside kvaudit's own. It does what one exhaustive-audit trial must do at least, and
 * nothing else: restore the state saved after the setup (llama_state_set_data), apply the trial's
 * ops, then read the two accessors and the per-sequence dump of every sequence. No isolation, no
 * judging, no parsing: every trial of length 1..=DEPTH over the ops in OPS_FILE, whose first op
 * index is SHARD mod SHARDS (so two processes split the work as two audit workers would).
 *
 *   bare_loop MODEL OPS_FILE DEPTH [SHARD SHARDS]
 *
 * OPS_FILE: one op per line, as the bench writes the domain's ops:
 *   rm SEQ P0 P1 | cp SRC DST P0 P1 | keep SEQ | add SEQ P0 P1 D | div SEQ P0 P1 D | clear |
 *   decode SEQ      (one token at the sequence's next position)
 * The setup is the seed domain's: n_ctx 256, 2 sequences, one unified stream, flash attention
 * off, 7 tokens decoded into sequence 0.
 *
 * Prints one line: "trials N seconds S" (S is the loop's wall time, setup excluded).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

enum kind { RM, CP, KEEP, ADD, DIV, CLEAR, DECODE };
struct op {
    enum kind kind;
    int a, b, c, d, e;
};

#define N_SEQ 2
#define MAX_OPS 256
#define MAX_DEPTH 8

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level;
    (void)text;
    (void)user;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int decode_one(struct llama_context *ctx, llama_memory_t mem, struct llama_batch *b,
                      int seq, llama_token tok) {
    b->n_tokens = 1;
    b->token[0] = tok;
    b->pos[0] = llama_memory_seq_pos_max(mem, seq) + 1;
    b->n_seq_id[0] = 1;
    b->seq_id[0][0] = seq;
    b->logits[0] = 1;
    return llama_decode(ctx, *b);
}

static void apply(struct llama_context *ctx, llama_memory_t mem, struct llama_batch *b,
                  const struct op *o) {
    switch (o->kind) {
    case RM: llama_memory_seq_rm(mem, o->a, o->b, o->c); break;
    case CP: llama_memory_seq_cp(mem, o->a, o->b, o->c, o->d); break;
    case KEEP: llama_memory_seq_keep(mem, o->a); break;
    case ADD: llama_memory_seq_add(mem, o->a, o->b, o->c, o->d); break;
    case DIV: llama_memory_seq_div(mem, o->a, o->b, o->c, o->d); break;
    case CLEAR: llama_memory_clear(mem, true); break;
    case DECODE: decode_one(ctx, mem, b, o->a, 1); break;
    }
}

static int read_ops(const char *path, struct op *ops) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    char word[16];
    int n = 0;
    while (n < MAX_OPS && fscanf(f, "%15s", word) == 1) {
        struct op *o = &ops[n++];
        memset(o, 0, sizeof *o);
        int ok = 1;
        if (!strcmp(word, "rm")) { o->kind = RM; ok = fscanf(f, "%d %d %d", &o->a, &o->b, &o->c) == 3; }
        else if (!strcmp(word, "cp")) { o->kind = CP; ok = fscanf(f, "%d %d %d %d", &o->a, &o->b, &o->c, &o->d) == 4; }
        else if (!strcmp(word, "keep")) { o->kind = KEEP; ok = fscanf(f, "%d", &o->a) == 1; }
        else if (!strcmp(word, "add")) { o->kind = ADD; ok = fscanf(f, "%d %d %d %d", &o->a, &o->b, &o->c, &o->d) == 4; }
        else if (!strcmp(word, "div")) { o->kind = DIV; ok = fscanf(f, "%d %d %d %d", &o->a, &o->b, &o->c, &o->d) == 4; }
        else if (!strcmp(word, "clear")) { o->kind = CLEAR; }
        else if (!strcmp(word, "decode")) { o->kind = DECODE; ok = fscanf(f, "%d", &o->a) == 1; }
        else { ok = 0; }
        if (!ok) {
            fprintf(stderr, "%s: bad op line at '%s'\n", path, word);
            exit(2);
        }
    }
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s MODEL OPS_FILE DEPTH [SHARD SHARDS]\n", argv[0]);
        return 2;
    }
    static struct op ops[MAX_OPS];
    int n_ops = read_ops(argv[2], ops);
    int depth = atoi(argv[3]);
    int shard = argc == 6 ? atoi(argv[4]) : 0, shards = argc == 6 ? atoi(argv[5]) : 1;
    if (n_ops == 0 || depth < 1 || depth > MAX_DEPTH || shards < 1 || shard < 0 || shard >= shards) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (model == NULL) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_seq_max = N_SEQ;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.kv_unified = true;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        fprintf(stderr, "cannot make a context\n");
        return 1;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    struct llama_batch batch = llama_batch_init(8, 0, 1);

    /* The setup: 7 tokens into sequence 0, saved once. */
    batch.n_tokens = 7;
    for (int i = 0; i < 7; i++) {
        batch.token[i] = 1 + i;
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = i == 6;
    }
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "setup decode failed\n");
        return 1;
    }
    size_t saved_len = llama_state_get_size(ctx);
    uint8_t *saved = malloc(saved_len);
    saved_len = llama_state_get_data(ctx, saved, saved_len);
    size_t dump_cap = 1 << 20;
    uint8_t *dump = malloc(dump_cap);

    long long trials = 0;
    volatile long long sink = 0;
    int idx[MAX_DEPTH];
    double t0 = now_s();
    for (int d = 1; d <= depth; d++) {
        for (int first = shard; first < n_ops; first += shards) {
            idx[0] = first;
            for (int k = 1; k < d; k++) idx[k] = 0;
            for (;;) {
                llama_state_set_data(ctx, saved, saved_len);
                for (int k = 0; k < d; k++) apply(ctx, mem, &batch, &ops[idx[k]]);
                for (int s = 0; s < N_SEQ; s++) {
                    sink += llama_memory_seq_pos_min(mem, s) + llama_memory_seq_pos_max(mem, s);
                    sink += (long long)llama_state_seq_get_data(ctx, dump, dump_cap, s);
                }
                trials++;
                int k = d - 1;
                while (k >= 1 && ++idx[k] == n_ops) idx[k--] = 0;
                if (k < 1) break;
            }
        }
    }
    double secs = now_s() - t0;
    printf("trials %lld seconds %.3f\n", trials, secs);
    llama_batch_free(batch);
    free(dump);
    free(saved);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
