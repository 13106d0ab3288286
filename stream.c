// stream.c: the copy schedule of the GPU engine: the units (layers, head) that are not resident travel from
// page-locked host memory into the ring's slots on the copy stream while the compute stream runs the unit before
// them. ringbuf.c decides where each copy lands (a slab never straddles the wrap point) and which earlier copy it
// displaces; this file issues the copies and keeps the two streams in step with per-slot events:
//   copied[slot]  recorded on the copy stream after a slot's copy; the compute stream waits on it before the unit
//   freed[slot]   recorded on the compute stream after the unit's kernels; the copy that displaces it waits on it
// A copy is issued only once the freed[] record it waits on has been enqueued (cudaStreamWaitEvent binds to the
// latest record at call time), which the ring's live >= 2 guarantees for the copy ahead of the unit computing now.
#include <stdlib.h>

#include "gpu_impl.h"

// ---- units and their copies
uint64_t unit_bytes(const dj_model *m, int u, uint64_t *lm_off) {
    const dj_model_info *in = &m->info;
    if (u < (int)in->config.n_layers) return in->layer.size;
    // Head: its slab, then (tied) the embedding table copied in as the lm_head.
    *lm_off = in->config.tied ? in->head.size : in->head.lm_head;
    return in->config.tied ? in->head.size + dj_align_up(in->embed_size, GPU_ALIGN) : in->head.size;
}

// Copies what a region of `size` bytes holding the matrices `mats` (slab order) needs on the GPU at share `to`
// and lacks in `from` (unit_copy), from src to dst: from an empty slot the bytes between the matrices and each
// one's rows [0, gpu rows at to), else each one's rows [gpu rows at from's share, gpu rows at to). Adjacent pieces
// go as one copy. *bytes += the bytes moved.
static int region_copy(uint8_t *dst, const uint8_t *src, uint64_t size, const sp_mat *mats, int n, slot_held from,
                       double to, uint64_t *bytes, cudaStream_t st, dj_err *e) {
    uint64_t start = 0, run = 0, run_end = 0;  // the copy pending: [run, run_end)
    for (int i = 0; i <= n; i++) {
        uint64_t b = from.empty ? start : size, x = size, end = size;  // the piece [b, x)
        if (i < n) {
            uint64_t rb = dj_row_bytes(mats[i].dtype, (uint64_t)mats[i].n_in);
            x = mats[i].off + (uint64_t)sp_gpu_rows(&mats[i], to) * rb;
            end = mats[i].off + (uint64_t)mats[i].n_out * rb;
            if (!from.empty) b = mats[i].off + (uint64_t)sp_gpu_rows(&mats[i], from.share) * rb;
        }
        start = end;
        if (x <= b) continue;
        if (b != run_end) {
            if (run_end > run && gpu_h2d_async(dst + run, src + run, run_end - run, st, e)) return -1;
            *bytes += run_end - run;
            run = b;
        }
        run_end = x;
    }
    if (run_end > run && gpu_h2d_async(dst + run, src + run, run_end - run, st, e)) return -1;
    *bytes += run_end - run;
    return 0;
}

int unit_copy(dj_gpu_state *s, int u, uint8_t *dst, cudaStream_t st, slot_held from, double to, uint64_t *bytes,
              dj_err *e) {
    const dj_model *m = s->m;
    const unit_mats *um = &s->mats;
    if (u < (int)m->info.config.n_layers)
        return region_copy(dst, dj_layer_ptr(m, (uint32_t)u), m->info.layer.size, um->layer, um->n_layer, from, to,
                           bytes, st, e);
    if (!m->info.config.tied)
        return region_copy(dst, dj_head_ptr(m), m->info.head.size, &um->lm_head, 1, from, to, bytes, st, e);
    if (from.empty && region_copy(dst, dj_head_ptr(m), m->info.head.size, NULL, 0, SLOT_EMPTY, 0, bytes, st, e))
        return -1;
    return region_copy(dst + s->sc.head_lm_off, dj_embed_ptr(m), m->info.embed_size, &um->lm_head, 1, from, to, bytes,
                       st, e);
}

// ---- set-up
int sched_init(dj_gpu_state *s, dj_err *e) {
    gpu_sched *sc = &s->sc;
    const rb_plan *p = sc->plan;
    if (!p->n_streamed) return 0;
    if (rb_ring_init(&sc->ring, p->ring_size, GPU_ALIGN, p->slots, e)) return -1;
    for (int i = 0; i < p->slots; i++)
        if (gpu_event_create(&sc->copied[i], 0, e) || gpu_event_create(&sc->freed[i], 0, e)) return -1;
    if (gpu_event_create(&sc->prev_done, 0, e)) return -1;
    sc->n_seq = p->n_streamed + RB_MAX_SLOTS + 1;
    sc->seq = calloc((size_t)sc->n_seq, sizeof *sc->seq);
    if (!sc->seq) return dj_fail(e, "out of memory");
    for (int i = 0; i < sc->n_seq; i++) {
        gpu_seq *q = &sc->seq[i];
        if (gpu_event_create(&q->c0, 1, e) || gpu_event_create(&q->c1, 1, e) || gpu_event_create(&q->w0, 1, e) ||
            gpu_event_create(&q->w1, 1, e) || gpu_event_create(&q->e1, 1, e))
            return -1;
    }
    return gpu_event_create(&sc->p0, 1, e) || gpu_event_create(&sc->p1, 1, e) ? -1 : 0;
}

void sched_free(dj_gpu_state *s) {
    gpu_sched *sc = &s->sc;
    for (int i = 0; i < RB_MAX_SLOTS; i++) gpu_event_destroy(sc->copied[i]), gpu_event_destroy(sc->freed[i]);
    gpu_event_destroy(sc->prev_done), gpu_event_destroy(sc->p0), gpu_event_destroy(sc->p1);
    for (int i = 0; sc->seq && i < sc->n_seq; i++) {
        gpu_seq *q = &sc->seq[i];
        gpu_event_destroy(q->c0), gpu_event_destroy(q->c1), gpu_event_destroy(q->w0), gpu_event_destroy(q->w1);
        gpu_event_destroy(q->e1);
    }
    free(sc->seq);
    free(sc->plan);
}

// ---- the schedule
static int stream_unit(const gpu_sched *sc, int64_t seq) {
    return sc->plan->stream_order[seq % sc->plan->n_streamed];
}

void sched_pass_begin(dj_gpu_state *s, int64_t T) {
    gpu_sched *sc = &s->sc;
    sc->pass_T = T;
    sc->pass_end = sc->computed + sc->plan->n_streamed;
    sc->pass_share = share_for(s, T);
    sc->pass_first = sc->computed, sc->pass_units_ms = 0;
    if (T <= SH_ROWS) sc->next_share = sc->pass_share;
}

// Issues every streamed copy whose slot is known to be free once the compute stream gets there: its wait
// (the freed[] record of the slab it displaces) must already be enqueued. --sync-copy issues only the copy
// the compute stream needs next, after everything enqueued so far (no overlap).
static int issue_copies(dj_gpu_state *s, dj_err *e) {
    gpu_sched *sc = &s->sc;
    const rb_plan *p = sc->plan;
    if (!p->n_streamed) return 0;
    for (;;) {
        if (s->opts.sync_copy && sc->issued > sc->computed) return 0;
        if (sc->issued - sc->harvested >= sc->n_seq - 1) return 0;  // timing records still unread
        if (!sc->have_pend) {
            int u = stream_unit(sc, sc->issued);
            if (rb_ring_alloc(&sc->ring, p->footprint[u], &sc->pend, e)) return -1;
            sc->have_pend = 1;
        }
        if (sc->pend.wait_seq >= sc->computed) return 0;  // the slab it displaces is not computed yet
        int64_t seq = sc->issued;
        gpu_seq *q = &sc->seq[seq % sc->n_seq];
        if (s->opts.sync_copy &&
            (gpu_event_record(sc->prev_done, s->compute, e) || gpu_stream_wait(s->copy, sc->prev_done, e)))
            return -1;
        if (sc->pend.wait_slot >= 0 && gpu_stream_wait(s->copy, sc->freed[sc->pend.wait_slot], e)) return -1;
        uint8_t *dst = sc->d_w + p->ring_off + sc->pend.off;
        // With a CPU share, a pass's copies leave out the CPU's rows at its share; the ones issued ahead for the
        // next pass at the share of the last pass of up to SH_ROWS rows, except during the warm-up (the prompt's
        // prefill follows).
        double share = seq < sc->pass_end ? sc->pass_share : sc->warming ? 0 : sc->next_share;
        q->bytes = 0;
        if (gpu_event_record(q->c0, s->copy, e) ||
            unit_copy(s, stream_unit(sc, seq), dst, s->copy, SLOT_EMPTY, share, &q->bytes, e) ||
            gpu_event_record(q->c1, s->copy, e) || gpu_event_record(sc->copied[sc->pend.slot], s->copy, e))
            return -1;
        q->share = share;
        q->off = sc->pend.off;
        q->ring_slot = sc->pend.slot;
        sc->issued++;
        sc->have_pend = 0;
    }
}

int unit_begin(dj_gpu_state *s, int u, gpu_unit *un, dj_err *e) {
    gpu_sched *sc = &s->sc;
    const rb_plan *p = sc->plan;
    *un = (gpu_unit){0};
    if (p->resident[u]) {
        un->w = sc->d_w + p->offset[u];
        return 0;
    }
    if (issue_copies(s, e)) return -1;
    int64_t seq = sc->computed;
    gpu_seq *q = &sc->seq[seq % sc->n_seq];
    if (stream_unit(sc, seq) != u || sc->issued <= seq)
        return dj_fail(e, "internal error: streaming schedule out of step at unit %d", u);
    uint8_t *in_ring = sc->d_w + p->ring_off + q->off;
    un->w = in_ring;
    // The split: the pass's share, or less where the copy (issued ahead) brought more of the unit. Where it
    // brought less (a pass of more rows than expected), the GPU's missing rows follow.
    if (q->share > sc->pass_share) {
        uint64_t extra = 0;
        if (unit_copy(s, u, in_ring, s->copy, SLOT_SPLIT_AT(q->share), sc->pass_share, &extra, e) ||
            gpu_event_record(sc->copied[q->ring_slot], s->copy, e))
            return -1;
        q->share = sc->pass_share;
    }
    if (q->share > 0) {  // split with the CPU: its rows come from the host slab
        un->host = u < (int)s->m->info.config.n_layers ? dj_layer_ptr(s->m, (uint32_t)u) : dj_head_ptr(s->m);
        un->share = q->share;
    }
    return gpu_event_record(q->w0, s->compute, e) || gpu_stream_wait(s->compute, sc->copied[q->ring_slot], e) ||
                   gpu_event_record(q->w1, s->compute, e)
               ? -1
               : 0;
}

int unit_end(dj_gpu_state *s, int u, dj_err *e) {
    gpu_sched *sc = &s->sc;
    if (sc->plan->resident[u]) return 0;
    const gpu_seq *q = &sc->seq[sc->computed % sc->n_seq];
    if (gpu_event_record(sc->freed[q->ring_slot], s->compute, e) || gpu_event_record(q->e1, s->compute, e)) return -1;
    sc->computed++;
    return issue_copies(s, e);
}

// The timing of every streamed unit computed so far (their copies and waits are complete after the pass's final
// synchronisation).
int sched_harvest(dj_gpu_state *s, dj_err *e) {
    gpu_sched *sc = &s->sc;
    for (; sc->harvested < sc->computed; sc->harvested++) {
        const gpu_seq *q = &sc->seq[sc->harvested % sc->n_seq];
        float cm, wm, um = 0;
        const int mine = sc->harvested >= sc->pass_first && sc->harvested < sc->pass_end;  // this pass's unit
        if (gpu_event_ms(&cm, q->c0, q->c1, e) || gpu_event_ms(&wm, q->w0, q->w1, e) ||
            (mine && gpu_event_ms(&um, q->w0, q->e1, e)) ||
            trace_copy(s->tr, sc->harvested, stream_unit(sc, sc->harvested), q->bytes, q->c0, q->c1, q->w0, q->w1, e))
            return -1;
        sc->pass_units_ms += um;
        s->st.copy_ms += cm;
        s->st.wait_ms += wm;
        s->st.copied_bytes += q->bytes;
    }
    return 0;
}

int sched_pass_outside(dj_gpu_state *s, double *outside_s, dj_err *e) {
    float ms;
    if (gpu_event_ms(&ms, s->sc.p0, s->sc.p1, e)) return -1;
    *outside_s = ms > s->sc.pass_units_ms ? (ms - s->sc.pass_units_ms) / 1e3 : 0;
    return 0;
}
