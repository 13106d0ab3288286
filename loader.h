// loader.h: a model.bin from disk into host memory, validated (model.h's parser), read by several threads; for the
// GPU engine the sections that travel over PCIe (layers, head, tied embeddings) page-locked as they land.
#ifndef DJINN_LOADER_H
#define DJINN_LOADER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

typedef struct {
    dj_model_info info;
    uint8_t *data;     // the whole file in host memory (read, not mapped; travelling sections page-locked
                       // when `pinned`)
    size_t data_size;
    int for_gpu;       // 1: loaded for the GPU engine (anonymous memory, travelling sections registered)
    int pinned;        // 1: every travelling section (layers, head, tied embeddings) is page-locked
    int pin_tried;     // page-locking was attempted (sections to unregister on free)
    int released;          // some weight sections were given back (model_release): their bytes read as zeros
    uint32_t fingerprint;  // model_fingerprint, taken before the first release
} dj_model;

typedef struct {
    int want_pinned;   // 1: load for the GPU: page-lock what travels (requires a GPU); 0: the CPU path
    int no_pin;        // with want_pinned: skip page-locking (pageable copies: slower, no overlap)
    int quiet;         // no progress on stderr
    int threads;       // read threads (0: default)
    // Test-only: called with test_hook_arg once the header is read and validated, before any section is (a test
    // truncates or rewrites the file exactly then). NULL in every real load.
    void (*test_hook_after_header)(void *test_hook_arg);
    void *test_hook_arg;
} dj_load_opts;

// Set by a SIGINT handler (djinn's Ctrl-C): a load under way stops within a read chunk and fails with "interrupted",
// having freed what it took; a load started after it fails at once. Never cleared: a second load is as unwanted.
extern volatile sig_atomic_t dj_load_cancel;

int model_load(const char *path, const dj_load_opts *o, dj_model *m, dj_err *e);
void model_free(dj_model *m);
// The model's fingerprint: CRC-32 of its header (config and tables) and of 4 KB at the start and the middle of every
// section (tokenizer, embeddings, each layer, the head), so that weights of one shape but other values differ; a
// model whose sections were released keeps the one it had (sessions saved before and after still match).
uint32_t model_fingerprint(const dj_model *m);
// Gives the host memory of bytes [off, off + size) of m->data back (unregistered first where it was page-locked):
// a section whose weights were copied elsewhere (tp_shard_models). PRECOND: off and size multiples of the page size.
void model_release(dj_model *m, uint64_t off, uint64_t size);
// Page-locks the travelling sections (layers, head, tied embeddings) of a model built in memory (m->data from an
// anonymous mmap of m->data_size bytes), as model_load does for the GPU; model_free undoes it.
int model_pin(dj_model *m, dj_err *e);

// Typed views into a loaded model.
static inline const uint8_t *dj_layer_ptr(const dj_model *m, uint32_t l) { return m->data + m->info.layer_off[l]; }
static inline const uint8_t *dj_embed_ptr(const dj_model *m) { return m->data + m->info.embed_off; }
static inline const uint8_t *dj_head_ptr(const dj_model *m) { return m->data + m->info.head_off; }
static inline const uint8_t *dj_lm_head_ptr(const dj_model *m) {
    return m->info.config.tied ? dj_embed_ptr(m) : dj_head_ptr(m) + m->info.head.lm_head;
}
static inline uint32_t dj_lm_head_type(const dj_model *m) {  // tied: the embeddings' dtype
    return m->info.config.tied ? m->info.config.embed_type : m->info.config.head_type;
}

#endif
