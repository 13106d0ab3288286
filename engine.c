// engine.c: the CPU and GPU forward passes behind one interface (engine.h).
#include "engine.h"

#include <string.h>

#include "cpu.h"

// ---- the CPU engine
static int cpu_engine_forward(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                              int all, dj_err *e) {
    if (all || !logits || T <= 1) return cpu_forward_slot(ctx, slot, tokens, T, pos, logits, e);
    // only the last row: the head runs for one position
    if (cpu_forward_slot(ctx, slot, tokens, T - 1, pos, NULL, e)) return -1;
    return cpu_forward_slot(ctx, slot, tokens + T - 1, 1, pos + T - 1, logits, e);
}
static int cpu_engine_step(void *ctx, int32_t B, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                           float *logits, dj_err *e) {
    return cpu_step_batch(ctx, B, slots, pos, tokens, logits, e);
}
static dj_parked *cpu_engine_park(void *ctx, int32_t slot, int64_t n, dj_err *e) {
    return (dj_parked *)cpu_park(ctx, slot, n, e);
}
static int cpu_engine_restore(void *ctx, dj_parked *p, int32_t slot, dj_err *e) {
    return cpu_restore(ctx, (dj_cpu_parked *)p, slot, e);
}
static void cpu_engine_drop(void *ctx, dj_parked *p) { cpu_parked_free((dj_cpu_parked *)p); }
static void cpu_engine_free(void *ctx) { cpu_state_free(ctx); }

// ---- the GPU engine: one KV slot, no batched step and no parking yet (the server refuses it)
static int gpu_one_slot(int32_t slot, dj_err *e) {
    return slot ? dj_fail(e, "gpu: KV slot %d does not exist (the GPU engine has one)", slot) : 0;
}
static int gpu_engine_forward(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                              int all, dj_err *e) {
    if (gpu_one_slot(slot, e)) return -1;
    return gpu_forward(ctx, tokens, T, pos, logits, all, e);
}
static int gpu_engine_pick(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                           const dj_pick_args *a, const int32_t *counts, int32_t *next, dj_err *e) {
    if (gpu_one_slot(slot, e)) return -1;
    return gpu_forward_pick(ctx, tokens, T, pos, a, counts, next, e);
}
static void gpu_engine_free(void *ctx) { gpu_state_free(ctx); }

uint64_t engine_kv_pos_bytes(const dj_config *c) {
    return 2ull * c->n_layers * c->n_kv_heads * c->head_dim * sizeof(float);
}

int engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, int32_t n_slots, dj_err *e) {
    memset(eng, 0, sizeof *eng);
    if (!m->for_gpu) {
        dj_cpu_state *s = cpu_state_new_slots(m, go->max_seq, n_slots, e);
        if (!s) return -1;
        *eng = (dj_engine){"cpu", 0, s, n_slots, go->max_seq, cpu_engine_forward, NULL, cpu_engine_step,
                           cpu_engine_park, cpu_engine_restore, cpu_engine_drop, cpu_engine_free};
        return 0;
    }
    if (n_slots != 1)
        return dj_fail(e, "the GPU engine has one KV slot (no step_batch, park or restore yet): %d slots asked for; "
                          "run on the CPU (--cpu)", n_slots);
    dj_gpu_state *s = gpu_state_new(m, go, e);
    if (!s) return -1;
    *eng = (dj_engine){"gpu", 1, s, 1, go->max_seq, gpu_engine_forward, gpu_engine_pick, NULL, NULL, NULL, NULL,
                       gpu_engine_free};
    return 0;
}

void engine_close(dj_engine *eng) {
    if (eng->free) eng->free(eng->ctx);
    memset(eng, 0, sizeof *eng);
}

int engine_next(dj_engine *eng, dj_sampler *smp, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                float *logits, int32_t *next, dj_err *e) {
    if (eng->pick) {
        dj_pick_args a;
        sampler_step_args(smp, &a);
        return eng->pick(eng->ctx, slot, tokens, T, pos, &a, sampler_counts(smp), next, e);
    }
    if (eng->forward(eng->ctx, slot, tokens, T, pos, logits, 0, e)) return -1;
    *next = sampler_next(smp, logits);
    return 0;
}
