// quant.c: q8 and q4 rows (quant.h).
#include "quant.h"

#include <math.h>
#include <string.h>

// ---- one group
// q8: the k of each of the group's g values for scale s (k = round(x / s) clamped to [-127, 127]).
static void q8_fit(const float *x, int g, float s, int8_t *k) {
    float inv = s != 0 ? 1.0f / s : 0.0f;
    for (int i = 0; i < g; i++) {
        int q = (int)lrintf(x[i] * inv);
        k[i] = (int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
    }
}

// q4: the stored k (0..15) of each value for scale s and zero point c / 4 (k = round(x / s + z) clamped), and the
// squared error of s * (k - z).
static double q4_fit(const float *x, int g, float s, int c, uint8_t *k) {
    const float z = (float)c * 0.25f, inv = 1.0f / s;
    double err = 0;
    for (int i = 0; i < g; i++) {
        int q = (int)lrintf(x[i] * inv + z);
        q = q < 0 ? 0 : q > 15 ? 15 : q;
        if (k) k[i] = (uint8_t)q;
        double d = (double)x[i] - (double)s * ((float)q - z);
        err += d * d;
    }
    return err;
}

// q4's parameter for a group of g values (1..DJ_QGROUP) and the k of all DJ_QGROUP (the padding's nearest to 0).
// The grid s (k - z), z in [0, 15.75], always holds 0, so the range to cover is [min(x, 0), max(x, 0)]: among the
// scales from 0.97 of that range over 15 up, Q4_CODES codes (each 1/32 of an octave apart), and for each the zero
// points that keep the range unclipped (at most 9 of them), the pair with the least squared error. -1 when the
// scale overflows.
#define Q4_CODES 7
static int q4_group(const float *x, int g, uint16_t *param, uint8_t *k) {
    float mn = 0, mx = 0;
    for (int i = 0; i < g; i++) mn = x[i] < mn ? x[i] : mn, mx = x[i] > mx ? x[i] : mx;
    const float r = mx - mn;
    *param = 0;
    memset(k, 0, DJ_QGROUP);
    if (!(r > 0)) return 0;  // all zeros: scale 0
    const uint16_t h = dj_f32_to_f16(r / 15.0f * 0.97f);
    if (h >= DJ_Q4_CODE_END << 5) return -1;
    int code0 = h >> 5 ? h >> 5 : 1;
    double best = INFINITY;
    for (int code = code0; code < code0 + Q4_CODES && code < (int)DJ_Q4_CODE_END; code++) {
        const float s = dj_f16_to_f32((uint16_t)(code << 5));
        float za = 4.0f * (15.0f - mx / s), zb = 4.0f * (-mn / s);
        int lo = (int)floorf(za < zb ? za : zb), hi = (int)ceilf(za < zb ? zb : za);
        if (hi - lo > 8) lo = (lo + hi) / 2 - 4, hi = lo + 8;
        for (int c = lo < 0 ? 0 : lo; c <= hi && c < 64; c++) {
            double err = q4_fit(x, g, s, c, NULL);
            if (err < best) best = err, *param = (uint16_t)(c << 10 | code);
        }
    }
    q4_fit(x, g, dj_q4_scale(*param), *param >> 10, k);
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
            float amax = 0;
            for (int i = 0; i < DJ_QGROUP; i++) amax = fabsf(grp[i]) > amax ? fabsf(grp[i]) : amax;
            param = dj_f32_to_f16(amax / 127.0f);
            if ((param & 0x7c00) == 0x7c00) return -1;
            q8_fit(grp, DJ_QGROUP, dj_f16_to_f32(param), (int8_t *)dst + gi * DJ_QGROUP);
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
    if (dtype == DJ_Q8) {  // the padding is stored as k = 0
        float s = dj_f16_to_f32(p);
        for (int j = 0; j < DJ_QGROUP; j++) out[j] = s * (float)(int8_t)row[g * DJ_QGROUP + j];
        return;
    }
    const float s = dj_q4_scale(p), z = (float)(p >> 10) * 0.25f;
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
