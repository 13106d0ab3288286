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
#define GEMV_WARPS 8   // rows per block: one warp per row
#define GEMV_UNROLL 4  // 16-byte loads in flight per lane

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
// (high), each k in 0..15, the sum of (4 k - c) x; q8: 16 floats, int8 k, the sum of (k - (4 c - 128)) x).
template <int WT> __device__ __forceinline__ float chunk_dot(uint4 q, const float *xc, float c) {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    float A = 0.0f, f[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (WT == DJ_Q4) {  // 4 k - c: small integers, exact
            bytes_to_float4(u[i] & 0x0F0F0F0Fu, 8388608.0f, f);  // 2^23
#pragma unroll
            for (int b = 0; b < 4; b++) A = fmaf(fmaf(f[b], 4.0f, -c), xc[4 * i + b], A);
            bytes_to_float4((u[i] >> 4) & 0x0F0F0F0Fu, 8388608.0f, f);
#pragma unroll
            for (int b = 0; b < 4; b++) A = fmaf(fmaf(f[b], 4.0f, -c), xc[16 + 4 * i + b], A);
        } else {  // int8 k: k ^ 0x80 is k + 128 as an unsigned byte, less 2^23 + 4 c: k - z, exact
            bytes_to_float4(u[i] ^ 0x80808080u, 8388608.0f + 4.0f * c, f);
#pragma unroll
            for (int b = 0; b < 4; b++) A = fmaf(f[b], xc[4 * i + b], A);
        }
    }
    return A;
}

// A chunk's group parameter p (model.h; 0 past a row's end) as the scale its products take: q8 its scale, q4 a
// quarter of it (the products are of 4 k - c).
template <int WT> __device__ __forceinline__ float chunk_scale(uint32_t p) {
    return WT == DJ_Q8 ? q_scale(p) : 0.25f * q_scale(p);
}

// acc[r] += row r's chunk q[r] . the chunk's x, scaled by its parameter pm[r], x read from shared memory (E floats
// at xc, 16-byte aligned) once for all NR rows.
template <int WT, int NR>
__device__ __forceinline__ void chunk_rows(float *acc, const float *xc, const uint4 *q, const uint32_t *pm) {
    constexpr int E = q_chunk_weights(WT);
    float xv[E];
#pragma unroll
    for (int v = 0; v < E / 4; v++) {
        const float4 f = ((const float4 *)xc)[v];
        xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = fmaf(chunk_dot<WT>(q[r], xv, (float)(pm[r] >> 10)), chunk_scale<WT>(pm[r]), acc[r]);
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

// q[u][r], pm[u][r] = chunk c + 32u of row wr[r] (values, 16 bytes) and its group's parameter, for the chunks
// below end; zeros past it (a parameter of 0 is a scale of 0). so: the parameters' offset in a row.
template <int WT, int U, int NR>
__device__ __forceinline__ void load_chunks(uint4 (*q)[NR], uint32_t (*pm)[NR], const uint8_t *const *wr, int64_t c,
                                            int64_t end, int64_t so) {
    constexpr int E = q_chunk_weights(WT);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t cc = c + 32 * u;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            q[u][r] = cc < end ? ld_stream((const uint4 *)(wr[r] + cc * 16)) : make_uint4(0, 0, 0, 0);
            pm[u][r] = cc < end ? *(const uint16_t *)(wr[r] + so + 2 * (cc * E / DJ_QGROUP)) : 0u;
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
    uint32_t pm[QG_UNROLL][QG_ROWS];
    // chunks c + 32u of the tile that holds c, up to that tile's end
    auto load = [&](int64_t c) { load_chunks<WT, QG_UNROLL, QG_ROWS>(q, pm, wr, c, min((c / TC + 1) * TC, nc), so); };
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
                chunk_rows<WT, QG_ROWS>(acc, xs + (c + 32 * u - t0) * STRIDE, q[u], pm[u]);
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

// The same product for n_in <= QP_MAX in integers, as the CPU share sums it (cpu.c): x is quantized per group of
// 32 in two int8 parts, x ~= d * (254 * hi + lo) with d = max|x| / (127 * 254) (~1/64516 of the group's largest
// magnitude), so a chunk's dot with its k is dp4a instructions (four byte products a lane each) where the float
// path spends a conversion, a subtraction and an FMA on every weight. Each block quantizes x into shared memory,
// one record per 16-byte chunk of weights: hi[E], lo[E], then {d, sum, 0, 0}, where sum = sum(254 hi + lo) over
// the chunk's inputs takes off the zero point (q4: 4 sum (k - c / 4) X = 4 sum k X - c sum; q8: sum (k - z) X =
// sum k X - z sum). Records are
// QR_BYTES = 2E + 16 bytes apart (q4 80, q8 48): lane l's 16-byte reads start at bank 20l or 12l (mod 32), so
// the eight lanes of each 128-bit phase never collide. The grid is QP_BPS blocks per SM, each warp taking row
// groups rg, rg + (warps in the grid), ... and loading the next chunks (of this row or of the next) before
// computing the current ones, so loads stay in flight across rows; few blocks keep x's quantization, which every
// block repeats, small beside the rows each block reads.
// PRECOND: as gemv_quant_kernel; n_in <= QP_MAX; dynamic shared memory qp_smem(WT, n_in) bytes.
#define QP_MAX 32768  // x's largest n_in (q8: 96 KB of shared memory)
#define QP_WARPS 16
#define QP_BPS 1       // blocks a streaming multiprocessor
#define QP_UNROLL 4    // chunks of each row in flight per lane, twice: the current ones and the next
static __host__ __device__ constexpr int qr_bytes(uint32_t wt) { return 2 * q_chunk_weights(wt) + 16; }
static size_t qp_smem(uint32_t wt, int64_t n_in) {
    return (size_t)(n_in / q_chunk_weights(wt)) * (size_t)qr_bytes(wt);
}

// Four int8 values, lowest first, as one word.
__device__ __forceinline__ uint32_t pack_i8x4(int a, int b, int c, int d) {
    return (uint32_t)(a & 0xFF) | (uint32_t)(b & 0xFF) << 8 | (uint32_t)(c & 0xFF) << 16 | (uint32_t)d << 24;
}

// What the persistent kernel multiplies W with, for row t of its input: x itself (QX_PLAIN), silu(x) * b (QX_SWIGLU:
// the down projection with gpu_swiglu fused, as gpu_swiglu computes it) or rmsnorm(x + b) * nw (QX_NORM: the
// residual add and the norm before q|k|v and gate|up fused, as gpu_add_rmsnorm computes them; b NULL: no add; the
// blocks of column 0 write x + b, or x, to xo, the residual stream's next buffer, which must not alias x). Rows of x,
// b and xo are ld floats apart.
enum { QX_PLAIN, QX_SWIGLU, QX_NORM };
struct qx_in {
    const float *x, *b, *nw;
    float *xo;
    float eps;
    int64_t ld;
};

// The values i0 .. i0 + 3 of the input (row xr, b's row br), the norm's scale applied.
// xo: the row of in.xo this block writes x + b to (QX_NORM), NULL for none.
template <int MODE>
__device__ __forceinline__ void qx_load4(const qx_in &in, const float *xr, const float *br, int64_t i0, float scale,
                                         float *xo, float *v) {
    const float4 f = __ldg((const float4 *)(xr + i0));
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    if (MODE == QX_SWIGLU) {
        const float4 u = __ldg((const float4 *)(br + i0));
        const float uu[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = silu_mul(v[j], uu[j]);
    } else if (MODE == QX_NORM) {
        if (in.b) {
            const float4 d = __ldg((const float4 *)(br + i0));
            v[0] += d.x, v[1] += d.y, v[2] += d.z, v[3] += d.w;
        }
        if (xo) *(float4 *)(xo + i0) = make_float4(v[0], v[1], v[2], v[3]);
        const float4 w = __ldg((const float4 *)(in.nw + i0));
        v[0] = v[0] * scale * w.x, v[1] = v[1] * scale * w.y, v[2] = v[2] * scale * w.z, v[3] = v[3] * scale * w.w;
    }
}

// QX_NORM's scale, 1 / sqrt(mean((x + b)^2) + eps), over the block (every thread gets it); 1 otherwise.
template <int MODE> __device__ __forceinline__ float qx_scale(const qx_in &in, const float *xr, const float *br,
                                                              int64_t n) {
    if (MODE != QX_NORM) return 1.0f;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i] + (in.b ? br[i] : 0.0f);
        ss += v * v;
    }
    ss = block_sum(ss);
    return 1.0f / sqrtf(ss / (float)n + in.eps);
}

// The larger of a and b, NaN where either is (fmaxf takes the other).
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Eight values v of the input (lane's quarter of group g; on: they exist) quantized into their record at rec: the
// four adjacent lanes of a group reduce its largest magnitude (and for q4 its sum) by shuffles, so every lane of the
// warp must call it (on or not). It gives cpu.c's (simd_quant_x) hi, lo and d for every input, so both engines see
// the same records; the group's largest magnitude and sum are exact whatever the order.
template <int WT> __device__ __forceinline__ void quant_eight(uint8_t *rec, int64_t g, int quarter, bool on, const float *v) {
    constexpr int E = q_chunk_weights(WT), RB = qr_bytes(WT);
    float amax = 0.0f;  // NaN where the group holds one
#pragma unroll
    for (int j = 0; j < 8; j++) amax = fmax_nan(amax, fabsf(v[j]));
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) amax = fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = 0.0f, inv = 0.0f;
    if (isnan(amax) || isinf(amax)) d = __int_as_float(0x7fc00000);  // NaN: the result is NaN, as in f32
    else if (amax >= 1e-30f) d = amax / (127.0f * 254.0f), inv = 127.0f / amax;
    // Rounding to the nearest integer (ties to even) by adding 1.5 * 2^23, exact for |t| < 2^22 (here |t| <= 127;
    // with NaN in the group, garbage under a NaN d): the same h and l as rintf and __float2int_rn, in full-rate
    // additions where those run at a quarter of the rate (H200: down's staging of x 3.07 -> 2.69 us, the q4 step
    // 0.985; bench/results/gemv_probe).
    constexpr float M = 12582912.0f;
    constexpr int MI = 0x4B400000;
    int h[8], l[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float tq = __fmul_rn(v[j], inv), y = __fadd_rn(tq, M), r = __fsub_rn(y, M);
        h[j] = __float_as_int(y) - MI, l[j] = __float_as_int(__fadd_rn(__fmul_rn(__fsub_rn(tq, r), 254.0f), M)) - MI;
        sum += 254 * h[j] + l[j];
    }
#pragma unroll
    for (int o = 1; o < E / 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // the record's E / 8 lanes
    if (!on) return;
    const uint2 hw = make_uint2(pack_i8x4(h[0], h[1], h[2], h[3]), pack_i8x4(h[4], h[5], h[6], h[7]));
    const uint2 lw = make_uint2(pack_i8x4(l[0], l[1], l[2], l[3]), pack_i8x4(l[4], l[5], l[6], l[7]));
    // q4: one record a group, quarter q's bytes at 8q; q8: two, quarters 0-1 in the first, 2-3 the second
    const int per = E / 8, part = quarter / per, at = 8 * (quarter % per);
    uint8_t *o = rec + (g * (DJ_QGROUP / E) + part) * RB;
    *(uint2 *)(o + at) = hw;
    *(uint2 *)(o + E + at) = lw;
    if (quarter % per == 0)
        *(uint4 *)(o + 2 * E) = make_uint4(__float_as_uint(d), (uint32_t)sum, 0u, 0u);
}

// Up to how many eights of the input a thread holds in registers for QX_NORM's one pass (stage_xq_norm).
#define QN_EIGHTS 2

// The input's row t (n_in, a multiple of 32) quantized into the records at rec: four adjacent lanes a group, each
// eight values (a thread a group took 32-deep dependent chains: ~1 us of a kernel of a few). The loop runs whole
// warps (n_in / 8 is a multiple of 4, blockDim.x of 32), so every lane meets the shuffles. (Loading a thread's next
// eight before quantizing the current ones gained nothing on down's 14336 values: bench/results/gemv_rows.)
template <int WT, int MODE>
__device__ __forceinline__ void stage_xq(uint8_t *rec, const qx_in &in, int64_t t, int64_t n_in) {
    const float *xr = in.x + t * in.ld, *br = in.b ? in.b + t * in.ld : NULL;
    const float scale = qx_scale<MODE>(in, xr, br, n_in);
    float *xo = MODE == QX_NORM && blockIdx.x == 0 ? in.xo + t * in.ld : NULL;
    const int lane = threadIdx.x & 31;
    const int64_t nq = n_in / 8;
    for (int64_t i0 = threadIdx.x - lane; i0 < nq; i0 += blockDim.x) {
        const int64_t i = i0 + lane;
        const bool on = i < nq;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (on) {
            qx_load4<MODE>(in, xr, br, 8 * i, scale, xo, v);
            qx_load4<MODE>(in, xr, br, 8 * i + 4, scale, xo, v + 4);
        }
        quant_eight<WT>(rec, i >> 2, lane & 3, on, v);
    }
}

// QX_NORM's staging of row t in one pass over x and b where each thread holds at most QN_EIGHTS eights of the row
// (n_in <= 8 QN_EIGHTS blockDim.x): x + b loaded once into registers (and written to xo by column 0), the sum of
// squares reduced over the block, then the eights scaled and quantized from registers, where stage_xq reads x and b
// twice (an L2 round trip more before the block's first product). nwv: the thread's norm weights, loaded before the
// wait on the kernel before (they are the model's). The same values as stage_xq's but for the sum of squares' order.
template <int WT>
__device__ __forceinline__ void stage_xq_norm(uint8_t *rec, const qx_in &in, int64_t t, int64_t n_in,
                                              const float4 (*nwv)[2]) {
    const float *xr = in.x + t * in.ld, *br = in.b ? in.b + t * in.ld : NULL;
    float *xo = blockIdx.x == 0 ? in.xo + t * in.ld : NULL;
    const int lane = threadIdx.x & 31;
    const int64_t nq = n_in / 8, base = threadIdx.x - lane;
    float v[QN_EIGHTS][8], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < QN_EIGHTS; k++) {
        const int64_t i = base + lane + k * (int64_t)blockDim.x;
#pragma unroll
        for (int j = 0; j < 8; j++) v[k][j] = 0.0f;
        if (i >= nq) continue;
#pragma unroll
        for (int hlf = 0; hlf < 2; hlf++) {
            const int64_t i0 = 8 * i + 4 * hlf;
            float4 f = __ldg((const float4 *)(xr + i0));
            if (br) {
                const float4 d = __ldg((const float4 *)(br + i0));
                f.x += d.x, f.y += d.y, f.z += d.z, f.w += d.w;
            }
            if (xo) *(float4 *)(xo + i0) = f;
            v[k][4 * hlf] = f.x, v[k][4 * hlf + 1] = f.y, v[k][4 * hlf + 2] = f.z, v[k][4 * hlf + 3] = f.w;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) ss += v[k][j] * v[k][j];
    }
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)n_in + in.eps);
#pragma unroll
    for (int k = 0; k < QN_EIGHTS; k++) {
        const int64_t i0 = base + k * (int64_t)blockDim.x, i = i0 + lane;
        if (i0 >= nq) break;  // warp-uniform
        const float w[8] = {nwv[k][0].x, nwv[k][0].y, nwv[k][0].z, nwv[k][0].w,
                            nwv[k][1].x, nwv[k][1].y, nwv[k][1].z, nwv[k][1].w};
#pragma unroll
        for (int j = 0; j < 8; j++) v[k][j] = v[k][j] * scale * w[j];
        quant_eight<WT>(rec, i >> 2, lane & 3, i < nq, v[k]);
    }
}

// The norm weights a thread of stage_xq_norm takes (zeros past n_in).
__device__ __forceinline__ void load_norm_w(const qx_in &in, int64_t n_in, float4 (*nwv)[2]) {
    const int64_t nq = n_in / 8;
#pragma unroll
    for (int k = 0; k < QN_EIGHTS; k++) {
        const int64_t i = threadIdx.x + k * (int64_t)blockDim.x;
        nwv[k][0] = i < nq ? __ldg((const float4 *)(in.nw + 8 * i)) : make_float4(0, 0, 0, 0);
        nwv[k][1] = i < nq ? __ldg((const float4 *)(in.nw + 8 * i + 4)) : make_float4(0, 0, 0, 0);
    }
}

// The dots of NR rows' chunks q[i] (the same columns) with x in integers, scaled and added to acc[i]: q8 scale_i *
// d * (254 sum k hi + sum k lo - z_i sum), q4 scale_i / 4 * d * (4 (254 sum k hi + sum k lo) - c_i sum) for their
// record r and parameters pm (q4: byte j holds weight j in its low nibble and j + 16 in its high one, each k in
// 0..15; q8: int8 k). Every sum is exact in int32 (q4: |4 * 15.5e6| + |63 * 1.04e6|, q8: 2 * 128 * 16 * 32385, both
// below 2^31). The record is read from shared memory once for all NR rows.
template <int WT, int NR>
__device__ __forceinline__ void chunk_dots_i8(float *acc, const uint4 *q, const uint8_t *r, const uint32_t *pm) {
    constexpr int E = q_chunk_weights(WT);
    const uint4 *r4 = (const uint4 *)r;
    int sh[NR], sl[NR];
#pragma unroll
    for (int k = 0; k < NR; k++) sh[k] = sl[k] = 0;
    if (WT == DJ_Q4) {
        const uint4 h0 = r4[0], h1 = r4[1], l0 = r4[2], l1 = r4[3];
        const uint32_t H[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const uint32_t L[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
#pragma unroll
        for (int k = 0; k < NR; k++) {
            const uint32_t u[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int a = (int)(u[i] & 0x0F0F0F0Fu), b = (int)((u[i] >> 4) & 0x0F0F0F0Fu);
                sh[k] = __dp4a(a, (int)H[i], sh[k]), sh[k] = __dp4a(b, (int)H[4 + i], sh[k]);
                sl[k] = __dp4a(a, (int)L[i], sl[k]), sl[k] = __dp4a(b, (int)L[4 + i], sl[k]);
            }
        }
    } else {
        const uint4 h = r4[0], l = r4[1];
        const uint32_t H[4] = {h.x, h.y, h.z, h.w}, L[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
        for (int k = 0; k < NR; k++) {
            const uint32_t u[4] = {q[k].x, q[k].y, q[k].z, q[k].w};
#pragma unroll
            for (int i = 0; i < 4; i++) sh[k] = __dp4a((int)u[i], (int)H[i], sh[k]), sl[k] = __dp4a((int)u[i], (int)L[i], sl[k]);
        }
    }
    const uint4 m = r4[E / 8];  // {d, sum}
    const float d = __uint_as_float(m.x);
#pragma unroll
    for (int k = 0; k < NR; k++) {
        const int hl = 254 * sh[k] + sl[k], c = (int)(pm[k] >> 10);
        const int v = WT == DJ_Q4 ? 4 * hl - c * (int)m.y : hl - (4 * c - 128) * (int)m.y;
        acc[k] += (float)v * (d * chunk_scale<WT>(pm[k]));
    }
}

// bench/qp_probe.cu's timer stamps in the persistent kernel: nothing outside its build (-DQP_PROBE).
#ifdef QP_PROBE
#include "bench/qp_probe.cuh"
#else
#define QP_PROBE_START()
#define QP_STAMP(k)
#define QP_PROBE_END()
#endif

// Launched as a programmatic dependent of the kernel before it (qp_launch): the first weights are loaded before
// pdl_wait, which returns once that kernel has finished and its writes are visible, so the launch and the loads'
// latency overlap its end. Past the wait it lets its own dependent launch (pdl_trigger): that kernel's block takes
// each multiprocessor as this one's block there finishes, rather than once the last has (README: the 8B shapes'
// q8 GEMVs 7-15 points nearer D2D, q4 up to 8; the resident step 6-7% faster). MODE: what the input is (qx_in). A
// warp takes NR rows of W at a time (qp_rows_a_warp), the next NR rows' first chunks loaded as it finishes; with SWO
// (gate|up, one token) its two rows are gate row p and up row p + n_out / 2, and it writes silu(gate) * up to y[p]
// (gpu_norm_matmul_swiglu), so down's GEMV reads h, not gate and up (q4 step 0.957, q8 0.953 on an H200). A
// block takes NT tokens of the input (rows NT blockIdx.y ...; fewer in the last), their records one after another
// in shared memory, and dots every chunk of weights it loads with each: a pass of a few tokens reads W once, not
// once a token.
template <int WT, int MODE, int NT, int NR, bool SWO = false>
__global__ __launch_bounds__(QP_WARPS * 32) void gemv_quant_persist_kernel(float *y, const qx_in in, const uint8_t *w,
                                                                          int64_t T, int64_t n_in, int64_t n_out,
                                                                          int64_t row_bytes) {
    static_assert(!SWO || (NT == 1 && NR == 2), "silu(gate) * up pairs a gate row and its up row in one warp");
    constexpr int RB = qr_bytes(WT), U = QP_UNROLL;
    extern __shared__ uint4 rec4[];
    QP_PROBE_START();
    const uint8_t *rec = (const uint8_t *)rec4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t0 = (int64_t)blockIdx.y * NT, nc = n_in / q_chunk_weights(WT), tb = nc * RB;  // tb: a token's
    const int nt = T - t0 < NT ? (int)(T - t0) : NT;                                              // records
    const int64_t so = n_in / DJ_QGROUP * q_group_bytes(WT), step = (int64_t)gridDim.x * QP_WARPS;
    uint4 q[U][NR], qn[U][NR];
    uint32_t sc[U][NR], scn[U][NR];  // the chunks' group parameters
    // Row k of the warp's set p: rows NR p + k, or with SWO gate row p and up row p + n_out / 2. Past n_out: row
    // n_out - 1 again, never written.
    const int64_t sets = SWO ? n_out / 2 : (n_out + NR - 1) / NR;
    auto row_of = [&](int64_t p, int k) -> int64_t { return SWO ? p + k * sets : min(p * NR + k, n_out - 1); };
    // chunks c + 32u of set p's rows
    auto load = [&](int64_t p, int64_t c, uint4 (*qq)[NR], uint32_t (*ss)[NR]) {
        const uint8_t *wr[NR];
#pragma unroll
        for (int k = 0; k < NR; k++) wr[k] = w + row_of(p, k) * row_bytes;
        load_chunks<WT, U, NR>(qq, ss, wr, c, nc, so);
    };
    int64_t r = (int64_t)blockIdx.x * QP_WARPS + warp, c = lane;  // r: the set
    if (r < sets) load(r, c, q, sc);
    const bool norm1 = MODE == QX_NORM && n_in <= 8 * QN_EIGHTS * (int64_t)blockDim.x;  // stage_xq_norm's rows
    float4 nwv[QN_EIGHTS][2];
    if (norm1) load_norm_w(in, n_in, nwv);
    pdl_wait();
    QP_STAMP(1);
    pdl_trigger();
    for (int j = 0; j < nt; j++)
        if (norm1) stage_xq_norm<WT>((uint8_t *)rec4 + j * tb, in, t0 + j, n_in, nwv);
        else stage_xq<WT, MODE>((uint8_t *)rec4 + j * tb, in, t0 + j, n_in);
    __syncthreads();
    QP_STAMP(2);
    float acc[NT][NR];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int k = 0; k < NR; k++) acc[j][k] = 0.0f;
    while (r < sets) {
        int64_t rn = r, cn = c + 32 * U;
        if (cn >= nc) rn = r + step, cn = lane;
        if (rn < sets) load(rn, cn, qn, scn);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + 32 * u >= nc) break;
#pragma unroll
            for (int j = 0; j < NT; j++)
                if (j < nt) chunk_dots_i8<WT, NR>(acc[j], q[u], rec + j * tb + (c + 32 * u) * RB, sc[u]);
        }
        if (rn != r) {  // the NR rows done
            if constexpr (SWO) {  // y (n_out / 2) = silu(gate) * up, as gpu_swiglu computes it
                const float gt = warp_sum(acc[0][0]), up = warp_sum(acc[0][1]);
                acc[0][0] = acc[0][1] = 0.0f;
                if (lane == 0) y[r] = silu_mul(gt, up);
            } else {
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (j >= nt) break;
#pragma unroll
                    for (int k = 0; k < NR; k++) {
                        const float v = warp_sum(acc[j][k]);
                        if (lane == 0 && r * NR + k < n_out) y[(t0 + j) * n_out + r * NR + k] = v;
                        acc[j][k] = 0.0f;
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int k = 0; k < NR; k++) q[u][k] = qn[u][k], sc[u][k] = scn[u][k];
        r = rn, c = cn;
    }
    QP_PROBE_END();
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

// Tokens a block of the persistent kernel takes (its NT): 1, 2, 4 or QP_MAX_NT.
#define QP_MAX_NT 8

// The persistent kernel on T rows of its input, NT a block, NR rows of W a warp, launched with programmatic stream
// serialization (the kernel waits on its predecessor itself: pdl_wait).
template <int WT, int MODE, int NT, int NR, bool SWO = false>
static int qp_launch_nr(dj_gpu *g, float *y, const qx_in &in, const uint8_t *w, int64_t T, int64_t n_in,
                        int64_t n_out, cudaStream_t s, dj_err *e) {
    const int64_t need = (n_out + QP_WARPS * NR - 1) / (QP_WARPS * NR);
    const int64_t rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    CUDA_CHECK(pdl_launch(gemv_quant_persist_kernel<WT, MODE, NT, NR, SWO>,
                          dim3((unsigned)(need < g->qp_blocks ? need : g->qp_blocks), (unsigned)((T + NT - 1) / NT)),
                          dim3(QP_WARPS * 32), NT * qp_smem(WT, n_in), s, y, in, w, T, n_in, n_out, rb));
    LAUNCH_CHECK("gemv_quant_persist", s);
    return 0;
}

// Rows of W a warp of the one-token kernel takes at a time (its NR): two, so that a lane reads x's record from shared
// memory once for both and has twice the weights in flight, except q8 where pairs leave the busiest warp more than
// 1/16 more rows than single rows would (W's rows fall to the warps of the grid two by two). Measured on an H200
// (bench/results/gemv_rows, Llama-3 shapes in a CUDA graph, % of D2D, one row a warp -> two): q4 53 -> 60% (q|k|v,
// 6144 rows, the busiest warp 3 -> 4 rows), 46 -> 51 (wo), 76 -> 93 (gate|up), 56 -> 63 (down), 76 -> 97 (lm_head),
// 73 -> 87 (70B's down); q8 96 -> 102, 78 -> 80, 92 -> 102, 89 -> 95 on the large matrices, but 77 -> 71 on q|k|v
// (q8's record, half q4's bytes a weight, saves less) and 69 -> 67 on wo.
static int qp_rows_a_warp(const dj_gpu *g, uint32_t wt, int64_t n_out) {
    const int64_t warps = (int64_t)g->qp_blocks * QP_WARPS;
    const int64_t one = (n_out + warps - 1) / warps, two = 2 * ((n_out + 2 * warps - 1) / (2 * warps));
    return wt == DJ_Q4 || 16 * two <= 17 * one ? 2 : 1;
}

extern "C" int gpu_qgemv_rows_a_warp(const dj_gpu *g, uint32_t wtype, int64_t n_out) {
    return qp_rows_a_warp(g, wtype, n_out);
}

// Several tokens a block take two rows a warp for every dtype and size: each lane reads every token's record from
// shared memory once for both rows, where with one row it read 2.5 bytes of records a weight a token (q4), which
// bound the pass (H200, 8B q4, one row -> two: q|k|v at 2 / 4 tokens 8.9 -> 7.8 / 15.0 -> 13.2 us, gate|up 30.1 ->
// 21.0 at 2, down 19.1 -> 15.9 at 2; q8 alike: bench/results/gemv_rows/session66).
template <int WT, int MODE, int NT>
static int qp_launch_nt(dj_gpu *g, float *y, const qx_in &in, const uint8_t *w, int64_t T, int64_t n_in,
                        int64_t n_out, cudaStream_t s, dj_err *e) {
    if constexpr (NT == 1)
        if (qp_rows_a_warp(g, WT, n_out) == 1) return qp_launch_nr<WT, MODE, NT, 1>(g, y, in, w, T, n_in, n_out, s, e);
    return qp_launch_nr<WT, MODE, NT, 2>(g, y, in, w, T, n_in, n_out, s, e);
}

// Shared memory the persistent kernel declares itself (QX_NORM's block_sum: 128 bytes), kept out of what the records
// of several tokens may take (qp_setup_one checks it).
#define QP_STATIC_SMEM 1024

// The most tokens a block of the persistent kernel stages for x of n_in (their records side by side in shared
// memory, qp_smem each): 1, 2, 4 or QP_MAX_NT.
static int qp_fit(const dj_gpu *g, uint32_t wt, int64_t n_in) {
    int nt = 1;
    while (nt < QP_MAX_NT && (size_t)(2 * nt) * qp_smem(wt, n_in) <= (size_t)(g->tc_optin - QP_STATIC_SMEM)) nt *= 2;
    return nt;
}

// Each block takes the fewest of 1, 2, 4, 8 tokens that hold T, or as many as its shared memory holds (qp_fit; the
// blocks of the further tokens read W again).
template <int WT, int MODE>
static int qp_launch(dj_gpu *g, float *y, const qx_in &in, const uint8_t *w, int64_t T, int64_t n_in, int64_t n_out,
                     cudaStream_t s, dj_err *e) {
    const int fit = qp_fit(g, WT, n_in);
    int nt = 1;
    while (nt < T && nt < fit) nt *= 2;
    switch (nt) {
    case 1:
        return qp_launch_nt<WT, MODE, 1>(g, y, in, w, T, n_in, n_out, s, e);
    case 2:
        return qp_launch_nt<WT, MODE, 2>(g, y, in, w, T, n_in, n_out, s, e);
    case 4:
        return qp_launch_nt<WT, MODE, 4>(g, y, in, w, T, n_in, n_out, s, e);
    default:
        return qp_launch_nt<WT, MODE, QP_MAX_NT>(g, y, in, w, T, n_in, n_out, s, e);
    }
}

template <int MODE>
static int qp_launch_any(dj_gpu *g, float *y, const qx_in &in, const void *w, uint32_t wtype, int64_t T, int64_t n_in,
                         int64_t n_out, cudaStream_t s, dj_err *e) {
    return wtype == DJ_Q8 ? qp_launch<DJ_Q8, MODE>(g, y, in, (const uint8_t *)w, T, n_in, n_out, s, e)
                          : qp_launch<DJ_Q4, MODE>(g, y, in, (const uint8_t *)w, T, n_in, n_out, s, e);
}

template <int WT>
static int gemv_quant_typed(dj_gpu *g, float *y, const float *x, const void *w, int64_t T, int64_t n_in,
                            int64_t n_out, cudaStream_t s, dj_err *e) {
    const int64_t rb = (int64_t)dj_row_bytes(WT, (uint64_t)n_in);
    if (T > 65535) return dj_fail(e, "gemv: T = %lld too large", (long long)T);
    const uint8_t *wb = (const uint8_t *)w;
    const int vec_ok = n_in % DJ_QGROUP == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    if (vec_ok && gpu_fused_ok(WT, w, n_in, n_out))  // the persistent kernel's shapes
        return qp_launch<WT, QX_PLAIN>(g, y, qx_in{x, NULL, NULL, NULL, 0.0f, n_in}, wb, T, n_in, n_out, s, e);
    if (vec_ok) {
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
// (scale * (k - z); q_widen2). n_in % 32 == 0: one thread per 16-byte chunk of values (one
// 16-byte load, its E weights stored 16 bytes at a time); otherwise one thread per group, byte by byte.
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
            const uint32_t pm = *(const uint16_t *)(wr + groups * QB + 2 * (c * E / DJ_QGROUP));
            const uint32_t u[4] = {q.x, q.y, q.z, q.w};
            __half2 s2, nc2;  // the scale, the value at the zero point
            q_widen_params<WT>(pm, &s2, &nc2);
            uint32_t h[E / 2];  // pairs of halves, lowest weight first
#pragma unroll
            for (int i = 0; i < 4; i++) {
                // each value becomes its half (q_widen2: q8 1024 + k + 128, q4 256 + k), exact
                uint32_t p[4];
                if (WT == DJ_Q8) {
                    const uint32_t v = u[i] ^ 0x80808080u;
                    p[0] = __byte_perm(v, 0x64646464u, 0x4140), p[1] = __byte_perm(v, 0x64646464u, 0x4342);
                } else {
                    const uint32_t a = ((u[i] << 2) & 0x003C003Cu) | 0x5C005C00u;
                    const uint32_t b = ((u[i] >> 2) & 0x003C003Cu) | 0x5C005C00u;
                    const uint32_t c = ((u[i] >> 6) & 0x003C003Cu) | 0x5C005C00u;
                    const uint32_t d = ((u[i] >> 10) & 0x003C003Cu) | 0x5C005C00u;
                    // a: weights 4i, 4i+2; c: 4i+1, 4i+3; b and d the same of the high nibbles (16 + ...)
                    p[0] = __byte_perm(a, c, 0x5410), p[1] = __byte_perm(a, c, 0x7632);
                    p[2] = __byte_perm(b, d, 0x5410), p[3] = __byte_perm(b, d, 0x7632);
                }
#pragma unroll
                for (int j = 0; j < (WT == DJ_Q8 ? 2 : 4); j++) {
                    const uint32_t o = q_widen2(p[j], s2, nc2);
                    if (WT == DJ_Q8) h[2 * i + j] = o;
                    else h[(j < 2 ? 0 : 8) + 2 * i + j % 2] = o;
                }
            }
            uint4 *o = (uint4 *)(out + r * n_in + c * E);
#pragma unroll
            for (int v = 0; v < E / 8; v++) o[v] = make_uint4(h[4 * v], h[4 * v + 1], h[4 * v + 2], h[4 * v + 3]);
        }
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * groups;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / groups, g = i - r * groups, c0 = g * DJ_QGROUP;
        const uint8_t *wr = w + r * row_bytes;
        const uint32_t pm = *(const uint16_t *)(wr + groups * QB + 2 * g);
        __half2 s2, nc2;
        q_widen_params<WT>(pm, &s2, &nc2);
        __half *o = out + r * n_in + c0;
        const int n = (int)min((int64_t)DJ_QGROUP, n_in - c0);
        for (int j = 0; j < n; j++) {
            const uint32_t v = WT == DJ_Q8 ? 0x6400u | (wr[g * QB + j] ^ 0x80u)
                                           : 0x5C00u | ((wr[g * QB + (j & 15)] >> (j < 16 ? 0 : 4)) & 15) << 2;
            const uint32_t hv = q_widen2(v, s2, nc2);
            o[j] = __ushort_as_half((unsigned short)hv);
        }
    }
}

// out (rows, n_in) f16 = q8/q4 rows of W; blocks 0: one thread a chunk of values (or a group where n_in is not a
// multiple of 32), else that many blocks of 256 (bench/overlap_bench.cu: the dequantization beside a GEMM on the
// other SMs).
extern "C" int gpu_dequant_f16(void *out_, const void *w, uint32_t wtype, int64_t rows, int64_t n_in, int blocks,
                               cudaStream_t s, dj_err *e) {
    if (!dj_is_quant(wtype) || rows < 1 || n_in < 1) return dj_fail(e, "gpu_dequant_f16: not q8/q4 rows");
    const int64_t rb = (int64_t)dj_row_bytes(wtype, (uint64_t)n_in);
    const int64_t work = n_in % DJ_QGROUP ? rows * ((n_in + DJ_QGROUP - 1) / DJ_QGROUP)
                                          : rows * (n_in / q_chunk_weights(wtype));
    const int grid = blocks > 0 ? blocks : grid_1d(work, 256);
    __half *out = (__half *)out_;
    if (wtype == DJ_Q8) dequant_f16_kernel<DJ_Q8><<<grid, 256, 0, s>>>(out, (const uint8_t *)w, rows, n_in, rb);
    else dequant_f16_kernel<DJ_Q4><<<grid, 256, 0, s>>>(out, (const uint8_t *)w, rows, n_in, rb);
    LAUNCH_CHECK("dequant_f16", s);
    return 0;
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
        if (gpu_dequant_f16(wd, (const uint8_t *)w + r0 * rb, wtype, rows, n_in, 0, s, e)) return -1;
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
    // cuBLAS's kernels load at first use, which may wait for the device: nothing may wait on the host then
    if (gpu_hold_release(g, e)) return -1;
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

// f16 and bf16 W: bytes of x's copy in W's dtype (blas_operand's; bf16: hi then lo), and where GPU_MM_ROWS's sums
// start after it in scratch (256-byte aligned).
static size_t x_copy_bytes(uint32_t wtype, int64_t T, int64_t n_in) {
    return (size_t)T * (size_t)n_in * (wtype == DJ_BF16 ? 4 : 2);
}
static size_t rows_part_at(uint32_t wtype, int64_t T, int64_t n_in) {
    return (x_copy_bytes(wtype, T, n_in) + 255) / 256 * 256;
}

// GPU_MM_ROWS: x rounded into scratch as blas_operand rounds it, the slices' sums after it.
extern "C" int gpu_matmul_rows(dj_gpu *g, int slices, float *y, const float *x, const void *w, uint32_t wtype,
                               int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (!drow_takes(wtype, w, T, n_in, n_out))
        return dj_fail(e, "gpu_matmul_rows: not for dtype %s, T = %lld, n_in = %lld or unaligned weights",
                       dj_dtype_name(wtype), (long long)T, (long long)n_in);
    const void *xb, *xlo;
    if (blas_operand(g, &xb, &xlo, x, wtype, T, n_in, s, e)) return -1;
    return drow_launch(g, slices, y, xb, xlo, (char *)g->scratch + rows_part_at(wtype, T, n_in), w, wtype, T, n_in,
                       n_out, s, e);
}

// ---- dispatch
extern "C" size_t gpu_matmul_scratch(uint32_t wtype, int64_t T, int64_t n_in) {
    if (dj_is_quant(wtype)) {  // x in f16, then a chunk of dequantized rows; or x alone (gpu_qgemm)
        size_t dq = ((size_t)T * (size_t)n_in + 127) / 128 * 128 * 2 + (size_t)qchunk_rows(n_in) * (size_t)n_in * 2;
        size_t qg = gpu_qgemm_scratch(T, n_in);
        return dq > qg ? dq : qg;
    }
    if (wtype == DJ_F32) return 0;
    return T > 1 ? rows_part_at(wtype, T, n_in) + drow_part_bytes(T) : x_copy_bytes(wtype, T, n_in);
}

// Up to how many tokens a pass over q8/q4 W (n_out, n_in) goes to the persistent GEMV, which reads W once for the
// tokens a block holds (qp_fit), past which qgemm.cu's register kernel is faster. The GEMV's cost grows with the
// tokens, about W's read time each; the register kernel's is nearly flat, a fixed cost plus W's bytes: the larger
// W, the fewer tokens the GEMV wins. Measured on the H200 with two rows a warp (bench/results/gemv_rows/session66,
// the GEMV's time over the register kernel's, q4 / q8, on the matrices of Llama-3-8B, of it split over two GPUs,
// Llama-2-13B and Llama-3-70B): at 5 tokens 0.75 / 0.72 (8.4M weights), 0.84 / 0.89 (12.6M), 0.85 / 0.90 (16.8M),
// then 1.17 / 1.21 (25.2M); at 4 0.91 / 0.98 (25.2M), 0.93 / 0.96 (29.4M), but 1.14 / 1.21 on 13B's wo (26.2M); at 3
// 0.90 / 0.91 and 1.00 / 1.03 (58.7M, two shapes), 0.97 / 0.94 (67.1M); at 2 0.55 - 0.92 everywhere up to 470M but
// 13B's down in q8 (1.04). So: 5 tokens up to 20M weights, 4 up to 32M, 3 up to 64M, 2 beyond. Never so many that
// W is read more than twice.
static int64_t qp_tokens(const dj_gpu *g, uint32_t wtype, int64_t n_in, int64_t n_out) {
    const int64_t weights = n_in * n_out;
    const int64_t most = weights <= (20 << 20) ? 5 : weights <= (32 << 20) ? 4 : weights <= (64 << 20) ? 3 : 2;
    const int64_t twice = 2 * (int64_t)qp_fit(g, wtype, n_in);
    return most < twice ? most : twice;
}

// Up to how many tokens of x (its rows ld floats apart) the persistent GEMV takes for W: qp_tokens, or 0 where it
// cannot take them (W not its shape, x unaligned).
static int64_t qp_most(const dj_gpu *g, uint32_t wtype, const void *w, const float *x, int64_t ld, int64_t n_in,
                       int64_t n_out) {
    if (!gpu_fused_ok(wtype, w, n_in, n_out) || ((uintptr_t)x & 15) != 0 || ld % 4 != 0) return 0;
    return qp_tokens(g, wtype, n_in, n_out);
}

int64_t gemv_tokens(const dj_gpu *g, uint32_t wtype, const void *w, int64_t n_in, int64_t n_out) {
    return qp_most(g, wtype, w, NULL, n_in, n_in, n_out);
}

extern "C" int gpu_matmul_path(dj_gpu *g, int path, float *y, const float *x, const void *w, uint32_t wtype,
                               int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    if (!dj_row_bytes(wtype, 1)) return dj_fail(e, "gpu_matmul: unknown weight dtype %u", wtype);
    if (T < 0 || n_in < 1 || n_out < 1 || T > INT32_MAX || n_in > INT32_MAX || n_out > INT32_MAX)
        return dj_fail(e, "gpu_matmul: bad shape T=%lld n_in=%lld n_out=%lld", (long long)T, (long long)n_in,
                       (long long)n_out);
    if (T == 0) return 0;
    if (path == GPU_MM_AUTO) {
        const int64_t most = qp_most(g, wtype, w, x, n_in, n_in, n_out);
        if (T == 1 || T <= most) {
            path = GPU_MM_GEMV;
        } else if (wtype == DJ_BF16 && drow_takes(wtype, w, T, n_in, n_out)) {
            path = GPU_MM_ROWS;  // f16 stays on cuBLAS: as fast or faster there (bench/drow_bench.cu)
        } else if (gpu_qgemm_wins(g, wtype, w, T, n_in, n_out)) {
            // the tokens past the tensor-core kernel's last whole block on the GEMV, where that saves a padded block
            const int64_t r = qgemm_tail(g, T, n_in, n_out, most);
            if (gpu_qgemm_variant(g, -1, y, x, w, wtype, T - r, n_in, n_out, s, e)) return -1;
            return r ? gpu_matmul_path(g, GPU_MM_GEMV, y + (T - r) * n_out, x + (T - r) * n_in, w, wtype, r, n_in,
                                       n_out, s, e)
                     : 0;
        } else {
            path = GPU_MM_CUBLAS;
        }
    }
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
    case GPU_MM_QGEMM:
        return gpu_qgemm_variant(g, -1, y, x, w, wtype, T, n_in, n_out, s, e);
    case GPU_MM_ROWS:
        return gpu_matmul_rows(g, 0, y, x, w, wtype, T, n_in, n_out, s, e);
    default:
        return dj_fail(e, "gpu_matmul: unknown path %d", path);
    }
}

extern "C" int gpu_matmul(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                          int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    return gpu_matmul_path(g, GPU_MM_AUTO, y, x, w, wtype, T, n_in, n_out, s, e);
}

extern "C" int gpu_swiglu_matmul(dj_gpu *g, float *y, float *hb, const float *gate, const float *up, int64_t ld,
                                 const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s,
                                 dj_err *e) {
    if (ld < n_in) return dj_fail(e, "gpu_swiglu_matmul: rows %lld floats apart, fewer than n_in = %lld", (long long)ld,
                                  (long long)n_in);
    if (T < 1) return T == 0 ? 0 : dj_fail(e, "gpu_swiglu_matmul: T = %lld", (long long)T);
    const int64_t most = ((uintptr_t)up & 15) == 0 ? qp_most(g, wtype, w, gate, ld, n_in, n_out) : 0;
    qx_in in = {gate, up, NULL, NULL, 0.0f, ld};
    if (T <= most) return qp_launch_any<QX_SWIGLU>(g, y, in, w, wtype, T, n_in, n_out, s, e);
    if (gpu_qgemm_wins(g, wtype, w, T, n_in, n_out)) {  // the tail as gpu_matmul_path takes it
        const int64_t r = qgemm_tail(g, T, n_in, n_out, most);
        if (gpu_swiglu_qgemm(g, y, gate, up, ld, w, wtype, T - r, n_in, n_out, s, e)) return -1;
        if (!r) return 0;
        in.x += (T - r) * ld, in.b += (T - r) * ld;
        return qp_launch_any<QX_SWIGLU>(g, y + (T - r) * n_out, in, w, wtype, r, n_in, n_out, s, e);
    }
    return gpu_swiglu(hb, gate, up, T, n_in, ld, s, e) || gpu_matmul(g, y, hb, w, wtype, T, n_in, n_out, s, e) ? -1 : 0;
}

// Whether the persistent kernel takes W: a whole number of groups up to QP_MAX a row, 16-byte aligned.
extern "C" int gpu_fused_ok(uint32_t wtype, const void *w, int64_t n_in, int64_t n_out) {
    return dj_is_quant(wtype) && n_in % DJ_QGROUP == 0 && n_in <= QP_MAX && ((uintptr_t)w & 15) == 0 && n_out >= 1 &&
           n_out <= INT32_MAX;
}

// The checks gpu_norm_matmul and gpu_norm_matmul_swiglu (fn) share: W the persistent kernel's, the buffers aligned,
// xo not x; 0 when they pass.
static int norm_matmul_check(const char *fn, const float *x, const float *delta, const float *xo, const float *nw,
                             const void *w, uint32_t wtype, int64_t n_in, int64_t n_out, dj_err *e) {
    if (!gpu_fused_ok(wtype, w, n_in, n_out) || (((uintptr_t)x | (uintptr_t)delta | (uintptr_t)xo | (uintptr_t)nw) & 15))
        return dj_fail(e, "%s: not for weights of dtype %u, n_in = %lld or unaligned buffers (gpu_fused_ok)", fn, wtype,
                       (long long)n_in);
    if (xo == x || !xo) return dj_fail(e, "%s: the residual's next buffer must not be x", fn);
    return 0;
}

extern "C" int gpu_norm_matmul(dj_gpu *g, float *y, const float *x, const float *delta, float *xo, const float *nw,
                               float eps, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out,
                               cudaStream_t s, dj_err *e) {
    if (norm_matmul_check("gpu_norm_matmul", x, delta, xo, nw, w, wtype, n_in, n_out, e)) return -1;
    if (T < 1 || T > 65535) return dj_fail(e, "gpu_norm_matmul: T = %lld tokens (1 to 65535)", (long long)T);
    return qp_launch_any<QX_NORM>(g, y, qx_in{x, delta, nw, xo, eps, n_in}, w, wtype, T, n_in, n_out, s, e);
}

extern "C" int gpu_norm_matmul_takes(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in,
                                     int64_t n_out) {
    return T >= 1 && T <= gemv_tokens(g, wtype, w, n_in, n_out);
}

extern "C" int gpu_norm_rows_ok(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in,
                                int64_t n_out) {
    return gpu_norm_matmul_takes(g, wtype, w, T, n_in, n_out) || gpu_norm_qgemm_ok(g, wtype, w, T, n_in, n_out);
}

extern "C" int gpu_norm_rows(dj_gpu *g, float *y, const float *x, const float *delta, float *xo, const float *nw,
                             float eps, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out,
                             cudaStream_t s, dj_err *e) {
    return gpu_norm_matmul_takes(g, wtype, w, T, n_in, n_out)
               ? gpu_norm_matmul(g, y, x, delta, xo, nw, eps, w, wtype, T, n_in, n_out, s, e)
               : gpu_norm_qgemm(g, y, x, delta, xo, nw, eps, w, wtype, T, n_in, n_out, s, e);
}

extern "C" int gpu_norm_matmul_swiglu(dj_gpu *g, float *h, const float *x, const float *delta, float *xo,
                                      const float *nw, float eps, const void *w, uint32_t wtype, int64_t n_in,
                                      int64_t n_out, cudaStream_t s, dj_err *e) {
    if (norm_matmul_check("gpu_norm_matmul_swiglu", x, delta, xo, nw, w, wtype, n_in, n_out, e)) return -1;
    if (n_out % 2) return dj_fail(e, "gpu_norm_matmul_swiglu: n_out = %lld is odd, not gate and up", (long long)n_out);
    const qx_in in = {x, delta, nw, xo, eps, n_in};
    const uint8_t *wb = (const uint8_t *)w;
    return wtype == DJ_Q8 ? qp_launch_nr<DJ_Q8, QX_NORM, 1, 2, true>(g, h, in, wb, 1, n_in, n_out, s, e)
                          : qp_launch_nr<DJ_Q4, QX_NORM, 1, 2, true>(g, h, in, wb, 1, n_in, n_out, s, e);
}

// ---- set-up, run once by gpu_open
// The persistent quantized GEMV's shared memory (x of up to QP_MAX elements) and its grid: QP_BPS blocks per SM,
// which the device must hold at once for the largest x.
template <int WT, int MODE> static int qp_setup_one(dj_gpu *g, int sms, dj_err *e) {
    const int smem = (int)qp_smem(WT, QP_MAX);
    CUDA_CHECK(cudaFuncSetAttribute(gemv_quant_persist_kernel<WT, MODE, 1, 1>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(gemv_quant_persist_kernel<WT, MODE, 1, 2>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if constexpr (MODE == QX_NORM)
        CUDA_CHECK(cudaFuncSetAttribute(gemv_quant_persist_kernel<WT, MODE, 1, 2, true>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // several tokens a block: as many records as the device's shared memory holds beside the kernel's own
    const void *several[] = {(const void *)gemv_quant_persist_kernel<WT, MODE, 2, 2>,
                             (const void *)gemv_quant_persist_kernel<WT, MODE, 4, 2>,
                             (const void *)gemv_quant_persist_kernel<WT, MODE, QP_MAX_NT, 2>};
    for (int i = 0; i < 3; i++) {
        cudaFuncAttributes fa;
        CUDA_CHECK(cudaFuncGetAttributes(&fa, several[i]));
        if (fa.sharedSizeBytes > QP_STATIC_SMEM)
            return dj_fail(e, "cuda: the quantized GEMV declares %zu bytes of shared memory, more than the %d kept "
                              "for it", fa.sharedSizeBytes, QP_STATIC_SMEM);
        CUDA_CHECK(cudaFuncSetAttribute(several[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        g->tc_optin - QP_STATIC_SMEM));
    }
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_quant_persist_kernel<WT, MODE, 1, 1>,
                                                             QP_WARPS * 32, (size_t)smem));
    if (per_sm < 1)
        return dj_fail(e, "cuda: %s cannot run the quantized GEMV (%d bytes of shared memory)", g->name, smem);
    const int blocks = sms * (per_sm < QP_BPS ? per_sm : QP_BPS);
    if (!g->qp_blocks || blocks < g->qp_blocks) g->qp_blocks = blocks;
    return 0;
}

int matmul_setup(dj_gpu *g, dj_err *e) {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g->device));
    g->qp_blocks = 0;
    return load_module_of(g, (const void *)gemv_quant_persist_kernel<DJ_Q8, QX_PLAIN, 1, 1>, e) ||
                   qp_setup_one<DJ_Q8, QX_PLAIN>(g, sms, e) || qp_setup_one<DJ_Q4, QX_PLAIN>(g, sms, e) ||
                   qp_setup_one<DJ_Q8, QX_SWIGLU>(g, sms, e) || qp_setup_one<DJ_Q4, QX_SWIGLU>(g, sms, e) ||
                   qp_setup_one<DJ_Q8, QX_NORM>(g, sms, e) || qp_setup_one<DJ_Q4, QX_NORM>(g, sms, e)
               ? -1
               : 0;
}
