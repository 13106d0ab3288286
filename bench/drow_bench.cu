// bench/drow_bench.cu: f16 and bf16 products of a few tokens, y (T, n_out) = x (T, n_in) . W^T, on the layer shapes
// of Llama-3-8B and Llama-3-70B: cuBLAS (what gpu_matmul runs for f16 at T > 1, and ran for bf16), dense_rows.cu's kernel
// at its own choice of slices and at 1, 2, 4, 8 and 16, and gpu_matmul's choice (what the engine runs), each as a
// rate of W's bytes. Each output is checked against cuBLAS's (the same rounded operands, summation order only:
// relative L2 <= 1e-4) before it is timed; weights rotate over copies totalling > 4x the L2, so each call reads HBM.
// Times are medians of CUDA-event groups. The ceiling beside it: build/bin/ceilings (the fastest read of the bytes).
//
//   build/bin/drow_bench [T ...]     (default T: 2 4 8 9 16; DROW_MATRIX=8b or 70b that model only)
#include <math.h>
#include <string.h>

#include "bench_gpu.h"
extern "C" {
#include "../model.h"
}

static const shape shapes[] = {
    {"8b", "qkv", 6144, 4096},       {"8b", "wo", 4096, 4096},       {"8b", "gate_up", 28672, 4096},
    {"8b", "down", 4096, 14336},     {"70b", "qkv", 10240, 8192},    {"70b", "wo", 8192, 8192},
    {"70b", "gate_up", 57344, 8192}, {"70b", "down", 8192, 28672},
};

int main(int argc, char **argv) {
    std::vector<int64_t> Ts;
    for (int i = 1; i < argc; i++) Ts.push_back(atoll(argv[i]));
    if (Ts.empty()) Ts = {2, 4, 8, 9, 16};
    for (int64_t T : Ts)
        if (T < 2 || T > 16) return fprintf(stderr, "drow_bench: T = %lld: 2 to 16\n", (long long)T), 2;
    const int64_t Tmax = *std::max_element(Ts.begin(), Ts.end());
    const char *only = getenv("DROW_MATRIX");
    cudaStream_t s;
    cudaDeviceProp prop;
    dj_gpu *g = bench_open("drow_bench", &s, &prop);
    const size_t l2 = (size_t)prop.l2CacheSize;
    static const int slices[] = {0, 1, 2, 4, 8, 16};
    printf("drow_bench on %s, %d SMs; us (GB/s of W's bytes)\n", prop.name, prop.multiProcessorCount);
    printf("%-4s %-8s %-4s %3s %16s %16s %16s   slices 1 2 4 8 16\n", "", "matrix", "dt", "T", "cuBLAS", "rows",
           "matmul");
    int bad = 0;
    for (const shape &sh : shapes) {
        if (only && strcmp(only, sh.model)) continue;
        const int64_t n_out = sh.n_out, n_in = sh.n_in;
        bench_mm io(Tmax, n_in, n_out, s);
        float *x = io.x, *y = io.y, *yref = io.yref;
        std::vector<float> &hy = io.hy, &href = io.href;
        const size_t bytes = (size_t)n_out * (size_t)n_in * 2;
        const int copies = (int)std::max<size_t>(2, 4 * l2 / bytes + 1);
        for (uint32_t dt : {DJ_F16, DJ_BF16}) {
            std::vector<void *> w(copies);
            for (int c = 0; c < copies; c++) {
                CK(cudaMalloc(&w[c], bytes));
                fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)w[c], bytes / 2, 70 + c, dt == DJ_BF16);
                CK(cudaGetLastError());
            }
            for (int64_t T : Ts) {
                const int iters = std::max(copies, 100);
                auto timed = [&](auto fn) { return 1e3 * time_ms(s, iters, 5, fn); };
                auto gbs = [&](double us) { return bytes / us / 1e3; };
                CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, yref, x, w[0], dt, T, n_in, n_out, s, &e_));
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(href.data(), yref, (size_t)(T * n_out) * 4, cudaMemcpyDeviceToHost));
                const double blas_us = timed([&](int i) {
                    CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                });
                double us[6];
                for (int k = 0; k < 6; k++) {
                    us[k] = INFINITY;
                    if (slices[k] > (n_in + 31) / 32) continue;
                    CK(cudaMemset(y, 0xff, (size_t)(T * n_out) * 4));
                    dj_err e;
                    if (gpu_matmul_rows(g, slices[k], y, x, w[0], dt, T, n_in, n_out, s, &e)) continue;  // too many
                    CK(cudaStreamSynchronize(s));
                    CK(cudaMemcpy(hy.data(), y, (size_t)(T * n_out) * 4, cudaMemcpyDeviceToHost));
                    const double err = rel_l2(hy.data(), href.data(), (size_t)(T * n_out));
                    if (!(err <= 1e-4)) {
                        printf("MISMATCH: %s %s %s T=%lld slices %d: relative L2 %.3e against cuBLAS\n", sh.model,
                               sh.name, dj_dtype_name(dt), (long long)T, slices[k], err);
                        bad = 1;
                        continue;
                    }
                    us[k] = timed([&](int i) {
                        CKD(gpu_matmul_rows(g, slices[k], y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                    });
                }
                const double mm_us = timed([&](int i) {
                    CKD(gpu_matmul(g, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                });
                printf("%-4s %-8s %-4s %3lld %7.1f (%6.0f) %7.1f (%6.0f) %7.1f (%6.0f)  ", sh.model, sh.name,
                       dj_dtype_name(dt), (long long)T, blas_us, gbs(blas_us), us[0], gbs(us[0]), mm_us, gbs(mm_us));
                for (int k = 1; k < 6; k++) printf(" %6.1f", us[k]);
                printf("\n");
                fflush(stdout);
            }
            for (void *p : w) CK(cudaFree(p));
        }
    }
    CK(cudaStreamDestroy(s));
    gpu_close(g);
    return bad;
}
