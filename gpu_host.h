// gpu_host.h: what code outside the GPU engine asks of the CUDA runtime, without CUDA's headers: whether there is a
// GPU, its memory, and page-locking the loader's memory. kernels.cu implements it; gpu_none.c where the build has no
// CUDA toolkit (DJINN_NO_GPU: make without one builds a CPU-only djinn).
#ifndef DJINN_GPU_HOST_H
#define DJINN_GPU_HOST_H

#include <stddef.h>

#include "util.h"

// Why a run has no GPU engine when no --cpu asked for that: "warning: " GPU_ABSENT ": running on the CPU".
#ifdef DJINN_NO_GPU
#define GPU_ABSENT "this djinn was built without the CUDA toolkit (CPU only)"
#else
#define GPU_ABSENT "no GPU found"
#endif

// Number of usable CUDA devices; 0 when there is no GPU or no driver (any error from cudaGetDeviceCount), and in a
// build without CUDA.
int gpu_count(void);
// Whether devices a and b can read each other's memory (cudaDeviceCanAccessPeer both ways; a == b: yes): the engine
// on several GPUs adds their partial sums by peer reads. 0 on any error.
int gpu_peer_ok(int a, int b);
// The current device's free and total memory in bytes (cudaMemGetInfo; the engine runs on device 0).
int gpu_mem_info(size_t *free_bytes, size_t *total_bytes, dj_err *e);
// cudaHostRegister of existing memory (read_only: the pages are only read by the GPU, e.g. an mmap), and its undoing.
int gpu_host_register(void *p, size_t bytes, int read_only, dj_err *e);
int gpu_host_unregister(void *p, dj_err *e);

#endif
