// test_cpu.c: the CPU reference kernels and forward pass against straightforward double-precision
// implementations written here, on random inputs at several sizes.
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model.h"
#include "../cpu.h"
#include "../quant.h"
#include "common.h"

// ---- matmul
// vec: cpu_matvec (1, T = 1) or cpu_matvec_multi (2) instead of cpu_matmul; held to the same bound.
static void tcpu_mm_case(uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out, int vec) {
    float *x = malloc(sizeof(float) * T * n_in), *wf = malloc(sizeof(float) * n_in * n_out);
    void *w = malloc(4 * n_in * n_out);
    float *y = malloc(sizeof(float) * T * n_out);
    tc_fill(x, T * n_in, -1, 1);
    tc_fill(wf, n_in * n_out, -1, 1);
    tc_store(w, wf, n_in * n_out, wtype);
    if (vec == 1) cpu_matvec(y, x, w, wtype, n_in, n_out);
    else if (vec == 2) cpu_matvec_multi(y, x, w, wtype, T, n_in, n_out);
    else cpu_matmul(y, x, w, wtype, T, n_in, n_out);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double want = 0, mag = 0;
            for (int64_t i = 0; i < n_in; i++) {
                want += (double)x[t * n_in + i] * tc_load(w, wtype, o * n_in + i);
                mag += fabs((double)x[t * n_in + i] * tc_load(w, wtype, o * n_in + i));
            }
            double got = y[t * n_out + o];
            cr_assert(fabs(got - want) <= 1e-6 * mag + 1e-30, "%s%s T=%ld n_in=%ld n_out=%ld (%ld,%ld): %g vs %g",
                      vec == 1 ? "matvec " : vec == 2 ? "matvec_multi " : "", dj_dtype_name(wtype), (long)T, (long)n_in, (long)n_out, (long)t, (long)o,
                      got, want);
        }
    free(x), free(wf), free(w), free(y);
}
static void tcpu_matmul_case(uint32_t wtype, int64_t T, int64_t n_in, int64_t n_out) {
    tcpu_mm_case(wtype, T, n_in, n_out, 0);
}

Test(cpu_kernels, matmul_all_dtypes_and_sizes) {
    static const int64_t sizes[][3] = {{1, 1, 1}, {1, 7, 5}, {3, 64, 130}, {17, 257, 31}, {2, 300, 700}, {5, 96, 1000}};
    uint32_t types[] = {DJ_F32, DJ_F16, DJ_BF16};
    tc_rng_seed(1);
    for (int k = 0; k < 3; k++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            tcpu_matmul_case(types[k], sizes[s][0], sizes[s][1], sizes[s][2]);
}

// cpu_matvec (the GPU engine's CPU share): vector bodies of 32 and 8 and scalar tails, every dtype, rows split
// over the pool.
Test(cpu_kernels, matvec_all_dtypes_and_sizes) {
    static const int64_t sizes[][2] = {{1, 1}, {7, 5}, {8, 3}, {31, 9}, {32, 64}, {33, 130}, {257, 31}, {4099, 600}};
    uint32_t types[] = {DJ_F32, DJ_F16, DJ_BF16};
    tc_rng_seed(2);
    for (int simd = 1; simd >= 0; simd--) {  // the vector path where the CPU has it, then the portable one
        if (simd && !cpu_set_simd(CPU_SIMD_AVX2)) cr_log_info("this CPU lacks AVX2/FMA/F16C: only cpu_matvec's portable loop runs");
        cpu_set_simd(simd);
        for (int k = 0; k < 3; k++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                tcpu_mm_case(types[k], 1, sizes[s][0], sizes[s][1], 1);
    }
    cpu_set_simd(CPU_SIMD_BEST);
}

// cpu_matvec_multi (the CPU share of a pass of several rows): every tile shape of both vector paths (AVX2: 1..3
// rows by 1..4 columns; AVX-512: 1..4 rows by 1..6 columns, T = 2..9, 12, 13 and 17, rows 1..3 past a multiple of
// 3 and of 4), vector bodies and tails of the inputs (AVX-512: masked loads of 1..15 and none), every dtype, on
// AVX-512 (where the CPU has it), AVX2 and the portable loop.
Test(cpu_kernels, matvec_multi_all_dtypes_and_sizes) {
    static const int64_t sizes[][3] = {{2, 1, 1},     {3, 7, 5},    {4, 8, 3},    {5, 31, 9},   {6, 32, 64},
                                       {7, 33, 130},  {8, 257, 31}, {9, 100, 13}, {17, 4099, 40}, {1, 300, 7},
                                       {12, 20, 17},  {13, 16, 66}, {6, 47, 6}};
    uint32_t types[] = {DJ_F32, DJ_F16, DJ_BF16};
    tc_rng_seed(4);
    if (cpu_set_simd(CPU_SIMD_AVX512) != CPU_SIMD_AVX512)
        cr_log_info("this CPU lacks AVX-512 (F, BW, VL, DQ): cpu_matvec_multi's AVX-512 tiles are not tested here");
    for (int simd = CPU_SIMD_AVX512; simd >= 0; simd--) {
        cpu_set_simd(simd);
        for (int k = 0; k < 3; k++)
            for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
                tcpu_mm_case(types[k], sizes[s][0], sizes[s][1], sizes[s][2], 2);
    }
    cpu_set_simd(CPU_SIMD_BEST);
}

// cpu_matvec_start / cpu_matvec_finish (the GPU engine's CPU share, asynchronous): the workers wait for the ready
// word, then give cpu_matvec_multi's result bit for bit and store the job's number in the done word; the caller
// works meanwhile. The ready word comes from another thread (as the GPU's would), the gate, which opens it only once
// every thread of the job says (cpu_test_hook_waiting_x) that it waits for x, or once a word or an output moved
// before x landed: then no clock decides whether an early start is seen.
static _Atomic int tcpu_waiting;  // threads of the running job that found x not landed
static void tcpu_count_waiting(void) { atomic_fetch_add(&tcpu_waiting, 1); }

typedef struct {
    _Atomic uint32_t *word;  // the ready word the gate stores
    uint32_t seq;
    int parts;               // the job's threads
    float *x;
    const float *x_later;
    int64_t n;
    _Atomic uint32_t *words[2];  // the job's words (done; mid), which must not reach seq before x lands
    const float *outs[2];        // its outputs, -7 everywhere, which must stay so
    int64_t n_outs[2];
    const char *names[2];        // the outputs' names
    const char *early;           // what moved before x landed (NULL: nothing)
    _Atomic int opened;
    double t_open;               // dj_now just before x landed
} tcpu_gate;

static const char *tcpu_moved(tcpu_gate *g) {
    for (int k = 0; k < 2; k++) {
        if (g->words[k] && atomic_load(g->words[k]) == g->seq) return k ? "the mid word" : "the done word";
        for (int64_t i = 0; i < g->n_outs[k]; i++)
            if (g->outs[k][i] != -7.0f) return g->names[k];
    }
    return NULL;
}

static void *tcpu_gate_open(void *arg) {
    tcpu_gate *g = arg;
    while (atomic_load(&tcpu_waiting) < g->parts && !(g->early = tcpu_moved(g))) sched_yield();
    if (!g->early) g->early = tcpu_moved(g);
    g->t_open = dj_now();
    atomic_store(&g->opened, 1);
    memcpy(g->x, g->x_later, (size_t)g->n * sizeof(float));  // x lands, then the word
    atomic_store_explicit(g->word, g->seq, memory_order_release);
    return NULL;
}

// After cpu_matvec_finish: it returned after the gate opened, with nothing moved before, and the stamps it reports
// (t: when x was first seen, h whole, the last row done) in the order of the gate and its return.
static void tcpu_gate_check(tcpu_gate *g, pthread_t th, const double t[3], const char *what) {
    double t_back = dj_now();
    int opened = atomic_load(&g->opened);
    cr_assert(opened, "%s: cpu_matvec_finish returned before x landed", what);
    pthread_join(th, NULL);
    cr_assert(!g->early, "%s: %s moved before x landed", what, g->early);
    cr_assert(g->t_open <= t[0] && t[0] <= t[1] && t[1] <= t[2] && t[2] <= t_back, "%s: stamps %.9f %.9f %.9f "
              "outside the gate's %.9f and the return's %.9f", what, t[0], t[1], t[2], g->t_open, t_back);
}

Test(cpu_kernels, matvec_async_equals_sync) {
    static const int64_t sizes[][3] = {{1, 64, 1}, {1, 4096, 700}, {1, 96, 2000}, {3, 256, 301}, {8, 512, 97}};
    uint32_t types[] = {DJ_F32, DJ_F16, DJ_Q8, DJ_Q4};
    uint32_t seq = 0xfffffff0u;  // the numbers wrap within the test; each word starts at the last job's
    _Atomic uint32_t ready = seq, done = seq;
    cpu_job *job = cpu_job_new();
    cr_assert(job);
    tc_rng_seed(5);
    cpu_test_hook_waiting_x = tcpu_count_waiting;
    for (int k = 0; k < 8; k++)  // each dtype on a thread a core, then on 7 threads (a late worker's chunk taken)
        for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
            if (c == 0) cpu_pool_stop(), cpu_set_threads(k < 4 ? 0 : 7);
            int64_t T = sizes[c][0], n_in = sizes[c][1], n_out = sizes[c][2];
            uint32_t wt = types[k % 4];
            size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)n_in);
            float *x = malloc(sizeof(float) * T * n_in), *x0 = malloc(sizeof(float) * T * n_in);
            float *wf = malloc(sizeof(float) * n_in * n_out), *want = malloc(sizeof(float) * T * n_out);
            float *got = malloc(sizeof(float) * T * n_out);
            uint8_t *w = malloc(rb * (size_t)n_out);
            cr_assert(x && x0 && wf && want && got && w);
            tc_fill(x0, T * n_in, -1, 1);
            tc_fill(wf, n_in * n_out, -1, 1);
            if (dj_is_quant(wt))
                for (int64_t o = 0; o < n_out; o++)
                    quant_row(wt, wf + o * n_in, n_in, w + (size_t)o * rb, NULL, NULL);
            else
                tc_store(w, wf, n_in * n_out, wt);
            cpu_matvec_multi(want, x0, w, wt, T, n_in, n_out);
            memset(x, 0, sizeof(float) * T * n_in);
            for (int64_t i = 0; i < T * n_out; i++) got[i] = -7.0f;
            seq++;
            tcpu_gate gate = {.word = &ready, .seq = seq, .parts = cpu_threads(), .x = x, .x_later = x0,
                              .n = T * n_in, .words = {&done}, .outs = {got}, .n_outs = {T * n_out}, .names = {"y"}};
            tcpu_waiting = 0;
            pthread_t th;
            cr_assert_eq(pthread_create(&th, NULL, tcpu_gate_open, &gate), 0);
            cpu_matvec_start(job, got, x, w, wt, T, n_in, n_out, &ready, &done, seq);
            double t[3];
            cpu_matvec_finish(job, t);
            char what[96];
            snprintf(what, sizeof what, "%s T=%ld n_in=%ld n_out=%ld", dj_dtype_name(wt), (long)T, (long)n_in,
                     (long)n_out);
            cr_assert_eq(atomic_load(&done), seq, "%s: done word %u", what, atomic_load(&done));
            tcpu_gate_check(&gate, th, t, what);
            cr_assert_eq(t[1], t[2], "%s: a matvec has no h: t[1] is t[2]", what);
            cr_assert(memcmp(got, want, sizeof(float) * T * n_out) == 0, "%s T=%ld n_in=%ld n_out=%ld: not bitwise "
                      "cpu_matvec_multi's", dj_dtype_name(wt), (long)T, (long)n_in, (long)n_out);
            free(x), free(x0), free(wf), free(want), free(got), free(w);
        }
    cpu_pool_stop(), cpu_set_threads(0);
    cpu_test_hook_waiting_x = NULL;
    cpu_job_free(job);
}

// Weights (n_out, n_in) of wtype from uniform values in [-1, 1): stored, or quantized row by row.
static uint8_t *tcpu_weights(uint32_t wt, int64_t n_in, int64_t n_out) {
    size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)n_in);
    float *wf = malloc(sizeof(float) * (size_t)(n_in * n_out));
    uint8_t *w = malloc(rb * (size_t)n_out);
    cr_assert(wf && w);
    tc_fill(wf, n_in * n_out, -1, 1);
    if (dj_is_quant(wt))
        for (int64_t o = 0; o < n_out; o++) quant_row(wt, wf + o * n_in, n_in, w + (size_t)o * rb, NULL, NULL);
    else
        tc_store(w, wf, n_in * n_out, wt);
    free(wf);
    return w;
}

// cpu_ffn_start (the CPU share's chain): h and the down rows bit for bit what cpu_matvec_multi and cpu_swiglu give
// step by step, over T rows (one-row and tiles' paths, at every vector level, on a pool of a thread a core and on
// one of more threads than cores), fused and separate gate|up, with and without down rows; no word and no output
// before x lands, both words after.
Test(cpu_kernels, ffn_chain_equals_steps) {
    static const int64_t sizes[][4] = {{1, 64, 96, 40}, {1, 512, 700, 512}, {3, 128, 301, 77}, {8, 96, 160, 0},
                                       {1, 96, 2000, 1}};  // T, dim, hid, n_down
    uint32_t types[] = {DJ_F32, DJ_F16, DJ_BF16, DJ_Q8, DJ_Q4};
    uint32_t seq = 0xfffffff8u;
    _Atomic uint32_t ready = seq, mid = seq, done = seq;
    cpu_job *job = cpu_job_new();
    cr_assert(job);
    tc_rng_seed(6);
    cpu_test_hook_waiting_x = tcpu_count_waiting;
    // each dtype at each vector level (the widest, AVX2, the portable loops), on a thread a core and on 7 threads
    // (more than CI's cores: a late worker's own first chunk is taken by another)
    for (int k = 0; k < 30; k++)
        for (size_t c = 0; c < sizeof sizes / sizeof *sizes; c++) {
            if (c == 0) cpu_pool_stop(), cpu_set_threads(k < 15 ? 0 : 7);
            cpu_set_simd(k % 15 / 5 == 0 ? CPU_SIMD_BEST : k % 15 / 5 == 1 ? CPU_SIMD_AVX2 : 0);
            int64_t T = sizes[c][0], dim = sizes[c][1], hid = sizes[c][2], nd = sizes[c][3], rows = nd + 5;
            uint32_t wt = types[k % 5];
            int fused = c % 2 == 0;
            uint8_t *gu = tcpu_weights(wt, dim, 2 * hid), *dn = tcpu_weights(wt, hid, rows);
            size_t rbd = (size_t)dj_row_bytes(wt, (uint64_t)hid);
            const uint8_t *up = gu + (size_t)hid * (size_t)dj_row_bytes(wt, (uint64_t)dim);
            uint8_t *up_apart = NULL;  // separate: up elsewhere
            if (!fused) {
                size_t ub = (size_t)dj_matrix_bytes(wt, (uint64_t)hid, (uint64_t)dim);
                cr_assert((up_apart = malloc(ub)));
                memcpy(up_apart, up, ub);
                up = up_apart;
            }
            float *x = calloc((size_t)(T * dim), 4), *x0 = malloc(sizeof(float) * (size_t)(T * dim));
            float *g = malloc(sizeof(float) * (size_t)(T * hid)), *u = malloc(sizeof(float) * (size_t)(T * hid));
            size_t hb = sizeof(float) * (size_t)(T * hid), yb = sizeof(float) * (size_t)(T * (nd + 1));
            float *h_want = malloc(hb), *y_want = malloc(yb), *h = malloc(hb), *y = malloc(yb);
            float *scratch = malloc(sizeof(float) * (size_t)(2 * T * hid));
            cr_assert(x && x0 && g && u && h_want && y_want && h && y && scratch);
            tc_fill(x0, T * dim, -1, 1);
            cpu_matvec_multi(g, x0, gu, wt, T, dim, hid);
            cpu_matvec_multi(u, x0, up, wt, T, dim, hid);
            cpu_swiglu(h_want, g, u, T * hid);
            const uint8_t *dn_rows = dn + (size_t)(rows - nd) * rbd;
            if (nd) cpu_matvec_multi(y_want, h_want, dn_rows, wt, T, hid, nd);
            for (int64_t i = 0; i < T * hid; i++) h[i] = -7.0f;
            for (int64_t i = 0; i < T * (nd + 1); i++) y[i] = -7.0f;
            seq++;
            tcpu_gate gate = {.word = &ready, .seq = seq, .parts = cpu_threads(), .x = x, .x_later = x0,
                              .n = T * dim, .words = {&done, &mid}, .outs = {h, y}, .n_outs = {T * hid, T * (nd + 1)},
                              .names = {"h", "y"}};
            tcpu_waiting = 0;
            pthread_t th;
            cr_assert_eq(pthread_create(&th, NULL, tcpu_gate_open, &gate), 0);
            cpu_ffn_args f = {h, y, scratch, x, gu, up, dn_rows, wt, T, dim, hid, nd};
            cpu_ffn_start(job, &f, &ready, &mid, &done, seq);
            double t[3];
            cpu_matvec_finish(job, t);
            const char *name = dj_dtype_name(wt);
            cr_assert(atomic_load(&mid) == seq && atomic_load(&done) == seq, "%s case %zu: words %u %u, want %u", name,
                      c, atomic_load(&mid), atomic_load(&done), seq);
            char what[96];
            snprintf(what, sizeof what, "%s case %zu (T=%ld dim=%ld hid=%ld)", name, c, (long)T, (long)dim, (long)hid);
            tcpu_gate_check(&gate, th, t, what);
            cr_assert(memcmp(h, h_want, sizeof(float) * (size_t)(T * hid)) == 0, "%s case %zu (T=%ld dim=%ld hid=%ld):"
                      " h not the steps'", name, c, (long)T, (long)dim, (long)hid);
            cr_assert(!nd || memcmp(y, y_want, sizeof(float) * (size_t)(T * nd)) == 0, "%s case %zu: down rows not "
                      "the steps'", name, c);
            cr_assert(y[T * nd] == -7.0f, "%s case %zu: written past the down rows", name, c);
            free(gu), free(dn), free(up_apart), free(x), free(x0), free(g), free(u), free(h_want), free(y_want);
            free(h), free(y), free(scratch);
        }
    cpu_pool_stop(), cpu_set_threads(0);
    cpu_test_hook_waiting_x = NULL;
    cpu_job_free(job);
    cpu_set_simd(CPU_SIMD_BEST);
}

// Every finite f16 and bf16 widened by cpu_matvec's vector path (rows of 8 and 32, one nonzero weight each, in
// every lane) and by its tail (rows of 1), against x = 1: exactly the widened value.
Test(cpu_kernels, matvec_widening_exact) {
    static const uint32_t types[] = {DJ_F16, DJ_BF16};
    static const int64_t widths[] = {1, 8, 32};
    for (int c = 0; c < 12; c++) {  // vector path (where the CPU has it), then the portable loop; each dtype and width
        const int simd = c < 6, k = c / 3 % 2;
        const int64_t n_in = widths[c % 3];
        int64_t n = 0;
        uint16_t *vals = malloc(2 * 65536);
        for (uint32_t h = 0; h < 65536; h++) {
            int finite = types[k] == DJ_F16 ? ((h >> 10) & 0x1f) != 0x1f : ((h >> 7) & 0xff) != 0xff;
            if (finite) vals[n++] = (uint16_t)h;
        }
        uint16_t *w = calloc((size_t)(n * n_in), 2);
        float *x = malloc(sizeof(float) * n_in), *y = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n_in; i++) x[i] = 1.0f;
        for (int64_t r = 0; r < n; r++) w[r * n_in + r % n_in] = vals[r];
        cpu_set_simd(simd);
        cpu_matvec(y, x, w, types[k], n_in, n);
        cpu_set_simd(CPU_SIMD_BEST);
        for (int64_t r = 0; r < n; r++) {
            float want = types[k] == DJ_F16 ? dj_f16_to_f32(vals[r]) : dj_bf16_to_f32(vals[r]);
            cr_assert_eq(y[r], want, "%s %#x, row width %ld, %s", dj_dtype_name(types[k]), vals[r], (long)n_in,
                         simd ? "vector path" : "portable loop");
        }
        free(vals), free(w), free(x), free(y);
    }
}

Test(cpu_kernels, matmul_f16_widening_exact) {
    // Every finite f16 as a weight against x = 1: y must be exactly the widened value.
    uint16_t *w = malloc(2 * 65536);
    int64_t n = 0;
    for (uint32_t h = 0; h < 65536; h++)
        if (((h >> 10) & 0x1f) != 0x1f) w[n++] = (uint16_t)h;
    float x = 1.0f, *y = malloc(sizeof(float) * n);
    cpu_matmul(y, &x, w, DJ_F16, 1, 1, n);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(y[i], dj_f16_to_f32(w[i]), "f16 %#x", w[i]);
    free(w), free(y);
}

// ---- rmsnorm, swiglu
Test(cpu_kernels, rmsnorm_matches_double_and_aliases) {
    tc_rng_seed(2);
    int64_t sizes[] = {1, 8, 64, 1001};
    for (int k = 0; k < 4; k++) {
        int64_t n = sizes[k];
        float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
        double *want = malloc(sizeof(double) * n);
        tc_fill(x, n, -3, 3);
        tc_fill(w, n, 0.5f, 1.5f);
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double r = 1.0 / sqrt(ss / n + 1e-5);
        for (int64_t i = 0; i < n; i++) want[i] = x[i] * r * w[i];
        cpu_rmsnorm(out, x, w, n, 1e-5f);
        cr_assert_lt(tc_rel_l2_d(out, want, n), 1e-6, "n=%ld", (long)n);
        cpu_rmsnorm(x, x, w, n, 1e-5f);  // in place
        cr_assert_lt(tc_rel_l2_d(x, want, n), 1e-6, "in place, n=%ld", (long)n);
        free(x), free(w), free(out), free(want);
    }
}

Test(cpu_kernels, swiglu_matches_double) {
    tc_rng_seed(3);
    enum { N = 513 };
    float g[N], u[N], out[N];
    double want[N];
    tc_fill(g, N, -8, 8);
    tc_fill(u, N, -2, 2);
    for (int i = 0; i < N; i++) want[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    cpu_swiglu(out, g, u, N);
    cr_assert_lt(tc_rel_l2_d(out, want, N), 1e-6);
    cpu_swiglu(g, g, u, N);  // out aliasing gate
    cr_assert_lt(tc_rel_l2_d(g, want, N), 1e-6);
}

// ---- RoPE
static dj_config tcpu_rope_config(uint32_t head_dim, float theta, int llama3) {
    dj_config c = {0};
    c.head_dim = head_dim;
    c.rope_theta = theta;
    if (llama3) {
        c.rope_type = DJ_ROPE_LLAMA3;
        c.rope_factor = 8, c.rope_low_freq = 1, c.rope_high_freq = 4, c.rope_orig_max = 32;
    }
    return c;
}

Test(cpu_kernels, rope_freqs_default) {
    dj_config c = tcpu_rope_config(64, 10000, 0);
    float f[32];
    cpu_rope_freqs(&c, f);
    for (int i = 0; i < 32; i++) {
        double want = 1.0 / pow(10000.0, 2.0 * i / 64.0);
        cr_assert(fabs(f[i] - want) <= 1e-6 * want, "inv_freq[%d] %g vs %g", i, f[i], want);
    }
}

Test(cpu_kernels, rope_freqs_llama3) {
    dj_config c = tcpu_rope_config(32, 500000, 1), d = tcpu_rope_config(32, 500000, 0);
    float f[16], base[16];
    cpu_rope_freqs(&c, f);
    cpu_rope_freqs(&d, base);
    int high = 0, low = 0, mid = 0;
    for (int i = 0; i < 16; i++) {
        // double-precision transcription of transformers' _compute_llama3_parameters
        double inv = base[i], wavelen = 2 * M_PI / inv, want;
        if (wavelen < 32.0 / 4) {
            want = inv, high++;
        } else if (wavelen > 32.0 / 1) {
            want = inv / 8, low++;
        } else {
            double s = (32.0 / wavelen - 1) / (4 - 1);
            want = (1 - s) * inv / 8 + s * inv, mid++;
        }
        cr_assert(fabs(f[i] - want) <= 1e-6 * want, "inv_freq[%d] %g vs %g", i, f[i], want);
    }
    cr_assert(high > 0 && low > 0 && mid > 0, "all three bands exercised (%d/%d/%d)", high, mid, low);
}

Test(cpu_kernels, rope_rotate_half) {
    tc_rng_seed(4);
    enum { H = 3, HD = 24 };
    dj_config c = tcpu_rope_config(HD, 10000, 0);
    float f[HD / 2], x[H * HD], x0[H * HD];
    cpu_rope_freqs(&c, f);
    int64_t positions[] = {0, 1, 7, 300, 4095};
    for (int k = 0; k < 5; k++) {
        int64_t pos = positions[k];
        tc_fill(x0, H * HD, -1, 1);
        memcpy(x, x0, sizeof x);
        cpu_rope(x, H, HD, pos, f);
        double want[H * HD];
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD / 2; i++) {
                double a = x0[h * HD + i], b = x0[h * HD + i + HD / 2], ang = (double)((float)pos * f[i]);
                want[h * HD + i] = a * cos(ang) - b * sin(ang);
                want[h * HD + i + HD / 2] = b * cos(ang) + a * sin(ang);
            }
        cr_assert_lt(tc_rel_l2_d(x, want, H * HD), 1e-6, "pos %ld", (long)pos);
        if (pos == 0) cr_assert(!memcmp(x, x0, sizeof x), "position 0 is the identity");
    }
}

Test(cpu_kernels, rope_scores_depend_on_relative_position) {
    tc_rng_seed(5);
    enum { HD = 16 };
    dj_config c = tcpu_rope_config(HD, 10000, 0);
    float f[HD / 2], q[HD], k[HD], qa[HD], ka[HD];
    cpu_rope_freqs(&c, f);
    tc_fill(q, HD, -1, 1);
    tc_fill(k, HD, -1, 1);
    double first = 0;
    for (int shift = 0; shift < 40; shift += 13) {
        memcpy(qa, q, sizeof q), memcpy(ka, k, sizeof k);
        cpu_rope(qa, 1, HD, 10 + shift, f);
        cpu_rope(ka, 1, HD, 3 + shift, f);
        double dot = 0;
        for (int i = 0; i < HD; i++) dot += (double)qa[i] * ka[i];
        if (shift == 0) first = dot;
        cr_assert(fabs(dot - first) < 1e-4, "q.k at distance 7 changes with the shift %d: %g vs %g", shift, dot, first);
    }
}

// ---- attention
Test(cpu_kernels, attention_gqa_matches_double) {
    tc_rng_seed(6);
    enum { NH = 6, NKV = 2, HD = 12, MAXS = 40 };
    float *kc = malloc(sizeof(float) * NKV * MAXS * HD), *vc = malloc(sizeof(float) * NKV * MAXS * HD);
    float q[NH * HD], out[NH * HD];
    double want[NH * HD];
    tc_fill(kc, NKV * MAXS * HD, -2, 2);
    tc_fill(vc, NKV * MAXS * HD, -1, 1);
    int64_t positions[] = {0, 1, 17, MAXS - 1};
    for (int p = 0; p < 4; p++) {
        int64_t pos = positions[p];
        tc_fill(q, NH * HD, -2, 2);
        cpu_attention(out, q, kc, vc, NH, NKV, HD, pos, MAXS);
        for (int h = 0; h < NH; h++) {
            const float *k = kc + (h / (NH / NKV)) * MAXS * HD, *v = vc + (h / (NH / NKV)) * MAXS * HD;
            double s[MAXS], mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos; t++) {
                s[t] = 0;
                for (int i = 0; i < HD; i++) s[t] += (double)q[h * HD + i] * k[t * HD + i];
                s[t] /= sqrt((double)HD);
                mx = fmax(mx, s[t]);
            }
            for (int t = 0; t <= pos; t++) sum += s[t] = exp(s[t] - mx);
            for (int i = 0; i < HD; i++) {
                want[h * HD + i] = 0;
                for (int t = 0; t <= pos; t++) want[h * HD + i] += s[t] / sum * v[t * HD + i];
            }
        }
        cr_assert_lt(tc_rel_l2_d(out, want, NH * HD), 1e-6, "pos %ld", (long)pos);
        if (pos == 0)  // one key: the output is that key's value
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < HD; i++)
                    cr_assert_float_eq(out[h * HD + i], vc[(h / (NH / NKV)) * MAXS * HD + i], 1e-6);
    }
    free(kc), free(vc);
}

// ---- forward pass: a random model built in memory against a naive double-precision forward
typedef struct {
    dj_model m;
    float *embed;                // (vocab, dim) as stored (rounded)
    float **wq, **wk, **wv, **wo, **wg, **wu, **wd, **an, **fn;  // per layer, as stored
    float *norm, *head;          // (dim), (vocab, dim)
} tcpu_model;

static float *tcpu_put(tcpu_model *tm, uint64_t off, int64_t n, float scale, uint32_t wtype) {
    float *v = malloc(sizeof(float) * n);
    tc_fill(v, n, -scale, scale);
    tc_store(tm->m.data + off, v, n, wtype);
    return v;
}
static float *tcpu_put_norm(tcpu_model *tm, uint64_t off, int64_t n) {
    float *v = malloc(sizeof(float) * n);
    tc_fill(v, n, 0.5f, 1.5f);
    memcpy(tm->m.data + off, v, sizeof(float) * n);
    return v;
}

static void tcpu_build(tcpu_model *tm, const dj_config *c) {
    memset(tm, 0, sizeof *tm);
    dj_err e;
    cr_assert_eq(model_plan(c, 4096, &tm->m.info, &e), 0, "%s", e.msg);
    tm->m.data_size = tm->m.info.file_size;
    tm->m.data = aligned_alloc(4096, dj_align_up(tm->m.data_size, 4096));
    memset(tm->m.data, 0, tm->m.data_size);
    const dj_model_info *I = &tm->m.info;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t hid = c->hidden_dim;
    uint32_t wt = c->wtype;
    tm->embed = tcpu_put(tm, I->embed_off, (int64_t)c->vocab_size * dim, 1.0f, wt);
    int L = c->n_layers;
    float ***all[] = {&tm->wq, &tm->wk, &tm->wv, &tm->wo, &tm->wg, &tm->wu, &tm->wd, &tm->an, &tm->fn};
    for (int k = 0; k < 9; k++) *all[k] = calloc(L, sizeof(float *));
    for (int l = 0; l < L; l++) {
        uint64_t b = I->layer_off[l];
        const dj_layer_layout *y = &I->layer;
        tm->an[l] = tcpu_put_norm(tm, b + y->attn_norm, dim);
        tm->fn[l] = tcpu_put_norm(tm, b + y->ffn_norm, dim);
        tm->wq[l] = tcpu_put(tm, b + y->wq, q * dim, 3.0f / sqrtf(dim), wt);
        tm->wk[l] = tcpu_put(tm, b + y->wk, kv * dim, 3.0f / sqrtf(dim), wt);
        tm->wv[l] = tcpu_put(tm, b + y->wv, kv * dim, 1.7f / sqrtf(dim), wt);
        tm->wo[l] = tcpu_put(tm, b + y->wo, dim * q, 1.7f / sqrtf(q), wt);
        tm->wg[l] = tcpu_put(tm, b + y->w_gate, hid * dim, 1.7f / sqrtf(dim), wt);
        tm->wu[l] = tcpu_put(tm, b + y->w_up, hid * dim, 1.7f / sqrtf(dim), wt);
        tm->wd[l] = tcpu_put(tm, b + y->w_down, dim * hid, 1.7f / sqrtf(hid), wt);
    }
    tm->norm = tcpu_put_norm(tm, I->head_off + I->head.norm, dim);
    tm->head = c->tied ? tm->embed
                       : tcpu_put(tm, I->head_off + I->head.lm_head, (int64_t)c->vocab_size * dim, 1.7f / sqrtf(dim), wt);
}

static void tcpu_free(tcpu_model *tm) {
    int L = tm->m.info.config.n_layers;
    float ***all[] = {&tm->wq, &tm->wk, &tm->wv, &tm->wo, &tm->wg, &tm->wu, &tm->wd, &tm->an, &tm->fn};
    for (int k = 0; k < 9; k++) {
        for (int l = 0; l < L; l++) free((*all[k])[l]);
        free(*all[k]);
    }
    if (tm->head != tm->embed) free(tm->head);
    free(tm->embed), free(tm->norm);
    free(tm->m.data);
    dj_info_free(&tm->m.info);
}

// y (n_out) = W (n_out, n_in) x, in double
static void tcpu_mv(double *y, const float *w, const double *x, int64_t n_in, int64_t n_out) {
    for (int64_t o = 0; o < n_out; o++) {
        double s = 0;
        for (int64_t i = 0; i < n_in; i++) s += (double)w[o * n_in + i] * x[i];
        y[o] = s;
    }
}
static void tcpu_norm(double *y, const double *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

// Whole-sequence forward, the textbook way: logits (T, vocab). RoPE angles in double from double inv_freq.
static void tcpu_ref_forward(const tcpu_model *tm, const int32_t *tok, int64_t T, double *logits) {
    const dj_config *c = &tm->m.info.config;
    int64_t dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, hid = c->hidden_dim;
    int64_t qd = nh * hd, kvd = nkv * hd, V = c->vocab_size;
    double *x = calloc(T * dim, 8), *xb = calloc(dim, 8), *q = calloc(T * qd, 8), *k = calloc(T * kvd, 8),
           *v = calloc(T * kvd, 8), *att = calloc(qd, 8), *o = calloc(dim, 8), *g = calloc(hid, 8),
           *u = calloc(hid, 8), *sc = calloc(T, 8), *freq = calloc(hd / 2, 8);
    for (int64_t i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(c->rope_theta, 2.0 * i / hd);
        if (c->rope_type == DJ_ROPE_LLAMA3) {
            double wl = 2 * M_PI / f, lw = c->rope_orig_max / c->rope_low_freq, hw = c->rope_orig_max / c->rope_high_freq;
            if (wl > lw) {
                f /= c->rope_factor;
            } else if (wl >= hw) {
                double s = (c->rope_orig_max / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                f = (1 - s) * f / c->rope_factor + s * f;
            }
        }
        freq[i] = f;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < dim; i++) x[t * dim + i] = tm->embed[tok[t] * dim + i];
    for (uint32_t l = 0; l < c->n_layers; l++) {
        for (int64_t t = 0; t < T; t++) {
            tcpu_norm(xb, x + t * dim, tm->an[l], dim, c->norm_eps);
            tcpu_mv(q + t * qd, tm->wq[l], xb, dim, qd);
            tcpu_mv(k + t * kvd, tm->wk[l], xb, dim, kvd);
            tcpu_mv(v + t * kvd, tm->wv[l], xb, dim, kvd);
            for (int64_t h = 0; h < nh + nkv; h++) {
                double *r = h < nh ? q + t * qd + h * hd : k + t * kvd + (h - nh) * hd;
                for (int64_t i = 0; i < hd / 2; i++) {
                    double a = r[i], b = r[i + hd / 2], ang = t * freq[i];
                    r[i] = a * cos(ang) - b * sin(ang);
                    r[i + hd / 2] = b * cos(ang) + a * sin(ang);
                }
            }
        }
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < nh; h++) {
                int64_t kh = h / (nh / nkv);
                double mx = -INFINITY, sum = 0;
                for (int64_t s = 0; s <= t; s++) {
                    double d = 0;
                    for (int64_t i = 0; i < hd; i++) d += q[t * qd + h * hd + i] * k[s * kvd + kh * hd + i];
                    sc[s] = d / sqrt((double)hd);
                    mx = fmax(mx, sc[s]);
                }
                for (int64_t s = 0; s <= t; s++) sum += sc[s] = exp(sc[s] - mx);
                for (int64_t i = 0; i < hd; i++) {
                    double a = 0;
                    for (int64_t s = 0; s <= t; s++) a += sc[s] / sum * v[s * kvd + kh * hd + i];
                    att[h * hd + i] = a;
                }
            }
            tcpu_mv(o, tm->wo[l], att, qd, dim);
            for (int64_t i = 0; i < dim; i++) x[t * dim + i] += o[i];
            tcpu_norm(xb, x + t * dim, tm->fn[l], dim, c->norm_eps);
            tcpu_mv(g, tm->wg[l], xb, dim, hid);
            tcpu_mv(u, tm->wu[l], xb, dim, hid);
            for (int64_t i = 0; i < hid; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            tcpu_mv(o, tm->wd[l], g, hid, dim);
            for (int64_t i = 0; i < dim; i++) x[t * dim + i] += o[i];
        }
    }
    for (int64_t t = 0; t < T; t++) {
        tcpu_norm(xb, x + t * dim, tm->norm, dim, c->norm_eps);
        tcpu_mv(logits + t * V, tm->head, xb, dim, V);
    }
    free(x), free(xb), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc), free(freq);
}

static dj_config tcpu_config(uint32_t wtype, int tied, int llama3) {
    dj_config c = {0};
    c.dim = 48, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;  // head_dim != dim / n_heads
    c.hidden_dim = 72, c.vocab_size = 97, c.max_seq_len = 128, c.tied = (uint32_t)tied;
    dj_config_set_wtype(&c, wtype);
    c.norm_eps = 1e-5f, c.rope_theta = 10000;
    if (llama3) {
        c.rope_type = DJ_ROPE_LLAMA3, c.rope_theta = 500000;
        c.rope_factor = 8, c.rope_low_freq = 1, c.rope_high_freq = 4, c.rope_orig_max = 16;
    }
    return c;
}

// Prefill of T tokens in one call, then the same tokens one at a time; both against the double reference.
static void tcpu_forward_case(uint32_t wtype, int tied, int llama3, int64_t T) {
    dj_config c = tcpu_config(wtype, tied, llama3);
    tcpu_model tm;
    tcpu_build(&tm, &c);
    int64_t V = c.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * T);
    for (int64_t t = 0; t < T; t++) tok[t] = (int32_t)tc_uniform(0, (float)V - 0.01f);
    double *want = malloc(sizeof(double) * T * V);
    float *got = malloc(sizeof(float) * T * V), *one = malloc(sizeof(float) * V);
    tcpu_ref_forward(&tm, tok, T, want);
    dj_err e;
    dj_cpu_state *s = cpu_state_new(&tm.m, T, &e);
    cr_assert(s, "%s", e.msg);
    cr_assert_eq(cpu_forward(s, tok, T, 0, got, &e), 0, "%s", e.msg);
    for (int64_t t = 0; t < T; t++) {
        double err = tc_rel_l2_d(got + t * V, want + t * V, V);
        cr_assert_lt(err, 2e-5, "%s tied=%d llama3=%d: position %ld rel L2 %g", dj_dtype_name(wtype), tied, llama3,
                     (long)t, err);
    }
    dj_cpu_state *s1 = cpu_state_new(&tm.m, T, &e);
    cr_assert(s1, "%s", e.msg);
    for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(cpu_forward(s1, tok + t, 1, t, one, &e), 0, "%s", e.msg);
        double err = tc_rel_l2_d(one, want + t * V, V);
        cr_assert_lt(err, 2e-5, "token by token: position %ld rel L2 %g", (long)t, err);
    }
    cpu_state_free(s);
    cpu_state_free(s1);
    free(tok), free(want), free(got), free(one);
    tcpu_free(&tm);
}

Test(cpu_forward, f32_untied_default_rope) { tcpu_forward_case(DJ_F32, 0, 0, 45); }
Test(cpu_forward, f16_tied_default_rope) { tcpu_forward_case(DJ_F16, 1, 0, 20); }
Test(cpu_forward, bf16_untied_llama3_rope) { tcpu_forward_case(DJ_BF16, 0, 1, 70); }

// The KV cache in each type (kvtype.h), with two kv heads and with one (MQA: the query heads of every row of a pass
// read the same kv head's rows): the prompt in one pass, token by token, and in cpu_step_rows's passes of runs of
// two slots interleaved give bitwise the same logits, each the same dot products over the same stored keys; and
// those are within `tol` relative L2 of the double reference at every position (f32 2e-5 as above; f16 1e-2 and q8
// 0.2, the worst of 20 seeds being 2.6e-3 and 5.8e-2).
static void tcpu_kv_case(int kv, uint32_t n_kv_heads, int64_t T, double tol) {
    dj_config c = tcpu_config(DJ_F32, 0, 0);
    c.n_kv_heads = n_kv_heads;
    tcpu_model tm;
    tcpu_build(&tm, &c);
    const int64_t V = c.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * T), slots[2 * 16], toks[2 * 16], want[2 * 16];
    for (int64_t t = 0; t < T; t++) tok[t] = (int32_t)tc_below((uint32_t)V);
    double *ref = malloc(sizeof(double) * T * V);
    float *all = malloc(sizeof(float) * T * V), *one = malloc(sizeof(float) * V),
          *rows = malloc(sizeof(float) * 2 * 16 * V);
    int64_t pos[2 * 16];
    tcpu_ref_forward(&tm, tok, T, ref);
    dj_err e;
    dj_cpu_state *s = cpu_state_new_slots(&tm.m, T, 2, kv, &e), *s1 = cpu_state_new_slots(&tm.m, T, 1, kv, &e),
                 *s2 = cpu_state_new_slots(&tm.m, T, 2, kv, &e);
    cr_assert(s && s1 && s2, "%s", e.msg);
    cr_assert_eq(cpu_forward_slot(s, 1, tok, T, 0, all, &e), 0, "%s", e.msg);
    for (int64_t t = 0; t < T; t++) {
        double err = tc_rel_l2_d(all + t * V, ref + t * V, V);
        cr_assert_lt(err, tol, "%s KV, %u kv heads: position %ld rel L2 %g from the reference (seed %llu)",
                     dj_kv_name(kv), n_kv_heads, (long)t, err, (unsigned long long)tc_seed_used());
        cr_assert_eq(cpu_forward(s1, tok + t, 1, t, one, &e), 0, "%s", e.msg);
        cr_assert_eq(memcmp(one, all + t * V, sizeof(float) * V), 0, "%s KV, %u kv heads: position %ld token by "
                     "token differs from the prompt's pass (seed %llu)", dj_kv_name(kv), n_kv_heads, (long)t,
                     (unsigned long long)tc_seed_used());
    }
    // both slots of s2 fed the same tokens in runs of 1 to 16 rows, slot 1's runs after slot 0's in each pass
    for (int64_t done[2] = {0, 0}; done[0] < T || done[1] < T;) {
        int64_t n = 0;
        for (int32_t k = 0; k < 2; k++)
            for (int64_t take = 1 + tc_below(16); take > 0 && done[k] < T; take--, done[k]++)
                slots[n] = k, pos[n] = done[k], toks[n] = tok[done[k]], want[n] = (int32_t)n, n++;
        cr_assert_eq(cpu_step_rows(s2, n, slots, pos, toks, n, want, rows, &e), 0, "%s", e.msg);
        for (int64_t r = 0; r < n; r++)
            cr_assert_eq(memcmp(rows + r * V, all + pos[r] * V, sizeof(float) * V), 0,
                         "%s KV, %u kv heads: slot %d position %ld in a pass of runs differs from the prompt's pass "
                         "(seed %llu)", dj_kv_name(kv), n_kv_heads, slots[r], (long)pos[r],
                         (unsigned long long)tc_seed_used());
    }
    cpu_state_free(s), cpu_state_free(s1), cpu_state_free(s2);
    free(tok), free(ref), free(all), free(one), free(rows);
    tcpu_free(&tm);
}

Test(cpu_forward, kv_types_every_pass_alike) {
    tc_rng_fresh("cpu_forward.kv_types_every_pass_alike");
    const double tol[DJ_KV_TYPES] = {2e-5, 1e-2, 0.2};
    for (int kv = 0; kv < DJ_KV_TYPES; kv++)
        for (uint32_t nkv = 1; nkv <= 2; nkv++) tcpu_kv_case(kv, nkv, 50, tol[kv]);
}

Test(cpu_forward, llama3_scaling_changes_logits) {
    // The llama3 case above would pass vacuously if scaling had no effect at these positions.
    dj_config a = tcpu_config(DJ_F32, 0, 1), b = a;
    b.rope_type = DJ_ROPE_DEFAULT;  // and no llama3 fields, which a default-RoPE config must leave zero
    b.rope_factor = b.rope_low_freq = b.rope_high_freq = 0, b.rope_orig_max = 0;
    tcpu_model ta, tb;
    tc_rng_seed(9);
    tcpu_build(&ta, &a);
    tc_rng_seed(9);
    tcpu_build(&tb, &b);
    enum { T = 40 };
    int32_t tok[T];
    for (int t = 0; t < T; t++) tok[t] = (t * 37) % 97;
    double *la = malloc(sizeof(double) * T * 97), *lb = malloc(sizeof(double) * T * 97);
    tcpu_ref_forward(&ta, tok, T, la);
    tcpu_ref_forward(&tb, tok, T, lb);
    float *fa = malloc(sizeof(float) * T * 97);
    for (int i = 0; i < T * 97; i++) fa[i] = (float)la[i];
    cr_assert_gt(tc_rel_l2_d(fa + (T - 1) * 97, lb + (T - 1) * 97, 97), 1e-2);
    free(la), free(lb), free(fa);
    tcpu_free(&ta);
    tcpu_free(&tb);
}

Test(cpu_forward, rejects_bad_tokens_and_positions) {
    dj_config c = tcpu_config(DJ_F32, 1, 0);
    tcpu_model tm;
    tcpu_build(&tm, &c);
    dj_err e;
    dj_cpu_state *s = cpu_state_new(&tm.m, 8, &e);
    cr_assert(s);
    float logits[97];
    int32_t bad = 97, neg = -1, ok = 5;
    cr_assert_eq(cpu_forward(s, &bad, 1, 0, logits, &e), -1);
    cr_assert(strstr(e.msg, "out of range"), "%s", e.msg);
    cr_assert_eq(cpu_forward(s, &neg, 1, 0, logits, &e), -1);
    cr_assert_eq(cpu_forward(s, &ok, 1, 8, logits, &e), -1);
    cr_assert(strstr(e.msg, "context"), "%s", e.msg);
    cr_assert_eq(cpu_forward(s, &ok, 1, 7, logits, &e), 0, "%s", e.msg);
    cr_assert_null(cpu_state_new(&tm.m, 0, &e));
    cr_assert_null(cpu_state_new_slots(&tm.m, 8, 1, DJ_KV_TYPES, &e), "a KV type past the last");
    cr_assert(strstr(e.msg, "KV type 3 unknown"), "%s", e.msg);
    cr_assert_null(cpu_state_new_slots(&tm.m, 8, 1, -1, &e), "KV type -1");
    cpu_state_free(s);
    tcpu_free(&tm);
}
