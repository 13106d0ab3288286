// tp.c: the tensor-parallel split plan (tp.h): heads and FFN rows to GPUs, their bytes, cutting columns, and a GPU's
// part of a model.
#include "tp.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

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

    // the head: vocab rows at most one apart, the first GPUs taking the extra ones
    const int64_t V = c->vocab_size;
    lo = 0;
    for (int g = 0; g < n; g++) {
        const int64_t hi = lo + V / n + (g < V % n);
        out[g].vocab_rows = (tp_range){lo, hi};
        lo = hi;
    }
    return 0;
}

// The first pair of GPUs 0..k-1 without peer access, set in e; 0 where every pair has it.
static int tp_peers_missing(int k, int (*peer_ok)(int, int), dj_err *e) {
    for (int a = 0; a < k; a++)
        for (int b = a + 1; b < k; b++)
            if (!peer_ok(a, b))
                return dj_fail(e, "GPUs %d and %d have no peer access (cudaDeviceCanAccessPeer): --gpus 1, or a "
                                  "list of GPUs that have it", a, b);
    return 0;
}

void tp_default_gpus(const dj_config *c, int visible, int (*peer_ok)(int, int), int *n, int ids[TP_MAX_GPUS],
                     char *why, size_t why_size) {
    int k = visible < TP_MAX_GPUS ? visible : TP_MAX_GPUS;
    tp_split sp[TP_MAX_GPUS];
    dj_err first = {{0}}, e = {{0}};
    if (why_size) why[0] = 0;
    for (; k > 1 && (tp_plan(c, k, sp, &e) || tp_peers_missing(k, peer_ok, &e)); k--)
        if (!first.msg[0]) first = e;
    if (k < 1) k = 1;
    for (int i = 0; i < k; i++) ids[i] = i;
    *n = k;
    if (k < visible && why_size && first.msg[0]) snprintf(why, why_size, "%s", first.msg);
    else if (k < visible && why_size) snprintf(why, why_size, "a run takes at most %d GPUs", TP_MAX_GPUS);
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

// ---- --gpus
int tp_parse_gpus(const char *v, int *n, int ids[TP_MAX_GPUS], dj_err *e) {
    const char *bad = "--gpus needs a count of GPUs from 1 to %d or a list of device ids such as 0,1, not '%s'";
    if (!v || !*v) return dj_fail(e, bad, TP_MAX_GPUS, v ? v : "");
    int k = 0;
    for (const char *p = v;;) {
        if (*p < '0' || *p > '9') return dj_fail(e, bad, TP_MAX_GPUS, v);
        long x = 0;
        while (*p >= '0' && *p <= '9' && x < 1000) x = x * 10 + (*p++ - '0');
        if (k == TP_MAX_GPUS) return dj_fail(e, "--gpus '%s': at most %d GPUs", v, TP_MAX_GPUS);
        ids[k++] = (int)x;
        if (!*p) break;
        if (*p++ != ',') return dj_fail(e, bad, TP_MAX_GPUS, v);
    }
    if (k == 1 && !strchr(v, ',')) {  // a count
        int c = ids[0];
        if (c < 1 || c > TP_MAX_GPUS) return dj_fail(e, bad, TP_MAX_GPUS, v);
        for (int i = 0; i < c; i++) ids[i] = i;
        *n = c;
        return 0;
    }
    for (int i = 0; i < k; i++)
        if (ids[i] > 63) return dj_fail(e, "--gpus '%s': device %d: ids go up to 63", v, ids[i]);
    *n = k;
    return 0;
}

// ---- a GPU's model
// Rows [lo, hi) of a (rows, cols) wtype matrix: contiguous, one copy.
static void tp_copy_rows(uint8_t *dst, const uint8_t *w, uint32_t wtype, int64_t cols, tp_range r) {
    uint64_t rb = dj_row_bytes(wtype, (uint64_t)cols);
    memcpy(dst, w + (uint64_t)r.lo * rb, (uint64_t)tp_len(r) * rb);
}

// GPU s's part of m, its tokenizer, embeddings and head copied, its layers still to fill (tp_part_layer).
static int tp_part_begin(const dj_model *m, const tp_split *s, dj_model *out, dj_err *e) {
    memset(out, 0, sizeof *out);
    dj_config sc = m->info.config;
    sc.n_heads = (uint32_t)tp_len(s->heads), sc.n_kv_heads = (uint32_t)tp_len(s->kv_heads);
    sc.hidden_dim = (uint32_t)tp_len(s->ffn_rows);
    if (model_plan(&sc, m->info.tok_size, &out->info, e)) return -1;
    const dj_model_info *fi = &m->info, *si = &out->info;
    void *p = mmap(NULL, si->file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        dj_info_free(&out->info);
        return dj_fail(e, "cannot allocate %.2f GB of host memory for a GPU's part of the model",
                       (double)si->file_size / 1e9);
    }
    madvise(p, si->file_size, MADV_HUGEPAGE);
    uint8_t *d = p;
    out->data = d, out->data_size = si->file_size, out->for_gpu = m->for_gpu;
    memcpy(d + si->tok_off, m->data + fi->tok_off, fi->tok_size);
    memcpy(d + si->embed_off, m->data + fi->embed_off, fi->embed_size);
    memcpy(d + si->head_off, m->data + fi->head_off, fi->head_size);
    return 0;
}

// Layer l of GPU s's part: its rows and columns of m's.
static void tp_part_layer(const dj_model *m, const tp_split *s, dj_model *out, uint32_t l) {
    const dj_config *c = &m->info.config;
    const dj_layer_layout *L = &m->info.layer, *S = &out->info.layer;
    uint32_t wt = c->wtype;
    int64_t dim = c->dim, q_dim = (int64_t)c->n_heads * c->head_dim;
    const uint8_t *f = dj_layer_ptr(m, l);
    uint8_t *g = out->data + out->info.layer_off[l];
    memcpy(g + S->attn_norm, f + L->attn_norm, (size_t)dim * 4);
    memcpy(g + S->ffn_norm, f + L->ffn_norm, (size_t)dim * 4);
    tp_copy_rows(g + S->wq, f + L->wq, wt, dim, s->q_rows);
    tp_copy_rows(g + S->wk, f + L->wk, wt, dim, s->kv_rows);
    tp_copy_rows(g + S->wv, f + L->wv, wt, dim, s->kv_rows);
    tp_cut_cols(g + S->wo, f + L->wo, wt, dim, q_dim, s->q_rows.lo, s->q_rows.hi);
    tp_copy_rows(g + S->w_gate, f + L->w_gate, wt, dim, s->ffn_rows);
    tp_copy_rows(g + S->w_up, f + L->w_up, wt, dim, s->ffn_rows);
    tp_cut_cols(g + S->w_down, f + L->w_down, wt, dim, c->hidden_dim, s->ffn_rows.lo, s->ffn_rows.hi);
}

int tp_shard_models(const dj_model *m, dj_model *release, const tp_split *s, int n, int pin, dj_model out[],
                    dj_err *e) {
    int made = 0;
    for (; made < n; made++)
        if (tp_part_begin(m, &s[made], &out[made], e)) goto fail;
    for (uint32_t l = 0; l < m->info.config.n_layers; l++) {
        for (int g = 0; g < n; g++) tp_part_layer(m, &s[g], &out[g], l);
        if (release) model_release(release, m->info.layer_off[l], m->info.layer.size);
    }
    if (release) {  // the embeddings and the head are the parts' own now
        model_release(release, m->info.embed_off, dj_align_up(m->info.embed_size, DJ_SECTION_ALIGN));
        model_release(release, m->info.head_off, m->info.head_size);
    }
    for (int g = 0; g < n; g++)
        if (pin && model_pin(&out[g], e)) goto fail;
    return 0;
fail:
    for (int g = 0; g < made; g++) model_free(&out[g]);
    return -1;
}

int tp_shard_model(const dj_model *m, const tp_split *s, int pin, dj_model *out, dj_err *e) {
    return tp_shard_models(m, NULL, s, 1, pin, out, e);
}
