// test_spec.c: speculative decoding (spec.h). The sampled rule against a Markov chain whose every sequence
// probability is known (a chi-square over all sequences, and the same test failing on the draft's own chain); then
// through the engines, on every reference model (stories260K and the three fixtures, which share its 512-token
// vocabulary): greedy tokens equal the plain path's with a draft that always disagrees (another model), one that
// often agrees (the target's q4 copy) and a perfect one (the target itself), penalties included; the rejected
// positions' KV never read; the context filling up, an end token, a stop string and Ctrl-C inside a drafted run,
// as the plain path does them (the CLI); refusals by name.
//
// Tolerance, CPU: none. The CPU engine computes each row of a pass with the same dot products in the same order as a
// pass of that token alone (test_engine.c), so a verification pass's rows are the decode steps' rows bit for bit
// and greedy tokens must be equal. GPU: a verification pass runs the multi-row matmuls and a decode step the GEMV,
// so the logits differ in summation order; tokens must be equal up to the first position where the plain run's two
// best logits are within 2% of their scale (a near tie either may break), and no earlier.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../convert/convert.h"
#include "../engine.h"
#include "../gpu_host.h"
#include "../loader.h"
#include "../spec.h"
#include "../tokenizer.h"
#include "common.h"

// ---- the rule: a Markov chain over V tokens
// The target's chain P and the draft's Q (rows: the previous token), sequences of L tokens after token 0. Every
// sequence's probability under P is a product of three entries; speculative sampling must produce exactly that.
enum { MV = 4, ML = 3, MK = 2 };
static const float P_chain[MV][MV] = {{0.5f, 0.2f, 0.3f, 0.0f}, {0.1f, 0.4f, 0.25f, 0.25f},
                                      {0.3f, 0.3f, 0.3f, 0.1f}, {0.25f, 0.25f, 0.25f, 0.25f}};
static const float Q_chain[MV][MV] = {{0.1f, 0.6f, 0.1f, 0.2f}, {0.7f, 0.1f, 0.1f, 0.1f},
                                      {0.0f, 0.5f, 0.2f, 0.3f}, {0.4f, 0.1f, 0.4f, 0.1f}};

static int32_t chain_draw(const float *row) {
    float u = tc_unif(), acc = 0;
    for (int32_t t = 0; t < MV; t++)
        if (row[t] > 0 && (acc += row[t]) > u) return t;
    for (int32_t t = MV - 1; t >= 0; t--)
        if (row[t] > 0) return t;
    return 0;
}

// Chi-square of counts (MV^ML cells, n draws) against P's sequence probabilities; a cell of probability 0 must be
// empty (else infinity).
static double chain_chi2(const int64_t *count, int64_t n) {
    double chi2 = 0;
    for (int c = 0; c < MV * MV * MV; c++) {
        int x0 = c / (MV * MV), x1 = c / MV % MV, x2 = c % MV;
        double pr = (double)P_chain[0][x0] * P_chain[x0][x1] * P_chain[x1][x2], ex = pr * (double)n;
        if (pr == 0) {
            if (count[c]) return INFINITY;
            continue;
        }
        chi2 += (count[c] - ex) * (count[c] - ex) / ex;
    }
    return chi2;
}

Test(spec, sampled_rule_gives_the_target_distribution) {
    uint64_t seed = tc_rng_fresh("spec.sampled_rule_gives_the_target_distribution");
    dj_err e;
    dj_sampler *u = sampler_new(MV, 1.0, 1.0, seed, &e);  // the accept and residual draws
    cr_assert(u, "%s", e.msg);
    enum { N = 200000 };
    static int64_t spec_count[MV * MV * MV], draft_count[MV * MV * MV];
    memset(spec_count, 0, sizeof spec_count), memset(draft_count, 0, sizeof draft_count);
    int64_t passes = 0, accepted = 0, drafted = 0;
    for (int s = 0; s < N; s++) {
        int32_t x[ML + MK + 1];
        int64_t n = 0;
        while (n < ML) {  // a round: k drafted from Q after the last token, verified against P's rows
            int64_t k = ML - n - 1 < MK ? ML - n - 1 : MK;
            int32_t d[MK], out[MK + 1], prev = n ? x[n - 1] : 0;
            float q[MK * MV], p[(MK + 1) * MV];
            for (int64_t j = 0; j <= k; j++) {
                int32_t pv = j ? d[j - 1] : prev;
                memcpy(p + j * MV, P_chain[pv], sizeof P_chain[pv]);
                if (j < k) memcpy(q + j * MV, Q_chain[pv], sizeof Q_chain[pv]), d[j] = chain_draw(Q_chain[pv]);
            }
            int64_t got = spec_verify(d, q, p, k, MV, u, out);
            cr_assert(got >= 1 && got <= k + 1);
            for (int64_t j = 0; j < got; j++) x[n++] = out[j];
            passes++, drafted += k, accepted += got - 1;
        }
        spec_count[(x[0] * MV + x[1]) * MV + x[2]]++;
        int32_t y0 = chain_draw(Q_chain[0]), y1 = chain_draw(Q_chain[y0]), y2 = chain_draw(Q_chain[y1]);
        draft_count[(y0 * MV + y1) * MV + y2]++;
    }
    // 63 degrees of freedom (fewer: the empty cells): P(chi2 > 130) < 1e-6
    double chi2 = chain_chi2(spec_count, N), chi2_draft = chain_chi2(draft_count, N);
    cr_assert(chi2 < 130, "speculative sampling's sequences are not the target's: chi-square %.1f (seed %llu)", chi2,
              (unsigned long long)tc_seed_used());
    cr_assert(chi2_draft > 130, "the test cannot tell the draft's chain from the target's: chi-square %.1f",
              chi2_draft);
    cr_assert(accepted > drafted / 10 && accepted < drafted, "accepted %lld of %lld drafted", (long long)accepted,
              (long long)drafted);
    sampler_free(u);
}

// ---- models and engines
typedef struct {
    int gpu;        // GPU engines (the target streamed when `streamed`)
    int streamed;   // the target: every layer through the ring, a CPU share of 0.3
    int gpus;       // the target on this many GPUs (tp_engine.c; 0: one), devices 0 and 1 where there are two, else
                    // two parts on device 0; the draft on one
} ts_kind;
static ts_kind K = {0, 0, 0};

static void ts_gpu_on(int streamed, int gpus) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (GPU tests run on the GPU machine)");
    K = (ts_kind){1, streamed, gpus};
}
static void ts_gpu(int streamed) { ts_gpu_on(streamed, 0); }

#define TS_CTX 256  // the fixtures' max_position_embeddings
static const char *ts_models[] = {"stories260K", "tied_gqa_f16", "mha_untied_f16", "llama3_gqa_bf16"};

// Reference model `name` (stories260K from $DJINN_DATA, else tests/fixtures/NAME with stories260K's tokenizer) in
// dtype (-1: its own; stories260K: f32), loaded for the engines under test.
static void ts_load(dj_model *m, const char *name, int dtype) {
    char stories[4096], src[4400], out[4400];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    int is_stories = !strcmp(name, "stories260K");
    if (is_stories) snprintf(src, sizeof src, "%s", stories);
    else snprintf(src, sizeof src, "%s/fixtures/%s", tc_tests_dir(), name);
    cr_assert_eq(access(src, R_OK), 0, "%s missing (run from the repository root, or set DJINN_TESTS)", src);
    char *dir = tc_tmpdir("spec");
    snprintf(out, sizeof out, "%s/m.bin", dir);
    convert_opts co = {.hf_dir = src, .out_path = out, .tok_dir = is_stories ? NULL : stories,
                       .dtype = dtype < 0 && is_stories ? DJ_F32 : dtype, .quiet = 1};
    dj_err e;
    cr_assert_eq(convert_run(&co, &e), 0, "%s: %s", name, e.msg);
    dj_load_opts lo = {.want_pinned = K.gpu, .quiet = 1};
    cr_assert_eq(model_load(out, &lo, m, &e), 0, "%s", e.msg);
    tc_rm_rf(dir);
    free(dir);
}

// A target (gpus: K.gpus) or a draft (gpus 0: one GPU).
static void ts_open(dj_engine *eng, const dj_model *m, int streamed, int gpus) {
    dj_gpu_opts go = {.max_seq = TS_CTX, .quiet = 1, .stream_all = streamed, .cpu_share = streamed ? 0.3 : 0,
                      .n_gpus = gpus};
    for (int r = 0; r < gpus; r++) go.gpus[r] = gpu_count() > r ? r : 0;
    dj_err e;
    cr_assert_eq(engine_open(eng, m, &go, 1, &e), 0, "%s", e.msg);
}

static dj_sampler *ts_sampler(int64_t vocab, const dj_sampling *p, uint64_t seed) {
    dj_err e;
    dj_sampler *s = sampler_new_with(vocab, p, seed, &e);
    cr_assert(s, "%s", e.msg);
    return s;
}

// A generation of n tokens after prompt (np), greedy with p's penalties: plainly (draft NULL: one decode step a
// token; gap: each step's two best logits, penalized, their distance over their scale) or drafted. ids (np + n)
// gets the prompt and the tokens; returns how many were made (a NaN stops it).
static int64_t ts_generate(dj_engine *tgt, dj_engine *dft, const dj_sampling *p, const dj_spec_opts *so,
                           const int32_t *prompt, int64_t np, int64_t n, int32_t *ids, double *gap, dj_spec_stats *st) {
    int64_t V = 512;
    float *lg = malloc(V * sizeof *lg);
    dj_sampler *smp = ts_sampler(V, p, 11);
    dj_err e;
    dj_spec *sp = NULL;
    if (dft) cr_assert(sp = spec_new(tgt, dft, V, smp, p, 12, NULL, TS_CTX, so, &e), "%s", e.msg);
    memcpy(ids, prompt, (size_t)np * sizeof *ids);
    for (int64_t i = 0; i < np; i++) sampler_accept(smp, prompt[i]);
    int32_t next;
    if (sp) cr_assert_eq(spec_prefill(sp, ids, np, &next, &e), 0, "%s", e.msg);
    else cr_assert_eq(tgt->forward(tgt->ctx, 0, ids, np, 0, lg, 0, &e), 0, "%s", e.msg);
    int64_t made = 0;
    for (; made < n; made++) {
        if (!sp) {
            next = sampler_next(smp, lg);
            const float *l = sampler_penalized(smp, lg);  // the gap that decided: between the penalized logits
            float a = -INFINITY, b = -INFINITY;
            for (int64_t i = 0; i < V; i++)
                if (l[i] > a) b = a, a = l[i];
                else if (l[i] > b) b = l[i];
            if (gap) gap[made] = (a - b) / fmax(fabs(a), 1.0);
        }
        if (next < 0) break;
        ids[np + made] = next;
        sampler_accept(smp, next);
        if (made + 1 == n) continue;
        int64_t at = np + made + 1;
        if (sp) cr_assert_eq(spec_next(sp, ids, at, n - made - 1, &next, &e), 0, "%s", e.msg);
        else cr_assert_eq(tgt->forward(tgt->ctx, 0, &next, 1, at - 1, lg, 0, &e), 0, "%s", e.msg);
    }
    if (sp && st) spec_stats(sp, st);
    spec_free(sp);
    sampler_free(smp);
    free(lg);
    return made;
}

// Greedy drafted tokens against the plain ones: equal (CPU), or equal up to a near tie of the plain run (GPU).
static void ts_same_tokens(const int32_t *plain, const int32_t *drafted, int64_t n, const double *gap,
                           const char *what) {
    for (int64_t i = 0; i < n; i++) {
        if (plain[i] == drafted[i]) continue;
        cr_assert(K.gpu && gap[i] < 0.02, "%s: token %lld is %d drafted, %d plain (two best logits %.2e apart; seed "
                  "%llu)", what, (long long)i, drafted[i], plain[i], gap[i], (unsigned long long)tc_seed_used());
        fprintf(stderr, "[%s] tokens part at %lld of %lld, a near tie (%.2e)\n", what, (long long)i, (long long)n,
                gap[i]);
        return;
    }
}

// Every reference model as the target, drafted by its q4 copy (agrees often), another reference model (disagrees:
// random fixtures share nothing) and itself (agrees always), at several K, greedy and with penalties.
static void ts_greedy_equals_plain(void) {
    tc_rng_fresh("spec.greedy_equals_plain");
    enum { NM = 4, NP = 5, N = 60 };
    dj_model tm[NM], qm[NM];
    for (int i = 0; i < NM; i++) ts_load(&tm[i], ts_models[i], -1), ts_load(&qm[i], ts_models[i], DJ_Q4);
    int32_t prompt[NP] = {1};
    for (int i = 1; i < NP; i++) prompt[i] = (int32_t)(3 + tc_below(509));
    dj_sampling settings[2] = {DJ_SAMPLING_DEFAULT, DJ_SAMPLING_DEFAULT};
    settings[0].temp = settings[1].temp = 0;
    settings[1].repeat_penalty = 1.3, settings[1].presence_penalty = 0.4;
    static const int64_t ks[] = {1, 4, 8, 16};
    for (int t = 0; t < NM; t++) {
        dj_engine tgt;
        ts_open(&tgt, &tm[t], K.streamed, K.gpus);
        for (int d = 0; d < 3; d++) {
            const dj_model *dm = d == 0 ? &qm[t] : d == 1 ? &tm[(t + 1) % NM] : &tm[t];
            dj_engine dft;
            ts_open(&dft, dm, 0, 0);
            for (int s = 0; s < 2; s++) {
                dj_spec_opts so = {.k_max = ks[(t + d + s) % 4]};
                int32_t plain[NP + N], drafted[NP + N];
                double gap[N];
                dj_spec_stats st;
                cr_assert_eq(ts_generate(&tgt, NULL, &settings[s], &so, prompt, NP, N, plain, gap, NULL), N);
                cr_assert_eq(ts_generate(&tgt, &dft, &settings[s], &so, prompt, NP, N, drafted, NULL, &st), N);
                char what[200];
                snprintf(what, sizeof what, "%s drafted by %s%s, K %lld%s", ts_models[t],
                         d == 0 ? "its q4 copy" : d == 1 ? ts_models[(t + 1) % NM] : "itself", "", (long long)so.k_max,
                         s ? ", penalties" : "");
                ts_same_tokens(plain + NP, drafted + NP, N, gap, what);
                cr_assert_eq(st.produced, st.accepted + st.passes, "%s", what);
                cr_assert(st.passes >= (N - 1 + so.k_max) / (so.k_max + 1) && st.passes <= N - 1, "%s: %lld passes",
                          what, (long long)st.passes);
                if (d == 2 && !K.gpu)  // the target itself: every drafted token stands
                    cr_assert_eq(st.accepted, st.drafted, "%s: %lld of %lld accepted", what, (long long)st.accepted,
                                 (long long)st.drafted);
                if (d == 1 && t > 0)  // random fixtures, random answers: almost none stands
                    cr_assert(st.accepted * 4 < st.drafted, "%s: %lld of %lld accepted", what, (long long)st.accepted,
                              (long long)st.drafted);
                fprintf(stderr, "[%s] %lld passes, %lld of %lld drafted accepted\n", what, (long long)st.passes,
                        (long long)st.accepted, (long long)st.drafted);
            }
            engine_close(&dft);
        }
        engine_close(&tgt);
    }
    for (int i = 0; i < NM; i++) model_free(&tm[i]), model_free(&qm[i]);
}

Test(spec, greedy_equals_plain) { ts_greedy_equals_plain(); }
Test(spec_gpu, greedy_equals_plain_resident) {
    ts_gpu(0);
    ts_greedy_equals_plain();
}
Test(spec_gpu, greedy_equals_plain_streamed) {
    ts_gpu(1);
    ts_greedy_equals_plain();
}
// The target on two GPUs (its verification passes and rollbacks on every GPU's part), the draft on one.
Test(spec_gpu, greedy_equals_plain_two_gpus) {
    ts_gpu_on(0, 2);
    ts_greedy_equals_plain();
}
Test(spec_gpu, greedy_equals_plain_two_gpus_streamed) {
    ts_gpu_on(1, 2);
    ts_greedy_equals_plain();
}

// Rollback: positions written by a pass whose tokens were then rejected are never read. A run that wrote garbage at
// positions n..n+6 (a verification pass of 7 rows) and then goes on from n equals one that never did: decode steps,
// and a pass of several rows whose rows equal the decode steps' (the verification pass's shape).
static void ts_rejected_kv_never_read(void) {
    tc_rng_fresh("spec.rejected_kv_never_read");
    dj_model m;
    ts_load(&m, "llama3_gqa_bf16", -1);
    enum { NP = 9, NG = 7, NA = 5, V = 512 };
    int32_t prompt[NP] = {1}, garbage[NG], a[NA];
    for (int i = 1; i < NP; i++) prompt[i] = (int32_t)(3 + tc_below(509));
    for (int i = 0; i < NG; i++) garbage[i] = (int32_t)(3 + tc_below(509));
    for (int i = 0; i < NA; i++) a[i] = (int32_t)(3 + tc_below(509));
    float *clean = malloc(NA * V * sizeof(float)), *dirty = malloc(NA * V * sizeof(float)),
          *rows = malloc(NA * V * sizeof(float));
    dj_engine eng;
    dj_err e;
    ts_open(&eng, &m, K.streamed, K.gpus);
    cr_assert_eq(eng.forward(eng.ctx, 0, prompt, NP, 0, NULL, 0, &e), 0, "%s", e.msg);
    for (int i = 0; i < NA; i++) cr_assert_eq(eng.forward(eng.ctx, 0, &a[i], 1, NP + i, clean + i * V, 0, &e), 0);
    engine_close(&eng);
    ts_open(&eng, &m, K.streamed, K.gpus);
    cr_assert_eq(eng.forward(eng.ctx, 0, prompt, NP, 0, NULL, 0, &e), 0, "%s", e.msg);
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(eng.forward(eng.ctx, 0, garbage, NG, NP, rows, 0, &e), 0, "%s", e.msg);
        if (round == 0)
            for (int i = 0; i < NA; i++) cr_assert_eq(eng.forward(eng.ctx, 0, &a[i], 1, NP + i, dirty + i * V, 0, &e), 0);
        else
            cr_assert_eq(eng.forward(eng.ctx, 0, a, NA, NP, dirty, 1, &e), 0, "%s", e.msg);
        for (int i = 0; i < NA; i++) {
            double err = tc_rel_l2(dirty + i * V, clean + i * V, V);
            cr_assert(K.gpu ? err < 1e-2 : err == 0, "%s after garbage at the positions: row %d, relative L2 %.3e "
                      "(seed %llu)", round ? "a pass of several rows" : "decode steps", i, err,
                      (unsigned long long)tc_seed_used());
        }
    }
    engine_close(&eng);
    model_free(&m);
    free(clean), free(dirty), free(rows);
}

Test(spec, rejected_kv_never_read) { ts_rejected_kv_never_read(); }
Test(spec_gpu, rejected_kv_never_read_resident) {
    ts_gpu(0);
    ts_rejected_kv_never_read();
}
Test(spec_gpu, rejected_kv_never_read_streamed) {
    ts_gpu(1);
    ts_rejected_kv_never_read();
}
Test(spec_gpu, rejected_kv_never_read_two_gpus) {
    ts_gpu_on(1, 2);
    ts_rejected_kv_never_read();
}

// ---- the command line
// The binaries from $DJINN_BIN on stories260K (f32, its q4 copy) and llama3_gqa_bf16 converted in a temp folder.
typedef struct {
    char dir[256], djinn[1100], st[300], st_q4[300], l3[300], out[300], err[300];
} ts_cli;

static int ts_run(ts_cli *c, char *const argv[]) { return tc_run(argv, "/dev/null", c->out, 0, c->err, 60); }

static void ts_cli_setup(ts_cli *c) {
    memset(c, 0, sizeof *c);
    const char *bin = tc_bin_dir();
    char conv[1100], stories[4096], l3[4400];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    snprintf(c->djinn, sizeof c->djinn, "%s/djinn", bin);
    snprintf(conv, sizeof conv, "%s/convert", bin);
    snprintf(l3, sizeof l3, "%s/fixtures/llama3_gqa_bf16", tc_tests_dir());
    char *dir = tc_tmpdir("spec_cli");
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    free(dir);
    snprintf(c->st, sizeof c->st, "%s/st.bin", c->dir), snprintf(c->st_q4, sizeof c->st_q4, "%s/st_q4.bin", c->dir);
    snprintf(c->l3, sizeof c->l3, "%s/l3.bin", c->dir);
    snprintf(c->out, sizeof c->out, "%s/stdout", c->dir), snprintf(c->err, sizeof c->err, "%s/stderr", c->dir);
    char *const runs[][9] = {{conv, stories, c->st, "--dtype", "f32", "-q", NULL},
                             {conv, stories, c->st_q4, "--dtype", "q4", "-q", NULL},
                             {conv, l3, c->l3, "--tokenizer", stories, "-q", NULL}};
    for (int i = 0; i < 3; i++) cr_assert_eq(ts_run(c, runs[i]), 0, "convert failed: %s", tc_read(c->err, NULL));
}

static void ts_cli_teardown(ts_cli *c) { tc_rm_rf(c->dir); }

// A run that must exit with `code`; its stdout and stderr (malloc'd).
static void ts_expect(ts_cli *c, char *const argv[], int code, char **out, char **err) {
    int rc = ts_run(c, argv);
    *out = tc_must_read(c->out, NULL), *err = tc_must_read(c->err, NULL);
    cr_assert_eq(rc, code, "exit %d, expected %d: %s", rc, code, *err);
}

// The plain run's and the drafted run's stdout and stop line must be the same. extra: options for both (NULL-ended),
// the drafted run's after them.
static void ts_cli_same(ts_cli *c, const char *model, const char *draft, const char *const *both,
                        const char *const *drafted_only, const char *stop_line) {
    char *argv[40];
    int n = 0;
    argv[n++] = c->djinn, argv[n++] = (char *)model;
    for (int i = 0; both[i]; i++) argv[n++] = (char *)both[i];
    argv[n] = NULL;
    char *out_plain, *err_plain, *out, *err;
    int code = !strcmp(stop_line, "interrupted") ? 130 : 0;
    ts_expect(c, argv, code, &out_plain, &err_plain);
    argv[n++] = "--draft", argv[n++] = (char *)draft;
    for (int i = 0; drafted_only[i]; i++) argv[n++] = (char *)drafted_only[i];
    argv[n] = NULL;
    ts_expect(c, argv, code, &out, &err);
    cr_assert_str_eq(out, out_plain, "drafted text differs from the plain run's:\n%s\n---- plain:\n%s", out, out_plain);
    cr_assert(strstr(err_plain, stop_line), "the plain run did not stop as the test meant ('%s'): %s", stop_line,
              err_plain);
    for (int k = 0; k < 2; k++) {  // the line saying why it stopped, or none in either
        const char *key = k ? "djinn: interrupted after" : "djinn: stopped", *a = strstr(err_plain, key),
                   *b = strstr(err, key);
        cr_assert(!a == !b && (!a || !strncmp(a, b, strcspn(a, "\n"))), "the stop lines differ:\n%s\n---- plain:\n%s",
                  err, err_plain);
    }
    cr_assert(strstr(err, "djinn: speculative: "), "no statistics line: %s", err);
    free(out_plain), free(err_plain), free(out), free(err);
}

// llama3_gqa_bf16 greedy from "Once" ends with its end token after 45 tokens; drafted by itself 9 at a time
// (K 8), that token comes in the middle of a drafted run: the text stops there, as the plain run's.
Test(spec_cli, end_token_inside_a_drafted_run) {
    ts_cli c;
    ts_cli_setup(&c);
    ts_cli_same(&c, c.l3, c.l3, (const char *[]){"-p", "Once", "-n", "200", "-t", "0", "--cpu", NULL},
                (const char *[]){"--draft-max", "8", NULL}, "end-of-sequence token after 45 new tokens");
    ts_cli_teardown(&c);
}

// The context fills up 28 tokens in: the drafted runs are cut to fit (K 8 from 2 prompt tokens), the text and the
// stop line are the plain run's.
Test(spec_cli, context_full_inside_a_drafted_run) {
    ts_cli c;
    ts_cli_setup(&c);
    ts_cli_same(&c, c.st, c.st, (const char *[]){"-p", "Once", "-n", "200", "-t", "0", "-c", "30", "--cpu", NULL},
                (const char *[]){"--draft-max", "8", NULL}, "the context of 30 tokens is full");
    ts_cli_same(&c, c.st, c.st_q4, (const char *[]){"-p", "Once", "-n", "200", "-t", "0", "-c", "41", "--cpu", NULL},
                (const char *[]){"--draft-max", "16", NULL}, "the context of 41 tokens is full");
    ts_cli_teardown(&c);
}

// -n, --stop, and Ctrl-C after 23 tokens (inside a drafted run of the q4 copy): what the plain run prints.
Test(spec_cli, stop_string_count_and_ctrl_c) {
    ts_cli c;
    ts_cli_setup(&c);
    ts_cli_same(&c, c.st, c.st_q4, (const char *[]){"-p", "Once upon a time", "-n", "37", "-t", "0", "--cpu", NULL},
                (const char *[]){"--draft-max", "6", NULL}, "decode 36 tokens");
    ts_cli_same(&c, c.st, c.st_q4,
                (const char *[]){"-p", "Once upon a time", "-n", "200", "-t", "0", "--stop", "park", "--cpu", NULL},
                (const char *[]){"--draft-max", "6", NULL}, "stopped at --stop 'park'");
    setenv("DJINN_TEST_SIGINT_AT", "23", 1);
    ts_cli_same(&c, c.st, c.st_q4, (const char *[]){"-p", "Once upon a time", "-n", "200", "-t", "0", "--cpu", NULL},
                (const char *[]){"--draft-max", "6", NULL}, "interrupted");
    unsetenv("DJINN_TEST_SIGINT_AT");
    ts_cli_teardown(&c);
}

// Sampled: the same seed gives the same text; drafted by the target itself every token stands (the draft's q is
// the target's p bit for bit on the CPU), penalties and top-k included; --draft-p-min 1 drafts nothing (no draft's
// most likely token reaches probability 1) and leaves one token a pass; --stats-json carries the figures.
Test(spec_cli, sampled_runs_and_statistics) {
    ts_cli c;
    ts_cli_setup(&c);
    char stats[400];
    snprintf(stats, sizeof stats, "%s/stats.json", c.dir);
    char *o1, *e1, *o2, *e2;
    char *argv[] = {c.djinn, c.st, "-p", "Once upon a time", "-n", "120", "-t", "0.9", "-s", "5", "--top-k", "40",
                    "--repeat-penalty", "1.2", "--cpu", "--draft", c.st, "--draft-max", "5", "--stats-json", stats,
                    NULL};
    ts_expect(&c, argv, 0, &o1, &e1);
    cr_assert(strstr(e1, "accepted (100.0%)"), "drafted by itself, a token was rejected: %s", e1);
    char *js = tc_must_read(stats, NULL);
    cr_assert(strstr(js, "\"acceptance\": 1.0000") && strstr(js, "\"draft_max\": 5") &&
              strstr(js, "\"tokens_per_pass\": ") && strstr(js, "\"draft_s\": ") && strstr(js, "\"target_s\": "),
              "--stats-json lacks the speculative figures: %s", js);
    free(js);
    ts_expect(&c, argv, 0, &o2, &e2);
    cr_assert_str_eq(o1, o2, "the same seed gave two texts");
    free(o2), free(e2);
    argv[16] = c.st_q4;  // a draft that disagrees at times: another text of the same distribution, repeatable
    ts_expect(&c, argv, 0, &o2, &e2);
    cr_assert(!strstr(e2, "accepted (100.0%)") && !strstr(e2, "accepted (0.0%)"), "%s", e2);
    char *o3, *e3;
    ts_expect(&c, argv, 0, &o3, &e3);
    cr_assert_str_eq(o2, o3, "the same seed gave two texts");
    free(o1), free(e1), free(o2), free(e2), free(o3), free(e3);
    char *pm[] = {c.djinn, c.st, "-p", "Once upon a time", "-n", "20", "-t", "0", "--cpu", "--draft", c.st_q4,
                  "--draft-p-min", "1", NULL};
    ts_expect(&c, pm, 0, &o1, &e1);
    cr_assert(strstr(e1, "djinn: speculative: 19 passes of the target, 1.00 tokens a pass; 0 of 0 drafted"), "%s", e1);
    free(o1), free(e1);
    ts_cli_teardown(&c);
}

// Bad options and pairings: one line naming the problem, nothing on stdout.
Test(spec_cli, refusals) {
    ts_cli c;
    ts_cli_setup(&c);
    char logits[400];
    snprintf(logits, sizeof logits, "%s/l.bin", c.dir);
    struct {
        char *argv[12];
        int code;
        const char *msg;
    } cases[] = {
        {{c.djinn, c.st, "--draft", c.st, "--draft-max", "0", NULL}, 2, "--draft-max needs a count from 1 to 32"},
        {{c.djinn, c.st, "--draft", c.st, "--draft-max", "33", NULL}, 2, "--draft-max needs a count from 1 to 32"},
        {{c.djinn, c.st, "--draft", c.st, "--draft-max", "four", NULL}, 2, "--draft-max needs a count"},
        {{c.djinn, c.st, "--draft", c.st, "--draft-p-min", "1.5", NULL}, 2, "--draft-p-min needs a value in [0, 1]"},
        {{c.djinn, c.st, "--draft-max", "4", NULL}, 2, "--draft-max and --draft-p-min need --draft"},
        {{c.djinn, c.st, "--draft", c.st, "--logits", logits, NULL}, 2, "--draft speeds up generation: not with"},
        {{c.djinn, c.st, "--draft", c.st, "--chat", NULL}, 2, "--draft speeds up generation: not with"},
        {{c.djinn, c.st, "--draft", NULL}, 2, "option '--draft' needs a value"},
        {{c.djinn, c.st, "--cpu", "--draft", "/nonexistent/d.bin", NULL}, 1, "/nonexistent/d.bin"},
        {{c.djinn, c.st, "--cpu", "-n", "3", "--draft", c.l3, NULL}, 1,
         "a context of 256 positions (max_position_embeddings), the run's is 512: lower -c"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = ts_run(&c, cases[i].argv);
        size_t n;
        char *out = tc_must_read(c.out, &n), *err = tc_must_read(c.err, NULL);
        cr_assert_eq(rc, cases[i].code, "case %zu: exit %d, expected %d: %s", i, rc, cases[i].code, err);
        cr_assert_eq(n, 0, "case %zu: stdout must stay empty: %s", i, out);
        cr_assert(strstr(err, cases[i].msg), "case %zu: stderr lacks '%s': %s", i, cases[i].msg, err);
        free(out), free(err);
    }
    ts_cli_teardown(&c);
}

// A draft of another vocabulary or another tokenizer is refused by name (spec_check_pair): the vocabulary's size
// changed in the loaded header, and one token's text changed in a copy of the tokenizer section.
Test(spec, draft_of_another_tokenizer_refused) {
    dj_model m;
    ts_load(&m, "stories260K", -1);
    dj_err e;
    const uint8_t *blob = m.data + m.info.tok_off;
    size_t n = (size_t)m.info.tok_size;
    dj_tokenizer *t = tok_load(blob, n, &e), *t2;
    cr_assert(t, "%s", e.msg);
    cr_assert_eq(spec_check_pair(&m, t, &m, t, "d.bin", &e), 0, "the model against itself: %s", e.msg);
    dj_model other = m;
    other.info.config.vocab_size = 640;
    cr_assert_neq(spec_check_pair(&m, t, &other, t, "d.bin", &e), 0);
    cr_assert(strstr(e.msg, "--draft d.bin: a vocabulary of 640 tokens, the target's has 512"), "%s", e.msg);
    uint8_t *copy = malloc(n);
    memcpy(copy, blob, n);
    uint8_t *at = memmem(copy, n, "\xe2\x96\x81" "ha", 5);  // the token "▁ha"
    cr_assert(at, "no token '▁ha' in stories260K's tokenizer section");
    at[4] = 'x';
    cr_assert(t2 = tok_load(copy, n, &e), "%s", e.msg);
    cr_assert_neq(spec_check_pair(&m, t, &m, t2, "d.bin", &e), 0);
    cr_assert(strstr(e.msg, "is '\xe2\x96\x81hx' in the draft and '\xe2\x96\x81ha' in the target: not the same "
                            "tokenizer"), "%s", e.msg);
    tok_free(t), tok_free(t2), free(copy);
    model_free(&m);
}
