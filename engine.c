// engine.c: the CPU and GPU forward passes behind one interface (engine.h).
#include "engine.h"

#include <stdlib.h>
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
// step_rows on the CPU: the rows alone in their slot (decode tokens) in one cpu_step_batch, each longer run (a
// prompt's chunk) by cpu_engine_forward; the wanted rows' logits copied out. Rows checked as gpu_step_rows does.
static int cpu_engine_rows(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                           int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    dj_cpu_state *s = ctx;
    const int64_t V = cpu_vocab(s);
    for (int64_t w = 0; w < n_want; w++)
        if (want[w] < 0 || want[w] >= n || (w && want[w] <= want[w - 1]))
            return dj_fail(e, "cpu: the rows wanted are not ascending rows of the %lld", (long long)n);
    int32_t *bs = malloc((size_t)n * 4), *bt = malloc((size_t)n * 4);
    int64_t *bp = malloc((size_t)n * 8), *bw = malloc((size_t)n * 8);  // a single row: its index in want, or -1
    float *tmp = NULL;
    int rc = -1;
    int32_t B = 0;
    if (!bs || !bt || !bp || !bw) {
        dj_fail(e, "out of memory");
        goto out;
    }
    for (int64_t r = 0, len, w = 0; r < n; r += len) {
        for (len = 1; r + len < n && slots[r + len] == slots[r]; len++)
            if (pos[r + len] != pos[r + len - 1] + 1)
                return free(bs), free(bt), free(bp), free(bw),
                       dj_fail(e, "cpu: rows %lld and %lld of KV slot %d are not consecutive positions",
                               (long long)(r + len - 1), (long long)(r + len), slots[r]);
        int64_t w0 = w;
        while (w < n_want && want[w] < r + len) w++;
        if (len == 1) {
            bs[B] = slots[r], bp[B] = pos[r], bt[B] = tokens[r], bw[B++] = w > w0 ? w0 : -1;
            continue;
        }
        // a run: none wanted, its last row only (the head once), or any (every row's logits, then the wanted)
        if (w == w0 || (w == w0 + 1 && want[w0] == r + len - 1)) {
            if (cpu_engine_forward(ctx, slots[r], tokens + r, len, pos[r], w > w0 ? logits + w0 * V : NULL, 0, e))
                goto out;
            continue;
        }
        free(tmp);
        if (!(tmp = malloc((size_t)(len * V) * sizeof *tmp))) {
            dj_fail(e, "out of memory");
            goto out;
        }
        if (cpu_forward_slot(s, slots[r], tokens + r, len, pos[r], tmp, e)) goto out;
        for (int64_t k = w0; k < w; k++) memcpy(logits + k * V, tmp + (want[k] - r) * V, (size_t)V * sizeof *tmp);
    }
    if (B) {
        free(tmp);
        if (!(tmp = malloc((size_t)B * V * sizeof *tmp))) {
            dj_fail(e, "out of memory");
            goto out;
        }
        if (cpu_step_batch(s, B, bs, bp, bt, tmp, e)) goto out;
        for (int32_t b = 0; b < B; b++)
            if (bw[b] >= 0) memcpy(logits + bw[b] * V, tmp + (int64_t)b * V, (size_t)V * sizeof *tmp);
    }
    rc = 0;
out:
    free(bs), free(bt), free(bp), free(bw), free(tmp);
    return rc;
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
static int gpu_engine_step(void *ctx, int32_t B, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                           float *logits, dj_err *e) {
    return gpu_step_batch(ctx, B, slots, pos, tokens, logits, e);
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
static void gpu_engine_drop(void *ctx, dj_parked *p) { gpu_drop(ctx, (dj_gpu_parked *)p); }
static void *gpu_engine_parked_kv(void *ctx, dj_parked *p, dj_err *e) {
    return gpu_parked_host(ctx, (dj_gpu_parked *)p, e);
}
static int gpu_engine_set_probe(void *ctx, dj_probe *p, dj_err *e) { return gpu_set_probe(ctx, p, e); }
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
                           cpu_engine_rows, cpu_engine_park, cpu_engine_restore, cpu_engine_drop, cpu_engine_free,
                           cpu_engine_parked_kv, cpu_engine_set_probe};
        return 0;
    }
    if (n_slots < 1) return dj_fail(e, "%d KV slots asked for", n_slots);
    dj_gpu_opts o = *go;
    o.n_slots = n_slots;
    dj_gpu_state *s = gpu_state_new(m, &o, e);
    if (!s) return -1;
    *eng = (dj_engine){"gpu", 1, s, n_slots, go->max_seq, gpu_engine_forward, gpu_engine_pick, gpu_engine_step,
                       gpu_engine_rows, gpu_engine_park, gpu_engine_restore, gpu_engine_drop, gpu_engine_free,
                       gpu_engine_parked_kv, gpu_engine_set_probe};
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
