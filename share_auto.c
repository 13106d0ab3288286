// share_auto.c: --cpu-share auto, the CPU share's tuner. At set-up it measures the CPU's rate over one streamed
// unit's matrices and sets each pass size's share from a model of the pass (share_model); after each pass it learns
// the rate the pass's CPU rows ran at and the pass's time outside its streamed units, and moves the shares.
#include <stdio.h>
#include <string.h>

#include "cpu.h"
#include "gpu_impl.h"

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
// has run, its rate alone measured at set-up over one streamed unit's matrices (rate_alone: one row best of three, the
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
    const share_chan *ch = &s->sh.chan;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = dj_now();
        for (int i = 0; i < n; i++) {
            memset(ch->h_in, 0, (size_t)(T * mats[i].n_in) * 4);
            cpu_matvec_multi(ch->h_out, ch->h_in, base + mats[i].off, mats[i].dtype, T, mats[i].n_in, mats[i].n_out);
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
    const share_tuner *tu = &sh->tune;
#define DERATE(t) (DERATE_ONE / (1 + (double)((t) - 1) / DERATE_ROWS))
    const int64_t u = share_nearest(sh, T, 1, tu->rate_in_passes, tu->rate_alone);
    return u ? tu->rate_in_passes[u] / tu->rate_alone[u] / DERATE(u) * DERATE(T) : DERATE(T);
#undef DERATE
}

// A pass's round trips at `share` and the PCIe bytes they move per row: x down, the CPU's rows back, for each matrix
// the CPU has rows of, in every streamed unit.
// A chain (share_chain) makes one trip of gate, up and down: x down, h and the CPU's rows of down back.
static void share_trips(const gpu_share *sh, const unit_mats *um, double share, double *trips, double *io) {
    const share_tuner *tu = &sh->tune;
    int chain = share_chain(um, share), kd = um->n_layer - 1;
    *trips = *io = 0;
    for (int i = 0; i <= um->n_layer; i++) {
        const sp_mat *mt = i < um->n_layer ? &um->layer[i] : &um->lm_head;
        double units = i < um->n_layer ? tu->m_layers : tu->m_head;
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
    const share_tuner *tu = &sh->tune;
    const int64_t u = share_nearest(sh, T, 0, tu->outside_s, NULL);
    return u ? tu->outside_s[u] : 0;
}

// by_rows[T] from the model (share_auto's terms), on the grid of shares k / SH_GRID. A share within SH_KEEP of the
// best's time stays: each change costs the copies issued ahead at the old one (the GPU's missing rows, or rows
// copied for nothing).
void share_model(gpu_share *sh, int64_t T) {
    share_tuner *tu = &sh->tune;
    double share = 0, c = tu->rate_in_passes[T] > 0 ? tu->rate_in_passes[T] : tu->rate_alone[T] * share_derate(sh, T);
    if (T <= sh->max_rows && c > 0 && tu->m_link > 0) {
        double r = share_outside(sh, T), t_pure = tu->m_streamed / (tu->m_link * 1e9), tb_link = t_pure / LINK_SHARED;
        double tb_cpu = tu->m_streamed / (c * 1e9), t0 = t_pure > r ? t_pure : r, best = t0, now = t0;
        for (int k = 1; k <= SH_TOP; k++) {
            double f = (double)k / SH_GRID, cpu = r + f * tb_cpu + tu->grid_trips[k] * SPLIT_COST_S +
                                                  (double)T * tu->grid_io[k] / (SPLIT_IO_GBS * 1e9);
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
    share_tuner *tu = &sh->tune;
    int u = p->stream_order[0], nl = (int)s->m->info.config.n_layers;
    const sp_mat *mats = u < nl ? s->mats.layer : &s->mats.lm_head;
    const uint8_t *base = u < nl ? dj_layer_ptr(s->m, (uint32_t)u)
                                 : s->m->info.config.tied ? dj_embed_ptr(s->m) : dj_head_ptr(s->m);
    int n = u < nl ? s->mats.n_layer : 1;
    double bytes = (double)sp_bytes(mats, n, 0);
    tu->automatic = 1;
    tu->m_streamed = (double)p->streamed_bytes, tu->m_link = sh->warm_h2d, tu->m_layers = tu->m_head = 0;
    for (int k = 0; k < p->n_streamed; k++) *(p->stream_order[k] == nl ? &tu->m_head : &tu->m_layers) += 1;
    // Units this small copy in about a round trip's time, mostly latency, which no share shortens (a test model of
    // 0.2 MB layers had its share turned on by a warm-up that measured the link below 2 GB/s): the CPU is not
    // measured, and its rate of 0 keeps every share off.
    int small = tu->m_streamed < SH_MIN_UNIT * (tu->m_layers + tu->m_head);
    int64_t ta = sh->max_rows >= 4 ? 4 : sh->max_rows, tb = sh->max_rows >= 16 ? 16 : sh->max_rows;
    double t1 = small ? 0 : cpu_unit_time(s, mats, n, base, 1, 3);
    double t_a = ta > 1 && !small ? cpu_unit_time(s, mats, n, base, ta, 2) : t1;
    double t_b = tb > ta && !small ? cpu_unit_time(s, mats, n, base, tb, 2) : t_a;
    for (int k = 0; k <= SH_TOP; k++)
        share_trips(sh, &s->mats, (double)k / SH_GRID, &tu->grid_trips[k], &tu->grid_io[k]);
    for (int64_t T = 1; T <= SH_ROWS; T++) {
        double t = T == 1 ? t1 : tb > ta ? t_a + (double)(T - ta) * (t_b - t_a) / (double)(tb - ta) : t_a;
        if (t < t1) t = t1;
        tu->rate_alone[T] = t > 0 ? bytes / t / 1e9 : 0, tu->rate_in_passes[T] = 0;
        tu->off_passes[T] = 0, tu->outside_s[T] = 0;
        share_model(sh, T);
    }
    share_rates(s);
    if (!s->opts.quiet && small)
        fprintf(stderr, "gpu: CPU share, automatic: off, the streamed units average %.1f MB (under %.0f MB, their "
                        "copies are mostly latency)\n", tu->m_streamed / (tu->m_layers + tu->m_head) / 1e6,
                SH_MIN_UNIT / 1e6);
    else if (!s->opts.quiet)
        fprintf(stderr, "gpu: CPU share, automatic: the CPU reads %.1f GB/s of weights for one row (%.1f for %lld "
                        "rows), the copies ran at %.1f GB/s: shares %.2f (1 row), %.2f (%lld), %.2f (%lld)%s\n",
                tu->rate_alone[1], tu->rate_alone[tb], (long long)tb, tu->m_link, sh->by_rows[1],
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
    share_tuner *tu = &sh->tune;
    if (!tu->automatic || T > sh->max_rows) return;
    if (sh->pass_outside_s > 0) tu->outside_s[T] = share_mean2(tu->outside_s[T], sh->pass_outside_s);
    if (sh->pass_cpu_s < 1e-3) {  // off for T: after SH_RETRY such passes, forget what turned it off, try again
        if (tu->rate_in_passes[T] > 0 && ++tu->off_passes[T] >= SH_RETRY)
            tu->rate_in_passes[T] = 0, tu->off_passes[T] = 0, share_model(sh, T);
        return;
    }
    double r = (double)sh->pass_cpu_bytes / sh->pass_cpu_s / 1e9;
    tu->rate_in_passes[T] = share_mean2(tu->rate_in_passes[T], r);
    for (int64_t t = 1; t <= SH_ROWS; t++) share_model(sh, t);  // the rows no pass measured follow this one
    if (T == 1) share_rates(s), share_stats(s);  // the decode share's bytes
}

void share_pass_begin(gpu_share *sh) {
    sh->pass_cpu_s = sh->pass_wait_s = sh->pass_outside_s = 0, sh->pass_cpu_bytes = 0;
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
