// model.h: the model.bin file format and its pure parser (model.c); the loader is loader.h.
//
// ---- model.bin, version 3 (all integers little-endian)
//   [0, 4096)       fixed header (dj_disk_header), zero-padded to 4096 bytes
//   [4096, ...)     section table: n_sections entries of dj_disk_section (32 bytes each)
//   then            tensor table: n_tensors entries of dj_disk_tensor (40 bytes each), one per kind of tensor
//                   (every layer has the same layout): dtype, shape, offset in its section and bytes, each of
//                   which the parser checks against what the config implies, so that no field of the config can
//                   change without the table disagreeing (a section size rounded up to 4096 bytes would not notice)
//   then sections, each starting at a multiple of DJ_SECTION_ALIGN (4096), in this order:
//     TOKENIZER     the tokenizer in the engine's binary form (tokenizer.h)
//     EMBED         token embeddings, (vocab, dim) in wtype; stays in host memory, one row gathered per token
//     LAYER i       one contiguous slab per transformer layer, laid out by dj_layer_layout(): moving a layer
//                   to the GPU is one copy
//     HEAD          final norm (dim, f32), then lm_head (vocab, dim) in wtype unless tied (then EMBED is the head)
//   The header's CRC-32 covers the header (crc field as zero), the section table and the tensor table.
// Version 1 (no tensor table; n_tensors, embed_type and head_type zero) is still read: its config is checked
// against the rounded section sizes only.
#ifndef DJINN_MODEL_H
#define DJINN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define DJ_MAGIC "DJINNMDL"
#define DJ_VERSION 3u      // what this build writes (3: q8 and q4 with zero points)
#define DJ_VERSION_MIN 1u  // the oldest it reads
#define DJ_HEADER_SIZE 4096u
#define DJ_SECTION_ALIGN 4096u  // every section offset and every layer slab size
#define DJ_TENSOR_ALIGN 256u    // every tensor inside a slab
#define DJ_MAX_LAYERS 1024u

// Weight dtypes. q8 and q4 quantize each row in groups of DJ_QGROUP weights along the input dimension (the last
// group zero-padded), a 16-bit parameter per group (quant.h says how it is chosen): bits 0-9 the scale s (an
// f16's bits 5-14: positive, 5 bits of mantissa; dj_q_scale) and bits 10-15 c, which sets the zero point z
// (dj_q8_zero, dj_q4_zero). A row is its groups' quantized values, then their parameters, padded to 16 bytes:
//   q8: int8 k per weight, z = 4 c - 128 (-128..124), w = s * (k - z)   8.5 bits per weight at 32 | cols
//   q4: per group 16 bytes, byte j holding weight j in its low nibble and weight j + 16 in its high one, each an
//       unsigned k (0..15), z = c / 4 (0..15.75), w = s * (k - z)       4.5 bits per weight at 32 | cols
// (Version 2 files held them symmetric, an f16 scale and no zero point: they are refused by name.)
enum dj_dtype { DJ_F32 = 0, DJ_F16 = 1, DJ_BF16 = 2, DJ_Q8 = 3, DJ_Q4 = 4 };
#define DJ_QGROUP 32
#define DJ_ROW_ALIGN 16u  // quantized rows start 16-byte aligned: one vector load per group of q4, half a group of q8
enum dj_rope_type { DJ_ROPE_DEFAULT = 0, DJ_ROPE_LLAMA3 = 1 };
enum dj_section_kind { DJ_SEC_TOKENIZER = 1, DJ_SEC_EMBED = 2, DJ_SEC_LAYER = 3, DJ_SEC_HEAD = 4 };
// The tensor table's kinds, in table order: a layer's tensors (in slab order), then the embeddings and the head's.
enum dj_tensor_kind {
    DJ_T_ATTN_NORM, DJ_T_FFN_NORM, DJ_T_WQ, DJ_T_WK, DJ_T_WV, DJ_T_WO, DJ_T_W_GATE, DJ_T_W_UP, DJ_T_W_DOWN,
    DJ_T_EMBED, DJ_T_FINAL_NORM, DJ_T_LM_HEAD, DJ_N_TENSOR_KINDS
};
const char *dj_tensor_name(uint32_t kind);  // "attn_norm", "wq", ..., "lm_head"; "?" for another value

size_t dj_dtype_size(uint32_t dtype);     // bytes per element of a float dtype: 4, 2, 2; 0 for q8, q4 and unknown
const char *dj_dtype_name(uint32_t dtype);  // "f32", "f16", "bf16", "q8", "q4", "?"
static inline int dj_is_quant(uint32_t dtype) { return dtype == DJ_Q8 || dtype == DJ_Q4; }
// Bytes of one row of `cols` weights in dtype (0 for an unknown dtype), and of a (rows, cols) matrix.
static inline uint64_t dj_row_bytes(uint32_t dtype, uint64_t cols) {
    uint64_t g = (cols + DJ_QGROUP - 1) / DJ_QGROUP;
    if (dtype == DJ_Q8) return (g * (DJ_QGROUP + 2) + DJ_ROW_ALIGN - 1) / DJ_ROW_ALIGN * DJ_ROW_ALIGN;
    if (dtype == DJ_Q4) return (g * (DJ_QGROUP / 2 + 2) + DJ_ROW_ALIGN - 1) / DJ_ROW_ALIGN * DJ_ROW_ALIGN;
    return cols * (dtype == DJ_F32 ? 4 : dtype == DJ_F16 || dtype == DJ_BF16 ? 2 : 0);
}
static inline uint64_t dj_matrix_bytes(uint32_t dtype, uint64_t rows, uint64_t cols) {
    return rows * dj_row_bytes(dtype, cols);
}
// A group parameter's scale (exactly the f16 whose bits are those of bits 0-9 shifted up by 5; codes from
// DJ_Q_CODE_END on would be infinities and are never written) and zero point.
#define DJ_Q_CODE_END (31u << 5)
static inline float dj_q_scale(uint16_t p) { return dj_f16_to_f32((uint16_t)((p & 0x3FFu) << 5)); }
static inline float dj_q8_zero(uint16_t p) { return (float)(4 * (p >> 10)) - 128.0f; }
static inline float dj_q4_zero(uint16_t p) { return (float)(p >> 10) * 0.25f; }

// Where a quantized row's scales start: after its groups' values.
static inline uint64_t dj_scales_offset(uint32_t dtype, uint64_t cols) {
    return (cols + DJ_QGROUP - 1) / DJ_QGROUP * (dtype == DJ_Q8 ? DJ_QGROUP : DJ_QGROUP / 2);
}

// The model's hyper-parameters, as stored in the header (80 bytes).
typedef struct {
    uint32_t dim;          // hidden size
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;   // GQA: n_heads % n_kv_heads == 0
    uint32_t head_dim;     // may differ from dim / n_heads
    uint32_t hidden_dim;   // FFN intermediate size
    uint32_t vocab_size;
    uint32_t max_seq_len;  // max_position_embeddings
    uint32_t wtype;        // dj_dtype of every layer matrix; norm weights are always f32
    uint32_t tied;         // 1: lm_head is the token embedding table
    float norm_eps;        // RMSNorm epsilon
    float rope_theta;
    uint32_t rope_type;    // dj_rope_type
    float rope_factor;     // llama3: scaling factor (8 for Llama 3.1)
    float rope_low_freq;   // llama3: low_freq_factor
    float rope_high_freq;  // llama3: high_freq_factor
    uint32_t rope_orig_max;  // llama3: original_max_position_embeddings
    uint32_t embed_type;   // dj_dtype of the embeddings: wtype, or q8 beside quantized layers (version 1: stored 0,
                           // read as wtype)
    uint32_t head_type;    // dj_dtype of an untied lm_head: as embed_type
    uint32_t reserved;     // zero
} dj_config;

// On-disk header (the first 128 bytes of the 4096-byte header; the rest is zero).
typedef struct {
    char magic[8];          // "DJINNMDL"
    uint32_t version;       // DJ_VERSION
    uint32_t header_size;   // DJ_HEADER_SIZE
    uint64_t file_size;     // total bytes: a truncated file is caught before any read
    uint32_t n_sections;    // entries in the section table at offset header_size
    uint32_t crc;           // CRC-32 of header (this field zero) + section table
    dj_config config;       // 80 bytes
    uint32_t n_tensors;     // entries in the tensor table after the section table (version 1: 0, no table)
    uint8_t pad[12];
} dj_disk_header;

typedef struct {
    uint32_t kind;    // dj_section_kind
    uint32_t index;   // layer index for DJ_SEC_LAYER, else 0
    uint64_t offset;  // from the start of the file, multiple of DJ_SECTION_ALIGN
    uint64_t size;    // bytes
    uint64_t reserved;
} dj_disk_section;

typedef struct {
    uint32_t kind;    // dj_tensor_kind
    uint32_t dtype;   // dj_dtype
    uint64_t rows;    // a matrix's rows (outputs); a vector's length
    uint64_t cols;    // a matrix's columns (inputs); 1 for a vector
    uint64_t offset;  // inside its section (a layer slab, EMBED, HEAD)
    uint64_t bytes;
} dj_disk_tensor;

// Byte offsets of each tensor inside a layer slab, all multiples of DJ_TENSOR_ALIGN.
// wq, wk, wv are back to back when their sizes are multiples of DJ_TENSOR_ALIGN (then usable as one
// (q_dim + 2*kv_dim, dim) matrix); so are w_gate and w_up.
typedef struct {
    uint64_t attn_norm;  // (dim) f32
    uint64_t ffn_norm;   // (dim) f32
    uint64_t wq;         // (n_heads*head_dim, dim)
    uint64_t wk;         // (n_kv_heads*head_dim, dim)
    uint64_t wv;         // (n_kv_heads*head_dim, dim)
    uint64_t wo;         // (dim, n_heads*head_dim)
    uint64_t w_gate;     // (hidden_dim, dim)
    uint64_t w_up;       // (hidden_dim, dim)
    uint64_t w_down;     // (dim, hidden_dim)
    uint64_t size;       // slab bytes, multiple of DJ_SECTION_ALIGN
} dj_layer_layout;

// Head slab: final norm (dim) f32 at 0; lm_head (vocab, dim) at lm_head unless tied.
typedef struct {
    uint64_t norm, lm_head, size;
} dj_head_layout;

// Fills the layouts from a config; -1 on overflow or invalid config. Used by the writer and the reader.
int dj_layout(const dj_config *c, dj_layer_layout *layer, dj_head_layout *head, dj_err *e);
// Sets the dtype of every matrix: the layers', the embeddings' and the lm_head's.
static inline void dj_config_set_wtype(dj_config *c, uint32_t wtype) { c->wtype = c->embed_type = c->head_type = wtype; }
// Checks that a config is internally consistent and within sane limits.
int dj_config_validate(const dj_config *c, dj_err *e);

// The tensor table a config implies (tied: no lm_head entry): its entries into t (DJ_N_TENSOR_KINDS of room), their
// count returned.
int dj_tensor_table(const dj_config *c, const dj_layer_layout *L, const dj_head_layout *H, dj_disk_tensor *t);

// ---- parsing: pure, no I/O
typedef struct {
    uint32_t version;                // of the file
    uint64_t header_bytes;           // header, section table and tensor table, rounded up to DJ_SECTION_ALIGN
    dj_config config;                // version 1: embed_type and head_type set to wtype
    dj_layer_layout layer;
    dj_head_layout head;
    uint64_t file_size;
    uint64_t tok_off, tok_size;      // tokenizer section
    uint64_t embed_off, embed_size;  // (vocab, dim) wtype
    uint64_t head_off, head_size;
    uint64_t *layer_off;             // n_layers offsets (malloc'd; free with dj_info_free)
} dj_model_info;

// Validates everything before use: magic, version, header size, file size, CRC, config, every section's
// presence, offset, alignment and size against the file and the layouts, no overlaps, no overflow.
// `data` holds at least the first `n` bytes of a file whose total size is `file_size` (n may be smaller, as
// long as it covers the header and the section table).
int model_parse(const void *data, size_t n, uint64_t file_size, dj_model_info *out, dj_err *e);
void dj_info_free(dj_model_info *m);

// Serialises header, section table and tensor table for `info` (file_size, offsets and layouts filled in) into buf
// of model_header_bytes bytes, CRC included, as version DJ_VERSION. Used by ./convert; the inverse of model_parse.
uint64_t model_header_bytes(uint32_t n_layers);  // all three tables, rounded up to DJ_SECTION_ALIGN
// The most bytes the three tables of any file can take: what a reader reads first.
#define DJ_MAX_HEADER_BYTES \
    (DJ_HEADER_SIZE + (DJ_MAX_LAYERS + 3) * sizeof(dj_disk_section) + DJ_N_TENSOR_KINDS * sizeof(dj_disk_tensor))
int model_write_header(const dj_model_info *info, void *buf, size_t n, dj_err *e);
// Computes all section offsets for a config and tokenizer size (the canonical file layout).
int model_plan(const dj_config *c, uint64_t tok_size, dj_model_info *out, dj_err *e);

#endif
