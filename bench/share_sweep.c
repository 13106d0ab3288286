// bench/share_sweep.c: the CPU share against a sweep of fixed shares, on the GPU machine. The model is loaded once
// and a GPU engine opened at RING_GB for each share (-1: automatic, 0: the link alone), all at once; then for each T
// the engines take turns, REPS rounds, each round starting one engine later: in its turn an engine runs WARM
// untimed passes of T rows (WARM_FIRST before the first round) and TIMED timed ones (a pass: a forward of T tokens
// at position POS, the last row's logits to the host: a decode step at T = 1, a verification or batched pass
// above). Interleaved so that the host's drift (its CPU rate moved by up to 25% within a call) falls on every share
// alike, where engines one after the other gave each share the host of its own moment. JSON on stdout: per share
// and T the median pass (and the fastest and slowest), the automatic share's choice for T beside it, so that a
// report can set it against the best fixed share of the same run, and the CPU's rate within the passes (its time
// on its rows) and the host's wait for their inputs, and the automatic share's moves within the timed passes'
// turns; and the weights a pass streams (GB, copies and CPU rows).
// With DUEL rounds (and an automatic share among the shares), each T ends with a duel: the automatic engine and the
// fixed share whose median was fastest take turns alone, DUEL rounds of WARM + TIMED passes each, the first of a
// round alternating; "duels" gives the median of the rounds' ratios (automatic over best, each round's two engines
// minutes apart at most) with the rounds' spread. A sweep's best is the least of several noisy medians, biased low
// against any one engine; the duel sets the automatic share against it again on equal terms. Where the best share
// is in the list twice, a second duel sets its twin against it the same way ("null": 1): the duels' own noise, the
// spread a ratio of two equal engines shows.
//
//   share_sweep MODEL.bin RING_GB T,T,... SHARE,SHARE,... [REPS [DUEL]]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gpu.h"
#include "../loader.h"
#include "../util.h"
#include "sort_times.h"

#define POS 64     // the passes start here (a short context in the KV cache)
#define WARM 1     // untimed passes of T rows before each engine's timed ones in a round (the copies issued ahead
                   // for them by the engine before, and by this one for passes of another T, are off)
#define TIMED 2    // timed passes of each engine in a round
#define WARM_FIRST 3  // untimed passes of each engine before the first round of a T
#define MAX_LIST 32

// The median of v's n values (sorted in place).
static double median(double *v, int n) {
    sort_times(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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

// An engine's turn: WARM untimed passes, then the mean of TIMED timed ones (seconds).
static double turn(dj_gpu_state *s, const int32_t *tok, int64_t T, float *logits) {
    for (int w = 0; w < WARM; w++) pass(s, tok, T, logits);
    double t0 = dj_now();
    for (int w = 0; w < TIMED; w++) pass(s, tok, T, logits);
    return (dj_now() - t0) / TIMED;
}

// Engines a and b take turns alone, `duel` rounds, the first of a round alternating: the JSON of the rounds' median
// ratio (a over b) and their spread, a's share and its moves, into out.
static void duel_json(char *out, size_t n, dj_gpu_state *a, dj_gpu_state *b, double b_share, int null, int duel,
                      const int32_t *tok, int64_t T, float *logits) {
    double ratio[64], ta[64], tb[64];
    dj_gpu_stats s0, s1;
    gpu_state_stats(a, &s0);
    for (int r = 0; r < duel; r++) {
        if (r % 2) tb[r] = turn(b, tok, T, logits), ta[r] = turn(a, tok, T, logits);
        else ta[r] = turn(a, tok, T, logits), tb[r] = turn(b, tok, T, logits);
        ratio[r] = ta[r] / tb[r];
    }
    gpu_state_stats(a, &s1);
    double mr = median(ratio, duel), ma = median(ta, duel), mb = median(tb, duel);
    snprintf(out, n,
             "{\"T\": %lld, \"best_share\": %g, \"share_used\": %.4f, \"rounds\": %d, \"auto_ms\": %.3f, "
             "\"best_ms\": %.3f, \"ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f, "
             "\"share_moves\": %llu, \"null\": %d}",
             (long long)T, b_share, gpu_cpu_share_for(a, T), duel, ma * 1e3, mb * 1e3, mr, ratio[0],
             ratio[duel - 1], (unsigned long long)(s1.share_moves - s0.share_moves), null);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: share_sweep MODEL.bin RING_GB T,T,... SHARE,SHARE,... [REPS [DUEL]]\n");
        return 2;
    }
    double Ts[MAX_LIST], shares[MAX_LIST];
    int nT = parse_list(argv[3], Ts), nS = parse_list(argv[4], shares), reps = argc > 5 ? atoi(argv[5]) : 5;
    int duel = argc > 6 ? atoi(argv[6]) : 0;
    if (nT < 1 || nS < 1 || reps < 1 || reps > 64 || duel < 0 || duel > 64)
        return fprintf(stderr, "share_sweep: bad T list, shares, REPS or DUEL\n"), 2;
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
    static char duels[2 * MAX_LIST][256];
    for (int ti = 0; ti < nT; ti++) {
        int64_t T = (int64_t)Ts[ti];
        static double t[MAX_LIST][64 * TIMED];
        double med[MAX_LIST];
        double cpu_ms[MAX_LIST] = {0}, cpu_gb[MAX_LIST] = {0}, wait_ms[MAX_LIST] = {0}, out_ms[MAX_LIST] = {0};
        uint64_t moves[MAX_LIST] = {0};
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
                wait_ms[si] += st1.cpu_wait_ms - st0.cpu_wait_ms, moves[si] += st1.share_moves - st0.share_moves;
                out_ms[si] += st1.outside_ms - st0.outside_ms;
            }
        for (int si = 0; si < nS; si++) {
            int n = reps * TIMED;
            sort_times(t[si], n);
            med[si] = t[si][n / 2];
            printf("%s\n  {\"share\": %g, \"T\": %lld, \"share_used\": %.4f, \"ms\": %.3f, \"ms_min\": %.3f, "
                   "\"ms_max\": %.3f, \"cpu_gb_s\": %.2f, \"cpu_ms_per_pass\": %.2f, \"wait_ms_per_pass\": %.2f, "
                   "\"outside_ms_per_pass\": %.2f, \"share_moves\": %llu}",
                   si + ti ? "," : "", shares[si], (long long)T, gpu_cpu_share_for(eng[si], T), med[si] * 1e3,
                   t[si][0] * 1e3, t[si][n - 1] * 1e3, cpu_ms[si] > 0 ? cpu_gb[si] / cpu_ms[si] * 1e3 : 0.0,
                   cpu_ms[si] / n, wait_ms[si] / n, out_ms[si] / n, (unsigned long long)moves[si]);
            fflush(stdout);
        }
        int a = -1, b = -1;  // the automatic engine, the fastest fixed share
        for (int si = 0; si < nS; si++) {
            if (shares[si] < 0 && a < 0) a = si;
            if (shares[si] > 0 && (b < 0 || med[si] < med[b])) b = si;
        }
        int twin = -1;  // another engine at the best fixed share
        for (int si = 0; b >= 0 && si < nS; si++)
            if (si != b && shares[si] == shares[b]) twin = si;
        if (duel && a >= 0 && b >= 0) duel_json(duels[2 * ti], sizeof duels[0], eng[a], eng[b], shares[b], 0, duel,
                                                tok, T, logits);
        if (duel && twin >= 0) duel_json(duels[2 * ti + 1], sizeof duels[0], eng[twin], eng[b], shares[b], 1, duel,
                                         tok, T, logits);
    }
    dj_gpu_stats st;  // the weights a pass streams: the copies' and the CPU's bytes of the streamed units
    gpu_state_stats(eng[0], &st);
    double gb = (double)(st.bytes_per_token + st.cpu_bytes_per_token) / 1e9;
    for (int si = 0; si < nS; si++) gpu_state_free(eng[si]);
    printf("\n], \"duels\": [");
    for (int ti = 0, k = 0; ti < 2 * nT; ti++)
        if (duels[ti][0]) printf("%s\n  %s", k++ ? "," : "", duels[ti]);
    printf("\n], \"gb_streamed\": %.4f}\n", gb);
    model_free(&m);
    free(tok), free(logits);
    return 0;
}
