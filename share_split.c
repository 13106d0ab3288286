// share_split.c: the CPU share's geometry: a unit's matrices (where each lies in its slab), where a share cuts each
// of them (share_fill: whole matrices first, the largest first), the share of a pass of T rows, and the bytes a
// decode pass then copies and the CPU reads. The GPU's matmuls take their shapes from here with or without a share.
#include "gpu_impl.h"

static sp_mat sp_mat_of(uint64_t off, int64_t n_in, int64_t n_out, uint32_t dtype) {
    return (sp_mat){off, n_in, n_out, dtype, 0, 1};
}

uint64_t sp_bytes(const sp_mat *mats, int n, double share) {
    uint64_t b = 0;
    for (int i = 0; i < n; i++)
        b += dj_matrix_bytes(mats[i].dtype, (uint64_t)(mats[i].n_out - (share > 0 ? sp_gpu_rows(&mats[i], share) : 0)),
                             (uint64_t)mats[i].n_in);
    return b;
}

void share_fill(sp_mat *mats, int n) {
    double total = (double)sp_bytes(mats, n, 0), at = 0;
    uint32_t taken = 0;  // bit i: matrix i has its interval (n <= 7: a layer's matrices)
    for (int k = 0; k < n; k++) {
        int big = -1;
        double bb = -1;
        for (int i = 0; i < n; i++) {
            double b = (double)sp_bytes(&mats[i], 1, 0);
            if (!(taken >> i & 1) && b > bb) big = i, bb = b;
        }
        taken |= 1u << big;
        mats[big].lo = at, at += total > 0 ? bb / total : 1.0 / n;
        mats[big].hi = k == n - 1 ? 1 : at;  // the last ends at 1 whatever the rounding
    }
}

// The matrices of a layer and the head, `share` for every pass of up to SH_ROWS rows (0: none), and the bytes each
// kind of unit moves in a decode pass.
void share_split(dj_gpu_state *s, double share) {
    const dj_config *c = &s->m->info.config;
    const dj_layer_layout *L = &s->m->info.layer;
    gpu_share *sh = &s->sh;
    unit_mats *um = &s->mats;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim,
            hid = c->hidden_dim;
    int n = 0;
#define MAT(o, ni, no) (um->layer[n++] = sp_mat_of((o), (ni), (no), c->wtype))
    if (s->fused_qkv) {
        MAT(L->wq, dim, q + 2 * kv);
    } else {
        MAT(L->wq, dim, q), MAT(L->wk, dim, kv), MAT(L->wv, dim, kv);
    }
    MAT(L->wo, q, dim);
    um->gate_up_at = n, um->n_gate_up = s->fused_gate_up ? 1 : 2;
    if (s->fused_gate_up) {
        MAT(L->w_gate, dim, 2 * hid);
    } else {
        MAT(L->w_gate, dim, hid), MAT(L->w_up, dim, hid);
    }
    MAT(L->w_down, hid, dim);
#undef MAT
    um->n_layer = n;
    share_fill(um->layer, n);
    um->lm_head = sp_mat_of(c->tied ? 0 : s->m->info.head.lm_head, dim, c->vocab_size, dj_lm_head_type(s->m));
    for (int T = 0; T <= SH_ROWS; T++) sh->by_rows[T] = T >= 1 && T <= sh->max_rows ? share : 0;
    share_rates(s);
}

// The one-row share's bytes: a decode copy's and the CPU's, per kind of unit.
void share_rates(dj_gpu_state *s) {
    gpu_share *sh = &s->sh;
    const dj_config *c = &s->m->info.config;
    sh->share = sh->by_rows[1];
    uint64_t tot[2] = {s->m->info.layer.size, s->m->info.head.size + (c->tied ? s->m->info.embed_size : 0)};
    const unit_mats *um = &s->mats;
    sh->cpu_bytes[0] = sp_bytes(um->layer, um->n_layer, sh->share);
    sh->cpu_bytes[1] = sp_bytes(&um->lm_head, 1, sh->share);
    for (int k = 0; k < 2; k++) sh->part_bytes[k] = tot[k] - sh->cpu_bytes[k];
}

double share_for(const dj_gpu_state *s, int64_t T) { return T >= 1 && T <= SH_ROWS ? s->sh.by_rows[T] : 0; }
double gpu_cpu_share_for(const dj_gpu_state *s, int64_t T) { return share_for(s, T); }

int share_chain(const unit_mats *um, double share) {
    if (share <= 0) return 0;
    for (int i = 0; i < um->n_gate_up; i++)
        if (sp_gpu_rows(&um->layer[um->gate_up_at + i], share) != 0) return 0;
    return 1;
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
