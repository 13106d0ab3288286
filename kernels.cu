// kernels.cu: Djinn's GPU kernels and cuBLAS/cuBLASLt calls, behind the C API in kernels.h.
#include <cuda_runtime.h>

#include "kernels.h"

// ---- device discovery
extern "C" int gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}
