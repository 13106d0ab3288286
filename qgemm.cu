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

#include <atomic>

// A kernel's shared-memory opt-in, once per device (a function's attributes belong to a device's context: the
// engine on several GPUs launches every kernel on each); done: the devices that have it, one bit each.
static int smem_optin(const void *kernel, int bytes, std::atomic<unsigned> &done, dj_err *e) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned bit = 1u << (dev & 31);
    if (done.load() & bit) return 0;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    done.fetch_or(bit);
    return 0;
}

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

// v = inputs a0 .. a0 + N - 1 of a row (zeros past n_in); N a multiple of 4
template <int N> static __device__ __forceinline__ void load_run(float *v, const float *row, int64_t a0, int64_t n_in) {
    if (a0 + N <= n_in && (((uintptr_t)(row + a0)) & 15) == 0) {
#pragma unroll
        for (int j = 0; j < N / 4; j++) {
            const float4 f = ((const float4 *)(row + a0))[j];
            v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) v[j] = a0 + j < n_in ? row[a0 + j] : 0.0f;
    }
}

// v = what the kernels multiply W with, inputs a0 .. a0 + N - 1 of token tok (qgemm_src: x, or silu(x) * up)
template <int N>
static __device__ __forceinline__ void load_src(float *v, const qgemm_src &src, int64_t tok, int64_t a0, int64_t n_in) {
    load_run<N>(v, src.x + tok * src.ld, a0, n_in);
    if (src.up) {
        float u[N];
        load_run<N>(u, src.up + tok * src.ld, a0, n_in);
#pragma unroll
        for (int j = 0; j < N; j++) v[j] = silu_mul(v[j], u[j]);
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
        load_src<16>(v, src, tok, a0, n_in);
    }
    *even = make_uint4(f16x2(v[0], v[2]), f16x2(v[4], v[6]), f16x2(v[8], v[10]), f16x2(v[12], v[14]));
    *odd = make_uint4(f16x2(v[1], v[3]), f16x2(v[5], v[7]), f16x2(v[9], v[11]), f16x2(v[13], v[15]));
}

// Where run r (inputs 16 r .. 16 r + 15) of token tok goes, its even inputs' 16 bytes and its odd inputs': XT
// qgemm_xt_kernel's layout (below: blocks of 1 << lbn tokens, KT stages of four runs, chunks swizzled by the token),
// else qgemm_x_kernel's (xp (T, kp)).
struct x_run_dst {
    uint4 *even, *odd;
};
template <bool XT>
static __device__ __forceinline__ x_run_dst x_run_at(__half *xp, int64_t tok, int64_t r, int64_t kp, int64_t KT,
                                                     int lbn) {
    if (!XT) {
        uint4 *dst = (uint4 *)(xp + tok * kp + 16 * r);
        return {dst, dst + 1};
    }
    const int t = (int)(tok & ((1 << lbn) - 1)), h = (int)(r & 3);
    uint4 *stage = (uint4 *)(xp + (((tok >> lbn) * KT + (r >> 2)) << lbn) * 64 + (int64_t)t * 64);
    return {stage + ((2 * h) ^ (t & 7)), stage + ((2 * h + 1) ^ (t & 7))};
}

// xp (T, kp) f16. Threads: x over the kp / 16 runs of 16 inputs, y (strided) over the tokens.
__global__ void qgemm_x_kernel(__half *xp, qgemm_src src, int64_t T, int64_t n_in, int64_t kp) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= kp / 16) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const x_run_dst d = x_run_at<false>(xp, t, r, kp, 0, 0);
        x16_halves(d.even, d.odd, src, t, 16 * r, n_in);
    }
}

// ---- the same values in the Hopper kernel's stage layout: for each block of BN tokens and each stage of 64 inputs,
// BN 128-byte rows (a token's 64 permuted inputs), 16-byte chunk c of token t at c ^ (t % 8), contiguous, so one
// bulk copy moves a stage's x. xt (ceil(T / BN) BN, KT 64) f16 in that order (KT = ceil(kp / 64)); tokens past T
// and inputs past n_in are zeros. bn = 1 << lbn; rows: T rounded up to whole blocks. Threads: x over the KT 4 runs of
// 16, y (strided) over the rows. The first n_tickets tickets (the stream-K kernel's, which runs next) are zeroed on
// the way.
__global__ void qgemm_xt_kernel(__half *xt, qgemm_src src, int64_t T, int64_t rows, int64_t n_in, int64_t KT,
                                int lbn, unsigned *tickets, int n_tickets) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.y == 0)
        for (int64_t i = r; i < n_tickets; i += (int64_t)gridDim.x * blockDim.x) tickets[i] = 0;
    if (r >= KT * 4) return;
    for (int64_t tok = blockIdx.y; tok < rows; tok += gridDim.y) {
        const x_run_dst d = x_run_at<true>(xt, tok, r, 0, KT, lbn);
        x16_halves(d.even, d.odd, src, tok < T ? tok : -1, 16 * r, n_in);
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
// Copies `bytes` (0..8) of src and zero-fills the rest of the 8.
static __device__ __forceinline__ void cp_async8(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes));
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

// q8_pair without PRMT: (a & m) ^ f with m = 0x00FF00FF, f = 0x64806480 (bytes 0 and 2 of a, their sign bits
// flipped, under 0x64), a = u for pair A and u >> 8 for pair C. ptxas kept PRMT's constant word as an immediate and
// copied the selector into a register before every one (4 copies a q8 mma; without them the q8 layer at 4-64 tokens
// 1-2% faster, both rounds: bench/results/qgemm_reg/session60).
static __device__ __forceinline__ uint32_t and_xor(uint32_t a, uint32_t m, uint32_t f) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "r"(m), "r"(f));  // (a & m) ^ f
    return d;
}

// The rows rmsnorm(x + delta) * nw in qgemm_x_kernel's layout (lbn 0: xp (T, kp)) or qgemm_xt_kernel's (blocks of
// 1 << lbn tokens, KT stages), for the Hopper kernel past QGEMM_FEW_T tokens (gpu_norm_qgemm), a block a row of the
// layout: the row's add and RMS as rmsnorm_kernel takes them (row_norm at its block size: the same floats), x + delta
// (x where delta is NULL) stored to xo, the normed row rounded to f16 in shared memory (each value alone, as f16x2
// rounds it; zeros past n_in), then its runs of 16 inputs where the layout puts them. Rows past T (a block's padding)
// are zeros. The first n_tickets tickets are zeroed on the way. PRECOND: blockDim.x = norm_threads(n_in); gridDim.x
// the layout's rows (T, or T rounded up to whole blocks); dynamic shared memory: 16 runs halves (runs = 4 KT with lbn,
// kp / 16 without); xo not x.
__global__ void qgemm_norm_x_kernel(__half *xp, const float *x, const float *delta, float *xo, const float *nw,
                                    float eps, int64_t T, int64_t n_in, int64_t kp, int64_t KT, int lbn,
                                    unsigned *tickets, int n_tickets) {
    extern __shared__ __align__(16) __half xn[];  // (16 runs) the row's normed inputs
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_tickets; i += (int64_t)gridDim.x * blockDim.x)
        tickets[i] = 0;
    const int64_t tok = blockIdx.x, runs = lbn ? 4 * KT : kp / 16;
    if (tok < T) {  // the whole block alike, through row_norm's barriers
        const int64_t off = tok * n_in;
        row_norm(xo + off, x + off, delta ? delta + off : NULL, nw, n_in, eps,
                 [&](int64_t i, float y) { xn[i] = __float2half_rn(y); });
        for (int64_t i = n_in + threadIdx.x; i < 16 * runs; i += blockDim.x) xn[i] = __float2half_rn(0.0f);
        __syncthreads();
    }
    for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
        uint4 even = make_uint4(0, 0, 0, 0), odd = even;  // x16_halves' two runs of 8: the even inputs, the odd
        if (tok < T) {
            const uint4 a = *(const uint4 *)(xn + 16 * r), b = *(const uint4 *)(xn + 16 * r + 8);
            even = make_uint4(__byte_perm(a.x, a.y, 0x5410), __byte_perm(a.z, a.w, 0x5410), __byte_perm(b.x, b.y, 0x5410),
                              __byte_perm(b.z, b.w, 0x5410));
            odd = make_uint4(__byte_perm(a.x, a.y, 0x7632), __byte_perm(a.z, a.w, 0x7632), __byte_perm(b.x, b.y, 0x7632),
                             __byte_perm(b.z, b.w, 0x7632));
        }
        const x_run_dst d = lbn ? x_run_at<true>(xp, tok, r, kp, KT, lbn) : x_run_at<false>(xp, tok, r, kp, KT, lbn);
        *d.even = even, *d.odd = odd;
    }
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

// PRECOND: w and every row (row_bytes apart) 16-byte aligned; xp from qgemm_x_kernel (kp = 32 * groups).
template <int WT, int BM, int BN, int WM, int WN, int ST>
__global__ void __launch_bounds__(WM *WN * 32)
    qgemm_kernel(float *__restrict__ y, const __half *__restrict__ xp, const uint8_t *__restrict__ w, int64_t T,
                 int64_t n_out, int64_t groups, int64_t row_bytes) {
    using C = qgemm_cfg<WT, BM, BN, WM, WN, ST>;
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;
    const int64_t kp = groups * DJ_QGROUP, so = groups * C::QB;  // x's row length; where a row's scales start
    const int KT = (int)((groups + 1) / 2);  // stages of 64 inputs

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
        if (st < KT) load(st, st);
        cp_async_commit();
    }

    const int g = lane >> 2;  // the fragment row (A) or column (B) this thread holds
    for (int kt = 0; kt < KT; kt++) {
        cp_async_wait<ST - 2>();
        __syncthreads();  // stage kt landed for everyone; stage kt - 1 is free
        if (kt + ST - 1 < KT) load((kt + ST - 1) % ST, kt + ST - 1);
        cp_async_commit();

        const uint8_t *q = sm + (kt % ST) * C::STAGE, *sc = q + C::Q_BYTES, *xs = sc + C::S_BYTES;
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

    const int c2 = 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
        for (int nt = 0; nt < C::NT; nt++)
            store_frag(y, T, n_out, m0 + wm * (BM / WM) + mt * 16 + g, n0 + wn * (BN / WN) + nt * 8 + c2, acc[mt][nt]);
}

// ---- the register kernel: passes of a few tokens at the weights' bytes
// The kernels above share each stage's weights between warps through shared memory (a copy, a barrier and an
// ldmatrix a stage), which holds them at 4-5x the time a read of their bytes takes up to 32 tokens
// (bench/results/qgemm_split). Here each warp widens the weights it copied itself, so no barrier orders the warps:
// a warp's rows' chunks go by cp.async into a ring of ST stages of its own in shared memory (deep in flight without
// the registers), and from there into the mma's A fragments. Lane (g, c) of a warp takes, for each of the warp's MT
// tiles of 16 rows, rows g and g + 8's chunks 4 NQ i + 4 k + c (k < NQ) of unit i. A chunk is 16 bytes of values: a
// q4 group (8 k16 steps) or half a q8 group (4 steps), 4 weights a step in the lane's slots 2c, 2c + 1, 2c + 8,
// 2c + 9, so a step mixes the quad's chunks, each weight widened with its own group's parameters before the product.
// x is laid out to match (qreg_x_kernel): lane (g, c)'s B fragment is token g's inputs in the same slots of the same
// chunk, two steps' in one 16-byte load, a warp's 512 bytes contiguous. Which weight of its chunk a step's slot e
// takes (the order q4_pair and q8_pair hand a word's weights out): q4, step 2w + h: 16h + 4w + {0, 2, 1, 3}[e]; q8,
// step s: 4s + {0, 2, 1, 3}[e].
// Work is split stream-K: a row block (the CTA's WARPS x MT x 16 rows) times its units of 4 NQ chunks a row make a
// line of units, cut into gridDim.x equal runs, one a CTA (as many CTAs as fit the device at once, so none waits for
// a second wave). A run that covers a block whole writes y; the runs sharing a block write their sums to scratch, and
// the last to finish (a ticket per warp's rows) adds them in run order, so y does not depend on which finished first.
// The warps of a CTA read the same inputs, so x stays in L1 for all of them.
// The chunk's weight in step s's first slot (e = 0): its four are that one + {0, 2, 1, 3}.
template <int WT> static __device__ __forceinline__ int qreg_step_first(int s) {
    return WT == DJ_Q4 ? 16 * (s & 1) + 4 * (s >> 1) : 4 * s;
}

template <int WT> struct qreg_shape {
    static constexpr int STEPS = WT == DJ_Q4 ? 8 : 4;  // k16 steps a chunk
    static constexpr int SP = STEPS / 2;               // 16-byte x loads a chunk a lane (two steps each)
    static constexpr int IN = WT == DJ_Q4 ? 32 : 16;   // inputs a chunk
};

// xf (uint4: a lane's two steps): for each block tb of 8 NT tokens, unit i, chunk k of a lane's NQ, step pair w, n8
// tile nt and lane (g, c), token 8 NT tb + 8 nt + g's inputs of chunk 4 NQ i + 4 k + c in the slots of steps 2w and
// 2w + 1, in f16 (zeros past T and n_in). n16: the uint4s, a thread each. The first n_tickets tickets are zeroed on
// the way (this kernel runs before the product, on the same stream).
template <int WT, int NT, int NQ>
__global__ void qreg_x_kernel(uint4 *xf, qgemm_src src, int64_t T, int64_t n_in, int64_t iters, int64_t n16,
                              unsigned *tickets, int64_t n_tickets) {
    using S = qreg_shape<WT>;
    pdl_trigger();  // qreg_kernel's CTAs start, and copy their first weights, while x is laid out
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_tickets; i += (int64_t)gridDim.x * blockDim.x)
        tickets[i] = 0;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n16) return;
    const int lane = (int)(idx & 31);
    int64_t r = idx >> 5;
    const int nt = (int)(r % NT);
    r /= NT;
    const int w = (int)(r % S::SP);
    r /= S::SP;
    const int k = (int)(r % NQ);
    r /= NQ;
    const int64_t tb = r / iters, i = r - tb * iters;
    const int64_t tok = tb * 8 * NT + 8 * nt + (lane >> 2), chunk = i * 4 * NQ + 4 * k + (lane & 3);
    float a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};  // steps 2w and 2w + 1's inputs, from their first slot's on
    if (tok < T) {
        load_src<4>(a, src, tok, S::IN * chunk + qreg_step_first<WT>(2 * w), n_in);
        load_src<4>(b, src, tok, S::IN * chunk + qreg_step_first<WT>(2 * w + 1), n_in);
    }
    xf[idx] = make_uint4(f16x2(a[0], a[2]), f16x2(a[1], a[3]), f16x2(b[0], b[2]), f16x2(b[1], b[3]));
}

// The same xf for the rows rmsnorm(x + delta) * nw (gpu_norm_qgemm: the norm before q|k|v or gate|up inside the x
// layout, so no normed row is written and read back), a block a token: the row's add and RMS as rmsnorm_kernel takes
// them (row_norm at its block size: the same floats), x + delta (x where delta is NULL) stored to xo, the normed row
// rounded to f16 in shared memory (zeros past n_in; each value rounded alone as f16x2 rounds it), then the token's
// uint4s where qreg_x_kernel puts them: token 8 NT tb + 8 nt + g takes lanes 4 g .. 4 g + 3 of n8 tile nt in every
// (unit, chunk, step pair) of token block tb. Blocks of tokens past T write zeros. The first n_tickets tickets are
// zeroed on the way. PRECOND: blockDim.x = norm_threads(n_in); gridDim.x: T rounded up to whole blocks of 8 NT tokens;
// dynamic shared memory: a token's iters 4 NQ IN inputs in f16; xo not x.
template <int WT, int NT, int NQ>
__global__ void qreg_norm_x_kernel(uint4 *xf, const float *x, const float *delta, float *xo, const float *nw,
                                   float eps, int64_t T, int64_t n_in, int64_t iters, unsigned *tickets,
                                   int64_t n_tickets) {
    using S = qreg_shape<WT>;
    extern __shared__ __align__(16) __half xn[];  // (iters 4 NQ IN) the token's normed inputs
    pdl_trigger();  // qreg_kernel's CTAs start, and copy their first weights, while x is laid out
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_tickets; i += (int64_t)gridDim.x * blockDim.x)
        tickets[i] = 0;
    const int64_t tok = blockIdx.x, padded = iters * 4 * NQ * S::IN;
    if (tok < T) {  // the whole block alike, through row_norm's barriers
        const int64_t off = tok * n_in;
        row_norm(xo + off, x + off, delta ? delta + off : NULL, nw, n_in, eps,
                 [&](int64_t i, float y) { xn[i] = __float2half_rn(y); });
        for (int64_t i = n_in + threadIdx.x; i < padded; i += blockDim.x) xn[i] = __float2half_rn(0.0f);
        __syncthreads();
    }
    // uint4 j of the token: m = j / 4 = (i NQ + k) SP + w (unit i, chunk k, step pair w), c = j % 4 (lane 4 g + c)
    const int64_t per_tok = iters * NQ * S::SP;
    const int nt = (int)(tok / 8 % NT), g = (int)(tok % 8);
    uint4 *dst = xf + (tok / (8 * NT) * per_tok * NT + nt) * 32 + 4 * g;
    for (int64_t j = threadIdx.x; j < 4 * per_tok; j += blockDim.x) {
        const int64_t m = j >> 2, ik = m / S::SP;
        const int c = (int)(j & 3), w = (int)(m - ik * S::SP);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (tok < T) {  // steps 2w and 2w + 1's four inputs each (a, b), from their first slot's on, as (a0, a2),
                        // (a1, a3), (b0, b2), (b1, b3)
            const __half *ch = xn + S::IN * (4 * ik + c);
            const uint2 a = *(const uint2 *)(ch + qreg_step_first<WT>(2 * w)),
                        b = *(const uint2 *)(ch + qreg_step_first<WT>(2 * w + 1));
            v = make_uint4(__byte_perm(a.x, a.y, 0x5410), __byte_perm(a.x, a.y, 0x7632), __byte_perm(b.x, b.y, 0x5410),
                           __byte_perm(b.x, b.y, 0x7632));
        }
        dst[m * NT * 32 + c] = v;
    }
}

static __device__ __forceinline__ uint32_t u4_at(const uint4 &v, int k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// A warp's copies are row copies: each copy instruction takes whole rows' contiguous bytes (4 lines of 128 bytes for
// 512), and each row's parameters for the unit come in one piece of 8 or 16 bytes. (A lane copying its own chunks
// touched 8 rows' 64 bytes, 8 lines, and a 4-byte parameter word a chunk: about twice the L1/TEX wavefronts a weight
// byte, 1.05-1.3x the time at 4-64 tokens: bench/results/qgemm_reg.) The warp's stage is shared by its lanes (a
// __syncwarp orders the copies and the reads), each lane reading its own chunks from it: a row's chunks are CPR
// 16-byte slots, slot ch ^ (4 (row & 1)) holding chunk ch, so the 8 lanes of a read phase (rows 2p and 2p + 1, 64
// bytes each) meet no bank twice. Needs CPR >= 8 (NQ >= 2).
// XS: x staged in shared memory, a unit's with its weights' stage, copied once a CTA (its warps read the same x) and
// read by LDS, where without it every warp reads it again through L1, which the rings leave at about 28 KB.
template <int WT, int NT, int MT, int NQ, int WARPS, int ST, int XS> struct qreg_cfg {
    static constexpr int THREADS = WARPS * 32;
    static constexpr int ROWS = WARPS * MT * 16;  // a row block
    static constexpr int CPR = 4 * NQ;                      // a row's chunks a unit
    static constexpr int PB = (WT == DJ_Q4 ? 2 : 1) * CPR;  // a row's parameter bytes a unit
    static constexpr int PS = PB < 16 ? PB : 16;            // bytes a parameter copy
    static constexpr int W_Q = 16 * MT * CPR * 16, W_P = 16 * MT * PB;  // a warp's stage: values, parameters
    static constexpr int Q_BYTES = WARPS * W_Q;
    static constexpr int XU = NQ * qreg_shape<WT>::SP * NT * 32;  // xf's uint4s a unit
    static constexpr int X_AT = WARPS * (W_Q + W_P);               // where a stage's x starts (XS)
    static constexpr int STAGE = X_AT + (XS ? XU * 16 : 0);
    static constexpr int SMEM = ST * STAGE;
    static_assert(CPR >= 8 && (16 * MT * CPR) % 32 == 0 && PB % 8 == 0, "row copies: whole rows a warp");
    static constexpr int ACC = MT * NT * 4;  // a lane's sums
};

struct qreg_args {
    float *y;                 // (T, n_out)
    const uint4 *xf;          // qreg_x_kernel's
    const uint8_t *w;         // (n_out, row_bytes), model.h's rows
    int64_t T, n_out, chunks, groups, row_bytes;
    int64_t iters, n_rb;      // units a row block; row blocks
    float *part;              // runs' sums: (token blocks, gridDim.x, 2, WARPS, ACC, 32)
    unsigned *tickets;        // (token blocks, n_rb, WARPS), zero
};

// PRECOND: w and every row 16-byte aligned; xf from qreg_x_kernel with the same NT and NQ; iters = ceil(chunks /
// (4 NQ)); gridDim.x <= n_rb * iters; gridDim.y blocks of 8 NT tokens.
template <int WT, int NT, int MT, int NQ, int WARPS, int ST, int XS>
__global__ void __launch_bounds__(WARPS * 32) qreg_kernel(qreg_args a) {
    using C = qreg_cfg<WT, NT, MT, NQ, WARPS, ST, XS>;
    constexpr int SP = qreg_shape<WT>::SP;
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int64_t G = gridDim.x, U = a.n_rb * a.iters;
    const int64_t u0 = (int64_t)blockIdx.x * U / G, u1 = ((int64_t)blockIdx.x + 1) * U / G;  // this CTA's run
    const int64_t so = a.groups * q_group_bytes(WT);                                            // parameters
    const uint4 *xb = a.xf + (int64_t)blockIdx.y * a.iters * C::XU + lane;

    // the rows of the lane's value copies (copy j: the warp's chunk lane + 32 j, row (lane + 32 j) / CPR) and of its
    // parameter copies (copy j: piece lane + 32 j, row (lane + 32 j) / (PB / PS)) in row block rb, clamped to the last
    // row (a row past n_out computes sums never stored)
    constexpr int NVC = 16 * MT * C::CPR / 32, NPC = (16 * MT * (C::PB / C::PS) + 31) / 32;
    const uint8_t *vrow[NVC], *prow[NPC];
    auto rows_of = [&](int64_t rb) {
        const int64_t r0 = rb * C::ROWS + warp * MT * 16;
#pragma unroll
        for (int j = 0; j < NVC; j++) {
            const int64_t row = r0 + (lane + 32 * j) / C::CPR;
            vrow[j] = a.w + (row < a.n_out ? row : a.n_out - 1) * a.row_bytes;
        }
#pragma unroll
        for (int j = 0; j < NPC; j++) {
            const int64_t row = r0 + (lane + 32 * j) / (C::PB / C::PS);
            prow[j] = a.w + (row < a.n_out ? row : a.n_out - 1) * a.row_bytes;
        }
    };
    auto load_x = [&](int64_t i, int st) {  // XS: unit i's x, contiguous in xf, by every thread of the CTA
        uint4 *xs = (uint4 *)(sm + st * C::STAGE + C::X_AT);
        const uint4 *src = xb - lane + i * C::XU;
        for (int n = tid; n < C::XU; n += C::THREADS) cp_async16(xs + n, src + n, 16);
    };
    // unit i into the warp's stage st: values (chunks past the row: zeros) and parameters (groups past the row: zeros),
    // and XS its x unless with_x is false
    auto load = [&](int64_t i, int st, bool with_x = true) {
        uint8_t *q = sm + st * C::STAGE + warp * C::W_Q, *p = sm + st * C::STAGE + C::Q_BYTES + warp * C::W_P;
#pragma unroll
        for (int j = 0; j < NVC; j++) {
            const int n = lane + 32 * j, r = n / C::CPR, ch = n % C::CPR;
            const int64_t cj = i * C::CPR + ch;  // the chunk in the row
            const bool ok = cj < a.chunks;
            cp_async16(q + (r * C::CPR + (ch ^ (4 * (r & 1)))) * 16, ok ? vrow[j] + cj * 16 : a.w, ok ? 16 : 0);
        }
        const int64_t g_unit = i * C::PB / 2;  // the unit's first group
#pragma unroll
        for (int j = 0; j < NPC; j++) {
            const int n = lane + 32 * j, r = n / (C::PB / C::PS), piece = n % (C::PB / C::PS);
            if (r >= 16 * MT) break;
            const int64_t g0 = g_unit + piece * (C::PS / 2), left = a.groups - g0;  // the piece's groups
            const int bytes = left <= 0 ? 0 : left >= C::PS / 2 ? C::PS : (int)(2 * left);
            uint8_t *dst = p + r * C::PB + piece * C::PS;
            const uint8_t *src = bytes ? prow[j] + so + 2 * g0 : a.w;
            if (C::PS == 16) cp_async16(dst, src, bytes);
            else cp_async8(dst, src, bytes);
        }
        if (XS && with_x) load_x(i, st);
    };

    float acc[MT][NT][4];
    auto zero = [&]() {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    };

    // x of chunk k of unit i (its B fragments, SP x NT 16-byte loads): up to 16 tokens loaded a chunk ahead of its
    // products, as the lane's weights are stages ahead (waiting on each load where it was used cost 44% of the cycles
    // between issues: bench/results/qgemm_reg); more tokens' would not fit the registers, and are loaded where used
    constexpr bool XPRE = NT <= 2;
    // the lane's uint4 n (k, wp, nt's: ((k SP + wp) NT + nt) 32) of unit i's x, in stage st where XS
    auto xat = [&](int64_t i, int st, int n) {
        return XS ? ((const uint4 *)(sm + st * C::STAGE + C::X_AT))[n + lane] : __ldg(xb + i * C::XU + n);
    };
    auto xload = [&](int64_t i, int st, int k, uint4 (*xv)[NT]) {
#pragma unroll
        for (int wp = 0; wp < SP; wp++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) xv[wp][nt] = xat(i, st, ((k * SP + wp) * NT + nt) * 32);
    };
    // the widening's constants in registers (and_or, and_xor)
    const uint32_t m_lo = reg_const<0x003C003Cu>(), m_hi = reg_const<0x03C003C0u>();
    const uint32_t e_lo = reg_const<0x5C005C00u>(), e_hi = reg_const<0x4C004C00u>();
    const uint32_t m8 = reg_const<0x00FF00FFu>(), f8 = reg_const<0x64806480u>();
    // chunk k of unit i in stage st, its x in xc (XPRE) or loaded here
    auto compute = [&](int64_t i, int st, int k, const uint4 (*xc)[NT]) {
        const uint8_t *wq = sm + st * C::STAGE + warp * C::W_Q, *wp_ = sm + st * C::STAGE + C::Q_BYTES + warp * C::W_P;
        uint4 q[MT][2];
        __half2 sc[MT][2], off[MT][2], off16[MT][2];  // off16: q4's other offset, 16 + z / 4 (0x4C00 | z << 4)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {  // row mt 16 + 8 h + g of the warp's stage, chunk 4 k + c, its parameter
                const int r = mt * 16 + 8 * h + g, ch = 4 * k + c;
                q[mt][h] = *(const uint4 *)(wq + (r * C::CPR + (ch ^ (4 * (r & 1)))) * 16);
                const uint32_t pm = *(const uint16_t *)(wp_ + r * C::PB + 2 * (WT == DJ_Q4 ? ch : ch >> 1));
                q_widen_params<WT>(pm, &sc[mt][h], &off[mt][h]);
                off16[mt][h] = __half2half2(__ushort_as_half((unsigned short)(0x4C00u | (pm >> 10) << 4)));
            }
#pragma unroll
        for (int wp = 0; wp < SP; wp++) {
            uint4 xv[NT];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                xv[nt] = XPRE ? xc[wp][nt] : xat(i, st, ((k * SP + wp) * NT + nt) * 32);
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    uint32_t af[4];
                    if (WT == DJ_Q4) {  // step 2 wp + hh: word wp's low (hh 0) or high nibbles
                        // u << 2 holds (B0, B2)'s low nibbles at bits 2-5 of each half (256 + k under exponent
                        // 0x5C00) and their high ones at bits 6-9 (16 + k under 0x4C00); u >> 6 (B1, B3)'s: two
                        // shifts for four pairs, and the same halves as q4_pair's, less the same exact offsets
                        const uint32_t u = u4_at(q[mt][0], wp), u8 = u4_at(q[mt][1], wp);
                        const uint32_t m = hh ? m_hi : m_lo, e = hh ? e_hi : e_lo;
                        const __half2 o0 = hh ? off16[mt][0] : off[mt][0], o1 = hh ? off16[mt][1] : off[mt][1];
                        af[0] = q_widen2(and_or(u << 2, m, e), sc[mt][0], o0);
                        af[1] = q_widen2(and_or(u8 << 2, m, e), sc[mt][1], o1);
                        af[2] = q_widen2(and_or(u >> 6, m, e), sc[mt][0], o0);
                        af[3] = q_widen2(and_or(u8 >> 6, m, e), sc[mt][1], o1);
                    } else {  // step 2 wp + hh: word 2 wp + hh
                        const uint32_t ug = u4_at(q[mt][0], 2 * wp + hh), ug8 = u4_at(q[mt][1], 2 * wp + hh);
                        af[0] = q_widen2(and_xor(ug, m8, f8), sc[mt][0], off[mt][0]);
                        af[1] = q_widen2(and_xor(ug8, m8, f8), sc[mt][1], off[mt][1]);
                        af[2] = q_widen2(and_xor(ug >> 8, m8, f8), sc[mt][0], off[mt][0]);
                        af[3] = q_widen2(and_xor(ug8 >> 8, m8, f8), sc[mt][1], off[mt][1]);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const uint32_t bf[2] = {hh ? xv[nt].z : xv[nt].x, hh ? xv[nt].w : xv[nt].y};
                        mma16816(acc[mt][nt], af, bf);
                    }
                }
            }
        }
    };

    // the lane's sums of row block rb into y, or into this run's slot and, for the last run of the block, the runs'
    // sums in order into y. (row g, tokens 2c, 2c + 1) in acc[.][.][0..1], row g + 8 in [2..3].
    const int64_t n0 = (int64_t)blockIdx.y * 8 * NT;
    auto store = [&](int64_t rb, const float *v) {  // v: the lane's ACC values, acc's order
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                store_frag(a.y, a.T, a.n_out, rb * C::ROWS + (warp * MT + mt) * 16 + g, n0 + 8 * nt + 2 * c,
                           v + (mt * NT + nt) * 4);
    };
    auto slot_of = [&](int64_t run, int64_t rb) {  // runs[run]'s slot for block rb: 0 where the run starts in it
        return (run * U / G) / a.iters == rb ? 0 : 1;
    };
    auto flush = [&](int64_t rb) {
        const int64_t first = rb * a.iters, last = first + a.iters;
        if (u0 <= first && last <= u1) {
            store(rb, &acc[0][0][0]);
            return;
        }
        const size_t runs = (size_t)blockIdx.y * (size_t)G;
        float *mine = a.part + (((runs + blockIdx.x) * 2 + slot_of(blockIdx.x, rb)) * WARPS + warp) * (C::ACC * 32);
#pragma unroll
        for (int e = 0; e < C::ACC; e++) mine[e * 32 + lane] = (&acc[0][0][0])[e];
        // the ticket releases the warp's sums and, for the last run, acquires every other run's
        const unsigned t = warp_ticket(a.tickets + ((int64_t)blockIdx.y * a.n_rb + rb) * WARPS + warp);
        const int64_t lo = ((first + 1) * G - 1) / U, hi = (last * G - 1) / U;  // the runs holding the block's ends
        if ((int64_t)t != hi - lo) return;
        float sum[C::ACC];
#pragma unroll
        for (int e = 0; e < C::ACC; e++) sum[e] = 0.0f;
        for (int64_t r = lo; r <= hi; r++) {
            const float *src = a.part + (((runs + r) * 2 + slot_of(r, rb)) * WARPS + warp) * (C::ACC * 32);
#pragma unroll
            for (int e = 0; e < C::ACC; e++) sum[e] += __ldcg(src + e * 32 + lane);
        }
        store(rb, sum);
    };

    // ST - 1 units in flight ahead of the one multiplied. Their weights are copied before pdl_wait, while the kernel
    // before (qreg_x_kernel, launched ahead of this one: programmatic dependent launch) lays x out; their x after it.
    // The first commit group holds every one's weights, so a stage's weights are in a group no later than its x.
    // (The layer of 8B q4 at 8 / 16 / 64 tokens 83.4 / 87.0 / 150.3 us against 90.9 / 95.6 / 155.1 without:
    // bench/results/qgemm_reg/session59.)
    int64_t lrb = u0 / a.iters, li = u0 - lrb * a.iters;  // the next unit to load
    const int64_t i0 = li;
    rows_of(lrb);
#pragma unroll
    for (int st = 0; st < ST - 1; st++)
        if (u0 + st < u1) {
            load(li, st, false);
            if (++li == a.iters) li = 0, rows_of(++lrb);
        }
    pdl_wait();
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (XS && u0 + st < u1) load_x((i0 + st) % a.iters, st);
        cp_async_commit();
    }
    zero();
    int64_t rb = u0 / a.iters, i = u0 - rb * a.iters;
    uint4 xa[XPRE ? SP : 1][NT], xn[XPRE ? SP : 1][NT];  // x of the chunk multiplied, and of the next (XPRE)
    if (XPRE && !XS && u0 < u1) xload(i, 0, 0, xa);
    for (int64_t u = u0; u < u1; u++) {
        cp_async_wait<ST - 2>();
        // the warp's copies of this unit seen by all its lanes, its reads of the last one done; XS: every warp's
        // copies of the unit's x, and every warp's reads of the stage refilled below
        if (XS) __syncthreads();
        else __syncwarp();
        const int st = (int)((u - u0) % ST);
        if (u + ST - 1 < u1) {
            load(li, (st + ST - 1) % ST);  // the stage the warp read last iteration
            if (++li == a.iters) li = 0, rows_of(++lrb);
        }
        cp_async_commit();
        if (XPRE && XS) xload(i, st, 0, xa);  // XS: the unit's first chunk of x, landed by the barrier above
#pragma unroll
        for (int k = 0; k < NQ; k++) {  // chunk k multiplied from xa (k even) or xn, the next one's x loaded into the other
            uint4(*cur)[NT] = k % 2 ? xn : xa, (*nxt)[NT] = k % 2 ? xa : xn;
            if (XPRE && k + 1 < NQ) xload(i, st, k + 1, nxt);
            else if (XPRE && !XS && u + 1 < u1) xload(i + 1 == a.iters ? 0 : i + 1, 0, 0, nxt);
            compute(i, st, k, cur);
        }
        if (XPRE && !XS && NQ % 2)  // the next unit's first chunk is in xn
#pragma unroll
            for (int wp = 0; wp < SP; wp++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) xa[wp][nt] = xn[wp][nt];
        if (++i == a.iters || u + 1 == u1) {
            flush(rb);
            zero();
            i = 0, rb++;
        }
    }
    cp_async_wait<0>();
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

// ST_MAX stages, or as many as fit a multiprocessor's 227 KB (q4's six at 256 tokens are five in q8).
template <int WT, int BN, int ST_MAX> struct qgemm_wg_cfg {
    static constexpr int THREADS = 256, BM = 128;
    static constexpr int QB = q_group_bytes(WT), CH = 2 * QB / 16;
    static constexpr int X_BYTES = BN * 128, Q_BYTES = CH * BM * 16, S_BYTES = BM * 4;
    static constexpr int STAGE = (X_BYTES + Q_BYTES + S_BYTES + 1023) / 1024 * 1024;
    static constexpr int ST = (227 * 1024 - 1024) / STAGE < ST_MAX ? (227 * 1024 - 1024) / STAGE : ST_MAX;
    static constexpr int SMEM = STAGE * ST + 1024;
    static_assert((BN == 128 || BN == 256) && ST >= 3 && SMEM <= 227 * 1024,
                  "m64n128 or m64n256 products, loads two stages behind");
};

#define QGEMM_SK_CTAS 264  // stream-K CTAs at most (two a multiprocessor on 132): their sums' slots in scratch

#if defined(QGEMM_WGMMA)
// A stream-K run's share of a tile cut between runs (qgemm_wg_kernel, qgemm_ws_kernel): the 256 threads that hold
// the tile's sums (ACC a thread; th 0..255) store them to one of the CTA's two slots in part (slot 0: the tile its
// run starts in, else 1; thread-minor), and the run that finishes the tile last, by the tile's ticket
// (tickets[its first run's CTA]), sums the runs' slots in run order into y: the same bits whichever finishes first.
// sync: the 256 threads' barrier; last_run, run_slot (QGEMM_SK_CTAS): shared memory; row: this thread's row g of its
// warp's 16 in the tile, n0 the tile's first token, c2 = 2 (lane % 4).
template <int ACC, class SYNC>
static __device__ __forceinline__ void sk_tile_sums(float *__restrict__ y, const float *acc, float *part,
                                                    unsigned *tickets, unsigned *last_run, int *run_slot, int th,
                                                    unsigned tile, unsigned KT_ALL, unsigned U, unsigned G, bool first,
                                                    int64_t row, int64_t n0, int c2, int64_t T, int64_t n_out,
                                                    SYNC sync) {
    // the runs holding the tile's first and last units, and the slot each keeps this tile's sums in
    const unsigned t0 = tile * KT_ALL, lo = ((t0 + 1) * G - 1) / U, hi = ((t0 + KT_ALL) * G - 1) / U;
    auto slot = [&](unsigned r) { return r * U / G >= t0 ? 0 : 1; };  // the run's first tile, or its last
    float *mine = part + ((int64_t)blockIdx.x * 2 + (first ? 0 : 1)) * (int64_t)(256 * ACC);
#pragma unroll
    for (int k = 0; k < ACC; k++) __stcg(mine + k * 256 + th, acc[k]);
    sync();  // every thread's sums before thread 0's release
    if (th == 0) {
        *last_run = ticket_add(tickets + lo) == hi - lo;
    }
    sync();  // thread 0's acquire before every thread's reads
    if (!*last_run) return;
    for (unsigned r = lo + th; r <= hi; r += 256) run_slot[r - lo] = (int)(r * 2 + slot(r));
    sync();
    const int n_runs = (int)(hi - lo + 1);
#pragma unroll 1
    for (int k0 = 0; k0 < ACC; k0 += 16) {  // 16 sums at a time (acc is dead here)
        float v[16];
#pragma unroll 1
        for (int q = 0; q < n_runs; q++) {
            const float *src = part + (int64_t)run_slot[q] * (256 * ACC) + k0 * 256 + th;
#pragma unroll
            for (int kk = 0; kk < 16; kk++) {
                const float p = __ldcg(src + kk * 256);
                v[kk] = q == 0 ? p : v[kk] + p;
            }
        }
        // accumulator k: n8 block k / 4's (row g, tokens 8 (k / 4) + 2c, + 1) for k % 4 < 2, row g + 8 for the others
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            const int k = k0 + kk, d = k % 4;
            const int64_t tok = n0 + (k / 4) * 8 + c2 + (d & 1), r = row + (d >> 1) * 8;
            if (r < n_out && tok < T) y[tok * n_out + r] = v[kk];
        }
    }
}
#endif

// PRECOND: as qgemm_kernel. SK: stream-K over the device, gridDim.x CTAs (as many as run at once), each a run of
// the line of (tile, stage) units, tiles in order (row block major, token block minor); a tile cut between runs
// is summed by the run that finishes it last, in run order (the same bits whichever finishes first), its ticket
// tickets[the first run's CTA] (zeroed by qgemm_xt_kernel); part: the runs' sums (sk_tile_sums). Else one tile a CTA
// (blockIdx.x tokens, blockIdx.y rows, blockIdx.z the part of KS).
template <int WT, int BN, int ST_MAX, int KS, bool XB, int MINB, bool SK>
__global__ void __launch_bounds__(256, MINB)
    qgemm_wg_kernel(float *__restrict__ y, const __half *__restrict__ xp, const uint8_t *__restrict__ w, int64_t T,
                    int64_t n_out, int64_t groups, int64_t row_bytes, unsigned *tickets, float *part) {
#if defined(QGEMM_WGMMA)
    using C = qgemm_wg_cfg<WT, BN, ST_MAX>;
    constexpr int ST = C::ST;
    __shared__ uint64_t xbar[ST];  // XB: a stage's x arrived (one bulk copy from qgemm_xt_kernel's layout)
    __shared__ unsigned last_run;                // SK: this CTA's run is the last of its tile's to finish
    __shared__ int run_slot[SK ? QGEMM_SK_CTAS : 1];  // SK: the slots of a tile's runs' sums, in run order
    constexpr int BM = C::BM, NB = BN / 128, TH = C::THREADS;
    constexpr int NQ = C::CH * BM / TH, NX = BN * 8 / TH, NS = (BM + TH - 1) / TH;  // copies a thread a stage
    static_assert(C::CH * BM % TH == 0 && BN * 8 % TH == 0 && (BM % TH == 0 || BM < TH), "whole copies a thread");
    static_assert(!SK || (KS == 1 && XB), "stream-K: whole tiles' inputs, x by bulk copy");
    extern __shared__ uint8_t sm_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t kp = groups * DJ_QGROUP, so = groups * C::QB;
    const int KT_ALL = (int)((groups + 1) / 2);
    const int64_t n_tb = (T + BN - 1) / BN;
    // this CTA's units [u, u_end): SK its run; else its tile's stages, part blockIdx.z of KS (the parts' sums are
    // added into y, which starts at zero)
    // (PRECOND for SK: units times CTAs below 2^31, no more CTAs than units)
    const unsigned U = SK ? (unsigned)(n_tb * ((n_out + BM - 1) / BM) * KT_ALL) : 1u, G = gridDim.x;
    // (held in shared memory: registers are short in the loop, where these are read once a tile)
    __shared__ int run[3];  // the next unit, the run's end, its first unit
    if (tid == 0) {
        if (SK) {
            run[0] = run[2] = (int)(blockIdx.x * U / G), run[1] = (int)((blockIdx.x + 1) * U / G);
        } else {
            const int KPER = (KT_ALL + KS - 1) / KS, K0 = (int)blockIdx.z * KPER;
            run[0] = run[2] = (int)(((int64_t)blockIdx.y * n_tb + blockIdx.x) * KT_ALL + K0);
            run[1] = run[0] + (K0 + KPER < KT_ALL ? KPER : KT_ALL - K0);
        }
    }
    if (XB) {
        if (tid == 0) {
            for (int s = 0; s < ST; s++) mbar_init(&xbar[s], 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
    }
    __syncthreads();
    int gs = 0;  // stages this CTA has run: the slot and the mbarrier phase of the next (they go on across tiles)
    for (;;) {
        const int u = run[0], u_end = run[1];
        if (u >= u_end) break;
        const int tile = u / KT_ALL, K0 = u - tile * KT_ALL;
        const int KT = u_end - u < KT_ALL - K0 ? u_end - u : KT_ALL - K0;  // stages K0 .. K0 + KT - 1
        const int64_t m0 = (int64_t)(tile / n_tb) * BM, tb = tile % n_tb, n0 = tb * BN;

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

        auto load = [&](int i) {  // the tile's i-th stage of this run, into slot (gs + i) % ST
            const int st = (gs + i) % ST;
            uint8_t *base = sm + st * C::STAGE;
            const int kt = K0 + i;
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                const bool ok = wok[j] && 2 * kt + whalf < groups;
                cp_async16(base + wdst + j * (TH / C::CH) * 16, ok ? wsrc[j] + (int64_t)kt * 2 * C::QB : w,
                           ok ? 16 : 0);
            }
            const int sbytes = 2 * kt + 1 < groups ? 4 : 2;
#pragma unroll
            for (int j = 0; j < NS; j++)
                if (tid + j * TH < BM)
                    cp_async4(base + sdst + j * TH * 4, sok[j] ? ssrc[j] + 4 * (int64_t)kt : w, sok[j] ? sbytes : 0);
            if (XB) {
                if (tid == 0) bulk_copy(base, xp + (tb * KT_ALL + kt) * BN * 64, BN * 128, &xbar[st]);
                return;
            }
            const bool kok = (int64_t)kt * 64 + xc * 8 < kp;
#pragma unroll
            for (int j = 0; j < NX; j++) {
                const bool ok = kok && j < nx;
                cp_async16(base + xdst + j * (TH / 8) * 128, ok ? xsrc + j * xstep + (int64_t)kt * 64 : xp,
                           ok ? 16 : 0);
            }
        };

        float acc[NB][64];  // BN 256: one 64x256 tile, n8 block j in acc[j / 16] + 4 (j % 16)
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int i = 0; i < 64; i++) acc[nb][i] = 0.0f;

#pragma unroll
        for (int st = 0; st < ST - 2; st++) {
            if (st < KT) load(st);
            cp_async_commit();
        }
        const int g = lane >> 2, rb = warp * 16;  // this warp's 16 rows of the CTA's 128
        uint32_t a[2][4][4];  // two stages' fragments: one in the products in flight, one being widened
        auto step = [&](int i, uint32_t (*af)[4]) {  // the tile's i-th stage of this run
            const int st = (gs + i) % ST;
            cp_async_wait<ST - 3>();
            if (XB) mbar_wait(&xbar[st], (uint32_t)(((gs + i) / ST) & 1));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async's writes, seen by wgmma
            __syncthreads();
            if (i + ST - 2 < KT) load(i + ST - 2);  // the stage of i - 2: its products are done
            cp_async_commit();
            const uint8_t *xs = sm + st * C::STAGE, *q = xs + C::X_BYTES, *sc = q + C::Q_BYTES;
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
        gs += KT;

        if (SK && KT < KT_ALL) {  // a cut tile: y from the last of its runs to finish
            static_assert(TH == 256, "the stream-K sums of 256 threads");
            sk_tile_sums<NB * 64>(y, acc[0], part, tickets, &last_run, run_slot, tid, (unsigned)tile, (unsigned)KT_ALL,
                                  U, G, u == run[2], m0 + rb + g, n0, 2 * (lane & 3), T, n_out,
                                  [] { __syncthreads(); });
        } else {
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
        }
        __syncthreads();  // every warp's products of this tile done before the next tile's loads reuse the slots
        if (tid == 0) run[0] = u + KT;
        __syncthreads();
    }
#endif
}

// ---- the Hopper kernel, warp-specialized (WS): one warpgroup widens, two multiply
// Nsight Compute on the kernel above (gate|up q4 at 512 tokens, bench/results/step_turn/session73) found its tensor
// pipe busy 66% of the SMs' active cycles, its warps (two a scheduler) stalled most on the widening's dependencies
// and the stage's ldmatrix, between products each warp must feed itself. Here warpgroup 0 (the producer) reads the
// weights straight into registers, D stages ahead, widens them into an f16 A tile in shared memory laid out as x is
// (each 128-row K-major, 128-byte swizzle, the inputs in qgemm_x_kernel's order within every 16) and moves x by one
// bulk copy a stage; warpgroups 1 and 2 (the consumers) only wait for a stage and multiply it (wgmma with both
// operands in shared memory, 64 rows each), releasing the slot when their products are done. A stage: full[slot]
// (the producer's 128 threads and x's bytes), empty[slot] (the consumers' 8 warps). It gained less than the
// widening's share of the other kernel's time promised, and only in q4 (bench/results/step_turn/session74).
template <int WT, int BN, int ST> struct qgemm_ws_cfg {
    static constexpr int THREADS = 384, BM = 128, D = 4;  // D: the producer's stages of weights in flight
    static constexpr int QB = q_group_bytes(WT), QW = 2 * QB / 16;  // a row's 16-byte words a stage
    static constexpr int X_BYTES = BN * 128, A_BYTES = BM * 128;
    static constexpr int STAGE = X_BYTES + A_BYTES;  // both multiples of 1024
    static constexpr int SMEM = STAGE * ST + 1024;
    static_assert(BN == 256 && ST >= 2 && SMEM <= 227 * 1024, "m64n256 products");
};

#if defined(QGEMM_WGMMA)
// d (64x256 f32, this thread's 128) += a (64x16 f16, shared memory, descriptor) . b (16x256 f16, descriptor)
static __device__ __forceinline__ void wgmma_256_ss(float *d, uint64_t a, uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(a), "l"(b), "r"(1));
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(b)) : "memory");
}
#endif

// A producer thread's weights of one stage, row m0 + tid: the two groups' values (q4: a uint4 each; q8: two) and
// their two 16-bit parameters; zeros past the row's last group and past n_out.
template <int WT> struct ws_regs {
    uint4 q[2 * q_group_bytes(WT) / 16];
    uint32_t sc;
};

#if defined(QGEMM_WGMMA)
static __device__ __forceinline__ void ws_consumers_sync() {  // the consumers' 256 threads (named barrier 1)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
}
#endif

// PRECOND: as qgemm_kernel; x in qgemm_xt_kernel's layout of BN-token blocks. SK: stream-K as qgemm_wg_kernel's
// (gridDim.x CTAs, each a run of the line of (tile, stage) units; a cut tile summed by its last run to finish, in run
// order; tickets and part as there, the consumers' 256 threads' sums in a slot). Else one tile a CTA: blockIdx.x
// tokens, blockIdx.y rows. Producer and consumers walk the same run; the stage counter i (slot i % ST, phase
// (i / ST) & 1) goes on across the run's tiles.
template <int WT, int BN, int ST, bool SK>
__global__ void __launch_bounds__(384, 1)
    qgemm_ws_kernel(float *__restrict__ y, const __half *__restrict__ xp, const uint8_t *__restrict__ w, int64_t T,
                    int64_t n_out, int64_t groups, int64_t row_bytes, unsigned *tickets, float *part) {
#if defined(QGEMM_WGMMA)
    using C = qgemm_ws_cfg<WT, BN, ST>;
    constexpr int BM = C::BM, D = C::D, QW = C::QW;
    __shared__ uint64_t full[ST], empty[ST];
    __shared__ unsigned last_run;                     // SK: this CTA's run is the last of its tile's to finish
    __shared__ int run_slot[SK ? QGEMM_SK_CTAS : 1];  // SK: the slots of a tile's runs' sums, in run order
    extern __shared__ uint8_t sm_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)sm_raw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int KT_ALL = (int)((groups + 1) / 2);
    const int64_t n_tb = (T + BN - 1) / BN;
    // this CTA's units [u0, u1) (PRECOND for SK: units times CTAs below 2^31, no more CTAs than units)
    const unsigned U = SK ? (unsigned)(n_tb * ((n_out + BM - 1) / BM) * KT_ALL) : 1u, G = gridDim.x;
    const unsigned u0 = SK ? blockIdx.x * U / G : (unsigned)(((int64_t)blockIdx.y * n_tb + blockIdx.x) * KT_ALL);
    const unsigned u1 = SK ? (blockIdx.x + 1) * U / G : u0 + (unsigned)KT_ALL;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) mbar_init(&full[s], BM + 1), mbar_init(&empty[s], 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // The producer's warpgroup gives registers to the consumers' (q4 104 + 2 x 200 a thread, q8 120 + 2 x 192: 3 x
    // 168, the launch's): the consumers hold a 64 x 256 tile's 128 sums a thread across the run's tiles (at 168, SK's
    // spilled 1 KB), the producer D stages of weights (without it, slower: bench/results/step_turn/session74 call 3).
    constexpr int PREG = WT == DJ_Q4 ? 104 : 120, CREG = (3 * 168 - PREG) / 2;
    static_assert(CREG % 8 == 0 && PREG + 2 * CREG <= 3 * 168, "setmaxnreg: multiples of 8 within the launch's");
    if (wg == 0) {  // the producer: thread tid widens row tid of each stage's tile
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREG) : "memory");
        // a unit's place, stepped one unit at a time (no division a stage)
        struct cursor {
            unsigned unit, kt, tb, rb;  // the unit; its stage, token block and row block
        };
        const unsigned NTB = (unsigned)n_tb;
        auto at = [&](unsigned unit) {
            const unsigned tile = unit / (unsigned)KT_ALL;
            return cursor{unit, unit - tile * (unsigned)KT_ALL, tile % NTB, tile / NTB};
        };
        auto step = [&](cursor &c) {
            c.unit++;
            if (++c.kt == (unsigned)KT_ALL) {
                c.kt = 0;
                if (++c.tb == NTB) c.tb = 0, c.rb++;
            }
        };
        cursor fc = at(u0), sc = fc;  // the next unit to fetch, the next stage to fill
        auto fetch = [&](ws_regs<WT> &r) {  // fc's weights into r (zeros past the run), fc on
            const int kt = (int)fc.kt;
            const int64_t row = (int64_t)fc.rb * BM + tid;
            const bool rok = fc.unit < u1 && row < n_out, g1 = rok && 2 * kt + 1 < groups;
            const uint8_t *wq = w + (rok ? row : 0) * row_bytes + (int64_t)kt * 2 * C::QB;
            const uint8_t *wsc = w + (rok ? row : 0) * row_bytes + groups * C::QB + 4 * (int64_t)kt;
#pragma unroll
            for (int j = 0; j < QW; j++) {
                const bool ok = j < QW / 2 ? rok : g1;
                r.q[j] = ok ? __ldg((const uint4 *)wq + j) : make_uint4(0, 0, 0, 0);
            }
            r.sc = g1 ? __ldg((const uint32_t *)wsc) : rok ? (uint32_t)__ldg((const unsigned short *)wsc) : 0u;
            step(fc);
        };
        // row tid's 128 bytes of slot st's A tile: 16-byte chunk c (inputs 8c .. 8c + 7 in x's order) at c ^ (tid % 8)
        auto widen = [&](const ws_regs<WT> &r, uint8_t *a) {
            uint4 *dst = (uint4 *)(a + (tid >> 3) * 1024 + (tid & 7) * 128);
#pragma unroll
            for (int gi = 0; gi < 2; gi++) {
                __half2 sg, ng;
                q_widen_params<WT>((r.sc >> (16 * gi)) & 0xFFFFu, &sg, &ng);
#pragma unroll
                for (int b = 0; b < 2; b++) {  // the group's 16-blocks: even inputs, then odd (chunks 4 gi + 2 b, + 1)
                    uint32_t ev[4], od[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        if (WT == DJ_Q4) {  // words of the group's 16 bytes; block b: the low (0) or high (1) nibbles
                            const uint32_t u = (&r.q[gi].x)[k];
                            ev[k] = q_widen2(q4_pair(u, 4 * b), sg, ng), od[k] = q_widen2(q4_pair(u, 4 * b + 8), sg, ng);
                        } else {  // block b: the group's bytes 16 b .. 16 b + 15
                            const uint32_t u = (&r.q[2 * gi + b].x)[k];
                            ev[k] = q_widen2(q8_pair(u, 0x4240), sg, ng), od[k] = q_widen2(q8_pair(u, 0x4341), sg, ng);
                        }
                    }
                    const int c = 4 * gi + 2 * b;
                    dst[c ^ (tid & 7)] = make_uint4(ev[0], ev[1], ev[2], ev[3]);
                    dst[(c + 1) ^ (tid & 7)] = make_uint4(od[0], od[1], od[2], od[3]);
                }
            }
        };
        ws_regs<WT> r[D];
#pragma unroll
        for (int d = 0; d < D; d++) fetch(r[d]);
        auto stage = [&](int i, ws_regs<WT> &rr) {  // the run's i-th stage (sc), sc on
            const int st = i % ST;
            if (i >= ST) mbar_wait(&empty[st], (uint32_t)((i / ST - 1) & 1));  // the consumers are done with it
            uint8_t *base = sm + st * C::STAGE;
            if (tid == 0)
                bulk_copy(base, xp + ((int64_t)sc.tb * KT_ALL + sc.kt) * BN * 64, BN * 128, &full[st]);
            step(sc);
            widen(rr, base + C::X_BYTES);
            fetch(rr);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the widened tile, seen by wgmma
            mbar_arrive(&full[st]);
        };
        const int n = (int)(u1 - u0);
        int i = 0;
        for (; i + D <= n; i += D)
#pragma unroll
            for (int d = 0; d < D; d++) stage(i + d, r[d]);
#pragma unroll
        for (int d = 0; d < D; d++)
            if (i + d < n) stage(i + d, r[d]);
        return;
    }

    // the consumers: warpgroup wg's 64 rows of each tile
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CREG) : "memory");
    const int cw = tid / 32 - 4, ctid = tid - 128;  // this warp's 16 rows: cw 16 .. cw 16 + 15 of the CTA's 128
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    float acc[128];
    int i = 0;  // the run's stages consumed
    for (unsigned u = u0; u < u1;) {
        const unsigned tile = u / (unsigned)KT_ALL;
        const int K0 = (int)(u - tile * (unsigned)KT_ALL);
        const int KT = (int)(u1 - u) < KT_ALL - K0 ? (int)(u1 - u) : KT_ALL - K0;  // stages K0 .. K0 + KT - 1
        const int64_t m0 = (int64_t)(tile / n_tb) * BM, n0 = (int64_t)(tile % n_tb) * BN;
#pragma unroll
        for (int k = 0; k < 128; k++) acc[k] = 0.0f;
        for (int k = 0; k < KT; k++, i++) {
            const int st = i % ST;
            mbar_wait(&full[st], (uint32_t)((i / ST) & 1));
            const uint8_t *xs = sm + st * C::STAGE, *as = xs + C::X_BYTES + (wg - 1) * 64 * 128;
            wg_fence();
            wg_pin(acc), wg_pin(acc + 64);
#pragma unroll
            for (int ks = 0; ks < 4; ks++) wgmma_256_ss(acc, wg_desc(as + ks * 32), wg_desc(xs + ks * 32));
            wg_commit();
            wg_wait<1>();  // the stage before's products are done: its slot goes back to the producer
            wg_pin(acc), wg_pin(acc + 64);
            if (k > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % ST]);
        }
        wg_wait<0>();
        wg_pin(acc), wg_pin(acc + 64);
        if (lane == 0) mbar_arrive(&empty[(i - 1) % ST]);  // the tile's last stage
        const int64_t row = m0 + cw * 16 + g;
        if (SK && KT < KT_ALL) {  // a cut tile: y from the last of its runs to finish (the consumers' 256 threads)
            sk_tile_sums<128>(y, acc, part, tickets, &last_run, run_slot, ctid, tile, (unsigned)KT_ALL, U, G, u == u0,
                              row, n0, c2, T, n_out, [] { ws_consumers_sync(); });
        } else {
            // accumulators 4j .. 4j + 3: n8 block j's (row g, tokens 8j + 2c, + 1), then row g + 8's
#pragma unroll
            for (int j = 0; j < 32; j++) store_frag(y, T, n_out, row, n0 + j * 8 + c2, acc + 4 * j);
        }
        u += KT;
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

// The Hopper kernel's shapes: (id, BN, ST, KS, XB, MINB, SK); ST at most (qgemm_wg_cfg: as many as fit). Measured
// against each other on the H100 (bench/results/qgemm): x by bulk copy (XB) gained 1-5% with 256 tokens whole and up
// to 20% on q4 with 128, lost 2-7% with 256 split; two CTAs a multiprocessor (MINB, 128 tokens, 126 registers)
// gained up to 20% on q4. On the H200 six stages (q4; q8's five fit) took 2-5% off five at 256-2048 tokens on every
// 8B matrix (bench/results/step_turn/session73, call 5).
#define QGEMM_WG_VARIANTS(X)                \
    X(8, 256, 6, 1, true, 1, false)         \
    X(9, 256, 4, 2, false, 1, false)        \
    X(10, 128, 4, 2, true, 2, false)        \
    X(11, 128, 4, 1, true, 2, false)
// Stream-K (SK), after the register kernel's shapes: session 73's calls 6-8 (qgemm_wg_kernel says how it runs); 23:
// 128-token tiles (one block up to 128 tokens), one CTA a multiprocessor (two, of four stages, gained the picks too
// little to keep: bench/results/step_turn/session74, call 6).
#define QGEMM_WG_SK_VARIANTS(X) X(20, 256, 6, 1, true, 1, true) X(23, 128, 6, 1, true, 1, true)
// Warp-specialized (qgemm_ws_kernel): (id, BN, ST, SK): whole tiles, stream-K.
#define QGEMM_WG_WS_VARIANTS(X) X(21, 256, 4, false) X(22, 256, 4, true)

#define QGEMM_FEW_T 64  // the most tokens the register kernel splits a row block's inputs for

// The Hopper kernel's scratch: x in f16 (T rounded up to whole blocks of 256 tokens), then for stream-K the tickets
// and the runs' sums (sk_tile_sums: two slots of 256 threads x 64 a CTA of 128 tokens, QGEMM_SK_CTAS of them, or
// half as many of 256).
static size_t wg_x_bytes(int64_t T, int64_t n_in) {
    return (size_t)(T + 255) / 256 * 256 * (size_t)((n_in + 63) / 64 * 64) * 2;
}
#define QGEMM_SK_TICKET_BYTES 2048
#define QGEMM_SK_PART_BYTES ((size_t)QGEMM_SK_CTAS * 2 * 64 * 256 * 4)
static_assert(QGEMM_SK_CTAS * 4 <= QGEMM_SK_TICKET_BYTES, "a ticket a CTA");
static unsigned *wg_tickets(__half *xp, int64_t T, int64_t n_in) { return (unsigned *)((uint8_t *)xp + wg_x_bytes(T, n_in)); }
static float *wg_parts(unsigned *tickets) { return (float *)((uint8_t *)tickets + QGEMM_SK_TICKET_BYTES); }

// xp = x in f16 for the kernels: qgemm_x_kernel's layout (bn 0), or qgemm_xt_kernel's in blocks of bn tokens.
// With bn, the first n_tickets of tickets are zeroed too.
static int qgemm_x(__half *xp, const qgemm_src &x, int64_t T, int64_t n_in, int bn, cudaStream_t s, dj_err *e,
                   unsigned *tickets = NULL, int n_tickets = 0) {
    const int64_t kp = (n_in + DJ_QGROUP - 1) / DJ_QGROUP * DJ_QGROUP;
    const int64_t KT = (kp + 63) / 64, runs = bn ? KT * 4 : kp / 16, rows = bn ? (T + bn - 1) / bn * bn : T;
    const dim3 grid((unsigned)((runs + 63) / 64), (unsigned)(rows < 65535 ? rows : 65535));
    if (bn)  // 128, 256
        qgemm_xt_kernel<<<grid, 64, 0, s>>>(xp, x, T, rows, n_in, KT, __builtin_ctz((unsigned)bn), tickets, n_tickets);
    else qgemm_x_kernel<<<grid, 64, 0, s>>>(xp, x, T, n_in, kp);
    LAUNCH_CHECK("qgemm_x", s);
    return 0;
}

// x laid out for the Hopper kernel from x's rows (wg_lay_src) or from the rows it norms (wg_lay_norm): bn tokens a
// block (0: qgemm_x_kernel's layout), the first n_tickets tickets zeroed.
struct wg_lay_src {
    qgemm_src x;
    int operator()(__half *xp, int64_t T, int64_t n_in, int bn, unsigned *tickets, int n_tickets, cudaStream_t s,
                   dj_err *e) const {
        return qgemm_x(xp, x, T, n_in, bn, s, e, tickets, n_tickets);
    }
};
struct qreg_norm_in {
    const float *x, *delta;  // (T, n_in); delta NULL: no add
    float *xo;               // (T, n_in)
    const float *nw;         // (n_in)
    float eps;
};
struct wg_lay_norm {
    qreg_norm_in in;
    int operator()(__half *xp, int64_t T, int64_t n_in, int bn, unsigned *tickets, int n_tickets, cudaStream_t s,
                   dj_err *e) const {
        const int64_t kp = (n_in + DJ_QGROUP - 1) / DJ_QGROUP * DJ_QGROUP, KT = (kp + 63) / 64;
        const int64_t rows = bn ? (T + bn - 1) / bn * bn : T, runs = bn ? 4 * KT : kp / 16;
        qgemm_norm_x_kernel<<<(unsigned)rows, norm_threads(n_in), (size_t)(16 * runs) * sizeof(__half), s>>>(
            xp, in.x, in.delta, in.xo, in.nw, in.eps, T, n_in, kp, KT, bn ? __builtin_ctz((unsigned)bn) : 0, tickets,
            n_tickets);
        LAUNCH_CHECK("qgemm_norm_x", s);
        return 0;
    }
};

// Stream-K's CTAs for a line of `units` (tile, stage) units: `most` (as many as run at once, within the sums'
// slots), none without a unit, units times CTAs below 2^31 (the kernels' unit arithmetic); 0, e set, where none fit.
static int64_t sk_ctas(int64_t units, int64_t most, dj_err *e) {
    int64_t G = most < units ? most : units;
    if (units * G >= ((int64_t)1 << 31)) G = (((int64_t)1 << 31) - 1) / units;
    if (G < 1) dj_fail(e, "gpu_qgemm: %lld units of work are too many for stream-K", (long long)units);
    return G < 1 ? 0 : G;
}

template <int WT, int BN, int ST, int KS, bool XB, int MINB, bool SK, class LAY>
static int qgemm_wg_launch(float *y, const LAY &lay, __half *xp, const void *w, int64_t T, int64_t n_in,
                           int64_t n_out, int n_sm, cudaStream_t s, dj_err *e) {
    using C = qgemm_wg_cfg<WT, BN, ST>;
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    const int64_t tiles = (T + BN - 1) / BN * ((n_out + C::BM - 1) / C::BM), units = tiles * ((groups + 1) / 2);
    const int64_t running = (int64_t)n_sm * MINB, slots = QGEMM_SK_CTAS * 128 / BN;  // CTAs at once; sums' slots
    const int64_t G = SK ? sk_ctas(units, running < slots ? running : slots, e) : 0;
    if (SK && !G) return -1;
    unsigned *tickets = SK ? wg_tickets(xp, T, n_in) : NULL;
    if (lay(xp, T, n_in, XB ? BN : 0, tickets, SK ? (int)G : 0, s, e)) return -1;
    static std::atomic<unsigned> ready;
    if (smem_optin((const void *)qgemm_wg_kernel<WT, BN, ST, KS, XB, MINB, SK>, C::SMEM, ready, e)) return -1;
    const dim3 grid = SK ? dim3((unsigned)G) : dim3((unsigned)((T + BN - 1) / BN), (unsigned)((n_out + C::BM - 1) / C::BM), KS);
    if (KS > 1) CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)T * (size_t)n_out * sizeof(float), s));
    qgemm_wg_kernel<WT, BN, ST, KS, XB, MINB, SK><<<grid, C::THREADS, C::SMEM, s>>>(
        y, xp, (const uint8_t *)w, T, n_out, groups, rb, tickets, SK ? wg_parts(tickets) : NULL);
    LAUNCH_CHECK("qgemm_wg", s);
    return 0;
}

template <int WT, int BN, int ST, bool SK, class LAY>
static int qgemm_ws_launch(float *y, const LAY &lay, __half *xp, const void *w, int64_t T, int64_t n_in, int64_t n_out,
                           int n_sm, cudaStream_t s, dj_err *e) {
    using C = qgemm_ws_cfg<WT, BN, ST>;
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    const int64_t tiles = (T + BN - 1) / BN * ((n_out + C::BM - 1) / C::BM), units = tiles * ((groups + 1) / 2);
    const int64_t slots = QGEMM_SK_CTAS * 128 / BN;  // a CTA a multiprocessor, within the sums' slots
    const int64_t G = SK ? sk_ctas(units, n_sm < slots ? n_sm : slots, e) : 0;
    if (SK && !G) return -1;
    if (!SK && units >= ((int64_t)1 << 31))  // the kernel's unit arithmetic
        return dj_fail(e, "gpu_qgemm: %lld units of work are too many for the warp-specialized kernel", (long long)units);
    unsigned *tickets = SK ? wg_tickets(xp, T, n_in) : NULL;
    if (lay(xp, T, n_in, BN, tickets, SK ? (int)G : 0, s, e)) return -1;
    static std::atomic<unsigned> ready;
    if (smem_optin((const void *)qgemm_ws_kernel<WT, BN, ST, SK>, C::SMEM, ready, e)) return -1;
    const dim3 grid = SK ? dim3((unsigned)G) : dim3((unsigned)((T + BN - 1) / BN), (unsigned)((n_out + C::BM - 1) / C::BM));
    qgemm_ws_kernel<WT, BN, ST, SK><<<grid, C::THREADS, C::SMEM, s>>>(y, xp, (const uint8_t *)w, T, n_out, groups, rb,
                                                                     tickets, SK ? wg_parts(tickets) : NULL);
    LAUNCH_CHECK("qgemm_ws", s);
    return 0;
}

template <int WT, int BM, int BN, int WM, int WN, int ST>
static int qgemm_launch(float *y, const qgemm_src &x, __half *xp, const void *w, int64_t T, int64_t n_in, int64_t n_out,
                        cudaStream_t s, dj_err *e) {
    using C = qgemm_cfg<WT, BM, BN, WM, WN, ST>;
    const dim3 grid((unsigned)((T + BN - 1) / BN), (unsigned)((n_out + BM - 1) / BM));
    if (qgemm_x(xp, x, T, n_in, 0, s, e)) return -1;
    static std::atomic<unsigned> ready;
    if (smem_optin((const void *)qgemm_kernel<WT, BM, BN, WM, WN, ST>, C::SMEM, ready, e)) return -1;
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    qgemm_kernel<WT, BM, BN, WM, WN, ST><<<grid, C::THREADS, C::SMEM, s>>>(y, xp, (const uint8_t *)w, T, n_out,
                                                                         groups, rb);
    LAUNCH_CHECK("qgemm", s);
    return 0;
}

// The register kernel's shapes, (id, NT, MT, NQ, WARPS, ST, XS): blocks of 8 NT tokens, MT tiles of 16 rows a warp,
// NQ chunks a lane a row a unit, WARPS warps a CTA, ST stages, XS x staged in shared memory (read once a CTA, where
// without it every warp reads it again through L1, which the rings leave at about 28 KB). 12 and 13 put eight warps
// of one tile each on a staged x (q4's 12 takes 96 registers a thread: 16 warps a multiprocessor); 15 and 18 take
// 256 inputs a unit. Each is the fastest of 12 shapes somewhere on the 8B matrices or their two-GPU halves at 4-64
// tokens; the rest lost everywhere and left (bench/results/qgemm_reg/session59).
#define QREG_VARIANTS(X)     \
    X(12, 1, 1, 4, 8, 2, 1)  \
    X(13, 2, 1, 4, 8, 2, 1)  \
    X(14, 4, 2, 4, 4, 3, 0)  \
    X(15, 4, 2, 2, 4, 3, 0)  \
    X(16, 8, 2, 2, 4, 3, 0)  \
    X(17, 2, 2, 4, 4, 2, 1)  \
    X(18, 4, 2, 2, 4, 3, 1)  \
    X(19, 8, 2, 2, 4, 2, 1)

#define QREG_TICKETS ((int64_t)1 << 16)  // a warp's rows of a row block of a token block (one ticket each)
#define QREG_CTA_PART (2 * 128 * 4)      // the runs' sums' bytes a CTA a token, at most (2 slots, 128 rows, floats)

// qreg_x_kernel's x for T tokens and n_in inputs, bytes, for every shape above (tokens to 64, inputs to 512 a unit);
// the tickets and the runs' sums follow it.
static size_t qreg_x_bytes(int64_t T, int64_t n_in) {
    return (size_t)((T + 63) / 64 * 64) * (size_t)((n_in + 511) / 512 * 512) * 2;
}
// The runs' sums up to QGEMM_FEW_T tokens: as many CTAs as 3 a multiprocessor on 132 fill, at 8 tokens a block or
// more (a launch that would need more runs fewer CTAs).
static size_t qreg_part_bytes(int64_t T) { return (size_t)(3 * 132) * QREG_CTA_PART * (size_t)((T + 7) / 8 * 8); }

// x in f16, T rounded up to whole blocks of 256 tokens; or the register kernel's x, its tickets and its runs' sums
// (at most QGEMM_FEW_T tokens' worth), where they take more.
extern "C" size_t gpu_qgemm_scratch(int64_t T, int64_t n_in) {
    const size_t x = wg_x_bytes(T, n_in) + (T > QGEMM_FEW_T ? QGEMM_SK_TICKET_BYTES + QGEMM_SK_PART_BYTES : 0);
    const size_t reg = qreg_x_bytes(T, n_in) + QREG_TICKETS * 4 + qreg_part_bytes(T < QGEMM_FEW_T ? T : QGEMM_FEW_T);
    return x > reg ? x : reg;  // never less for more tokens: a reserve for T covers every pass of fewer
}

// Where a launch of the register kernel wants x laid out: the pass's tokens t0 .. t0 + T - 1 in tb blocks of 8 NT,
// iters units a row block, n16 uint4s of xf, the first n_tickets tickets zeroed (both in scratch).
struct qreg_x_at {
    uint4 *xf;
    unsigned *tickets;
    int64_t t0, T, tb, iters, n16, n_tickets;
};

// x laid out by qreg_x_kernel from qgemm_src's rows (gpu_qgemm, gpu_swiglu_qgemm).
template <int WT, int NT, int NQ> struct qreg_lay_src {
    qgemm_src x;
    int64_t n_in;
    int operator()(const qreg_x_at &a, cudaStream_t s, dj_err *e) const {
        const qgemm_src xc = {x.x + a.t0 * x.ld, x.up ? x.up + a.t0 * x.ld : NULL, x.ld};
        qreg_x_kernel<WT, NT, NQ><<<(unsigned)((a.n16 + 255) / 256), 256, 0, s>>>(a.xf, xc, a.T, n_in, a.iters, a.n16,
                                                                                a.tickets, a.n_tickets);
        LAUNCH_CHECK("qreg_x", s);
        return 0;
    }
};

// x laid out by qreg_norm_x_kernel from the rows rmsnorm(x + delta) * nw, x + delta stored to xo (gpu_norm_qgemm).
template <int WT, int NT, int NQ> struct qreg_lay_norm {
    qreg_norm_in in;
    int64_t n_in;
    int operator()(const qreg_x_at &a, cudaStream_t s, dj_err *e) const {
        const int64_t off = a.t0 * n_in;
        const size_t smem = (size_t)(a.iters * 4 * NQ * qreg_shape<WT>::IN) * sizeof(__half);
        qreg_norm_x_kernel<WT, NT, NQ><<<(unsigned)(a.tb * 8 * NT), norm_threads(n_in), smem, s>>>(
            a.xf, in.x + off, in.delta ? in.delta + off : NULL, in.xo + off, in.nw, in.eps, a.T, n_in, a.iters,
            a.tickets, a.n_tickets);
        LAUNCH_CHECK("qreg_norm_x", s);
        return 0;
    }
};

// x laid out by lay_x (qreg_lay_src, qreg_lay_norm: launches on s, PDL-triggering at their start), then the product.
template <int WT, int NT, int MT, int NQ, int WARPS, int ST, int XS, class LAY>
static int qreg_product(const dj_gpu *g, float *y, const LAY &lay_x, void *scratch, const void *w, int64_t T,
                        int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    using C = qreg_cfg<WT, NT, MT, NQ, WARPS, ST, XS>;
    auto kernel = qreg_kernel<WT, NT, MT, NQ, WARPS, ST, XS>;
    static std::atomic<unsigned> ready;
    static std::atomic<int> per_sm_of[32];  // CTAs a multiprocessor holds, by device (0: not asked yet)
    if (smem_optin((const void *)kernel, C::SMEM, ready, e)) return -1;
    int per_sm = per_sm_of[g->device & 31].load();
    if (!per_sm) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::THREADS, C::SMEM));
        if (per_sm < 1) return dj_fail(e, "gpu_qgemm: the register kernel's CTA does not fit a multiprocessor");
        per_sm_of[g->device & 31].store(per_sm);
    }
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP, chunks = groups * q_group_bytes(WT) / 16;
    const int64_t iters = (chunks + 4 * NQ - 1) / (4 * NQ), n_rb = (n_out + C::ROWS - 1) / C::ROWS;
    const int64_t rb_bytes = (int64_t)dj_row_bytes(WT, (uint64_t)n_in), per_tok = 65535 * 8 * NT;
    for (int64_t t0 = 0; t0 < T; t0 += per_tok) {  // grid.y: blocks of 8 NT tokens
        const int64_t Tc = T - t0 < per_tok ? T - t0 : per_tok, tb = (Tc + 8 * NT - 1) / (8 * NT);
        // runs: the CTAs the device holds at once, shared by the token blocks, within the scratch's sums; whole row
        // blocks (no sums) past QGEMM_FEW_T tokens or QREG_TICKETS tickets
        int64_t G = n_rb;
        if (Tc <= QGEMM_FEW_T && tb * n_rb * WARPS <= QREG_TICKETS) {
            const int64_t fit = (int64_t)per_sm * g->n_sm / tb;
            const int64_t room = (int64_t)(qreg_part_bytes(Tc) / ((size_t)2 * C::ROWS * 8 * NT * 4)) / tb;
            G = fit < room ? fit : room;
            if (G < 1) G = 1;
            // as few runs as keep the longest as long (never more runs than units): every run then takes the same
            // number of units, and fewer blocks are split between runs (the 8B's q|k|v at 16 tokens 17.8 -> 16.7 us,
            // 384 units on 192 CTAs where 264 took them; the halves' down at 8 tokens 17.7 -> 16.7, 448 on 224:
            // qgemm_reg/session60)
            const int64_t units = n_rb * iters, longest = (units + G - 1) / G;
            G = (units + longest - 1) / longest;
        }
        uint4 *xf = (uint4 *)scratch;
        unsigned *tickets = (unsigned *)((uint8_t *)scratch + qreg_x_bytes(Tc, n_in));
        const int64_t n16 = tb * iters * C::XU, n_tickets = G == n_rb ? 0 : tb * n_rb * WARPS;
        if (lay_x(qreg_x_at{xf, tickets, t0, Tc, tb, iters, n16, n_tickets}, s, e)) return -1;
        const qreg_args args = {y + t0 * n_out, xf, (const uint8_t *)w, Tc, n_out, chunks, groups, rb_bytes, iters,
                                n_rb, (float *)(tickets + QREG_TICKETS), tickets};
        CUDA_CHECK(pdl_launch(kernel, dim3((unsigned)G, (unsigned)tb), dim3(C::THREADS), C::SMEM, s, args));
        LAUNCH_CHECK("qreg", s);
    }
    return 0;
}

static bool qreg_variant(int variant) {
#define QREG_IS(id, ...) || variant == id
    return false QREG_VARIANTS(QREG_IS);
#undef QREG_IS
}

// Register shape `variant`'s product of x laid out by LAY<wtype, NT, NQ>{in, n_in} (qreg_lay_src from x's rows,
// qreg_lay_norm from the rows it norms). PRECOND: the scratch reserved (gpu_qgemm_scratch).
template <template <int, int, int> class LAY, class IN>
static int qreg_run(dj_gpu *g, const char *fn, int variant, float *y, const IN &in, const void *w, uint32_t wtype,
                    int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
#define QREG_CASE(id, NT, MT, NQ, WARPS, ST, XS)                                                                   \
    case id:                                                                                                       \
        return wtype == DJ_Q8 ? qreg_product<DJ_Q8, NT, MT, NQ, WARPS, ST, XS>(                                    \
                                    g, y, LAY<DJ_Q8, NT, NQ>{in, n_in}, g->scratch, w, T, n_in, n_out, s, e)       \
                              : qreg_product<DJ_Q4, NT, MT, NQ, WARPS, ST, XS>(                                    \
                                    g, y, LAY<DJ_Q4, NT, NQ>{in, n_in}, g->scratch, w, T, n_in, n_out, s, e);
    switch (variant) {
        QREG_VARIANTS(QREG_CASE)
    default:
        return dj_fail(e, "%s: no register shape %d for T=%lld", fn, variant, (long long)T);
    }
#undef QREG_CASE
}

extern "C" int gpu_qgemm_ok(uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out) {
    return dj_is_quant(wtype) && T >= 1 && n_in >= 1 && n_out >= 1 && (uintptr_t)w % 16 == 0 &&
           (n_out + 63) / 64 <= 65535 && (T + 15) / 16 <= INT32_MAX;
}

// The tile shape for T tokens, n_in inputs and n_out rows (bench/qgemm_bench.cu). Up to 64 tokens the register
// kernel, its fastest shape on the 8B matrices and their two-GPU halves (one H200 call,
// bench/results/qgemm_reg/session59; "big": more than 2^24 weights). Up to 16 tokens eight warps of one tile on a
// staged x, 8 or 16 tokens a block (the q4 layer at 8 tokens 91.0 us against 98.4 for the shapes before, at 16 96.7
// against 101.0; q8 at 16 122.0 against 135.6). At 32: q4 in units of 256 inputs with x staged where big (gate|up 46.7
// against 49.8), else 13 (the 8B's wo 18.4); q8 unstaged in units of 256 where big, else 17 (16 tokens a block, x
// staged). At 64: q4 64 a block where big (gate|up 63.1), else 18 (wo 22.1 against 23.4); q8 64 a block staged where
// big (gate|up 70.6 against 82.6), else 14.
// Beyond 64 tokens on Hopper the wgmma shape of least estimated time: waves of CTAs (as many as multiprocessors; a
// started wave costs 0.6 of a full one plus 0.4 times its fill, a single wave a whole one) times the stages a CTA runs
// times a stage's cost: 1.4 for 256 tokens (twice the tokens of 128 for each widened weight), 1.7 split (a pass half as
// long pays its start, the zeroing of y, and x without the bulk copy), 1.1 and 1 for 128 split and whole (two CTAs a
// multiprocessor, which this estimate leaves out: counting them as half a wave fitted worse). Fitted to the H100 run of
// every shape at T = 128..2048: the chosen shapes take 1.002x the time of the best of the four, at worst 1.06x. At 512
// tokens the 4096-row matrices get 256 split (64 CTAs of 256 whole left half the SMs idle: 1.6x the time).
static int qgemm_pick_cost(const dj_gpu *g, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, double *cost) {
    const int64_t rows = (n_out + 127) / 128, stages = ((n_in + DJ_QGROUP - 1) / DJ_QGROUP + 1) / 2;
    *cost = 0;
    if (T <= 64) {  // the register kernel
        const bool big = n_in * n_out > (1 << 24);
        if (T <= 16) return T <= 8 ? 12 : 13;
        if (T <= 32) return wtype == DJ_Q4 ? (big ? 18 : 13) : big ? 15 : 17;
        return wtype == DJ_Q4 ? (big ? 16 : 18) : big ? 19 : 14;
    }
    if (!g->wgmma) return 0;
    static const struct {
        int variant, bn, ks;
        double stage_cost;
    } shapes[] = {{8, 256, 1, 1.4}, {9, 256, 2, 1.7}, {10, 128, 2, 1.1}, {11, 128, 1, 1.0}};
    // q4: the warp-specialized kernel (21, 22) in place of shape 8 (20), at 1.35 a stage; in q8 it does not win
    // (bench/results/step_turn/session74)
    const bool ws = wtype == DJ_Q4;
    int best = 11;
    double best_t = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const double ctas = (double)((T + shapes[i].bn - 1) / shapes[i].bn * rows * shapes[i].ks);
        const double w = ctas / (double)g->n_sm, full = ceil(w);
        const double waves = fmax(1.0, full - 0.4 * (full - w));
        const int v = shapes[i].variant == 8 && ws ? 21 : shapes[i].variant;
        const double stage_cost = v == 21 ? 1.35 : shapes[i].stage_cost;
        const double t = waves * (double)((stages + shapes[i].ks - 1) / shapes[i].ks) * stage_cost;
        if (i == 0 || t < best_t) best = v, best_t = t;
    }
    // Stream-K (shape 20, 22): each multiprocessor an equal run of the (tile, stage) units, no wave left part-full, at
    // shape 8's (21's) cost a stage plus 19 stages' worth (a run's starts, its cut tiles' sums). Its CTAs stand at
    // unrelated stages, so x is read again for every tile: where x takes more than half the L2 those reads go to
    // memory, charged 5%. Fitted on the H200 (bench/results/step_turn/session73 call 8, session74 calls 1 and 3).
    const double units = (double)((T + 255) / 256 * rows * stages), G = fmin((double)g->n_sm, units);
    const bool x_spills = (double)((T + 255) / 256 * 256) * (double)n_in * 2 > 0.5 * (double)g->l2_bytes;
    const double t_sk = (ws ? 1.35 : 1.4) * (units / G + 19.0) * (x_spills ? 1.05 : 1.0);
    if (t_sk < best_t) best = ws ? 22 : 20, best_t = t_sk;
    // Up to 128 tokens (one token block: the row blocks alone may leave multiprocessors idle) stream-K over 128-token
    // tiles (shape 23) at 1.1 a stage plus 5 (session74, call 6).
    if (T <= 128) {
        const double units128 = (double)(rows * stages), t_sk128 = 1.1 * (units128 / fmin((double)g->n_sm, units128) + 5.0);
        if (t_sk128 < best_t) best = 23, best_t = t_sk128;
    }
    *cost = best_t;
    return best;
}
static int qgemm_pick(const dj_gpu *g, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out) {
    double cost;
    return qgemm_pick_cost(g, wtype, T, n_in, n_out, &cost);
}

// Tokens at the end of a pass of T that cost the Hopper kernel a block of their own: T % 128 when they are at most
// `most` and the estimate above charges T more than T without them (at 513 tokens, 256 more padded; at 641 none,
// as 640 already runs three blocks of 256). 0 elsewhere.
int qgemm_tail(const dj_gpu *g, int64_t T, int64_t n_in, int64_t n_out, int64_t most) {
    const int64_t r = T % 128;
    if (!g->wgmma || T <= 128 || r == 0 || r > most) return 0;
    double with, without;
    qgemm_pick_cost(g, DJ_Q4, T, n_in, n_out, &with);
    qgemm_pick_cost(g, DJ_Q4, T - r, n_in, n_out, &without);
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
    static_assert(0 QGEMM_VARIANTS(QGEMM_COUNT) QGEMM_WG_VARIANTS(QGEMM_COUNT) QREG_VARIANTS(QGEMM_COUNT) ==
                      GPU_QGEMM_REG_END,
                  "kernels.h's GPU_QGEMM_REG_END: the register kernel's shapes end there");
    static_assert(GPU_QGEMM_REG_END QGEMM_WG_SK_VARIANTS(QGEMM_COUNT) QGEMM_WG_WS_VARIANTS(QGEMM_COUNT) ==
                      GPU_QGEMM_VARIANTS,
                  "kernels.h's GPU_QGEMM_VARIANTS counts the tile shapes");
    const int n_mma = 0 QGEMM_VARIANTS(QGEMM_COUNT), n_wg = 0 QGEMM_WG_VARIANTS(QGEMM_COUNT);
#undef QGEMM_COUNT
    const bool hopper = (variant >= n_mma && variant < n_mma + n_wg) || variant >= GPU_QGEMM_REG_END;
    return variant >= 0 && variant < GPU_QGEMM_VARIANTS && (!hopper || g->wgmma);
}

// Whether tile shape `variant` is the Hopper kernel's.
static bool wg_variant(int variant) {
#define QGEMM_WG_IS(id, ...) || variant == id
    return false QGEMM_WG_VARIANTS(QGEMM_WG_IS) QGEMM_WG_SK_VARIANTS(QGEMM_WG_IS) QGEMM_WG_WS_VARIANTS(QGEMM_WG_IS);
#undef QGEMM_WG_IS
}

// The scratch tile shape `variant` needs for T tokens: gpu_qgemm_scratch's, and stream-K's sums for its shapes (which
// take any T when asked for by name).
static int qgemm_reserve(dj_gpu *g, int variant, int64_t T, int64_t n_in, cudaStream_t s, dj_err *e) {
#define QGEMM_WG_SK(id, BN, ST, KS, XB, MINB, SK) || (variant == id && SK)
#define QGEMM_WS_SK(id, BN, ST, SK) || (variant == id && SK)
    const bool sk = false QGEMM_WG_SK_VARIANTS(QGEMM_WG_SK) QGEMM_WG_WS_VARIANTS(QGEMM_WS_SK);
#undef QGEMM_WG_SK
#undef QGEMM_WS_SK
    const size_t need = gpu_qgemm_scratch(T, n_in),
                 sk_need = wg_x_bytes(T, n_in) + QGEMM_SK_TICKET_BYTES + QGEMM_SK_PART_BYTES;
    return scratch_need(g, sk && sk_need > need ? sk_need : need, s, e);
}

// The Hopper kernel's shape `variant` on x laid out by lay (wg_lay_src, wg_lay_norm). PRECOND: the scratch reserved
// (qgemm_reserve).
template <class LAY>
static int wg_run(dj_gpu *g, int variant, float *y, const LAY &lay, const void *w, uint32_t wtype, int64_t T,
                  int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    __half *xp = (__half *)g->scratch;
    if (!g->wgmma) return dj_fail(e, "gpu_qgemm: tile shape %d needs an sm_90 device", variant);
#define QGEMM_WG_CASE(id, BN, ST, KS, XB, MINB, SK)                                                            \
    case id:                                                                                                     \
        return wtype == DJ_Q8                                                                                    \
                   ? qgemm_wg_launch<DJ_Q8, BN, ST, KS, XB, MINB, SK>(y, lay, xp, w, T, n_in, n_out, g->n_sm, s, e) \
                   : qgemm_wg_launch<DJ_Q4, BN, ST, KS, XB, MINB, SK>(y, lay, xp, w, T, n_in, n_out, g->n_sm, s, e);
#define QGEMM_WS_CASE(id, BN, ST, SK)                                                                            \
    case id:                                                                                                     \
        return wtype == DJ_Q8 ? qgemm_ws_launch<DJ_Q8, BN, ST, SK>(y, lay, xp, w, T, n_in, n_out, g->n_sm, s, e)  \
                              : qgemm_ws_launch<DJ_Q4, BN, ST, SK>(y, lay, xp, w, T, n_in, n_out, g->n_sm, s, e);
    switch (variant) {
        QGEMM_WG_VARIANTS(QGEMM_WG_CASE)
        QGEMM_WG_SK_VARIANTS(QGEMM_WG_CASE)
        QGEMM_WG_WS_VARIANTS(QGEMM_WS_CASE)
    default:
        return dj_fail(e, "gpu_qgemm: no Hopper tile shape %d", variant);
    }
#undef QGEMM_WG_CASE
#undef QGEMM_WS_CASE
}

static int qgemm_run(dj_gpu *g, int variant, float *y, const qgemm_src &x, const void *w, uint32_t wtype, int64_t T,
                     int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (!gpu_qgemm_ok(wtype, w, T, n_in, n_out))
        return dj_fail(e, "gpu_qgemm: unsupported: weights of dtype %u at %p, T=%lld n_in=%lld n_out=%lld", wtype, w,
                       (long long)T, (long long)n_in, (long long)n_out);
    if (variant < 0) variant = qgemm_pick(g, wtype, T, n_in, n_out);
    if (qgemm_reserve(g, variant, T, n_in, s, e)) return -1;
    __half *xp = (__half *)g->scratch;
#define QGEMM_CASE(id, BM, BN, WM, WN, ST)                                                                       \
    case id:                                                                                                    \
        return wtype == DJ_Q8 ? qgemm_launch<DJ_Q8, BM, BN, WM, WN, ST>(y, x, xp, w, T, n_in, n_out, s, e)          \
                              : qgemm_launch<DJ_Q4, BM, BN, WM, WN, ST>(y, x, xp, w, T, n_in, n_out, s, e);
    if (qreg_variant(variant))
        return qreg_run<qreg_lay_src>(g, "gpu_qgemm", variant, y, x, w, wtype, T, n_in, n_out, s, e);
    if (wg_variant(variant)) return wg_run(g, variant, y, wg_lay_src{x}, w, wtype, T, n_in, n_out, s, e);
    switch (variant) {
        QGEMM_VARIANTS(QGEMM_CASE)
    default:
        return dj_fail(e, "gpu_qgemm: no tile shape %d", variant);
    }
#undef QGEMM_CASE
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

// ---- the norm before the product inside the register kernel's x layout (qreg_norm_x_kernel)
// A token's normed row in f16 in the layout's shared memory: 32 KB at most, under the 48 KB a block has without
// opting in (16384: Llama-3-405B's dim).
#define QREG_NORM_MAX_IN 16384

// The shape gpu_norm_qgemm runs the pass on (the product's for T, qgemm_pick): the register kernel's, or past
// QGEMM_FEW_T tokens the Hopper kernel's; -1 where the pass is neither's.
static int norm_qgemm_shape(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out) {
    if (!gpu_qgemm_ok(wtype, w, T, n_in, n_out) || T < 2 || n_in > QREG_NORM_MAX_IN) return -1;
    const int variant = qgemm_pick(g, wtype, T, n_in, n_out);
    return qreg_variant(variant) || (T > QGEMM_FEW_T && wg_variant(variant)) ? variant : -1;
}

extern "C" int gpu_norm_qgemm_ok(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in,
                                 int64_t n_out) {
    return norm_qgemm_shape(g, wtype, w, T, n_in, n_out) >= 0 && T > gemv_tokens(g, wtype, w, n_in, n_out) &&
           gpu_qgemm_wins(g, wtype, w, T, n_in, n_out);
}

extern "C" int gpu_norm_qgemm(dj_gpu *g, float *y, const float *x, const float *delta, float *xo, const float *nw,
                              float eps, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out,
                              cudaStream_t s, dj_err *e) {
    const int variant = norm_qgemm_shape(g, wtype, w, T, n_in, n_out);
    if (variant < 0)
        return dj_fail(e, "gpu_norm_qgemm: not a pass of the register or the Hopper kernel: weights of dtype %u at %p, "
                          "T=%lld n_in=%lld (at most %d) n_out=%lld", wtype, w, (long long)T, (long long)n_in,
                       QREG_NORM_MAX_IN, (long long)n_out);
    if (xo == x || !xo) return dj_fail(e, "gpu_norm_qgemm: the residual's next buffer must not be x");
    if (qgemm_reserve(g, variant, T, n_in, s, e)) return -1;
    const qreg_norm_in in = {x, delta, xo, nw, eps};
    if (wg_variant(variant)) return wg_run(g, variant, y, wg_lay_norm{in}, w, wtype, T, n_in, n_out, s, e);
    return qreg_run<qreg_lay_norm>(g, "gpu_norm_qgemm", variant, y, in, w, wtype, T, n_in, n_out, s, e);
}

// Whether this device runs the Hopper kernel: compute capability 9.0 exactly (sm_90a code runs nowhere else).
int qgemm_setup(dj_gpu *g, dj_err *e) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, g->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, g->device));
    g->wgmma = major == 9 && minor == 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&g->n_sm, cudaDevAttrMultiProcessorCount, g->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&g->l2_bytes, cudaDevAttrL2CacheSize, g->device));
    return load_module_of(g, (const void *)qgemm_x_kernel, e);
}
