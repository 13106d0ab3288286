// test_quant.c: q8 and q4 weights: the row format and its error bounds (quant.c), the CPU's matvec on quantized rows
// against the reference matmul, a quantized model's forward pass against the same weights widened to f32, and the
// quality of the quantization on every reference model (mean KL and top-1 agreement against HF's float64 logits;
// stories260K's perplexity and top-1 agreement with f32 on a real text), q4 beside plain round-to-nearest with one f16
// scale per 32 weights.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check.h"
#include "../convert/convert.h"
#include "../cpu.h"
#include "../loader.h"
#include "../quant.h"
#include "../sampler.h"
#include "../tokenizer.h"
#include "common.h"

// ---- the row format
Test(quant, row_bytes_and_bits_per_weight) {
    cr_assert_eq(dj_row_bytes(DJ_Q8, 4096), 4096 + 256, "q8: 8.5 bits a weight");
    cr_assert_eq(dj_row_bytes(DJ_Q4, 4096), 2048 + 256, "q4: 4.5 bits a weight");
    cr_assert_eq(dj_row_bytes(DJ_Q4, 14336) * 8, 14336 * 9 / 2 * 1ull, "q4 at Llama 3's FFN width");
    // 172 columns: 6 groups, the last 12 values zero padding, the row rounded up to 16 bytes
    cr_assert_eq(dj_row_bytes(DJ_Q8, 172), 208);  // 6 * 34 = 204 -> 208
    cr_assert_eq(dj_row_bytes(DJ_Q4, 172), 112);  // 6 * 18 = 108 -> 112
    cr_assert_eq(dj_scales_offset(DJ_Q4, 172), 96);
    cr_assert_eq(dj_row_bytes(DJ_F16, 172), 344);
    cr_assert_eq(dj_row_bytes(7, 172), 0);
}

// Plain round-to-nearest q4 with one f16 scale per 32 weights (llama.cpp's Q4_0: the largest magnitude maps to -8,
// k in -8..7), the baseline of the quality figures: x (n) -> out (n) widened, and the squared error.
static double rtn_q4(const float *x, int64_t n, float *out) {
    double err = 0;
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        int64_t g1 = g0 + 32 < n ? g0 + 32 : n;
        float amax = 0, mx = 0;
        for (int64_t i = g0; i < g1; i++)
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
        float s = dj_f16_to_f32(dj_f32_to_f16(mx / -8.0f)), inv = s != 0 ? 1.0f / s : 0.0f;
        for (int64_t i = g0; i < g1; i++) {
            int k = (int)lrintf(x[i] * inv);
            k = k < -8 ? -8 : k > 7 ? 7 : k;
            out[i] = s * (float)k;
            err += ((double)x[i] - out[i]) * ((double)x[i] - out[i]);
        }
    }
    return err;
}

// The symmetric q8 that zero points replaced (max|w| / 127 as an f16 scale, k in -127..127): its squared error.
static double sym_q8(const float *x, int64_t n) {
    double err = 0;
    for (int64_t g0 = 0; g0 < n; g0 += 32) {
        int64_t g1 = g0 + 32 < n ? g0 + 32 : n;
        float amax = 0;
        for (int64_t i = g0; i < g1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float s = dj_f16_to_f32(dj_f32_to_f16(amax / 127.0f)), inv = s != 0 ? 1.0f / s : 0.0f;
        for (int64_t i = g0; i < g1; i++) {
            double d = (double)x[i] - (double)s * (float)lrintf(x[i] * inv);
            err += d * d;
        }
    }
    return err;
}

// Random rows: the error quant_row reports what dequant_row gives back; no weight off by more than half a step or,
// where the scale is below the range ([min(w, 0), max(w, 0)]) over 255 or 15, the 3% of the range clipped at one
// end: 0.035 of the range (q8), its 15th (q4); q8's squared error below 1e-4 of the weights' and at most 0.8
// of the symmetric q8's (max|w| / 127 as an f16 scale; 0.72 expected on Gaussian weights), q4's at most 0.75 of
// round-to-nearest's (0.68 expected); the padding zero.
Test(quant, error_bounds_and_search) {
    tc_rng_fresh("quant.error_bounds_and_search");
    const int64_t widths[] = {32, 64, 172, 4096};
    double err_q4 = 0, err_rtn = 0, err_q8 = 0, err_sym8 = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        int64_t n = widths[wi];
        float *x = malloc((size_t)n * 4), *back = malloc((size_t)n * 4), *rt = malloc((size_t)n * 4);
        uint8_t *row = malloc(dj_row_bytes(DJ_Q8, (uint64_t)n)), *row2 = malloc(dj_row_bytes(DJ_Q4, (uint64_t)n));
        for (int rep = 0; rep < 40; rep++) {
            for (int64_t i = 0; i < n; i++) x[i] = tc_normal() * (rep % 3 == 0 ? 0.02f : 1.0f);
            if (rep == 5) x[n / 2] = 40.0f;  // one outlier in a group
            double e8 = 0, ref = 0;
            cr_assert_eq(quant_row(DJ_Q8, x, n, row, &e8, &ref), 0);
            dequant_row(DJ_Q8, row, n, back);
            double chk8 = 0;
            for (int64_t g0 = 0; g0 < n; g0 += 32) {
                float mn = 0, mx = 0;
                for (int64_t i = g0; i < n && i < g0 + 32; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
                for (int64_t i = g0; i < n && i < g0 + 32; i++) {
                    cr_assert(fabsf(back[i] - x[i]) <= 0.035f * (mx - mn), "q8 n=%lld i=%lld: %g -> %g (range %g)",
                              (long long)n, (long long)i, x[i], back[i], mx - mn);
                    chk8 += ((double)x[i] - back[i]) * ((double)x[i] - back[i]);
                }
            }
            cr_assert(fabs(chk8 - e8) <= 1e-9 * (e8 + 1e-30) + 1e-20, "q8 reported %g, measured %g", e8, chk8);
            if (rep != 5) cr_assert(e8 <= 1e-4 * ref + 1e-30, "q8 relative squared error %g", e8 / ref);
            err_q8 += e8, err_sym8 += sym_q8(x, n);
            double es = 0;
            cr_assert_eq(quant_row(DJ_Q4, x, n, row2, &es, NULL), 0);
            // the error quant_row reports is the error of what dequant_row gives back
            dequant_row(DJ_Q4, row2, n, back);
            double chk = 0;
            for (int64_t i = 0; i < n; i++) chk += ((double)x[i] - back[i]) * ((double)x[i] - back[i]);
            cr_assert(fabs(chk - es) <= 1e-9 * (es + 1e-30) + 1e-20, "reported %g, measured %g", es, chk);
            for (int64_t g0 = 0; g0 < n; g0 += 32) {
                float mn = 0, mx = 0;
                for (int64_t i = g0; i < n && i < g0 + 32; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
                for (int64_t i = g0; i < n && i < g0 + 32; i++)
                    cr_assert(fabsf(back[i] - x[i]) <= (mx - mn) / 15.0f, "q4 n=%lld i=%lld: %g -> %g (range %g)",
                              (long long)n, (long long)i, x[i], back[i], mx - mn);
            }
            err_q4 += es, err_rtn += rtn_q4(x, n, rt);
        }
        // the padding of a partial last group (widened) and of the row (stored) is zero
        if (n % 32) {
            float grp[32];
            dequant_group(DJ_Q4, row2, n, n / 32, grp);
            for (int j = n % 32; j < 32; j++) cr_assert_eq(grp[j], 0.0f);
            uint64_t so = dj_scales_offset(DJ_Q4, (uint64_t)n), rb = dj_row_bytes(DJ_Q4, (uint64_t)n);
            for (uint64_t b = so + 2 * (uint64_t)((n + 31) / 32); b < rb; b++) cr_assert_eq(row2[b], 0);
        }
        free(x), free(back), free(rt), free(row), free(row2);
    }
    cr_assert(err_q4 < 0.75 * err_rtn, "q4: squared error %g against round-to-nearest's %g", err_q4, err_rtn);
    cr_assert(err_q8 < 0.8 * err_sym8, "q8: squared error %g against the symmetric q8's %g", err_q8, err_sym8);
    // groups no scale can hold: a range beyond 15.75 * 64512 (q4), 255 * 64512 (q8)
    float big[32] = {5e6f};
    uint8_t r[64];
    cr_assert_eq(quant_row(DJ_Q4, big, 32, r, NULL, NULL), -1);
    big[0] = 9e5f;
    float back[32];
    cr_assert_eq(quant_row(DJ_Q4, big, 32, r, NULL, NULL), 0);
    dequant_row(DJ_Q4, r, 32, back);
    cr_assert(fabsf(back[0] - 9e5f) <= 9e5f / 15 * 0.6f && back[1] == 0.0f, "%g %g", back[0], back[1]);
    big[0] = 1.5e7f;
    cr_assert_eq(quant_row(DJ_Q8, big, 32, r, NULL, NULL), 0);
    dequant_row(DJ_Q8, r, 32, back);
    cr_assert(fabsf(back[0] - 1.5e7f) <= 1.5e7f / 255 && back[1] == 0.0f, "%g %g", back[0], back[1]);
    big[0] = 2e7f;
    cr_assert_eq(quant_row(DJ_Q8, big, 32, r, NULL, NULL), -1);
}

// The padding of a partial last group widens to exactly 0 in both formats, whatever zero point the group's values
// gave it: all positive, all negative, mixed, all zero, one value; and the row's bytes after the last parameter are
// zero.
Test(quant, partial_group_padding_is_zero) {
    tc_rng_fresh("quant.partial_group_padding_is_zero");
    const int64_t widths[] = {1, 2, 17, 31, 33, 63, 172};
    const uint32_t dts[] = {DJ_Q8, DJ_Q4};
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++)
        for (int kind = 0; kind < 5; kind++)
            for (size_t d = 0; d < 2; d++) {
                const int64_t n = widths[wi];
                float x[172], grp[32];
                for (int64_t i = 0; i < n; i++) {
                    const float v = tc_normal();
                    x[i] = kind == 0 ? 0.1f + fabsf(v) : kind == 1 ? -0.1f - fabsf(v) : kind == 2 ? v : 0.0f;
                }
                if (kind == 4) x[n - 1] = 3.0f;  // one value, the rest zero
                uint8_t row[256];
                cr_assert_eq(quant_row(dts[d], x, n, row, NULL, NULL), 0);
                const int64_t last = (n - 1) / 32;
                dequant_group(dts[d], row, n, last, grp);
                for (int64_t j = n - last * 32; j < 32; j++)
                    cr_assert_eq(grp[j], 0.0f, "%s, %lld columns, values of kind %d: padding %lld widens to %g (seed "
                                 "%llu)", dj_dtype_name(dts[d]), (long long)n, kind, (long long)j, grp[j],
                                 (unsigned long long)tc_seed_used());
                const uint64_t so = dj_scales_offset(dts[d], (uint64_t)n), rb = dj_row_bytes(dts[d], (uint64_t)n);
                for (uint64_t b = so + 2 * (uint64_t)(last + 1); b < rb; b++)
                    cr_assert_eq(row[b], 0, "%s, %lld columns: row byte %llu", dj_dtype_name(dts[d]), (long long)n,
                                 (unsigned long long)b);
            }
}

// The search's two builds (SSE, AVX2) add in the same order: the same bytes on every host.
Test(quant, search_builds_give_the_same_bytes) {
    if (!quant_use_avx2(1)) cr_skip_test("this CPU has no AVX2: the SSE build alone runs here");
    tc_rng_fresh("quant.search_builds_give_the_same_bytes");
    const int64_t widths[] = {1, 31, 32, 33, 172, 4096};
    float x[4096];
    uint8_t a[8192], b[8192];
    int64_t rows = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++)
        for (int rep = 0; rep < 400; rep++, rows++) {
            const int64_t n = widths[wi];
            const float scale = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.0f : 300.0f;
            for (int64_t i = 0; i < n; i++) {
                x[i] = tc_normal() * scale;
                if (rep % 5 == 1) x[i] = fabsf(x[i]);                 // one-sided groups
                if (rep % 7 == 2 && i % 3) x[i] = 0;                  // mostly zeros
                if (rep % 11 == 3 && i == n / 2) x[i] = 40 * scale;   // a spike
            }
            for (uint32_t dt = DJ_Q8; dt <= DJ_Q4; dt++) {
                // the figures of a few candidates of the first group, bit for bit
                const int g = n < 32 ? (int)n : 32;
                float mx = 0;
                for (int i = 0; i < g; i++) mx = fmaxf(mx, fabsf(x[i]));
                for (int c = 0; c < 4 && mx > 0; c++) {
                    const float sc = mx / (dt == DJ_Q8 ? 120.0f : 7.0f) * (1 + 0.03f * c),
                                z = dt == DJ_Q8 ? 128.0f + 4 * (c - 2) : 7.5f + 0.25f * c;
                    quant_use_avx2(0);
                    const float e4 = quant_search_err(dt, x, g, sc, z);
                    quant_use_avx2(1);
                    const float e8 = quant_search_err(dt, x, g, sc, z);
                    cr_assert(!memcmp(&e4, &e8, 4), "%s group of %d: %.9g against %.9g", dj_dtype_name(dt), g,
                              (double)e4, (double)e8);
                }
                quant_use_avx2(0);
                cr_assert_eq(quant_row(dt, x, n, a, NULL, NULL), 0);
                quant_use_avx2(1);
                cr_assert_eq(quant_row(dt, x, n, b, NULL, NULL), 0);
                cr_assert(!memcmp(a, b, dj_row_bytes(dt, (uint64_t)n)), "%s row of %lld (rep %d): the builds differ",
                          dj_dtype_name(dt), (long long)n, rep);
            }
        }
    cr_log_info("%lld rows in q8 and q4 the same from both builds", (long long)rows);
}

// ---- the CPU's matvec on quantized rows, vector (AVX-512 VNNI, AVX2) and portable paths, against the reference
// matmul. The portable path widens exactly, as the matmul does: only the order of the sums differs (2e-6). The vector
// path sums in integers against x quantized in two int8 parts per group of 32 (cpu.c): each x_i off by at most
// max|x_g| / 64516, independently, so the result is off by ~ rms(x_i error) / rms(x) = (max|x_g| / rms(x)) / (64516 *
// sqrt(3)): 1.5e-5 for uniform x, 5.1e-5 at most (a group with one nonzero value: max / rms = sqrt(32)). That is
// the typical size, not a bound: an output of 33 inputs can sum to near zero (5 such outputs reached 6.8e-5 of plain
// relative error in 150 runs, median 1.4e-5), so each output's error is taken against its own expected size,
// sqrt(sum_i w_i^2 (max|x_g| / 64516)^2 / 3) (x_i's rounding uniform within +-max|x_g| / 64516), and the rms of
// those ratios over the outputs must stay under 4 (~1 expected, 2.2 the largest in 150 runs of 5 outputs; one int8
// part alone gives ~254).
Test(quant, cpu_matvec_against_matmul) {
    tc_rng_fresh("quant.cpu_matvec_against_matmul");
    const int64_t shapes[][2] = {{64, 172}, {172, 64}, {4096, 96}, {96, 4000}, {33, 5}};
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)n_in);
            uint8_t *w = malloc(rb * (size_t)n_out);
            float *row = malloc((size_t)n_in * 4), *x = malloc((size_t)n_in * 4);
            float *ref = malloc((size_t)n_out * 4), *got = malloc((size_t)n_out * 4);
            double *expect = malloc((size_t)n_out * 8);
            for (int64_t o = 0; o < n_out; o++) {
                tc_fill(row, n_in, -1, 1);
                cr_assert_eq(quant_row(wt, row, n_in, w + (size_t)o * rb, NULL, NULL), 0);
            }
            tc_fill(x, n_in, -1, 1);
            for (int64_t o = 0; o < n_out; o++) {  // each output's expected error on the vector path
                dequant_row(wt, w + (size_t)o * rb, n_in, row);
                double v = 0, gmax = 0;
                for (int64_t i = 0; i < n_in; i++) {
                    if (i % 32 == 0) {
                        gmax = 0;
                        for (int64_t k = i; k < n_in && k < i + 32; k++) gmax = fmax(gmax, fabs(x[k]));
                    }
                    v += (double)row[i] * row[i] * (gmax / 64516) * (gmax / 64516) / 3;
                }
                expect[o] = sqrt(v) + 1e-30;
            }
            cpu_matmul(ref, x, w, wt, 1, n_in, n_out);
            for (int simd = CPU_SIMD_AVX512; simd >= 0; simd--) {  // VNNI (where the CPU has it), AVX2, portable
                const int vec = cpu_set_simd(simd);  // non-zero: the vector path runs
                cpu_matvec(got, x, w, wt, n_in, n_out);
                if (!vec) {
                    cr_assert(tc_rel_l2(got, ref, n_out) < 2e-6, "%s %lldx%lld portable: rel %g", dj_dtype_name(wt),
                              (long long)n_out, (long long)n_in, tc_rel_l2(got, ref, n_out));
                    continue;
                }
                double r2 = 0;
                for (int64_t o = 0; o < n_out; o++) r2 += pow(((double)got[o] - ref[o]) / expect[o], 2) / (double)n_out;
                cr_assert(sqrt(r2) < 4, "%s %lldx%lld simd %d: errors %g times their expected size",
                          dj_dtype_name(wt), (long long)n_out, (long long)n_in, simd, sqrt(r2));
            }
            cpu_set_simd(CPU_SIMD_BEST);
            free(w), free(row), free(x), free(ref), free(got), free(expect);
        }
}

// cpu_matvec_multi on quantized rows (a pass of several rows): it dequantizes exactly, as the matmul does, on every
// path (AVX-512, AVX2, portable), so only the order of the sums differs. Row counts 1..3 past a multiple of the
// 3- and 4-row tiles, partial last groups, T over every column tile (AVX2: 4, 3, 2, 1 left; AVX-512: 6..1).
Test(quant, cpu_matvec_multi_against_matmul) {
    tc_rng_fresh("quant.cpu_matvec_multi_against_matmul");
    const int64_t shapes[][3] = {{2, 64, 172}, {3, 172, 64}, {5, 4096, 97}, {8, 96, 400},
                                 {17, 33, 5},  {7, 30, 1},   {13, 48, 38},  {4, 16, 3}};
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int64_t T = shapes[si][0], n_in = shapes[si][1], n_out = shapes[si][2];
            size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)n_in);
            uint8_t *w = malloc(rb * (size_t)n_out);
            float *row = malloc((size_t)n_in * 4), *x = malloc((size_t)(T * n_in) * 4);
            float *ref = malloc((size_t)(T * n_out) * 4), *got = malloc((size_t)(T * n_out) * 4);
            for (int64_t o = 0; o < n_out; o++) {
                tc_fill(row, n_in, -1, 1);
                cr_assert_eq(quant_row(wt, row, n_in, w + (size_t)o * rb, NULL, NULL), 0);
            }
            tc_fill(x, T * n_in, -1, 1);
            cpu_matmul(ref, x, w, wt, T, n_in, n_out);
            for (int simd = CPU_SIMD_AVX512; simd >= 0; simd--) {
                cpu_set_simd(simd);
                memset(got, 0xff, (size_t)(T * n_out) * 4);  // NaNs: a value not written fails
                cpu_matvec_multi(got, x, w, wt, T, n_in, n_out);
                cr_assert(tc_rel_l2(got, ref, T * n_out) < 2e-6, "%s T=%lld %lldx%lld simd %d: rel %g",
                          dj_dtype_name(wt), (long long)T, (long long)n_out, (long long)n_in, simd,
                          tc_rel_l2(got, ref, T * n_out));
            }
            cpu_set_simd(CPU_SIMD_BEST);
            free(w), free(row), free(x), free(ref), free(got);
        }
}

// The vector path against a double-precision dot of the exactly widened weights, on normal x with outliers (one
// group in 8 holds a value 40x the others) and an all-zero group: per output within the bound of x's two-part
// rounding, sum over groups of max|x_g| / 64516 * sum|w_i| (+1% for the f32 steps of the rounding, + 1e-6 of
// sum|w_i x_i| for the f32 sums), and over all outputs within 2.5e-4 relative: x rounded to one int8 part (1/254 of
// max|x_g|) gives ~4e-3 and fails both. On these inputs the two parts give a median of 4.6e-5 per width and path, the
// largest 8.2e-5 in 200 runs of each; a bound of 1e-4 failed one whole run in 300 (24 rows of 14336). Widths: one group, partial last groups, q4's VNNI blocks of 4 groups with
// 1..3 of them past the last 16 groups and 1..3 groups past the last block, Llama-3-8B's 4096 and 14336.
// Then inf and NaN in x give NaN as in f32, and x = 0 gives 0. Both integer paths: AVX-512 VNNI (where the CPU has
// it) and AVX2.
Test(quant, cpu_matvec_integer_path_against_double) {
    if (!cpu_set_simd(CPU_SIMD_BEST)) {
        cr_log_info("this CPU lacks AVX2/FMA/F16C: cpu_matvec's integer path does not run");
        return;
    }
    if (cpu_set_simd(CPU_SIMD_AVX512) != CPU_SIMD_AVX512)
        cr_log_info("this CPU lacks AVX-512: the VNNI path is not tested");
    tc_rng_fresh("quant.cpu_matvec_integer_path_against_double");
    const int64_t shapes[][2] = {{32, 64},  {33, 40}, {100, 64},  {172, 64},
                                 {416, 64}, {736, 64}, {4096, 64}, {14336, 24}};
    for (int pass = 0; pass < 4; pass++) {  // q8, q4 on the VNNI path (where the CPU has it), then on AVX2
        const uint32_t wt = pass % 2 ? DJ_Q4 : DJ_Q8;
        cpu_set_simd(pass < 2 ? CPU_SIMD_AVX512 : CPU_SIMD_AVX2);
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            int64_t n_in = shapes[si][0], n_out = shapes[si][1], groups = (n_in + 31) / 32;
            size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)n_in);
            uint8_t *w = malloc(rb * (size_t)n_out);
            float *row = malloc((size_t)n_in * 4), *x = malloc((size_t)n_in * 4), *got = malloc((size_t)n_out * 4);
            double *want = malloc((size_t)n_out * 8), *gmax = malloc((size_t)groups * 8);
            for (int64_t i = 0; i < n_in; i++) x[i] = tc_normal();
            for (int64_t g = 0; g < groups; g += 8)
                x[g * 32 + tc_below((uint32_t)(n_in - g * 32 < 32 ? n_in - g * 32 : 32))] *= 40;
            if (groups > 2) memset(x + 32, 0, 32 * 4);  // group 1
            for (int64_t g = 0; g < groups; g++) {
                gmax[g] = 0;
                for (int64_t i = g * 32; i < n_in && i < g * 32 + 32; i++) gmax[g] = fmax(gmax[g], fabs(x[i]));
            }
            cpu_matvec(got, x, w, wt, n_in, 0);  // no rows: nothing written, nothing read
            for (int64_t o = 0; o < n_out; o++) {
                tc_fill(row, n_in, -1, 1);
                cr_assert_eq(quant_row(wt, row, n_in, w + (size_t)o * rb, NULL, NULL), 0);
            }
            cpu_matvec(got, x, w, wt, n_in, n_out);
            for (int64_t o = 0; o < n_out; o++) {
                dequant_row(wt, w + (size_t)o * rb, n_in, row);
                double bound = 0, mag = 0;
                want[o] = 0;
                for (int64_t i = 0; i < n_in; i++) {
                    want[o] += (double)row[i] * x[i];
                    mag += fabs((double)row[i] * x[i]);
                    bound += fabs(row[i]) * gmax[i / 32] / 64516 * 1.01;
                }
                bound += 1e-6 * mag + 1e-30;
                cr_assert(fabs(got[o] - want[o]) <= bound, "%s %lldx%lld row %lld: %.9g vs %.9g (bound %g)",
                          dj_dtype_name(wt), (long long)n_out, (long long)n_in, (long long)o, got[o], want[o], bound);
            }
            double rel = tc_rel_l2_d(got, want, n_out);
            cr_assert(rel < 2.5e-4, "%s %lldx%lld: rel %g", dj_dtype_name(wt), (long long)n_out, (long long)n_in, rel);
            x[n_in - 1] = INFINITY;
            cpu_matvec(got, x, w, wt, n_in, n_out);
            for (int64_t o = 0; o < n_out; o++) cr_assert(isnan(got[o]) || isinf(got[o]), "inf in x: %g", got[o]);
            x[0] = NAN;
            cpu_matvec(got, x, w, wt, n_in, n_out);
            for (int64_t o = 0; o < n_out; o++) cr_assert(isnan(got[o]), "NaN in x: %g", got[o]);
            memset(x, 0, (size_t)n_in * 4);
            cpu_matvec(got, x, w, wt, n_in, n_out);
            for (int64_t o = 0; o < n_out; o++) cr_assert(got[o] == 0, "x = 0: %g", got[o]);
            free(w), free(row), free(x), free(got), free(want), free(gmax);
        }
    }
    cpu_set_simd(CPU_SIMD_BEST);
}

// ---- models
// Converts src (tokenizer from tok, NULL: src) to dtype into dir/name and loads it for the CPU.
static void tq_convert(dj_model *m, const char *dir, const char *name, const char *src, const char *tok, int dtype) {
    char out[4300];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    convert_opts co = {.hf_dir = src, .out_path = out, .tok_dir = tok, .dtype = dtype, .quiet = 1};
    dj_err e;
    cr_assert_eq(convert_run(&co, &e), 0, "%s: %s", name, e.msg);
    dj_load_opts lo = {.quiet = 1};
    cr_assert_eq(model_load(out, &lo, m, &e), 0, "%s", e.msg);
}

// The model's logits for ids (T), every position, on the CPU.
static float *tq_logits(const dj_model *m, const int32_t *ids, int64_t T) {
    dj_err e;
    dj_cpu_state *s = cpu_state_new(m, T, &e);
    cr_assert(s, "%s", e.msg);
    float *lg = malloc((size_t)T * m->info.config.vocab_size * 4);
    cr_assert_eq(cpu_forward(s, ids, T, 0, lg, &e), 0, "%s", e.msg);
    cpu_state_free(s);
    return lg;
}

// An f32 image of quantized model q at path, loaded into w: its embeddings and lm_head widened, and its layers'
// matrices widened too, or with f (q's checkpoint in f32) given, f's weights through round-to-nearest (rtn_q4): the
// baseline model, its embeddings and head as q's.
static void tq_widened(dj_model *w, const dj_model *q, const dj_model *f, const char *path) {
    const dj_model_info *qi = &q->info;
    dj_config c = qi->config;
    dj_config_set_wtype(&c, DJ_F32);
    dj_model_info fi;
    dj_err e;
    cr_assert_eq(model_plan(&c, qi->tok_size, &fi, &e), 0, "%s", e.msg);
    uint8_t *img = calloc(1, fi.file_size);
    cr_assert_eq(model_write_header(&fi, img, fi.header_bytes, &e), 0, "%s", e.msg);
    memcpy(img + fi.tok_off, q->data + qi->tok_off, qi->tok_size);
    const dj_config *qc = &qi->config;
    for (int64_t r = 0; r < qc->vocab_size; r++)
        dequant_row(qc->embed_type, q->data + qi->embed_off + (uint64_t)r * dj_row_bytes(qc->embed_type, qc->dim),
                    qc->dim, (float *)(img + fi.embed_off) + r * qc->dim);
    memcpy(img + fi.head_off + fi.head.norm, q->data + qi->head_off + qi->head.norm, (size_t)qc->dim * 4);
    if (!qc->tied)
        for (int64_t r = 0; r < qc->vocab_size; r++)
            dequant_row(qc->head_type,
                        q->data + qi->head_off + qi->head.lm_head + (uint64_t)r * dj_row_bytes(qc->head_type, qc->dim),
                        qc->dim, (float *)(img + fi.head_off + fi.head.lm_head) + r * qc->dim);
    int64_t dim = qc->dim, qd = (int64_t)qc->n_heads * qc->head_dim, kvd = (int64_t)qc->n_kv_heads * qc->head_dim,
            hid = qc->hidden_dim;
    for (uint32_t l = 0; l < qc->n_layers; l++) {
        const uint8_t *src = q->data + qi->layer_off[l];
        uint8_t *dst = img + fi.layer_off[l];
        memcpy(dst + fi.layer.attn_norm, src + qi->layer.attn_norm, (size_t)dim * 4);
        memcpy(dst + fi.layer.ffn_norm, src + qi->layer.ffn_norm, (size_t)dim * 4);
        // (tensor offset in q's layout, in the f32 layout, rows, cols)
        const struct { uint64_t qo, fo; int64_t rows, cols; } t[] = {
            {qi->layer.wq, fi.layer.wq, qd, dim},         {qi->layer.wk, fi.layer.wk, kvd, dim},
            {qi->layer.wv, fi.layer.wv, kvd, dim},        {qi->layer.wo, fi.layer.wo, dim, qd},
            {qi->layer.w_gate, fi.layer.w_gate, hid, dim}, {qi->layer.w_up, fi.layer.w_up, hid, dim},
            {qi->layer.w_down, fi.layer.w_down, dim, hid}};
        for (size_t k = 0; k < sizeof t / sizeof *t; k++)
            for (int64_t r = 0; r < t[k].rows; r++) {
                float *out = (float *)(dst + t[k].fo) + r * t[k].cols;
                const float *fr = f ? (const float *)(f->data + f->info.layer_off[l] + t[k].fo) + r * t[k].cols : NULL;
                if (f) rtn_q4(fr, t[k].cols, out);
                else dequant_row(qc->wtype, src + t[k].qo + (uint64_t)r * dj_row_bytes(qc->wtype, (uint64_t)t[k].cols),
                                 t[k].cols, out);
            }
    }
    tc_write(path, img, fi.file_size);
    free(img);
    dj_info_free(&fi);
    dj_load_opts lo = {.quiet = 1};
    cr_assert_eq(model_load(path, &lo, w, &e), 0, "%s", e.msg);
}

// A quantized model's forward pass is the f32 forward pass of its weights widened: the same logits up to the order
// of sums.
Test(quant, model_forward_equals_its_widened_weights) {
    char stories[4096];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    char *dir = tc_tmpdir("quant");
    for (int dtype = DJ_Q8; dtype <= DJ_Q4; dtype++) {
        dj_model q, f;
        tq_convert(&q, dir, "q.bin", stories, NULL, dtype);
        char fpath[4300];
        snprintf(fpath, sizeof fpath, "%s/widened.bin", dir);
        tq_widened(&f, &q, NULL, fpath);
        int32_t ids[40];
        tc_rng_seed(5);
        ids[0] = 1;
        for (int i = 1; i < 40; i++) ids[i] = (int32_t)tc_below(512);
        float *a = tq_logits(&q, ids, 40), *b = tq_logits(&f, ids, 40);
        for (int t = 0; t < 40; t++)
            cr_assert(tc_rel_l2(a + t * 512, b + t * 512, 512) < 1e-5, "%s position %d: rel %g", dj_dtype_name((uint32_t)dtype),
                      t, tc_rel_l2(a + t * 512, b + t * 512, 512));
        free(a), free(b);
        model_free(&f), model_free(&q);
    }
    tc_rm_rf(dir);
    free(dir);
}

// ---- quality, against the unquantized model: every position of every reference model
typedef struct {
    double kl;
    int64_t top1, n;
} tq_quality;

static tq_quality tq_against_ref(const dj_model *m, const char *ref_path) {
    dj_ref r;
    dj_err e;
    cr_assert_eq(ref_load(ref_path, &r, &e), 0, "%s", e.msg);
    float *lg = tq_logits(m, r.ids, r.n_tokens);
    FILE *sink = fopen("/dev/null", "w");
    dj_check ck;
    check_logits(&r, lg, sink, &ck);
    fclose(sink);
    tq_quality q = {ck.mean_kl, ck.agree, r.n_tokens};
    free(lg);
    ref_free(&r);
    return q;
}

// Over a text of a few thousand tokens, in windows of the context: each model's perplexity, and its top-1 agreement
// with the first model (the f32 one) at every position.
typedef struct {
    double ppl;
    int64_t top1, n;
} tq_text;

static void tq_on_text(const dj_model *m, int n_models, const char *text_path, tq_text *out) {
    size_t n;
    char *text = tc_must_read(text_path, &n);
    dj_err e;
    dj_tokenizer *tok = tok_load(m[0].data + m[0].info.tok_off, (size_t)m[0].info.tok_size, &e);
    cr_assert(tok, "%s", e.msg);
    int32_t *ids;
    size_t n_ids;
    cr_assert_eq(tok_encode(tok, text, n, 1, &ids, &n_ids, &e), 0, "%s", e.msg);
    double nll[8] = {0};
    int64_t scored = 0;
    cr_assert_leq(n_models, 8);
    memset(out, 0, sizeof *out * (size_t)n_models);
    int64_t ctx = m[0].info.config.max_seq_len, V = m[0].info.config.vocab_size;
    for (int64_t w0 = 0; w0 + 1 < (int64_t)n_ids; w0 += ctx) {
        int64_t T = (int64_t)n_ids - w0 < ctx ? (int64_t)n_ids - w0 : ctx;
        float *ref = tq_logits(&m[0], ids + w0, T);
        for (int k = 0; k < n_models; k++) {
            float *lg = k ? tq_logits(&m[k], ids + w0, T) : ref;
            for (int64_t t = 0; t < T; t++) {
                if (t + 1 < T) nll[k] += check_nll(lg + t * V, V, ids[w0 + t + 1]), scored += !k;
                out[k].top1 += dj_argmax(lg + t * V, V) == dj_argmax(ref + t * V, V);
            }
            out[k].n += T;
            if (k) free(lg);
        }
        free(ref);
    }
    cr_assert_gt(scored, 2000, "stories.txt gave %lld tokens", (long long)scored);
    for (int k = 0; k < n_models; k++) out[k].ppl = exp(nll[k] / (double)scored);
    tok_free(tok), free(ids), free(text);
}

// The f32 model at path, loaded into x with every weight (embeddings, norms, matrices) times 1 + u 2^-8, u uniform in
// [-1, 1] from a fixed hash: noise the size of bf16's rounding, far below q8's error. How often that alone moves a
// reference's top-1 says how finely the reference can resolve top-1 agreement (its near-ties).
static void tq_noised(dj_model *x, const char *path) {
    dj_load_opts lo = {.quiet = 1};
    dj_err e;
    cr_assert_eq(model_load(path, &lo, x, &e), 0, "%s", e.msg);
    float *w = (float *)(x->data + x->info.embed_off);
    uint64_t n = (x->info.file_size - x->info.embed_off) / 4;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t h = (j + 1) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 32;
        w[j] *= (float)(1 + ((double)(h & 0xFFFFFF) / 8388608.0 - 1) * 0x1p-8);
    }
}

Test(quant, quality_on_every_reference_model, .timeout = 600) {
    char stories[4096], text[4096];
    tc_data_path(stories, sizeof stories, "models/stories260K");
    tc_data_path(text, sizeof text, "texts/stories.txt");
    const char *refs[] = {"stories260K", "tied_gqa_f16", "mha_untied_f16", "llama3_gqa_bf16"};
    char *dir = tc_tmpdir("quant");
    tq_quality tot[4] = {{0}};  // q8, q4, round-to-nearest, f32 with bf16-sized noise
    for (int i = 0; i < 4; i++) {
        char src[4300], ref[4300], fpath[4300], rpath[4300];
        if (i == 0) snprintf(src, sizeof src, "%s", stories);
        else snprintf(src, sizeof src, "%s/fixtures/%s", tc_tests_dir(), refs[i]);
        snprintf(ref, sizeof ref, "%s/ref/%s.bin", tc_tests_dir(), refs[i]);
        // f32; q8, q4, q4's layers as round-to-nearest with one f16 scale would store them (tq_widened); f32 noised
        dj_model m[5];
        tq_convert(&m[0], dir, "f32.bin", src, i ? stories : NULL, DJ_F32);
        tq_convert(&m[1], dir, "q8.bin", src, i ? stories : NULL, DJ_Q8);
        tq_convert(&m[2], dir, "q4.bin", src, i ? stories : NULL, DJ_Q4);
        snprintf(rpath, sizeof rpath, "%s/rtn.bin", dir);
        tq_widened(&m[3], &m[2], &m[0], rpath);
        snprintf(fpath, sizeof fpath, "%s/f32.bin", dir);
        tq_noised(&m[4], fpath);
        tq_quality q[4];
        for (int k = 0; k < 4; k++) {
            q[k] = tq_against_ref(&m[k + 1], ref);
            tot[k].kl += q[k].kl * (double)q[k].n, tot[k].top1 += q[k].top1, tot[k].n += q[k].n;
        }
        cr_log_info("%s: q8 KL %.2e top1 %lld/%lld; q4 KL %.2e top1 %lld; q4 round-to-nearest KL %.2e top1 %lld; "
                    "f32 with bf16-sized noise KL %.2e top1 %lld", refs[i], q[0].kl, (long long)q[0].top1,
                    (long long)q[0].n, q[1].kl, (long long)q[1].top1, q[2].kl, (long long)q[2].top1, q[3].kl,
                    (long long)q[3].top1);
        if (i == 0) {
            // the real model, on a real text of 2187 tokens as well as the reference's 205
            tq_text tx[4];
            tq_on_text(m, 4, text, tx);
            cr_log_info("stories260K on stories.txt, %lld positions: perplexity f32 %.4f, q8 %.4f, q4 %.4f, q4 "
                        "round-to-nearest %.4f; top-1 agreement with f32: q8 %.2f%%, q4 %.2f%%, "
                        "round-to-nearest %.2f%%",
                        (long long)tx[0].n, tx[0].ppl, tx[1].ppl, tx[2].ppl, tx[3].ppl,
                        100.0 * (double)tx[1].top1 / (double)tx[1].n, 100.0 * (double)tx[2].top1 / (double)tx[2].n,
                        100.0 * (double)tx[3].top1 / (double)tx[3].n);
            // The q8 targets: a mean KL of 1e-3 (also checked below over all four) and top-1 agreement of
            // 99%, here on the real weights over the text's positions (99.50%). On the reference's 205 it is 202
            // (98.5%): three near-ties, each of KL below 1e-3; 98% there bounds a broken quantizer.
            cr_expect(q[0].kl <= 1e-3, "stories260K q8: mean KL %g > 1e-3", q[0].kl);
            cr_expect((double)tx[1].top1 >= 0.99 * (double)tx[1].n, "stories.txt q8: top-1 %lld of %lld",
                      (long long)tx[1].top1, (long long)tx[1].n);
            cr_expect((double)q[0].top1 >= 0.98 * (double)q[0].n, "stories260K q8: top-1 %lld of %lld",
                      (long long)q[0].top1, (long long)q[0].n);
            cr_expect(q[1].kl <= q[2].kl, "stories260K q4: KL %g worse than round-to-nearest's %g", q[1].kl, q[2].kl);
            cr_expect(q[1].top1 >= q[2].top1 && tx[2].top1 >= tx[3].top1,
                      "stories260K q4: top-1 %lld and %lld on the text, round-to-nearest's %lld and %lld",
                      (long long)q[1].top1, (long long)tx[2].top1, (long long)q[2].top1, (long long)tx[3].top1);
            cr_expect(tx[2].ppl <= tx[3].ppl, "q4 perplexity %g worse than round-to-nearest's %g", tx[2].ppl,
                      tx[3].ppl);
            cr_expect(tx[1].ppl <= tx[0].ppl * 1.005, "q8 perplexity %g more than 0.5%% above f32's %g", tx[1].ppl,
                      tx[0].ppl);
        }
        for (int k = 0; k < 5; k++) model_free(&m[k]);
        // every model: bounds a broken quantizer or kernel would not meet
        cr_expect(q[0].kl <= 1e-2 && q[1].kl <= 0.3, "%s: KL q8 %g, q4 %g", refs[i], q[0].kl, q[1].kl);
    }
    cr_expect(tot[0].kl <= 1e-3 * (double)tot[0].n, "all four references: q8 mean KL %g > 1e-3",
              tot[0].kl / (double)tot[0].n);
    cr_expect(tot[1].kl <= tot[2].kl && tot[1].top1 >= tot[2].top1,
              "all four references: q4 KL %g top-1 %lld, round-to-nearest's %g and %lld", tot[1].kl / (double)tot[1].n,
              (long long)tot[1].top1, tot[2].kl / (double)tot[2].n, (long long)tot[2].top1);
    // The random fixtures' logits are near-flat: noise the size of bf16's rounding alone moves up to 5% of a fixture's
    // top-1 (97.9% over the four), so they resolve no top-1 target of 99% for a format of 16 bits or fewer.
    cr_log_info("all four references, %lld positions: q8 KL %.2e top1 %.1f%%; q4 KL %.2e top1 %.1f%%; "
                "q4 round-to-nearest KL %.2e top1 %.1f%%; f32 with bf16-sized noise KL %.2e top1 %.1f%%",
                (long long)tot[0].n,
                tot[0].kl / (double)tot[0].n, 100.0 * (double)tot[0].top1 / (double)tot[0].n,
                tot[1].kl / (double)tot[1].n, 100.0 * (double)tot[1].top1 / (double)tot[1].n,
                tot[2].kl / (double)tot[2].n, 100.0 * (double)tot[2].top1 / (double)tot[2].n,
                tot[3].kl / (double)tot[3].n, 100.0 * (double)tot[3].top1 / (double)tot[3].n);
    tc_rm_rf(dir);
    free(dir);
}
