// bench/bench_gpu.h: what the CUDA benchmarks share (ceilings.cu, qgemm_bench.cu, ...): error checks that end the run
// with the call's name, fills of pseudo-random values, and timing with CUDA events, plain or inside a graph.
#ifndef DJINN_BENCH_GPU_H
#define DJINN_BENCH_GPU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "../kernels.h"

#define CK(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t err_ = (call);                                                                        \
        if (err_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "bench: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,              \
                    cudaGetErrorName(err_));                                                              \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)
#define CKB(call)                                                                                         \
    do {                                                                                                  \
        cublasStatus_t st_ = (call);                                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                               \
            fprintf(stderr, "bench: %s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,              \
                    cublasGetStatusName(st_));                                                            \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)
#define CKD(call)                                                                                         \
    do {                                                                                                  \
        dj_err e_;                                                                                        \
        if ((call) != 0) {                                                                                \
            fprintf(stderr, "bench: %s\n", e_.msg);                                                    \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

// A matrix of a model's layer, (n_out, n_in), by the model's and the matrix's names.
struct shape {
    const char *model, *name;
    int64_t n_out, n_in;
};

// ||a - b|| / ||b|| over n values; infinite where a holds a NaN or an infinity.
static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// Device 0 opened for a benchmark named `tool`, with a non-blocking stream and the device's properties; the run ends
// with one line where there is no GPU.
static dj_gpu *bench_open(const char *tool, cudaStream_t *s, cudaDeviceProp *prop) {
    if (gpu_count() == 0) {
        fprintf(stderr, "%s: no GPU found\n", tool);
        exit(1);
    }
    dj_gpu *g;
    CKD(gpu_open(&g, 0, &e_));
    CK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    CK(cudaGetDeviceProperties(prop, 0));
    return g;
}

// Pseudo-random values in [-0.5, 0.5) of any element type: never time on zeros.
template <typename T>
__global__ void fill_kernel(T *p, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = (T)((float)(h & 0xffffff) / 16777216.0f - 0.5f);
    }
}
__global__ void fill_u16_kernel(uint16_t *p, size_t n, uint32_t seed, int bf16) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        float f = (float)(h & 0xffffff) / 16777216.0f - 0.5f;
        p[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16(f)) : __half_as_ushort(__float2half(f));
    }
}

// Median milliseconds per call of fn over `reps` timed groups of `iters` calls, after a warm-up group.
template <typename F>
static double time_ms(cudaStream_t s, int iters, int reps, F fn) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < iters; i++) fn(i);
    CK(cudaStreamSynchronize(s));
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < iters; i++) fn(i);
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / iters);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// The same, the `iters` calls captured once into a CUDA graph and replayed, as a decode step runs them: launch
// gaps as the engine sees them, not the host's launch rate.
template <typename F>
static double time_graph_ms(cudaStream_t s, int iters, int reps, F fn) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; i++) fn(i);
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms = time_ms(s, 1, reps, [&](int) { CK(cudaGraphLaunch(exec, s)); });
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return ms / iters;
}

// The HBM ceiling every benchmark sets its figures beside: GB/s of a D2D copy of `bytes` from src to dst, read and
// write both counted (the median of 11 groups of 5).
static double d2d_copy_gbs(cudaStream_t s, void *dst, const void *src, size_t bytes) {
    const double ms =
        time_ms(s, 5, 11, [&](int) { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
    return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// Copies of a matrix of `bytes` (random f16 bit patterns of [-0.5, 0.5): finite weights for f16; as q8 or q4 a
// group parameter may decode to an infinite scale, so these time, not compute), enough of them (at least 2) that
// cycling through them misses an L2 of l2 bytes.
// Every 16-bit word's scale code (bits 0-9) kept below 512: wherever a row's group parameters fall, none is a code
// from DJ_Q_CODE_END on (an infinite scale, which model.bin never holds); the values' bytes stay random.
__global__ void q_params_finite_kernel(uint16_t *p, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] &= (uint16_t)~0x0200u;
}

static std::vector<void *> weight_copies(size_t bytes, size_t l2, cudaStream_t s) {
    std::vector<void *> w(std::max<size_t>(2, 4 * l2 / bytes + 1));
    for (size_t c = 0; c < w.size(); c++) {
        CK(cudaMalloc(&w[c], bytes));
        fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)w[c], bytes / 2, 30 + (int)c, 0);
        q_params_finite_kernel<<<4096, 256, 0, s>>>((uint16_t *)w[c], bytes / 2);
        CK(cudaGetLastError());
    }
    return w;
}

// A product's operands for up to Tmax tokens: x (Tmax, n_in) of pseudo-random values, y and yref (Tmax, n_out) on
// the device, and host room for both outputs.
struct bench_mm {
    float *x, *y, *yref;
    std::vector<float> hy, href;
    bench_mm(int64_t Tmax, int64_t n_in, int64_t n_out, cudaStream_t s)
        : hy((size_t)(Tmax * n_out)), href((size_t)(Tmax * n_out)) {
        CK(cudaMalloc(&x, (size_t)(Tmax * n_in) * 4));
        CK(cudaMalloc(&y, (size_t)(Tmax * n_out) * 4));
        CK(cudaMalloc(&yref, (size_t)(Tmax * n_out) * 4));
        fill_kernel<float><<<4096, 256, 0, s>>>(x, (size_t)(Tmax * n_in), 8);
        CK(cudaGetLastError());
    }
    ~bench_mm() { cudaFree(x), cudaFree(y), cudaFree(yref); }
};

#endif
