// kernels.h: every GPU kernel and the cuBLAS/cuBLASLt calls behind a plain C API (implemented in kernels.cu).
#ifndef DJINN_KERNELS_H
#define DJINN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Number of usable CUDA devices; 0 when there is no GPU or no driver (any error from cudaGetDeviceCount).
int gpu_count(void);

#ifdef __cplusplus
}
#endif

#endif
