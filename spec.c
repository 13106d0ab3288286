// spec.c: speculative decoding (spec.h): the draft's check against the target, then rounds of draft-and-verify
// over the two engines' slot 0.
#include "spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- the pair
int spec_check_pair(const dj_model *target, const dj_tokenizer *ttok, const dj_model *draft,
                    const dj_tokenizer *dtok, const char *draft_path, dj_err *e) {
    uint32_t tv = target->info.config.vocab_size, dv = draft->info.config.vocab_size;
    if (tv != dv)
        return dj_fail(e, "--draft %s: a vocabulary of %u tokens, the target's has %u: the draft must share the "
                          "target's tokenizer", draft_path, dv, tv);
    int32_t n = tok_vocab_size(ttok);
    if (tok_vocab_size(dtok) != n)
        return dj_fail(e, "--draft %s: its tokenizer has %d tokens, the target's %d: not the same tokenizer",
                       draft_path, tok_vocab_size(dtok), n);
    for (int32_t id = 0; id < n; id++) {
        size_t la, lb;
        const char *a = tok_piece(ttok, id, &la), *b = tok_piece(dtok, id, &lb);
        if (!a != !b || la != lb || (a && memcmp(a, b, la)))
            return dj_fail(e, "--draft %s: token %d is '%.*s' in the draft and '%.*s' in the target: not the same "
                              "tokenizer", draft_path, id, b ? (int)lb : 0, b ? b : "", a ? (int)la : 0, a ? a : "");
    }
    size_t ne, nd;
    const int32_t *te = tok_eos_ids(ttok, &ne), *de = tok_eos_ids(dtok, &nd);
    if (tok_bos(ttok) != tok_bos(dtok) || ne != nd || (ne && memcmp(te, de, ne * sizeof *te)))
        return dj_fail(e, "--draft %s: its BOS or end tokens differ from the target's: not the same tokenizer",
                       draft_path);
    return 0;
}

// ---- the verification rule
// One drafted position: d, drawn from q, stands with probability min(1, p(d)/q(d)); else the token is drawn from
// max(0, p - q) normalised (p becomes it), or p's top when rounding left that empty.
static int32_t verify_one(int32_t d, const float *q, float *p, int64_t vocab, int32_t top, dj_sampler *smp) {
    float u = sampler_uniform(smp);
    if (u * q[d] < p[d]) return d;  // u < p/q, without dividing by a zero q
    for (int64_t i = 0; i < vocab; i++) p[i] = p[i] > q[i] ? p[i] - q[i] : 0.0f;
    int32_t t = dj_draw(p, vocab, sampler_uniform(smp));
    return t < 0 ? top : t;
}

// Drafts d (k) against the rows p: returns how many stood, j; when j < k, out[j] is the token drawn in d[j]'s place.
static int64_t drafts_stand(const int32_t *d, const float *q, float *p, int64_t k, int64_t vocab, dj_sampler *smp,
                            int32_t *out) {
    for (int64_t j = 0; j < k; j++) {
        float *pj = p + j * vocab;
        out[j] = verify_one(d[j], q + j * vocab, pj, vocab, dj_argmax(pj, vocab), smp);
        if (out[j] != d[j]) return j;
    }
    return k;
}

int64_t spec_verify(const int32_t *d, const float *q, float *p, int64_t k, int64_t vocab, dj_sampler *smp,
                    int32_t *out) {
    int64_t j = drafts_stand(d, q, p, k, vocab, smp, out);
    if (j < k) return j + 1;
    int32_t t = dj_draw(p + k * vocab, vocab, sampler_uniform(smp));  // all stood: the target's next, from p
    out[k] = t < 0 ? dj_argmax(p + k * vocab, vocab) : t;
    return k + 1;
}

// ---- the rounds
struct dj_spec {
    dj_engine *tgt, *dft;
    dj_sampler *smp, *dsmp;  // the run's sampler; the draft's (same settings, its own generator)
    const dj_tokenizer *tok;
    dj_spec_opts o;
    int64_t vocab, ctx;
    int greedy;
    int32_t *seq;      // (ctx + SPEC_K_MAX + 1): the context, then the tokens drafted after it
    int64_t seq_n;     // seq's first seq_n tokens are the caller's ids
    int64_t tn, dn;    // the target's and the draft's KV caches hold seq's first tn, dn tokens
    float *dlogits;    // (vocab): the draft's last row
    float *q;          // (SPEC_K_MAX, vocab): the draft's distributions (sampled runs)
    float *tlogits;    // (SPEC_K_MAX + 2, vocab): the verification pass's rows
    float *p;          // (SPEC_K_MAX + 1, vocab): the target's distributions (sampled runs)
    int32_t out[SPEC_K_MAX + 1];  // the last pass's tokens, for positions base..base+n_out-1
    int64_t base, n_out;
    dj_spec_stats st;
};

void spec_free(dj_spec *sp) {
    if (!sp) return;
    sampler_free(sp->dsmp);
    free(sp->seq), free(sp->dlogits), free(sp->q), free(sp->tlogits), free(sp->p);
    free(sp);
}

dj_spec *spec_new(dj_engine *target, dj_engine *draft, int64_t vocab, dj_sampler *smp, const dj_sampling *p,
                  uint64_t draft_seed, const dj_tokenizer *tok, int64_t ctx, const dj_spec_opts *o, dj_err *e) {
    if (o->k_max < 1 || o->k_max > SPEC_K_MAX || !(o->p_min >= 0 && o->p_min <= 1)) {
        dj_fail(e, "speculative decoding: %lld tokens drafted a pass (1..%d), confidence %g (0..1)",
                (long long)o->k_max, SPEC_K_MAX, o->p_min);
        return NULL;
    }
    if (target->max_seq < ctx || draft->max_seq < ctx) {
        dj_fail(e, "speculative decoding: engines of %lld and %lld positions for a context of %lld",
                (long long)target->max_seq, (long long)draft->max_seq, (long long)ctx);
        return NULL;
    }
    dj_spec *sp = calloc(1, sizeof *sp);
    if (!sp) {
        dj_fail(e, "out of memory");
        return NULL;
    }
    *sp = (dj_spec){.tgt = target, .dft = draft, .smp = smp, .tok = tok, .o = *o, .vocab = vocab, .ctx = ctx,
                    .greedy = sampler_is_greedy(smp)};
    size_t V = (size_t)sp->vocab;
    if (!(sp->dsmp = sampler_new_with(sp->vocab, p, draft_seed, e))) {
        free(sp);
        return NULL;
    }
    sp->seq = malloc((size_t)(ctx + SPEC_K_MAX + 1) * sizeof *sp->seq);
    sp->dlogits = malloc(V * sizeof(float));
    sp->tlogits = malloc((SPEC_K_MAX + 2) * V * sizeof(float));
    if (!sp->greedy) {
        sp->q = malloc(SPEC_K_MAX * V * sizeof(float));
        sp->p = malloc((SPEC_K_MAX + 1) * V * sizeof(float));
    }
    if (!sp->seq || !sp->dlogits || !sp->tlogits || (!sp->greedy && (!sp->q || !sp->p))) {
        spec_free(sp);
        dj_fail(e, "out of memory for speculative decoding (vocabulary %zu)", V);
        return NULL;
    }
    return sp;
}

void spec_stats(const dj_spec *sp, dj_spec_stats *st) { *st = sp->st; }

// The draft's probability of its most likely token: the softmax of its raw logits (vocab).
static double top_prob(const float *z, int64_t vocab) {
    float m = z[dj_argmax(z, vocab)];
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += exp((double)z[i] - m);
    return sum > 0 ? 1.0 / sum : 0;
}

// The draft's step: tokens (T) at positions pos.., its last row into dlogits.
static int draft_forward(dj_spec *sp, const int32_t *tokens, int64_t T, int64_t pos, dj_err *e) {
    double t0 = dj_now();
    int rc = sp->dft->forward(sp->dft->ctx, 0, tokens, T, pos, sp->dlogits, 0, e);
    sp->st.draft_s += dj_now() - t0, sp->st.draft_steps++;
    if (!rc) sp->dn = pos + T;
    return rc;
}

int spec_prefill(dj_spec *sp, const int32_t *ids, int64_t n, int32_t *next, dj_err *e) {
    if (n < 1 || n > sp->ctx) return dj_fail(e, "speculative decoding: a prompt of %lld tokens", (long long)n);
    memcpy(sp->seq, ids, (size_t)n * sizeof *ids);
    sp->seq_n = n, sp->tn = sp->dn = 0, sp->n_out = 0;
    if (engine_next(sp->tgt, sp->smp, 0, ids, n, 0, sp->tlogits, next, e)) return -1;
    sp->tn = n;
    return draft_forward(sp, ids, n, 0, e);
}

// Up to k tokens drafted after seq[0..n-1] into seq[n..]; returns how many (q: their distributions when sampled).
// The draft first catches up on the context it has not seen (the last token, and one more after a full run).
static int64_t draft_run(dj_spec *sp, int64_t n, int64_t k, dj_err *e) {
    if (k == 0) return 0;
    if (sp->dn < n && draft_forward(sp, sp->seq + sp->dn, n - sp->dn, sp->dn, e)) return -1;
    int64_t V = sp->vocab, i = 0;
    while (i < k) {
        if (sp->o.p_min > 0 && top_prob(sp->dlogits, V) < sp->o.p_min) break;  // before the draw: exactness kept
        sampler_history(sp->dsmp, sp->seq, n + i);
        int32_t d = sp->greedy ? sampler_pick_u(sp->dsmp, sp->dlogits, 0.0f)
                               : sampler_probs(sp->dsmp, sp->dlogits, sp->q + i * V);
        if (d < 0) break;  // the draft's logits overflowed: the target goes on alone
        if (!sp->greedy) d = dj_draw(sp->q + i * V, V, sampler_uniform(sp->dsmp));
        sp->seq[n + i++] = d;
        if (i == k || (sp->tok && tok_is_eos(sp->tok, d))) break;  // nothing follows an end token
        if (draft_forward(sp, &d, 1, n + i - 1, e)) return -1;
    }
    sp->st.drafted += i;
    return i;
}

// One round after seq[0..n-1]: k drafted, one target pass over the last context token and them, the tokens that
// stand into out (for positions n..).
static int round_run(dj_spec *sp, int64_t n, int64_t want, dj_err *e) {
    int64_t V = sp->vocab, k = sp->o.k_max;
    if (k > sp->ctx - n) k = sp->ctx - n;  // the pass's last position, n - 1 + k, inside the context
    if (k > want - 1) k = want - 1;        // the pass gives up to k + 1 tokens
    if (k < 0) k = 0;
    k = draft_run(sp, n, k, e);
    if (k < 0) return -1;
    // The target: the tokens its cache lacks (the last accepted one) and the k drafted, every row's logits.
    int64_t T = n + k - sp->tn, lead = n - 1 - sp->tn;  // lead: rows before the last accepted token (none after a pass)
    double t0 = dj_now();
    if (T > SPEC_K_MAX + 2) return dj_fail(e, "speculative decoding: a verification pass of %lld rows", (long long)T);
    if (sp->tgt->forward(sp->tgt->ctx, 0, sp->seq + sp->tn, T, sp->tn, sp->tlogits, 1, e)) return -1;
    sp->st.target_s += dj_now() - t0, sp->st.passes++;
    const float *rows = sp->tlogits + lead * V;  // row j: the target after seq[n - 1 + j]
    // Each row's rule sees the penalties' window of its own prefix; the window is put back at the end.
    int64_t got = 0;
    if (sp->greedy) {
        for (int64_t j = 0; j <= k; j++) {
            sampler_history(sp->smp, sp->seq, n + j);
            int32_t t = sampler_pick_u(sp->smp, rows + j * V, 0.0f);
            sp->out[got++] = t;
            if (j == k || t != sp->seq[n + j]) break;
        }
    } else {
        int64_t rows_ok = 0;  // rows with a distribution: a NaN row ends them, its token -1
        for (; rows_ok <= k; rows_ok++) {
            sampler_history(sp->smp, sp->seq, n + rows_ok);
            if (sampler_probs(sp->smp, rows + rows_ok * V, sp->p + rows_ok * V) < 0) break;
        }
        if (rows_ok == k + 1) {
            got = spec_verify(sp->seq + n, sp->q, sp->p, k, V, sp->smp, sp->out);
        } else {  // every draft before the NaN row may stand; that row's token is -1
            got = drafts_stand(sp->seq + n, sp->q, sp->p, rows_ok, V, sp->smp, sp->out) + 1;
            if (got == rows_ok + 1) sp->out[rows_ok] = -1;
        }
    }
    sampler_history(sp->smp, sp->seq, n);
    // The caches hold seq up to the last standing draft; the positions after it are written over by the next pass.
    sp->tn = n + got - 1;
    if (sp->dn > n + got - 1) sp->dn = n + got - 1;
    sp->base = n, sp->n_out = got;
    sp->st.accepted += got - 1, sp->st.produced += got;
    return 0;
}

int spec_next(dj_spec *sp, const int32_t *ids, int64_t n, int64_t want, int32_t *next, dj_err *e) {
    if (n < sp->seq_n || n > sp->ctx || want < 1)
        return dj_fail(e, "speculative decoding: position %lld after %lld known (context %lld, %lld wanted)",
                       (long long)n, (long long)sp->seq_n, (long long)sp->ctx, (long long)want);
    memcpy(sp->seq + sp->seq_n, ids + sp->seq_n, (size_t)(n - sp->seq_n) * sizeof *ids);
    sp->seq_n = n;
    if (n > sp->base && n < sp->base + sp->n_out) {  // the last pass's tokens: the caller took them in order
        *next = sp->out[n - sp->base];
        return 0;
    }
    if (round_run(sp, n, want, e)) return -1;
    *next = sp->out[0];
    return 0;
}
