// spec.h: speculative decoding over two engines. A small draft model with the target's vocabulary proposes up to
// k tokens one step at a time; the target scores all of them in one forward pass of k+1 rows (the last accepted
// token and the k drafted), so a streamed target reads its weights once for up to k+1 tokens. Verification keeps
// the output the target's own: greedy, each drafted token stands while it is the target's pick; sampled, speculative
// sampling (a drafted d drawn from the draft's distribution q stands with probability min(1, p(d)/q(d)) under the
// target's p, else the token comes from max(0, p - q) normalised), whose output distribution is exactly p. Every
// pass ends with one token of the target's own (the correction, or the one after k accepted).
//
// The KV caches need no copy to roll back: positions are explicit in every call and attention at position i reads
// positions 0..i only, so the rejected positions are never read and the next pass writes over them.
#ifndef DJINN_SPEC_H
#define DJINN_SPEC_H

#include <stdint.h>

#include "engine.h"
#include "loader.h"
#include "sampler.h"
#include "tokenizer.h"

#define SPEC_K_MAX 32  // --draft-max's ceiling: a verification pass of 33 rows, one GPU logits chunk

typedef struct {
    int64_t k_max;  // most tokens drafted per target pass, 1..SPEC_K_MAX
    double p_min;   // drafting stops before a step whose most likely token has a draft probability (softmax of its
                    // raw logits) below p_min; 0: never. Decided before the draw, so the output stays exact.
} dj_spec_opts;

typedef struct {
    int64_t passes;    // the target's verification passes
    int64_t drafted;   // tokens the draft proposed
    int64_t accepted;  // of those, tokens the target kept
    int64_t produced;  // tokens the passes gave: accepted + one each
    int64_t draft_steps;       // the draft's forward calls (its prompt's prefill included)
    double draft_s, target_s;  // time in the draft's steps (prefill included) and in the verification passes
} dj_spec_stats;

// Refuses a draft whose tokens are not the target's: the vocabulary size, every token's text, BOS and the end
// tokens must agree (a draft of another tokenizer proposes ids that mean other text). draft_path names it.
int spec_check_pair(const dj_model *target, const dj_tokenizer *ttok, const dj_model *draft,
                    const dj_tokenizer *dtok, const char *draft_path, dj_err *e);

typedef struct dj_spec dj_spec;
// Over slot 0 of both engines (each max_seq >= ctx), a vocabulary of vocab. smp: the run's sampler (its generator makes the accept and
// resample draws); the draft samples with the same settings p from its own generator seeded with draft_seed. tok:
// the end tokens, after which nothing is drafted (NULL: none).
dj_spec *spec_new(dj_engine *target, dj_engine *draft, int64_t vocab, dj_sampler *smp, const dj_sampling *p,
                  uint64_t draft_seed, const dj_tokenizer *tok, int64_t ctx, const dj_spec_opts *o, dj_err *e);
void spec_free(dj_spec *sp);
// The prompt ids (n) through both engines; *next: the target's first token (-1: its logits held NaN or infinity).
int spec_prefill(dj_spec *sp, const int32_t *ids, int64_t n, int32_t *next, dj_err *e);
// The token at position n after ids[0..n-1], which must be the prompt and then the tokens this returned, in order:
// the next of the last pass's verified tokens, or else a new draft-and-verify round. want: how many more tokens the
// caller can take (>= 1; no more are drafted than it can use). *next -1: the target's logits held NaN or infinity.
int spec_next(dj_spec *sp, const int32_t *ids, int64_t n, int64_t want, int32_t *next, dj_err *e);
void spec_stats(const dj_spec *sp, dj_spec_stats *st);

// The sampled verification rule alone. d (k) drafted tokens, q (k, vocab) the draft distributions they were drawn
// from, p (k+1, vocab) the target's distributions at the same positions (overwritten: a rejected row becomes its
// residual). Draws come from smp's generator. out (k+1): the tokens that stand, the accepted drafts then the
// target's own; returns their count, 1..k+1.
int64_t spec_verify(const int32_t *d, const float *q, float *p, int64_t k, int64_t vocab, dj_sampler *smp,
                    int32_t *out);

#endif
