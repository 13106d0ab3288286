// gpu_impl.h: the GPU engine's state, shared by its files and nothing else:
//   gpu.c          set-up (device, budget, plan, buffers, warm-up), the layer, the pass
//   stream.c       the copy schedule: streamed units through the ring's slots, copy and compute streams in step
//   share.c        the CPU share: the rows of streamed matrices the CPU computes from host memory (split matmuls)
//   share_split.c  the CPU share's geometry: a unit's matrices and where a share cuts them
//   share_chan.c   the CPU share's job channel: x to the host, the CPU's rows back, the job's words
//   share_auto.c   --cpu-share auto: the share's tuner
//   park.c         KV slots parked in page-locked host memory and restored
//   probe_gpu.c    probes: control vectors added after layers, layers' rows dumped
#ifndef DJINN_GPU_IMPL_H
#define DJINN_GPU_IMPL_H

#include "gpu.h"
#include "kernels.h"
#include "ringbuf.h"
#include "trace.h"

#define GPU_ALIGN 4096u     // units in device memory
#define GPU_MAX_BATCH 4096  // most tokens one pass processes (prefill of a longer prompt takes several)
#define GPU_LOGIT_ROWS 64   // head rows computed per chunk when every position's logits are wanted
#define SW_X_LANDED 0       // the CPU share's job words (share_chan.h_words), a cache line apart: x is in h_in;
#define SW_ROWS_DONE 16     //   the CPU's rows are in h_out;
#define SW_H_DONE 32        //   a chain's h is in h_out (share_ffn)
#define SW_WORDS 48
#define SH_ROWS 64          // passes of up to this many rows take a CPU share (longer ones: none)
#define SH_GRID 100         // --cpu-share auto tries the shares k / SH_GRID
#define SH_RETRY 16         // automatic: passes of T rows with T's share turned off by what passes measured,
                            // after which T tries its neighbours' rate again
#define PROF_CATS 11
#define PROF_EVENTS 2048

// A matrix of a unit, for the CPU share: at byte offset `off` of its region, (n_out, n_in) in dtype. A share s is
// that fraction of the bytes of the unit's matrices: the CPU takes whole matrices, the largest first, then the last
// rows of the next that the rest of s pays for (share_fill). Each matrix the CPU has rows of costs a round trip
// (x to the host, its rows back: ~50 us on the H200 machine), so the fewer matrices split, the better: one to four
// a layer, where splitting every matrix took four at any share. This one's CPU part grows from nothing at s = lo
// to all of it at s = hi; rows [0, sp_gpu_rows(s)) are the GPU's and the rest the CPU's: a larger share, fewer GPU
// rows.
typedef struct {
    uint64_t off;
    int64_t n_in, n_out;
    uint32_t dtype;
    double lo, hi;
} sp_mat;
static inline int64_t sp_gpu_rows(const sp_mat *m, double share) {
    double f = share <= m->lo ? 0 : share >= m->hi ? 1 : (share - m->lo) / (m->hi - m->lo);
    return m->n_out - (int64_t)((double)m->n_out * f);
}
// What a ring slot holds of its unit (unit_copy's `from`): nothing yet (SLOT_EMPTY), or the unit split at `share`
// (0: whole; SLOT_SPLIT_AT).
typedef struct {
    int empty;
    double share;
} slot_held;
#define SLOT_EMPTY ((slot_held){.empty = 1})
#define SLOT_SPLIT_AT(f) ((slot_held){.share = (f)})

// Sets lo and hi of a unit's n matrices: the largest first (the earlier on a tie).
void share_fill(sp_mat *mats, int n);
// Bytes of the matrices' rows: all of them, or (share > 0) the CPU's at that share.
uint64_t sp_bytes(const sp_mat *mats, int n, double share);

// The matrices of a layer and of the head (share_split.c): their shapes for the GPU's matmuls, and where a CPU share
// cuts them.
typedef struct {
    sp_mat layer[7];        // a layer's matrices in slab order (fused q|k|v and gate|up: one each)
    int n_layer;
    int gate_up_at, n_gate_up;  // gate|up's index in `layer` and its matrices (fused: 1, else gate and up)
    sp_mat lm_head;         // in its region (the head slab; tied: the embedding table)
} unit_mats;

// Device activations, the KV cache and pinned staging, sized for max_batch rows.
typedef struct {
    float *x, *xb, *delta;  // (max_batch, dim): residual stream, normed input, a block's output (or embeddings
                            // in the weight dtype at the start of a pass)
    float *qkv;             // (max_batch, q_dim + 2 kv_dim)
    float *att;             // (max_batch, q_dim)
    float *ffn;             // (max_batch, 2 hidden)
    float *hb;              // (max_batch, hidden)
    float *logits;          // (GPU_LOGIT_ROWS, vocab)
    float *head_part;       // several GPUs: (GPU_LOGIT_ROWS, its vocab rows), its logits before the gather
    gpu_kv_cache kv;        // keys and values, (n_slots, n_layers, n_kv_heads, max_seq, head_dim) each, of the
                            // options' kv_type (q8: with their scales)
    float *inv_freq;        // (head_dim/2)
    int32_t *pos;           // (max_batch) a prefill's first position; a step's position of each row
    int32_t *kv_slot;       // (2 max_batch) a step's KV slot of each row, then the first key the pass writes there
    dj_pick_args *pick;     // (GPU_LOGIT_ROWS) the draws' arguments (gpu_pick)
    int32_t *counts;        // (vocab) one sampler's window counts, kept in step by the arguments
    int32_t *next;          // (GPU_LOGIT_ROWS) the tokens picked
    void *pick_scratch;     // gpu_pick_scratch(GPU_LOGIT_ROWS)
    uint8_t *h_x;           // pinned (max_batch, dim) f32 bytes: gathered embedding rows as stored
    float *h_logits;        // pinned (GPU_LOGIT_ROWS, vocab)
    int32_t *h_pos, *h_kv_slot;  // pinned (max_batch), (2 max_batch)
    dj_pick_args *h_pick;   // pinned (GPU_LOGIT_ROWS)
    int32_t *h_next;        // pinned (GPU_LOGIT_ROWS)
    const int32_t *counts_of;  // the host counts d_counts copies (a new sampler's are uploaded whole)
} gpu_bufs;

// One streamed copy (seq s lives at [s % n_seq]): where it went and what it cost.
typedef struct {
    cudaEvent_t c0, c1;  // copy start/end (copy stream)
    cudaEvent_t w0, w1;  // wait start/end (compute stream)
    cudaEvent_t e1;      // the unit's kernels done (compute stream)
    uint64_t off;        // ring offset
    uint64_t bytes;      // bytes the copy moved
    int ring_slot;       // the ring slot it went to
    double share;        // the copy left out the CPU's rows at this share (0: the unit is whole on the GPU)
} gpu_seq;

// The copy schedule (stream.c). Streamed copies form one endless sequence (seq s -> unit
// stream_order[s % n_streamed]), so the next pass's first streamed layers are already copying while this pass's
// resident layers, the head and sampling run.
typedef struct {
    rb_plan *plan;
    rb_ring ring;
    uint8_t *d_w;                     // (plan->weight_bytes): resident units, then the ring
    uint64_t head_lm_off;             // lm_head offset inside the head unit on the device
    cudaEvent_t copied[RB_MAX_SLOTS];  // a slot's copy is done (copy stream)
    cudaEvent_t freed[RB_MAX_SLOTS];   // a slot's compute is done (compute stream)
    cudaEvent_t prev_done;            // --sync-copy: everything enqueued on the compute stream so far
    rb_alloc pend;                    // allocated in the ring, copy not issued yet (have_pend)
    int have_pend;
    int64_t issued, computed, harvested;  // streamed seqs: copies issued; computes enqueued; timings read
    int n_seq;                        // records kept, indexed by seq % n_seq
    gpu_seq *seq;                     // (n_seq)
    int64_t pass_T, pass_end;         // the pass running: its tokens; streamed seqs below pass_end are its units
    double pass_share, next_share;    // its CPU share; the one the copies issued ahead for the next pass assume
                                      // (the last pass's of SH_ROWS rows or fewer: the next is most likely alike)
    int warming;                      // in the warm-up: the copies issued ahead for the next pass are whole
    cudaEvent_t p0, p1;               // a pass's start and end on the compute stream
    int64_t pass_first;               // its first streamed seq
    double pass_units_ms;             // its streamed units' time on the compute stream, w0 to e1 (sched_harvest)
} gpu_sched;

// A split's CPU rows, a job of the pool's workers (share.c).
typedef struct {
    int on;                           // started and not joined
    uint64_t bytes[2];                // the weights it reads: a matvec's [0]; a chain's gate|up [0] and down [1]
    int mark[2];                      // their trace marks (-1: none)
    double posted;                    // dj_now when the host queued it
} share_job;

// The CPU share's job channel (share_chan.c). The CPU's rows of a split are a job of the pool's workers
// (cpu_matvec_start), which begin when the GPU says x has landed in h_in and say when their rows are in h_out; the
// GPU's work after the split is queued behind a wait on the GPU for that, and the host goes on queueing meanwhile.
typedef struct {
    float *h_in, *h_out;              // pinned (SH_ROWS, widest input): x for the CPU; (SH_ROWS, widest output): its
    float *d_in, *d_out;              // rows' results; d_in, d_out: their mapped device views
    _Atomic uint32_t *h_words;        // pinned, mapped: [SW_X_LANDED] the last job whose x has landed (the GPU writes
    uint32_t *d_words;                // it), [SW_ROWS_DONE] the last whose rows are in h_out, [SW_H_DONE] the last
                                      // chain's h (the CPU writes them)
    uint32_t jobs;                    // the number of the last job queued
    unsigned *d_count;                // gpu_to_host's block count
    share_job job;                    // the job queued (on) or the last computed
    struct cpu_job *work;             // the workers' state of that job (cpu.h), kept from share_init to share_free
} share_chan;

// --cpu-share auto (share_auto.c): the model's terms and what the passes taught it.
typedef struct {
    int automatic;
    // the CPU's rate (GB/s of weights) for T rows: measured alone at set-up, and within passes (0: not yet)
    double rate_alone[SH_ROWS + 1], rate_in_passes[SH_ROWS + 1];
    int off_passes[SH_ROWS + 1];                  // passes of T rows since T's share went off
    double m_streamed, m_layers, m_head, m_link;  // bytes streamed a pass, the layers and heads among its units, GB/s
    double grid_trips[SH_GRID], grid_io[SH_GRID];  // a pass's round trips and their PCIe bytes a row, at k / SH_GRID
    // a pass of T rows' time on the compute stream outside its streamed units (the resident units, the head's
    // kernels when resident, the gathers; 0: not measured yet), learnt like rate_in_passes
    double outside_s[SH_ROWS + 1];
} share_tuner;

// The CPU share (share.c): in a pass of up to SH_ROWS rows the CPU computes a fraction of every streamed unit's
// matrices (share_fill) from host memory (cpu_matvec_multi) while the GPU computes the rest; those rows never cross
// PCIe. The fraction depends on the pass's rows: the CPU's part of a matmul grows with them, the link's does not.
typedef struct {
    double share;                     // the fraction of a one-row pass (the decode step); 0: off
    double by_rows[SH_ROWS + 1];      // the fraction of a pass of T rows, T = 1..max_rows
    int64_t max_rows;                 // SH_ROWS, or max_batch when smaller
    uint64_t part_bytes[2], cpu_bytes[2];  // a layer [0], the head [1]: bytes a decode copy moves; the CPU's
    share_chan chan;                  // x to the CPU, its rows back
    float *d_gpu_part;                // (SH_ROWS, widest output): the GPU's rows of a split over several rows
    uint64_t chains;                  // share_ffn's jobs so far
    double warm_h2d;                  // GB/s of the warm-up's copies (the automatic share's H2D rate)
    share_tuner tune;                 // --cpu-share auto
    // the pass running: its CPU time on its rows and waiting for x, the bytes they read, its time outside its
    // streamed units (share_learn puts them into the stats, and the tuner learns from them)
    double pass_cpu_s, pass_wait_s;
    uint64_t pass_cpu_bytes;
    double pass_outside_s;
} gpu_share;

// DJINN_PROFILE=1: events between the kernels of each layer, summed per phase (prefill and decode apart) and
// printed when the state is freed. Off by default: the events cost a little and block graphs.
typedef struct {
    int on, n;
    cudaEvent_t ev[PROF_EVENTS];
    int cat[PROF_EVENTS];
    double ms[2][PROF_CATS];
    int64_t passes[2];
} gpu_prof;

// KV slots parked in host memory (park.c): their copies run on a stream of their own, ordered with the compute
// stream by events, so that neither the host nor the weight copies wait for them.
typedef struct gpu_parking gpu_parking;

// Probes (probe_gpu.c, probe.h): the control vectors on the device, the rows of a dumped layer on their way back.
typedef struct {
    dj_probe *p;            // NULL: none
    float *d_vec;           // (n_layers, dim): the vector added after each steered layer
    uint8_t *steered;       // (n_layers) host: that layer has one
    float *h_rows;          // pinned (max_batch, dim): a dumped layer's rows
    int64_t *pos;           // (max_batch) host: their positions
    int32_t *kv_slot;       // (max_batch) host: their KV slots
} gpu_probe;

// A unit's weights for a pass (unit_begin): on the device, and where the CPU share splits it, the split.
typedef struct {
    const uint8_t *w;     // its slab on the device
    const uint8_t *host;  // split with the CPU: its slab in host memory (the CPU's rows); NULL: all on the GPU
    double share;         // the split's share (share_fill's), where host is set
} gpu_unit;

// A run of a step pass: rows r0 .. r0+len-1 are consecutive positions of one slot (a prompt's chunk), attending
// with the prefill kernel.
typedef struct {
    int64_t r0, len;
    int32_t kv_slot;
} step_run;

// What a pass gives back for the rows it would return logits of: their tokens, picked where the logits are.
typedef struct {
    const dj_pick_args *args;  // (the rows wanted)
    const int32_t *counts;     // one row's sampler's (vocab); NULL when no penalty is on (always, for several rows)
    int32_t *next;             // (the rows wanted)
} pick_req;

// A pass's inputs (gpu.c's forward and step_pass make one), handed to the pass, the layers and the head. The
// caller stages its positions in b.h_pos and, a step's, its KV slots in b.h_kv_slot.
typedef struct {
    const int32_t *tokens;  // (T)
    int64_t T;              // rows, <= max_batch
    int step;               // each row at its own position of its own KV slot (b.pos[r], b.kv_slot[r]); else a
                            // prefill: positions b.pos[r] = b.pos[0] + r of kv_slot
    int32_t kv_slot;        // a prefill's
    int64_t singles;        // a step: rows [0, singles) attend alone (decode kernel), then
    int64_t n_runs;         //   runs[0, n_runs) (each as a prefill of its rows: gpu.c's attention())
    const step_run *runs;
    float *logits;          // (logit_end - logit_first, vocab) of rows [logit_first, logit_end); NULL: none
    int64_t logit_first, logit_end;  // end <= first: no row wanted
    const pick_req *pick;   // instead of logits: the wanted rows' tokens, picked on the GPU
} pass_desc;

struct dj_gpu_state {
    const dj_model *m;
    dj_gpu_opts opts;
    dj_gpu *g;
    cudaStream_t compute, copy;
    int fused_qkv, fused_gate_up;  // wq|wk|wv and w_gate|w_up adjacent in the slab: one matmul each
    int tc_attn;                   // prefill attention on the tensor cores (head_dim allows, no fma_attn)
    int64_t max_seq, max_batch;
    int32_t n_slots;               // KV slots, slot_elems elements apart in b.kv
    int64_t slot_elems;
    // host scratch of gpu_step_rows: a step pass's runs, tokens in the pass's order, the wanted rows; whether a run
    // of each KV slot has begun; each slot's first position in the pass (step_fresh)
    step_run *runs;                // (max_batch)
    int32_t *step_tok, *slot_began, *slot_first;  // (max_batch), (n_slots), (n_slots)
    uint8_t *step_wanted;          // (max_batch)
    gpu_parking *park;
    gpu_bufs b;
    unit_mats mats;
    gpu_sched sc;
    gpu_share sh;
    int head_split;                // several GPUs: each computes its vocab rows' logits (tp_head_agree); else the
                                   // first GPU computes the whole head
    cudaGraphExec_t graph;         // the all-resident decode step, captured on first use
    // the all-resident step of T decoding rows (T <= GPU_LOGIT_ROWS), captured at its second pass (the first runs
    // kernel by kernel: each kernel's module and set-up loaded outside a capture)
    cudaGraphExec_t row_graph[GPU_LOGIT_ROWS + 1];
    uint8_t row_graph_seen[GPU_LOGIT_ROWS + 1];
    // the all-resident pass of T rows of one slot wanting every row's logits (speculative verification), captured
    // the same way, for the slot it was captured on (the slot's cache offset is in its kernels' arguments)
    cudaGraphExec_t run_graph[GPU_LOGIT_ROWS + 1];
    int32_t run_graph_slot[GPU_LOGIT_ROWS + 1];  // the slot run_graph[T] serves, or was last seen with
    uint8_t run_graph_seen[GPU_LOGIT_ROWS + 1];
    dj_gpu_stats st;
    gpu_prof prof;
    gpu_probe pr;
    dj_trace *tr;                  // --trace (trace.h); NULL: off, or its file written
};

// ---- stream.c: the copy schedule
// Bytes of unit u (a layer, or the head: its slab, and for a tied model the embedding table after it as the
// lm_head, whose offset goes to *lm_off).
uint64_t unit_bytes(const dj_model *m, int u, uint64_t *lm_off);
// Unit u host -> device at dst on stream st, so that a ring slot holding `from` of it holds it split at `to` (<=
// from's share; 0: whole): the GPU's rows at `to` it lacks, and from an empty slot everything outside the matrices.
// *bytes += the bytes moved.
int unit_copy(dj_gpu_state *s, int u, uint8_t *dst, cudaStream_t st, slot_held from, double to, uint64_t *bytes,
              dj_err *e);
int sched_init(dj_gpu_state *s, dj_err *e);  // the ring and its events; nothing when no unit streams
void sched_free(dj_gpu_state *s);
void sched_pass_begin(dj_gpu_state *s, int64_t T);  // a pass of T tokens starts
// Unit u's weights for this pass (a streamed unit: the compute stream waits for its copy) and its split with the CPU;
// unit_end after its kernels releases a streamed unit's slot and issues the copies that were waiting for it.
int unit_begin(dj_gpu_state *s, int u, gpu_unit *un, dj_err *e);
int unit_end(dj_gpu_state *s, int u, dj_err *e);
int sched_harvest(dj_gpu_state *s, dj_err *e);  // after the pass's last sync: copy and wait times into s->st
// After sched_harvest, with p0 and p1 recorded around the pass: its time outside its streamed units, in seconds.
int sched_pass_outside(dj_gpu_state *s, double *outside_s, dj_err *e);

// ---- gpu.c
int kv_slot_ok(const dj_gpu_state *s, int32_t slot, dj_err *e);  // slot names one of the engine's KV slots
void graphs_drop(dj_gpu_state *s);  // the captured steps go (captured again at their next passes)

// ---- park.c: parking
int park_init(dj_gpu_state *s, dj_err *e);
void park_free(dj_gpu_state *s);
// Before the compute stream next writes or reads `slot`: it waits for the slot's pending park or restore copies.
int park_order(dj_gpu_state *s, int32_t slot, dj_err *e);
void park_stats(dj_gpu_state *s);  // the finished copies' bytes and times into s->st

// ---- share_split.c: the CPU share's geometry
void share_split(dj_gpu_state *s, double share);  // the matrices; `share` for every pass of up to SH_ROWS rows
double share_for(const dj_gpu_state *s, int64_t T);  // the share of a pass of T rows (0: none)
void share_rates(dj_gpu_state *s);                // after by_rows changed: the one-row share and its bytes
void share_stats(dj_gpu_state *s);                // bytes per decode token over PCIe and read by the CPU
// Whether the CPU has every row of gate and up at `share`: the MLP block is then share_ffn's.
int share_chain(const unit_mats *um, double share);

// ---- share_chan.c: the CPU share's job channel
uint64_t share_device_bytes(const dj_gpu_state *s);  // GPU memory share_init will take (opts.cpu_share != 0)
int share_init(dj_gpu_state *s, dj_err *e);       // the channel's pinned buffers and words, the GPU rows' buffer
void share_free(dj_gpu_state *s);
// The job before first (h_in, h_out and the pool are taken again), then x (T, n_in) to h_in for job `seq`; `mat`:
// the matrix in its unit (the trace's label).
int share_send_x(dj_gpu_state *s, const float *x, int64_t T, int64_t n_in, int mat, uint32_t seq, dj_err *e);
// The queued split's CPU rows done (the caller joins the workers; none queued: nothing). Every wait of the host
// on the compute stream within a pass comes after it: the stream waits for those rows.
int share_flush(dj_gpu_state *s, dj_err *e);
// share_flush where a launch may block the host because a kernel is not loaded yet (gpu_kernels_loaded): no job may
// wait then.
int share_flush_if_loading(dj_gpu_state *s, dj_err *e);
void share_release(dj_gpu_state *s);  // a failed pass: the queued job ended whether x came or not (rows garbage)

// ---- share.c: the CPU share's split matmuls
// y (T, n_out) = x (T, n_in) . W^T, T <= SH_ROWS, split at `share`: rows [0, sp_gpu_rows) by the GPU from w, the
// rest by the CPU from hw.
int share_matmul(dj_gpu_state *s, float *y, const float *x, int64_t T, const uint8_t *w, const uint8_t *hw,
                 const sp_mat *mt, double share, dj_err *e);
// y (T, dim) = down . (silu(gate . x) * (up . x)), the CPU's job computing all of gate and up and its rows of down,
// the GPU the rest of down over h, which it gets in hb (T, hid); un: the layer, split.
int share_ffn(dj_gpu_state *s, float *y, float *hb, const float *x, int64_t T, const gpu_unit *un, dj_err *e);

// ---- share_auto.c: the automatic share's tuner
void share_auto(dj_gpu_state *s);                 // --cpu-share auto, after the warm-up measured the copies
void share_pass_begin(gpu_share *sh);             // a pass starts: its measures from zero
void share_learn(dj_gpu_state *s, int64_t T);     // after a pass of T rows: its CPU time into the stats (and auto)
// by_rows[T] from the tuner's rates, round trips and the pass's time outside its streamed units (share_auto's model;
// no GPU needed)
void share_model(gpu_share *sh, int64_t T);

// ---- probe_gpu.c: probes
// After layer l of the pass pd (its output still in d_delta, *pending): the layer's control vector added to the
// residual stream, which then holds the add (*pending = 0), and its rows dumped (the compute stream waits for them).
int gpu_probe_layer(dj_gpu_state *s, const pass_desc *pd, int l, int *pending, dj_err *e);
int gpu_probe_graphable(const dj_gpu_state *s);  // the decode graph can hold the probes: none dumps
void gpu_probe_free(dj_gpu_state *s);

#endif
