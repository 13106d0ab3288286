// sampler.h: the next token from a row of logits: greedy (argmax) or top-p (nucleus) sampling with temperature,
// from a seeded generator: the same seed gives the same tokens.
#ifndef DJINN_SAMPLER_H
#define DJINN_SAMPLER_H

#include <stdint.h>

#include "util.h"

typedef struct {
    uint64_t state;  // xorshift64*; never 0
} dj_rng;

void rng_seed(dj_rng *r, uint64_t seed);
uint32_t rng_u32(dj_rng *r);
float rng_f32(dj_rng *r);  // [0, 1)

// The first index of the largest value.
int32_t dj_argmax(const float *x, int64_t n);

typedef struct dj_sampler dj_sampler;
// temp 0 or top_p 0: greedy. Else softmax(logits / temp), the smallest set of most likely tokens whose mass
// reaches top_p (at least one; ties in probability by ascending id), one draw from it. Buffers for `vocab` logits.
dj_sampler *sampler_new(int64_t vocab, double temp, double top_p, uint64_t seed, dj_err *e);
void sampler_free(dj_sampler *s);
// -1 when the row holds a NaN or +infinity, or only -infinity (the caller reports it; nothing is indexed by it).
int32_t sampler_next(dj_sampler *s, const float *logits);
int sampler_is_greedy(const dj_sampler *s);

#endif
