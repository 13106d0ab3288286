// engine.c: the CPU and GPU forward passes behind one interface (engine.h).
#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "cpu.h"
#include "gpu_host.h"

// ---- the CPU engine
static int cpu_engine_forward(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                              int all, dj_err *e) {
    return all ? cpu_forward_slot(ctx, slot, tokens, T, pos, logits, e)
               : cpu_forward_last(ctx, slot, tokens, T, pos, logits, e);
}
static int cpu_engine_rows(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                           int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    return cpu_step_rows(ctx, n, slots, pos, tokens, n_want, want, logits, e);
}
static dj_parked *cpu_engine_park(void *ctx, int32_t slot, int64_t n, dj_err *e) {
    return (dj_parked *)cpu_park(ctx, slot, n, e);
}
static int cpu_engine_restore(void *ctx, dj_parked *p, int32_t slot, dj_err *e) {
    return cpu_restore(ctx, (dj_cpu_parked *)p, slot, e);
}
static void cpu_engine_drop(void *ctx, dj_parked *p) { cpu_parked_free((dj_cpu_parked *)p); }
static void *cpu_engine_parked_kv(void *ctx, dj_parked *p, dj_err *e) { return cpu_parked_kv((dj_cpu_parked *)p); }
static int cpu_engine_set_probe(void *ctx, dj_probe *p, dj_err *e) {
    cpu_set_probe(ctx, p);
    return 0;
}
static void cpu_engine_free(void *ctx) { cpu_state_free(ctx); }

// ---- the GPU engine
static int gpu_engine_forward(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                              int all, dj_err *e) {
    return gpu_forward(ctx, slot, tokens, T, pos, logits, all, e);
}
static int gpu_engine_pick(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                           const dj_pick_args *a, const int32_t *counts, int32_t *next, dj_err *e) {
    return gpu_forward_pick(ctx, slot, tokens, T, pos, a, counts, next, e);
}
static dj_parked *gpu_engine_park(void *ctx, int32_t slot, int64_t n, dj_err *e) {
    return (dj_parked *)gpu_park(ctx, slot, n, e);
}
static int gpu_engine_restore(void *ctx, dj_parked *p, int32_t slot, dj_err *e) {
    return gpu_restore(ctx, (dj_gpu_parked *)p, slot, e);
}
static int gpu_engine_rows(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                           int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    return gpu_step_rows(ctx, n, slots, pos, tokens, n_want, want, logits, e);
}
static int gpu_engine_rows_pick(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                                int64_t n_want, const int32_t *want, const dj_pick_args *args, int32_t *next,
                                dj_err *e) {
    return gpu_step_rows_pick(ctx, n, slots, pos, tokens, n_want, want, args, next, e);
}
static void gpu_engine_drop(void *ctx, dj_parked *p) { gpu_drop(ctx, (dj_gpu_parked *)p); }
static void *gpu_engine_parked_kv(void *ctx, dj_parked *p, dj_err *e) {
    return gpu_parked_host(ctx, (dj_gpu_parked *)p, e);
}
static int gpu_engine_set_probe(void *ctx, dj_probe *p, dj_err *e) { return gpu_set_probe(ctx, p, e); }
static void gpu_engine_stats(void *ctx, dj_gpu_stats *out) { gpu_state_stats(ctx, out); }
static void gpu_engine_free(void *ctx) { gpu_state_free(ctx); }

uint64_t engine_kv_pos_bytes(const dj_config *c, int kv_type) {
    return 2ull * c->n_layers * c->n_kv_heads * dj_kv_row_bytes(kv_type, c->head_dim);
}

int engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, int32_t n_slots, dj_err *e) {
    memset(eng, 0, sizeof *eng);
    if (go->kv_type < 0 || go->kv_type >= DJ_KV_TYPES) return dj_fail(e, "KV type %d unknown", go->kv_type);
    if (!m->for_gpu) {
        dj_cpu_state *s = cpu_state_new_slots(m, go->max_seq, n_slots, go->kv_type, e);
        if (!s) return -1;
        cpu_set_cancel(s, go->cancel);
        *eng = (dj_engine){.name = "cpu", .is_gpu = 0, .ctx = s, .n_slots = n_slots, .kv_type = go->kv_type,
                           .max_seq = go->max_seq,
                           .forward = cpu_engine_forward, .pick = NULL, .step_rows = cpu_engine_rows,
                           .park = cpu_engine_park, .restore = cpu_engine_restore, .drop = cpu_engine_drop,
                           .free = cpu_engine_free, .parked_kv = cpu_engine_parked_kv,
                           .set_probe = cpu_engine_set_probe, .gpu_stats = NULL};
        return 0;
    }
    if (n_slots < 1) return dj_fail(e, "%d KV slots asked for", n_slots);
    if (go->n_gpus > 1) return tp_engine_open(eng, m, go, n_slots, e);
    dj_gpu_opts o = *go;
    o.n_slots = n_slots;
    dj_gpu_state *s = gpu_state_new(m, &o, e);
    if (!s) return -1;
    *eng = (dj_engine){.name = "gpu", .is_gpu = 1, .ctx = s, .n_slots = n_slots, .kv_type = go->kv_type,
                       .max_seq = go->max_seq,
                       .forward = gpu_engine_forward, .pick = gpu_engine_pick, .step_rows = gpu_engine_rows,
                       .step_rows_pick = gpu_engine_rows_pick, .park = gpu_engine_park, .restore = gpu_engine_restore, .drop = gpu_engine_drop,
                       .free = gpu_engine_free, .parked_kv = gpu_engine_parked_kv,
                       .set_probe = gpu_engine_set_probe, .gpu_stats = gpu_engine_stats};
    return 0;
}

void engine_default_gpus(dj_gpu_opts *go, const dj_config *c, const char *who) {
    const int visible = gpu_count();
    if (go->n_gpus || visible < 2) return;
    char why[sizeof ((dj_err *)0)->msg] = "";
    tp_default_gpus(c, visible, gpu_peer_ok, &go->n_gpus, go->gpus, why, sizeof why);
    if (why[0]) fprintf(stderr, "%s: %d GPUs visible, running on %d: %s\n", who, visible, go->n_gpus, why);
}

void engine_close(dj_engine *eng) {
    if (eng->free) eng->free(eng->ctx);
    memset(eng, 0, sizeof *eng);
}

int engine_gpu_stats(const dj_engine *eng, dj_gpu_stats *out) {
    if (!eng->gpu_stats) return 0;
    eng->gpu_stats(eng->ctx, out);
    return 1;
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
