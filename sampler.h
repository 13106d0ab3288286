// sampler.h: the next token from a row of logits, greedy or sampled from a seeded generator (the same seed gives
// the same tokens). One rule, exact, run by two implementations: sampler_next on the host and gpu_pick
// (kernels.h) where the logits are, so that only the chosen token leaves the GPU.
#ifndef DJINN_SAMPLER_H
#define DJINN_SAMPLER_H

#include <math.h>
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
// The ranges sampler_new_with takes, where the settings are floats the picks can use: temp from 0 and the repeat
// penalty from DJ_SAMPLING_MIN (a factor it can divide by), both below DJ_SAMPLING_MAX; the additive penalties within
// +-DJ_SAMPLING_MAX (times a count of up to 2^24, still a finite float); repeat_last_n 0 .. 2^24.
#define DJ_SAMPLING_MIN 1e-30
#define DJ_SAMPLING_MAX 1e30
#define DJ_TEXT_(x) #x
#define DJ_TEXT(x) DJ_TEXT_(x)  // a bound as its text, for messages: DJ_TEXT(DJ_SAMPLING_MAX) is "1e30"

// The exact rule, over logits z (n), in float arithmetic as written:
//   penalties  each i with c = counts[i] > 0 (its occurrences in the window): z_i / r if z_i > 0 else z_i * r
//              (when r != 1), then minus (c * frequency + presence)                      -> l_i
//   no token   (-1) when some l_i is NaN or +infinity, or every one is -infinity
//   greedy     temp 0: the first index of the largest l_i
//   weights    w_i = dj_pick_weight(l_i, max l, temp): min(trunc(e^((l_i - max l) / temp) * 2^32), 2^32 - 1), a
//              32-bit integer (the most likely token weighs 2^32 - 1), e^x by the float arithmetic below, the same
//              on host and GPU (no library expf, which differs between them in the last bit); the order: w
//              descending, then id ascending
//   top_k      the first k of the order (0: all)
//   top_p      of those, the shortest prefix whose weight reaches ceil(top_p * their weight) (in double, clamped
//              to at least 1)
//   min_p      of those, the ones with w >= ceil(min_p * (2^32 - 1)) (in double)
//   draw       M = the weight kept, r = min(floor(u * M), M - 1): the first kept i in index order whose running
//              sum of kept weights exceeds r
// Integer weights make every sum exact and independent of order, so both implementations agree bit for bit; the
// kept set is always a prefix of the order: the ids with w > t, and the first nt (in id order) of those with
// w == t.
#define DJ_PICK_SETS 8
typedef struct {
    float temp, top_p, min_p;  // temp <= 0: greedy
    int32_t top_k;
    float repeat_penalty, presence_penalty, frequency_penalty;
    float u;                   // the draw, in [0, 1)
    int32_t penalize;          // counts are read (a penalty is on and the window is not empty)
    // For a copy of the counts kept elsewhere (the GPU's): n_set >= 0 changes to apply first,
    // counts[set_id[i]] = set_count[i]; -1: the whole array changed.
    int32_t n_set;
    int32_t set_id[DJ_PICK_SETS], set_count[DJ_PICK_SETS];
} dj_pick_args;

// The penalties and the weight as both implementations compute them: each float operation rounded on its own
// (on the GPU, intrinsics that keep nvcc from fusing a multiply and an add; C11 host code does not fuse).
#ifdef __CUDA_ARCH__
#define DJ_PICK_QUAL static __device__ __forceinline__
#define DJ_FMUL(a, b) __fmul_rn(a, b)
#define DJ_FADD(a, b) __fadd_rn(a, b)
#define DJ_FDIV(a, b) __fdiv_rn(a, b)
#else
#define DJ_PICK_QUAL static inline
#define DJ_FMUL(a, b) ((a) * (b))
#define DJ_FADD(a, b) ((a) + (b))
#define DJ_FDIV(a, b) ((a) / (b))
#endif

DJ_PICK_QUAL float dj_pick_penalized(float z, int32_t c, float repeat, float frequency, float presence) {
    if (repeat != 1.0f) z = z > 0.0f ? DJ_FDIV(z, repeat) : DJ_FMUL(z, repeat);
    const float f = DJ_FADD(DJ_FMUL((float)c, frequency), presence);
    return DJ_FADD(z, -f);
}

// e^x for x <= 0 as 2^k * 2^f, k = rint(x log2 e), |f| <= 1/2, 2^f by its Taylor series to degree 7 (error below
// 1e-8); then the weight. x <= -22 weighs 0 (e^-22 * 2^32 < 1.2).
DJ_PICK_QUAL uint32_t dj_pick_weight(float l, float m, float temp) {
    const float x = DJ_FDIV(DJ_FADD(l, -m), temp);
    if (!(x > -22.0f)) return 0;  // also -infinity and NaN
    const float t = DJ_FMUL(x, 1.44269504f), k = rintf(t), f = DJ_FADD(t, -k);
    float p = 1.5252733e-5f;  // ln2^7 / 7!
    p = DJ_FADD(DJ_FMUL(p, f), 1.5403530e-4f);
    p = DJ_FADD(DJ_FMUL(p, f), 1.3333558e-3f);
    p = DJ_FADD(DJ_FMUL(p, f), 9.6181291e-3f);
    p = DJ_FADD(DJ_FMUL(p, f), 5.5504109e-2f);
    p = DJ_FADD(DJ_FMUL(p, f), 2.4022651e-1f);
    p = DJ_FADD(DJ_FMUL(p, f), 6.9314718e-1f);
    p = DJ_FADD(DJ_FMUL(p, f), 1.0f);
    // times 2^(k + 32), exactly (k in -32..0): the weight before truncation
    const float v = DJ_FMUL(p, (float)(1ull << (uint32_t)(32 + (int32_t)k)));
    return v >= 4294967296.0f ? UINT32_MAX : (uint32_t)v;
}

typedef struct dj_sampler dj_sampler;
// Buffers for `vocab` logits and repeat_last_n tokens of history. NULL with e set for settings out of range.
dj_sampler *sampler_new_with(int64_t vocab, const dj_sampling *p, uint64_t seed, dj_err *e);
// temp and top_p only (the others at their defaults).
dj_sampler *sampler_new(int64_t vocab, double temp, double top_p, uint64_t seed, dj_err *e);
// The penalties' history: every token of the context, in order (the prompt's, then each one sampled).
void sampler_accept(dj_sampler *s, int32_t id);
void sampler_free(dj_sampler *s);
// Draws u and picks: -1 when the row holds a NaN or +infinity, or only -infinity (the caller reports it; nothing
// is indexed by it). The caller's logits are not changed.
int32_t sampler_next(dj_sampler *s, const float *logits);
int sampler_is_greedy(const dj_sampler *s);

// For picking elsewhere (gpu_pick): the next draw's arguments (u drawn, as sampler_next would) and the count
// changes since the previous call; counts: the window's occurrences per id (vocab), NULL when no penalty is on.
void sampler_step_args(dj_sampler *s, dj_pick_args *a);
const int32_t *sampler_counts(const dj_sampler *s);
// The logits (vocab) as the next pick sees them, the penalties applied: z itself when none is on, else the
// sampler's own buffer, valid until its next call.
const float *sampler_penalized(dj_sampler *s, const float *z);
// The rule itself with a given draw u, on the sampler's settings and counts (the reference for gpu_pick).
int32_t sampler_pick_u(dj_sampler *s, const float *logits, float u);

// For speculative decoding (spec.h), which needs the distributions themselves:
// probs (vocab): the distribution sampler_pick_u draws from on these logits, each kept id's weight over the kept
// weight (greedy: 1 at the top id); returns the top id, or -1 (probs untouched) when there is none.
int32_t sampler_probs(dj_sampler *s, const float *logits, float *probs);
// A draw from the sampler's generator, [0, 1).
float sampler_uniform(dj_sampler *s);
// The penalties' window set to the last repeat_last_n of ids (n), as if only they had been accepted.
void sampler_history(dj_sampler *s, const int32_t *ids, int64_t n);
// A draw from p (n) scaled to its positive mass: the first id whose running sum exceeds u times that mass; -1 when
// there is none.
int32_t dj_draw(const float *p, int64_t n, float u);

// Session files (session.h): the generator's state, saved after a run and set to resume it (0 is refused: the
// generator's fixed point).
uint64_t sampler_rng_state(const dj_sampler *s);
void sampler_set_rng_state(dj_sampler *s, uint64_t state);

#endif
