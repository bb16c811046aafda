/*
 * kvaudit_cov.c: the coverage runtime of `+cov` builds (docs/usage.md, "+cov").
 *
 * llama.cpp's memory sources are compiled with gcc's -fsanitize-coverage=trace-pc (gcc 12 has
 * no trace-pc-guard), which calls __sanitizer_cov_trace_pc() at the start of every basic block.
 * This file defines that callback: it records the return address minus the shared object's
 * load base (a PC offset that addr2line maps to file:line in the same .so) in a fixed-size
 * open-addressing set, and the AFL-style edge (previous PC >> 1 xor this PC, per thread) in a
 * second one, with how often it was taken (handed out as AFL's hit-count class). No allocation, no lock: the memory code runs on the thread that calls llama.h
 * (ggml's worker threads run no instrumented code), and a racing write could only lose a
 * point, never corrupt the tables.
 *
 * Recording has three modes, set by kvaudit_shim_cov_enable(): 0 off; 1 the ops of a trace
 * (PCs and edges, taken and cleared per trial by kvaudit_shim_cov_take(): the guided fuzzer's
 * signal, the list of used slots makes the clear cost what was recorded); 2 everything else a
 * run executes (the context's construction, the setup's decodes, resets, observations): PCs
 * only, into a third set that is never cleared, so kvaudit_shim_cov_take_outside() hands out
 * each such point once, the first time it is reached, and a run pays for the mode only in the
 * callback's lookup of a point it already holds.
 *
 * Only `+cov` builds compile this file (src/targets/llama/build/cov.rs). Valid C and C++ (the
 * shim unit is compiled as C++): the exported names are extern "C".
 */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported (the shim unit is compiled with -fvisibility=hidden; the export map keeps only
 * kvaudit_shim_*). */
#define COV_API __attribute__((visibility("default")))

/* Slots per set (a power of two). 0.1.156's memory sources have about 21,500 call sites; a
 * trial reaches a few hundred to a few thousand points. */
#define COV_SLOTS (1u << 16)
/* At most this many points per set between two takes; more are dropped (and counted). */
#define COV_MAX_POINTS (COV_SLOTS / 2)

/* Set by the linker: the ELF header of this shared object, i.e. its load base. */
extern const char __ehdr_start __attribute__((visibility("hidden")));

struct cov_set {
    /* Value + 1 per slot (0: empty). */
    uint32_t slot[COV_SLOTS];
    /* How often each slot's value was recorded since the last take (saturating). */
    uint16_t hits[COV_SLOTS];
    /* The values recorded since the last take, in order. */
    uint32_t list[COV_MAX_POINTS];
    uint32_t n;
    uint32_t dropped;
};

static struct cov_set cov_pcs;
static struct cov_set cov_edges;
/* Mode 2's points, and how many of its list kvaudit_shim_cov_take_outside() handed out. */
static struct cov_set cov_outside;
static uint32_t cov_outside_taken;
static volatile int cov_on;
static __thread uint32_t cov_prev;

static inline void cov_insert(struct cov_set *s, uint32_t v) {
    uint32_t h = (v * 2654435761u) & (COV_SLOTS - 1);
    for (;;) {
        uint32_t cur = s->slot[h];
        if (cur == v + 1) {
            if (s->hits[h] != UINT16_MAX)
                s->hits[h]++;
            return;
        }
        if (cur == 0)
            break;
        h = (h + 1) & (COV_SLOTS - 1);
    }
    if (s->n >= COV_MAX_POINTS) {
        s->dropped++;
        return;
    }
    s->slot[h] = v + 1;
    s->hits[h] = 1;
    s->list[s->n++] = v;
}

/* AFL's hit-count classes: 1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+. */
static inline uint32_t cov_bucket(uint16_t hits) {
    if (hits <= 3)
        return hits - 1;
    if (hits <= 7)
        return 3;
    if (hits <= 15)
        return 4;
    if (hits <= 31)
        return 5;
    if (hits <= 127)
        return 6;
    return 7;
}

__attribute__((visibility("hidden"), no_sanitize_address)) void __sanitizer_cov_trace_pc(void) {
    int mode = cov_on;
    if (!mode)
        return;
    uint32_t pc = (uint32_t)((uintptr_t)__builtin_return_address(0) - (uintptr_t)&__ehdr_start);
    if (mode == 2) {
        cov_insert(&cov_outside, pc);
        return;
    }
    cov_insert(&cov_pcs, pc);
    cov_insert(&cov_edges, pc ^ (cov_prev >> 1));
    cov_prev = pc;
}

/* Recording off (0), of the ops (1) or outside them (2). Builds without this file lack the
 * symbols, which is how the loader tells them apart; a runtime without
 * kvaudit_shim_cov_take_outside (older builds) knows only 0 and 1. */
COV_API void kvaudit_shim_cov_enable(int on) {
    cov_prev = 0;
    cov_on = on;
}

/* With `with_hits`, each value goes out mixed with its hit-count class (AFL's edge counts: a
 * loop that runs once and one that runs ten times are different edges). */
static size_t cov_take_set(struct cov_set *s, uint32_t *out, size_t cap, int with_hits) {
    size_t n = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t v = s->list[i];
        /* Clear the slot: find it again. */
        uint32_t h = (v * 2654435761u) & (COV_SLOTS - 1);
        while (s->slot[h] != v + 1)
            h = (h + 1) & (COV_SLOTS - 1);
        if (out != NULL && n < cap)
            out[n++] = with_hits ? v ^ (cov_bucket(s->hits[h]) * 0x9E3779B1u) : v;
        s->slot[h] = 0;
        s->hits[h] = 0;
    }
    s->n = 0;
    return n;
}

/* Copies the PC offsets (at most pcs_cap) and edges with their hit-count class (at most
 * edges_cap) recorded since the last
 * take into the buffers (NULL: discard), clears both sets, and writes how many of each were
 * copied into *n_pcs and *n_edges. Returns the points dropped since the last take because a
 * set was full (0 normally). Clearing with open addressing: every slot is emptied, so no
 * probe chain of a later insert crosses a stale entry. */
COV_API uint32_t kvaudit_shim_cov_take(uint32_t *pcs, size_t pcs_cap, size_t *n_pcs, uint32_t *edges,
                               size_t edges_cap, size_t *n_edges) {
    uint32_t dropped = cov_pcs.dropped + cov_edges.dropped;
    size_t np = cov_take_set(&cov_pcs, pcs, pcs_cap, 0);
    size_t ne = cov_take_set(&cov_edges, edges, edges_cap, 1);
    cov_pcs.dropped = cov_edges.dropped = 0;
    if (n_pcs != NULL)
        *n_pcs = np;
    if (n_edges != NULL)
        *n_edges = ne;
    return dropped;
}

/* Copies the mode-2 points reached for the first time since the last call (at most cap; NULL:
 * discard) into pcs and returns how many it copied. The set keeps them: a point is handed out
 * once per process (a forked child inherits what its parent had handed out). */
COV_API size_t kvaudit_shim_cov_take_outside(uint32_t *pcs, size_t cap) {
    size_t n = 0;
    for (; cov_outside_taken < cov_outside.n; cov_outside_taken++) {
        if (pcs != NULL && n < cap)
            pcs[n++] = cov_outside.list[cov_outside_taken];
    }
    return n;
}

#ifdef __cplusplus
}
#endif
