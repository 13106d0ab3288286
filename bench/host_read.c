// bench/host_read.c: the host memory's read ceiling (host_read.h).
#include "host_read.h"

#include <immintrin.h>
#include <string.h>

#include "../pool.h"
#include "../util.h"

#define HR_PARTS 256  // the buffer's parts, spread over the pool's threads

typedef struct {
    uint8_t *w;        // host_touch: the buffer written
    const uint8_t *p;  // host_read_pass: the buffer read
    size_t bytes;
    uint64_t fold[HR_PARTS];  // each part's xor of its loads
} hr_job;

static void touch_task(void *ctx, int64_t b, int64_t e) {
    hr_job *j = ctx;
    size_t per = j->bytes / HR_PARTS;
    for (int64_t part = b; part < e; part++) {
        size_t end = part == HR_PARTS - 1 ? j->bytes : (size_t)(part + 1) * per;
        for (size_t i = (size_t)part * per; i < end; i += 4096) {
            size_t n = end - i < 4096 ? end - i : 4096;
            memset(j->w + i, (int)(i >> 12), n);
        }
    }
}

__attribute__((target("avx2"))) static void read_task(void *ctx, int64_t b, int64_t e) {
    hr_job *j = ctx;
    size_t per = j->bytes / HR_PARTS / 64 * 64;  // parts 32-byte aligned (the buffer is); a few bytes unread
    for (int64_t part = b; part < e; part++) {
        const __m256i *q = (const __m256i *)(j->p + (size_t)part * per);
        __m256i a0 = _mm256_setzero_si256(), a1 = a0;
        for (size_t i = 0; i < per / 32; i += 2) {
            a0 = _mm256_xor_si256(a0, _mm256_load_si256(q + i));
            a1 = _mm256_xor_si256(a1, _mm256_load_si256(q + i + 1));
        }
        j->fold[part] = (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a0, a1), 0);
    }
}

void host_touch(uint8_t *buf, size_t bytes) {
    hr_job j = {.w = buf, .bytes = bytes};
    cpu_parallel_for(HR_PARTS, 1e12, touch_task, &j);
}

double host_read_pass(const uint8_t *buf, size_t bytes) {
    hr_job j = {.p = buf, .bytes = bytes};
    double t0 = dj_now();
    cpu_parallel_for(HR_PARTS, 1e12, read_task, &j);
    return dj_now() - t0;
}

double host_read_gbs(const uint8_t *buf, size_t bytes, int passes) {
    double best = 0;
    for (int r = 0; r < passes; r++) {
        double gbs = (double)bytes / host_read_pass(buf, bytes) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}
