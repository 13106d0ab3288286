// share.c: the GPU engine's CPU share. The link is the limit of streaming, and the host's memory is faster than
// the link: in a decode step the GPU receives only part of each streamed unit's matrices (q|k|v, wo, gate|up, down;
// the head's lm_head) and the CPU computes the rest (cpu_matvec) from the weights where they already lie, in host
// memory: whole matrices, the largest first, then the last rows of the next (share_fill). For each matrix the CPU
// has rows of, x goes to the host, the GPU computes its rows meanwhile, and the CPU's rows land in the output
// through mapped host memory. stream.c leaves the CPU's rows out of a decode pass's copies. Beside it: the geometry
// (share_split.c), the job channel (share_chan.c) and the automatic share's tuner (share_auto.c).
#include "cpu.h"
#include "gpu_impl.h"

// ---- the split matmul
// x goes to the host (the channel's h_in) and the GPU computes its rows; one row: straight into y. Several: y's rows
// are n_out apart, so the GPU's (T, gpu_rows) land in d_gpu_part and both parts are placed into y by a kernel (the
// CPU's read through the mapped view: a copy on the compute stream could queue behind a weight copy on the copy
// engine).
// The CPU's rows are a job of the pool's workers, which start as the GPU's word says x has landed, while the host
// goes on queueing the GPU's work up to the next split (its copies, the next layer's kernels) behind a wait on the
// GPU for the workers' word; the host joins the job there (share_flush). No launch stands between the CPU's rows
// and the GPU's next kernels, nor between x landing and the CPU's first rows.

// The GPU's rows [0, gr) of y = x . W^T, into y (its CPU rows, nc of them, placed there after) or, several rows
// with CPU rows, d_gpu_part placed into y.
static int share_gpu_rows(dj_gpu_state *s, float *y, const float *x, int64_t T, const uint8_t *w, const sp_mat *mt,
                          int64_t gr, int64_t nc, dj_err *e) {
    float *gy = T == 1 || !nc ? y : s->sh.d_gpu_part;
    return gr && (gpu_matmul(s->g, gy, x, w, mt->dtype, T, mt->n_in, gr, s->compute, e) ||
                  (gy != y && gpu_place_rows(y, mt->n_out, gy, gr, T, gr, s->compute, e)))
               ? -1
               : 0;
}

int share_matmul(dj_gpu_state *s, float *y, const float *x, int64_t T, const uint8_t *w, const uint8_t *hw,
                 const sp_mat *mt, double share, dj_err *e) {
    gpu_share *sh = &s->sh;
    share_chan *ch = &sh->chan;
    uint32_t wt = mt->dtype, seq = ch->jobs + 1;
    int64_t gr = sp_gpu_rows(mt, share), nc = mt->n_out - gr;
    int k = mt == &s->mats.lm_head ? 0 : (int)(mt - s->mats.layer);  // the matrix in its unit (the trace's label)
    if (nc && share_send_x(s, x, T, mt->n_in, k, seq, e)) return -1;
    if (share_gpu_rows(s, y, x, T, w, mt, gr, nc, e)) return -1;
    if (!nc) return 0;
    if (trace_split(s->tr, k, 1, e)) return -1;
    const uint8_t *cw = hw + dj_matrix_bytes(wt, (uint64_t)gr, (uint64_t)mt->n_in);
    ch->job = (share_job){1, {dj_matrix_bytes(wt, (uint64_t)nc, (uint64_t)mt->n_in), 0}, {-1, -1}, dj_now()};
    cpu_matvec_start(ch->work, ch->h_out, ch->h_in, cw, wt, T, mt->n_in, nc, &ch->h_words[SW_X_LANDED],
                     &ch->h_words[SW_ROWS_DONE], seq);
    return gpu_place_rows_after(y + gr, mt->n_out, ch->d_out, nc, T, nc, &ch->d_words[SW_ROWS_DONE], seq, s->compute,
                                e) ||
                   trace_split_placed(s->tr, k, &ch->job.mark[0], e) || share_flush_if_loading(s, e)
               ? -1
               : 0;
}

// The MLP block where the CPU has every row of gate and up (share_chain): one job of the workers computes h =
// silu(gate . x) * (up . x) and goes straight on to its rows of down over h (cpu_ffn_start), with no round trip in
// between. The GPU places h once it is whole (T * hid floats, half of gate|up's rows) for its own rows of down (w:
// the layer's slab on the device), then the CPU's rows of down once they are, into y.
int share_ffn(dj_gpu_state *s, float *y, float *hb, const float *x, int64_t T, const gpu_unit *un, dj_err *e) {
    gpu_share *sh = &s->sh;
    share_chan *ch = &sh->chan;
    const unit_mats *um = &s->mats;
    const sp_mat *gm = &um->layer[um->gate_up_at], *dn = &um->layer[um->n_layer - 1];
    const uint8_t *hw = un->host, *w = un->w;
    uint32_t wt = gm->dtype, seq = ch->jobs + 1;
    int kd = um->n_layer - 1;
    int64_t dim = gm->n_in, hid = dn->n_in, gr = sp_gpu_rows(dn, un->share), nd = dn->n_out - gr;
    if (share_send_x(s, x, T, dim, um->gate_up_at, seq, e) || trace_split(s->tr, um->gate_up_at, 1, e)) return -1;
    const uint8_t *gw = hw + gm->off;
    cpu_ffn_args f = {ch->h_out, ch->h_out + 3 * T * hid, ch->h_out + T * hid, ch->h_in, gw,
                      um->n_gate_up == 2 ? hw + gm[1].off : gw + dj_matrix_bytes(wt, (uint64_t)hid, (uint64_t)dim),
                      hw + dn->off + dj_matrix_bytes(wt, (uint64_t)gr, (uint64_t)hid), wt, T, dim, hid, nd};
    ch->job = (share_job){1, {dj_matrix_bytes(wt, 2 * (uint64_t)hid, (uint64_t)dim),
                              dj_matrix_bytes(wt, (uint64_t)nd, (uint64_t)hid)}, {-1, -1}, dj_now()};
    sh->chains++;
    cpu_ffn_start(ch->work, &f, &ch->h_words[SW_X_LANDED], &ch->h_words[SW_H_DONE], &ch->h_words[SW_ROWS_DONE],
                  seq);
    if (gr && gpu_place_rows_after(hb, hid, ch->d_out, hid, T, hid, &ch->d_words[SW_H_DONE], seq, s->compute, e))
        return -1;
    if (trace_split_placed(s->tr, um->gate_up_at, &ch->job.mark[0], e)) return -1;
    if (!nd) return share_gpu_rows(s, y, hb, T, w + dn->off, dn, gr, 0, e) || share_flush_if_loading(s, e) ? -1 : 0;
    return trace_split(s->tr, kd, 0, e) || share_gpu_rows(s, y, hb, T, w + dn->off, dn, gr, nd, e) ||
                   trace_split(s->tr, kd, 1, e) ||
                   gpu_place_rows_after(y + gr, dim, ch->d_out + 3 * T * hid, nd, T, nd, &ch->d_words[SW_ROWS_DONE],
                                        seq, s->compute, e) ||
                   trace_split_placed(s->tr, kd, &ch->job.mark[1], e) || share_flush_if_loading(s, e)
               ? -1
               : 0;
}
