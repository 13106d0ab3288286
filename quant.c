// quant.c: q8 and q4 rows (quant.h).
#include "quant.h"

#include <math.h>
#include <string.h>

// ---- one group
// The k of each of the group's g values for scale s (k = round(x / s) clamped to [lo, hi]) and the squared error.
static double group_fit(const float *x, int g, float s, int lo, int hi, int8_t *k) {
    double err = 0;
    float inv = s != 0 ? 1.0f / s : 0.0f;
    for (int i = 0; i < g; i++) {
        int q = (int)lrintf(x[i] * inv);
        q = q < lo ? lo : q > hi ? hi : q;
        if (k) k[i] = (int8_t)q;
        double d = (double)x[i] - (double)s * q;
        err += d * d;
    }
    return err;
}

// The f16 scale of a group of g values and their k; -1 when the scale overflows f16.
static int group_quant(uint32_t dtype, const float *x, int g, int rtn, uint16_t *scale, int8_t *k) {
    float amax = 0, mx = 0;
    for (int i = 0; i < g; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), mx = x[i];
    float s;
    int lo = dtype == DJ_Q8 ? -127 : -8, hi = dtype == DJ_Q8 ? 127 : 7;
    if (amax == 0) {
        s = 0;
    } else if (dtype == DJ_Q8) {
        s = amax / 127.0f;
    } else {
        s = mx / -8.0f;  // round-to-nearest: the largest magnitude maps to -8
        if (!rtn) {
            double best = group_fit(x, g, s, lo, hi, NULL);
            for (int t = 0; t <= 8; t++)
                for (int sign = -1; sign <= 1; sign += 2) {
                    float c = (float)sign * amax / (6.0f + 0.25f * (float)t);
                    double err = group_fit(x, g, c, lo, hi, NULL);
                    if (err < best) best = err, s = c;
                }
            // least squares for the chosen k: s = sum(x k) / sum(k^2), kept when it fits better
            int8_t kk[DJ_QGROUP];
            group_fit(x, g, s, lo, hi, kk);
            double xk = 0, k2 = 0;
            for (int i = 0; i < g; i++) xk += (double)x[i] * kk[i], k2 += (double)kk[i] * kk[i];
            if (k2 > 0) {
                float ls = (float)(xk / k2);
                if (group_fit(x, g, ls, lo, hi, NULL) < best) s = ls;
            }
        }
    }
    uint16_t h = dj_f32_to_f16(s);
    if ((h & 0x7c00) == 0x7c00) return -1;
    *scale = h;
    group_fit(x, g, dj_f16_to_f32(h), lo, hi, k);
    return 0;
}

// ---- rows
int quant_row(uint32_t dtype, const float *x, int64_t n, uint8_t *dst, int rtn, double *sq_err, double *sq_ref) {
    uint64_t rb = dj_row_bytes(dtype, (uint64_t)n), so = dj_scales_offset(dtype, (uint64_t)n);
    memset(dst, 0, rb);
    float grp[DJ_QGROUP];
    int8_t k[DJ_QGROUP];
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += DJ_QGROUP, gi++) {
        int g = n - g0 < DJ_QGROUP ? (int)(n - g0) : DJ_QGROUP;
        memset(grp, 0, sizeof grp);
        memcpy(grp, x + g0, (size_t)g * sizeof *grp);
        uint16_t scale;
        if (group_quant(dtype, grp, DJ_QGROUP, rtn, &scale, k)) return -1;
        memcpy(dst + so + 2 * gi, &scale, 2);
        if (dtype == DJ_Q8) {
            memcpy(dst + gi * DJ_QGROUP, k, DJ_QGROUP);
        } else {
            uint8_t *b = dst + gi * (DJ_QGROUP / 2);
            for (int j = 0; j < DJ_QGROUP / 2; j++) b[j] = (uint8_t)((k[j] + 8) | (k[j + DJ_QGROUP / 2] + 8) << 4);
        }
        float s = dj_f16_to_f32(scale);
        for (int i = 0; i < g; i++) {
            double d = (double)grp[i] - (double)s * k[i];
            if (sq_err) *sq_err += d * d;
            if (sq_ref) *sq_ref += (double)grp[i] * grp[i];
        }
    }
    return 0;
}

void dequant_group(uint32_t dtype, const uint8_t *row, int64_t n, int64_t g, float *out) {
    uint16_t h;
    memcpy(&h, row + dj_scales_offset(dtype, (uint64_t)n) + 2 * g, 2);
    float s = dj_f16_to_f32(h);
    for (int j = 0; j < DJ_QGROUP; j++) {
        int k;
        if (dtype == DJ_Q8) {
            k = (int8_t)row[g * DJ_QGROUP + j];
        } else {
            uint8_t b = row[g * (DJ_QGROUP / 2) + (j % (DJ_QGROUP / 2))];
            k = (j < DJ_QGROUP / 2 ? b & 15 : b >> 4) - 8;
        }
        out[j] = s * (float)k;
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
