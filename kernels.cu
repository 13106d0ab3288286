// kernels.cu: the GPU runtime behind kernels.h: error checking, device discovery, the context (device,
// cuBLAS handle and workspace, the scratch buffer the ops share), device and pinned host memory, copies,
// streams, events and graphs. The kernels live beside it, one op family a file: ops.cu (widening, norms,
// SwiGLU, RoPE, KV writes), matmul.cu (GEMV and cuBLAS), attention.cu (decode and prefill), sample.cu
// (argmax, top-p); kernels_impl.h is what they share.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>

#include "kernels_impl.h"

// ---- error checking (the macros are in kernels_impl.h)
int launch_check(const char *kernel, cudaStream_t s, const char *file, int line, dj_err *e) {
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

// ---- device discovery
extern "C" int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

extern "C" int gpu_peer_ok(int a, int b) {
    int ab = 0, ba = 0;
    if (a == b) return 1;
    if (cudaDeviceCanAccessPeer(&ab, a, b) != cudaSuccess || cudaDeviceCanAccessPeer(&ba, b, a) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return ab && ba;
}

// ---- context
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
        if (gpu_malloc(&g->workspace, GPU_WORKSPACE, "cuBLAS workspace", e)) break;
        st = cublasSetWorkspace(g->blas, g->workspace, GPU_WORKSPACE);
        if (st != CUBLAS_STATUS_SUCCESS) {
            dj_fail(e, "cublas: cublasSetWorkspace failed: %s", cublasGetStatusName(st));
            break;
        }
        g->loaded = 1;
        if (attention_setup(g, e) || tc_setup(g, e) || matmul_setup(g, e) || qgemm_setup(g, e) || drow_setup(g, e) ||
            ops_setup(g, e) || sample_setup(g, e))
            break;
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
    if (g->blas) cublasDestroy(g->blas);
    gpu_free(g->workspace);
    gpu_free(g->scratch);
    gpu_free(g->drow_tickets);
    free(g);
}

extern "C" const char *gpu_name(const dj_gpu *g) { return g->name; }

extern "C" int gpu_kernels_loaded(const dj_gpu *g) { return g->loaded; }

extern "C" void gpu_set_hold(dj_gpu *g, int (*release)(void *ctx, dj_err *e), void *ctx) {
    g->hold = release, g->hold_ctx = ctx;
}

// A driver function by name, as of CUDA 12.4; NULL where the driver lacks it.
static void *driver_fn(const char *name) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12040, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return fn;
}

int load_module_of(dj_gpu *g, const void *kernel, dj_err *e) {
    CUresult (*get_module)(CUmodule *, CUfunction) = (CUresult(*)(CUmodule *, CUfunction))driver_fn("cuFuncGetModule");
    CUresult (*count)(unsigned *, CUmodule) = (CUresult(*)(unsigned *, CUmodule))driver_fn("cuModuleGetFunctionCount");
    CUresult (*list)(CUfunction *, unsigned, CUmodule) =
        (CUresult(*)(CUfunction *, unsigned, CUmodule))driver_fn("cuModuleEnumerateFunctions");
    CUresult (*load)(CUfunction) = (CUresult(*)(CUfunction))driver_fn("cuFuncLoad");
    if (!get_module || !count || !list || !load) {
        g->loaded = 0;
        return 0;
    }
    cudaFunction_t f;
    CUDA_CHECK(cudaGetFuncBySymbol(&f, kernel));
    CUmodule m;
    unsigned n = 0;
    if (get_module(&m, (CUfunction)f) != CUDA_SUCCESS || count(&n, m) != CUDA_SUCCESS)
        return dj_fail(e, "cuda: cannot list the kernels of a module of %s", g->name);
    CUfunction *fs = (CUfunction *)malloc((n ? n : 1) * sizeof *fs);
    if (!fs) return dj_fail(e, "out of host memory listing the GPU's kernels");
    int rc = list(fs, n, m) == CUDA_SUCCESS ? 0 : -1;
    for (unsigned i = 0; !rc && i < n; i++) rc = load(fs[i]) == CUDA_SUCCESS ? 0 : -1;
    free(fs);
    return rc ? dj_fail(e, "cuda: cannot load the kernels of a module on %s", g->name) : 0;
}

extern "C" int gpu_reserve(dj_gpu *g, size_t bytes, dj_err *e) {
    if (bytes <= g->scratch_size) return 0;
    bytes = (size_t)dj_align_up(bytes, 1u << 20);
    if (gpu_hold_release(g, e)) return -1;
    CUDA_CHECK(cudaDeviceSynchronize());  // work in flight may still use the old scratch
    gpu_free(g->scratch);
    g->scratch = NULL;
    g->scratch_size = 0;
    if (gpu_malloc(&g->scratch, bytes, "GPU scratch (activations in the weight dtype, attention partials)", e))
        return -1;
    g->scratch_size = bytes;
    return 0;
}

// Scratch for a call on stream s (kernels_impl.h says when it grows).
int scratch_need(dj_gpu *g, size_t bytes, cudaStream_t s, dj_err *e) {
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

// ---- copies
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

extern "C" int gpu_copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                size_t height, cudaStream_t s, dj_err *e) {
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, s));
    return 0;
}

// ---- pinned host memory
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
extern "C" int gpu_set_device(int device, dj_err *e) {
    CUDA_CHECK(cudaSetDevice(device));
    return 0;
}
extern "C" int gpu_peer_enable(int peer, dj_err *e) {
    int self = 0, can = 0;
    CUDA_CHECK(cudaGetDevice(&self));
    if (peer == self) return 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&can, self, peer));
    if (!can)
        return dj_fail(e, "GPUs %d and %d have no peer access (cudaDeviceCanAccessPeer): their sums would go through "
                          "host memory, which feeds the links", self, peer);
    cudaError_t r = cudaDeviceEnablePeerAccess(peer, 0);
    if (r == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else CUDA_CHECK(r);
    return 0;
}
extern "C" int gpu_device_sync(dj_err *e) {
    CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}
extern "C" int gpu_clock_khz(int *khz, dj_err *e) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(khz, cudaDevAttrClockRate, dev));
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
