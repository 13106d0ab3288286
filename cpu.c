// cpu.c: the CPU's arithmetic (cpu.h): reference ops in fp32 with weights widened on the fly and the SIMD matvec of
// the GPU engine's CPU share, all parallel over the pool (pool.h). The CPU forward pass built on them: cpu_forward.c.
#include "cpu.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

// ---- widening and the reference matmul
// f16 -> f32 through a 64K-entry table: the conversion's branches would otherwise dominate the inner loop.
static float cpu_f16_table[65536];
static pthread_once_t cpu_f16_once = PTHREAD_ONCE_INIT;
static void cpu_f16_table_init(void) {
    for (uint32_t i = 0; i < 65536; i++) cpu_f16_table[i] = dj_f16_to_f32((uint16_t)i);
}
void cpu_f16_init(void) { pthread_once(&cpu_f16_once, cpu_f16_table_init); }

// dst (n) = row `r` of w (rows of n elements in wtype, dj_row_bytes apart), widened to f32 (q8, q4: dequantized,
// exactly). Returns dst, or w's own row for f32.
const float *cpu_widen_row(float *dst, const void *w, uint32_t wtype, int64_t r, int64_t n) {
    if (wtype == DJ_F32) return (const float *)w + r * n;
    if (dj_is_quant(wtype)) {
        dequant_row(wtype, (const uint8_t *)w + (uint64_t)r * dj_row_bytes(wtype, (uint64_t)n), n, dst);
        return dst;
    }
    const uint16_t *src = (const uint16_t *)w + r * n;
    if (wtype == DJ_F16) {
        for (int64_t i = 0; i < n; i++) dst[i] = cpu_f16_table[src[i]];
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = dj_bf16_to_f32(src[i]);
    }
    return dst;
}

// Eight independent partial sums: lets the compiler vectorise without reassociating (no -ffast-math).
static float cpu_dot(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

typedef struct {
    float *y;        // (T, n_out)
    const float *x;  // (T, n_in)
    const void *w;   // (n_out, n_in) wtype
    uint32_t wtype;
    int64_t T, n_in, n_out;
    _Atomic int oom;  // a thread could not allocate its row: its rows are not computed
} cpu_matmul_job;

static void cpu_matmul_task(void *ctx, int64_t begin, int64_t end) {
    const cpu_matmul_job *j = ctx;
    float *row = NULL;
    if (j->wtype != DJ_F32) {
        row = malloc((size_t)j->n_in * sizeof(float));
        if (!row) {
            atomic_store(&j->oom, 1);
            return;
        }
    }
    for (int64_t o = begin; o < end; o++) {
        const float *wr = cpu_widen_row(row, j->w, j->wtype, o, j->n_in);
        for (int64_t t = 0; t < j->T; t++) j->y[t * j->n_out + o] = cpu_dot(j->x + t * j->n_in, wr, j->n_in);
    }
    free(row);
}

int cpu_matmul(float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out) {
    assert(dj_row_bytes(wtype, 1) > 0);
    if (wtype == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    cpu_matmul_job j = {y, x, w, wtype, T, n_in, n_out, 0};
    cpu_parallel_for(n_out, (double)T * (double)n_in * (double)n_out, cpu_matmul_task, &j);
    return atomic_load(&j.oom) ? -1 : 0;
}

// ---- matvec at the host's memory bandwidth: the GPU engine's CPU share (dj_gpu_opts.cpu_share)
// y (n_out) = W x, for one token, at the host's memory bandwidth: on x86 with AVX2, FMA and F16C, eight f16, bf16
// or f32 weights are widened per instruction and summed in four fused multiply-add accumulators, q8 and q4 ones
// summed in integers against x quantized once per call; elsewhere, the portable loop of cpu_dot. Rows are split
// over the thread pool.

// q8 and q4 rows (model.h) in integers, llama.cpp-style: x is quantized once per call (cpu_xq) in two int8 parts
// per group of 32, so that one group's dot with the weights' k is two maddubs, two madd and one conversion, not
// 32 widenings. The two parts keep x to ~1/64516 of its group's largest magnitude, where one part alone (~1/254)
// would cost ~4e-3 of the result.
//   x_i ~= d_g * (254 * hi_i + lo_i), d_g = max|x_g| / (127 * 254), hi = round(x / (max|x_g| / 127)) in -127..127,
//   lo = round(254 * (x / (max|x_g| / 127) - hi)) in -127..127: |x_i - x~_i| <= max|x_g| / 64516 (+ f32 rounding)
// The last group is zero-padded (the weights' padding is stored too, so whole groups are read throughout); a group
// whose largest magnitude is below 1e-30 is taken as zero (its reciprocal scale would overflow), one holding an
// inf or a NaN gets d = NaN so the result is NaN as in f32.
typedef struct {
    int8_t *hi, *lo;  // (groups, DJ_QGROUP), 32-byte aligned
    float *d;         // (groups)
    int32_t *sum;     // (groups) sum over the group of 254 * hi + lo: the zero points' (see simd_dot_q)
    int16_t *x16;     // (groups, DJ_QGROUP), 64-byte aligned, 254 * hi + lo (|.| <= 32385): q8's VNNI path; or NULL
    struct cpu_x4 *x4;  // (groups / 4), 64-byte aligned: q4's blocks of 4 groups (zv_dot_q4, simd_dot_q4x); or NULL
    int vnni;           // the AVX-512 VNNI path runs: zv_dot_q8 on x16, zv_dot_q4 on x4
} cpu_xq;

// q4 takes 64 bytes of weights (4 groups; AVX2 half of them) as they lie: byte j of a group holds its weights j and
// j + 16 in the low and high nibble. x is laid out to match, per block of 4 groups and per part (hi, lo): a[p] is
// input p % 16 of the block's group p / 16, b[p] input 16 + p % 16. 256 bytes a block, as many as x16's.
typedef struct cpu_x4 {
    _Alignas(64) int8_t a[2][64];  // [hi, lo]
    int8_t b[2][64];
} cpu_x4;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define CPU_SIMD 1
#define SIMD_FN __attribute__((target("avx2,fma,f16c")))
SIMD_FN static inline __m256 simd_load8(const void *w, uint32_t wtype, int64_t i) {
    if (wtype == DJ_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    if (wtype == DJ_BF16) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

SIMD_FN static float simd_dot_row(const float *x, const void *w, uint32_t wtype, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(simd_load8(w, wtype, i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(simd_load8(w, wtype, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(simd_load8(w, wtype, i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(simd_load8(w, wtype, i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(simd_load8(w, wtype, i), _mm256_loadu_ps(x + i), a0);
    __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    const uint16_t *w16 = (const uint16_t *)w;
    for (; i < n; i++)
        r += x[i] * (wtype == DJ_F32   ? ((const float *)w)[i]
                     : wtype == DJ_F16 ? dj_f16_to_f32(w16[i])
                                       : dj_bf16_to_f32(w16[i]));
    return r;
}

// 8 int32 lanes (four weights each) -> 32 int8, lane order kept.
SIMD_FN static inline __m256i simd_pack_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));  // per 128-bit half
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

SIMD_FN static inline int32_t simd_hsum_i32(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 1)));
}

SIMD_FN static inline float simd_hsum_ps(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// x (n) -> q (ceil(n / 32) groups).
SIMD_FN static void simd_quant_x(const float *x, int64_t n, const cpu_xq *q) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), k254 = _mm256_set1_ps(254.0f);
    for (int64_t g = 0; g * DJ_QGROUP < n; g++) {
        float pad[DJ_QGROUP] = {0};
        const float *xg = x + g * DJ_QGROUP;
        if (n - g * DJ_QGROUP < DJ_QGROUP) xg = memcpy(pad, xg, (size_t)(n - g * DJ_QGROUP) * sizeof(float));
        __m256 v[4], mx = _mm256_setzero_ps(), nan = mx;
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xg + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_and_ps(v[k], abs_mask));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));  // max_ps drops NaNs
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        float inv = 0.0f;
        q->d[g] = 0.0f;
        if (_mm256_movemask_ps(nan) || isinf(amax)) q->d[g] = NAN;
        else if (amax >= 1e-30f) q->d[g] = amax / (127.0f * 254.0f), inv = 127.0f / amax;
        __m256i hi[4], lo[4], s = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256 t = _mm256_mul_ps(v[k], _mm256_set1_ps(inv));  // |t| <= 127
            __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            hi[k] = _mm256_cvtps_epi32(r);
            lo[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t, r), k254));  // |t - r| <= 1/2: exact
            s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_mullo_epi32(hi[k], _mm256_set1_epi32(254)), lo[k]));
        }
        _mm256_store_si256((__m256i *)(q->hi + g * DJ_QGROUP), simd_pack_i8(hi[0], hi[1], hi[2], hi[3]));
        _mm256_store_si256((__m256i *)(q->lo + g * DJ_QGROUP), simd_pack_i8(lo[0], lo[1], lo[2], lo[3]));
        q->sum[g] = simd_hsum_i32(s);
    }
}

// One group's sum of k * (254 * hi + lo), in 8 int32 lanes. No step saturates or rounds, for any stored byte:
//   maddubs (u8 * i8, pairs summed into i16, saturating): q8 pairs |k| * |hi| <= 2 * 128 * 127 = 32512 < 32767
//   (|k| = 128 only for a byte quant_row never writes: abs_epi8(-128) reads as 128 unsigned, and sign() negates
//   hi, so even that is exact); q4 pairs 2 * 15 * 127 = 3810.
//   madd (i16 pairs into i32): a lane holds four weights: <= 4 * 128 * (254 * 127 + 127) = 16.6e6 < 2^24, so its
//   conversion to f32 is exact too.
SIMD_FN static inline __m256i simd_join(__m256i phi, __m256i plo) {
    __m256i h = _mm256_madd_epi16(phi, _mm256_set1_epi16(254));
    return _mm256_add_epi32(h, _mm256_madd_epi16(plo, _mm256_set1_epi16(1)));
}

// q8: k * x as |k| * (x with k's sign), maddubs taking an unsigned first operand; the zero point comes off in f32
// (z * sum[g], simd_dot_q).
SIMD_FN static inline __m256i simd_group_q8(const uint8_t *row, const cpu_xq *q, int64_t g) {
    __m256i k = _mm256_loadu_si256((const __m256i *)(row + g * DJ_QGROUP)), a = _mm256_abs_epi8(k);
    __m256i hi = _mm256_load_si256((const __m256i *)(q->hi + g * DJ_QGROUP));
    __m256i lo = _mm256_load_si256((const __m256i *)(q->lo + g * DJ_QGROUP));
    __m256i phi = _mm256_maddubs_epi16(a, _mm256_sign_epi8(hi, k));
    return simd_join(phi, _mm256_maddubs_epi16(a, _mm256_sign_epi8(lo, k)));
}

// q4: the stored nibbles k (unsigned, maddubs' first operand as they are); the zero point comes off in f32 (z *
// sum[g], simd_dot_q). The group's 16 bytes go to both halves; the upper half shifted by 4 (per 64 bits: a byte's
// high nibble lands in its low 4 bits) gives weights 16..31 after the mask.
SIMD_FN static inline __m256i simd_group_q4(const uint8_t *row, const cpu_xq *q, int64_t g) {
    __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(row + g * (DJ_QGROUP / 2))));
    __m256i u = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
    __m256i hi = _mm256_load_si256((const __m256i *)(q->hi + g * DJ_QGROUP));
    __m256i lo = _mm256_load_si256((const __m256i *)(q->lo + g * DJ_QGROUP));
    return simd_join(_mm256_maddubs_epi16(u, hi), _mm256_maddubs_epi16(u, lo));
}

// 8 q8 or q4 group parameters (model.h; fewer in the low lanes, zeros above, give as many): their scales (the f16s
// of bits 0-9 shifted up by 5) and zero points (c = bits 10-15: q8 4 c - 128, q4 c / 4). One at a time:
// simd_scale1, cpu_zero1.
SIMD_FN static inline __m256 simd_q_scales(__m128i p) {
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_and_si128(p, _mm_set1_epi16(0x3FF)), 5));
}
SIMD_FN static inline __m256 simd_q_zeros(uint32_t wtype, __m128i p) {
    __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_srli_epi16(p, 10)));
    return wtype == DJ_Q8 ? _mm256_fmsub_ps(c, _mm256_set1_ps(4.0f), _mm256_set1_ps(128.0f))
                          : _mm256_mul_ps(c, _mm256_set1_ps(0.25f));
}
SIMD_FN static inline float simd_scale1(uint16_t p) { return _cvtsh_ss((unsigned short)((p & 0x3FFu) << 5)); }
static inline float cpu_zero1(uint32_t wtype, uint16_t p) { return wtype == DJ_Q8 ? dj_q8_zero(p) : dj_q4_zero(p); }

// A row (n weights of q8 or q4) times x: each group's exact integer sum, in f32, times scale_g * d_g, into four
// accumulators (groups are independent: the loop is bound by throughput, not by the FMA's latency); the zero
// points, scale_g * d_g * z_g * sum[g], summed apart and taken off at the end. Scales are
// widened 8 at a time while 8 groups remain (16 bytes: a shorter tail could read past the matrix), then singly.
// Rows lie one after the other, so the weights are one stream, gb bytes a group (the padding of 15 bytes at most
// per row aside); software prefetch keeps it ahead of the core: the hardware's prefetchers alone left q4 at 1/3 of
// the host's read bandwidth on 2 cores (2/3 with it), q8 at 62% (75%).
// 8 KB ahead, not 2: beside the PCIe copies 16 threads read 10-13% faster (H200 machine, q4 and q8,
// bench/results/share_prefetch). Bench variants in a build folder of their own (make tracks no flags):
// make BUILD=build/pfN CEXTRA=-DCPU_PREFETCH=N build/pfN/bin/ceilings.
#ifndef CPU_PREFETCH
#define CPU_PREFETCH 8192
#endif
#define SIMD_GROUP(g) (wtype == DJ_Q8 ? simd_group_q8(row, q, g) : simd_group_q4(row, q, g))
__attribute__((always_inline)) SIMD_FN static inline float simd_dot_q(const uint8_t *row, uint32_t wtype, int64_t n,
                                                                      const cpu_xq *q) {
    int64_t groups = (n + DJ_QGROUP - 1) / DJ_QGROUP, g = 0, gb = (wtype == DJ_Q8 ? DJ_QGROUP : DJ_QGROUP / 2) + 2;
    const uint16_t *scales = (const uint16_t *)(row + dj_scales_offset(wtype, (uint64_t)n));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, off = a0;
    for (; g + 8 <= groups; g += 8) {
        // the matrix CPU_PREFETCH bytes ahead (into the next rows), as many lines as these 8 groups span
        const char *pf = (const char *)row + g * gb + CPU_PREFETCH;
        for (int64_t b = 0; b < 8 * gb; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
        _Alignas(32) float d[8];
        __m128i p = _mm_loadu_si128((const __m128i *)(scales + g));
        __m256 sd = _mm256_mul_ps(simd_q_scales(p), _mm256_loadu_ps(q->d + g));
        off = _mm256_fmadd_ps(_mm256_mul_ps(sd, simd_q_zeros(wtype, p)),
                              _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(q->sum + g))), off);
        _mm256_store_ps(d, sd);
        for (int k = 0; k < 8; k += 4) {
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SIMD_GROUP(g + k)), _mm256_broadcast_ss(d + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SIMD_GROUP(g + k + 1)), _mm256_broadcast_ss(d + k + 1), a1);
            a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SIMD_GROUP(g + k + 2)), _mm256_broadcast_ss(d + k + 2), a2);
            a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SIMD_GROUP(g + k + 3)), _mm256_broadcast_ss(d + k + 3), a3);
        }
    }
    float offs = 0.0f;
    for (; g < groups; g++) {
        const float sd = simd_scale1(scales[g]) * q->d[g];
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SIMD_GROUP(g)), _mm256_set1_ps(sd), a0);
        offs += sd * cpu_zero1(wtype, scales[g]) * (float)q->sum[g];
    }
    return simd_hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) - (simd_hsum_ps(off) + offs);
}
#undef SIMD_GROUP
// The two instances, each with its group kind inlined.
SIMD_FN static float simd_dot_q8(const uint8_t *row, int64_t n, const cpu_xq *q) {
    return simd_dot_q(row, DJ_Q8, n, q);
}
SIMD_FN static float simd_dot_q4(const uint8_t *row, int64_t n, const cpu_xq *q) {
    return simd_dot_q(row, DJ_Q4, n, q);
}

// q4 against cpu_x4 (x holds a whole block of 4 groups; zv_dot_q4 does the same with VNNI): 2 groups (32 bytes,
// half a block) at a time, their low and high nibbles (k) as maddubs' unsigned bytes against each part's
// inputs as they lie (pairs <= 2 * 15 * 127; the two nibbles' pairs added, <= 7620), the parts joined by madd into
// 8 int32 lanes of 254 * hi + lo, group l / 4's (<= 8 * 15 * 32385 < 2^24: exact in f32), scaled by the lane's group;
// the zero points come off per 8 groups in f32 (scale * z * q->sum). ~15 instructions per 2 groups where
// simd_group_q4 takes ~11 a group. Groups past the last block go through simd_group_q4.
SIMD_FN static inline __m256 simd_pair_q4(const uint8_t *w, const int8_t *a, const int8_t *b) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    __m256i k = _mm256_loadu_si256((const __m256i *)w), lo = _mm256_and_si256(k, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(k, 4), mask);
    __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256((const __m256i *)a)),
                                  _mm256_maddubs_epi16(hi, _mm256_load_si256((const __m256i *)b)));
    __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256((const __m256i *)(a + 64))),
                                  _mm256_maddubs_epi16(hi, _mm256_load_si256((const __m256i *)(b + 64))));
    return _mm256_cvtepi32_ps(simd_join(ph, pl));
}
// Block k's half h (groups 4k + 2h and 4k + 2h + 1) times sd permuted to its lanes (sd's groups from index i).
#define SIMD_PAIR(w, x, h, sd, i) \
    _mm256_mul_ps(simd_pair_q4((w) + 32 * (h), (x)->a[0] + 32 * (h), (x)->b[0] + 32 * (h)), \
                  _mm256_permutevar8x32_ps(sd, _mm256_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1)))
SIMD_FN static float simd_dot_q4x(const uint8_t *row, int64_t n, const cpu_xq *q) {
    const int64_t groups = (n + DJ_QGROUP - 1) / DJ_QGROUP, whole = groups / 4 * 4, gb = DJ_QGROUP / 2 + 2;
    const uint16_t *scales = (const uint16_t *)(row + dj_scales_offset(DJ_Q4, (uint64_t)n));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, off = a0;
    int64_t g = 0;
    for (; g + 8 <= whole; g += 8) {
        const char *pf = (const char *)row + g * gb + CPU_PREFETCH;  // as simd_dot_q
        for (int64_t b = 0; b < 8 * gb; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
        __m128i p = _mm_loadu_si128((const __m128i *)(scales + g));
        __m256 sd = _mm256_mul_ps(simd_q_scales(p), _mm256_loadu_ps(q->d + g));
        off = _mm256_fmadd_ps(_mm256_mul_ps(sd, simd_q_zeros(DJ_Q4, p)),
                              _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(q->sum + g))), off);
        const uint8_t *w = row + g * (DJ_QGROUP / 2);
        const cpu_x4 *x = q->x4 + g / 4;
        a0 = _mm256_add_ps(a0, SIMD_PAIR(w, x, 0, sd, 0));
        a1 = _mm256_add_ps(a1, SIMD_PAIR(w, x, 1, sd, 2));
        a0 = _mm256_add_ps(a0, SIMD_PAIR(w + 64, x + 1, 0, sd, 4));
        a1 = _mm256_add_ps(a1, SIMD_PAIR(w + 64, x + 1, 1, sd, 6));
    }
    if (g < whole) {  // one block left: its 4 scales (8 bytes, nothing read past them)
        __m128i p = _mm_loadl_epi64((const __m128i *)(scales + g));
        __m128 sd4 = _mm_mul_ps(_mm256_castps256_ps128(simd_q_scales(p)), _mm_loadu_ps(q->d + g));
        __m128 sum4 = _mm_cvtepi32_ps(_mm_loadu_si128((const __m128i *)(q->sum + g)));
        __m256 sd = _mm256_insertf128_ps(_mm256_setzero_ps(), sd4, 0);
        off = _mm256_fmadd_ps(_mm256_mul_ps(sd, simd_q_zeros(DJ_Q4, p)),
                              _mm256_insertf128_ps(_mm256_setzero_ps(), sum4, 0), off);
        const uint8_t *w = row + g * (DJ_QGROUP / 2);
        a0 = _mm256_add_ps(a0, SIMD_PAIR(w, q->x4 + g / 4, 0, sd, 0));
        a1 = _mm256_add_ps(a1, SIMD_PAIR(w, q->x4 + g / 4, 1, sd, 2));
    }
    float offs = 0.0f;
    for (g = whole; g < groups; g++) {
        const float sd = simd_scale1(scales[g]) * q->d[g];
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(simd_group_q4(row, q, g)), _mm256_set1_ps(sd), a0);
        offs += sd * dj_q4_zero(scales[g]) * (float)q->sum[g];
    }
    return simd_hsum_ps(_mm256_sub_ps(_mm256_add_ps(a0, a1), off)) - offs;
}
#undef SIMD_PAIR

// The same sums with AVX-512 VNNI (cpu_vnni_on). q8: a group's 32 weights sign-extended to int16 in one register
// times x16 = 254 * hi + lo by one vpdpwssd: 16 int32 lanes of two products each, <= 2 * 128 * 32385 = 8.3e6 < 2^24,
// so exact in f32 as well. Per group a widening, a multiply-add and a conversion where the AVX2 path takes ~12
// instructions.
#define SIMDV_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
// Group g's exact integer sum in 16 int32 lanes, converted to f32.
__attribute__((always_inline)) SIMDV_FN static inline __m512 zv_group_q8(const uint8_t *row, const cpu_xq *q,
                                                                         int64_t g) {
    __m512i k = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(row + g * DJ_QGROUP)));
    __m512i x = _mm512_load_si512(q->x16 + g * DJ_QGROUP);
    return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(), k, x));
}
SIMDV_FN static float zv_dot_q8(const uint8_t *row, int64_t n, const cpu_xq *q) {
    const int64_t groups = (n + DJ_QGROUP - 1) / DJ_QGROUP, gb = DJ_QGROUP + 2;
    const uint16_t *scales = (const uint16_t *)(row + dj_scales_offset(DJ_Q8, (uint64_t)n));
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    __m256 off = _mm256_setzero_ps();  // the zero points, as simd_dot_q
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
        const char *pf = (const char *)row + g * gb + CPU_PREFETCH;  // as simd_dot_q
        for (int64_t b = 0; b < 8 * gb; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
        _Alignas(32) float d[8];
        __m128i p = _mm_loadu_si128((const __m128i *)(scales + g));
        __m256 sd = _mm256_mul_ps(simd_q_scales(p), _mm256_loadu_ps(q->d + g));
        off = _mm256_fmadd_ps(_mm256_mul_ps(sd, simd_q_zeros(DJ_Q8, p)),
                              _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(q->sum + g))), off);
        _mm256_store_ps(d, sd);
        for (int k = 0; k < 8; k += 2) {
            a0 = _mm512_fmadd_ps(zv_group_q8(row, q, g + k), _mm512_set1_ps(d[k]), a0);
            a1 = _mm512_fmadd_ps(zv_group_q8(row, q, g + k + 1), _mm512_set1_ps(d[k + 1]), a1);
        }
    }
    float offs = 0.0f;
    for (; g < groups; g++) {
        const float sd = simd_scale1(scales[g]) * q->d[g];
        a0 = _mm512_fmadd_ps(zv_group_q8(row, q, g), _mm512_set1_ps(sd), a0);
        offs += sd * dj_q8_zero(scales[g]) * (float)q->sum[g];
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) - (simd_hsum_ps(off) + offs);
}

// q4: 4 groups (64 bytes) at a time against cpu_x4, no widening: the low nibbles (mask) and the high ones (shift,
// mask) as vpdpbusd's unsigned bytes k, times x's int8 parts, 4 products a lane: lane l holds the exact sum
// over its 8 weights of u * part (<= 8 * 15 * 127), group l / 4's. Converted to f32 and scaled by the lane's group
// (sv: the 16 groups' scale * d, permuted 4 lanes a group), into one f32 sum per part; the zero points come off
// once per 16 groups in f32 (scale * d * z * q->sum), and the row is 254 * hi's + lo's - the offsets'. Per 4
// groups 3 bit operations, 4 multiply-adds, 2 conversions, 2 FMAs and a permutation, where the q8 scheme would take
// ~7 instructions a group. Groups past the last block of 4 go through the AVX2 sum (simd_group_q4).
__attribute__((always_inline)) SIMDV_FN static inline void zv_block_q4(const uint8_t *w, const cpu_x4 *x, __m512 sv,
                                                                       __m512 *h, __m512 *l) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512i k = _mm512_loadu_si512(w), lo = _mm512_and_si512(k, mask);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(k, 4), mask);
    __m512i sh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(x->a[0]));
    __m512i sl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_load_si512(x->a[1]));
    sh = _mm512_dpbusd_epi32(sh, hi, _mm512_load_si512(x->b[0]));
    sl = _mm512_dpbusd_epi32(sl, hi, _mm512_load_si512(x->b[1]));
    *h = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), sv, *h);
    *l = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), sv, *l);
}
// 16 q4 group parameters: their scales and zero points (simd_q_scales).
SIMDV_FN static inline __m512 zv_q_scales(__m256i p) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_and_si256(p, _mm256_set1_epi16(0x3FF)), 5));
}
SIMDV_FN static inline __m512 zv_q4_zeros(__m256i p) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_srli_epi16(p, 10))), _mm512_set1_ps(0.25f));
}
// Lanes 4i..4i+3 take group i of a block: the permutation of the 16 groups' scales for block b.
#define ZV_SV(b, sd) \
    _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), \
                                           _mm512_set1_epi32(4 * (b))),                                        \
                          sd)
SIMDV_FN static float zv_dot_q4(const uint8_t *row, int64_t n, const cpu_xq *q) {
    const int64_t groups = (n + DJ_QGROUP - 1) / DJ_QGROUP, whole = groups / 4 * 4, gb = DJ_QGROUP / 2 + 2;
    const uint16_t *scales = (const uint16_t *)(row + dj_scales_offset(DJ_Q4, (uint64_t)n));
    __m512 h0 = _mm512_setzero_ps(), l0 = h0, h1 = h0, l1 = h0, off = h0;
    int64_t g = 0;
    for (; g + 16 <= whole; g += 16) {
        const char *pf = (const char *)row + g * gb + CPU_PREFETCH;  // as simd_dot_q
        for (int64_t b = 0; b < 16 * gb; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
        __m256i p = _mm256_loadu_si256((const __m256i *)(scales + g));
        __m512 sd = _mm512_mul_ps(zv_q_scales(p), _mm512_loadu_ps(q->d + g));
        off = _mm512_fmadd_ps(_mm512_mul_ps(sd, zv_q4_zeros(p)),
                              _mm512_cvtepi32_ps(_mm512_loadu_si512(q->sum + g)), off);
        const uint8_t *w = row + g * (DJ_QGROUP / 2);
        const cpu_x4 *x = q->x4 + g / 4;
        zv_block_q4(w, x, ZV_SV(0, sd), &h0, &l0);
        zv_block_q4(w + 64, x + 1, ZV_SV(1, sd), &h1, &l1);
        zv_block_q4(w + 128, x + 2, ZV_SV(2, sd), &h0, &l0);
        zv_block_q4(w + 192, x + 3, ZV_SV(3, sd), &h1, &l1);
    }
    if (g < whole) {  // 1..3 blocks: their scales loaded under a mask (nothing read past them)
        __mmask16 m = (__mmask16)((1u << (whole - g)) - 1);
        __m256i p = _mm256_maskz_loadu_epi16(m, scales + g);
        __m512 sd = _mm512_mul_ps(zv_q_scales(p), _mm512_maskz_loadu_ps(m, q->d + g));
        off = _mm512_fmadd_ps(_mm512_mul_ps(sd, zv_q4_zeros(p)),
                              _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, q->sum + g)), off);
        for (int64_t b = 0; g + 4 * b < whole; b++)
            zv_block_q4(row + (g + 4 * b) * (DJ_QGROUP / 2), q->x4 + g / 4 + b, ZV_SV(b, sd), &h0, &l0);
    }
    __m256 t = _mm256_setzero_ps();
    float offs = 0.0f;
    for (g = whole; g < groups; g++) {
        const float sd = simd_scale1(scales[g]) * q->d[g];
        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(simd_group_q4(row, q, g)), _mm256_set1_ps(sd), t);
        offs += sd * dj_q4_zero(scales[g]) * (float)q->sum[g];
    }
    __m512 hl = _mm512_fmadd_ps(_mm512_add_ps(h0, h1), _mm512_set1_ps(254.0f), _mm512_add_ps(l0, l1));
    return _mm512_reduce_add_ps(_mm512_sub_ps(hl, off)) + (simd_hsum_ps(t) - offs);
}
#undef ZV_SV

// AVX2 and FMA through the compiler's builtin (which also checks that the OS saves the AVX state); F16C
// through CPUID leaf 1 (ECX bit 29), which not every compiler's builtin knows.
static int cpu_simd_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        unsigned a, b, c, d;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
        ok = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return ok;
}

// AVX-512 (F, BW, VL, DQ: the compiler's builtin checks that the OS saves the zmm state) for the tiles of passes of
// several rows (cpu_matvec_multi), on top of cpu_simd_ok's set.
static int cpu_avx512_ok(void) {
    static int ok = -1;
    if (ok < 0)
        ok = cpu_simd_ok() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return ok;
}
// AVX-512 VNNI on top of cpu_avx512_ok's set: the one-row q8/q4 path (zv_dot_q8, zv_dot_q4).
static int cpu_vnni_ok(void) {
    static int ok = -1;
    if (ok < 0) ok = cpu_avx512_ok() && __builtin_cpu_supports("avx512vnni");
    return ok;
}
#endif
static int cpu_simd_level = CPU_SIMD_BEST;  // cpu_set_simd's ceiling

// Whether the vector paths run: allowed by cpu_set_simd and present (cpu_matvec_multi's AVX-512 tiles; AVX2 for
// the rest).
static int cpu_avx512_on(void) {
#ifdef CPU_SIMD
    return cpu_simd_level >= CPU_SIMD_AVX512 && cpu_avx512_ok();
#else
    return 0;
#endif
}
#ifdef CPU_SIMD
static int cpu_avx2_on(void) { return cpu_simd_level >= CPU_SIMD_AVX2 && cpu_simd_ok(); }
static int cpu_vnni_on(void) { return cpu_simd_level >= CPU_SIMD_AVX512 && cpu_vnni_ok(); }
#endif

int cpu_set_simd(int level) {
    cpu_simd_level = level < 0 ? 0 : level > CPU_SIMD_BEST ? CPU_SIMD_BEST : level;
#ifdef CPU_SIMD
    if (!cpu_avx2_on()) return 0;
    return cpu_avx512_on() ? CPU_SIMD_AVX512 : CPU_SIMD_AVX2;
#else
    return 0;
#endif
}

// cpu_matvec_start's job: x lands when *ready reaches seq; the thread that computes the last row stores seq in
// *done. x's records (cpu_matvec, q8 and q4) are built by the first thread to see x, the others wait for them.
// Its first chunks of rows are the workers' own, one each (worker p's is chunk p - 1, the caller has none): a worker
// waiting for x reads its chunk's weights into its cache meanwhile (cpu_async_wait_x) and takes it first; the other
// chunks go in order to whoever asks, and a first chunk its worker has not come for is taken at the end by anyone.
// (Figures: bench/results/code_notes, cpu_async_first.)
#define CPU_FIRST_MAX 256
#define CPU_PREFETCH_MAX (1 << 20)  // bytes a worker reads ahead: within a core's L2
struct cpu_async {
    const _Atomic uint32_t *ready;
    _Atomic uint32_t *done;
    uint32_t seq;
    _Atomic int staged;  // x's records: 0 not built, 1 being built, 2 built (or none needed)
    _Atomic int64_t rows_done;
    int64_t n_out;
    _Atomic uint64_t t_x;  // dj_now when the first thread saw x: the least of the threads' (a double's bits)
    double t_done;         // dj_now when the last row was done
    int64_t n_first;     // first chunks (of the job's first matrix: the chain's gate|up units)
    _Atomic uint64_t first_taken[CPU_FIRST_MAX / 64];
};

// A thread's way through a job's chunks (cpu_claim): its own first chunk, then the queue, then the first chunks
// left.
typedef struct {
    int stage;
    int64_t i;
} cpu_claim_it;

// The next rows [*b, *e) of n for thread `part` (a pool part: 0 the caller), chunk at a time; the queue `next`
// (rows) starts after a's first chunks (a NULL: no first chunks). 0: none left.
static int cpu_claim(struct cpu_async *a, _Atomic int64_t *next, int64_t chunk, int64_t n, int64_t part,
                     cpu_claim_it *it, int64_t *b, int64_t *e) {
    int64_t nf = a ? a->n_first : 0, k = -1;
#define TAKE(c) (!(atomic_fetch_or(&a->first_taken[(c) / 64], 1ull << ((c) % 64)) >> ((c) % 64) & 1))
    if (it->stage == 0) {
        it->stage = 1;
        if (part >= 1 && part <= nf && TAKE(part - 1)) k = part - 1;
    }
    if (k < 0 && it->stage == 1) {
        int64_t r = atomic_fetch_add(next, chunk);
        if (r < n) {
            *b = r, *e = r + chunk < n ? r + chunk : n;
            return 1;
        }
        it->stage = 2;
    }
    for (; k < 0 && it->i < nf; it->i++)
        if (TAKE(it->i)) k = it->i;
#undef TAKE
    if (k < 0) return 0;
    *b = k * chunk, *e = (k + 1) * chunk < n ? (k + 1) * chunk : n;
    return 1;
}

// First chunks for a job of n rows in chunks of `chunk` on `parts` threads: the queue's start (rows).
static int64_t cpu_first_chunks(struct cpu_async *a, int64_t n, int64_t chunk, int64_t parts) {
    int64_t chunks = (n + chunk - 1) / chunk, nf = parts - 1;
    if (nf > chunks / 2) nf = chunks / 2;  // the queue keeps half: a late worker's chunk is one of many
    if (nf > CPU_FIRST_MAX) nf = CPU_FIRST_MAX;
    a->n_first = nf;
    for (int i = 0; i < CPU_FIRST_MAX / 64; i++) atomic_store(&a->first_taken[i], 0);
    return a->n_first * chunk;
}

void (*cpu_test_hook_waiting_x)(void);

// Waits for x (wrapping order), reading the weights of thread part's first chunk meanwhile (up to
// CPU_PREFETCH_MAX bytes): its rows of w (rb bytes each), and of w2 where it is not NULL (the chain's up beside
// gate).
static void cpu_async_wait_x(struct cpu_async *a, int64_t part, const uint8_t *w, const uint8_t *w2, size_t rb,
                             int64_t chunk, int64_t n) {
    size_t at = 0, end = 0;
    const uint8_t *r = NULL, *r2 = NULL;
    if (part >= 1 && part <= a->n_first) {
        int64_t b = (part - 1) * chunk, e = b + chunk < n ? b + chunk : n;
        end = (size_t)(e - b) * rb * (w2 ? 2 : 1) > CPU_PREFETCH_MAX ? CPU_PREFETCH_MAX / (w2 ? 2 : 1)
                                                                     : (size_t)(e - b) * rb;
        r = w + (size_t)b * rb, r2 = w2 ? w2 + (size_t)b * rb : NULL;
    }
    for (int told = 0; (int32_t)(atomic_load_explicit(a->ready, memory_order_acquire) - a->seq) < 0;) {
        if (!told && cpu_test_hook_waiting_x) cpu_test_hook_waiting_x();
        told = 1;
        if (at >= end) {
            dj_cpu_relax();
            continue;
        }
        for (size_t stop = at + 1024 < end ? at + 1024 : end; at < stop; at += 64) {
            __builtin_prefetch(r + at, 0, 2);
            if (r2) __builtin_prefetch(r2 + at, 0, 2);
        }
    }
    double now = dj_now();  // the least over the threads: a thread late to store its own still sees x first
    uint64_t bits, cur = atomic_load(&a->t_x);
    memcpy(&bits, &now, sizeof bits);  // a positive double's bits order as the double does
    while (bits < cur && !atomic_compare_exchange_weak(&a->t_x, &cur, bits)) {}
}

// n more rows are done; the last rows tell the GPU.
static void cpu_async_rows(struct cpu_async *a, int64_t n) {
    if (atomic_fetch_add_explicit(&a->rows_done, n, memory_order_acq_rel) + n == a->n_out) {
        a->t_done = dj_now();  // after every thread's t_x: each took its own before its rows
        atomic_store_explicit(a->done, a->seq, memory_order_release);
    }
}

typedef struct {
    float *y;        // (n_out)
    const float *x;  // (n_in)
    const void *w;   // (n_out, n_in) wtype
    uint32_t wtype;
    int64_t n_in, n_out, chunk;
    const cpu_xq *xq;      // x quantized, for q8 and q4 on the vector path; NULL otherwise
    _Atomic int64_t next;  // the next chunk of rows to claim: a thread the OS delays takes fewer
    struct cpu_async *as;  // cpu_matvec_start's: x lands later; NULL: x is there
} cpu_matvec_job;

// A quantized row's dot with x on the portable path: widened a group at a time (a partial last one's padding
// gives zeros, and only its n % 32 values are summed).
static float cpu_dot_quant(const float *x, const uint8_t *row, uint32_t wtype, int64_t n) {
    float acc = 0.0f, buf[DJ_QGROUP];
    for (int64_t done = 0; done < n; done += DJ_QGROUP) {
        int64_t k = n - done < DJ_QGROUP ? n - done : DJ_QGROUP;
        dequant_group(wtype, row, n, done / DJ_QGROUP, buf);
        acc += cpu_dot(x + done, buf, k);
    }
    return acc;
}

static void cpu_matvec_rows(const cpu_matvec_job *j, int64_t begin, int64_t end) {
    size_t ws = dj_dtype_size(j->wtype), rb = (size_t)dj_row_bytes(j->wtype, (uint64_t)j->n_in);
    const uint8_t *w = j->w;
#ifdef CPU_SIMD
    if (j->xq && j->xq->vnni) {  // AVX-512 VNNI
        for (int64_t o = begin; o < end; o++)
            j->y[o] = j->wtype == DJ_Q8 ? zv_dot_q8(w + (size_t)o * rb, j->n_in, j->xq)
                                        : zv_dot_q4(w + (size_t)o * rb, j->n_in, j->xq);
        return;
    }
    if (j->xq) {  // set only where the vector path runs
        for (int64_t o = begin; o < end; o++)
            j->y[o] = j->wtype == DJ_Q8 ? simd_dot_q8(w + (size_t)o * rb, j->n_in, j->xq)
                      : j->xq->x4       ? simd_dot_q4x(w + (size_t)o * rb, j->n_in, j->xq)
                                        : simd_dot_q4(w + (size_t)o * rb, j->n_in, j->xq);
        return;
    }
#endif
    if (dj_is_quant(j->wtype)) {
        for (int64_t o = begin; o < end; o++) j->y[o] = cpu_dot_quant(j->x, w + (size_t)o * rb, j->wtype, j->n_in);
        return;
    }
#ifdef CPU_SIMD
    if (cpu_avx2_on()) {
        for (int64_t o = begin; o < end; o++) j->y[o] = simd_dot_row(j->x, w + (size_t)o * rb, j->wtype, j->n_in);
        return;
    }
#endif
    float row[1024];  // widened in chunks: cpu_dot on each
    for (int64_t o = begin; o < end; o++) {
        float acc = 0.0f;
        for (int64_t c = 0; c < j->n_in; c += 1024) {
            int64_t n = j->n_in - c < 1024 ? j->n_in - c : 1024;
            const void *wr = w + ((size_t)o * (size_t)j->n_in + (size_t)c) * ws;
            const float *wf = j->wtype == DJ_F32 ? (const float *)wr : cpu_widen_row(row, wr, j->wtype, 0, n);
            acc += cpu_dot(j->x + c, wf, n);
        }
        j->y[o] = acc;
    }
}

static int cpu_xq_alloc(cpu_xq *xq, uint32_t wtype, int64_t n_in, void **xbuf);
static void cpu_xq_fill(cpu_xq *xq, const float *x, int64_t n_in, uint32_t wtype);

// x's records (xq NULL: none), built once by the first thread to get here while the others wait for them.
static void cpu_stage(_Atomic int *staged, cpu_xq *xq, const float *x, int64_t n_in, uint32_t wtype) {
    int idle = 0;
    if (atomic_compare_exchange_strong(staged, &idle, 1)) {
        if (xq) cpu_xq_fill(xq, x, n_in, wtype);
        atomic_store_explicit(staged, 2, memory_order_release);
    }
    while (atomic_load_explicit(staged, memory_order_acquire) != 2) dj_cpu_relax();
}

static void cpu_matvec_task(void *ctx, int64_t part, int64_t parts_end) {
    cpu_matvec_job *j = ctx;
    (void)parts_end;
    struct cpu_async *a = j->as;
    if (a) {
        cpu_async_wait_x(a, part, j->w, NULL, (size_t)dj_row_bytes(j->wtype, (uint64_t)j->n_in), j->chunk, j->n_out);
        cpu_stage(&a->staged, (cpu_xq *)j->xq, j->x, j->n_in, j->wtype);
    }
    int64_t b, e;
    for (cpu_claim_it it = {0}; cpu_claim(a, &j->next, j->chunk, j->n_out, part, &it, &b, &e);) {
        cpu_matvec_rows(j, b, e);
        if (a) cpu_async_rows(a, e - b);
    }
}

#ifdef CPU_SIMD
// q->hi, q->lo -> q->x16 = 254 * hi + lo (groups of 32), 16 at a time.
SIMD_FN static void simd_x16(const cpu_xq *q, size_t groups) {
    for (size_t i = 0; i < groups * DJ_QGROUP; i += 16) {
        __m256i hi = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(q->hi + i)));
        __m256i lo = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(q->lo + i)));
        __m256i x = _mm256_add_epi16(_mm256_mullo_epi16(hi, _mm256_set1_epi16(254)), lo);
        _mm256_store_si256((__m256i *)(q->x16 + i), x);
    }
}

// q->hi, q->lo -> q->x4 (blocks of 4 groups), as cpu_x4 lays them out.
static void cpu_x4_layout(const cpu_xq *q, size_t blocks) {
    for (size_t k = 0; k < blocks; k++) {
        cpu_x4 *x = q->x4 + k;
        for (int part = 0; part < 2; part++) {
            const int8_t *src = (part ? q->lo : q->hi) + k * 4 * DJ_QGROUP;
            for (int i = 0; i < 4; i++) {  // group i's inputs 0..15 and 16..31
                memcpy(x->a[part] + 16 * i, src + i * DJ_QGROUP, 16);
                memcpy(x->b[part] + 16 * i, src + i * DJ_QGROUP + 16, 16);
            }
        }
    }
}
#endif

int cpu_matvec(float *y, const float *x, const void *w, uint32_t wtype, int64_t n_in, int64_t n_out) {
    assert(dj_row_bytes(wtype, 1) > 0);
    if (wtype == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    int64_t parts = cpu_threads(), chunk = n_out / (8 * parts);
    if (chunk < 16) chunk = 16;
    cpu_matvec_job j = {y, x, w, wtype, n_in, n_out, chunk, NULL, 0, NULL};
    cpu_xq xq;
    void *xbuf;
    if (cpu_xq_alloc(&xq, wtype, n_in, &xbuf)) return -1;
    if (xbuf) {
        cpu_xq_fill(&xq, x, n_in, wtype);
        j.xq = &xq;
    }
    cpu_parallel_for(parts, (double)n_in * (double)n_out, cpu_matvec_task, &j);
    free(xbuf);
    return 0;
}

// q8, q4 on the vector path: room for x's records (*xbuf NULL: none needed; -1: out of memory), one allocation
// per call (72 bytes per 32 inputs, 9 KB at n_in = 4096, after q4's cpu_x4 blocks or q8's x16 on VNNI: 64 bytes a
// group), so concurrent callers share nothing. Fewer than 4 groups of q4 leave no block: simd_dot_q4 takes them a
// group at a time.
static int cpu_xq_alloc(cpu_xq *xq, uint32_t wtype, int64_t n_in, void **xbuf_out) {
    *xbuf_out = NULL;
#ifdef CPU_SIMD
    if (dj_is_quant(wtype) && cpu_avx2_on() && n_in > 0) {
        size_t groups = (size_t)(n_in + DJ_QGROUP - 1) / DJ_QGROUP, base = groups * (2 * DJ_QGROUP + 8);
        size_t lay = wtype == DJ_Q4 ? groups / 4 * sizeof(cpu_x4) : cpu_vnni_on() ? groups * 2 * DJ_QGROUP : 0;
        void *xbuf = aligned_alloc(64, (lay + base + 63) / 64 * 64);
        if (!xbuf) return -1;
        int8_t *b = (int8_t *)xbuf + lay;  // q4's blocks or q8's x16 first: 64-byte aligned
        *xq = (cpu_xq){b, b + groups * DJ_QGROUP, (float *)(b + groups * 2 * DJ_QGROUP),
                       (int32_t *)(b + groups * (2 * DJ_QGROUP + 4)), NULL, NULL, 0};
        if (lay && wtype == DJ_Q8) xq->x16 = xbuf;
        else if (lay) xq->x4 = xbuf;
        *xbuf_out = xbuf;
        return 0;
    }
#endif
    (void)xq, (void)wtype, (void)n_in;
    return 0;
}

// x quantized into the records cpu_xq_alloc made room for, once for every row.
static void cpu_xq_fill(cpu_xq *xq, const float *x, int64_t n_in, uint32_t wtype) {
#ifdef CPU_SIMD
    size_t groups = (size_t)(n_in + DJ_QGROUP - 1) / DJ_QGROUP;
    simd_quant_x(x, n_in, xq);
    if (xq->x16) simd_x16(xq, groups);
    else if (xq->x4) cpu_x4_layout(xq, groups / 4);
    xq->vnni = cpu_vnni_on() && (xq->x16 || xq->x4);
#else
    (void)xq, (void)x, (void)n_in, (void)wtype;
#endif
}

// ---- matvec over a few tokens: the CPU share of a pass of several rows (a batched step, a verification pass)
// y (T, n_out) = x (T, n_in) . W^T reading each weight row from memory once for all T: a thread widens a block of
// MV_RC rows by MV_KB inputs to f32 (q8 and q4 dequantized, exactly scale * k) into a buffer of its own, then
// multiplies each MV_R of its rows with the T columns MV_C at a time, MV_R * MV_C accumulators in registers (per
// 8 inputs: MV_R + MV_C loads for MV_R * MV_C fused multiply-adds, so the FMA units, not the loads, set the pace),
// the block's partial sums added into y. Past a few columns the work is arithmetic, not memory: T times
// cpu_matvec's multiply-adds per weight read.
#define MV_R 3
#define MV_C 4
#define MV_RC 24    // rows of a block (a multiple of MV_R)
#define MV_KB 256   // inputs of a block (a multiple of DJ_QGROUP)
typedef struct {
    float *y;        // (T, n_out)
    const float *x;  // (T, n_in)
    const uint8_t *w;
    uint32_t wtype;
    int64_t T, n_in, n_out, chunk;  // chunk: rows claimed at a time, a multiple of MV_R
    _Atomic int64_t next;
    struct cpu_async *as;  // cpu_matvec_start's: x lands later; NULL: x is there
    _Atomic int oom;       // a thread could not allocate its buffer: its rows are not computed
} cpu_multi_job;

#ifdef CPU_SIMD
// Weights [k0, k1) of a row of n (k0 a multiple of DJ_QGROUP) -> dst (k1 - k0 rounded up to 8: the quantized
// formats' padding widens to zeros, the other formats' tail is zeroed here).
SIMD_FN static void simd_widen_range(float *dst, const uint8_t *row, uint32_t wtype, int64_t n, int64_t k0, int64_t k1) {
    if (dj_is_quant(wtype)) {
        const uint16_t *scales = (const uint16_t *)(row + dj_scales_offset(wtype, (uint64_t)n));
        for (int64_t g = k0 / DJ_QGROUP, i = 0; g * DJ_QGROUP < k1; g++, i += DJ_QGROUP) {
            __m256 d = _mm256_set1_ps(simd_scale1(scales[g]));
            __m256 z = _mm256_set1_ps(cpu_zero1(wtype, scales[g]));  // k - z: exact
            __m128i lo, hi;  // weights 0..15 and 16..31 as int8
            if (wtype == DJ_Q8) {
                lo = _mm_loadu_si128((const __m128i *)(row + g * DJ_QGROUP));
                hi = _mm_loadu_si128((const __m128i *)(row + g * DJ_QGROUP + 16));
            } else {  // nibble j: weight j (low) and j + 16 (high)
                __m128i b = _mm_loadu_si128((const __m128i *)(row + g * (DJ_QGROUP / 2))), m = _mm_set1_epi8(0x0f);
                lo = _mm_and_si128(b, m);
                hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
            }
#define SIMD_WIDEN8(v) _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), z), d)
            _mm256_storeu_ps(dst + i, SIMD_WIDEN8(lo));
            _mm256_storeu_ps(dst + i + 8, SIMD_WIDEN8(_mm_srli_si128(lo, 8)));
            _mm256_storeu_ps(dst + i + 16, SIMD_WIDEN8(hi));
            _mm256_storeu_ps(dst + i + 24, SIMD_WIDEN8(_mm_srli_si128(hi, 8)));
#undef SIMD_WIDEN8
        }
        return;
    }
    int64_t i = k0;
    for (; i + 8 <= k1; i += 8) _mm256_storeu_ps(dst + i - k0, simd_load8(row, wtype, i));
    if (i < k1) {
        const float *t = cpu_widen_row(dst + i - k0, row + (size_t)i * dj_dtype_size(wtype), wtype, 0, k1 - i);
        if (t != dst + i - k0) memcpy(dst + i - k0, t, (size_t)(k1 - i) * sizeof(float));  // f32: its own row
        for (int64_t k = k1; k < i + 8; k++) dst[k - k0] = 0.0f;
    }
}

// y[c * ldy + r] (+)= rows r (R of them, ldw apart) . columns c (C of them, ldx apart) over n inputs (add: onto
// what y holds); R, C constants once inlined.
__attribute__((always_inline)) SIMD_FN static inline void simd_tile(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                                   const float *w, int64_t ldw, int R, int C,
                                                                   int64_t n, int add) {
    __m256 acc[MV_R][MV_C];  // unrolled (-O2 would leave the loops, and the accumulators in memory)
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv[MV_R];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = _mm256_loadu_ps(w + r * ldw + i);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m256 xv = _mm256_loadu_ps(x + c * ldx + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = simd_hsum_ps(acc[r][c]);
            for (int64_t k = i; k < n; k++) s += w[r * ldw + k] * x[c * ldx + k];
            y[c * ldy + r] = add ? y[c * ldy + r] + s : s;
        }
}

#define SIMD_TILES(R)                                                                                                \
    SIMD_FN static void simd_tiles_##R(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t T,               \
                                       const float *w, int64_t ldw, int64_t n, int add) {                           \
        int64_t c = 0;                                                                                               \
        for (; c + MV_C <= T; c += MV_C) simd_tile(y + c * ldy, ldy, x + c * ldx, ldx, w, ldw, R, MV_C, n, add);     \
        if (T - c == 3) simd_tile(y + c * ldy, ldy, x + c * ldx, ldx, w, ldw, R, 3, n, add);                         \
        if (T - c == 2) simd_tile(y + c * ldy, ldy, x + c * ldx, ldx, w, ldw, R, 2, n, add);                         \
        if (T - c == 1) simd_tile(y + c * ldy, ldy, x + c * ldx, ldx, w, ldw, R, 1, n, add);                         \
    }
SIMD_TILES(1)
SIMD_TILES(2)
SIMD_TILES(3)
#undef SIMD_TILES

// ---- the same on AVX-512: 16 lanes, 32 registers, the weights widened where they are used
// Tiles of ZR rows by up to ZC columns: ZR * ZC accumulators of 16 lanes over the whole row (per 16 inputs: ZR
// widenings of 16 weights and ZC loads of x for ZR * ZC fused multiply-adds), reduced once, 16 sums at a time, by a
// transposing tree (45 instructions for 16 sums where one reduction each takes 8). The ZR rows are read from
// memory by the first column group and from the caches by the others. On the H100 machine's Xeon host
// (bench/results/share_rows_8b, Llama-3-8B shapes) 1.3-2.6x the AVX2 tiles' GB/s at 2-32 rows; on a 2-core Zen 4,
// blocks of inputs widened into a buffer first (as the AVX2 tiles do) lost at every T, the reduction then paid
// once per block.
#define ZR 4
#define ZC 6
#define SIMD512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// Weights i..i+15 of a row (i a multiple of 16) in f32, exactly (q8, q4: scale * k); zeros past the row's end (the
// quantized formats' stored padding is k = 0; the other formats load only the lanes of m, the inputs left).
// scales: the row's, for q8 and q4.
__attribute__((always_inline)) SIMD512_FN static inline __m512 z_load16(const uint8_t *row, const uint16_t *scales,
                                                                       uint32_t wtype, int64_t i, __mmask16 m) {
    if (dj_is_quant(wtype)) {
        __m512i k;
        if (wtype == DJ_Q8) {
            k = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + i)));
        } else {  // nibble j of a group's 16 bytes: weight j (low) and j + 16 (high)
            __m128i b = _mm_loadu_si128((const __m128i *)(row + i / DJ_QGROUP * (DJ_QGROUP / 2)));
            if (i / 16 & 1) b = _mm_srli_epi16(b, 4);
            k = _mm512_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0f)));
        }
        const uint16_t p = scales[i / DJ_QGROUP];
        const __m512 z = _mm512_set1_ps(cpu_zero1(wtype, p));  // k - z: exact
        return _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(k), z), _mm512_set1_ps(simd_scale1(p)));
    }
    if (wtype == DJ_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    return wtype == DJ_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static const uint16_t *z_scales(const uint8_t *row, uint32_t wtype, int64_t n) {
    return dj_is_quant(wtype) ? (const uint16_t *)(row + dj_scales_offset(wtype, (uint64_t)n)) : NULL;
}

// out[i] = the sum of a[i]'s lanes, i < 16. Pairs interleaved (per 128 bits: a's and b's low and high halves),
// then pairs of pairs (64-bit halves), then 128-bit lanes twice: each step halves the vectors and the lanes left
// to sum.
__attribute__((always_inline)) SIMD512_FN static inline __m512 z_reduce16(const __m512 *a) {
    __m512 t[8], u[4], v[2];
    for (int j = 0; j < 8; j++)
        t[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
    for (int j = 0; j < 4; j++) {
        __m512d p = _mm512_castps_pd(t[2 * j]), q = _mm512_castps_pd(t[2 * j + 1]);
        u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
    }
    for (int j = 0; j < 2; j++)
        v[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

// y[c * ldy + r] = the sum of acc[r * C + c]'s lanes (R * C of them): reduced 16 at a time by the tree.
__attribute__((always_inline)) SIMD512_FN static inline void z_store(float *y, int64_t ldy, const __m512 *acc, int R,
                                                                    int C) {
    __m512 v[32];  // the tree's inputs, zeros past R * C
#pragma GCC unroll 32
    for (int i = 0; i < 32; i++) v[i] = i < R * C ? acc[i] : _mm512_setzero_ps();
    _Alignas(64) float s[32];
    _mm512_store_ps(s, z_reduce16(v));
    if (R * C > 16) _mm512_store_ps(s + 16, z_reduce16(v + 16));
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[c * ldy + r] = s[r * C + c];
}

// y[c * ldy + r] = rows r (R of them, rb bytes apart, widened in registers) . columns c (C of them, ldx apart; the
// last 16 inputs loaded masked, never past n) over all n inputs; R, C constants once inlined. The accumulators are
// copied out for the tree after the loop: reading acc itself through a pointer made the compiler store every
// accumulator on each iteration.
__attribute__((always_inline)) SIMD512_FN static inline void z_tile_direct(float *y, int64_t ldy, const float *x,
                                                                          int64_t ldx, const uint8_t *w, size_t rb,
                                                                          uint32_t wtype, int R, int C, int64_t n) {
    __m512 acc[ZR * ZC];
    const uint16_t *scales[ZR];
#pragma GCC unroll 32
    for (int i = 0; i < R * C; i++) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) scales[r] = z_scales(w + r * rb, wtype, n);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 wv[ZR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = z_load16(w + r * rb, scales[r], wtype, i, m);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + c * ldx + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r * C + c] = _mm512_fmadd_ps(wv[r], xv, acc[r * C + c]);
        }
    }
    z_store(y, ldy, acc, R, C);
}

// z_tile_direct over rows [b, end), ZC columns at a time, instantiated per dtype (its widening inlined).
#define Z_DIRECT_TILE(R, C) z_tile_direct(y + c0 * j->n_out, j->n_out, j->x + c0 * j->n_in, j->n_in, w, rb, wt, R, C, j->n_in)
#define Z_DIRECT_R(R)                                                                                                \
    for (int64_t c0 = 0; c0 < j->T; c0 += ZC)                                                                        \
    switch (j->T - c0 < ZC ? j->T - c0 : ZC) {                                                                       \
    case 1: Z_DIRECT_TILE(R, 1); break;                                                                              \
    case 2: Z_DIRECT_TILE(R, 2); break;                                                                              \
    case 3: Z_DIRECT_TILE(R, 3); break;                                                                              \
    case 4: Z_DIRECT_TILE(R, 4); break;                                                                              \
    case 5: Z_DIRECT_TILE(R, 5); break;                                                                              \
    case 6: Z_DIRECT_TILE(R, 6); break;                                                                              \
    }
#define Z_DIRECT(WT)                                                                                                 \
    SIMD512_FN static void z_direct_##WT(const cpu_multi_job *j, int64_t b, int64_t end) {                          \
        const uint32_t wt = WT;                                                                                      \
        size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)j->n_in);                                                     \
        for (int64_t o = b; o < end; o += ZR) {                                                                      \
            const uint8_t *w = j->w + (size_t)o * rb;                                                                \
            float *y = j->y + o;                                                                                     \
            switch (end - o < ZR ? end - o : ZR) {                                                                   \
            case 4: Z_DIRECT_R(4) break;                                                                             \
            case 3: Z_DIRECT_R(3) break;                                                                             \
            case 2: Z_DIRECT_R(2) break;                                                                             \
            case 1: Z_DIRECT_R(1) break;                                                                             \
            }                                                                                                        \
        }                                                                                                            \
    }
Z_DIRECT(DJ_F32)
Z_DIRECT(DJ_F16)
Z_DIRECT(DJ_BF16)
Z_DIRECT(DJ_Q8)
Z_DIRECT(DJ_Q4)
#undef Z_DIRECT_TILE
#undef Z_DIRECT_R
#undef Z_DIRECT

// Rows [b, end) of the job's y.
SIMD512_FN static void z_rows(const cpu_multi_job *j, int64_t b, int64_t end) {
    switch (j->wtype) {
    case DJ_F32: z_direct_DJ_F32(j, b, end); return;
    case DJ_F16: z_direct_DJ_F16(j, b, end); return;
    case DJ_BF16: z_direct_DJ_BF16(j, b, end); return;
    case DJ_Q8: z_direct_DJ_Q8(j, b, end); return;
    case DJ_Q4: z_direct_DJ_Q4(j, b, end); return;
    }
}
#endif

// A thread's buffer for the tiles' rows of up to n inputs (cpu_multi_chunk's): NULL on the AVX-512 path, which
// widens in registers. -1: out of memory.
static int cpu_multi_buf(int64_t n, float **buf) {
    *buf = NULL;
#ifdef CPU_SIMD
    if (cpu_avx512_on()) return 0;
#endif
    *buf = malloc((size_t)(MV_RC * MV_KB + n + DJ_QGROUP) * sizeof(float));
    return *buf ? 0 : -1;
}

// Rows [b, end) of a tiles' job.
static void cpu_multi_chunk(const cpu_multi_job *j, int64_t b, int64_t end, float *buf) {
    int64_t n = j->n_in;
#ifdef CPU_SIMD
    if (cpu_avx512_on()) {
        z_rows(j, b, end);
        return;
    }
    if (cpu_avx2_on()) {
        // MV_RC rows at a time, MV_KB inputs at a time: the rows' block and x's stay in the L1/L2 caches while
        // every row group and column group passes over them
        size_t rb = (size_t)dj_row_bytes(j->wtype, (uint64_t)n);
        for (int64_t r0 = b; r0 < end; r0 += MV_RC) {
            int64_t r1 = r0 + MV_RC < end ? r0 + MV_RC : end;
            for (int64_t k0 = 0; k0 < n; k0 += MV_KB) {
                int64_t k1 = k0 + MV_KB < n ? k0 + MV_KB : n;
                for (int64_t o = r0; o < r1; o++)
                    simd_widen_range(buf + (o - r0) * MV_KB, j->w + (size_t)o * rb, j->wtype, n, k0, k1);
                for (int64_t o = r0; o < r1; o += MV_R) {
                    int R = r1 - o < MV_R ? (int)(r1 - o) : MV_R;
                    float *y = j->y + o, *wb = buf + (o - r0) * MV_KB;
                    const float *x = j->x + k0;
                    if (R == 3) simd_tiles_3(y, j->n_out, x, n, j->T, wb, MV_KB, k1 - k0, k0 > 0);
                    if (R == 2) simd_tiles_2(y, j->n_out, x, n, j->T, wb, MV_KB, k1 - k0, k0 > 0);
                    if (R == 1) simd_tiles_1(y, j->n_out, x, n, j->T, wb, MV_KB, k1 - k0, k0 > 0);
                }
            }
        }
        return;
    }
#endif
    for (int64_t o = b; o < end; o++) {
        const float *wr = cpu_widen_row(buf, j->w, j->wtype, o, n);
        for (int64_t t = 0; t < j->T; t++) j->y[t * j->n_out + o] = cpu_dot(j->x + t * n, wr, n);
    }
}

static void cpu_multi_task(void *ctx, int64_t part, int64_t parts_end) {
    cpu_multi_job *j = ctx;
    (void)parts_end;
    if (j->as)
        cpu_async_wait_x(j->as, part, j->w, NULL, (size_t)dj_row_bytes(j->wtype, (uint64_t)j->n_in), j->chunk,
                         j->n_out);
    float *buf;
    const int oom = cpu_multi_buf(j->n_in, &buf);
    if (oom) atomic_store(&j->oom, 1);
    int64_t b, end;
    for (cpu_claim_it it = {0}; cpu_claim(j->as, &j->next, j->chunk, j->n_out, part, &it, &b, &end);) {
        if (!oom) cpu_multi_chunk(j, b, end, buf);
        if (j->as) cpu_async_rows(j->as, end - b);  // counted even when not computed: the GPU waits for the count
    }
    free(buf);
}

int cpu_matvec_multi(float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in,
                     int64_t n_out) {
    assert(dj_row_bytes(wtype, 1) > 0);
    // one row: cpu_matvec, unless the AVX-512 tiles take it (f16, bf16, f32: their wider loads read host memory
    // faster than cpu_matvec's AVX2; q8 and q4 keep cpu_matvec's integer sums)
    if (T == 1 && (!cpu_avx512_on() || dj_is_quant(wtype))) return cpu_matvec(y, x, w, wtype, n_in, n_out);
    if (wtype == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    // chunks of whole tiles on both vector paths (3 rows, 4 rows): multiples of 12
    int64_t parts = cpu_threads(), chunk = n_out / (8 * parts) / 12 * 12;
    if (chunk < 12) chunk = 12;
    cpu_multi_job j = {y, x, w, wtype, T, n_in, n_out, chunk, 0, NULL, 0};
    cpu_parallel_for(parts, (double)T * (double)n_in * (double)n_out, cpu_multi_task, &j);
    return atomic_load(&j.oom) ? -1 : 0;
}

// cpu_ffn_start's job: phase one claims the hidden units a chunk at a time (cpu_claim), each chunk's gate rows and
// up rows by one thread, then their silu(gate) * up into h; phase two, once every unit is done, the down rows
// from h.
typedef struct {
    const cpu_ffn_args *f;
    _Atomic uint32_t *mid;
    _Atomic int64_t next, units, next_down;  // phase one's chunks claimed, its units done; phase two's rows claimed
    _Atomic int staged;                      // h's records for down (cpu_async's staged)
    int64_t chunk, chunk_down;
    double t_mid;
    cpu_job *job;  // the job it is part of
} cpu_chain;

// The pool runs one asynchronous job at a time: held (cpu_pool_hold) from cpu_matvec_start or cpu_ffn_start to
// cpu_matvec_finish, by the thread that started it.

// An asynchronous job's state (cpu.h: its owner keeps it from start to finish), and x's records for cpu_matvec's
// path ([1]: h's, for down).
struct cpu_job {
    struct cpu_async a;
    cpu_matvec_job mv[3];  // a matvec's ([0]), or the chain's gate, up and down
    cpu_multi_job mm[3];
    cpu_xq xq[2];
    void *xbuf[2];
    cpu_ffn_args ffn;
    cpu_chain ch;
    int multi, chain, inline_;  // the tiles' path; cpu_ffn_start's; one thread: the caller computes it all in
                                // cpu_matvec_finish
    _Atomic int oom;            // a buffer could not be allocated: rows left out (cpu_matvec_finish fails)
};

cpu_job *cpu_job_new(void) { return calloc(1, sizeof(cpu_job)); }
void cpu_job_free(cpu_job *j) { free(j); }

// Rows per claim: a share of each of `parts` threads' eighth, whole tiles (multiples of 12) on the tiles' path.
static int64_t cpu_job_chunk(const cpu_job *j, int64_t n_out, int64_t parts) {
    int64_t c = j->multi ? n_out / (8 * parts) / 12 * 12 : n_out / (8 * parts);
    return j->multi ? (c < 12 ? 12 : c) : c < 16 ? 16 : c;
}

// The k-th matrix's job of the one running (k: j->mv's index) over x, writing y (T, n_out); `rec`: which of
// j->xq holds x's records for cpu_matvec's path, made where it needs them.
static void cpu_job_matrix(cpu_job *j, int k, int rec, float *y, const float *x, const void *w, uint32_t wtype,
                           int64_t T, int64_t n_in, int64_t n_out) {
    if (j->multi) {
        j->mm[k] = (cpu_multi_job){y, x, w, wtype, T, n_in, n_out, cpu_job_chunk(j, n_out, cpu_threads()), 0, &j->a,
                                   0};
        return;
    }
    j->mv[k] = (cpu_matvec_job){y, x, w, wtype, n_in, n_out, cpu_job_chunk(j, n_out, cpu_threads()), NULL, 0, &j->a};
    if (!j->xbuf[rec] && cpu_xq_alloc(&j->xq[rec], wtype, n_in, &j->xbuf[rec]))
        atomic_store(&j->oom, 1);  // no records: cpu_matvec's portable rows, and the job fails at its finish
    if (j->xbuf[rec] && rec == 0) j->a.staged = 0;  // [1]'s: cpu_chain's staged
    if (j->xbuf[rec]) j->mv[k].xq = &j->xq[rec];
}

// Takes the pool (cpu_pool_hold) and sets the job's common part.
static void cpu_job_begin(cpu_job *j, uint32_t wtype, int64_t T, int64_t n_out, const _Atomic uint32_t *ready,
                          _Atomic uint32_t *done, uint32_t seq) {
    if (wtype == DJ_F16) pthread_once(&cpu_f16_once, cpu_f16_table_init);
    cpu_pool_hold();
    j->a = (struct cpu_async){ready, done, seq, 2, 0, n_out, UINT64_MAX, 0, 0, {0}};
    j->multi = !(T == 1 && (!cpu_avx512_on() || dj_is_quant(wtype)));
    j->chain = 0;
    j->xbuf[0] = j->xbuf[1] = NULL;
    j->inline_ = cpu_threads() == 1;
    atomic_store(&j->oom, 0);
}

void cpu_matvec_start(cpu_job *j, float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in,
                      int64_t n_out, const _Atomic uint32_t *ready, _Atomic uint32_t *done, uint32_t seq) {
    assert(dj_row_bytes(wtype, 1) > 0 && n_out > 0);
    cpu_job_begin(j, wtype, T, n_out, ready, done, seq);
    cpu_job_matrix(j, 0, 0, y, x, w, wtype, T, n_in, n_out);
    if (j->multi) j->mm[0].next = cpu_first_chunks(&j->a, n_out, j->mm[0].chunk, cpu_threads());
    else j->mv[0].next = cpu_first_chunks(&j->a, n_out, j->mv[0].chunk, cpu_threads());
    if (!j->inline_)
        cpu_parallel_start(cpu_threads(), j->multi ? cpu_multi_task : cpu_matvec_task,
                           j->multi ? (void *)&j->mm[0] : (void *)&j->mv[0]);
}

// The chain's rows [b, e) of its k-th matrix (0 gate, 1 up, 2 down); buf: cpu_multi_buf's.
static void cpu_chain_rows(const cpu_job *j, int k, int64_t b, int64_t e, float *buf) {
    if (j->multi) cpu_multi_chunk(&j->mm[k], b, e, buf);
    else cpu_matvec_rows(&j->mv[k], b, e);
}

static void cpu_chain_task(void *ctx, int64_t part, int64_t parts_end) {
    cpu_chain *c = ctx;
    const cpu_ffn_args *f = c->f;
    struct cpu_async *a = &c->job->a;
    int64_t T = f->T, hid = f->hid, b, e;
    (void)parts_end;
    cpu_async_wait_x(a, part, f->gate, f->up, (size_t)dj_row_bytes(f->wtype, (uint64_t)f->dim), c->chunk, hid);
    cpu_stage(&a->staged, c->job->multi ? NULL : (cpu_xq *)c->job->mv[0].xq, f->x, f->dim, f->wtype);
    float *buf = NULL;
    const int oom = c->job->multi && cpu_multi_buf(f->dim > hid ? f->dim : hid, &buf);
    if (oom) atomic_store(&c->job->oom, 1);  // its rows are counted, not computed: the GPU waits for the count
    for (cpu_claim_it it = {0}; cpu_claim(a, &c->next, c->chunk, hid, part, &it, &b, &e);) {
        if (!oom) cpu_chain_rows(c->job, 0, b, e, buf), cpu_chain_rows(c->job, 1, b, e, buf);
        for (int64_t t = 0; t < T; t++) {
            size_t o = (size_t)(t * hid + b);
            cpu_swiglu(f->h + o, f->gate_up + o, f->gate_up + (size_t)(T * hid) + o, e - b);
        }
        double now = dj_now();  // before the count: down's rows, and t_done, come after it
        if (atomic_fetch_add_explicit(&c->units, e - b, memory_order_acq_rel) + (e - b) == hid) {
            c->t_mid = now;
            atomic_store_explicit(c->mid, a->seq, memory_order_release);
            if (!f->n_down) a->t_done = c->t_mid, atomic_store_explicit(a->done, a->seq, memory_order_release);
        }
    }
    if (f->n_down) {
        while (atomic_load_explicit(&c->units, memory_order_acquire) < hid) dj_cpu_relax();
        cpu_stage(&c->staged, c->job->multi ? NULL : (cpu_xq *)c->job->mv[2].xq, f->h, hid, f->wtype);
        for (cpu_claim_it it = {0}; cpu_claim(NULL, &c->next_down, c->chunk_down, f->n_down, part, &it, &b, &e);) {
            if (!oom) cpu_chain_rows(c->job, 2, b, e, buf);
            cpu_async_rows(a, e - b);
        }
    }
    free(buf);
}

void cpu_ffn_start(cpu_job *j, const cpu_ffn_args *f, const _Atomic uint32_t *ready, _Atomic uint32_t *mid,
                   _Atomic uint32_t *done, uint32_t seq) {
    assert(dj_row_bytes(f->wtype, 1) > 0 && f->hid > 0 && f->n_down >= 0);
    cpu_job_begin(j, f->wtype, f->T, f->n_down, ready, done, seq);
    j->chain = 1, j->ffn = *f;
    const cpu_ffn_args *g = &j->ffn;
    int64_t T = g->T, hid = g->hid;
    cpu_job_matrix(j, 0, 0, g->gate_up, g->x, g->gate, g->wtype, T, g->dim, hid);
    cpu_job_matrix(j, 1, 0, g->gate_up + (size_t)(T * hid), g->x, g->up, g->wtype, T, g->dim, hid);
    cpu_job_matrix(j, 2, 1, g->y, g->h, g->down, g->wtype, T, hid, g->n_down > 0 ? g->n_down : 1);
    int64_t chunk = cpu_job_chunk(j, hid, cpu_threads());
    j->ch = (cpu_chain){.f = g, .mid = mid, .next = cpu_first_chunks(&j->a, hid, chunk, cpu_threads()),
                        .staged = j->xbuf[1] ? 0 : 2, .chunk = chunk,
                        .chunk_down = cpu_job_chunk(j, g->n_down, cpu_threads()), .job = j};
    if (!j->inline_) cpu_parallel_start(cpu_threads(), cpu_chain_task, &j->ch);
}

int cpu_matvec_finish(cpu_job *j, double t[3]) {
    if (j->inline_) {
        if (j->chain) cpu_chain_task(&j->ch, 0, 1);
        else if (j->multi) cpu_multi_task(&j->mm[0], 0, 1);
        else cpu_matvec_task(&j->mv[0], 0, 1);
    } else {
        cpu_parallel_join();
    }
    for (int k = 0; k < 2; k++) free(j->xbuf[k]), j->xbuf[k] = NULL;
    uint64_t bits = atomic_load(&j->a.t_x);
    memcpy(&t[0], &bits, sizeof t[0]);
    t[2] = j->a.t_done, t[1] = j->chain ? j->ch.t_mid : t[2];
    const int oom = atomic_load(&j->oom) || (j->multi && !j->chain && atomic_load(&j->mm[0].oom));
    cpu_pool_unhold();
    return oom ? -1 : 0;
}

// ---- norm, RoPE, attention, SwiGLU
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void cpu_rope_freqs(const dj_config *c, float *inv_freq) {
    int64_t hd = c->head_dim;
    for (int64_t i = 0; i < hd / 2; i++) {
        // HF: 1.0 / (base ** (arange(0, hd, 2).float() / hd)), every step in f32
        float expo = (float)(2 * i) / (float)hd;
        inv_freq[i] = 1.0f / powf(c->rope_theta, expo);
    }
    if (c->rope_type != DJ_ROPE_LLAMA3) return;
    // transformers' _compute_llama3_parameters: keep high frequencies, divide low ones by `factor`, and blend
    // smoothly in between, with wavelength thresholds taken from the original context length.
    float factor = c->rope_factor, lf = c->rope_low_freq, hf = c->rope_high_freq;
    float old_len = (float)c->rope_orig_max;
    float low_wavelen = old_len / lf, high_wavelen = old_len / hf;
    for (int64_t i = 0; i < hd / 2; i++) {
        float f = inv_freq[i];
        float wavelen = (float)(2.0 * M_PI) / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old_len / wavelen - lf) / (hf - lf);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = scaled;
    }
}

void cpu_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos, const float *inv_freq) {
    int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        float c = cosf(angle), s = sinf(angle);
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + h * head_dim;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

void cpu_attention_head(float *out, const float *q, const float *k, const float *v, int64_t head_dim,
                               int64_t pos, float *scores) {
    float scale = 1.0f / sqrtf((float)head_dim), mx = -INFINITY;
    for (int64_t t = 0; t <= pos; t++) {
        scores[t] = cpu_dot(q, k + t * head_dim, head_dim) * scale;
        if (scores[t] > mx) mx = scores[t];
    }
    float sum = 0.0f;
    for (int64_t t = 0; t <= pos; t++) {
        scores[t] = expf(scores[t] - mx);
        sum += scores[t];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < head_dim; i++) out[i] = 0.0f;
    for (int64_t t = 0; t <= pos; t++) {
        float p = scores[t] * inv;
        const float *vt = v + t * head_dim;
        for (int64_t i = 0; i < head_dim; i++) out[i] += p * vt[i];
    }
}

int cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, int64_t pos, int64_t max_seq) {
    assert(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && pos < max_seq);
    float *scores = malloc((size_t)(pos + 1) * sizeof(float));
    if (!scores) return -1;
    int64_t group = n_heads / n_kv_heads;
    for (int64_t h = 0; h < n_heads; h++) {
        int64_t kvh = h / group;
        cpu_attention_head(out + h * head_dim, q + h * head_dim, k_cache + kvh * max_seq * head_dim,
                           v_cache + kvh * max_seq * head_dim, head_dim, pos, scores);
    }
    free(scores);
    return 0;
}

void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
