// bench/qp_probe.cuh: the timer stamps of matmul.cu's persistent quantized GEMV, included there only in a build
// with -DQP_PROBE (bench/qp_probe.cu reads them). Each block of the kernel stamps the global timer at its start,
// after pdl_wait, once x is staged and at its end (after a barrier: its last warp's), into the next free slot with
// its index and grid.
#ifndef DJINN_QP_PROBE_CUH
#define DJINN_QP_PROBE_CUH

#define QP_PROBE_SLOTS (1 << 16)
__device__ unsigned long long qp_probe_buf[QP_PROBE_SLOTS][6];
__device__ unsigned int qp_probe_n;
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The stamps so far (bench/qp_probe.cu declares it): reset empties the slots (0, or 1 on failure); otherwise up to
// max slots copied to out, 6 a block (start, pdl_wait's return, x staged, end, blockIdx.x, gridDim.x): their
// number, or -1 on failure.
extern "C" int gpu_qp_probe(unsigned long long *out, int max, int reset) {
    unsigned int n = 0;
    if (reset) return cudaMemcpyToSymbol(qp_probe_n, &n, sizeof n) != cudaSuccess;
    if (cudaMemcpyFromSymbol(&n, qp_probe_n, sizeof n) != cudaSuccess) return -1;
    if ((int)n > max) n = (unsigned)max;
    if (n > QP_PROBE_SLOTS) n = QP_PROBE_SLOTS;
    if (cudaMemcpyFromSymbol(out, qp_probe_buf, (size_t)n * 6 * 8) != cudaSuccess) return -1;
    return (int)n;
}

// In the kernel: the block's slot claimed and its first stamp; a stamp k; the last stamp after a barrier.
#define QP_PROBE_START()                                                                                       \
    unsigned int slot = 0;                                                                                     \
    if (threadIdx.x == 0) {                                                                                    \
        slot = atomicAdd(&qp_probe_n, 1u);                                                                     \
        if (slot < QP_PROBE_SLOTS) qp_probe_buf[slot][4] = blockIdx.x, qp_probe_buf[slot][5] = gridDim.x;      \
    }                                                                                                          \
    QP_STAMP(0)
#define QP_STAMP(k) \
    do { if (threadIdx.x == 0 && slot < QP_PROBE_SLOTS) qp_probe_buf[slot][k] = gtimer(); } while (0)
#define QP_PROBE_END() \
    __syncthreads();   \
    QP_STAMP(3)

#endif
