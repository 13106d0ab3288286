// bench/host_matvec.h: the CPU share's own kernel as a reader of host memory: cpu_matvec over q4 rows filling a
// buffer, so that bench/ceilings.cu can measure what that kernel reaches beside the PCIe copies (its combined ceiling
// for q4), where host_read.h's plain loads give the memory's.
#ifndef DJINN_BENCH_HOST_MATVEC_H
#define DJINN_BENCH_HOST_MATVEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HOST_MATVEC_IN 4096  // inputs a row: the Llama-3-8B layer's widest (gate|up, q|k|v) read that many

// Fills buf (bytes) with copies of one q4 row of HOST_MATVEC_IN random weights, in parallel (every page written).
void host_q4_fill(uint8_t *buf, size_t bytes);
// The bytes of the whole rows in `bytes`: what a pass reads.
size_t host_q4_bytes(size_t bytes);
// Seconds for one cpu_matvec over those rows (x fixed, y discarded).
double host_q4_pass(const uint8_t *buf, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
