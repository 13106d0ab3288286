// bench/qp_probe.cu: where a one-token quantized GEMV's time goes, block by block. Built with -DQP_PROBE (matmul.cu
// then stamps each block of the persistent kernel with the global timer, ~0.26 us a tick: its start, pdl_wait's
// return, x staged, its end), it replays a CUDA graph of back-to-back GEMVs (weights rotating past the L2, as
// ceilings.cu times them) and prints per shape, in us, the medians over the launches of: the weights' bytes at 4.5
// TB/s (at4.5TB: about what the H200 reads), the launch's period (its last block's end after the launch before's),
// its first block's start and its first release from pdl_wait (both after the launch before's last end), a block's
// staging of x and its rows' work (median block), the slowest block's work, and the tail (the last block's end
// after the median block's).
//
// Usage: qp_probe   (GPU machine only; its own build folder, as the stamps change matmul.o:
//                    `make BUILD=build/probe NVEXTRA=-DQP_PROBE build/probe/bin/qp_probe`)
#include "bench_gpu.h"

#include "../model.h"  // dtype enum and sizes only

#ifndef QP_PROBE
#error "bench/qp_probe.cu needs matmul.cu's stamps: build it with NVEXTRA=-DQP_PROBE in a build folder of its own"
#endif
// matmul.cu's stamps (bench/qp_probe.cuh): reset empties them; otherwise up to max blocks' 6 copied to out: their
// number (-1: failure).
extern "C" int gpu_qp_probe(unsigned long long *out, int max, int reset);

static double med(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

int main() {
    cudaStream_t s;
    cudaDeviceProp prop;
    dj_gpu *g = bench_open("qp_probe", &s, &prop);
    if (gpu_qp_probe(NULL, 0, 1)) return fprintf(stderr, "qp_probe: clearing the stamps failed\n"), 1;
    static const int64_t shapes[][2] = {{4096, 4096}, {6144, 4096}, {4096, 14336}, {28672, 4096}, {8192, 28672}};
    static const uint32_t dtypes[] = {DJ_Q4, DJ_Q8};
    std::vector<unsigned long long> buf(((size_t)1 << 16) * 6);
    printf("%-4s %14s %6s %8s %8s %8s %8s %8s %8s %8s %8s\n", "dt", "shape", "grid", "at4.5TB", "period", "start",
           "release", "stage", "work", "workmax", "tail");
    for (auto &sh : shapes) {
        const int64_t n_out = sh[0], n_in = sh[1];
        float *x, *y;
        CK(cudaMalloc(&x, (size_t)n_in * 4));
        CK(cudaMalloc(&y, (size_t)n_out * 4));
        fill_kernel<float><<<256, 256, 0, s>>>(x, (size_t)n_in, 8);
        CK(cudaGetLastError());
        for (uint32_t dt : dtypes) {
            const size_t wbytes = (size_t)dj_matrix_bytes(dt, (uint64_t)n_out, (uint64_t)n_in);
            const std::vector<void *> w = weight_copies(wbytes, prop.l2CacheSize, s);
            const int copies = (int)w.size(), iters = std::max(24, 2 * copies);
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < iters; i++)
                CKD(gpu_matmul_path(g, GPU_MM_GEMV, y, x, w[i % copies], dt, 1, n_in, n_out, s, &e_));
            CK(cudaStreamEndCapture(s, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            CK(cudaGraphLaunch(exec, s));
            CK(cudaStreamSynchronize(s));
            if (gpu_qp_probe(NULL, 0, 1)) return fprintf(stderr, "qp_probe: clearing the stamps failed\n"), 1;
            CK(cudaGraphLaunch(exec, s));
            CK(cudaStreamSynchronize(s));
            const int n = gpu_qp_probe(buf.data(), 1 << 16, 0);
            if (n <= 0) return fprintf(stderr, "qp_probe: no stamps read back\n"), 1;
            const int grid = (int)buf[5];
            if (n != grid * iters) return fprintf(stderr, "qp_probe: %d stamps for %d launches of %d\n", n, iters, grid), 1;
            std::vector<double> period, start, release, stage, work, workmax, tail;
            double prev_end = 0;
            for (int k = 0; k < iters; k++) {
                const unsigned long long *b = &buf[(size_t)k * grid * 6];
                double s0 = 1e30, e1 = 0, w0 = 1e30;
                std::vector<double> st, wk, ends;
                for (int i = 0; i < grid; i++) {
                    const unsigned long long *q = b + 6 * i;
                    s0 = std::min(s0, (double)q[0]), w0 = std::min(w0, (double)q[1]), e1 = std::max(e1, (double)q[3]);
                    st.push_back((q[2] - q[1]) * 1e-3), wk.push_back(((double)q[3] - q[2]) * 1e-3);
                    ends.push_back((double)q[3]);
                }
                if (k > 0) {
                    period.push_back((e1 - prev_end) * 1e-3), start.push_back((s0 - prev_end) * 1e-3);
                    release.push_back((w0 - prev_end) * 1e-3), stage.push_back(med(st)), work.push_back(med(wk));
                    workmax.push_back(*std::max_element(wk.begin(), wk.end()));
                    tail.push_back((e1 - med(ends)) * 1e-3);
                }
                prev_end = e1;
            }
            printf("%-4s %6lldx%-7lld %6d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", dt == DJ_Q4 ? "q4" : "q8",
                   (long long)n_out, (long long)n_in, grid, wbytes / 4.5e6, med(period),
                   med(start), med(release), med(stage), med(work), med(workmax), med(tail));
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
            for (void *p : w) CK(cudaFree(p));
        }
        CK(cudaFree(x));
        CK(cudaFree(y));
    }
    return 0;
}
