// sampler.c: greedy and top-p sampling on the host (sampler.h).
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

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
    double temp, top_p;  // temp 0: greedy
    dj_rng rng;
    dj_prob *buf;  // (vocab)
    float *probs;  // (vocab)
};

// Descending probability; ties by ascending id, so top-p 0 picks exactly argmax's token.
static int prob_cmp(const void *a, const void *b) {
    const dj_prob *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

dj_sampler *sampler_new(int64_t vocab, double temp, double top_p, uint64_t seed, dj_err *e) {
    dj_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->buf = malloc((size_t)vocab * sizeof *s->buf);
        s->probs = malloc((size_t)vocab * sizeof *s->probs);
    }
    if (!s || !s->buf || !s->probs) {
        sampler_free(s);
        dj_fail(e, "out of memory for the sampler");
        return NULL;
    }
    s->vocab = vocab;
    s->temp = top_p == 0 ? 0 : temp;  // top-p 0 keeps only the most likely token: greedy
    s->top_p = top_p;
    rng_seed(&s->rng, seed);
    return s;
}

void sampler_free(dj_sampler *s) {
    if (!s) return;
    free(s->buf);
    free(s->probs);
    free(s);
}

int sampler_is_greedy(const dj_sampler *s) { return s->temp == 0; }

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

int32_t sampler_next(dj_sampler *s, const float *logits) {
    int64_t vocab = s->vocab;
    int32_t top = checked_argmax(logits, vocab);
    if (top < 0 || s->temp == 0) return top;
    float mx = logits[top];
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) {
        s->probs[i] = expf((float)((logits[i] - mx) / s->temp));
        sum += s->probs[i];
    }
    // A token below (1 - top_p) / (vocab - 1) of the mass can never be in the nucleus, unless it is the most
    // likely one (the tokens after it in order would lack the 1 - top_p the nucleus leaves out): skip sorting them.
    // The cutoff stops at the top token's weight, exactly 1 here, so the nucleus is never empty even when
    // top_p < 1/vocab and the distribution is nearly flat.
    double cutoff = vocab > 1 ? fmin((1.0 - s->top_p) / (double)(vocab - 1) * sum, 1.0) : 0;
    int64_t n = 0;
    for (int64_t i = 0; i < vocab; i++)
        if (s->probs[i] >= cutoff) s->buf[n++] = (dj_prob){s->probs[i], (int32_t)i};
    qsort(s->buf, (size_t)n, sizeof *s->buf, prob_cmp);
    double target = s->top_p * sum, cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; i++) {
        cum += s->buf[i].p;
        if (cum >= target) {
            keep = i + 1;
            break;
        }
    }
    double mass = 0;
    for (int64_t i = 0; i < keep; i++) mass += s->buf[i].p;
    double r = rng_f32(&s->rng) * mass, acc = 0;
    for (int64_t i = 0; i < keep; i++) {
        acc += s->buf[i].p;
        if (r < acc) return s->buf[i].id;
    }
    return s->buf[keep - 1].id;
}
