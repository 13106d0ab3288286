// ops.cu: the elementwise and per-row ops of a layer, in the order a token meets them: widening an embedding
// row from the weight dtype, RMSNorm (alone, or after the residual add), RoPE and the KV-cache write (apart, or
// in one launch), and SwiGLU. f32 in and out, the same formulas as the CPU reference in model.c.
#include <cuda_runtime.h>

#include "kernels_impl.h"

// ---- widen: embedding rows from the weight dtype
template <int WT>
__global__ void widen_kernel(float *out, const void *in, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = wload<WT>(in, i);
}

extern "C" int gpu_widen(float *out, const void *in, uint32_t wtype, int64_t n, cudaStream_t s, dj_err *e) {
    if (n < 0 || (wtype != DJ_F16 && wtype != DJ_BF16 && wtype != DJ_F32))
        return dj_fail(e, "gpu_widen: bad n=%lld or dtype %u", (long long)n, wtype);
    if (n == 0) return 0;
    if (wtype == DJ_F32) widen_kernel<DJ_F32><<<grid_1d(n, 256), 256, 0, s>>>(out, in, n);
    else if (wtype == DJ_F16) widen_kernel<DJ_F16><<<grid_1d(n, 256), 256, 0, s>>>(out, in, n);
    else widen_kernel<DJ_BF16><<<grid_1d(n, 256), 256, 0, s>>>(out, in, n);
    LAUNCH_CHECK("widen", s);
    return 0;
}

// Rows of q8 or q4 (model.h's layout, row_bytes apart): one thread per element.
template <int WT>
__global__ void widen_quant_kernel(float *out, const uint8_t *in, int64_t rows, int64_t cols, int64_t row_bytes) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols;
        out[i] = qload<WT>(in + r * row_bytes, cols, i - r * cols);
    }
}

extern "C" int gpu_widen_rows(float *out, const void *in, uint32_t wtype, int64_t rows, int64_t cols, cudaStream_t s,
                              dj_err *e) {
    if (!dj_is_quant(wtype)) return gpu_widen(out, in, wtype, rows * cols, s, e);
    if (rows < 0 || cols < 1) return dj_fail(e, "gpu_widen_rows: bad shape %lld x %lld", (long long)rows, (long long)cols);
    if (rows == 0) return 0;
    const int64_t n = rows * cols, rb = (int64_t)dj_row_bytes(wtype, (uint64_t)cols);
    if (wtype == DJ_Q8) widen_quant_kernel<DJ_Q8><<<grid_1d(n, 256), 256, 0, s>>>(out, (const uint8_t *)in, rows, cols, rb);
    else widen_quant_kernel<DJ_Q4><<<grid_1d(n, 256), 256, 0, s>>>(out, (const uint8_t *)in, rows, cols, rb);
    LAUNCH_CHECK("widen_quant", s);
    return 0;
}

// ---- placing a block of rows into wider rows
template <bool AFTER>
__global__ void place_rows_kernel(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                                  int64_t cols) {
    if (AFTER) pdl_wait();  // host_wait_kernel has seen the host's word
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        dst[r * ld_dst + c] = src[r * ld_src + c];
    }
}

extern "C" int gpu_place_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                              int64_t cols, cudaStream_t s, dj_err *e) {
    if (rows < 0 || cols < 0 || (rows > 1 && (ld_dst < cols || ld_src < cols)))
        return dj_fail(e, "gpu_place_rows: bad shape %lld x %lld (ld %lld, %lld)", (long long)rows, (long long)cols,
                       (long long)ld_dst, (long long)ld_src);
    if (rows == 0 || cols == 0) return 0;
    place_rows_kernel<false><<<grid_1d(rows * cols, 256), 256, 0, s>>>(dst, ld_dst, src, ld_src, rows, cols);
    LAUNCH_CHECK("place_rows", s);
    return 0;
}

// One thread polls the word at `word` (mapped host memory) until it reaches `seq` (in wrapping order), a read over
// PCIe every microsecond or so: the read's answer travels the way the weights' copies do, so the poll stays rare.
// It lets its dependent (the placing kernel) launch at once, so that the placing starts as the word arrives.
__global__ void host_wait_kernel(const uint32_t *word, uint32_t seq) {
    pdl_trigger();
    if (threadIdx.x != 0) return;
    for (;;) {
        uint32_t v;
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
        if ((int32_t)(v - seq) >= 0) return;
        __nanosleep(1000);
    }
}

// n floats to mapped host memory by the SMs' own writes (posted: they do not wait on the link's other direction,
// where the weights' copies run, as a copy engine's D2H setup and a separate signal did: 17 against 7-9 us from
// the kernel before to the CPU's first rows, H200), then seq stored at `word` by the last block to finish, after
// every block's writes are visible to the host. count: a device word at 0, left at 0.
__global__ void to_host_kernel(float *dst, const float *src, int64_t n, unsigned *count, uint32_t *word,
                               uint32_t seq) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (((uintptr_t)dst | (uintptr_t)src) % 16 == 0) {
        const int64_t n4 = n / 4;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride)
            ((float4 *)dst)[i] = ((const float4 *)src)[i];
        for (int64_t i = 4 * n4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
    } else {
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(count, 1u) == gridDim.x - 1) {
        *count = 0;
        __threadfence_system();
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(word), "r"(seq) : "memory");
    }
}

extern "C" int gpu_to_host(float *dst, const float *src, int64_t n, unsigned *count, uint32_t *word, uint32_t seq,
                           cudaStream_t s, dj_err *e) {
    if (n < 0) return dj_fail(e, "gpu_to_host: bad n=%lld", (long long)n);
    int64_t blocks = n / 16384 + 1;
    to_host_kernel<<<(unsigned)(blocks > 64 ? 64 : blocks), 512, 0, s>>>(dst, src, n, count, word, seq);
    LAUNCH_CHECK("to_host", s);
    return 0;
}

extern "C" int gpu_place_rows_after(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                                    int64_t cols, const uint32_t *word, uint32_t seq, cudaStream_t s, dj_err *e) {
    if (rows < 0 || cols < 0 || (rows > 1 && (ld_dst < cols || ld_src < cols)))
        return dj_fail(e, "gpu_place_rows_after: bad shape %lld x %lld (ld %lld, %lld)", (long long)rows,
                       (long long)cols, (long long)ld_dst, (long long)ld_src);
    host_wait_kernel<<<1, 32, 0, s>>>(word, seq);
    LAUNCH_CHECK("host_wait", s);
    if (rows == 0 || cols == 0) return 0;
    CUDA_CHECK(pdl_launch(place_rows_kernel<true>, dim3((unsigned)grid_1d(rows * cols, 256)), dim3(256), 0, s, dst,
                          ld_dst, src, ld_src, rows, cols));
    LAUNCH_CHECK("place_rows", s);
    return 0;
}

// ---- RMSNorm, alone or after the residual add
// One block per row (norm_threads). ADD: x += delta first (the residual add), then out = rmsnorm(x) * w.
template <bool ADD>
__global__ void rmsnorm_kernel(float *out, float *x, const float *delta, const float *w, int64_t n, float eps) {
    const int64_t off = (int64_t)blockIdx.x * n;
    float *xr = x + off;
    // out may alias x or delta: a thread writes only its own elements, after reading them
    row_norm(ADD ? xr : NULL, xr, ADD ? delta + off : NULL, w, n, eps, [&](int64_t i, float y) { out[off + i] = y; });
}

extern "C" int gpu_rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t n, float eps,
                           cudaStream_t s, dj_err *e) {
    if (T < 0 || n < 1 || T > INT32_MAX) return dj_fail(e, "gpu_rmsnorm: bad shape T=%lld n=%lld", (long long)T, (long long)n);
    if (T == 0) return 0;
    rmsnorm_kernel<false><<<(unsigned)T, norm_threads(n), 0, s>>>(out, (float *)x, NULL, w, n, eps);
    LAUNCH_CHECK("rmsnorm", s);
    return 0;
}

extern "C" int gpu_add_rmsnorm(float *x, const float *delta, float *out, const float *w, int64_t T, int64_t n,
                               float eps, cudaStream_t s, dj_err *e) {
    if (T < 0 || n < 1 || T > INT32_MAX)
        return dj_fail(e, "gpu_add_rmsnorm: bad shape T=%lld n=%lld", (long long)T, (long long)n);
    if (T == 0) return 0;
    rmsnorm_kernel<true><<<(unsigned)T, norm_threads(n), 0, s>>>(out, x, delta, w, n, eps);
    LAUNCH_CHECK("add_rmsnorm", s);
    return 0;
}

// ---- the residual add on its own (probes: the stream after a layer, a control vector added)
// One thread per element: out = x + delta (+ v[column]), each add rounded as the fused norm's (no contraction: adds
// only).
__global__ void residual_add_kernel(float *out, const float *x, const float *delta, const float *v, int64_t T,
                                    int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < T * n; i += (int64_t)gridDim.x * blockDim.x) {
        float r = x[i] + delta[i];
        if (v) r += v[i % n];
        out[i] = r;
    }
}

extern "C" int gpu_residual_add(float *out, const float *x, const float *delta, const float *v, int64_t T, int64_t n,
                                cudaStream_t s, dj_err *e) {
    if (T < 0 || n < 1) return dj_fail(e, "gpu_residual_add: bad shape T=%lld n=%lld", (long long)T, (long long)n);
    if (T == 0) return 0;
    residual_add_kernel<<<grid_1d(T * n, 256), 256, 0, s>>>(out, x, delta, v, T, n);
    LAUNCH_CHECK("residual_add", s);
    return 0;
}

// ---- RoPE
// Pair (i, i + half) of the head row xr rotated for position pos. The products and the difference are rounded
// separately (no FMA contraction), as the CPU reference computes them.
static __device__ __forceinline__ void rope_pair(float *xr, int64_t i, int64_t half, int64_t pos,
                                                 const float *inv_freq) {
    const float ang = __fmul_rn((float)pos, inv_freq[i]);
    float sn, cs;
    sincosf(ang, &sn, &cs);
    const float a = xr[i], b = xr[i + half];
    xr[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    xr[i + half] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
}

// One thread per rotated pair (t, head, i).
__global__ void rope_kernel(float *x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t ld, const float *inv_freq,
                            const int32_t *d_pos) {
    const int64_t half = head_dim / 2, per_t = n_heads * half;
    const int32_t pos0 = *d_pos;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < T * per_t; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / per_t, r = k - t * per_t, h = r / half, i = r - h * half;
        rope_pair(x + t * ld + h * head_dim, i, half, pos0 + t, inv_freq);
    }
}

extern "C" int gpu_rope(float *x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t ld, const float *inv_freq,
                        const int32_t *d_pos, cudaStream_t s, dj_err *e) {
    if (T < 0 || n_heads < 1 || head_dim < 2 || head_dim % 2 || ld < n_heads * head_dim)
        return dj_fail(e, "gpu_rope: bad shape T=%lld n_heads=%lld head_dim=%lld ld=%lld (head_dim must be even)",
                       (long long)T, (long long)n_heads, (long long)head_dim, (long long)ld);
    if (T == 0) return 0;
    rope_kernel<<<grid_1d(T * n_heads * head_dim / 2, 256), 256, 0, s>>>(x, T, n_heads, head_dim, ld, inv_freq, d_pos);
    LAUNCH_CHECK("rope", s);
    return 0;
}

// ---- KV-cache write
// Row r of a pass's k or v (2 n_kv_heads rows a token: k's heads, then v's) and its place in the cache: (kv head,
// position) of the one layer and slot the cache view starts at.
static __device__ __forceinline__ int64_t kv_row_of(int h, int n_kv_heads, int max_seq, int pos) {
    return (int64_t)(h % n_kv_heads) * max_seq + pos;
}

// Warp (blockIdx.x * 8 + warp) < 2 n_kv_heads of token t = blockIdx.y writes one k or v head row at *d_pos + t.
template <int KT>
__global__ void kv_write_kernel(gpu_kv_cache c, const float *k, const float *v, int64_t ld, int n_kv_heads,
                                int head_dim, int max_seq, const int32_t *d_pos) {
    const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), t = (int)blockIdx.y;
    const int64_t pos = (int64_t)*d_pos + t;
    if (w >= 2 * n_kv_heads || pos < 0 || pos >= max_seq) return;  // whole warps
    const bool is_v = w >= n_kv_heads;
    const float *x = (is_v ? v : k) + (int64_t)t * ld + (int64_t)(w % n_kv_heads) * head_dim;
    kv_put_row_warp<KT>(is_v ? c.v : c.k, is_v ? c.vs : c.ks, kv_row_of(w, n_kv_heads, max_seq, (int)pos), x,
                        head_dim);
}

extern "C" int gpu_kv_write(const gpu_kv_cache *c, const float *k, const float *v, int64_t ld, int64_t T,
                            int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos,
                            cudaStream_t s, dj_err *e) {
    if (T < 0 || T > 65535 || n_kv_heads < 1 || n_kv_heads > 65535 || head_dim < 1 || max_seq < 1 ||
        max_seq > INT32_MAX || ld < n_kv_heads * head_dim)
        return dj_fail(e, "gpu_kv_write: bad shape T=%lld n_kv_heads=%lld head_dim=%lld ld=%lld", (long long)T,
                       (long long)n_kv_heads, (long long)head_dim, (long long)ld);
    if (T == 0) return 0;
    dim3 grid((unsigned)((2 * n_kv_heads + 7) / 8), (unsigned)T);
#define KV_WRITE(KT)                                                                                          \
    kv_write_kernel<KT><<<grid, 256, 0, s>>>(*c, k, v, ld, (int)n_kv_heads, (int)head_dim, (int)max_seq, d_pos)
    KV_SWITCH(c->type, KV_WRITE)
#undef KV_WRITE
    LAUNCH_CHECK("kv_write", s);
    return 0;
}

// ---- RoPE + KV write in one launch
// Row t = blockIdx.y: its q heads (n_heads, at q + t ldq) rotated in place for its position (as rope_kernel) by the
// first q_blocks blocks, its k heads (n_kv_heads, at k + t ldkv) rotated in place and written into the cache and
// its v heads (at v + t ldkv) written, a warp a head row, by the blocks after them: the same values as rope_kernel
// then kv_write_kernel, in one launch. Position and cache: *d_pos + t in the cache given (kv.slot NULL: a
// prefill's consecutive rows), or kv.pos[t] in slot kv.slot[t], kv.slot_stride elements further (a batched step).
template <int KT>
__global__ void rope_kv_kernel(float *q, int64_t ldq, float *k, float *v, int64_t ldkv, gpu_kv_cache c, int n_heads,
                               int n_kv_heads, int head_dim, int max_seq, int q_blocks, const float *inv_freq,
                               const int32_t *d_pos, gpu_kv_rows kv) {
    const int half = head_dim / 2;
    const int t = (int)blockIdx.y;
    pdl_wait();
    pdl_trigger();
    const int pos = kv.slot ? kv.pos[t] : *d_pos + t;
    q += (int64_t)t * ldq, k += (int64_t)t * ldkv, v += (int64_t)t * ldkv;
    if ((int)blockIdx.x < q_blocks) {
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n_heads * half; j += q_blocks * blockDim.x) {
            const int h = j / half, i = j - h * half;
            rope_pair(q + (int64_t)h * head_dim, i, half, pos, inv_freq);
        }
        return;
    }
    const int w = ((int)blockIdx.x - q_blocks) * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (w >= 2 * n_kv_heads) return;  // whole warps
    const bool is_v = w >= n_kv_heads;
    float *x = (is_v ? v : k) + (int64_t)(w % n_kv_heads) * head_dim;
    if (!is_v) {
        for (int i = lane; i < half; i += 32) rope_pair(x, i, half, pos, inv_freq);
        __syncwarp();  // the row's rotated values, written by every lane, read by every lane below
    }
    if (pos < 0 || pos >= max_seq) return;
    if (kv.slot) {
        const int64_t off = (int64_t)kv.slot[t] * kv.slot_stride;
        const int64_t bytes = off * (int64_t)sizeof(typename kv_elem<KT>::T);
        c.k = (char *)c.k + bytes, c.v = (char *)c.v + bytes;
        if (KT == DJ_KV_Q8) c.ks += off / head_dim, c.vs += off / head_dim;
    }
    kv_put_row_warp<KT>(is_v ? c.v : c.k, is_v ? c.vs : c.ks, kv_row_of(w, n_kv_heads, max_seq, pos), x, head_dim);
}

static int rope_kv_launch(float *q, int64_t ldq, float *k, float *v, int64_t ldkv, int64_t T, const gpu_kv_cache *c,
                          int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                          const float *inv_freq, const int32_t *d_pos, gpu_kv_rows kv, cudaStream_t s, dj_err *e) {
    const int q_blocks = (int)((n_heads * (head_dim / 2) + 255) / 256), kv_blocks = (int)((2 * n_kv_heads + 7) / 8);
    dim3 grid((unsigned)(q_blocks + kv_blocks), (unsigned)T);
#define ROPE_KV(KT)                                                                                               \
    CUDA_CHECK(pdl_launch(rope_kv_kernel<KT>, grid, dim3(256), 0, s, q, ldq, k, v, ldkv, *c, (int)n_heads,         \
                          (int)n_kv_heads, (int)head_dim, (int)max_seq, q_blocks, inv_freq, d_pos, kv))
    KV_SWITCH(c->type, ROPE_KV)
#undef ROPE_KV
    LAUNCH_CHECK("rope_kv", s);
    return 0;
}

extern "C" int gpu_rope_kv(dj_gpu *g, float *qkv, int64_t ld, int64_t T, const gpu_kv_cache *c, int64_t n_heads,
                           int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const float *inv_freq,
                           const int32_t *d_pos, cudaStream_t s, dj_err *e) {
    if (attn_check("gpu_rope_kv", n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (T < 0 || T > 65535 || (T > 1 && ld < (n_heads + 2 * n_kv_heads) * head_dim))
        return dj_fail(e, "gpu_rope_kv: bad T=%lld ld=%lld", (long long)T, (long long)ld);
    if (T == 0) return 0;
    float *k = qkv + n_heads * head_dim, *v = k + n_kv_heads * head_dim;
    return rope_kv_launch(qkv, ld, k, v, ld, T, c, n_heads, n_kv_heads, head_dim, max_seq, inv_freq, d_pos,
                          gpu_kv_rows{NULL, NULL, 0, NULL, 0}, s, e);
}

extern "C" int gpu_rope_kv_rows(dj_gpu *g, float *q, int64_t ldq, float *k, float *v, int64_t ldkv, int64_t B,
                                const gpu_kv_cache *c, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                int64_t max_seq, const float *inv_freq, const gpu_kv_rows *kv, cudaStream_t s,
                                dj_err *e) {
    if (attn_check("gpu_rope_kv_rows", n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (B < 0 || B > 65535 || !kv->pos || !kv->slot || kv->slot_stride < 0 || kv->slot_stride % head_dim ||
        (B > 1 && (ldq < n_heads * head_dim || ldkv < n_kv_heads * head_dim)))
        return dj_fail(e, "gpu_rope_kv_rows: bad B=%lld ldq=%lld ldkv=%lld", (long long)B, (long long)ldq,
                       (long long)ldkv);
    if (B == 0) return 0;
    return rope_kv_launch(q, ldq, k, v, ldkv, B, c, n_heads, n_kv_heads, head_dim, max_seq, inv_freq, NULL, *kv, s,
                          e);
}

// ---- SwiGLU
__global__ void swiglu_kernel(float *out, const float *gate, const float *up, int64_t T, int64_t n, int64_t ld) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < T * n; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / n, i = k - t * n;
        out[k] = silu_mul(gate[t * ld + i], up[t * ld + i]);
    }
}

extern "C" int gpu_swiglu(float *out, const float *gate, const float *up, int64_t T, int64_t n, int64_t ld,
                          cudaStream_t s, dj_err *e) {
    if (T < 0 || n < 1 || ld < n) return dj_fail(e, "gpu_swiglu: bad shape T=%lld n=%lld ld=%lld", (long long)T, (long long)n, (long long)ld);
    if (T == 0) return 0;
    swiglu_kernel<<<grid_1d(T * n, 256), 256, 0, s>>>(out, gate, up, T, n, ld);
    LAUNCH_CHECK("swiglu", s);
    return 0;
}

int ops_setup(dj_gpu *g, dj_err *e) { return load_module_of(g, (const void *)place_rows_kernel<false>, e); }

// ---- the tensor-parallel all-reduce's sum (tp_link.c): y = parts[0] + parts[1] + ..., in that order on every GPU,
// so every GPU's sum is the same bits. The parts may live on other devices (peer access).
struct sum_parts_args {
    const float *p[GPU_MAX_PARTS];
};
__global__ void sum_parts_kernel(float *y, sum_parts_args a, int n, int64_t len) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (int64_t)gridDim.x * blockDim.x) {
        float acc = a.p[0][i];
        for (int k = 1; k < n; k++) acc += a.p[k][i];
        y[i] = acc;
    }
}

extern "C" int gpu_sum_parts(float *y, const float *const *parts, int n, int64_t len, cudaStream_t s, dj_err *e) {
    if (n < 1 || n > GPU_MAX_PARTS || len < 0) return dj_fail(e, "gpu_sum_parts: %d parts of %lld", n, (long long)len);
    if (len == 0) return 0;
    sum_parts_args a = {};
    for (int k = 0; k < n; k++) a.p[k] = parts[k];
    sum_parts_kernel<<<grid_1d(len, 256), 256, 0, s>>>(y, a, n, len);
    LAUNCH_CHECK("sum_parts", s);
    return 0;
}

// ---- the tensor-parallel all-reduce on the device (tp_link.c), GPU `rank` of n. Each block b takes its own slice of
// the len floats (gpu_tp_exchange_blocks: every GPU cuts the same slices) and
//  1. pushes its slice of this GPU's partial into every other GPU's inbox (stores by peer access: nothing waits on a
//     remote read's round trip),
//  2. announces it: its count of exchanges (count[b], this GPU's memory) raised by one and written, after a system
//     fence, into the block's flag in every other GPU's memory,
//  3. waits, one thread a GPU polling this GPU's own memory, until every other GPU's flag for block b has reached
//     that count (>=: a GPU may already be one exchange further), then
//  4. sums its slice, part 0 + part 1 + ... in GPU order (this GPU's from mine, the others' from its inbox, read past
//     L1), so every GPU gets the same bits.
// A GPU's block b counts exactly the exchanges its peers' block b counts (the same sequence of lengths), so the
// flags need no reset between passes and a captured graph replays them. The block gives up, setting *err, when the
// host raises *abort (another GPU's call failed) or after about TP_XCHG_TIMEOUT_S seconds (a GPU that never comes).
// A programmatic dependent (kernels_impl.h): it triggers at once, so the GEMV after it loads its first weights while
// it waits for the others (resident 8B q4 on two H200: 1.73 -> 1.58 ms a token, bench/results/tp_x2).
#define TP_XCHG_TIMEOUT_S 30.0
#define TP_XCHG_THREADS 256
#ifndef TP_XCHG_SLICE  // (a build may set it in NVEXTRA to time others: bench/peer_ceilings)
#define TP_XCHG_SLICE 1024  // floats a block at least: one row of 4096 in 4 blocks
#endif
#define TP_XCHG_POLLS 4096
#ifndef TP_LL_MAX  // (a build may set it in NVEXTRA to time the flag protocol at every length: bench/peer_ceilings)
#define TP_LL_MAX (16 * 4096)  // floats an exchange sends as flagged words (tp_exchange_ll_kernel) at most
#endif
static long long tp_timeout_cycles(int clock_khz) { return (long long)(TP_XCHG_TIMEOUT_S * 1e3 * clock_khz); }
extern "C" int64_t gpu_tp_exchange_ll_max(void) { return TP_LL_MAX; }
extern "C" int gpu_tp_exchange_ll(int64_t len) { return len <= TP_LL_MAX; }
extern "C" int gpu_tp_exchange_blocks(int64_t len) {
    const int64_t b = (len + TP_XCHG_SLICE - 1) / TP_XCHG_SLICE;
    return (int)(b < 1 ? 1 : b > GPU_TP_XCHG_BLOCKS ? GPU_TP_XCHG_BLOCKS : b);
}
// Whether a poll of this GPU's memory, at its polls-th poll since t0, gives up: *abort raised or the timeout passed
// (then *err is set). The abort word is host memory: read across PCIe once every TP_XCHG_POLLS polls, not each.
__device__ __forceinline__ int tp_give_up(unsigned polls, long long t0, const volatile int *abort, volatile int *err,
                                          long long timeout_cycles) {
    if (polls % TP_XCHG_POLLS || !(*abort || clock64() - t0 > timeout_cycles)) return 0;
    *err = 1;
    return 1;
}
// Polls *f (this GPU's memory) until it reaches gen; 1 where it gave up (tp_give_up).
__device__ __forceinline__ int tp_poll(const volatile unsigned long long *f, unsigned long long gen,
                                       const volatile int *abort, volatile int *err, long long timeout_cycles) {
    const long long t0 = clock64();
    for (unsigned polls = 1; *f < gen; polls++)
        if (tp_give_up(polls, t0, abort, err, timeout_cycles)) return 1;
    return 0;
}
__global__ void tp_exchange_kernel(float *y, const float *mine, int64_t len, gpu_tp_xchg a, int n, int rank,
                                   unsigned long long *count, const volatile int *abort, volatile int *err,
                                   long long timeout_cycles) {
    __shared__ unsigned long long gen;
    pdl_wait();     // the partial written by the matmul before
    pdl_trigger();  // the kernel after (a GEMV) may start its weights' loads while this one waits for the others
    const int b = blockIdx.x;
    const int64_t slice = ((len + gridDim.x - 1) / gridDim.x + 3) & ~(int64_t)3;  // whole float4s
    const int64_t lo = b * slice, hi = lo + slice < len ? lo + slice : len;
    const int64_t hi4 = lo + ((hi > lo ? hi - lo : 0) & ~(int64_t)3);  // the float4 part; a tail of 0-3 floats
    for (int64_t i = lo + 4 * (int64_t)threadIdx.x; i < hi4; i += 4 * TP_XCHG_THREADS) {
        const float4 v = *(const float4 *)(mine + i);
        for (int k = 0; k < n; k++)
            if (k != rank) *(float4 *)(a.out[k] + i) = v;
    }
    for (int64_t i = hi4 + threadIdx.x; i < hi; i += TP_XCHG_THREADS)
        for (int k = 0; k < n; k++)
            if (k != rank) a.out[k][i] = mine[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        gen = count[b] + 1;
        count[b] = gen;
        __threadfence_system();  // every thread's pushes (ordered before by the barrier) land before the flags
        for (int k = 0; k < n; k++)
            if (k != rank) *(volatile unsigned long long *)(a.flag_out[k] + b) = gen;
    }
    __syncthreads();
    if ((int)threadIdx.x < n && (int)threadIdx.x != rank) {
        tp_poll(a.flag_in[threadIdx.x] + b, gen, abort, err, timeout_cycles);
        __threadfence_system();  // the peer's slice read after its flag
    }
    __syncthreads();
    for (int64_t i = lo + threadIdx.x; i < hi; i += TP_XCHG_THREADS) {
        float acc = rank == 0 ? mine[i] : __ldcg(a.in[0] + i);
        for (int k = 1; k < n; k++) acc += k == rank ? mine[i] : __ldcg(a.in[k] + i);
        y[i] = acc;
    }
}

// The same all-reduce for up to TP_LL_MAX floats by words that carry their own flag (gpu_tp_xchg's ll pointers): each
// value goes with the exchange's count in one 8-byte word (value bits low, the count's low 32 bits high), stored by
// peer access as one access, so a word read with the count it waits for holds that exchange's value: no system fence,
// no flag and no second round trip before the sum. On two H200 (NV18; bench/results/tp_x2/session63, in graphs):
// one row 4.8 -> 3.3 us, 16 rows 5.8 -> 4.7; at 64 rows the words' twice the bytes lose (9.6 -> 9.9), hence the
// limit. Each thread pushes its floats two words a store, then polls its own floats' words in
// this GPU's inbox until each carries the count, and sums them in GPU order as the kernel above does. A word of an
// older exchange in an inbox of the same parity carries another count (the inboxes are zeroed before the first
// exchange and at a rejoin, and counts start at 1), so the poll waits for equality.
__global__ void tp_exchange_ll_kernel(float *y, const float *mine, int64_t len, gpu_tp_xchg a, int n, int rank,
                                      unsigned long long *count, const volatile int *abort, volatile int *err,
                                      long long timeout_cycles) {
    __shared__ unsigned gen;
    pdl_wait();
    pdl_trigger();
    const int b = blockIdx.x;
    if (threadIdx.x == 0) {
        const unsigned long long c = count[b] + 1;
        count[b] = c;
        gen = (unsigned)c;
    }
    __syncthreads();
    const unsigned long long tag = (unsigned long long)gen << 32;
    const int64_t slice = ((len + gridDim.x - 1) / gridDim.x + 1) & ~(int64_t)1;  // whole pairs
    const int64_t lo = b * slice, hi = lo + slice < len ? lo + slice : len;
    for (int64_t i = lo + 2 * (int64_t)threadIdx.x; i < hi; i += 2 * TP_XCHG_THREADS) {
        const bool two = i + 1 < hi;
        const unsigned long long w0 = tag | __float_as_uint(mine[i]);
        const unsigned long long w1 = tag | (two ? __float_as_uint(mine[i + 1]) : 0u);
        for (int k = 0; k < n; k++)
            if (k != rank) {
                unsigned long long *d = a.ll_out[k] + i;
                if (two && ((uintptr_t)d & 15) == 0) {
                    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(d), "l"(w0), "l"(w1) : "memory");
                } else {
                    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(d), "l"(w0) : "memory");
                    if (two) asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(d + 1), "l"(w1) : "memory");
                }
            }
    }
    __syncthreads();  // every push read from mine before any sum is stored (y may be mine)
    const long long t0 = clock64();
    for (int64_t i = lo + threadIdx.x; i < hi; i += TP_XCHG_THREADS) {
        float acc = 0.0f;
        for (int k = 0; k < n; k++) {
            float v;
            if (k == rank) {
                v = mine[i];
            } else {
                unsigned long long w;
                for (unsigned polls = 1;; polls++) {
                    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(a.ll_in[k] + i) : "memory");
                    if ((unsigned)(w >> 32) == gen) break;
                    if (tp_give_up(polls, t0, abort, err, timeout_cycles)) return;
                }
                v = __uint_as_float((unsigned)w);
            }
            acc = k == 0 ? v : acc + v;
        }
        y[i] = acc;
    }
}

extern "C" int gpu_tp_exchange(float *y, const float *mine, int64_t len, const gpu_tp_xchg *x, int n, int rank,
                               unsigned long long *count, const volatile int *abort, volatile int *err, int clock_khz,
                               cudaStream_t s, dj_err *e) {
    if (n < 1 || n > GPU_MAX_PARTS || rank < 0 || rank >= n || len < 0)
        return dj_fail(e, "gpu_tp_exchange: rank %d of %d, %lld floats", rank, n, (long long)len);
    CUDA_CHECK(pdl_launch(gpu_tp_exchange_ll(len) ? tp_exchange_ll_kernel : tp_exchange_kernel,
                          dim3((unsigned)gpu_tp_exchange_blocks(len)), dim3(TP_XCHG_THREADS), 0, s, y, mine, len, *x,
                          n, rank, count, abort, err, tp_timeout_cycles(clock_khz)));
    LAUNCH_CHECK("tp_exchange", s);
    return 0;
}

// ---- the head split's gather (tp_link.c): every GPU's logits of its vocab rows into GPU 0's d_logits, GPU 0 waiting
// for them before its pick or its copy to the host. Per block b (the same blocks on every GPU, each its count of
// gathers, in lockstep as gpu_tp_exchange's):
//  GPU 0: raises its flag in every other GPU's memory (dst is free: its readers came before in stream order), places
//    its own slice, waits (one thread a GPU, polling its own memory) for every other GPU's flag, as the exchange does;
//  GPU k > 0: waits for GPU 0's flag in its own memory, pushes its slice into dst (stores by peer access), then after
//    a system fence raises its flag in GPU 0's memory.
// The handshake keeps a GPU from pushing into dst while GPU 0 still reads the last chunk's (nothing else orders the
// head's chunks between GPUs). Columns may start anywhere (an odd split), so the stores are scalar.
__global__ void tp_gather_kernel(float *dst, int64_t ld, int64_t c0, const float *mine, int64_t rows, int64_t cols,
                                 gpu_tp_flags a, int n, int rank, unsigned long long *count, const volatile int *abort,
                                 volatile int *err, long long timeout_cycles) {
    __shared__ unsigned long long gen;
    __shared__ int gave_up;  // GPU k > 0: GPU 0 never came (its call failed): nothing pushed
    const int b = blockIdx.x;
    const int64_t len = rows * cols, slice = (len + gridDim.x - 1) / gridDim.x;
    const int64_t lo = b * slice, hi = lo + slice < len ? lo + slice : len;
    if (threadIdx.x == 0) {
        gen = count[b] + 1;
        count[b] = gen;
        gave_up = 0;
        if (rank == 0)
            for (int k = 1; k < n; k++) *(volatile unsigned long long *)(a.flag_out[k] + b) = gen;
        else
            gave_up = tp_poll(a.flag_in[0] + b, gen, abort, err, timeout_cycles);
    }
    __syncthreads();
    if (gave_up) return;
    for (int64_t i = lo + threadIdx.x; i < hi; i += TP_XCHG_THREADS) {
        const int64_t r = i / cols, j = i - r * cols;
        dst[r * ld + c0 + j] = mine[i];
    }
    __syncthreads();
    if (rank > 0) {
        if (threadIdx.x == 0) {
            __threadfence_system();  // every thread's pushes (ordered before by the barrier) land before the flag
            *(volatile unsigned long long *)(a.flag_out[0] + b) = gen;
        }
        return;
    }
    if ((int)threadIdx.x > 0 && (int)threadIdx.x < n) {
        tp_poll(a.flag_in[threadIdx.x] + b, gen, abort, err, timeout_cycles);
        __threadfence_system();  // the peer's slice seen after its flag
    }
}

extern "C" int gpu_tp_gather(float *dst, int64_t ld, int64_t c0, const float *mine, int64_t rows, int64_t cols,
                             int blocks, const gpu_tp_flags *f, int n, int rank, unsigned long long *count,
                             const volatile int *abort, volatile int *err, int clock_khz, cudaStream_t s, dj_err *e) {
    if (n < 2 || n > GPU_MAX_PARTS || rank < 0 || rank >= n || rows < 1 || cols < 1 || c0 < 0 || c0 + cols > ld ||
        blocks < 1 || blocks > GPU_TP_XCHG_BLOCKS)
        return dj_fail(e, "gpu_tp_gather: rank %d of %d, (%lld, %lld) at column %lld of %lld, %d blocks", rank, n,
                       (long long)rows, (long long)cols, (long long)c0, (long long)ld, blocks);
    tp_gather_kernel<<<blocks, TP_XCHG_THREADS, 0, s>>>(dst, ld, c0, mine, rows, cols, *f, n, rank, count, abort, err,
                                                        tp_timeout_cycles(clock_khz));
    LAUNCH_CHECK("tp_gather", s);
    return 0;
}
