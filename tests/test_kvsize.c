// test_kvsize.c: the KV cache's default sizes (kvsize.c) at, under and over their bounds: the context is the model's
// while its cache fits to the byte, else a multiple of 256 (never under 256, never over the model's); the slots are
// whole ones, at most 65536; the server's default sequences a step are half the slots, from 1 to 256; the default
// parking is half the host's available memory; the memory read is what /proc/meminfo says, or what a test says.
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
