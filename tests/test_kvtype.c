// test_kvtype.c: the KV cache's types (kvtype.c): their names both ways, what a row of each costs, and the q8 row
// rule both engines round with, on rows built so that each clause of the rule decides an element: the zero row,
// the largest element at exactly +-127, ties rounded half to even, NaN and infinite values.
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "../kvtype.h"
#include "common.h"

Test(kvtype, names_round_trip) {
    char all[64] = "";
    for (int t = 0; t < DJ_KV_TYPES; t++) {
        cr_assert_eq(dj_kv_parse(dj_kv_name(t)), t, "%s", dj_kv_name(t));
        if (t) strcat(all, "|");
        strcat(all, dj_kv_name(t));
    }
    cr_assert_str_eq(all, DJ_KV_NAMES, "the help's list and the names differ");
    cr_assert_str_eq(dj_kv_name(DJ_KV_F32), "f32");
    cr_assert_str_eq(dj_kv_name(DJ_KV_F16), "f16");
    cr_assert_str_eq(dj_kv_name(DJ_KV_Q8), "q8");
    cr_assert_str_eq(dj_kv_name(DJ_KV_TYPES), "?");
    cr_assert_str_eq(dj_kv_name(-1), "?");
    static const char *bad[] = {"", "F16", "f8", "q4", "f16 ", "f3", "q8x", "bf16"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) cr_assert_eq(dj_kv_parse(bad[i]), -1, "'%s' parsed", bad[i]);
    cr_assert_eq(DJ_KV_F32, 0, "an engine opened with zeroed options must get f32");
}

Test(kvtype, row_bytes) {
    cr_assert_eq(dj_kv_elem_bytes(DJ_KV_F32), 4);
    cr_assert_eq(dj_kv_elem_bytes(DJ_KV_F16), 2);
    cr_assert_eq(dj_kv_elem_bytes(DJ_KV_Q8), 1);
    cr_assert_eq(dj_kv_row_bytes(DJ_KV_F32, 128), 512);
    cr_assert_eq(dj_kv_row_bytes(DJ_KV_F16, 128), 256);
    cr_assert_eq(dj_kv_row_bytes(DJ_KV_Q8, 128), 128 + 4, "a q8 row is its values and one f32 scale");
    cr_assert_eq(dj_kv_row_bytes(DJ_KV_Q8, 8), 12);
}

// A row of zeros: scale 0 and every value 0 (no division by zero into NaN).
Test(kvtype, q8_zero_row) {
    float x[8] = {0, -0.0f, 0, 0, 0, 0, 0, 0}, s = -1;
    int8_t q[8];
    memset(q, 55, sizeof q);
    dj_kv_q8_row(x, 8, q, &s);
    cr_assert(s == 0 && !signbit(s), "scale %g", s);
    for (int d = 0; d < 8; d++) cr_assert_eq(q[d], 0, "value %d: %d", d, q[d]);
}

// Random rows at several sizes: the largest |x| becomes exactly +-127 with its sign, the scale is max|x| / 127, and
// every value is within half a step of x (k * s).
Test(kvtype, q8_random_rows) {
    tc_rng_fresh("kvtype.q8_random_rows");
    static const int sizes[] = {1, 2, 8, 64, 128, 256};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int rep = 0; rep < 50; rep++) {
            const int n = sizes[k];
            float x[256], s;
            int8_t q[256];
            float mag = powf(10.0f, tc_uniform(-6, 4));
            for (int d = 0; d < n; d++) x[d] = mag * tc_normal();
            int at = 0;
            for (int d = 1; d < n; d++)
                if (fabsf(x[d]) > fabsf(x[at])) at = d;
            dj_kv_q8_row(x, n, q, &s);
            cr_assert_eq(s, fabsf(x[at]) / 127.0f, "n %d: scale %g for max %g (seed %llu)", n, s, fabsf(x[at]),
                         (unsigned long long)tc_seed_used());
            cr_assert_eq(q[at], x[at] > 0 ? 127 : -127, "n %d: the largest value %g stored as %d (seed %llu)", n,
                         x[at], q[at], (unsigned long long)tc_seed_used());
            // half a step, plus float's rounding: x / s rounds to the nearest float (an ulp of up to 127: 2^-17,
            // so a true 117.499998 can read 117.5 and go to 118), and k * s rounds again (an ulp of |x|)
            for (int d = 0; d < n; d++)
                cr_assert(fabsf((float)q[d] * s - x[d]) <= (0.5f + 128 * FLT_EPSILON) * s + FLT_EPSILON * fabsf(x[d]) &&
                              q[d] >= -127,
                          "n %d value %d: %g stored as %d * %g (seed %llu)", n, d, x[d], q[d], s,
                          (unsigned long long)tc_seed_used());
        }
}

// A scale of exactly 1 (max 127): halves round to the even neighbour, as rintf in the default rounding mode.
Test(kvtype, q8_ties_to_even) {
    const float x[10] = {127, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -127};
    const int8_t want[10] = {127, 2, 4, -2, -4, 0, 0, 2, 126, -127};
    int8_t q[10];
    float s;
    dj_kv_q8_row(x, 10, q, &s);
    cr_assert_eq(s, 1.0f);
    for (int d = 0; d < 10; d++) cr_assert_eq(q[d], want[d], "%g stored as %d, not %d", x[d], q[d], want[d]);
}

// NaN is not a row's maximum (fmaxf passes over it) and stores 0; an infinite value makes the scale infinite and
// every value 0 (x / inf is 0, inf / inf is NaN).
Test(kvtype, q8_nan_and_infinity) {
    const float x[4] = {1, NAN, -2, 0.5f};
    int8_t q[4];
    float s;
    dj_kv_q8_row(x, 4, q, &s);
    cr_assert_eq(s, 2.0f / 127.0f, "scale %g", s);
    cr_assert_eq(q[1], 0, "NaN stored as %d", q[1]);
    cr_assert_eq(q[2], -127);
    cr_assert_eq(q[0], (int8_t)rintf(1.0f / s));
    for (int sign = -1; sign <= 1; sign += 2) {
        const float y[4] = {3, sign * INFINITY, -7, NAN};
        memset(q, 9, sizeof q);
        dj_kv_q8_row(y, 4, q, &s);
        cr_assert(isinf(s) && s > 0, "scale %g", s);
        for (int d = 0; d < 4; d++) cr_assert_eq(q[d], 0, "%g in an infinite row stored as %d", y[d], q[d]);
    }
}
