// share.c: the GPU engine's CPU share. The link is the limit of streaming, and the host's memory is faster than
// the link: in a decode step the GPU receives only the first rows of each streamed matrix (q|k|v, wo, gate|up,
// down, lm_head) and the CPU computes the rest (cpu_matvec) from the weights where they already lie, in host
// memory. For each split matmul x goes to the host, the GPU computes its rows meanwhile, and the CPU's rows land in
// the output through mapped host memory. stream.c leaves the CPU's rows out of a decode pass's copies.
#include <stdio.h>
#include <string.h>

#include "cpu.h"
#include "gpu_impl.h"

// ---- the split
// A matrix at `off`, (n_out, n_in) in dtype, with `share` of its rows (rounded down) on the CPU.
static sp_mat sp_split(uint64_t off, int64_t n_in, int64_t n_out, uint32_t dtype, double share) {
    return (sp_mat){off, n_in, n_out, n_out - (int64_t)((double)n_out * share), dtype};
}

// Bytes of the matrices' rows: all of them, or (cpu_only) the CPU's.
static uint64_t sp_bytes(const sp_mat *mats, int n, int cpu_only) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++)
        b += dj_matrix_bytes(mats[i].dtype, (uint64_t)(mats[i].n_out - (cpu_only ? mats[i].gpu_rows : 0)),
                             (uint64_t)mats[i].n_in);
    return b;
}

// The matrices as split with `share` of each one's rows on the CPU (0: none), and the bytes each kind of unit
// moves in a decode pass.
void share_split(dj_gpu_state *s, double share) {
    const dj_config *c = &s->m->info.config;
    const dj_layer_layout *L = &s->m->info.layer;
    gpu_share *sh = &s->sh;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim,
            hid = c->hidden_dim;
    int n = 0;
    sh->share = share;
#define MAT(o, ni, no) (sh->lmats[n++] = sp_split((o), (ni), (no), c->wtype, share))
    if (s->fused_qkv) {
        MAT(L->wq, dim, q + 2 * kv);
    } else {
        MAT(L->wq, dim, q), MAT(L->wk, dim, kv), MAT(L->wv, dim, kv);
    }
    MAT(L->wo, q, dim);
    if (s->fused_gate_up) {
        MAT(L->w_gate, dim, 2 * hid);
    } else {
        MAT(L->w_gate, dim, hid), MAT(L->w_up, dim, hid);
    }
    MAT(L->w_down, hid, dim);
#undef MAT
    sh->n_lmats = n;
    sh->hmat = sp_split(c->tied ? 0 : s->m->info.head.lm_head, dim, c->vocab_size, dj_lm_head_type(s->m), share);
    uint64_t tot[2] = {s->m->info.layer.size, s->m->info.head.size + (c->tied ? s->m->info.embed_size : 0)};
    sh->cpu_bytes[0] = sp_bytes(sh->lmats, n, 1), sh->cpu_bytes[1] = sp_bytes(&sh->hmat, 1, 1);
    for (int k = 0; k < 2; k++) sh->part_bytes[k] = tot[k] - sh->cpu_bytes[k];
}

int share_init(dj_gpu_state *s, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_share *sh = &s->sh;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim,
            hid = c->hidden_dim, vocab = c->vocab_size;
    int64_t most_in = hid > dim ? hid : dim, most_out = 2 * hid;
    if (q > most_in) most_in = q;
    if (q + 2 * kv > most_out) most_out = q + 2 * kv;
    if (vocab > most_out) most_out = vocab;
    if (gpu_host_alloc((void **)&sh->h_cx, (size_t)most_in * 4, "the CPU share's input", e) ||
        gpu_host_alloc((void **)&sh->h_cy, (size_t)most_out * 4, "the CPU share's output", e) ||
        gpu_host_device_ptr((void **)&sh->d_cy, sh->h_cy, e) || gpu_event_create(&sh->x_ready, 0, e))
        return -1;
    return 0;
}

void share_free(dj_gpu_state *s) {
    gpu_event_destroy(s->sh.x_ready);
    gpu_host_free(s->sh.h_cx), gpu_host_free(s->sh.h_cy);
}

// ---- the split matvec
// The host waits for x, so the compute stream runs dry meanwhile; the copy stream does not (its next copy is
// already issued).
int share_matvec(dj_gpu_state *s, float *y, const float *x, const uint8_t *w, const uint8_t *hw, const sp_mat *mt,
                 dj_err *e) {
    gpu_share *sh = &s->sh;
    uint32_t wt = mt->dtype;
    int64_t nc = mt->n_out - mt->gpu_rows;
    if (nc && (gpu_d2h_async(sh->h_cx, x, (size_t)mt->n_in * 4, s->compute, e) ||
               gpu_event_record(sh->x_ready, s->compute, e)))
        return -1;
    if (mt->gpu_rows && gpu_matmul(s->g, y, x, w, wt, 1, mt->n_in, mt->gpu_rows, s->compute, e)) return -1;
    if (!nc) return 0;
    // h_cy is free: the previous split's read of it precedes x_ready on the stream.
    if (gpu_event_sync(sh->x_ready, e)) return -1;
    cpu_matvec(sh->h_cy, sh->h_cx, hw + dj_matrix_bytes(wt, (uint64_t)mt->gpu_rows, (uint64_t)mt->n_in), wt, mt->n_in,
               nc);
    return gpu_widen(y + mt->gpu_rows, sh->d_cy, DJ_F32, nc, s->compute, e);
}

// ---- --cpu-share auto
// The fraction that makes the CPU's side of a decode step take as long as the GPU's copies. The CPU's side is its
// rows at its matvec rate (measured over one streamed unit's matrices, best of three; the first touch warms) plus a
// round trip per split matmul (x to the host, the CPU's rows back, the GPU's work in between: ~SPLIT_COST_S, in
// which the CPU idles); the copies run at LINK_SHARED times the warm-up's H2D rate, the CPU's reads of host memory
// taking the rest. For B bytes streamed per step, rates C (CPU) and L (link) and K = splits * SPLIT_COST_S,
// share * B / C + K = (1 - share) * B / L gives share = (B / L - K) / (B / C + B / L). Where the round trips would
// eat most of the gain (small models), the share stays off. On the H100 machine (q4 Llama-3-8B shape at the
// minimum ring, 2026-11-24) the copies ran at 46-49 GB/s with the CPU share against 54 alone, and the fixed shares
// 0.5, 0.6, 0.7 took 43, 50, 48-51 ms a token: a balance without K or the contention (0.62) lost 4-15%.
#define SPLIT_COST_S 80e-6
#define LINK_SHARED 0.88
void share_auto(dj_gpu_state *s) {
    const rb_plan *p = s->sc.plan;
    gpu_share *sh = &s->sh;
    int u = p->stream_order[0], nl = (int)s->m->info.config.n_layers;
    const sp_mat *mats = u < nl ? sh->lmats : &sh->hmat;
    const uint8_t *base = u < nl ? dj_layer_ptr(s->m, (uint32_t)u)
                                 : s->m->info.config.tied ? dj_embed_ptr(s->m) : dj_head_ptr(s->m);
    int n = u < nl ? sh->n_lmats : 1;
    double best = 0;
    uint64_t bytes = sp_bytes(mats, n, 0);
    for (int r = 0; r < 3; r++) {
        double t0 = dj_now();
        for (int i = 0; i < n; i++) {
            memset(sh->h_cx, 0, (size_t)mats[i].n_in * 4);
            cpu_matvec(sh->h_cy, sh->h_cx, base + mats[i].off, mats[i].dtype, mats[i].n_in, mats[i].n_out);
        }
        double t = dj_now() - t0;
        if (t > 0 && (best == 0 || t < best)) best = t;
    }
    double cpu = best > 0 ? (double)bytes / best / 1e9 : 0, h2d = sh->warm_h2d;
    double streamed = (double)p->streamed_bytes, splits = 0;
    for (int k = 0; k < p->n_streamed; k++) splits += p->stream_order[k] == nl ? 1 : sh->n_lmats;
    double share = 0, t_pure = h2d > 0 ? streamed / (h2d * 1e9) : 0;
    if (cpu > 0 && h2d > 0) {
        double tb_cpu = streamed / (cpu * 1e9), tb_link = streamed / (LINK_SHARED * h2d * 1e9);
        share = (tb_link - splits * SPLIT_COST_S) / (tb_cpu + tb_link);
    }
    if (share > 0.95) share = 0.95;
    double t_split = share > 0 ? (1 - share) * streamed / (LINK_SHARED * h2d * 1e9) : t_pure;
    int worth = share > 0 && t_split < 0.9 * t_pure;
    if (!s->opts.quiet)
        fprintf(stderr, "gpu: CPU share, automatic: the CPU's matvec reads %.1f GB/s, the copies ran at %.1f GB/s: "
                        "%s\n", cpu, h2d, worth ? "sharing" : "not worth the round trips for this model: off");
    share_split(s, worth ? share : 0);
}

void share_stats(dj_gpu_state *s) {
    const rb_plan *p = s->sc.plan;
    const gpu_share *sh = &s->sh;
    int nl = (int)s->m->info.config.n_layers;
    if (sh->share <= 0) return;
    uint64_t pcie = 0, cpu = 0;
    for (int k = 0; k < p->n_streamed; k++) {
        int h = p->stream_order[k] == nl;
        pcie += sh->part_bytes[h], cpu += sh->cpu_bytes[h];
    }
    s->st.bytes_per_token = pcie, s->st.cpu_bytes_per_token = cpu, s->st.cpu_share = sh->share;
}
