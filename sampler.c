// sampler.c: the sampling rule on the host, and the arguments that let gpu_pick run it on the GPU (sampler.h).
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- generator
void rng_seed(dj_rng *r, uint64_t seed) {
    r->state = (seed + 1) * 0x9E3779B97F4A7C15ull;
    if (!r->state) r->state = 1;  // 0 is xorshift's fixed point
}

uint32_t rng_u32(dj_rng *r) {  // xorshift64*
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return (uint32_t)((r->state * 0x2545F4914F6CDD1Dull) >> 32);
}

float rng_f32(dj_rng *r) { return (float)(rng_u32(r) >> 8) / 16777216.0f; }

// ---- greedy
int32_t dj_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

// ---- the rule (sampler.h)
typedef struct {
    uint32_t w;
    int32_t id;
} dj_cand;

struct dj_sampler {
    int64_t vocab;
    dj_sampling p;
    dj_pick_args a;  // the settings as the rule reads them
    dj_rng rng;
    uint32_t *w;     // (vocab) weights
    dj_cand *buf;    // (vocab) the candidates for the kept prefix
    float *work;     // (vocab): the penalized logits, when a penalty is on
    int32_t *hist;   // (repeat_last_n): the last tokens, a ring
    int64_t n_hist, at;
    int32_t *count;  // (vocab): occurrences in hist
    int n_changed;   // ids whose count changed since sampler_step_args (-1: too many to list, or never synced)
    int32_t changed[DJ_PICK_SETS];
};

// The order: weight descending, then id ascending.
static int cand_cmp(const void *a, const void *b) {
    const dj_cand *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int penalties_on(const dj_sampling *p) {
    return p->repeat_last_n > 0 && (p->repeat_penalty != 1.0 || p->presence_penalty != 0 || p->frequency_penalty != 0);
}

dj_sampler *sampler_new_with(int64_t vocab, const dj_sampling *p, uint64_t seed, dj_err *e) {
    if (!(p->temp >= 0) || !(p->top_p >= 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) || p->top_k < 0 ||
        !(p->repeat_penalty >= DJ_SAMPLING_MIN && p->repeat_penalty < DJ_SAMPLING_MAX) ||
        !(fabs(p->presence_penalty) <= DJ_SAMPLING_MAX) || !(fabs(p->frequency_penalty) <= DJ_SAMPLING_MAX) ||
        p->repeat_last_n < 0 || p->repeat_last_n > (1 << 24) || !(p->temp < DJ_SAMPLING_MAX) ||
        vocab < 1 || vocab > INT32_MAX) {
        dj_fail(e, "sampler: settings out of range");
        return NULL;
    }
    dj_sampler *s = calloc(1, sizeof *s);
    int pen = penalties_on(p);
    if (s) {
        s->w = malloc((size_t)vocab * sizeof *s->w);
        s->buf = malloc((size_t)vocab * sizeof *s->buf);
        if (pen) {
            s->work = malloc((size_t)vocab * sizeof *s->work);
            s->hist = malloc((size_t)p->repeat_last_n * sizeof *s->hist);
            s->count = calloc((size_t)vocab, sizeof *s->count);
        }
    }
    if (!s || !s->w || !s->buf || (pen && (!s->work || !s->hist || !s->count))) {
        sampler_free(s);
        dj_fail(e, "out of memory for the sampler");
        return NULL;
    }
    s->vocab = vocab;
    s->p = *p;
    int greedy = p->temp == 0 || p->top_p == 0 || p->top_k == 1;  // only the most likely token is left
    s->a = (dj_pick_args){.temp = greedy ? 0.0f : (float)p->temp, .top_p = (float)p->top_p, .min_p = (float)p->min_p,
                          .top_k = p->top_k > INT32_MAX ? INT32_MAX : (int32_t)p->top_k,
                          .repeat_penalty = (float)p->repeat_penalty, .presence_penalty = (float)p->presence_penalty,
                          .frequency_penalty = (float)p->frequency_penalty};
    s->n_changed = -1;
    rng_seed(&s->rng, seed);
    return s;
}

dj_sampler *sampler_new(int64_t vocab, double temp, double top_p, uint64_t seed, dj_err *e) {
    dj_sampling p = DJ_SAMPLING_DEFAULT;
    p.temp = temp, p.top_p = top_p;
    return sampler_new_with(vocab, &p, seed, e);
}

void sampler_free(dj_sampler *s) {
    if (!s) return;
    free(s->w), free(s->buf), free(s->work), free(s->hist), free(s->count);
    free(s);
}

int sampler_is_greedy(const dj_sampler *s) { return !(s->a.temp > 0); }

static void note_change(dj_sampler *s, int32_t id) {
    if (s->n_changed >= 0 && s->n_changed < DJ_PICK_SETS) s->changed[s->n_changed++] = id;
    else s->n_changed = -1;
}

void sampler_accept(dj_sampler *s, int32_t id) {
    if (!s->hist || id < 0 || id >= s->vocab) return;
    int64_t n = s->p.repeat_last_n;
    if (s->n_hist == n) {  // the oldest leaves the window
        s->count[s->hist[s->at]]--;
        note_change(s, s->hist[s->at]);
    } else {
        s->n_hist++;
    }
    s->hist[s->at] = id;
    s->count[id]++;
    note_change(s, id);
    s->at = (s->at + 1) % n;
}

const int32_t *sampler_counts(const dj_sampler *s) { return s->count; }

void sampler_step_args(dj_sampler *s, dj_pick_args *a) {
    *a = s->a;
    a->u = sampler_is_greedy(s) ? 0.0f : rng_f32(&s->rng);
    a->penalize = s->count && s->n_hist > 0;
    a->n_set = s->count ? s->n_changed : 0;
    for (int i = 0; i < a->n_set; i++) a->set_id[i] = s->changed[i], a->set_count[i] = s->count[s->changed[i]];
    s->n_changed = 0;
}

// The index of the largest logit, or -1 when the row holds a NaN or +infinity, or nothing above -infinity: no
// distribution to sample from (a model whose arithmetic overflowed).
static int32_t checked_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]) || x[i] == INFINITY) return -1;
        if (x[i] > x[best]) best = i;
    }
    return x[best] == -INFINITY ? -1 : (int32_t)best;
}

// Moves the k first of a[0..n) in cand_cmp's order to a[0..k), in any order: quickselect.
static void select_top(dj_cand *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        dj_cand pivot = a[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp(&a[i], &pivot) < 0) i++;
            while (cand_cmp(&a[j], &pivot) > 0) j--;
            if (i <= j) {
                dj_cand t = a[i];
                a[i] = a[j], a[j] = t;
                i++, j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

// The kept prefix after top-k and top-p as a cut: weights above *t, and the first *nt of those equal to it.
static void top_k_p_cut(dj_sampler *s, int32_t top, uint64_t W, uint64_t *t, uint64_t *nt) {
    const dj_pick_args *a = &s->a;
    int64_t n = s->vocab, k = a->top_k > 0 && a->top_k < n ? a->top_k : 0, nc = 0;
    if (!k && !(a->top_p < 1)) return;  // all kept: the caller's t = 0, nt = every one
    double target_p = 0;
    if (k) {
        for (int64_t i = 0; i < n; i++) s->buf[nc++] = (dj_cand){s->w[i], (int32_t)i};
        select_top(s->buf, n, k);
        nc = k;
    } else {
        // No token after the first one of the order is in the nucleus unless the weight from it to the end,
        // at most (n - 1) * w, exceeds W - target: the others need no sorting.
        double tg = ceil((double)a->top_p * (double)W);
        target_p = tg < 1 ? 1 : tg > (double)W ? (double)W : tg;
        uint64_t need = W - (uint64_t)target_p + 1;
        for (int64_t i = 0; i < n; i++)
            if ((uint64_t)s->w[i] * (uint64_t)(n - 1) >= need || i == top) s->buf[nc++] = (dj_cand){s->w[i], (int32_t)i};
    }
    qsort(s->buf, (size_t)nc, sizeof *s->buf, cand_cmp);
    int64_t keep = nc;
    if (a->top_p < 1) {
        if (k) {
            uint64_t Wk = 0;
            for (int64_t i = 0; i < k; i++) Wk += s->buf[i].w;
            double tg = ceil((double)a->top_p * (double)Wk);
            target_p = tg < 1 ? 1 : tg > (double)Wk ? (double)Wk : tg;
        }
        uint64_t cum = 0, target = (uint64_t)target_p;
        for (int64_t i = 0; i < nc; i++)
            if ((cum += s->buf[i].w) >= target) {
                keep = i + 1;
                break;
            }
    }
    *t = s->buf[keep - 1].w, *nt = 0;
    for (int64_t i = keep - 1; i >= 0 && s->buf[i].w == *t; i--) ++*nt;
}

const float *sampler_penalized(dj_sampler *s, const float *z) {
    if (!s->count || !s->n_hist) return z;
    const dj_pick_args *a = &s->a;
    for (int64_t i = 0; i < s->vocab; i++)
        s->work[i] = s->count[i] > 0 ? dj_pick_penalized(z[i], s->count[i], a->repeat_penalty, a->frequency_penalty,
                                                         a->presence_penalty)
                                     : z[i];
    return s->work;
}

// The rule up to the draw: the top id of the penalized row (-1: no distribution); for a sampled rule the weights
// s->w and the kept set, the ids with w > *t and the first *nt (in id order) of those with w == *t, weighing *M.
static int32_t rule_kept(dj_sampler *s, const float *z, uint64_t *t, uint64_t *nt, uint64_t *M) {
    const dj_pick_args *a = &s->a;
    int64_t n = s->vocab;
    const float *l = sampler_penalized(s, z);  // a NaN, an infinity or a row of -infinity stays one: one check, on l
    int32_t top = checked_argmax(l, n);
    if (top < 0 || !(a->temp > 0)) return top;
    uint64_t W = 0;
    for (int64_t i = 0; i < n; i++) W += s->w[i] = dj_pick_weight(l[i], l[top], a->temp);
    *t = 0, *nt = UINT64_MAX;
    top_k_p_cut(s, top, W, t, nt);
    if (a->min_p > 0) {
        uint64_t wm = (uint64_t)ceil((double)a->min_p * 4294967295.0);
        if (wm > *t) *t = wm, *nt = UINT64_MAX;
    }
    uint64_t ties = 0;
    *M = 0;
    for (int64_t i = 0; i < n; i++)
        if (s->w[i] > *t || (s->w[i] == *t && ties++ < *nt)) *M += s->w[i];
    return top;
}

int32_t sampler_pick_u(dj_sampler *s, const float *z, float u) {
    uint64_t t, nt, M;
    int32_t top = rule_kept(s, z, &t, &nt, &M);
    if (top < 0 || !(s->a.temp > 0)) return top;
    // the draw, in index order over the kept ids
    double rd = floor((double)u * (double)M);
    uint64_t r = rd <= 0 ? 0 : rd >= (double)M ? M - 1 : (uint64_t)rd, acc = 0, ties = 0;
    for (int64_t i = 0; i < s->vocab; i++)
        if (s->w[i] > t || (s->w[i] == t && ties++ < nt))
            if ((acc += s->w[i]) > r) return (int32_t)i;
    return top;  // not reached: acc ends at M > r
}

int32_t sampler_probs(dj_sampler *s, const float *z, float *probs) {
    uint64_t t, nt, M;
    int32_t top = rule_kept(s, z, &t, &nt, &M);
    if (top < 0) return -1;
    if (!(s->a.temp > 0)) {
        memset(probs, 0, (size_t)s->vocab * sizeof *probs);
        probs[top] = 1;
        return top;
    }
    uint64_t ties = 0;
    for (int64_t i = 0; i < s->vocab; i++)
        probs[i] = s->w[i] > t || (s->w[i] == t && ties++ < nt) ? (float)((double)s->w[i] / (double)M) : 0.0f;
    return top;
}

float sampler_uniform(dj_sampler *s) { return rng_f32(&s->rng); }

void sampler_history(dj_sampler *s, const int32_t *ids, int64_t n) {
    if (!s->hist) return;
    for (int64_t i = 0; i < s->n_hist; i++) s->count[s->hist[i]]--;
    s->n_hist = s->at = 0;
    for (int64_t i = n > s->p.repeat_last_n ? n - s->p.repeat_last_n : 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->vocab) continue;
        s->hist[s->at] = ids[i], s->count[ids[i]]++, s->n_hist++;
        s->at = (s->at + 1) % s->p.repeat_last_n;
    }
    s->n_changed = -1;  // a copy of the counts elsewhere takes them whole
}

int32_t dj_draw(const float *p, int64_t n, float u) {
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += p[i] > 0 ? p[i] : 0;
    if (!(total > 0)) return -1;
    double r = (double)u * total, acc = 0;
    int64_t last = -1;
    for (int64_t i = 0; i < n; i++)
        if (p[i] > 0) {
            last = i;
            if ((acc += p[i]) > r) return (int32_t)i;
        }
    return (int32_t)last;  // u * total rounded up to the sum
}

int32_t sampler_next(dj_sampler *s, const float *logits) {
    return sampler_pick_u(s, logits, sampler_is_greedy(s) ? 0.0f : rng_f32(&s->rng));
}

// ---- session files
uint64_t sampler_rng_state(const dj_sampler *s) { return s->rng.state; }
void sampler_set_rng_state(dj_sampler *s, uint64_t state) {
    if (state) s->rng.state = state;
}
