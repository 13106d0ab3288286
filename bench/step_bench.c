// bench/step_bench.c: a server's decode turn without the server, on the GPU machine. The model opened as djinn serve
// opens it (resident where it fits) with ROWS slots of CTX positions, then a turn of ROWS rows, row r decoding one
// token at DEPTH in slot r, through step_rows_pick as batch.c runs it (greedy, only the ids back): the median of REPS
// turns at each depth. The cache's contents do not change the work (attention reads positions 0..DEPTH whatever
// they hold), so no prefill fills them first. JSON on stdout: each depth's ms a turn and tokens/s.
// STEP_PROFILE=1: after the timed turns, one more between cudaProfilerStart and cudaProfilerStop, so that
// `ncu --profile-from-start off` sees one turn's kernels alone. STEP_NO_GRAPH=1: every kernel launched on its own
// (djinn --no-graph), as ncu profiles them best.
//
//   step_bench MODEL.bin CTX ROWS DEPTH[,DEPTH...] [REPS] [KV_TYPE]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>

#include "../engine.h"
#include "../kvtype.h"
#include "../loader.h"
#include "../sampler.h"
#include "../util.h"
#include "sort_times.h"

static void die(const char *what, const dj_err *e) {
    fprintf(stderr, "step_bench: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: step_bench MODEL.bin CTX ROWS DEPTH[,DEPTH...] [REPS] [KV_TYPE]\n");
        return 2;
    }
    const int64_t ctx = atoll(argv[2]), rows = atoll(argv[3]);
    const int reps = argc > 5 ? atoi(argv[5]) : 50;
    const int kt = dj_kv_parse(argc > 6 ? argv[6] : "f16");
    int64_t depths[64];
    int nd = 0;
    for (char *p = argv[4]; *p && nd < 64;) {
        depths[nd++] = strtoll(p, &p, 10);
        if (*p == ',') p++;
    }
    if (ctx < 2 || rows < 1 || rows > 1024 || reps < 1 || reps > 10000 || nd < 1 || kt < 0)
        return fprintf(stderr, "step_bench: bad CTX, ROWS, DEPTH, REPS or KV_TYPE\n"), 2;
    for (int i = 0; i < nd; i++)
        if (depths[i] < 0 || depths[i] >= ctx)
            return fprintf(stderr, "step_bench: depth %lld outside the context\n", (long long)depths[i]), 2;
    dj_model m = {0};
    dj_load_opts lo = {.want_pinned = 1, .quiet = 1};
    dj_err e;
    if (model_load(argv[1], &lo, &m, &e)) die(argv[1], &e);
    const int64_t V = m.info.config.vocab_size;
    const char *ng = getenv("STEP_NO_GRAPH");
    dj_gpu_opts go = {.max_seq = ctx, .kv_type = kt, .quiet = 1, .no_graph = ng && *ng == '1'};
    dj_engine eng;
    if (engine_open(&eng, &m, &go, (int32_t)rows, &e)) die("engine", &e);
    if (!eng.step_rows_pick) die("engine", &(dj_err){.msg = "no step_rows_pick"});
    dj_sampler *smp = sampler_new(V, 0.0, 1.0, 1, &e);
    if (!smp) die("sampler", &e);
    int32_t *slots = malloc((size_t)rows * sizeof *slots), *tok = malloc((size_t)rows * sizeof *tok);
    int32_t *want = malloc((size_t)rows * sizeof *want), *next = malloc((size_t)rows * sizeof *next);
    int64_t *pos = malloc((size_t)rows * sizeof *pos);
    dj_pick_args *args = malloc((size_t)rows * sizeof *args);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!slots || !tok || !want || !next || !pos || !args || !t) die("out of memory", NULL);
    for (int64_t r = 0; r < rows; r++) slots[r] = (int32_t)r, tok[r] = (int32_t)((1000 + 7 * r) % V), want[r] = (int32_t)r;
    for (int64_t r = 0; r < rows; r++) sampler_step_args(smp, &args[r]);
    const char *prof = getenv("STEP_PROFILE");
    printf("{\"model\": \"%s\", \"ctx\": %lld, \"rows\": %lld, \"reps\": %d, \"kv_type\": \"%s\", \"steps\": [",
           argv[1], (long long)ctx, (long long)rows, reps, dj_kv_name(kt));
    for (int i = 0; i < nd; i++) {
        for (int64_t r = 0; r < rows; r++) pos[r] = depths[i];
        for (int k = 0; k < reps + 3; k++) {  // three unmeasured: the first sight of the rows, the graph's capture
            double t0 = dj_now();
            if (eng.step_rows_pick(eng.ctx, rows, slots, pos, tok, rows, want, args, next, &e)) die("turn", &e);
            if (k >= 3) t[k - 3] = dj_now() - t0;
        }
        sort_times(t, reps);
        printf("%s{\"depth\": %lld, \"ms\": %.4f, \"tok_s\": %.1f}", i ? ", " : "", (long long)depths[i],
               t[reps / 2] * 1e3, (double)rows / t[reps / 2]);
        fprintf(stderr, "step_bench: %lld rows at depth %lld: %.3f ms\n", (long long)rows, (long long)depths[i],
                t[reps / 2] * 1e3);
        fflush(stdout);
        if (prof && *prof == '1' && i == nd - 1) {
            if (cudaProfilerStart() != cudaSuccess) die("cudaProfilerStart", NULL);
            if (eng.step_rows_pick(eng.ctx, rows, slots, pos, tok, rows, want, args, next, &e)) die("turn", &e);
            if (cudaProfilerStop() != cudaSuccess) die("cudaProfilerStop", NULL);
        }
    }
    printf("]}\n");
    free(slots), free(tok), free(want), free(next), free(pos), free(args), free(t);
    sampler_free(smp);
    engine_close(&eng);
    model_free(&m);
    return 0;
}
