// probe_gpu.c: the GPU engine's side of probes (probe.h). The control vectors live on the device and are added by
// gpu_residual_add on the compute stream after their layers; a dumped layer's rows come back to pinned memory and
// are recorded on the host. gpu.c fuses a layer's residual add into the next layer's norm, so after a layer the
// stream is d_x + d_delta: a dump reads that sum (made in d_xb, free between layers, leaving d_x as it was) and a
// vector turns d_x into the sum plus the vector, the next norm then adding nothing. The sums are the fused norm's,
// so a zero vector (-0.0f entries: probe_vector) gives bitwise the logits of no probe at all. A tapped layer (the
// server's breakpoints) also leaves the sum in d_x: the pass's rows come back, the tapped ones are copied out or
// written over and copied back, and the next norm adds nothing. On several GPUs (tp_engine.c) every GPU holds the
// whole residual stream: each adds the vectors and writes the replacing rows into its own, so the streams stay
// equal; the first alone records the dump and fills the breakpoints' rows (counting them as passed).
#include <stdlib.h>
#include <string.h>

#include "gpu_impl.h"

int gpu_set_probe(dj_gpu_state *s, dj_probe *p, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_probe *pr = &s->pr;
    size_t dim = c->dim;
    if (gpu_stream_sync(s->compute, e)) return -1;  // no pass still reads the vectors
    graphs_drop(s);  // captured again, with or without the additions
    pr->p = NULL;
    if (!p) return 0;
    if (probe_dim(p) != dim) return dj_fail(e, "gpu: a probe of dim %u for a model of dim %zu", probe_dim(p), dim);
    if (!pr->d_vec) {
        if (gpu_malloc((void **)&pr->d_vec, (size_t)c->n_layers * dim * 4, "control vectors", e) ||
            gpu_host_alloc((void **)&pr->h_rows, (size_t)s->max_batch * dim * 4, "dumped rows", e))
            return -1;
        pr->steered = calloc(c->n_layers, 1);
        pr->pos = malloc((size_t)s->max_batch * sizeof *pr->pos);
        pr->kv_slot = malloc((size_t)s->max_batch * sizeof *pr->kv_slot);
        if (!pr->steered || !pr->pos || !pr->kv_slot) return dj_fail(e, "out of memory");
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const float *v = probe_vector(p, l);
        pr->steered[l] = v != NULL;
        if (v && gpu_h2d(pr->d_vec + l * dim, v, dim * 4, e)) return -1;
    }
    pr->p = p;
    return 0;
}

int gpu_probe_graphable(const dj_gpu_state *s) {
    return !s->pr.p || (!probe_any_dump(s->pr.p) && !probe_any_tap(s->pr.p));
}

// Where each of the pass's T rows sits: a step's rows each at its own place, a prefill's at consecutive positions
// of its slot.
static void place_rows(dj_gpu_state *s, const pass_desc *pd) {
    gpu_probe *pr = &s->pr;
    for (int64_t t = 0; t < pd->T; t++) {
        pr->pos[t] = pd->step ? s->b.h_pos[t] : s->b.h_pos[0] + t;
        pr->kv_slot[t] = pd->step ? s->b.h_kv_slot[t] : pd->kv_slot;
    }
}

// The taps after layer l, d_x (T, dim) holding the residual stream: the rows come back; a tapped row is copied out,
// or written over and copied back with the adjacent ones written over.
static int tap_rows(dj_gpu_state *s, int l, int64_t T, dj_err *e) {
    gpu_probe *pr = &s->pr;
    const int lead = s->opts.tp_rank == 0;  // several GPUs: the others only write the replacing rows
    const int64_t dim = s->m->info.config.dim;
    const size_t row = (size_t)dim * 4;
    if (gpu_d2h_async(pr->h_rows, s->b.x, (size_t)T * row, s->compute, e) || share_flush(s, e) ||
        gpu_stream_sync(s->compute, e))
        return -1;
    int64_t run = 0, wrote = 0;  // rows written over just before t; any at all
    for (int64_t t = 0; t <= T; t++) {
        int replace = 0;
        float *h = pr->h_rows + t * dim;
        const float *r = NULL;
        if (t < T && lead) {
            float *out = probe_tap_row(pr->p, (uint32_t)l, pr->kv_slot[t], pr->pos[t], &replace);
            if (out && !replace) memcpy(out, h, row);  // a breakpoint's row
            r = out;
        } else if (t < T) {
            r = probe_tap_peek(pr->p, (uint32_t)l, pr->kv_slot[t], pr->pos[t], &replace);
        }
        if (r && replace) {
            memcpy(h, r, row), run++;
            continue;
        }
        if (run && gpu_h2d_async(s->b.x + (t - run) * dim, h - run * dim, (size_t)run * row, s->compute, e)) return -1;
        wrote += run, run = 0;
    }
    // h_rows is free again for the next layer's rows
    return wrote && (share_flush(s, e) || gpu_stream_sync(s->compute, e)) ? -1 : 0;
}

int gpu_probe_layer(dj_gpu_state *s, const pass_desc *pd, int l, int *pending, dj_err *e) {
    gpu_probe *pr = &s->pr;
    gpu_bufs *b = &s->b;
    int64_t T = pd->T;
    if (!pr->p) return 0;
    int64_t dim = s->m->info.config.dim;
    // several GPUs: the first records the dump
    const int dump = probe_dumps(pr->p, (uint32_t)l) && s->opts.tp_rank == 0, tap = probe_tapped(pr->p, (uint32_t)l);
    const float *v = pr->steered[l] ? pr->d_vec + (int64_t)l * dim : NULL;
    if (!dump && !v && !tap) return 0;
    float *res = v || tap ? b->x : b->xb;
    if (gpu_residual_add(res, b->x, b->delta, v, T, dim, s->compute, e)) return -1;
    if (v || tap) *pending = 0;
    place_rows(s, pd);
    if (tap && tap_rows(s, l, T, e)) return -1;
    if (!dump) return 0;
    if (gpu_d2h_async(pr->h_rows, res, (size_t)(T * dim) * 4, s->compute, e) || share_flush(s, e) ||
        gpu_stream_sync(s->compute, e))
        return -1;
    return probe_record(pr->p, (uint32_t)l, pr->h_rows, T, pd->tokens, pr->pos, pr->kv_slot, e);
}

void gpu_probe_free(dj_gpu_state *s) {
    gpu_probe *pr = &s->pr;
    gpu_free(pr->d_vec);
    gpu_host_free(pr->h_rows);
    free(pr->steered), free(pr->pos), free(pr->kv_slot);
    memset(pr, 0, sizeof *pr);
}
