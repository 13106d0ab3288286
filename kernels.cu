// kernels.cu: Djinn's GPU kernels and cuBLAS/cuBLASLt calls, behind the C API in kernels.h.
// Built without fast-math: expf, sinf/cosf and division are the accurate ones, so results stay within
// rounding of the CPU reference in model.c.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cuda_pipeline.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
// builds the kernel's own error, by synchronising (skipped while the stream is being captured).
static int launch_check(const char *kernel, cudaStream_t s, const char *file, int line, dj_err *e) {
    cudaError_t err = cudaGetLastError();
#ifdef DJINN_DEBUG
    if (err == cudaSuccess) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        err = cudaStreamIsCapturing(s, &cs);
        if (err == cudaSuccess && cs == cudaStreamCaptureStatusNone) err = cudaStreamSynchronize(s);
    }
#else
    (void)s;
#endif
    if (err != cudaSuccess)
        return dj_fail(e, "cuda: kernel %s failed at %s:%d: %s (%s)", kernel, file, line, cudaGetErrorName(err),
                       cudaGetErrorString(err));
    return 0;
}
#define LAUNCH_CHECK(kernel, s)                                                                           \
    do {                                                                                                  \
        if (launch_check(kernel, s, __FILE__, __LINE__, e)) return -1;                                    \
    } while (0)

// Launches kernel k (grid, block, dynamic shared memory smem) on s, with the programmatic-dependent-launch
// attribute when pdl is set, and checks the launch.
template <typename... P, typename... A>
static int launch_k(const char *name, void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int pdl,
                    dj_err *e, A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cfg.attrs = attr, cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t err = cudaLaunchKernelEx(&cfg, k, ((P)args)...);
    if (err != cudaSuccess)
        return dj_fail(e, "cuda: launching kernel %s failed: %s (%s)", name, cudaGetErrorName(err),
                       cudaGetErrorString(err));
    return launch_check(name, s, __FILE__, __LINE__, e);
}

// ---- device discovery
extern "C" int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

// ---- small device helpers
// Programmatic dependent launch (sm_90): a kernel launched with the PDL attribute (launch_k with pdl set) may
// start while the kernel before it in the stream is still running. Such a kernel may only read constant data
// (weights, norm weights, rope table) before pdl_wait(), which returns once the previous kernel has finished
// and its writes are visible; every kernel of the fused decode chain calls pdl_wait() before it reads or writes
// anything else, and pdl_trigger() early so that the next one can be scheduled as its own blocks retire.
// Launched without the attribute, both are no-ops.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. PRECOND: blockDim.x a multiple of 32, <= 1024.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // part may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0f;
    return warp_sum(v);
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return warp_max(v);
}
__device__ unsigned long long block_sum_u64(unsigned long long v) {
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
__device__ unsigned long long block_scan_u64(unsigned long long v) {
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

// ---- context
#define GPU_WORKSPACE (32u << 20)  // cuBLAS/cuBLASLt workspace: the size NVIDIA recommends for Hopper
#define LT_CACHE 32                // cuBLASLt plans kept, keyed by shape and dtype

typedef struct {
    int used;
    uint32_t wtype;
    int64_t T, n_in, n_out;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

struct dj_gpu {
    int device;
    char name[320];
    int n_sm;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace;        // GPU_WORKSPACE bytes, shared by cuBLAS and cuBLASLt (stream-ordered)
    void *scratch;          // scratch_size bytes: x in wtype for cuBLAS, split-KV partials
    size_t scratch_size;
    lt_plan plans[LT_CACHE];
    int next_plan;
    int prefill_max_hd;     // largest head_dim whose prefill tiles fit the device's shared memory
    int pdl;                // fused decode kernels and decode attention launch with the PDL attribute
    int tc_attn;            // prefill attention on the tensor cores (bf16x3) where head_dim allows; default on
    int tc_optin;           // the device's opt-in shared memory per block
    int fused_blocks;       // persistent grid of the fused decode GEMV: blocks per SM x SMs
};

static int attention_setup(dj_gpu *g, dj_err *e);
static int fused_setup(dj_gpu *g, dj_err *e);
static int tc_setup(dj_gpu *g, dj_err *e);

static void lt_plan_drop(lt_plan *p) {
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

extern "C" int gpu_open(dj_gpu **out, int device, dj_err *e) {
    *out = NULL;
    int n = gpu_count();
    if (n == 0) return dj_fail(e, "cuda: no GPU found (cudaGetDeviceCount reports none or no driver)");
    if (device < 0 || device >= n) return dj_fail(e, "cuda: device %d does not exist (%d found)", device, n);
    dj_gpu *g = (dj_gpu *)calloc(1, sizeof *g);
    if (!g) return dj_fail(e, "out of host memory for the GPU context");
    g->device = device;
    int rc = -1;
    do {
        cudaDeviceProp p;
        if (cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&p, device) != cudaSuccess) {
            dj_fail(e, "cuda: cannot select device %d: %s", device, cudaGetErrorName(cudaGetLastError()));
            break;
        }
        g->n_sm = p.multiProcessorCount;
        snprintf(g->name, sizeof g->name, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                 p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30));
        if (p.major < 8) {
            dj_fail(e, "cuda: %s is too old: Djinn's kernels need compute capability 8.0 or newer", g->name);
            break;
        }
        cublasStatus_t st = cublasCreate(&g->blas);
        if (st != CUBLAS_STATUS_SUCCESS) {
            dj_fail(e, "cublas: cublasCreate failed: %s", cublasGetStatusName(st));
            break;
        }
        st = cublasLtCreate(&g->lt);
        if (st != CUBLAS_STATUS_SUCCESS) {
            dj_fail(e, "cublas: cublasLtCreate failed: %s", cublasGetStatusName(st));
            break;
        }
        if (gpu_malloc(&g->workspace, GPU_WORKSPACE, "cuBLAS workspace", e)) break;
        st = cublasSetWorkspace(g->blas, g->workspace, GPU_WORKSPACE);
        if (st != CUBLAS_STATUS_SUCCESS) {
            dj_fail(e, "cublas: cublasSetWorkspace failed: %s", cublasGetStatusName(st));
            break;
        }
        if (attention_setup(g, e) || fused_setup(g, e) || tc_setup(g, e)) break;
        rc = 0;
    } while (0);
    if (rc) {
        gpu_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

extern "C" void gpu_close(dj_gpu *g) {
    if (!g) return;
    for (int i = 0; i < LT_CACHE; i++) {
        lt_plan_drop(&g->plans[i]);
    }
    if (g->lt) cublasLtDestroy(g->lt);
    if (g->blas) cublasDestroy(g->blas);
    gpu_free(g->workspace);
    gpu_free(g->scratch);
    free(g);
}

extern "C" const char *gpu_name(const dj_gpu *g) { return g->name; }

extern "C" int gpu_reserve(dj_gpu *g, size_t bytes, dj_err *e) {
    if (bytes <= g->scratch_size) return 0;
    bytes = (size_t)dj_align_up(bytes, 1u << 20);
    CUDA_CHECK(cudaDeviceSynchronize());  // work in flight may still use the old scratch
    gpu_free(g->scratch);
    g->scratch = NULL;
    g->scratch_size = 0;
    if (gpu_malloc(&g->scratch, bytes, "GPU scratch (activations in the weight dtype, attention partials)", e))
        return -1;
    g->scratch_size = bytes;
    return 0;
}

// Scratch for a call on stream s: grows outside a capture, refuses inside one (the graph would keep a
// pointer to memory freed here).
static int scratch_need(dj_gpu *g, size_t bytes, cudaStream_t s, dj_err *e) {
    if (bytes <= g->scratch_size) return 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(s, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return dj_fail(e, "cuda: GPU scratch too small during graph capture (%zu bytes, need %zu): call "
                          "gpu_reserve before capturing", g->scratch_size, bytes);
    return gpu_reserve(g, bytes, e);
}

// ---- memory
extern "C" int gpu_malloc(void **p, size_t bytes, const char *what, dj_err *e) {
    *p = NULL;
    cudaError_t err = cudaMalloc(p, bytes ? bytes : 1);
    if (err == cudaSuccess) return 0;
    *p = NULL;
    cudaGetLastError();  // an allocation failure is not sticky; clear it for the next call
    size_t fr = 0, tot = 0;
    if (err == cudaErrorMemoryAllocation && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
        return dj_fail(e, "GPU out of memory: %s needs %.1f MiB, %.1f MiB free of %.1f MiB", what,
                       (double)bytes / (1 << 20), (double)fr / (1 << 20), (double)tot / (1 << 20));
    return dj_fail(e, "cuda: cudaMalloc of %zu bytes for %s failed: %s (%s)", bytes, what, cudaGetErrorName(err),
                   cudaGetErrorString(err));
}

extern "C" void gpu_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" int gpu_mem_info(size_t *free_bytes, size_t *total_bytes, dj_err *e) {
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return 0;
}

extern "C" int gpu_memset(void *p, int byte, size_t bytes, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, s));
    return 0;
}

// cudaMemcpy from pageable memory may return before the DMA lands, and work on non-blocking streams does
// not wait for the legacy stream: synchronise so the data is on the device when this returns.
extern "C" int gpu_h2d(void *dst, const void *src, size_t bytes, dj_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    return 0;
}
extern "C" int gpu_d2h(void *dst, const void *src, size_t bytes, dj_err *e) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return 0;
}
extern "C" int gpu_h2d_async(void *dst, const void *src, size_t bytes, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return 0;
}
extern "C" int gpu_d2h_async(void *dst, const void *src, size_t bytes, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    return 0;
}
extern "C" int gpu_d2d_async(void *dst, const void *src, size_t bytes, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    return 0;
}

extern "C" int gpu_host_alloc(void **p, size_t bytes, const char *what, dj_err *e) {
    *p = NULL;
    cudaError_t err = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err == cudaSuccess) return 0;
    *p = NULL;
    cudaGetLastError();
    return dj_fail(e, "cuda: cannot pin %.1f MiB of host memory for %s: %s (%s)", (double)bytes / (1 << 20), what,
                   cudaGetErrorName(err), cudaGetErrorString(err));
}

extern "C" int gpu_host_device_ptr(void **dev, void *host, dj_err *e) {
    *dev = NULL;
    CUDA_CHECK(cudaHostGetDevicePointer(dev, host, 0));
    return 0;
}

extern "C" void gpu_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

extern "C" int gpu_host_register(void *p, size_t bytes, int read_only, dj_err *e) {
    unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    cudaError_t err = cudaHostRegister(p, bytes, flags);
    if (err == cudaSuccess) return 0;
    cudaGetLastError();
    return dj_fail(e, "cuda: cudaHostRegister of %.1f MiB failed: %s (%s)", (double)bytes / (1 << 20),
                   cudaGetErrorName(err), cudaGetErrorString(err));
}

extern "C" int gpu_host_unregister(void *p, dj_err *e) {
    CUDA_CHECK(cudaHostUnregister(p));
    return 0;
}

// ---- streams, events, graphs
extern "C" int gpu_stream_create(cudaStream_t *s, dj_err *e) {
    CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    return 0;
}
extern "C" void gpu_stream_destroy(cudaStream_t s) {
    if (s) cudaStreamDestroy(s);
}
extern "C" int gpu_stream_sync(cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return 0;
}
extern "C" int gpu_sync(dj_err *e) {
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
extern "C" int gpu_event_create(cudaEvent_t *ev, int timing, dj_err *e) {
    CUDA_CHECK(cudaEventCreateWithFlags(ev, timing ? cudaEventDefault : cudaEventDisableTiming));
    return 0;
}
extern "C" void gpu_event_destroy(cudaEvent_t ev) {
    if (ev) cudaEventDestroy(ev);
}
extern "C" int gpu_event_record(cudaEvent_t ev, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaEventRecord(ev, s));
    return 0;
}
extern "C" int gpu_stream_wait(cudaStream_t s, cudaEvent_t ev, dj_err *e) {
    CUDA_CHECK(cudaStreamWaitEvent(s, ev, 0));
    return 0;
}
extern "C" int gpu_event_sync(cudaEvent_t ev, dj_err *e) {
    CUDA_CHECK(cudaEventSynchronize(ev));
    return 0;
}
extern "C" int gpu_event_ms(float *ms, cudaEvent_t start, cudaEvent_t end, dj_err *e) {
    CUDA_CHECK(cudaEventElapsedTime(ms, start, end));
    return 0;
}
extern "C" int gpu_graph_begin(cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    return 0;
}
extern "C" int gpu_graph_end(cudaStream_t s, cudaGraphExec_t *exec, dj_err *e) {
    cudaGraph_t graph = NULL;
    *exec = NULL;
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    cudaError_t err = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
        *exec = NULL;
        return dj_fail(e, "cuda: cudaGraphInstantiate failed at %s:%d: %s (%s)", __FILE__, __LINE__,
                       cudaGetErrorName(err), cudaGetErrorString(err));
    }
    return 0;
}
extern "C" int gpu_graph_launch(cudaGraphExec_t exec, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    return 0;
}
extern "C" void gpu_graph_destroy(cudaGraphExec_t exec) {
    if (exec) cudaGraphExecDestroy(exec);
}

// ---- matmul
// Weight dtypes: a 16-byte chunk of W holds VEC elements, unpacked to floats.
template <int WT> struct wtraits;
template <> struct wtraits<DJ_F32> { static constexpr int VEC = 4, SIZE = 4; };
template <> struct wtraits<DJ_F16> { static constexpr int VEC = 8, SIZE = 2; };
template <> struct wtraits<DJ_BF16> { static constexpr int VEC = 8, SIZE = 2; };

template <int WT> __device__ __forceinline__ void unpack16(uint4 v, float *f);
template <> __device__ __forceinline__ void unpack16<DJ_F32>(uint4 v, float *f) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
}
template <> __device__ __forceinline__ void unpack16<DJ_F16>(uint4 v, float *f) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __half2 h;
        memcpy(&h, &u[i], 4);
        float2 p = __half22float2(h);
        f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
}
template <> __device__ __forceinline__ void unpack16<DJ_BF16>(uint4 v, float *f) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        __nv_bfloat162 h;
        memcpy(&h, &u[i], 4);
        float2 p = __bfloat1622float2(h);
        f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
}

template <int WT> __device__ __forceinline__ float wload(const void *w, int64_t i);
template <> __device__ __forceinline__ float wload<DJ_F32>(const void *w, int64_t i) { return ((const float *)w)[i]; }
template <> __device__ __forceinline__ float wload<DJ_F16>(const void *w, int64_t i) {
    return __half2float(((const __half *)w)[i]);
}
template <> __device__ __forceinline__ float wload<DJ_BF16>(const void *w, int64_t i) {
    return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
}

// W is read exactly once: stream it past L1 so x stays cached there.
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

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

static int grid_1d(int64_t n, int threads) {  // blocks for a grid-stride loop: enough to fill the GPU
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

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

static const char *wtype_name(uint32_t wtype) {  // as dj_dtype_name, without linking model.o
    return wtype == DJ_F32 ? "f32" : wtype == DJ_F16 ? "f16" : wtype == DJ_BF16 ? "bf16" : "?";
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

// cuBLASLt with a small cache of plans (descriptors + heuristic's algorithm), so repeated shapes cost no
// host-side heuristic query.
static int lt_plan_get(dj_gpu *g, lt_plan **out, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out,
                       dj_err *e) {
    for (int i = 0; i < LT_CACHE; i++) {
        lt_plan *p = &g->plans[i];
        if (p->used && p->wtype == wtype && p->T == T && p->n_in == n_in && p->n_out == n_out) {
            *out = p;
            return 0;
        }
    }
    lt_plan *p = &g->plans[g->next_plan];
    g->next_plan = (g->next_plan + 1) % LT_CACHE;
    lt_plan_drop(p);
    cudaDataType_t dt = cuda_dtype(wtype);
    cublasOperation_t ta = CUBLAS_OP_T;
    p->a = p->b = p->c = NULL;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    p->used = 1;  // from here on lt_plan_drop destroys whatever exists
    p->wtype = 0xffffffffu;  // matches no lookup until complete
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, dt, (uint64_t)n_in, (uint64_t)n_out, n_in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, dt, (uint64_t)n_in, (uint64_t)T, n_in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, (uint64_t)n_out, (uint64_t)T, n_out));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = GPU_WORKSPACE;
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || nres == 0) {
        return dj_fail(e, "cublasLt: no algorithm for %s T=%lld n_in=%lld n_out=%lld: %s", wtype_name(wtype),
                       (long long)T, (long long)n_in, (long long)n_out, cublasGetStatusName(st));
    }
    p->algo = res.algo;
    p->wtype = wtype, p->T = T, p->n_in = n_in, p->n_out = n_out;
    *out = p;
    return 0;
}

static int matmul_cublaslt(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                           int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    const void *xb, *xlo;
    if (blas_operand(g, &xb, &xlo, x, wtype, T, n_in, s, e)) return -1;
    lt_plan *p = NULL;
    if (lt_plan_get(g, &p, wtype, T, n_in, n_out, e)) return -1;
    const float alpha = 1.0f, beta = 0.0f, one = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(g->lt, p->op, &alpha, w, p->a, xb, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                g->workspace, GPU_WORKSPACE, s));
    if (xlo)  // y += W . lo (bf16 residual); the heuristic's algorithm is valid for beta != 0 as well
        CUBLAS_CHECK(cublasLtMatmul(g->lt, p->op, &alpha, w, p->a, xlo, p->b, &one, y, p->c, y, p->c, &p->algo,
                                    g->workspace, GPU_WORKSPACE, s));
    return 0;
}

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
    case GPU_MM_CUBLASLT:
        return matmul_cublaslt(g, y, x, w, wtype, T, n_in, n_out, s, e);
    default:
        return dj_fail(e, "gpu_matmul: unknown path %d", path);
    }
}

extern "C" int gpu_matmul(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                          int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e) {
    return gpu_matmul_path(g, GPU_MM_AUTO, y, x, w, wtype, T, n_in, n_out, s, e);
}

// ---- normalisation and activations
// One block per row. ADD: x += delta first (the residual add), then out = rmsnorm(x) * w.
template <bool ADD>
__global__ void rmsnorm_kernel(float *out, float *x, const float *delta, const float *w, int64_t n, float eps) {
    const int64_t off = (int64_t)blockIdx.x * n;
    float *xr = x + off;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (ADD) {
            v += delta[off + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    // The same thread reads back what it wrote above, so no barrier is needed; out may alias x or delta.
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[off + i] = xr[i] * scale * w[i];
}

static int norm_threads(int64_t n) { return n >= 4096 ? 1024 : n >= 1024 ? 512 : 128; }

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

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, int64_t T, int64_t n, int64_t ld) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < T * n; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / n, i = k - t * n;
        const float g = gate[t * ld + i];
        out[k] = g / (1.0f + expf(-g)) * up[t * ld + i];
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

// ---- RoPE
// One thread per rotated pair (t, head, i). The products and the difference are rounded separately
// (no FMA contraction), as the CPU reference computes them.
__global__ void rope_kernel(float *x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t ld, const float *inv_freq,
                            const int32_t *d_pos) {
    const int64_t half = head_dim / 2, per_t = n_heads * half;
    const int32_t pos0 = *d_pos;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < T * per_t; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / per_t, r = k - t * per_t, h = r / half, i = r - h * half;
        float *xr = x + t * ld + h * head_dim;
        const float ang = __fmul_rn((float)(pos0 + t), inv_freq[i]);
        float sn, cs;
        sincosf(ang, &sn, &cs);
        const float a = xr[i], b = xr[i + half];
        xr[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        xr[i + half] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
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

// ---- KV cache
__global__ void kv_write_kernel(float *k_cache, float *v_cache, const float *k, const float *v, int64_t ld, int64_t T,
                                int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos) {
    const int64_t per_t = n_kv_heads * head_dim;
    const int64_t pos0 = *d_pos;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < T * per_t; j += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = j / per_t, r = j - t * per_t, h = r / head_dim, d = r - h * head_dim;
        const int64_t pos = pos0 + t;
        if (pos < 0 || pos >= max_seq) continue;
        const int64_t dst = (h * max_seq + pos) * head_dim + d;
        k_cache[dst] = k[t * ld + r];
        v_cache[dst] = v[t * ld + r];
    }
}

extern "C" int gpu_kv_write(float *k_cache, float *v_cache, const float *k, const float *v, int64_t ld, int64_t T,
                            int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos,
                            cudaStream_t s, dj_err *e) {
    if (T < 0 || n_kv_heads < 1 || head_dim < 1 || max_seq < 1 || ld < n_kv_heads * head_dim)
        return dj_fail(e, "gpu_kv_write: bad shape T=%lld n_kv_heads=%lld head_dim=%lld ld=%lld", (long long)T,
                       (long long)n_kv_heads, (long long)head_dim, (long long)ld);
    if (T == 0) return 0;
    kv_write_kernel<<<grid_1d(T * n_kv_heads * head_dim, 256), 256, 0, s>>>(k_cache, v_cache, k, v, ld, T, n_kv_heads,
                                                                           head_dim, max_seq, d_pos);
    LAUNCH_CHECK("kv_write", s);
    return 0;
}

// ---- attention: decode (split-KV, then combine)
#define DEC_CHUNK 64    // keys per split: small, so that even one kv head at a short context fills the GPU
#define DEC_G 8         // query heads of one kv head handled per block (more: blockIdx.z)
#define DEC_THREADS 128
#define HD_MAX 256

// One block per (split, kv head, group of <= 8 query heads). Scores for the chunk go to shared memory,
// then softmax per head, then P.V; writes the unnormalised partial output with its max and sum:
//   part_o (n_heads, n_splits, head_dim), part_ml (n_heads, n_splits, 2) = (max score, sum of exp).
// PRECOND: head_dim even, <= 256; blockDim.x == DEC_THREADS.
__global__ __launch_bounds__(DEC_THREADS) void attn_decode_split_kernel(
    float *part_o, float *part_ml, const float *q, const float *k_cache, const float *v_cache, int n_heads,
    int group, int head_dim, int max_seq, int n_splits, float scale, const int32_t *d_pos) {
    __shared__ float sc[DEC_G * DEC_CHUNK];      // scores, then probabilities (g, key)
    __shared__ float red[DEC_THREADS * DEC_G];   // P.V partials across key slices
    __shared__ float ml[DEC_G * 2];
    extern __shared__ __align__(16) float dec_kv[];  // the chunk's keys, then its values: (2, DEC_CHUNK, hd)
    pdl_wait();
    pdl_trigger();
    const int split = blockIdx.x, kvh = blockIdx.y, g0 = blockIdx.z * DEC_G;
    const int ng = min(DEC_G, group - g0), hd = head_dim;
    const int pos = min(*d_pos, max_seq - 1);
    const int k0 = split * DEC_CHUNK;
    if (k0 > pos) return;  // whole block: this split is beyond the context
    const int nk = min(DEC_CHUNK, pos + 1 - k0);
    const int h0 = kvh * group + g0;  // first query head of this block
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const float *kb = k_cache + ((int64_t)kvh * max_seq + k0) * hd;
    const float *vb = v_cache + ((int64_t)kvh * max_seq + k0) * hd;
    float *Ks = dec_kv, *Vs = dec_kv + DEC_CHUNK * hd;

    // The chunk's keys and values (nk rows, contiguous in the cache) into shared memory with every copy in
    // flight at once (cp.async): one memory round trip, where loads inside the loops below would be one per
    // step. Rows past nk are never read, here or below.
    const int n = nk * hd;
    if (hd % 4 == 0) {
        for (int i = 4 * tid; i < n; i += 4 * DEC_THREADS) {
            __pipeline_memcpy_async(Ks + i, kb + i, 16);
            __pipeline_memcpy_async(Vs + i, vb + i, 16);
        }
    } else {
        for (int i = tid; i < n; i += DEC_THREADS) {
            __pipeline_memcpy_async(Ks + i, kb + i, 4);
            __pipeline_memcpy_async(Vs + i, vb + i, 4);
        }
    }
    __pipeline_commit();

    // q in registers: lane holds dims lane + 32 i of each head
    float qr[DEC_G][HD_MAX / 32];
#pragma unroll
    for (int g = 0; g < DEC_G; g++)
#pragma unroll
        for (int i = 0; i < HD_MAX / 32; i++) {
            const int d = lane + 32 * i;
            qr[g][i] = (g < ng && d < hd) ? q[(int64_t)(h0 + g) * hd + d] : 0.0f;
        }
    __pipeline_wait_prior(0);
    __syncthreads();

    // scores: warp per key, lanes across head_dim
    for (int j = warp; j < nk; j += DEC_THREADS / 32) {
        float kv[HD_MAX / 32];
#pragma unroll
        for (int i = 0; i < HD_MAX / 32; i++) {
            const int d = lane + 32 * i;
            kv[i] = d < hd ? Ks[j * hd + d] : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < DEC_G; g++) {
            if (g >= ng) break;  // block-uniform
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < HD_MAX / 32; i++) p += qr[g][i] * kv[i];
            p = warp_sum(p);
            if (lane == 0) sc[g * DEC_CHUNK + j] = p * scale;
        }
    }
    __syncthreads();

    // softmax over the chunk, warp per query head
    for (int g = warp; g < ng; g += 4) {
        float m = -INFINITY;
        for (int j = lane; j < nk; j += 32) m = fmaxf(m, sc[g * DEC_CHUNK + j]);
        m = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < nk; j += 32) {
            const float p = expf(sc[g * DEC_CHUNK + j] - m);
            sc[g * DEC_CHUNK + j] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) ml[2 * g] = m, ml[2 * g + 1] = l;
    }
    __syncthreads();

    // P.V: thread (slice, d) sums keys slice, slice + nsl, ... for dims d and d + 128
    const int dpt = hd >= DEC_THREADS ? DEC_THREADS : hd;  // threads per slice
    const int nsl = DEC_THREADS / dpt;                     // key slices
    const int sl = tid / dpt, dd = tid - sl * dpt;
    float acc[2][DEC_G];
#pragma unroll
    for (int g = 0; g < DEC_G; g++) acc[0][g] = acc[1][g] = 0.0f;
    if (sl < nsl) {
        const bool two = dd + DEC_THREADS < hd;
#pragma unroll 4
        for (int j = sl; j < nk; j += nsl) {
            const float v0 = Vs[j * hd + dd];
            const float v1 = two ? Vs[j * hd + dd + DEC_THREADS] : 0.0f;
#pragma unroll
            for (int g = 0; g < DEC_G; g++) {
                if (g >= ng) break;
                const float p = sc[g * DEC_CHUNK + j];
                acc[0][g] += p * v0;
                acc[1][g] += p * v1;
            }
        }
    }
    if (nsl > 1) {  // then hd <= 64... < 128: one dim per thread, reduce the slices in shared memory
        if (sl < nsl)
#pragma unroll
            for (int g = 0; g < DEC_G; g++) red[(sl * DEC_G + g) * dpt + dd] = acc[0][g];
        __syncthreads();
        if (tid < dpt)
#pragma unroll
            for (int g = 0; g < DEC_G; g++) {
                float o = 0.0f;
                for (int k = 0; k < nsl; k++) o += red[(k * DEC_G + g) * dpt + tid];
                acc[0][g] = o;
            }
    }
    if (sl == 0) {
        for (int g = 0; g < ng; g++) {
            const int64_t base = ((int64_t)(h0 + g) * n_splits + split);
            part_o[base * hd + dd] = acc[0][g];
            if (dd + DEC_THREADS < hd) part_o[base * hd + dd + DEC_THREADS] = acc[1][g];
            if (dd == 0) part_ml[2 * base] = ml[2 * g], part_ml[2 * base + 1] = ml[2 * g + 1];
        }
    }
}

// out (n_heads, head_dim) from the partials of the splits that hold keys 0..pos. One block per query head.
__global__ void attn_decode_combine_kernel(float *out, const float *part_o, const float *part_ml, int head_dim,
                                           int max_seq, int n_splits, const int32_t *d_pos) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x;
    const int pos = min(*d_pos, max_seq - 1);
    const int ns = pos / DEC_CHUNK + 1;
    const float *mlh = part_ml + (int64_t)h * n_splits * 2;
    float m = -INFINITY;
    for (int s = 0; s < ns; s++) m = fmaxf(m, mlh[2 * s]);
    float l = 0.0f;
    for (int s = 0; s < ns; s++) l += mlh[2 * s + 1] * expf(mlh[2 * s] - m);
    const float inv = 1.0f / l;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) o += part_o[((int64_t)h * n_splits + s) * head_dim + d] * expf(mlh[2 * s] - m);
        out[(int64_t)h * head_dim + d] = o * inv;
    }
}

static int64_t dec_splits(int64_t max_seq) { return (max_seq + DEC_CHUNK - 1) / DEC_CHUNK; }
static size_t dec_smem(int hd) { return 2 * sizeof(float) * DEC_CHUNK * (size_t)hd; }  // a chunk's K and V

extern "C" size_t gpu_attention_scratch(int64_t n_heads, int64_t head_dim, int64_t max_seq) {
    return (size_t)n_heads * (size_t)dec_splits(max_seq) * (size_t)(head_dim + 2) * sizeof(float);
}

static int attn_check(const char *fn, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                      dj_err *e) {
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || head_dim < 2 || head_dim % 2 ||
        head_dim > HD_MAX || max_seq < 1 || max_seq > INT32_MAX / 2 || n_heads > 65535)
        return dj_fail(e, "%s: unsupported shape n_heads=%lld n_kv_heads=%lld head_dim=%lld max_seq=%lld "
                          "(need n_heads %% n_kv_heads == 0, head_dim even and <= %d)",
                       fn, (long long)n_heads, (long long)n_kv_heads, (long long)head_dim, (long long)max_seq, HD_MAX);
    return 0;
}

extern "C" int gpu_attention_decode(dj_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                                    const int32_t *d_pos, cudaStream_t s, dj_err *e) {
    if (attn_check("gpu_attention_decode", n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (scratch_need(g, gpu_attention_scratch(n_heads, head_dim, max_seq), s, e)) return -1;
    const int64_t ns = dec_splits(max_seq), group = n_heads / n_kv_heads;
    float *part_o = (float *)g->scratch, *part_ml = part_o + n_heads * ns * head_dim;
    dim3 grid((unsigned)ns, (unsigned)n_kv_heads, (unsigned)((group + DEC_G - 1) / DEC_G));
    const float scale = 1.0f / sqrtf((float)head_dim);
    if (launch_k("attn_decode_split", attn_decode_split_kernel, grid, dim3(DEC_THREADS), dec_smem((int)head_dim), s,
                 g->pdl, e, part_o,
                 part_ml, q, k_cache, v_cache, (int)n_heads, (int)group, (int)head_dim, (int)max_seq, (int)ns, scale,
                 d_pos))
        return -1;
    return launch_k("attn_decode_combine", attn_decode_combine_kernel, dim3((unsigned)n_heads), dim3(128), 0, s,
                    g->pdl, e, out, (const float *)part_o, (const float *)part_ml, (int)head_dim, (int)max_seq, (int)ns,
                    d_pos);
}

// ---- fused decode (T = 1)
// A decode step of a layer in seven launches instead of twelve, for models whose shapes allow it
// (gpu_fused_supported): the norms move into the matmuls that read their output, the residual adds into the
// matmuls that produce them, SwiGLU into the gate/up matmul, and RoPE of q and k into the KV-cache write:
//   qkv = Wqkv . rmsnorm(x)          (FUSE_NORM)     rope + KV write      attention split, combine
//   x += Wo . att                    (FUSE_RES)      hb = silu(Wg . n) * (Wu . n), n = rmsnorm(x)  (FUSE_SWIGLU)
//   x += Wdown . hb                  (FUSE_RES)      and for the head: logits = Wlm . rmsnorm(x)   (FUSE_NORM)
// With g->pdl each launch may overlap the previous one's tail: its first weight loads are issued before
// pdl_wait(). Each block copies its input vector into shared memory once (__ldcg: from L2, never the read-only
// path that __ldg takes, which is only valid for data no running kernel writes): read from L2 for every row,
// it cost twice the time of the weights (measured on the H100). The arithmetic is that of
// the unfused kernels (f32, the same formulas), so results differ from them by summation order only.
#define FD_WARPS 8                  // warps per block, one row of W at a time each
#define FD_BLOCKS_PER_SM 4          // persistent grid: blocks per SM (32 warps), each normalises x once
#define FD_MAX_NORM_DIM 16384       // FUSE_NORM/SWIGLU: rmsnorm(x) lives in shared memory (64 KiB)
#define FD_MAX_RES_DIM 32768        // FUSE_RES: x lives in shared memory (128 KiB)

// 16-byte weight loads per lane per step: 8 (4 KiB per warp in flight), 4 per matrix for SwiGLU's two.
template <int MODE> struct fd_steps { static constexpr int U = MODE == GPU_FUSE_SWIGLU ? 4 : 8; };

// y (n_out) from W (n_out, n_in) row-major in WT (SWIGLU: W is [Wg; Wu], (2 n_out, n_in)), rows strided over a
// persistent grid, one warp per row. x (n_in) f32; nw (n_in) f32 norm weights (NORM, SWIGLU).
// PRECOND: n_in % VEC == 0; W and x 16-byte aligned; n_in <= FD_MAX_NORM_DIM (RES: FD_MAX_RES_DIM) and n_in * 4
// bytes of dynamic shared memory; blockDim.x == FD_WARPS * 32.
template <int WT, int MODE>
__global__ __launch_bounds__(FD_WARPS * 32, FD_BLOCKS_PER_SM) void fused_gemv_kernel(
    float *y, const float *x, const float *nw, float eps, const void *w, int n_in, int n_out) {
    constexpr int VEC = wtraits<WT>::VEC, SZ = wtraits<WT>::SIZE, U = fd_steps<MODE>::U;
    constexpr int NM = MODE == GPU_FUSE_SWIGLU ? 2 : 1;  // matrices read per output row
    extern __shared__ float4 fd_smem[];                  // x (n_in); NORM, SWIGLU: rmsnorm(x) * nw
    float *xs = (float *)fd_smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nchunk = n_in / VEC, iters = (nchunk + 32 * U - 1) / (32 * U);  // 16-byte chunks; steps per row
    const int rstride = gridDim.x * FD_WARPS;
    const size_t row_bytes = (size_t)n_in * SZ, mat_bytes = (size_t)n_out * row_bytes;
    uint4 wv[NM][U];
    // Step `it` of row r: chunks lane + it * 32 U + 32 u of each matrix.
    auto load = [&](int r, int it) {
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const uint4 *wr = (const uint4 *)((const char *)w + m * mat_bytes + (size_t)r * row_bytes);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = lane + it * 32 * U + 32 * u;
                wv[m][u] = c < nchunk ? ld_stream(wr + c) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    int row = blockIdx.x * FD_WARPS + warp, it = 0;
    if (row < n_out) load(row, 0);  // weights are constant: fetched before the previous kernel has finished
    pdl_wait();
    pdl_trigger();
    if (MODE == GPU_FUSE_RES) {  // x once per block into shared memory: every warp reads all of it, every row
        for (int i = 4 * threadIdx.x; i < n_in; i += 4 * blockDim.x) fd_smem[i / 4] = __ldcg((const float4 *)(x + i));
        __syncthreads();
    } else {  // rmsnorm(x) * nw, as rmsnorm_kernel computes it
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
            const float v = __ldcg(x + i);
            xs[i] = v;
            ss += v * v;
        }
        ss = block_sum(ss);
        const float scale = 1.0f / sqrtf(ss / (float)n_in + eps);
        for (int i = threadIdx.x; i < n_in; i += blockDim.x) xs[i] = xs[i] * scale * nw[i];  // own writes only
        __syncthreads();
    }
    float acc[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m] = 0.0f;
    while (row < n_out) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = lane + it * 32 * U + 32 * u;
            if (c >= nchunk) break;
            float4 xv[VEC / 4];
#pragma unroll
            for (int q = 0; q < VEC / 4; q++)
                xv[q] = fd_smem[c * (VEC / 4) + q];
#pragma unroll
            for (int m = 0; m < NM; m++) {
                float wf[VEC];
                unpack16<WT>(wv[m][u], wf);
#pragma unroll
                for (int q = 0; q < VEC / 4; q++)
                    acc[m] += wf[4 * q] * xv[q].x + wf[4 * q + 1] * xv[q].y + wf[4 * q + 2] * xv[q].z +
                              wf[4 * q + 3] * xv[q].w;
            }
        }
        const int done_row = row;
        if (++it == iters) it = 0, row += rstride;
        if (row < n_out) load(row, it);  // the next step's loads go out before this row's reduction
        if (it == 0) {
            const float a = warp_sum(acc[0]), b = NM > 1 ? warp_sum(acc[NM - 1]) : 0.0f;
            if (lane == 0) {
                if (MODE == GPU_FUSE_NORM) y[done_row] = a;
                else if (MODE == GPU_FUSE_RES) y[done_row] += a;
                else y[done_row] = a / (1.0f + expf(-a)) * b;
            }
#pragma unroll
            for (int m = 0; m < NM; m++) acc[m] = 0.0f;
        }
    }
}

// Row t = blockIdx.y of qkv (rows ld floats apart, each [q | k | v]): rotates its q (n_heads) and k
// (n_kv_heads) heads in place for position *d_pos + t (as rope_kernel) and writes k and v into the caches there
// (as kv_write_kernel), in one launch.
__global__ void rope_kv_kernel(float *qkv, int64_t ld, float *k_cache, float *v_cache, int n_heads, int n_kv_heads,
                               int head_dim, int max_seq, const float *inv_freq, const int32_t *d_pos) {
    pdl_wait();
    pdl_trigger();
    const int half = head_dim / 2, nrot = (n_heads + n_kv_heads) * half, kvd = n_kv_heads * head_dim;
    const int pos = *d_pos + (int)blockIdx.y;
    const bool store = pos >= 0 && pos < max_seq;
    qkv += (int64_t)blockIdx.y * ld;
    const float *v = qkv + (int64_t)(n_heads + n_kv_heads) * head_dim;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < nrot + kvd; j += gridDim.x * blockDim.x) {
        if (j < nrot) {
            const int h = j / half, i = j - h * half;
            float *xr = qkv + (int64_t)h * head_dim;
            const float ang = __fmul_rn((float)pos, inv_freq[i]);
            float sn, cs;
            sincosf(ang, &sn, &cs);
            const float a = xr[i], b = xr[i + half];
            const float ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
            const float rb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
            xr[i] = ra, xr[i + half] = rb;
            if (h >= n_heads && store) {
                float *kc = k_cache + ((int64_t)(h - n_heads) * max_seq + pos) * head_dim;
                kc[i] = ra, kc[i + half] = rb;
            }
        } else if (store) {
            const int r = j - nrot, h = r / head_dim, d = r - h * head_dim;
            v_cache[((int64_t)h * max_seq + pos) * head_dim + d] = v[r];
        }
    }
}

template <int WT>
static int fused_setup_typed(dj_err *e) {
    const int sm = FD_MAX_NORM_DIM * (int)sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(fused_gemv_kernel<WT, GPU_FUSE_NORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    CUDA_CHECK(cudaFuncSetAttribute(fused_gemv_kernel<WT, GPU_FUSE_SWIGLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm));
    CUDA_CHECK(cudaFuncSetAttribute(fused_gemv_kernel<WT, GPU_FUSE_RES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    FD_MAX_RES_DIM * (int)sizeof(float)));
    return 0;
}

// Raises the fused GEMV's shared-memory limit; a device that cannot give FD_MAX_NORM_DIM floats per block gets
// no fused decode (fused_blocks 0, gpu_fused_supported says no).
static int fused_setup(dj_gpu *g, dj_err *e) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device));
    g->fused_blocks = 0;
    if (optin < FD_MAX_RES_DIM * (int)sizeof(float)) return 0;
    if (fused_setup_typed<DJ_F32>(e) || fused_setup_typed<DJ_F16>(e) || fused_setup_typed<DJ_BF16>(e)) return -1;
    g->fused_blocks = g->n_sm * FD_BLOCKS_PER_SM;
    return 0;
}

static int64_t fused_vec(uint32_t wtype) {
    return wtype == DJ_F32 ? wtraits<DJ_F32>::VEC : wtype == DJ_F16 ? wtraits<DJ_F16>::VEC : wtraits<DJ_BF16>::VEC;
}

extern "C" int gpu_fused_supported(const dj_gpu *g, uint32_t wtype, int64_t n_in, int64_t n_out, int mode) {
    if (!g->fused_blocks || (wtype != DJ_F32 && wtype != DJ_F16 && wtype != DJ_BF16) || n_in < 1 || n_out < 1 || n_in > INT32_MAX / 2 ||
        n_out > INT32_MAX / 2 || n_in % fused_vec(wtype))
        return 0;
    return (mode == GPU_FUSE_RES && n_in <= FD_MAX_RES_DIM) ||
           ((mode == GPU_FUSE_NORM || mode == GPU_FUSE_SWIGLU) && n_in <= FD_MAX_NORM_DIM);
}

extern "C" void gpu_set_pdl(dj_gpu *g, int on) { g->pdl = on; }

template <int WT>
static int fused_typed(dj_gpu *g, int mode, float *y, const float *x, const float *nw, float eps, const void *w,
                       int n_in, int n_out, cudaStream_t s, dj_err *e) {
    const int rows_per_block = FD_WARPS;
    dim3 grid((unsigned)min((n_out + rows_per_block - 1) / rows_per_block, g->fused_blocks)), block(FD_WARPS * 32);
    const size_t sm = (size_t)n_in * sizeof(float);
    if (mode == GPU_FUSE_NORM)
        return launch_k("fused_gemv<norm>", fused_gemv_kernel<WT, GPU_FUSE_NORM>, grid, block, sm, s, g->pdl, e, y, x,
                        nw, eps, w, n_in, n_out);
    if (mode == GPU_FUSE_RES)
        return launch_k("fused_gemv<res>", fused_gemv_kernel<WT, GPU_FUSE_RES>, grid, block, sm, s, g->pdl, e, y, x,
                        nw, eps, w, n_in, n_out);
    return launch_k("fused_gemv<swiglu>", fused_gemv_kernel<WT, GPU_FUSE_SWIGLU>, grid, block, sm, s, g->pdl, e, y, x,
                    nw, eps, w, n_in, n_out);
}

extern "C" int gpu_fused_matmul(dj_gpu *g, int mode, float *y, const float *x, const float *nw, float eps,
                                const void *w, uint32_t wtype, int64_t n_in, int64_t n_out, cudaStream_t s,
                                dj_err *e) {
    if (!gpu_fused_supported(g, wtype, n_in, n_out, mode))
        return dj_fail(e, "gpu_fused_matmul: mode %d, %s, n_in=%lld n_out=%lld is not supported here", mode,
                       wtype_name(wtype), (long long)n_in, (long long)n_out);
    if (((uintptr_t)w & 15) || ((uintptr_t)x & 15) || (mode != GPU_FUSE_RES && !nw))
        return dj_fail(e, "gpu_fused_matmul: W and x must be 16-byte aligned, and the norm needs its weights");
    if (wtype == DJ_F32) return fused_typed<DJ_F32>(g, mode, y, x, nw, eps, w, (int)n_in, (int)n_out, s, e);
    if (wtype == DJ_F16) return fused_typed<DJ_F16>(g, mode, y, x, nw, eps, w, (int)n_in, (int)n_out, s, e);
    return fused_typed<DJ_BF16>(g, mode, y, x, nw, eps, w, (int)n_in, (int)n_out, s, e);
}

extern "C" int gpu_rope_kv(dj_gpu *g, float *qkv, int64_t ld, int64_t T, float *k_cache, float *v_cache,
                           int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                           const float *inv_freq, const int32_t *d_pos, cudaStream_t s, dj_err *e) {
    if (attn_check("gpu_rope_kv", n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (T < 0 || T > 65535 || (T > 1 && ld < (n_heads + 2 * n_kv_heads) * head_dim))
        return dj_fail(e, "gpu_rope_kv: bad T=%lld ld=%lld", (long long)T, (long long)ld);
    if (T == 0) return 0;
    const int64_t n = (n_heads + n_kv_heads) * (head_dim / 2) + n_kv_heads * head_dim;
    return launch_k("rope_kv", rope_kv_kernel, dim3((unsigned)((n + 255) / 256), (unsigned)T), dim3(256), 0, s, g->pdl,
                    e, qkv, ld, k_cache, v_cache, (int)n_heads, (int)n_kv_heads, (int)head_dim, (int)max_seq, inv_freq,
                    d_pos);
}

// ---- attention: prefill (tiled, causal, online softmax)
#define PF_BQ 64       // query rows per block (one query head)
#define PF_BK 32       // keys per tile
#define PF_THREADS 128 // two threads per query row

static size_t prefill_smem(int hd) {
    return sizeof(float) * ((size_t)PF_BQ * (hd + 1) + (size_t)PF_BK * (hd + 1) + (size_t)PF_BK * hd +
                            (size_t)PF_BQ * (PF_BK + 1));
}

// Block (query tile, query head). Thread pair (2r, 2r+1) owns query row r: each computes the scores of
// alternate keys of a tile and alternate output dims (so the pair's shared-memory reads hit different
// banks). Shared memory: Qs (BQ, hd+1), Ks (BK, hd+1), Vs (BK, hd), Ps (BQ, BK+1); the +1 pads keep
// the 16 rows a warp reads at once in distinct banks.
// PRECOND: head_dim even, <= HD; blockDim.x == PF_THREADS.
template <int HD>
__global__ __launch_bounds__(PF_THREADS) void attn_prefill_kernel(float *out, int64_t ldo, const float *q, int64_t ldq,
                                                                 const float *k_cache, const float *v_cache, int T,
                                                                 int group, int hd, int max_seq, float scale,
                                                                 const int32_t *d_pos) {
    extern __shared__ float smem[];
    const int hs = hd + 1;
    float *Qs = smem, *Ks = Qs + PF_BQ * hs, *Vs = Ks + PF_BK * hs, *Ps = Vs + PF_BK * hd;
    // the longest tiles (latest queries) start first, so the short ones fill the tail
    const int h = blockIdx.y, kvh = h / group, t0 = (gridDim.x - 1 - blockIdx.x) * PF_BQ;
    const int tid = threadIdx.x, r = tid >> 1, half = tid & 1;
    const int pos0 = *d_pos;
    for (int idx = tid; idx < PF_BQ * hd; idx += PF_THREADS) {
        const int rr = idx / hd, d = idx - rr * hd, t = t0 + rr;
        Qs[rr * hs + d] = t < T ? q[(int64_t)t * ldq + (int64_t)h * hd + d] : 0.0f;
    }
    const int t = t0 + r;
    const int last_key = min(pos0 + min(t0 + PF_BQ - 1, T - 1), max_seq - 1);
    const int my_last = min(pos0 + min(t, T - 1), last_key);  // rows past T mirror the last row, unwritten
    const float *kb = k_cache + (int64_t)kvh * max_seq * hd, *vb = v_cache + (int64_t)kvh * max_seq * hd;

    float m = -INFINITY, l = 0.0f;
    float acc[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) acc[i] = 0.0f;

    for (int k0 = 0; k0 <= last_key; k0 += PF_BK) {
        __syncthreads();  // the previous tile's Ks/Vs are no longer read (and Qs is complete, first time)
        for (int idx = tid; idx < PF_BK * hd; idx += PF_THREADS) {
            const int j = idx / hd, d = idx - j * hd, key = k0 + j;
            const bool ok = key <= last_key;
            Ks[j * hs + d] = ok ? kb[(int64_t)key * hd + d] : 0.0f;
            Vs[j * hd + d] = ok ? vb[(int64_t)key * hd + d] : 0.0f;
        }
        __syncthreads();

        float sj[PF_BK / 2];
#pragma unroll
        for (int jj = 0; jj < PF_BK / 2; jj++) sj[jj] = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float qd = Qs[r * hs + d];
#pragma unroll
            for (int jj = 0; jj < PF_BK / 2; jj++) sj[jj] += qd * Ks[(2 * jj + half) * hs + d];
        }
        float mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < PF_BK / 2; jj++) {
            const int key = k0 + 2 * jj + half;
            sj[jj] = key <= my_last ? sj[jj] * scale : -INFINITY;
            mt = fmaxf(mt, sj[jj]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        const float mn = fmaxf(m, mt);
        // Tile 0 always holds key 0 <= my_last, so mn is finite from the first tile on.
        const float alpha = expf(m - mn);  // m = -inf on the first tile: 0
        float ls = 0.0f;
#pragma unroll
        for (int jj = 0; jj < PF_BK / 2; jj++) {
            const float p = expf(sj[jj] - mn);  // masked: exp(-inf) = 0
            Ps[r * (PF_BK + 1) + 2 * jj + half] = p;
            ls += p;
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 1);
        l = l * alpha + ls;
        m = mn;
        __syncwarp();  // row r's probabilities come from this thread pair, in this warp
#pragma unroll
        for (int i = 0; i < HD / 2; i++) acc[i] *= alpha;
        for (int j = 0; j < PF_BK; j++) {
            const float p = Ps[r * (PF_BK + 1) + j];
#pragma unroll
            for (int i = 0; i < HD / 2; i++) {
                const int d = 2 * i + half;
                if (d < hd) acc[i] += p * Vs[j * hd + d];
            }
        }
        __syncwarp();  // Ps row is rewritten by the next tile
    }
    if (t < T) {
        const float inv = 1.0f / l;
        float *o = out + (int64_t)t * ldo + (int64_t)h * hd;
#pragma unroll
        for (int i = 0; i < HD / 2; i++) {
            const int d = 2 * i + half;
            if (d < hd) o[d] = acc[i] * inv;
        }
    }
}

// Raises the dynamic shared-memory limit of each prefill instantiation to what its largest head_dim needs,
// as far as the device allows (H100: 227 KB, all of them); records the largest head_dim that fits.
static int attention_setup(dj_gpu *g, dj_err *e) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device));
    // Decode stages a chunk's keys and values: 128 KiB at head_dim 256 (every device Djinn runs on has that).
    if (dec_smem(HD_MAX) + 8 * 1024 > (size_t)optin)
        return dj_fail(e, "cuda: %s allows %d bytes of shared memory per block; decode attention needs %zu",
                       g->name, optin, dec_smem(HD_MAX) + 8 * 1024);
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dec_smem(HD_MAX)));
    g->prefill_max_hd = 0;
    if (prefill_smem(64) > (size_t)optin) return 0;
    CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)prefill_smem(64)));
    g->prefill_max_hd = 64;
    if (prefill_smem(128) > (size_t)optin) return 0;
    CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)prefill_smem(128)));
    g->prefill_max_hd = 128;
    if (prefill_smem(256) > (size_t)optin) {
        g->prefill_max_hd = (int)((optin / sizeof(float) - PF_BQ * (PF_BK + 1) - PF_BQ - PF_BK) / (PF_BQ + 2 * PF_BK)) & ~1;
        if (g->prefill_max_hd > HD_MAX) g->prefill_max_hd = HD_MAX;
    } else {
        g->prefill_max_hd = HD_MAX;
    }
    if (g->prefill_max_hd > 128)
        CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)prefill_smem(g->prefill_max_hd)));
    return 0;
}

// ---- attention: prefill on the tensor cores (bf16x3)
// The same tiled, causal, online-softmax attention as attn_prefill_kernel, with both products (S = Q K^T and
// O += P V) on the tensor cores (mma.sync m16n8k16, bf16 operands, f32 accumulation) in the bf16x3 split:
// each f32 operand a = hi + lo, both bf16 (|a - hi - lo| <= 2^-17 |a|), and a.b = lo.hi + hi.lo + hi.hi.
// The dropped lo.lo term is ~2^-18 of each product: f32-class attention for every weight dtype, with the
// range of f32 (bf16 has its exponent), at three tensor-core products per one. Each tile's P.V starts from
// zero and is added to O in f32 outside the tensor cores, whose own accumulation is not IEEE (over a long
// context inside them it drifts to ~6e-5 from the CPU).
// Block (64 queries, query head), 4 warps; warp w owns query rows 16w..16w+15: its Q fragments (scaled by
// 1/sqrt(head_dim)), its S and P, its O accumulators and softmax state all stay in registers, in the mma
// fragment layout (lane = 4 g + c: rows g and g + 8, columns 2c and 2c + 1 of each 8-wide tile). P goes from
// the S accumulators to A fragments without leaving the registers. Only the K/V tiles (64 keys, as bf16 hi and
// lo in shared memory, rows padded by 8 so fragment loads hit distinct banks) need block barriers.
#define TC_BQ 64
#define TC_BK 64
#define TC_THREADS 128

static size_t tc_smem(int hd) { return (size_t)4 * TC_BK * (hd + 8) * sizeof(__nv_bfloat16); }

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v) { return *(uint32_t *)&v; }

// (a, b) -> hi = bf16(a, b), lo = bf16 of what hi missed; a in the low half, as the fragments want it.
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t *hi, uint32_t *lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float2 hf = __bfloat1622float2(h);
    *hi = bf2_bits(h);
    *lo = bf2_bits(__floats2bfloat162_rn(a - hf.x, b - hf.y));
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a.b in bf16x3, the small terms first.
__device__ __forceinline__ void mma_bf16x3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                                           uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    mma_bf16(c, al, bh0, bh1);
    mma_bf16(c, ah, bl0, bl1);
    mma_bf16(c, ah, bh0, bh1);
}

// Two B fragments (k 16 x n 8, n-tiles n0 and n0 + 8) of V^T from row-major V (keys x dims) in shared memory.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// PRECOND: HD % 16 == 0, head_dim == HD; blockDim.x == TC_THREADS; tc_smem(HD) bytes of dynamic shared memory;
// k_cache, v_cache 16-byte aligned.
template <int HD>
__global__ __launch_bounds__(TC_THREADS) void attn_prefill_tc_kernel(float *out, int64_t ldo, const float *q,
                                                                    int64_t ldq, const float *k_cache,
                                                                    const float *v_cache, int T, int group,
                                                                    int max_seq, float scale, const int32_t *d_pos) {
    extern __shared__ __align__(128) __nv_bfloat16 tc_sm[];
    constexpr int LD = HD + 8, KS = HD / 16, ND = HD / 8;
    __nv_bfloat16 *Kh = tc_sm, *Kl = Kh + TC_BK * LD, *Vh = Kl + TC_BK * LD, *Vl = Vh + TC_BK * LD;
    const int h = blockIdx.y, kvh = h / group, t0 = (gridDim.x - 1 - blockIdx.x) * TC_BQ;  // longest tiles first
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int pos0 = *d_pos;
    const int last_key = min(pos0 + min(t0 + TC_BQ - 1, T - 1), max_seq - 1);
    // this thread's two rows; rows past T compute the last row's keys (unwritten)
    const int ta = t0 + 16 * warp + g, tb = ta + 8;
    const int last_a = min(pos0 + min(ta, T - 1), last_key), last_b = min(pos0 + min(tb, T - 1), last_key);

    // Q fragments (rows ta, tb), scaled, split: k-step s covers dims 16s..16s+15.
    uint32_t qh[KS][4], ql[KS][4];
    {
        const float *qa = q + (int64_t)ta * ldq + (int64_t)h * HD, *qb = q + (int64_t)tb * ldq + (int64_t)h * HD;
        const bool oka = ta < T, okb = tb < T;
#pragma unroll
        for (int s = 0; s < KS; s++) {
            const int d0 = 16 * s + 2 * c, d1 = d0 + 8;
            split_bf16x2(oka ? qa[d0] * scale : 0.0f, oka ? qa[d0 + 1] * scale : 0.0f, &qh[s][0], &ql[s][0]);
            split_bf16x2(okb ? qb[d0] * scale : 0.0f, okb ? qb[d0 + 1] * scale : 0.0f, &qh[s][1], &ql[s][1]);
            split_bf16x2(oka ? qa[d1] * scale : 0.0f, oka ? qa[d1 + 1] * scale : 0.0f, &qh[s][2], &ql[s][2]);
            split_bf16x2(okb ? qb[d1] * scale : 0.0f, okb ? qb[d1 + 1] * scale : 0.0f, &qh[s][3], &ql[s][3]);
        }
    }
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;  // this thread's partial row sums
    const float *kb = k_cache + (int64_t)kvh * max_seq * HD, *vb = v_cache + (int64_t)kvh * max_seq * HD;

    for (int k0 = 0; k0 <= last_key; k0 += TC_BK) {
        __syncthreads();  // every warp is done with the previous tile
        for (int idx = tid; idx < TC_BK * HD / 4; idx += TC_THREADS) {
            const int j = idx / (HD / 4), d = (idx - j * (HD / 4)) * 4, key = k0 + j;
            const bool ok = key <= last_key;  // never read past the context (the cache may hold anything there)
            const float4 kv4 = ok ? *(const float4 *)(kb + (int64_t)key * HD + d) : make_float4(0, 0, 0, 0);
            const float4 vv4 = ok ? *(const float4 *)(vb + (int64_t)key * HD + d) : make_float4(0, 0, 0, 0);
            uint2 hi, lo;
            split_bf16x2(kv4.x, kv4.y, &hi.x, &lo.x), split_bf16x2(kv4.z, kv4.w, &hi.y, &lo.y);
            *(uint2 *)(Kh + j * LD + d) = hi, *(uint2 *)(Kl + j * LD + d) = lo;
            split_bf16x2(vv4.x, vv4.y, &hi.x, &lo.x), split_bf16x2(vv4.z, vv4.w, &hi.y, &lo.y);
            *(uint2 *)(Vh + j * LD + d) = hi, *(uint2 *)(Vl + j * LD + d) = lo;
        }
        __syncthreads();

        // S (16 rows x 64 keys): n-tile n holds keys k0 + 8n .. k0 + 8n + 7
        float sc[TC_BK / 8][4];
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            const int row = (8 * n + g) * LD + 2 * c;
#pragma unroll
            for (int s = 0; s < KS; s++) {
                const uint32_t bh0 = *(const uint32_t *)(Kh + row + 16 * s), bh1 = *(const uint32_t *)(Kh + row + 16 * s + 8);
                const uint32_t bl0 = *(const uint32_t *)(Kl + row + 16 * s), bl1 = *(const uint32_t *)(Kl + row + 16 * s + 8);
                mma_bf16x3(sc[n], qh[s], ql[s], bh0, bh1, bl0, bl1);
            }
        }
        // causal mask and the online softmax of rows ta (sc[.][0..1]) and tb (sc[.][2..3])
        float mta = -INFINITY, mtb = -INFINITY;
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
            const int key = k0 + 8 * n + 2 * c;
            sc[n][0] = key <= last_a ? sc[n][0] : -INFINITY;
            sc[n][1] = key + 1 <= last_a ? sc[n][1] : -INFINITY;
            sc[n][2] = key <= last_b ? sc[n][2] : -INFINITY;
            sc[n][3] = key + 1 <= last_b ? sc[n][3] : -INFINITY;
            mta = fmaxf(mta, fmaxf(sc[n][0], sc[n][1]));
            mtb = fmaxf(mtb, fmaxf(sc[n][2], sc[n][3]));
        }
        mta = fmaxf(mta, __shfl_xor_sync(0xffffffffu, mta, 1));
        mta = fmaxf(mta, __shfl_xor_sync(0xffffffffu, mta, 2));
        mtb = fmaxf(mtb, __shfl_xor_sync(0xffffffffu, mtb, 1));
        mtb = fmaxf(mtb, __shfl_xor_sync(0xffffffffu, mtb, 2));
        // finite from the first tile on: key 0 <= last_a, last_b
        const float mna = fmaxf(ma, mta), mnb = fmaxf(mb, mtb);
        const float aa = expf(ma - mna), ab = expf(mb - mnb);  // m = -inf on the first tile: 0
        ma = mna, mb = mnb;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
            sc[n][0] = expf(sc[n][0] - mna), sc[n][1] = expf(sc[n][1] - mna);  // masked: exp(-inf) = 0
            sc[n][2] = expf(sc[n][2] - mnb), sc[n][3] = expf(sc[n][3] - mnb);
            sa += sc[n][0] + sc[n][1], sb += sc[n][2] + sc[n][3];
        }
        la = la * aa + sa, lb = lb * ab + sb;
#pragma unroll
        for (int n = 0; n < ND; n++) o[n][0] *= aa, o[n][1] *= aa, o[n][2] *= ab, o[n][3] *= ab;

        // P as A fragments: k-step s (keys 16s..16s+15) is S n-tiles 2s and 2s + 1
        uint32_t ph[TC_BK / 16][4], pl[TC_BK / 16][4];
#pragma unroll
        for (int s = 0; s < TC_BK / 16; s++) {
            split_bf16x2(sc[2 * s][0], sc[2 * s][1], &ph[s][0], &pl[s][0]);
            split_bf16x2(sc[2 * s][2], sc[2 * s][3], &ph[s][1], &pl[s][1]);
            split_bf16x2(sc[2 * s + 1][0], sc[2 * s + 1][1], &ph[s][2], &pl[s][2]);
            split_bf16x2(sc[2 * s + 1][2], sc[2 * s + 1][3], &ph[s][3], &pl[s][3]);
        }
        // O += P V, two 8-wide dim tiles at a time; ldmatrix lane l addresses row (l & 7) + 8 ((l >> 3) & 1) of
        // the k-step and column 8 (l >> 4) of the pair
        const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4);
#pragma unroll
        for (int n2 = 0; n2 < ND / 2; n2++) {
            float pv[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int s = 0; s < TC_BK / 16; s++) {
                uint32_t vh[4], vl[4];
                ldmatrix_x4_trans(vh, Vh + (16 * s + lrow) * LD + 16 * n2 + lcol);
                ldmatrix_x4_trans(vl, Vl + (16 * s + lrow) * LD + 16 * n2 + lcol);
                mma_bf16x3(pv[0], ph[s], pl[s], vh[0], vh[1], vl[0], vl[1]);
                mma_bf16x3(pv[1], ph[s], pl[s], vh[2], vh[3], vl[2], vl[3]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) o[2 * n2][i] += pv[0][i], o[2 * n2 + 1][i] += pv[1][i];
        }
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    const float ia = 1.0f / la, ib = 1.0f / lb;
    float *oa = out + (int64_t)ta * ldo + (int64_t)h * HD, *ob = out + (int64_t)tb * ldo + (int64_t)h * HD;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        const int d = 8 * n + 2 * c;
        if (ta < T) oa[d] = o[n][0] * ia, oa[d + 1] = o[n][1] * ia;
        if (tb < T) ob[d] = o[n][2] * ib, ob[d + 1] = o[n][3] * ib;
    }
}

#define TC_HDS(X) X(16) X(32) X(48) X(64) X(80) X(96) X(112) X(128) X(144) X(160) X(176) X(192) X(208) X(224) X(240) X(256)

// Raises the tensor-core kernels' shared-memory limits (H100: all fit; elsewhere the ones that do).
static int tc_setup(dj_gpu *g, dj_err *e) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device));
    g->tc_optin = optin;
    g->tc_attn = 1;
#define TC_SET(HDV)                                                                                              \
    if (tc_smem(HDV) <= (size_t)optin)                                                                           \
        CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_tc_kernel<HDV>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                        (int)tc_smem(HDV)));
    TC_HDS(TC_SET)
#undef TC_SET
    return 0;
}

extern "C" void gpu_set_tc_attn(dj_gpu *g, int on) { g->tc_attn = on; }

extern "C" int gpu_tc_attn_supported(const dj_gpu *g, int64_t head_dim) {
    return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0 && tc_smem((int)head_dim) <= (size_t)g->tc_optin;
}

// The tensor-core prefill for this call, if switched on (the default) and the shape is one it has: launches it
// and sets *done, else leaves the call to the FMA kernel.
static int attn_prefill_tc(dj_gpu *g, int *done, float *out, int64_t ldo, const float *q, int64_t ldq,
                           const float *k_cache, const float *v_cache, int T, int group, int hd, int max_seq,
                           float scale, const int32_t *d_pos, int n_heads, cudaStream_t s, dj_err *e) {
    *done = 0;
    if (!g->tc_attn || !gpu_tc_attn_supported(g, hd) || ((uintptr_t)k_cache & 15) || ((uintptr_t)v_cache & 15))
        return 0;
    *done = 1;
    dim3 grid((unsigned)((T + TC_BQ - 1) / TC_BQ), (unsigned)n_heads);
    const size_t sm = tc_smem(hd);
#define TC_LAUNCH(HDV)                                                                                             \
    case HDV:                                                                                                      \
        attn_prefill_tc_kernel<HDV><<<grid, TC_THREADS, sm, s>>>(out, ldo, q, ldq, k_cache, v_cache, T, group,    \
                                                                 max_seq, scale, d_pos);                          \
        break;
    switch (hd) { TC_HDS(TC_LAUNCH) }
#undef TC_LAUNCH
    LAUNCH_CHECK("attn_prefill_tc", s);
    return 0;
}

extern "C" int gpu_attention_prefill(dj_gpu *g, float *out, int64_t ldo, const float *q, int64_t ldq,
                                     const float *k_cache, const float *v_cache, int64_t T, int64_t n_heads,
                                     int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos,
                                     cudaStream_t s, dj_err *e) {
    if (attn_check("gpu_attention_prefill", n_heads, n_kv_heads, head_dim, max_seq, e)) return -1;
    if (head_dim > g->prefill_max_hd)
        return dj_fail(e, "gpu_attention_prefill: head_dim %lld needs %zu bytes of shared memory per block; "
                          "this GPU allows head_dim <= %d", (long long)head_dim, prefill_smem((int)head_dim),
                       g->prefill_max_hd);
    if (T < 0 || T > max_seq || ldq < n_heads * head_dim || ldo < n_heads * head_dim)
        return dj_fail(e, "gpu_attention_prefill: bad T=%lld ldq=%lld ldo=%lld", (long long)T, (long long)ldq,
                       (long long)ldo);
    if (T == 0) return 0;
    const int group = (int)(n_heads / n_kv_heads), hd = (int)head_dim;
    const float scale = 1.0f / sqrtf((float)head_dim);
    int done;
    if (attn_prefill_tc(g, &done, out, ldo, q, ldq, k_cache, v_cache, (int)T, group, hd, (int)max_seq, scale, d_pos,
                        (int)n_heads, s, e))
        return -1;
    if (done) return 0;
    dim3 grid((unsigned)((T + PF_BQ - 1) / PF_BQ), (unsigned)n_heads);
    const size_t sm = prefill_smem(hd);
    if (hd <= 64)
        attn_prefill_kernel<64><<<grid, PF_THREADS, sm, s>>>(out, ldo, q, ldq, k_cache, v_cache, (int)T, group, hd,
                                                             (int)max_seq, scale, d_pos);
    else if (hd <= 128)
        attn_prefill_kernel<128><<<grid, PF_THREADS, sm, s>>>(out, ldo, q, ldq, k_cache, v_cache, (int)T, group, hd,
                                                              (int)max_seq, scale, d_pos);
    else
        attn_prefill_kernel<256><<<grid, PF_THREADS, sm, s>>>(out, ldo, q, ldq, k_cache, v_cache, (int)T, group, hd,
                                                              (int)max_seq, scale, d_pos);
    LAUNCH_CHECK("attn_prefill", s);
    return 0;
}

// ---- sampling
#define SAMPLE_THREADS 1024

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

extern "C" int gpu_argmax(int32_t *d_out, const float *logits, int64_t n, cudaStream_t s, dj_err *e) {
    if (n < 1 || n > INT32_MAX) return dj_fail(e, "gpu_argmax: bad n=%lld", (long long)n);
    argmax_kernel<<<1, SAMPLE_THREADS, 0, s>>>(d_out, logits, n);
    LAUNCH_CHECK("argmax", s);
    return 0;
}

extern "C" int gpu_sample_top_p(int32_t *d_out, const float *logits, int64_t n, float temp, float top_p, float u,
                                cudaStream_t s, dj_err *e) {
    if (n < 1 || n > INT32_MAX) return dj_fail(e, "gpu_sample_top_p: bad n=%lld", (long long)n);
    if (!(temp > 0.0f) || !(top_p > 0.0f)) return gpu_argmax(d_out, logits, n, s, e);
    top_p_kernel<<<1, SAMPLE_THREADS, 0, s>>>(d_out, logits, n, temp, top_p, u);
    LAUNCH_CHECK("top_p", s);
    return 0;
}
