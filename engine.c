// engine.c: the CPU and GPU forward passes behind one interface (engine.h).
#include "engine.h"

#include <string.h>

#include "cpu.h"

static int cpu_engine_forward(void *ctx, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                              dj_err *e) {
    if (all || !logits || T <= 1) return cpu_forward(ctx, tokens, T, pos, logits, e);
    // only the last row: the head runs for one position
    if (cpu_forward(ctx, tokens, T - 1, pos, NULL, e)) return -1;
    return cpu_forward(ctx, tokens + T - 1, 1, pos + T - 1, logits, e);
}
static void cpu_engine_free(void *ctx) { cpu_state_free(ctx); }

static int gpu_engine_forward(void *ctx, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                              dj_err *e) {
    return gpu_forward(ctx, tokens, T, pos, logits, all, e);
}
static int gpu_engine_pick(void *ctx, const int32_t *tokens, int64_t T, int64_t pos, const dj_pick_args *a,
                           const int32_t *counts, int32_t *next, dj_err *e) {
    return gpu_forward_pick(ctx, tokens, T, pos, a, counts, next, e);
}
static void gpu_engine_free(void *ctx) { gpu_state_free(ctx); }

int engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, dj_err *e) {
    memset(eng, 0, sizeof *eng);
    if (!m->for_gpu) {
        dj_cpu_state *s = cpu_state_new(m, go->max_seq, e);
        if (!s) return -1;
        *eng = (dj_engine){"cpu", 0, s, cpu_engine_forward, NULL, cpu_engine_free};
        return 0;
    }
    dj_gpu_state *s = gpu_state_new(m, go, e);
    if (!s) return -1;
    *eng = (dj_engine){"gpu", 1, s, gpu_engine_forward, gpu_engine_pick, gpu_engine_free};
    return 0;
}

void engine_close(dj_engine *eng) {
    if (eng->free) eng->free(eng->ctx);
    memset(eng, 0, sizeof *eng);
}

int engine_next(dj_engine *eng, dj_sampler *smp, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                int32_t *next, dj_err *e) {
    if (eng->pick) {
        dj_pick_args a;
        sampler_step_args(smp, &a);
        return eng->pick(eng->ctx, tokens, T, pos, &a, sampler_counts(smp), next, e);
    }
    if (eng->forward(eng->ctx, tokens, T, pos, logits, 0, e)) return -1;
    *next = sampler_next(smp, logits);
    return 0;
}
