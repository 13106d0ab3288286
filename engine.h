// engine.h: one interface over the two forward passes, the GPU engine (gpu.h) and the CPU one (cpu.h), so that
// generation and --check see a model only through forward().
#ifndef DJINN_ENGINE_H
#define DJINN_ENGINE_H

#include <stdint.h>

#include "gpu.h"
#include "sampler.h"

typedef struct {
    const char *name;  // "cpu", "gpu"
    int is_gpu;
    void *ctx;         // dj_gpu_state or dj_cpu_state
    // Runs tokens (T) at positions pos .. pos+T-1, filling the KV cache. logits: (T, vocab) when all, else
    // (vocab) for the last token; NULL for none.
    int (*forward)(void *ctx, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all, dj_err *e);
    // forward for the last token, its next token picked where the logits are (gpu_forward_pick); NULL: the
    // engine has none, the host samples
    int (*pick)(void *ctx, const int32_t *tokens, int64_t T, int64_t pos, const dj_pick_args *a, const int32_t *counts,
                int32_t *next, dj_err *e);
    void (*free)(void *ctx);
} dj_engine;

// The engine follows how the model was loaded: page-locked for the GPU (loader.h) runs on the GPU with the
// options `go`, otherwise on the CPU with a context of go->max_seq tokens.
int engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, dj_err *e);
void engine_close(dj_engine *eng);  // a zeroed engine is fine
// Runs tokens (T) at positions pos.. and picks the next token with the sampler: where the logits are when the
// engine can (only the id comes back), else from `logits` (vocab), host memory the host sampler reads. *next: -1
// when the last row held a NaN or +infinity, or only -infinity.
int engine_next(dj_engine *eng, dj_sampler *smp, const int32_t *tokens, int64_t T, int64_t pos, float *logits,
                int32_t *next, dj_err *e);

#endif
