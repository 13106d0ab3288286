// gpu.h: the GPU forward pass. The transformer layers (and the head) that fit in the weight budget stay resident
// on the GPU; the rest stream over PCIe every pass through the skip-end ring (ringbuf.h places them, stream.c copies
// them), and while they stream the CPU computes part of every streamed unit's matrices from host memory (share.c).
#ifndef DJINN_GPU_H
#define DJINN_GPU_H

#include <stdint.h>

#include "kvtype.h"
#include "loader.h"
#include "probe.h"
#include "sampler.h"
#include "tp.h"

typedef struct {
    double ring_gb;     // GPU memory for weights, in GB (1e9 bytes); <= 0: free memory minus KV cache,
                        // activations and a margin
    int64_t max_seq;    // context: KV cache length (of each slot)
    int32_t n_slots;    // KV slots, each a sequence's cache of max_seq positions (0: 1)
    int kv_type;        // the KV cache's elements (kvtype.h; 0: f32)
    int64_t max_batch;  // most tokens per pass (0: 4096); longer prompts take several passes
    int64_t warm_rows;  // rows of the set-up's warm-up prefill (0: 2): the prompt length, so that its first
                        // pass finds its cuBLAS kernels loaded (lazy module loading: ~5 ms per new kernel)
    int stream_all;     // nothing resident: every layer cycles through the ring every pass (ablation)
    int sync_copy;      // copy, wait, compute: no overlap (ablation)
    int no_graph;       // all-resident decode without the CUDA graph (launch by launch)
    int fma_attn;       // prefill attention on the fp32 FMA kernel even where head_dim has the tensor-core one
                        // (bf16x3, gpu_set_tc_attn), for comparison
    double cpu_share;   // decode passes: this fraction (up to 0.95) of every streamed unit's matrices (whole ones
                        // first, the largest first: share.c) is computed by the CPU from host memory
                        // (cpu_matvec), so never crosses PCIe; < 0: automatic (the CPU's and the link's measured
                        // rates balanced); 0: off. Nothing changes while all is resident. Logits match the unsplit
                        // path up to summation order (not bitwise).
    int quiet;          // no plan on stderr
    const char *trace;  // the timeline of decode steps into this file (trace.h); NULL: none
    // Ctrl-C (the command line's flag, set by its handler; NULL: none): once set, the set-up stops before its next
    // unit's copy, and a forward before its next pass, each failing with "interrupted" (a pass is never cut, so the
    // engine stays consistent); both engines (the CPU's stops before its next layer)
    const volatile sig_atomic_t *cancel;
    int trace_steps;    // the steps it records (0: TRACE_STEPS_DEFAULT)
    // Several GPUs (issue 48): gpus[0..n_gpus) the devices of a tensor-parallel engine (engine_open; 0 or 1: one
    // GPU, device gpus[0]); for each GPU's part, the link it meets the others on (tp_link.h) and its rank there
    int n_gpus;
    int gpus[TP_MAX_GPUS];
    struct tp_link *tp;
    int tp_rank;
    // engine_open's model, when the caller lets the engine on several GPUs give its weight sections back as it
    // copies them into the GPUs' parts (its tokenizer, header and fingerprint stay: loader.h's model_release; after a
    // failed open too, so the caller can only free it); NULL: the model is kept whole
    dj_model *consume;
} dj_gpu_opts;

typedef struct {
    uint64_t bytes_per_token;  // streamed bytes per pass (with a CPU share: per decode pass)
    uint64_t cpu_bytes_per_token;  // CPU share: bytes of streamed matrices the CPU reads per decode pass
    double cpu_share;          // the CPU share in effect (0: off)
    int n_resident, n_streamed;  // units (layers and the head)
    uint64_t resident_bytes;   // their weights on the GPU for good (all resident: what a decode step reads)
    uint64_t copied_bytes;     // streamed bytes copied so far
    double copy_ms;            // time the copy engine spent on them
    double wait_ms;            // time the compute stream waited for copies
    int64_t passes;
    int64_t graph_passes;      // of them, replayed as a CUDA graph (all resident)
    int tc_attn;               // prefill attention runs on the tensor cores (head_dim allows, no fma_attn)
    int head_split;            // several GPUs: each computes its vocab rows of the head (tp_head_agree)
    uint64_t park_bytes, restore_bytes;  // KV bytes parked to host memory and restored, copies finished so far
    double park_ms, restore_ms;          // the copies' time on the device
    uint64_t cpu_bytes;        // CPU share, every pass so far: bytes of weights the CPU computed with
    double cpu_ms;             // the CPU's time on them
    double cpu_wait_ms;        // the host's time waiting for a split matmul's input (the GPU's work before it)
    uint64_t cpu_chains;       // MLP blocks whose gate, up and down rows the CPU computed as one job (share_ffn)
    uint64_t share_moves;      // automatic CPU share: times a pass moved the decode share (each costs the copies
                               // issued ahead at the old one)
    double outside_ms;         // passes that streamed: their time on the compute stream outside their streamed
                               // units (resident units, the head's kernels), which the automatic share counts
} dj_gpu_stats;

typedef struct dj_gpu_state dj_gpu_state;
// The most rows one pass of an engine with options o takes: max_batch (0: 4096), at most the context.
int64_t gpu_pass_rows(const dj_gpu_opts *o);
// Needs a model loaded with want_pinned (loader.h).
dj_gpu_state *gpu_state_new(const dj_model *m, const dj_gpu_opts *o, dj_err *e);
void gpu_state_free(dj_gpu_state *s);
// The CPU share a pass of T rows takes (dj_gpu_opts.cpu_share: fixed, or the automatic one chosen for T).
double gpu_cpu_share_for(const dj_gpu_state *s, int64_t T);
// Runs tokens (T) at positions pos .. pos+T-1 of KV slot `slot`. logits: (T, vocab) when all, else (vocab) for the
// last token; NULL for none. Host memory.
int gpu_forward(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                dj_err *e);
// gpu_forward for the last token, but its next token is picked on the GPU by sampler.h's rule (a from
// sampler_step_args, counts from sampler_counts) and only the id comes back: -1 when the logits held a NaN or
// +infinity, or only -infinity.
int gpu_forward_pick(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                     const dj_pick_args *a, const int32_t *counts, int32_t *next, dj_err *e);
// One pass over rows of several sequences (engine.h's step_rows): row r is tokens[r] at position pos[r] of slot
// slots[r]; a slot's rows are adjacent and at consecutive positions (one decode token, or a chunk of its prompt).
// logits (n_want, vocab), host memory: the rows want[0..n_want-1] (ascending). Every matmul runs over all the rows
// (each weight row read once a pass; passes of up to max_batch rows), rope and the KV writes per row in its slot,
// attention per row (the decode kernel) or per chunk (the prefill kernel) over its slot's keys. A pass of one row
// is a plain decode step (the CUDA graph when all is resident, the CPU share when it streams).
int gpu_step_rows(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                  int64_t n_want, const int32_t *want, float *logits, dj_err *e);
// The same pass, the wanted rows' next tokens picked on the GPU by sampler.h's rule (args (n_want) from
// sampler_step_args, none with a penalty on) into next (n_want): only the ids come back. -1 for a row as
// sampler_next gives it.
int gpu_step_rows_pick(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                       int64_t n_want, const int32_t *want, const dj_pick_args *args, int32_t *next, dj_err *e);
// Parking (engine.h): a slot's first n positions copied to page-locked host memory on the parking stream, back
// into any slot, or released. Every later pass on the slots concerned waits for the copies on the device.
typedef struct dj_gpu_parked dj_gpu_parked;
dj_gpu_parked *gpu_park(dj_gpu_state *s, int32_t slot, int64_t n, dj_err *e);
int gpu_restore(dj_gpu_state *s, dj_gpu_parked *p, int32_t slot, dj_err *e);
void gpu_drop(dj_gpu_state *s, dj_gpu_parked *p);
void gpu_state_stats(dj_gpu_state *s, dj_gpu_stats *out);  // the parking copies finished so far included
// The parked keys, then values, each (n_layers * n_kv_heads, n, head_dim) f32, in host memory once its copies are
// done (it waits for them): read them, or write them before gpu_restore.
void *gpu_parked_host(dj_gpu_state *s, dj_gpu_parked *p, dj_err *e);
// Probes (probe.h) after the layers of every later pass, NULL for none; the caller keeps p alive meanwhile. The
// control vectors go to the device now (set it again after changing them); a probe that dumps runs the decode step
// launch by launch, one that only steers keeps the CUDA graph (captured again with the additions).
int gpu_set_probe(dj_gpu_state *s, dj_probe *p, dj_err *e);

#endif
