// test_sampler.c: the host sampler (sampler.c) on its own: greedy picks, seeded repeatability, and the top-p
// distribution against the exact nucleus computed here in double, by counting many draws.
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../sampler.h"
#include "common.h"

static dj_sampler *ts_new(int64_t vocab, double temp, double top_p, uint64_t seed) {
    dj_err e;
    dj_sampler *s = sampler_new(vocab, temp, top_p, seed, &e);
    cr_assert(s, "%s", e.msg);
    return s;
}

Test(sampler, argmax_takes_the_first_of_equal_values) {
    float x[] = {1, 3, -2, 3, 0};
    cr_assert_eq(dj_argmax(x, 5), 1);
    float y[] = {-INFINITY, -5, -5};
    cr_assert_eq(dj_argmax(y, 3), 1);
    cr_assert_eq(dj_argmax(y, 1), 0);
}

Test(sampler, greedy_settings) {
    tc_rng_fresh("sampler.greedy_settings");
    enum { V = 1000 };
    float *z = malloc(V * sizeof *z);
    for (int i = 0; i < V; i++) z[i] = tc_normal();
    int32_t want = dj_argmax(z, V);
    // temperature 0, top-p 0, or a nucleus smaller than the top token's mass: always the top token
    const double settings[][2] = {{0, 0.9}, {1.0, 0}, {0.7, 1e-9}, {1.0, 1e-6}};
    for (size_t k = 0; k < sizeof settings / sizeof settings[0]; k++) {
        dj_sampler *s = ts_new(V, settings[k][0], settings[k][1], 1);
        cr_assert_eq(sampler_is_greedy(s), settings[k][0] == 0 || settings[k][1] == 0);
        for (int r = 0; r < 50; r++)
            cr_assert_eq(sampler_next(s, z), want, "temp %g top-p %g (seed %llu)", settings[k][0], settings[k][1],
                         (unsigned long long)tc_seed_used());
        sampler_free(s);
    }
    free(z);
}

Test(sampler, same_seed_same_tokens) {
    enum { V = 300, N = 200 };
    float z[V];
    tc_rng_seed(7);
    for (int i = 0; i < V; i++) z[i] = 2.0f * tc_normal();
    int32_t a[N], b[N], c[N];
    dj_sampler *s1 = ts_new(V, 1.0, 0.95, 42), *s2 = ts_new(V, 1.0, 0.95, 42), *s3 = ts_new(V, 1.0, 0.95, 43);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        a[i] = sampler_next(s1, z), b[i] = sampler_next(s2, z), c[i] = sampler_next(s3, z);
        differ += a[i] != c[i];
    }
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "the same seed drew different tokens");
    cr_assert_gt(differ, N / 4, "seeds 42 and 43 drew the same tokens %d times of %d", N - differ, N);
    sampler_free(s1), sampler_free(s2), sampler_free(s3);
}

Test(sampler, generator_range) {
    dj_rng r;
    rng_seed(&r, 0);  // seed 0 must not be xorshift's fixed point
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        float u = rng_f32(&r);
        cr_assert(u >= 0 && u < 1, "rng_f32 gave %g", u);
        sum += u;
    }
    cr_assert(fabs(sum / 100000 - 0.5) < 0.01, "mean %g", sum / 100000);
}

// The nucleus of softmax(z / temp) for top_p, in double: probabilities sorted by (p desc, id asc), the smallest
// prefix whose mass reaches top_p, renormalised. want (V).
static void ts_nucleus(const float *z, int V, double temp, double top_p, double *want) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, z[i]);
    int *order = malloc((size_t)V * sizeof *order);
    for (int i = 0; i < V; i++) want[i] = exp((z[i] - mx) / temp), sum += want[i], order[i] = i;
    for (int i = 1; i < V; i++)  // insertion sort: small V
        for (int j = i; j > 0 && (want[order[j]] > want[order[j - 1]] ||
                                  (want[order[j]] == want[order[j - 1]] && order[j] < order[j - 1]));
             j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    double cum = 0, mass = 0;
    int keep = V;
    for (int k = 0; k < V; k++) {
        cum += want[order[k]];
        if (cum >= top_p * sum) {
            keep = k + 1;
            break;
        }
    }
    for (int k = 0; k < keep; k++) mass += want[order[k]];
    double *p = calloc((size_t)V, sizeof *p);
    for (int k = 0; k < keep; k++) p[order[k]] = want[order[k]] / mass;
    memcpy(want, p, (size_t)V * sizeof *p);
    free(p), free(order);
}

// Frequencies over n draws against the exact nucleus: every token outside it never drawn, every one inside within
// 5 standard deviations of its expected count.
static void ts_distribution(const float *z, int V, double temp, double top_p, int n) {
    double *want = malloc((size_t)V * sizeof *want);
    ts_nucleus(z, V, temp, top_p, want);
    int *count = calloc((size_t)V, sizeof *count);
    dj_sampler *s = ts_new(V, temp, top_p, 1234);
    for (int i = 0; i < n; i++) {
        int32_t t = sampler_next(s, z);
        cr_assert(t >= 0 && t < V, "token %d out of range", t);
        count[t]++;
    }
    for (int i = 0; i < V; i++) {
        double mean = want[i] * n, sd = sqrt(n * want[i] * (1 - want[i]));
        if (want[i] == 0)
            cr_assert_eq(count[i], 0, "temp %g top-p %g: token %d is outside the nucleus but was drawn %d times",
                         temp, top_p, i, count[i]);
        else
            cr_assert(fabs(count[i] - mean) <= 5 * sd + 1, "temp %g top-p %g: token %d drawn %d times, expected %.1f",
                      temp, top_p, i, count[i], mean);
    }
    sampler_free(s);
    free(count), free(want);
}

Test(sampler, top_p_draws_follow_the_nucleus) {
    // logits with a clear order and two ties (ids 2 and 5, 3 and 6), so the boundary falls in several places
    const float z[] = {2.0f, 1.5f, 0.5f, 0.2f, -0.3f, 0.5f, 0.2f, -1.0f};
    const int V = 8;
    const double temps[] = {1.0, 0.7, 1.6}, tops[] = {1.0, 0.95, 0.8, 0.5, 0.3};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++) ts_distribution(z, V, temps[a], tops[b], 60000);
}

// A flat row over Llama 3's vocabulary (the sampler's worst case): the nucleus is the lowest ids, and only those
// are drawn.
Test(sampler, flat_row_large_vocabulary) {
    enum { V = 128256 };
    float *z = calloc(V, sizeof *z);
    dj_sampler *s = ts_new(V, 1.0, 0.5, 9);
    int32_t hi = 0;
    for (int i = 0; i < 200; i++) {
        int32_t t = sampler_next(s, z);
        if (t > hi) hi = t;
    }
    cr_assert(hi <= V / 2 + 1, "drew id %d from a nucleus of the first half", hi);
    cr_assert(hi > V / 4, "200 draws from 64k equal tokens all below %d", hi);
    sampler_free(s);
    free(z);
}

// ---- top-k, min-p and the penalties (llama.cpp's meanings)
static dj_sampler *ts_with(int64_t vocab, const dj_sampling *p, uint64_t seed) {
    dj_err e;
    dj_sampler *s = sampler_new_with(vocab, p, seed, &e);
    cr_assert(s, "%s", e.msg);
    return s;
}

// Draws n tokens; every one must be in `allowed` (a 0/1 map); returns how many distinct allowed ids came up.
static int ts_draws_within(dj_sampler *s, const float *z, int64_t vocab, const char *allowed, int n) {
    char *seen = calloc((size_t)vocab, 1);
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int32_t t = sampler_next(s, z);
        cr_assert(t >= 0 && t < vocab && allowed[t], "drew %d, outside the allowed set (seed %llu)", t,
                  (unsigned long long)tc_seed_used());
        distinct += !seen[t], seen[t] = 1;
    }
    free(seen);
    return distinct;
}

// top-k: only the k most likely tokens, each of them drawn; top-k 1 is greedy; with top-p, the nucleus is taken
// over the k tokens' own mass (top-p 0.5 of 4 equal tokens: two of them).
Test(sampler, top_k) {
    tc_rng_fresh("sampler.top_k");
    enum { V = 200 };
    float z[V];
    for (int i = 0; i < V; i++) z[i] = tc_normal();
    dj_sampling p = DJ_SAMPLING_DEFAULT;
    p.top_p = 1.0, p.top_k = 5;
    char allowed[V] = {0};
    for (int k = 0; k < 5; k++) {  // the 5 largest
        int best = -1;
        for (int i = 0; i < V; i++)
            if (!allowed[i] && (best < 0 || z[i] > z[best])) best = i;
        allowed[best] = 1;
    }
    dj_sampler *s = ts_with(V, &p, 3);
    cr_assert_eq(ts_draws_within(s, z, V, allowed, 4000), 5, "not every one of the top 5 was drawn");
    sampler_free(s);
    p.top_k = 1;
    s = ts_with(V, &p, 3);
    cr_assert(sampler_is_greedy(s));
    cr_assert_eq(sampler_next(s, z), dj_argmax(z, V));
    sampler_free(s);
    float flat[V];
    for (int i = 0; i < V; i++) flat[i] = i < 4 ? 2.0f : -30.0f;  // four equal tokens, the rest negligible
    char two[V] = {0};
    two[0] = two[1] = 1;  // ties go to the smaller id: the nucleus of 0.5 is ids 0 and 1
    p.top_k = 4, p.top_p = 0.5;
    s = ts_with(V, &p, 9);
    cr_assert_eq(ts_draws_within(s, flat, V, two, 2000), 2);
    sampler_free(s);
}

// min-p: only tokens at least min_p times as likely as the top one (at temperature 1: logit >= top + ln(min_p)).
Test(sampler, min_p) {
    tc_rng_fresh("sampler.min_p");
    enum { V = 300 };
    float z[V];
    for (int i = 0; i < V; i++) z[i] = 1.5f * tc_normal();
    int top = dj_argmax(z, V);
    // two more tokens inside the cut whatever the draw: the top of 300 such logits stands more than ln 5 above the
    // rest in about 3% of draws (DJINN_SEED=1712556014762264), which left one token and nothing to test
    z[(top + 1) % V] = z[top] - 0.5f, z[(top + 2) % V] = z[top] - 1.0f;
    // and none within 1e-3 of the cut, where float rounding decides (one within 1e-4 of it was drawn and failed,
    // DJINN_SEED=1735729461431989): those are moved just below it
    const float cut = z[top] + logf(0.2f);
    for (int i = 0; i < V; i++)
        if (fabsf(z[i] - cut) < 1e-3f) z[i] = cut - 2e-3f;
    char allowed[V];
    int n_allowed = 0;
    for (int i = 0; i < V; i++) n_allowed += allowed[i] = z[i] >= cut;
    dj_sampling p = DJ_SAMPLING_DEFAULT;
    p.top_p = 1.0, p.min_p = 0.2;
    dj_sampler *s = ts_with(V, &p, 5);
    int got = ts_draws_within(s, z, V, allowed, 6000);
    cr_assert(got >= n_allowed - 1 && n_allowed > 1, "%d of the %d tokens within min-p drawn", got, n_allowed);
    sampler_free(s);
}

// The penalties, through greedy picks between two close logits: id 3 (logit a) against id 7 (logit b).
static int32_t ts_pick(float a, float b, const int32_t *hist, int n_hist, double rep, double freq, double pres,
                       int64_t last_n) {
    enum { V = 16 };
    float z[V], keep[V];
    for (int i = 0; i < V; i++) z[i] = -10.0f;
    z[3] = a, z[7] = b;
    memcpy(keep, z, sizeof z);
    dj_sampling p = DJ_SAMPLING_DEFAULT;
    p.temp = 0, p.repeat_penalty = rep, p.frequency_penalty = freq, p.presence_penalty = pres, p.repeat_last_n = last_n;
    dj_sampler *s = ts_with(V, &p, 1);
    for (int i = 0; i < n_hist; i++) sampler_accept(s, hist[i]);
    int32_t t = sampler_next(s, z);
    cr_assert_eq(memcmp(z, keep, sizeof z), 0, "the caller's logits were changed");
    sampler_free(s);
    return t;
}

Test(sampler, penalties) {
    const int32_t once[] = {3}, twice[] = {3, 1, 3}, aged[] = {3, 5, 6};
    cr_assert_eq(ts_pick(2.0f, 1.9f, once, 1, 1.0, 0, 0, 64), 3, "no penalty: the larger logit");
    cr_assert_eq(ts_pick(2.0f, 1.9f, once, 1, 1.1, 0, 0, 64), 7, "repeat 1.1: 2.0 / 1.1 < 1.9");
    cr_assert_eq(ts_pick(2.0f, 1.9f, once, 1, 1.04, 0, 0, 64), 3, "repeat 1.04: 2.0 / 1.04 > 1.9");
    cr_assert_eq(ts_pick(-1.0f, -1.05f, once, 1, 1.1, 0, 0, 64), 7, "a negative logit is multiplied: -1.1 < -1.05");
    cr_assert_eq(ts_pick(2.0f, 1.9f, twice, 3, 1.1, 0, 0, 64), 7, "a token seen twice is penalized once");
    cr_assert_eq(ts_pick(2.0f, 1.65f, twice, 3, 1.1, 0, 0, 64), 3, "once: 2.0 / 1.1 = 1.82 > 1.65");
    cr_assert_eq(ts_pick(2.0f, 1.7f, twice, 3, 1.0, 0.1, 0, 64), 3, "frequency 0.1 x 2: 1.8 > 1.7");
    cr_assert_eq(ts_pick(2.0f, 1.7f, twice, 3, 1.0, 0.2, 0, 64), 7, "frequency 0.2 x 2: 1.6 < 1.7");
    cr_assert_eq(ts_pick(2.0f, 1.7f, twice, 3, 1.0, 0, 0.25, 64), 3, "presence 0.25 once: 1.75 > 1.7");
    cr_assert_eq(ts_pick(2.0f, 1.7f, twice, 3, 1.0, 0, 0.35, 64), 7, "presence 0.35 once: 1.65 < 1.7");
    cr_assert_eq(ts_pick(2.0f, 1.9f, aged, 3, 1.5, 0.5, 0.5, 2), 3, "id 3 left the window of 2");
    cr_assert_eq(ts_pick(2.0f, 1.9f, aged, 3, 1.5, 0, 0, 3), 7, "id 3 inside a window of 3");
    cr_assert_eq(ts_pick(2.0f, 1.9f, aged, 3, 1.5, 0, 0, 0), 3, "repeat-last-n 0: no penalty");
    // out-of-range settings are refused
    dj_err e;
    dj_sampling p = DJ_SAMPLING_DEFAULT;
    p.repeat_penalty = 0;
    cr_assert_null(sampler_new_with(10, &p, 1, &e));
    p = DJ_SAMPLING_DEFAULT, p.min_p = 1.5;
    cr_assert_null(sampler_new_with(10, &p, 1, &e));
    p = DJ_SAMPLING_DEFAULT, p.top_k = -1;
    cr_assert_null(sampler_new_with(10, &p, 1, &e));
}

// sampler_probs is the distribution sampler_pick_u draws from: over a grid of N draws u = (i + 1/2) / N, each id is
// picked a fraction of the grid within 2/N of its probability (the draw maps u to weight intervals), for every
// sampler setting; greedy is one-hot at the pick; a NaN row has none.
Test(sampler, probs_are_the_draws_distribution) {
    tc_rng_fresh("sampler.probs_are_the_draws_distribution");
    enum { V = 200, N = 1 << 16 };
    float z[V], probs[V];
    static int32_t count[V];
    for (int i = 0; i < V; i++) z[i] = 1.5f * tc_normal();
    dj_sampling set[5];
    for (int k = 0; k < 5; k++) set[k] = DJ_SAMPLING_DEFAULT;
    set[1].top_k = 17, set[2].min_p = 0.05, set[3].top_p = 1, set[3].temp = 0.6;
    set[4].repeat_penalty = 1.5, set[4].frequency_penalty = 0.3;
    for (int k = 0; k < 5; k++) {
        dj_err e;
        dj_sampler *s = sampler_new_with(V, &set[k], 1, &e);
        cr_assert(s, "%s", e.msg);
        for (int i = 0; i < 30; i++) sampler_accept(s, (int32_t)tc_below(V));
        cr_assert_geq(sampler_probs(s, z, probs), 0);
        memset(count, 0, sizeof count);
        for (int i = 0; i < N; i++) count[sampler_pick_u(s, z, ((float)i + 0.5f) / N)]++;
        double sum = 0;
        for (int i = 0; i < V; i++) {
            sum += probs[i];
            cr_assert(fabs((double)count[i] / N - probs[i]) <= 2.0 / N, "setting %d, id %d: drawn %.6f, probability "
                      "%.6f (seed %llu)", k, i, (double)count[i] / N, probs[i], (unsigned long long)tc_seed_used());
        }
        cr_assert(fabs(sum - 1) < 1e-5, "setting %d: probabilities sum to %.7f", k, sum);
        sampler_free(s);
    }
    dj_err e;
    dj_sampler *g = sampler_new(V, 0, 0.9, 1, &e);
    cr_assert_eq(sampler_probs(g, z, probs), dj_argmax(z, V));
    for (int i = 0; i < V; i++) cr_assert_eq(probs[i], i == dj_argmax(z, V) ? 1.0f : 0.0f);
    z[7] = NAN;
    cr_assert_eq(sampler_probs(g, z, probs), -1);
    sampler_free(g);
}

// sampler_history(ids, n) leaves the penalties as accepting ids one by one would (the last repeat_last_n count);
// going back to a shorter history undoes the longer one.
Test(sampler, history_equals_accepting) {
    tc_rng_fresh("sampler.history_equals_accepting");
    enum { V = 50, H = 300 };
    float z[V], pa[V], pb[V];
    int32_t ids[H];
    for (int i = 0; i < V; i++) z[i] = tc_normal();
    for (int i = 0; i < H; i++) ids[i] = (int32_t)tc_below(V);
    dj_sampling p = DJ_SAMPLING_DEFAULT;
    p.repeat_penalty = 1.4, p.presence_penalty = 0.2, p.frequency_penalty = 0.1, p.repeat_last_n = 20;
    dj_err e;
    dj_sampler *a = sampler_new_with(V, &p, 1, &e), *b = sampler_new_with(V, &p, 1, &e);
    const int lens[] = {0, 5, 20, 21, 137, 40, 3, H};
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
        sampler_free(a);
        a = sampler_new_with(V, &p, 1, &e);
        for (int i = 0; i < lens[k]; i++) sampler_accept(a, ids[i]);
        sampler_history(b, ids, lens[k]);
        sampler_probs(a, z, pa), sampler_probs(b, z, pb);
        cr_assert_eq(memcmp(pa, pb, sizeof pa), 0, "history of %d tokens differs from accepting them", lens[k]);
    }
    // and the window is not a no-op: a history that differs changes the probabilities
    sampler_history(b, ids + 1, H - 1);
    sampler_probs(b, z, pb);
    sampler_history(b, ids, 0);
    sampler_probs(b, z, pa);
    cr_assert_neq(memcmp(pa, pb, sizeof pa), 0);
    sampler_free(a), sampler_free(b);
}

Test(sampler, draw_from_a_distribution) {
    const float p[] = {0, 0.25f, 0, 0.5f, 0.25f, 0};
    cr_assert_eq(dj_draw(p, 6, 0.0f), 1);
    cr_assert_eq(dj_draw(p, 6, 0.2499f), 1);
    cr_assert_eq(dj_draw(p, 6, 0.25f), 3);
    cr_assert_eq(dj_draw(p, 6, 0.7499f), 3);
    cr_assert_eq(dj_draw(p, 6, 0.75f), 4);
    cr_assert_eq(dj_draw(p, 6, 0.99999994f), 4);  // never an id of probability 0
    const float q[] = {0, 2, 0, 6};                // unnormalised: scaled to its mass
    cr_assert_eq(dj_draw(q, 4, 0.2f), 1);
    cr_assert_eq(dj_draw(q, 4, 0.3f), 3);
    const float none[] = {0, -1, 0};
    cr_assert_eq(dj_draw(none, 3, 0.5f), -1);
}

// ---- rows with no distribution: refused (-1) by every rule, greedy or sampled, at any position
// A row is refused when one value is NaN or +infinity, or when every value is -infinity; -infinity beside a finite
// value is a token never drawn. Each case alone, at the first, a middle and the last position, so that no other
// value's refusal hides it.
static int32_t ts_pick_row(const float *z, int V, double temp) {
    dj_sampler *s = ts_new(V, temp, 1.0, 3);
    int32_t t = sampler_next(s, z);
    float probs[8] = {0};
    if (V <= 8) {
        for (int i = 0; i < V; i++) probs[i] = 0.5f;
        int32_t p = sampler_probs(s, z, probs);
        cr_assert_eq(p < 0, t < 0, "temp %g: sampler_probs gave %d where sampler_next gave %d", temp, p, t);
        if (p < 0)
            for (int i = 0; i < V; i++) cr_assert_eq(probs[i], 0.5f, "a refused row left probs[%d] changed", i);
    }
    sampler_free(s);
    return t;
}

Test(sampler, rows_without_a_distribution) {
    enum { V = 6 };
    const double temps[] = {0, 1.0};  // greedy, sampled
    const int at[] = {0, 2, V - 1};
    const float bad[] = {INFINITY, NAN, -NAN};
    for (int ti = 0; ti < 2; ti++)
        for (int b = 0; b < 3; b++)
            for (int a = 0; a < 3; a++) {
                float z[V] = {0.5f, 1.0f, -2.0f, 3.0f, 0.25f, -1.0f};
                z[at[a]] = bad[b];
                cr_assert_eq(ts_pick_row(z, V, temps[ti]), -1, "temp %g: %g at %d was not refused", temps[ti], bad[b],
                             at[a]);
            }
    // every value -infinity: nothing to draw
    for (int ti = 0; ti < 2; ti++) {
        float z[V];
        for (int i = 0; i < V; i++) z[i] = -INFINITY;
        cr_assert_eq(ts_pick_row(z, V, temps[ti]), -1, "temp %g: a row of -infinity was not refused", temps[ti]);
        cr_assert_eq(ts_pick_row(z, 1, temps[ti]), -1, "temp %g: one -infinity was not refused", temps[ti]);
        // one finite value among them, first, in the middle or last: it is the only token there is
        for (int a = 0; a < 3; a++) {
            for (int i = 0; i < V; i++) z[i] = -INFINITY;
            z[at[a]] = -1e30f;
            cr_assert_eq(ts_pick_row(z, V, temps[ti]), at[a], "temp %g: the finite value at %d", temps[ti], at[a]);
        }
    }
    // the largest finite float is a value like any other, and -infinity beside finite values is never drawn
    float big[V] = {-INFINITY, FLT_MAX, -INFINITY, 1.0f, -INFINITY, -FLT_MAX};
    cr_assert_eq(ts_pick_row(big, V, 0), 1);
    dj_sampler *s = ts_new(V, 1.0, 1.0, 5);
    float mix[V] = {-INFINITY, 0.0f, -INFINITY, 0.0f, -INFINITY, -INFINITY};
    for (int r = 0; r < 200; r++) {
        int32_t t = sampler_next(s, mix);
        cr_assert(t == 1 || t == 3, "drew %d, whose logit is -infinity", t);
    }
    sampler_free(s);
}

// The same through the penalties: a row whose NaN or +infinity sits in a penalized token is still refused.
Test(sampler, rows_without_a_distribution_penalized) {
    enum { V = 6 };
    const float bad[] = {INFINITY, NAN};
    for (int b = 0; b < 2; b++)
        for (int temp = 0; temp < 2; temp++) {
            dj_sampling p = DJ_SAMPLING_DEFAULT;
            p.temp = temp, p.top_p = 1.0, p.repeat_penalty = 1.3, p.presence_penalty = 0.5;
            dj_err e;
            dj_sampler *s = sampler_new_with(V, &p, 1, &e);
            cr_assert(s, "%s", e.msg);
            sampler_accept(s, 4);
            float z[V] = {0.5f, 1.0f, -2.0f, 3.0f, 0.25f, -1.0f};
            z[4] = bad[b];
            cr_assert_eq(sampler_next(s, z), -1, "temp %d: a penalized %g was not refused", temp, bad[b]);
            z[4] = 0.25f;  // the same row with the value finite: a token
            int32_t t = sampler_next(s, z);
            cr_assert(temp ? t >= 0 && t < V : t == 3, "temp %d: a finite row gave %d", temp, t);
            sampler_free(s);
        }
}

// Every range sampler_new_with checks, at its limit (accepted), and just past it (refused), each setting alone.
static int ts_accepts(dj_sampling p, int64_t vocab) {
    dj_err e = {{0}};
    dj_sampler *s = sampler_new_with(vocab, &p, 1, &e);
    if (!s) cr_assert(strstr(e.msg, "out of range"), "message '%s'", e.msg);
    sampler_free(s);
    return s != NULL;
}

Test(sampler, settings_at_their_limits) {
    const dj_sampling d = DJ_SAMPLING_DEFAULT;
    dj_sampling p;
#define TS_LIMIT(field, value, ok)                                                                       \
    do {                                                                                                 \
        p = d, p.field = (value);                                                                       \
        cr_assert_eq(ts_accepts(p, 10), (ok), "%s = %s: %s", #field, #value, (ok) ? "refused" : "accepted"); \
    } while (0)
    TS_LIMIT(temp, 0, 1);
    TS_LIMIT(temp, -1e-9, 0);
    TS_LIMIT(temp, 9.9e29, 1);
    TS_LIMIT(temp, 1e30, 0);
    TS_LIMIT(temp, NAN, 0);
    TS_LIMIT(top_p, 0, 1);
    TS_LIMIT(top_p, 1, 1);
    TS_LIMIT(top_p, -1e-9, 0);
    TS_LIMIT(top_p, 1 + 1e-9, 0);
    TS_LIMIT(top_p, NAN, 0);
    TS_LIMIT(min_p, 0, 1);
    TS_LIMIT(min_p, 1, 1);
    TS_LIMIT(min_p, -1e-9, 0);
    TS_LIMIT(min_p, 1 + 1e-9, 0);
    TS_LIMIT(min_p, NAN, 0);
    TS_LIMIT(top_k, 0, 1);
    TS_LIMIT(top_k, -1, 0);
    TS_LIMIT(top_k, INT64_MAX, 1);
    TS_LIMIT(repeat_penalty, 1e-30, 1);
    TS_LIMIT(repeat_penalty, 1e-31, 0);  // as a float a denormal, or zero, to divide by
    TS_LIMIT(repeat_penalty, 0, 0);
    TS_LIMIT(repeat_penalty, -1, 0);
    TS_LIMIT(repeat_penalty, 9.9e29, 1);
    TS_LIMIT(repeat_penalty, 1e30, 0);
    TS_LIMIT(repeat_penalty, NAN, 0);
    TS_LIMIT(presence_penalty, -1e30, 1);
    TS_LIMIT(presence_penalty, -1.01e30, 0);
    TS_LIMIT(presence_penalty, -DBL_MAX, 0);  // as a float, -inf
    TS_LIMIT(presence_penalty, INFINITY, 0);
    TS_LIMIT(presence_penalty, -INFINITY, 0);
    TS_LIMIT(presence_penalty, NAN, 0);
    TS_LIMIT(frequency_penalty, 1e30, 1);
    TS_LIMIT(frequency_penalty, 1.01e30, 0);
    TS_LIMIT(frequency_penalty, DBL_MAX, 0);
    TS_LIMIT(frequency_penalty, INFINITY, 0);
    TS_LIMIT(frequency_penalty, -INFINITY, 0);
    TS_LIMIT(frequency_penalty, NAN, 0);
    TS_LIMIT(repeat_last_n, 0, 1);
    TS_LIMIT(repeat_last_n, -1, 0);
    TS_LIMIT(repeat_last_n, 1 << 24, 1);
    TS_LIMIT(repeat_last_n, (1 << 24) + 1, 0);
#undef TS_LIMIT
    // the window of 2^24 with a penalty on: its history allocated
    p = d, p.repeat_penalty = 1.1, p.repeat_last_n = 1 << 24;
    cr_assert(ts_accepts(p, 10));
    cr_assert(ts_accepts(d, 1), "a vocabulary of 1");
    cr_assert(!ts_accepts(d, 0), "a vocabulary of 0");
    cr_assert(!ts_accepts(d, -1), "a vocabulary of -1");
    cr_assert(!ts_accepts(d, (int64_t)INT32_MAX + 1), "a vocabulary over INT32_MAX");
}
