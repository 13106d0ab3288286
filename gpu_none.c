// gpu_none.c: the GPU side of a build without the CUDA toolkit (DJINN_NO_GPU: make finds no nvcc, or CUDA=/nowhere).
// No GPU is ever found (gpu_count is 0), so nothing is page-locked and the engine (engine.h) opens the CPU forward
// pass; gpu.h's calls are here for the linker alone, and fail with the reason should one be reached.
#include <string.h>

#include "engine.h"
#include "gpu.h"
#include "gpu_host.h"

#ifndef DJINN_NO_GPU
#error "gpu_none.c stands in for the GPU engine only in a build without CUDA (-DDJINN_NO_GPU)"
#endif

static int absent(dj_err *e) { return dj_fail(e, "%s", GPU_ABSENT); }

// ---- gpu_host.h
int gpu_count(void) { return 0; }
int gpu_peer_ok(int a, int b) { return a == b; }
int gpu_mem_info(size_t *free_bytes, size_t *total_bytes, dj_err *e) { return absent(e); }
int gpu_host_register(void *p, size_t bytes, int read_only, dj_err *e) { return absent(e); }
int gpu_host_unregister(void *p, dj_err *e) { return absent(e); }

// ---- gpu.h
dj_gpu_state *gpu_state_new(const dj_model *m, const dj_gpu_opts *o, dj_err *e) {
    absent(e);
    return NULL;
}
void gpu_state_free(dj_gpu_state *s) {}
int gpu_forward(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all,
                dj_err *e) {
    return absent(e);
}
int gpu_forward_pick(dj_gpu_state *s, int32_t slot, const int32_t *tokens, int64_t T, int64_t pos,
                     const dj_pick_args *a, const int32_t *counts, int32_t *next, dj_err *e) {
    return absent(e);
}
int gpu_step_rows(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                  int64_t n_want, const int32_t *want, float *logits, dj_err *e) {
    return absent(e);
}
int gpu_step_rows_pick(dj_gpu_state *s, int64_t n, const int32_t *slots, const int64_t *pos, const int32_t *tokens,
                       int64_t n_want, const int32_t *want, const dj_pick_args *args, int32_t *next, dj_err *e) {
    return absent(e);
}
dj_gpu_parked *gpu_park(dj_gpu_state *s, int32_t slot, int64_t n, dj_err *e) {
    absent(e);
    return NULL;
}
int gpu_restore(dj_gpu_state *s, dj_gpu_parked *p, int32_t slot, dj_err *e) { return absent(e); }
void gpu_drop(dj_gpu_state *s, dj_gpu_parked *p) {}
void gpu_state_stats(dj_gpu_state *s, dj_gpu_stats *out) { memset(out, 0, sizeof *out); }
void *gpu_parked_host(dj_gpu_state *s, dj_gpu_parked *p, dj_err *e) {
    absent(e);
    return NULL;
}
int gpu_set_probe(dj_gpu_state *s, dj_probe *p, dj_err *e) { return absent(e); }
int tp_engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, int32_t n_slots, dj_err *e) {
    return absent(e);
}
