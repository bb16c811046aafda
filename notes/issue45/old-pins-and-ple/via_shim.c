/* H6: the PLE trace through kvaudit's own shim (libkvaudit_shim.so of the pin), as the worker
 * drives it: two handles (audited A, twin T), each its own model and context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "kvaudit_shim.h"
static int nv;
static int dec(kvaudit_shim *h, int n, const int32_t *tok, const int32_t *pos, int32_t seq) {
    int32_t nsid[16], sids[16];
    for (int i = 0; i < n; i++) { nsid[i] = 1; sids[i] = seq; }
    return kvaudit_shim_decode(h, n, tok, pos, nsid, sids, 1);
}
static float *logits(kvaudit_shim *h) { float *a = malloc(sizeof(float) * nv); kvaudit_shim_get_logits_ith(h, -1, a, nv); return a; }
int main(int argc, char **argv) {
    const char *model = argv[1];
    kvaudit_shim_setting st[] = {{"n_ctx", 256}, {"n_seq_max", 2}, {"kv_unified", 1}, {"flash_attn", 0},
        {"type_k", 1}, {"type_v", 1}, {"swa_full", 1}, {"n_rs_seq", 0}, {"n_threads", 1}};
    char err[512] = "";
    kvaudit_shim *A = kvaudit_shim_open(model, st, sizeof st / sizeof st[0], err, sizeof err);
    kvaudit_shim *T = kvaudit_shim_open(model, st, sizeof st / sizeof st[0], err, sizeof err);
    if (!A || !T) { fprintf(stderr, "open: %s\n", err); return 2; }
    nv = kvaudit_shim_n_vocab(A);
    kvaudit_shim_clear(A, 1);
    const int32_t t0[] = {12}, t1a[] = {12, 49, 23, 60}, t1b[] = {12, 49}, pt[] = {5}, p6[] = {6};
    const int32_t R[] = {12, 49, 23, 60, 12, 49}, RP[] = {0, 1, 2, 3, 4, 5};
    int split = argc > 2 ? atoi(argv[2]) : 1;
    int r0 = dec(A, 1, t0, NULL, 0);
    int r1 = split ? dec(A, 4, t1a, NULL, 1) : dec(A, 6, R, NULL, 1);
    int r2 = split ? dec(A, 2, t1b, NULL, 1) : 0;
    int r3 = dec(A, 1, pt, p6, 1);
    float *a = logits(A);
    kvaudit_shim_clear(T, 1);
    int r4 = dec(T, 6, R, RP, 1), r5 = dec(T, 1, pt, p6, 1);
    float *f = logits(T);
    float d = 0; for (int i = 0; i < nv; i++) { float x = a[i] - f[i]; if (x < 0) x = -x; if (x > d) d = x; }
    printf("rc %d %d %d %d %d %d; audited vs fresh max |diff| %g (%s)\n", r0, r1, r2, r3, r4, r5, d, split ? "4 + 2" : "6 at once");
    return d > 1e-3;
}
