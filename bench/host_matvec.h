// bench/host_matvec.h: the CPU share's own kernel as a reader of host memory: its matvec over q4, q8 or f16 rows
// filling a buffer, so that bench/ceilings.cu can measure what that kernel reaches beside the PCIe copies (the combined
// ceiling of a q4, q8 or f16 step's share), where host_read.h's plain loads give the memory's.
#ifndef DJINN_BENCH_HOST_MATVEC_H
#define DJINN_BENCH_HOST_MATVEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HOST_MATVEC_IN 4096  // inputs a row: the Llama-3-8B layer's widest (gate|up, q|k|v) read that many

// Fills buf (bytes) with copies of one q4 (q8, f16) row of HOST_MATVEC_IN random weights, in parallel (every page
// written).
void host_q4_fill(uint8_t *buf, size_t bytes);
void host_q8_fill(uint8_t *buf, size_t bytes);
void host_f16_fill(uint8_t *buf, size_t bytes);
// The bytes of the whole rows in `bytes`: what a pass reads.
size_t host_q4_bytes(size_t bytes);
size_t host_q8_bytes(size_t bytes);
size_t host_f16_bytes(size_t bytes);
// Seconds for one matvec over those rows as the CPU share computes a decode step's (x fixed, y discarded).
double host_q4_pass(const uint8_t *buf, size_t bytes);
double host_q8_pass(const uint8_t *buf, size_t bytes);
double host_f16_pass(const uint8_t *buf, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
