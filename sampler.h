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
// The samplers, with llama.cpp's names and meanings, applied in this order:
//   penalties  over the last repeat_last_n tokens given to sampler_accept (the prompt's included), each distinct
//              token's logit l once: repeat_penalty r (1: off) makes it l / r when l > 0, else l * r; then
//              l -= count * frequency_penalty + presence_penalty (0: off)
//   temp       0 (or top_p 0, or top_k 1): greedy, the largest penalized logit; else softmax(l / temp)
//   top_k      the k most likely tokens (0: all)
//   top_p      of those, the smallest set whose mass reaches top_p of theirs (1: all)
//   min_p      of those, the ones at least min_p times as likely as the most likely (0: all)
// then one draw from what is left. Ties in probability go to the smaller id throughout.
typedef struct {
    double temp, top_p, min_p;
    int64_t top_k;
    double repeat_penalty, presence_penalty, frequency_penalty;
    int64_t repeat_last_n;
} dj_sampling;
#define DJ_SAMPLING_DEFAULT ((dj_sampling){.temp = 1.0, .top_p = 0.9, .repeat_penalty = 1.0, .repeat_last_n = 64})
// Buffers for `vocab` logits and repeat_last_n tokens of history. NULL with e set for settings out of range.
dj_sampler *sampler_new_with(int64_t vocab, const dj_sampling *p, uint64_t seed, dj_err *e);
// temp and top_p only (the others at their defaults).
dj_sampler *sampler_new(int64_t vocab, double temp, double top_p, uint64_t seed, dj_err *e);
// The penalties' history: every token of the context, in order (the prompt's, then each one sampled).
void sampler_accept(dj_sampler *s, int32_t id);
void sampler_free(dj_sampler *s);
// -1 when the row holds a NaN or +infinity, or only -infinity (the caller reports it; nothing is indexed by it).
int32_t sampler_next(dj_sampler *s, const float *logits);
int sampler_is_greedy(const dj_sampler *s);

#endif
