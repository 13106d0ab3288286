// tp_link.h: the GPUs of one tensor-parallel engine (issue 48, docs/multigpu.md) meeting twice a layer. Each GPU runs
// its part of the model (tp_shard_model) in a thread of its own; after wo and after w_down each writes its partial
// output to tp_part and calls tp_allreduce, which adds every GPU's partial in GPU order into its delta (every GPU
// the same bits, so the residual streams stay equal). The GPUs exchange their partials on the device (each pushes
// its partial and a flag into the others' memory by peer access); one GPU's failure raises an abort word that ends
// every wait (tp_fail). The host threads meet only at the set-up (a barrier one failure breaks for all), which takes
// turns (tp_turn_*) so that GPUs sharing a device size their memory one after the other.
#ifndef DJINN_TP_LINK_H
#define DJINN_TP_LINK_H

#include <stdint.h>

#include "kernels.h"
#include "tp.h"

typedef struct tp_link tp_link;

// n GPUs, GPU r on devices[r] (a device may repeat: two parts on one device stand in for two devices in tests).
tp_link *tp_link_new(int n, const int *devices, dj_err *e);
void tp_link_free(tp_link *l);  // after every GPU's thread has left it; NULL is fine
// In GPU r's thread, its device current: its partial buffers (2 x max_rows x dim f32), its inboxes for the others'
// partials and its flags and counts (or, parts sharing a device, events), its vocab rows (tp_plan's: the head
// split); then, once every GPU has joined, peer access to the others' devices.
int tp_link_join(tp_link *l, int rank, int64_t max_rows, int64_t dim, tp_range vocab_rows, dj_err *e);
// Where GPU r's matmul writes its partial for its next all-reduce.
float *tp_part(tp_link *l, int rank);
// GPU r's partial (n floats at tp_part, written on stream s) summed with every GPU's, in GPU order, into out, on s:
// the GPUs exchange on the device (no host wait), so it may be captured in a graph. A pass begins at tp_pass_begin.
int tp_allreduce(tp_link *l, int rank, float *out, int64_t n, cudaStream_t s, dj_err *e);
// Every GPU's thread here, or -1 ("another GPU's pass failed") once one failed.
int tp_barrier(tp_link *l, dj_err *e);
void tp_fail(tp_link *l);   // a GPU's call failed: every barrier fails until tp_reset
void tp_reset(tp_link *l);  // between calls (every thread idle): the failure forgotten, the partials' parity reset
// After a failure, in GPU r's thread, once every GPU's device is drained (an exchange waiting gives up on tp_fail's
// abort): its counts of exchanges and the flags the others raise in its memory zeroed, so that the GPUs count their
// exchanges from the same start again (then tp_reset).
int tp_rejoin(tp_link *l, int rank, dj_err *e);
// Whether a GPU's exchange gave up (abort or timeout) since tp_reset: the call's sums are not to be trusted.
int tp_gave_up(const tp_link *l);
void tp_pass_begin(tp_link *l, int rank);  // GPU r's pass begins: its all-reduces count from parity 0
// Whether a pass may be one CUDA graph: the GPUs exchange on the device (not where parts share a device: tp_allreduce).
int tp_graphable(const tp_link *l);
// The head split by vocab rows (docs/multigpu.md), decided once at set-up: GPU r says whether it can split its head
// for the engine's life (`can`: no CPU share can take part of it) and, GPU 0, where its logits (rows, vocab) live;
// once every GPU has said: 1 (the split) where every one can and the GPUs are devices of their own (the gather spins
// on the device, as the exchange does), else 0 (GPU 0 computes the whole head); -1 if a GPU failed. The same verdict
// on every GPU; tp_head_split gives it afterwards.
int tp_head_agree(tp_link *l, int rank, int can, float *logits, dj_err *e);
int tp_head_split(const tp_link *l);
tp_range tp_vocab_rows(const tp_link *l, int rank);  // GPU r's rows of lm_head
// GPU r's logits of its vocab rows (rows, its count of them, compact at mine, written on s) into GPU 0's logits at its
// columns; on GPU 0 the stream then waits for every GPU's (gpu_tp_gather). On the device, so a graph may hold it;
// every GPU gathers the same rows in the same order.
int tp_head_gather(tp_link *l, int rank, const float *mine, int64_t rows, cudaStream_t s, dj_err *e);
// The set-up's turn: GPU r's begins once GPUs 0..r-1 ended theirs (-1 if one failed); tp_turn_sharers is how many
// GPUs from r on share r's device (the automatic weight budget divides what is free among them).
int tp_turn_begin(tp_link *l, int rank, dj_err *e);
void tp_turn_end(tp_link *l, int rank);
int tp_turn_sharers(const tp_link *l, int rank);

#endif
