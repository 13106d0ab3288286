// quant.c: q8 and q4 rows (quant.h).
#include "quant.h"

#include <math.h>
#include <string.h>

// ---- one group
#define Q_CODES 7  // scales tried a group, each 1/32 of an octave above the one before
// The unsigned u = round(x / s + z) clamped to 0..umax of each of the group's g values (into u when given) and
// the squared error of s * (u - z): q8 stores u - 128 with z = 4 c, q4 u with z = c / 4.
static double q_fit(const float *x, int g, float s, float z, int umax, uint8_t *u) {
    const float inv = 1.0f / s, top = (float)umax, M = 12582912.0f;  // 1.5 * 2^23
    double err = 0;
    for (int i = 0; i < g; i++) {
        // round to nearest, ties to even, as lrintf (|x / s + z| < 2^22: s is at least 0.97 of the range's step)
        float q = (x[i] * inv + z + M) - M;
        q = q < 0.0f ? 0.0f : q > top ? top : q;
        if (u) u[i] = (uint8_t)q;
        double d = (double)x[i] - (double)s * (q - z);
        err += d * d;
    }
    return err;
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

// q8's parameter for a group of g values and the k of all DJ_QGROUP (the padding's exactly 0: u = 4 c): among 7
// scales from 0.97 of the range [min(x, 0), max(x, 0)] over 255 up, and for each the 4 zero points nearest to the
// one that puts the minimum at u = 0, the pair with the least squared error. -1 when the scale overflows.
static int q8_group(const float *x, int g, uint16_t *param, int8_t *k) {
    float mn, mx;
    int code0, rc = q_first_code(x, g, 255.0f, &mn, &mx, &code0);
    *param = 0;
    memset(k, 0, DJ_QGROUP);
    if (rc <= 0) return rc;
    double best = INFINITY;
    for (int code = code0; code < code0 + Q_CODES && code < (int)DJ_Q_CODE_END; code++) {
        const float s = dj_f16_to_f32((uint16_t)(code << 5));
        const int c0 = (int)floorf(-mn / s * 0.25f);
        for (int c = c0 - 1; c <= c0 + 2; c++) {
            if (c < 0 || c > 63) continue;
            double err = q_fit(x, g, s, 4.0f * (float)c, 255, NULL);
            if (err < best) best = err, *param = (uint16_t)(c << 10 | code);
        }
    }
    uint8_t u[DJ_QGROUP];
    q_fit(x, g, dj_q_scale(*param), 4.0f * (float)(*param >> 10), 255, u);
    for (int i = 0; i < DJ_QGROUP; i++) k[i] = (int8_t)((i < g ? u[i] : 4 * (*param >> 10)) - 128);
    return 0;
}

// q4's parameter for a group of g values (1..DJ_QGROUP) and the k of all DJ_QGROUP (the padding's nearest to 0).
// The grid s (k - z), z in [0, 15.75], always holds 0, so the range to cover is [min(x, 0), max(x, 0)]: among the
// scales from 0.97 of that range over 15 up, Q_CODES codes (each 1/32 of an octave apart), and for each the zero
// points that keep the range unclipped (at most 9 of them), the pair with the least squared error. -1 when the
// scale overflows.
static int q4_group(const float *x, int g, uint16_t *param, uint8_t *k) {
    float mn, mx;
    int code0, rc = q_first_code(x, g, 15.0f, &mn, &mx, &code0);
    *param = 0;
    memset(k, 0, DJ_QGROUP);
    if (rc <= 0) return rc;
    double best = INFINITY;
    for (int code = code0; code < code0 + Q_CODES && code < (int)DJ_Q_CODE_END; code++) {
        const float s = dj_f16_to_f32((uint16_t)(code << 5));
        float za = 4.0f * (15.0f - mx / s), zb = 4.0f * (-mn / s);
        int lo = (int)floorf(za < zb ? za : zb), hi = (int)ceilf(za < zb ? zb : za);
        if (hi - lo > 8) lo = (lo + hi) / 2 - 4, hi = lo + 8;
        for (int c = lo < 0 ? 0 : lo; c <= hi && c < 64; c++) {
            double err = q_fit(x, g, s, (float)c * 0.25f, 15, NULL);
            if (err < best) best = err, *param = (uint16_t)(c << 10 | code);
        }
    }
    q_fit(x, g, dj_q_scale(*param), (float)(*param >> 10) * 0.25f, 15, k);
    const int zk = (int)lrintf((float)(*param >> 10) * 0.25f);
    for (int i = g; i < DJ_QGROUP; i++) k[i] = (uint8_t)(zk > 15 ? 15 : zk);
    return 0;
}

// ---- rows
int quant_row(uint32_t dtype, const float *x, int64_t n, uint8_t *dst, double *sq_err, double *sq_ref) {
    uint64_t rb = dj_row_bytes(dtype, (uint64_t)n), so = dj_scales_offset(dtype, (uint64_t)n);
    memset(dst, 0, rb);
    float grp[DJ_QGROUP], back[DJ_QGROUP];
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += DJ_QGROUP, gi++) {
        int g = n - g0 < DJ_QGROUP ? (int)(n - g0) : DJ_QGROUP;
        memset(grp, 0, sizeof grp);
        memcpy(grp, x + g0, (size_t)g * sizeof *grp);
        uint16_t param;
        if (dtype == DJ_Q8) {
            if (q8_group(grp, g, &param, (int8_t *)dst + gi * DJ_QGROUP)) return -1;
        } else {
            uint8_t k[DJ_QGROUP];
            if (q4_group(grp, g, &param, k)) return -1;
            uint8_t *b = dst + gi * (DJ_QGROUP / 2);
            for (int j = 0; j < DJ_QGROUP / 2; j++) b[j] = (uint8_t)(k[j] | k[j + DJ_QGROUP / 2] << 4);
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
