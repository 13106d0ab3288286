// bench/host_read.h: the host memory's read ceiling, which bench/cpu_matvec.c and bench/ceilings.cu both measure:
// every thread of the pool (pool.h: one per CPU of the process's affinity mask) reads its part of a buffer with
// 32-byte AVX2 loads, xor-folded into a result kept in memory so that no load can be optimised away.
#ifndef DJINN_BENCH_HOST_READ_H
#define DJINN_BENCH_HOST_READ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Writes every page of buf (bytes) in parallel, so that the reads find memory, not the zero page.
void host_touch(uint8_t *buf, size_t bytes);
// Seconds for one pass over buf (bytes; buf 32-byte aligned; the last bytes of each 1/256th left out, < 64).
double host_read_pass(const uint8_t *buf, size_t bytes);
// GB/s (1e9 bytes), the best of `passes` passes.
double host_read_gbs(const uint8_t *buf, size_t bytes, int passes);

#ifdef __cplusplus
}
#endif

#endif
