// cpu.h: the CPU side of the engine: the reference ops (the oracle every GPU kernel is tested against) and the
// SIMD matvec the GPU engine's CPU share runs on (cpu.c), and the CPU forward pass (cpu_forward.c: the engine where
// no GPU is present).
#ifndef DJINN_CPU_H
#define DJINN_CPU_H

#include <stdint.h>

#include "kvtype.h"
#include "loader.h"
#include "pool.h"
#include "probe.h"

// ---- ops: fp32 arithmetic throughout; weights stay in their stored dtype and are widened on the fly.
// y (T, n_out) = x (T, n_in) . W^T, with W (n_out, n_in) in wtype; multithreaded. cpu_matmul, cpu_matvec and
// cpu_matvec_multi return -1 when a thread's buffer could not be allocated (y then incomplete), else 0.
int cpu_matmul(float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out);
// y (n_out) = W x for one token (W (n_out, n_in) in wtype): cpu_matmul's result up to summation order, at the
// host's memory bandwidth (AVX2 + FMA + F16C where the CPU has them, detected at run time); multithreaded. The
// GPU engine's CPU share (dj_gpu_opts.cpu_share) runs on it.
int cpu_matvec(float *y, const float *x, const void *w, uint32_t wtype, int64_t n_in, int64_t n_out);
// y (T, n_out) = x (T, n_in) . W^T for a few tokens, each weight row read from memory once for all T (the CPU
// share of a pass of several rows): cpu_matmul's result up to summation order; T = 1 is cpu_matvec where
// the AVX-512 tiles do not run or the weights are q8 or q4.
int cpu_matvec_multi(float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in,
                     int64_t n_out);
// An asynchronous job's state on the pool's workers: its owner (the GPU engine's CPU share) makes one, passes it to
// each start and its finish, and frees it when no job runs. NULL from cpu_job_new: out of memory.
typedef struct cpu_job cpu_job;
cpu_job *cpu_job_new(void);
void cpu_job_free(cpu_job *j);
// cpu_matvec_multi on the pool's workers, asynchronously: they begin once *ready reaches seq (in wrapping order:
// x has landed), and the thread that computes the last row stores seq in *done (release), while the caller goes
// on with other work, until cpu_matvec_finish. The pool runs one job at a time (another start, with any job
// object, waits for this one's finish), and nothing else on the pool in between.
// (The GPU engine's CPU share: the GPU writes *ready and waits for *done, both in mapped host memory.)
void cpu_matvec_start(cpu_job *j, float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in,
                      int64_t n_out, const _Atomic uint32_t *ready, _Atomic uint32_t *done, uint32_t seq);
// The CPU's part of a layer's MLP block where it has every row of gate and up (the GPU engine's CPU share, its
// chain): asynchronously as cpu_matvec_start, h = silu(gate . x) * (up . x) for T rows, then y = the last n_down
// rows of down (0: none) over h; seq goes to *mid once h is whole (release), then to *done once y is. h and y are
// cpu_matvec_multi's and cpu_swiglu's results, bit for bit. One job at a time with cpu_matvec_start's.
typedef struct {
    float *h, *y;                  // (T, hid) silu(gate . x) * (up . x); (T, n_down) the down rows
    float *gate_up;                // (2, T, hid): room for gate . x and up . x
    const float *x;                // (T, dim)
    const void *gate, *up, *down;  // (hid, dim) each, in wtype; down's last n_down rows (n_down, hid)
    uint32_t wtype;
    int64_t T, dim, hid, n_down;
} cpu_ffn_args;
void cpu_ffn_start(cpu_job *j, const cpu_ffn_args *f, const _Atomic uint32_t *ready, _Atomic uint32_t *mid,
                   _Atomic uint32_t *done, uint32_t seq);
// Joins cpu_matvec_start's or cpu_ffn_start's job: the caller computes rows still unclaimed and returns when every
// thread is done, with the host's clock (dj_now) when a thread first saw x (t[0]), when h was whole (t[1]; a
// matvec: t[2]) and when the last row was done (t[2]). -1: out of memory, some rows left out (all counted done).
int cpu_matvec_finish(cpu_job *j, double t[3]);
// Test-only: called by each thread of cpu_matvec_start's or cpu_ffn_start's job that finds x not landed yet, once,
// before it waits for it (a test lands x once every thread waits). NULL in every real run.
extern void (*cpu_test_hook_waiting_x)(void);
// For tests and benchmarks: the widest vector code cpu_matvec and cpu_matvec_multi may take (the default
// CPU_SIMD_BEST): 0 their portable loops; CPU_SIMD_AVX2 AVX2 + FMA + F16C; CPU_SIMD_AVX512 also AVX-512 for
// cpu_matvec_multi's tiles and, where the CPU has VNNI too, for cpu_matvec's q8/q4 rows. Returns the level in use:
// the lower of `level` and what this CPU has (0: none).
enum { CPU_SIMD_AVX2 = 1, CPU_SIMD_AVX512 = 2, CPU_SIMD_BEST = CPU_SIMD_AVX512 };
int cpu_set_simd(int level);
// out (n) = x / sqrt(mean(x^2) + eps) * w; w (n) f32. out may alias x.
void cpu_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
// inv_freq (head_dim/2): HF's rotary inverse frequencies, llama3 scaling applied, in f32 as HF computes them.
void cpu_rope_freqs(const dj_config *c, float *inv_freq);
// x (n_heads, head_dim) rotated in place for position pos, HF rotate-half style: pairs (i, i + head_dim/2),
// angle = (float)pos * inv_freq[i] in f32.
void cpu_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos, const float *inv_freq);
// Causal GQA attention of one query at position pos over keys 0..pos; query head h reads kv head
// h / (n_heads / n_kv_heads). q, out (n_heads, head_dim); k_cache, v_cache (n_kv_heads, max_seq, head_dim).
// Scale 1/sqrt(head_dim), softmax in f32. -1: out of memory for the scores (out untouched).
int cpu_attention(float *out, const float *q, const float *k_cache, const float *v_cache, int64_t n_heads,
                  int64_t n_kv_heads, int64_t head_dim, int64_t pos, int64_t max_seq);
// out (n) = silu(gate) * up. out may alias gate.
void cpu_swiglu(float *out, const float *gate, const float *up, int64_t n);
// One query head over keys 0..pos (k, v (pos+1, head_dim)); scores (pos+1) is scratch. cpu_attention's per head.
void cpu_attention_head(float *out, const float *q, const float *k, const float *v, int64_t head_dim, int64_t pos,
                        float *scores);
// dst (n) = row `r` of w (rows of n elements in wtype, dj_row_bytes apart), widened to f32 (q8, q4: dequantized,
// exactly); w's own row for f32. f16 needs cpu_f16_init first (its table).
const float *cpu_widen_row(float *dst, const void *w, uint32_t wtype, int64_t r, int64_t n);
void cpu_f16_init(void);  // the f16 -> f32 table, once

// ---- the forward pass (cpu_forward.c)
// A forward-pass state: activations and n_slots KV slots, each one sequence's cache of max_seq positions laid out
// (n_layers, n_kv_heads, max_seq, head_dim) in a KV type (kvtype.h: f32, f16, or q8 with its scales in an array
// beside); the slots one after the other. Attention reads a kv head's rows widened to f32 (f16 exactly, q8 as
// k * scale). Slot memory is touched only where positions are written, so slots that are never used cost address
// space, not RAM.
typedef struct dj_cpu_state dj_cpu_state;
dj_cpu_state *cpu_state_new(const dj_model *m, int64_t max_seq, dj_err *e);  // one slot, f32
dj_cpu_state *cpu_state_new_slots(const dj_model *m, int64_t max_seq, int32_t n_slots, int kv_type, dj_err *e);
void cpu_state_free(dj_cpu_state *s);
int64_t cpu_vocab(const dj_cpu_state *s);  // the model's vocabulary: a logits row's length
// Runs tokens (T) at positions pos .. pos+T-1 of slot 0, filling its KV cache; logits (T, vocab) if not NULL.
int cpu_forward(dj_cpu_state *s, const int32_t *tokens, int64_t T, int64_t pos, float *logits, dj_err *e);
// The same in `slot`.
int cpu_forward_slot(dj_cpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                     dj_err *e);
// One decode step of B sequences: row b is tokens[b] at position pos[b] of slot slots[b] (each slot at most once);
// logits (B, vocab). The rows share every matmul (each weight row read once for up to 32 rows); attention is per
// row over its own slot. Each row's logits are bitwise those of cpu_forward_slot on that token alone.
int cpu_step_batch(dj_cpu_state *s, int32_t B, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                   float *logits, dj_err *e);
// cpu_forward_slot with the logits (vocab) of the last row only (NULL: none): the head runs once.
int cpu_forward_last(dj_cpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                     dj_err *e);
// One pass over n rows of several sequences (engine.h's step_rows): row r is tokens[r] at position pos[r] of slot
// slots[r]; a slot's rows adjacent and at consecutive positions; logits (n_want, vocab) of the rows want[] (ascending).
// Each row's logits are bitwise those of cpu_forward_slot of its slot's rows alone.
int cpu_step_rows(dj_cpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                  int64_t n_want, const int32_t *want, float *logits, dj_err *e);
// Parking: a slot's first n positions (every layer's keys and values) copied into host memory of their own
// (malloc'd: n * engine_kv_pos_bytes), and back into any slot, bitwise.
typedef struct dj_cpu_parked dj_cpu_parked;
dj_cpu_parked *cpu_park(dj_cpu_state *s, int32_t slot, int64_t n, dj_err *e);
// Copies p into positions 0..n-1 of `slot` (n: p's) and frees p; on an error p is kept.
int cpu_restore(dj_cpu_state *s, dj_cpu_parked *p, int32_t slot, dj_err *e);
void cpu_parked_free(dj_cpu_parked *p);
// The parked cache in engine.h's parked layout for the KV type (keys, values, q8's scales): what a session file holds.
void *cpu_parked_kv(dj_cpu_parked *p);
// Probes (probe.h) after every layer of later passes; NULL: none. The caller keeps p alive meanwhile.
void cpu_set_probe(dj_cpu_state *s, dj_probe *p);
// Ctrl-C's flag (NULL: none): once set, a pass stops before its next layer with "interrupted", the positions it was
// computing left undefined (the caller gives them up: the command line exits).
void cpu_set_cancel(dj_cpu_state *s, const volatile sig_atomic_t *cancel);

#endif
