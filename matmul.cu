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
// A lane takes 16-byte chunks of a row's values (q4: one group of 32 weights; q8: half a group, 16 weights), the
// warp's lanes consecutive chunks (512 contiguous bytes a load), NR rows a warp sharing each x value. x is staged
// in shared memory a tile at a time, a chunk's E floats padded to E + 4: lane l then reads its float4s at bank
// 4 * l (mod 32), so the eight lanes of each 128-bit phase never collide (read from global memory, lanes 64 or
// 128 bytes apart cost one cache line each per load, which capped the kernel at half the HBM bandwidth). A byte b
// becomes a float without an integer conversion: the float whose bits are 0x4B000000 | b is 2^23 + b, exactly
// (one byte permute and one subtraction per weight).
#define QG_WARPS 8     // warps a block
#define QG_TILE 8192   // x elements staged at a time (a multiple of 32)
#define QG_UNROLL 4    // chunks in flight per lane and row
#define QG_ROWS 2      // rows a warp

// The 4 bytes of word w (lowest first) as floats b - bias.
__device__ __forceinline__ void bytes_to_float4(uint32_t w, float bias, float *f) {
    f[0] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440)) - bias;
    f[1] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7441)) - bias;
    f[2] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7442)) - bias;
    f[3] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7443)) - bias;
}

// The dot of one 16-byte chunk's weights with xc (q4: 32 floats, byte j holding weight j (low nibble) and j + 16
// (high), each k + 8; q8: 16 floats, int8 k).
template <int WT> __device__ __forceinline__ float chunk_dot(uint4 q, const float *xc) {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    float A = 0.0f, f[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (WT == DJ_Q4) {
            bytes_to_float4(u[i] & 0x0F0F0F0Fu, 8388616.0f, f);  // 2^23 + 8
#pragma unroll
            for (int b = 0; b < 4; b++) A = fmaf(f[b], xc[4 * i + b], A);
            bytes_to_float4((u[i] >> 4) & 0x0F0F0F0Fu, 8388616.0f, f);
#pragma unroll
            for (int b = 0; b < 4; b++) A = fmaf(f[b], xc[16 + 4 * i + b], A);
        } else {  // int8 k: k ^ 0x80 is k + 128 as an unsigned byte
            bytes_to_float4(u[i] ^ 0x80808080u, 8388736.0f, f);  // 2^23 + 128
#pragma unroll
            for (int b = 0; b < 4; b++) A = fmaf(f[b], xc[4 * i + b], A);
        }
    }
    return A;
}

// acc[r] += scale[r] * (row r's chunk q[r] . the chunk's x), x read from shared memory (E floats at xc, 16-byte
// aligned) once for all NR rows.
template <int WT, int NR>
__device__ __forceinline__ void chunk_rows(float *acc, const float *xc, const uint4 *q, const float *scale) {
    constexpr int E = q_chunk_weights(WT);
    float xv[E];
#pragma unroll
    for (int v = 0; v < E / 4; v++) {
        const float4 f = ((const float4 *)xc)[v];
        xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
    }
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = fmaf(chunk_dot<WT>(q[r], xv), scale[r], acc[r]);
}

// xs = x's chunks c0 .. c1 (E floats each), chunk c at (c - c0) * (E + 4): the padding puts lane l's float4 reads
// at bank 4 * l (mod 32). Every thread of the block takes part.
template <int WT> __device__ __forceinline__ void stage_x(float *xs, const float *x, int64_t c0, int64_t c1) {
    constexpr int E = q_chunk_weights(WT);
    const float4 *xr = (const float4 *)x + c0 * (E / 4);
    for (int64_t i = threadIdx.x; i < (c1 - c0) * (E / 4); i += blockDim.x) {
        const int64_t ch = i / (E / 4), j = i - ch * (E / 4);
        *(float4 *)(xs + ch * (E + 4) + 4 * j) = __ldg(xr + i);
    }
}

// q[u][r], sc[u][r] = chunk c + 32u of row wr[r] (values, 16 bytes) and its group's scale, for the chunks below
// end; zeros past it. so: the scales' offset in a row.
template <int WT, int U, int NR>
__device__ __forceinline__ void load_chunks(uint4 (*q)[NR], float (*sc)[NR], const uint8_t *const *wr, int64_t c,
                                            int64_t end, int64_t so) {
    constexpr int E = q_chunk_weights(WT);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t cc = c + 32 * u;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            q[u][r] = cc < end ? ld_stream((const uint4 *)(wr[r] + cc * 16)) : make_uint4(0, 0, 0, 0);
            sc[u][r] = cc < end ? __half2float(*(const __half *)(wr[r] + so + 2 * (cc * E / DJ_QGROUP))) : 0.0f;
        }
    }
}

// y (T, n_out) = x (T, n_in) . W^T, W rows row_bytes apart; x row blockIdx.y. The first weights are loaded before x
// is staged, and each tile's last chunks before the next tile's x, so the staging hides behind loads in flight.
// PRECOND: n_in % 32 == 0; W and row_bytes 16-byte aligned, x 16-byte aligned; blockDim.x == QG_WARPS * 32.
template <int WT>
__global__ __launch_bounds__(QG_WARPS * 32) void gemv_quant_kernel(float *y, const float *x, const uint8_t *w,
                                                                  int64_t n_in, int64_t n_out, int64_t row_bytes) {
    constexpr int E = q_chunk_weights(WT), STRIDE = E + 4, TC = QG_TILE / E;  // weights a chunk, chunks a tile
    __shared__ __align__(16) float xs[TC * STRIDE];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * QG_WARPS + warp) * QG_ROWS, t = blockIdx.y;
    const bool active = r0 < n_out;  // every warp stages x and meets the barriers
    const int64_t nc = n_in / E, so = n_in / DJ_QGROUP * q_group_bytes(WT);  // chunks a row, the scales' offset
    const uint8_t *wr[QG_ROWS];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) wr[r] = w + min(r0 + r, n_out - 1) * row_bytes;  // past the end: unused
    float acc[QG_ROWS];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) acc[r] = 0.0f;
    uint4 q[QG_UNROLL][QG_ROWS];
    float sc[QG_UNROLL][QG_ROWS];
    // chunks c + 32u of the tile that holds c, up to that tile's end
    auto load = [&](int64_t c) { load_chunks<WT, QG_UNROLL, QG_ROWS>(q, sc, wr, c, min((c / TC + 1) * TC, nc), so); };
    int64_t c = lane;
    if (active && c < nc) load(c);
    for (int64_t t0 = 0; t0 < nc; t0 += TC) {
        const int64_t te = min(t0 + TC, nc);
        __syncthreads();  // the previous tile's reads are done
        stage_x<WT>(xs, x + t * n_in, t0, te);
        __syncthreads();
        if (!active) continue;
        while (c < te) {
            int64_t cn = c + 32 * QG_UNROLL;
            if (cn >= te) cn = te + lane;  // the next tile's first chunks
#pragma unroll
            for (int u = 0; u < QG_UNROLL; u++) {
                if (c + 32 * u >= te) break;
                chunk_rows<WT, QG_ROWS>(acc, xs + (c + 32 * u - t0) * STRIDE, q[u], sc[u]);
            }
            c = cn;
            if (c < nc) load(c);
        }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < n_out) y[t * n_out + r0 + r] = v;
    }
}

// The same product for n_in <= QP_MAX, with x staged once: a grid of as many blocks as fit the device at once,
// each warp taking row groups rg, rg + (warps in the grid), ... and loading the next chunks (of this row group
// or of the next) before computing the current ones, so loads stay in flight across rows. Matrices of a few
// MB are then not dominated by each block's start (staging x, the first loads' latency).
// PRECOND: as gemv_quant_kernel; n_in <= QP_MAX; dynamic shared memory qp_smem(WT, n_in) bytes.
#define QP_MAX 16384  // x's largest n_in (q8: 80 KB of shared memory)
#define QP_WARPS 8
#define QP_UNROLL 4    // chunks in flight per lane, twice: the current ones and the next
#define QP_ROWS 1      // rows a warp (2 and 4, and 4 warps a block, measured slower on the H100)
static size_t qp_smem(uint32_t wt, int64_t n_in) {
    const int64_t E = q_chunk_weights(wt);
    return (size_t)(n_in / E) * (size_t)(E + 4) * sizeof(float);
}

template <int WT>
__global__ __launch_bounds__(QP_WARPS * 32) void gemv_quant_persist_kernel(float *y, const float *x, const uint8_t *w,
                                                                          int64_t n_in, int64_t n_out,
                                                                          int64_t row_bytes) {
    constexpr int E = q_chunk_weights(WT), STRIDE = E + 4;
    extern __shared__ float4 xs4[];
    float *xs = (float *)xs4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t = blockIdx.y, nc = n_in / E, nrg = (n_out + QP_ROWS - 1) / QP_ROWS;
    const int64_t so = n_in / DJ_QGROUP * q_group_bytes(WT), step = (int64_t)gridDim.x * QP_WARPS;
    uint4 q[QP_UNROLL][QP_ROWS], qn[QP_UNROLL][QP_ROWS];
    float sc[QP_UNROLL][QP_ROWS], scn[QP_UNROLL][QP_ROWS];
    // chunks c + 32u of row group rg
    auto load = [&](int64_t rg, int64_t c, uint4 (*qq)[QP_ROWS], float (*ss)[QP_ROWS]) {
        const uint8_t *wr[QP_ROWS];  // rows past the end: the last, unused
#pragma unroll
        for (int r = 0; r < QP_ROWS; r++) wr[r] = w + min(rg * QP_ROWS + r, n_out - 1) * row_bytes;
        load_chunks<WT, QP_UNROLL, QP_ROWS>(qq, ss, wr, c, nc, so);
    };
    int64_t rg = (int64_t)blockIdx.x * QP_WARPS + warp, c = lane;
    if (rg < nrg) load(rg, c, q, sc);
    stage_x<WT>(xs, x + t * n_in, 0, nc);
    __syncthreads();
    float acc[QP_ROWS];
#pragma unroll
    for (int r = 0; r < QP_ROWS; r++) acc[r] = 0.0f;
    while (rg < nrg) {
        int64_t rgn = rg, cn = c + 32 * QP_UNROLL;
        if (cn >= nc) rgn = rg + step, cn = lane;
        if (rgn < nrg) load(rgn, cn, qn, scn);
#pragma unroll
        for (int u = 0; u < QP_UNROLL; u++) {
            if (c + 32 * u >= nc) break;
            chunk_rows<WT, QP_ROWS>(acc, xs + (c + 32 * u) * STRIDE, q[u], sc[u]);
        }
        if (rgn != rg) {  // row group done
#pragma unroll
            for (int r = 0; r < QP_ROWS; r++) {
                const float v = warp_sum(acc[r]);
                if (lane == 0 && rg * QP_ROWS + r < n_out) y[t * n_out + rg * QP_ROWS + r] = v;
                acc[r] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < QP_UNROLL; u++)
#pragma unroll
            for (int r = 0; r < QP_ROWS; r++) q[u][r] = qn[u][r], sc[u][r] = scn[u][r];
        rg = rgn, c = cn;
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
static int gemv_quant_typed(dj_gpu *g, float *y, const float *x, const void *w, int64_t T, int64_t n_in,
                            int64_t n_out, cudaStream_t s, dj_err *e) {
    const int64_t rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    if (T > 65535) return dj_fail(e, "gemv: T = %lld too large", (long long)T);
    const uint8_t *wb = (const uint8_t *)w;
    const int vec_ok = n_in % DJ_QGROUP == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (vec_ok && n_in <= QP_MAX) {
        const int64_t nrg = (n_out + QP_ROWS - 1) / QP_ROWS, need = (nrg + QP_WARPS - 1) / QP_WARPS;
        const int fit = g->qp_blocks[WT == DJ_Q8 ? 0 : 1];
        dim3 grid((unsigned)(need < fit ? need : fit), (unsigned)T);
        gemv_quant_persist_kernel<WT><<<grid, QP_WARPS * 32, qp_smem(WT, n_in), s>>>(y, x, wb, n_in, n_out, rb);
        LAUNCH_CHECK("gemv_quant_persist", s);
    } else if (vec_ok) {
        const int64_t per_block = QG_WARPS * QG_ROWS;
        dim3 grid((unsigned)((n_out + per_block - 1) / per_block), (unsigned)T);
        gemv_quant_kernel<WT><<<grid, QG_WARPS * 32, 0, s>>>(y, x, wb, n_in, n_out, rb);
        LAUNCH_CHECK("gemv_quant", s);
    } else {
        dim3 grid((unsigned)((n_out + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)T);
        gemv_quant_scalar_kernel<WT><<<grid, GEMV_WARPS * 32, 0, s>>>(y, x, wb, n_in, n_out, rb);
        LAUNCH_CHECK("gemv_quant_scalar", s);
    }
    return 0;
}

// ---- prefill with quantized weights: rows of W dequantized to f16 in chunks, each multiplied by cuBLAS
// QCHUNK bytes of f16 rows a chunk, in multiples of 128 rows: measured on the H100 (Llama-3-8B shapes, T = 512),
// 16 MB chunks left the GEMM too few tiles per wave (428 against 317 us for 28672 x 4096 in q8); 256 MB gained
// nothing more.
#define QCHUNK (64u << 20)

static int64_t qchunk_rows(int64_t n_in) {
    int64_t r = (int64_t)QCHUNK / (n_in * 2);
    return r < 128 ? 128 : r / 128 * 128;
}

// out (rows, n_in) f16 = rows of W (row_bytes apart), each weight widened exactly and rounded to f16 once
// (scale * k). n_in % 32 == 0: one thread per 16-byte chunk of values (one 16-byte load, its E weights stored 16
// bytes at a time); otherwise one thread per group, byte by byte.
template <int WT>
__global__ void dequant_f16_kernel(__half *out, const uint8_t *w, int64_t rows, int64_t n_in, int64_t row_bytes) {
    constexpr int QB = q_group_bytes(WT), E = q_chunk_weights(WT);
    const int64_t groups = (n_in + DJ_QGROUP - 1) / DJ_QGROUP;
    if (n_in % DJ_QGROUP == 0) {
        const int64_t chunks = n_in / E;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * chunks;
             i += (int64_t)gridDim.x * blockDim.x) {
            const int64_t r = i / chunks, c = i - r * chunks;
            const uint8_t *wr = w + r * row_bytes;
            const uint4 q = *(const uint4 *)(wr + c * 16);
            const float sc = __half2float(*(const __half *)(wr + groups * QB + 2 * (c * E / DJ_QGROUP)));
            const uint32_t u[4] = {q.x, q.y, q.z, q.w};
            __align__(16) __half h[E];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const uint32_t b = (u[j / 4] >> (8 * (j % 4))) & 0xFFu;
                if (WT == DJ_Q8) {
                    h[j] = __float2half_rn(sc * (float)(int)(int8_t)b);
                } else {
                    h[j] = __float2half_rn(sc * (float)((int)(b & 15u) - 8));
                    h[j + 16] = __float2half_rn(sc * (float)((int)(b >> 4) - 8));
                }
            }
            uint4 *o = (uint4 *)(out + r * n_in + c * E);
#pragma unroll
            for (int v = 0; v < E / 8; v++) o[v] = ((const uint4 *)h)[v];
        }
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * groups;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / groups, g = i - r * groups, c0 = g * DJ_QGROUP;
        const uint8_t *wr = w + r * row_bytes;
        const float sc = __half2float(*(const __half *)(wr + groups * QB + 2 * g));
        __half *o = out + r * n_in + c0;
        const int n = (int)min((int64_t)DJ_QGROUP, n_in - c0);
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
        const int64_t work = n_in % DJ_QGROUP ? rows * ((n_in + DJ_QGROUP - 1) / DJ_QGROUP)
                                              : rows * (n_in / q_chunk_weights(wtype));
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
        if (wtype == DJ_Q8) return gemv_quant_typed<DJ_Q8>(g, y, x, w, T, n_in, n_out, s, e);
        if (wtype == DJ_Q4) return gemv_quant_typed<DJ_Q4>(g, y, x, w, T, n_in, n_out, s, e);
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

// ---- set-up, run once by gpu_open
// The persistent quantized GEMV's shared memory (x of up to QP_MAX elements) and its grid: as many blocks as the
// device holds at once.
template <int WT> static int qp_setup_one(dj_gpu *g, int *blocks, dj_err *e) {
    const int smem = (int)qp_smem(WT, QP_MAX);
    CUDA_CHECK(cudaFuncSetAttribute(gemv_quant_persist_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0, sms = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_quant_persist_kernel<WT>, QP_WARPS * 32,
                                                             (size_t)smem));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g->device));
    if (per_sm < 1)
        return dj_fail(e, "cuda: %s cannot run the quantized GEMV (%d bytes of shared memory)", g->name, smem);
    *blocks = per_sm * sms;
    return 0;
}

int matmul_setup(dj_gpu *g, dj_err *e) {
    return qp_setup_one<DJ_Q8>(g, &g->qp_blocks[0], e) || qp_setup_one<DJ_Q4>(g, &g->qp_blocks[1], e) ? -1 : 0;
}
