// kvsize.h: how large the KV cache is when no flag says: the memory it may take (a quarter of the device's), the
// context that fits it (the command line), the server's slots and sequences a step, and the host memory parked
// caches may take.
#ifndef DJINN_KVSIZE_H
#define DJINN_KVSIZE_H

#include <stdint.h>

#define KV_MEM_SHARE 4       // the KV cache of all slots takes at most 1/4 of the device's memory by default
#define KV_CTX_STEP 256      // a context cut to fit is a multiple of this
#define KV_SLOTS_MAX 65536   // the server's KV slots, whatever the memory holds
#define KV_PARALLEL_MAX 256  // the server's default sequences a step, whatever the slots
#define PARK_MEM_SHARE 2     // parked caches take at most 1/2 of the host memory available at start by default
#define PARK_GB_UNKNOWN 8.0  // --park-gb's default where the host's available memory cannot be read
#define KV_CTX_FLOOR 4096    // the command line's default context on the GPU has room for this many positions at least
#define KV_GPU_MARGIN (2ull << 30)  // GPU memory kept for activations, scratch and cuBLAS beside weights and KV

// The bytes the KV cache may take by default: a quarter of the GPU's total memory (gpu), or of the host memory
// available now (the CPU engine: its cache is host memory, beside the weights already loaded); 0 when unknown.
// *what names it for a message ("the GPU's memory"). Tests: DJINN_TEST_MEM=BYTES stands for either memory.
uint64_t kv_budget(int gpu, const char **what);
// Host memory available now (/proc/meminfo's MemAvailable, else the free pages; DJINN_TEST_MEM); 0 when unknown.
uint64_t host_mem_available(void);
// The server's default --park-gb, in GB, for `avail` bytes of host memory available: half of it
// (PARK_GB_UNKNOWN when 0: unknown).
double kv_park_gb(uint64_t avail);

// The longest context of at most max_seq positions whose KV cache (slots x pos_bytes a position) fits budget bytes:
// max_seq when it fits, else a multiple of KV_CTX_STEP, at least KV_CTX_STEP (or max_seq when that is smaller).
int64_t kv_fit_context(uint64_t pos_bytes, int32_t slots, uint64_t budget, int64_t max_seq);
// The command line's context without -c (kv_default_context): its positions and the bytes its KV cache was held to.
typedef struct {
    int64_t ctx;
    uint64_t budget;  // the bytes the cache may take: the budget given, or less on the GPU (by_weights)
    int by_weights;   // 1: held to what the weights leave of the GPU's memory, less than the budget given
} kv_ctx_choice;
// The command line's context without -c for a model of max_seq positions, pos_bytes of KV cache each: max_seq where
// the cache fits budget bytes (kv_budget; 0: unknown, then max_seq), else the context that does (kv_fit_context). On
// the GPU (gpu) the cache also takes no more than what weights bytes leave of the GPU's memory (budget x
// KV_MEM_SHARE) beside KV_GPU_MARGIN, so that it never takes room that would hold layers resident, though always
// room for KV_CTX_FLOOR positions (or max_seq, when fewer): the engine streams the layers that no longer fit.
kv_ctx_choice kv_default_context(uint64_t pos_bytes, int64_t max_seq, uint64_t budget, int gpu, uint64_t weights);
// The server's KV slots in budget bytes, slot_bytes each: at most KV_SLOTS_MAX (0: not one fits).
int32_t kv_slots(uint64_t slot_bytes, uint64_t budget);
// The server's default sequences a step over `slots` KV slots: half of them (the other half holds idle sessions'
// caches), at least 1, at most KV_PARALLEL_MAX.
int32_t kv_default_parallel(int32_t slots);

#endif
