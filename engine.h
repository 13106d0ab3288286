// engine.h: one interface over the two forward passes, the GPU engine (gpu.h) and the CPU one (cpu.h), so that
// generation and --check see a model only through forward().
#ifndef DJINN_ENGINE_H
#define DJINN_ENGINE_H

#include <stdint.h>

#include "gpu.h"

typedef struct {
    const char *name;  // "cpu", "gpu"
    int is_gpu;
    void *ctx;         // dj_gpu_state or dj_cpu_state
    // Runs tokens (T) at positions pos .. pos+T-1, filling the KV cache. logits: (T, vocab) when all, else
    // (vocab) for the last token; NULL for none.
    int (*forward)(void *ctx, const int32_t *tokens, int64_t T, int64_t pos, float *logits, int all, dj_err *e);
    void (*free)(void *ctx);
} dj_engine;

// The engine follows how the model was loaded: page-locked for the GPU (loader.h) runs on the GPU with the
// options `go`, otherwise on the CPU with a context of go->max_seq tokens.
int engine_open(dj_engine *eng, const dj_model *m, const dj_gpu_opts *go, dj_err *e);
void engine_close(dj_engine *eng);  // a zeroed engine is fine

#endif
