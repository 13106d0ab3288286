// kernels_impl.h: what the GPU files share and nothing else sees (kernels.h stays the one C API): the
// error-checking macros, the context's definition and the calls into it, the warp and block reductions, and
// how kernels read one weight of a given dtype. Included by kernels.cu (the runtime), ops.cu, matmul.cu,
// attention.cu and sample.cu only. Each is compiled on its own (no relocatable device code): every device
// function here is inline, with a copy in each file that calls it.
#ifndef DJINN_KERNELS_IMPL_H
#define DJINN_KERNELS_IMPL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>

#include "kernels.h"
extern "C" {  // model.h has no C++ guard of its own
#include "model.h"
}

// ---- error checking
// Each macro needs `dj_err *e` in scope and is used in functions returning int.
#define CUDA_CHECK(call)                                                                                  \
    do {                                                                                                  \
        cudaError_t err_ = (call);                                                                        \
        if (err_ != cudaSuccess)                                                                          \
            return dj_fail(e, "cuda: %s failed at %s:%d: %s (%s)", #call, __FILE__, __LINE__,            \
                           cudaGetErrorName(err_), cudaGetErrorString(err_));                             \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                \
    do {                                                                                                  \
        cublasStatus_t st_ = (call);                                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
            return dj_fail(e, "cublas: %s failed at %s:%d: %s", #call, __FILE__, __LINE__,                \
                           cublasGetStatusName(st_));                                                     \
    } while (0)

// After every launch: the launch error (bad configuration, too much shared memory), and in -DDJINN_DEBUG
// builds the kernel's own error, by synchronising (skipped while the stream is being captured). kernels.cu.
int launch_check(const char *kernel, cudaStream_t s, const char *file, int line, dj_err *e);
#define LAUNCH_CHECK(kernel, s)                                                                           \
    do {                                                                                                  \
        if (launch_check(kernel, s, __FILE__, __LINE__, e)) return -1;                                    \
    } while (0)

// Blocks for a grid-stride loop over n elements: enough to fill the GPU.
static inline int grid_1d(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

// ---- context (kernels.cu owns it; the op files read it)
#define GPU_WORKSPACE (32u << 20)  // cuBLAS workspace: the size NVIDIA recommends for Hopper

// Programmatic dependent launch: pdl_launch starts kernel k on s while the kernel before it still runs, once
// every block of that one has called pdl_trigger (or exited). k must call pdl_wait, which returns when the kernel
// before has finished and its writes are visible, before it touches memory that kernel reads or writes. A kernel
// that triggers right after its own wait lets the next one's blocks take each multiprocessor as its blocks there
// finish; the f16 GEMV lost by it (bench/results/pdl), so only the quantized GEMV, decode's rope and attention,
// the tensor-parallel exchange and the register kernel (qgemm.cu, behind its x layout) take part.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
template <typename... P, typename... A>
static cudaError_t pdl_launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, ((P)args)...);
}

struct dj_gpu {
    int device;
    char name[320];
    cublasHandle_t blas;
    void *workspace;        // GPU_WORKSPACE bytes for cuBLAS (stream-ordered)
    void *scratch;          // scratch_size bytes: x in wtype for cuBLAS, split-KV partials
    size_t scratch_size;
    int prefill_max_hd;     // largest head_dim whose prefill tiles fit the device's shared memory
    int tc_attn;            // prefill attention on the tensor cores (bf16x3) where head_dim allows; default on
    int tc_optin;           // the device's opt-in shared memory per block
    int dec_smem_max;       // dynamic shared memory decode attention may take a block (attention_setup)
    int qp_blocks;          // the persistent quantized GEMV's grid: QP_BPS blocks per SM where the device holds them
    int wgmma;              // qgemm.cu's Hopper kernel runs here (compute capability 9.0)
    int n_sm;               // multiprocessors (qgemm.cu's dispatch)
    int l2_bytes;           // the L2 cache (qgemm.cu's dispatch)
    unsigned *drow_tickets;  // dense_rows.cu's tickets, zero between its launches
    int loaded;             // 0 once a module of ours could not be loaded whole (gpu_kernels_loaded)
    int (*hold)(void *, dj_err *);  // gpu_set_hold's: called before anything that may block the host on the GPU
    void *hold_ctx;
};

// Every kernel of the module (a .cu file's) that holds `kernel`, loaded now (CUDA loads each kernel lazily, at its
// first launch, and that load may wait for the whole device: a stream waiting on the GPU for the host would then
// never move). A driver without the entry points (CUDA 12.4) leaves g->loaded 0. kernels.cu.
int load_module_of(dj_gpu *g, const void *kernel, dj_err *e);
// gpu_set_hold's call, where it is set (cuBLAS's launches, the scratch's growth).
static inline int gpu_hold_release(dj_gpu *g, dj_err *e) { return g->hold ? g->hold(g->hold_ctx, e) : 0; }

// Scratch for a call on stream s: grows outside a capture, refuses inside one (the graph would keep a
// pointer to memory freed here). kernels.cu.
int scratch_need(dj_gpu *g, size_t bytes, cudaStream_t s, dj_err *e);

// Set-up gpu_open runs once per device (attention.cu): attention_setup raises the shared-memory limits of
// the decode and FMA prefill kernels (refuses a device without room for decode), tc_setup those of the
// tensor-core prefill kernels and switches it on.
int attention_setup(dj_gpu *g, dj_err *e);
int tc_setup(dj_gpu *g, dj_err *e);
// matmul.cu: the persistent quantized GEMV's shared-memory limit and grid size.
int matmul_setup(dj_gpu *g, dj_err *e);
int ops_setup(dj_gpu *g, dj_err *e);     // ops.cu: its kernels loaded
int sample_setup(dj_gpu *g, dj_err *e);  // sample.cu: its kernels loaded
// qgemm.cu: whether the device runs its Hopper kernel (g->wgmma); its multiprocessors.
int qgemm_setup(dj_gpu *g, dj_err *e);
// qgemm.cu's estimate, for gpu_matmul's dispatch: how many tokens at the end of a pass of T (at most `most`) would
// cost the tensor-core kernel a padded block of their own; 0 where none would.
int qgemm_tail(const dj_gpu *g, int64_t T, int64_t n_in, int64_t n_out, int64_t most);
// matmul.cu's dispatch, for gpu_norm_qgemm_ok: up to how many tokens of an aligned x gpu_matmul gives q8/q4 W (n_out,
// n_in) to the persistent GEMV (0: none); past them it takes qgemm.cu's kernels where gpu_qgemm_wins.
int64_t gemv_tokens(const dj_gpu *g, uint32_t wtype, const void *w, int64_t n_in, int64_t n_out);

// dense_rows.cu: f16 and bf16 products of 2 to DROW_MAX_T tokens, W read once (matmul.cu's GPU_MM_ROWS).
#define DROW_MAX_T 16
int drow_setup(dj_gpu *g, dj_err *e);  // its tickets (zeroed) and kernels
// Whether it takes the product: f16 or bf16 W 16-byte aligned, 2 <= T <= DROW_MAX_T, n_in a multiple of 8.
int drow_takes(uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out);
// Scratch its slices' sums take for a pass of T tokens (never less for more tokens).
size_t drow_part_bytes(int64_t T);
// y = x . W^T with x already in W's dtype (xb; bf16: xlo its low parts, as the cuBLAS path's operands), in `slices`
// slices of the inputs (0: chosen by the shape; a count the shape cannot take is refused), their sums in part
// (drow_part_bytes(T)). PRECOND: drow_takes (gpu_matmul_rows checks it).
int drow_launch(dj_gpu *g, int64_t slices, float *y, const void *xb, const void *xlo, void *part, const void *w,
                uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);

// The attention shapes the kernels support (attention.cu; gpu_rope_kv checks them too): n_heads a multiple
// of n_kv_heads, head_dim even and <= 256. fn names the caller in the message.
int attn_check(const char *fn, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, dj_err *e);

// ---- SwiGLU's element: silu(g) * u, written once so that every kernel computing it (gpu_swiglu, the fused GEMV
// and qgemm's x) gives the same float.
static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// ---- KV cache elements (kvtype.h): how the kernels that write the cache (ops.cu) and read it (attention.cu) store
// and widen one element of each type. KT is a dj_kv_type; KV_SWITCH turns a run-time type into it.
template <int KT> struct kv_elem;
template <> struct kv_elem<DJ_KV_F32> { typedef float T; };
template <> struct kv_elem<DJ_KV_F16> { typedef __half T; };
template <> struct kv_elem<DJ_KV_Q8> { typedef int8_t T; };

// Element i of a cache of type KT, widened (q8: times its row's scale sc; ignored otherwise).
template <int KT> static __device__ __forceinline__ float kv_get(const void *p, int64_t i, float sc) {
    if constexpr (KT == DJ_KV_F32) return ((const float *)p)[i];
    else if constexpr (KT == DJ_KV_F16) return __half2float(((const __half *)p)[i]);
    else return (float)((const int8_t *)p)[i] * sc;
}

// CALL(KT) for the run-time type t (a statement; needs `dj_err *e` in a function returning int).
#define KV_SWITCH(t, CALL)                                                       \
    switch (t) {                                                                 \
    case DJ_KV_F32: CALL(DJ_KV_F32); break;                                      \
    case DJ_KV_F16: CALL(DJ_KV_F16); break;                                      \
    case DJ_KV_Q8: CALL(DJ_KV_Q8); break;                                        \
    default: return dj_fail(e, "KV cache type %d has no kernels", (int)(t));    \
    }

// ---- warp and block reductions
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// One warp writes row x (head_dim floats, any memory) as the cache row `row` (in rows of head_dim from `cache`;
// its q8 scale at scales[row]), rounding as kvtype.h says: f16 to nearest even (NaN as dj_f32_to_f16), q8 with
// s = max|x| / 127 and k = x / s rounded half to even (0 where that is NaN or beyond +-127), as dj_kv_q8_row does on
// the CPU.
template <int KT>
static __device__ __forceinline__ void kv_put_row_warp(void *cache, float *scales, int64_t row, const float *x,
                                                       int hd) {
    const int lane = threadIdx.x & 31;
    typedef typename kv_elem<KT>::T T;
    T *dst = (T *)cache + row * hd;
    if constexpr (KT == DJ_KV_Q8) {
        float amax = 0.0f;
        for (int d = lane; d < hd; d += 32) amax = fmaxf(amax, fabsf(x[d]));
        amax = warp_max(amax);  // exact in any order
        const float sc = amax / 127.0f;
        if (lane == 0) scales[row] = sc;
        for (int d = lane; d < hd; d += 32) {
            const float r = sc > 0.0f ? rintf(x[d] / sc) : 0.0f;
            dst[d] = r >= -127.0f && r <= 127.0f ? (int8_t)r : (int8_t)0;
        }
    } else if constexpr (KT == DJ_KV_F16) {
        for (int d = lane; d < hd; d += 32) {  // a NaN as dj_f32_to_f16 has it: its sign, quiet, no payload
            const float v = x[d];
            dst[d] = isnan(v) ? __ushort_as_half((unsigned short)(((__float_as_uint(v) >> 16) & 0x8000u) | 0x7e00u))
                              : __float2half_rn(v);
        }
    } else {
        for (int d = lane; d < hd; d += 32) dst[d] = x[d];
    }
}
static __device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. PRECOND: blockDim.x a multiple of 32, <= 1024.
static __device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // part may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0f;
    return warp_sum(v);
}
static __device__ __forceinline__ unsigned long long block_sum_u64(unsigned long long v) {
    __shared__ unsigned long long part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0ull;
    return warp_sum_u64(v);
}
// Inclusive prefix sum over the block in thread order. PRECOND: as block_sum.
static __device__ __forceinline__ unsigned long long block_scan_u64(unsigned long long v) {
    __shared__ unsigned long long part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        unsigned long long w = lane < nw ? part[lane] : 0ull;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        part[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    if (warp > 0) v += part[warp - 1];
    return v;
}

// ---- RMSNorm of one row by a block, written once so that every kernel normalising rows with it (ops.cu's
// rmsnorm_kernel, qgemm.cu's register-kernel x layout) gives the same floats
// Threads for a row of n (the reduction's order depends on it: kernels sharing row_norm launch alike).
static inline int norm_threads(int64_t n) { return n >= 4096 ? 1024 : n >= 1024 ? 512 : 128; }
// Element v of the row, normed with the row's scale and weighted by w: in this order, in every kernel.
static __device__ __forceinline__ float rms_at(float v, float scale, float w) { return v * scale * w; }

// Elements of a row a thread holds in registers while norming it (row_norm): rows of up to NORM_HELD
// norm_threads(n), 8192 floats, are read once.
#define NORM_HELD 8
// The row v = x + delta (delta NULL: x) normed, its RMS scale 1 / sqrt(mean(v^2) + eps), weighted by w: put(i,
// rms_at(v_i, scale, w_i)) for each of the thread's elements i (threadIdx.x + k blockDim.x); v also stored to sum
// (NULL: not stored; it may be x). Each thread sums its elements' squares in stride order, then block_sum. Where the
// row fits NORM_HELD a thread, every load (x, delta, w) is issued before the first store, so the row costs one
// memory round trip (a loop of a load, then a store to what may alias the next load, waited for each element in turn:
// bench/results/step_turn/session71); a longer row is read again from sum (or x) after the sum. PRECOND: every
// thread of the block calls it; blockDim.x = norm_threads(n); delta NULL where sum is NULL.
template <typename Put>
static __device__ __forceinline__ void row_norm(float *sum, const float *x, const float *delta, const float *w,
                                                int64_t n, float eps, Put put) {
    const int64_t bd = blockDim.x;
    float ss = 0.0f;
    if (n <= NORM_HELD * bd) {
        float v[NORM_HELD], wv[NORM_HELD];
#pragma unroll
        for (int k = 0; k < NORM_HELD; k++) {
            const int64_t i = threadIdx.x + k * bd;
            v[k] = i < n ? x[i] : 0.0f, wv[k] = i < n ? w[i] : 0.0f;
            if (delta && i < n) v[k] += delta[i];
        }
#pragma unroll
        for (int k = 0; k < NORM_HELD; k++) {
            const int64_t i = threadIdx.x + k * bd;
            if (i >= n) break;
            if (sum) sum[i] = v[k];
            ss = fmaf(v[k], v[k], ss);  // one rounding, whatever the compiler would contract
        }
        const float scale = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
#pragma unroll
        for (int k = 0; k < NORM_HELD; k++) {
            const int64_t i = threadIdx.x + k * bd;
            if (i >= n) break;
            put(i, rms_at(v[k], scale, wv[k]));
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < n; i += bd) {
        float v = x[i];
        if (delta) v += delta[i];
        if (sum) sum[i] = v;
        ss = fmaf(v, v, ss);
    }
    const float scale = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    // a thread reads back only the elements it stored: no barrier
    for (int64_t i = threadIdx.x; i < n; i += bd) put(i, rms_at(sum ? sum[i] : x[i], scale, w[i]));
}

// ---- weight dtypes: element i of W (wtype WT) as a float, exactly (f16 and bf16 widen without rounding)
template <int WT> static __device__ __forceinline__ float wload(const void *w, int64_t i);
template <> __device__ __forceinline__ float wload<DJ_F32>(const void *w, int64_t i) { return ((const float *)w)[i]; }
template <> __device__ __forceinline__ float wload<DJ_F16>(const void *w, int64_t i) {
    return __half2float(((const __half *)w)[i]);
}
template <> __device__ __forceinline__ float wload<DJ_BF16>(const void *w, int64_t i) {
    return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
}

// q8 and q4 rows (model.h): a group's values take q_group_bytes bytes; a 16-byte chunk of values holds
// q_chunk_weights weights (q4: one group; q8: half of one).
static __host__ __device__ constexpr int q_group_bytes(uint32_t wt) { return wt == DJ_Q8 ? DJ_QGROUP : DJ_QGROUP / 2; }
static __host__ __device__ constexpr int q_chunk_weights(uint32_t wt) { return wt == DJ_Q8 ? 16 : 32; }

// A q8 or q4 group parameter p (model.h): its scale, exactly; c = p >> 10 sets its zero point (q8 4 c - 128, q4 c / 4).
static __device__ __forceinline__ float q_scale(uint32_t p) {
    return __half2float(__ushort_as_half((unsigned short)((p & 0x3FFu) << 5)));
}

// Widening a pair of stored values to f16 (the prefill's dequantization and qgemm.cu's fragments), each in the low
// bits of a half: q8 1024 + (k + 128) (bits 0x6400 | v), q4 256 + k (bits 0x5C00 | k << 2, a quarter a unit). The
// pair's parameters: s the scale and off the value at the zero point (q8 1024 + 4 c, bits 0x6400 + 4 c; q4 256 +
// c / 4, bits 0x5C00 | c); then (v - off) * s is (k - z) * s, the subtraction exact and the product rounded once.
template <int WT> static __device__ __forceinline__ void q_widen_params(uint32_t p, __half2 *s, __half2 *off) {
    *s = __half2half2(__ushort_as_half((unsigned short)((p & 0x3FFu) << 5)));
    const uint32_t off_bits = WT == DJ_Q8 ? 0x6400u + 4 * (p >> 10) : 0x5C00u | (p >> 10);
    *off = __half2half2(__ushort_as_half((unsigned short)off_bits));
}
static __device__ __forceinline__ uint32_t q_widen2(uint32_t pair, __half2 s, __half2 off) {
    __half2 v;
    memcpy(&v, &pair, 4);
    v = __hmul2(__hsub2(v, off), s);
    uint32_t o;
    memcpy(&o, &v, 4);
    return o;
}

// The register kernel's widening, one instruction where the compiler makes two: (a & m) | e with m and e immediates
// takes two LOP3s (one immediate an instruction: ptxas, sm_90, 8.6 LOP3 a q4 mma where 4 do). The constants are set
// once by an asm the compiler cannot fold back into immediates.
template <uint32_t V> static __device__ __forceinline__ uint32_t reg_const() {
    uint32_t r;
    asm("mov.b32 %0, %1;" : "=r"(r) : "n"(V));
    return r;
}
static __device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t m, uint32_t e) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(m), "r"(e));  // (a & m) | e
    return d;
}
// d (16x8 f32) += a (16x16 f16, row) . b (16x8 f16, col)
static __device__ __forceinline__ void mma16816(float *d, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An m16n8 tile's sums held by a lane into y (T, n_out): d[0], d[1] at (row, tokens tok, tok + 1), d[2], d[3] at
// row + 8 (row = the tile's first + lane / 4, tok = its first + 2 (lane % 4)); nothing past T or n_out.
static __device__ __forceinline__ void store_frag(float *y, int64_t T, int64_t n_out, int64_t row, int64_t tok,
                                                  const float *d) {
    if (row < n_out) {
        if (tok < T) y[tok * n_out + row] = d[0];
        if (tok + 1 < T) y[(tok + 1) * n_out + row] = d[1];
    }
    if (row + 8 < n_out) {
        if (tok < T) y[tok * n_out + row + 8] = d[2];
        if (tok + 1 < T) y[(tok + 1) * n_out + row + 8] = d[3];
    }
}

// A ticket's release-acquire add at GPU scope: releases what this thread (and what a barrier ordered before it) has
// written, acquires what every earlier taker released; the ticket's value before the add.
static __device__ __forceinline__ unsigned ticket_add(unsigned *ticket) {
    unsigned t;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(t) : "l"(ticket) : "memory");
    return t;
}
// The same for a warp's sums: lane 0 takes the ticket after the warp's barrier (which orders its lanes' stores before
// it), every lane gets its value, and a second barrier orders the lanes' reads after lane 0's acquire. (With a
// __threadfence by every lane before a plain add and after it the 8B q4 layer took 0.4-3.7% longer at 4-32 tokens,
// the halves' up to 2.3%: bench/results/qgemm_reg/session60.)
static __device__ __forceinline__ unsigned warp_ticket(unsigned *ticket) {
    __syncwarp();
    unsigned t = 0;
    if ((threadIdx.x & 31) == 0) t = ticket_add(ticket);
    t = __shfl_sync(0xFFFFFFFFu, t, 0);
    __syncwarp();
    return t;
}

// Element i of a q8 or q4 row of n weights (model.h's layout), exactly scale * (k - z).
template <int WT> static __device__ __forceinline__ float qload(const uint8_t *row, int64_t n, int64_t i) {
    constexpr int QB = q_group_bytes(WT);  // bytes of values per group
    const int64_t g = i / DJ_QGROUP, j = i - g * DJ_QGROUP;
    const uint16_t p = *(const uint16_t *)(row + (n + DJ_QGROUP - 1) / DJ_QGROUP * QB + 2 * g);
    if (WT == DJ_Q8) return q_scale(p) * ((float)(int8_t)row[g * QB + j] - (float)(4 * (p >> 10) - 128));
    const int k = (row[g * QB + (j & (QB - 1))] >> (j < QB ? 0 : 4)) & 15;
    return q_scale(p) * ((float)k - (float)(p >> 10) * 0.25f);
}

#endif
