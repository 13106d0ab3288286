// gpu.c: the GPU forward pass (gpu.h). Set-up sizes the weight budget, plans which units (layers, then the head)
// stay resident (ringbuf.h), allocates the activations and the KV cache and runs a warm-up; a pass gathers the
// embedding rows, runs every layer on the units' weights wherever they sit (resident, or a ring slot stream.c
// fills), then the head. An all-resident decode step is one CUDA graph. Activations, the KV cache and all
// accumulation are f32; matrices stay in the model's dtype.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "gpu_impl.h"
#include "tp_link.h"

// ---- profiling (DJINN_PROFILE=1)
enum {
    PROF_NORM, PROF_QKV, PROF_ROPE_KV, PROF_ATTENTION, PROF_WO, PROF_GATE_UP, PROF_SWIGLU, PROF_DOWN, PROF_HEAD,
    PROF_ALLREDUCE, PROF_OTHER
};
static const char *prof_names[PROF_CATS] = {"norms", "qkv matmul", "rope+kv write", "attention", "wo matmul",
                                            "gate/up matmul", "swiglu", "down matmul", "head",
                                            "all-reduce", "other"};

static int prof_init(dj_gpu_state *s, dj_err *e) {
    const char *pe = getenv("DJINN_PROFILE");
    if (!pe || *pe != '1') return 0;
    for (int i = 0; i < PROF_EVENTS; i++)
        if (gpu_event_create(&s->prof.ev[i], 1, e)) return -1;
    s->prof.on = 1;
    return 0;
}

// Marks the end of a kernel group of category cat on the compute stream.
static void prof_mark(dj_gpu_state *s, int cat) {
    gpu_prof *p = &s->prof;
    if (!p->on || p->n >= PROF_EVENTS) return;
    if (gpu_event_record(p->ev[p->n], s->compute, NULL) == 0) p->cat[p->n++] = cat;
}

// After the pass's synchronisation: time between consecutive marks goes to the later mark's category.
static void prof_collect(dj_gpu_state *s, int decode) {
    gpu_prof *p = &s->prof;
    if (!p->on) return;
    for (int i = 1; i < p->n; i++) {
        float ms;
        if (gpu_event_ms(&ms, p->ev[i - 1], p->ev[i], NULL) == 0) p->ms[decode][p->cat[i]] += ms;
    }
    p->passes[decode]++;
    p->n = 0;
}

static void prof_free(dj_gpu_state *s) {
    const gpu_prof *p = &s->prof;
    for (int d = 0; p->on && d < 2; d++) {
        if (!p->passes[d]) continue;
        double tot = 0;
        for (int c = 0; c < PROF_CATS; c++) tot += p->ms[d][c];
        fprintf(stderr, "profile (%s, %lld passes, %.3f ms per pass):", d ? "decode" : "prefill",
                (long long)p->passes[d], tot / (double)p->passes[d]);
        for (int c = 0; c < PROF_CATS; c++)
            if (p->ms[d][c] > 0)
                fprintf(stderr, " %s %.3f ms (%.0f%%);", prof_names[c], p->ms[d][c] / (double)p->passes[d],
                        100 * p->ms[d][c] / tot);
        fputc('\n', stderr);
    }
    for (int i = 0; i < PROF_EVENTS; i++) gpu_event_destroy(p->ev[i]);
}

// ---- the layer
// One step of a layer: its kernels, then (profiling) the mark of its category.
#define STEP(cat, call)                  \
    do {                                 \
        if (call) return -1;             \
        prof_mark(s, PROF_##cat);        \
    } while (0)

// q, k and v of T rows in d_qkv: one fused matmul into rows [q | k | v], or three into separate (T, n) blocks.
typedef struct {
    float *q, *k, *v;
    int64_t ldq, ldkv;  // floats between rows
} qkv_rows;

// gate and up of T rows in d_ffn: one fused matmul into rows [gate | up], or two into separate blocks.
typedef struct {
    float *gate, *up;
    int64_t ld;
} ffn_rows;

// The k-th of the layer's matmuls (s->mats.layer) on T rows: on the GPU, or split with the CPU when the unit is (the
// CPU share).
static int layer_mm(dj_gpu_state *s, const gpu_unit *un, int k, float *y, const float *x, int64_t T, dj_err *e) {
    const sp_mat *mt = &s->mats.layer[k];
    if (un->host) return share_matmul(s, y, x, T, un->w + mt->off, un->host + mt->off, mt, un->share, e);
    return gpu_matmul(s->g, y, x, un->w + mt->off, mt->dtype, T, mt->n_in, mt->n_out, s->compute, e);
}

// The fused layouts: rows [q | k | v] of d_qkv, rows [gate | up] of d_ffn.
static qkv_rows qkv_fused_rows(const dj_gpu_state *s) {
    const dj_config *c = &s->m->info.config;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    return (qkv_rows){s->b.qkv, s->b.qkv + q, s->b.qkv + q + kv, q + 2 * kv, q + 2 * kv};
}
static ffn_rows ffn_fused_rows(const dj_gpu_state *s) {
    int64_t hid = s->m->info.config.hidden_dim;
    return (ffn_rows){s->b.ffn, s->b.ffn + hid, 2 * hid};
}

static int qkv_matmul(dj_gpu_state *s, const gpu_unit *un, int64_t T, qkv_rows *r, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    float *xb = s->b.xb;
    if (s->fused_qkv) {
        *r = qkv_fused_rows(s);
        return layer_mm(s, un, 0, r->q, xb, T, e);
    }
    *r = (qkv_rows){s->b.qkv, s->b.qkv + T * q, s->b.qkv + T * (q + kv), q, kv};
    return layer_mm(s, un, 0, r->q, xb, T, e) || layer_mm(s, un, 1, r->k, xb, T, e) ||
                   layer_mm(s, un, 2, r->v, xb, T, e)
               ? -1
               : 0;
}

// The T rows of a step pass: each at its own position in its own KV slot, the first key the pass writes there after
// the slots (upload_tokens).
static gpu_kv_rows step_kv_rows(const dj_gpu_state *s, int64_t T) {
    return (gpu_kv_rows){s->b.pos, s->b.kv_slot, s->slot_elems, s->b.kv_slot + T, 0};
}

// RoPE on q and k, and k, v into the cache: one launch for a decode step's rows (each in its slot) or where each
// row is [q | k | v] (the fused layout), three otherwise. kc: the layer's cache in slot 0 (a decode step) or in the
// pass's slot.
static int rope_kv_write(dj_gpu_state *s, const pass_desc *pd, const qkv_rows *r, const gpu_kv_cache *kc,
                         dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const gpu_bufs *b = &s->b;
    int64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, T = pd->T;
    cudaStream_t st = s->compute;
    if (pd->step) {
        gpu_kv_rows kv = step_kv_rows(s, T);
        return gpu_rope_kv_rows(s->g, r->q, r->ldq, r->k, r->v, r->ldkv, T, kc, nh, nkv, hd, s->max_seq,
                                b->inv_freq, &kv, st, e);
    }
    if (s->fused_qkv)
        return gpu_rope_kv(s->g, r->q, r->ldq, T, kc, nh, nkv, hd, s->max_seq, b->inv_freq, b->pos, st, e);
    return gpu_rope(r->q, T, nh, hd, r->ldq, b->inv_freq, b->pos, st, e) ||
                   gpu_rope(r->k, T, nkv, hd, r->ldkv, b->inv_freq, b->pos, st, e) ||
                   gpu_kv_write(kc, r->k, r->v, r->ldkv, T, nkv, hd, s->max_seq, b->pos, st, e)
               ? -1
               : 0;
}

// Causal attention of the T queries over the cache into d_att (T, q_dim): a decode step's rows each over its own
// slot, a prefill's over the pass's slot. A pass of up to PASS_DECODE_ROWS rows (a speculative verification, a short
// turn), or a step's run of as many, takes the decode kernels, each row over its own keys, split over them. The
// prefill kernel gives a head one block for up to 64 queries, 32 blocks on the 8B: on the resident 8B q4 a 9-row pass
// at 256 / 4000 positions took 4.98 / 25.4 ms with it, 3.9 / 4.9 with the decode kernels, though each row reads its
// keys again; 64 rows 11.9 / 33.3 against 11.6 / 17.4 (bench/results/spec_verify/session64).
#define PASS_DECODE_ROWS 64

// Rows [r0, r0 + len) of the pass, all of one slot (its cache slot_off elements into kc's), attending over their
// keys: by the decode kernels (kv: the rows' positions, and slots where kc is the whole cache) up to
// PASS_DECODE_ROWS rows, else by the prefill kernel over the slot's cache.
static int slot_rows_attention(dj_gpu_state *s, const qkv_rows *r, const gpu_kv_cache *kc, int64_t slot_off,
                               const gpu_kv_rows *kv, int64_t r0, int64_t len, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const int64_t nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    float *att = s->b.att + r0 * nh * hd;
    const float *q = r->q + r0 * r->ldq;
    if (len <= PASS_DECODE_ROWS)
        return gpu_attention_decode_rows(s->g, att, q, r->ldq, kc, len, nh, nkv, hd, s->max_seq, kv, s->compute, e);
    const gpu_kv_cache slot = gpu_kv_at(*kc, slot_off, hd);
    return gpu_attention_prefill(s->g, att, nh * hd, q, r->ldq, &slot, len, nh, nkv, hd, s->max_seq, s->b.pos + r0,
                                 s->compute, e);
}

static int attention(dj_gpu_state *s, const pass_desc *pd, const qkv_rows *r, const gpu_kv_cache *kc, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    if (!pd->step) {  // one slot's rows: the pass's own cache
        gpu_kv_rows kv = {s->b.pos, NULL, 0, NULL, 0};
        return slot_rows_attention(s, r, kc, 0, &kv, 0, pd->T, e);
    }
    // a step: the single rows in one launch, each over its own slot, then each run of a prompt over its slot
    gpu_kv_rows kv = step_kv_rows(s, pd->T);
    if (pd->singles && gpu_attention_decode_rows(s->g, s->b.att, r->q, r->ldq, kc, pd->singles, c->n_heads,
                                                 c->n_kv_heads, c->head_dim, s->max_seq, &kv, s->compute, e))
        return -1;
    for (int64_t i = 0; i < pd->n_runs; i++) {
        const step_run *u = &pd->runs[i];
        const gpu_kv_rows run = {kv.pos + u->r0, kv.slot + u->r0, kv.slot_stride, kv.fresh + u->r0, 1};
        if (slot_rows_attention(s, r, kc, (int64_t)u->kv_slot * s->slot_elems, &run, u->r0, u->len, e)) return -1;
    }
    return 0;
}

static int gate_up_matmul(dj_gpu_state *s, const gpu_unit *un, int64_t T, ffn_rows *r, dj_err *e) {
    int64_t hid = s->m->info.config.hidden_dim;
    int k = s->fused_qkv ? 2 : 4;  // after q|k|v and wo
    if (s->fused_gate_up) {
        *r = ffn_fused_rows(s);
        return layer_mm(s, un, k, r->gate, s->b.xb, T, e);
    }
    *r = (ffn_rows){s->b.ffn, s->b.ffn + T * hid, hid};
    return layer_mm(s, un, k, r->gate, s->b.xb, T, e) || layer_mm(s, un, k + 1, r->up, s->b.xb, T, e) ? -1 : 0;
}

// Where a layer's two norms (and the residual adds before them) run. With every row of the pass on the GPU and q|k|v
// and gate|up each one matmul, inside the products after them, where each is taken by a kernel that norms its input
// as it stages it: the GEMV for one token (gpu_norm_matmul, gate|up's silu(gate) * up out of it too), and for more
// the product's kernel as gpu_matmul picks it: the GEMV for the few tokens it takes (gpu_norm_matmul), the register
// kernel's x layout past them up to 64, the Hopper kernel's beyond (gpu_norm_qgemm; the same bits as the norm then
// the product). No norm's launch, no normed copy of x. Else apart, into d_xb before the matmuls. Both or neither: see
// residual_swap.
typedef enum {
    NORMS_APART,    // gpu_add_rmsnorm into d_xb, then the matmuls
    NORMS_IN_GEMV,  // one token
    NORMS_IN_X,     // 2 tokens or more: the GEMV's, the register or the Hopper kernel's staging of x (norm_rows)
} norm_form;

// Whether the product of matrix mt's T rows (2 or more) takes the norm inside it (NORMS_IN_X).
static int norm_fits_rows(const dj_gpu_state *s, const sp_mat *mt, const uint8_t *w, int64_t T) {
    return gpu_norm_rows_ok(s->g, mt->dtype, w + mt->off, T, mt->n_in, mt->n_out);
}

static norm_form norms_where(const dj_gpu_state *s, const gpu_unit *un, int64_t T) {
    const dj_layer_layout *L = &s->m->info.layer;
    const gpu_bufs *b = &s->b;
    const uint8_t *w = un->w;
    if (!s->fused_qkv || !s->fused_gate_up || un->host) return NORMS_APART;
    uintptr_t ptrs = (uintptr_t)(w + L->attn_norm) | (uintptr_t)(w + L->ffn_norm) | (uintptr_t)b->x |
                     (uintptr_t)b->xb | (uintptr_t)b->delta;
    const sp_mat *qkv = &s->mats.layer[0], *gu = &s->mats.layer[2];
    if (ptrs & 15) return NORMS_APART;  // the GEMV's 16-byte loads; gpu_norm_qgemm_ok's aligned x
    if (T == 1)
        return gpu_fused_ok(qkv->dtype, w + qkv->off, qkv->n_in, qkv->n_out) &&
                       gpu_fused_ok(gu->dtype, w + gu->off, gu->n_in, gu->n_out)
                   ? NORMS_IN_GEMV
                   : NORMS_APART;
    return norm_fits_rows(s, qkv, w, T) && norm_fits_rows(s, gu, w, T) ? NORMS_IN_X : NORMS_APART;
}

// After a fused norm wrote x + delta, or x, to d_xb (the normed input never exists on its own, so d_xb is free): the
// two buffers swap, and d_x is the residual stream again. Two swaps a layer, so a step ends with the buffers where it
// began (the decode graph and upload_tokens rely on it).
static void residual_swap(gpu_bufs *b) {
    float *t = b->x;
    b->x = b->xb, b->xb = t;
}

// The norm fused into the one-token GEMV of matmul k (NORMS_IN_GEMV), x + delta (`add`) or x to d_xb, then the swap.
// qkv NULL: gate|up, whose product goes on as silu(gate) * up into d_hb (gpu_norm_matmul_swiglu).
static int norm_matmul(dj_gpu_state *s, const uint8_t *w, int k, const float *norm, int add, qkv_rows *qkv,
                       dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const sp_mat *mt = &s->mats.layer[k];
    gpu_bufs *b = &s->b;
    const float *delta = add ? b->delta : NULL;
    if (qkv) *qkv = qkv_fused_rows(s);
    if (qkv ? gpu_norm_matmul(s->g, qkv->q, b->x, delta, b->xb, norm, c->norm_eps, w + mt->off, mt->dtype, 1,
                              mt->n_in, mt->n_out, s->compute, e)
            : gpu_norm_matmul_swiglu(s->g, b->hb, b->x, delta, b->xb, norm, c->norm_eps, w + mt->off, mt->dtype,
                                     mt->n_in, mt->n_out, s->compute, e))
        return -1;
    residual_swap(b);
    return 0;
}

// The norm fused into the staging of x for matmul k's T rows into y (NORMS_IN_X: the fused layouts q|k|v and
// gate|up), on the GEMV or the register kernel as gpu_matmul would pick, x + delta (`add`) or x to d_xb, then the
// swap.
static int norm_rows(dj_gpu_state *s, const uint8_t *w, int k, const float *norm, int add, int64_t T, float *y,
                     dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const sp_mat *mt = &s->mats.layer[k];
    gpu_bufs *b = &s->b;
    const float *delta = add ? b->delta : NULL;
    if (gpu_norm_rows(s->g, y, b->x, delta, b->xb, norm, c->norm_eps, w + mt->off, mt->dtype, T, mt->n_in,
                      mt->n_out, s->compute, e))
        return -1;
    residual_swap(b);
    return 0;
}

// How a layer runs on its unit in this pass, decided before its kernels (plan_layer) from where its matrices run:
// where the norms run, and the MLP block's form.
typedef enum {
    MLP_NORM_GEMV,   // one token, all on the GPU: the norm inside the gate|up GEMV, silu(gate) * up out of it
    MLP_NORM_X,      // 2 tokens or more, all on the GPU: the norm inside gate|up's staging of x, then as MLP_GPU_DOWN
    MLP_GPU_DOWN,    // down all on the GPU: its q8/q4 products compute silu(gate) * up as they read it
    MLP_SPLIT_DOWN,  // down split with the CPU: silu(gate) * up into d_hb first
    MLP_CPU_CHAIN,   // the CPU has all of gate and up: one CPU job from x to its rows of down (share_ffn)
} mlp_form;

typedef struct {
    norm_form norms;  // where both norms run (norms_where)
    mlp_form mlp;
} layer_plan;

static layer_plan plan_layer(const dj_gpu_state *s, const gpu_unit *un, int64_t T) {
    const sp_mat *dn = &s->mats.layer[s->mats.n_layer - 1];
    const norm_form nf = norms_where(s, un, T);
    if (nf == NORMS_IN_GEMV) return (layer_plan){nf, MLP_NORM_GEMV};
    if (nf == NORMS_IN_X) return (layer_plan){nf, MLP_NORM_X};
    if (un->host && share_chain(&s->mats, un->share)) return (layer_plan){nf, MLP_CPU_CHAIN};
    if (!un->host || sp_gpu_rows(dn, un->share) == dn->n_out) return (layer_plan){nf, MLP_GPU_DOWN};
    return (layer_plan){nf, MLP_SPLIT_DOWN};
}

// q|k|v = wq|wk|wv . rmsnorm(x), x += delta first where `pending`: the norm inside the product, or before the
// matmuls.
static int norm_qkv(dj_gpu_state *s, const gpu_unit *un, const layer_plan *pl, int64_t T, const float *norm,
                    int pending, qkv_rows *qkv, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_bufs *b = &s->b;
    if (pl->norms == NORMS_IN_GEMV) {
        STEP(QKV, norm_matmul(s, un->w, 0, norm, pending, qkv, e));
        return 0;
    }
    if (pl->norms == NORMS_IN_X) {
        *qkv = qkv_fused_rows(s);
        STEP(QKV, norm_rows(s, un->w, 0, norm, pending, T, qkv->q, e));
        return 0;
    }
    STEP(NORM, pending ? gpu_add_rmsnorm(b->x, b->delta, b->xb, norm, T, c->dim, c->norm_eps, s->compute, e)
                       : gpu_rmsnorm(b->xb, b->x, norm, T, c->dim, c->norm_eps, s->compute, e));
    STEP(QKV, qkv_matmul(s, un, T, qkv, e));
    return 0;
}

// Where wo and w_down write: d_delta, or on several GPUs this GPU's partial, which tp_sum adds to the others' into
// d_delta (tp_link.h).
static float *part_out(dj_gpu_state *s) { return s->opts.tp ? tp_part(s->opts.tp, s->opts.tp_rank) : s->b.delta; }
// (several GPUs only: on one, a profile mark here would time nothing but its own event, 64 of them a token)
static int tp_sum(dj_gpu_state *s, int64_t T, dj_err *e) {
    const int64_t dim = s->m->info.config.dim;
    return tp_allreduce(s->opts.tp, s->opts.tp_rank, s->b.delta, T * dim, s->compute, e);
}

// out = w_down . (silu(gate) * up), down all on the GPU (gpu_swiglu_matmul: its q8/q4 products compute silu(gate) *
// up as they read it).
static int swiglu_down(dj_gpu_state *s, const gpu_unit *un, const ffn_rows *ffn, float *out, int64_t T, dj_err *e) {
    const sp_mat *dn = &s->mats.layer[s->mats.n_layer - 1];
    return gpu_swiglu_matmul(s->g, out, s->b.hb, ffn->gate, ffn->up, ffn->ld, un->w + dn->off, dn->dtype, T, dn->n_in,
                             dn->n_out, s->compute, e);
}

// delta = w_down . (silu(w_gate . n) * (w_up . n)), n = rmsnorm(x += delta), in the plan's form.
static int mlp_block(dj_gpu_state *s, const gpu_unit *un, const layer_plan *pl, int64_t T, const float *norm,
                     dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_bufs *b = &s->b;
    cudaStream_t st = s->compute;
    const int k_down = s->mats.n_layer - 1;
    float *out = part_out(s);
    ffn_rows ffn;
    if (pl->mlp == MLP_NORM_GEMV) {
        STEP(GATE_UP, norm_matmul(s, un->w, 2, norm, 1, NULL, e));
        STEP(DOWN, layer_mm(s, un, k_down, out, b->hb, T, e));
        return 0;
    }
    if (pl->mlp == MLP_NORM_X) {
        ffn = ffn_fused_rows(s);
        STEP(GATE_UP, norm_rows(s, un->w, 2, norm, 1, T, ffn.gate, e));
        STEP(DOWN, swiglu_down(s, un, &ffn, out, T, e));
        return 0;
    }
    STEP(NORM, gpu_add_rmsnorm(b->x, b->delta, b->xb, norm, T, c->dim, c->norm_eps, st, e));
    if (pl->mlp == MLP_CPU_CHAIN) {
        STEP(DOWN, share_ffn(s, out, b->hb, b->xb, T, un, e));
        return 0;
    }
    STEP(GATE_UP, gate_up_matmul(s, un, T, &ffn, e));
    if (pl->mlp == MLP_GPU_DOWN) {
        STEP(DOWN, swiglu_down(s, un, &ffn, out, T, e));
        return 0;
    }
    STEP(SWIGLU, gpu_swiglu(b->hb, ffn.gate, ffn.up, T, c->hidden_dim, ffn.ld, st, e));
    STEP(DOWN, layer_mm(s, un, k_down, out, b->hb, T, e));
    return 0;
}

// One transformer layer on the pass's T rows of the residual stream d_x, on its unit's weights as planned. `pending`:
// the previous layer's output (in d_delta) still has to be added, fused with this layer's first norm.
static int gpu_layer(dj_gpu_state *s, const pass_desc *pd, const gpu_unit *un, const layer_plan *pl, int l,
                     int pending, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const dj_layer_layout *L = &s->m->info.layer;
    gpu_bufs *b = &s->b;
    int64_t T = pd->T;
    const float *attn_norm = (const float *)(un->w + L->attn_norm), *ffn_norm = (const float *)(un->w + L->ffn_norm);
    const int64_t layer_kv = (int64_t)l * c->n_kv_heads * s->max_seq * c->head_dim +
                             (pd->step ? 0 : (int64_t)pd->kv_slot * s->slot_elems);
    const gpu_kv_cache kc = gpu_kv_at(b->kv, layer_kv, c->head_dim);  // the layer's (in the prefill's KV slot)
    const int k_wo = s->fused_qkv ? 1 : 3;
    qkv_rows qkv;

    prof_mark(s, PROF_OTHER);  // what came before: streaming waits, the embeddings
    // attention block: x += wo . attention(rope(wq|wk|wv . rmsnorm(x)))
    if (norm_qkv(s, un, pl, T, attn_norm, pending, &qkv, e)) return -1;  // q|k|v of the normed x
    STEP(ROPE_KV, rope_kv_write(s, pd, &qkv, &kc, e));                   // RoPE on q and k; k and v into the cache
    STEP(ATTENTION, attention(s, pd, &qkv, &kc, e));                     // each query over its slot's keys, causal
    STEP(WO, layer_mm(s, un, k_wo, part_out(s), b->att, T, e));          // delta = wo . att
    if (s->opts.tp) STEP(ALLREDUCE, tp_sum(s, T, e));
    // MLP block: x += w_down . (silu(w_gate . n) * (w_up . n)), n = rmsnorm(x)
    if (mlp_block(s, un, pl, T, ffn_norm, e)) return -1;
    if (s->opts.tp) STEP(ALLREDUCE, tp_sum(s, T, e));
    return 0;
}

// ---- the pass
// The embedding rows (in d_delta unless f32) widened into d_x, every layer, then the head's final norm (fused with
// the last residual add) into d_xb. *head: the head unit (the final norm at its start, then the lm_head).
static int gpu_body(dj_gpu_state *s, const pass_desc *pd, gpu_unit *head, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_bufs *b = &s->b;
    int nl = (int)c->n_layers;
    int64_t T = pd->T;
    if (c->embed_type != DJ_F32 && gpu_widen_rows(b->x, b->delta, c->embed_type, T, c->dim, s->compute, e)) return -1;
    int pending = 0;  // a layer's output in d_delta not yet added to d_x (a probe may add it: probe_gpu.c)
    for (int l = 0; l < nl; l++) {
        gpu_unit un;
        if (unit_begin(s, l, &un, e) || trace_unit(s->tr, l, 0, e)) return -1;
        const layer_plan pl = plan_layer(s, &un, T);  // where its matrices run, decided once
        if (gpu_layer(s, pd, &un, &pl, l, pending, e) || trace_unit(s->tr, l, 1, e) || unit_end(s, l, e)) return -1;
        pending = 1;
        if (gpu_probe_layer(s, pd, l, &pending, e)) return -1;
    }
    if (unit_begin(s, nl, head, e) || trace_unit(s->tr, nl, 0, e)) return -1;
    const float *norm = (const float *)head->w;
    return pending ? gpu_add_rmsnorm(b->x, b->delta, b->xb, norm, T, c->dim, c->norm_eps, s->compute, e)
                   : gpu_rmsnorm(b->xb, b->x, norm, T, c->dim, c->norm_eps, s->compute, e);
}

// Logits (rows, vocab) into d_logits for rows r0.. of the pass, from the head gpu_body left ready. Several GPUs:
// each its vocab rows' (lm_head from its first row on: rows are independent in every dtype), gathered into the first
// GPU's d_logits (tp_head_gather), or where the head does not split, the first GPU the whole head.
static int head_logits(dj_gpu_state *s, int64_t T, int64_t r0, int64_t rows, const gpu_unit *head, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const float *x = s->b.xb + r0 * c->dim;
    const uint8_t *lm = head->w + s->sc.head_lm_off;
    if (s->head_split) {
        const uint32_t ht = dj_lm_head_type(s->m);
        const tp_range v = tp_vocab_rows(s->opts.tp, s->opts.tp_rank);
        return gpu_matmul(s->g, s->b.head_part, x, lm + (uint64_t)v.lo * dj_row_bytes(ht, c->dim), ht, rows, c->dim,
                          v.hi - v.lo, s->compute, e) ||
                       tp_head_gather(s->opts.tp, s->opts.tp_rank, s->b.head_part, rows, s->compute, e)
                   ? -1
                   : 0;
    }
    if (s->opts.tp_rank > 0) return 0;
    if (head->host)
        return share_matmul(s, s->b.logits, x, rows, lm, dj_lm_head_ptr(s->m), &s->mats.lm_head, head->share, e);
    return gpu_matmul(s->g, s->b.logits, x, lm, dj_lm_head_type(s->m), rows, c->dim, c->vocab_size, s->compute, e);
}

// The embedding rows of the pass's tokens and its positions (h_pos, and a decode step's h_kv_slot with the first
// keys it writes after its T slots: step_fresh; filled by the caller), uploaded on the compute stream. The rows are
// gathered on the host as stored (a copy per row) and land in d_x for f32, else in d_delta (free at the start of a
// pass), which gpu_body widens into d_x.
static int upload_tokens(dj_gpu_state *s, const pass_desc *pd, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_bufs *b = &s->b;
    const int32_t *tokens = pd->tokens;
    int64_t T = pd->T;
    size_t row_bytes = (size_t)dj_row_bytes(c->embed_type, c->dim);
    for (int64_t t = 0; t < T; t++)
        memcpy(b->h_x + (size_t)t * row_bytes, dj_embed_ptr(s->m) + (size_t)tokens[t] * row_bytes, row_bytes);
    void *dst = c->embed_type == DJ_F32 ? (void *)b->x : (void *)b->delta;
    return gpu_h2d_async(dst, b->h_x, (size_t)T * row_bytes, s->compute, e) ||
                   gpu_h2d_async(b->pos, b->h_pos, (size_t)T * 4, s->compute, e) ||
                   (pd->step && gpu_h2d_async(b->kv_slot, b->h_kv_slot, (size_t)T * 8, s->compute, e))
               ? -1
               : 0;
}

// Queues the picks from d_logits's rows (rows <= GPU_LOGIT_ROWS; args: theirs) and the ids' copy to the host; the
// caller waits for the stream. One row's counts go whole when the sampler says so or is not the one last seen, else
// as the changes in the arguments.
static int queue_pick(dj_gpu_state *s, const pick_req *pk, const dj_pick_args *args, int64_t rows, dj_err *e) {
    gpu_bufs *b = &s->b;
    int64_t vocab = s->m->info.config.vocab_size;
    memcpy(b->h_pick, args, (size_t)rows * sizeof *args);
    if (pk->counts && (args->n_set < 0 || pk->counts != b->counts_of)) {
        b->h_pick->n_set = 0;
        if (gpu_h2d_async(b->counts, pk->counts, (size_t)vocab * 4, s->compute, e)) return -1;  // staged at once
    }
    b->counts_of = pk->counts;
    return gpu_h2d_async(b->pick, b->h_pick, (size_t)rows * sizeof *args, s->compute, e) ||
                   gpu_pick(b->pick_scratch, b->next, b->logits, rows, vocab, b->pick, pk->counts ? b->counts : NULL,
                            s->compute, e) ||
                   gpu_d2h_async(b->h_next, b->next, (size_t)rows * 4, s->compute, e)
               ? -1
               : 0;
}

// The output of the head's rows [r0, r0 + rows) of the pass (the wanted rows from `first`), in d_logits: the picks
// from them (pd->pick) or their logits (logits non-NULL) queued to the host on the compute stream; then, after the
// caller's wait, taken into the caller's next or logits.
static int queue_out(dj_gpu_state *s, const pass_desc *pd, const float *logits, int64_t first, int64_t r0,
                     int64_t rows, dj_err *e) {
    if (s->opts.tp_rank > 0) return 0;
    const pick_req *pk = pd->pick;
    const int64_t vocab = s->m->info.config.vocab_size;
    return (pk ? queue_pick(s, pk, pk->args + (r0 - first), rows, e)
               : logits && gpu_d2h_async(s->b.h_logits, s->b.logits, (size_t)(rows * vocab) * 4, s->compute, e))
               ? -1
               : 0;
}
static void take_out(dj_gpu_state *s, const pass_desc *pd, float *logits, int64_t first, int64_t r0, int64_t rows) {
    if (s->opts.tp_rank > 0) return;
    const int64_t vocab = s->m->info.config.vocab_size;
    if (pd->pick) memcpy(pd->pick->next + (r0 - first), s->b.h_next, (size_t)rows * 4);
    else if (logits) memcpy(logits + (r0 - first) * vocab, s->b.h_logits, (size_t)(rows * vocab) * 4);
}

// The graph a pass that graph_now replays: one row's, a step of T decoding rows', or a run of T rows of one slot
// wanting every row's logits (speculative verification).
static cudaGraphExec_t *graph_of(dj_gpu_state *s, const pass_desc *pd) {
    return pd->T == 1 ? &s->graph : pd->step ? &s->row_graph[pd->T] : &s->run_graph[pd->T];
}

// All resident, a pass of T rows as one CUDA graph for its T (positions, and a step's KV slots, are read from d_pos
// and d_kv_slot, so every such pass of T rows replays the same graph; a run's slot is in its kernels' arguments: its
// graph serves one slot); then the rows' logits come back, or the tokens picked from them. One row's is captured on
// first use, T rows' at their second pass.
static int graph_step(dj_gpu_state *s, const pass_desc *pd, dj_err *e) {
    const int64_t T = pd->T;
    cudaGraphExec_t *graph = graph_of(s, pd);
    if (!*graph) {
        gpu_unit head;
        if (gpu_graph_begin(s->compute, e)) return -1;
        int rc = gpu_body(s, pd, &head, e) || head_logits(s, T, 0, T, &head, e);
        dj_err ge;
        if (gpu_graph_end(s->compute, graph, rc ? &ge : e) || rc) return -1;
    }
    if (gpu_graph_launch(*graph, s->compute, e) || queue_out(s, pd, pd->logits, 0, 0, T, e) ||
        gpu_stream_sync(s->compute, e))
        return -1;
    take_out(s, pd, pd->logits, 0, 0, T);
    s->st.passes++, s->st.graph_passes++;
    return 0;
}

// Whether the T-row graph seen[] marks was asked for before (then 1), marking it (0: this pass goes kernel by kernel).
static int seen_before(uint8_t *seen) {
    if (*seen) return 1;
    *seen = 1;
    return 0;
}

// Whether a pass can run as one CUDA graph, captured whole: every unit resident, one row, or T rows (at most a
// chunk of the head's) all wanting their output that are a step's decoding rows (each attending alone) or a run of
// one slot (a verification pass), and nothing that asks for it kernel by kernel (--no-graph, profiling, a trace, a
// probe that reads rows back mid-pass). Changes nothing.
static int graph_capturable(const dj_gpu_state *s, const pass_desc *pd) {
    // (several GPUs: every one is asked for the same output, so each captures the same head: a split head's gather
    // in one GPU's graph and not in another's pass would wait for ever)
    const int all_resident = !s->sc.plan->n_streamed, wants_output = pd->logits || pd->pick;
    const int kernel_by_kernel = s->opts.no_graph || s->prof.on || s->tr || !gpu_probe_graphable(s) ||
                                 (s->opts.tp && !tp_graphable(s->opts.tp));
    if (!all_resident || !wants_output || kernel_by_kernel) return 0;
    const int64_t T = pd->T;
    if (T == 1) return 1;
    if (pd->logit_first != 0 || pd->logit_end != T || T > GPU_LOGIT_ROWS) return 0;
    return !pd->step || pd->singles == T;
}

// Whether a pass that graph_capturable allows runs as its graph now, noting it: one row's always; T rows' from their
// second such pass on (the first goes kernel by kernel: row_graph_seen, run_graph_seen), a run's on its graph's slot
// (a run on another slot drops that graph and is seen afresh).
static int graph_now(dj_gpu_state *s, const pass_desc *pd) {
    if (!graph_capturable(s, pd)) return 0;
    const int64_t T = pd->T;
    if (T == 1) return 1;
    if (pd->step) return seen_before(&s->row_graph_seen[T]);
    if (s->run_graph_slot[T] != pd->kv_slot) {  // another slot's graph: dropped, this slot's seen afresh
        if (s->run_graph[T]) gpu_graph_destroy(s->run_graph[T]), s->run_graph[T] = NULL;
        s->run_graph_slot[T] = pd->kv_slot, s->run_graph_seen[T] = 0;
    }
    return seen_before(&s->run_graph_seen[T]);
}

// The head's rows [r0, r0 + rows) of the pass (the wanted rows from `first`): their logits into d_logits, and
// queue_out's copy (logits NULL and no pick: nothing).
static int head_chunk(dj_gpu_state *s, const pass_desc *pd, const gpu_unit *head, const float *logits, int64_t first,
                      int64_t r0, int64_t rows, dj_err *e) {
    if ((logits || pd->pick) && head_logits(s, pd->T, r0, rows, head, e)) return -1;
    return queue_out(s, pd, logits, first, r0, rows, e);
}

// The head over the rows wanted, in chunks of GPU_LOGIT_ROWS (none wanted: one round without its kernels, which
// still ends its unit). After the last chunk's kernels the head's unit ends (its ring slot released, the next
// pass's first copies issued) before the final wait; each wait joins the CPU's rows first (share_flush), then the
// chunk's logits, or the pick, go to the caller.
static int pass_head(dj_gpu_state *s, const pass_desc *pd, const gpu_unit *head, int streams, dj_err *e) {
    const int64_t T = pd->T;
    int nl = (int)s->m->info.config.n_layers;
    float *logits = pd->logits;
    int64_t first = pd->logit_first, end = pd->logit_end;
    if (end <= first) logits = NULL, first = T - 1, end = T;
    for (int64_t r0 = first; r0 < end; r0 += GPU_LOGIT_ROWS) {
        int64_t rows = end - r0 < GPU_LOGIT_ROWS ? end - r0 : GPU_LOGIT_ROWS, last = r0 + rows >= end;
        if (head_chunk(s, pd, head, logits, first, r0, rows, e)) return -1;
        prof_mark(s, PROF_HEAD);
        if (last && (trace_unit(s->tr, nl, 1, e) || unit_end(s, nl, e) ||
                     (streams && gpu_event_record(s->sc.p1, s->compute, e))))  // the pass's end on the stream
            return -1;
        if (share_flush(s, e) || gpu_stream_sync(s->compute, e)) return -1;
        take_out(s, pd, logits, first, r0, rows);
    }
    return 0;
}

// After the pass's last wait: its copies' timings and its time outside its streamed units, the trace, what the
// CPU share learns from it, the profile.
static int pass_end(dj_gpu_state *s, int64_t T, int streams, dj_err *e) {
    if (sched_harvest(s, e) || (streams && sched_pass_outside(s, &s->sh.pass_outside_s, e)) ||
        trace_pass_end(s->tr, e))
        return -1;
    if (s->tr && trace_done(s->tr)) trace_free(s->tr), s->tr = NULL;  // written: the rest of the run untraced
    share_learn(s, T);
    prof_collect(s, T == 1);
    s->st.passes++;
    return 0;
}

// A step of T rows staged in h_pos and h_kv_slot: after the slots, each row's first key the pass writes in its slot
// (gpu_kv_rows.fresh: the decode attention copies the keys below it early).
static void step_fresh(dj_gpu_state *s, int64_t T) {
    gpu_kv_fresh(s->b.h_kv_slot + T, s->b.h_kv_slot, s->b.h_pos, T, s->slot_first);
}

// One pass over pd->T <= max_batch tokens, whose positions and KV slots the caller staged in h_pos and h_kv_slot.
static int pass_run(dj_gpu_state *s, const pass_desc *pd, dj_err *e) {
    if (trace_pass_begin(s->tr, pd->T, s->sc.issued, e)) return -1;
    sched_pass_begin(s, pd->T);
    share_pass_begin(&s->sh);
    if (s->opts.tp) tp_pass_begin(s->opts.tp, s->opts.tp_rank);
    if (upload_tokens(s, pd, e)) return -1;
    if (graph_now(s, pd)) return graph_step(s, pd, e);
    gpu_unit head;
    const int streams = s->sc.plan->n_streamed > 0;  // the pass's time outside its streamed units is measured
    if ((streams && gpu_event_record(s->sc.p0, s->compute, e)) || gpu_body(s, pd, &head, e) ||
        pass_head(s, pd, &head, streams, e))
        return -1;
    return pass_end(s, pd->T, streams, e);
}

// A pass that fails lets go the GPU's wait for a CPU job it queued: a later wait on the stream would never end.
static int gpu_pass(dj_gpu_state *s, const pass_desc *pd, dj_err *e) {
    if (pass_run(s, pd, e)) {
        share_release(s);
        return -1;
    }
    return 0;
}

void graphs_drop(dj_gpu_state *s) {
    if (s->graph) gpu_graph_destroy(s->graph), s->graph = NULL;
    for (int t = 0; t <= GPU_LOGIT_ROWS; t++) {
        if (s->row_graph[t]) gpu_graph_destroy(s->row_graph[t]), s->row_graph[t] = NULL;
        if (s->run_graph[t]) gpu_graph_destroy(s->run_graph[t]), s->run_graph[t] = NULL;
    }
}

int kv_slot_ok(const dj_gpu_state *s, int32_t slot, dj_err *e) {
    if (slot < 0 || slot >= s->n_slots)
        return dj_fail(e, "gpu: KV slot %d does not exist (%d slots)", slot, s->n_slots);
    return 0;
}

// Ctrl-C (dj_gpu_opts.cancel): 1 with e set ("interrupted") once it came.
static int cancelled(const dj_gpu_state *s, dj_err *e) {
    return s->opts.cancel && *s->opts.cancel ? (dj_fail(e, "interrupted"), 1) : 0;
}

// A prompt longer than one pass takes several; each streams the weights once. The last one gives the logits or
// the pick. A pass of one token is a decode step of one row (the graph serves every slot). Ctrl-C stops it between
// passes.
static int forward(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                   int all, const pick_req *pk, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    if (kv_slot_ok(s, slot, e) || park_order(s, slot, e)) return -1;
    if (T < 1 || pos < 0 || pos + T > s->max_seq)
        return dj_fail(e, "positions %lld..%lld outside the context of %lld", (long long)pos, (long long)(pos + T - 1),
                       (long long)s->max_seq);
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= c->vocab_size)
            return dj_fail(e, "token id %d outside the vocabulary (%u)", tokens[t], c->vocab_size);
    for (int64_t t0 = 0; t0 < T; t0 += s->max_batch) {
        if (cancelled(s, e)) return -1;
        int64_t n = T - t0 < s->max_batch ? T - t0 : s->max_batch, last = t0 + n == T;
        float *out = !logits ? NULL : all ? logits + t0 * (int64_t)c->vocab_size : last ? logits : NULL;
        const pick_req *pick = last ? pk : NULL;  // the logits of every row, or of the last (picked, or none)
        pass_desc pd = {.tokens = tokens + t0, .T = n, .step = n == 1, .kv_slot = slot, .singles = 1, .logits = out,
                        .logit_first = all && !pick ? 0 : n - 1, .logit_end = n, .pick = pick};
        for (int64_t t = 0; t < n; t++) s->b.h_pos[t] = (int32_t)(pos + t0 + t);
        s->b.h_kv_slot[0] = slot;
        if (pd.step) step_fresh(s, 1);
        if (gpu_pass(s, &pd, e)) return -1;
    }
    return 0;
}

int gpu_forward(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                int all, dj_err *e) {
    return forward(s, slot, tokens, T, pos, logits, all, NULL, e);
}

int gpu_forward_pick(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                     const dj_pick_args *a, const int32_t *counts, int32_t *next, dj_err *e) {
    pick_req pk = {a, counts, next};
    return forward(s, slot, tokens, T, pos, NULL, 0, &pk, e);
}

// One pass of rows [a, b) of a checked gpu_step_rows call, whose wanted rows in it are want[w0, w1): ordered
// for the device as the wanted rows (in want's order), the other rows attending alone, then the runs of two or more
// consecutive rows of one slot (the rest of a prompt's chunk); logits (w1 - w0, vocab), or pk's picks of them.
static int step_pass(dj_gpu_state *s, int64_t a, int64_t b, const int32_t *slots, const int64_t *pos,
                     const int32_t *tokens, const int32_t *want, int64_t w0, int64_t w1, float *logits,
                     const pick_req *pk, dj_err *e) {
    uint8_t *wanted = s->step_wanted;
    int64_t n = 0;
    memset(wanted + a, 0, (size_t)(b - a));
    for (int64_t w = w0; w < w1; w++) wanted[want[w]] = 1;
#define PLACE(k) (s->step_tok[n] = tokens[k], s->b.h_pos[n] = (int32_t)pos[k], s->b.h_kv_slot[n] = slots[k], n++)
    for (int64_t w = w0; w < w1; w++) PLACE(want[w]);
    pass_desc pd = {.tokens = s->step_tok, .step = 1, .runs = s->runs, .logits = logits, .logit_end = w1 - w0,
                    .pick = pk};
    for (int runs = 0; runs < 2; runs++) {  // the rows alone first, then the runs
        for (int64_t r = a, len; r < b; r += len) {
            len = 1;
            if (wanted[r]) continue;
            while (r + len < b && !wanted[r + len] && slots[r + len] == slots[r]) len++;
            if ((len > 1) != runs) continue;
            if (runs) s->runs[pd.n_runs++] = (step_run){n, len, slots[r]};
            for (int64_t k = r; k < r + len; k++) PLACE(k);
        }
        if (!runs) pd.singles = n;
    }
#undef PLACE
    pd.T = n;
    step_fresh(s, n);
    return gpu_pass(s, &pd, e);
}

// gpu_step_rows and gpu_step_rows_pick: logits (n_want, vocab), or the picks by args (n_want) into next (n_want).
static int step_rows(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                     int64_t n_want, const int32_t *want, float *logits, const dj_pick_args *args, int32_t *next,
                     dj_err *e) {
    const dj_config *c = &s->m->info.config;
    if (n < 1) return dj_fail(e, "gpu_step_rows: %lld rows", (long long)n);
    int32_t *began = s->slot_began;  // a run of this KV slot began in an earlier row
    memset(began, 0, (size_t)s->n_slots * sizeof *began);
    for (int64_t i = 0; i < n; i++) {
        if (kv_slot_ok(s, slots[i], e)) return -1;
        if (pos[i] < 0 || pos[i] >= s->max_seq)
            return dj_fail(e, "gpu: row %lld: position %lld outside the context of %lld", (long long)i,
                           (long long)pos[i], (long long)s->max_seq);
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= c->vocab_size)
            return dj_fail(e, "gpu: token id %d out of range (vocab %u)", tokens[i], c->vocab_size);
        if (i && slots[i] == slots[i - 1]) {
            if (pos[i] != pos[i - 1] + 1)
                return dj_fail(e, "gpu: rows %lld and %lld of KV slot %d are not consecutive positions",
                               (long long)i - 1, (long long)i, slots[i]);
        } else if (began[slots[i]]) {
            return dj_fail(e, "gpu: KV slot %d twice in one batch", slots[i]);
        } else {
            began[slots[i]] = 1;
        }
    }
    for (int64_t w = 0; w < n_want; w++)
        if (want[w] < 0 || want[w] >= n || (w && want[w] <= want[w - 1]))
            return dj_fail(e, "gpu_step_rows: the rows wanted are not ascending rows of the %lld", (long long)n);
    // passes of up to max_batch rows; a long run splits between passes, its later rows seeing the earlier ones' keys
    int64_t a = 0, w = 0;
    while (a < n) {
        int64_t b = a + s->max_batch < n ? a + s->max_batch : n, wb = w;
        while (wb < n_want && want[wb] < b) wb++;
        for (int64_t r = a; r < b; r++)
            if (park_order(s, slots[r], e)) return -1;
        const pick_req pk = {args ? args + w : NULL, NULL, next ? next + w : NULL};
        if (step_pass(s, a, b, slots, pos, tokens, want, w, wb, args ? NULL : logits + w * (int64_t)c->vocab_size,
                      args && wb > w ? &pk : NULL, e))
            return -1;
        a = b, w = wb;
    }
    return 0;
}

int gpu_step_rows(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                  int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    return step_rows(s, n, slots, pos, tokens, n_want, want, logits, NULL, NULL, e);
}

int gpu_step_rows_pick(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                       int64_t n_want, const int32_t *want, const dj_pick_args *args, int32_t *next, dj_err *e) {
    for (int64_t w = 0; w < n_want; w++)
        if (args[w].penalize)
            return dj_fail(e, "gpu_step_rows_pick: row %lld's sampler has a penalty on: its counts go with "
                              "gpu_forward_pick, one row at a time", (long long)w);
    return step_rows(s, n, slots, pos, tokens, n_want, want, NULL, args, next, e);
}

void gpu_state_stats(dj_gpu_state *s, dj_gpu_stats *out) {
    park_stats(s);
    *out = s->st;
    out->cpu_chains = s->sh.chains;
}

// ---- set-up
// The device, its streams, and the kernels this model's shapes take.
static int open_device(dj_gpu_state *s, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    const dj_layer_layout *L = &s->m->info.layer;
    if (gpu_open(&s->g, s->opts.gpus[0], e) || gpu_stream_create(&s->compute, e) || gpu_stream_create(&s->copy, e))
        return -1;
    uint64_t dim = c->dim, q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    uint32_t wt = c->wtype;
    s->fused_qkv = L->wk == L->wq + dj_matrix_bytes(wt, q, dim) && L->wv == L->wk + dj_matrix_bytes(wt, kv, dim);
    s->fused_gate_up = L->w_up == L->w_gate + dj_matrix_bytes(wt, c->hidden_dim, dim);
    s->tc_attn = !s->opts.fma_attn && gpu_tc_attn_supported(s->g, c->head_dim);
    gpu_set_tc_attn(s->g, s->tc_attn);
    if (!s->opts.quiet)
        fprintf(stderr, "gpu: prefill attention: %s\n",
                s->tc_attn            ? "tensor cores (bf16x3)"
                : s->opts.fma_attn    ? "fp32 FMA kernel (--fma-attn)"
                                      : "fp32 FMA kernel (the tensor-core kernel needs head_dim a multiple of 16 up "
                                        "to 256)");
    s->max_seq = s->opts.max_seq;
    s->n_slots = s->opts.n_slots > 0 ? s->opts.n_slots : 1;
    s->slot_elems = (int64_t)c->n_layers * c->n_kv_heads * s->max_seq * c->head_dim;
    s->b.kv.type = s->opts.kv_type;
    if (s->b.kv.type < 0 || s->b.kv.type >= DJ_KV_TYPES)
        return dj_fail(e, "KV cache type %d unknown", s->b.kv.type);
    s->max_batch = gpu_pass_rows(&s->opts);
    return 0;
}

int64_t gpu_pass_rows(const dj_gpu_opts *o) {
    const int64_t rows = o->max_batch > 0 ? o->max_batch : GPU_MAX_BATCH;
    return rows < o->max_seq ? rows : o->max_seq;
}

// Several GPUs: the rows of lm_head this GPU computes where the head splits (tp_head_agree); else 0.
static uint64_t head_part_rows(const dj_gpu_state *s) {
    if (!s->opts.tp) return 0;
    const tp_range v = tp_vocab_rows(s->opts.tp, s->opts.tp_rank);
    return (uint64_t)(v.hi - v.lo);
}

// Device memory outside the weights, so that the automatic budget and the free-memory check see it.
typedef struct {
    uint64_t kv, act, scratch;    // kv: keys and values with their scales
    uint64_t kv_elems, kv_scales;  // the bytes of each of keys and values, and of each's scales (q8; else 0)
    uint64_t other;  // all of it, with the cuBLAS workspace and some slack
} gpu_sizes;

static gpu_sizes buffer_sizes(const dj_gpu_state *s) {
    const dj_config *c = &s->m->info.config;
    uint64_t dim = c->dim, hd = c->head_dim, q = (uint64_t)c->n_heads * hd, kv = (uint64_t)c->n_kv_heads * hd,
             hid = c->hidden_dim, mb = (uint64_t)s->max_batch;
    gpu_sizes z;
    const uint64_t rows = (uint64_t)c->n_layers * c->n_kv_heads * (uint64_t)s->max_seq * (uint64_t)s->n_slots;
    z.kv_elems = rows * hd * dj_kv_elem_bytes(s->opts.kv_type);
    z.kv_scales = rows * (dj_kv_row_bytes(s->opts.kv_type, hd) - hd * dj_kv_elem_bytes(s->opts.kv_type));
    z.kv = 2 * (z.kv_elems + z.kv_scales);
    z.act = 4 * (mb * (3 * dim + q + 2 * kv + q + 3 * hid) + (GPU_LOGIT_ROWS + 1) * (uint64_t)c->vocab_size +
                 GPU_LOGIT_ROWS * head_part_rows(s)) +
            gpu_pick_scratch(GPU_LOGIT_ROWS) + GPU_LOGIT_ROWS * (sizeof(dj_pick_args) + 4);
    int64_t widest = (int64_t)(hid > dim ? hid : (q > dim ? q : dim));
    z.scratch = gpu_matmul_scratch(c->wtype, s->max_batch, widest);
    uint64_t head = gpu_matmul_scratch(dj_lm_head_type(s->m), GPU_LOGIT_ROWS, (int64_t)dim);
    if (head > z.scratch) z.scratch = head;
    int64_t step = s->n_slots < s->max_batch ? s->n_slots : s->max_batch;  // rows of a step attending alone
    const int64_t pass_rows = s->max_batch < PASS_DECODE_ROWS ? s->max_batch : PASS_DECODE_ROWS;  // (attention())
    if (pass_rows > step) step = pass_rows;
    uint64_t att = gpu_attention_scratch(step, c->n_heads, c->n_kv_heads, (int64_t)hd, s->max_seq);
    if (att > z.scratch) z.scratch = att;
    z.act += share_device_bytes(s);
    z.other = z.kv + z.act + z.scratch + (64ull << 20);
    return z;
}

// The weight budget: --ring-gb, or the free memory minus everything else and a margin.
#define GPU_MARGIN (512ull << 20)
static int weight_budget(const dj_gpu_state *s, const gpu_sizes *z, uint64_t *budget, size_t *free_b, dj_err *e) {
    size_t total_b;
    if (gpu_mem_info(free_b, &total_b, e)) return -1;
    if (*free_b < z->other + GPU_MARGIN)
        return dj_fail(e, "GPU has %.2f GB free, not enough for the KV cache (%.2f GB for -c %lld) and activations "
                          "(%.2f GB): lower -c", (double)*free_b / 1e9, (double)z->kv / 1e9, (long long)s->max_seq,
                       (double)(z->act + z->scratch) / 1e9);
    if (s->opts.ring_gb <= 0) {  // GPUs of a tensor-parallel engine sharing this device take equal parts
        const uint64_t k = s->opts.tp ? (uint64_t)tp_turn_sharers(s->opts.tp, s->opts.tp_rank) : 1;
        if (*free_b < k * z->other + GPU_MARGIN)
            return dj_fail(e, "GPU has %.2f GB free, not enough for %d parts of the model's KV cache and activations",
                           (double)*free_b / 1e9, (int)k);
        *budget = (*free_b - k * z->other - GPU_MARGIN) / k;
        return 0;
    }
    *budget = rb_gb_bytes(s->opts.ring_gb);
    if (*budget + z->other > *free_b)
        return dj_fail(e, "--ring-gb %.2f is more than the GPU can give: %.2f GB free, of which %.2f GB go to the KV "
                          "cache (-c %lld) and activations; use --ring-gb %.2f or less", s->opts.ring_gb,
                       (double)*free_b / 1e9, (double)z->other / 1e9, (long long)s->max_seq,
                       (double)(*free_b - z->other - GPU_MARGIN) / 1e9);
    return 0;
}

// The plan: units in forward order, the head last; as many resident as the budget allows, a ring for the rest.
static int make_plan(dj_gpu_state *s, const gpu_sizes *z, uint64_t budget, size_t free_b, dj_err *e) {
    const dj_gpu_opts *o = &s->opts;
    int nl = (int)s->m->info.config.n_layers;
    uint64_t sizes[RB_MAX_UNITS];
    for (int u = 0; u <= nl; u++) sizes[u] = unit_bytes(s->m, u, &s->sc.head_lm_off);
    if (rb_plan_make(s->sc.plan, sizes, nl + 1, budget, 0, GPU_ALIGN, o->stream_all, e)) return -1;
    const rb_plan *p = s->sc.plan;
    if (p->weight_bytes + z->other > free_b)
        return dj_fail(e, "--ring-gb %.2f needs %.2f GB of GPU memory for weights plus %.2f GB for the KV cache (-c "
                          "%lld) and activations, but only %.2f GB are free", (double)budget / 1e9,
                       (double)p->weight_bytes / 1e9, (double)z->other / 1e9, (long long)s->max_seq,
                       (double)free_b / 1e9);
    s->st.bytes_per_token = p->streamed_bytes;
    s->st.n_resident = p->n_resident;
    s->st.n_streamed = p->n_streamed;
    s->st.resident_bytes = p->resident_bytes;
    if (o->quiet) return 0;
    fprintf(stderr, "gpu: %s\n", gpu_name(s->g));
    fprintf(stderr, "gpu: weight budget %.2f GB%s: %d of %d layers + head resident (%.2f GB), %d units streamed "
                    "(%.2f GB per token over PCIe, ring %.2f GB, %d slots)%s%s\n",
            (double)budget / 1e9, o->ring_gb > 0 ? " (--ring-gb)" : " (free memory minus KV cache and activations)",
            p->n_resident - (p->resident[nl] ? 1 : 0), nl, (double)p->resident_bytes / 1e9, p->n_streamed,
            (double)p->streamed_bytes / 1e9, (double)p->ring_size / 1e9, p->slots,
            o->stream_all ? ", --stream-all" : "", o->sync_copy ? ", --sync-copy" : "");
    fprintf(stderr, "gpu: KV cache %.2f GB (%d slot%s of context %lld, %s), activations %.2f GB\n",
            (double)z->kv / 1e9, s->n_slots, s->n_slots == 1 ? "" : "s", (long long)s->max_seq,
            dj_kv_name(s->b.kv.type), (double)(z->act + z->scratch) / 1e9);
    return 0;
}

// Device memory, each allocation named so that an out-of-memory error says what did not fit; pinned staging; the
// RoPE table.
static int alloc_buffers(dj_gpu_state *s, const gpu_sizes *z, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    gpu_bufs *b = &s->b;
    uint64_t dim = c->dim, hd = c->head_dim, q = (uint64_t)c->n_heads * hd, kv = (uint64_t)c->n_kv_heads * hd,
             hid = c->hidden_dim, mb = (uint64_t)s->max_batch, vocab = c->vocab_size;
    if (gpu_malloc((void **)&s->sc.d_w, s->sc.plan->weight_bytes, "weights (resident layers and the ring)", e) ||
        gpu_malloc(&b->kv.k, z->kv_elems, "KV cache (keys)", e) ||
        gpu_malloc(&b->kv.v, z->kv_elems, "KV cache (values)", e) ||
        (z->kv_scales && (gpu_malloc((void **)&b->kv.ks, z->kv_scales, "KV cache (scales)", e) ||
                          gpu_malloc((void **)&b->kv.vs, z->kv_scales, "KV cache (scales)", e))) ||
        gpu_malloc((void **)&b->inv_freq, hd / 2 * 4, "rope table", e) ||
        gpu_malloc((void **)&b->x, mb * dim * 4, "activations", e) ||
        gpu_malloc((void **)&b->xb, mb * dim * 4, "activations", e) ||
        gpu_malloc((void **)&b->delta, mb * dim * 4, "activations", e) ||
        gpu_malloc((void **)&b->qkv, mb * (q + 2 * kv) * 4, "activations", e) ||
        gpu_malloc((void **)&b->att, mb * q * 4, "activations", e) ||
        gpu_malloc((void **)&b->ffn, mb * 2 * hid * 4, "activations", e) ||
        gpu_malloc((void **)&b->hb, mb * hid * 4, "activations", e) ||
        gpu_malloc((void **)&b->logits, GPU_LOGIT_ROWS * vocab * 4, "logits", e) ||
        (s->opts.tp && gpu_malloc((void **)&b->head_part, GPU_LOGIT_ROWS * head_part_rows(s) * 4, "logits", e)) ||
        gpu_malloc((void **)&b->pos, mb * 4, "positions", e) ||
        gpu_malloc((void **)&b->kv_slot, mb * 8, "KV slots", e) ||
        gpu_reserve(s->g, z->scratch, e) ||
        gpu_malloc((void **)&b->pick, GPU_LOGIT_ROWS * sizeof *b->pick, "sampling", e) ||
        gpu_malloc((void **)&b->counts, vocab * 4, "sampling", e) ||
        gpu_malloc((void **)&b->next, GPU_LOGIT_ROWS * 4, "sampling", e) ||
        gpu_malloc(&b->pick_scratch, gpu_pick_scratch(GPU_LOGIT_ROWS), "sampling", e) ||
        gpu_host_alloc((void **)&b->h_pick, GPU_LOGIT_ROWS * sizeof *b->h_pick, "sampling staging", e) ||
        gpu_host_alloc((void **)&b->h_next, GPU_LOGIT_ROWS * 4, "sampling staging", e) ||
        gpu_host_alloc((void **)&b->h_x, mb * dim * 4, "embedding staging", e) ||
        gpu_host_alloc((void **)&b->h_logits, GPU_LOGIT_ROWS * vocab * 4, "logits staging", e) ||
        gpu_host_alloc((void **)&b->h_pos, mb * 4, "position staging", e) ||
        gpu_host_alloc((void **)&b->h_kv_slot, mb * 8, "position staging", e))
        return -1;
    s->runs = malloc(mb * sizeof *s->runs), s->step_tok = malloc(mb * 4), s->step_wanted = malloc(mb);
    s->slot_began = malloc((size_t)s->n_slots * 4), s->slot_first = malloc((size_t)s->n_slots * 4);
    if (!s->runs || !s->step_tok || !s->step_wanted || !s->slot_began || !s->slot_first)
        return dj_fail(e, "out of memory");
    float *inv = malloc((size_t)hd / 2 * 4);
    if (!inv) return dj_fail(e, "out of memory");
    cpu_rope_freqs(c, inv);
    int rc = gpu_h2d(b->inv_freq, inv, (size_t)hd / 2 * 4, e);
    free(inv);
    return rc;
}

// Several GPUs: whether the head splits by vocab rows, agreed by every GPU before the first pass and kept for the
// engine's life (each GPU computing the same head chunks, or the gathers would wait for ever). This GPU can split
// where no CPU share can take rows of its head (no share, or the head resident: the share takes streamed units only)
// and its rows start 16 bytes apart, as the whole head's do (the matmuls' vector loads).
static int head_agree(dj_gpu_state *s, dj_err *e) {
    const dj_config *c = &s->m->info.config;
    if (!s->opts.tp) return 0;
    const int can = (s->opts.cpu_share == 0 || s->sc.plan->resident[c->n_layers]) && head_part_rows(s) > 0 &&
                    dj_row_bytes(dj_lm_head_type(s->m), c->dim) % 16 == 0;
    const int split = tp_head_agree(s->opts.tp, s->opts.tp_rank, can, s->b.logits, e);
    if (split < 0) return -1;
    s->head_split = split;
    return 0;
}

// Resident units: copied once.
static int copy_resident(dj_gpu_state *s, dj_err *e) {
    const rb_plan *p = s->sc.plan;
    for (int u = 0; u <= (int)s->m->info.config.n_layers; u++) {
        if (cancelled(s, e)) return -1;
        if (p->resident[u] && unit_copy(s, u, s->sc.d_w + p->offset[u], s->copy, SLOT_EMPTY, 0, &(uint64_t){0}, e))
            return -1;
    }
    return gpu_stream_sync(s->copy, e);
}

// One prefill pass of opts.warm_rows tokens (2 when not given; at most a pass and the context) and, all resident,
// one decode step, which captures the graph, each with a pick: module loading (CUDA loads each kernel at its first launch, and
// cuBLAS picks its kernels by shape: on the H100 the 7B's first 512-token pass took 32 ms, the next ones 17),
// cuBLAS's first-call set-up and the graph capture happen here, not in the user's time to first token. The KV
// cache rows it writes are overwritten by the real prompt. Its copies measure the link for --cpu-share auto.
static int warm_up(dj_gpu_state *s, dj_err *e) {
    s->sc.warming = 1;
    int64_t T = s->opts.warm_rows > 0 ? s->opts.warm_rows : 2;
    if (T > s->max_batch) T = s->max_batch;
    if (T > s->max_seq) T = s->max_seq;
    int32_t *toks = calloc((size_t)T, sizeof *toks), next;
    if (!toks) return dj_fail(e, "out of memory");
    const dj_pick_args a = {.temp = 1, .top_p = 0.5f, .min_p = 0.01f, .top_k = 8, .repeat_penalty = 1};  // every path
    int rc = gpu_forward_pick(s, 0, toks, T, 0, &a, NULL, &next, e);
    // (several GPUs: every one takes both passes, whatever its own plan, as they meet in each)
    if (!rc && (!s->sc.plan->n_streamed || s->opts.tp) && s->max_seq > T)
        rc = gpu_forward_pick(s, 0, toks, 1, T, &a, NULL, &next, e);
    free(toks);
    memset(s->prof.ms, 0, sizeof s->prof.ms);
    memset(s->prof.passes, 0, sizeof s->prof.passes);
    dj_gpu_stats keep = s->st;
    s->sh.warm_h2d = keep.copy_ms > 0 ? (double)keep.copied_bytes / 1e6 / keep.copy_ms : 0;
    s->sc.warming = 0;
    memset(&s->st, 0, sizeof s->st);
    s->st.bytes_per_token = keep.bytes_per_token, s->st.n_resident = keep.n_resident;
    s->st.n_streamed = keep.n_streamed, s->st.resident_bytes = keep.resident_bytes;
    s->st.tc_attn = s->tc_attn, s->st.head_split = s->head_split;
    return rc;
}

dj_gpu_state *gpu_state_new(const dj_model *m, const dj_gpu_opts *o, dj_err *e) {
    if (!m->for_gpu) {
        dj_fail(e, "internal error: the model was not loaded for the GPU (model_load with want_pinned)");
        return NULL;
    }
    dj_gpu_state *s = calloc(1, sizeof *s);
    if (!s || !(s->sc.plan = calloc(1, sizeof *s->sc.plan))) {
        free(s);
        dj_fail(e, "out of memory");
        return NULL;
    }
    s->m = m;
    s->opts = *o;
    gpu_sizes z;
    uint64_t budget = 0;
    size_t free_b = 0;
    if (open_device(s, e)) goto fail;
    z = buffer_sizes(s);
    // several GPUs: each sizes its memory in turn (parts sharing a device see what the earlier ones took)
    if (o->tp && tp_turn_begin(o->tp, o->tp_rank, e)) goto fail;
    const int unsized = weight_budget(s, &z, &budget, &free_b, e) ||  // what the weights may use
                        make_plan(s, &z, budget, free_b, e) ||  // which units stay resident; the ring for the rest
                        alloc_buffers(s, &z, e);                // activations, KV cache, staging
    if (o->tp) tp_turn_end(o->tp, o->tp_rank);
    if (unsized ||
        head_agree(s, e) ||                           // several GPUs: the head split by vocab rows, or not
        copy_resident(s, e) ||                        // resident units, copied once
        sched_init(s, e) ||                           // the ring's events and the copy records
        park_init(s, e) ||                            // the parking stream and the slots' events
        prof_init(s, e))
        goto fail;
    // The CPU share: a fixed one from now on, an automatic one once the warm-up has measured the copies.
    int want_share = o->cpu_share != 0 && s->sc.plan->n_streamed;
    if (o->cpu_share != 0 && !s->sc.plan->n_streamed && !o->quiet)
        fprintf(stderr, "gpu: --cpu-share: every layer is resident, so the GPU computes everything\n");
    if (want_share && share_init(s, e)) goto fail;
    share_split(s, want_share && o->cpu_share > 0 ? fmin(o->cpu_share, 0.95) : 0);
    if (warm_up(s, e)) goto fail;
    if (want_share && o->cpu_share < 0) share_auto(s);
    share_stats(s);
    if (s->sh.share > 0 && !o->quiet)
        fprintf(stderr, "gpu: CPU share %.2f%s: in decode the CPU computes that part of every streamed unit's matrices "
                        "from host memory: %.2f GB per token over PCIe, %.2f GB read by the CPU (%d threads)\n",
                s->sh.share, o->cpu_share < 0 ? " (automatic)" : "", (double)s->st.bytes_per_token / 1e9,
                (double)s->st.cpu_bytes_per_token / 1e9, cpu_threads());
    if (o->trace) {  // the timeline of the decode steps to come
        tr_info ti = {gpu_name(s->g), dj_dtype_name(s->m->info.config.wtype), (int)s->m->info.config.n_layers,
                      s->sc.plan->resident, s->sh.share, s->st.bytes_per_token, s->st.cpu_bytes_per_token};
        if (!(s->tr = trace_open(o->trace, o->trace_steps > 0 ? o->trace_steps : TRACE_STEPS_DEFAULT, &ti,
                                 s->compute, s->copy, o->quiet, e)))
            goto fail;
    }
    return s;
fail:
    gpu_state_free(s);
    return NULL;
}

void gpu_state_free(dj_gpu_state *s) {
    if (!s) return;
    share_release(s);
    if (s->compute) gpu_stream_sync(s->compute, NULL);
    if (s->copy) gpu_stream_sync(s->copy, NULL);
    dj_err te;
    if (trace_close(s->tr, &te)) fprintf(stderr, "djinn: --trace: %s\n", te.msg);  // a run shorter than the trace
    trace_free(s->tr);
    park_free(s);
    sched_free(s);
    share_free(s);
    graphs_drop(s);
    gpu_probe_free(s);
    prof_free(s);
    gpu_bufs *b = &s->b;
    void *dev[] = {s->sc.d_w, b->inv_freq, b->kv.k, b->kv.v, b->kv.ks, b->kv.vs, b->x, b->xb, b->delta, b->qkv,
                   b->att, b->ffn, b->hb, b->logits, b->head_part, b->pos, b->kv_slot, b->pick, b->counts, b->next,
                   b->pick_scratch};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu_free(dev[i]);
    gpu_host_free(b->h_x), gpu_host_free(b->h_logits), gpu_host_free(b->h_pos), gpu_host_free(b->h_kv_slot);
    free(s->runs), free(s->step_tok), free(s->step_wanted), free(s->slot_began), free(s->slot_first);
    gpu_host_free(b->h_pick), gpu_host_free(b->h_next);
    if (s->compute) gpu_stream_destroy(s->compute);
    if (s->copy) gpu_stream_destroy(s->copy);
    gpu_close(s->g);
    free(s);
}
