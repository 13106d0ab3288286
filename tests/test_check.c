// test_check.c: --check's pieces on their own (check.c): the reference file reader against good and damaged
// files, and the row comparison's figures against values worked out here.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../engine.h"
#include "../model.h"
#include "common.h"

// A reference file of n tokens over vocab V: header, ids, logits (n, V).
static void tchk_write(const char *path, const char *magic, uint32_t version, uint32_t n, uint32_t n_prompt,
                       uint32_t V, const int32_t *ids, const float *logits, long trim) {
    size_t bytes = 24 + 4 * (size_t)n + 4 * (size_t)n * V;
    uint8_t *b = calloc(1, bytes + 16);  // trim > 0: zero bytes past the end
    memcpy(b, magic, 8);
    memcpy(b + 8, &version, 4), memcpy(b + 12, &n, 4), memcpy(b + 16, &n_prompt, 4), memcpy(b + 20, &V, 4);
    memcpy(b + 24, ids, 4 * (size_t)n);
    memcpy(b + 24 + 4 * (size_t)n, logits, 4 * (size_t)n * V);
    tc_write(path, b, (size_t)((long)bytes + trim));
    free(b);
}

Test(check, reference_round_trip_and_damage) {
    char *dir = tc_tmpdir("check"), path[256];
    snprintf(path, sizeof path, "%s/ref.bin", dir);
    enum { N = 5, V = 7 };
    int32_t ids[N] = {1, 4, 2, 6, 0};
    float lg[N * V];
    tc_rng_seed(3);
    tc_fill(lg, N * V, -4, 4);
    dj_ref r;
    dj_err e;
    tchk_write(path, "DJINNREF", 1, N, 2, V, ids, lg, 0);
    cr_assert_eq(ref_load(path, &r, &e), 0, "%s", e.msg);
    cr_assert(r.n_tokens == N && r.n_prompt == 2 && r.vocab == V);
    cr_assert_eq(memcmp(r.ids, ids, sizeof ids), 0);
    cr_assert_eq(memcmp(r.logits, lg, sizeof lg), 0);
    ref_free(&r);
    ref_free(&r);  // twice is harmless
    // each damage refused with a line that says what is wrong
    const struct {
        const char *magic;
        uint32_t version, n, n_prompt;
        long trim;
        const char *want;
    } bad[] = {
        {"DJINNMDL", 1, N, 2, 0, "not a reference file"},
        {"DJINNREF", 2, N, 2, 0, "reference version 2"},
        {"DJINNREF", 1, N, N + 1, 0, "corrupt reference header"},
        {"DJINNREF", 1, N, 2, -4, "truncated"},
        {"DJINNREF", 1, N, 2, 8, "truncated or corrupt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tchk_write(path, bad[i].magic, bad[i].version, bad[i].n, bad[i].n_prompt, V, ids, lg, bad[i].trim);
        cr_assert_eq(ref_load(path, &r, &e), -1, "case %zu loaded", i);
        cr_assert(strstr(e.msg, bad[i].want), "case %zu: '%s' lacks '%s'", i, e.msg, bad[i].want);
        cr_assert(!r.ids && !r.logits, "case %zu left buffers behind", i);
    }
    tc_write(path, "DJINN", 5);
    cr_assert_eq(ref_load(path, &r, &e), -1);
    snprintf(path, sizeof path, "%s/missing.bin", dir);
    cr_assert_eq(ref_load(path, &r, &e), -1);
    cr_assert(strstr(e.msg, "cannot open"), "%s", e.msg);
    tc_rm_rf(dir);
    free(dir);
}

Test(check, compare_row_figures) {
    const float ref[4] = {1, 2, 3, 4};
    dj_row_cmp c = compare_row(ref, ref, 4);
    cr_assert(c.max_abs == 0 && c.rel_l2 == 0 && c.top1 && fabs(c.kl) < 1e-12);
    // a constant shift leaves the softmax (and KL) unchanged but not the logits
    const float shifted[4] = {1.5f, 2.5f, 3.5f, 4.5f};
    c = compare_row(ref, shifted, 4);
    cr_assert(fabs(c.max_abs - 0.5) < 1e-12 && c.top1 && fabs(c.kl) < 1e-12);
    cr_assert(fabs(c.rel_l2 - sqrt(4 * 0.25 / 30.0)) < 1e-12, "rel_l2 %g", c.rel_l2);
    // another top token, and a KL worked out by hand: ref softmax of (0, 0), got (log 3, 0): p = (.5, .5),
    // q = (.75, .25): KL = .5 log(.5/.75) + .5 log(.5/.25)
    const float r2[2] = {0, 0}, g2[2] = {(float)log(3.0), 0};
    c = compare_row(r2, g2, 2);
    cr_assert(fabs(c.kl - (0.5 * log(0.5 / 0.75) + 0.5 * log(2.0))) < 1e-6, "KL %g", c.kl);
    const float r3[3] = {0, 5, 1}, g3[3] = {6, 5, 1};
    cr_assert(!compare_row(r3, g3, 3).top1);
    // a NaN logit makes the row's errors NaN, so a tolerance check fails
    const float g4[4] = {1, NAN, 3, 4};
    c = compare_row(ref, g4, 4);
    cr_assert(isnan(c.max_abs) && isnan(c.rel_l2) && !(c.rel_l2 <= 1.0) && isnan(c.kl));
    // Saturated rows (one token's probability 1 to double precision; tools/shape_check.py's tied models gave such
    // rows): the sum of terms that round to +-1e-50 is never below 0, as KL itself is not.
    tc_rng_seed(7);
    float sr[64], sg[64];
    int negative = 0;
    for (int k = 0; k < 2000; k++) {
        for (int i = 0; i < 64; i++) sr[i] = 40 * tc_normal(), sg[i] = sr[i] + 0.3f * tc_normal();
        c = compare_row(sr, sg, 64);
        negative += c.kl < 0;
    }
    cr_assert_eq(negative, 0, "%d rows of 2000 gave a negative KL", negative);
}

Test(check, every_position_and_the_worst) {
    enum { N = 3, V = 5 };
    float ref[N * V], got[N * V];
    tc_rng_seed(11);
    tc_fill(ref, N * V, -2, 2);
    memcpy(got, ref, sizeof ref);
    got[1 * V + 3] += 0.25f;  // position 1 is the only one off
    int32_t ids[N] = {1, 2, 3};
    dj_ref r = {N, 1, V, ids, ref};
    FILE *out = tmpfile();
    cr_assert(out);
    dj_check c;
    check_logits(&r, got, out, &c);
    cr_assert_eq(c.worst_pos, 1);
    cr_assert(fabs(c.worst_abs - 0.25) < 1e-6, "worst |d| %g", c.worst_abs);
    cr_assert(c.worst_rel > 0 && c.rel_l2 > 0 && c.rel_l2 < c.worst_rel);
    cr_assert(c.agree >= N - 1);
    // one table row per position and the overall line
    rewind(out);
    char line[512];
    int lines = 0, overall = 0;
    while (fgets(line, sizeof line, out)) lines++, overall += !strncmp(line, "overall:", 8);
    fclose(out);
    cr_assert_eq(lines, 1 + N + 1, "%d lines", lines);
    cr_assert_eq(overall, 1);
    // a NaN row stays the worst: the row after it must not replace it (x <= NaN is false, so a plain "worse than"
    // test let it, and --check passed over NaN logits)
    got[1 * V + 3] = NAN;
    out = tmpfile();
    cr_assert(out);
    check_logits(&r, got, out, &c);
    fclose(out);
    cr_assert(isnan(c.worst_rel) && isnan(c.worst_abs) && c.worst_pos == 1, "worst rel %g abs %g at %lld", c.worst_rel,
              c.worst_abs, (long long)c.worst_pos);
    cr_assert(!(c.worst_rel <= 1.0), "a NaN row passes a tolerance");
}

// The weights' tolerances in an f32 KV cache as they were; f16's adds 5e-3 to the float weights' relative L2; q8's
// is held to the mean KL, as q8 weights are.
Test(check, default_tolerances) {
    cr_assert_eq(check_default_tol(0, DJ_BF16, DJ_KV_F32), 1e-4);
    cr_assert_eq(check_default_tol(0, DJ_F32, DJ_KV_F32), 1e-4);
    cr_assert_eq(check_default_tol(1, DJ_F32, DJ_KV_F32), 1e-4);
    cr_assert_eq(check_default_tol(1, DJ_F16, DJ_KV_F32), 5e-3);
    cr_assert_eq(check_default_tol(1, DJ_BF16, DJ_KV_F32), 1e-2);
    cr_assert_eq(check_default_tol(0, DJ_Q8, DJ_KV_F32), 1e-2);
    cr_assert_eq(check_default_tol(0, DJ_Q4, DJ_KV_F32), 0.3);
    cr_assert_eq(check_default_tol(0, DJ_F32, DJ_KV_F16), 1e-4 + 5e-3);
    cr_assert_eq(check_default_tol(1, DJ_BF16, DJ_KV_F16), 1e-2 + 5e-3);
    cr_assert_eq(check_default_tol(0, DJ_Q8, DJ_KV_F16), 1e-2);
    cr_assert_eq(check_default_tol(0, DJ_F32, DJ_KV_Q8), 1e-2);
    cr_assert_eq(check_default_tol(1, DJ_F16, DJ_KV_Q8), 1e-2);
    cr_assert_eq(check_default_tol(0, DJ_Q4, DJ_KV_Q8), 0.3);
    const dj_check c = {.worst_rel = 0.25, .mean_kl = 0.5};
    const char *name;
    cr_assert_eq(check_measure(&c, DJ_F16, DJ_KV_F16, &name), 0.25);
    cr_assert_str_eq(name, "worst rel_l2");
    cr_assert_eq(check_measure(&c, DJ_F32, DJ_KV_Q8, &name), 0.5);
    cr_assert_str_eq(name, "mean KL");
    cr_assert_eq(check_measure(&c, DJ_Q4, DJ_KV_F32, &name), 0.5);
    cr_assert_str_eq(name, "mean KL");
}

// ---- the CPU engine against HF in each KV type
// stories260K's committed reference (tests/ref, HF in float64) teacher-forced through the CPU engine with its
// weights in f32 and its cache in kv: check_measure's figure, within check_default_tol's tolerance.
static double tchk_stories_kv(int kv, double *tol) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ref/stories260K.bin", tc_tests_dir());
    dj_ref r;
    dj_err e = {{0}};
    cr_assert_eq(ref_load(path, &r, &e), 0, "%s", e.msg);
    dj_model m;
    tc_load_stories(&m, DJ_F32, 0);
    dj_gpu_opts go = {.max_seq = r.n_tokens, .quiet = 1, .kv_type = kv};
    dj_engine eng;
    cr_assert_eq(engine_open(&eng, &m, &go, 1, &e), 0, "%s", e.msg);
    float *lg = malloc((size_t)r.n_tokens * r.vocab * sizeof(float));
    cr_assert_eq(eng.forward(eng.ctx, 0, r.ids, r.n_tokens, 0, lg, 1, &e), 0, "%s", e.msg);
    dj_check ck;
    const char *name;
    double v = tc_check(&r, lg, DJ_F32, kv, &ck, &name);
    *tol = check_default_tol(0, DJ_F32, kv);
    cr_log_info("%s KV: max|dlogit| %.3e, worst rel_l2 %.3e, mean KL %.3e; %s %.3e, tolerance %.1e", dj_kv_name(kv),
                ck.worst_abs, ck.worst_rel, ck.mean_kl, name, v, *tol);
    engine_close(&eng);
    free(lg);
    ref_free(&r);
    model_free(&m);
    return v;
}

Test(check, cpu_kv_types_meet_the_hf_reference) {
    for (int kv = 0; kv < DJ_KV_TYPES; kv++) {
        double tol, v = tchk_stories_kv(kv, &tol);
        cr_assert(v <= tol, "%s KV: %.3e from HF, over the tolerance %.1e", dj_kv_name(kv), v, tol);
    }
}


