// kvtype.c: the KV cache types' names and the q8 row quantizer (kvtype.h).
#include "kvtype.h"

#include <math.h>
#include <string.h>

static const char *const kv_names[DJ_KV_TYPES] = {"f32", "f16", "q8"};

const char *dj_kv_name(int t) { return t >= 0 && t < DJ_KV_TYPES ? kv_names[t] : "?"; }

int dj_kv_parse(const char *s) {
    for (int t = 0; t < DJ_KV_TYPES; t++)
        if (!strcmp(s, kv_names[t])) return t;
    return -1;
}

void dj_kv_q8_row(const float *x, int64_t head_dim, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int64_t d = 0; d < head_dim; d++) amax = fmaxf(amax, fabsf(x[d]));
    const float s = amax / 127.0f;
    *scale = s;
    for (int64_t d = 0; d < head_dim; d++) {
        const float r = s > 0.0f ? rintf(x[d] / s) : 0.0f;
        q[d] = r >= -127.0f && r <= 127.0f ? (int8_t)r : 0;  // NaN (and an infinite row's) values: 0
    }
}
