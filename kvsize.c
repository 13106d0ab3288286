// kvsize.c: the KV cache's default sizes (kvsize.h): the memory it and parked caches may take, read from the system,
// then contexts and slots by division.
#include "kvsize.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpu_host.h"

// DJINN_TEST_MEM: the bytes a test says the device has (0: none said), so that a cut can be seen on any machine.
static uint64_t test_mem(void) {
    const char *v = getenv("DJINN_TEST_MEM");
    return v ? strtoull(v, NULL, 10) : 0;
}

uint64_t host_mem_available(void) {
    const uint64_t said = test_mem();
    if (said) return said;
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    char line[256];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    if (f) fclose(f);
    if (found) return (uint64_t)kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);  // a kernel without MemAvailable
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

uint64_t kv_budget(int gpu, const char **what) {
    size_t free_b = 0, total_b = 0;
    const uint64_t said = test_mem();
    if (gpu) {
        *what = "the GPU's memory";
        if (said) return said / KV_MEM_SHARE;
        return gpu_mem_info(&free_b, &total_b, NULL) ? 0 : (uint64_t)total_b / KV_MEM_SHARE;
    }
    *what = "the host's available memory";
    return host_mem_available() / KV_MEM_SHARE;
}

double kv_park_gb(uint64_t avail) { return avail ? (double)(avail / PARK_MEM_SHARE) / 1e9 : PARK_GB_UNKNOWN; }

int64_t kv_fit_context(uint64_t pos_bytes, int32_t slots, uint64_t budget, int64_t max_seq) {
    uint64_t per = pos_bytes * (uint64_t)(slots > 0 ? slots : 1);  // bytes of one position over every slot
    uint64_t fits = per ? budget / per : UINT64_MAX;
    if (fits >= (uint64_t)max_seq) return max_seq;
    int64_t ctx = (int64_t)(fits / KV_CTX_STEP * KV_CTX_STEP);
    if (ctx < KV_CTX_STEP) ctx = KV_CTX_STEP;
    return ctx < max_seq ? ctx : max_seq;
}

kv_ctx_choice kv_default_context(uint64_t pos_bytes, int64_t max_seq, uint64_t budget, int gpu, uint64_t weights) {
    kv_ctx_choice ch = {.ctx = max_seq, .budget = budget};
    if (!budget) return ch;  // the memory is unknown: the engine's own allocation says if it fits
    if (gpu) {
        const uint64_t total = budget * KV_MEM_SHARE, used = weights + KV_GPU_MARGIN;
        const uint64_t left = total > used ? total - used : 0;
        const uint64_t floor = pos_bytes * (uint64_t)(max_seq < KV_CTX_FLOOR ? max_seq : KV_CTX_FLOOR);
        const uint64_t room = left > floor ? left : floor;
        if (room < budget) ch.budget = room, ch.by_weights = 1;
    }
    ch.ctx = kv_fit_context(pos_bytes, 1, ch.budget, max_seq);
    return ch;
}

int32_t kv_slots(uint64_t slot_bytes, uint64_t budget) {
    uint64_t n = slot_bytes ? budget / slot_bytes : KV_SLOTS_MAX;
    return n > KV_SLOTS_MAX ? KV_SLOTS_MAX : (int32_t)n;
}

int32_t kv_default_parallel(int32_t slots) {
    int32_t p = slots / 2;
    return p < 1 ? 1 : p > KV_PARALLEL_MAX ? KV_PARALLEL_MAX : p;
}
