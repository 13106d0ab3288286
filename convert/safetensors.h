// safetensors.h: parser for the safetensors container (8-byte little-endian header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the data). Pure: bytes in, table out.
#ifndef DJINN_SAFETENSORS_H
#define DJINN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

// Every dtype the format defines, so that an unsupported one is refused by name rather than as garbage.
typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64,
    ST_F8_E4M3, ST_F8_E5M2, ST_DTYPE_COUNT
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct {
    const char *name;        // points into the st_file's own storage
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;         // = prod(shape) * dtype size, checked against data_offsets
    uint64_t offset;         // of the data, from the start of the file
    const uint8_t *data;     // the data among the bytes given to the parser; NULL when they end before it
} st_tensor;

typedef struct {
    st_tensor *tensors;      // sorted by name
    size_t n;
    void *priv;              // owned storage (names, JSON doc)
} st_file;

// Validates: header length within the file and <= 100 MB, JSON object whose values are tensors (the
// optional "__metadata__" string map is skipped), known dtype, shape dims >= 0 and product without
// overflow, data_offsets [begin, end] with begin <= end, end <= data size, size matching shape*dtype,
// and no two tensors overlapping. Errors name the tensor: "safetensors: tensor 'x': ...".
int st_parse(const void *bytes, size_t n, st_file *out, dj_err *e);  // the whole file in bytes
// The same from the start of a file of file_size bytes: bytes holds at least the header (st_header_size from its
// first 8 bytes), tensors past the bytes given get data NULL and their offset.
int st_header_size(const void *first8, uint64_t file_size, uint64_t *size, dj_err *e);
int st_parse_head(const void *bytes, size_t n, uint64_t file_size, st_file *out, dj_err *e);
void st_free(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);  // binary search; NULL if absent
const char *st_dtype_name(st_dtype t);                          // "F32", "BF16", ...
size_t st_dtype_size(st_dtype t);

#endif
