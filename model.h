// model.h: the model.bin file format, its pure parser, the loader, and the CPU reference forward pass.
//
// ---- model.bin, version 1 (all integers little-endian)
//   [0, 4096)       fixed header (dj_disk_header), zero-padded to 4096 bytes
//   [4096, ...)     section table: n_sections entries of dj_disk_section (32 bytes each)
//   then sections, each starting at a multiple of DJ_SECTION_ALIGN (4096), in this order:
//     TOKENIZER     the tokenizer in the engine's binary form (tokenizer.h)
//     EMBED         token embeddings, (vocab, dim) in wtype; stays in host memory, one row gathered per token
//     LAYER i       one contiguous slab per transformer layer, laid out by dj_layer_layout(): moving a layer
//                   to the GPU is one copy
//     HEAD          final norm (dim, f32), then lm_head (vocab, dim) in wtype unless tied (then EMBED is the head)
//   The header's CRC-32 covers the header (crc field as zero) and the section table.
#ifndef DJINN_MODEL_H
#define DJINN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define DJ_MAGIC "DJINNMDL"
#define DJ_VERSION 1u
#define DJ_HEADER_SIZE 4096u
#define DJ_SECTION_ALIGN 4096u  // every section offset and every layer slab size
#define DJ_TENSOR_ALIGN 256u    // every tensor inside a slab
#define DJ_MAX_LAYERS 1024u

enum dj_dtype { DJ_F32 = 0, DJ_F16 = 1, DJ_BF16 = 2 };
enum dj_rope_type { DJ_ROPE_DEFAULT = 0, DJ_ROPE_LLAMA3 = 1 };
enum dj_section_kind { DJ_SEC_TOKENIZER = 1, DJ_SEC_EMBED = 2, DJ_SEC_LAYER = 3, DJ_SEC_HEAD = 4 };

size_t dj_dtype_size(uint32_t dtype);     // 4, 2, 2; 0 for an unknown dtype
const char *dj_dtype_name(uint32_t dtype);  // "f32", "f16", "bf16", "?"

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
    uint32_t wtype;        // dj_dtype of every matrix and of the embeddings; norm weights are always f32
    uint32_t tied;         // 1: lm_head is the token embedding table
    float norm_eps;        // RMSNorm epsilon
    float rope_theta;
    uint32_t rope_type;    // dj_rope_type
    float rope_factor;     // llama3: scaling factor (8 for Llama 3.1)
    float rope_low_freq;   // llama3: low_freq_factor
    float rope_high_freq;  // llama3: high_freq_factor
    uint32_t rope_orig_max;  // llama3: original_max_position_embeddings
    uint32_t reserved[3];
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
    uint8_t pad[16];
} dj_disk_header;

typedef struct {
    uint32_t kind;    // dj_section_kind
    uint32_t index;   // layer index for DJ_SEC_LAYER, else 0
    uint64_t offset;  // from the start of the file, multiple of DJ_SECTION_ALIGN
    uint64_t size;    // bytes
    uint64_t reserved;
} dj_disk_section;

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
// Checks that a config is internally consistent and within sane limits.
int dj_config_validate(const dj_config *c, dj_err *e);

// ---- parsing: pure, no I/O
typedef struct {
    dj_config config;
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

// Serialises header + section table for `info` (file_size, offsets and layouts filled in) into buf of
// `header_bytes(info)` bytes, CRC included. Used by ./convert; the inverse of model_parse.
uint64_t model_header_bytes(uint32_t n_layers);  // header + table, rounded up to DJ_SECTION_ALIGN
int model_write_header(const dj_model_info *info, void *buf, size_t n, dj_err *e);
// Computes all section offsets for a config and tokenizer size (the canonical file layout).
int model_plan(const dj_config *c, uint64_t tok_size, dj_model_info *out, dj_err *e);

// ---- loading
typedef struct {
    dj_model_info info;
    uint8_t *data;     // the whole file in host memory (read, not mapped; travelling sections page-locked
                       // when `pinned`)
    size_t data_size;
    int for_gpu;       // 1: loaded for the GPU engine (anonymous memory, travelling sections registered)
    int pinned;        // 1: every travelling section (layers, head, tied embeddings) is page-locked
    int pin_tried;     // page-locking was attempted (sections to unregister on free)
} dj_model;

typedef struct {
    int want_pinned;   // 1: load for the GPU: page-lock what travels (requires a GPU); 0: the CPU path
    int no_pin;        // with want_pinned: skip page-locking (pageable copies: slower, no overlap)
    int quiet;         // no progress on stderr
    int threads;       // read threads (0: default)
} dj_load_opts;

int model_load(const char *path, const dj_load_opts *o, dj_model *m, dj_err *e);
void model_free(dj_model *m);

// Typed views into a loaded model.
static inline const uint8_t *dj_layer_ptr(const dj_model *m, uint32_t l) { return m->data + m->info.layer_off[l]; }
static inline const uint8_t *dj_embed_ptr(const dj_model *m) { return m->data + m->info.embed_off; }
static inline const uint8_t *dj_head_ptr(const dj_model *m) { return m->data + m->info.head_off; }
static inline const uint8_t *dj_lm_head_ptr(const dj_model *m) {
    return m->info.config.tied ? dj_embed_ptr(m) : dj_head_ptr(m) + m->info.head.lm_head;
}

// ---- CPU reference: the oracle for every GPU kernel, and the engine's path where no GPU is present.
// fp32 arithmetic throughout; weights stay in their stored dtype and are widened on the fly.
// y (T, n_out) = x (T, n_in) . W^T, with W (n_out, n_in) in wtype; multithreaded.
void cpu_matmul(float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out);
// y (n_out) = W x for one token (W (n_out, n_in) in wtype): cpu_matmul's result up to summation order, at the
// host's memory bandwidth (AVX2 + FMA + F16C where the CPU has them, detected at run time); multithreaded. The
// GPU engine's CPU share (dj_gpu_opts.cpu_share) runs on it.
void cpu_matvec(float *y, const float *x, const void *w, uint32_t wtype, int64_t n_in, int64_t n_out);
// For tests: on = 0 makes cpu_matvec take its portable loop. Returns 1 when the vector path is in use.
int cpu_set_simd(int on);
// out (n) = x / sqrt(mean(x^2) + eps) * w; w (n) f32. out may alias x.
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
// inv_freq (head_dim/2): HF's rotary inverse frequencies, llama3 scaling applied, in f32 as HF computes them.
void cpu_rope_freqs(const dj_config *c, float *inv_freq);
// x (n_heads, head_dim) rotated in place for position pos, HF rotate-half style: pairs (i, i + head_dim/2),
// angle = (float)pos * inv_freq[i] in f32.
void cpu_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos, const float *inv_freq);
// Causal GQA attention of one query at position pos over keys 0..pos; query head h reads kv head
// h / (n_heads / n_kv_heads). q, out (n_heads, head_dim); k_cache, v_cache (n_kv_heads, max_seq, head_dim).
// Scale 1/sqrt(head_dim), softmax in f32.
void cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache, int64_t n_heads,
                   int64_t n_kv_heads, int64_t head_dim, int64_t pos, int64_t max_seq);
// out (n) = silu(gate) * up. out may alias gate.
void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n);

// A forward-pass state: activations and the KV cache (n_layers, n_kv_heads, max_seq, head_dim) in f32.
typedef struct dj_cpu_state dj_cpu_state;
dj_cpu_state *cpu_state_new(const dj_model *m, int64_t max_seq, dj_err *e);
void cpu_state_free(dj_cpu_state *s);
// Runs tokens (T) at positions pos .. pos+T-1, filling the KV cache; logits (T, vocab) if not NULL.
int cpu_forward(dj_cpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, dj_err *e);
// Worker threads for the CPU path (a pool started on first use). cpu_set_threads only has an effect before
// that; n <= 0: one per online core. cpu_threads starts the pool and returns its size (caller included).
void cpu_set_threads(int n);
int cpu_threads(void);

// ---- GPU forward: all layers resident when they fit in the weight budget, the rest streamed over PCIe
// through the skip-end ring (ringbuf.h). Needs a model loaded with want_pinned.
typedef struct {
    double ring_gb;     // GPU memory for weights, in GB (1e9 bytes); <= 0: free memory minus KV cache,
                        // activations and a margin
    int64_t max_seq;    // context: KV cache length
    int64_t max_batch;  // most tokens per pass (0: 4096); longer prompts take several passes
    int64_t warm_rows;  // rows of the set-up's warm-up prefill (0: 2): the prompt length, so that its first
                        // pass finds its cuBLAS kernels loaded (lazy module loading: ~5 ms per new kernel)
    int stream_all;     // nothing resident: every layer cycles through the ring every pass (ablation)
    int sync_copy;      // copy, wait, compute: no overlap (ablation)
    int no_graph;       // all-resident decode without the CUDA graph (launch by launch)
    int fma_attn;       // prefill attention on the fp32 FMA kernel even where head_dim has the tensor-core one
                        // (bf16x3, gpu_set_tc_attn), for comparison
    double cpu_share;   // decode passes: this fraction (up to 0.95) of the rows of every streamed matrix is computed
                        // by the CPU from host memory (cpu_matvec), so never crosses PCIe; < 0: automatic (the
                        // CPU's and the link's measured rates balanced); 0: off. Nothing changes while all is
                        // resident. Logits match the unsplit path up to summation order (not bitwise).
    int quiet;          // no plan on stderr
} dj_gpu_opts;

typedef struct {
    uint64_t bytes_per_token;  // streamed bytes per pass (with a CPU share: per decode pass)
    uint64_t cpu_bytes_per_token;  // CPU share: bytes of streamed matrices the CPU reads per decode pass
    double cpu_share;          // the CPU share in effect (0: off)
    int n_resident, n_streamed;  // units (layers and the head)
    uint64_t copied_bytes;     // streamed bytes copied so far
    double copy_ms;            // time the copy engine spent on them
    double wait_ms;            // time the compute stream waited for copies
    int64_t passes;
    int tc_attn;               // prefill attention runs on the tensor cores (head_dim allows, no fma_attn)
} dj_gpu_stats;

typedef struct dj_gpu_state dj_gpu_state;
dj_gpu_state *gpu_state_new(const dj_model *m, const dj_gpu_opts *o, dj_err *e);
void gpu_state_free(dj_gpu_state *s);
// Runs tokens (T) at positions pos .. pos+T-1. logits: (T, vocab) when all, else (vocab) for the last
// token; NULL for none. Host memory.
int gpu_forward(dj_gpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all, dj_err *e);
void gpu_state_stats(const dj_gpu_state *s, dj_gpu_stats *out);

#endif
