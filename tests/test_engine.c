// test_engine.c: the engine's KV slots on the CPU engine (engine.h), with stories260K converted here: a batched
// decode step gives each row the logits of that sequence run alone, slots do not see each other, and a slot parked
// to host memory and restored (into another slot) continues bitwise as if it had stayed.
//
// Tolerance: none. The CPU engine computes each row of a batch with the same dot products, in the same order, as a
// pass of that one token (cpu_matmul sums each output over its inputs alone; attention is per row), so the batched
// logits must equal the lone ones bit for bit; a parked cache is a copy of the floats.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../convert/convert.h"
#include "../engine.h"
#include "../loader.h"
#include "common.h"

#define TE_CTX 192

// stories260K converted to f32 in a fresh folder, loaded for the CPU.
static void te_load(dj_model *m) {
    char stories[4096], out[4200];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    char *dir = tc_tmpdir("engine");
    snprintf(out, sizeof out, "%s/s.bin", dir);
    convert_opts co = {.hf_dir = stories, .out_path = out, .dtype = DJ_F32, .quiet = 1};
    dj_err e;
    cr_assert_eq(convert_run(&co, &e), 0, "%s", e.msg);
    dj_load_opts lo = {.quiet = 1};
    cr_assert_eq(model_load(out, &lo, m, &e), 0, "%s", e.msg);
    tc_rm_rf(dir);
    free(dir);
}

static void te_open(dj_engine *eng, const dj_model *m, int32_t slots) {
    dj_gpu_opts go = {.max_seq = TE_CTX};
    dj_err e;
    cr_assert_eq(engine_open(eng, m, &go, slots, &e), 0, "%s", e.msg);
    cr_assert_eq(eng->n_slots, slots);
    cr_assert(eng->step_batch && eng->park && eng->restore && eng->drop, "the CPU engine lacks a slot entry point");
}

// n random token ids (BOS first, as a prompt would start).
static int32_t *te_tokens(const dj_model *m, int64_t n) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = i ? (int32_t)(3 + tc_below(m->info.config.vocab_size - 3)) : 1;
    return t;
}

static void te_same(const float *got, const float *want, int64_t V, const char *what, int seq, int step) {
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
        cr_assert_eq(eng.step_batch(eng.ctx, n, bs, bp, bt, lg, &e), 0, "%s", e.msg);
        for (int r = 0; r < n; r++)
            te_same(lg + (size_t)r * V, want[who[r]] + (size_t)(s + 1) * V, V, "batched step", who[r], s + 1);
    }
    engine_close(&eng);
    for (int b = 0; b < B; b++) free(prompt[b]), free(want[b]), free(fed[b]);
    free(slot), free(steps), free(len), free(prompt), free(fed), free(want), free(lg), free(bs), free(bt), free(who);
    free(bp);
    model_free(&m);
}

Test(engine, step_batch_equals_each_sequence_alone) {
    tc_rng_fresh("engine.step_batch_equals_each_sequence_alone");
    te_batch_case(5);
}

Test(engine, step_batch_over_32_rows) {
    tc_rng_fresh("engine.step_batch_over_32_rows");
    te_batch_case(37);
}

// A sequence decoding in slot 0 while another one is prefilled, decoded and overwritten in slot 1 between its
// steps: slot 0's logits are those of the sequence alone.
Test(engine, slots_are_independent) {
    tc_rng_fresh("engine.slots_are_independent");
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
        cr_assert_eq(eng.step_batch(eng.ctx, 1, &slot, &pos, &fed[s], lg, &e), 0, "%s", e.msg);
        te_same(lg, want + (size_t)(s + 1) * V, V, "slot 0 beside a busy slot 1", 0, s + 1);
    }
    engine_close(&eng);
    free(a), free(other), free(want), free(lg);
    model_free(&m);
}

// A sequence's prompt and first steps in slot 0, its cache parked, slot 0 taken over by another sequence, the
// parked cache restored into slot 2: the rest of its decode is bitwise the uninterrupted one, and the sequence that
// took slot 0 goes on undisturbed by the restore.
Test(engine, park_and_restore_continue_bitwise) {
    tc_rng_fresh("engine.park_and_restore_continue_bitwise");
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
        cr_assert_eq(eng.step_batch(eng.ctx, 1, &slot, &pos, &fed[s], lg, &e), 0, "%s", e.msg);
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
        cr_assert_eq(eng.step_batch(eng.ctx, 2, sl, ps, tk, lg, &e), 0, "%s", e.msg);
        te_same(lg, want + (size_t)(s + 1) * V, V, "restored into slot 2", 0, s + 1);
        te_same(lg + V, want_b + (size_t)(s - before + 1) * V, V, "beside the restored one", 1, s - before + 1);
    }
    engine_close(&eng);
    free(a), free(b), free(want), free(want_b), free(lg);
    model_free(&m);
}

// Slots, positions and tokens out of range, a slot twice in one step, a park longer than the context: refused
// with a message, nothing written; a failed restore keeps the parked cache.
Test(engine, refuses_bad_slots_and_rows) {
    dj_model m;
    te_load(&m);
    int64_t V = m.info.config.vocab_size;
    dj_engine eng;
    te_open(&eng, &m, 2);
    dj_err e;
    float *lg = malloc((size_t)2 * V * sizeof(float));
    int32_t tok[2] = {1, 5};
    cr_assert_eq(eng.forward(eng.ctx, 2, tok, 1, 0, lg, 0, &e), -1);
    cr_assert(strstr(e.msg, "slot 2 does not exist"), "%s", e.msg);
    cr_assert_eq(eng.forward(eng.ctx, -1, tok, 1, 0, lg, 0, &e), -1);
    int32_t twice[2] = {1, 1}, ok[2] = {0, 1}, bad_tok[2] = {1, (int32_t)V};
    int64_t pos[2] = {0, 0}, far[2] = {0, TE_CTX};
    cr_assert_eq(eng.step_batch(eng.ctx, 2, twice, pos, tok, lg, &e), -1);
    cr_assert(strstr(e.msg, "twice"), "%s", e.msg);
    cr_assert_eq(eng.step_batch(eng.ctx, 2, ok, far, tok, lg, &e), -1);
    cr_assert(strstr(e.msg, "outside the context"), "%s", e.msg);
    cr_assert_eq(eng.step_batch(eng.ctx, 2, ok, pos, bad_tok, lg, &e), -1);
    cr_assert(strstr(e.msg, "out of range"), "%s", e.msg);
    cr_assert_eq(eng.step_batch(eng.ctx, 2, ok, pos, tok, lg, &e), 0, "%s", e.msg);
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
