// test_tp.c: the tensor-parallel split plan (tp.h): its refusals at their bounds, its coverage and balance over many
// shapes, its byte counts, cutting columns; and a CPU reference of the split forward pass (each GPU's heads and FFN
// rows, the partial sums of wo and w_down added as an all-reduce would) against the unsplit CPU engine's logits.
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../convert/convert.h"
#include "../cpu.h"
#include "../engine.h"
#include "../model.h"
#include "../quant.h"
#include "../tp.h"
#include "common.h"

// A synthetic config of the shape that matters to the plan.
static dj_config shape(uint32_t n_heads, uint32_t n_kv, uint32_t hd, uint32_t hidden, uint32_t wtype) {
    dj_config c = {.dim = 64, .n_layers = 3, .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd,
                   .hidden_dim = hidden, .vocab_size = 256, .max_seq_len = 64, .norm_eps = 1e-5f,
                   .rope_theta = 10000.0f};
    dj_config_set_wtype(&c, wtype);
    return c;
}

static int plan(const dj_config *c, int n, tp_split *out, dj_err *e) { return tp_plan(c, n, out, e); }

static void must_refuse(const dj_config *c, int n, const char *says) {
    tp_split s[TP_MAX_GPUS + 2];
    dj_err e = {{0}};
    cr_assert_eq(plan(c, n, s, &e), -1, "--gpus %d was not refused (%s expected)", n, says);
    cr_assert(strstr(e.msg, says), "--gpus %d: \"%s\" does not say \"%s\"", n, e.msg, says);
    cr_assert(!strchr(e.msg, '\n'), "not one line: %s", e.msg);
}

static void must_plan(const dj_config *c, int n) {
    tp_split s[TP_MAX_GPUS];
    dj_err e = {{0}};
    cr_assert_eq(plan(c, n, s, &e), 0, "--gpus %d refused: %s", n, e.msg);
}

// ---- refusals, each alone, at and beside its bound
Test(tp, refuses_gpu_counts_outside_one_to_max) {
    dj_config c = shape(16, 8, 64, 1024, DJ_F16);
    must_refuse(&c, -1, "between 1 and 8 GPUs");
    must_refuse(&c, 0, "between 1 and 8 GPUs");
    must_plan(&c, 1);
    must_plan(&c, TP_MAX_GPUS);
    must_refuse(&c, TP_MAX_GPUS + 1, "between 1 and 8 GPUs");
}

Test(tp, refuses_fewer_kv_heads_than_gpus) {
    dj_config c = shape(8, 4, 64, 1024, DJ_F16);
    must_plan(&c, 3);
    must_plan(&c, 4);
    must_refuse(&c, 5, "4 KV heads, whole heads per GPU: at most 4 GPUs");
}

// stories260K's attention shape (8 heads of 8 dims, 4 kv heads): in q4 a GPU's columns of wo must be whole groups of
// 32, two GPUs cut at 32 columns, four would cut at 16; f32 cuts anywhere on 4 columns.
Test(tp, refuses_wo_cuts_that_split_a_quant_group) {
    dj_config c = shape(8, 4, 8, 172, DJ_Q4);
    must_plan(&c, 2);
    must_refuse(&c, 4, "cannot be cut into whole heads at multiples of 32 columns of wo (q4)");
    // 3 kv heads of 32 columns over 2 GPUs cut at 32 or 64; 3 of 16 columns need the cut at 32: 2 + 1
    dj_config odd = shape(3, 3, 16, 128, DJ_Q8);
    tp_split s[2];
    dj_err e = {{0}};
    cr_assert_eq(plan(&odd, 2, s, &e), 0, "%s", e.msg);
    cr_assert_eq(s[0].kv_heads.hi, 2, "the cut must fall at 2 heads (32 columns), not %lld",
                 (long long)s[0].kv_heads.hi);
    c.wtype = DJ_F32;
    must_plan(&c, 4);
}

// FFN rows go in units of the granularity: hidden 172 in q8 is 6 units of 32.
Test(tp, refuses_fewer_ffn_units_than_gpus) {
    dj_config c = shape(8, 8, 32, 172, DJ_Q8);
    must_plan(&c, 6);
    must_refuse(&c, 7, "hidden_dim 172 is 6 units of 32 columns of w_down (q8)");
    dj_config f = shape(8, 8, 32, 20, DJ_F32);  // 5 units of 4
    must_plan(&f, 5);
    must_refuse(&f, 6, "hidden_dim 20 is 5 units of 4 columns");
}

// ---- coverage and balance over many shapes
static void check_cover(const tp_split *s, int n, size_t field, int64_t total, int64_t gran, const char *what,
                        const char *ctx) {
    int64_t lo = 0;
    for (int g = 0; g < n; g++) {
        tp_range r = *(const tp_range *)((const char *)&s[g] + field);
        cr_assert_eq(r.lo, lo, "%s: GPU %d's %s start at %lld, not where GPU %d's end (%lld)", ctx, g, what,
                     (long long)r.lo, g - 1, (long long)lo);
        cr_assert_gt(r.hi, r.lo, "%s: GPU %d has no %s", ctx, g, what);
        cr_assert(g == 0 || r.lo % gran == 0, "%s: GPU %d's %s cut at %lld, not a multiple of %lld", ctx, g, what,
                  (long long)r.lo, (long long)gran);
        lo = r.hi;
    }
    cr_assert_eq(lo, total, "%s: the %s cover %lld of %lld", ctx, what, (long long)lo, (long long)total);
}

// Whether any arrangement of kv-head counts (each base or base + 1, `extra` of them base + 1) puts every cut of
// wo's columns on a multiple of gran: the test's own search, by recursion.
static int some_fit(int g, int n, int extra, int64_t base, int64_t at, int64_t cols_per_head, int64_t gran) {
    if (g > 0 && g < n && (at * cols_per_head) % gran) return 0;  // the cut before GPU g
    if (g == n) return extra == 0;
    if (extra > 0 && some_fit(g + 1, n, extra - 1, base, at + base + 1, cols_per_head, gran)) return 1;
    return extra < n - g && some_fit(g + 1, n, extra, base, at + base, cols_per_head, gran);
}

// One shape on n GPUs: tp_plan refuses exactly when the test's own search finds no plan; a plan covers every kv
// head, head, row and column once, in order, cut on the granularity, kv heads and FFN units at most one apart.
// Returns whether it planned.
static int check_shape(uint32_t kv, uint32_t grp, uint32_t hd_, uint32_t hidden, uint32_t wtype, int n) {
    dj_config c = shape(kv * grp, kv, hd_, hidden, wtype);
    int64_t gran = tp_col_granularity(wtype), hd = hd_, units = (hidden + gran - 1) / gran;
    char ctx[200];
    snprintf(ctx, sizeof ctx, "%u heads, %u kv, head_dim %u, hidden %u, %s, %d GPUs", c.n_heads, kv, hd_, hidden,
             dj_dtype_name(wtype), n);
    int fits = (int64_t)kv >= n && units >= n &&
               some_fit(0, n, (int)(kv % (uint32_t)n), kv / (uint32_t)n, 0, grp * hd, gran);
    tp_split s[TP_MAX_GPUS];
    dj_err e = {{0}};
    int rc = tp_plan(&c, n, s, &e);
    cr_assert_eq(rc, fits ? 0 : -1, "%s: tp_plan %s (%s)", ctx, rc ? "refused" : "planned", e.msg);
    if (rc) return 0;
    check_cover(s, n, offsetof(tp_split, kv_heads), kv, 1, "kv heads", ctx);
    check_cover(s, n, offsetof(tp_split, heads), kv * grp, grp, "heads", ctx);
    check_cover(s, n, offsetof(tp_split, kv_rows), kv * hd, hd, "kv rows", ctx);
    check_cover(s, n, offsetof(tp_split, q_rows), kv * grp * hd, gran, "wo columns", ctx);
    check_cover(s, n, offsetof(tp_split, ffn_rows), hidden, gran, "FFN rows", ctx);
    check_cover(s, n, offsetof(tp_split, vocab_rows), c.vocab_size, 1, "vocab rows", ctx);
    int64_t kmin = kv, kmax = 0, umin = units, umax = 0;
    for (int g = 0; g < n; g++) {
        int64_t k = s[g].kv_heads.hi - s[g].kv_heads.lo, u = (s[g].ffn_rows.hi - s[g].ffn_rows.lo + gran - 1) / gran;
        cr_assert_eq(s[g].heads.lo, s[g].kv_heads.lo * grp, "%s: GPU %d's heads are not its kv heads' groups", ctx, g);
        cr_assert_eq(s[g].q_rows.lo, s[g].heads.lo * hd, "%s: GPU %d's wq rows are not its heads'", ctx, g);
        cr_assert_eq(s[g].kv_rows.lo, s[g].kv_heads.lo * hd, "%s: GPU %d's wk rows are not its kv heads'", ctx, g);
        kmin = k < kmin ? k : kmin, kmax = k > kmax ? k : kmax;
        umin = u < umin ? u : umin, umax = u > umax ? u : umax;
    }
    cr_assert_leq(kmax - kmin, 1, "%s: kv heads %lld to %lld a GPU", ctx, (long long)kmin, (long long)kmax);
    cr_assert_leq(umax - umin, 1, "%s: FFN units %lld to %lld a GPU", ctx, (long long)umin, (long long)umax);
    return 1;
}

// Odd head counts, GQA ratios 1 to 5, head_dims that do and do not fill a group, hidden sizes not divisible by N.
Test(tp, plans_cover_every_head_and_row_once_balanced) {
    static const uint32_t wtypes[] = {DJ_F32, DJ_F16, DJ_BF16, DJ_Q8, DJ_Q4};
    static const uint32_t hds[] = {4, 8, 12, 16, 48, 64, 80, 128};
    static const uint32_t hiddens[] = {1, 20, 31, 32, 33, 172, 300, 1000, 11008, 14336, 28672};
    int planned = 0, shapes = 0;
    for (uint32_t kv = 1; kv <= 12; kv++)
        for (uint32_t grp = 1; grp <= 5; grp++)
            for (size_t ih = 0; ih < sizeof hds / sizeof hds[0]; ih++)
                for (size_t if_ = 0; if_ < sizeof hiddens / sizeof hiddens[0]; if_++)
                    for (size_t iw = 0; iw < 5; iw++)
                        for (int n = 1; n <= TP_MAX_GPUS; n++, shapes++)
                            planned += check_shape(kv, grp, hds[ih], hiddens[if_], wtypes[iw], n);
    cr_log_info("tp_plan: %d shapes, %d planned, %d refused", shapes, planned, shapes - planned);
    cr_assert_gt(planned, shapes / 4, "too few shapes planned to prove much");
}

// lm_head's vocab rows: contiguous, covering the vocab once in GPU order, at most one row apart, the larger slices
// first; vocabs that N divides and ones it does not (Llama-3's 128256, odd ones, one row more than N).
Test(tp, vocab_rows_tile_the_vocab_balanced) {
    static const uint32_t vocabs[] = {8, 9, 255, 256, 257, 512, 32000, 32001, 128256, 151936, 151937};
    for (size_t iv = 0; iv < sizeof vocabs / sizeof vocabs[0]; iv++)
        for (int n = 1; n <= TP_MAX_GPUS; n++) {
            dj_config c = shape(8, 8, 16, 256, DJ_F16);
            c.vocab_size = vocabs[iv];
            tp_split s[TP_MAX_GPUS];
            dj_err e = {{0}};
            cr_assert_eq(tp_plan(&c, n, s, &e), 0, "vocab %u on %d GPUs: %s", vocabs[iv], n, e.msg);
            char ctx[80];
            snprintf(ctx, sizeof ctx, "vocab %u on %d GPUs", vocabs[iv], n);
            check_cover(s, n, offsetof(tp_split, vocab_rows), vocabs[iv], 1, "vocab rows", ctx);
            for (int g = 1; g < n; g++) {
                const tp_range p = s[g - 1].vocab_rows, q = s[g].vocab_rows;
                const int64_t a = p.hi - p.lo, b = q.hi - q.lo;
                cr_assert(a == b || a == b + 1, "%s: GPU %d has %lld rows, GPU %d %lld", ctx, g - 1, (long long)a, g,
                          (long long)b);
            }
        }
}

// ---- bytes
Test(tp, bytes_add_up_to_the_unsplit_layer) {
    static const uint32_t wtypes[] = {DJ_F32, DJ_F16, DJ_BF16, DJ_Q8, DJ_Q4};
    for (int iw = 0; iw < 5; iw++) {
        dj_config c = shape(32, 8, 128, 14336, wtypes[iw]);
        c.dim = 4096;
        dj_layer_layout L;
        dj_head_layout H;
        dj_err e = {{0}};
        cr_assert_eq(dj_layout(&c, &L, &H, &e), 0, "%s", e.msg);
        for (int n = 1; n <= TP_MAX_GPUS; n++) {
            tp_split s[TP_MAX_GPUS];
            cr_assert_eq(tp_plan(&c, n, s, &e), 0, "%s", e.msg);
            uint64_t kv = 0, w = 0;
            for (int g = 0; g < n; g++) kv += tp_kv_pos_bytes(&c, &s[g], DJ_KV_Q8), w += tp_layer_bytes(&c, &s[g]);
            cr_assert_eq(kv, engine_kv_pos_bytes(&c, DJ_KV_Q8), "%s, %d GPUs: KV bytes a position",
                         dj_dtype_name(c.wtype), n);
            if (n == 1) cr_assert_eq(w, L.size, "%s: one GPU's layer is not dj_layout's", dj_dtype_name(c.wtype));
            // each GPU holds both norms, rounds its slab up and pads its cut rows: at most that much more altogether
            uint64_t per_gpu = 8ull * c.dim + 9 * DJ_TENSOR_ALIGN + DJ_SECTION_ALIGN + 2ull * c.dim * DJ_ROW_ALIGN;
            cr_assert(w >= L.size - DJ_SECTION_ALIGN && w <= L.size + n * per_gpu,
                      "%s, %d GPUs: %llu bytes a layer altogether against %llu", dj_dtype_name(c.wtype), n,
                      (unsigned long long)w, (unsigned long long)L.size);
            // the split is even: no GPU holds more than the attention of its most kv heads and the FFN of its most
            // units, beside the norms, the alignment and the cut rows' padding
            uint64_t q = (uint64_t)c.n_heads * c.head_dim, kvr = (uint64_t)c.n_kv_heads * c.head_dim, d = c.dim;
            uint64_t attn = 2 * dj_matrix_bytes(c.wtype, q, d) + 2 * dj_matrix_bytes(c.wtype, kvr, d);
            uint64_t ffn = 3 * dj_matrix_bytes(c.wtype, c.hidden_dim, d);
            uint64_t units = c.hidden_dim / tp_col_granularity(c.wtype);  // 14336: a multiple of every granularity
            uint64_t bound = attn / c.n_kv_heads * ((c.n_kv_heads + n - 1) / n) + ffn / units * ((units + n - 1) / n) +
                             per_gpu;
            for (int g = 0; g < n; g++)
                cr_assert_leq(tp_layer_bytes(&c, &s[g]), bound, "%s, %d GPUs: GPU %d holds %llu of %llu bytes a layer",
                              dj_dtype_name(c.wtype), n, g, (unsigned long long)tp_layer_bytes(&c, &s[g]),
                              (unsigned long long)L.size);
        }
    }
}

// ---- cutting columns
Test(tp, cut_columns_widen_to_the_full_rows_slice) {
    tc_rng_fresh("tp.cut_columns_widen_to_the_full_rows_slice");
    static const uint32_t wtypes[] = {DJ_F32, DJ_F16, DJ_BF16, DJ_Q8, DJ_Q4};
    static const int64_t colss[] = {64, 172, 96, 300};
    cpu_f16_init();
    for (int iw = 0; iw < 5; iw++)
        for (int ic = 0; ic < 4; ic++) {
            uint32_t wt = wtypes[iw];
            int64_t rows = 5, cols = colss[ic], gran = tp_col_granularity(wt);
            uint64_t rb = dj_row_bytes(wt, cols);
            uint8_t *w = malloc(rows * rb), *cut = malloc(rows * rb);
            float *x = malloc(cols * 4), *full = malloc(cols * 4), *part = malloc(cols * 4);
            for (int64_t r = 0; r < rows; r++) {
                tc_fill(x, cols, -1, 1);
                if (dj_is_quant(wt)) cr_assert_eq(quant_row(wt, x, cols, w + r * rb, NULL, NULL), 0);
                else tc_store(w + r * rb, x, cols, wt);
            }
            for (int64_t c0 = 0; c0 < cols; c0 += gran)
                for (int64_t c1 = c0 + gran; c1 < cols + gran; c1 += gran) {
                    int64_t hi = c1 < cols ? c1 : cols, n = hi - c0;
                    memset(cut, 0xA5, rows * rb);
                    tp_cut_cols(cut, w, wt, rows, cols, c0, hi);
                    for (int64_t r = 0; r < rows; r++) {
                        const float *f = cpu_widen_row(full, w, wt, r, cols), *p = cpu_widen_row(part, cut, wt, r, n);
                        cr_assert(memcmp(f + c0, p, n * 4) == 0, "%s: row %lld, columns [%lld, %lld) widen otherwise",
                                  dj_dtype_name(wt), (long long)r, (long long)c0, (long long)hi);
                        const uint8_t *row = cut + r * dj_row_bytes(wt, n);  // the row's padding zeroed
                        if (dj_is_quant(wt))
                            for (uint64_t b = dj_scales_offset(wt, n) + 2 * ((n + DJ_QGROUP - 1) / DJ_QGROUP);
                                 b < dj_row_bytes(wt, n); b++)
                                cr_assert_eq(row[b], 0, "%s: padding byte %llu of a cut row", dj_dtype_name(wt),
                                             (unsigned long long)b);
                    }
                }
            free(w), free(cut), free(x), free(full), free(part);
        }
}

// ---- the split forward pass on the CPU
// One GPU's weights of one layer, from its model (tp_shard_model): its rows of wq, wk, wv, w_gate, w_up, its columns
// of wo and w_down.
typedef struct {
    const uint8_t *wq, *wk, *wv, *gate, *up, *wo, *down;
} gpu_layer;

// logits (T, vocab) of tokens at positions 0..T-1, every layer split over n GPUs by s, each GPU's weights those of
// its model (tp_shard_model): each GPU's q, k, v rows, RoPE, attention over its heads and its own KV cache, its
// partial wo; its gate and up rows, swiglu, its partial w_down; the partials added in GPU order (the all-reduce),
// then the residual; the head by each GPU's vocab rows, placed at their columns (the gather on GPU 0).
static void tp_forward(const dj_model *m, const tp_split *s, int n, const int32_t *tokens, int64_t T, float *logits) {
    const dj_config *c = &m->info.config;
    uint32_t wt = c->wtype, nl = c->n_layers;
    int64_t dim = c->dim, hd = c->head_dim, S = T;
    gpu_layer *gl = calloc((size_t)n * nl, sizeof *gl);
    float *kc[TP_MAX_GPUS], *vc[TP_MAX_GPUS];
    dj_model sm[TP_MAX_GPUS];
    for (int g = 0; g < n; g++) {
        dj_err e = {{0}};
        cr_assert_eq(tp_shard_model(m, &s[g], 0, &sm[g], &e), 0, "%s", e.msg);
        const dj_config *gc = &sm[g].info.config;
        cr_assert(gc->dim == c->dim && gc->head_dim == c->head_dim && gc->n_heads == s[g].heads.hi - s[g].heads.lo &&
                      gc->n_kv_heads == s[g].kv_heads.hi - s[g].kv_heads.lo &&
                      gc->hidden_dim == s[g].ffn_rows.hi - s[g].ffn_rows.lo,
                  "GPU %d's config is not its part", g);
        int64_t nkv = s[g].kv_heads.hi - s[g].kv_heads.lo;
        kc[g] = calloc((size_t)(nl * nkv * S * hd), 4), vc[g] = calloc((size_t)(nl * nkv * S * hd), 4);
        const dj_layer_layout *G = &sm[g].info.layer;
        for (uint32_t l = 0; l < nl; l++) {
            const uint8_t *slab = dj_layer_ptr(&sm[g], l);
            gl[g * nl + l] = (gpu_layer){slab + G->wq, slab + G->wk, slab + G->wv, slab + G->w_gate, slab + G->w_up,
                                         slab + G->wo, slab + G->w_down};
        }
    }
    const dj_layer_layout *L = &m->info.layer;
    size_t qb = (size_t)c->n_heads * hd * 4, kb = (size_t)c->n_kv_heads * hd * 4;
    float *inv_freq = malloc(hd / 2 * 4), *x = malloc(dim * 4), *xb = malloc(dim * 4), *acc = malloc(dim * 4),
          *part = malloc(dim * 4), *q = malloc(qb), *k = malloc(kb), *v = malloc(kb), *att = malloc(qb),
          *h = malloc((size_t)c->hidden_dim * 4), *h2 = malloc((size_t)c->hidden_dim * 4),
          *slice = malloc((size_t)c->vocab_size * 4);
    cpu_f16_init();
    cpu_rope_freqs(c, inv_freq);
    for (int64_t t = 0; t < T; t++) {
        const float *row = cpu_widen_row(x, dj_embed_ptr(m), c->embed_type, tokens[t], dim);
        if (row != x) memcpy(x, row, dim * 4);
        for (uint32_t l = 0; l < nl; l++) {
            const uint8_t *slab = dj_layer_ptr(m, l);
            // attention: every GPU its heads, then the all-reduce of the partial wo outputs
            cpu_rmsnorm(xb, x, (const float *)(slab + L->attn_norm), dim, c->norm_eps);
            memset(acc, 0, dim * 4);
            for (int g = 0; g < n; g++) {
                gpu_layer *w = &gl[g * nl + l];
                int64_t nh = s[g].heads.hi - s[g].heads.lo, nkv = s[g].kv_heads.hi - s[g].kv_heads.lo;
                cr_assert_eq(cpu_matmul(q, xb, w->wq, wt, 1, dim, nh * hd), 0);
                cr_assert_eq(cpu_matmul(k, xb, w->wk, wt, 1, dim, nkv * hd), 0);
                cr_assert_eq(cpu_matmul(v, xb, w->wv, wt, 1, dim, nkv * hd), 0);
                cpu_rope(q, nh, hd, t, inv_freq);
                cpu_rope(k, nkv, hd, t, inv_freq);
                float *kl = kc[g] + l * nkv * S * hd, *vl = vc[g] + l * nkv * S * hd;  // (nkv, S, hd)
                for (int64_t j = 0; j < nkv; j++) {
                    memcpy(kl + (j * S + t) * hd, k + j * hd, hd * 4);
                    memcpy(vl + (j * S + t) * hd, v + j * hd, hd * 4);
                }
                cr_assert_eq(cpu_attention(att, q, kl, vl, nh, nkv, hd, t, S), 0);
                cr_assert_eq(cpu_matmul(part, att, w->wo, wt, 1, nh * hd, dim), 0);
                for (int64_t i = 0; i < dim; i++) acc[i] += part[i];
            }
            for (int64_t i = 0; i < dim; i++) x[i] += acc[i];
            // feed-forward: every GPU its hidden rows, then the all-reduce of the partial w_down outputs
            cpu_rmsnorm(xb, x, (const float *)(slab + L->ffn_norm), dim, c->norm_eps);
            memset(acc, 0, dim * 4);
            for (int g = 0; g < n; g++) {
                gpu_layer *w = &gl[g * nl + l];
                int64_t nf = s[g].ffn_rows.hi - s[g].ffn_rows.lo;
                cr_assert_eq(cpu_matmul(h, xb, w->gate, wt, 1, dim, nf), 0);
                cr_assert_eq(cpu_matmul(h2, xb, w->up, wt, 1, dim, nf), 0);
                cpu_swiglu(h, h, h2, nf);
                cr_assert_eq(cpu_matmul(part, h, w->down, wt, 1, nf, dim), 0);
                for (int64_t i = 0; i < dim; i++) acc[i] += part[i];
            }
            for (int64_t i = 0; i < dim; i++) x[i] += acc[i];
        }
        // the head: every GPU holds x whole after the last all-reduce; each computes the logits of its vocab rows
        // (lm_head from its row lo on) and places them at those columns
        cpu_rmsnorm(xb, x, (const float *)(dj_head_ptr(m) + m->info.head.norm), dim, c->norm_eps);
        const uint32_t ht = dj_lm_head_type(m);
        for (int g = 0; g < n; g++) {
            const tp_range vr = s[g].vocab_rows;
            const uint8_t *rows = dj_lm_head_ptr(m) + (uint64_t)vr.lo * dj_row_bytes(ht, (uint64_t)dim);
            cr_assert_eq(cpu_matmul(slice, xb, rows, ht, 1, dim, vr.hi - vr.lo), 0);
            memcpy(logits + t * c->vocab_size + vr.lo, slice, (size_t)(vr.hi - vr.lo) * 4);
        }
    }
    for (int g = 0; g < n; g++) free(kc[g]), free(vc[g]), model_free(&sm[g]);
    free(gl), free(inv_freq), free(x), free(xb), free(acc), free(part), free(q), free(k), free(v), free(att), free(h),
        free(h2), free(slice);
}

#define TP_TOL 1e-5  // relative L2 of the logits: the all-reduce adds partial sums in another order (seen: ~1e-7)

// The split pass against cpu_forward on T tokens at positions 0..T-1, for every N in want[] (0-terminated); every
// other N up to TP_MAX_GPUS either matches too or is refused by tp_plan.
static void split_matches_engine(const dj_model *m, const char *name, const int *want) {
    const dj_config *c = &m->info.config;
    int64_t T = 6, V = c->vocab_size;
    int32_t tokens[6];
    for (int i = 0; i < T; i++) tokens[i] = (int32_t)tc_below(c->vocab_size);
    dj_err e = {{0}};
    dj_cpu_state *st = cpu_state_new(m, T, &e);
    cr_assert(st, "%s", e.msg);
    float *ref = malloc(T * V * 4), *got = malloc(T * V * 4);
    cr_assert_eq(cpu_forward(st, tokens, T, 0, ref, &e), 0, "%s", e.msg);
    cpu_state_free(st);
    int ran = 0;
    for (int n = 1; n <= TP_MAX_GPUS; n++) {
        tp_split s[TP_MAX_GPUS];
        int wanted = 0;
        for (const int *w = want; *w; w++) wanted |= *w == n;
        if (tp_plan(c, n, s, &e)) {
            cr_assert(!wanted, "%s: --gpus %d refused: %s", name, n, e.msg);
            continue;
        }
        for (int64_t i = 0; i < T * V; i++) got[i] = NAN;
        tp_forward(m, s, n, tokens, T, got);
        double err = tc_rel_l2(got, ref, T * V);
        cr_log_info("%s %s, %d GPUs: logits relative L2 %.2e", name, dj_dtype_name(c->wtype), n, err);
        cr_assert(err <= TP_TOL, "%s %s, %d GPUs: logits relative L2 %.3e > %.0e (seed %llu)", name,
                  dj_dtype_name(c->wtype), n, err, TP_TOL, (unsigned long long)tc_seed_used());
        ran += wanted;
    }
    int n_want = 0;
    for (const int *w = want; *w; w++) n_want++;
    cr_assert_eq(ran, n_want, "%s: %d of the %d GPU counts wanted ran", name, ran, n_want);
    free(ref), free(got);
}

// stories260K: 8 heads of 8 dims, 4 kv heads, hidden 172; q8 and q4 cut wo at 32 columns, so 4 GPUs are refused.
Test(tp, split_pass_matches_engine_on_stories) {
    tc_rng_fresh("tp.split_pass_matches_engine_on_stories");
    static const struct {
        uint32_t dtype;
        int want[4];
    } cases[] = {{DJ_F32, {1, 2, 4, 0}}, {DJ_F16, {1, 2, 4, 0}}, {DJ_Q8, {1, 2, 0}}, {DJ_Q4, {1, 2, 0}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dj_model m;
        tc_load_stories(&m, (int)cases[i].dtype, 0);
        cr_assert_eq(m.info.config.n_kv_heads, 4, "stories260K changed: %u kv heads", m.info.config.n_kv_heads);
        split_matches_engine(&m, "stories260K", cases[i].want);
        model_free(&m);
    }
}

// A committed fixture (tests/fixtures/NAME, HF format) converted to dtype (-1: as stored) for the CPU engine, with
// stories260K's tokenizer (the fixtures have none).
static void load_fixture(dj_model *m, const char *name, int dtype) {
    char tok[4096], src[4300], out[4300];
    tc_data_path(tok, sizeof tok, "models/stories260K");
    snprintf(src, sizeof src, "%s/fixtures/%s", tc_tests_dir(), name);
    cr_assert_eq(access(src, R_OK), 0, "fixture %s missing (run from the repository root, or set DJINN_TESTS)", src);
    char *dir = tc_tmpdir("tp");
    snprintf(out, sizeof out, "%s/m.bin", dir);
    convert_opts co = {.hf_dir = src, .out_path = out, .tok_dir = tok, .dtype = dtype, .quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(convert_run(&co, &e), 0, "%s", e.msg);
    dj_load_opts lo = {.quiet = 1};
    cr_assert_eq(model_load(out, &lo, m, &e), 0, "%s", e.msg);
    tc_rm_rf(dir);
    free(dir);
}

// The fixtures: llama3_gqa_bf16 (4 heads of 48, 2 kv heads, hidden 192, llama3 RoPE), mha_untied_f16 (4 heads of 32,
// 4 kv heads, hidden 128, untied head), in their own dtype, f32 and q4 (every cut there on whole groups).
Test(tp, split_pass_matches_engine_on_fixtures) {
    tc_rng_fresh("tp.split_pass_matches_engine_on_fixtures");
    static const struct {
        const char *name;
        int dtype;
        int want[4];
    } cases[] = {{"llama3_gqa_bf16", -1, {1, 2, 0}}, {"llama3_gqa_bf16", DJ_F32, {1, 2, 0}},
                 {"llama3_gqa_bf16", DJ_Q4, {1, 2, 0}}, {"mha_untied_f16", -1, {1, 2, 4, 0}},
                 {"mha_untied_f16", DJ_F32, {1, 2, 4, 0}}, {"mha_untied_f16", DJ_Q8, {1, 2, 4, 0}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dj_model m;
        load_fixture(&m, cases[i].name, cases[i].dtype);
        split_matches_engine(&m, cases[i].name, cases[i].want);
        model_free(&m);
    }
}

// --gpus: a count means the first N devices, a list names them; anything else, one line quoting what was given.
Test(tp, parse_gpus) {
    int n = 0, ids[TP_MAX_GPUS];
    dj_err e = {{0}};
    cr_assert_eq(tp_parse_gpus("2", &n, ids, &e), 0, "%s", e.msg);
    cr_assert(n == 2 && ids[0] == 0 && ids[1] == 1, "--gpus 2: %d GPUs, %d, %d", n, ids[0], ids[1]);
    cr_assert_eq(tp_parse_gpus("1", &n, ids, &e), 0, "%s", e.msg);
    cr_assert(n == 1 && ids[0] == 0);
    cr_assert_eq(tp_parse_gpus("3,1", &n, ids, &e), 0, "%s", e.msg);
    cr_assert(n == 2 && ids[0] == 3 && ids[1] == 1, "--gpus 3,1: %d GPUs, %d, %d", n, ids[0], ids[1]);
    cr_assert_eq(tp_parse_gpus("0,0", &n, ids, &e), 0, "%s", e.msg);  // two parts on one device (tests)
    cr_assert(n == 2 && ids[0] == 0 && ids[1] == 0);
    cr_assert_eq(tp_parse_gpus("8", &n, ids, &e), 0, "%s", e.msg);
    cr_assert(n == 8 && ids[7] == 7);
    static const char *bad[] = {"", "0", "9", "-1", "a", "1,", ",1", "1,,2", "1 ,2", "2x", "0,1,2,3,4,5,6,7,8",
                                "64", "0,64", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(tp_parse_gpus(bad[i], &n, ids, &e), -1, "--gpus '%s' accepted", bad[i]);
        cr_assert(strstr(e.msg, "--gpus") && !strchr(e.msg, '\n'), "--gpus '%s': %s", bad[i], e.msg);
    }
}

// No --gpus: every visible GPU the model splits over and whose pairs have peer access, else the most that do (the
// first refusal said), else one; one visible or none: one, nothing said.
static int all_peers(int a, int b) { return a >= 0 && b >= 0; }
static int no_peers(int a, int b) { return a == b; }
static int third_alone(int a, int b) { return a == b || (a != 2 && b != 2); }  // device 2 reaches no other
Test(tp, default_gpus) {
    int n, ids[TP_MAX_GPUS];
    char why[512];
    dj_config c = shape(16, 8, 64, 1024, DJ_F16);
    tp_default_gpus(&c, 2, all_peers, &n, ids, why, sizeof why);
    cr_assert(n == 2 && ids[0] == 0 && ids[1] == 1 && !why[0], "2 visible: %d GPUs (%s)", n, why);
    tp_default_gpus(&c, 1, all_peers, &n, ids, why, sizeof why);
    cr_assert(n == 1 && ids[0] == 0 && !why[0], "1 visible: %d GPUs (%s)", n, why);
    tp_default_gpus(&c, 0, all_peers, &n, ids, why, sizeof why);
    cr_assert(n == 1 && ids[0] == 0, "none visible: %d GPUs", n);
    tp_default_gpus(&c, TP_MAX_GPUS + 3, all_peers, &n, ids, why, sizeof why);
    cr_assert(n == TP_MAX_GPUS && ids[TP_MAX_GPUS - 1] == TP_MAX_GPUS - 1 && strstr(why, "at most"),
              "%d visible: %d GPUs (%s)", TP_MAX_GPUS + 3, n, why);
    dj_config few = shape(8, 2, 64, 1024, DJ_F16);  // 2 kv heads: 2 of 4 GPUs
    tp_default_gpus(&few, 4, all_peers, &n, ids, why, sizeof why);
    cr_assert(n == 2 && strstr(why, "--gpus 4") && strstr(why, "2 KV heads"), "4 visible, 2 kv heads: %d (%s)", n,
              why);
    dj_config one = shape(8, 1, 64, 1024, DJ_F16);  // 1 kv head: one GPU
    tp_default_gpus(&one, 2, all_peers, &n, ids, why, sizeof why);
    cr_assert(n == 1 && strstr(why, "1 KV heads"), "1 kv head: %d (%s)", n, why);
    tp_default_gpus(&c, 4, third_alone, &n, ids, why, sizeof why);
    cr_assert(n == 2 && strstr(why, "GPUs 0 and 2 have no peer access"), "device 2 without peers: %d (%s)", n, why);
    tp_default_gpus(&c, 2, no_peers, &n, ids, why, sizeof why);
    cr_assert(n == 1 && strstr(why, "GPUs 0 and 1 have no peer access"), "no peer access: %d (%s)", n, why);
}

// Every part at once with the source given back (tp_shard_models, release): the parts are those tp_shard_model makes
// from a whole copy of the model, the source's layers, embeddings and head now read as zeros, its tokenizer and
// fingerprint (session files) unchanged.
Test(tp, shard_models_release_the_source) {
    const uint32_t dtypes[] = {DJ_F32, DJ_Q4};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        dj_model m, whole;
        tc_load_stories(&m, (int)dtypes[d], 0);
        tc_load_stories(&whole, (int)dtypes[d], 0);
        const dj_model_info *in = &m.info;
        const uint32_t fp = model_fingerprint(&m);
        tp_split s[2];
        dj_err e = {{0}};
        cr_assert_eq(tp_plan(&in->config, 2, s, &e), 0, "%s", e.msg);
        dj_model parts[2], ref;
        cr_assert_eq(tp_shard_models(&m, &m, s, 2, 0, parts, &e), 0, "%s", e.msg);
        for (int g = 0; g < 2; g++) {
            cr_assert_eq(tp_shard_model(&whole, &s[g], 0, &ref, &e), 0, "%s", e.msg);
            cr_assert(ref.data_size == parts[g].data_size &&
                          !memcmp(ref.data, parts[g].data, ref.data_size),
                      "%s: GPU %d's part differs from the one made from the whole model", dj_dtype_name(dtypes[d]), g);
            model_free(&ref);
        }
        const uint64_t spans[][2] = {{in->layer_off[0], in->layer.size},
                                     {in->layer_off[in->config.n_layers - 1], in->layer.size},
                                     {in->embed_off, in->embed_size},
                                     {in->head_off, in->head_size}};
        for (size_t k = 0; k < sizeof spans / sizeof spans[0]; k++) {
            int nonzero = 0;
            for (uint64_t i = 0; i < spans[k][1]; i++) nonzero |= m.data[spans[k][0] + i];
            cr_assert(!nonzero, "%s: section %zu of the source still holds its weights", dj_dtype_name(dtypes[d]), k);
        }
        cr_assert(!memcmp(m.data + in->tok_off, whole.data + in->tok_off, in->tok_size), "the tokenizer went too");
        cr_assert_eq(model_fingerprint(&m), fp, "the released model's fingerprint changed");
        cr_assert_eq(model_fingerprint(&whole), fp);
        for (int g = 0; g < 2; g++) model_free(&parts[g]);
        model_free(&m), model_free(&whole);
    }
}
