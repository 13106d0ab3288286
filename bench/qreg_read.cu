// bench/qreg_read.cu: the register kernel's memory side alone (qgemm.cu's qreg_kernel): the rows of a q4 matrix read
// in its pattern (a warp's 16 rows, UB bytes of each a unit, by cp.async into a ring of ST stages of its own, stream-K
// runs over row blocks x units as the kernel cuts them), with C dummy FMAs and H chained mma a lane a unit standing
// in for the widening and products, or (WD) the kernel's own widening and products on the staged bytes, beside a
// plain sequential read of the same bytes. It asks whether the kernel's pattern and pipeline can move its bytes at
// the rate a sequential read does, with and without work between the copies, and what the work itself costs.
//
//   make build/bin/qreg_read && build/bin/qreg_read   (GPU machine only; results: bench/results/qgemm_reg/session6[34])
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../kernels_impl.h"

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t err_ = (call);                                                                  \
        if (err_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "qreg_read: %s: %s (line %d)\n", #call, cudaGetErrorName(err_), __LINE__); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// A sequential read: each warp 512 contiguous bytes a load, the grid striding over the bytes.
__global__ void seq_read(const uint4 *w, size_t n16, unsigned *sink) {
    uint32_t acc = 0;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * step < n16; i += 4 * step) {  // four loads in flight a thread
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = __ldg(w + i + k * step);
#pragma unroll
        for (int k = 0; k < 4; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n16; i += step) {
        const uint4 v = __ldg(w + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

// The pattern: rows of rb bytes, UB bytes of each a unit (values only), WARPS warps of 16 rows a CTA, ST stages.
// H products a unit (kernels_impl.h's mma16816), each on the last one's sums, as the register kernel's products of a
// tile follow each other; its widening by kernels_impl.h's and_or and q_widen2.

// WD > 0: in place of the stand-in work, the register kernel's own loop body on the staged bytes (q4, 16 rows x 256
// bytes a unit, the rows swizzled as the kernel's stage: chunk ch of row r at slot ch ^ 4 (r & 1)): lane (g, c)
// widens chunks 4k + c of rows g and g + 8 (k < 4) with each chunk's parameters worked out as the kernel's are, and
// multiplies each k16 step with x fragments read from shared memory, into WD chains of sums. WD 3: two chains, each
// pair widened by one HFMA2 (k s + (-(off s)), the product rounded: not the kernel's bits) in place of q_widen2's
// HSUB2 and HMUL2, to bound what a widening of two operations a pair would move.
template <int UB, int WARPS, int ST, int C, int H = 0, int WD = 0>
__global__ void __launch_bounds__(WARPS * 32) tile_read(const uint8_t *w, int64_t n_rows, int64_t rb, int64_t units_per_row,
                                                        unsigned *sink) {
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int CPR = UB / 16, NV = 16 * CPR / 32, W_Q = 16 * UB;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_rb = (n_rows + WARPS * 16 - 1) / (WARPS * 16), U = n_rb * units_per_row, G = gridDim.x;
    const int64_t u0 = (int64_t)blockIdx.x * U / G, u1 = ((int64_t)blockIdx.x + 1) * U / G;
    const int ch = lane % CPR, r0 = lane / CPR;
    uint8_t *ring = sm + warp * ST * W_Q;
    auto load = [&](int64_t u, int st) {
        const int64_t blk = u / units_per_row, i = u - blk * units_per_row;
        const int64_t row0 = blk * WARPS * 16 + warp * 16;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            int64_t row = row0 + r0 + j * (32 / CPR);
            row = row < n_rows ? row : n_rows - 1;
            const int r = r0 + j * (32 / CPR);
            cp_async16(ring + st * W_Q + (r * CPR + (WD ? ch ^ (4 * (r & 1)) : ch)) * 16, w + row * rb + i * UB + ch * 16);
        }
    };
    float a[8];
#pragma unroll
    for (int k = 0; k < 8; k++) a[k] = (float)(lane + k);
    uint32_t acc = 0;
    constexpr int CHAINS = WD == 3 ? 2 : WD > 1 ? WD : 1;
    float d[4] = {0, 0, 0, 0}, dd[CHAINS][4] = {};
    static_assert(WD == 0 || UB == 256, "the widening body on the 256-byte units of the kernel's shape 12");
    const uint32_t m_lo = reg_const<0x003C003Cu>(), m_hi = reg_const<0x03C003C0u>();
    const uint32_t e_lo = reg_const<0x5C005C00u>(), e_hi = reg_const<0x4C004C00u>();
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (u0 + st < u1) load(u0 + st, st);
        cp_commit();
    }
    for (int64_t u = u0; u < u1; u++) {
        cp_wait<ST - 2>();
        __syncwarp();
        const int st = (int)((u - u0) % ST);
        if (u + ST - 1 < u1) load(u + ST - 1, (st + ST - 1) % ST);
        cp_commit();
        acc ^= *(const uint32_t *)(ring + st * W_Q + lane * 16);
#pragma unroll
        for (int k = 0; k < C / 8; k++)
#pragma unroll
            for (int m = 0; m < 8; m++) asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f3A000000;" : "+f"(a[m]));
        const uint32_t fa[4] = {acc, acc + 1, acc + 2, acc + 3}, fb[2] = {acc ^ 5, acc ^ 7};
#pragma unroll
        for (int h = 0; h < H; h++) mma16816(d, fa, fb);
        if constexpr (WD > 0) {
            const int g = lane >> 2, c = lane & 3;
            const uint8_t *base = ring + st * W_Q;
#pragma unroll
            for (int k = 0; k < CPR / 4; k++) {
                const int chk = 4 * k + c;
                const uint4 q0 = *(const uint4 *)(base + (g * CPR + (chk ^ (4 * (g & 1)))) * 16);
                const uint4 q1 = *(const uint4 *)(base + ((g + 8) * CPR + (chk ^ (4 * (g & 1)))) * 16);
                // the chunk's parameters, from its bytes (a stand-in for its word); c0, c16: -(off s) for WD 3
                __half2 sc[2], off[2], off16[2], c0[2], c16[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t pm = (h ? q1.w : q0.w) >> 16;
                    sc[h] = __half2half2(__ushort_as_half((unsigned short)((pm & 0x3FFu) << 5)));
                    off[h] = __half2half2(__ushort_as_half((unsigned short)(0x5C00u | (pm >> 10))));
                    off16[h] = __half2half2(__ushort_as_half((unsigned short)(0x4C00u | (pm >> 10) << 4)));
                    c0[h] = __hneg2(__hmul2(off[h], sc[h])), c16[h] = __hneg2(__hmul2(off16[h], sc[h]));
                }
                auto widen = [&](uint32_t pair, int h, int hh) {
                    if constexpr (WD == 3) {
                        __half2 v;
                        memcpy(&v, &pair, 4);
                        v = __hfma2(v, sc[h], hh ? c16[h] : c0[h]);
                        uint32_t o;
                        memcpy(&o, &v, 4);
                        return o;
                    } else {
                        return q_widen2(pair, sc[h], hh ? off16[h] : off[h]);
                    }
                };
                const uint32_t uu[2][4] = {{q0.x, q0.y, q0.z, q0.w}, {q1.x, q1.y, q1.z, q1.w}};
#pragma unroll
                for (int wp = 0; wp < 4; wp++) {
                    const uint4 xv = *(const uint4 *)(base + (((k * 4 + wp) * 32 + lane) & 255) * 16);  // x's loads
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const uint32_t u = uu[0][wp], u8 = uu[1][wp], m = hh ? m_hi : m_lo, e = hh ? e_hi : e_lo;
                        uint32_t af[4];
                        af[0] = widen(and_or(u << 2, m, e), 0, hh);
                        af[1] = widen(and_or(u8 << 2, m, e), 1, hh);
                        af[2] = widen(and_or(u >> 6, m, e), 0, hh);
                        af[3] = widen(and_or(u8 >> 6, m, e), 1, hh);
                        const uint32_t bf[2] = {hh ? xv.z : xv.x, hh ? xv.w : xv.y};
                        mma16816(dd[(2 * wp + hh) % CHAINS], af, bf);
                    }
                }
            }
        }
    }
    cp_wait<0>();
    float s = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) s += a[k];
    for (int k = 0; k < CHAINS; k++) s += dd[k][0] + dd[k][1] + dd[k][2] + dd[k][3];
    if (acc == 0x12345678u || s + d[0] + d[1] + d[2] + d[3] == 1234.5f) *sink = acc;
}

static double time_us(cudaStream_t s, int reps, void (*launch)(cudaStream_t, int, void *), void *ctx) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> t;
    launch(s, 0, ctx);
    for (int r = 0; r < reps; r++) {  // groups of 10 launches back to back: the launch gaps mostly hidden
        CK(cudaEventRecord(a, s));
        for (int k = 0; k < 10; k++) launch(s, 10 * r + k, ctx);
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1e2);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct ctx_t {
    uint8_t *w;
    int copies;
    int64_t rows, rb, upr;
    size_t bytes;
    unsigned *sink;
    int grid, smem;
    void (*k)(const uint8_t *, int64_t, int64_t, int64_t, unsigned *);
    int threads;
};

static void launch_seq(cudaStream_t s, int r, void *p) {
    ctx_t *c = (ctx_t *)p;
    seq_read<<<132 * 8, 256, 0, s>>>((const uint4 *)(c->w + (size_t)(r % c->copies) * c->bytes), c->bytes / 16, c->sink);
}
static void launch_tile(cudaStream_t s, int r, void *p) {
    ctx_t *c = (ctx_t *)p;
    c->k<<<c->grid, c->threads, c->smem, s>>>(c->w + (size_t)(r % c->copies) * c->bytes, c->rows, c->rb, c->upr, c->sink);
}

template <int UB, int WARPS, int ST, int C, int H = 0, int WD = 0>
static void run(cudaStream_t s, ctx_t &c, double seq_us, int cap) {
    auto k = tile_read<UB, WARPS, ST, C, H, WD>;
    const int smem = WARPS * ST * 16 * UB;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, WARPS * 32, smem));
    if (cap && per_sm > cap) per_sm = cap;
    c.k = k, c.threads = WARPS * 32, c.smem = smem, c.grid = per_sm * 132;
    const double us = time_us(s, 30, launch_tile, &c);
    printf("UB %4d warps %d ST %d C %4d H %2d WD %d: %d CTAs a SM, %7.1f us, %6.0f GB/s, %.2f of the sequential read\n", UB, WARPS,
           ST, C, H, WD, per_sm, us, c.bytes / us / 1e3, seq_us / us);
}

int main() {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    ctx_t c;
    c.rows = 28672, c.rb = 2304, c.upr = 2048 / 256;  // the 8B's gate|up in q4: 4096 inputs, values then parameters
    c.bytes = (size_t)c.rows * c.rb;
    c.copies = 8;  // 528 MB: past L2 every call
    CK(cudaMalloc(&c.w, c.bytes * c.copies));
    CK(cudaMemset(c.w, 1, c.bytes * c.copies));
    CK(cudaMalloc(&c.sink, 4));
    const double seq = time_us(s, 30, launch_seq, &c);
    printf("sequential read of %.1f MB: %.1f us, %.0f GB/s\n", c.bytes / 1e6, seq, c.bytes / seq / 1e3);
    // the values only are read by the tile pattern (2048 of 2304 bytes a row): compare at the bytes each moves
    const double seq_vals = seq * 2048.0 / 2304.0;
    c.upr = 2048 / 256;
    run<256, 8, 2, 0>(s, c, seq_vals, 0);
    run<256, 8, 2, 0>(s, c, seq_vals, 2);
    run<256, 8, 4, 0>(s, c, seq_vals, 0);
    run<256, 8, 2, 600>(s, c, seq_vals, 0);
    run<256, 8, 2, 600>(s, c, seq_vals, 2);
    run<256, 8, 3, 600>(s, c, seq_vals, 0);
    run<256, 8, 2, 900>(s, c, seq_vals, 2);
    run<256, 8, 2, 1200>(s, c, seq_vals, 2);
    run<256, 8, 2, 300, 32>(s, c, seq_vals, 2);
    run<256, 8, 2, 600, 32>(s, c, seq_vals, 2);
    run<256, 8, 3, 600, 32>(s, c, seq_vals, 0);
    run<256, 8, 2, 0, 32>(s, c, seq_vals, 2);
    run<256, 8, 2, 0, 64>(s, c, seq_vals, 2);
    run<256, 8, 2, 0, 0, 1>(s, c, seq_vals, 2);  // the kernel's body, one chain of sums (shape 12)
    run<256, 8, 2, 0, 0, 2>(s, c, seq_vals, 2);  // two chains
    run<256, 8, 3, 0, 0, 1>(s, c, seq_vals, 0);
    run<256, 8, 2, 0, 0, 3>(s, c, seq_vals, 2);  // one HFMA2 a pair
    run<256, 8, 2, 0, 0, 3>(s, c, seq_vals, 1);
    run<256, 8, 2, 0, 0, 1>(s, c, seq_vals, 1);  // the body at one CTA a multiprocessor (shape 13's occupancy)
    run<256, 8, 4, 0, 0, 1>(s, c, seq_vals, 1);
    c.upr = 2048 / 512;
    run<512, 8, 2, 0>(s, c, seq_vals, 0);
    run<512, 8, 2, 1200>(s, c, seq_vals, 0);
    run<512, 4, 3, 1200, 64>(s, c, seq_vals, 0);
    c.upr = 2048 / 128;
    run<128, 8, 4, 0>(s, c, seq_vals, 0);
    run<128, 8, 4, 300>(s, c, seq_vals, 0);
    run<128, 8, 4, 300, 16>(s, c, seq_vals, 0);
    return 0;
}
