// matmul.cu: y (T, n_out) f32 = x (T, n_in) f32 . W^T with W (n_out, n_in) row-major in the model's dtype:
// our GEMV (W read once with 16-byte loads, fp32 accumulation; the decode path) and the cuBLAS GEMM (x rounded
// to the weight dtype for the tensor cores; the prefill path), and gpu_matmul_path choosing between them.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string.h>

#include "kernels_impl.h"

// ---- weight loads: a 16-byte chunk of W holds VEC elements, unpacked to floats
template <int WT> struct wtraits;
template <> struct wtraits<DJ_F32> { static constexpr int VEC = 4, SIZE = 4; };
template <> struct wtraits<DJ_F16> { static constexpr int VEC = 8, SIZE = 2; };
template <> struct wtraits<DJ_BF16> { static constexpr int VEC = 8, SIZE = 2; };

__device__ __forceinline__ float2 pair_to_float2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }

// A 16-byte chunk of 16-bit weights as four pairs H2 (__half2 or __nv_bfloat162), widened to 8 floats.
template <typename H2> __device__ __forceinline__ void unpack16_pairs(uint4 v, float *f) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        H2 h;
        memcpy(&h, &u[i], 4);
        float2 p = pair_to_float2(h);
        f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
}

template <int WT> __device__ __forceinline__ void unpack16(uint4 v, float *f);
template <> __device__ __forceinline__ void unpack16<DJ_F32>(uint4 v, float *f) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
}
template <> __device__ __forceinline__ void unpack16<DJ_F16>(uint4 v, float *f) { unpack16_pairs<__half2>(v, f); }
template <> __device__ __forceinline__ void unpack16<DJ_BF16>(uint4 v, float *f) {
    unpack16_pairs<__nv_bfloat162>(v, f);
}

// W is read exactly once: stream it past L1 so x stays cached there.
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// ---- GEMV
#ifndef GEMV_WARPS
#define GEMV_WARPS 8   // rows per block: one warp per row
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4  // 16-byte loads in flight per lane
#endif

// y (T, n_out) = x (T, n_in) . W^T for NT rows of x per block (blockIdx.y), one row of W per warp.
// PRECOND: n_in % VEC == 0, W and x 16-byte aligned (so every row of both is).
template <int WT, int NT>
__global__ __launch_bounds__(GEMV_WARPS * 32) void gemv_vec_kernel(float *y, const float *x, const void *w,
                                                                  int64_t T, int64_t n_in, int64_t n_out) {
    constexpr int VEC = wtraits<WT>::VEC;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    if (row >= n_out) return;  // whole warp
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)min((int64_t)NT, T - t0);
    const uint4 *wr = (const uint4 *)((const char *)w + row * n_in * wtraits<WT>::SIZE);
    const int64_t nchunk = n_in / VEC;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t c0 = lane; c0 < nchunk; c0 += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            wv[u] = make_uint4(0, 0, 0, 0);
            if (c0 + 32 * u < nchunk) wv[u] = ld_stream(wr + c0 + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            const int64_t c = c0 + 32 * u;
            if (c >= nchunk) break;
            float wf[VEC];
            unpack16<WT>(wv[u], wf);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const float4 *xr = (const float4 *)(x + (t0 + t) * n_in) + c * (VEC / 4);
#pragma unroll
                for (int q = 0; q < VEC / 4; q++) {
                    float4 xv = __ldg(xr + q);
                    acc[t] += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z + wf[4 * q + 3] * xv.w;
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[(t0 + t) * n_out + row] = v;
    }
}

// Any n_in and alignment (e.g. n_in = 172 in f16): element loads, one row of x per blockIdx.y.
template <int WT>
__global__ __launch_bounds__(GEMV_WARPS * 32) void gemv_scalar_kernel(float *y, const float *x, const void *w,
                                                                     int64_t n_in, int64_t n_out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + warp, t = blockIdx.y;
    if (row >= n_out) return;
    const float *xr = x + t * n_in;
    float acc = 0.0f;
    for (int64_t i = lane; i < n_in; i += 32) acc += wload<WT>(w, row * n_in + i) * xr[i];
    acc = warp_sum(acc);
    if (lane == 0) y[t * n_out + row] = acc;
}

template <int WT, int NT>
static void launch_gemv_vec(float *y, const float *x, const void *w, int64_t T, int64_t n_in, int64_t n_out,
                            cudaStream_t s) {
    dim3 grid((unsigned)((n_out + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)((T + NT - 1) / NT));
    gemv_vec_kernel<WT, NT><<<grid, GEMV_WARPS * 32, 0, s>>>(y, x, w, T, n_in, n_out);
}

template <int WT>
static int gemv_typed(float *y, const float *x, const void *w, int64_t T, int64_t n_in, int64_t n_out,
                      cudaStream_t s, dj_err *e) {
    constexpr int VEC = wtraits<WT>::VEC;
    const int vec_ok = n_in % VEC == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (vec_ok && T == 1) {
        launch_gemv_vec<WT, 1>(y, x, w, T, n_in, n_out, s);
        LAUNCH_CHECK("gemv_vec<1>", s);
    } else if (vec_ok) {
        if ((T + 3) / 4 > 65535) return dj_fail(e, "gemv: T = %lld too large", (long long)T);
        launch_gemv_vec<WT, 4>(y, x, w, T, n_in, n_out, s);
        LAUNCH_CHECK("gemv_vec<4>", s);
    } else {
        if (T > 65535) return dj_fail(e, "gemv: T = %lld too large", (long long)T);
        dim3 grid((unsigned)((n_out + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)T);
        gemv_scalar_kernel<WT><<<grid, GEMV_WARPS * 32, 0, s>>>(y, x, w, n_in, n_out);
        LAUNCH_CHECK("gemv_scalar", s);
    }
    return 0;
}

template <int WT> __global__ void to_wtype_kernel(void *xb, void *xlo, const float *x, int64_t n);
static int blas_use_stream(dj_gpu *g, cudaStream_t s, dj_err *e);

// ---- quantized GEMV (q8, q4: model.h's rows)
// One warp per QROWS rows of W; lane l takes the rows' groups l, l + 32, ... (QUNROLL of them in flight), each
// group's 32 weights dequantized in registers, multiplied with x's 32 values and summed in fp32, the sum times
// the group's scale. A byte b becomes a float without an integer conversion: the float whose bits are
// 0x4B000000 | b is 2^23 + b, exactly (one byte permute and one subtraction per weight).
#define QROWS 2
#define QUNROLL 2

// The 4 bytes of word w (lowest first) as floats b - bias.
__device__ __forceinline__ void bytes_to_float4(uint32_t w, float bias, float *f) {
    f[0] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440)) - bias;
    f[1] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7441)) - bias;
    f[2] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7442)) - bias;
    f[3] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7443)) - bias;
}

// The dot of one group's 32 weights (q: its value bytes, 16 for q4 in two uint4s' first, 32 for q8) with xg (32).
template <int WT> __device__ __forceinline__ float group_dot(const uint4 *q, const float *xg) {
    float acc = 0.0f, f[4];
    if (WT == DJ_Q4) {  // byte j: weight j (low nibble) and j + 16 (high), each k + 8
        const uint32_t u[4] = {q[0].x, q[0].y, q[0].z, q[0].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            bytes_to_float4(u[i] & 0x0F0F0F0Fu, 8388616.0f, f);  // 2^23 + 8
#pragma unroll
            for (int b = 0; b < 4; b++) acc = fmaf(f[b], xg[4 * i + b], acc);
            bytes_to_float4((u[i] >> 4) & 0x0F0F0F0Fu, 8388616.0f, f);
#pragma unroll
            for (int b = 0; b < 4; b++) acc = fmaf(f[b], xg[16 + 4 * i + b], acc);
        }
    } else {  // int8 k: k ^ 0x80 is k + 128 as an unsigned byte
        const uint32_t u[8] = {q[0].x, q[0].y, q[0].z, q[0].w, q[1].x, q[1].y, q[1].z, q[1].w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            bytes_to_float4(u[i] ^ 0x80808080u, 8388736.0f, f);  // 2^23 + 128
#pragma unroll
            for (int b = 0; b < 4; b++) acc = fmaf(f[b], xg[4 * i + b], acc);
        }
    }
    return acc;
}

// y (T, n_out) = x (T, n_in) . W^T, W rows row_bytes apart; x row blockIdx.y.
// PRECOND: n_in % 32 == 0; W, x and row_bytes 16-byte aligned.
template <int WT>
__global__ __launch_bounds__(GEMV_WARPS * 32) void gemv_quant_kernel(float *y, const float *x, const uint8_t *w,
                                                                    int64_t n_in, int64_t n_out, int64_t row_bytes) {
    constexpr int QB = WT == DJ_Q8 ? DJ_QGROUP : DJ_QGROUP / 2, NV = QB / 16;  // value bytes, uint4s per group
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * QROWS, t = blockIdx.y;
    if (r0 >= n_out) return;  // whole warp
    const int64_t groups = n_in / DJ_QGROUP, so = groups * QB;
    const float *xr = x + t * n_in;
    float acc[QROWS];
#pragma unroll
    for (int r = 0; r < QROWS; r++) acc[r] = 0.0f;
    for (int64_t g0 = lane; g0 < groups; g0 += 32 * QUNROLL) {
        uint4 q[QUNROLL][QROWS][NV];
        float sc[QUNROLL][QROWS];
#pragma unroll
        for (int u = 0; u < QUNROLL; u++)
#pragma unroll
            for (int r = 0; r < QROWS; r++) {
                const int64_t g = g0 + 32 * u, row = r0 + r;
                const uint8_t *wr = w + row * row_bytes;
                const bool ok = g < groups && row < n_out;
#pragma unroll
                for (int v = 0; v < NV; v++) q[u][r][v] = ok ? ld_stream((const uint4 *)(wr + g * QB) + v) : make_uint4(0, 0, 0, 0);
                sc[u][r] = ok ? __half2float(*(const __half *)(wr + so + 2 * g)) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < QUNROLL; u++) {
            const int64_t g = g0 + 32 * u;
            if (g >= groups) break;
            float xg[DJ_QGROUP];
            const float4 *xv = (const float4 *)(xr + g * DJ_QGROUP);
#pragma unroll
            for (int i = 0; i < DJ_QGROUP / 4; i++) {
                const float4 v = __ldg(xv + i);
                xg[4 * i] = v.x, xg[4 * i + 1] = v.y, xg[4 * i + 2] = v.z, xg[4 * i + 3] = v.w;
            }
#pragma unroll
            for (int r = 0; r < QROWS; r++) acc[r] = fmaf(group_dot<WT>(q[u][r], xg), sc[u][r], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < QROWS; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < n_out) y[t * n_out + r0 + r] = v;
    }
}

// Any n_in (a partial last group) and alignment: element loads, one row of x per blockIdx.y.
template <int WT>
__global__ __launch_bounds__(GEMV_WARPS * 32) void gemv_quant_scalar_kernel(float *y, const float *x, const uint8_t *w,
                                                                           int64_t n_in, int64_t n_out,
                                                                           int64_t row_bytes) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * GEMV_WARPS + warp, t = blockIdx.y;
    if (row >= n_out) return;
    const float *xr = x + t * n_in;
    float acc = 0.0f;
    for (int64_t i = lane; i < n_in; i += 32) acc += qload<WT>(w + row * row_bytes, n_in, i) * xr[i];
    acc = warp_sum(acc);
    if (lane == 0) y[t * n_out + row] = acc;
}

template <int WT>
static int gemv_quant_typed(float *y, const float *x, const void *w, int64_t T, int64_t n_in, int64_t n_out,
                            cudaStream_t s, dj_err *e) {
    const int64_t rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    if (T > 65535) return dj_fail(e, "gemv: T = %lld too large", (long long)T);
    const uint8_t *wb = (const uint8_t *)w;
    if (n_in % DJ_QGROUP == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0) {
        const int64_t per_block = GEMV_WARPS * QROWS;
        dim3 grid((unsigned)((n_out + per_block - 1) / per_block), (unsigned)T);
        gemv_quant_kernel<WT><<<grid, GEMV_WARPS * 32, 0, s>>>(y, x, wb, n_in, n_out, rb);
        LAUNCH_CHECK("gemv_quant", s);
    } else {
        dim3 grid((unsigned)((n_out + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)T);
        gemv_quant_scalar_kernel<WT><<<grid, GEMV_WARPS * 32, 0, s>>>(y, x, wb, n_in, n_out, rb);
        LAUNCH_CHECK("gemv_quant_scalar", s);
    }
    return 0;
}

// ---- prefill with quantized weights: rows of W dequantized to f16 in chunks, each multiplied by cuBLAS
// QCHUNK bytes of f16 rows a chunk: small enough that the GEMM finds most of its chunk still in L2.
#define QCHUNK (16u << 20)

static int64_t qchunk_rows(int64_t n_in) {
    int64_t r = (int64_t)QCHUNK / (n_in * 2);
    return r < 16 ? 16 : r / 16 * 16;
}

// out (rows, n_in) f16 = rows of W (row_bytes apart), one thread per group: its values, widened exactly and
// rounded to f16 once (scale * k).
template <int WT>
__global__ void dequant_f16_kernel(__half *out, const uint8_t *w, int64_t rows, int64_t n_in, int64_t row_bytes) {
    constexpr int QB = WT == DJ_Q8 ? DJ_QGROUP : DJ_QGROUP / 2;
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * groups;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / groups, g = i - r * groups, c0 = g * DJ_QGROUP;
        const uint8_t *wr = w + r * row_bytes;
        const float sc = __half2float(*(const __half *)(wr + groups * QB + 2 * g));
        __half *o = out + r * n_in + c0;
        const int n = (int)min((int64_t)DJ_QGROUP, n_in - c0);
        if (n == DJ_QGROUP && (n_in & 7) == 0) {  // a whole group: four 16-byte stores
            __align__(16) __half h[DJ_QGROUP];
#pragma unroll
            for (int j = 0; j < DJ_QGROUP; j++) {
                const int k = WT == DJ_Q8 ? (int)(int8_t)wr[g * QB + j]
                                          : ((wr[g * QB + (j & 15)] >> (j < 16 ? 0 : 4)) & 15) - 8;
                h[j] = __float2half_rn(sc * (float)k);
            }
#pragma unroll
            for (int v = 0; v < 4; v++) ((uint4 *)o)[v] = ((const uint4 *)h)[v];
            continue;
        }
        for (int j = 0; j < n; j++) {
            const int k = WT == DJ_Q8 ? (int)(int8_t)wr[g * QB + j] : ((wr[g * QB + (j & 15)] >> (j < 16 ? 0 : 4)) & 15) - 8;
            o[j] = __float2half_rn(sc * (float)k);
        }
    }
}

// y = x . W^T for quantized W and T > 1: x rounded to f16 once, then per chunk of rows: dequantize, GEMM.
static int matmul_quant_cublas(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                               int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (scratch_need(g, gpu_matmul_scratch(wtype, T, n_in), s, e)) return -1;
    const int64_t n = T * n_in, rb = (int64_t)dj_row_bytes(wtype, (uint64_t)n_in), cr = qchunk_rows(n_in);
    __half *xb = (__half *)g->scratch, *wd = xb + (n + 127) / 128 * 128;
    to_wtype_kernel<DJ_F16><<<grid_1d(n, 256), 256, 0, s>>>(xb, NULL, x, n);
    LAUNCH_CHECK("to_wtype", s);
    if (blas_use_stream(g, s, e)) return -1;
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t r0 = 0; r0 < n_out; r0 += cr) {
        const int64_t rows = n_out - r0 < cr ? n_out - r0 : cr;
        const uint8_t *wr = (const uint8_t *)w + r0 * rb;
        const int64_t work = rows * ((n_in + DJ_QGROUP - 1) / DJ_QGROUP);
        if (wtype == DJ_Q8) dequant_f16_kernel<DJ_Q8><<<grid_1d(work, 256), 256, 0, s>>>(wd, wr, rows, n_in, rb);
        else dequant_f16_kernel<DJ_Q4><<<grid_1d(work, 256), 256, 0, s>>>(wd, wr, rows, n_in, rb);
        LAUNCH_CHECK("dequant_f16", s);
        CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)n_in, &alpha, wd,
                                  CUDA_R_16F, (int)n_in, xb, CUDA_R_16F, (int)n_in, &beta, y + r0, CUDA_R_32F,
                                  (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
}

// ---- cuBLAS GEMM
// xb (n) in wtype = x (n) f32, round to nearest even. For bf16 also xlo (n) = bf16(x - xb): bf16's 8-bit
// mantissa alone loses ~2e-3 of each activation, which compounds past the 1e-2 logit tolerance over a
// model; hi + lo carries 16 bits, at the price of a second GEMM.
template <int WT>
__global__ void to_wtype_kernel(void *xb, void *xlo, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (WT == DJ_F16) {
            ((__half *)xb)[i] = __float2half_rn(x[i]);
        } else {
            __nv_bfloat16 hi = __float2bfloat16_rn(x[i]);
            ((__nv_bfloat16 *)xb)[i] = hi;
            ((__nv_bfloat16 *)xlo)[i] = __float2bfloat16_rn(x[i] - __bfloat162float(hi));
        }
    }
}

static cudaDataType_t cuda_dtype(uint32_t wtype) {
    return wtype == DJ_F16 ? CUDA_R_16F : wtype == DJ_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// x in the operand dtype cuBLAS multiplies W with: x itself for f32, else a rounded copy in scratch; for
// bf16 also *xlo, the rounding residual (NULL otherwise).
static int blas_operand(dj_gpu *g, const void **xb, const void **xlo, const float *x, uint32_t wtype, int64_t T,
                        int64_t n_in, cudaStream_t s, dj_err *e) {
    *xb = x, *xlo = NULL;
    if (wtype == DJ_F32) return 0;
    if (scratch_need(g, gpu_matmul_scratch(wtype, T, n_in), s, e)) return -1;
    int64_t n = T * n_in;
    void *lo = (char *)g->scratch + (size_t)n * 2;
    if (wtype == DJ_F16)
        to_wtype_kernel<DJ_F16><<<grid_1d(n, 256), 256, 0, s>>>(g->scratch, NULL, x, n);
    else
        to_wtype_kernel<DJ_BF16><<<grid_1d(n, 256), 256, 0, s>>>(g->scratch, lo, x, n);
    LAUNCH_CHECK("to_wtype", s);
    *xb = g->scratch;
    if (wtype == DJ_BF16) *xlo = lo;
    return 0;
}

static int blas_use_stream(dj_gpu *g, cudaStream_t s, dj_err *e) {
    // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
    CUBLAS_CHECK(cublasSetStream(g->blas, s));
    CUBLAS_CHECK(cublasSetWorkspace(g->blas, g->workspace, GPU_WORKSPACE));
    return 0;
}

// Row-major y (T, n_out) = x (T, n_in) . W^T is, in cuBLAS's column-major terms, y^T (n_out x T) =
// op_T(W_cm (n_in x n_out)) . x^T_cm (n_in x T): A = W with lda = n_in transposed, B = x with ldb = n_in.
static int matmul_cublas(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                         int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    const void *xb, *xlo;
    if (blas_operand(g, &xb, &xlo, x, wtype, T, n_in, s, e)) return -1;
    if (blas_use_stream(g, s, e)) return -1;
    const float alpha = 1.0f, beta = 0.0f, one = 1.0f;
    cudaDataType_t dt = cuda_dtype(wtype);
    CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)T, (int)n_in, &alpha, w, dt,
                              (int)n_in, xb, dt, (int)n_in, &beta, y, CUDA_R_32F, (int)n_out, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    if (xlo)  // y += W . lo (bf16 residual)
        CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)T, (int)n_in, &alpha, w, dt,
                                  (int)n_in, xlo, dt, (int)n_in, &one, y, CUDA_R_32F, (int)n_out,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

// ---- dispatch
extern "C" size_t gpu_matmul_scratch(uint32_t wtype, int64_t T, int64_t n_in) {
    if (dj_is_quant(wtype))  // x in f16, then a chunk of dequantized rows
        return ((size_t)T * (size_t)n_in + 127) / 128 * 128 * 2 + (size_t)qchunk_rows(n_in) * (size_t)n_in * 2;
    return wtype == DJ_F32 ? 0 : (size_t)T * (size_t)n_in * (wtype == DJ_BF16 ? 4 : 2);
}

extern "C" int gpu_matmul_path(dj_gpu *g, int path, float *y, const float *x, const void *w, uint32_t wtype,
                               int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (!dj_row_bytes(wtype, 1)) return dj_fail(e, "gpu_matmul: unknown weight dtype %u", wtype);
    if (T < 0 || n_in < 1 || n_out < 1 || T > INT32_MAX || n_in > INT32_MAX || n_out > INT32_MAX)
        return dj_fail(e, "gpu_matmul: bad shape T=%lld n_in=%lld n_out=%lld", (long long)T, (long long)n_in,
                       (long long)n_out);
    if (T == 0) return 0;
    if (path == GPU_MM_AUTO) path = T == 1 ? GPU_MM_GEMV : GPU_MM_CUBLAS;
    switch (path) {
    case GPU_MM_GEMV:
        if (wtype == DJ_Q8) return gemv_quant_typed<DJ_Q8>(y, x, w, T, n_in, n_out, s, e);
        if (wtype == DJ_Q4) return gemv_quant_typed<DJ_Q4>(y, x, w, T, n_in, n_out, s, e);
        if (wtype == DJ_F32) return gemv_typed<DJ_F32>(y, x, w, T, n_in, n_out, s, e);
        if (wtype == DJ_F16) return gemv_typed<DJ_F16>(y, x, w, T, n_in, n_out, s, e);
        return gemv_typed<DJ_BF16>(y, x, w, T, n_in, n_out, s, e);
    case GPU_MM_CUBLAS:
        if (dj_is_quant(wtype)) return matmul_quant_cublas(g, y, x, w, wtype, T, n_in, n_out, s, e);
        return matmul_cublas(g, y, x, w, wtype, T, n_in, n_out, s, e);
    default:
        return dj_fail(e, "gpu_matmul: unknown path %d", path);
    }
}

extern "C" int gpu_matmul(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                          int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    return gpu_matmul_path(g, GPU_MM_AUTO, y, x, w, wtype, T, n_in, n_out, s, e);
}
