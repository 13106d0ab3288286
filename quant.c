// quant.c: q8 and q4 rows (quant.h).
#include "quant.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

// ---- one group
#define Q_CODES 7  // scales tried a group, each 1/32 of an octave above the one before
// The unsigned u = round(x / s + z) clamped to 0..umax of each of the group's g values: q8 stores u - 128 with
// z = 4 c, q4 u with z = c / 4.
static void q_round(const float *x, int g, float s, float z, int umax, uint8_t *u) {
    const float inv = 1.0f / s, top = (float)umax, M = 12582912.0f;  // 1.5 * 2^23
    for (int i = 0; i < g; i++) {
        // round to nearest, ties to even, as lrintf (|x / s + z| < 2^22: s is at least 0.97 of the range's step)
        float q = (x[i] * inv + z + M) - M;
        u[i] = (uint8_t)(q < 0.0f ? 0.0f : q > top ? top : q);
    }
}

// A group's range [min(x, 0), max(x, 0)] into mn, mx and the first scale code to try, that of 0.97 of the range
// over `steps`: 1, 0 where the range is empty (all zeros: the parameter 0, scale 0), -1 where the scale overflows.
static int q_first_code(const float *x, int g, float steps, float *mn, float *mx, int *code0) {
    *mn = *mx = 0;
    for (int i = 0; i < g; i++) *mn = x[i] < *mn ? x[i] : *mn, *mx = x[i] > *mx ? x[i] : *mx;
    if (!(*mx - *mn > 0)) return 0;
    const uint16_t h = dj_f32_to_f16((*mx - *mn) / steps * 0.97f);
    if (h >= DJ_Q_CODE_END << 5) return -1;
    *code0 = h >> 5 ? h >> 5 : 1;
    return 1;
}

// The zero points c a group's search tries at scale s, lo..hi: q8 the 4 nearest to the one that puts the minimum at
// u = 0; q4 those that leave [mn, mx] unclipped (at most 9, the middle ones).
static void q_zero_range(uint32_t dtype, float s, float mn, float mx, int *lo, int *hi) {
    if (dtype == DJ_Q8) {
        *lo = (int)floorf(-mn / s * 0.25f) - 1, *hi = *lo + 3;
    } else {
        float za = 4.0f * (15.0f - mx / s), zb = 4.0f * (-mn / s);
        *lo = (int)floorf(za < zb ? za : zb), *hi = (int)ceilf(za < zb ? zb : za);
        if (*hi - *lo > 8) *lo = (*lo + *hi) / 2 - 4, *hi = *lo + 8;
    }
    *lo = *lo < 0 ? 0 : *lo, *hi = *hi > 63 ? 63 : *hi;
}

// A zero point's c in units of the stored u: q8 4 c, q4 c / 4.
static float q_zero_u(uint32_t dtype, int c) { return dtype == DJ_Q8 ? 4.0f * (float)c : (float)c * 0.25f; }

// The squared error of s * (u - z) for q_round's u, for the search: from GCC's vector extensions, summed in f32 over
// the lanes `valid` marks 1 (g of them; the padding's 0). quant_row reports the kept pair's error in doubles, so
// pairs whose f32 errors are within ~1e-6 of each other may rank either way. Two builds of it add in the same order,
// so a checkpoint converts to the same bytes on every host: four lanes (SSE) with two sums, one over the even fours
// of weights and one over the odd, and eight (AVX2, where the CPU has it) whose halves are those two sums. AVX2 took
// an 8B conversion on the GPU machine's 16 cores from 40.0 to 32.7-34.5 s (q4; bench/results/convert_speed).
typedef float q_v4 __attribute__((vector_size(16)));
typedef int32_t q_v4i __attribute__((vector_size(16)));
typedef float q_v8 __attribute__((vector_size(32)));
typedef int32_t q_v8i __attribute__((vector_size(32)));
typedef union {
    q_v4 v4[DJ_QGROUP / 4];
    q_v8 v8[DJ_QGROUP / 8];
    float f[DJ_QGROUP];
} q_lanes;

#define Q_ERR_STEP(V, VI, x, valid, acc)                                                                       \
    do {                                                                                                        \
        V q = ((x) * inv + z + M) - M;                                                                          \
        const VI neg = q < 0.0f, over = q > topv;                                                               \
        q = (V)((VI)q & ~neg);                                                                                  \
        q = (V)(((VI)q & ~over) | ((VI)topv & over));                                                           \
        const V d = (x) - s * (q - z);                                                                          \
        (acc) += d * d * (valid);                                                                               \
    } while (0)

static float q_err4(const q_lanes *x, const q_lanes *valid, float s, float z, float top) {
    const float inv = 1.0f / s, M = 12582912.0f;  // as q_round
    const q_v4 topv = (q_v4){0} + top;
    q_v4 acc[2] = {{0}, {0}};
    for (int k = 0; k < DJ_QGROUP / 4; k++) Q_ERR_STEP(q_v4, q_v4i, x->v4[k], valid->v4[k], acc[k & 1]);
    return ((acc[0][0] + acc[1][0]) + (acc[0][1] + acc[1][1])) + ((acc[0][2] + acc[1][2]) + (acc[0][3] + acc[1][3]));
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) static float q_err8(const q_lanes *x, const q_lanes *valid, float s, float z,
                                                     float top) {
    const float inv = 1.0f / s, M = 12582912.0f;
    const q_v8 topv = (q_v8){0} + top;
    q_v8 acc = {0};
    for (int k = 0; k < DJ_QGROUP / 8; k++) Q_ERR_STEP(q_v8, q_v8i, x->v8[k], valid->v8[k], acc);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
#endif
#undef Q_ERR_STEP

// Whether the AVX2 build runs: -1 undecided (then the CPU's answer, the same from every thread), 0 or 1.
static _Atomic int q_avx2 = -1;

static int q_cpu_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2");  // also checks that the OS saves the AVX state
#else
    return 0;
#endif
}

int quant_use_avx2(int on) {
    const int v = on && q_cpu_avx2();
    atomic_store_explicit(&q_avx2, v, memory_order_relaxed);
    return v;
}

static float q_err(const q_lanes *x, const q_lanes *valid, float s, float z, float top) {
    int avx2 = atomic_load_explicit(&q_avx2, memory_order_relaxed);
    if (avx2 < 0) avx2 = quant_use_avx2(1);
#if defined(__x86_64__) || defined(__i386__)
    if (avx2) return q_err8(x, valid, s, z, top);
#endif
    return q_err4(x, valid, s, z, top);
}

static void q_load(const float *x, int g, q_lanes *xv, q_lanes *valid) {
    memset(xv, 0, sizeof *xv), memcpy(xv->f, x, (size_t)g * sizeof *x);
    for (int i = 0; i < DJ_QGROUP; i++) valid->f[i] = i < g;
}

float quant_search_err(uint32_t dtype, const float *x, int g, float s, float z) {
    q_lanes xv, valid;
    q_load(x, g, &xv, &valid);
    return q_err(&xv, &valid, s, z, dtype == DJ_Q8 ? 255.0f : 15.0f);
}

// The parameter of a group of g values (1..DJ_QGROUP) and the unsigned u of all DJ_QGROUP (the padding's the u
// nearest to 0: exactly 0 in q8): among Q_CODES scales from 0.97 of the range [min(x, 0), max(x, 0)] over 255 (q8) or
// 15 (q4) up, each 1/32 of an octave above the one before, and for each the zero points q_zero_range gives, the pair
// with the least squared error. -1 when the scale overflows.
static int q_group(uint32_t dtype, const float *x, int g, uint16_t *param, uint8_t *u) {
    const int umax = dtype == DJ_Q8 ? 255 : 15;
    float mn, mx;
    int code0, rc = q_first_code(x, g, (float)umax, &mn, &mx, &code0);
    *param = 0;
    memset(u, dtype == DJ_Q8 ? 128 : 0, DJ_QGROUP);  // all zeros: every k 0
    if (rc <= 0) return rc;
    q_lanes xv, valid;
    q_load(x, g, &xv, &valid);
    float best = INFINITY;
    for (int code = code0; code < code0 + Q_CODES && code < (int)DJ_Q_CODE_END; code++) {
        const float s = dj_f16_to_f32((uint16_t)(code << 5));
        int lo, hi;
        q_zero_range(dtype, s, mn, mx, &lo, &hi);
        for (int c = lo; c <= hi; c++) {
            const float err = q_err(&xv, &valid, s, q_zero_u(dtype, c), (float)umax);
            if (err < best) best = err, *param = (uint16_t)(c << 10 | code);
        }
    }
    const float z = q_zero_u(dtype, *param >> 10);
    q_round(x, g, dj_q_scale(*param), z, umax, u);
    const int zu = (int)lrintf(z);
    for (int i = g; i < DJ_QGROUP; i++) u[i] = (uint8_t)(zu > umax ? umax : zu);
    return 0;
}

// ---- rows
int quant_row(uint32_t dtype, const float *x, int64_t n, uint8_t *dst, double *sq_err, double *sq_ref) {
    uint64_t rb = dj_row_bytes(dtype, (uint64_t)n), so = dj_scales_offset(dtype, (uint64_t)n);
    memset(dst, 0, rb);
    float back[DJ_QGROUP];
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += DJ_QGROUP, gi++) {
        const int g = n - g0 < DJ_QGROUP ? (int)(n - g0) : DJ_QGROUP;
        const float *grp = x + g0;  // q_group reads its g values only
        uint16_t param;
        uint8_t u[DJ_QGROUP];
        if (q_group(dtype, grp, g, &param, u)) return -1;
        if (dtype == DJ_Q8) {  // k = u - 128
            for (int j = 0; j < DJ_QGROUP; j++) dst[gi * DJ_QGROUP + j] = (uint8_t)(u[j] ^ 0x80);
        } else {
            uint8_t *b = dst + gi * (DJ_QGROUP / 2);
            for (int j = 0; j < DJ_QGROUP / 2; j++) b[j] = (uint8_t)(u[j] | u[j + DJ_QGROUP / 2] << 4);
        }
        memcpy(dst + so + 2 * gi, &param, 2);
        dequant_group(dtype, dst, n, gi, back);
        for (int i = 0; i < g; i++) {
            double d = (double)grp[i] - back[i];
            if (sq_err) *sq_err += d * d;
            if (sq_ref) *sq_ref += (double)grp[i] * grp[i];
        }
    }
    return 0;
}

void dequant_group(uint32_t dtype, const uint8_t *row, int64_t n, int64_t g, float *out) {
    uint16_t p;
    memcpy(&p, row + dj_scales_offset(dtype, (uint64_t)n) + 2 * g, 2);
    const float s = dj_q_scale(p);
    if (dtype == DJ_Q8) {  // the padding is stored as u = 4 c: zero
        const float z = dj_q8_zero(p);
        for (int j = 0; j < DJ_QGROUP; j++) out[j] = s * ((float)(int8_t)row[g * DJ_QGROUP + j] - z);
        return;
    }
    const float z = dj_q4_zero(p);
    for (int j = 0; j < DJ_QGROUP; j++) {
        if (g * DJ_QGROUP + j >= n) {  // a partial last group's padding
            out[j] = 0.0f;
            continue;
        }
        uint8_t b = row[g * (DJ_QGROUP / 2) + (j % (DJ_QGROUP / 2))];
        out[j] = s * ((float)(j < DJ_QGROUP / 2 ? b & 15 : b >> 4) - z);
    }
}

void dequant_row(uint32_t dtype, const uint8_t *row, int64_t n, float *out) {
    int64_t g = 0;
    for (; (g + 1) * DJ_QGROUP <= n; g++) dequant_group(dtype, row, n, g, out + g * DJ_QGROUP);
    if (g * DJ_QGROUP < n) {  // a partial last group
        float last[DJ_QGROUP];
        dequant_group(dtype, row, n, g, last);
        memcpy(out + g * DJ_QGROUP, last, (size_t)(n - g * DJ_QGROUP) * sizeof(float));
    }
}
