// sample.cu: picking the next token on the GPU from logits (n) f32 in device memory: argmax, and top-p
// (nucleus) sampling with temperature, sort-free and deterministic (kernels.h gives the exact semantics). One
// block each; the chosen index is written to device memory.
#include <cuda_runtime.h>

#include "kernels_impl.h"

#define SAMPLE_THREADS 1024  // one block per call

// ---- argmax

// The first index of the largest non-NaN value over the block (-1 when there is none); every thread gets it.
__device__ void block_argmax(const float *z, int64_t n, float *best_v, int64_t *best_i) {
    __shared__ float sv[32];
    __shared__ long long si[32];
    float bv = -INFINITY;
    long long bi = -1;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = z[i];
        if (v == v && (bi < 0 || v > bv)) bv = v, bi = i;  // increasing i: the first of equal values stays
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    *best_v = bv;
    *best_i = bi;
}

__global__ __launch_bounds__(SAMPLE_THREADS) void argmax_kernel(int32_t *out, const float *z, int64_t n) {
    float bv;
    int64_t bi;
    block_argmax(z, n, &bv, &bi);
    if (threadIdx.x == 0) *out = (int32_t)(bi < 0 ? 0 : bi);
}

extern "C" int gpu_argmax(int32_t *d_out, const float *logits, int64_t n, cudaStream_t s, dj_err *e) {
    if (n < 1 || n > INT32_MAX) return dj_fail(e, "gpu_argmax: bad n=%lld", (long long)n);
    argmax_kernel<<<1, SAMPLE_THREADS, 0, s>>>(d_out, logits, n);
    LAUNCH_CHECK("argmax", s);
    return 0;
}

// ---- top-p
// Integer weight of a logit (kernels.h gives the semantics); NaN weighs 0.
__device__ __forceinline__ unsigned long long topp_weight(float z, float m, float temp) {
    const float v = expf((z - m) / temp);
    return v >= 0.0f ? (unsigned long long)(v * 4294967296.0f) : 0ull;
}

#define RADIX_BITS 11
#define RADIX_BINS (1 << RADIX_BITS)

// One block. Weights fit in 33 bits (<= 2^32), selected 11 bits at a time from the top. Histograms hold
// weight mass per digit; integer atomics make them exact and independent of order.
__global__ __launch_bounds__(SAMPLE_THREADS) void top_p_kernel(int32_t *out, const float *z, int64_t n, float temp,
                                                               float top_p, float u) {
    __shared__ unsigned long long hist[RADIX_BINS];
    __shared__ unsigned long long sel[3];  // prefix, mass above the prefix, mass at or above the prefix
    const int tid = threadIdx.x;
    float zmax;
    int64_t imax;
    block_argmax(z, n, &zmax, &imax);
    unsigned long long part = 0;
    for (int64_t i = tid; i < n; i += SAMPLE_THREADS) part += topp_weight(z[i], zmax, temp);
    const unsigned long long W = block_sum_u64(part);
    if (W == 0) {  // all NaN or infinite logits: fall back to argmax
        if (tid == 0) *out = (int32_t)(imax < 0 ? 0 : imax);
        return;
    }
    const double tg = ceil((double)top_p * (double)W);
    const unsigned long long target = tg < 1.0 ? 1ull : tg >= (double)W ? W : (unsigned long long)tg;

    unsigned long long prefix = 0, above = 0, at_or_above = W;
    for (int pass = 0; pass < 3; pass++) {
        const int shift = 2 * RADIX_BITS - RADIX_BITS * pass;  // 22, 11, 0
        for (int b = tid; b < RADIX_BINS; b += SAMPLE_THREADS) hist[b] = 0;
        __syncthreads();
        unsigned long long zero_digit = 0;  // the crowded bin, summed in registers first
        for (int64_t i = tid; i < n; i += SAMPLE_THREADS) {
            const unsigned long long w = topp_weight(z[i], zmax, temp);
            if ((w >> (shift + RADIX_BITS)) != prefix) continue;
            const unsigned digit = (unsigned)(w >> shift) & (RADIX_BINS - 1);
            if (digit == 0)
                zero_digit += w;
            else
                atomicAdd(&hist[digit], w);
        }
        zero_digit = warp_sum_u64(zero_digit);
        if ((tid & 31) == 0 && zero_digit) atomicAdd(&hist[0], zero_digit);
        __syncthreads();
        // Thread j holds bins hi = 2047 - 2j and lo = hi - 1; the scan in thread order gives suffix sums.
        const int hi = RADIX_BINS - 1 - 2 * tid, lo = hi - 1;
        const unsigned long long mh = hist[hi], mlo = hist[lo];
        const unsigned long long incl = block_scan_u64(mh + mlo);  // mass of bins >= lo
        const unsigned long long s_lo = above + incl, s_hi = s_lo - mlo, s_up = s_hi - mh;  // >= lo, >= hi, > hi
        // The chosen digit is the largest b with above + mass(bins >= b) >= target: exactly one thread sees it.
        if (s_hi >= target && s_up < target) sel[0] = (prefix << RADIX_BITS) | (unsigned)hi, sel[1] = s_up, sel[2] = s_hi;
        else if (s_lo >= target && s_hi < target) sel[0] = (prefix << RADIX_BITS) | (unsigned)lo, sel[1] = s_hi, sel[2] = s_lo;
        __syncthreads();
        prefix = sel[0], above = sel[1], at_or_above = sel[2];
        __syncthreads();  // sel and hist are rewritten by the next pass
    }
    const unsigned long long thr = prefix, M = at_or_above;
    double rd = floor((double)u * (double)M);
    const unsigned long long r = rd <= 0.0 ? 0ull : rd >= (double)M ? M - 1 : (unsigned long long)rd;

    // Pick: contiguous index segments per thread, so thread order is index order.
    const int64_t seg = (n + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int64_t b0 = min((int64_t)tid * seg, n), b1 = min(b0 + seg, n);
    unsigned long long mine = 0;
    for (int64_t i = b0; i < b1; i++) {
        const unsigned long long w = topp_weight(z[i], zmax, temp);
        if (w >= thr) mine += w;
    }
    const unsigned long long incl = block_scan_u64(mine), excl = incl - mine;
    if (mine > 0 && excl <= r && r < incl) {
        unsigned long long c = excl;
        for (int64_t i = b0; i < b1; i++) {
            const unsigned long long w = topp_weight(z[i], zmax, temp);
            if (w < thr) continue;
            c += w;
            if (c > r) {
                *out = (int32_t)i;
                break;
            }
        }
    }
}

extern "C" int gpu_sample_top_p(int32_t *d_out, const float *logits, int64_t n, float temp, float top_p, float u,
                                cudaStream_t s, dj_err *e) {
    if (n < 1 || n > INT32_MAX) return dj_fail(e, "gpu_sample_top_p: bad n=%lld", (long long)n);
    if (!(temp > 0.0f) || !(top_p > 0.0f)) return gpu_argmax(d_out, logits, n, s, e);
    top_p_kernel<<<1, SAMPLE_THREADS, 0, s>>>(d_out, logits, n, temp, top_p, u);
    LAUNCH_CHECK("top_p", s);
    return 0;
}
