// bench/share_sweep.c: the CPU share against a sweep of fixed shares, on the GPU machine. The model is loaded once
// and a GPU engine opened at RING_GB for each share (-1: automatic, 0: the link alone), all at once; then for each T
// the engines take turns, REPS rounds, each round starting one engine later: in its turn an engine runs WARM
// untimed passes of T rows (WARM_FIRST before the first round) and TIMED timed ones (a pass: a forward of T tokens
// at position POS, the last row's logits to the host: a decode step at T = 1, a verification or batched pass
// above). Interleaved so that the host's drift (its CPU rate moved by up to 25% within a call) falls on every share
// alike, where engines one after the other gave each share the host of its own moment. JSON on stdout: per share
// and T the median pass (and the fastest and slowest), the automatic share's choice for T beside it, so that a
// report can set it against the best fixed share of the same run, and the CPU's rate within the passes (its time
// on its rows) and the host's wait for their inputs.
//
//   share_sweep MODEL.bin RING_GB T,T,... SHARE,SHARE,... [REPS]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu.h"
#include "../loader.h"
#include "../util.h"

#define POS 64     // the passes start here (a short context in the KV cache)
#define WARM 1     // untimed passes of T rows before each engine's timed ones in a round (the copies issued ahead
                   // for them by the engine before, and by this one for passes of another T, are off)
#define TIMED 2    // timed passes of each engine in a round
#define WARM_FIRST 3  // untimed passes of each engine before the first round of a T
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

// One pass of T rows at POS; exits on failure.
static void pass(dj_gpu_state *s, const int32_t *tok, int64_t T, float *logits) {
    dj_err e;
    if (gpu_forward(s, 0, tok + POS, T, POS, logits, 0, &e)) fprintf(stderr, "share_sweep: %s\n", e.msg), exit(1);
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
    dj_gpu_state *eng[MAX_LIST];
    for (int si = 0; si < nS; si++) {
        dj_gpu_opts o = {.max_seq = POS + 512, .ring_gb = atof(argv[2]), .cpu_share = shares[si], .warm_rows = 2,
                         .quiet = si > 0};
        eng[si] = gpu_state_new(&m, &o, &e);
        if (!eng[si] || gpu_forward(eng[si], 0, tok, POS, 0, NULL, 0, &e))
            return fprintf(stderr, "share_sweep: %s\n", e.msg), 1;
    }
    for (int ti = 0; ti < nT; ti++) {
        int64_t T = (int64_t)Ts[ti];
        static double t[MAX_LIST][64 * TIMED];
        double cpu_ms[MAX_LIST] = {0}, cpu_gb[MAX_LIST] = {0}, wait_ms[MAX_LIST] = {0};
        for (int si = 0; si < nS; si++)  // the automatic share learns T's rate before any pass is timed
            for (int w = 0; w < WARM_FIRST; w++)
                pass(eng[si], tok, T, logits);
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < nS; k++) {
                int si = (k + r) % nS;  // each round starts one engine later
                dj_gpu_state *s = eng[si];
                dj_gpu_stats st0, st1;
                for (int w = 0; w < WARM; w++) pass(s, tok, T, logits);
                gpu_state_stats(s, &st0);
                for (int w = 0; w < TIMED; w++) {
                    double t0 = dj_now();
                    pass(s, tok, T, logits);
                    t[si][r * TIMED + w] = dj_now() - t0;
                }
                gpu_state_stats(s, &st1);
                cpu_ms[si] += st1.cpu_ms - st0.cpu_ms, cpu_gb[si] += (double)(st1.cpu_bytes - st0.cpu_bytes) / 1e9;
                wait_ms[si] += st1.cpu_wait_ms - st0.cpu_wait_ms;
            }
        for (int si = 0; si < nS; si++) {
            int n = reps * TIMED;
            qsort(t[si], (size_t)n, sizeof t[si][0], cmp_d);
            printf("%s\n  {\"share\": %g, \"T\": %lld, \"share_used\": %.4f, \"ms\": %.3f, \"ms_min\": %.3f, "
                   "\"ms_max\": %.3f, \"cpu_gb_s\": %.2f, \"cpu_ms_per_pass\": %.2f, \"wait_ms_per_pass\": %.2f}",
                   si + ti ? "," : "", shares[si], (long long)T, gpu_cpu_share_for(eng[si], T), t[si][n / 2] * 1e3,
                   t[si][0] * 1e3, t[si][n - 1] * 1e3, cpu_ms[si] > 0 ? cpu_gb[si] / cpu_ms[si] * 1e3 : 0.0,
                   cpu_ms[si] / n, wait_ms[si] / n);
            fflush(stdout);
        }
    }
    for (int si = 0; si < nS; si++) gpu_state_free(eng[si]);
    printf("\n]}\n");
    model_free(&m);
    free(tok), free(logits);
    return 0;
}
