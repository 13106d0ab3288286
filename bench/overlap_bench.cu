// bench/overlap_bench.cu: whether dequantizing a q8/q4 matrix to f16 can hide behind the cuBLAS GEMM of the matrix
// before it, which is what a prefill of a few hundred tokens would need to run near f16's speed. For each Llama
// shape, at T tokens: the f16 GEMM alone, the dequantization alone, both in turn (today's path), and a pipeline of
// the two on two streams (GEMM of buffer A while buffer B is dequantized, then the other way round), the GEMM either
// plain cublasGemmEx or cuBLASLt told to leave k SMs to the other stream (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) with
// the dequantization on k blocks... of the SMs left. Times are per matrix, medians of CUDA-event groups.
//
//   build/bin/overlap_bench OUT.json [T]     (default T 512)
#include <cublasLt.h>
#include <string.h>

#include "bench_gpu.h"
extern "C" {
#include "../model.h"
}

static const shape shapes[] = {
    {"8b", "qkv", 6144, 4096},  {"8b", "wo", 4096, 4096},         {"8b", "gate_up", 28672, 4096},
    {"8b", "down", 4096, 14336}, {"70b", "gate_up", 57344, 8192}, {"70b", "down", 8192, 28672},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: overlap_bench OUT.json [T]\n");
        return 2;
    }
    const int64_t T = argc > 2 ? atoll(argv[2]) : 512;
    dj_gpu *g;
    CKD(gpu_open(&g, 0, &e_));
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t s, s2;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, hi));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const size_t l2 = (size_t)prop.l2CacheSize;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    CKB(cublasCreate(&blas));
    CKB(cublasLtCreate(&lt));
    const size_t wsz = 64u << 20;
    void *work;
    CK(cudaMalloc(&work, wsz));
    CKB(cublasSetStream(blas, s));
    CKB(cublasSetWorkspace(blas, work, wsz));
    cudaEvent_t ev_dq[2], ev_g[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&ev_dq[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&ev_g[i], cudaEventDisableTiming));
    }
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fprintf(f, "{\"device\": \"%s\", \"T\": %lld, \"rows\": [\n", prop.name, (long long)T);
    printf("overlap_bench on %s, %d SMs, T = %lld; us per matrix\n", prop.name, sms, (long long)T);
    printf("%-4s %-8s %-3s %8s %8s %8s %8s   lt(k SMs left to the dequantization): k us ...\n", "", "matrix", "dt",
           "gemm", "dequant", "in turn", "2 strm");
    const int ks[] = {8, 16, 24, 32, 48, 66};
    int first = 1;
    for (const shape &sh : shapes) {
        const int64_t n_out = sh.n_out, n_in = sh.n_in;
        __half *x, *wf[2];
        float *y;
        CK(cudaMalloc(&x, (size_t)(T * n_in) * 2));
        CK(cudaMalloc(&y, (size_t)(T * n_out) * 4));
        fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)x, (size_t)(T * n_in), 5, 0);
        for (int i = 0; i < 2; i++) CK(cudaMalloc(&wf[i], (size_t)(n_out * n_in) * 2));
        // cuBLASLt problem: y^T (n_out x T) = W^T x^T, as matmul.cu's cublasGemmEx
        cublasLtMatmulDesc_t op;
        cublasLtMatrixLayout_t la, lb, lc;
        const cublasOperation_t ta = CUBLAS_OP_T;
        CKB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, (uint64_t)n_in, (uint64_t)n_out, n_in));
        CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, (uint64_t)n_in, (uint64_t)T, n_in));
        CKB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)n_out, (uint64_t)T, n_out));
        for (uint32_t dt : {DJ_Q8, DJ_Q4}) {
            const size_t qbytes = (size_t)dj_matrix_bytes(dt, (uint64_t)n_out, (uint64_t)n_in);
            const std::vector<void *> wq = weight_copies(qbytes, l2, s);
            const int nq = (int)wq.size();
            for (int i = 0; i < 2; i++) CKD(gpu_dequant_f16(wf[i], wq[0], dt, n_out, n_in, 0, s, &e_));
            const float one = 1.0f, zero = 0.0f;
            auto gemm = [&](int b) {
                CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_out, (int)T, (int)n_in, &one, wf[b], CUDA_R_16F,
                                 (int)n_in, x, CUDA_R_16F, (int)n_in, &zero, y, CUDA_R_32F, (int)n_out,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            const int iters = 20;
            const double t_g = 1e3 * time_ms(s, iters, 5, [&](int i) { gemm(i & 1); });
            const double t_d = 1e3 * time_ms(s, iters, 5, [&](int i) {
                CKD(gpu_dequant_f16(wf[i & 1], wq[i % nq], dt, n_out, n_in, 0, s, &e_));
            });
            const double t_s = 1e3 * time_ms(s, iters, 5, [&](int i) {
                CKD(gpu_dequant_f16(wf[i & 1], wq[i % nq], dt, n_out, n_in, 0, s, &e_));
                gemm(i & 1);
            });
            // the pipeline: s multiplies buffer i % 2 once s2 has dequantized it; s2 dequantizes the other buffer
            // once s's previous product from it is done. gemm_fn(b) runs on s; blocks: the dequantization's grid.
            auto pipe = [&](auto gemm_fn, int blocks) {
                return 1e3 * time_ms(s, iters, 5, [&](int i) {
                    const int cur = i & 1, nxt = cur ^ 1;
                    if (i == 0) {  // the first buffer in turn, as a prefill's first matrix would be
                        CKD(gpu_dequant_f16(wf[cur], wq[i % nq], dt, n_out, n_in, 0, s, &e_));
                        CK(cudaEventRecord(ev_g[nxt], s));
                    } else {
                        CK(cudaStreamWaitEvent(s, ev_dq[cur], 0));
                    }
                    CK(cudaStreamWaitEvent(s2, ev_g[nxt], 0));
                    CKD(gpu_dequant_f16(wf[nxt], wq[(i + 1) % nq], dt, n_out, n_in, blocks, s2, &e_));
                    CK(cudaEventRecord(ev_dq[nxt], s2));
                    gemm_fn(cur);
                    CK(cudaEventRecord(ev_g[cur], s));
                    if (i == iters - 1) CK(cudaStreamWaitEvent(s, ev_dq[nxt], 0));
                });
            };
            const double t_p = pipe(gemm, 0);
            fprintf(f, "%s  {\"model\": \"%s\", \"matrix\": \"%s\", \"dtype\": \"%s\", \"n_out\": %lld, \"n_in\": %lld, "
                       "\"gemm_us\": %.2f, \"dequant_us\": %.2f, \"in_turn_us\": %.2f, \"two_streams_us\": %.2f, "
                       "\"lt\": [",
                    first ? "" : ",\n", sh.model, sh.name, dj_dtype_name(dt), (long long)n_out, (long long)n_in, t_g,
                    t_d, t_s, t_p);
            first = 0;
            printf("%-4s %-8s %-3s %8.1f %8.1f %8.1f %8.1f  ", sh.model, sh.name, dj_dtype_name(dt), t_g, t_d, t_s, t_p);
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
                const int k = ks[ki], target = sms - k;
                CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof target));
                cublasLtMatmulPreference_t pref;
                CKB(cublasLtMatmulPreferenceCreate(&pref));
                CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
                cublasLtMatmulHeuristicResult_t res;
                int n = 0;
                CKB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &n));
                CKB(cublasLtMatmulPreferenceDestroy(pref));
                if (n < 1) {
                    printf(" %d:-", k);
                    continue;
                }
                auto ltg = [&](int b) {
                    CKB(cublasLtMatmul(lt, op, &one, wf[b], la, x, lb, &zero, y, lc, y, lc, &res.algo, work, wsz, s));
                };
                const double t_lt = 1e3 * time_ms(s, iters, 5, [&](int i) { ltg(i & 1); });
                double best = INFINITY;
                int best_b = 0;
                for (int per : {1, 2, 4}) {
                    const double t = pipe(ltg, k * per);
                    if (t < best) best = t, best_b = k * per;
                }
                printf(" %d:%.1f(%.1f,%d)", k, best, t_lt, best_b);
                fprintf(f, "%s{\"k\": %d, \"gemm_us\": %.2f, \"pipe_us\": %.2f, \"blocks\": %d}", ki ? ", " : "", k,
                        t_lt, best, best_b);
            }
            fprintf(f, "]}");
            printf("\n");
            fflush(stdout);
            for (void *p : wq) CK(cudaFree(p));
        }
        const int zero_target = 0;
        CKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &zero_target, sizeof zero_target));
        CKB(cublasLtMatrixLayoutDestroy(la));
        CKB(cublasLtMatrixLayoutDestroy(lb));
        CKB(cublasLtMatrixLayoutDestroy(lc));
        CKB(cublasLtMatmulDescDestroy(op));
        CK(cudaFree(x));
        CK(cudaFree(y));
        for (int i = 0; i < 2; i++) CK(cudaFree(wf[i]));
    }
    fprintf(f, "\n]}\n");
    if (fclose(f)) {
        perror(argv[1]);
        return 1;
    }
    CKB(cublasLtDestroy(lt));
    CKB(cublasDestroy(blas));
    gpu_close(g);
    return 0;
}
