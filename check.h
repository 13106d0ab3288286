// check.h: measuring a model's logits: --check (a reference file of token ids and float64-derived logits from HF
// transformers, tools/reference.py, and the comparison against it) and --perplexity's log-likelihoods.
#ifndef DJINN_CHECK_H
#define DJINN_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "util.h"

// Reference file (little-endian), written by tools/reference.py:
//   char magic[8] "DJINNREF"; u32 version (1); u32 n_tokens; u32 n_prompt; u32 vocab;
//   i32 ids[n_tokens]; f32 logits[n_tokens][vocab]   (logits of every position, from HF in float64)
typedef struct {
    uint32_t n_tokens, n_prompt, vocab;
    int32_t *ids;    // (n_tokens)
    float *logits;   // (n_tokens, vocab)
} dj_ref;

int ref_load(const char *path, dj_ref *r, dj_err *e);
void ref_free(dj_ref *r);

// One position: max |difference|, relative L2 error, whether the top-1 tokens agree, KL(ref || got) of the
// softmaxes.
typedef struct {
    double max_abs, rel_l2, kl;
    int top1;
} dj_row_cmp;
dj_row_cmp compare_row(const float *ref, const float *got, int64_t n);

// Every position: a table row each on `out`, then the overall line; the worst relative L2 in *worst_rel (NaN when
// a logit is NaN).
typedef struct {
    double worst_abs, worst_rel, rel_l2, mean_kl, max_kl;
    int64_t agree, worst_pos;
} dj_check;
void check_logits(const dj_ref *r, const float *logits, FILE *out, dj_check *c);

// --perplexity: -log of the softmax of logits (vocab) at target, in double; NaN when a logit is not finite.
double check_nll(const float *logits, int64_t vocab, int32_t target);

// What --check holds to its tolerance: float weights in an f32 or f16 KV cache (kvtype.h), the worst relative L2
// (the same model in other arithmetic); q8 or q4 weights, or a q8 cache, the mean KL (a model whose weights or
// cache moved on purpose: how far its distributions moved). *name: which.
double check_measure(const dj_check *c, uint32_t wtype, int kv_type, const char **name);
// The default tolerance: float weights on the CPU (exact widening, f32 arithmetic) 1e-4; on the GPU, whose prefill
// rounds activations to the weight dtype, f32 1e-4, f16 5e-3, bf16 1e-2; an f16 KV cache adds 5e-3 to these; q8
// weights or a q8 cache 1e-2 and q4 weights 0.3 (mean KL: bounds that every reference model meets, far below what a
// broken kernel gives, ~log(vocab)). The KV types' figures: check.c.
double check_default_tol(int is_gpu, uint32_t wtype, int kv_type);

#endif
