// bench/qgemm_bench.cu: the quantized product y (T, n_out) = x (T, n_in) . W^T for T > 1 on the layer shapes of
// Llama-3-8B, Llama-2-13B and Llama-3-70B (and the 8B as each of two GPUs holds it: 8b_tp2), in q8 and q4: every
// tile shape of qgemm.cu (gpu_qgemm_variant) beside the path it replaces (rows dequantized to f16 a chunk at a
// time, then cuBLAS) and beside cuBLAS on f16 weights of the same shape (what the q8/q4 prefill is held to); up
// to 8 tokens also the persistent GEMV, which reads W once
// for all of them (gemv us; x quantized per group of 32 in two int8 parts: relative L2 <= 1e-3); and gpu_matmul's own
// choice among them (matmul us: what the engine runs). Each variant's output is checked against the dequantizing
// path's (same f16 operands, summation order only: relative L2 <= 1e-4) before it is timed.
// Weights rotate over copies totalling > 4x the L2 size, so each call reads HBM. Times are medians of CUDA-event
// groups; TFLOP/s counts 2 T n_in n_out.
//
//   build/bin/qgemm_bench OUT.json [T ...]     (default T: 2 4 8 16 32 64 128 256 512 2048)
// QGEMM_ONLY=8,11,12 (environment) times those tile shapes only (the others print as inf); QGEMM_MATRIX=8b:gate_up
// that matrix only, QGEMM_MATRIX=8b that model's four; QGEMM_DTYPE=q4 (or q8) that dtype only.
#include <math.h>
#include <string.h>

#include "bench_gpu.h"
extern "C" {
#include "../model.h"
}

#define NVAR GPU_QGEMM_VARIANTS

static const shape shapes[] = {
    {"8b", "qkv", 6144, 4096},      {"8b", "wo", 4096, 4096},       {"8b", "gate_up", 28672, 4096},
    {"8b", "down", 4096, 14336},    {"13b", "qkv", 15360, 5120},    {"13b", "wo", 5120, 5120},
    {"13b", "gate_up", 27648, 5120}, {"13b", "down", 5120, 13824},  {"70b", "qkv", 10240, 8192},
    {"70b", "wo", 8192, 8192},      {"70b", "gate_up", 57344, 8192}, {"70b", "down", 8192, 28672},
    // the 8B's matrices on each of two GPUs (tp_plan: half the heads and FFN rows; wo and down half their columns)
    {"8b_tp2", "qkv", 3072, 4096},  {"8b_tp2", "wo", 4096, 2048},   {"8b_tp2", "gate_up", 14336, 4096},
    {"8b_tp2", "down", 4096, 7168},
};

// Whether QGEMM_MATRIX (only; NULL: every matrix) names this matrix ("8b:gate_up") or its model ("8b").
static bool picked(const shape &sh, const char *only) {
    char name[64];
    snprintf(name, sizeof name, "%s:%s", sh.model, sh.name);
    return !only || !strcmp(only, name) || !strcmp(only, sh.model);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: qgemm_bench OUT.json [T ...]\n");
        return 2;
    }
    std::vector<int64_t> Ts;
    for (int i = 2; i < argc; i++) Ts.push_back(atoll(argv[i]));
    if (Ts.empty()) Ts = {2, 4, 8, 16, 32, 64, 128, 256, 512, 2048};
    const int64_t Tmax = *std::max_element(Ts.begin(), Ts.end());
    bool timed_var[NVAR];
    const char *only = getenv("QGEMM_ONLY");
    for (int v = 0; v < NVAR; v++) timed_var[v] = !only;
    for (const char *p = only; p && *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= NVAR) {
            fprintf(stderr, "qgemm_bench: QGEMM_ONLY: not a list of tile shapes 0..%d: %s\n", NVAR - 1, only);
            return 2;
        }
        timed_var[v] = true;
        p = *end == ',' ? end + 1 : end;
    }
    const char *only_matrix = getenv("QGEMM_MATRIX"), *only_dtype = getenv("QGEMM_DTYPE");
    if (only_dtype && strcmp(only_dtype, "q8") && strcmp(only_dtype, "q4")) {
        fprintf(stderr, "qgemm_bench: QGEMM_DTYPE: %s is not q8 or q4\n", only_dtype);
        return 2;
    }
    if (std::none_of(std::begin(shapes), std::end(shapes), [&](const shape &sh) { return picked(sh, only_matrix); })) {
        fprintf(stderr, "qgemm_bench: QGEMM_MATRIX: no matrix or model named %s\n", only_matrix);
        return 2;
    }
    dj_gpu *g;
    cudaStream_t s;
    CKD(gpu_open(&g, 0, &e_));
    CKD(gpu_stream_create(&s, &e_));
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    const size_t l2 = (size_t)prop.l2CacheSize;
    printf("qgemm_bench on %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount, l2 / 1e6);
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fprintf(f, "{\"device\": \"%s\", \"rows\": [\n", prop.name);
    int first_row = 1, bad = 0;
    printf("%-4s %-8s %-3s %5s %10s %10s %10s %10s %10s %5s %8s %8s  variants (us)\n", "", "matrix", "dt", "T",
           "f16 us", "dequant us", "gemv us", "qgemm us", "matmul us", "var", "of f16", "TFLOP/s");
    for (const shape &sh : shapes) {
        if (!picked(sh, only_matrix)) continue;
        const int64_t n_out = sh.n_out, n_in = sh.n_in;
        bench_mm io(Tmax, n_in, n_out, s);
        float *x = io.x, *y = io.y, *yref = io.yref;
        std::vector<float> &hy = io.hy, &href = io.href;
        // f16 weights of the shape: the product q8 and q4 are held to
        const size_t fbytes = (size_t)dj_matrix_bytes(DJ_F16, (uint64_t)n_out, (uint64_t)n_in);
        const int fcopies = (int)std::max<size_t>(2, 4 * l2 / fbytes + 1);
        std::vector<void *> fw(fcopies);
        for (int c = 0; c < fcopies; c++) {
            CK(cudaMalloc(&fw[c], fbytes));
            fill_u16_kernel<<<4096, 256, 0, s>>>((uint16_t *)fw[c], fbytes / 2, 70 + c, 0);
            CK(cudaGetLastError());
        }
        for (uint32_t dt : {DJ_Q8, DJ_Q4}) {
            if (only_dtype && strcmp(only_dtype, dj_dtype_name(dt))) continue;
            const size_t wbytes = (size_t)dj_matrix_bytes(dt, (uint64_t)n_out, (uint64_t)n_in);
            const std::vector<void *> w = weight_copies(wbytes, l2, s);
            const int copies = (int)w.size();
            for (int64_t T : Ts) {
                const double flop = 2.0 * T * n_in * n_out;
                const int iters = (int)std::max<double>(copies, std::min<double>(200, 2e10 / flop));
                auto timed = [&](auto fn) { return 1e3 * time_ms(s, iters, 5, fn); };
                const double f16_us = timed([&](int i) {
                    CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, y, x, fw[i % fcopies], DJ_F16, T, n_in, n_out, s, &e_));
                });
                const double dq_us = timed([&](int i) {
                    CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                });
                CKD(gpu_matmul_path(g, GPU_MM_CUBLAS, yref, x, w[0], dt, T, n_in, n_out, s, &e_));
                CK(cudaStreamSynchronize(s));
                CK(cudaMemcpy(href.data(), yref, (size_t)(T * n_out) * 4, cudaMemcpyDeviceToHost));
                double var_us[NVAR], var_err[NVAR];
                int best = -1;
                for (int v = 0; v < NVAR; v++) {
                    var_err[v] = 0, var_us[v] = INFINITY;
                    if (!timed_var[v] || !gpu_qgemm_has(g, v)) continue;
                    CK(cudaMemset(y, 0xff, (size_t)(T * n_out) * 4));
                    CKD(gpu_qgemm_variant(g, v, y, x, w[0], dt, T, n_in, n_out, s, &e_));
                    CK(cudaStreamSynchronize(s));
                    CK(cudaMemcpy(hy.data(), y, (size_t)(T * n_out) * 4, cudaMemcpyDeviceToHost));
                    var_err[v] = rel_l2(hy.data(), href.data(), (size_t)(T * n_out));
                    if (!(var_err[v] <= 1e-4)) {
                        printf("MISMATCH: %s %s %s T=%lld variant %d: relative L2 %.3e against the dequantizing path\n",
                               sh.model, sh.name, dj_dtype_name(dt), (long long)T, v, var_err[v]);
                        bad = 1;
                        var_us[v] = INFINITY;
                        continue;
                    }
                    var_us[v] = timed([&](int i) {
                        CKD(gpu_qgemm_variant(g, v, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                    });
                    if (best < 0 || var_us[v] < var_us[best]) best = v;
                }
                double gemv_us = INFINITY;
                if (T <= 8) {
                    CK(cudaMemset(y, 0xff, (size_t)(T * n_out) * 4));
                    CKD(gpu_matmul_path(g, GPU_MM_GEMV, y, x, w[0], dt, T, n_in, n_out, s, &e_));
                    CK(cudaStreamSynchronize(s));
                    CK(cudaMemcpy(hy.data(), y, (size_t)(T * n_out) * 4, cudaMemcpyDeviceToHost));
                    const double err = rel_l2(hy.data(), href.data(), (size_t)(T * n_out));
                    if (!(err <= 1e-3)) {
                        printf("MISMATCH: %s %s %s T=%lld gemv: relative L2 %.3e against the dequantizing path\n",
                               sh.model, sh.name, dj_dtype_name(dt), (long long)T, err);
                        bad = 1;
                    } else {
                        gemv_us = timed([&](int i) {
                            CKD(gpu_matmul_path(g, GPU_MM_GEMV, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                        });
                    }
                }
                const double auto_us = timed([&](int i) {
                    CKD(gpu_qgemm_variant(g, -1, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                });
                const double mm_us = timed([&](int i) {
                    CKD(gpu_matmul(g, y, x, w[i % copies], dt, T, n_in, n_out, s, &e_));
                });
                printf("%-4s %-8s %-3s %5lld %10.1f %10.1f %10.1f %10.1f %10.1f %5d %7.1f%% %8.1f ", sh.model, sh.name,
                       dj_dtype_name(dt), (long long)T, f16_us, dq_us, gemv_us, auto_us, mm_us, best,
                       100 * f16_us / auto_us, flop / (auto_us * 1e-6) / 1e12);
                for (int v = 0; v < NVAR; v++) printf(" %7.1f", var_us[v]);
                printf("\n");
                fflush(stdout);
                fprintf(f, "%s  {\"model\": \"%s\", \"matrix\": \"%s\", \"dtype\": \"%s\", \"T\": %lld, \"n_out\": %lld, "
                           "\"n_in\": %lld, \"f16_us\": %.2f, \"dequant_us\": %.2f, \"gemv_us\": %.2f, \"qgemm_us\": %.2f, "
                           "\"matmul_us\": %.2f, \"best_variant\": %d, "
                           "\"variant_us\": [",
                        first_row ? "" : ",\n", sh.model, sh.name, dj_dtype_name(dt), (long long)T, (long long)n_out,
                        (long long)n_in, f16_us, dq_us, isfinite(gemv_us) ? gemv_us : -1.0, auto_us, mm_us, best);
                for (int v = 0; v < NVAR; v++) fprintf(f, "%s%.2f", v ? ", " : "", isfinite(var_us[v]) ? var_us[v] : -1.0);
                fprintf(f, "], \"max_rel_l2\": %.3e}", *std::max_element(var_err, var_err + NVAR));
                first_row = 0;
            }
            for (void *p : w) CK(cudaFree(p));
        }
        for (void *p : fw) CK(cudaFree(p));
    }
    fprintf(f, "\n]}\n");
    if (fclose(f)) {
        perror(argv[1]);
        return 1;
    }
    gpu_stream_destroy(s);
    gpu_close(g);
    return bad;
}
