// quant.h: the q8 and q4 weight formats of model.h, row by row: quantizing floats (the converter) and widening
// them back (the CPU reference, the tests). Groups of DJ_QGROUP weights along a row share one 16-bit parameter.
// Both keep 0 on their grid, so the range to cover is [min(w, 0), max(w, 0)]; both try 7 scales from 0.97 of that
// range over 255 (q8) or 15 (q4) up, 1/32 of an octave apart, and for each a few zero points, and keep the pair
// whose rounded group has the least squared error.
//   q8  w = scale * (k - z), k in -128..127, z = 4 c - 128: the 4 zero points nearest to the one that puts the
//       minimum at k = -128. On Gaussian groups 0.72 of the squared error of the symmetric q8 it replaced
//       (max|w| / 127 as an f16 scale, k in -127..127).
//   q4  w = scale * (k - z), k in 0..15, z = c / 4 in [0, 15.75]: the zero points that leave the range unclipped.
//       On Gaussian groups 0.68 of the squared error of round-to-nearest with one f16 scale (llama.cpp's Q4_0),
//       where the symmetric search it replaced gave 0.93.
// The parameters are chosen first and the k with them, so widening (exact in f32) gives back exactly the values
// whose error was measured.
#ifndef DJINN_QUANT_H
#define DJINN_QUANT_H

#include <stdint.h>

#include "model.h"

// x (n) f32 -> dst (dj_row_bytes(dtype, n) bytes; the row's padding zeroed; a partial last group's parameter chosen
// for its own values and its padding stored as its grid's nearest to 0: exactly 0 in q8). Adds the squared error
// of the row to *sq_err and its squared values to *sq_ref when given. -1 when a group's scale does not fit (a
// group's range beyond 1.6e7 for q8, 9.6e5 for q4): nothing sensible to store.
int quant_row(uint32_t dtype, const float *x, int64_t n, uint8_t *dst, double *sq_err, double *sq_ref);
// The search's AVX2 build on (1, where the CPU has it) or off (0), for the tests: both give the same bytes. Returns
// whether it is on.
int quant_use_avx2(int on);
// The search's figure for a group x of g values (1..DJ_QGROUP) at scale s and zero point z in stored units (q8:
// 4 c, q4: c / 4), from the build in use: the tests hold the two builds to the same bits.
float quant_search_err(uint32_t dtype, const float *x, int g, float s, float z);
// row (dj_row_bytes(dtype, n) bytes of q8 or q4) -> out (n) f32, exactly scale * (k - z).
void dequant_row(uint32_t dtype, const uint8_t *row, int64_t n, float *out);
// Group g of such a row (n weights) -> out (DJ_QGROUP; a partial last group's padding gives zeros).
void dequant_group(uint32_t dtype, const uint8_t *row, int64_t n, int64_t g, float *out);

#endif
