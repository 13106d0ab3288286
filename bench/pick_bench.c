// bench/pick_bench.c: what picking the next token costs on a Llama 3 vocabulary (128256), per settings and kind of
// row: gpu_pick on the GPU (CUDA events around each launch; the row is restored before each, since the kernel
// overwrites it), and the host sampler on the same row (what a step paid when the logits came back to the host,
// the copy not counted). Flat rows are the worst case (every token ties; the nucleus is most of the vocabulary).
//
//   build/bin/pick_bench OUT.json
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels.h"
#include "../sampler.h"

#define V 128256
#define REPS 200

typedef struct {
    const char *name;
    dj_sampling p;
} setting;

static double host_us(dj_sampler *s, const float *z) {
    double t0 = dj_now();
    int reps = 20;
    for (int i = 0; i < reps; i++) sampler_pick_u(s, z, (float)(i + 0.5) / (float)reps);
    return (dj_now() - t0) / reps * 1e6;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: pick_bench OUT.json\n");
        return 2;
    }
    dj_err e = {{0}};
    dj_gpu *g = NULL;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    if (gpu_open(&g, 0, &e) || gpu_stream_create(&st, &e) || gpu_event_create(&e0, 1, &e) ||
        gpu_event_create(&e1, 1, &e)) {
        fprintf(stderr, "pick_bench: %s\n", e.msg);
        return 1;
    }
    setting sets[6];
    for (int i = 0; i < 6; i++) sets[i].p = DJ_SAMPLING_DEFAULT;
    sets[0].name = "greedy", sets[0].p.temp = 0;
    sets[1].name = "t1 top-p 1", sets[1].p.top_p = 1;
    sets[2].name = "t1 top-p 0.9", sets[2].p.top_p = 0.9;
    sets[3].name = "t0.8 top-k 40 top-p 0.95 min-p 0.05", sets[3].p.temp = 0.8, sets[3].p.top_k = 40;
    sets[3].p.top_p = 0.95, sets[3].p.min_p = 0.05;
    sets[4].name = "t1 min-p 0.05", sets[4].p.top_p = 1, sets[4].p.min_p = 0.05;
    sets[5].name = "t1 top-p 0.9 penalties", sets[5].p.repeat_penalty = 1.1, sets[5].p.frequency_penalty = 0.1;
    sets[5].p.presence_penalty = 0.1;
    const char *kinds[] = {"flat", "near-flat", "spread"};
    float *z = malloc((size_t)V * 4), *dz, *dsrc;
    int32_t *dout, *dcounts;
    void *scratch;
    dj_pick_args *dargs;
    if (!z || gpu_malloc((void **)&dz, V * 4, "row", &e) || gpu_malloc((void **)&dsrc, V * 4, "row", &e) ||
        gpu_malloc((void **)&dout, 4, "out", &e) || gpu_malloc((void **)&dcounts, V * 4, "counts", &e) ||
        gpu_malloc((void **)&dargs, sizeof(dj_pick_args), "args", &e) ||
        gpu_malloc(&scratch, gpu_pick_scratch(1), "scratch", &e)) {
        fprintf(stderr, "pick_bench: %s\n", e.msg);
        return 1;
    }
    FILE *out = fopen(argv[1], "w");
    if (!out) {
        perror(argv[1]);
        return 1;
    }
    fprintf(out, "{\"device\": \"%s\", \"vocab\": %d, \"cases\": [", gpu_name(g), V);
    printf("%-38s %-10s %10s %10s\n", "settings", "row", "GPU us", "host us");
    uint64_t x = 88172645463325252ull;
    int first = 1;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < V; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            float u = (float)((x >> 11) * (1.0 / 9007199254740992.0)), v = (float)((x >> 40) & 0xffff) / 65536.0f;
            float n = sqrtf(-2.0f * logf(u + 1e-12f)) * cosf(6.2831853f * v);  // N(0, 1)
            z[i] = k == 0 ? 0.0f : k == 1 ? 1e-3f * n : 3.0f * n;
        }
        if (gpu_h2d(dsrc, z, V * 4, &e)) goto fail;
        for (int si = 0; si < 6; si++) {
            dj_sampler *s = sampler_new_with(V, &sets[si].p, 1, &e);
            if (!s) goto fail;
            for (int h = 0; h < 64; h++) sampler_accept(s, (int32_t)(h * 997 % V));
            dj_pick_args a;
            sampler_step_args(s, &a);
            a.n_set = 0;
            if (gpu_h2d(dargs, &a, sizeof a, &e) ||
                (sampler_counts(s) && gpu_h2d(dcounts, sampler_counts(s), V * 4, &e)))
                goto fail;
            double total = 0;
            for (int r = -10; r < REPS; r++) {
                float ms;
                if (cudaMemcpyAsync(dz, dsrc, V * 4, cudaMemcpyDeviceToDevice, st) != cudaSuccess ||
                    gpu_event_record(e0, st, &e) ||
                    gpu_pick(scratch, dout, dz, 1, V, dargs, sampler_counts(s) ? dcounts : NULL, st, &e) ||
                    gpu_event_record(e1, st, &e) || gpu_event_sync(e1, &e) || gpu_event_ms(&ms, e0, e1, &e))
                    goto fail;
                if (r >= 0) total += ms;
            }
            double gus = total / REPS * 1e3, hus = host_us(s, z);
            printf("%-38s %-10s %10.1f %10.1f\n", sets[si].name, kinds[k], gus, hus);
            fprintf(out, "%s\n  {\"settings\": \"%s\", \"row\": \"%s\", \"gpu_us\": %.2f, \"host_us\": %.1f}",
                    first ? "" : ",", sets[si].name, kinds[k], gus, hus);
            first = 0;
            sampler_free(s);
        }
    }
    fprintf(out, "\n]}\n");
    if (fclose(out)) {
        perror(argv[1]);
        return 1;
    }
    return 0;
fail:
    fprintf(stderr, "pick_bench: %s\n", e.msg);
    return 1;
}
