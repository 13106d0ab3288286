// engine.h: one interface over the two forward passes, the GPU engine (gpu.h) and the CPU one (cpu.h), so that
// generation, --check and the server see a model only through it.
//
// KV slots. An engine holds n_slots KV caches ("slots"), each one sequence's keys and values for max_seq positions,
// laid out as a single sequence's cache always was: (n_layers, n_kv_heads, max_seq, head_dim) elements of the
// engine's KV type (kvtype.h: f32, f16, q8 with its scales beside), the slots one after the other. A sequence lives
// in one slot: its prefill is forward() on that slot (in chunks, if the caller wants), and its decode steps go
// through step_rows() together with every other sequence decoding at the same time, each row one new token at its
// own position in its own slot. The command line uses slot 0 of one.
// A slot's first n positions can be parked in host memory and restored, into any slot, bitwise.
#ifndef DJINN_ENGINE_H
#define DJINN_ENGINE_H

#include <stdint.h>

#include "gpu.h"
#include "sampler.h"

typedef struct dj_parked dj_parked;  // a parked slot's keys and values in host memory, owned by the engine

typedef struct {
    const char *name;  // "cpu", "gpu"
    int is_gpu;
    void *ctx;         // dj_gpu_state or dj_cpu_state
    int32_t n_slots;   // KV slots, each max_seq positions
    int kv_type;       // their elements (kvtype.h)
    int64_t max_seq;
    // Runs tokens (T) at positions pos .. pos+T-1 of `slot`, filling that slot's KV cache. logits: (T, vocab)
    // when all, else (vocab) for the last token; NULL for none.
    int (*forward)(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                   dj_err *e);
    // forward for the last token, its next token picked where the logits are (gpu_forward_pick); NULL: the
    // engine has none, the host samples
    int (*pick)(void *ctx, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, const dj_pick_args *a,
                const int32_t *counts, int32_t *next, dj_err *e);
    // One pass over n rows of several sequences, a continuous-batching turn: row r is tokens[r] at position pos[r]
    // of slot slots[r]; a slot's rows are adjacent and at consecutive positions (a sequence's decode token, or a
    // chunk of its prompt), positions past what the slot holds. logits (n_want, vocab), host memory: the rows
    // want[0..n_want-1] (ascending). Each row's logits equal those of forward() of its slot's rows alone (the CPU
    // engine: bitwise); a GPU pass reads every weight row once for all its rows (a matmul over the rows, not a
    // matvec each); attention is per row over its own slot's positions.
    int (*step_rows)(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                     int64_t n_want, const int32_t *want, float *logits, dj_err *e);
    // step_rows with the wanted rows' next tokens picked where the logits are, by sampler.h's rule with args
    // (n_want, from sampler_step_args; no penalty on: gpu_pick keeps one sampler's counts) into next (n_want): only
    // the ids come back. NULL: the engine has none, the host samples the logits.
    int (*step_rows_pick)(void *ctx, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                          int64_t n_want, const int32_t *want, const dj_pick_args *args, int32_t *next, dj_err *e);
    // Parking (NULL: none). park copies positions 0..n-1 of `slot` (every layer's K and V: n * kv_pos_bytes) to
    // host memory the engine owns (page-locked on the GPU) and returns it; the slot may then be reused. restore
    // copies a parked cache back into positions 0..n-1 of any slot and releases it (on an error it is kept);
    // drop releases one without restoring. The GPU engine may run the copies on its copy stream: every later call
    // behaves as if they had completed (it orders them with events), so nothing waits on the host.
    dj_parked *(*park)(void *ctx, int32_t slot, int64_t n, dj_err *e);
    int (*restore)(void *ctx, dj_parked *p, int32_t slot, dj_err *e);
    void (*drop)(void *ctx, dj_parked *p);
    void (*free)(void *ctx);
    // A parked cache in host memory, its copies done: read it, or fill it before restore (session.h). Its keys,
    // then its values, each (n_layers, n_kv_heads, n, head_dim) elements of the engine's KV type; for q8 then the
    // keys' scales and the values' scales, each (n_layers, n_kv_heads, n) f32: n * engine_kv_pos_bytes in all.
    void *(*parked_kv)(void *ctx, dj_parked *p, dj_err *e);
    // Probes (probe.h: dumps and control vectors after layers) for every later pass; NULL: none. The caller keeps
    // the probe alive while it is set, and sets it again after changing its vectors.
    int (*set_probe)(void *ctx, dj_probe *p, dj_err *e);
    // The GPU engine's figures so far (gpu.h), the parking copies finished included; NULL: the engine has none.
    void (*gpu_stats)(void *ctx, dj_gpu_stats *out);
} dj_engine;

// Bytes of one position's keys and values over every layer in KV type kv_type (kvtype.h): a slot is max_seq of
// them.
uint64_t engine_kv_pos_bytes(const dj_config *c, int kv_type);
// The engine follows how the model was loaded: page-locked for the GPU (loader.h) runs on the GPU with the
// options `go`, otherwise on the CPU; either with n_slots KV slots of go->max_seq positions.
int engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, int32_t n_slots, dj_err *e);
void engine_close(dj_engine *eng);  // a zeroed engine is fine
// The engine on go->n_gpus >= 2 GPUs (tp_engine.c; engine_open takes it for n_gpus >= 2): every layer split over
// them by tp_plan, each GPU's part of the model built in host memory. Forward, pick, the batched step and parking as
// one GPU (logits within rounding of it: the partial sums' order), the CPU share and probes too.
// Where go names no GPUs (n_gpus 0) and several are visible, the GPUs a run takes by default: every one the model
// splits over (tp_default_gpus); when that is fewer than visible, one line on stderr after "who: ". The command
// line's and the server's.
void engine_default_gpus(dj_gpu_opts *go, const dj_config *c, const char *who);
int tp_engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, int32_t n_slots, dj_err *e);
// The GPU engine's figures into *out: 1; 0 (out untouched) for an engine without them (the CPU's).
int engine_gpu_stats(const dj_engine *eng, dj_gpu_stats *out);
// Runs tokens (T) at positions pos.. of `slot` and picks the next token with the sampler: where the logits are
// when the engine can (only the id comes back), else from `logits` (vocab), host memory the host sampler reads.
// *next: -1 when the last row held a NaN or +infinity, or only -infinity.
int engine_next(dj_engine *eng, dj_sampler *smp, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                float *logits, int32_t *next, dj_err *e);

// What djinn and djinn serve answer to llama.cpp's -ngl (a layer count), which they then ignore.
#define ENGINE_NGL_NOTE                                                                                            \
    "Djinn sizes the GPU's share by memory, not layers: --ring-gb G (automatic by default) keeps as many layers " \
    "resident as fit and streams the rest"

#endif
