// kvtype.h: the KV cache's element types (--kv-type): f32, f16 (the default) and q8, what each costs a position,
// and the q8 row quantizer both engines round with.
//
// A K or V "row" is one kv head's head_dim values at one position. An f32 or f16 row is head_dim values (f16: round
// to nearest even, as dj_f32_to_f16). A q8 row is head_dim int8 values k and one f32 scale s, the value k * s:
// s = max|x| / 127 and k = x / s rounded half to even (an all-zero row: s = 0, k = 0; a k that is NaN or beyond
// +-127, from NaN or infinite values: 0). The scales are an array of
// their own beside the values, laid out as the values with head_dim = 1: the element at index i of a cache has its
// scale at index i / head_dim. Both engines quantize a row exactly this way (IEEE division, the same rounding), so a
// cache written by one reads back bitwise on the other.
#ifndef DJINN_KVTYPE_H
#define DJINN_KVTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { DJ_KV_F32 = 0, DJ_KV_F16 = 1, DJ_KV_Q8 = 2 } dj_kv_type;
#define DJ_KV_TYPES 3
#define DJ_KV_DEFAULT DJ_KV_F16  // the command line's and the server's (an engine opened with zeroed options: f32)
#define DJ_KV_NAMES "f32|f16|q8"

static inline size_t dj_kv_elem_bytes(int t) { return t == DJ_KV_F32 ? 4 : t == DJ_KV_F16 ? 2 : 1; }
// Bytes of one row of head_dim values, its scale included.
static inline uint64_t dj_kv_row_bytes(int t, uint64_t head_dim) {
    return head_dim * dj_kv_elem_bytes(t) + (t == DJ_KV_Q8 ? sizeof(float) : 0);
}
const char *dj_kv_name(int t);        // "f32", "f16", "q8"; "?" for anything else
int dj_kv_parse(const char *s);       // the type named s, or -1
// A q8 row: q (head_dim) and *scale from x (head_dim), as above.
void dj_kv_q8_row(const float *x, int64_t head_dim, int8_t *q, float *scale);

#endif
