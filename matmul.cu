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
    return wtype == DJ_F32 ? 0 : (size_t)T * (size_t)n_in * (wtype == DJ_BF16 ? 4 : 2);
}

extern "C" int gpu_matmul_path(dj_gpu *g, int path, float *y, const float *x, const void *w, uint32_t wtype,
                               int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (wtype != DJ_F32 && wtype != DJ_F16 && wtype != DJ_BF16)
        return dj_fail(e, "gpu_matmul: unknown weight dtype %u", wtype);
    if (T < 0 || n_in < 1 || n_out < 1 || T > INT32_MAX || n_in > INT32_MAX || n_out > INT32_MAX)
        return dj_fail(e, "gpu_matmul: bad shape T=%lld n_in=%lld n_out=%lld", (long long)T, (long long)n_in,
                       (long long)n_out);
    if (T == 0) return 0;
    if (path == GPU_MM_AUTO) path = T == 1 ? GPU_MM_GEMV : GPU_MM_CUBLAS;
    switch (path) {
    case GPU_MM_GEMV:
        if (wtype == DJ_F32) return gemv_typed<DJ_F32>(y, x, w, T, n_in, n_out, s, e);
        if (wtype == DJ_F16) return gemv_typed<DJ_F16>(y, x, w, T, n_in, n_out, s, e);
        return gemv_typed<DJ_BF16>(y, x, w, T, n_in, n_out, s, e);
    case GPU_MM_CUBLAS:
        return matmul_cublas(g, y, x, w, wtype, T, n_in, n_out, s, e);
    default:
        return dj_fail(e, "gpu_matmul: unknown path %d", path);
    }
}

extern "C" int gpu_matmul(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                          int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    return gpu_matmul_path(g, GPU_MM_AUTO, y, x, w, wtype, T, n_in, n_out, s, e);
}
