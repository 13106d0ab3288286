// sampler.c: greedy and top-p sampling on the host (sampler.h).
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

// ---- top-p
typedef struct {
    float p;
    int32_t id;
} dj_prob;

struct dj_sampler {
    int64_t vocab;
    dj_sampling p;  // temp 0: greedy
    dj_rng rng;
    dj_prob *buf;   // (vocab)
    float *probs;   // (vocab)
    float *work;    // (vocab): the penalized logits, when a penalty is on
    int32_t *hist;  // (repeat_last_n): the last tokens, a ring
    int64_t n_hist, at;
    int32_t *count;  // (vocab): occurrences in hist, kept while sampling
};

// Descending probability; ties by ascending id, so top-p 0 picks exactly argmax's token.
static int prob_cmp(const void *a, const void *b) {
    const dj_prob *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int penalties_on(const dj_sampling *p) {
    return p->repeat_last_n > 0 && (p->repeat_penalty != 1.0 || p->presence_penalty != 0 || p->frequency_penalty != 0);
}

dj_sampler *sampler_new_with(int64_t vocab, const dj_sampling *p, uint64_t seed, dj_err *e) {
    if (!(p->temp >= 0) || !(p->top_p >= 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) || p->top_k < 0 ||
        !(p->repeat_penalty > 0) || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) ||
        p->repeat_last_n < 0 || p->repeat_last_n > (1 << 24)) {
        dj_fail(e, "sampler: settings out of range");
        return NULL;
    }
    dj_sampler *s = calloc(1, sizeof *s);
    int pen = penalties_on(p);
    if (s) {
        s->buf = malloc((size_t)vocab * sizeof *s->buf);
        s->probs = malloc((size_t)vocab * sizeof *s->probs);
        if (pen) {
            s->work = malloc((size_t)vocab * sizeof *s->work);
            s->hist = malloc((size_t)p->repeat_last_n * sizeof *s->hist);
            s->count = calloc((size_t)vocab, sizeof *s->count);
        }
    }
    if (!s || !s->buf || !s->probs || (pen && (!s->work || !s->hist || !s->count))) {
        sampler_free(s);
        dj_fail(e, "out of memory for the sampler");
        return NULL;
    }
    s->vocab = vocab;
    s->p = *p;
    if (p->top_p == 0 || p->top_k == 1) s->p.temp = 0;  // only the most likely token is left: greedy
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
    free(s->buf), free(s->probs), free(s->work), free(s->hist), free(s->count);
    free(s);
}

int sampler_is_greedy(const dj_sampler *s) { return s->p.temp == 0; }

void sampler_accept(dj_sampler *s, int32_t id) {
    if (!s->hist || id < 0 || id >= s->vocab) return;
    int64_t n = s->p.repeat_last_n;
    if (s->n_hist == n) s->count[s->hist[s->at]]--;  // the oldest leaves the window
    else s->n_hist++;
    s->hist[s->at] = id;
    s->count[id]++;
    s->at = (s->at + 1) % n;
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

// The logits with the penalties applied, in s->work: each distinct token of the window once (its count is negated
// while the pass has seen it, then restored).
static const float *penalize(dj_sampler *s, const float *logits) {
    memcpy(s->work, logits, (size_t)s->vocab * sizeof *s->work);
    for (int64_t k = 0; k < s->n_hist; k++) {
        int32_t id = s->hist[k], c = s->count[id];
        if (c <= 0) continue;  // seen already in this pass
        s->count[id] = -c;
        float l = logits[id];
        if (s->p.repeat_penalty != 1.0) l = l > 0 ? (float)(l / s->p.repeat_penalty) : (float)(l * s->p.repeat_penalty);
        s->work[id] = l - (float)((double)c * s->p.frequency_penalty + s->p.presence_penalty);
    }
    for (int64_t k = 0; k < s->n_hist; k++)
        if (s->count[s->hist[k]] < 0) s->count[s->hist[k]] = -s->count[s->hist[k]];
    return s->work;
}

// Moves the k largest of a[0..n) (prob_cmp order) to a[0..k), in any order: quickselect.
static void select_top(dj_prob *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        dj_prob pivot = a[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (prob_cmp(&a[i], &pivot) < 0) i++;
            while (prob_cmp(&a[j], &pivot) > 0) j--;
            if (i <= j) {
                dj_prob t = a[i];
                a[i] = a[j], a[j] = t;
                i++, j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int32_t sampler_next(dj_sampler *s, const float *logits) {
    int64_t vocab = s->vocab;
    // the penalties keep a NaN, an infinity or a row of -infinity as it was: one check, on what is sampled
    const float *l = s->work && s->n_hist ? penalize(s, logits) : logits;
    int32_t top = checked_argmax(l, vocab);
    if (top < 0 || s->p.temp == 0) return top;
    float mx = l[top];
    double sum = 0, temp = s->p.temp;
    for (int64_t i = 0; i < vocab; i++) {
        s->probs[i] = expf((float)((l[i] - mx) / temp));
        sum += s->probs[i];
    }
    int64_t n = 0, k = s->p.top_k > 0 && s->p.top_k < vocab ? s->p.top_k : 0;
    double target;
    if (k) {  // the k most likely, then top-p over their mass
        for (int64_t i = 0; i < vocab; i++) s->buf[n++] = (dj_prob){s->probs[i], (int32_t)i};
        select_top(s->buf, n, k);
        n = k;
        double ksum = 0;
        for (int64_t i = 0; i < n; i++) ksum += s->buf[i].p;
        target = s->p.top_p * ksum;
    } else {
        // A token below (1 - top_p) / (vocab - 1) of the mass can never be in the nucleus, unless it is the most
        // likely one (the tokens after it in order would lack the 1 - top_p the nucleus leaves out): skip sorting
        // them. The cutoff stops at the top token's weight, exactly 1 here, so the nucleus is never empty even
        // when top_p < 1/vocab and the distribution is nearly flat. min-p's bound (the top token's weight is 1)
        // cuts the same way.
        double cutoff = vocab > 1 ? fmin((1.0 - s->p.top_p) / (double)(vocab - 1) * sum, 1.0) : 0;
        if (s->p.min_p > cutoff) cutoff = s->p.min_p;
        for (int64_t i = 0; i < vocab; i++)
            if (s->probs[i] >= cutoff) s->buf[n++] = (dj_prob){s->probs[i], (int32_t)i};
        target = s->p.top_p * sum;
    }
    qsort(s->buf, (size_t)n, sizeof *s->buf, prob_cmp);
    int64_t keep = n;
    double cum = 0;
    for (int64_t i = 0; i < n; i++) {
        cum += s->buf[i].p;
        if (cum >= target) {
            keep = i + 1;
            break;
        }
    }
    // min-p: at least min_p times the most likely token's probability (its weight, buf[0].p, is 1)
    while (keep > 1 && s->buf[keep - 1].p < s->p.min_p * s->buf[0].p) keep--;
    double mass = 0;
    for (int64_t i = 0; i < keep; i++) mass += s->buf[i].p;
    double r = rng_f32(&s->rng) * mass, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += s->buf[i].p;
        if (r < acc) return s->buf[i].id;
    }
    return s->buf[keep - 1].id;
}
