// quant.h: the q8 and q4 weight formats of model.h, row by row: quantizing floats (the converter) and widening
// them back (the CPU reference, the tests). Groups of DJ_QGROUP weights along a row share one f16 scale.
//   q8  scale = max|w| / 127 rounded to f16, k = round(w / scale) in -127..127
//   q4  k in -8..7; the scale is the one, among round-to-nearest's (the group's largest-magnitude weight maps to
//       -8, as llama.cpp's Q4_0) and 18 others (max|w| / t for t in 6..8 and either sign), whose rounded group has
//       the least squared error, then refined by least squares for those k; rtn = 1 keeps round-to-nearest's alone
//       (the baseline the quality figures are compared with)
// The scale is rounded to f16 before the k are chosen with it, so widening (scale * k, exact in f32) gives back
// exactly the values whose error was measured.
#ifndef DJINN_QUANT_H
#define DJINN_QUANT_H

#include <stdint.h>

#include "model.h"

// x (n) f32 -> dst (dj_row_bytes(dtype, n) bytes; the last group's padding and the row's zeroed). Adds the squared
// error of the row to *sq_err and its squared values to *sq_ref when given. -1 when a group's scale does not fit in
// f16 (weights beyond +-8e6 for q8, +-5e5 for q4): nothing sensible to store.
int quant_row(uint32_t dtype, const float *x, int64_t n, uint8_t *dst, int rtn, double *sq_err, double *sq_ref);
// row (dj_row_bytes(dtype, n) bytes of q8 or q4) -> out (n) f32, exactly scale * k.
void dequant_row(uint32_t dtype, const uint8_t *row, int64_t n, float *out);
// Group g of such a row (n weights) -> out (DJ_QGROUP; a partial last group's padding gives zeros).
void dequant_group(uint32_t dtype, const uint8_t *row, int64_t n, int64_t g, float *out);

#endif
