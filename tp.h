// tp.h: the tensor-parallel split (issue 48; docs/multigpu.md): which heads and rows of every layer each of N GPUs
// owns, what that costs each GPU (KV bytes a position, weight bytes a layer), and cutting a matrix's input columns
// at the plan's boundaries.
//
// GPU g owns a contiguous range of kv heads and the query heads that read them (a GQA group never crosses GPUs), so
// its attention needs nothing from the others: its rows of wq, wk, wv and its KV cache rows are those heads', and its
// input columns of wo are the same heads' dims. It owns a contiguous range of FFN hidden rows: its rows of w_gate
// and w_up, the same input columns of w_down. Each GPU's wo and w_down give a partial (dim) output; their sum over
// the GPUs (an all-reduce, twice a layer) is the unsplit layer's output up to the order of additions.
#ifndef DJINN_TP_H
#define DJINN_TP_H

#include <stdint.h>

#include "loader.h"
#include "model.h"

#define TP_MAX_GPUS 8  // one host's GPUs; the plan's kv-head arrangements are searched over 2^n masks

typedef struct {
    int64_t lo, hi;  // [lo, hi)
} tp_range;

// One GPU's share of every layer (the same in every layer).
typedef struct {
    tp_range kv_heads;  // its kv heads: its KV cache rows
    tp_range heads;     // its query heads: kv_heads times n_heads / n_kv_heads
    tp_range q_rows;    // rows of wq, and input columns of wo: heads times head_dim
    tp_range kv_rows;   // rows of wk and wv: kv_heads times head_dim
    tp_range ffn_rows;  // rows of w_gate and w_up, and input columns of w_down
    tp_range vocab_rows;  // rows of lm_head whose logits it computes (the head split; tp_link.h's tp_head_agree)
} tp_split;

// The columns a cut of a wtype matrix's rows may fall on are multiples of this: DJ_QGROUP for q8 and q4 (a cut row
// is whole groups, re-packed as a row of its own), 16 bytes of elements for the floats (the GPU's vector loads).
int64_t tp_col_granularity(uint32_t wtype);

// Fills out[0..n_gpus) for c. Kv heads are split as evenly as possible (counts at most one apart; which GPUs take
// one more is chosen so that wo's cuts fall on tp_col_granularity), FFN rows in units of tp_col_granularity as evenly
// as possible (the last GPU's last unit may be partial). Refuses by name, one line: n_gpus outside 1..TP_MAX_GPUS,
// fewer kv heads than GPUs, heads whose columns cannot be cut on the granularity, fewer FFN units than GPUs.
int tp_plan(const dj_config *c, int n_gpus, tp_split out[], dj_err *e);

// One GPU's KV cache bytes a position: its kv heads' K and V rows in every layer, in kv_type (kvtype.h). Summed
// over the GPUs: engine_kv_pos_bytes.
uint64_t tp_kv_pos_bytes(const dj_config *c, const tp_split *s, int kv_type);
// One GPU's slab of one layer, laid out as dj_layout lays the whole one (tensors DJ_TENSOR_ALIGN apart, the slab a
// multiple of DJ_SECTION_ALIGN): both norms (every GPU applies them), its rows of wq, wk, wv, w_gate, w_up and its
// columns of wo and w_down (each cut row dj_row_bytes of its width). One GPU: dj_layout's size.
uint64_t tp_layer_bytes(const dj_config *c, const tp_split *s);

// dst (rows, c1 - c0) = columns [c0, c1) of w (rows, cols), both in wtype, each dst row dj_row_bytes(wtype, c1 - c0)
// (q8, q4: the groups' values and parameters copied, the padding zeroed). PRECOND: 0 <= c0 < c1 <= cols, c0 and c1
// (unless c1 == cols) multiples of tp_col_granularity(wtype), as tp_plan's cuts are.
void tp_cut_cols(void *dst, const void *w, uint32_t wtype, int64_t rows, int64_t cols, int64_t c0, int64_t c1);

// The GPUs a run takes where --gpus is not given: every visible one (up to TP_MAX_GPUS) where the model splits
// over them (tp_plan) and each pair has peer access (peer_ok(a, b): gpu_peer_ok, or a test's), else the most that
// do, else one; ids 0..*n-1. Fewer than visible: *why says why (the first refusal, one line), else it is empty.
void tp_default_gpus(const dj_config *c, int visible, int (*peer_ok)(int, int), int *n, int ids[TP_MAX_GPUS],
                     char *why, size_t why_size);

// --gpus V: a count N (1 to TP_MAX_GPUS: the first N visible devices) or a comma-separated list of device ids (0 to
// 63; one may repeat: two parts on one device, a stand-in for two GPUs in tests), into *n and ids; one line naming V
// where it is neither. Whether the devices exist is the engine's to say (engine_open).
int tp_parse_gpus(const char *v, int *n, int ids[TP_MAX_GPUS], dj_err *e);

// out: GPU s's part of m as a model of its own, in memory: m's config with s's heads, kv heads and FFN rows
// (n_heads, n_kv_heads, hidden_dim), every layer slab laid out for that config (its rows of wq, wk, wv, w_gate, w_up,
// its columns of wo and w_down), the tokenizer, embeddings and head m's. pin: its travelling sections page-locked
// (model_pin), as the loader does for the GPU. model_free releases it. PRECOND: s from tp_plan for m's config.
int tp_shard_model(const dj_model *m, const tp_split *s, int pin, dj_model *out, dj_err *e);
// Every GPU's part at once (out[0..n) for s[0..n)), built layer by layer; release (m itself, or NULL: m stays whole):
// each of m's layers given back (model_release) once every part has copied it, then its embeddings and head, so that
// the host holds the model about once (m's tokenizer and header stay; its fingerprint is kept).
int tp_shard_models(const dj_model *m, dj_model *release, const tp_split *s, int n, int pin, dj_model out[],
                    dj_err *e);

#endif
