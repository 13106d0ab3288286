// test_engine.c: the engine's KV slots (engine.h), with stories260K converted here, on the CPU engine and on the
// GPU engine (resident, and streamed with a CPU share): a batched decode step gives each row the logits of that
// sequence run alone, slots do not see each other, and a slot parked to host memory and restored (into another
// slot) continues as if it had stayed.
//
// Tolerance, CPU: none, in each KV type (f32, f16, q8). The CPU engine computes each row of a batch with the same
// dot products, in the same order, as a pass of that one token (cpu_matmul sums each output over its inputs alone;
// attention is per row, a row's keys stored the same way whichever pass wrote them), so the batched logits must
// equal the lone ones bit for bit; a parked cache is a copy of the cache's bytes. GPU: a lone decode
// step runs the GEMV (q8/q4: in integers, x quantized per group) and a batch the tensor-core matmul (x rounded to
// f16), so rows agree to the kernels' accuracy: relative L2 per row 1e-4 in f32, 1e-2 in q4 and q8 (the GPU tests'
// own tolerances against the CPU: test_gpu.c).
#include <criterion/criterion.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../convert/convert.h"
#include "../engine.h"
#include "../gpu_host.h"
#include "../loader.h"
#include "common.h"

#define TE_CTX 192

// The engine under test: the CPU's, or the GPU's with the model in `dtype`, resident or streamed with a CPU share.
typedef struct {
    int gpu, dtype, streamed;
    double tol;  // per row relative L2 (0: bitwise)
    int kv;      // the KV type (kvtype.h)
} te_kind;
static te_kind K = {0, DJ_F32, 0, 0, DJ_KV_F32};

static void te_gpu(int dtype, int streamed, double tol) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (GPU tests run on the GPU machine)");
    K = (te_kind){1, dtype, streamed, tol, DJ_KV_F32};
}
static void te_cpu_kv(int kv) { K = (te_kind){0, DJ_F32, 0, 0, kv}; }
static void te_gpu_kv(int dtype, int streamed, double tol, int kv) {
    te_gpu(dtype, streamed, tol);
    K.kv = kv;
}

// stories260K converted in a fresh folder, loaded for the engine under test.
static void te_load(dj_model *m) {
    tc_load_stories(m, K.dtype, K.gpu);
}

static volatile sig_atomic_t te_cut;  // the engines' Ctrl-C flag (dj_gpu_opts.cancel)

static void te_open(dj_engine *eng, const dj_model *m, int32_t slots) {
    // streamed: every layer through a ring of the smallest size, a third of each matrix's rows on the CPU in steps
    dj_gpu_opts go = {.max_seq = TE_CTX, .quiet = 1, .stream_all = K.streamed, .cpu_share = K.streamed ? 0.3 : 0,
                      .kv_type = K.kv, .cancel = &te_cut};
    dj_err e;
    cr_assert_eq(engine_open(eng, m, &go, slots, &e), 0, "%s", e.msg);
    cr_assert_eq(eng->n_slots, slots);
    cr_assert_eq(eng->is_gpu, K.gpu);
    cr_assert_eq(eng->kv_type, K.kv);
    cr_assert(eng->step_rows && eng->park && eng->restore && eng->drop, "the %s engine lacks a slot entry point",
              eng->name);
}

// A decode step of n sequences, one row each, every row's logits (n, vocab): step_rows wanting all its rows.
static int te_step(dj_engine *eng, int n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                   float *logits, dj_err *e) {
    int32_t want[64];
    cr_assert_leq(n, 64);
    for (int r = 0; r < n; r++) want[r] = r;
    return eng->step_rows(eng->ctx, n, slots, pos, tokens, n, want, logits, e);
}

// n random token ids (BOS first, as a prompt would start).
static int32_t *te_tokens(const dj_model *m, int64_t n) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = i ? (int32_t)(3 + tc_below(m->info.config.vocab_size - 3)) : 1;
    return t;
}

static void te_same(const float *got, const float *want, int64_t V, const char *what, int seq, int step) {
    if (K.tol > 0) {
        double d = 0, w = 0;
        for (int64_t i = 0; i < V; i++) d += (double)(got[i] - want[i]) * (got[i] - want[i]), w += (double)want[i] * want[i];
        cr_assert(d <= K.tol * K.tol * w, "%s: sequence %d, step %d: relative L2 %.3e from alone, over %.1e (seed %llu)",
                  what, seq, step, sqrt(d / w), K.tol, (unsigned long long)tc_seed_used());
        return;
    }
    for (int64_t i = 0; i < V; i++)
        cr_assert(got[i] == want[i], "%s: sequence %d, step %d, logit %ld: %.9g, alone %.9g (seed %llu)", what, seq,
                  step, (long)i, got[i], want[i], (unsigned long long)tc_seed_used());
}

// One sequence alone in a 1-slot engine: its prompt, then `steps` tokens fed in turn (the greedy pick of each row);
// want (steps + 1, V): the logits after the prompt and after each fed token; fed (steps): the tokens.
static void te_alone(const dj_model *m, const int32_t *prompt, int64_t n, int steps, float *want, int32_t *fed) {
    dj_engine eng;
    te_open(&eng, m, 1);
    int64_t V = m->info.config.vocab_size;
    dj_err e;
    cr_assert_eq(eng.forward(eng.ctx, 0, prompt, n, 0, want, 0, &e), 0, "%s", e.msg);
    for (int s = 0; s < steps; s++) {
        fed[s] = dj_argmax(want + s * V, V);
        cr_assert_eq(eng.forward(eng.ctx, 0, &fed[s], 1, n + s, want + (s + 1) * V, 0, &e), 0, "%s", e.msg);
    }
    engine_close(&eng);
}

// B sequences of different lengths, prefilled into slots in a shuffled order, then decoded together: every step's
// rows are the lone runs' logits. Sequences leave the batch as they reach their number of steps, so B shrinks; 37
// sequences cross the CPU engine's 32-row pass.
static void te_batch_case(int B) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size;
    int32_t *slot = malloc(B * sizeof *slot), *steps = malloc(B * sizeof *steps);
    int64_t *len = malloc(B * sizeof *len);
    int32_t **prompt = malloc(B * sizeof *prompt), **fed = malloc(B * sizeof *fed);
    float **want = malloc(B * sizeof *want);
    for (int b = 0; b < B; b++) slot[b] = b;
    for (int b = B - 1; b > 0; b--) {  // a shuffle: sequence b in slot[b]
        int k = (int)tc_below((uint32_t)b + 1);
        int32_t t = slot[b];
        slot[b] = slot[k], slot[k] = t;
    }
    int max_steps = 0;
    for (int b = 0; b < B; b++) {
        len[b] = 1 + tc_below(40);
        steps[b] = 1 + (int32_t)tc_below(8);
        if (steps[b] > max_steps) max_steps = steps[b];
        prompt[b] = te_tokens(&m, len[b]);
        want[b] = malloc((size_t)(steps[b] + 1) * V * sizeof(float));
        fed[b] = malloc((size_t)steps[b] * sizeof(int32_t));
        te_alone(&m, prompt[b], len[b], steps[b], want[b], fed[b]);
    }
    dj_engine eng;
    te_open(&eng, &m, B);
    dj_err e;
    float *lg = malloc((size_t)B * V * sizeof(float));
    for (int b = 0; b < B; b++) {
        cr_assert_eq(eng.forward(eng.ctx, slot[b], prompt[b], len[b], 0, lg, 0, &e), 0, "%s", e.msg);
        te_same(lg, want[b], V, "prefill in its slot", b, 0);
    }
    int32_t *bs = malloc(B * sizeof *bs), *bt = malloc(B * sizeof *bt), *who = malloc(B * sizeof *who);
    int64_t *bp = malloc(B * sizeof *bp);
    for (int s = 0; s < max_steps; s++) {
        int n = 0;
        for (int b = 0; b < B; b++)
            if (s < steps[b]) bs[n] = slot[b], bp[n] = len[b] + s, bt[n] = fed[b][s], who[n++] = b;
        cr_assert_eq(te_step(&eng, n, bs, bp, bt, lg, &e), 0, "%s", e.msg);
        for (int r = 0; r < n; r++)
            te_same(lg + (size_t)r * V, want[who[r]] + (size_t)(s + 1) * V, V, "batched step", who[r], s + 1);
    }
    engine_close(&eng);
    for (int b = 0; b < B; b++) free(prompt[b]), free(want[b]), free(fed[b]);
    free(slot), free(steps), free(len), free(prompt), free(fed), free(want), free(lg), free(bs), free(bt), free(who);
    free(bp);
    model_free(&m);
}


// Continuous batching's passes (step_rows): sequences joining at different turns, their prompts in chunks of 1 to
// 16 rows beside the others' decode tokens, the segments of a pass in a shuffled order; the logits after each
// prompt and after each fed token are those of the sequence alone.
static void te_rows_case(int K) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size;
    int64_t len[8], done[8] = {0};
    int32_t steps[8], step[8] = {0}, start[8], *prompt[8], *fed[8];
    float *want[8];
    for (int k = 0; k < K; k++) {
        len[k] = 1 + tc_below(40), steps[k] = 1 + (int32_t)tc_below(6), start[k] = (int32_t)tc_below(6);
        prompt[k] = te_tokens(&m, len[k]);
        want[k] = malloc((size_t)(steps[k] + 1) * V * sizeof(float));
        fed[k] = malloc((size_t)steps[k] * sizeof(int32_t));
        te_alone(&m, prompt[k], len[k], steps[k], want[k], fed[k]);
    }
    dj_engine eng;
    te_open(&eng, &m, K);
    dj_err e;
    int32_t slots[8 * 17], toks[8 * 17], wrow[8], wseq[8], order[8];
    int64_t pos[8 * 17];
    float *lg = malloc((size_t)K * V * sizeof(float));
    for (int t = 0, busy = 1; busy; t++) {
        busy = 0;
        for (int k = 0; k < K; k++) order[k] = k;
        for (int k = K - 1; k > 0; k--) {
            int r = (int)tc_below((uint32_t)k + 1), x = order[k];
            order[k] = order[r], order[r] = x;
        }
        int64_t n = 0;
        int nw = 0;
        for (int i = 0; i < K; i++) {
            int k = order[i];
            if (step[k] == steps[k]) continue;
            busy = 1;
            if (t < start[k]) continue;
            if (done[k] < len[k]) {  // a chunk of its prompt
                int64_t take = 1 + tc_below(16);
                if (take > len[k] - done[k]) take = len[k] - done[k];
                for (int64_t j = 0; j < take; j++)
                    slots[n] = k, pos[n] = done[k] + j, toks[n] = prompt[k][done[k] + j], n++;
                done[k] += take;
                if (done[k] == len[k]) wrow[nw] = (int32_t)n - 1, wseq[nw++] = k;
            } else {  // its next fed token
                slots[n] = k, pos[n] = len[k] + step[k], toks[n] = fed[k][step[k]], n++;
                wrow[nw] = (int32_t)n - 1, wseq[nw++] = k;
            }
        }
        if (!n) continue;
        cr_assert_eq(eng.step_rows(eng.ctx, n, slots, pos, toks, nw, wrow, lg, &e), 0, "%s", e.msg);
        for (int w = 0; w < nw; w++) {
            int k = wseq[w];
            int s = pos[wrow[w]] == len[k] - 1 ? 0 : ++step[k];  // the prompt's last row, or a fed token's
            te_same(lg + (size_t)w * V, want[k] + (size_t)s * V, V, s ? "a decode row of a mixed pass" :
                    "a prompt's last row in a mixed pass", k, s);
        }
    }
    engine_close(&eng);
    for (int k = 0; k < K; k++) free(prompt[k]), free(want[k]), free(fed[k]);
    free(lg);
    model_free(&m);
}

// A sequence decoding in slot 0 while another one is prefilled, decoded and overwritten in slot 1 between its
// steps: slot 0's logits are those of the sequence alone.
static void te_slots_independent(void) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size, n = 20;
    const int steps = 6;
    int32_t *a = te_tokens(&m, n), *other = te_tokens(&m, 150), fed[6];
    float *want = malloc((size_t)(steps + 1) * V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
    te_alone(&m, a, n, steps, want, fed);
    dj_engine eng;
    te_open(&eng, &m, 2);
    dj_err e;
    cr_assert_eq(eng.forward(eng.ctx, 0, a, n, 0, lg, 0, &e), 0, "%s", e.msg);
    te_same(lg, want, V, "slot 0 after its prompt", 0, 0);
    for (int s = 0; s < steps; s++) {
        int64_t o = 10 + 20 * s;  // slot 1: a longer run each time, from position 0 again (overwritten)
        cr_assert_eq(eng.forward(eng.ctx, 1, other + s, o, 0, NULL, 0, &e), 0, "%s", e.msg);
        int32_t slot = 0;
        int64_t pos = n + s;
        cr_assert_eq(te_step(&eng, 1, &slot, &pos, &fed[s], lg, &e), 0, "%s", e.msg);
        te_same(lg, want + (size_t)(s + 1) * V, V, "slot 0 beside a busy slot 1", 0, s + 1);
    }
    engine_close(&eng);
    free(a), free(other), free(want), free(lg);
    model_free(&m);
}

// A sequence's prompt and first steps in slot 0, its cache parked, slot 0 taken over by another sequence, the
// parked cache restored into slot 2: the rest of its decode is bitwise the uninterrupted one, and the sequence that
// took slot 0 goes on undisturbed by the restore.
static void te_park_restore(void) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size, n = 33, nb = 17;
    const int steps = 8, before = 3;
    int32_t *a = te_tokens(&m, n), *b = te_tokens(&m, nb), fed[8], fed_b[8];
    float *want = malloc((size_t)(steps + 1) * V * sizeof(float)), *want_b = malloc((size_t)(steps + 1) * V * sizeof(float));
    float *lg = malloc((size_t)2 * V * sizeof(float));
    te_alone(&m, a, n, steps, want, fed);
    te_alone(&m, b, nb, steps, want_b, fed_b);
    dj_engine eng;
    te_open(&eng, &m, 3);
    dj_err e;
    cr_assert_eq(eng.forward(eng.ctx, 0, a, n, 0, lg, 0, &e), 0, "%s", e.msg);
    int32_t slot = 0;
    int64_t pos;
    for (int s = 0; s < before; s++) {
        pos = n + s;
        cr_assert_eq(te_step(&eng, 1, &slot, &pos, &fed[s], lg, &e), 0, "%s", e.msg);
    }
    dj_parked *p = eng.park(eng.ctx, 0, n + before, &e);
    cr_assert(p, "%s", e.msg);
    dj_parked *empty = eng.park(eng.ctx, 1, 0, &e);  // nothing to keep is a valid park too
    cr_assert(empty, "%s", e.msg);
    eng.drop(eng.ctx, empty);
    cr_assert_eq(eng.forward(eng.ctx, 0, b, nb, 0, lg, 0, &e), 0, "%s", e.msg);  // slot 0 is b's now
    te_same(lg, want_b, V, "the sequence that took the slot", 1, 0);
    cr_assert_eq(eng.restore(eng.ctx, p, 2, &e), 0, "%s", e.msg);
    for (int s = before; s < steps; s++) {  // both decode together: a in slot 2, b in slot 0
        int32_t sl[2] = {2, 0}, tk[2] = {fed[s], fed_b[s - before]};
        int64_t ps[2] = {n + s, nb + s - before};
        cr_assert_eq(te_step(&eng, 2, sl, ps, tk, lg, &e), 0, "%s", e.msg);
        te_same(lg, want + (size_t)(s + 1) * V, V, "restored into slot 2", 0, s + 1);
        te_same(lg + V, want_b + (size_t)(s - before + 1) * V, V, "beside the restored one", 1, s - before + 1);
    }
    engine_close(&eng);
    free(a), free(b), free(want), free(want_b), free(lg);
    model_free(&m);
}

// Slots, positions and tokens out of range, a slot twice in one step, a park longer than the context: refused
// with a message, nothing written; a failed restore keeps the parked cache.
static void te_refusals(void) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size;
    dj_engine eng;
    te_open(&eng, &m, 2);
    dj_err e;
    float *lg = malloc((size_t)3 * V * sizeof(float));
    int32_t tok[3] = {1, 5, 7};
    cr_assert_eq(eng.forward(eng.ctx, 2, tok, 1, 0, lg, 0, &e), -1);
    cr_assert(strstr(e.msg, "slot 2 does not exist"), "%s", e.msg);
    cr_assert_eq(eng.forward(eng.ctx, -1, tok, 1, 0, lg, 0, &e), -1);
    int32_t twice[3] = {1, 0, 1}, ok[2] = {0, 1}, bad_tok[2] = {1, (int32_t)V};
    int64_t pos[3] = {0, 0, 0}, far[2] = {0, TE_CTX};
    cr_assert_eq(te_step(&eng, 3, twice, pos, tok, lg, &e), -1);  // not adjacent: a slot twice, not a run
    cr_assert(strstr(e.msg, "twice"), "%s", e.msg);
    cr_assert_eq(te_step(&eng, 2, ok, far, tok, lg, &e), -1);
    cr_assert(strstr(e.msg, "outside the context"), "%s", e.msg);
    cr_assert_eq(te_step(&eng, 2, ok, pos, bad_tok, lg, &e), -1);
    cr_assert(strstr(e.msg, "out of range"), "%s", e.msg);
    cr_assert_eq(te_step(&eng, 2, ok, pos, tok, lg, &e), 0, "%s", e.msg);
    cr_assert_null(eng.park(eng.ctx, 0, TE_CTX + 1, &e));
    cr_assert_null(eng.park(eng.ctx, 5, 1, &e));
    dj_parked *p = eng.park(eng.ctx, 0, 1, &e);
    cr_assert(p, "%s", e.msg);
    cr_assert_eq(eng.restore(eng.ctx, p, 7, &e), -1);
    cr_assert_eq(eng.restore(eng.ctx, p, 1, &e), 0, "the parked cache was lost by the failed restore: %s", e.msg);
    engine_close(&eng);
    free(lg);
    model_free(&m);
}

// Ctrl-C's flag (dj_gpu_opts.cancel): set, a prompt's pass stops with "interrupted" (the GPU before its pass, the
// CPU before its next layer); cleared, the same prompt run again gives bitwise a fresh engine's logits (a cut pass
// leaves nothing the positions' rerun does not overwrite); an engine's set-up with the flag set stops too.
static void te_cut_pass(void) {
    dj_model m;
    te_load(&m);
    const int64_t V = m.info.config.vocab_size, n = 40;
    int32_t *tok = te_tokens(&m, n);
    float *lg = malloc((size_t)V * sizeof(float)), *fresh = malloc((size_t)V * sizeof(float));
    dj_engine eng;
    dj_err e;
    te_cut = 0;
    te_open(&eng, &m, 1);
    cr_assert_eq(eng.forward(eng.ctx, 0, tok, n, 0, fresh, 0, &e), 0, "%s", e.msg);
    engine_close(&eng);
    te_open(&eng, &m, 1);
    te_cut = 1;
    cr_assert_eq(eng.forward(eng.ctx, 0, tok, n, 0, lg, 0, &e), -1, "a pass ran through Ctrl-C");
    cr_assert(strstr(e.msg, "interrupted"), "%s", e.msg);
    te_cut = 0;
    cr_assert_eq(eng.forward(eng.ctx, 0, tok, n, 0, lg, 0, &e), 0, "%s", e.msg);
    cr_assert_eq(memcmp(lg, fresh, (size_t)V * sizeof(float)), 0, "the rerun after a cut pass differs");
    engine_close(&eng);
    te_cut = 1;  // Ctrl-C before the set-up: the GPU's stops before its first copy (the CPU's has no long set-up)
    dj_gpu_opts go = {.max_seq = TE_CTX, .quiet = 1, .kv_type = K.kv, .cancel = &te_cut};
    int rc = engine_open(&eng, &m, &go, 1, &e);
    te_cut = 0;
    if (K.gpu) cr_assert(rc == -1 && strstr(e.msg, "interrupted"), "the GPU's set-up ran through Ctrl-C: %d", rc);
    engine_close(&eng);
    free(tok), free(lg), free(fresh);
    model_free(&m);
}

// step_rows_pick (the GPU engine's; the CPU engine has none): 70 sequences' next tokens, greedy and sampled rows
// mixed, two chunks of the head's rows: the ids the host's rule draws from step_rows's logits with the same draws,
// bit for bit; a row whose sampler has a penalty on is refused by name.
static void te_rows_pick(void) {
    dj_model m;
    te_load(&m);
    const int B = 70;
    const int64_t V = m.info.config.vocab_size;
    dj_engine eng;
    dj_err e;
    te_open(&eng, &m, B);
    if (!K.gpu) {
        cr_expect(eng.step_rows_pick == NULL, "the CPU engine picks on the host");
        engine_close(&eng), model_free(&m);
        return;
    }
    int32_t slots[70], toks[70], want[70], host[70], dev[70];
    int64_t pos[70];
    dj_pick_args args[70];
    dj_sampler *smp[70];
    float *lg = malloc((size_t)B * V * sizeof(float));
    cr_assert(lg);
    for (int b = 0; b < B; b++) {
        const int64_t n = 1 + tc_below(20);
        int32_t *p = te_tokens(&m, n);
        cr_assert_eq(eng.forward(eng.ctx, b, p, n, 0, NULL, 0, &e), 0, "%s", e.msg);
        free(p);
        slots[b] = b, pos[b] = n, toks[b] = 3 + (int32_t)tc_below((uint32_t)V - 3), want[b] = b;
        smp[b] = sampler_new(V, b % 3 ? 0.8 : 0.0, b % 2 ? 0.9 : 1.0, 1000 + (uint64_t)b, &e);
        cr_assert(smp[b], "%s", e.msg);
        sampler_step_args(smp[b], &args[b]);
    }
    cr_assert_eq(eng.step_rows(eng.ctx, B, slots, pos, toks, B, want, lg, &e), 0, "%s", e.msg);
    for (int b = 0; b < B; b++) host[b] = sampler_pick_u(smp[b], lg + (size_t)b * V, args[b].u);
    // the same rows again (they write the same keys): the picks on the device
    cr_assert_eq(eng.step_rows_pick(eng.ctx, B, slots, pos, toks, B, want, args, dev, &e), 0, "%s", e.msg);
    for (int b = 0; b < B; b++)
        cr_expect_eq(dev[b], host[b], "row %d (temp %.1f): picked %d on the device, %d on the host", b, args[b].temp,
                     dev[b], host[b]);
    args[5].penalize = 1;
    cr_expect_neq(eng.step_rows_pick(eng.ctx, B, slots, pos, toks, B, want, args, dev, &e), 0, "a penalty went by");
    cr_expect(strstr(e.msg, "penalty"), "%s", e.msg);
    for (int b = 0; b < B; b++) sampler_free(smp[b]);
    free(lg);
    engine_close(&eng);
    model_free(&m);
}

// Each case on each engine: the CPU's (bitwise) with each KV type, the GPU's in f32 resident, in q4 streamed with a
// CPU share (its lone steps split with the CPU, its batches not), in f16 resident, and in q4 (an f16 KV cache) and q8
// resident (their passes of more rows than the GEMV takes, up to 64, with both norms inside the register kernel's x
// layout: gpu_norm_qgemm; their lone steps with them inside the GEMV).
#define TE_TEST(suite, setup, name, call)                                            \
    Test(suite, name) {                                                              \
        setup;                                                                       \
        tc_rng_fresh(#suite "." #name);                                              \
        call;                                                                        \
    }
#define TE_CASES(suite, setup)                                                       \
    TE_TEST(suite, setup, step_batch_equals_each_sequence_alone, te_batch_case(5))   \
    TE_TEST(suite, setup, step_batch_over_32_rows, te_batch_case(37))                \
    TE_TEST(suite, setup, slots_are_independent, te_slots_independent())             \
    TE_TEST(suite, setup, park_and_restore_continue, te_park_restore())              \
    TE_TEST(suite, setup, mixed_passes_equal_each_sequence_alone, te_rows_case(7))   \
    Test(suite, refuses_bad_slots_and_rows) {                                        \
        setup;                                                                       \
        te_refusals();                                                               \
    }                                                                                \
    TE_TEST(suite, setup, ctrl_c_cuts_a_pass, te_cut_pass())                         \
    TE_TEST(suite, setup, rows_pick_as_the_host_samples, te_rows_pick())

TE_CASES(engine, (void)0)
TE_CASES(engine_kv_f16, te_cpu_kv(DJ_KV_F16))
TE_CASES(engine_kv_q8, te_cpu_kv(DJ_KV_Q8))
TE_CASES(engine_gpu_f32, te_gpu(DJ_F32, 0, 1e-4))
TE_CASES(engine_gpu_q4_streamed, te_gpu(DJ_Q4, 1, 1e-2))
TE_CASES(engine_gpu_f16, te_gpu(DJ_F16, 0, 2e-3))
TE_CASES(engine_gpu_q4_kv_f16, te_gpu_kv(DJ_Q4, 0, 1e-2, DJ_KV_F16))
TE_CASES(engine_gpu_q8, te_gpu(DJ_Q8, 0, 1e-2))
// a q8 cache: a batch's k differs from a lone step's by the matmuls' rounding, and a row element that lands on the
// other side of a q8 step moves by max|row| / 127: 1.7e-4 seen on the H200 with the FMA decode kernel, 1.05e-3 and
// 3.6e-3 (two seeds) with the tensor-core one (its own rounding moves other elements across), so 1e-2, the q8
// cache's tolerance against HF (check_default_tol); a row read from the wrong slot or position is O(1) off
TE_CASES(engine_gpu_f32_streamed_kv_q8, te_gpu_kv(DJ_F32, 1, 1e-2, DJ_KV_Q8))

// A step_rows call refused after it computed a run's logits (the next slot's rows are not at consecutive positions)
// frees everything it allocated: the heap's bytes in use (glibc's mallinfo2, the calling thread's arena) are what
// they were before it. CPU engine: its step_rows allocates the run's logits on the host.
Test(engine, refused_rows_free_their_buffers) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size;
    dj_engine eng;
    te_open(&eng, &m, 2);
    dj_err e;
    float *lg = malloc((size_t)2 * V * sizeof(float));
    // slot 0's run of three with its first and last rows wanted (every row's logits computed, then copied out)
    int32_t slots[5] = {0, 0, 0, 1, 1}, tok[5] = {1, 5, 7, 1, 9}, want[2] = {0, 2};
    int64_t good[5] = {0, 1, 2, 0, 1}, gap[5] = {0, 1, 2, 0, 2};
    cr_assert_eq(eng.step_rows(eng.ctx, 5, slots, good, tok, 2, want, lg, &e), 0, "%s", e.msg);  // pool, tables
    size_t before = mallinfo2().uordblks;
    cr_assert_eq(eng.step_rows(eng.ctx, 5, slots, gap, tok, 2, want, lg, &e), -1);
    size_t after = mallinfo2().uordblks;
    cr_assert(strstr(e.msg, "not consecutive"), "%s", e.msg);
    cr_assert_leq(after, before, "the refused call left %zu bytes allocated", after - before);
    engine_close(&eng);
    free(lg);
    model_free(&m);
}

// ---- the KV types (kvtype.h) on the CPU engine
// One run of n tokens (BOS first) in a fresh 1-slot engine of KV type kv: logits (n, vocab) of every position.
static void te_run_kv(const dj_model *m, int kv, const int32_t *tok, int64_t n, float *logits) {
    K.kv = kv;
    dj_engine eng;
    te_open(&eng, m, 1);
    dj_err e;
    cr_assert_eq(eng.forward(eng.ctx, 0, tok, n, 0, logits, 1, &e), 0, "%s", e.msg);
    engine_close(&eng);
    K.kv = DJ_KV_F32;
}

// f16 and q8 caches give logits near f32's at every position, yet not f32's (the cache really holds the type):
// relative L2 per position under 5e-3 (f16) and 0.15 (q8), far below a broken cache's ~1; the worst of 150 random
// tokens' positions on stories260K, over 30 seeds: f16 2.1e-3, q8 6.1e-2.
Test(engine, kv_types_near_f32) {
    tc_rng_fresh("engine.kv_types_near_f32");
    dj_model m;
    te_load(&m);
    const int64_t V = m.info.config.vocab_size, n = 150;
    const double bound[DJ_KV_TYPES] = {0, 5e-3, 0.15};
    int32_t *tok = te_tokens(&m, n);
    float *ref = malloc((size_t)(n * V) * sizeof(float)), *got = malloc((size_t)(n * V) * sizeof(float));
    te_run_kv(&m, DJ_KV_F32, tok, n, ref);
    for (int kv = DJ_KV_F16; kv < DJ_KV_TYPES; kv++) {
        te_run_kv(&m, kv, tok, n, got);
        double worst = 0;
        int64_t at = 0;
        for (int64_t t = 0; t < n; t++) {
            double d = tc_rel_l2(got + t * V, ref + t * V, V);
            if (d > worst) worst = d, at = t;
        }
        cr_log_info("%s KV: worst relative L2 from f32 %.3e (position %ld)", dj_kv_name(kv), worst, (long)at);
        cr_assert(worst <= bound[kv], "%s KV: position %ld relative L2 %.3e from f32's, over %.0e (seed %llu)",
                  dj_kv_name(kv), (long)at, worst, bound[kv], (unsigned long long)tc_seed_used());
        cr_assert_gt(worst, 0, "%s KV: logits equal f32's at every position: the cache is not stored in %s",
                     dj_kv_name(kv), dj_kv_name(kv));
    }
    free(tok), free(ref), free(got);
    model_free(&m);
}

// A CPU engine's KV slots take max_seq * engine_kv_pos_bytes(its type) each: the heap's bytes in use (glibc's
// mallinfo2, this thread's arena and its mmapped blocks) grow by that much less for f16 and q8 than for f32.
Test(engine, kv_types_take_less_memory) {
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("under AddressSanitizer: its allocator is not glibc's, so mallinfo2 cannot see the cache's bytes");
#endif
    dj_model m;
    te_load(&m);
    const int64_t ctx = 4096;
    const int32_t slots = 2;
    int64_t grew[DJ_KV_TYPES];
    for (int kv = 0; kv < DJ_KV_TYPES; kv++) {
        dj_gpu_opts go = {.max_seq = ctx, .quiet = 1, .kv_type = kv};
        dj_engine eng;
        dj_err e;
        struct mallinfo2 a = mallinfo2();
        cr_assert_eq(engine_open(&eng, &m, &go, slots, &e), 0, "%s", e.msg);
        struct mallinfo2 b = mallinfo2();
        grew[kv] = (int64_t)(b.uordblks + b.hblkhd) - (int64_t)(a.uordblks + a.hblkhd);
        engine_close(&eng);
    }
    const uint64_t f32 = engine_kv_pos_bytes(&m.info.config, DJ_KV_F32);
    for (int kv = DJ_KV_F16; kv < DJ_KV_TYPES; kv++) {
        int64_t saved = grew[DJ_KV_F32] - grew[kv],
                want = slots * ctx * (int64_t)(f32 - engine_kv_pos_bytes(&m.info.config, kv));
        cr_assert(saved >= want - 65536 && saved <= want + 65536,
                  "%s KV: %ld bytes allocated, f32's %ld: %ld fewer, %ld expected", dj_kv_name(kv), (long)grew[kv],
                  (long)grew[DJ_KV_F32], (long)saved, (long)want);
    }
    model_free(&m);
}
