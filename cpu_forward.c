// cpu_forward.c: the CPU forward pass (cpu.h): n_slots KV caches, a pass of up to CPU_CHUNK rows through every
// layer on cpu.c's ops, decode steps of several sequences, the rows of a continuous-batching turn, and parking.
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

// ---- the forward pass
#define CPU_CHUNK 32  // rows per pass through the layers: bounds the activation buffers

// The keys' or the values' cache of every slot, in rows (kvtype.h): row r, a kv head's head_dim values at one
// position, is data's elements r * head_dim .. and, for q8, scale[r].
typedef struct {
    void *data;    // (n_slots, n_layers, n_kv_heads, max_seq, head_dim) elements of the state's kv_type
    float *scale;  // q8: (n_slots, n_layers, n_kv_heads, max_seq); else NULL
} cpu_kv_cache;

struct dj_cpu_state {
    const dj_model *m;
    dj_config c;
    int64_t max_seq;
    int32_t n_slots;
    int kv_type;       // the caches' elements (kvtype.h)
    int64_t q_dim, kv_dim;
    size_t slot_rows;  // one slot's rows of K (or V): n_layers * n_kv_heads * max_seq
    float *inv_freq;   // (head_dim/2)
    float *x;          // (CPU_CHUNK, dim) residual stream
    float *xb;         // (CPU_CHUNK, dim) normed input / block output
    float *q;          // (CPU_CHUNK, q_dim)
    float *k, *v;      // (CPU_CHUNK, kv_dim)
    float *att;        // (CPU_CHUNK, q_dim)
    float *hb, *hb2;   // (CPU_CHUNK, hidden_dim)
    cpu_kv_cache kv[2];  // the keys, the values
    dj_probe *probe;   // dumps and steering after layers (probe.h), or NULL
    const volatile sig_atomic_t *cancel;  // Ctrl-C (cpu_set_cancel), or NULL
};

int64_t cpu_vocab(const dj_cpu_state *s) { return s->c.vocab_size; }

void cpu_state_free(dj_cpu_state *s) {
    if (!s) return;
    free(s->inv_freq);
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->hb);
    free(s->hb2);
    for (int i = 0; i < 2; i++) free(s->kv[i].data), free(s->kv[i].scale);
    free(s);
}

// n zeroed elements of `size` bytes.
static void *cpu_alloc(uint64_t n, size_t size, const char *what, dj_err *e) {
    uint64_t bytes;
    if (dj_mul_u64(n, size, &bytes) || bytes > SIZE_MAX) {
        dj_fail(e, "cpu: %s of %" PRIu64 " elements is too large", what, n);
        return NULL;
    }
    void *p = calloc(1, bytes ? (size_t)bytes : 1);
    if (!p) dj_fail(e, "cpu: cannot allocate %.2f GB for the %s", (double)bytes / 1e9, what);
    return p;
}
static float *cpu_alloc_floats(uint64_t n, const char *what, dj_err *e) { return cpu_alloc(n, sizeof(float), what, e); }

dj_cpu_state *cpu_state_new(const dj_model *m, int64_t max_seq, dj_err *e) {
    return cpu_state_new_slots(m, max_seq, 1, DJ_KV_F32, e);
}

dj_cpu_state *cpu_state_new_slots(const dj_model *m, int64_t max_seq, int32_t n_slots, int kv_type, dj_err *e) {
    const dj_config *c = &m->info.config;
    if (kv_type < 0 || kv_type >= DJ_KV_TYPES) {
        dj_fail(e, "cpu: KV type %d unknown", kv_type);
        return NULL;
    }
    if (max_seq <= 0) {
        dj_fail(e, "cpu: context size must be positive (got %" PRId64 ")", max_seq);
        return NULL;
    }
    if (n_slots <= 0) {
        dj_fail(e, "cpu: the number of KV slots must be positive (got %d)", n_slots);
        return NULL;
    }
    dj_cpu_state *s = calloc(1, sizeof *s);
    if (!s) {
        dj_fail(e, "cpu: out of memory");
        return NULL;
    }
    s->m = m;
    s->c = *c;
    s->max_seq = max_seq;
    s->n_slots = n_slots;
    s->kv_type = kv_type;
    s->q_dim = (int64_t)c->n_heads * c->head_dim;
    s->kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    uint64_t slot, rows, elems;
    if (dj_mul_u64((uint64_t)c->n_layers * c->n_kv_heads, (uint64_t)max_seq, &slot) || slot > SIZE_MAX ||
        dj_mul_u64(slot, (uint64_t)n_slots, &rows) || dj_mul_u64(rows, c->head_dim, &elems)) {
        dj_fail(e, "cpu: KV cache size overflows");
        cpu_state_free(s);
        return NULL;
    }
    s->slot_rows = (size_t)slot;
    for (int i = 0; i < 2; i++)
        if (!(s->kv[i].data = cpu_alloc(elems, dj_kv_elem_bytes(kv_type), "KV cache", e)) ||
            (kv_type == DJ_KV_Q8 && !(s->kv[i].scale = cpu_alloc_floats(rows, "KV cache's scales", e)))) {
            cpu_state_free(s);
            return NULL;
        }
    if (!(s->inv_freq = cpu_alloc_floats(c->head_dim / 2 + 1, "rope table", e)) ||
        !(s->x = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->dim, "activations", e)) ||
        !(s->xb = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->dim, "activations", e)) ||
        !(s->q = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->q_dim, "activations", e)) ||
        !(s->k = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->kv_dim, "activations", e)) ||
        !(s->v = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->kv_dim, "activations", e)) ||
        !(s->att = cpu_alloc_floats((uint64_t)CPU_CHUNK * s->q_dim, "activations", e)) ||
        !(s->hb = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->hidden_dim, "activations", e)) ||
        !(s->hb2 = cpu_alloc_floats((uint64_t)CPU_CHUNK * c->hidden_dim, "activations", e))) {
        cpu_state_free(s);
        return NULL;
    }
    cpu_rope_freqs(c, s->inv_freq);
    return s;
}

// A pass's rows: row t is a token at position pos[t] of slot slot[t].
typedef struct {
    int32_t slot[CPU_CHUNK];
    int64_t pos[CPU_CHUNK];
} cpu_rows;

// The row of (layer, kv head h, position p) of a slot's K or V cache.
static size_t cpu_kv_row(const dj_cpu_state *s, int32_t slot, uint32_t layer, int64_t h, int64_t p) {
    return (size_t)slot * s->slot_rows +
           ((size_t)layer * (size_t)s->c.n_kv_heads + (size_t)h) * (size_t)s->max_seq + (size_t)p;
}

// Row r of cache kc = x (head_dim), in the state's KV type: f16 rounded to nearest even, q8 by dj_kv_q8_row.
static void cpu_kv_put(const dj_cpu_state *s, const cpu_kv_cache *kc, size_t r, const float *x) {
    const int64_t hd = s->c.head_dim;
    switch (s->kv_type) {
    case DJ_KV_F32: memcpy((float *)kc->data + r * hd, x, (size_t)hd * sizeof(float)); break;
    case DJ_KV_F16:
        for (int64_t d = 0; d < hd; d++) ((uint16_t *)kc->data)[r * hd + d] = dj_f32_to_f16(x[d]);
        break;
    case DJ_KV_Q8: dj_kv_q8_row(x, hd, (int8_t *)kc->data + r * hd, &kc->scale[r]); break;
    }
}

// Rows r .. r+n-1 of cache kc as floats (n, head_dim): f32's own rows, else widened into dst (f16 exactly; q8 each
// value k * its row's scale, in f32).
static const float *cpu_kv_get(const dj_cpu_state *s, const cpu_kv_cache *kc, size_t r, int64_t n, float *dst) {
    const int64_t hd = s->c.head_dim;
    if (s->kv_type == DJ_KV_F32) return (const float *)kc->data + r * hd;
    if (s->kv_type == DJ_KV_F16) return cpu_widen_row(dst, (const uint16_t *)kc->data + r * hd, DJ_F16, 0, n * hd);
    const int8_t *q = (const int8_t *)kc->data + r * hd;
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < hd; d++) dst[i * hd + d] = (float)q[i * hd + d] * kc->scale[r + (size_t)i];
    return dst;
}

typedef struct {
    dj_cpu_state *s;
    const cpu_rows *r;
    uint32_t layer;
    int64_t max_pos;  // the largest pos of the rows
    _Atomic int oom;  // a task could not allocate its scores: its rows are not computed
} cpu_attn_job;

// Parallel over (row, head) pairs; each task has its own scratch: scores, and (f16, q8) its kv head's keys and
// values widened, which the query heads of a group, adjacent, share.
static void cpu_attn_task(void *ctx, int64_t begin, int64_t end) {
    cpu_attn_job *j = ctx;
    const dj_cpu_state *s = j->s;
    int64_t nh = s->c.n_heads, hd = s->c.head_dim, group = nh / s->c.n_kv_heads, n = j->max_pos + 1;
    size_t widened = s->kv_type == DJ_KV_F32 ? 0 : 2 * (size_t)n * (size_t)hd;
    float *scores = malloc(((size_t)n + widened) * sizeof(float));
    if (!scores) {
        atomic_store(&j->oom, 1);
        return;
    }
    float *kw = widened ? scores + n : NULL, *vw = widened ? kw + (size_t)n * hd : NULL;
    const float *k = NULL, *v = NULL;
    size_t have = SIZE_MAX;  // the first row of the keys in k and v, read for positions 0..have_pos
    int64_t have_pos = -1;
    for (int64_t i = begin; i < end; i++) {
        int64_t t = i / nh, h = i % nh, pos = j->r->pos[t];
        size_t r0 = cpu_kv_row(s, j->r->slot[t], j->layer, h / group, 0);
        if (r0 != have || pos != have_pos) {
            k = cpu_kv_get(s, &s->kv[0], r0, pos + 1, kw), v = cpu_kv_get(s, &s->kv[1], r0, pos + 1, vw);
            have = r0, have_pos = pos;
        }
        cpu_attention_head(s->att + t * s->q_dim + h * hd, s->q + t * s->q_dim + h * hd, k, v, hd, pos, scores);
    }
    free(scores);
}

// The embedding row of `token`, widened: out (dim).
static void cpu_embed(const dj_model *m, int32_t token, float *out) {
    const dj_config *c = &m->info.config;
    const float *row = cpu_widen_row(out, dj_embed_ptr(m), c->embed_type, token, c->dim);
    if (row != out) memcpy(out, row, (size_t)c->dim * sizeof(float));  // f32: widen_row returned the table's row
}

// Runs T <= CPU_CHUNK rows through every layer; logits (T, vocab) if not NULL. Every row's keys and values are
// written before any row attends, so rows of one slot at consecutive positions see each other causally; rows of
// different slots never meet.
static int cpu_oom(dj_err *e) { return dj_fail(e, "cpu: out of memory for a pass's scratch rows"); }

static int cpu_forward_rows(dj_cpu_state *s, const int32_t *tokens, int64_t T, const cpu_rows *r, float *logits,
                            dj_err *e) {
    const dj_model *m = s->m;
    const dj_config *c = &s->c;
    const dj_layer_layout *L = &m->info.layer;
    int64_t dim = c->dim, hd = c->head_dim, hidden = c->hidden_dim, qd = s->q_dim, kvd = s->kv_dim, max_pos = 0;
    uint32_t wt = c->wtype;
    cpu_f16_init();
    for (int64_t t = 0; t < T; t++) {
        cpu_embed(m, tokens[t], s->x + t * dim);
        if (r->pos[t] > max_pos) max_pos = r->pos[t];
    }

    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (s->cancel && *s->cancel) return dj_fail(e, "interrupted");  // a layer is the longest wait
        const uint8_t *slab = dj_layer_ptr(m, l);
        // attention block
        for (int64_t t = 0; t < T; t++)
            cpu_rmsnorm(s->xb + t * dim, s->x + t * dim, (const float *)(slab + L->attn_norm), dim, c->norm_eps);
        if (cpu_matmul(s->q, s->xb, slab + L->wq, wt, T, dim, qd) ||
            cpu_matmul(s->k, s->xb, slab + L->wk, wt, T, dim, kvd) ||
            cpu_matmul(s->v, s->xb, slab + L->wv, wt, T, dim, kvd))
            return cpu_oom(e);
        for (int64_t t = 0; t < T; t++) {
            cpu_rope(s->q + t * qd, c->n_heads, hd, r->pos[t], s->inv_freq);
            cpu_rope(s->k + t * kvd, c->n_kv_heads, hd, r->pos[t], s->inv_freq);
            // k, v stored (head, pos, head_dim): each head's keys are contiguous for the attention loop
            for (int64_t h = 0; h < c->n_kv_heads; h++) {
                size_t row = cpu_kv_row(s, r->slot[t], l, h, r->pos[t]);
                cpu_kv_put(s, &s->kv[0], row, s->k + t * kvd + h * hd);
                cpu_kv_put(s, &s->kv[1], row, s->v + t * kvd + h * hd);
            }
        }
        cpu_attn_job aj = {s, r, l, max_pos, 0};
        cpu_parallel_for(T * c->n_heads, (double)T * (double)qd * (double)(max_pos + 1) * 2.0, cpu_attn_task, &aj);
        if (atomic_load(&aj.oom)) return cpu_oom(e);
        if (cpu_matmul(s->xb, s->att, slab + L->wo, wt, T, qd, dim)) return cpu_oom(e);
        for (int64_t i = 0; i < T * dim; i++) s->x[i] += s->xb[i];

        // feed-forward block
        for (int64_t t = 0; t < T; t++)
            cpu_rmsnorm(s->xb + t * dim, s->x + t * dim, (const float *)(slab + L->ffn_norm), dim, c->norm_eps);
        if (cpu_matmul(s->hb, s->xb, slab + L->w_gate, wt, T, dim, hidden) ||
            cpu_matmul(s->hb2, s->xb, slab + L->w_up, wt, T, dim, hidden))
            return cpu_oom(e);
        cpu_swiglu(s->hb, s->hb, s->hb2, T * hidden);
        if (cpu_matmul(s->xb, s->hb, slab + L->w_down, wt, T, hidden, dim)) return cpu_oom(e);
        for (int64_t i = 0; i < T * dim; i++) s->x[i] += s->xb[i];
        // probes: a control vector added to the residual stream, the rows dumped
        if (s->probe && probe_rows(s->probe, l, s->x, T, tokens, r->pos, r->slot, e)) return -1;
    }

    if (!logits) return 0;
    const float *norm = (const float *)(dj_head_ptr(m) + m->info.head.norm);
    for (int64_t t = 0; t < T; t++) cpu_rmsnorm(s->xb + t * dim, s->x + t * dim, norm, dim, c->norm_eps);
    return cpu_matmul(logits, s->xb, dj_lm_head_ptr(m), dj_lm_head_type(m), T, dim, c->vocab_size) ? cpu_oom(e) : 0;
}

void cpu_set_probe(dj_cpu_state *s, dj_probe *p) { s->probe = p; }
void cpu_set_cancel(dj_cpu_state *s, const volatile sig_atomic_t *cancel) { s->cancel = cancel; }

static int cpu_check_slot(const dj_cpu_state *s, int32_t slot, dj_err *e) {
    if (slot < 0 || slot >= s->n_slots)
        return dj_fail(e, "cpu: KV slot %d does not exist (%d slots)", slot, s->n_slots);
    return 0;
}

static int cpu_check_tokens(const dj_cpu_state *s, const int32_t *tokens, int64_t T, dj_err *e) {
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= s->c.vocab_size)
            return dj_fail(e, "cpu: token id %d out of range (vocab %u)", tokens[t], s->c.vocab_size);
    return 0;
}

int cpu_forward(dj_cpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, dj_err *e) {
    return cpu_forward_slot(s, 0, tokens, T, pos, logits, e);
}

int cpu_forward_slot(dj_cpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                     dj_err *e) {
    if (cpu_check_slot(s, slot, e)) return -1;
    if (T < 0 || pos < 0 || pos > s->max_seq - T)
        return dj_fail(e, "cpu: positions %" PRId64 "..%" PRId64 " exceed the context of %" PRId64 " tokens", pos,
                       pos + T - 1, s->max_seq);
    if (cpu_check_tokens(s, tokens, T, e)) return -1;
    cpu_rows r;
    for (int64_t t0 = 0; t0 < T; t0 += CPU_CHUNK) {
        int64_t n = T - t0 < CPU_CHUNK ? T - t0 : CPU_CHUNK;
        for (int64_t t = 0; t < n; t++) r.slot[t] = slot, r.pos[t] = pos + t0 + t;
        if (cpu_forward_rows(s, tokens + t0, n, &r, logits ? logits + t0 * (int64_t)s->c.vocab_size : NULL, e))
            return -1;
    }
    return 0;
}

int cpu_step_batch(dj_cpu_state *s, int32_t B, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                   float *logits, dj_err *e) {
    if (B < 0) return dj_fail(e, "cpu: a batch of %d rows", B);
    for (int32_t b = 0; b < B; b++) {
        if (cpu_check_slot(s, slots[b], e)) return -1;
        if (pos[b] < 0 || pos[b] >= s->max_seq)
            return dj_fail(e, "cpu: position %" PRId64 " is outside the context of %" PRId64 " tokens", pos[b],
                           s->max_seq);
        for (int32_t a = 0; a < b; a++)
            if (slots[a] == slots[b]) return dj_fail(e, "cpu: KV slot %d twice in one batch", slots[b]);
    }
    if (cpu_check_tokens(s, tokens, B, e)) return -1;
    cpu_rows r;
    for (int32_t b0 = 0; b0 < B; b0 += CPU_CHUNK) {
        int32_t n = B - b0 < CPU_CHUNK ? B - b0 : CPU_CHUNK;
        for (int32_t t = 0; t < n; t++) r.slot[t] = slots[b0 + t], r.pos[t] = pos[b0 + t];
        if (cpu_forward_rows(s, tokens + b0, n, &r, logits + (size_t)b0 * s->c.vocab_size, e)) return -1;
    }
    return 0;
}

int cpu_forward_last(dj_cpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                     dj_err *e) {
    if (!logits || T <= 1) return cpu_forward_slot(s, slot, tokens, T, pos, logits, e);
    // the head runs for the last position only
    if (cpu_forward_slot(s, slot, tokens, T - 1, pos, NULL, e)) return -1;
    return cpu_forward_slot(s, slot, tokens + T - 1, 1, pos + T - 1, logits, e);
}

// The rows alone in their slot (decode tokens) in one cpu_step_batch, each longer run (a prompt's chunk) by
// cpu_forward_last or, when rows before its last are wanted, cpu_forward_slot; the wanted rows' logits copied out.
int cpu_step_rows(dj_cpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                  int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    const int64_t V = s->c.vocab_size;
    for (int64_t w = 0; w < n_want; w++)
        if (want[w] < 0 || want[w] >= n || (w && want[w] <= want[w - 1]))
            return dj_fail(e, "cpu: the rows wanted are not ascending rows of the %" PRId64, n);
    int32_t *bs = malloc((size_t)n * 4), *bt = malloc((size_t)n * 4);
    int64_t *bp = malloc((size_t)n * 8), *bw = malloc((size_t)n * 8);  // a single row: its index in want, or -1
    float *tmp = NULL;
    int rc = -1;
    int32_t B = 0;
    if (!bs || !bt || !bp || !bw) {
        dj_fail(e, "out of memory");
        goto out;
    }
    for (int64_t r = 0, len, w = 0; r < n; r += len) {
        for (len = 1; r + len < n && slots[r + len] == slots[r]; len++)
            if (pos[r + len] != pos[r + len - 1] + 1) {
                dj_fail(e, "cpu: rows %" PRId64 " and %" PRId64 " of KV slot %d are not consecutive positions",
                        r + len - 1, r + len, slots[r]);
                goto out;
            }
        int64_t w0 = w;
        while (w < n_want && want[w] < r + len) w++;
        if (len == 1) {
            bs[B] = slots[r], bp[B] = pos[r], bt[B] = tokens[r], bw[B++] = w > w0 ? w0 : -1;
            continue;
        }
        // a run: none wanted, its last row only (the head once), or any (every row's logits, then the wanted)
        if (w == w0 || (w == w0 + 1 && want[w0] == r + len - 1)) {
            if (cpu_forward_last(s, slots[r], tokens + r, len, pos[r], w > w0 ? logits + w0 * V : NULL, e)) goto out;
            continue;
        }
        free(tmp);
        if (!(tmp = malloc((size_t)(len * V) * sizeof *tmp))) {
            dj_fail(e, "out of memory");
            goto out;
        }
        if (cpu_forward_slot(s, slots[r], tokens + r, len, pos[r], tmp, e)) goto out;
        for (int64_t k = w0; k < w; k++) memcpy(logits + k * V, tmp + (want[k] - r) * V, (size_t)V * sizeof *tmp);
    }
    if (B) {
        free(tmp);
        if (!(tmp = malloc((size_t)B * V * sizeof *tmp))) {
            dj_fail(e, "out of memory");
            goto out;
        }
        if (cpu_step_batch(s, B, bs, bp, bt, tmp, e)) goto out;
        for (int32_t b = 0; b < B; b++)
            if (bw[b] >= 0) memcpy(logits + bw[b] * V, tmp + (int64_t)b * V, (size_t)V * sizeof *tmp);
    }
    rc = 0;
out:
    free(bs), free(bt), free(bp), free(bw), free(tmp);
    return rc;
}

// ---- parking
struct dj_cpu_parked {
    int64_t n;      // positions
    uint8_t kv[];   // engine.h's parked layout: K then V, each (n_layers, n_kv_heads, n, head_dim) elements of the
                    // KV type; q8: then K's and V's scales, each (n_layers, n_kv_heads, n) f32
};

// Copies positions 0..n-1 of every (layer, kv head) run of one slot between the cache and a parked copy: the
// elements of K and V, then (q8) their scales, each run `bytes` long for a position.
static void cpu_park_copy(dj_cpu_state *s, int32_t slot, dj_cpu_parked *p, int out) {
    const size_t runs = (size_t)s->c.n_layers * (size_t)s->c.n_kv_heads, elem = dj_kv_elem_bytes(s->kv_type);
    uint8_t *at = p->kv;
    for (int part = 0; part < (s->kv_type == DJ_KV_Q8 ? 4 : 2); part++) {
        const cpu_kv_cache *kc = &s->kv[part % 2];
        uint8_t *base = part < 2 ? (uint8_t *)kc->data : (uint8_t *)kc->scale;
        const size_t bytes = part < 2 ? (size_t)s->c.head_dim * elem : sizeof(float), run = (size_t)p->n * bytes;
        for (size_t i = 0; i < runs; i++, at += run) {
            const uint32_t layer = (uint32_t)(i / s->c.n_kv_heads);
            uint8_t *c = base + cpu_kv_row(s, slot, layer, (int64_t)(i % s->c.n_kv_heads), 0) * bytes;
            if (out) memcpy(at, c, run);
            else memcpy(c, at, run);
        }
    }
}

dj_cpu_parked *cpu_park(dj_cpu_state *s, int32_t slot, int64_t n, dj_err *e) {
    if (cpu_check_slot(s, slot, e)) return NULL;
    if (n < 0 || n > s->max_seq) {
        dj_fail(e, "cpu: cannot park %" PRId64 " positions of a slot of %" PRId64, n, s->max_seq);
        return NULL;
    }
    size_t bytes = 2 * (size_t)s->c.n_layers * (size_t)s->c.n_kv_heads * (size_t)n *
                   (size_t)dj_kv_row_bytes(s->kv_type, s->c.head_dim);  // n * engine_kv_pos_bytes
    dj_cpu_parked *p = malloc(sizeof *p + bytes);
    if (!p) {
        dj_fail(e, "cpu: cannot allocate %.3f GB to park a KV slot", (double)bytes / 1e9);
        return NULL;
    }
    p->n = n;
    cpu_park_copy(s, slot, p, 1);
    return p;
}

int cpu_restore(dj_cpu_state *s, dj_cpu_parked *p, int32_t slot, dj_err *e) {
    if (cpu_check_slot(s, slot, e)) return -1;
    if (p->n > s->max_seq)
        return dj_fail(e, "cpu: a parked cache of %" PRId64 " positions does not fit a slot of %" PRId64, p->n,
                       s->max_seq);
    cpu_park_copy(s, slot, p, 0);
    free(p);
    return 0;
}

void *cpu_parked_kv(dj_cpu_parked *p) { return p->kv; }

void cpu_parked_free(dj_cpu_parked *p) { free(p); }
