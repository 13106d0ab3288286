// test_tp_gpu.c: the engine on several GPUs (tp_engine.c) against the engine on one, with stories260K. Two parts of
// the model on one device stand in for two devices (engine_open's gpus {0, 0}): every line of the split runs, the
// all-reduce included (its "peer" reads then stay on one device), but for the head's split by vocab rows, which
// needs devices of their own (tt_split_is); the two-GPU machine runs the same tests with gpus {0, 1}, the split in.
// Tolerance: relative L2 of each row's logits against one GPU's. The split adds wo's and w_down's outputs in partial
// sums (each GPU's columns, then the sum in GPU order) where one GPU sums them whole, so only the order of additions
// differs: f32 weights 1e-5 (seen on the H200: 3.5e-7 on 2 GPUs, 4.2e-7 on 4; the CPU reference
// of the same split 1e-7 to 4e-7, test_tp.c); f16, bf16, q8 and q4 2e-3, as their matmuls round x to f16 and a sum
// one f32 ulp apart may round to the next f16 (2^-11 of the value; seen 1.3e-4 to 4.5e-4 in f16, up to 4e-4 in q4).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../convert/convert.h"
#include "../engine.h"
#include "../gpu_host.h"
#include "../loader.h"
#include "../probe.h"
#include "../sampler.h"
#include "../tp.h"
#include "common.h"

#define TT_CTX 96

static void tt_need_gpu(void) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (GPU tests run on the GPU machine)");
}

// The two "GPUs" of a test: devices 0 and 1 where there are two, else device 0 twice.
static void tt_gpus(dj_gpu_opts *go, int n) {
    go->n_gpus = n;
    for (int r = 0; r < n; r++) go->gpus[r] = gpu_count() > r ? r : 0;
}

// cpu_share: dj_gpu_opts' (0: off)
static void tt_open_share(dj_engine *eng, const dj_model *m, int n_gpus, int stream_all, int32_t slots,
                          double cpu_share) {
    dj_gpu_opts go = {.max_seq = TT_CTX, .quiet = 1, .stream_all = stream_all, .cpu_share = cpu_share};
    if (n_gpus > 1) tt_gpus(&go, n_gpus);
    dj_err e = {{0}};
    cr_assert_eq(engine_open(eng, m, &go, slots, &e), 0, "%d GPUs: %s", n_gpus, e.msg);
}
static void tt_open(dj_engine *eng, const dj_model *m, int n_gpus, int stream_all, int32_t slots) {
    tt_open_share(eng, m, n_gpus, stream_all, slots, 0);
}

// Logits (T + nd rows): a prompt of T tokens (every row's), then nd decode steps, each on the last one's greedy token.
static float *tt_run(dj_engine *eng, const dj_model *m, const int32_t *prompt, int64_t T, int64_t nd, int32_t *toks) {
    int64_t V = m->info.config.vocab_size;
    float *out = malloc((size_t)((T + nd) * V) * 4);
    dj_err e = {{0}};
    cr_assert_eq(eng->forward(eng->ctx, 0, prompt, T, 0, out, 1, &e), 0, "%s", e.msg);
    for (int64_t i = 0; i < nd; i++) {
        int32_t best = dj_argmax(out + (T + i - 1) * V, V);
        toks[i] = best;
        cr_assert_eq(eng->forward(eng->ctx, 0, &best, 1, T + i, out + (T + i) * V, 0, &e), 0, "%s", e.msg);
    }
    return out;
}

// Whether the engine on n GPUs splits the head by vocab rows (each GPU its rows' logits, gathered on GPU 0): where
// the head can run wholly on the GPU (`can`: no CPU share on it) and the GPUs are devices of their own (tt_gpus: the
// two-GPU machine's 0 and 1); parts sharing a device keep the whole head on GPU 0.
static void tt_split_is(const dj_engine *eng, int n, int can, const char *what) {
    dj_gpu_stats st;
    cr_assert(engine_gpu_stats(eng, &st));
    const int want = can && gpu_count() >= n;
    cr_assert_eq(st.head_split, want, "%s: the head %s by vocab rows", what, want ? "does not split" : "splits");
}

static int32_t *tt_prompt(const dj_model *m, int64_t n) {
    int32_t *t = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) t[i] = i ? (int32_t)(3 + tc_below(m->info.config.vocab_size - 3)) : 1;
    return t;
}

// Every row of got within tol of ref's; the worst returned.
static double tt_tol(int dtype) { return dtype == DJ_F32 ? 1e-5 : 2e-3; }
static double tt_close(const float *got, const float *ref, int64_t rows, int64_t V, double tol, const char *what) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double d = tc_rel_l2(got + r * V, ref + r * V, V);
        cr_assert(d <= tol, "%s: row %lld's logits %.3e from one GPU's, over %.0e (seed %llu)", what, (long long)r, d,
                  tol, (unsigned long long)tc_seed_used());
        if (d > worst) worst = d;
    }
    return worst;
}

// Prefill and greedy decode on 2 (and 4: stories260K has 4 kv heads; f32 and f16 only, q8 and q4 cut wo's columns
// at 32) GPUs against one, in every dtype: the logits within the tolerance, the greedy tokens the same. On two
// devices the head splits: the prompt's 70 rows take two chunks of the head (64 and 6 rows, each gathered), the
// decode steps one row (in the step's graph); a greedy pick (the graph, then the pick on GPU 0) gives the logits'
// argmax, and a step that wants no output (no head on any GPU) leaves the next one's logits as they were.
Test(tp_gpu, logits_match_one_gpu) {
    tt_need_gpu();
    tc_rng_fresh("tp_gpu.logits_match_one_gpu");
    const int dtypes[] = {DJ_F32, DJ_F16, DJ_Q8, DJ_Q4};
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        dj_model m;
        tc_load_stories(&m, dtypes[d], 1);
        int64_t T = 70, nd = 24, V = m.info.config.vocab_size;
        int32_t *prompt = tt_prompt(&m, T), t1[24], tn[24];
        dj_engine one;
        tt_open(&one, &m, 1, 0, 1);
        float *ref = tt_run(&one, &m, prompt, T, nd, t1);
        engine_close(&one);
        for (int n = 2; n <= 4; n += 2) {
            if (n == 4 && dj_is_quant(dtypes[d])) continue;
            dj_engine tp;
            tt_open(&tp, &m, n, 0, 1);
            float *got = tt_run(&tp, &m, prompt, T, nd, tn);
            char what[64];
            snprintf(what, sizeof what, "%s on %d GPUs", dj_dtype_name(dtypes[d]), n);
            double worst = tt_close(got, ref, T + nd, V, tt_tol(dtypes[d]), what);
            cr_assert_eq(memcmp(tn, t1, sizeof t1), 0, "%s: the greedy tokens differ from one GPU's", what);
            tt_split_is(&tp, n, 1, what);
            // the last step again (its KV rows the same), picking greedily on the GPU
            const dj_pick_args greedy = {.temp = 0, .repeat_penalty = 1};
            const float *last = got + (T + nd - 1) * V;
            int32_t next = -1;
            const int32_t best = dj_argmax(last, V);
            dj_err e = {{0}};
            cr_assert_eq(tp.pick(tp.ctx, 0, &tn[nd - 1], 1, T + nd - 1, &greedy, NULL, &next, &e), 0, "%s", e.msg);
            cr_assert_eq(next, best, "%s: the greedy pick %d, the logits' argmax %d", what, next, best);
            // the step once more wanting nothing (no GPU runs the head: none may gather), then its logits: the same
            float *again = malloc((size_t)V * 4);
            cr_assert_eq(tp.forward(tp.ctx, 0, &tn[nd - 1], 1, T + nd - 1, NULL, 0, &e), 0, "%s", e.msg);
            cr_assert_eq(tp.forward(tp.ctx, 0, &tn[nd - 1], 1, T + nd - 1, again, 0, &e), 0, "%s", e.msg);
            cr_assert_eq(memcmp(again, last, (size_t)V * 4), 0, "%s: a step after one without output differs", what);
            free(again);
            fprintf(stderr, "tp_gpu: %s: worst row %.2e from one GPU's logits\n", what, worst);
            engine_close(&tp);
            free(got);
        }
        free(ref), free(prompt);
        model_free(&m);
    }
}

// Every layer streamed through each GPU's ring (its own part over its own link) gives the resident split's logits
// bit for bit, as one GPU's streaming does; with no CPU share the streamed head splits by vocab rows too.
Test(tp_gpu, streamed_bitwise_equal_to_resident) {
    tt_need_gpu();
    tc_rng_fresh("tp_gpu.streamed_bitwise_equal_to_resident");
    dj_model m;
    tc_load_stories(&m, DJ_Q4, 1);
    int64_t T = 30, nd = 8, V = m.info.config.vocab_size;
    int32_t *prompt = tt_prompt(&m, T), ta[8], tb[8];
    dj_engine res, str;
    tt_open(&res, &m, 2, 0, 1);
    float *ref = tt_run(&res, &m, prompt, T, nd, ta);
    tt_split_is(&res, 2, 1, "q4 resident on 2 GPUs");
    engine_close(&res);
    tt_open(&str, &m, 2, 1, 1);
    float *got = tt_run(&str, &m, prompt, T, nd, tb);
    dj_gpu_stats st;
    cr_assert(engine_gpu_stats(&str, &st));
    cr_assert_gt(st.n_streamed, 0, "--stream-all streamed nothing");
    tt_split_is(&str, 2, 1, "q4 streamed on 2 GPUs");
    engine_close(&str);
    cr_assert_eq(memcmp(got, ref, (size_t)((T + nd) * V) * 4), 0, "streamed logits differ from resident ones");
    free(ref), free(got), free(prompt);
    model_free(&m);
}

// The batched step on 2 GPUs: three sequences' rows in one pass, against one GPU's same step; the picking step's
// greedy ids are the argmax of the logits step's rows, the second time (the step's graph captured: the head's
// gather of 3 rows in it) and the third (the graph replayed).
Test(tp_gpu, step_rows_match_one_gpu) {
    tt_need_gpu();
    tc_rng_fresh("tp_gpu.step_rows_match_one_gpu");
    dj_model m;
    tc_load_stories(&m, DJ_Q8, 1);
    int64_t V = m.info.config.vocab_size, P = 12;
    enum { N = 3 };
    int32_t *prompt[N], slots[N] = {0, 1, 2}, tokens[N], want[N] = {0, 1, 2};
    int64_t pos[N];
    for (int i = 0; i < N; i++) prompt[i] = tt_prompt(&m, P + i), pos[i] = P + i, tokens[i] = 5 + 7 * i;
    float *out[2];
    dj_err e = {{0}};
    for (int k = 0; k < 2; k++) {
        dj_engine eng;
        tt_open(&eng, &m, k ? 2 : 1, 0, N);
        for (int i = 0; i < N; i++)
            cr_assert_eq(eng.forward(eng.ctx, i, prompt[i], P + i, 0, NULL, 0, &e), 0, "%s", e.msg);
        out[k] = malloc((size_t)(N * V) * 4);
        cr_assert_eq(eng.step_rows(eng.ctx, N, slots, pos, tokens, N, want, out[k], &e), 0, "%s", e.msg);
        if (k) {  // the same step again, picking: the KV rows it writes are the same ones
            dj_pick_args a[N] = {{.temp = 0, .repeat_penalty = 1}, {.temp = 0, .repeat_penalty = 1},
                                 {.temp = 0, .repeat_penalty = 1}};
            int32_t next[N];
            for (int again = 0; again < 2; again++) {
                cr_assert_eq(eng.step_rows_pick(eng.ctx, N, slots, pos, tokens, N, want, a, next, &e), 0, "%s",
                             e.msg);
                for (int i = 0; i < N; i++) {
                    const int32_t best = dj_argmax(out[k] + i * V, V);
                    cr_assert_eq(next[i], best, "pick %d, row %d: picked %d, the logits' greedy token is %d", again, i,
                                 next[i], best);
                }
            }
            tt_split_is(&eng, 2, 1, "q8 step on 2 GPUs");
        }
        engine_close(&eng);
    }
    tt_close(out[1], out[0], N, V, tt_tol(DJ_Q8), "q8 step of 3 rows on 2 GPUs");
    for (int i = 0; i < N; i++) free(prompt[i]);
    free(out[0]), free(out[1]);
    model_free(&m);
}

// The CPU share on 2 GPUs: every layer streamed through each GPU's ring, the CPU computing half of each GPU's
// streamed matrices on that GPU's own threads (cpu_pool_new: the GPUs' jobs run at once), against one GPU all
// resident and unshared. The 70-row prompt takes no share (passes over 64 rows) and matches to the split's
// tolerance; the decode steps add the CPU's order of additions (1e-5 in f32, the CPU share's own bound on one GPU,
// test_gpu.c; q4's int8 parts of x 5e-4 there) to the split's: 2e-5 in f32, 2e-3 in q4. The greedy tokens agree.
// The head streams and the CPU may take part of it, so GPU 0 computes it whole (no split by vocab rows).
Test(tp_gpu, cpu_share_matches_one_gpu) {
    tt_need_gpu();
    tc_rng_fresh("tp_gpu.cpu_share_matches_one_gpu");
    const int dtypes[] = {DJ_F32, DJ_Q4};
    for (int d = 0; d < 2; d++) {
        dj_model m;
        tc_load_stories(&m, dtypes[d], 1);
        int64_t T = 70, nd = 12, V = m.info.config.vocab_size;
        int32_t *prompt = tt_prompt(&m, T), t1[12], tn[12];
        dj_engine one, two;
        tt_open(&one, &m, 1, 0, 1);
        float *ref = tt_run(&one, &m, prompt, T, nd, t1);
        engine_close(&one);
        tt_open_share(&two, &m, 2, 1, 1, 0.5);
        float *got = tt_run(&two, &m, prompt, T, nd, tn);
        dj_gpu_stats st;
        cr_assert(engine_gpu_stats(&two, &st));
        cr_assert(st.cpu_bytes_per_token > 0 && st.cpu_bytes > 0, "%s: the CPU computed no rows (%llu bytes a token)",
                  dj_dtype_name(dtypes[d]), (unsigned long long)st.cpu_bytes_per_token);
        tt_split_is(&two, 2, 0, "a CPU share on 2 GPUs");
        engine_close(&two);
        char what[64];
        snprintf(what, sizeof what, "%s prompt on 2 GPUs, CPU share 0.5", dj_dtype_name(dtypes[d]));
        tt_close(got, ref, T, V, tt_tol(dtypes[d]), what);
        snprintf(what, sizeof what, "%s decode on 2 GPUs, CPU share 0.5", dj_dtype_name(dtypes[d]));
        double worst = tt_close(got + T * V, ref + T * V, nd, V, dtypes[d] == DJ_F32 ? 2e-5 : 2e-3, what);
        cr_assert_eq(memcmp(tn, t1, sizeof t1), 0, "%s: the greedy tokens differ from one GPU's", what);
        fprintf(stderr, "tp_gpu: %s: worst decode row %.2e from one GPU's logits, %.1f%% of the streamed bytes on "
                        "the CPU\n", what, worst, 100 * st.cpu_share);
        free(ref), free(got), free(prompt);
        model_free(&m);
    }
}

// Probes on 2 GPUs (each GPU holds the whole residual stream; GPU 0 fills the breakpoints' rows): a control vector
// after layer 1 with a tap reading positions 5-14 after layer 0, then the vector with a tap writing positions 20-24
// after layer 2 (a slot has one tap), against one GPU with the same probes: the logits and the read rows within the
// split's tolerance (f32: 1e-5), every tapped row counted once. And a zero vector leaves the two GPUs' logits
// bitwise as they are without a probe.
static dj_probe *tt_probe(const dj_model *m, const float *vec, float *read, const float *write) {
    dj_err e = {{0}};
    dj_probe *p = probe_new(&m->info.config, &e);
    cr_assert(p, "%s", e.msg);
    cr_assert_eq(probe_add_vector(p, 1, vec, 0.7, &e), 0, "%s", e.msg);
    if (read) cr_assert_eq(probe_tap(p, 0, 0, 5, 10, 0, read, &e), 0, "%s", e.msg);
    if (write) cr_assert_eq(probe_tap(p, 0, 2, 20, 5, 1, (float *)write, &e), 0, "%s", e.msg);
    return p;
}
Test(tp_gpu, probes_match_one_gpu) {
    tt_need_gpu();
    tc_rng_fresh("tp_gpu.probes_match_one_gpu");
    dj_model m;
    tc_load_stories(&m, DJ_F32, 1);
    const int64_t T = 40, nd = 8, V = m.info.config.vocab_size, dim = m.info.config.dim;
    int32_t *prompt = tt_prompt(&m, T), t1[8], t2[8], tw[2][8];
    float *vec = malloc((size_t)dim * 4), *zero = calloc((size_t)dim, 4), *write = malloc((size_t)(5 * dim) * 4);
    float *read[2] = {malloc((size_t)(10 * dim) * 4), malloc((size_t)(10 * dim) * 4)}, *out[2], *outw[2];
    for (int64_t i = 0; i < dim; i++) vec[i] = tc_unif() - 0.5f;
    for (int64_t i = 0; i < 5 * dim; i++) write[i] = 2 * tc_unif() - 1;
    dj_err e = {{0}};
    for (int k = 0; k < 2; k++) {
        dj_engine eng;
        tt_open(&eng, &m, k ? 2 : 1, 0, 1);
        for (int w = 0; w < 2; w++) {  // the reading tap, then the writing one
            dj_probe *p = tt_probe(&m, vec, w ? NULL : read[k], w ? write : NULL);
            cr_assert_eq(eng.set_probe(eng.ctx, p, &e), 0, "%d GPUs: %s", k + 1, e.msg);
            float *o = tt_run(&eng, &m, prompt, T, nd, w ? tw[k] : k ? t2 : t1);
            if (w) outw[k] = o;
            else out[k] = o;
            cr_assert_eq(probe_untap(p, 0), w ? 5 : 10, "%d GPUs: the %s tap's rows not each counted once", k + 1,
                         w ? "writing" : "reading");
            cr_assert_eq(eng.set_probe(eng.ctx, NULL, &e), 0, "%s", e.msg);
            probe_free(p);
        }
        engine_close(&eng);
    }
    tt_close(out[1], out[0], T + nd, V, tt_tol(DJ_F32), "probed f32 on 2 GPUs");
    tt_close(read[1], read[0], 10, dim, tt_tol(DJ_F32), "a breakpoint's rows on 2 GPUs");
    tt_close(outw[1], outw[0], T + nd, V, tt_tol(DJ_F32), "rows written on 2 GPUs");
    cr_assert_eq(memcmp(t1, t2, sizeof t1), 0, "probed: the greedy tokens differ from one GPU's");
    cr_assert_eq(memcmp(tw[0], tw[1], sizeof t1), 0, "rows written: the greedy tokens differ from one GPU's");
    // a zero vector on 2 GPUs: bitwise the unprobed 2 GPUs' logits
    float *plain, *zeroed;
    dj_engine eng;
    tt_open(&eng, &m, 2, 0, 1);
    plain = tt_run(&eng, &m, prompt, T, nd, t1);
    dj_probe *p = probe_new(&m.info.config, &e);
    cr_assert(p && probe_add_vector(p, 1, zero, 1.0, &e) == 0, "%s", e.msg);
    cr_assert_eq(eng.set_probe(eng.ctx, p, &e), 0, "%s", e.msg);
    zeroed = tt_run(&eng, &m, prompt, T, nd, t2);
    cr_assert_eq(memcmp(plain, zeroed, (size_t)((T + nd) * V) * 4), 0, "a zero vector changed 2 GPUs' logits");
    cr_assert_eq(eng.set_probe(eng.ctx, NULL, &e), 0, "%s", e.msg);
    engine_close(&eng);
    probe_free(p);
    free(plain), free(zeroed), free(out[0]), free(out[1]), free(outw[0]), free(outw[1]), free(read[0]), free(read[1]);
    free(vec), free(zero), free(write), free(prompt);
    model_free(&m);
}

// What the split cannot do is refused by name: more GPUs than kv heads, a device that does not exist.
Test(tp_gpu, refusals) {
    tt_need_gpu();
    dj_model m;
    tc_load_stories(&m, DJ_F32, 1);
    dj_engine eng;
    dj_err e = {{0}};
    dj_gpu_opts go = {.max_seq = TT_CTX, .quiet = 1};
    tt_gpus(&go, 5);
    cr_assert_eq(engine_open(&eng, &m, &go, 1, &e), -1);
    cr_assert(strstr(e.msg, "at most 4 GPUs"), "%s", e.msg);
    tt_gpus(&go, 2);
    go.gpus[1] = 97;
    cr_assert_eq(engine_open(&eng, &m, &go, 1, &e), -1);
    cr_assert(strstr(e.msg, "97"), "the error does not name the missing device: %s", e.msg);
    model_free(&m);
}

// ---- against HF
// tests/ref's references (HF in float64) teacher-forced through the split engine on 2 GPUs: within the tolerance
// --check gives one GPU (check_default_tol), for stories260K in every dtype and each fixture in its own and q4
// (tied_gqa_f16's 16-dim heads cannot be cut at q4's 32 columns of wo: tp_plan refuses that, test_tp.c).
static void tt_load_fixture(dj_model *m, const char *name, int dtype) {
    char tok[4096], src[4300], out[4300];
    tc_data_path(tok, sizeof tok, "models/stories260K");
    snprintf(src, sizeof src, "%s/fixtures/%s", tc_tests_dir(), name);
    char *dir = tc_tmpdir("tp_gpu");
    snprintf(out, sizeof out, "%s/m.bin", dir);
    convert_opts co = {.hf_dir = src, .out_path = out, .tok_dir = tok, .dtype = dtype, .quiet = 1};
    dj_err e = {{0}};
    cr_assert_eq(convert_run(&co, &e), 0, "%s", e.msg);
    dj_load_opts lo = {.quiet = 1, .want_pinned = 1};
    cr_assert_eq(model_load(out, &lo, m, &e), 0, "%s", e.msg);
    tc_rm_rf(dir);
    free(dir);
}

Test(tp_gpu, hf_references) {
    tt_need_gpu();
    static const struct {
        const char *name;  // tests/ref/NAME.bin; a fixture unless stories260K
        int dtype;         // -1: as stored
    } cases[] = {{"stories260K", DJ_F32}, {"stories260K", DJ_F16}, {"stories260K", DJ_Q8}, {"stories260K", DJ_Q4},
                 {"llama3_gqa_bf16", -1}, {"llama3_gqa_bf16", DJ_Q4}, {"mha_untied_f16", -1},
                 {"mha_untied_f16", DJ_Q4}, {"tied_gqa_f16", -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/ref/%s.bin", tc_tests_dir(), cases[i].name);
        dj_ref r;
        dj_err e = {{0}};
        cr_assert_eq(ref_load(path, &r, &e), 0, "%s", e.msg);
        dj_model m;
        if (!strcmp(cases[i].name, "stories260K")) tc_load_stories(&m, cases[i].dtype, 1);
        else tt_load_fixture(&m, cases[i].name, cases[i].dtype);
        const uint32_t wt = m.info.config.wtype;
        dj_gpu_opts go = {.max_seq = r.n_tokens, .quiet = 1};
        tt_gpus(&go, 2);
        dj_engine eng;
        cr_assert_eq(engine_open(&eng, &m, &go, 1, &e), 0, "%s %s: %s", cases[i].name, dj_dtype_name(wt), e.msg);
        tt_split_is(&eng, 2, 1, cases[i].name);
        float *lg = malloc((size_t)r.n_tokens * r.vocab * sizeof(float));
        cr_assert_eq(eng.forward(eng.ctx, 0, r.ids, r.n_tokens, 0, lg, 1, &e), 0, "%s", e.msg);
        dj_check ck;
        const char *measure;
        double v = tc_check(&r, lg, wt, DJ_KV_F32, &ck, &measure), tol = check_default_tol(1, wt, DJ_KV_F32);
        fprintf(stderr, "tp_gpu: %s %s on 2 GPUs against HF: %s %.3e (tolerance %.1e)\n", cases[i].name,
                dj_dtype_name(wt), measure, v, tol);
        cr_assert(v <= tol, "%s %s on 2 GPUs: %s %.3e from HF, over %.1e", cases[i].name, dj_dtype_name(wt), measure,
                  v, tol);
        engine_close(&eng);
        free(lg);
        ref_free(&r);
        model_free(&m);
    }
}

// ---- parking
// A slot parked on 2 GPUs: parked_kv gathers every kv head into engine.h's layout (one GPU's within the split's
// rounding: a head misplaced is O(1) off), and restoring it (after parked_kv: the gathered copy scattered back)
// into another slot continues bit for bit as the slot it came from.
Test(tp_gpu, parking_gathers_and_restores) {
    tt_need_gpu();
    tc_rng_fresh("tp_gpu.parking_gathers_and_restores");
    dj_model m;
    tc_load_stories(&m, DJ_F32, 1);
    const int64_t P = 20, V = m.info.config.vocab_size;
    const uint64_t bytes = (uint64_t)P * engine_kv_pos_bytes(&m.info.config, DJ_KV_F32);
    int32_t *prompt = tt_prompt(&m, P), next = 7;
    float *kv[2], *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    dj_err e = {{0}};
    for (int k = 0; k < 2; k++) {
        dj_engine eng;
        tt_open(&eng, &m, k ? 2 : 1, 0, 2);
        cr_assert_eq(eng.forward(eng.ctx, 0, prompt, P, 0, NULL, 0, &e), 0, "%s", e.msg);
        dj_parked *pk = eng.park(eng.ctx, 0, P, &e);
        cr_assert(pk, "%s", e.msg);
        const void *host = eng.parked_kv(eng.ctx, pk, &e);
        cr_assert(host, "%s", e.msg);
        kv[k] = malloc(bytes);
        memcpy(kv[k], host, bytes);
        cr_assert_eq(eng.restore(eng.ctx, pk, 1, &e), 0, "%s", e.msg);
        cr_assert_eq(eng.forward(eng.ctx, 0, &next, 1, P, a, 0, &e), 0, "%s", e.msg);
        cr_assert_eq(eng.forward(eng.ctx, 1, &next, 1, P, b, 0, &e), 0, "%s", e.msg);
        cr_assert_eq(memcmp(a, b, (size_t)V * 4), 0, "%d GPU(s): the restored slot goes on otherwise", k ? 2 : 1);
        engine_close(&eng);
    }
    double d = tc_rel_l2(kv[1], kv[0], (int64_t)(bytes / 4));
    cr_assert(d <= 1e-5, "the parked cache on 2 GPUs is %.3e from one GPU's", d);
    free(kv[0]), free(kv[1]), free(a), free(b), free(prompt);
    model_free(&m);
}
