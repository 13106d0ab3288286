// share.c: the GPU engine's CPU share. The link is the limit of streaming, and the host's memory is faster than
// the link: in a decode step the GPU receives only part of each streamed unit's matrices (q|k|v, wo, gate|up, down;
// the head's lm_head) and the CPU computes the rest (cpu_matvec) from the weights where they already lie, in host
// memory: whole matrices, the largest first, then the last rows of the next (share_fill). For each matrix the CPU
// has rows of, x goes to the host, the GPU computes its rows meanwhile, and the CPU's rows land in the output
// through mapped host memory. stream.c leaves the CPU's rows out of a decode pass's copies.
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cpu.h"
#include "gpu_impl.h"

// The widest input and output of the split matmuls.
static void share_widths(const dj_gpu_state *s, int64_t *in, int64_t *out) {
    const dj_config *c = &s->m->info.config;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim,
            hid = c->hidden_dim, vocab = c->vocab_size;
    *in = hid > dim ? hid : dim, *out = 3 * hid + dim;  // a chain's h, gate|up and down rows (share_ffn)
    if (q > *in) *in = q;
    if (q + 2 * kv > *out) *out = q + 2 * kv;
    if (vocab > *out) *out = vocab;
}

uint64_t share_device_bytes(const dj_gpu_state *s) {
    int64_t in, out, rows = s->max_batch < SH_ROWS ? s->max_batch : SH_ROWS;
    share_widths(s, &in, &out);
    return s->opts.cpu_share != 0 ? (uint64_t)(rows * out) * 4 : 0;
}

// gpu_set_hold's: the job queued computed before cuBLAS or the scratch may block the host on the device.
static int share_hold(void *ctx, dj_err *e) { return share_flush((dj_gpu_state *)ctx, e); }

int share_init(dj_gpu_state *s, dj_err *e) {
    gpu_share *sh = &s->sh;
    int64_t in, out;
    share_widths(s, &in, &out);
    sh->max_rows = s->max_batch < SH_ROWS ? s->max_batch : SH_ROWS;
    size_t rows = (size_t)sh->max_rows;
    if (gpu_host_alloc((void **)&sh->h_cx, rows * (size_t)in * 4, "the CPU share's input", e) ||
        gpu_host_alloc((void **)&sh->h_cy, rows * (size_t)out * 4, "the CPU share's output", e) ||
        gpu_host_device_ptr((void **)&sh->d_cy, sh->h_cy, e) ||
        gpu_malloc((void **)&sh->d_sy, share_device_bytes(s), "the CPU share's GPU rows", e) ||
        gpu_host_alloc((void **)&sh->h_words, SW_N * sizeof *sh->h_words, "the CPU share's job words", e) ||
        gpu_host_device_ptr((void **)&sh->d_words, (void *)sh->h_words, e) ||
        gpu_host_device_ptr((void **)&sh->d_cx, sh->h_cx, e) ||
        gpu_malloc((void **)&sh->d_count, sizeof *sh->d_count, "the CPU share's block count", e) ||
        gpu_memset(sh->d_count, 0, sizeof *sh->d_count, s->compute, e))
        return -1;
    if (!(sh->work = cpu_job_new())) return dj_fail(e, "out of memory");
    for (int k = 0; k < SW_N; k++) atomic_store(&sh->h_words[k], 0);
    sh->jobs = 0;
    gpu_set_hold(s->g, share_hold, s);
    return 0;
}

void share_free(dj_gpu_state *s) {
    gpu_host_free(s->sh.h_cx), gpu_host_free(s->sh.h_cy), gpu_host_free((void *)s->sh.h_words);
    gpu_free(s->sh.d_sy), gpu_free(s->sh.d_count);
    cpu_job_free(s->sh.work);
}

// ---- the split matmul
// x goes to the host (h_cx) and the GPU computes its rows; one row: straight into y. Several: y's rows are n_out
// apart, so the GPU's (T, gpu_rows) land in d_sy and both parts are placed into y by a kernel (the CPU's read
// through the mapped view: a copy on the compute stream could queue behind a weight copy on the copy engine).
// The CPU's rows are a job of the pool's workers, which start as the GPU's word says x has landed, while the host
// goes on queueing the GPU's work up to the next split (its copies, the next layer's kernels) behind a wait on the
// GPU for the workers' word; the host joins the job there (share_flush). No launch stands between the CPU's rows
// and the GPU's next kernels, nor between x landing and the CPU's first rows.

// The job before first (h_cx, h_cy and the pool are taken again), then x (T, n_in) to h_cx for job `seq`.
static int share_send_x(dj_gpu_state *s, const float *x, int64_t T, int64_t n_in, int mat, uint32_t seq,
                        dj_err *e) {
    gpu_share *sh = &s->sh;
    if (T > sh->max_rows) return dj_fail(e, "internal error: a CPU share over %lld rows", (long long)T);
    return share_flush(s, e) || trace_split(s->tr, mat, 0, e) ||
                   gpu_to_host(sh->d_cx, x, T * n_in, sh->d_count, &sh->d_words[SW_X], sh->jobs = seq, s->compute, e)
               ? -1
               : 0;
}

// The GPU's rows [0, gr) of y = x . W^T, into y (its CPU rows, nc of them, placed there after) or, several rows
// with CPU rows, d_sy placed into y.
static int share_gpu_rows(dj_gpu_state *s, float *y, const float *x, int64_t T, const uint8_t *w, const sp_mat *mt,
                          int64_t gr, int64_t nc, dj_err *e) {
    float *gy = T == 1 || !nc ? y : s->sh.d_sy;
    return gr && (gpu_matmul(s->g, gy, x, w, mt->dtype, T, mt->n_in, gr, s->compute, e) ||
                  (gy != y && gpu_place_rows(y, mt->n_out, gy, gr, T, gr, s->compute, e)))
               ? -1
               : 0;
}

// A launch may block the host where a kernel is not loaded yet (gpu_kernels_loaded): no job may wait then.
static int share_posted(dj_gpu_state *s, dj_err *e) {
    return !gpu_kernels_loaded(s->g) && share_flush(s, e) ? -1 : 0;
}

int share_matmul(dj_gpu_state *s, float *y, const float *x, int64_t T, const uint8_t *w, const uint8_t *hw,
                 const sp_mat *mt, dj_err *e) {
    gpu_share *sh = &s->sh;
    uint32_t wt = mt->dtype, seq = sh->jobs + 1;
    int64_t gr = sp_gpu_rows(mt, sh->cur_share), nc = mt->n_out - gr;
    int k = mt == &s->mats.lm_head ? 0 : (int)(mt - s->mats.layer);  // the matrix in its unit (the trace's label)
    if (nc && share_send_x(s, x, T, mt->n_in, k, seq, e)) return -1;
    if (share_gpu_rows(s, y, x, T, w, mt, gr, nc, e)) return -1;
    if (!nc) return 0;
    if (trace_split(s->tr, k, 1, e)) return -1;
    const uint8_t *cw = hw + dj_matrix_bytes(wt, (uint64_t)gr, (uint64_t)mt->n_in);
    sh->job = (share_job){1, {dj_matrix_bytes(wt, (uint64_t)nc, (uint64_t)mt->n_in), 0}, {-1, -1}, dj_now()};
    cpu_matvec_start(sh->work, sh->h_cy, sh->h_cx, cw, wt, T, mt->n_in, nc, &sh->h_words[SW_X], &sh->h_words[SW_DONE],
                     seq);
    return gpu_place_rows_after(y + gr, mt->n_out, sh->d_cy, nc, T, nc, &sh->d_words[SW_DONE], seq, s->compute, e) ||
                   trace_split_placed(s->tr, k, &sh->job.mark[0], e) || share_posted(s, e)
               ? -1
               : 0;
}

// The MLP block where the CPU has every row of gate and up (share_chain): one job of the workers computes h =
// silu(gate . x) * (up . x) and goes straight on to its rows of down over h (cpu_ffn_start), with no round trip in
// between. The GPU places h once it is whole (T * hid floats, half of gate|up's rows) for its own rows of down (w:
// the layer's slab on the device), then the CPU's rows of down once they are, into y.
int share_ffn(dj_gpu_state *s, float *y, float *hb, const float *x, int64_t T, const uint8_t *w, dj_err *e) {
    gpu_share *sh = &s->sh;
    const unit_mats *um = &s->mats;
    const sp_mat *gm = &um->layer[um->gate_up_at], *dn = &um->layer[um->n_layer - 1];
    const uint8_t *hw = sh->cur_host;
    uint32_t wt = gm->dtype, seq = sh->jobs + 1;
    int kd = um->n_layer - 1;
    int64_t dim = gm->n_in, hid = dn->n_in, gr = sp_gpu_rows(dn, sh->cur_share), nd = dn->n_out - gr;
    if (share_send_x(s, x, T, dim, um->gate_up_at, seq, e) || trace_split(s->tr, um->gate_up_at, 1, e)) return -1;
    const uint8_t *gw = hw + gm->off;
    cpu_ffn_args f = {sh->h_cy, sh->h_cy + 3 * T * hid, sh->h_cy + T * hid, sh->h_cx, gw,
                      um->n_gate_up == 2 ? hw + gm[1].off : gw + dj_matrix_bytes(wt, (uint64_t)hid, (uint64_t)dim),
                      hw + dn->off + dj_matrix_bytes(wt, (uint64_t)gr, (uint64_t)hid), wt, T, dim, hid, nd};
    sh->job = (share_job){1, {dj_matrix_bytes(wt, 2 * (uint64_t)hid, (uint64_t)dim),
                              dj_matrix_bytes(wt, (uint64_t)nd, (uint64_t)hid)}, {-1, -1}, dj_now()};
    sh->chains++;
    cpu_ffn_start(sh->work, &f, &sh->h_words[SW_X], &sh->h_words[SW_MID], &sh->h_words[SW_DONE], seq);
    if (gr && gpu_place_rows_after(hb, hid, sh->d_cy, hid, T, hid, &sh->d_words[SW_MID], seq, s->compute, e))
        return -1;
    if (trace_split_placed(s->tr, um->gate_up_at, &sh->job.mark[0], e)) return -1;
    if (!nd) return share_gpu_rows(s, y, hb, T, w + dn->off, dn, gr, 0, e) || share_posted(s, e) ? -1 : 0;
    return trace_split(s->tr, kd, 0, e) || share_gpu_rows(s, y, hb, T, w + dn->off, dn, gr, nd, e) ||
                   trace_split(s->tr, kd, 1, e) ||
                   gpu_place_rows_after(y + gr, dim, sh->d_cy + 3 * T * hid, nd, T, nd, &sh->d_words[SW_DONE], seq,
                                        s->compute, e) ||
                   trace_split_placed(s->tr, kd, &sh->job.mark[1], e) || share_posted(s, e)
               ? -1
               : 0;
}

int share_flush(dj_gpu_state *s, dj_err *e) {
    gpu_share *sh = &s->sh;
    if (!sh->job.on) return 0;
    sh->job.on = 0;
    double t[3];
    if (cpu_matvec_finish(sh->work, t)) return dj_fail(e, "gpu: out of memory for the CPU share's rows");
    double t0 = sh->job.posted < t[0] ? sh->job.posted : t[0];
    sh->pass_wait_s += t[0] - t0, sh->pass_cpu_s += t[2] - t[0];
    sh->pass_cpu_bytes += sh->job.bytes[0] + sh->job.bytes[1];
    return trace_split_times(s->tr, sh->job.mark[0], t0, t[0], t[1], sh->job.bytes[0], e) ||
                   trace_split_times(s->tr, sh->job.mark[1], t[1], t[1], t[2], sh->job.bytes[1], e)
               ? -1
               : 0;
}

// x may never land (the stream failed): the workers are told it has, and compute garbage.
void share_release(dj_gpu_state *s) {
    gpu_share *sh = &s->sh;
    if (!sh->job.on) return;
    sh->job.on = 0;
    atomic_store_explicit(&sh->h_words[SW_X], sh->jobs, memory_order_release);
    double t[3];
    (void)cpu_matvec_finish(sh->work, t);  // its rows are garbage anyway
}
