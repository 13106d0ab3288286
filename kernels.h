// kernels.h: every GPU kernel and the cuBLAS calls behind a plain C API. Implemented by kernels.cu (the runtime:
// context, memory, copies, streams, events, graphs) and one file per op family beside it: ops.cu (widening,
// norms, RoPE, KV writes, SwiGLU), matmul.cu (GEMV and cuBLAS GEMM), attention.cu (prefill and decode) and
// sample.cu (argmax, top-p); kernels_impl.h is their private header.
//
// Conventions
// - Activations on the GPU are f32: residual stream, q/k/v, attention output, logits. Matrices stay in the
//   model's wtype (DJ_F32/DJ_F16/DJ_BF16/DJ_Q8/DJ_Q4 from model.h); arithmetic accumulates in fp32.
// - Pointers named d_* or documented as device live in GPU memory; sizes and counts are int64_t.
// - Every function that can fail takes a dj_err* and returns 0, or -1 with one line such as
//   "cuda: cudaMalloc(...) failed at kernels.cu:123: cudaErrorMemoryAllocation (out of memory)".
//   Kernel launches are checked with cudaGetLastError(); a build with -DDJINN_DEBUG also synchronises the
//   stream after every launch (outside graph capture) so an asynchronous fault names its kernel.
// - Positions come from device memory (const int32_t *d_pos, one int: the position of the first token),
//   so a decode step can be captured once as a CUDA graph and replayed with only *d_pos changing.
//   Kernels never write outside the KV cache: positions >= max_seq are clamped/skipped, so the caller must
//   check pos + T <= max_seq on the host.
// - KV cache, per layer: k_cache, v_cache each (n_kv_heads, max_seq, head_dim) f32, the layout of
//   cpu_attention. f32 keeps attention exact against the CPU reference and needs no conversion on write;
//   it costs twice the memory and decode bandwidth of f16 (a later change can store the weight dtype).
// - A dj_gpu serves one compute stream at a time: its scratch buffer (f16/bf16 copies of x for cuBLAS,
//   split-KV partials for decode attention) is reused by successive calls in stream order.
#ifndef DJINN_KERNELS_H
#define DJINN_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {  // util.h has no C++ guard of its own; its system headers are already included above
#endif

#include "gpu_host.h"  // gpu_count, gpu_host_register, gpu_host_unregister
#include "kvtype.h"
#include "sampler.h"
#include "util.h"

// ---- context: device, cuBLAS handle, workspace and scratch
typedef struct dj_gpu dj_gpu;

// Selects `device`, creates the cuBLAS handle and a 32 MiB cuBLAS workspace, and raises the shared-memory
// limit of the attention kernels.
int gpu_open(dj_gpu **out, int device, dj_err *e);
void gpu_close(dj_gpu *g);  // NULL is fine
// One line naming the device: "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB".
const char *gpu_name(const dj_gpu *g);
// Every kernel of Djinn's was loaded at gpu_open (kernels.cu): the host may keep a stream waiting on the GPU for
// it while it launches more. 0 with a driver older than CUDA 12.4's entry points.
int gpu_kernels_loaded(const dj_gpu *g);
// release(ctx, e) runs before any call that may block the host on the device (cuBLAS's first launches, the
// scratch's growth): the stream must not be waiting for the host then. NULL: none.
void gpu_set_hold(dj_gpu *g, int (*release)(void *ctx, dj_err *e), void *ctx);
// Grows the scratch buffer to at least `bytes` (synchronises the device when it grows). Call it before a
// graph capture with the largest of gpu_matmul_scratch / gpu_attention_scratch the captured calls need:
// growing inside a capture is refused with an error.
int gpu_reserve(dj_gpu *g, size_t bytes, dj_err *e);
size_t gpu_matmul_scratch(uint32_t wtype, int64_t T, int64_t n_in);          // bytes gpu_matmul needs
size_t gpu_attention_scratch(int64_t rows, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             int64_t max_seq);  // decode's, for any launch of up to `rows` rows

// ---- memory
// cudaMalloc; on failure the message names `what`, the size, and the free/total device memory.
int gpu_malloc(void **p, size_t bytes, const char *what, dj_err *e);
void gpu_free(void *p);  // NULL is fine
int gpu_memset(void *p, int byte, size_t bytes, cudaStream_t s, dj_err *e);  // async on s
// Copies: the *_async ones are ordered on s (and truly asynchronous only for pinned host memory);
// the others are synchronous (the data has landed when they return) and ordered after nothing: call
// gpu_stream_sync first when a stream is still writing what gpu_d2h reads.
int gpu_h2d(void *dst, const void *src, size_t bytes, dj_err *e);
int gpu_d2h(void *dst, const void *src, size_t bytes, dj_err *e);
int gpu_h2d_async(void *dst, const void *src, size_t bytes, cudaStream_t s, dj_err *e);
int gpu_d2h_async(void *dst, const void *src, size_t bytes, cudaStream_t s, dj_err *e);
// `height` rows of `width` bytes, spitch bytes apart at src and dpitch apart at dst, either way between host and
// device (the direction from the pointers), ordered on s.
int gpu_copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                     cudaStream_t s, dj_err *e);
// Page-locked host memory for the streaming ring: cudaHostAlloc (portable, mapped); the loader's registration of
// existing memory is in gpu_host.h. gpu_host_device_ptr: the address kernels use to read or write gpu_host_alloc's
// memory directly over PCIe.
int gpu_host_alloc(void **p, size_t bytes, const char *what, dj_err *e);
int gpu_host_device_ptr(void **dev, void *host, dj_err *e);
void gpu_host_free(void *p);  // NULL is fine

// ---- streams, events, graphs
int gpu_stream_create(cudaStream_t *s, dj_err *e);  // non-blocking with respect to the legacy stream
void gpu_stream_destroy(cudaStream_t s);
int gpu_stream_sync(cudaStream_t s, dj_err *e);
int gpu_event_create(cudaEvent_t *ev, int timing, dj_err *e);  // timing 0: cheaper, no elapsed time
void gpu_event_destroy(cudaEvent_t ev);
int gpu_event_record(cudaEvent_t ev, cudaStream_t s, dj_err *e);
int gpu_stream_wait(cudaStream_t s, cudaEvent_t ev, dj_err *e);  // s waits for ev (no host block)
int gpu_event_sync(cudaEvent_t ev, dj_err *e);
int gpu_event_ms(float *ms, cudaEvent_t start, cudaEvent_t end, dj_err *e);
// Several devices (tp_link.c): the calling thread's device; device `peer`'s memory readable by the current one's
// kernels (cudaDeviceEnablePeerAccess; already enabled is fine), refused by name where the pair has no peer access;
// everything issued to the current device finished.
int gpu_set_device(int device, dj_err *e);
int gpu_peer_enable(int peer, dj_err *e);
int gpu_device_sync(dj_err *e);
int gpu_clock_khz(int *khz, dj_err *e);  // the current device's SM clock (cudaDevAttrClockRate)
// Capture the work issued on s into a graph (thread-local capture mode), instantiate it, replay it.
int gpu_graph_begin(cudaStream_t s, dj_err *e);
int gpu_graph_end(cudaStream_t s, cudaGraphExec_t *exec, dj_err *e);
int gpu_graph_launch(cudaGraphExec_t exec, cudaStream_t s, dj_err *e);
void gpu_graph_destroy(cudaGraphExec_t exec);

// ---- matmul: y (T, n_out) f32 = x (T, n_in) f32 . W^T, W (n_out, n_in) row-major in wtype
// GPU_MM_AUTO: our GEMV for T == 1 (reads W once with 16-byte loads, fp32 accumulation; the decode path),
// cublasGemmEx for T > 1. The cuBLAS path, f16/bf16: x is rounded to wtype in scratch and multiplied on the
// tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F), output f32; for bf16, whose 8-bit significand
// alone puts whole-model logits ~2e-2 off, x is split into bf16 hi + lo and multiplied twice. f32 weights use CUBLAS_COMPUTE_32F
// with the default math mode, which is plain fp32, not TF32: it keeps the f32 path within ~1e-5 of the CPU.
// The GEMV reads W once per 4 rows of x, so it is also correct (if slower) for any T.
// q8 and q4 (model.h; rows dj_row_bytes apart): the GEMV sums k times x quantized per group of 32 in two int8 parts
// (where gpu_fused_ok; elsewhere exactly scale * k in fp32), up to 8 tokens of x for each read of W; the cuBLAS
// path dequantizes rows to f16 in scratch, a chunk of about 64 MiB at a time, and multiplies each chunk as f16
// weights (x rounded to f16).
// GPU_MM_QGEMM (qgemm.cu), q8 and q4 only: the stored values straight into shared memory, widened in registers to
// the same f16 values the dequantizing path writes (scale * k rounded once) and multiplied on the tensor cores with
// x rounded to f16 and fp32 accumulation; no f16 copy of W. GPU_MM_AUTO takes it where gpu_qgemm_wins, except for
// passes of a few tokens, which the GEMV takes (one read of W), and the few tokens past the kernel's last whole
// block of a longer pass, which the GEMV takes too where the kernel would pad a block for them.
// GPU_MM_ROWS (dense_rows.cu), f16 and bf16 only, 2 to 16 tokens with n_in a multiple of 8: x rounded as the cuBLAS
// path rounds it, each weight read once into the mma's registers (bf16: multiplied with x's hi and lo parts alike,
// where cuBLAS reads W twice); GPU_MM_AUTO takes it for bf16 passes of those tokens.
enum gpu_mm_path { GPU_MM_AUTO = 0, GPU_MM_GEMV = 1, GPU_MM_CUBLAS = 2, GPU_MM_QGEMM = 3, GPU_MM_ROWS = 4 };
int gpu_matmul(dj_gpu *g, float *y, const float *x, const void *w, uint32_t wtype, int64_t T, int64_t n_in,
               int64_t n_out, cudaStream_t s, dj_err *e);
int gpu_matmul_path(dj_gpu *g, int path, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                    int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);

// GPU_MM_ROWS with its inputs cut in `slices` slices summed in order (0: chosen by the shape, as gpu_matmul does):
// for the tests and bench/drow_bench.cu.
int gpu_matmul_rows(dj_gpu *g, int slices, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                    int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);

// Whether GPU_MM_QGEMM takes this product: q8/q4 W 16-byte aligned (model.bin's rows always are).
int gpu_qgemm_ok(uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out);
// Whether it is also the faster path (qgemm.cu: on Hopper 2..1024 tokens in q8, 2..2048 in q4; elsewhere 2..128 tokens
// and enough rows to fill the device).
int gpu_qgemm_wins(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out);
// GPU_MM_QGEMM with tile shape `variant` (qgemm.cu's QGEMM_VARIANTS and QGEMM_WG_VARIANTS; -1: chosen by T and the
// shape, as gpu_matmul does): for bench/qgemm_bench.cu, which measures the shapes.
int gpu_qgemm_variant(dj_gpu *g, int variant, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
                      int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);
// y (T, n_out) = (silu(gate) * up) . W^T on GPU_MM_QGEMM (gate and up rows ld floats apart): gpu_swiglu and
// gpu_matmul in one, the same floats, where the qgemm kernels take the product (gpu_qgemm_wins). x is computed as it
// is rounded to f16 for the kernels: no f32 copy is written and read back (the 8B down projection at 512 tokens:
// 58 MB less traffic). PRECOND-checked: gpu_qgemm_ok, ld >= n_in.
int gpu_swiglu_qgemm(dj_gpu *g, float *y, const float *gate, const float *up, int64_t ld, const void *w,
                     uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);
size_t gpu_qgemm_scratch(int64_t T, int64_t n_in);  // bytes of scratch it needs: x in f16
#define GPU_QGEMM_VARIANTS 24                          // tile shapes 0..23
#define GPU_QGEMM_REG_END 20                           // the register kernel's: 12..19
int gpu_qgemm_has(const dj_gpu *g, int variant);    // whether this device runs tile shape `variant`
// y (T, n_out) = W . (rmsnorm(x + delta) * nw) on the register kernel (2..64 tokens) or past 64 on the Hopper kernel,
// for the passes whose shape is theirs (GPU_MM_QGEMM's for T): gpu_add_rmsnorm then gpu_qgemm_variant(-1) in one, the
// same bits, each row normed (as rmsnorm_kernel does it) as it is laid out for the kernel, so no normed copy is
// written and read back; and xo (T, n_in) = x + delta, the residual stream's next value, in a buffer that is not x;
// delta NULL: no add, xo = x. x, delta (T, n_in), nw (n_in) f32. PRECOND-checked: gpu_qgemm_ok, T >= 2, the register
// or the Hopper kernel's shape for T, n_in <= 16384, xo not x.
int gpu_norm_qgemm(dj_gpu *g, float *y, const float *x, const float *delta, float *xo, const float *nw, float eps,
                   const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);
// Whether gpu_matmul takes this product of T tokens (x aligned) on the register kernel, so that gpu_norm_qgemm can
// take it with the norm before it: gpu_norm_qgemm's shapes, past the tokens the GEMV takes, where gpu_qgemm_wins.
int gpu_norm_qgemm_ok(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out);
// out (rows, n_in) f16 = q8/q4 rows of W dequantized (scale * k rounded once), as the cuBLAS path does a chunk at a
// time; blocks > 0 fixes the grid (blocks of 256 threads), 0 sizes it to the work.
int gpu_dequant_f16(void *out, const void *w, uint32_t wtype, int64_t rows, int64_t n_in, int blocks,
                    cudaStream_t s, dj_err *e);

// out (n) f32 = in (n) in wtype, exactly (f16 and bf16 widen without rounding): token embedding rows arrive in
// the model's dtype, half the bytes of f32 over PCIe and no conversion loop on the host. out and in must not overlap.
// With DJ_F32 it is a copy; `in` may be mapped host memory (gpu_host_device_ptr).
int gpu_widen(float *out, const void *in, uint32_t wtype, int64_t n, cudaStream_t s, dj_err *e);
// out (rows, cols) f32 = rows of any weight dtype (dj_row_bytes apart; q8 and q4 dequantized exactly, scale * k).
int gpu_widen_rows(float *out, const void *in, uint32_t wtype, int64_t rows, int64_t cols, cudaStream_t s, dj_err *e);
// dst[r * ld_dst + c] = src[r * ld_src + c] for r < rows, c < cols: a block of rows placed into wider ones (the CPU
// share's parts of a matmul's output). src may be mapped host memory; the two must not overlap.
int gpu_place_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols,
                   cudaStream_t s, dj_err *e);
// The same, once the 32-bit word at `word` (a device view of mapped host memory) reaches seq, which the host
// stores after writing src: the stream waits on the GPU for it, so the host may queue work behind it first.
// dst (n) = src, dst a device view of mapped host memory, then seq stored at `word` (one too) once the host can
// read all of dst. count: a device word at 0 (left at 0), one per stream using it.
int gpu_to_host(float *dst, const float *src, int64_t n, unsigned *count, uint32_t *word, uint32_t seq,
                cudaStream_t s, dj_err *e);
int gpu_place_rows_after(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols,
                         const uint32_t *word, uint32_t seq, cudaStream_t s, dj_err *e);

// ---- normalisation and activations (rows of n f32 values, T rows back to back)
// out (T, n) = x / sqrt(mean(x^2) + eps) * w; w (n) f32. out may alias x.
int gpu_rmsnorm(float *out, const float *x, const float *w, int64_t T, int64_t n, float eps, cudaStream_t s,
                dj_err *e);
// Residual add fused with the next norm: x (T, n) += delta (T, n); out (T, n) = rmsnorm(x) * w.
// out may alias delta (not x).
// y (len) = parts[0] + parts[1] + ... + parts[n - 1], added in that order (the tensor-parallel all-reduce: every GPU
// the same bits). The parts may be on other devices with peer access to them.
#define GPU_MAX_PARTS 8
int gpu_sum_parts(float *y, const float *const *parts, int n, int64_t len, cudaStream_t s, dj_err *e);
// The tensor-parallel all-reduce on the device (ops.cu says how), GPU `rank` of n: y (len floats) = every GPU's
// partial summed in GPU order, every GPU the same bits. This GPU's partial is `mine`; out[k] is GPU k's inbox for
// it and flag_out[k] this GPU's GPU_TP_XCHG_BLOCKS flags in GPU k's memory (both written by peer access), in[k] and
// flag_in[k] the same for GPU k in this GPU's memory (entries at rank unused); count: this GPU's
// GPU_TP_XCHG_BLOCKS counts of exchanges (zeroed with every flag before the first). *err (host-mapped) set where a
// block gave up: *abort (host-mapped) raised, or about 30 s without a GPU coming (clock_khz: cudaDevAttrClockRate).
#ifndef GPU_TP_XCHG_BLOCKS  // (a build may set it, in CEXTRA and NVEXTRA both, to time others: peer_ceilings)
#define GPU_TP_XCHG_BLOCKS 128
#endif
// Up to a length (gpu_tp_exchange_ll) the partials go as words that carry their own flag instead: ll_out[k] GPU k's
// inbox of 8-byte words for this GPU's, ll_in[k] this GPU's for GPU k's (zeroed before the first exchange).
typedef struct {
    float *out[GPU_MAX_PARTS];
    unsigned long long *flag_out[GPU_MAX_PARTS];
    const float *in[GPU_MAX_PARTS];
    const unsigned long long *flag_in[GPU_MAX_PARTS];
    unsigned long long *ll_out[GPU_MAX_PARTS];
    const unsigned long long *ll_in[GPU_MAX_PARTS];
} gpu_tp_xchg;
int gpu_tp_exchange(float *y, const float *mine, int64_t len, const gpu_tp_xchg *x, int n, int rank,
                    unsigned long long *count, const volatile int *abort, volatile int *err, int clock_khz,
                    cudaStream_t s, dj_err *e);
int gpu_tp_exchange_blocks(int64_t len);  // the blocks (slices) an exchange of len floats cuts, 1..GPU_TP_XCHG_BLOCKS
int gpu_tp_exchange_ll(int64_t len);      // whether an exchange of len floats goes as flagged words
int64_t gpu_tp_exchange_ll_max(void);     // the most floats an exchange sends as flagged words
// The head split's gather on the device (ops.cu says how), GPU `rank` of n: this GPU's logits `mine` (rows, cols,
// compact) placed at columns [c0, c0 + cols) of GPU 0's logits `dst` (rows, ld), in GPU 0's memory (by peer access
// from the others). GPU 0 raises its flag_out[k] (GPU k's memory: GPU 0's readers of dst are done) and returns once
// every flag_in[k] (its memory: GPU k's block placed) has come; GPU k > 0 waits for its flag_in[0], places, raises
// its flag_out[0]. blocks: the same on every GPU (up to GPU_TP_XCHG_BLOCKS); count, abort, err, clock_khz as in
// gpu_tp_exchange.
typedef struct {
    unsigned long long *flag_out[GPU_MAX_PARTS];
    const unsigned long long *flag_in[GPU_MAX_PARTS];
} gpu_tp_flags;
int gpu_tp_gather(float *dst, int64_t ld, int64_t c0, const float *mine, int64_t rows, int64_t cols, int blocks,
                  const gpu_tp_flags *f, int n, int rank, unsigned long long *count, const volatile int *abort,
                  volatile int *err, int clock_khz, cudaStream_t s, dj_err *e);
int gpu_add_rmsnorm(float *x, const float *delta, float *out, const float *w, int64_t T, int64_t n, float eps,
                    cudaStream_t s, dj_err *e);
// The residual add alone: out (T, n) = x + delta, plus v (n) on every row when v is not NULL (a control vector:
// probe.h). The same sums as gpu_add_rmsnorm's x, so rmsnorm(out) equals its normed output bitwise. out may alias x.
int gpu_residual_add(float *out, const float *x, const float *delta, const float *v, int64_t T, int64_t n,
                     cudaStream_t s, dj_err *e);
// out (T, n) = silu(gate) * up, gate and up rows `ld` floats apart (ld = n for separate buffers, 2n for
// one (T, 2n) buffer holding [gate | up] per row, then up = gate + n). out may alias gate only when ld == n.
int gpu_swiglu(float *out, const float *gate, const float *up, int64_t T, int64_t n, int64_t ld, cudaStream_t s,
               dj_err *e);
// y (T, n_out) = (silu(gate) * up) . W^T, gate and up rows ld floats apart (ld >= n_in): gpu_swiglu into hb (T,
// n_in) then gpu_matmul, or, for q8 and q4 weights, kernels that compute silu(gate) * up as they read it and never
// write hb (the GEMV for a few tokens, gpu_swiglu_qgemm where the tensor-core kernel takes the product), choosing
// as gpu_matmul does.
int gpu_swiglu_matmul(dj_gpu *g, float *y, float *hb, const float *gate, const float *up, int64_t ld, const void *w,
                      uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);
// Whether the persistent quantized GEMV takes W (n_out, n_in): q8/q4, a whole number of groups up to the x it
// stages, 16-byte aligned. It then runs gpu_matmul's one-token q8/q4 products (x aligned too), gpu_swiglu_matmul's
// fused product and gpu_norm_matmul (its buffers aligned too).
int gpu_fused_ok(uint32_t wtype, const void *w, int64_t n_in, int64_t n_out);
// h (n_out / 2) = silu(gate) * up for one token, where gate and up are the two halves of W . (rmsnorm(x + delta) *
// nw) (W: the gate rows, then the up rows): gpu_norm_matmul then gpu_swiglu in one kernel, the same floats, with
// the residual written to xo as gpu_norm_matmul writes it. PRECOND-checked: gpu_norm_matmul's; n_out even.
int gpu_norm_matmul_swiglu(dj_gpu *g, float *h, const float *x, const float *delta, float *xo, const float *nw,
                           float eps, const void *w, uint32_t wtype, int64_t n_in, int64_t n_out, cudaStream_t s,
                           dj_err *e);
// Rows of W (n_out rows of wtype) a warp of the persistent GEMV takes at a time for one token on this device: 1 or 2
// (tests reach both with it).
int gpu_qgemv_rows_a_warp(const dj_gpu *g, uint32_t wtype, int64_t n_out);
// y (T, n_out) = W . (rmsnorm(x + delta) * nw) on the persistent GEMV (gpu_add_rmsnorm and its gpu_matmul in one
// kernel: each row normed as it is staged, W read once for the tokens a block holds), and xo = x + delta, the
// residual stream's next value, in a buffer that is not x; delta NULL: no add, xo = x. x, delta, xo (T, n_in).
// PRECOND-checked: gpu_fused_ok, x, delta, xo, nw 16-byte aligned, 1 <= T <= 65535.
int gpu_norm_matmul(dj_gpu *g, float *y, const float *x, const float *delta, float *xo, const float *nw, float eps,
                    const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);
// Whether gpu_matmul gives this product of T tokens (x aligned) to the persistent GEMV, so that gpu_norm_matmul can
// take it with the norm before it.
int gpu_norm_matmul_takes(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out);
// y (T, n_out) = W . (rmsnorm(x + delta) * nw) and xo = x + delta for T >= 2 tokens, on the kernel gpu_matmul gives
// the product: gpu_norm_matmul where gpu_norm_matmul_takes it, else gpu_norm_qgemm; gpu_norm_rows_ok: whether one of
// them takes it. PRECOND-checked: the one it calls.
int gpu_norm_rows(dj_gpu *g, float *y, const float *x, const float *delta, float *xo, const float *nw, float eps,
                  const void *w, uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, cudaStream_t s, dj_err *e);
int gpu_norm_rows_ok(const dj_gpu *g, uint32_t wtype, const void *w, int64_t T, int64_t n_in, int64_t n_out);

// ---- RoPE: x rows (T rows `ld` floats apart, each n_heads * head_dim), rotated in place for positions
// *d_pos + t, HF rotate-half pairs (i, i + head_dim/2), angle = (float)pos * inv_freq[i] in f32 (cpu_rope).
// inv_freq (head_dim/2) f32 in device memory, from cpu_rope_freqs. With the fused [q | k | v] matmul
// output, q and k are adjacent: one call with n_heads + n_kv_heads rotates both.
// PRECOND: head_dim even.
int gpu_rope(float *x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t ld, const float *inv_freq,
             const int32_t *d_pos, cudaStream_t s, dj_err *e);

// ---- KV cache and attention
// A KV cache as the kernels see it: keys from k and values from v, each (n_kv_heads, max_seq, head_dim) elements of
// `type` (kvtype.h: f32, f16, q8) for one layer (of one slot, or of slot 0 for a step's rows); for q8 each row's
// scale in ks and vs, laid out as the elements with head_dim = 1 (element i's scale at i / head_dim). Rows are
// written as kvtype.h says (f16 round to nearest even; q8 s = max|x| / 127, k = x / s rounded half to even), so a
// cache the CPU engine wrote reads back the same here; every read widens to f32 (q8: k * s).
typedef struct {
    void *k, *v;
    float *ks, *vs;  // q8; NULL otherwise
    int type;
} gpu_kv_cache;
// The view `elems` elements further on (a multiple of head_dim): another layer or slot of the same cache.
static inline gpu_kv_cache gpu_kv_at(gpu_kv_cache c, int64_t elems, int64_t head_dim) {
    const int64_t bytes = elems * (int64_t)dj_kv_elem_bytes(c.type);
    c.k = (char *)c.k + bytes, c.v = (char *)c.v + bytes;
    if (c.ks) c.ks += elems / head_dim, c.vs += elems / head_dim;
    return c;
}
// Writes k, v rows (T rows `ld` floats apart, each n_kv_heads * head_dim) into the caches at positions
// *d_pos + t (rows whose position is >= max_seq are skipped).
int gpu_kv_write(const gpu_kv_cache *c, const float *k, const float *v, int64_t ld, int64_t T, int64_t n_kv_heads,
                 int64_t head_dim, int64_t max_seq, const int32_t *d_pos, cudaStream_t s, dj_err *e);
// RoPE + KV write in one launch: T rows of qkv, `ld` floats apart (ignored for T = 1), each
// (n_heads + 2 n_kv_heads, head_dim) = [q | k | v]; row t's q and k rotated in place for position *d_pos + t
// (as gpu_rope), then its k and v written into the caches there (as gpu_kv_write): the same values. T <= 65535.
// PRECOND: the shapes of gpu_attention_decode.
int gpu_rope_kv(dj_gpu *g, float *qkv, int64_t ld, int64_t T, const gpu_kv_cache *c, int64_t n_heads,
                int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const float *inv_freq, const int32_t *d_pos,
                cudaStream_t s, dj_err *e);
// The rows of a batched decode step (device memory): row b is at position pos[b] of KV slot slot[b], whose caches
// start slot[b] * slot_stride elements after the ones given (slots one after the other, each (n_kv_heads, max_seq,
// head_dim) of a layer at the same offset). fresh[b]: the first key of row b's slot that the pass writes (the least
// position of the pass's rows in that slot, whichever launch attends them); the decode attention copies the keys
// below it before it waits for the kernel before it (rope_kv). NULL: pos[0] where slot is NULL (the rows are one
// sequence's, from pos[0] on), else none. one_slot: every row is in slot[0] (a prompt's run; slot NULL says it too),
// so the decode attention may take several rows a block over the same keys.
typedef struct {
    const int32_t *pos, *slot;
    int64_t slot_stride;
    const int32_t *fresh;
    int one_slot;
} gpu_kv_rows;
// fresh (n) for rows at positions pos (n) of KV slots slot (n) of a pass: for each row, the least position of the
// rows in its slot. first: scratch of one word a slot, every slot below the largest seen.
void gpu_kv_fresh(int32_t *fresh, const int32_t *slot, const int32_t *pos, int64_t n, int32_t *first);
// gpu_rope_kv for B rows each at its own position and slot: row b's q heads at q + b ldq, its k and v heads at
// k + b ldkv and v + b ldkv (the fused [q | k | v] rows, or separate q, k, v blocks). B <= 65535.
int gpu_rope_kv_rows(dj_gpu *g, float *q, int64_t ldq, float *k, float *v, int64_t ldkv, int64_t B,
                     const gpu_kv_cache *c, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                     const float *inv_freq, const gpu_kv_rows *kv, cudaStream_t s, dj_err *e);
// Decode: one query per head at position pos = *d_pos over keys 0..pos, GQA (query head h reads kv head
// h / (n_heads / n_kv_heads)), scale 1/sqrt(head_dim), f32 softmax. q, out (n_heads, head_dim).
// Split across the KV length (flash-decoding): a short context in splits of 16, 32 or 64 keys (the smallest that
// needs at most 16 splits a kv head; where many rows fill the GPU, fewer, longer splits), a deep one over every
// split of the grid (enough to fill the GPU with the rows and heads at hand), each looping over its keys 64 at a
// time with an online softmax; the split chosen on the device from pos, so a captured graph serves every pos. Then a
// combine pass. Needs gpu_attention_scratch() bytes.
// PRECOND: head_dim even, <= 256; n_heads % n_kv_heads == 0.
int gpu_attention_decode(dj_gpu *g, float *out, const float *q, const gpu_kv_cache *c, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, int64_t max_seq, const int32_t *d_pos, cudaStream_t s,
                         dj_err *e);
// The split a decode launch of B rows gives a row at position pos (the kernels work it out on the device from pos;
// this is the same rule on the host, for tests): the grid's splits a kv head (*n_splits), the keys a split takes
// (*span), and the splits that hold keys (returned), for rows each in blocks of their own. Rows of one slot that
// share a block (the tensor-core kernel's) aim at more splits, and all take the split of the block's deepest row.
// PRECOND: attn_check's shapes.
int gpu_attention_splits(int64_t B, int64_t n_heads, int64_t n_kv_heads, int64_t max_seq, int64_t pos,
                         int64_t *n_splits, int64_t *span);
// gpu_attention_decode for B rows of a batched step, each over its own slot's keys 0..kv->pos[b] (gpu_kv_rows; slot
// NULL: every row over c itself, as a pass of a few rows of one slot): row b's query at q + b ldq, its output at
// out + b n_heads head_dim. Rows of one slot (slot NULL, or one_slot) on the tensor cores go 16 / group a block,
// the query heads of all of them one operand over keys read once. Scratch: gpu_attention_scratch(B, ...).
int gpu_attention_decode_rows(dj_gpu *g, float *out, const float *q, int64_t ldq, const gpu_kv_cache *c, int64_t B,
                              int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t max_seq,
                              const gpu_kv_rows *kv, cudaStream_t s, dj_err *e);
// Prefill: queries t = 0..T-1 at positions *d_pos + t, each over keys 0..*d_pos + t (causal; the cache
// already holds this chunk's keys, so chunked prefill works). q rows `ldq` floats apart, out rows `ldo`
// apart, each (n_heads, head_dim). Tiled flash-attention (online softmax in registers and shared memory):
// no T x T matrix in global memory. PRECOND as for decode. Two kernels, one block per (64 queries, head) each
// (a small T after a long context, as in chunked prefill, has little parallelism):
//   tensor cores (the default where head_dim is a multiple of 16 up to 256): mma.sync with bf16 operands in the
//   bf16x3 split (each f32 operand as a bf16 high part plus a bf16 residual, three products), fp32
//   accumulation: f32-class accuracy (rows within ~3e-5 of the f32 CPU reference) at tensor-core speed;
//   fp32 FMAs from shared memory: every other head_dim, or when gpu_set_tc_attn(g, 0) (rows within 1e-5).
int gpu_attention_prefill(dj_gpu *g, float *out, int64_t ldo, const float *q, int64_t ldq, const gpu_kv_cache *c,
                          int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                          int64_t max_seq, const int32_t *d_pos, cudaStream_t s, dj_err *e);

// The tensor-core attention kernels on (the default) or off (the FMA kernels for every head_dim and KV type);
// applies to later gpu_attention_prefill and decode calls (decode: an f16 or q8 cache at head_dim 64 or 128, up to 8
// query heads a kv head, has a tensor-core kernel; q8's int8 rows widened to f16 exactly, its scales applied to the
// scores and folded into the probabilities).
void gpu_set_tc_attn(dj_gpu *g, int on);
int gpu_tc_attn_supported(const dj_gpu *g, int64_t head_dim);  // 1: that head_dim has the tensor-core kernel

// ---- sampling: sampler.h's rule where the logits are
// The next token of each of `rows` rows of logits (rows, n) f32 in device memory, which it overwrites: d_out (rows)
// gets the ids (-1 for a row holding a NaN or +infinity, or only -infinity). d_args (rows) in device memory, from
// sampler_step_args; d_counts (rows, n) the windows' occurrences, kept in step by each row's args (n_set changes
// applied first), or NULL when no penalty is on; scratch: gpu_pick_scratch(rows) bytes of device memory. The same
// ids as sampler_pick_u, bit for bit. One cooperative launch, up to 256 blocks a row (4 ids a thread): a max pass,
// a weight pass, 4 radix passes for top-k and 4 for top-p (8-bit digits), a draw; greedy rows stop after the max.
size_t gpu_pick_scratch(int64_t rows);
int gpu_pick(void *scratch, int32_t *d_out, float *logits, int64_t rows, int64_t n, const dj_pick_args *d_args,
             int32_t *d_counts, cudaStream_t s, dj_err *e);

#ifdef __cplusplus
}
#endif

#endif
