// test_kvsize.c: the KV cache's default sizes (kvsize.c) at, under and over their bounds: the context is the model's
// while its cache fits to the byte, else a multiple of 256 (never under 256, never over the model's); the command
// line's default context is that of a quarter of the memory, on the GPU no more than what the weights leave (2 GiB
// kept) though always 4096 positions; the slots are whole ones, at most 65536; the server's default sequences a step
// are half the slots, from 1 to 256; the default parking is half the host's available memory; the memory read is
// what /proc/meminfo says, or what a test says.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "../kvsize.h"

Test(kvsize, the_models_context_while_it_fits) {
    // Llama 3's 131072 positions at f16 (128 KiB a position): 16 GiB, within a quarter of an H200's 143 GB
    cr_expect_eq(kv_fit_context(131072, 1, 143771000000ull / 4, 131072), 131072);
    cr_expect_eq(kv_fit_context(1000, 1, 512000, 512), 512, "fits to the byte");
    cr_expect_eq(kv_fit_context(1000, 2, 1024000, 512), 512, "two slots, to the byte");
    cr_expect_eq(kv_fit_context(1000, 1, UINT64_MAX / 2, 512), 512, "no more than the model's");
    cr_expect_eq(kv_fit_context(0, 1, 0, 512), 512, "a cache of no bytes");
}

Test(kvsize, cut_to_a_multiple_of_256) {
    cr_expect_eq(kv_fit_context(1000, 1, 511999, 512), 256, "a byte short of 512 positions");
    cr_expect_eq(kv_fit_context(1000, 1, 1024000, 131072), 1024, "exactly 1024");
    cr_expect_eq(kv_fit_context(1000, 1, 1023999, 131072), 768, "a byte short of 1024");
    cr_expect_eq(kv_fit_context(1000, 4, 4096000, 131072), 1024, "four slots' worth");
    cr_expect_eq(kv_fit_context(1000, 4, 4095999, 131072), 768);
    // 24 GB: a quarter holds 45776 positions of 128 KiB, cut to 45568
    cr_expect_eq(kv_fit_context(131072, 1, 6000000000ull, 131072), 45568);
}

Test(kvsize, never_under_256_nor_over_the_model) {
    cr_expect_eq(kv_fit_context(1000, 1, 255999, 131072), 256, "under 256 positions fit: 256 all the same");
    cr_expect_eq(kv_fit_context(1000, 1, 0, 131072), 256, "nothing fits");
    cr_expect_eq(kv_fit_context(1000, 1, 0, 100), 100, "a model of 100 positions");
    cr_expect_eq(kv_fit_context(1000, 1, 99999, 100), 100);
    cr_expect_eq(kv_fit_context(1000, 1, 300000, 300), 300, "300 fit: the model's, though not a multiple of 256");
    cr_expect_eq(kv_fit_context(1000, 1, 299999, 300), 256);
}

// Expects kv_default_context's choice to hold ctx positions in budget bytes, held there by the weights or not.
static void tk_expect_choice(kv_ctx_choice got, int64_t ctx, uint64_t budget, int by_weights, const char *what) {
    cr_expect(got.ctx == ctx && got.budget == budget && got.by_weights == by_weights,
              "%s: %lld positions in %llu bytes (by the weights: %d), not %lld in %llu (%d)", what,
              (long long)got.ctx, (unsigned long long)got.budget, got.by_weights, (long long)ctx,
              (unsigned long long)budget, by_weights);
}

// 128 KiB a position (Llama 3 8B's at f16) and the H200's 143771000000 bytes, a quarter of them the budget.
#define TK_POS 131072ull
#define TK_H200 143771000000ull

Test(kvsize, default_context_is_the_models_while_it_fits) {
    for (int gpu = 0; gpu < 2; gpu++) {
        // 131072 positions take 16 GiB; 16 GB of weights leave far more of the GPU
        tk_expect_choice(kv_default_context(TK_POS, 131072, TK_H200 / 4, gpu, 16000000000ull), 131072, TK_H200 / 4,
                         0, gpu ? "an 8B model on an H200" : "a quarter of 143.771 GB on the CPU");
        tk_expect_choice(kv_default_context(1000, 512, 512000, gpu, 0), 512, 512000, 0, "to the byte");
    }
    tk_expect_choice(kv_default_context(TK_POS, 131072, 0, 1, 140000000000ull), 131072, 0, 0, "the memory unknown");
}

Test(kvsize, default_context_cut_to_the_memory) {
    // a quarter of 24 GB holds 45776 positions of 128 KiB: 45568; on the CPU the weights take nothing from it
    tk_expect_choice(kv_default_context(TK_POS, 131072, 6000000000ull, 0, 20000000000ull), 45568, 6000000000ull, 0,
                     "24 GB");
    tk_expect_choice(kv_default_context(1000, 512, 511999, 0, 0), 256, 511999, 0, "a byte short of 512");
    tk_expect_choice(kv_default_context(1000, 131072, 1000, 0, 0), 256, 1000, 0, "no floor of 4096 on the CPU");
}

Test(kvsize, default_context_on_the_gpu_takes_what_the_weights_leave) {
    // 130 GB of weights leave 143.771 GB - 130 GB - 2 GiB = 11623516352 bytes: 88680 positions, cut to 88576
    tk_expect_choice(kv_default_context(TK_POS, 131072, TK_H200 / 4, 1, 130000000000ull), 88576,
                     TK_H200 - 130000000000ull - KV_GPU_MARGIN, 1, "130 GB of weights");
    // weights that leave the budget to the byte: the budget holds; a byte more of them, a byte less of it
    const uint64_t budget = 10000000000ull, exact = 3 * budget - KV_GPU_MARGIN;
    tk_expect_choice(kv_default_context(TK_POS, 131072, budget, 1, exact), 76288, budget, 0, "leave the budget");
    tk_expect_choice(kv_default_context(TK_POS, 131072, budget, 1, exact + 1), 76288, budget - 1, 1, "a byte less");
}

Test(kvsize, default_context_on_the_gpu_keeps_4096_positions) {
    // weights that leave less than 4096 positions, or nothing: 4096 all the same
    const uint64_t floor = KV_CTX_FLOOR * TK_POS;
    const uint64_t weights[] = {TK_H200 - KV_GPU_MARGIN - floor + 1, TK_H200 - KV_GPU_MARGIN, TK_H200, 2 * TK_H200};
    for (size_t i = 0; i < sizeof weights / sizeof *weights; i++)
        tk_expect_choice(kv_default_context(TK_POS, 131072, TK_H200 / 4, 1, weights[i]), KV_CTX_FLOOR, floor, 1,
                         "weights that leave less than 4096 positions");
    tk_expect_choice(kv_default_context(TK_POS, 131072, TK_H200 / 4, 1, TK_H200 - KV_GPU_MARGIN - floor - 1),
                     KV_CTX_FLOOR, floor + 1, 1, "weights that leave 4096 positions and a byte");
    tk_expect_choice(kv_default_context(TK_POS, 1000, TK_H200 / 4, 1, TK_H200), 1000, 1000 * TK_POS, 1,
                     "a model of 1000 positions: room for its whole context");
}

Test(kvsize, slots_are_whole_and_bounded) {
    cr_expect_eq(kv_slots(1000, 999), 0, "not one");
    cr_expect_eq(kv_slots(1000, 1000), 1);
    cr_expect_eq(kv_slots(1000, 2999), 2);
    cr_expect_eq(kv_slots(1000, 3000), 3);
    cr_expect_eq(kv_slots(1, KV_SLOTS_MAX), KV_SLOTS_MAX);
    cr_expect_eq(kv_slots(1, KV_SLOTS_MAX + 1ull), KV_SLOTS_MAX, "at most %d", KV_SLOTS_MAX);
    cr_expect_eq(kv_slots(1, UINT64_MAX), KV_SLOTS_MAX);
}

Test(kvsize, default_parallel_is_half_the_slots) {
    const int32_t slots[] = {1, 2, 3, 4, 5, 2 * KV_PARALLEL_MAX - 1, 2 * KV_PARALLEL_MAX, 2 * KV_PARALLEL_MAX + 2,
                             KV_SLOTS_MAX};
    const int32_t want[] = {1, 1, 1, 2, 2, KV_PARALLEL_MAX - 1, KV_PARALLEL_MAX, KV_PARALLEL_MAX, KV_PARALLEL_MAX};
    for (size_t i = 0; i < sizeof slots / sizeof *slots; i++)
        cr_expect_eq(kv_default_parallel(slots[i]), want[i], "%d slots: %d", slots[i], kv_default_parallel(slots[i]));
}

Test(kvsize, parking_takes_half_the_available_memory) {
    cr_expect_eq(kv_park_gb(64000000000ull), 32.0);
    cr_expect_eq(kv_park_gb(3), 1e-9, "half of 3 bytes, whole bytes");
    cr_expect_eq(kv_park_gb(0), PARK_GB_UNKNOWN, "unknown");
}

// /proc/meminfo's MemAvailable in bytes, as read here (0: none).
static double tk_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f) && sscanf(line, "MemAvailable: %llu kB", &kb) != 1) {}
    if (f) fclose(f);
    return (double)kb * 1024;
}

// The host's MemAvailable, read here before and after the code reads it (it moves meanwhile, a little); a quarter
// of it for the CPU engine; DJINN_TEST_MEM in its place for either engine.
Test(kvsize, the_memory_read) {
    unsetenv("DJINN_TEST_MEM");
    const double before = tk_mem_available(), got = (double)host_mem_available(), after = tk_mem_available();
    if (!before || !after) cr_skip_test("no MemAvailable in /proc/meminfo here");
    const double lo = before < after ? before : after, hi = before < after ? after : before;
    cr_expect(got >= 0.995 * lo && got <= 1.005 * hi, "MemAvailable %g then %g, read %g", before, after, got);
    const char *what = NULL;
    const double q = (double)kv_budget(0, &what), now = tk_mem_available();
    cr_expect(q >= 0.995 * now / 4 && q <= 1.005 * now / 4, "a quarter of %g: %g", now, q);
    cr_expect_str_eq(what, "the host's available memory");
    setenv("DJINN_TEST_MEM", "4000", 1);
    cr_expect_eq(host_mem_available(), 4000);
    cr_expect_eq(kv_budget(0, &what), 1000);
    cr_expect_eq(kv_budget(1, &what), 1000);
    cr_expect_str_eq(what, "the GPU's memory");
    unsetenv("DJINN_TEST_MEM");
}
