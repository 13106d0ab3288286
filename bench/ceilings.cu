// bench/ceilings.cu: the hardware ceilings Djinn's numbers are reported against, measured on this GPU, and
// the decode GEMV against them.
//   HBM: device-to-device copy, bytes read + bytes written per second (1 GiB buffers).
//   PCIe: pinned host-to-device copy in 64 MiB chunks (the streaming engine's transfer size).
//   Host memory (host_section): read by every CPU of the affinity mask from a pinned buffer, alone and while pinned
//   H2D copies run; the two rates together are the combined ceiling of a streamed step with a CPU share. The same
//   with the CPU share's own q4 and f16 matvecs as the readers: the ceilings of a q4 and an f16 step's share.
//   Tensor cores: cuBLAS f16 GEMM 8192^3 with fp32 accumulation, TFLOP/s.
//   GEMV: gpu_matmul's T = 1 paths (ours, cuBLAS) and cuBLASLt on the Llama-2-7B shapes in f16, bf16 and f32,
//   GB/s of weights + activations moved and the fraction of the measured D2D bandwidth. The weights rotate
//   over copies totalling > 4x the L2 size so each call reads HBM, not cache.
//   Prefill GEMMs: gpu_matmul's cuBLAS path (the f32 -> f16 rounding of x included) on the fused 7B shapes at
//   T = 512, TFLOP/s and the fraction of the GEMM ceiling; and every algorithm cuBLASLt's heuristic offers for
//   the shape, each timed alone: the first (its top-1 choice, "cublaslt top-1") and the best.
//   Quantized weights on the Llama-3-8B shapes (q|k|v, wo, gate|up, down, lm_head): the decode GEMV in f16, q8
//   and q4, GB/s of the bytes the format stores (the fraction of D2D is the issue's measure) and its fraction of
//   the fastest kernel that only reads the same bytes (a short read's start and end cost what D2D's does not),
//   and the T = 512 prefill product (q8 and q4 dequantize chunks of rows to f16 for cuBLAS), tokens/s against f16's.
//   cuBLASLt is timed here, on descriptors of its own (Djinn does not use it): the same product as gpu_matmul's
//   cuBLAS path, W^T . x with fp32 compute and f32 output, with x already in the weight dtype (no rounding pass;
//   bf16 as its hi and lo parts, two products, as the cuBLAS path computes it).
// Usage: ceilings [out.json]. Prints a table; writes JSON when given a path. GPU machine only. QUANT_ONLY=1 in the
// environment: the ceilings and the quantized section alone, printed; LINK_ONLY=1: the pinned H2D and D2H rates and
// the host memory's (printed, and the JSON).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "../kernels_impl.h"  // pdl_launch, pdl_wait, pdl_trigger: the GEMV's own launch
#include "bench_gpu.h"
#include "host_matvec.h"
#include "host_read.h"
extern "C" {
#include "../model.h"  // dtype enum only
#include "../pool.h"
}

static size_t dt_size(uint32_t dt) { return dt == DJ_F32 ? 4 : 2; }
static const char *dt_name(uint32_t dt) {
    return dt == DJ_F32 ? "f32" : dt == DJ_F16 ? "f16" : dt == DJ_BF16 ? "bf16" : dt == DJ_Q8 ? "q8" : "q4";
}

// cuBLASLt's view of y (T, n_out) f32 = x (T, n_in) . W^T, W and x in dtype dt: in column-major terms
// W^T . x, A = W (n_in x n_out, transposed), B = x (n_in x T), C = y (n_out x T); and up to 16 algorithms its
// heuristic offers for a workspace of ws bytes, best guess first.
struct lt_problem {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulHeuristicResult_t res[16];
    int n;
};

static void lt_open(lt_problem *p, cublasLtHandle_t lt, uint32_t dt, int64_t T, int64_t n_in, int64_t n_out,
                    size_t ws) {
    const cudaDataType_t cdt = dt == DJ_F16 ? CUDA_R_16F : dt == DJ_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t ta = CUBLAS_OP_T;
    CKB(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CKB(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKB(cublasLtMatrixLayoutCreate(&p->la, cdt, (uint64_t)n_in, (uint64_t)n_out, n_in));
    CKB(cublasLtMatrixLayoutCreate(&p->lb, cdt, (uint64_t)n_in, (uint64_t)T, n_in));
    CKB(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, (uint64_t)n_out, (uint64_t)T, n_out));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsz = ws;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    p->n = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 16, p->res, &p->n));
    CKB(cublasLtMatmulPreferenceDestroy(pref));
    if (p->n == 0) {
        fprintf(stderr, "ceilings: cuBLASLt offers no algorithm for %s T=%lld n_in=%lld n_out=%lld\n", dt_name(dt),
                (long long)T, (long long)n_in, (long long)n_out);
        exit(1);
    }
}

static void lt_close(lt_problem *p) {
    CKB(cublasLtMatrixLayoutDestroy(p->la));
    CKB(cublasLtMatrixLayoutDestroy(p->lb));
    CKB(cublasLtMatrixLayoutDestroy(p->lc));
    CKB(cublasLtMatmulDescDestroy(p->op));
}

// y = W . x with the problem's algorithm k; then y += W . xlo when xlo is given (bf16's low part).
static void lt_matmul(cublasLtHandle_t lt, const lt_problem *p, int k, const void *w, const void *x, const void *xlo,
                      float *y, void *work, size_t ws, cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    CKB(cublasLtMatmul(lt, p->op, &one, w, p->la, x, p->lb, &zero, y, p->lc, y, p->lc, &p->res[k].algo, work, ws, s));
    if (xlo)
        CKB(cublasLtMatmul(lt, p->op, &one, w, p->la, xlo, p->lb, &one, y, p->lc, y, p->lc, &p->res[k].algo, work, ws,
                           s));
}

// ---- the least time a kernel takes to read n bytes: the ceiling of a GEMV of that size, beside D2D's
// A grid-stride read of 16-byte words, four loads in flight a thread, folded into one word that is never written
// (unless it happens to equal `never`, which keeps the loads). As a programmatic dependent (pdl) it waits on the
// kernel before it and then lets the next one launch, as the quantized GEMV does, so a chain of them hides its launches
// but not its starts and ends.
template <bool pdl>
__global__ void read_kernel(const uint4 *__restrict__ p, size_t n16, unsigned never, unsigned *sink) {
    if (pdl) pdl_wait(), pdl_trigger();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                    d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = __ldg(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == never) *sink = acc;
}

// The best over grids of 1-8 blocks an SM and 256-1024 threads, in a CUDA graph of reads of the rotating copies w
// (bytes each, a multiple of 16), plain launches and programmatic dependents alike: microseconds a read.
static double read_us(const std::vector<void *> &w, size_t bytes, int sms, cudaStream_t s) {
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    const int copies = (int)w.size();
    double best = 1e30;
    for (int pdl = 0; pdl < 2; pdl++)
        for (int bps = 1; bps <= 8; bps *= 2)
            for (int threads = 256; threads <= 1024; threads *= 2) {
                if (bps * threads > 2048) continue;  // an SM's thread limit
                const dim3 grid((unsigned)(sms * bps)), block((unsigned)threads);
                const double us = 1e3 * time_graph_ms(s, 8 * copies, 9, [&](int i) {
                    const uint4 *src = (const uint4 *)w[i % copies];
                    if (pdl) {
                        CK(pdl_launch(read_kernel<true>, grid, block, 0, s, src, bytes / 16, 0x9e3779b9u, sink));
                    } else {
                        read_kernel<false><<<grid, block, 0, s>>>(src, bytes / 16, 0x9e3779b9u, sink);
                        CK(cudaGetLastError());
                    }
                });
                best = std::min(best, us);
            }
    CK(cudaFree(sink));
    return best;
}

// ---- quantized weights: decode GEMV and T = 512 prefill on the Llama-3-8B shapes (and 70B's down), f16 beside
// q8 and q4
struct qrow { const char *dt; int64_t n_out, n_in; double gemv_us, gemv_gbs, gemv_frac, read_us, prefill_us; };

static std::vector<qrow> quant_section(dj_gpu *g, cudaStream_t s, size_t l2, int sms, double d2d_gbs) {
    // n_out, n_in, times in a Llama-3-8B decode step (the lm_head once, in q8 for q8 and q4 models alike: the
    // converter's head type); the last: Llama-3-70B's down projection
    static const int64_t shapes[][3] = {{6144, 4096, 32}, {4096, 4096, 32}, {28672, 4096, 32}, {4096, 14336, 32},
                                        {128256, 4096, 1}, {8192, 28672, 0}};
    double step_bytes[2] = {0, 0}, step_us[2] = {0, 0}, step_read_us[2] = {0, 0};  // q8's step, q4's
    static const uint32_t dtypes[] = {DJ_F16, DJ_Q8, DJ_Q4};
    const int64_t PT = 512;
    std::vector<qrow> rows;
    printf("\nquantized weights, Llama-3-8B shapes: decode GEMV in a CUDA graph (GB/s of stored bytes; of D2D, %.0f GB/s "
           "in this run; the fastest read of the same bytes, its us and the GEMV's fraction of it) and prefill T = "
           "%lld\n", d2d_gbs, (long long)PT);
    printf("%-5s %14s %10s %10s %8s %8s %8s %12s %10s\n", "dtype", "shape", "gemv us", "GB/s", "of D2D", "read us",
           "of read", "prefill us", "of f16");
    for (auto &sh : shapes) {
        const int64_t n_out = sh[0], n_in = sh[1];
        double f16_prefill_us = 0;
        float *x, *y;
        CK(cudaMalloc(&x, (size_t)(PT * n_in) * 4));
        CK(cudaMalloc(&y, (size_t)(PT * n_out) * 4));
        fill_kernel<float><<<4096, 256, 0, s>>>(x, (size_t)(PT * n_in), 8);
        CK(cudaGetLastError());
        for (uint32_t dt : dtypes) {
            const size_t wbytes = (size_t)dj_matrix_bytes(dt, (uint64_t)n_out, (uint64_t)n_in);
            const std::vector<void *> w = weight_copies(wbytes, l2, s);
            const int copies = (int)w.size();
            qrow r = {dt_name(dt), n_out, n_in, 0, 0, 0, 0, 0};
            r.gemv_us = 1e3 * time_graph_ms(s, 8 * copies, 9, [&](int i) {
                CKD(gpu_matmul_path(g, GPU_MM_GEMV, y, x, w[i % copies], dt, 1, n_in, n_out, s, &e_));
            });
            r.gemv_gbs = ((double)wbytes + 4.0 * (n_in + n_out)) / (r.gemv_us * 1e-6) / 1e9;
            r.gemv_frac = r.gemv_gbs / d2d_gbs;
            r.read_us = read_us(w, wbytes / 16 * 16, sms, s);
            r.prefill_us = 1e3 * time_ms(s, 2 * copies, 5, [&](int i) {
                CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, y, x, w[i % copies], dt, PT, n_in, n_out, s, &e_));
            });
            if (dt == DJ_F16) f16_prefill_us = r.prefill_us;
            for (int q = 0; q < 2; q++) {  // the step's GEMVs: the layers in the step's dtype, the lm_head in q8
                const uint32_t in_step = q == 0 || sh[2] == 1 ? DJ_Q8 : DJ_Q4;
                if (sh[2] && dt == in_step)
                    step_bytes[q] += sh[2] * r.gemv_gbs * r.gemv_us * 1e3, step_us[q] += sh[2] * r.gemv_us,
                    step_read_us[q] += sh[2] * r.read_us;
            }
            printf("%-5s %6lldx%-7lld %10.1f %10.1f %7.1f%% %8.1f %7.1f%% %12.1f %9.1f%%\n", r.dt, (long long)n_out,
                   (long long)n_in, r.gemv_us, r.gemv_gbs, 100 * r.gemv_frac, r.read_us, 100 * r.read_us / r.gemv_us,
                   r.prefill_us, 100 * f16_prefill_us / r.prefill_us);
            rows.push_back(r);
            for (void *p : w) CK(cudaFree(p));
        }
        CK(cudaFree(x));
        CK(cudaFree(y));
    }
    // A Llama-3-8B decode step's GEMVs together: their bytes over the sum of their times.
    for (int q = 0; q < 2; q++)
        printf("%s: a Llama-3-8B step's GEMVs together (32 layers, the lm_head in q8): %.1f GB/s, %.1f%% of D2D, "
               "%.1f%% of the same reads\n", q ? "q4" : "q8", step_bytes[q] / step_us[q] / 1e3,
               100 * step_bytes[q] / step_us[q] / 1e3 / d2d_gbs, 100 * step_read_us[q] / step_us[q]);
    return rows;
}

// ---- host memory: the CPU share reads weights from page-locked host memory while the copies stream others from it
// over PCIe. Alone: every thread of the pool (one per CPU of the affinity mask) reading a pinned buffer of HOST_GIB,
// best of 5 passes (bench/host_read.c, as bench/cpu_matvec.c measures it). Together: the same passes while pinned
// H2D copies in 64 MiB chunks from another pinned buffer run on a stream, each side over the time they overlapped:
// the host the mean of the passes that ended before the copies did, H2D the chunks that began after the first
// chunk still copying when the reads began and ended before the last such pass did. Their sum is the combined
// ceiling a streamed step with a CPU share is held to.
// The same for the CPU share's own q4, q8 and f16 matvecs in place of the plain reads (bench/host_matvec.c): what
// that kernel reaches beside the copies, the ceiling of a q4 (q8, f16) step's CPU share.
#define HOST_GIB 4
struct host_ceil { int threads; double alone, with_h2d, h2d_with; int passes; };
struct host_reader {
    void (*fill)(uint8_t *, size_t);            // writes every page
    double (*pass)(const uint8_t *, size_t);    // seconds for one pass
    size_t (*read)(size_t);                     // the bytes one pass reads
};
static size_t all_bytes(size_t bytes) { return bytes; }
static const host_reader plain_reads = {host_touch, host_read_pass, all_bytes};
static const host_reader q4_matvec = {host_q4_fill, host_q4_pass, host_q4_bytes};
static const host_reader q8_matvec = {host_q8_fill, host_q8_pass, host_q8_bytes};
static const host_reader f16_matvec = {host_f16_fill, host_f16_pass, host_f16_bytes};

// The first of ev[i..] not yet complete (ev.size(): all are).
static size_t next_pending(const std::vector<cudaEvent_t> &ev, size_t i) {
    for (; i < ev.size(); i++) {
        cudaError_t q = cudaEventQuery(ev[i]);
        if (q == cudaErrorNotReady) return i;
        CK(q);
    }
    return i;
}

// dev: n_src chunks of device memory, src: n_src chunks of pinned host memory; h2d_gbs: the link's rate alone.
static host_ceil host_section(cudaStream_t s, void *dev, const void *src, size_t chunk, size_t n_src, double h2d_gbs,
                              const host_reader &rd) {
    const size_t bytes = (size_t)HOST_GIB << 30, got = rd.read(bytes);
    uint8_t *buf;
    CK(cudaHostAlloc((void **)&buf, bytes, cudaHostAllocDefault));
    rd.fill(buf, bytes);
    host_ceil r = {cpu_threads(), 0, 0, 0, 0};
    for (int k = 0; k < 5; k++) r.alone = std::max(r.alone, (double)got / rd.pass(buf, bytes) / 1e9);
    // enough chunks to outlast about ten passes at the rate alone; twice as many when they did not
    size_t n = (size_t)(10.0 * (double)bytes / r.alone * h2d_gbs / (double)chunk) + 16;
    for (int tries = 0; tries < 4 && !r.passes; tries++, n *= 2) {
        std::vector<cudaEvent_t> ev(n);
        for (cudaEvent_t &e : ev) CK(cudaEventCreate(&e));
        for (size_t i = 0; i < n; i++) {
            const size_t off = i % n_src * chunk;
            CK(cudaMemcpyAsync((char *)dev + off, (const char *)src + off, chunk, cudaMemcpyHostToDevice, s));
            CK(cudaEventRecord(ev[i], s));
        }
        const size_t a = next_pending(ev, 0);  // ends after the reads began
        size_t done = a;                       // chunks [0, done) ended before the last counted pass did
        double read_s = 0;
        int passes = 0;
        for (;;) {
            const double t = rd.pass(buf, bytes);
            const size_t d = next_pending(ev, done);
            if (d == n) break;  // the copies ended during this pass: part of it read alone
            read_s += t, passes++, done = d;
        }
        CK(cudaStreamSynchronize(s));
        const cudaError_t le = cudaGetLastError();  // the queries' cudaErrorNotReady is no failure
        if (le != cudaErrorNotReady) CK(le);
        if (passes >= 2 && done >= a + 9) {
            float ms;
            CK(cudaEventElapsedTime(&ms, ev[a], ev[done - 1]));
            r.with_h2d = (double)passes * (double)got / read_s / 1e9;
            r.h2d_with = (double)(done - 1 - a) * (double)chunk / (ms * 1e-3) / 1e9;
            r.passes = passes;
        }
        for (cudaEvent_t e : ev) CK(cudaEventDestroy(e));
    }
    CK(cudaFreeHost(buf));
    if (!r.passes) {
        fprintf(stderr, "ceilings: the host's reads and the H2D copies never overlapped for two passes\n");
        exit(1);
    }
    return r;
}

// The CPU share's matvecs, each measured as host_section's reader.
#define HOST_MATVECS 3
static const struct { const char *name; const host_reader *rd; } matvecs[HOST_MATVECS] = {
    {"q4", &q4_matvec}, {"q8", &q8_matvec}, {"f16", &f16_matvec}};

static void host_print(const host_ceil &h, const host_ceil *mv) {
    char what[64];
    snprintf(what, sizeof what, "host memory read, %d threads (%d GiB)", h.threads, HOST_GIB);
    printf("%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n", what, h.alone,
           "  while pinned H2D copies run", h.with_h2d, "PCIe pinned H2D while the host reads", h.h2d_with,
           "combined (host read + H2D, together)", h.with_h2d + h.h2d_with);
    for (int k = 0; k < HOST_MATVECS; k++) {
        char name[64], comb[64];
        snprintf(name, sizeof name, "%s matvec (CPU share), %d threads", matvecs[k].name, mv[k].threads);
        snprintf(comb, sizeof comb, "combined (%s matvec + H2D, together)", matvecs[k].name);
        printf("%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n", name, mv[k].alone,
               "  while pinned H2D copies run", mv[k].with_h2d, "PCIe pinned H2D while the matvec runs",
               mv[k].h2d_with, comb, mv[k].with_h2d + mv[k].h2d_with);
    }
}

// The host section's JSON members (no braces), after the members before them.
static int host_json(FILE *f, const host_ceil &h, const host_ceil *mv) {
    if (fprintf(f, "\"host_read_threads\": %d, \"host_read_gbs\": %.3f, \"host_read_with_h2d_gbs\": %.3f, "
                   "\"h2d_with_host_read_gbs\": %.3f, \"host_plus_h2d_gbs\": %.3f", h.threads, h.alone, h.with_h2d,
                h.h2d_with, h.with_h2d + h.h2d_with) < 0)
        return -1;
    for (int k = 0; k < HOST_MATVECS; k++) {
        const char *n = matvecs[k].name;
        if (fprintf(f, ", \"%s_matvec_gbs\": %.3f, \"%s_matvec_with_h2d_gbs\": %.3f, \"h2d_with_%s_matvec_gbs\": %.3f, "
                       "\"%s_matvec_plus_h2d_gbs\": %.3f", n, mv[k].alone, n, mv[k].with_h2d, n, mv[k].h2d_with, n,
                    mv[k].with_h2d + mv[k].h2d_with) < 0)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    cudaStream_t s;
    cudaDeviceProp prop;
    dj_gpu *g = bench_open("ceilings", &s, &prop);
    printf("device: %s, L2 %.0f MiB\n", gpu_name(g), prop.l2CacheSize / 1048576.0);

    // ---- HBM: D2D copy
    const size_t big = (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, big));
    CK(cudaMalloc(&dst, big));
    fill_kernel<float><<<4096, 256, 0, s>>>((float *)src, big / 4, 1);
    CK(cudaGetLastError());
    const double d2d_gbs = d2d_copy_gbs(s, dst, src, big);
    CK(cudaFree(dst));

    // ---- PCIe: pinned H2D in 64 MiB chunks
    const size_t chunk = (size_t)64 << 20, n_chunks = 16;
    void *host;
    CK(cudaHostAlloc(&host, chunk * n_chunks, cudaHostAllocDefault));
    for (size_t i = 0; i < chunk * n_chunks / 4; i++) ((float *)host)[i] = (float)(i % 1000) * 0.001f;
    double h2d_ms = time_ms(s, (int)n_chunks, 5, [&](int i) {
        CK(cudaMemcpyAsync((char *)src + (size_t)i * chunk, (char *)host + (size_t)i * chunk, chunk,
                           cudaMemcpyHostToDevice, s));
    });
    const double h2d_gbs = (double)chunk / (h2d_ms * 1e-3) / 1e9;
    // ---- PCIe: pinned D2H in 64 MiB chunks (parked KV caches go this way)
    double d2h_ms = time_ms(s, (int)n_chunks, 5, [&](int i) {
        CK(cudaMemcpyAsync((char *)host + (size_t)i * chunk, (char *)src + (size_t)i * chunk, chunk,
                           cudaMemcpyDeviceToHost, s));
    });
    const double d2h_gbs = (double)chunk / (d2h_ms * 1e-3) / 1e9;
    // ---- host memory, alone and beside the copies
    const bool quant_only = getenv("QUANT_ONLY") != NULL;
    const host_ceil hc = quant_only ? host_ceil{} : host_section(s, src, host, chunk, n_chunks, h2d_gbs, plain_reads);
    host_ceil mv[HOST_MATVECS] = {};
    for (int k = 0; k < HOST_MATVECS && !quant_only; k++)
        mv[k] = host_section(s, src, host, chunk, n_chunks, h2d_gbs, *matvecs[k].rd);
    if (getenv("LINK_ONLY")) {  // LINK_ONLY=1: the link's two directions and the host's memory (the bench scripts)
        printf("%-40s %9.2f GB/s\n%-40s %9.2f GB/s\n", "PCIe pinned H2D (64 MiB chunks)", h2d_gbs,
               "PCIe pinned D2H (64 MiB chunks)", d2h_gbs);
        host_print(hc, mv);
        FILE *f = argc > 1 ? fopen(argv[1], "w") : NULL;
        if (argc > 1 && !f) {
            perror(argv[1]);
            return 1;
        }
        if (f && (fprintf(f, "{\"device\": \"%s\", \"pcie_h2d_pinned_64mib_gbs\": %.3f, "
                             "\"pcie_d2h_pinned_64mib_gbs\": %.3f, ", gpu_name(g), h2d_gbs, d2h_gbs) < 0 ||
                  host_json(f, hc, mv) || fprintf(f, "}\n") < 0 || fclose(f))) {
            perror(argv[1]);
            return 1;
        }
        cpu_pool_stop();
        return 0;
    }
    CK(cudaFreeHost(host));
    CK(cudaFree(src));

    // ---- tensor cores: cuBLAS f16 GEMM, fp32 accumulation
    const int N = 8192;
    __half *A, *B, *C;
    CK(cudaMalloc(&A, (size_t)N * N * 2));
    CK(cudaMalloc(&B, (size_t)N * N * 2));
    CK(cudaMalloc(&C, (size_t)N * N * 2));
    fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)A, (size_t)N * N, 2, 0);
    fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)B, (size_t)N * N, 3, 0);
    CK(cudaGetLastError());
    cublasHandle_t blas;
    CKB(cublasCreate(&blas));
    CKB(cublasSetStream(blas, s));
    const float one = 1.0f, zero = 0.0f;
    double gemm_ms = time_ms(s, 3, 7, [&](int) {
        CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16F, N, B, CUDA_R_16F, N, &zero, C,
                         CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    const double gemm_tflops = 2.0 * N * (double)N * N / (gemm_ms * 1e-3) / 1e12;
    CKB(cublasDestroy(blas));
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));

    if (getenv("QUANT_ONLY")) {  // QUANT_ONLY=1: the quantized section alone (a kernel variant: matmul.cu's constants changed in a build folder of its own)
        printf("%-40s %9.1f GB/s\n%-40s %9.1f TFLOP/s\n", "HBM D2D copy (read+write, 1 GiB)", d2d_gbs,
               "cuBLAS f16 GEMM 8192^3 (fp32 acc)", gemm_tflops);
        quant_section(g, s, (size_t)prop.l2CacheSize, prop.multiProcessorCount, d2d_gbs);
        return 0;
    }
    printf("\n%-40s %12s\n", "ceiling", "value");
    printf("%-40s %9.1f GB/s\n", "HBM D2D copy (read+write, 1 GiB)", d2d_gbs);
    printf("%-40s %9.2f GB/s\n", "PCIe pinned H2D (64 MiB chunks)", h2d_gbs);
    printf("%-40s %9.2f GB/s\n", "PCIe pinned D2H (64 MiB chunks)", d2h_gbs);
    host_print(hc, mv);
    printf("%-40s %7.1f TFLOP/s\n", "cuBLAS f16 GEMM 8192^3 (fp32 acc)", gemm_tflops);

    // cuBLASLt: a handle and a workspace of its own
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    const size_t lt_ws = (size_t)32 << 20;
    void *lt_work;
    CK(cudaMalloc(&lt_work, lt_ws));

    // ---- GEMV on the 7B shapes: (n_out, n_in)
    static const int64_t shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
    static const uint32_t dtypes[] = {DJ_F16, DJ_BF16, DJ_F32};
    static const int paths[] = {GPU_MM_GEMV, GPU_MM_CUBLAS, -1};  // -1: cuBLASLt, timed here
    static const char *pnames[] = {"gemv", "cublas", "cublaslt"};
    struct row { const char *dt, *path; int64_t n_out, n_in; double us, gbs, frac; };
    std::vector<row> rows;
    printf("\n%-6s %-9s %14s %10s %10s %8s\n", "dtype", "path", "shape", "us", "GB/s", "of D2D");
    for (uint32_t dt : dtypes)
        for (auto &sh : shapes) {
            const int64_t n_out = sh[0], n_in = sh[1];
            const size_t wbytes = (size_t)(n_out * n_in) * dt_size(dt);
            const int copies = (int)std::max<size_t>(2, (4 * (size_t)prop.l2CacheSize) / wbytes + 1);
            std::vector<void *> w(copies);
            for (int c = 0; c < copies; c++) {
                CK(cudaMalloc(&w[c], wbytes));
                if (dt == DJ_F32)
                    fill_kernel<float><<<4096, 256, 0, s>>>((float *)w[c], wbytes / 4, 10 + c);
                else
                    fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)w[c], wbytes / 2, 10 + c, dt == DJ_BF16);
                CK(cudaGetLastError());
            }
            float *x, *y;
            void *xq = NULL, *xlo = NULL;  // cuBLASLt's x in the weight dtype; bf16: hi and lo parts
            CK(cudaMalloc(&x, (size_t)n_in * 4));
            CK(cudaMalloc(&y, (size_t)n_out * 4));
            fill_kernel<float><<<64, 256, 0, s>>>(x, (size_t)n_in, 7);
            if (dt != DJ_F32) {
                CK(cudaMalloc(&xq, (size_t)n_in * 2));
                fill_u16_kernel<<<64, 256, 0, s>>>((uint16_t *)xq, (size_t)n_in, 5, dt == DJ_BF16);
            }
            if (dt == DJ_BF16) {
                CK(cudaMalloc(&xlo, (size_t)n_in * 2));
                fill_u16_kernel<<<64, 256, 0, s>>>((uint16_t *)xlo, (size_t)n_in, 6, 1);
            }
            CK(cudaGetLastError());
            lt_problem lp;
            lt_open(&lp, lt, dt, 1, n_in, n_out, lt_ws);
            for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
                double ms = time_ms(s, 4 * copies, 9, [&](int i) {
                    if (paths[p] < 0)
                        lt_matmul(lt, &lp, 0, w[i % copies], xq ? xq : x, xlo, y, lt_work, lt_ws, s);
                    else
                        CKD(gpu_matmul_path(g, paths[p], y, x, w[i % copies], dt, 1, n_in, n_out, s, &e_));
                });
                const double bytes = (double)wbytes + 4.0 * (n_in + n_out);
                const double gbs = bytes / (ms * 1e-3) / 1e9;
                rows.push_back({dt_name(dt), pnames[p], n_out, n_in, ms * 1e3, gbs, gbs / d2d_gbs});
                printf("%-6s %-9s %6lldx%-7lld %10.1f %10.1f %7.1f%%\n", dt_name(dt), pnames[p],
                       (long long)n_out, (long long)n_in, ms * 1e3, gbs, 100.0 * gbs / d2d_gbs);
            }
            lt_close(&lp);
            for (void *p : w) CK(cudaFree(p));
            CK(cudaFree(x));
            CK(cudaFree(y));
            CK(cudaFree(xq));
            CK(cudaFree(xlo));
        }

    // ---- prefill GEMMs on the fused 7B shapes, T = 512: (n_out, n_in)
    static const int64_t pshapes[][2] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}, {32000, 4096}};
    const int64_t PT = 512;
    struct grow { int64_t n_out, n_in; double cublas_us, lt_us, lt_best_us; int lt_best, lt_n; };
    std::vector<grow> grows;
    printf("\nprefill GEMM, f16 weights, T = %lld (TFLOP/s; of the GEMM ceiling)\n", (long long)PT);
    printf("%14s %18s %18s %24s\n", "shape", "cublas", "cublaslt top-1", "cublaslt best of n");
    for (auto &sh : pshapes) {
        const int64_t n_out = sh[0], n_in = sh[1];
        const size_t wbytes = (size_t)(n_out * n_in) * 2;
        const int copies = (int)std::max<size_t>(2, (4 * (size_t)prop.l2CacheSize) / wbytes + 1);
        std::vector<void *> w(copies);
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&w[c], wbytes));
            fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)w[c], wbytes / 2, 20 + c, 0);
            CK(cudaGetLastError());
        }
        float *x, *y;
        __half *xh;
        CK(cudaMalloc(&x, (size_t)(PT * n_in) * 4));
        CK(cudaMalloc(&xh, (size_t)(PT * n_in) * 2));
        CK(cudaMalloc(&y, (size_t)(PT * n_out) * 4));
        fill_kernel<float><<<4096, 256, 0, s>>>(x, (size_t)(PT * n_in), 8);
        fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)xh, (size_t)(PT * n_in), 9, 0);
        CK(cudaGetLastError());
        const double flop = 2.0 * PT * n_in * n_out;
        grow r = {n_out, n_in, 0, 0, 0, -1, 0};
        r.cublas_us = 1e3 * time_ms(s, 2 * copies, 7, [&](int i) {
            CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, y, x, w[i % copies], DJ_F16, PT, n_in, n_out, s, &e_));
        });
        // every candidate of cuBLASLt's heuristic alone; the first is its top-1 choice
        lt_problem lp;
        lt_open(&lp, lt, DJ_F16, PT, n_in, n_out, lt_ws);
        r.lt_n = lp.n;
        for (int k = 0; k < lp.n; k++) {
            double us = 1e3 * time_ms(s, 2 * copies, 5, [&](int i) {
                lt_matmul(lt, &lp, k, w[i % copies], xh, NULL, y, lt_work, lt_ws, s);
            });
            if (k == 0) r.lt_us = us;
            if (r.lt_best < 0 || us < r.lt_best_us) r.lt_best_us = us, r.lt_best = k;
        }
        lt_close(&lp);
        const double pk = gemm_tflops;
        printf("%6lldx%-7lld %8.1f us %5.1f%% %8.1f us %5.1f%% %8.1f us %5.1f%% (#%d of %d)\n", (long long)n_out,
               (long long)n_in, r.cublas_us, 100 * flop / (r.cublas_us * 1e-6) / 1e12 / pk, r.lt_us,
               100 * flop / (r.lt_us * 1e-6) / 1e12 / pk, r.lt_best_us,
               100 * flop / (r.lt_best_us * 1e-6) / 1e12 / pk, r.lt_best, r.lt_n);
        grows.push_back(r);
        for (void *p : w) CK(cudaFree(p));
        CK(cudaFree(x));
        CK(cudaFree(xh));
        CK(cudaFree(y));
    }
    CK(cudaFree(lt_work));
    CKB(cublasLtDestroy(lt));
    const std::vector<qrow> qrows = quant_section(g, s, (size_t)prop.l2CacheSize, prop.multiProcessorCount, d2d_gbs);

    if (argc > 1) {
        FILE *f = fopen(argv[1], "w");
        if (!f) {
            perror(argv[1]);
            return 1;
        }
        fprintf(f, "{\n  \"device\": \"%s\",\n  \"hbm_d2d_gbs\": %.2f,\n  \"pcie_h2d_pinned_64mib_gbs\": %.3f,\n"
                   "  \"pcie_d2h_pinned_64mib_gbs\": %.3f,\n  ", gpu_name(g), d2d_gbs, h2d_gbs, d2h_gbs);
        host_json(f, hc, mv);
        fprintf(f, ",\n  \"cublas_f16_gemm_8192_tflops\": %.2f,\n  \"gemv\": [\n", gemm_tflops);
        for (size_t i = 0; i < rows.size(); i++)
            fprintf(f, "    {\"dtype\": \"%s\", \"path\": \"%s\", \"n_out\": %lld, \"n_in\": %lld, \"us\": %.2f, "
                       "\"gbs\": %.1f, \"fraction_of_d2d\": %.3f}%s\n",
                    rows[i].dt, rows[i].path, (long long)rows[i].n_out, (long long)rows[i].n_in, rows[i].us,
                    rows[i].gbs, rows[i].frac, i + 1 < rows.size() ? "," : "");
        fprintf(f, "  ],\n  \"prefill_gemm_f16_t512\": [\n");
        for (size_t i = 0; i < grows.size(); i++) {
            const grow &r = grows[i];
            const double flop = 2.0 * PT * r.n_in * r.n_out;
            fprintf(f, "    {\"n_out\": %lld, \"n_in\": %lld, \"cublas_us\": %.2f, \"cublaslt_us\": %.2f, "
                       "\"cublaslt_best_us\": %.2f, \"cublaslt_best_index\": %d, \"cublaslt_candidates\": %d, "
                       "\"cublas_tflops\": %.1f, \"cublaslt_best_tflops\": %.1f}%s\n",
                    (long long)r.n_out, (long long)r.n_in, r.cublas_us, r.lt_us, r.lt_best_us, r.lt_best, r.lt_n,
                    flop / (r.cublas_us * 1e-6) / 1e12, flop / (r.lt_best_us * 1e-6) / 1e12,
                    i + 1 < grows.size() ? "," : "");
        }
        fprintf(f, "  ],\n  \"quant_llama3_8b\": [\n");
        for (size_t i = 0; i < qrows.size(); i++) {
            const qrow &r = qrows[i];
            fprintf(f, "    {\"dtype\": \"%s\", \"n_out\": %lld, \"n_in\": %lld, \"gemv_us\": %.2f, \"gemv_gbs\": %.1f, "
                       "\"gemv_fraction_of_d2d\": %.3f, \"read_us\": %.2f, \"gemv_fraction_of_read\": %.3f, "
                       "\"prefill_t512_us\": %.1f}%s\n",
                    r.dt, (long long)r.n_out, (long long)r.n_in, r.gemv_us, r.gemv_gbs, r.gemv_frac, r.read_us,
                    r.read_us / r.gemv_us, r.prefill_us, i + 1 < qrows.size() ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        if (ferror(f) | fclose(f)) {  // every fprintf above: a failed one leaves the stream's error set
            perror(argv[1]);
            return 1;
        }
        printf("\nwrote %s\n", argv[1]);
    }
    cpu_pool_stop();
    CK(cudaStreamDestroy(s));
    gpu_close(g);
    return 0;
}
