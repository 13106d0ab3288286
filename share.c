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
    cpu_matvec_start(sh->work, sh->h_cy, sh->h_cx, cw, wt, T, mt->n_in, nc, &sh->h_words[SW_X], &sh->h_words[SW_DONE], seq);
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

// ---- --cpu-share auto
// For a pass of T rows, the fraction that makes the pass shortest: the GPU's copies and the CPU's side run side by
// side, and the pass takes the longer of them. The CPU's side is the pass's time outside its streamed units (the
// resident layers and the head, which the CPU waits through while the copies may run: rb_spread; measured by the
// passes, share_outside), then its bytes at its rate for T rows plus a round trip per matrix it has rows of (x to
// the host, the CPU's rows back, the GPU's work in between: ~SPLIT_COST_S, in which the CPU idles, and T rows of x
// and of the results over PCIe at ~SPLIT_IO_GBS); the copies run at LINK_SHARED times the warm-up's H2D rate, the
// CPU's reads of host memory taking the rest. The round trips grow with the share in steps (share_fill: whole
// matrices first), so the shares are tried a hundredth apart (the trips and their bytes for each worked out once).
// Where the round trips would eat most of the gain (small models, many rows), the share stays off.
// The CPU's rate for T rows is what passes of T rows measured (its time on its rows, share_learn), and until one
// has run, its rate alone measured at set-up over one streamed unit's matrices ("iso": one row best of three, the
// first touch warming; 4 and 16 rows best of two, and a line through those two for the other T, never faster than
// one row) times what a pass leaves of it: the CPU computes slower within passes than alone, more so the more rows:
// DERATE_ONE / (1 + (T - 1) / DERATE_ROWS), scaled to what passes of the nearest T measured. Learnt rates follow
// the machine of the day and keep a pass of many rows from waiting on the CPU. (Figures: bench/results/code_notes,
// share_auto.)
#define SH_TOP 95    // automatic shares go up to SH_TOP / SH_GRID, as fixed ones do
#define SH_KEEP 0.03
#define SH_MIN_UNIT 8e6  // bytes a streamed unit, on average, below which no share pays (~2 round trips of copy)
#define SPLIT_COST_S 80e-6
#define SPLIT_IO_GBS 20.0
#define LINK_SHARED 0.88
#define DERATE_ONE 0.8
#define DERATE_ROWS 24.0

// Seconds for the CPU to compute the unit's matrices over T rows (x zero), best of `reps`.
static double cpu_unit_time(dj_gpu_state *s, const sp_mat *mats, int n, const uint8_t *base, int64_t T, int reps) {
    gpu_share *sh = &s->sh;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = dj_now();
        for (int i = 0; i < n; i++) {
            memset(sh->h_cx, 0, (size_t)(T * mats[i].n_in) * 4);
            cpu_matvec_multi(sh->h_cy, sh->h_cx, base + mats[i].off, mats[i].dtype, T, mats[i].n_in, mats[i].n_out);
        }
        double t = dj_now() - t0;
        if (t > 0 && (best == 0 || t < best)) best = t;
    }
    return best;
}

// The row count nearest T, from d0 rows away (the lower first on a tie), whose a (and b, where given) passes have
// measured (> 0); 0: none.
static int64_t share_nearest(const gpu_share *sh, int64_t T, int64_t d0, const double *a, const double *b) {
    for (int64_t d = d0; d < sh->max_rows; d++)
        for (int64_t u = T - d; u <= T + d; u += d ? 2 * d : 1)
            if (u >= 1 && u <= sh->max_rows && a[u] > 0 && (!b || b[u] > 0)) return u;
    return 0;
}

// A measure learnt from the passes: half the last pass's, half what was learnt before (the first pass's alone).
static double share_mean2(double was, double now) { return was > 0 ? 0.5 * (was + now) : now; }

// What a pass leaves of the CPU's rate alone for T rows: the default curve, scaled to the nearest T whose passes
// measured it (the lower first on a tie), so that a share no pass of T rows has tried yet starts from the day's
// measure, not the default alone (H100 machine, 8B f16: the default put T = 16 at 0.49 where passes of 8 rows
// showed 0.8 of it, and kept its share at 0, 15% slower than a share of 0.2).
static double share_derate(const gpu_share *sh, int64_t T) {
#define DERATE(t) (DERATE_ONE / (1 + (double)((t) - 1) / DERATE_ROWS))
    const int64_t u = share_nearest(sh, T, 1, sh->seen, sh->iso);
    return u ? sh->seen[u] / sh->iso[u] / DERATE(u) * DERATE(T) : DERATE(T);
#undef DERATE
}

// A pass's round trips at `share` and the PCIe bytes they move per row: x down, the CPU's rows back, for each matrix
// the CPU has rows of, in every streamed unit.
// A chain (share_chain) makes one trip of gate, up and down: x down, h and the CPU's rows of down back.
static void share_trips(const gpu_share *sh, const unit_mats *um, double share, double *trips, double *io) {
    int chain = share_chain(um, share), kd = um->n_layer - 1;
    *trips = *io = 0;
    for (int i = 0; i <= um->n_layer; i++) {
        const sp_mat *mt = i < um->n_layer ? &um->layer[i] : &um->lm_head;
        double units = i < um->n_layer ? sh->m_layers : sh->m_head;
        int64_t nc = mt->n_out - sp_gpu_rows(mt, share);
        if (chain && i == um->gate_up_at) *trips += units, *io += units * 4.0 * (double)(mt->n_in + um->layer[kd].n_in);
        else if (chain && (i > um->gate_up_at && i < um->gate_up_at + um->n_gate_up)) continue;
        else if (chain && i == kd) *io += units * 4.0 * (double)nc;
        else if (nc > 0) *trips += units, *io += units * 4.0 * (double)(mt->n_in + nc);
    }
}

// The time a pass of T rows spent outside its streamed units (the resident ones, the head's kernels), as passes of
// T measured it, else as those of the nearest T that did (the lower first on a tie); 0 before any.
static double share_outside(const gpu_share *sh, int64_t T) {
    const int64_t u = share_nearest(sh, T, 0, sh->outside_s, NULL);
    return u ? sh->outside_s[u] : 0;
}

// by_rows[T] from the model (share_auto's terms), on the grid of shares k / SH_GRID. A share within SH_KEEP of the
// best's time stays: each change costs the copies issued ahead at the old one (the GPU's missing rows, or rows
// copied for nothing).
void share_model(gpu_share *sh, int64_t T) {
    double share = 0, c = sh->seen[T] > 0 ? sh->seen[T] : sh->iso[T] * share_derate(sh, T);
    if (T <= sh->max_rows && c > 0 && sh->m_link > 0) {
        double r = share_outside(sh, T), t_pure = sh->m_streamed / (sh->m_link * 1e9), tb_link = t_pure / LINK_SHARED;
        double tb_cpu = sh->m_streamed / (c * 1e9), t0 = t_pure > r ? t_pure : r, best = t0, now = t0;
        for (int k = 1; k <= SH_TOP; k++) {
            double f = (double)k / SH_GRID, cpu = r + f * tb_cpu + sh->grid_trips[k] * SPLIT_COST_S +
                                                  (double)T * sh->grid_io[k] / (SPLIT_IO_GBS * 1e9);
            double t = cpu > (1 - f) * tb_link ? cpu : (1 - f) * tb_link;
            if (t < best) best = t, share = f;
            if (k == (int)(sh->by_rows[T] * SH_GRID + 0.5)) now = t;
        }
        if (sh->by_rows[T] > 0 && now <= best * (1 + SH_KEEP)) share = sh->by_rows[T];
        if (!(share > 0 && best < 0.9 * t0)) share = 0;  // not worth the round trips
    }
    sh->by_rows[T] = share;
}

void share_auto(dj_gpu_state *s) {
    const rb_plan *p = s->sc.plan;
    gpu_share *sh = &s->sh;
    int u = p->stream_order[0], nl = (int)s->m->info.config.n_layers;
    const sp_mat *mats = u < nl ? s->mats.layer : &s->mats.lm_head;
    const uint8_t *base = u < nl ? dj_layer_ptr(s->m, (uint32_t)u)
                                 : s->m->info.config.tied ? dj_embed_ptr(s->m) : dj_head_ptr(s->m);
    int n = u < nl ? s->mats.n_layer : 1;
    double bytes = (double)sp_bytes(mats, n, 0);
    sh->automatic = 1;
    sh->m_streamed = (double)p->streamed_bytes, sh->m_link = sh->warm_h2d, sh->m_layers = sh->m_head = 0;
    for (int k = 0; k < p->n_streamed; k++) *(p->stream_order[k] == nl ? &sh->m_head : &sh->m_layers) += 1;
    // Units this small copy in about a round trip's time, mostly latency, which no share shortens (a test model of
    // 0.2 MB layers had its share turned on by a warm-up that measured the link below 2 GB/s): the CPU is not
    // measured, and its rate of 0 keeps every share off.
    int small = sh->m_streamed < SH_MIN_UNIT * (sh->m_layers + sh->m_head);
    int64_t ta = sh->max_rows >= 4 ? 4 : sh->max_rows, tb = sh->max_rows >= 16 ? 16 : sh->max_rows;
    double t1 = small ? 0 : cpu_unit_time(s, mats, n, base, 1, 3);
    double t_a = ta > 1 && !small ? cpu_unit_time(s, mats, n, base, ta, 2) : t1;
    double t_b = tb > ta && !small ? cpu_unit_time(s, mats, n, base, tb, 2) : t_a;
    for (int k = 0; k <= SH_TOP; k++) share_trips(sh, &s->mats, (double)k / SH_GRID, &sh->grid_trips[k], &sh->grid_io[k]);
    for (int64_t T = 1; T <= SH_ROWS; T++) {
        double t = T == 1 ? t1 : tb > ta ? t_a + (double)(T - ta) * (t_b - t_a) / (double)(tb - ta) : t_a;
        if (t < t1) t = t1;
        sh->iso[T] = t > 0 ? bytes / t / 1e9 : 0, sh->seen[T] = 0, sh->off_passes[T] = 0, sh->outside_s[T] = 0;
        share_model(sh, T);
    }
    share_rates(s);
    if (!s->opts.quiet && small)
        fprintf(stderr, "gpu: CPU share, automatic: off, the streamed units average %.1f MB (under %.0f MB, their "
                        "copies are mostly latency)\n", sh->m_streamed / (sh->m_layers + sh->m_head) / 1e6,
                SH_MIN_UNIT / 1e6);
    else if (!s->opts.quiet)
        fprintf(stderr, "gpu: CPU share, automatic: the CPU reads %.1f GB/s of weights for one row (%.1f for %lld "
                        "rows), the copies ran at %.1f GB/s: shares %.2f (1 row), %.2f (%lld), %.2f (%lld)%s\n",
                sh->iso[1], sh->iso[tb], (long long)tb, sh->m_link, sh->by_rows[1],
                sh->by_rows[8 <= sh->max_rows ? 8 : 1], 8 <= sh->max_rows ? 8LL : 1LL, sh->by_rows[sh->max_rows],
                (long long)sh->max_rows, sh->share > 0 ? "" : ": not worth the round trips for this model, off");
    // No pass will share (a share is learnt only from passes that computed rows): the threads the measurement
    // started are joined rather than left waiting for work that never comes.
    int any = 0;
    for (int64_t T = 1; T <= sh->max_rows; T++) any |= sh->by_rows[T] > 0;
    if (!any) cpu_pool_stop();
}

// Automatic: the rate the pass measured for T rows (half the last measure, half the new) and the share that
// follows. A pass whose CPU computed less than a millisecond tells little. A rate learnt in a slow moment of the
// host may turn T's share off, and a share of 0 measures nothing: so every SH_RETRY passes off, T forgets its rate
// and takes its neighbours' again (one pass in SH_RETRY may lose).
static void learn(dj_gpu_state *s, int64_t T) {
    gpu_share *sh = &s->sh;
    if (!sh->automatic || T > sh->max_rows) return;
    if (sh->pass_outside_s > 0) sh->outside_s[T] = share_mean2(sh->outside_s[T], sh->pass_outside_s);
    if (sh->pass_cpu_s < 1e-3) {  // off for T: after SH_RETRY such passes, forget what turned it off, try again
        if (sh->seen[T] > 0 && ++sh->off_passes[T] >= SH_RETRY)
            sh->seen[T] = 0, sh->off_passes[T] = 0, share_model(sh, T);
        return;
    }
    double r = (double)sh->pass_cpu_bytes / sh->pass_cpu_s / 1e9;
    sh->seen[T] = share_mean2(sh->seen[T], r);
    for (int64_t t = 1; t <= SH_ROWS; t++) share_model(sh, t);  // the rows no pass measured follow this one
    if (T == 1) share_rates(s), share_stats(s);  // the decode share's bytes
}

// The pass's CPU time into the stats, then learn; a move of the decode share counted.
void share_learn(dj_gpu_state *s, int64_t T) {
    gpu_share *sh = &s->sh;
    s->st.cpu_bytes += sh->pass_cpu_bytes, s->st.cpu_ms += sh->pass_cpu_s * 1e3;
    s->st.cpu_wait_ms += sh->pass_wait_s * 1e3, s->st.outside_ms += sh->pass_outside_s * 1e3;
    double was = sh->by_rows[1];
    learn(s, T);
    s->st.share_moves += sh->by_rows[1] != was;
}
