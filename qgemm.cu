// qgemm.cu: y (T, n_out) f32 = x (T, n_in) . W^T for q8 and q4 W (model.h's rows) on the tensor cores, for T > 1
// (prefill, and any pass of several tokens). The stored bytes go straight from memory to shared memory; each warp
// widens its own weights in registers to the f16 values the dequantizing path would have written (scale * k,
// rounded once) and multiplies them with mma.sync (or, on Hopper, wgmma), so no f16 copy of W is ever written or
// read back.
//
// Why the inputs are permuted: a warp loads weights with ldmatrix, which hands each thread bytes 4c..4c+3 of a
// 16-byte row chunk (c = lane % 4). Those bytes hold weights 4c..4c+3 (q8) or, in their low and high nibbles,
// 4c..4c+3 and 16+4c..16+4c+3 (q4, model.h's layout), while the mma's A fragment wants the thread's inputs at
// k = 2c, 2c+1, 2c+8, 2c+9 of each 16. Rather than shuffle weights, x is stored with its inputs in the order the
// weights arrive: within every 16, position 2c + j + 8h holds input 4c + h + 2j (h, j in 0..1), so a thread's
// pair of halves (bytes 0 and 2, or 1 and 3) meets the matching pair of x values. A sum does not care about order.
#include "kernels_impl.h"

#include <math.h>
#include <stdint.h>

// ---- x rounded to f16, inputs permuted within each 16 (position 2c + j + 8h holds input 4c + h + 2j: the even
// inputs of the 16 in order, then the odd ones), rows padded with zeros to kp = 32 * groups
// A thread takes 16 inputs of a token: 64 bytes read (128 with up), two 16-byte chunks written. A thread an element
// (2-byte stores, 64-bit divisions for its indices) had cost 5-7% of the 8B layer's q8 and q4 products at 512 tokens.
static __device__ __forceinline__ uint32_t f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

// What the kernels multiply W with, row t: x's row (up NULL), or silu(x) * up (the down projection with gpu_swiglu
// fused, as it computes it); rows ld floats apart.
struct qgemm_src {
    const float *x, *up;
    int64_t ld;
};

// v = inputs a0 .. a0 + 15 of a row (zeros past n_in)
static __device__ __forceinline__ void load16(float *v, const float *row, int64_t a0, int64_t n_in) {
    if (a0 + 16 <= n_in && (((uintptr_t)(row + a0)) & 15) == 0) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 f = ((const float4 *)(row + a0))[j];
            v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = a0 + j < n_in ? row[a0 + j] : 0.0f;
    }
}

// Inputs a0 .. a0 + 15 of token tok (zeros for tok < 0) as two runs of 8 f16: the even ones of the 16 in order
// (to *even), then the odd ones.
static __device__ __forceinline__ void x16_halves(uint4 *even, uint4 *odd, const qgemm_src &src, int64_t tok,
                                                  int64_t a0, int64_t n_in) {
    float v[16];
    if (tok < 0) {
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = 0.0f;
    } else {
        load16(v, src.x + tok * src.ld, a0, n_in);
        if (src.up) {
            float u[16];
            load16(u, src.up + tok * src.ld, a0, n_in);
#pragma unroll
            for (int j = 0; j < 16; j++) v[j] = silu_mul(v[j], u[j]);
        }
    }
    *even = make_uint4(f16x2(v[0], v[2]), f16x2(v[4], v[6]), f16x2(v[8], v[10]), f16x2(v[12], v[14]));
    *odd = make_uint4(f16x2(v[1], v[3]), f16x2(v[5], v[7]), f16x2(v[9], v[11]), f16x2(v[13], v[15]));
}

// xp (T, kp) f16. Threads: x over the kp / 16 runs of 16 inputs, y (strided) over the tokens. The split kernel's
// n_tickets tickets are zeroed on the way (by the first block's threads: it runs before, on the same stream).
__global__ void qgemm_x_kernel(__half *xp, qgemm_src src, int64_t T, int64_t n_in, int64_t kp, unsigned *tickets,
                               int n_tickets) {
    if (blockIdx.x == 0 && blockIdx.y == 0)
        for (int i = threadIdx.x; i < n_tickets; i += blockDim.x) tickets[i] = 0;
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= kp / 16) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        uint4 *dst = (uint4 *)(xp + t * kp + 16 * r);
        x16_halves(dst, dst + 1, src, t, 16 * r, n_in);
    }
}

// ---- the same values in the Hopper kernel's stage layout: for each block of BN tokens and each stage of 64 inputs,
// BN 128-byte rows (a token's 64 permuted inputs), 16-byte chunk c of token t at c ^ (t % 8), contiguous, so one
// bulk copy moves a stage's x. xt (ceil(T / BN) BN, KT 64) f16 in that order (KT = ceil(kp / 64)); tokens past T
// and inputs past n_in are zeros. bn = 1 << lbn; rows: T rounded up to whole blocks. Threads: x over the KT 4 runs of
// 16, y (strided) over the rows.
__global__ void qgemm_xt_kernel(__half *xt, qgemm_src src, int64_t T, int64_t rows, int64_t n_in, int64_t KT,
                                int lbn) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= KT * 4) return;
    const int64_t kt = r >> 2;
    const int h = (int)(r & 3);
    for (int64_t tok = blockIdx.y; tok < rows; tok += gridDim.y) {
        const int t = (int)(tok & ((1 << lbn) - 1));
        __half *stage = xt + (((tok >> lbn) * KT + kt) << lbn) * 64 + (int64_t)t * 64;
        x16_halves((uint4 *)stage + ((2 * h) ^ (t & 7)), (uint4 *)stage + ((2 * h + 1) ^ (t & 7)), src,
                   tok < T ? tok : -1, 16 * r, n_in);
    }
}

// ---- PTX: asynchronous copies into shared memory, ldmatrix, mma
static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// Copies `bytes` (0 or 16) of src and zero-fills the rest of the 16.
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes));
}
// Copies `bytes` (0, 2 or 4) of src and zero-fills the rest of the 4.
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x2(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}
// d (16x8 f32) += a (16x16 f16, row) . b (16x8 f16, col)
static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- widening: a pair of stored values (each in the low bits of a 16-bit half, as 1024 + v) to its weights with
// kernels_impl.h's q_widen2, as the dequantizing path does (bitwise the same halves).
// q4: u = bytes 4c..4c+3 of a group (B0..B3). Step 0 (low nibbles) and step 1 (high nibbles): pair A = (B0, B2),
// pair C = (B1, B3); each nibble k lands at bits 2-5 of its half (shift: 0, 4, 8 or 12).
static __device__ __forceinline__ uint32_t q4_pair(uint32_t u, int shift) {
    return (shift ? (u >> (shift - 2)) & 0x003C003Cu : (u << 2) & 0x003C003Cu) | 0x5C005C00u;
}
// q8: u = bytes 4c..4c+3 of a half group, each k as a signed byte: pair A = (B0, B2), pair C = (B1, B3).
static __device__ __forceinline__ uint32_t q8_pair(uint32_t u, uint32_t sel) {
    return __byte_perm(u ^ 0x80808080u, 0x64646464u, sel);
}

// The A fragments of a stage's four k16 steps (a[step][4], m16n8k16's layout in the x permutation qgemm_x_kernel
// makes) for the 16 rows from rb of a stage, widened to f16 from its values q and scales sc in shared memory.
template <int WT, int BM>
static __device__ __forceinline__ void widen_frags(uint32_t (*a)[4], const uint8_t *q, const uint8_t *sc, int rb,
                                                   int lane) {
    const int g = lane >> 2;
    const uint32_t s_lo = *(const uint32_t *)(sc + (rb + g) * 4), s_hi = *(const uint32_t *)(sc + (rb + g + 8) * 4);
    const int lr = rb + (lane & 7) + ((lane >> 3) & 1) * 8;  // the row this lane addresses
    // q4: u[0] = (row g, group 0), (g + 8, 0), (g, 1), (g + 8, 1); q8: u[group] = (row g, half 0), (g + 8, half 0),
    // (g, half 1), (g + 8, half 1)
    uint32_t u[2][4];
    ldsm_x4(u[0], q + ((lane >> 4) * BM + lr) * 16);
    if (WT == DJ_Q8) ldsm_x4(u[1], q + ((2 + (lane >> 4)) * BM + lr) * 16);
#pragma unroll
    for (int gi = 0; gi < 2; gi++) {
        __half2 sg, ng, sg8, ng8;  // rows g and g + 8: group gi's scale and -c
        q_widen_params<WT>((s_lo >> (16 * gi)) & 0xFFFFu, &sg, &ng);
        q_widen_params<WT>((s_hi >> (16 * gi)) & 0xFFFFu, &sg8, &ng8);
#pragma unroll
        for (int s = 0; s < 2; s++) {
            uint32_t *f = a[2 * gi + s];
            if (WT == DJ_Q4) {  // step s: the low (0) or high (1) nibbles
                const uint32_t ug = u[0][2 * gi], ug8 = u[0][2 * gi + 1];
                f[0] = q_widen2(q4_pair(ug, 4 * s), sg, ng), f[1] = q_widen2(q4_pair(ug8, 4 * s), sg8, ng8);
                f[2] = q_widen2(q4_pair(ug, 4 * s + 8), sg, ng);
                f[3] = q_widen2(q4_pair(ug8, 4 * s + 8), sg8, ng8);
            } else {  // step s: half s of the group
                const uint32_t ug = u[gi][2 * s], ug8 = u[gi][2 * s + 1];
                f[0] = q_widen2(q8_pair(ug, 0x4240), sg, ng), f[1] = q_widen2(q8_pair(ug8, 0x4240), sg8, ng8);
                f[2] = q_widen2(q8_pair(ug, 0x4341), sg, ng), f[3] = q_widen2(q8_pair(ug8, 0x4341), sg8, ng8);
            }
        }
    }
}

// A stage's weights, the mma.sync kernel: rows m0 .. m0 + BM - 1, inputs 64 kt .. 64 kt + 63 (two groups): the values
// into q chunk-major (16 bytes a (chunk, row), a row's chunks by consecutive threads), the two scales into sc
// (4 bytes a row); past the last row or group, zeros. so: where a row's scales start.
template <class C, int BM>
static __device__ __forceinline__ void load_w(uint8_t *q, uint8_t *sc, const uint8_t *w, int64_t m0, int64_t n_out,
                                              int64_t groups, int64_t row_bytes, int64_t so, int kt, int tid) {
    for (int i = tid; i < C::CH * BM; i += C::THREADS) {
        const int r = i / C::CH, c = i - r * C::CH;
        const int64_t row = m0 + r, g = 2 * (int64_t)kt + c / (C::CH / 2);
        const bool ok = row < n_out && g < groups;
        cp_async16(q + (c * BM + r) * 16, ok ? w + row * row_bytes + (int64_t)kt * 2 * C::QB + c * 16 : w,
                   ok ? 16 : 0);
    }
    for (int r = tid; r < BM; r += C::THREADS) {
        const int64_t row = m0 + r, g = 2 * (int64_t)kt;
        const int bytes = row < n_out ? (g + 1 < groups ? 4 : 2) : 0;
        cp_async4(sc + r * 4, bytes ? w + row * row_bytes + so + 2 * g : w, bytes);
    }
}

// ---- the kernel
// A CTA computes a (BM rows of W) x (BN tokens) tile of y, 64 inputs (two groups) a stage, ST stages of
// asynchronous copies in flight; WM x WN warps, each a (BM / WM) x (BN / WN) tile of m16n8k16 products.
// Shared memory, a stage: Q the values, chunk-major ([16-byte chunk of the stage][row], so the 8 rows an ldmatrix
// reads are 128 contiguous bytes), S the rows' two scales, X the tokens' 64 permuted inputs (128 bytes a token,
// 16-byte chunk c of token t stored at c ^ (t % 8): conflict-free ldmatrix).
template <int WT, int BM, int BN, int WM, int WN, int ST> struct qgemm_cfg {
    static constexpr int THREADS = WM * WN * 32;
    static constexpr int QB = q_group_bytes(WT);      // bytes of values a group
    static constexpr int CH = 2 * QB / 16;            // 16-byte chunks of values a row a stage
    static constexpr int MT = BM / WM / 16, NT = BN / WN / 8;  // m16 and n8 tiles a warp
    static constexpr int Q_BYTES = CH * BM * 16, S_BYTES = BM * 4, X_BYTES = BN * 128;
    static constexpr int STAGE = Q_BYTES + S_BYTES + X_BYTES;
    static constexpr int SMEM = STAGE * ST;
    static_assert(BM % (WM * 16) == 0 && BN % (WN * 8) == 0, "warp tiles of whole m16n8 products");
    static_assert(NT % 2 == 0 || NT == 1, "B fragments two n8 tiles at a time, or one");
};

// Split over the inputs (gridDim.z parts, for passes of a few tokens whose tiles alone leave multiprocessors idle):
// each part writes its sums to part[z] (T, n_out), and the part that finishes its tile last adds the parts' sums
// in order 0, 1, ... into y, so that y does not depend on which finished first. tickets: one a tile, zero before
// the launch (qgemm_x_kernel zeroes them).
struct qgemm_split {
    float *part;
    unsigned *tickets;
};

// PRECOND: w and every row (row_bytes apart) 16-byte aligned; xp from qgemm_x_kernel (kp = 32 * groups).
template <int WT, int BM, int BN, int WM, int WN, int ST>
__global__ void __launch_bounds__(WM *WN * 32)
    qgemm_kernel(float *__restrict__ y, const __half *__restrict__ xp, const uint8_t *__restrict__ w, int64_t T,
                 int64_t n_out, int64_t groups, int64_t row_bytes, qgemm_split split) {
    using C = qgemm_cfg<WT, BM, BN, WM, WN, ST>;
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    const int64_t kp = groups * DJ_QGROUP, so = groups * C::QB;  // x's row length; where a row's scales start
    // this part's stages of 64 inputs: [K0, KT)
    const int KT_ALL = (int)((groups + 1) / 2), KPER = (KT_ALL + (int)gridDim.z - 1) / (int)gridDim.z;
    const int K0 = (int)blockIdx.z * KPER, KT = K0 + KPER < KT_ALL ? K0 + KPER : KT_ALL;

    // stage `st` <- inputs 64 kt .. 64 kt + 63: values, scales, x (past the end: zeros)
    auto load = [&](int st, int kt) {
        uint8_t *q = sm + st * C::STAGE, *sc = q + C::Q_BYTES, *xs = sc + C::S_BYTES;
        load_w<C, BM>(q, sc, w, m0, n_out, groups, row_bytes, so, kt, tid);
        for (int i = tid; i < BN * 8; i += C::THREADS) {  // a token's 128 bytes by consecutive threads
            const int t = i >> 3, c = i & 7;
            const int64_t tok = n0 + t, k = (int64_t)kt * 64 + c * 8;
            const bool ok = tok < T && k < kp;
            cp_async16(xs + (t * 8 + (c ^ (t & 7))) * 16, ok ? xp + tok * kp + k : xp, ok ? 16 : 0);
        }
    };

    float acc[C::MT][C::NT][4];
#pragma unroll
    for (int i = 0; i < C::MT; i++)
#pragma unroll
        for (int j = 0; j < C::NT; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (K0 + st < KT) load(st, K0 + st);
        cp_async_commit();
    }

    const int g = lane >> 2;  // the fragment row (A) or column (B) this thread holds
    for (int kt = K0; kt < KT; kt++) {
        cp_async_wait<ST - 2>();
        __syncthreads();  // stage kt landed for everyone; stage kt - 1 is free
        if (kt + ST - 1 < KT) load((kt - K0 + ST - 1) % ST, kt + ST - 1);
        cp_async_commit();

        const uint8_t *q = sm + ((kt - K0) % ST) * C::STAGE, *sc = q + C::Q_BYTES, *xs = sc + C::S_BYTES;
        // A fragments of the stage's four k16 steps, widened: a[m tile][step][4]
        uint32_t a[C::MT][4][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++) {
            const int rb = wm * (BM / WM) + mt * 16;  // the tile's first row in the CTA
            widen_frags<WT, BM>(a[mt], q, sc, rb, lane);
        }
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
#pragma unroll
            for (int nt = 0; nt < C::NT; nt += (C::NT == 1 ? 1 : 2)) {
                const int tb = wn * (BN / WN) + nt * 8;  // the tile's first token in the CTA
                uint32_t b[4];
                if (C::NT == 1) {
                    const int t = tb + (lane & 7), c = 2 * ks + ((lane >> 3) & 1);
                    ldsm_x2(b, xs + (t * 8 + (c ^ (t & 7))) * 16);
                } else {
                    const int t = tb + (lane & 7) + (lane >> 4) * 8, c = 2 * ks + ((lane >> 3) & 1);
                    ldsm_x4(b, xs + (t * 8 + (c ^ (t & 7))) * 16);
                }
#pragma unroll
                for (int mt = 0; mt < C::MT; mt++) {
                    mma16816(acc[mt][nt], a[mt][ks], b);
                    if (C::NT > 1) mma16816(acc[mt][nt + 1], a[mt][ks], b + 2);
                }
            }
        }
    }
    cp_async_wait<0>();

    // y[token][row] (or this part's sums): c0, c1 at (row g, tokens 2c, 2c + 1), c2, c3 at row g + 8
    const int c2 = 2 * (lane & 3);
    float *out = gridDim.z == 1 ? y : split.part + (size_t)blockIdx.z * (size_t)T * (size_t)n_out;
    auto each = [&](auto &&f) {  // f(offset in y, the thread's value) for each output the thread holds
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++) {
            const int64_t row = m0 + wm * (BM / WM) + mt * 16 + g;
#pragma unroll
            for (int nt = 0; nt < C::NT; nt++) {
                const int64_t tok = n0 + wn * (BN / WN) + nt * 8 + c2;
                float *d = acc[mt][nt];
                if (row < n_out) {
                    if (tok < T) f(tok * n_out + row, d[0]);
                    if (tok + 1 < T) f((tok + 1) * n_out + row, d[1]);
                }
                if (row + 8 < n_out) {
                    if (tok < T) f(tok * n_out + row + 8, d[2]);
                    if (tok + 1 < T) f((tok + 1) * n_out + row + 8, d[3]);
                }
            }
        }
    };
    each([&](int64_t i, float &v) { out[i] = v; });
    if (gridDim.z == 1) return;
    // the last part of this tile to finish adds the parts in order
    __shared__ unsigned ticket;
    __threadfence();  // this part's sums are visible before its ticket is
    __syncthreads();
    if (tid == 0) ticket = atomicAdd(split.tickets + blockIdx.y * gridDim.x + blockIdx.x, 1u);
    __syncthreads();
    if (ticket != gridDim.z - 1) return;
    __threadfence();
    const size_t stride = (size_t)T * (size_t)n_out;
    each([&](int64_t i, float &v) {
        float sum = __ldcg(split.part + i);
        for (unsigned z = 1; z < gridDim.z; z++) sum += __ldcg(split.part + z * stride + (size_t)i);
        y[i] = sum;
    });
}

// ---- the register kernel: passes of a few tokens at the weights' bytes
// The kernels above stage the weights through shared memory (a copy, a barrier and an ldmatrix a stage), which holds
// them at 4-5x the time a read of their bytes takes up to 32 tokens (bench/results/qgemm_split). Here each lane
// loads its weights from memory straight into registers and widens them into the mma's A fragments. Lane (g, c) of
// a warp holds, for each of the warp's MT tiles of 16 rows, rows g and g + 8 of groups 4 KC i + KC c .. + KC - 1 in
// iteration i (a quad reads 4 KC consecutive groups of a row: 64 KC bytes of q4). A group's 32 weights feed 8 k16
// steps, 4 a step, in the lane's slots 2c, 2c + 1, 2c + 8, 2c + 9, so a step mixes the quad's four groups, each
// weight widened with its own group's parameters before the product. x is laid out to match (qreg_x_kernel): lane
// (g, c)'s B fragment is token g's inputs in the same slots of the same group, two steps' in one 16-byte load, a
// warp's 512 bytes contiguous. Which weight of its group a step's slot e takes (the order q4_pair and q8_pair hand
// a word's weights out): q4, step 2w + h: 16h + 4w + {0, 2, 1, 3}[e]; q8, step s: 4s + {0, 2, 1, 3}[e].
// A CTA's warps take different rows and the same inputs, so x stays in L1 for all of them; the inputs are split into
// gridDim.z parts, added up as qgemm_kernel's split does (the last part of a tile to finish adds them in order).
template <int WT> static __device__ __forceinline__ int qreg_slot(int s, int e) {
    const int o = 2 * (e & 1) + (e >> 1);
    return WT == DJ_Q4 ? 16 * (s & 1) + 4 * (s >> 1) + o : 4 * s + o;
}

// v = inputs a0 .. a0 + 3 of a row (zeros past n_in)
static __device__ __forceinline__ void load4(float *v, const float *row, int64_t a0, int64_t n_in) {
    if (a0 + 4 <= n_in && (((uintptr_t)(row + a0)) & 15) == 0) {
        const float4 f = *(const float4 *)(row + a0);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = a0 + j < n_in ? row[a0 + j] : 0.0f;
    }
}

// xf (uint4 a lane's two steps): for each block tb of 8 NT tokens, iteration i, group j of a lane's KC, step pair w,
// n8 tile nt and lane (g, c), token 8 NT tb + 8 nt + g's inputs of group 4 KC i + KC c + j in the slots of steps
// 2w and 2w + 1, in f16 (zeros past T and n_in). n16: the uint4s; a thread each. The split kernel's n_tickets
// tickets are zeroed on the way, as qgemm_x_kernel does.
template <int WT, int NT, int KC>
__global__ void qreg_x_kernel(uint4 *xf, qgemm_src src, int64_t T, int64_t n_in, int64_t iters, int64_t n16,
                              unsigned *tickets, int n_tickets) {
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < n_tickets; i += blockDim.x) tickets[i] = 0;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n16) return;
    const int lane = (int)(idx & 31);
    int64_t r = idx >> 5;
    const int nt = (int)(r % NT);
    r /= NT;
    const int w = (int)(r & 3);
    r >>= 2;
    const int j = (int)(r % KC);
    r /= KC;
    const int64_t tb = r / iters, i = r - tb * iters;
    const int64_t tok = tb * 8 * NT + 8 * nt + (lane >> 2), grp = i * 4 * KC + (int64_t)KC * (lane & 3) + j;
    float a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};  // the inputs of steps 2w and 2w + 1, from their first slot on
    if (tok < T) {
        const int64_t a0 = 32 * grp + qreg_slot<WT>(2 * w, 0), b0 = 32 * grp + qreg_slot<WT>(2 * w + 1, 0);
        load4(a, src.x + tok * src.ld, a0, n_in);
        load4(b, src.x + tok * src.ld, b0, n_in);
        if (src.up) {
            float ua[4], ub[4];
            load4(ua, src.up + tok * src.ld, a0, n_in);
            load4(ub, src.up + tok * src.ld, b0, n_in);
#pragma unroll
            for (int k = 0; k < 4; k++) a[k] = silu_mul(a[k], ua[k]), b[k] = silu_mul(b[k], ub[k]);
        }
    }
    xf[idx] = make_uint4(f16x2(a[0], a[2]), f16x2(a[1], a[3]), f16x2(b[0], b[2]), f16x2(b[1], b[3]));
}

// 16 bytes of weights, read once: past L1, which keeps x.
static __device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
static __device__ __forceinline__ uint32_t u4_at(const uint4 &v, int k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// A lane's weights of an iteration: values q (QV 16-byte loads a group) and parameters p, rows g (h 0) and g + 8.
template <int WT, int MT, int KC> struct qreg_frag {
    static constexpr int QV = WT == DJ_Q8 ? 2 : 1;
    uint4 q[MT][2][KC * QV];
    uint32_t p[MT][2][KC];
};

// PRECOND: w and every row (row_bytes apart) 16-byte aligned; xf from qreg_x_kernel with the same NT and KC; iters =
// ceil(groups / (4 KC)).
template <int WT, int NT, int MT, int KC, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    qreg_kernel(float *__restrict__ y, const uint4 *__restrict__ xf, const uint8_t *__restrict__ w, int64_t T,
                int64_t n_out, int64_t groups, int64_t row_bytes, int iters, qgemm_split split) {
    using F = qreg_frag<WT, MT, KC>;
    constexpr int QB = q_group_bytes(WT), QV = F::QV;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int64_t so = groups * QB;  // where a row's parameters start
    const int64_t m0 = ((int64_t)blockIdx.x * WARPS + warp) * MT * 16;
    // the lane's rows (tile mt, half h), clamped to the last: a row past n_out computes sums never stored
    const uint8_t *rp[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = m0 + 16 * mt + 8 * h + g;
            rp[mt][h] = w + (row < n_out ? row : n_out - 1) * row_bytes;
        }
    // this part's iterations [I0, I1)
    const int I0 = (int)((int64_t)iters * blockIdx.z / gridDim.z);
    const int I1 = (int)((int64_t)iters * (blockIdx.z + 1) / gridDim.z);
    const uint4 *xb = xf + (int64_t)blockIdx.y * iters * (KC * 4 * NT * 32) + lane;

    auto load = [&](int i, F &f) {
        const int64_t g0 = (int64_t)i * 4 * KC + KC * c;  // the lane's first group
        if (g0 + KC <= groups) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
#pragma unroll
                    for (int k = 0; k < KC * QV; k++) f.q[mt][h][k] = ld_stream(rp[mt][h] + g0 * QB + 16 * k);
                    const uint8_t *ps = rp[mt][h] + so + 2 * g0;
                    if (KC == 1) {
                        f.p[mt][h][0] = *(const uint16_t *)ps;
                    } else if (KC == 2) {
                        const uint32_t v = *(const uint32_t *)ps;
                        f.p[mt][h][0] = v & 0xFFFFu, f.p[mt][h][KC - 1] = v >> 16;
                    } else {
#pragma unroll
                        for (int k = 0; k < KC; k += 2) {
                            const uint32_t v = *(const uint32_t *)(ps + 2 * k);
                            f.p[mt][h][k] = v & 0xFFFFu, f.p[mt][h][k + 1] = v >> 16;
                        }
                    }
                }
        } else {  // the last iteration's groups past the row's end: zeros (x is zero there too)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int k = 0; k < KC; k++) {
                        const bool ok = g0 + k < groups;
#pragma unroll
                        for (int v = 0; v < QV; v++)
                            f.q[mt][h][k * QV + v] =
                                ok ? ld_stream(rp[mt][h] + (g0 + k) * QB + 16 * v) : make_uint4(0, 0, 0, 0);
                        f.p[mt][h][k] = ok ? *(const uint16_t *)(rp[mt][h] + so + 2 * (g0 + k)) : 0u;
                    }
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

    auto compute = [&](int i, const F &f) {
        const uint4 *xi = xb + (int64_t)i * (KC * 4 * NT * 32);
#pragma unroll
        for (int k = 0; k < KC; k++) {
            __half2 sc[MT][2], off[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) q_widen_params<WT>(f.p[mt][h][k], &sc[mt][h], &off[mt][h]);
#pragma unroll
            for (int wp = 0; wp < 4; wp++) {
                uint4 xv[NT];
#pragma unroll
                for (int nt = 0; nt < NT; nt++) xv[nt] = __ldg(xi + ((k * 4 + wp) * NT + nt) * 32);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int s = 2 * wp + hh;  // the step
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        uint32_t a[4];
                        if (WT == DJ_Q4) {
                            const uint32_t ug = u4_at(f.q[mt][0][k], wp), ug8 = u4_at(f.q[mt][1][k], wp);
                            a[0] = q_widen2(q4_pair(ug, 4 * hh), sc[mt][0], off[mt][0]);
                            a[1] = q_widen2(q4_pair(ug8, 4 * hh), sc[mt][1], off[mt][1]);
                            a[2] = q_widen2(q4_pair(ug, 8 + 4 * hh), sc[mt][0], off[mt][0]);
                            a[3] = q_widen2(q4_pair(ug8, 8 + 4 * hh), sc[mt][1], off[mt][1]);
                        } else {
                            const uint32_t ug = u4_at(f.q[mt][0][k * QV + s / 4], s % 4);
                            const uint32_t ug8 = u4_at(f.q[mt][1][k * QV + s / 4], s % 4);
                            a[0] = q_widen2(q8_pair(ug, 0x4240), sc[mt][0], off[mt][0]);
                            a[1] = q_widen2(q8_pair(ug8, 0x4240), sc[mt][1], off[mt][1]);
                            a[2] = q_widen2(q8_pair(ug, 0x4341), sc[mt][0], off[mt][0]);
                            a[3] = q_widen2(q8_pair(ug8, 0x4341), sc[mt][1], off[mt][1]);
                        }
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                            const uint32_t b[2] = {hh ? xv[nt].z : xv[nt].x, hh ? xv[nt].w : xv[nt].y};
                            mma16816(acc[mt][nt], a, b);
                        }
                    }
                }
            }
        }
    };

    // two iterations' weights in registers: the next one's loads in flight while this one is multiplied
    F fa, fb;
    if (I0 < I1) load(I0, fa);
    for (int i = I0; i < I1; i += 2) {
        if (i + 1 < I1) load(i + 1, fb);
        compute(i, fa);
        if (i + 2 < I1) load(i + 2, fa);
        if (i + 1 < I1) compute(i + 1, fb);
    }

    // y[token][row] (or this part's sums): c0, c1 at (row g, tokens 2c, 2c + 1), c2, c3 at row g + 8
    const int64_t n0 = (int64_t)blockIdx.y * 8 * NT;
    float *out = gridDim.z == 1 ? y : split.part + (size_t)blockIdx.z * (size_t)T * (size_t)n_out;
    auto each = [&](auto &&fn) {  // fn(offset in y, the lane's value) for each output the lane holds
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int64_t row = m0 + 16 * mt + g;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int64_t tok = n0 + 8 * nt + 2 * c;
                float *d = acc[mt][nt];
                if (row < n_out) {
                    if (tok < T) fn(tok * n_out + row, d[0]);
                    if (tok + 1 < T) fn((tok + 1) * n_out + row, d[1]);
                }
                if (row + 8 < n_out) {
                    if (tok < T) fn(tok * n_out + row + 8, d[2]);
                    if (tok + 1 < T) fn((tok + 1) * n_out + row + 8, d[3]);
                }
            }
        }
    };
    each([&](int64_t i, float &v) { out[i] = v; });
    if (gridDim.z == 1) return;
    __shared__ unsigned ticket;
    __threadfence();  // this part's sums are visible before its ticket is
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(split.tickets + blockIdx.y * gridDim.x + blockIdx.x, 1u);
    __syncthreads();
    if (ticket != gridDim.z - 1) return;
    __threadfence();
    const size_t stride = (size_t)T * (size_t)n_out;
    each([&](int64_t i, float &v) {
        float sum = __ldcg(split.part + i);
        for (unsigned z = 1; z < gridDim.z; z++) sum += __ldcg(split.part + z * stride + (size_t)i);
        y[i] = sum;
    });
}

// ---- the Hopper kernel: warpgroup MMAs (wgmma, sm_90a), the weights widened into A registers, x from shared memory
// A CTA is two warpgroups, each 64 rows of W (a warp 16, its A fragments laid out as mma.sync's), times BN tokens
// (one m64nBNk16 product a k16 step); 64 inputs a stage, ST stages. x's stage is the swizzled 128-byte-row layout of
// the kernel above, which is wgmma's 128-byte swizzle when the stage is 1024-byte aligned, so B is read by
// descriptor; with XB, qgemm_xt_kernel lays x out stage by stage and one thread moves a stage's x with one bulk copy
// (the multiprocessor's copy engine, completing an mbarrier) instead of every thread copying 16 bytes at a time.
// Loads run ST - 2 stages ahead: the products of a stage stay in flight while the next stage is widened (wait_group
// 1), so a stage is refilled only two iterations after its products were issued. A thread copies the same (row,
// chunk) of weights and the same row's scales in every stage, so its addresses are worked out once (recomputing them
// per copy cost about as many instructions as the widening: 15-20% of the time). KS = 2 splits the inputs between
// two CTAs (twice the CTAs where rows and tokens alone leave SMs idle); MINB = 2 keeps a 128-token CTA within 128
// registers so that two share a multiprocessor.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QGEMM_WGMMA 1
#endif

#if defined(QGEMM_WGMMA)
// wgmma's shared-memory matrix descriptor: start address, stride between 8-row groups (1024 bytes), 128-byte swizzle.
static __device__ __forceinline__ uint64_t wg_desc(const void *p) {
    return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulators across the asynchronous products.
static __device__ __forceinline__ void wg_pin(float *d) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}
static __device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
// bytes (a multiple of 16) from src to dst by the copy engine of the multiprocessor (the async proxy, as wgmma
// reads), completing a phase of mbarrier b, which this call arms for them.
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, int bytes, uint64_t *b) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
}
// d (64x128 f32, this thread's 64) += a (64x16 f16, registers) . b (16x128 f16, shared memory, descriptor)
static __device__ __forceinline__ void wgmma_128(float *d, const uint32_t *a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
// d (64x256 f32, this thread's 128) += a (64x16 f16, registers) . b (16x256 f16, shared memory, descriptor)
static __device__ __forceinline__ void wgmma_256(float *d, const uint32_t *a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#endif

// An output of one part of KS: stored, or with KS = 2 added to y's zero (0 + a + b and 0 + b + a are the same float:
// two parts sum the same in either order, so the result does not depend on which part finishes first).
template <int KS> static __device__ __forceinline__ void put(float *p, float v) {
    static_assert(KS == 1 || KS == 2, "more than two parts would sum in the order they finish");
    if (KS == 1) *p = v;
    else atomicAdd(p, v);
}

template <int WT, int BN, int ST> struct qgemm_wg_cfg {
    static constexpr int THREADS = 256, BM = 128;
    static constexpr int QB = q_group_bytes(WT), CH = 2 * QB / 16;
    static constexpr int X_BYTES = BN * 128, Q_BYTES = CH * BM * 16, S_BYTES = BM * 4;
    static constexpr int STAGE = (X_BYTES + Q_BYTES + S_BYTES + 1023) / 1024 * 1024;
    static constexpr int SMEM = STAGE * ST + 1024;
    static_assert((BN == 128 || BN == 256) && ST >= 3 && SMEM <= 227 * 1024,
                  "m64n128 or m64n256 products, loads two stages behind");
};

// PRECOND: as qgemm_kernel.
template <int WT, int BN, int ST, int KS, bool XB, int MINB>
__global__ void __launch_bounds__(256, MINB)
    qgemm_wg_kernel(float *__restrict__ y, const __half *__restrict__ xp, const uint8_t *__restrict__ w, int64_t T,
                    int64_t n_out, int64_t groups, int64_t row_bytes) {
#if defined(QGEMM_WGMMA)
    using C = qgemm_wg_cfg<WT, BN, ST>;
    __shared__ uint64_t xbar[ST];  // XB: a stage's x arrived (one bulk copy from qgemm_xt_kernel's layout)
    constexpr int BM = C::BM, NB = BN / 128, TH = C::THREADS;
    constexpr int NQ = C::CH * BM / TH, NX = BN * 8 / TH, NS = (BM + TH - 1) / TH;  // copies a thread a stage
    static_assert(C::CH * BM % TH == 0 && BN * 8 % TH == 0 && (BM % TH == 0 || BM < TH), "whole copies a thread");
    extern __shared__ uint8_t sm_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    const int64_t kp = groups * DJ_QGROUP, so = groups * C::QB;
    // this CTA's stages: part blockIdx.z of KS (the parts' sums are added into y, which starts at zero)
    const int KT_ALL = (int)((groups + 1) / 2), KPER = (KT_ALL + KS - 1) / KS, K0 = (int)blockIdx.z * KPER;
    const int KT = K0 + KPER < KT_ALL ? KPER : KT_ALL - K0;  // stages kt = K0 .. K0 + KT - 1

    // weights: chunk wc of rows wr0 + j TH / CH; the half of the stage (group) that chunk falls in
    const int wc = tid % C::CH, wr0 = tid / C::CH, whalf = wc / (C::CH / 2);
    const uint8_t *wsrc[NQ];
    bool wok[NQ];
#pragma unroll
    for (int j = 0; j < NQ; j++) {
        const int64_t row = m0 + wr0 + j * (TH / C::CH);
        wok[j] = row < n_out;
        wsrc[j] = w + (wok[j] ? row : 0) * row_bytes + wc * 16;
    }
    const int wdst = C::X_BYTES + (wc * BM + wr0) * 16;  // + j (TH / CH) 16
    // scales: rows tid + j TH
    const uint8_t *ssrc[NS];
    bool sok[NS];
#pragma unroll
    for (int j = 0; j < NS; j++) {
        const int64_t row = m0 + tid + j * TH;
        sok[j] = tid + j * TH < BM && row < n_out;
        ssrc[j] = w + (sok[j] ? row : 0) * row_bytes + so;
    }
    const int sdst = C::X_BYTES + C::Q_BYTES + tid * 4;  // + j TH 4
    // x without XB: chunk xc of tokens xt0 + j TH / 8 (the swizzle depends on t % 8, the same for every j)
    const int xc = tid & 7, xt0 = tid >> 3;
    const __half *xsrc = xp + (n0 + xt0) * kp + xc * 8;
    const int64_t xstep = (int64_t)(TH / 8) * kp;
    const int xdst = (xt0 * 8 + (xc ^ (xt0 & 7))) * 16;  // + j (TH / 8) 128
    int nx = 0;  // how many of the thread's tokens exist
#pragma unroll
    for (int j = 0; j < NX; j++) nx += n0 + xt0 + j * (TH / 8) < T;
    if (XB) {
        if (tid == 0) {
            for (int s = 0; s < ST; s++) mbar_init(&xbar[s], 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }

    auto load = [&](int st, int i) {  // the CTA's i-th stage
        uint8_t *base = sm + st * C::STAGE;
        const int kt = K0 + i;
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            const bool ok = wok[j] && 2 * kt + whalf < groups;
            cp_async16(base + wdst + j * (TH / C::CH) * 16, ok ? wsrc[j] + (int64_t)kt * 2 * C::QB : w, ok ? 16 : 0);
        }
        const int sbytes = 2 * kt + 1 < groups ? 4 : 2;
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (tid + j * TH < BM)
                cp_async4(base + sdst + j * TH * 4, sok[j] ? ssrc[j] + 4 * (int64_t)kt : w, sok[j] ? sbytes : 0);
        if (XB) {
            if (tid == 0) bulk_copy(base, xp + ((int64_t)blockIdx.x * KT_ALL + kt) * BN * 64, BN * 128, &xbar[st]);
            return;
        }
        const bool kok = (int64_t)kt * 64 + xc * 8 < kp;
#pragma unroll
        for (int j = 0; j < NX; j++) {
            const bool ok = kok && j < nx;
            cp_async16(base + xdst + j * (TH / 8) * 128, ok ? xsrc + j * xstep + (int64_t)kt * 64 : xp, ok ? 16 : 0);
        }
    };

    float acc[NB][64];  // BN 256: one 64x256 tile, n8 block j in acc[j / 16] + 4 (j % 16)
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int i = 0; i < 64; i++) acc[nb][i] = 0.0f;

#pragma unroll
    for (int st = 0; st < ST - 2; st++) {
        if (st < KT) load(st, st);
        cp_async_commit();
    }
    const int g = lane >> 2, rb = warp * 16;  // this warp's 16 rows of the CTA's 128
    uint32_t a[2][4][4];  // two stages' fragments: one in the products in flight, one being widened
    auto step = [&](int i, uint32_t (*af)[4]) {  // the CTA's i-th stage
        cp_async_wait<ST - 3>();
        if (XB) mbar_wait(&xbar[i % ST], (uint32_t)((i / ST) & 1));
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async's writes, seen by wgmma
        __syncthreads();
        if (i + ST - 2 < KT) load((i + ST - 2) % ST, i + ST - 2);  // the stage of i - 2: its products are done
        cp_async_commit();
        const uint8_t *xs = sm + (i % ST) * C::STAGE, *q = xs + C::X_BYTES, *sc = q + C::Q_BYTES;
        widen_frags<WT, BM>(af, q, sc, rb, lane);
        wg_fence();
#pragma unroll
        for (int nb = 0; nb < NB; nb++) wg_pin(acc[nb]);
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            if (NB == 2) wgmma_256(acc[0], af[ks], wg_desc(xs + ks * 32));  // one product: half the instructions
            else wgmma_128(acc[0], af[ks], wg_desc(xs + ks * 32));
        }
        wg_commit();
        wg_wait<1>();
#pragma unroll
        for (int nb = 0; nb < NB; nb++) wg_pin(acc[nb]);
    };
    int i = 0;
    for (; i + 1 < KT; i += 2) {
        step(i, a[0]);
        step(i + 1, a[1]);
    }
    if (i < KT) step(i, a[0]);
    wg_wait<0>();
#pragma unroll
    for (int nb = 0; nb < NB; nb++) wg_pin(acc[nb]);
    cp_async_wait<0>();

    // accumulator i of n8 block j: (row g, tokens 8j + 2c, + 1) for i % 4 < 2, row g + 8 for the others
    const int c2 = 2 * (lane & 3);
    const int64_t row = m0 + rb + g;
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int64_t tok = n0 + nb * 128 + j * 8 + c2;
            const float *d = acc[nb] + 4 * j;
            if (row < n_out) {
                if (tok < T) put<KS>(y + tok * n_out + row, d[0]);
                if (tok + 1 < T) put<KS>(y + (tok + 1) * n_out + row, d[1]);
            }
            if (row + 8 < n_out) {
                if (tok < T) put<KS>(y + tok * n_out + row + 8, d[2]);
                if (tok + 1 < T) put<KS>(y + (tok + 1) * n_out + row + 8, d[3]);
            }
        }
#endif
}

// ---- launch
// The tile shapes measured (bench/qgemm_bench.cu); gpu_qgemm picks among them by T.
#define QGEMM_VARIANTS(X)        \
    X(0, 128, 128, 4, 2, 4)      \
    X(1, 128, 128, 2, 4, 4)      \
    X(2, 256, 128, 4, 2, 3)      \
    X(3, 128, 64, 4, 2, 4)       \
    X(4, 64, 128, 2, 4, 4)       \
    X(5, 128, 32, 4, 2, 4)       \
    X(6, 128, 16, 8, 1, 4)       \
    X(7, 64, 64, 2, 2, 4)

// The Hopper kernel's shapes: (id, BN, ST, KS, XB, MINB). Measured against each other on the H100
// (bench/results/qgemm): x by bulk copy (XB) gained 1-5% with 256 tokens whole and up to 20% on q4 with 128, lost
// 2-7% with 256 split; two CTAs a multiprocessor (MINB, 128 tokens, 126 registers) gained up to 20% on q4.
#define QGEMM_WG_VARIANTS(X)      \
    X(8, 256, 5, 1, true, 1)      \
    X(9, 256, 4, 2, false, 1)     \
    X(10, 128, 4, 2, true, 2)     \
    X(11, 128, 4, 1, true, 2)

// The mma.sync kernel split over the inputs, for passes of a few tokens on matrices whose rows alone leave
// multiprocessors idle: (id, BM, BN, WM, ST, PER_SM), its tiles times the parts about PER_SM CTAs a multiprocessor
// (qgemm_parts). Of six shapes measured on the H200 (bench/results/qgemm_split: BM 32-128, BN 16-64, 2-6 CTAs a
// multiprocessor), these two won: on Llama-3-8B's q|k|v, wo and down in q4, 1.17-1.61x the engine's previous
// choice at T = 8, 1.27-2.07x at 16, 1.03-1.43x at 32; past 32 tokens and on gate|up the other shapes stay ahead.
#define QGEMM_SPLIT_VARIANTS(X)   \
    X(12, 64, 16, 4, 6, 4)        \
    X(13, 64, 32, 4, 6, 3)

#define QGEMM_SPLIT_T 64                     // the most tokens the split kernels take
#define QGEMM_SPLIT_COLS ((int64_t)1 << 16)  // parts x rows: the partial sums' floats a token (scratch)
#define QGEMM_TICKETS 1024                   // tiles of a split launch (one ticket each)
#define QGEMM_SPLIT_MAX 16                   // parts at most

// xp = x in f16 for the kernels: qgemm_x_kernel's layout (bn 0; n_tickets of tickets zeroed), or qgemm_xt_kernel's
// in blocks of bn tokens.
static int qgemm_x(__half *xp, const qgemm_src &x, int64_t T, int64_t n_in, int bn, unsigned *tickets, int n_tickets,
                   cudaStream_t s, dj_err *e) {
    const int64_t kp = (n_in + DJ_QGROUP - 1) / DJ_QGROUP * DJ_QGROUP;
    const int64_t KT = (kp + 63) / 64, runs = bn ? KT * 4 : kp / 16, rows = bn ? (T + bn - 1) / bn * bn : T;
    const dim3 grid((unsigned)((runs + 63) / 64), (unsigned)(rows < 65535 ? rows : 65535));
    if (bn) qgemm_xt_kernel<<<grid, 64, 0, s>>>(xp, x, T, rows, n_in, KT, __builtin_ctz((unsigned)bn));  // 128, 256
    else qgemm_x_kernel<<<grid, 64, 0, s>>>(xp, x, T, n_in, kp, tickets, n_tickets);
    LAUNCH_CHECK("qgemm_x", s);
    return 0;
}

template <int WT, int BN, int ST, int KS, bool XB, int MINB>
static int qgemm_wg_launch(float *y, const qgemm_src &x, __half *xp, const void *w, int64_t T, int64_t n_in,
                           int64_t n_out, cudaStream_t s, dj_err *e) {
    using C = qgemm_wg_cfg<WT, BN, ST>;
    if (qgemm_x(xp, x, T, n_in, XB ? BN : 0, NULL, 0, s, e)) return -1;
    static int ready;
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(qgemm_wg_kernel<WT, BN, ST, KS, XB, MINB>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        ready = 1;
    }
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    const dim3 grid((unsigned)((T + BN - 1) / BN), (unsigned)((n_out + C::BM - 1) / C::BM), KS);
    if (KS > 1) CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)T * (size_t)n_out * sizeof(float), s));
    qgemm_wg_kernel<WT, BN, ST, KS, XB, MINB><<<grid, C::THREADS, C::SMEM, s>>>(y, xp, (const uint8_t *)w, T, n_out,
                                                                              groups, rb);
    LAUNCH_CHECK("qgemm_wg", s);
    return 0;
}

// How many parts the split kernel cuts the inputs into: enough that tiles x parts make about per_sm CTAs a
// multiprocessor, each part two stages of 64 inputs or more, the partial sums within QGEMM_SPLIT_COLS a token; 1
// (no split) where the tiles alone fill the device or the pass is too long for the scratch.
static int qgemm_parts(const dj_gpu *g, int per_sm, int64_t T, int64_t tiles, int64_t n_in, int64_t n_out) {
    const int64_t stages = ((n_in + DJ_QGROUP - 1) / DJ_QGROUP + 1) / 2, want = (int64_t)per_sm * g->n_sm;
    if (T > QGEMM_SPLIT_T || tiles > QGEMM_TICKETS || tiles >= want) return 1;
    int64_t k = (want + tiles - 1) / tiles;
    if (k > QGEMM_SPLIT_MAX) k = QGEMM_SPLIT_MAX;
    if (k > stages / 2) k = stages / 2;
    if (k * n_out > QGEMM_SPLIT_COLS) k = QGEMM_SPLIT_COLS / n_out;
    return k > 1 ? (int)k : 1;
}

// split: the parts (1: the plain kernel); where they go in the scratch after xp: the tickets, then the sums.
template <int WT, int BM, int BN, int WM, int WN, int ST>
static int qgemm_launch(float *y, const qgemm_src &x, __half *xp, const void *w, int64_t T, int64_t n_in, int64_t n_out,
                        int parts, cudaStream_t s, dj_err *e) {
    using C = qgemm_cfg<WT, BM, BN, WM, WN, ST>;
    const dim3 grid((unsigned)((T + BN - 1) / BN), (unsigned)((n_out + BM - 1) / BM), (unsigned)parts);
    const int64_t kp64 = (n_in + 63) / 64 * 64;
    unsigned *tickets = (unsigned *)(xp + (T + 255) / 256 * 256 * kp64);
    qgemm_split split = {(float *)(tickets + QGEMM_TICKETS), tickets};
    if (qgemm_x(xp, x, T, n_in, 0, tickets, parts > 1 ? (int)(grid.x * grid.y) : 0, s, e)) return -1;
    static int ready;  // the shared-memory opt-in, once per instantiation (the process uses one device)
    if (!ready) {
        CUDA_CHECK(cudaFuncSetAttribute(qgemm_kernel<WT, BM, BN, WM, WN, ST>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        ready = 1;
    }
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    qgemm_kernel<WT, BM, BN, WM, WN, ST><<<grid, C::THREADS, C::SMEM, s>>>(y, xp, (const uint8_t *)w, T, n_out,
                                                                         groups, rb, split);
    LAUNCH_CHECK("qgemm", s);
    return 0;
}

// The register kernel's shapes, (id, NT, MT, KC, WARPS, PER_SM): blocks of 8 NT tokens, MT tiles of 16 rows a warp,
// KC groups a lane an iteration, WARPS warps a CTA, the inputs split into parts until about PER_SM CTAs a
// multiprocessor.
#define QREG_VARIANTS(X)        \
    X(14, 1, 1, 2, 8, 2)        \
    X(15, 2, 1, 2, 8, 2)        \
    X(16, 2, 2, 2, 4, 4)        \
    X(17, 4, 2, 1, 4, 4)        \
    X(18, 8, 1, 1, 8, 2)        \
    X(19, 1, 2, 2, 4, 4)        \
    X(20, 1, 1, 4, 8, 2)

// qreg_x_kernel's x for T tokens and n_in inputs, bytes, for every shape above (tokens to 64, groups to 16): the
// tickets and partial sums follow it.
static size_t qreg_x_bytes(int64_t T, int64_t n_in) {
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP;
    return (size_t)((T + 63) / 64 * 64) * (size_t)((groups + 15) / 16 * 16) * 64;
}

// x in f16, T rounded up to whole blocks of 256 tokens; up to QGEMM_SPLIT_T tokens, the split kernels' tickets and
// partial sums after it. The register kernel's x and its split's the same way.
extern "C" size_t gpu_qgemm_scratch(int64_t T, int64_t n_in) {
    const size_t x = (size_t)(T + 255) / 256 * 256 * (size_t)((n_in + 63) / 64 * 64) * 2;
    const size_t split = T <= QGEMM_SPLIT_T ? QGEMM_TICKETS * 4 + (size_t)T * QGEMM_SPLIT_COLS * 4 : 0;
    const size_t xr = qreg_x_bytes(T, n_in);
    return (x > xr ? x : xr) + split;
}

// How many parts the register kernel cuts the inputs into: as qgemm_parts, with iterations of 4 KC groups, each part
// one iteration or more.
static int qreg_parts(const dj_gpu *g, int per_sm, int64_t T, int64_t tiles, int64_t iters, int64_t n_out) {
    const int64_t want = (int64_t)per_sm * g->n_sm;
    if (T > QGEMM_SPLIT_T || tiles > QGEMM_TICKETS || tiles >= want) return 1;
    int64_t k = (want + tiles - 1) / tiles;
    if (k > QGEMM_SPLIT_MAX) k = QGEMM_SPLIT_MAX;
    if (k > iters) k = iters;
    if (k * n_out > QGEMM_SPLIT_COLS) k = QGEMM_SPLIT_COLS / n_out;
    return k > 1 ? (int)k : 1;
}

template <int WT, int NT, int MT, int KC, int WARPS>
static int qreg_launch(const dj_gpu *g, int per_sm, float *y, const qgemm_src &x, void *scratch, const void *w,
                       int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, iters = (groups + 4 * KC - 1) / (4 * KC);
    const int64_t rows = WARPS * MT * 16, rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    for (int64_t t0 = 0; t0 < T; t0 += (int64_t)65535 * 8 * NT) {  // grid.y: blocks of 8 NT tokens
        const int64_t Tc = T - t0 < (int64_t)65535 * 8 * NT ? T - t0 : (int64_t)65535 * 8 * NT;
        const int64_t tb = (Tc + 8 * NT - 1) / (8 * NT), tiles = tb * ((n_out + rows - 1) / rows);
        const int parts = qreg_parts(g, per_sm, Tc, tiles, iters, n_out);
        uint4 *xf = (uint4 *)scratch;
        unsigned *tickets = (unsigned *)((uint8_t *)scratch + qreg_x_bytes(Tc, n_in));
        const qgemm_split split = {(float *)(tickets + QGEMM_TICKETS), tickets};
        const qgemm_src xc = {x.x + t0 * x.ld, x.up ? x.up + t0 * x.ld : NULL, x.ld};
        const int64_t n16 = tb * iters * KC * 4 * NT * 32;
        qreg_x_kernel<WT, NT, KC><<<(unsigned)((n16 + 255) / 256), 256, 0, s>>>(xf, xc, Tc, n_in, iters, n16, tickets,
                                                                              parts > 1 ? (int)tiles : 0);
        LAUNCH_CHECK("qreg_x", s);
        const dim3 grid((unsigned)((n_out + rows - 1) / rows), (unsigned)tb, (unsigned)parts);
        qreg_kernel<WT, NT, MT, KC, WARPS><<<grid, WARPS * 32, 0, s>>>(y + t0 * n_out, xf, (const uint8_t *)w, Tc,
                                                                      n_out, groups, rb, (int)iters, split);
        LAUNCH_CHECK("qreg", s);
    }
    return 0;
}

extern "C" int gpu_qgemm_ok(uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out) {
    return dj_is_quant(wtype) && T >= 1 && n_in >= 1 && n_out >= 1 && (uintptr_t)w % 16 == 0 &&
           (n_out + 63) / 64 <= 65535 && (T + 15) / 16 <= INT32_MAX;
}

// The tile shape for T tokens, n_in inputs and n_out rows (bench/qgemm_bench.cu, bench/results/qgemm: qgemm.txt for
// T = 8..2048, qgemm_small.txt for 2..64, H100). Up to 32 tokens, where 128 rows a CTA give fewer CTAs than 0.9 of
// the SMs: the mma.sync kernel split over the inputs, 16 tokens a tile up to 16, 32 up to 32 (bench/results/
// qgemm_split, H200). Else up to 64 tokens: one 16-row mma tile of tokens up to 16, 32 up to
// 64; on Hopper, where 128 rows a CTA give fewer CTAs than 0.9 of the SMs, the wgmma kernel with 128 tokens a CTA
// and the inputs split instead (2..64 tokens: 8B's q|k|v, wo and down 0.47-0.70x the mma tile's time, 13B's wo and
// down 0.45-0.66x, 70B's 0.44-0.97x), and for larger matrices from 17 tokens the wgmma kernel whole (32 tokens:
// 0.80-0.94x, 64 tokens: 0.46-0.59x; at 16 and fewer the mma tile stays, 0.86-1.02x the wgmma kernel's time). Beyond
// 64 tokens on Hopper the wgmma shape of least estimated time: waves of CTAs (as many as multiprocessors; a started
// wave costs 0.6 of a full one plus 0.4 times its fill, a single wave a whole one) times the stages a CTA runs times
// a stage's cost: 1.4 for 256 tokens (twice the tokens of 128 for each widened weight), 1.7 split (a pass half as
// long pays its start, the zeroing of y, and x without the bulk copy), 1.1 and 1 for 128 split and whole (two CTAs a
// multiprocessor, which this estimate leaves out: counting them as half a wave fitted worse). Fitted to the H100 run
// of every shape at T = 128..2048: the chosen shapes take 1.002x the time of the best of the four, at worst 1.06x.
// At 512 tokens the 4096-row matrices get 256 split (64 CTAs of 256 whole left half the SMs idle: 1.6x the time).
static int qgemm_pick_cost(const dj_gpu *g, int64_t T, int64_t n_in, int64_t n_out, double *cost) {
    const int64_t rows = (n_out + 127) / 128, stages = ((n_in + DJ_QGROUP - 1) / DJ_QGROUP + 1) / 2;
    *cost = 0;
    if (T <= 32 && 10 * rows < 9 * (int64_t)g->n_sm) return T <= 16 ? 12 : 13;  // the mma.sync kernel split
    if (T <= 64) {
        if (g->wgmma && 10 * rows < 9 * (int64_t)g->n_sm) return 10;  // split inputs fill the SMs the rows leave idle
        return T <= 16 ? 6 : g->wgmma ? 11 : 5;
    }
    if (!g->wgmma) return 0;
    static const struct {
        int variant, bn, ks;
        double stage_cost;
    } shapes[] = {{8, 256, 1, 1.4}, {9, 256, 2, 1.7}, {10, 128, 2, 1.1}, {11, 128, 1, 1.0}};
    int best = 11;
    double best_t = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const double ctas = (double)((T + shapes[i].bn - 1) / shapes[i].bn * rows * shapes[i].ks);
        const double w = ctas / (double)g->n_sm, full = ceil(w);
        const double waves = fmax(1.0, full - 0.4 * (full - w));
        const double t = waves * (double)((stages + shapes[i].ks - 1) / shapes[i].ks) * shapes[i].stage_cost;
        if (i == 0 || t < best_t) best = shapes[i].variant, best_t = t;
    }
    *cost = best_t;
    return best;
}
static int qgemm_pick(const dj_gpu *g, int64_t T, int64_t n_in, int64_t n_out) {
    double cost;
    return qgemm_pick_cost(g, T, n_in, n_out, &cost);
}

// Tokens at the end of a pass of T that cost the Hopper kernel a block of their own: T % 128 when they are at most
// `most` and the estimate above charges T more than T without them (at 513 tokens, 256 more padded; at 641 none,
// as 640 already runs three blocks of 256). 0 elsewhere.
int qgemm_tail(const dj_gpu *g, int64_t T, int64_t n_in, int64_t n_out, int64_t most) {
    const int64_t r = T % 128;
    if (!g->wgmma || T <= 128 || r == 0 || r > most) return 0;
    double with, without;
    qgemm_pick_cost(g, T, n_in, n_out, &with);
    qgemm_pick_cost(g, T - r, n_in, n_out, &without);
    return with > without ? (int)r : 0;
}

// Where gpu_matmul takes this kernel rather than dequantizing rows to f16 for cuBLAS. On Hopper from 2 tokens up to
// 1024 (q8) or 2048 (q4): bench/results/qgemm (H100), the Llama-3-8B layer's four matrices, x's conversion included:
// at 512 tokens q8 532 us against 659 dequantizing (q4 485 against 756), at 1024 q8 926 against 965 (q4 834 against
// 1069), at 2048 q8 lost (1773 against 1635) while q4 still won (1598 against 1742); with more tokens cuBLAS's f16
// kernels, ~1.4x the wgmma kernel's rate, win once the dequantization is paid for enough of them. Elsewhere
// (mma.sync only) a few tokens and at least 45 rows a multiprocessor: at T = 8..128 it took 0.3-0.5x the time on
// matrices of 6144 rows or more and lost on 4096 and 5120 rows.
extern "C" int gpu_qgemm_wins(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in,
                              int64_t n_out) {
    if (!gpu_qgemm_ok(wtype, w, T, n_in, n_out) || T < 2) return 0;
    return g->wgmma ? T <= (wtype == DJ_Q8 ? 1024 : 2048) : T <= 128 && n_out >= 45 * (int64_t)g->n_sm;
}

extern "C" int gpu_qgemm_has(const dj_gpu *g, int variant) {
#define QGEMM_COUNT(...) +1
    static_assert(0 QGEMM_VARIANTS(QGEMM_COUNT) QGEMM_WG_VARIANTS(QGEMM_COUNT) QGEMM_SPLIT_VARIANTS(QGEMM_COUNT)
                          QREG_VARIANTS(QGEMM_COUNT) == GPU_QGEMM_VARIANTS,
                  "kernels.h's GPU_QGEMM_VARIANTS counts the tile shapes");
    const int n_mma = 0 QGEMM_VARIANTS(QGEMM_COUNT), n_wg = 0 QGEMM_WG_VARIANTS(QGEMM_COUNT);
#undef QGEMM_COUNT
    return variant >= 0 && variant < GPU_QGEMM_VARIANTS && (variant < n_mma || variant >= n_mma + n_wg || g->wgmma);
}

static int qgemm_run(dj_gpu *g, int variant, float *y, const qgemm_src &x, const void *w, uint32_t wtype, int64_t T,
                     int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (!gpu_qgemm_ok(wtype, w, T, n_in, n_out))
        return dj_fail(e, "gpu_qgemm: unsupported: weights of dtype %u at %p, T=%lld n_in=%lld n_out=%lld", wtype, w,
                       (long long)T, (long long)n_in, (long long)n_out);
    if (variant < 0) variant = qgemm_pick(g, T, n_in, n_out);
    if (scratch_need(g, gpu_qgemm_scratch(T, n_in), s, e)) return -1;
    __half *xp = (__half *)g->scratch;
#define QGEMM_CASE(id, BM, BN, WM, WN, ST)                                                                       \
    case id:                                                                                                    \
        return wtype == DJ_Q8 ? qgemm_launch<DJ_Q8, BM, BN, WM, WN, ST>(y, x, xp, w, T, n_in, n_out, 1, s, e)       \
                              : qgemm_launch<DJ_Q4, BM, BN, WM, WN, ST>(y, x, xp, w, T, n_in, n_out, 1, s, e);
#define QGEMM_SPLIT_CASE(id, BM, BN, WM, ST, PER_SM)                                                               \
    case id: {                                                                                                    \
        const int k = qgemm_parts(g, PER_SM, T, (T + BN - 1) / BN * ((n_out + BM - 1) / BM), n_in, n_out);          \
        return wtype == DJ_Q8 ? qgemm_launch<DJ_Q8, BM, BN, WM, 1, ST>(y, x, xp, w, T, n_in, n_out, k, s, e)        \
                              : qgemm_launch<DJ_Q4, BM, BN, WM, 1, ST>(y, x, xp, w, T, n_in, n_out, k, s, e);       \
    }
#define QGEMM_WG_CASE(id, BN, ST, KS, XB, MINB)                                                               \
    case id:                                                                                                    \
        if (!g->wgmma) return dj_fail(e, "gpu_qgemm: tile shape %d needs an sm_90 device", variant);            \
        return wtype == DJ_Q8 ? qgemm_wg_launch<DJ_Q8, BN, ST, KS, XB, MINB>(y, x, xp, w, T, n_in, n_out, s, e)  \
                              : qgemm_wg_launch<DJ_Q4, BN, ST, KS, XB, MINB>(y, x, xp, w, T, n_in, n_out, s, e);
#define QREG_CASE(id, NT, MT, KC, WARPS, PER_SM)                                                                  \
    case id:                                                                                                      \
        return wtype == DJ_Q8                                                                                     \
                   ? qreg_launch<DJ_Q8, NT, MT, KC, WARPS>(g, PER_SM, y, x, g->scratch, w, T, n_in, n_out, s, e)   \
                   : qreg_launch<DJ_Q4, NT, MT, KC, WARPS>(g, PER_SM, y, x, g->scratch, w, T, n_in, n_out, s, e);
    switch (variant) {
        QGEMM_VARIANTS(QGEMM_CASE)
        QGEMM_WG_VARIANTS(QGEMM_WG_CASE)
        QGEMM_SPLIT_VARIANTS(QGEMM_SPLIT_CASE)
        QREG_VARIANTS(QREG_CASE)
    default:
        return dj_fail(e, "gpu_qgemm: no tile shape %d", variant);
    }
#undef QGEMM_CASE
#undef QGEMM_WG_CASE
#undef QGEMM_SPLIT_CASE
#undef QREG_CASE
}

extern "C" int gpu_qgemm_variant(dj_gpu *g, int variant, float *y, const float *x, const void *w, uint32_t wtype,
                                 int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    return qgemm_run(g, variant, y, qgemm_src{x, NULL, n_in}, w, wtype, T, n_in, n_out, s, e);
}

extern "C" int gpu_swiglu_qgemm(dj_gpu *g, float *y, const float *gate, const float *up, int64_t ld, const void *w,
                                uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (ld < n_in) return dj_fail(e, "gpu_swiglu_qgemm: rows %lld floats apart, fewer than n_in = %lld", (long long)ld,
                                  (long long)n_in);
    return qgemm_run(g, -1, y, qgemm_src{gate, up, ld}, w, wtype, T, n_in, n_out, s, e);
}

// Whether this device runs the Hopper kernel: compute capability 9.0 exactly (sm_90a code runs nowhere else).
int qgemm_setup(dj_gpu *g, dj_err *e) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, g->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, g->device));
    g->wgmma = major == 9 && minor == 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&g->n_sm, cudaDevAttrMultiProcessorCount, g->device));
    return load_module_of(g, (const void *)qgemm_x_kernel, e);
}
