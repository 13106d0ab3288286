// bench/depth_bench.c: what a decode step costs deep into the context, for each KV cache type, on the GPU machine.
// The model opened as djinn opens it (the automatic budget: resident where it fits) with one slot of CTX positions
// in each type, then a decode step (one token, its logits to the host) at each depth: the median of REPS steps.
// The cache's contents do not change the work (attention reads positions 0..depth whatever they hold), so no
// prefill fills them first. JSON on stdout; the bytes a step reads (the resident weights once, the KV cache up to
// the depth) beside each time, for bench/depth_bench.sh to set against the device's measured bandwidth.
//
//   depth_bench MODEL.bin CTX DEPTH[,DEPTH...] [REPS] [TYPES]     TYPES: e.g. f32,f16,q8 (the default)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine.h"
#include "../loader.h"
#include "../util.h"
#include "sort_times.h"

static void die(const char *what, const dj_err *e) {
    fprintf(stderr, "depth_bench: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: depth_bench MODEL.bin CTX DEPTH[,DEPTH...] [REPS] [TYPES]\n");
        return 2;
    }
    const int64_t ctx = atoll(argv[2]);
    const int reps = argc > 4 ? atoi(argv[4]) : 20;
    const char *types = argc > 5 ? argv[5] : "f32,f16,q8";
    int64_t depths[64];
    int nd = 0;
    for (char *p = argv[3]; *p && nd < 64;) {
        depths[nd++] = strtoll(p, &p, 10);
        if (*p == ',') p++;
    }
    if (ctx < 2 || reps < 1 || reps > 1000 || nd < 1) return fprintf(stderr, "depth_bench: bad CTX, DEPTH or REPS\n"), 2;
    for (int i = 0; i < nd; i++)
        if (depths[i] < 0 || depths[i] >= ctx) return fprintf(stderr, "depth_bench: depth %lld outside the context\n",
                                                              (long long)depths[i]), 2;
    dj_model m = {0};
    dj_load_opts lo = {.want_pinned = 1, .quiet = 1};
    dj_err e;
    if (model_load(argv[1], &lo, &m, &e)) die(argv[1], &e);
    const int64_t V = m.info.config.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    double *t = malloc((size_t)reps * sizeof *t);
    printf("{\"model\": \"%s\", \"ctx\": %lld, \"reps\": %d, \"types\": [", argv[1], (long long)ctx, reps);
    char list[64];
    snprintf(list, sizeof list, "%s", types);
    int first = 1;
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        const int kt = dj_kv_parse(name);
        if (kt < 0) return fprintf(stderr, "depth_bench: KV type %s unknown\n", name), 2;
        dj_gpu_opts go = {.max_seq = ctx, .kv_type = kt, .warm_rows = 2, .quiet = 1};
        dj_engine eng;
        if (engine_open(&eng, &m, &go, 1, &e)) die("engine", &e);
        dj_gpu_stats st = {0};
        engine_gpu_stats(&eng, &st);
        const uint64_t pos_bytes = engine_kv_pos_bytes(&m.info.config, kt);
        printf("%s\n  {\"kv_type\": \"%s\", \"kv_pos_bytes\": %llu, \"weight_bytes\": %llu, \"streamed_units\": %d, "
               "\"steps\": [", first ? "" : ",", name, (unsigned long long)pos_bytes,
               (unsigned long long)st.resident_bytes, st.n_streamed);
        first = 0;
        for (int i = 0; i < nd; i++) {
            const int32_t tok = (int32_t)(1000 % V);
            for (int r = 0; r < reps + 2; r++) {  // two unmeasured: the graph's first launch at a new position
                double t0 = dj_now();
                if (eng.forward(eng.ctx, 0, &tok, 1, depths[i], logits, 0, &e)) die("step", &e);
                if (r >= 2) t[r - 2] = dj_now() - t0;
            }
            sort_times(t, reps);
            const double bytes = (double)st.resident_bytes + (double)(depths[i] + 1) * (double)pos_bytes;
            printf("%s{\"depth\": %lld, \"ms\": %.4f, \"bytes\": %.0f}", i ? ", " : "", (long long)depths[i],
                   t[reps / 2] * 1e3, bytes);
            fprintf(stderr, "depth_bench: %s depth %lld: %.3f ms\n", name, (long long)depths[i], t[reps / 2] * 1e3);
            fflush(stdout);
        }
        printf("]}");
        engine_close(&eng);
    }
    printf("\n]}\n");
    free(logits), free(t);
    model_free(&m);
    return 0;
}
