// bench/share_sweep.c: the CPU share against a sweep of fixed shares, on the GPU machine. The model is loaded once;
// for each share (-1: automatic, 0: the link alone) a GPU engine is opened at RING_GB, and a pass of T rows (a
// forward of T tokens at position POS, the last row's logits to the host: a decode step at T = 1, a verification
// or batched pass above) is timed for each T, median of REPS. JSON on stdout; the automatic share's choice for
// each T beside its time, so that a report can set it against the best fixed share of the same run, and the CPU's
// rate within the passes (its time on its rows) and the host's wait for their inputs.
//
//   share_sweep MODEL.bin RING_GB T,T,... SHARE,SHARE,... [REPS]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu.h"
#include "../loader.h"
#include "../util.h"

#define POS 64     // the passes start here (a short context in the KV cache)
#define MAX_LIST 32

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// "a,b,c" -> v (at most MAX_LIST); the count, or -1.
static int parse_list(const char *s, double *v) {
    int n = 0;
    for (char *end; *s && n < MAX_LIST; s = *end ? end + 1 : end) {
        v[n++] = strtod(s, &end);
        if (end == s || (*end && *end != ',')) return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: share_sweep MODEL.bin RING_GB T,T,... SHARE,SHARE,... [REPS]\n");
        return 2;
    }
    double Ts[MAX_LIST], shares[MAX_LIST];
    int nT = parse_list(argv[3], Ts), nS = parse_list(argv[4], shares), reps = argc > 5 ? atoi(argv[5]) : 5;
    if (nT < 1 || nS < 1 || reps < 1 || reps > 64) return fprintf(stderr, "share_sweep: bad T list, shares or REPS\n"), 2;
    for (int i = 0; i < nT; i++)
        if (Ts[i] < 1 || Ts[i] > 512) return fprintf(stderr, "share_sweep: T %g outside 1..512\n", Ts[i]), 2;
    dj_model m = {0};
    dj_load_opts lo = {.want_pinned = 1, .quiet = 1};
    dj_err e;
    if (model_load(argv[1], &lo, &m, &e)) return fprintf(stderr, "share_sweep: %s\n", e.msg), 1;
    int64_t V = m.info.config.vocab_size;
    int32_t *tok = malloc((POS + 512) * sizeof *tok);
    float *logits = malloc((size_t)V * sizeof *logits);
    if (!tok || !logits) return fprintf(stderr, "share_sweep: out of memory\n"), 1;
    for (int i = 0; i < POS + 512; i++) tok[i] = (int32_t)((1000 + (int64_t)i * 7919) % V);
    printf("{\"model\": \"%s\", \"ring_gb\": %s, \"pos\": %d, \"reps\": %d, \"runs\": [", argv[1], argv[2], POS, reps);
    for (int si = 0; si < nS; si++) {
        dj_gpu_opts o = {.max_seq = POS + 512, .ring_gb = atof(argv[2]), .cpu_share = shares[si], .warm_rows = 2,
                         .quiet = si > 0};
        dj_gpu_state *s = gpu_state_new(&m, &o, &e);
        if (!s || gpu_forward(s, 0, tok, POS, 0, NULL, 0, &e)) return fprintf(stderr, "share_sweep: %s\n", e.msg), 1;
        for (int ti = 0; ti < nT; ti++) {
            int64_t T = (int64_t)Ts[ti];
            double t[64];
            dj_gpu_stats st0, st1;
            gpu_state_stats(s, &st0);
            for (int r = 0; r < reps; r++) {
                double t0 = dj_now();
                if (gpu_forward(s, 0, tok + POS, T, POS, logits, 0, &e)) return fprintf(stderr, "share_sweep: %s\n", e.msg), 1;
                t[r] = dj_now() - t0;
            }
            gpu_state_stats(s, &st1);
            qsort(t, (size_t)reps, sizeof *t, cmp_d);
            double cpu_ms = st1.cpu_ms - st0.cpu_ms, cpu_gb = (double)(st1.cpu_bytes - st0.cpu_bytes) / 1e9;
            printf("%s\n  {\"share\": %g, \"T\": %lld, \"share_used\": %.4f, \"ms\": %.3f, \"cpu_gb_s\": %.2f, "
                   "\"cpu_ms_per_pass\": %.2f, \"wait_ms_per_pass\": %.2f}",
                   si + ti ? "," : "", shares[si], (long long)T, gpu_cpu_share_for(s, T), t[reps / 2] * 1e3,
                   cpu_ms > 0 ? cpu_gb / cpu_ms * 1e3 : 0.0, cpu_ms / reps, (st1.cpu_wait_ms - st0.cpu_wait_ms) / reps);
            fflush(stdout);
        }
        gpu_state_free(s);
    }
    printf("\n]}\n");
    model_free(&m);
    free(tok), free(logits);
    return 0;
}
