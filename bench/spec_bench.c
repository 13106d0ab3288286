// bench/spec_bench.c: what speculative decoding's speed is made of, on the GPU machine. The target opened as djinn
// opens it (after the draft, resident), then: the cost of a verification pass of T = 1..T_MAX rows (forward with
// every row's logits, at position SPEC_POS, as spec.c runs it) and of a plain decode step (one row, the last logits
// only: the CUDA graph or the CPU share), and the draft's decode step. Medians of REPS passes, JSON on stdout.
//
//   spec_bench TARGET.bin DRAFT.bin RING_GB CPU_SHARE [T_MAX] [REPS]
//
// CPU_SHARE: dj_gpu_opts.cpu_share (-1: automatic, 0: the link alone). A pass's cost is timed around the call,
// logits on the host included. SPEC_T_ONLY=T times that T alone; SPEC_POS=P starts the passes at position P (default
// 256, the context before it run as one prefill; the caches hold P + 1024 positions).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine.h"
#include "../loader.h"
#include "../util.h"
#include "sort_times.h"

// The median time of reps calls of forward(T rows at pos); all: every row's logits.
static double time_pass(dj_engine *eng, const int32_t *tok, int64_t T, int64_t pos, int all, float *logits, int reps) {
    double t[64];
    dj_err e;
    for (int r = 0; r < reps; r++) {
        double t0 = dj_now();
        if (eng->forward(eng->ctx, 0, tok, T, pos, logits, all, &e)) {
            fprintf(stderr, "spec_bench: %s\n", e.msg);
            exit(1);
        }
        t[r] = dj_now() - t0;
    }
    sort_times(t, reps);
    return t[reps / 2];
}

static void load(const char *path, dj_model *m) {
    dj_load_opts lo = {.want_pinned = 1, .quiet = 1};
    dj_err e;
    if (model_load(path, &lo, m, &e)) {
        fprintf(stderr, "spec_bench: %s\n", e.msg);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: spec_bench TARGET.bin DRAFT.bin RING_GB CPU_SHARE [T_MAX] [REPS]\n");
        return 2;
    }
    int t_max = argc > 5 ? atoi(argv[5]) : 17, reps = argc > 6 ? atoi(argv[6]) : 5;
    const char *pos_env = getenv("SPEC_POS");
    const int pos = pos_env ? atoi(pos_env) : 256;  // where the timed passes start (the context before it cached)
    if (t_max < 1 || t_max > 64 || reps < 1 || reps > 64 || pos < 1 || pos > 1 << 20)
        return fprintf(stderr, "spec_bench: bad T_MAX, REPS or SPEC_POS\n"), 2;
    dj_model tm = {0}, dm = {0};
    dj_engine tgt, dft;
    dj_err e;
    load(argv[2], &dm);
    load(argv[1], &tm);
    int64_t V = tm.info.config.vocab_size;
    // the caches djinn opens (DJ_KV_DEFAULT; session 62's figures were taken on f32, these options' zero)
    dj_gpu_opts dgo = {.max_seq = pos + 1024, .warm_rows = 2, .quiet = 1, .kv_type = DJ_KV_DEFAULT};
    dj_gpu_opts tgo = {.max_seq = pos + 1024, .ring_gb = atof(argv[3]), .cpu_share = atof(argv[4]), .warm_rows = 2,
                       .kv_type = DJ_KV_DEFAULT};
    if (engine_open(&dft, &dm, &dgo, 1, &e) || engine_open(&tgt, &tm, &tgo, 1, &e)) {
        fprintf(stderr, "spec_bench: %s\n", e.msg);
        return 1;
    }
    int32_t *tok = malloc((pos + 64) * sizeof *tok);
    float *logits = malloc((size_t)(64 * V) * sizeof *logits);
    for (int i = 0; i < pos + 64; i++) tok[i] = (int32_t)((1000 + (int64_t)i * 7919) % V);  // any vocabulary
    // the context before pos, in both
    if (tgt.forward(tgt.ctx, 0, tok, pos, 0, NULL, 0, &e) || dft.forward(dft.ctx, 0, tok, pos, 0, NULL, 0, &e)) {
        fprintf(stderr, "spec_bench: %s\n", e.msg);
        return 1;
    }
    printf("{\"target\": \"%s\", \"draft\": \"%s\", \"ring_gb\": %s, \"cpu_share\": %s, \"pos\": %d, \"reps\": %d,\n",
           argv[1], argv[2], argv[3], argv[4], pos, reps);
    double step = time_pass(&tgt, tok + pos, 1, pos, 0, logits, reps);
    double dstep = time_pass(&dft, tok + pos, 1, pos, 0, logits, reps);
    printf(" \"decode_step_ms\": %.4f, \"draft_step_ms\": %.4f,\n \"verify_ms\": [", step * 1e3, dstep * 1e3);
    const char *only = getenv("SPEC_T_ONLY");  // that T alone (with DJINN_PROFILE=1: where its pass's time goes)
    for (int T = 1; T <= t_max; T++) {
        if (only && atoi(only) != T) continue;
        double t = time_pass(&tgt, tok + pos, T, pos, 1, logits, reps);
        printf("%s%.4f", T > 1 && !only ? ", " : "", t * 1e3);
        fprintf(stderr, "spec_bench: T = %d: %.2f ms\n", T, t * 1e3);
        fflush(stdout);
    }
    printf("]}\n");
    engine_close(&tgt), engine_close(&dft);
    model_free(&tm), model_free(&dm);
    free(tok), free(logits);
    return 0;
}
