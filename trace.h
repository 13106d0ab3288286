// trace.h: the timeline of a few decode steps of the GPU engine (djinn --trace FILE): what the copy stream, the
// compute stream and the CPU share did, as intervals in milliseconds from one origin, written as JSON that
// bench/timeline.py draws, and a line of figures per step on stderr. Off, the engine's tracer is NULL and each hook
// below is one branch on it.
//
// The origin: at the first decode step (a pass of one row) after set-up, both streams are synchronised, then one
// event is recorded on the compute stream and waited for, and the host's clock read at once (the origin of the CPU's
// intervals: a few microseconds late at most). That step is not recorded: its copies, issued ahead, began before
// the origin, and the synchronisation slowed it. The next `steps` decode steps are, every event of their work recorded
// after the origin (copies too, but where the ring holds more than a pass: the first step's copies issued before the
// origin were done before it, at negative times); then, of the pass after them, the copies that ran ahead during the
// last step (they fill its copy lane). Events are read after each pass's final synchronisation (cudaEventElapsedTime
// from the origin, or to it for the copies that went before it).
//
// The intervals ("lane" and "kind" in the JSON):
//   copy     copy    a streamed unit's H2D copy (stream.c's events around it): unit, bytes
//   compute  wait    the compute stream stalled for a unit's copy (stream.c's events around the wait)
//            unit    a unit's work, from after its wait to after its last kernel (a layer; the head: the final norm,
//                    the lm_head, the pick or the logits' copy back)
//            split   a split matmul (share.c): from x leaving for the host, through the GPU's rows ("mid"), to the
//                    CPU's rows placed in the output; after mid the stream idles until the CPU is done
//   cpu      wait_x  the host waiting for a split's x
//            rows    the CPU share's threads computing the CPU's rows: bytes of weights read
// The units: 0 .. n_layers - 1 the layers, n_layers the head.
#ifndef DJINN_TRACE_H
#define DJINN_TRACE_H

#include <stdint.h>

#ifndef DJINN_NO_GPU  // a build without CUDA (gpu_host.h) keeps only the constants: djinn's --trace-steps
#include <cuda_runtime_api.h>
#endif

#include "buf.h"
#include "util.h"

#define TRACE_STEPS_DEFAULT 4
#define TRACE_STEPS_MAX 64

typedef struct dj_trace dj_trace;

typedef enum { TR_COPY, TR_WAIT, TR_UNIT, TR_SPLIT, TR_WAIT_X, TR_ROWS } tr_kind;

typedef struct {
    tr_kind kind;
    int step;        // 1.. (the pass after the last step: steps + 1, copies only)
    int unit;        // a layer, or n_layers: the head
    int mat;         // split, wait_x, rows: the matrix's index in its unit (share.c's order: q|k|v or q, k, v, wo,
                     // gate|up or gate, up, down; the head's lm_head 0); else -1
    double t0, t1;   // ms from the origin
    double mid;      // split: the GPU's rows done (ms)
    uint64_t bytes;  // copy: bytes copied; rows: bytes of weights the CPU read
} tr_span;

// The engine the trace describes (written at the top of the file).
typedef struct {
    const char *device;
    const char *dtype;                // the weights'
    int n_layers;
    const uint8_t *resident;          // (n_layers + 1): the unit stays on the GPU
    double cpu_share;                 // the decode share at set-up (0: off)
    uint64_t bytes_per_token;         // a decode step's bytes over PCIe at that share
    uint64_t cpu_bytes_per_token;     // and read by the CPU
} tr_info;

// One step's figures (trace_summary): ms from the origin and durations in ms.
typedef struct {
    int step;
    double t0, t1, ms;        // the step: its first event to the head's last
    uint64_t copy_bytes;      // its streamed units' copies
    double copy_gbs;          // their bytes over their time (the link while it copies)
    double copy_busy;         // the fraction of the step the copy stream was copying (any step's copies)
    double wait_ms;           // the compute stream stalled for copies
    uint64_t cpu_bytes;       // weights the CPU computed with
    double cpu_busy;          // the fraction of the step the CPU computed its rows
    double cpu_wait_ms;       // the host waited for x
    double gpu_waits_cpu_ms;  // the compute stream idle after the GPU's rows of a split (the place kernel included)
    double weights_gbs;       // (copy_bytes + cpu_bytes) / ms: the streamed weights' rate
} tr_step;

// ---- the record: spans and step windows in host memory, the summary, the JSON (pure, no GPU)
dj_trace *trace_new(const tr_info *in, int steps, dj_err *e);  // steps: 1..TRACE_STEPS_MAX decode steps to record
void trace_free(dj_trace *t);                                  // NULL is fine; abandons an unwritten file
int trace_add(dj_trace *t, const tr_span *s, dj_err *e);
int trace_window(dj_trace *t, int step, double t0, double t1, dj_err *e);  // step k (1..) spans [t0, t1]
int trace_steps(const dj_trace *t);                                         // the windows so far
void trace_summary(const dj_trace *t, int k, tr_step *out);                 // window k (0..)
int trace_json(const dj_trace *t, dj_buf *b);  // the file's text: -1 out of memory

// ---- the engine's side
#ifndef DJINN_NO_GPU
// A tracer of `steps` decode steps into `path` (created now as PATH.tmp, renamed when written: fileio.h) for the
// engine's two streams; quiet: no summary on stderr.
dj_trace *trace_open(const char *path, int steps, const tr_info *in, cudaStream_t compute, cudaStream_t copy,
                     int quiet, dj_err *e);
// Writes the file with what was recorded (fewer steps than asked when the run ended first: "complete": false) if
// it is not written yet. 0 when there was nothing to write.
int trace_close(dj_trace *t, dj_err *e);
int trace_done(const dj_trace *t);  // the file is written: the engine may free the tracer

int trace_pass_begin_(dj_trace *t, int64_t T, int64_t issued, dj_err *e);
int trace_unit_(dj_trace *t, int unit, int end, dj_err *e);
int trace_split_(dj_trace *t, int mat, int stage, dj_err *e);
int trace_split_placed_(dj_trace *t, int mat, int *mark, dj_err *e);
int trace_split_times_(dj_trace *t, int mark, double h0, double h1, double h2, uint64_t bytes, dj_err *e);
int trace_copy_(dj_trace *t, int64_t seq, int unit, uint64_t bytes, cudaEvent_t c0, cudaEvent_t c1, cudaEvent_t w0,
                cudaEvent_t w1, dj_err *e);
int trace_pass_end_(dj_trace *t, dj_err *e);

// The hooks: each a branch on the tracer when off.
// A pass of T rows begins (gpu_pass, before anything of it is enqueued); `issued`: the copies issued so far (stream.c's
// seqs).
static inline int trace_pass_begin(dj_trace *t, int64_t T, int64_t issued, dj_err *e) {
    return t ? trace_pass_begin_(t, T, issued, e) : 0;
}
// Unit u's work begins on the compute stream (after its wait), or ends (end: after its last kernel).
static inline int trace_unit(dj_trace *t, int u, int end, dj_err *e) { return t ? trace_unit_(t, u, end, e) : 0; }
// A split matmul of the unit's matrix `mat`: stage 0 before x leaves for the host, 1 after the GPU's rows.
static inline int trace_split(dj_trace *t, int mat, int stage, dj_err *e) {
    return t ? trace_split_(t, mat, stage, e) : 0;
}
// The split's end, queued after the placing of the CPU's rows; *mark: its mark, for trace_split_times (-1: none).
static inline int trace_split_placed(dj_trace *t, int mat, int *mark, dj_err *e) {
    *mark = -1;
    return t ? trace_split_placed_(t, mat, mark, e) : 0;
}
// The CPU's side of the split whose end is `mark`, once computed: the host's clock (dj_now) when it began waiting
// for x (h0), when x had landed (h1) and when its rows were done (h2); bytes of weights it read.
static inline int trace_split_times(dj_trace *t, int mark, double h0, double h1, double h2, uint64_t bytes,
                                    dj_err *e) {
    return t ? trace_split_times_(t, mark, h0, h1, h2, bytes, e) : 0;
}
// A streamed unit's copy (stream.c's seq) and its wait, read after the pass that computed the unit (sched_harvest).
static inline int trace_copy(dj_trace *t, int64_t seq, int unit, uint64_t bytes, cudaEvent_t c0, cudaEvent_t c1,
                             cudaEvent_t w0, cudaEvent_t w1, dj_err *e) {
    return t ? trace_copy_(t, seq, unit, bytes, c0, c1, w0, w1, e) : 0;
}
// After the pass's final synchronisation and the copies' harvest: its marks read; the file written after the last.
static inline int trace_pass_end(dj_trace *t, dj_err *e) { return t ? trace_pass_end_(t, e) : 0; }

#endif  // DJINN_NO_GPU

#endif
