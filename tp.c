// tp.c: the tensor-parallel split plan (tp.h): heads and FFN rows to GPUs, their bytes, and cutting columns.
#include "tp.h"

#include <assert.h>
#include <string.h>

#include "kvtype.h"

int64_t tp_col_granularity(uint32_t wtype) {
    return dj_is_quant(wtype) ? DJ_QGROUP : 16 / (int64_t)dj_dtype_size(wtype);
}

// ---- the plan
// Which GPUs take one more kv head: bit (n - 1 - g) of mask set for GPU g, so that counting masks down prefers the
// first GPUs. 1 when every cut of wo's columns (q dims before a GPU's first head) falls on the granularity.
static int tp_kv_cuts_fit(const dj_config *c, int n, unsigned mask, int64_t gran, tp_split out[]) {
    int64_t base = c->n_kv_heads / n, group = c->n_heads / c->n_kv_heads, hd = c->head_dim, lo = 0;
    for (int g = 0; g < n; g++) {
        int64_t hi = lo + base + ((mask >> (n - 1 - g)) & 1);
        if (g > 0 && (lo * group * hd) % gran) return 0;
        out[g].kv_heads = (tp_range){lo, hi};
        out[g].heads = (tp_range){lo * group, hi * group};
        out[g].kv_rows = (tp_range){lo * hd, hi * hd};
        out[g].q_rows = (tp_range){lo * group * hd, hi * group * hd};
        lo = hi;
    }
    return 1;
}

int tp_plan(const dj_config *c, int n_gpus, tp_split out[], dj_err *e) {
    int n = n_gpus;
    if (n < 1 || n > TP_MAX_GPUS) return dj_fail(e, "--gpus %d: between 1 and %d GPUs", n, TP_MAX_GPUS);
    if (c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads || c->head_dim == 0 || c->hidden_dim == 0)
        return dj_fail(e, "tensor parallel: a config of %u heads, %u kv heads, head_dim %u, hidden_dim %u is invalid",
                       c->n_heads, c->n_kv_heads, c->head_dim, c->hidden_dim);
    if ((int64_t)c->n_kv_heads < n)
        return dj_fail(e, "--gpus %d: the model has %u KV heads, whole heads per GPU: at most %u GPUs", n,
                       c->n_kv_heads, c->n_kv_heads);
    int64_t gran = tp_col_granularity(c->wtype);

    // attention: kv heads at most one apart; among the arrangements of the extra heads, the first whose cuts fit
    int extra = (int)(c->n_kv_heads % (uint32_t)n), found = 0;
    for (int mask = (1 << n) - 1; mask >= 0 && !found; mask--)
        if (__builtin_popcount((unsigned)mask) == extra) found = tp_kv_cuts_fit(c, n, (unsigned)mask, gran, out);
    if (!found)
        return dj_fail(e, "--gpus %d: %u heads of %u dims cannot be cut into whole heads at multiples of %lld columns "
                       "of wo (%s); try another number of GPUs",
                       n, c->n_heads, c->head_dim, (long long)gran, dj_dtype_name(c->wtype));

    // FFN: units of gran rows, at most one apart, the first GPUs taking the extra ones
    int64_t hid = c->hidden_dim, units = (hid + gran - 1) / gran, lo = 0;
    if (units < n)
        return dj_fail(e, "--gpus %d: hidden_dim %lld is %lld units of %lld columns of w_down (%s), fewer than GPUs",
                       n, (long long)hid, (long long)units, (long long)gran, dj_dtype_name(c->wtype));
    for (int g = 0; g < n; g++) {
        int64_t u = units / n + (g < units % n), hi = lo + u * gran;
        out[g].ffn_rows = (tp_range){lo, hi < hid ? hi : hid};
        lo = hi;
    }
    return 0;
}

// ---- what a GPU holds
static int64_t tp_len(tp_range r) { return r.hi - r.lo; }

uint64_t tp_kv_pos_bytes(const dj_config *c, const tp_split *s, int kv_type) {
    return 2ull * c->n_layers * (uint64_t)tp_len(s->kv_heads) * dj_kv_row_bytes(kv_type, c->head_dim);
}

uint64_t tp_layer_bytes(const dj_config *c, const tp_split *s) {
    uint32_t wt = c->wtype;
    uint64_t dim = c->dim, q = (uint64_t)tp_len(s->q_rows), kv = (uint64_t)tp_len(s->kv_rows),
             hid = (uint64_t)tp_len(s->ffn_rows), a = DJ_TENSOR_ALIGN;
    uint64_t bytes[] = {dim * 4,
                        dim * 4,
                        dj_matrix_bytes(wt, q, dim),
                        dj_matrix_bytes(wt, kv, dim),
                        dj_matrix_bytes(wt, kv, dim),
                        dj_matrix_bytes(wt, dim, q),
                        dj_matrix_bytes(wt, hid, dim),
                        dj_matrix_bytes(wt, hid, dim),
                        dj_matrix_bytes(wt, dim, hid)};
    uint64_t off = 0;
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) off = dj_align_up(off + bytes[i], a);
    return dj_align_up(off, DJ_SECTION_ALIGN);
}

// ---- cutting columns
void tp_cut_cols(void *dst, const void *w, uint32_t wtype, int64_t rows, int64_t cols, int64_t c0, int64_t c1) {
    int64_t gran = tp_col_granularity(wtype), n = c1 - c0;
    assert(0 <= c0 && c0 < c1 && c1 <= cols && c0 % gran == 0 && (c1 == cols || c1 % gran == 0));
    uint64_t src_row = dj_row_bytes(wtype, (uint64_t)cols), dst_row = dj_row_bytes(wtype, (uint64_t)n);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *s = (const uint8_t *)w + (uint64_t)r * src_row;
        uint8_t *d = (uint8_t *)dst + (uint64_t)r * dst_row;
        if (!dj_is_quant(wtype)) {
            size_t es = dj_dtype_size(wtype);
            memcpy(d, s + (size_t)c0 * es, (size_t)n * es);
            continue;
        }
        // whole groups: their values, then their parameters after the cut row's own values; padding zeroed
        int64_t g0 = c0 / DJ_QGROUP, ng = (n + DJ_QGROUP - 1) / DJ_QGROUP;
        size_t gb = wtype == DJ_Q8 ? DJ_QGROUP : DJ_QGROUP / 2;
        memset(d, 0, dst_row);
        memcpy(d, s + (size_t)g0 * gb, (size_t)ng * gb);
        memcpy(d + dj_scales_offset(wtype, (uint64_t)n), s + dj_scales_offset(wtype, (uint64_t)cols) + (size_t)g0 * 2,
               (size_t)ng * 2);
    }
}
