// test_kernels.c: every GPU kernel (ops.cu, matmul.cu, attention.cu, sample.cu) against the CPU reference in
// model.c (or, for sampling, the host sampler's version of the same rule), on fresh random inputs at
// several sizes.
// Outputs are poisoned with NaN (0xff bytes) before each run so an unwritten element fails the check.
// The seed comes from the clock and is printed; DJINN_SEED=<n> replays a run (tests/common.h). Without a GPU every test
// skips with the reason.
//
// Tolerances (relative L2 error against the reference):
//   f32 arithmetic on both sides (norms, RoPE, attention, SwiGLU, our GEMV for every dtype, cuBLAS with
//   f32 weights in plain fp32): 1e-5, i.e. summation-order rounding only.
//   cuBLAS with f16 weights: 1e-3 (x is rounded to f16, 11-bit significand, for the tensor cores).
//   cuBLAS with bf16 weights: 1e-4 (x split into bf16 hi + lo, two GEMMs: ~16 significant bits).
//   KV writes and sampling (gpu_pick against the host sampler, sampler.h's rule): exact.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels.h"
#include "../model.h"
#include "../cpu.h"
#include "../quant.h"
#include "common.h"

// ---- fixtures: seed, GPU context
static dj_gpu *tk_g;
static cudaStream_t tk_s;
static double tk_worst;  // largest error seen in the current test, printed at the end

static void tk_start(const char *name) {
    if (gpu_count() == 0)
        cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (kernel tests run on the GPU machine)");
    char tag[128];
    snprintf(tag, sizeof tag, "kernels.%s", name);
    tc_rng_fresh(tag);
    tk_worst = 0;
    dj_err e;
    cr_assert_eq(gpu_open(&tk_g, 0, &e), 0, "gpu_open: %s", e.msg);
    cr_assert_eq(gpu_stream_create(&tk_s, &e), 0, "%s", e.msg);
}

static void tk_end(const char *name) {
    fprintf(stderr, "[kernels.%s] worst relative error %.3e\n", name, tk_worst);
    gpu_stream_destroy(tk_s);
    gpu_close(tk_g);
    tk_g = NULL;
}

static void tk_fill(float *x, int64_t n, float scale) { tc_fill(x, n, -scale, scale); }

// W (n_out, n_in) from floats into wh in wtype: floats stored (rounded), q8 and q4 quantized row by row.
static void tk_store_matrix(void *wh, float *wf, int64_t n_out, int64_t n_in, uint32_t wt) {
    if (!dj_is_quant(wt)) {
        tc_store(wh, wf, n_out * n_in, wt);
        return;
    }
    size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)n_in);
    for (int64_t o = 0; o < n_out; o++)
        cr_assert_eq(quant_row(wt, wf + o * n_in, n_in, (uint8_t *)wh + (size_t)o * rb, NULL, NULL), 0);
}

// ---- device helpers (every failure stops the test with the API's message)
static void *tk_dev(size_t bytes) {
    void *p;
    dj_err e;
    cr_assert_eq(gpu_malloc(&p, bytes, "test buffer", &e), 0, "%s", e.msg);
    return p;
}
static void *tk_up(const void *host, size_t bytes) {
    void *p = tk_dev(bytes);
    dj_err e;
    cr_assert_eq(gpu_h2d(p, host, bytes, &e), 0, "%s", e.msg);
    return p;
}
static void tk_down(void *host, const void *dev, size_t bytes) {
    dj_err e;
    cr_assert_eq(gpu_stream_sync(tk_s, &e), 0, "kernel failed: %s", e.msg);
    cr_assert_eq(gpu_d2h(host, dev, bytes, &e), 0, "%s", e.msg);
}
static void tk_poison(void *dev, size_t bytes) {  // 0xffffffff is a NaN
    dj_err e;
    cr_assert_eq(gpu_memset(dev, 0xff, bytes, tk_s, &e), 0, "%s", e.msg);
}
static int32_t *tk_pos(int32_t pos) { return tk_up(&pos, sizeof pos); }

// An f32 cache view of device keys and values.
static gpu_kv_cache tk_kv32(float *dk, float *dv) { return (gpu_kv_cache){dk, dv, NULL, NULL, DJ_KV_F32}; }

// Row x (hd) stored as kvtype.h says into dst (and *scale for q8), x then overwritten with what the stored row
// widens to: a CPU reference over x reads exactly what the kernels read.
static void tk_kv_row(int t, float *x, int64_t hd, void *dst, float *scale) {
    if (t == DJ_KV_F32) {
        memcpy(dst, x, (size_t)hd * 4);
    } else if (t == DJ_KV_F16) {
        uint16_t *h = dst;
        for (int64_t d = 0; d < hd; d++) h[d] = dj_f32_to_f16(x[d]), x[d] = dj_f16_to_f32(h[d]);
    } else {
        dj_kv_q8_row(x, hd, dst, scale);
        for (int64_t d = 0; d < hd; d++) x[d] = (float)((int8_t *)dst)[d] * *scale;
    }
}

// The device cache of type t holding f32 caches kc, vc (cn elements, rows of hd), each row as tk_kv_row stores it
// (kc, vc left holding the widened values). Host copies of what was uploaded in *hk, *hv, *hs (NULL: not wanted).
static gpu_kv_cache tk_kv_up(int t, float *kc, float *vc, int64_t cn, int64_t hd) {
    const size_t eb = dj_kv_elem_bytes(t), rows = (size_t)(cn / hd);
    uint8_t *h[2] = {malloc((size_t)cn * eb), malloc((size_t)cn * eb)};
    float *sc[2] = {malloc(rows * 4), malloc(rows * 4)};
    for (int w = 0; w < 2; w++)
        for (size_t r = 0; r < rows; r++) tk_kv_row(t, (w ? vc : kc) + r * hd, hd, h[w] + r * hd * eb, &sc[w][r]);
    gpu_kv_cache c = {tk_up(h[0], (size_t)cn * eb), tk_up(h[1], (size_t)cn * eb), NULL, NULL, t};
    if (t == DJ_KV_Q8) c.ks = tk_up(sc[0], rows * 4), c.vs = tk_up(sc[1], rows * 4);
    free(h[0]), free(h[1]), free(sc[0]), free(sc[1]);
    return c;
}

// The device cache c (cn elements, rows of hd) widened into kc, vc on the host.
static void tk_kv_down(const gpu_kv_cache *c, float *kc, float *vc, int64_t cn, int64_t hd) {
    const size_t eb = dj_kv_elem_bytes(c->type), rows = (size_t)(cn / hd);
    uint8_t *h = malloc((size_t)cn * eb);
    float *sc = malloc(rows * 4);
    for (int w = 0; w < 2; w++) {
        float *x = w ? vc : kc;
        tk_down(h, w ? c->v : c->k, (size_t)cn * eb);
        if (c->type == DJ_KV_Q8) tk_down(sc, w ? c->vs : c->ks, rows * 4);
        for (int64_t i = 0; i < cn; i++)
            x[i] = c->type == DJ_KV_F32   ? ((float *)h)[i]
                   : c->type == DJ_KV_F16 ? dj_f16_to_f32(((uint16_t *)h)[i])
                                          : (float)((int8_t *)h)[i] * sc[i / hd];
    }
    free(h), free(sc);
}

static void tk_kv_free(gpu_kv_cache *c) { gpu_free(c->k), gpu_free(c->v), gpu_free(c->ks), gpu_free(c->vs); }

// Relative L2 error of got against ref over n values; NaNs in got (unwritten or broken) fail by name.
static int tk_close(const float *got, const float *ref, int64_t n, double tol, const char *what) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i])) {
            cr_expect(0, "%s: element %lld is NaN (not written?) (seed %llu)", what, (long long)i, (unsigned long long)tc_seed_used());
            return 0;
        }
        double d = (double)got[i] - ref[i];
        num += d * d, den += (double)ref[i] * ref[i];
    }
    double r = sqrt(num / (den > 0 ? den : 1));
    if (r > tk_worst) tk_worst = r;
    cr_expect(r <= tol, "%s: relative L2 error %.3e > %.1e (seed %llu)", what, r, tol, (unsigned long long)tc_seed_used());
    return r <= tol;
}

// ---- matmul
// A random (n_out, n_in) matrix stored in wt on the host (wh) and the device (dw), room for Tmax rows of x and y.
typedef struct {
    float *wf, *x, *ref, *got, *dx, *dy;
    void *wh, *dw;
    int64_t n_in, n_out;
    uint32_t wt;
} tk_mm;

static tk_mm tk_mm_new(uint32_t wt, int64_t n_in, int64_t n_out, int64_t Tmax) {
    tk_mm m = {.n_in = n_in, .n_out = n_out, .wt = wt};
    m.wf = malloc((size_t)(n_in * n_out) * 4), m.x = malloc((size_t)(Tmax * n_in) * 4);
    m.wh = malloc((size_t)(n_in * n_out) * 4);
    m.ref = malloc((size_t)(Tmax * n_out) * 4), m.got = malloc((size_t)(Tmax * n_out) * 4);
    tk_fill(m.wf, n_in * n_out, 1.0f / sqrtf((float)n_in));
    tk_store_matrix(m.wh, m.wf, n_out, n_in, wt);
    m.dw = tk_up(m.wh, (size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n_in));
    m.dx = tk_dev((size_t)(Tmax * n_in) * 4), m.dy = tk_dev((size_t)(Tmax * n_out) * 4);
    return m;
}

// T random rows of x, on the device too; ref = the CPU's product.
static void tk_mm_input(tk_mm *m, int64_t T) {
    dj_err e;
    tk_fill(m->x, T * m->n_in, 1.0f);
    cr_assert_eq(gpu_h2d(m->dx, m->x, (size_t)(T * m->n_in) * 4, &e), 0, "%s", e.msg);
    cpu_matmul(m->ref, m->x, m->wh, m->wt, T, m->n_in, m->n_out);
}

static void tk_mm_free(tk_mm *m) {
    gpu_free(m->dw), gpu_free(m->dx), gpu_free(m->dy);
    free(m->wf), free(m->x), free(m->wh), free(m->ref), free(m->got);
}

// gpu_matmul_scratch, host arithmetic only (no GPU): never less for more tokens, so the scratch reserved for a pass
// of T rows (the engine reserves once, before capturing its graphs) covers every pass of fewer, whatever path each
// takes; and at least x's copy in the weight dtype.
Test(kernels, matmul_scratch_never_less_for_more_tokens) {
    static const int64_t n_ins[] = {8, 200, 4096, 14336, 28672};
    for (uint32_t wt = DJ_F32; wt <= DJ_Q4; wt++)
        for (size_t i = 0; i < sizeof n_ins / sizeof n_ins[0]; i++) {
            const int64_t n_in = n_ins[i];
            size_t last = 0;
            for (int64_t T = 1; T <= 4096; T++) {
                const size_t b = gpu_matmul_scratch(wt, T, n_in);
                cr_assert_geq(b, last, "%s n_in=%lld: %zu bytes at T=%lld, fewer than %zu at T=%lld", dj_dtype_name(wt),
                              (long long)n_in, b, (long long)T, last, (long long)(T - 1));
                if (wt != DJ_F32)
                    cr_assert_geq(b, (size_t)(T * n_in * 2), "%s n_in=%lld T=%lld: less than x in f16",
                                  dj_dtype_name(wt), (long long)n_in, (long long)T);
                last = b;
            }
        }
}

Test(kernels, matmul) {
    tk_start("matmul");
    static const int64_t Ts[] = {1, 2, 3, 7, 64, 300};
    // {64, 9000}: a long input row and a short output, the one-token GEMV's other extreme; {36864, 40}: x longer
    // than the quantized GEMV stages at once (QP_MAX, QG_TILE in matmul.cu): its tiled kernel, four and a half
    // tiles; {28672, 64}: the longest x the integer kernel stages (Llama-3-70B's down projection)
    // {208, 77}: an odd number of groups with a partial last one (qgemm's last stage half empty)
    static const int64_t shapes[][2] = {{172, 64}, {172, 512}, {512, 4096}, {4096, 300}, {11008, 64}, {36, 4096},
                                        {64, 9000}, {36864, 40}, {28672, 64}, {208, 77}};
    static const int paths[] = {GPU_MM_AUTO, GPU_MM_GEMV, GPU_MM_CUBLAS, GPU_MM_QGEMM};
    static const char *path_names[] = {"auto", "gemv", "cublas", "qgemm"};
    dj_err e;
    for (uint32_t wt = DJ_F32; wt <= DJ_Q4; wt++) {
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            tk_mm m = tk_mm_new(wt, n_in, n_out, 300);
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const int64_t T = Ts[ti];
                tk_mm_input(&m, T);
                for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
                    const int path = paths[pi];
                    if (path == GPU_MM_QGEMM && !dj_is_quant(wt)) continue;
                    const int blas = path == GPU_MM_CUBLAS || path == GPU_MM_QGEMM || (path == GPU_MM_AUTO && T > 1);
                    // GEMV: fp32 on exactly widened weights, but q8 and q4 in integers against x quantized to ~1/64516
                    // of each group's largest magnitude where n_in <= QP_MAX, as the CPU share; cuBLAS: x rounded to
                    // the weight dtype (q8, q4: x and the widened weights rounded to f16); qgemm: the same f16 values
                    // on the tensor cores
                    const double tol = !blas ? (dj_is_quant(wt) && n_in <= 32768 ? 1e-4 : 1e-5)
                                       : wt == DJ_F32 ? 1e-5 : wt == DJ_BF16 ? 1e-4 : 2e-3;
                    tk_poison(m.dy, (size_t)(T * n_out) * 4);
                    int rc = gpu_matmul_path(tk_g, path, m.dy, m.dx, m.dw, wt, T, n_in, n_out, tk_s, &e);
                    cr_expect_eq(rc, 0, "matmul %s %s T=%lld n_in=%lld n_out=%lld: %s", dj_dtype_name(wt),
                                 path_names[pi], (long long)T, (long long)n_in, (long long)n_out, e.msg);
                    if (rc) continue;
                    tk_down(m.got, m.dy, (size_t)(T * n_out) * 4);
                    char what[160];
                    snprintf(what, sizeof what, "matmul %s %s T=%lld n_in=%lld n_out=%lld", dj_dtype_name(wt),
                             path_names[pi], (long long)T, (long long)n_in, (long long)n_out);
                    tk_close(m.got, m.ref, T * n_out, tol, what);
                }
            }
            tk_mm_free(&m);
        }
    }
    tk_end("matmul");
}

// ---- qgemm's tile shapes
// Tile shape v on m's T tokens against the CPU (the f16 operands: 2e-3), then again: the same bits (again: scratch
// of T * n_out floats). 1 when both ran.
static int tk_qgemm_twice(tk_mm *m, int v, int64_t T, float *again) {
    dj_err e;
    const int64_t n_out = m->n_out;
    char what[160];
    snprintf(what, sizeof what, "qgemm tile shape %d %s T=%lld n_in=%lld n_out=%lld", v, dj_dtype_name(m->wt),
             (long long)T, (long long)m->n_in, (long long)n_out);
    tk_poison(m->dy, (size_t)(T * n_out) * 4);
    int rc = gpu_qgemm_variant(tk_g, v, m->dy, m->dx, m->dw, m->wt, T, m->n_in, n_out, tk_s, &e);
    cr_expect_eq(rc, 0, "%s: %s", what, e.msg);
    if (rc) return 0;
    tk_down(m->got, m->dy, (size_t)(T * n_out) * 4);
    tk_close(m->got, m->ref, T * n_out, 2e-3, what);
    tk_poison(m->dy, (size_t)(T * n_out) * 4);
    rc = gpu_qgemm_variant(tk_g, v, m->dy, m->dx, m->dw, m->wt, T, m->n_in, n_out, tk_s, &e);
    cr_expect_eq(rc, 0, "%s, again: %s", what, e.msg);
    if (rc) return 0;
    tk_down(again, m->dy, (size_t)(T * n_out) * 4);
    cr_expect(!memcmp(again, m->got, (size_t)(T * n_out) * 4), "%s: a second run differs", what);
    return 1;
}

// Every tile shape this device runs, q8 and q4, against the CPU on the same quantized weights: token counts below,
// at and past a tile's width (16 to 256), rows a partial tile, groups a partial stage ({40, 130}: two groups, one
// stage); the register kernel (12-19) cuts these small matrices' row blocks into a run a unit up to 64 tokens, and
// takes whole blocks past it. A second run of each must give the same bits (runs add into y in whichever order they
// finish).
Test(kernels, qgemm_tile_shapes) {
    tk_start("qgemm_tile_shapes");
    static const int64_t Ts[] = {1, 2, 16, 33, 64, 130, 300},
                         shapes[][2] = {{512, 200}, {208, 77}, {1056, 392}, {40, 130}};
    int ran = 0;
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            tk_mm m = tk_mm_new(wt, n_in, n_out, 300);
            float *again = malloc((size_t)(300 * n_out) * 4);
            cr_assert(again);
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                const int64_t T = Ts[ti];
                tk_mm_input(&m, T);
                for (int v = 0; v < GPU_QGEMM_VARIANTS; v++) {
                    if (!gpu_qgemm_has(tk_g, v)) continue;
                    ran += tk_qgemm_twice(&m, v, T, again);
                }
            }
            free(again);
            tk_mm_free(&m);
        }
    cr_expect_geq(ran, 2 * 4 * 7 * 12, "the mma.sync and register tile shapes run everywhere");
    tk_end("qgemm_tile_shapes");
}

// The register kernel's runs across row blocks: 2048 rows of 8192 inputs make 512 or more units, more than a device
// holds CTAs, so runs start and end inside blocks and the runs of a block add their sums in order (slots 0 and 1);
// each run twice, the same bits.
Test(kernels, qgemm_register_runs) {
    tk_start("qgemm_register_runs");
    static const int64_t Ts[] = {2, 9, 16, 33, 64};
    const int64_t n_in = 8192, n_out = 2048;
    int ran = 0;
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++) {
        tk_mm m = tk_mm_new(wt, n_in, n_out, 64);
        float *again = malloc((size_t)(64 * n_out) * 4);
        cr_assert(again);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int64_t T = Ts[ti];
            tk_mm_input(&m, T);
            for (int v = 12; v < GPU_QGEMM_REG_END; v++) ran += tk_qgemm_twice(&m, v, T, again);
        }
        free(again);
        tk_mm_free(&m);
    }
    cr_expect_eq(ran, 2 * 5 * (GPU_QGEMM_REG_END - 12), "every register tile shape ran");
    tk_end("qgemm_register_runs");
}

// dense_rows.cu (GPU_MM_ROWS), f16 and bf16, every T from 2 to 16 on an odd shape with a partial last k-block (n_in
// 200: six blocks of 32 and one of 8; n_out 301: a part row block), and on 4096 x 1000 at 2, 9 and 16 tokens in 1,
// 3, 7 and 16 slices (the shape's own choice too): against the CPU (x rounded as the cuBLAS path rounds it: f16 2e-3,
// bf16 hi + lo 1e-4), then again, the same bits (the last slice to finish sums them in slice order). What it does not
// take (f32 W, 1 or 17 tokens, n_in not a multiple of 8, more slices than k-blocks) is refused by name.
Test(kernels, matmul_rows) {
    tk_start("matmul_rows");
    dj_err e;
    int ran = 0;
    for (uint32_t wt = DJ_F16; wt <= DJ_BF16; wt++) {
        const double tol = wt == DJ_F16 ? 2e-3 : 1e-4;
        static const int64_t shapes[][2] = {{200, 301}, {4096, 1000}};
        for (size_t si = 0; si < 2; si++) {
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            tk_mm m = tk_mm_new(wt, n_in, n_out, 17);
            float *again = malloc((size_t)(16 * n_out) * 4);
            cr_assert(again);
            for (int64_t T = 2; T <= 16; T++) {
                if (si == 1 && T != 2 && T != 9 && T != 16) continue;
                tk_mm_input(&m, T);
                static const int splits[] = {0, 1, 3, 7, 16};
                for (size_t k = 0; k < (si == 0 ? 2 : 5); k++) {
                    char what[160];
                    snprintf(what, sizeof what, "matmul_rows %s T=%lld n_in=%lld n_out=%lld slices %d",
                             dj_dtype_name(wt), (long long)T, (long long)n_in, (long long)n_out, splits[k]);
                    tk_poison(m.dy, (size_t)(T * n_out) * 4);
                    int rc = gpu_matmul_rows(tk_g, splits[k], m.dy, m.dx, m.dw, wt, T, n_in, n_out, tk_s, &e);
                    cr_expect_eq(rc, 0, "%s: %s", what, e.msg);
                    if (rc) continue;
                    tk_down(m.got, m.dy, (size_t)(T * n_out) * 4);
                    tk_close(m.got, m.ref, T * n_out, tol, what);
                    tk_poison(m.dy, (size_t)(T * n_out) * 4);
                    rc = gpu_matmul_rows(tk_g, splits[k], m.dy, m.dx, m.dw, wt, T, n_in, n_out, tk_s, &e);
                    cr_expect_eq(rc, 0, "%s, again: %s", what, e.msg);
                    if (rc) continue;
                    tk_down(again, m.dy, (size_t)(T * n_out) * 4);
                    cr_expect(!memcmp(again, m.got, (size_t)(T * n_out) * 4), "%s: a second run differs", what);
                    ran++;
                }
            }
            if (si == 0) {  // refusals: by name, nothing launched
                cr_expect_neq(gpu_matmul_rows(tk_g, 0, m.dy, m.dx, m.dw, wt, 1, n_in, n_out, tk_s, &e), 0);
                cr_expect(strstr(e.msg, "gpu_matmul_rows"), "T = 1 refused by name: %s", e.msg);
                cr_expect_neq(gpu_matmul_rows(tk_g, 0, m.dy, m.dx, m.dw, wt, 17, n_in, n_out, tk_s, &e), 0);
                cr_expect_neq(gpu_matmul_rows(tk_g, 0, m.dy, m.dx, m.dw, wt, 4, 196, n_out, tk_s, &e), 0);
                cr_expect(strstr(e.msg, "n_in = 196"), "n_in = 196 refused by name: %s", e.msg);
                cr_expect_neq(gpu_matmul_rows(tk_g, 0, m.dy, m.dx, m.dw, DJ_F32, 4, n_in, n_out, tk_s, &e), 0);
                cr_expect_neq(gpu_matmul_rows(tk_g, 8, m.dy, m.dx, m.dw, wt, 4, n_in, n_out, tk_s, &e), 0);
                cr_expect(strstr(e.msg, "8 slices"), "8 slices of 7 k-blocks refused by name: %s", e.msg);
            }
            free(again);
            tk_mm_free(&m);
        }
    }
    cr_expect_eq(ran, 2 * (15 * 2 + 3 * 5), "every case ran");
    tk_end("matmul_rows");
}

// The Hopper kernels' shapes after the register kernel's (GPU_QGEMM_REG_END onwards: stream-K; warp-specialized, whole
// tiles and stream-K) on lines of units long enough that runs cut tiles at both ends: 2048 x 8192 at 300 tokens (32
// tiles of 128 stages, four or five runs each, runs crossing tiles), and 8448 x 128 at 1280 tokens (330 tiles of 2
// stages: runs of about five units hold whole tiles between cut ones); each twice, the same bits (the last run to
// finish sums the runs in run order). Skipped, saying so, where the device has no wgmma.
Test(kernels, qgemm_stream_k_runs, .timeout = 600) {
    tk_start("qgemm_stream_k_runs");
    if (!gpu_qgemm_has(tk_g, GPU_QGEMM_REG_END))
        cr_skip_test("these tile shapes need an sm_90 device (wgmma)");
    static const int64_t cases[][3] = {{8192, 2048, 300}, {128, 8448, 1280}};  // n_in, n_out, T
    int ran = 0;
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const int64_t n_in = cases[ci][0], n_out = cases[ci][1], T = cases[ci][2];
            tk_mm m = tk_mm_new(wt, n_in, n_out, T);
            float *again = malloc((size_t)(T * n_out) * 4);
            cr_assert(again);
            tk_mm_input(&m, T);
            for (int v = GPU_QGEMM_REG_END; v < GPU_QGEMM_VARIANTS; v++) ran += tk_qgemm_twice(&m, v, T, again);
            free(again);
            tk_mm_free(&m);
        }
    cr_expect_eq(ran, 2 * 2 * (GPU_QGEMM_VARIANTS - GPU_QGEMM_REG_END), "every tile shape past the register kernel's ran");
    tk_end("qgemm_stream_k_runs");
}

// The one-token persistent GEMV with one and with two rows of W a warp (gpu_qgemv_rows_a_warp on this device), in its
// three input modes (x itself, silu(gate) * up, rmsnorm(x + delta)), against the CPU: q4 (two rows a warp at any
// size) on an odd row count, whose last pair has one row past W; q8 on the smallest odd row count that takes two
// rows a warp (the last pair half past W too) and on one that takes one.
static void tk_rows_case(uint32_t wt, int64_t n_out) {
    const int64_t n = 4096;
    dj_err e;
    float *x = malloc((size_t)n * 8), *d = malloc((size_t)n * 4), *nw = malloc((size_t)n * 4), *h = malloc((size_t)n * 4);
    float *wf = malloc((size_t)(n * n_out) * 4), *ref = malloc((size_t)n_out * 4), *got = malloc((size_t)n_out * 4);
    const size_t wb = (size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n);
    void *wh = malloc(wb);
    tk_fill(x, 2 * n, 2.0f), tk_fill(d, n, 1.0f), tk_fill(nw, n, 1.5f), tk_fill(wf, n * n_out, 1.0f / sqrtf((float)n));
    tk_store_matrix(wh, wf, n_out, n, wt);
    float *dx = tk_up(x, (size_t)n * 8), *dd = tk_up(d, (size_t)n * 4), *dn = tk_up(nw, (size_t)n * 4);
    float *dxo = tk_dev((size_t)n * 4), *dh = tk_dev((size_t)n * 4), *dy = tk_dev((size_t)n_out * 4);
    void *dw = tk_up(wh, wb);
    for (int mode = 0; mode < 3; mode++) {
        int rc;
        tk_poison(dy, (size_t)n_out * 4);
        if (mode == 0) {  // x
            cpu_matmul(ref, x, wh, wt, 1, n, n_out);
            rc = gpu_matmul_path(tk_g, GPU_MM_GEMV, dy, dx, dw, wt, 1, n, n_out, tk_s, &e);
        } else if (mode == 1) {  // silu(gate) * up: x's two halves
            cpu_swiglu(h, x, x + n, n);
            cpu_matmul(ref, h, wh, wt, 1, n, n_out);
            rc = gpu_swiglu_matmul(tk_g, dy, dh, dx, dx + n, 2 * n, dw, wt, 1, n, n_out, tk_s, &e);
        } else {  // rmsnorm(x + delta) * nw
            for (int64_t i = 0; i < n; i++) h[i] = x[i] + d[i];
            cpu_rmsnorm(h, h, nw, n, 1e-5f);
            cpu_matmul(ref, h, wh, wt, 1, n, n_out);
            rc = gpu_norm_matmul(tk_g, dy, dx, dd, dxo, dn, 1e-5f, dw, wt, 1, n, n_out, tk_s, &e);
        }
        cr_assert_eq(rc, 0, "%s", e.msg);
        tk_down(got, dy, (size_t)n_out * 4);
        char what[112];
        snprintf(what, sizeof what, "gemv %s mode %d n_out=%lld (%d rows a warp)", dj_dtype_name(wt), mode,
                 (long long)n_out, gpu_qgemv_rows_a_warp(tk_g, wt, n_out));
        tk_close(got, ref, n_out, 1e-4, what);
    }
    gpu_free(dx), gpu_free(dd), gpu_free(dn), gpu_free(dxo), gpu_free(dh), gpu_free(dy), gpu_free(dw);
    free(x), free(d), free(nw), free(h), free(wf), free(ref), free(got), free(wh);
}

Test(kernels, gemv_rows_a_warp) {
    tk_start("gemv_rows_a_warp");
    cr_assert_eq(gpu_qgemv_rows_a_warp(tk_g, DJ_Q4, 301), 2);
    tk_rows_case(DJ_Q4, 301);
    int64_t two = 1;  // the first q8 row count that takes pairs, made odd
    while (two < 1000000 && gpu_qgemv_rows_a_warp(tk_g, DJ_Q8, two) == 1) two++;
    two |= 1;
    cr_assert_eq(gpu_qgemv_rows_a_warp(tk_g, DJ_Q8, two), 2, "no q8 row count below 1000000 takes two rows a warp");
    cr_assert_eq(gpu_qgemv_rows_a_warp(tk_g, DJ_Q8, 301), 1);
    tk_rows_case(DJ_Q8, two);
    tk_rows_case(DJ_Q8, 301);
    tk_end("gemv_rows_a_warp");
}

// The gate|up GEMV that goes on to silu(gate) * up (gpu_norm_matmul_swiglu) against gpu_norm_matmul into [gate | up]
// then gpu_swiglu: h and the residual the same bits, q8 and q4, with and without the residual add.
Test(kernels, norm_matmul_swiglu) {
    tk_start("norm_matmul_swiglu");
    static const int64_t shapes[][2] = {{64, 20}, {256, 301}, {4096, 2200}};  // n_in (dim), n_out / 2 (hidden)
    dj_err e;
    for (size_t si = 0; si < 3; si++)
        for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
            for (int add = 0; add < 2; add++) {
                const int64_t n = shapes[si][0], hid = shapes[si][1], n_out = 2 * hid;
                float *x = malloc((size_t)n * 4), *d = malloc((size_t)n * 4), *nw = malloc((size_t)n * 4);
                float *wf = malloc((size_t)(n * n_out) * 4);
                float *h[2] = {malloc((size_t)hid * 4), malloc((size_t)hid * 4)}, *res[2] = {malloc((size_t)n * 4), malloc((size_t)n * 4)};
                const size_t wb = (size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n);
                void *wh = malloc(wb);
                tk_fill(x, n, 2.0f), tk_fill(d, n, 1.0f), tk_fill(nw, n, 1.5f);
                tk_fill(wf, n * n_out, 3.0f / sqrtf((float)n));  // gate of order 1: silu neither flat nor linear
                tk_store_matrix(wh, wf, n_out, n, wt);
                float *dx = tk_up(x, (size_t)n * 4), *dd = tk_up(d, (size_t)n * 4), *dn = tk_up(nw, (size_t)n * 4);
                void *dw = tk_up(wh, wb);
                float *dgu = tk_dev((size_t)n_out * 4), *dh = tk_dev((size_t)hid * 4), *dxo = tk_dev((size_t)n * 4);
                for (int fused = 0; fused < 2; fused++) {
                    tk_poison(dh, (size_t)hid * 4), tk_poison(dxo, (size_t)n * 4);
                    if (fused)
                        cr_assert_eq(gpu_norm_matmul_swiglu(tk_g, dh, dx, add ? dd : NULL, dxo, dn, 1e-5f, dw, wt, n, n_out,
                                                            tk_s, &e), 0, "%s", e.msg);
                    else
                        cr_assert(!gpu_norm_matmul(tk_g, dgu, dx, add ? dd : NULL, dxo, dn, 1e-5f, dw, wt, 1, n, n_out, tk_s, &e) &&
                                      !gpu_swiglu(dh, dgu, dgu + hid, 1, hid, n_out, tk_s, &e),
                                  "%s", e.msg);
                    tk_down(h[fused], dh, (size_t)hid * 4), tk_down(res[fused], dxo, (size_t)n * 4);
                }
                char what[96];
                snprintf(what, sizeof what, "norm_matmul_swiglu %s n_in=%lld hidden=%lld add=%d", dj_dtype_name(wt),
                         (long long)n, (long long)hid, add);
                cr_expect_eq(memcmp(h[0], h[1], (size_t)hid * 4), 0, "%s: h differs", what);
                cr_expect_eq(memcmp(res[0], res[1], (size_t)n * 4), 0, "%s: the residual differs", what);
                int64_t nan = 0;
                for (int64_t i = 0; i < hid; i++) nan += isnan(h[1][i]);
                cr_expect_eq(nan, 0, "%s: %lld values of h not written", what, (long long)nan);
                if (si == 0 && add) {  // refused by name: an odd n_out
                    cr_expect_neq(gpu_norm_matmul_swiglu(tk_g, dh, dx, dd, dxo, dn, 1e-5f, dw, wt, n, n_out - 1, tk_s, &e), 0);
                    cr_expect(strstr(e.msg, "gpu_norm_matmul_swiglu"), "%s", e.msg);
                }
                gpu_free(dx), gpu_free(dd), gpu_free(dn), gpu_free(dw), gpu_free(dgu), gpu_free(dh), gpu_free(dxo);
                free(x), free(d), free(nw), free(wf), free(h[0]), free(h[1]), free(res[0]), free(res[1]), free(wh);
            }
    tk_end("norm_matmul_swiglu");
}

// ---- RoPE + KV write in one launch
// RoPE of q and k plus the KV write, for one token and for T rows ld floats apart (prefill, fused [q|k|v] rows):
// the same values as the CPU's RoPE, the caches holding exactly the rotated k and the v of each row (positions past
// the cache: nothing).
Test(kernels, rope_kv) {
    tk_start("rope_kv");
    // nh, nkv, hd, pos, T, row padding
    static const int64_t cases[][6] = {{8, 4, 64, 0, 1, 0},  {6, 2, 16, 99, 1, 0},  {4, 4, 128, 37, 1, 0},
                                       {4, 2, 48, 5000, 1, 0}, {8, 2, 64, 0, 17, 0}, {4, 4, 128, 30, 80, 8},
                                       {6, 3, 32, 90, 20, 4}};
    dj_err e;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t nh = cases[ci][0], nkv = cases[ci][1], hd = cases[ci][2], pos = cases[ci][3], T = cases[ci][4];
        const int64_t row = (nh + 2 * nkv) * hd, ld = row + cases[ci][5], n = T * ld, max_seq = 100;
        const int64_t cache_n = nkv * max_seq * hd;
        dj_config c = {0};
        c.head_dim = (uint32_t)hd, c.rope_theta = 10000.0f;
        float *inv = malloc((size_t)hd / 2 * 4), *qkv = malloc((size_t)n * 4), *got = malloc((size_t)cache_n * 4);
        float *kc = malloc((size_t)cache_n * 4), *vc = malloc((size_t)cache_n * 4);
        cpu_rope_freqs(&c, inv);
        tk_fill(qkv, n, 2.0f), tk_fill(kc, cache_n, 1.0f), tk_fill(vc, cache_n, 1.0f);
        float *dqkv = tk_up(qkv, (size_t)n * 4), *dinv = tk_up(inv, (size_t)hd / 2 * 4);
        float *dk = tk_up(kc, (size_t)cache_n * 4), *dv = tk_up(vc, (size_t)cache_n * 4);
        int32_t *dpos = tk_pos((int32_t)pos);
        const gpu_kv_cache kv = tk_kv32(dk, dv);
        cr_assert_eq(gpu_rope_kv(tk_g, dqkv, ld, T, &kv, nh, nkv, hd, max_seq, dinv, dpos, tk_s, &e), 0, "%s", e.msg);
        float *gq = malloc((size_t)n * 4);
        tk_down(gq, dqkv, (size_t)n * 4);
        for (int64_t t = 0; t < T; t++) {
            cpu_rope(qkv + t * ld, nh, hd, pos + t, inv);
            cpu_rope(qkv + t * ld + nh * hd, nkv, hd, pos + t, inv);
        }
        char what[160];
        snprintf(what, sizeof what, "rope_kv n_heads=%lld n_kv=%lld head_dim=%lld pos=%lld T=%lld ld=%lld",
                 (long long)nh, (long long)nkv, (long long)hd, (long long)pos, (long long)T, (long long)ld);
        tk_close(gq, qkv, n, 1e-5, what);  // v and the padding included: they must come through untouched
        for (int64_t t = 0; t < T; t++)
            if (pos + t < max_seq)
                for (int64_t h = 0; h < nkv; h++) {
                    memcpy(kc + (h * max_seq + pos + t) * hd, gq + t * ld + (nh + h) * hd, (size_t)hd * 4);
                    memcpy(vc + (h * max_seq + pos + t) * hd, gq + t * ld + (nh + nkv + h) * hd, (size_t)hd * 4);
                }
        free(gq);
        for (int which = 0; which < 2; which++) {
            tk_down(got, which ? dv : dk, (size_t)cache_n * 4);
            cr_expect_eq(memcmp(got, which ? vc : kc, (size_t)cache_n * 4), 0, "%s: %s cache differs", what,
                         which ? "v" : "k");
        }
        gpu_free(dqkv), gpu_free(dinv), gpu_free(dk), gpu_free(dv), gpu_free(dpos);
        free(inv), free(qkv), free(got), free(kc), free(vc);
    }
    tk_end("rope_kv");
}

// ---- widening (embedding rows): every f16 and bf16 bit pattern, exactly as the host converts it
Test(kernels, widen) {
    tk_start("widen");
    const int64_t n = 65536;
    uint16_t *h = malloc((size_t)n * 2);
    float *got = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = (uint16_t)i;
    uint16_t *dh = tk_up(h, (size_t)n * 2);
    float *dout = tk_dev((size_t)n * 4);
    dj_err e;
    for (uint32_t wt = DJ_F16; wt <= DJ_BF16; wt++) {
        tk_poison(dout, (size_t)n * 4);
        cr_assert_eq(gpu_widen(dout, dh, wt, n, tk_s, &e), 0, "%s", e.msg);
        tk_down(got, dout, (size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            const float want = wt == DJ_F16 ? dj_f16_to_f32(h[i]) : dj_bf16_to_f32(h[i]);
            if (!(got[i] == want || (isnan(got[i]) && isnan(want)))) {
                cr_expect(0, "widen %s: 0x%04x gives %g, want %g", dj_dtype_name(wt), (unsigned)i, got[i], want);
                break;
            }
        }
    }
    gpu_free(dh), gpu_free(dout);
    free(h), free(got);
    // q8 and q4 rows (embeddings): exactly what the CPU widens, partial last groups included
    const int64_t shapes[][2] = {{7, 64}, {5, 172}, {3, 4096}};
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
        for (int si = 0; si < 3; si++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            size_t rb = (size_t)dj_row_bytes(wt, (uint64_t)cols);
            float *f = malloc((size_t)(rows * cols) * 4), *want = malloc((size_t)(rows * cols) * 4);
            float *back = malloc((size_t)(rows * cols) * 4);
            uint8_t *q = malloc(rb * (size_t)rows);
            tk_fill(f, rows * cols, 2.0f);
            tk_store_matrix(q, f, rows, cols, wt);
            for (int64_t r = 0; r < rows; r++) dequant_row(wt, q + (size_t)r * rb, cols, want + r * cols);
            void *dq = tk_up(q, rb * (size_t)rows);
            float *dw = tk_dev((size_t)(rows * cols) * 4);
            tk_poison(dw, (size_t)(rows * cols) * 4);
            cr_assert_eq(gpu_widen_rows(dw, dq, wt, rows, cols, tk_s, &e), 0, "%s", e.msg);
            tk_down(back, dw, (size_t)(rows * cols) * 4);
            cr_expect_eq(memcmp(back, want, (size_t)(rows * cols) * 4), 0, "widen_rows %s %lldx%lld differs from the CPU",
                         dj_dtype_name(wt), (long long)rows, (long long)cols);
            gpu_free(dq), gpu_free(dw);
            free(f), free(want), free(back), free(q);
        }
    tk_end("widen");
}

// ---- rmsnorm, fused residual add + rmsnorm, swiglu
Test(kernels, rmsnorm) {
    tk_start("rmsnorm");
    static const int64_t ns[] = {8, 48, 64, 172, 4096, 8192, 8193};  // 8193: past row_norm's registers
    static const int64_t Ts[] = {1, 5};
    dj_err e;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (size_t ti = 0; ti < 2; ti++) {
            const int64_t n = ns[ni], T = Ts[ti];
            const float eps = ni % 2 ? 1e-5f : 1e-6f;
            float *x = malloc((size_t)(T * n) * 4), *d = malloc((size_t)(T * n) * 4), *w = malloc((size_t)n * 4);
            float *ref = malloc((size_t)(T * n) * 4), *got = malloc((size_t)(T * n) * 4);
            float *xs = malloc((size_t)(T * n) * 4);
            tk_fill(x, T * n, 2.0f), tk_fill(d, T * n, 1.0f), tk_fill(w, n, 1.5f);
            float *dx = tk_up(x, (size_t)(T * n) * 4), *dd = tk_up(d, (size_t)(T * n) * 4), *dw = tk_up(w, (size_t)n * 4);
            float *dout = tk_dev((size_t)(T * n) * 4);
            char what[128];

            // plain, out separate and then in place (out == x)
            for (int inplace = 0; inplace < 2; inplace++) {
                float *o = inplace ? dx : dout;
                if (!inplace) tk_poison(dout, (size_t)(T * n) * 4);
                cr_assert_eq(gpu_rmsnorm(o, dx, dw, T, n, eps, tk_s, &e), 0, "%s", e.msg);
                tk_down(got, o, (size_t)(T * n) * 4);
                for (int64_t t = 0; t < T; t++) cpu_rmsnorm(ref + t * n, x + t * n, w, n, eps);
                snprintf(what, sizeof what, "rmsnorm n=%lld T=%lld%s", (long long)n, (long long)T, inplace ? " in place" : "");
                tk_close(got, ref, T * n, 1e-5, what);
            }

            // fused: x += delta; out = rmsnorm(x) * w; then with out == delta
            for (int alias = 0; alias < 2; alias++) {
                cr_assert_eq(gpu_h2d(dx, x, (size_t)(T * n) * 4, &e), 0, "%s", e.msg);
                cr_assert_eq(gpu_h2d(dd, d, (size_t)(T * n) * 4, &e), 0, "%s", e.msg);
                float *o = alias ? dd : dout;
                if (!alias) tk_poison(dout, (size_t)(T * n) * 4);
                cr_assert_eq(gpu_add_rmsnorm(dx, dd, o, dw, T, n, eps, tk_s, &e), 0, "%s", e.msg);
                for (int64_t i = 0; i < T * n; i++) xs[i] = x[i] + d[i];
                for (int64_t t = 0; t < T; t++) cpu_rmsnorm(ref + t * n, xs + t * n, w, n, eps);
                tk_down(got, o, (size_t)(T * n) * 4);
                snprintf(what, sizeof what, "add_rmsnorm out n=%lld T=%lld%s", (long long)n, (long long)T, alias ? " out=delta" : "");
                tk_close(got, ref, T * n, 1e-5, what);
                tk_down(got, dx, (size_t)(T * n) * 4);
                for (int64_t i = 0; i < T * n; i++)
                    if (got[i] != xs[i]) {
                        cr_expect(0, "add_rmsnorm residual n=%lld T=%lld: x[%lld] = %g, want %g (seed %llu)", (long long)n,
                                  (long long)T, (long long)i, got[i], xs[i], (unsigned long long)tc_seed_used());
                        break;
                    }
            }
            gpu_free(dx), gpu_free(dd), gpu_free(dw), gpu_free(dout);
            free(x), free(d), free(w), free(ref), free(got), free(xs);
        }
    tk_end("rmsnorm");
}

Test(kernels, swiglu) {
    tk_start("swiglu");
    static const int64_t ns[] = {8, 172, 11008};
    static const int64_t Ts[] = {1, 3};
    dj_err e;
    for (size_t ni = 0; ni < 3; ni++)
        for (size_t ti = 0; ti < 2; ti++)
            for (int fused = 0; fused < 3; fused++) {  // 0: separate, 1: one [gate | up] buffer, 2: out == gate
                const int64_t n = ns[ni], T = Ts[ti], ld = fused == 1 ? 2 * n : n;
                float *gu = malloc((size_t)(T * 2 * n) * 4), *ref = malloc((size_t)(T * n) * 4), *got = malloc((size_t)(T * n) * 4);
                tk_fill(gu, T * 2 * n, 6.0f);
                // separate layouts: gate rows in the first T*n floats, up rows in the next T*n
                float *dgu = tk_up(gu, (size_t)(T * 2 * n) * 4), *dout = tk_dev((size_t)(T * n) * 4);
                const float *hg = gu, *hu = fused == 1 ? gu + n : gu + T * n;
                float *dg = dgu, *du = fused == 1 ? dgu + n : dgu + T * n;
                float *o = fused == 2 ? dg : dout;
                if (fused != 2) tk_poison(dout, (size_t)(T * n) * 4);
                cr_assert_eq(gpu_swiglu(o, dg, du, T, n, ld, tk_s, &e), 0, "%s", e.msg);
                tk_down(got, o, (size_t)(T * n) * 4);
                for (int64_t t = 0; t < T; t++) cpu_swiglu(ref + t * n, hg + t * ld, hu + t * ld, n);
                char what[96];
                snprintf(what, sizeof what, "swiglu n=%lld T=%lld layout=%d", (long long)n, (long long)T, fused);
                tk_close(got, ref, T * n, 1e-5, what);
                gpu_free(dgu), gpu_free(dout);
                free(gu), free(ref), free(got);
            }
    tk_end("swiglu");
}

// The down projection with silu(gate) * up fused into it (q8, q4: one kernel; otherwise gpu_swiglu then the matmul)
// against the CPU's swiglu and matmul, for one token and for 3 (the GEMV's blocks of several tokens), gate and up
// in one (T, 2 n_in) buffer; n_in = 172 is no whole number of groups: the unfused path for every dtype.
Test(kernels, swiglu_matmul) {
    tk_start("swiglu_matmul");
    static const int64_t shapes[][2] = {{172, 40}, {4096, 300}, {14336, 64}}, Ts[] = {1, 3};  // n_in, n_out
    static const uint32_t wts[] = {DJ_F16, DJ_Q8, DJ_Q4};
    dj_err e;
    for (size_t si = 0; si < 3; si++)
        for (size_t wi = 0; wi < 3; wi++)
            for (size_t ti = 0; ti < 2; ti++) {
                const int64_t n = shapes[si][0], n_out = shapes[si][1], T = Ts[ti];
                const uint32_t wt = wts[wi];
                float *gu = malloc((size_t)(T * 2 * n) * 4), *h = malloc((size_t)(T * n) * 4);
                float *wf = malloc((size_t)(n * n_out) * 4), *ref = malloc((size_t)(T * n_out) * 4);
                float *got = malloc((size_t)(T * n_out) * 4);
                void *wh = malloc((size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n));
                tk_fill(gu, T * 2 * n, 4.0f);
                tk_fill(wf, n * n_out, 1.0f / sqrtf((float)n));
                tk_store_matrix(wh, wf, n_out, n, wt);
                for (int64_t t = 0; t < T; t++) cpu_swiglu(h + t * n, gu + t * 2 * n, gu + t * 2 * n + n, n);
                cpu_matmul(ref, h, wh, wt, T, n, n_out);
                float *dgu = tk_up(gu, (size_t)(T * 2 * n) * 4), *dh = tk_dev((size_t)(T * n) * 4);
                float *dy = tk_dev((size_t)(T * n_out) * 4);
                void *dw = tk_up(wh, (size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n));
                tk_poison(dy, (size_t)(T * n_out) * 4);
                cr_assert_eq(gpu_swiglu_matmul(tk_g, dy, dh, dgu, dgu + n, 2 * n, dw, wt, T, n, n_out, tk_s, &e), 0,
                             "%s", e.msg);
                tk_down(got, dy, (size_t)(T * n_out) * 4);
                char what[96];
                snprintf(what, sizeof what, "swiglu_matmul %s T=%lld n_in=%lld n_out=%lld", dj_dtype_name(wt),
                         (long long)T, (long long)n, (long long)n_out);
                // q8, q4: x quantized to ~1/64516 of each group's largest magnitude (the integer GEMV, for one token
                // or a few); several tokens otherwise on cuBLAS, x rounded to f16
                const int gemv = dj_is_quant(wt) && n % 32 == 0;
                tk_close(got, ref, T * n_out, gemv ? 1e-4 : T == 1 ? 1e-5 : 2e-3, what);
                gpu_free(dgu), gpu_free(dh), gpu_free(dy), gpu_free(dw);
                free(gu), free(h), free(wf), free(ref), free(got), free(wh);
            }
    tk_end("swiglu_matmul");
}

// Passes of several tokens on q8/q4 weights as gpu_matmul chooses for them: against the CPU, and, for 257 tokens
// over 40000 rows on the Hopper kernel (313 row blocks: the 257th token would cost the kernel a padded block on any
// device of up to 313 multiprocessors), split as promised: the first 256 rows of y the same bits as the
// tensor-core kernel's on those tokens alone, the last the GEMV's on that token. gpu_swiglu_matmul chooses the
// same way: the same bits as gpu_swiglu then gpu_matmul.
Test(kernels, matmul_few_tokens) {
    tk_start("matmul_few_tokens");
    static const int64_t Ts[] = {2, 4, 257};
    const int64_t n_in = 256, n_out = 40000;
    dj_err e;
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++) {
        tk_mm m = tk_mm_new(wt, n_in, n_out, 257);
        float *part = malloc((size_t)(257 * n_out) * 4), *two = malloc((size_t)(257 * n_out) * 4);
        float *gu = malloc((size_t)(257 * 2 * n_in) * 4);
        cr_assert(part && two && gu);
        float *dgu = tk_dev((size_t)(257 * 2 * n_in) * 4), *dh = tk_dev((size_t)(257 * n_in) * 4);
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int64_t T = Ts[ti];
            char what[96];
            snprintf(what, sizeof what, "matmul %s T=%lld n_in=%lld n_out=%lld", dj_dtype_name(wt), (long long)T,
                     (long long)n_in, (long long)n_out);
            tk_mm_input(&m, T);
            tk_poison(m.dy, (size_t)(T * n_out) * 4);
            cr_assert_eq(gpu_matmul(tk_g, m.dy, m.dx, m.dw, wt, T, n_in, n_out, tk_s, &e), 0, "%s: %s", what, e.msg);
            tk_down(m.got, m.dy, (size_t)(T * n_out) * 4);
            tk_close(m.got, m.ref, T * n_out, T > 4 ? 2e-3 : 1e-4, what);  // 2 and 4 tokens on the GEMV (10M weights)
            if (T == 257 && gpu_qgemm_has(tk_g, 8)) {
                const size_t head = (size_t)(256 * n_out) * 4;
                cr_assert_eq(gpu_matmul_path(tk_g, GPU_MM_QGEMM, m.dy, m.dx, m.dw, wt, 256, n_in, n_out, tk_s, &e), 0,
                             "%s", e.msg);
                tk_down(part, m.dy, head);
                cr_expect(!memcmp(part, m.got, head), "%s: the first 256 tokens differ from the tensor-core kernel's",
                          what);
                cr_assert_eq(gpu_matmul_path(tk_g, GPU_MM_GEMV, m.dy, m.dx + 256 * n_in, m.dw, wt, 1, n_in, n_out,
                                             tk_s, &e),
                             0, "%s", e.msg);
                tk_down(part, m.dy, (size_t)n_out * 4);
                cr_expect(!memcmp(part, m.got + 256 * n_out, (size_t)n_out * 4),
                          "%s: the 257th token differs from the GEMV's", what);
            }
            // the fused down projection on T rows of [gate | up]
            tk_fill(gu, T * 2 * n_in, 4.0f);
            cr_assert_eq(gpu_h2d(dgu, gu, (size_t)(T * 2 * n_in) * 4, &e), 0, "%s", e.msg);
            tk_poison(m.dy, (size_t)(T * n_out) * 4);
            cr_assert_eq(gpu_swiglu_matmul(tk_g, m.dy, dh, dgu, dgu + n_in, 2 * n_in, m.dw, wt, T, n_in, n_out, tk_s,
                                           &e),
                         0, "%s: %s", what, e.msg);
            tk_down(part, m.dy, (size_t)(T * n_out) * 4);
            cr_assert_eq(gpu_swiglu(dh, dgu, dgu + n_in, T, n_in, 2 * n_in, tk_s, &e), 0, "%s", e.msg);
            cr_assert_eq(gpu_matmul(tk_g, m.dy, dh, m.dw, wt, T, n_in, n_out, tk_s, &e), 0, "%s", e.msg);
            tk_down(two, m.dy, (size_t)(T * n_out) * 4);
            cr_expect(!memcmp(part, two, (size_t)(T * n_out) * 4),
                      "%s: gpu_swiglu_matmul differs from gpu_swiglu then gpu_matmul", what);
        }
        gpu_free(dgu), gpu_free(dh);
        free(part), free(two), free(gu);
        tk_mm_free(&m);
    }
    tk_end("matmul_few_tokens");
}

// The down projection of several tokens with silu(gate) * up computed as the quantized tensor-core kernel reads x
// (gpu_swiglu_qgemm): the same bits as gpu_swiglu then that kernel, and the CPU's swiglu and matmul within the f16
// rounding of x; gate and up in separate buffers and in one [gate | up] buffer; a row stride below n_in is refused.
Test(kernels, swiglu_qgemm) {
    tk_start("swiglu_qgemm");
    static const int64_t shapes[][2] = {{512, 200}, {1056, 392}, {40, 130}}, Ts[] = {2, 33, 300};  // n_in, n_out
    dj_err e;
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
        for (size_t si = 0; si < 3; si++) {
            const int64_t n = shapes[si][0], n_out = shapes[si][1], Tmax = 300;
            tk_mm m = tk_mm_new(wt, n, n_out, Tmax);
            float *gu = malloc((size_t)(Tmax * 2 * n) * 4), *h = malloc((size_t)(Tmax * n) * 4);
            float *two = malloc((size_t)(Tmax * n_out) * 4);
            float *dgu = tk_dev((size_t)(Tmax * 2 * n) * 4), *dh = tk_dev((size_t)(Tmax * n) * 4);
            cr_assert(gu && h && two);
            for (size_t ti = 0; ti < 3; ti++)
                for (int fused = 0; fused < 2; fused++) {
                    const int64_t T = Ts[ti], ld = fused ? 2 * n : n;
                    tk_fill(gu, T * 2 * n, 6.0f);
                    cr_assert_eq(gpu_h2d(dgu, gu, (size_t)(T * 2 * n) * 4, &e), 0, "%s", e.msg);
                    const float *hg = gu, *hu = fused ? gu + n : gu + T * n;
                    const float *dg = dgu, *du = fused ? dgu + n : dgu + T * n;
                    for (int64_t t = 0; t < T; t++) cpu_swiglu(h + t * n, hg + t * ld, hu + t * ld, n);
                    cpu_matmul(m.ref, h, m.wh, wt, T, n, n_out);
                    char what[128];
                    snprintf(what, sizeof what, "swiglu_qgemm %s T=%lld n_in=%lld n_out=%lld layout=%d",
                             dj_dtype_name(wt), (long long)T, (long long)n, (long long)n_out, fused);
                    // the two steps: gpu_swiglu, then the same kernel on its output
                    tk_poison(m.dy, (size_t)(T * n_out) * 4);
                    cr_assert_eq(gpu_swiglu(dh, dg, du, T, n, ld, tk_s, &e), 0, "%s", e.msg);
                    cr_assert_eq(gpu_matmul_path(tk_g, GPU_MM_QGEMM, m.dy, dh, m.dw, wt, T, n, n_out, tk_s, &e), 0,
                                 "%s: %s", what, e.msg);
                    tk_down(two, m.dy, (size_t)(T * n_out) * 4);
                    tk_poison(m.dy, (size_t)(T * n_out) * 4);
                    cr_assert_eq(gpu_swiglu_qgemm(tk_g, m.dy, dg, du, ld, m.dw, wt, T, n, n_out, tk_s, &e), 0, "%s: %s",
                                 what, e.msg);
                    tk_down(m.got, m.dy, (size_t)(T * n_out) * 4);
                    cr_expect(!memcmp(m.got, two, (size_t)(T * n_out) * 4), "%s: differs from gpu_swiglu then qgemm",
                              what);
                    tk_close(m.got, m.ref, T * n_out, 2e-3, what);
                }
            cr_expect_neq(gpu_swiglu_qgemm(tk_g, m.dy, dgu, dgu + n, n - 1, m.dw, wt, 2, n, n_out, tk_s, &e), 0,
                          "a row stride below n_in is refused");
            cr_expect(strstr(e.msg, "floats apart"), "the refusal names the stride: %s", e.msg);
            gpu_free(dgu), gpu_free(dh);
            free(gu), free(h), free(two);
            tk_mm_free(&m);
        }
    tk_end("swiglu_qgemm");
}

// The norm before q|k|v and gate|up fused into the quantized GEMV, for 1 to 9 tokens (a block of 1, 2 and 8 tokens,
// and 9: a second block of tokens reading W again): y against the CPU's add, rmsnorm and matmul row by row, the
// residual written to xo exactly (x + delta in f32, or x) for every row, x left as it was; weights it cannot take,
// xo == x and a bad T are refused by name.
Test(kernels, norm_matmul) {
    tk_start("norm_matmul");
    // n_in (dim), n_out; 8448: past the 8192 the one-pass staging holds (two eights a thread of 512), so two passes
    static const int64_t shapes[][2] = {{64, 40}, {4096, 300}, {8192, 96}, {8448, 40}};
    static const int64_t Ts[] = {1, 2, 5, 9};
    const int64_t Tmax = 9;
    dj_err e;
    for (size_t si = 0; si < 4; si++)
        for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++)
            for (int add = 0; add < 2; add++) {
                const int64_t n = shapes[si][0], n_out = shapes[si][1];
                const size_t xb = (size_t)(Tmax * n) * 4, yb = (size_t)(Tmax * n_out) * 4;
                float *x = malloc(xb), *d = malloc(xb), *nw = malloc((size_t)n * 4), *h = malloc(xb);
                float *wf = malloc((size_t)(n * n_out) * 4), *ref = malloc(yb), *got = malloc(yb), *res = malloc(xb);
                float *want_res = malloc(xb), *xback = malloc(xb);
                void *wh = malloc((size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n));
                cr_assert(x && d && nw && h && wf && ref && got && res && want_res && xback && wh);
                tk_fill(x, Tmax * n, 2.0f), tk_fill(d, Tmax * n, 1.0f), tk_fill(nw, n, 1.5f);
                tk_fill(wf, n * n_out, 1.0f / sqrtf((float)n));
                tk_store_matrix(wh, wf, n_out, n, wt);
                for (int64_t i = 0; i < Tmax * n; i++) want_res[i] = add ? x[i] + d[i] : x[i];
                for (int64_t t = 0; t < Tmax; t++) cpu_rmsnorm(h + t * n, want_res + t * n, nw, n, 1e-5f);
                cpu_matmul(ref, h, wh, wt, Tmax, n, n_out);
                float *dx = tk_up(x, xb), *dd = tk_up(d, xb), *dn = tk_up(nw, (size_t)n * 4);
                float *dxo = tk_dev(xb), *dy = tk_dev(yb);
                void *dw = tk_up(wh, (size_t)dj_matrix_bytes(wt, (uint64_t)n_out, (uint64_t)n));
                cr_assert(gpu_fused_ok(wt, dw, n, n_out));
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    const int64_t T = Ts[ti];
                    tk_poison(dy, yb), tk_poison(dxo, xb);
                    cr_assert_eq(gpu_norm_matmul(tk_g, dy, dx, add ? dd : NULL, dxo, dn, 1e-5f, dw, wt, T, n, n_out,
                                                 tk_s, &e),
                                 0, "%s", e.msg);
                    tk_down(got, dy, (size_t)(T * n_out) * 4);
                    tk_down(res, dxo, (size_t)(T * n) * 4);
                    tk_down(xback, dx, (size_t)(T * n) * 4);
                    char what[112];
                    snprintf(what, sizeof what, "norm_matmul %s T=%lld n_in=%lld n_out=%lld add=%d", dj_dtype_name(wt),
                             (long long)T, (long long)n, (long long)n_out, add);
                    tk_close(got, ref, T * n_out, 1e-4, what);
                    cr_expect_eq(memcmp(res, want_res, (size_t)(T * n) * 4), 0, "%s: the residual differs", what);
                    cr_expect_eq(memcmp(xback, x, (size_t)(T * n) * 4), 0, "%s: x was written", what);
                }
                if (si == 0 && add) {  // refusals
                    cr_expect_neq(gpu_norm_matmul(tk_g, dy, dx, dd, dx, dn, 1e-5f, dw, wt, 1, n, n_out, tk_s, &e), 0);
                    cr_expect(strstr(e.msg, "must not be x"), "%s", e.msg);
                    cr_expect(!gpu_fused_ok(DJ_F16, dw, n, n_out) && !gpu_fused_ok(wt, dw, 48, n_out));
                    cr_expect_neq(gpu_norm_matmul(tk_g, dy, dx, dd, dxo, dn, 1e-5f, dw, DJ_F16, 1, n, n_out, tk_s, &e), 0);
                    cr_expect(strstr(e.msg, "gpu_norm_matmul"), "%s", e.msg);
                    cr_expect_neq(gpu_norm_matmul(tk_g, dy, dx, dd, dxo, dn, 1e-5f, dw, wt, 0, n, n_out, tk_s, &e), 0);
                    cr_expect(strstr(e.msg, "T = 0"), "%s", e.msg);
                    // the GEMV's few tokens (2 at least for any W it takes), not past them, not where it cannot
                    cr_expect(gpu_norm_matmul_takes(tk_g, wt, dw, 2, n, n_out));
                    cr_expect(!gpu_norm_matmul_takes(tk_g, wt, dw, 9, n, n_out));
                    cr_expect(!gpu_norm_matmul_takes(tk_g, DJ_F16, dw, 2, n, n_out));
                }
                gpu_free(dx), gpu_free(dd), gpu_free(dn), gpu_free(dxo), gpu_free(dy), gpu_free(dw);
                free(x), free(d), free(nw), free(h), free(wf), free(ref), free(got), free(res), free(wh), free(want_res);
                free(xback);
            }
    tk_end("norm_matmul");
}

// The norm before q|k|v and gate|up inside the register kernel's x layout, 2..64 tokens, and the Hopper kernel's past
// them (gpu_norm_qgemm): y and the residual xo bit for bit those of gpu_add_rmsnorm (gpu_rmsnorm without delta) then
// the same product (gpu_qgemm_variant, the shape picked for T), xo exactly x + delta (or x) as the host adds it, x
// left as it was, and y within the f16 operands' 2e-3 of the CPU's add, rmsnorm and matmul. Token counts on both
// sides of the blocks of 8 NT tokens (8, 16, 32 and 64 a block) and of the Hopper kernel's 128 and 256 (65 to 513,
// on a device that has it); n_in a partial group (208: 6.5 groups, x's zeros past it meeting the rest of the last
// group's weights), whole groups not a multiple of 512 (1056), and the norm's three block sizes, 12288 with three
// elements a thread. Passes the kernels do not take, and xo == x, are refused by name.
Test(kernels, norm_qgemm) {
    tk_start("norm_qgemm");
    static const int64_t Ts[] = {2, 3, 7, 8, 9, 16, 17, 31, 33, 64, 65, 130, 300, 513};
    static const int64_t shapes[][2] = {{208, 77}, {1056, 392}, {4096, 512}, {12288, 160}};  // n_in, n_out
    const int64_t Tmax = 513;
    const int hopper = gpu_qgemm_has(tk_g, 8);
    const float eps = 1e-5f;
    dj_err e;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++) {
            const int64_t n = shapes[si][0], n_out = shapes[si][1];
            const size_t xb = (size_t)(Tmax * n) * 4, yb = (size_t)(Tmax * n_out) * 4;
            tk_mm m = tk_mm_new(wt, n, n_out, Tmax);  // m.x: the rows of x; m.ref: the CPU's products
            float *d = malloc(xb), *nw = malloc((size_t)n * 4), *h = malloc(xb), *want_res = malloc(xb);
            float *res = malloc(xb), *res2 = malloc(xb), *xback = malloc(xb), *two = malloc(yb);
            cr_assert(d && nw && h && want_res && res && res2 && xback && two);
            float *dd = tk_dev(xb), *dn = tk_dev((size_t)n * 4), *dxa = tk_dev(xb), *dxb = tk_dev(xb);
            float *dxo = tk_dev(xb), *dy2 = tk_dev(yb);
            for (int add = 0; add < 2; add++) {
                tk_fill(m.x, Tmax * n, 2.0f), tk_fill(d, Tmax * n, 1.0f), tk_fill(nw, n, 1.5f);
                for (int64_t i = 0; i < Tmax * n; i++) want_res[i] = add ? m.x[i] + d[i] : m.x[i];
                for (int64_t t = 0; t < Tmax; t++) cpu_rmsnorm(h + t * n, want_res + t * n, nw, n, eps);
                cpu_matmul(m.ref, h, m.wh, wt, Tmax, n, n_out);
                cr_assert_eq(gpu_h2d(dd, d, xb, &e), 0, "%s", e.msg);
                cr_assert_eq(gpu_h2d(dn, nw, (size_t)n * 4, &e), 0, "%s", e.msg);
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    const int64_t T = Ts[ti];
                    if (T > 64 && !hopper) continue;  // the mma.sync kernel past 64 tokens: refused below
                    const size_t tx = (size_t)(T * n) * 4, ty = (size_t)(T * n_out) * 4;
                    char what[128];
                    snprintf(what, sizeof what, "norm_qgemm %s T=%lld n_in=%lld n_out=%lld add=%d", dj_dtype_name(wt),
                             (long long)T, (long long)n, (long long)n_out, add);
                    cr_assert_eq(gpu_h2d(m.dx, m.x, tx, &e), 0, "%s", e.msg);
                    cr_assert_eq(gpu_h2d(dxa, m.x, tx, &e), 0, "%s", e.msg);
                    // the two steps: the norm into dxb (dxa += delta), then the product on it
                    tk_poison(dy2, ty);
                    cr_assert_eq(add ? gpu_add_rmsnorm(dxa, dd, dxb, dn, T, n, eps, tk_s, &e)
                                     : gpu_rmsnorm(dxb, dxa, dn, T, n, eps, tk_s, &e),
                                 0, "%s: %s", what, e.msg);
                    cr_assert_eq(gpu_qgemm_variant(tk_g, -1, dy2, dxb, m.dw, wt, T, n, n_out, tk_s, &e), 0, "%s: %s",
                                 what, e.msg);
                    tk_down(two, dy2, ty);
                    tk_down(res2, dxa, tx);
                    // in one
                    tk_poison(m.dy, ty), tk_poison(dxo, tx);
                    cr_assert_eq(gpu_norm_qgemm(tk_g, m.dy, m.dx, add ? dd : NULL, dxo, dn, eps, m.dw, wt, T, n, n_out,
                                                tk_s, &e),
                                 0, "%s: %s", what, e.msg);
                    tk_down(m.got, m.dy, ty);
                    tk_down(res, dxo, tx);
                    tk_down(xback, m.dx, tx);
                    cr_expect(!memcmp(m.got, two, ty), "%s: y differs from the norm then the product", what);
                    cr_expect(!memcmp(res, res2, tx), "%s: the residual differs from gpu_add_rmsnorm's", what);
                    cr_expect(!memcmp(res, want_res, tx), "%s: the residual is not x + delta", what);
                    cr_expect(!memcmp(xback, m.x, tx), "%s: x was written", what);
                    tk_close(m.got, m.ref, T * n_out, 2e-3, what);
                }
            }
            if (si == 0) {  // refusals, and the passes gpu_matmul would give the register kernel
                cr_expect_neq(gpu_norm_qgemm(tk_g, m.dy, m.dx, dd, m.dx, dn, eps, m.dw, wt, 8, n, n_out, tk_s, &e), 0);
                cr_expect(strstr(e.msg, "must not be x"), "%s", e.msg);
                static const int64_t bad_T[] = {1, 65};  // 65: the mma.sync kernel's where there is no Hopper one
                for (int b = 0; b < 2 - hopper; b++) {
                    cr_expect_neq(gpu_norm_qgemm(tk_g, m.dy, m.dx, dd, dxo, dn, eps, m.dw, wt, bad_T[b], n, n_out, tk_s,
                                                 &e),
                                  0, "T=%lld taken", (long long)bad_T[b]);
                    cr_expect(strstr(e.msg, "gpu_norm_qgemm"), "%s", e.msg);
                    cr_expect(!gpu_norm_qgemm_ok(tk_g, wt, m.dw, bad_T[b], n, n_out));
                }
                // past what the Hopper kernel wins (q8 1024 tokens, q4 2048), gpu_matmul dequantizes for cuBLAS
                cr_expect(!gpu_norm_qgemm_ok(tk_g, wt, m.dw, 4096, n, n_out));
                cr_expect_neq(gpu_norm_qgemm(tk_g, m.dy, m.dx, dd, dxo, dn, eps, m.dw, DJ_F16, 8, n, n_out, tk_s, &e), 0);
                cr_expect(!gpu_norm_qgemm_ok(tk_g, DJ_F16, m.dw, 8, n, n_out));
                // 64 tokens are past the one-token GEMV's few: gpu_matmul takes the register kernel where it wins
                cr_expect_eq(gpu_norm_qgemm_ok(tk_g, wt, m.dw, 64, n, n_out),
                             gpu_qgemm_wins(tk_g, wt, m.dw, 64, n, n_out));
            }
            gpu_free(dd), gpu_free(dn), gpu_free(dxa), gpu_free(dxb), gpu_free(dxo), gpu_free(dy2);
            free(d), free(nw), free(h), free(want_res), free(res), free(res2), free(xback), free(two);
            tk_mm_free(&m);
        }
    tk_end("norm_qgemm");
}

// ---- RoPE
Test(kernels, rope) {
    tk_start("rope");
    static const int64_t hds[] = {8, 48, 64, 128};
    static const int64_t Ts[] = {1, 7, 33};
    dj_err e;
    for (int type = 0; type < 2; type++)
        for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
            for (size_t ti = 0; ti < 3; ti++)
                for (int pi = 0; pi < 3; pi++) {
                    const int64_t hd = hds[hi], T = Ts[ti], nh = 3, ld = nh * hd + 5;
                    const int64_t pos0 = pi == 0 ? 0 : pi == 1 ? 1000 : 4096 - T;  // last case ends at 4095
                    dj_config c = {0};
                    c.head_dim = (uint32_t)hd;
                    c.rope_theta = type ? 500000.0f : 10000.0f;
                    c.rope_type = type ? DJ_ROPE_LLAMA3 : DJ_ROPE_DEFAULT;
                    c.rope_factor = 8.0f, c.rope_low_freq = 1.0f, c.rope_high_freq = 4.0f, c.rope_orig_max = 8192;
                    float *inv = malloc((size_t)hd / 2 * 4), *x = malloc((size_t)(T * ld) * 4), *got = malloc((size_t)(T * ld) * 4);
                    cpu_rope_freqs(&c, inv);
                    tk_fill(x, T * ld, 2.0f);
                    float *dx = tk_up(x, (size_t)(T * ld) * 4), *dinv = tk_up(inv, (size_t)hd / 2 * 4);
                    int32_t *dpos = tk_pos((int32_t)pos0);
                    cr_assert_eq(gpu_rope(dx, T, nh, hd, ld, dinv, dpos, tk_s, &e), 0, "%s", e.msg);
                    tk_down(got, dx, (size_t)(T * ld) * 4);
                    for (int64_t t = 0; t < T; t++) cpu_rope(x + t * ld, nh, hd, pos0 + t, inv);  // x becomes the reference
                    char what[128];
                    snprintf(what, sizeof what, "rope %s head_dim=%lld T=%lld pos0=%lld", type ? "llama3" : "default",
                             (long long)hd, (long long)T, (long long)pos0);
                    tk_close(got, x, T * ld, 1e-5, what);  // includes the ld padding, which must stay untouched
                    gpu_free(dx), gpu_free(dinv), gpu_free(dpos);
                    free(inv), free(x), free(got);
                }
    tk_end("rope");
}

// ---- KV cache writes
Test(kernels, kv_write) {
    tk_start("kv_write");
    dj_err e;
    const int64_t n_kv = 3, hd = 48, max_seq = 70, kv_dim = n_kv * hd, ld = 3 * kv_dim + 16;  // fused [q|k|v] rows
    const int64_t cache_n = n_kv * max_seq * hd;
    static const int64_t cases[][2] = {{1, 0}, {1, 69}, {5, 10}, {64, 6}};  // (T, pos0)
    float *kc = malloc((size_t)cache_n * 4), *vc = malloc((size_t)cache_n * 4);
    float *got = malloc((size_t)cache_n * 4), *rows = malloc((size_t)(64 * ld) * 4);
    for (size_t ci = 0; ci < 4; ci++) {
        const int64_t T = cases[ci][0], pos0 = cases[ci][1];
        tk_fill(kc, cache_n, 1.0f), tk_fill(vc, cache_n, 1.0f), tk_fill(rows, T * ld, 3.0f);
        float *dk = tk_up(kc, (size_t)cache_n * 4), *dv = tk_up(vc, (size_t)cache_n * 4);
        float *dr = tk_up(rows, (size_t)(T * ld) * 4);
        int32_t *dpos = tk_pos((int32_t)pos0);
        const gpu_kv_cache kv = tk_kv32(dk, dv);
        cr_assert_eq(gpu_kv_write(&kv, dr + kv_dim, dr + 2 * kv_dim, ld, T, n_kv, hd, max_seq, dpos, tk_s, &e), 0, "%s",
                     e.msg);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < n_kv; h++)
                for (int64_t d = 0; d < hd; d++) {
                    kc[(h * max_seq + pos0 + t) * hd + d] = rows[t * ld + kv_dim + h * hd + d];
                    vc[(h * max_seq + pos0 + t) * hd + d] = rows[t * ld + 2 * kv_dim + h * hd + d];
                }
        for (int which = 0; which < 2; which++) {
            tk_down(got, which ? dv : dk, (size_t)cache_n * 4);
            const float *want = which ? vc : kc;
            for (int64_t i = 0; i < cache_n; i++)
                if (got[i] != want[i]) {
                    cr_expect(0, "kv_write %s T=%lld pos0=%lld: cache element %lld (head %lld, pos %lld, dim %lld) is %g, want %g",
                              which ? "v" : "k", (long long)T, (long long)pos0, (long long)i, (long long)(i / (max_seq * hd)),
                              (long long)(i / hd % max_seq), (long long)(i % hd), got[i], want[i]);
                    break;
                }
        }
        gpu_free(dk), gpu_free(dv), gpu_free(dr), gpu_free(dpos);
    }
    free(kc), free(vc), free(got), free(rows);
    tk_end("kv_write");
}

// ---- attention
// Random caches (n_kv, max_seq, hd) valid up to position `last`, NaN after it: any read past the context
// poisons the result.
static void tk_cache(float *c, int64_t n_kv, int64_t max_seq, int64_t hd, int64_t last) {
    for (int64_t h = 0; h < n_kv; h++)
        for (int64_t p = 0; p < max_seq; p++)
            for (int64_t d = 0; d < hd; d++) c[(h * max_seq + p) * hd + d] = p <= last ? tc_sym() : NAN;
}

// max_seq 0: len + 37, a max_seq that is no multiple of anything. The cache of type kt, the CPU reference over
// what its rows widen to.
static void tk_decode_case_kt(int kt, int64_t group, int64_t n_kv, int64_t hd, int64_t len, int64_t max_seq) {
    dj_err e;
    const int64_t nh = group * n_kv, pos = len - 1;
    if (!max_seq) max_seq = len + 37;
    const int64_t cn = n_kv * max_seq * hd;
    float *kc = malloc((size_t)cn * 4), *vc = malloc((size_t)cn * 4), *q = malloc((size_t)(nh * hd) * 4);
    float *ref = malloc((size_t)(nh * hd) * 4), *got = malloc((size_t)(nh * hd) * 4);
    tk_cache(kc, n_kv, max_seq, hd, pos), tk_cache(vc, n_kv, max_seq, hd, pos);
    tk_fill(q, nh * hd, 3.0f);  // scores of order 1: a softmax that is neither flat nor one-hot
    gpu_kv_cache kv = tk_kv_up(kt, kc, vc, cn, hd);
    float *dq = tk_up(q, (size_t)(nh * hd) * 4), *dout = tk_dev((size_t)(nh * hd) * 4);
    int32_t *dpos = tk_pos((int32_t)pos);
    tk_poison(dout, (size_t)(nh * hd) * 4);
    int rc = gpu_attention_decode(tk_g, dout, dq, &kv, nh, n_kv, hd, max_seq, dpos, tk_s, &e);
    char what[128];
    snprintf(what, sizeof what, "attention decode %s group=%lld n_kv=%lld head_dim=%lld len=%lld max_seq=%lld",
             dj_kv_name(kt), (long long)group, (long long)n_kv, (long long)hd, (long long)len, (long long)max_seq);
    cr_expect_eq(rc, 0, "%s: %s", what, e.msg);
    if (!rc) {
        tk_down(got, dout, (size_t)(nh * hd) * 4);
        cpu_attention(ref, q, kc, vc, nh, n_kv, hd, pos, max_seq);
        // f32-class sums (f32 FMAs, or the tensor cores on two-part f16 operands); a q8 cache on the tensor cores
        // also rounds its scale-folded probabilities into those two parts: 1.04e-5 at 20000 keys
        tk_close(got, ref, nh * hd, kt == DJ_KV_Q8 ? 2e-5 : 1e-5, what);
    }
    tk_kv_free(&kv), gpu_free(dq), gpu_free(dout), gpu_free(dpos);
    free(kc), free(vc), free(q), free(ref), free(got);
}

static void tk_decode_case_ms(int64_t group, int64_t n_kv, int64_t hd, int64_t len, int64_t max_seq) {
    tk_decode_case_kt(DJ_KV_F32, group, n_kv, hd, len, max_seq);
}

static void tk_decode_case(int64_t group, int64_t n_kv, int64_t hd, int64_t len) {
    tk_decode_case_ms(group, n_kv, hd, len, 0);
}

Test(kernels, attention_decode) {
    tk_start("attention_decode");
    static const int64_t groups[] = {1, 2, 4, 8};
    static const int64_t hds[] = {64, 128, 8, 48};
    static const int64_t lens[] = {1, 17, 512, 4096};
    for (size_t gi = 0; gi < 4; gi++)
        for (size_t hi = 0; hi < 4; hi++)
            for (size_t li = 0; li < 4; li++) tk_decode_case(groups[gi], 2, hds[hi], lens[li]);
    tk_decode_case(12, 1, 64, 300);   // more query heads per kv head than one block takes
    tk_decode_case(3, 2, 256, 1000);  // the largest head_dim, two dims per thread
    tk_decode_case(1, 1, 24, 257);    // tiny odd head_dim, a split with one key
    // a short context in a long cache: splits of 16 keys (up to 256 keys), of 32 (up to 512), then of 64, each
    // boundary from both sides, and a last split of one key
    static const int64_t short_lens[] = {33, 200, 256, 257, 512, 513, 1500};
    for (size_t li = 0; li < sizeof short_lens / sizeof short_lens[0]; li++)
        tk_decode_case_ms(4, 2, 128, short_lens[li], 4096);
    tk_end("attention_decode");
}

// Prefill of T queries at pos0.. against cpu_attention row by row (every row when T <= 512, else a
// sample of rows that includes the first and the last).
static void tk_prefill_case_kt(int kt, int64_t group, int64_t n_kv, int64_t hd, int64_t T, int64_t pos0, double tol) {
    dj_err e;
    const int64_t nh = group * n_kv, last = pos0 + T - 1, max_seq = last + 1 + 19;
    const int64_t cn = n_kv * max_seq * hd, qd = nh * hd, ldq = qd + 2 * n_kv * hd;  // q rows as in a fused [q|k|v]
    float *kc = malloc((size_t)cn * 4), *vc = malloc((size_t)cn * 4), *q = malloc((size_t)(T * ldq) * 4);
    float *ref = malloc((size_t)qd * 4), *got = malloc((size_t)(T * qd) * 4);
    tk_cache(kc, n_kv, max_seq, hd, last), tk_cache(vc, n_kv, max_seq, hd, last);
    tk_fill(q, T * ldq, 3.0f);
    gpu_kv_cache kv = tk_kv_up(kt, kc, vc, cn, hd);
    float *dq = tk_up(q, (size_t)(T * ldq) * 4), *dout = tk_dev((size_t)(T * qd) * 4);
    int32_t *dpos = tk_pos((int32_t)pos0);
    tk_poison(dout, (size_t)(T * qd) * 4);
    int rc = gpu_attention_prefill(tk_g, dout, qd, dq, ldq, &kv, T, nh, n_kv, hd, max_seq, dpos, tk_s, &e);
    char what[160];
    snprintf(what, sizeof what, "attention prefill %s group=%lld n_kv=%lld head_dim=%lld T=%lld pos0=%lld",
             dj_kv_name(kt), (long long)group, (long long)n_kv, (long long)hd, (long long)T, (long long)pos0);
    cr_expect_eq(rc, 0, "%s: %s", what, e.msg);
    if (!rc) {
        tk_down(got, dout, (size_t)(T * qd) * 4);
        const int64_t step = T <= 512 ? 1 : 61;
        for (int64_t t = 0;; t = t + step < T ? t + step : T - 1) {
            cpu_attention(ref, q + t * ldq, kc, vc, nh, n_kv, hd, pos0 + t, max_seq);
            char row[200];
            snprintf(row, sizeof row, "%s, row %lld", what, (long long)t);
            if (!tk_close(got + t * qd, ref, qd, tol, row) || t == T - 1) break;
        }
    }
    tk_kv_free(&kv), gpu_free(dq), gpu_free(dout), gpu_free(dpos);
    free(kc), free(vc), free(q), free(ref), free(got);
}

static void tk_prefill_case_tol(int64_t group, int64_t n_kv, int64_t hd, int64_t T, int64_t pos0, double tol) {
    tk_prefill_case_kt(DJ_KV_F32, group, n_kv, hd, T, pos0, tol);
}

static void tk_prefill_case(int64_t group, int64_t n_kv, int64_t hd, int64_t T, int64_t pos0) {
    tk_prefill_case_tol(group, n_kv, hd, T, pos0, 1e-5);
}

// The fp32 FMA kernel (gpu_set_tc_attn off), on every shape, the largest head_dim included.
Test(kernels, attention_prefill, .timeout = 600) {
    tk_start("attention_prefill");
    gpu_set_tc_attn(tk_g, 0);
    static const int64_t groups[] = {1, 2, 4, 8};
    static const int64_t hds[] = {64, 128, 8, 48};
    static const int64_t Ts[] = {1, 17, 512};
    for (size_t gi = 0; gi < 4; gi++)
        for (size_t hi = 0; hi < 4; hi++)
            for (size_t ti = 0; ti < 3; ti++) {
                tk_prefill_case(groups[gi], 2, hds[hi], Ts[ti], 0);
                tk_prefill_case(groups[gi], 2, hds[hi], Ts[ti], 100);  // chunked prefill: a context before it
            }
    tk_prefill_case(4, 1, 64, 4096, 0);
    tk_prefill_case(1, 2, 128, 4096, 0);
    tk_prefill_case(2, 2, 128, 300, 3796);  // last query at 4095
    tk_prefill_case(3, 2, 256, 100, 37);    // the largest head_dim
    tk_prefill_case(1, 1, 24, 65, 5);       // tiny odd head_dim, a second partial query tile
    gpu_set_tc_attn(tk_g, 1);
    tk_end("attention_prefill");
}

// The same cases on the tensor-core kernel (bf16x3, the default). Its products are f32-class (operands to
// 2^-17) but the tensor cores' own accumulation is not IEEE f32, so it is held to 3e-5 where the FMA kernel stays
// under 1e-5 (one bf16 product per term would land near 3e-3). Every GQA ratio, head_dims 16 to 256, chunked
// prefill, the longest context.
static void tk_prefill_case_tc(int64_t group, int64_t n_kv, int64_t hd, int64_t T, int64_t pos0) {
    tk_prefill_case_tol(group, n_kv, hd, T, pos0, 3e-5);
}

Test(kernels, attention_prefill_tc, .timeout = 600) {
    tk_start("attention_prefill_tc");
    static const int64_t groups[] = {1, 2, 4, 8};
    static const int64_t hds[] = {64, 128, 16, 32, 48, 80};
    static const int64_t Ts[] = {1, 17, 512};
    for (int64_t hd = 16; hd <= 256; hd += 16) cr_assert(gpu_tc_attn_supported(tk_g, hd), "head_dim %lld", (long long)hd);
    cr_assert(!gpu_tc_attn_supported(tk_g, 8) && !gpu_tc_attn_supported(tk_g, 24) && !gpu_tc_attn_supported(tk_g, 272));
    for (size_t gi = 0; gi < 4; gi++)
        for (size_t hi = 0; hi < 6; hi++)
            for (size_t ti = 0; ti < 3; ti++) {
                tk_prefill_case_tc(groups[gi], 2, hds[hi], Ts[ti], 0);
                tk_prefill_case_tc(groups[gi], 2, hds[hi], Ts[ti], 100);
            }
    tk_prefill_case_tc(4, 1, 64, 4096, 0);
    tk_prefill_case_tc(1, 2, 128, 4096, 0);
    tk_prefill_case_tc(2, 2, 128, 300, 3796);  // last query at 4095
    tk_prefill_case_tc(1, 1, 48, 65, 5);       // a second, partial query tile
    tk_prefill_case_tc(3, 2, 256, 100, 37);    // the largest head_dim
    tk_prefill_case_tc(2, 1, 176, 70, 0);
    tk_prefill_case_tc(1, 2, 8, 40, 3);        // a head_dim it has no kernel for: the FMA kernel serves it
    tk_end("attention_prefill_tc");
}

// A batched decode step's rows (gpu_rope_kv_rows, gpu_attention_decode_rows): rows in shuffled slots at their
// own positions (one at 0, one at the context's end), q, k, v in separate blocks (ldq != ldkv) and fused rows, for
// every KV type: each row's rotated q and k, its cache rows in its own slot only, stored exactly as kvtype.h says
// (the rotated rows the GPU computed, stored on the host: the same bits), and its attention over that slot's keys,
// against the CPU; the other slots' caches untouched.
Test(kernels, decode_rows) {
    tk_start("decode_rows");
    dj_err e;
    const int64_t n_kv = 2, group = 3, nh = n_kv * group, hd = 32, max_seq = 150, qd = nh * hd, kvd = n_kv * hd;
    const int32_t n_slots = 7, B = 5;
    const int64_t cn = n_kv * max_seq * hd, all = cn * n_slots;
    dj_config c = {0};
    c.head_dim = (uint32_t)hd, c.rope_theta = 10000.0f;
    float inv[16];
    cpu_rope_freqs(&c, inv);
    float *kc = malloc((size_t)all * 4), *vc = malloc((size_t)all * 4), *gk = malloc((size_t)all * 4);
    float *gvc = malloc((size_t)all * 4);
    uint8_t row_bytes[32 * 4];
    float row_scale;
    for (int kt = 0; kt < DJ_KV_TYPES; kt++)
        for (int fused = 0; fused < 2; fused++) {
            tk_fill(kc, all, 1.0f), tk_fill(vc, all, 1.0f);
            gpu_kv_cache cache = tk_kv_up(kt, kc, vc, all, hd);  // kc, vc: what the cache holds, widened
            int32_t slot[5] = {4, 0, 6, 2, 3}, pos[5] = {0, 149, 77, 5, 64};
            // rows: fused [q | k | v] each (ld = qd + 2 kvd), or blocks q (B, qd), k (B, kvd), v (B, kvd)
            const int64_t n = B * (qd + 2 * kvd), ldq = fused ? qd + 2 * kvd : qd, ldkv = fused ? qd + 2 * kvd : kvd;
            float *rows = malloc((size_t)n * 4), *q = rows, *k = fused ? rows + qd : rows + B * qd;
            float *v = fused ? rows + qd + kvd : rows + B * (qd + kvd);
            tk_fill(rows, n, 2.0f);
            float *drows = tk_up(rows, (size_t)n * 4), *dinv = tk_up(inv, sizeof inv);
            float *dout = tk_dev((size_t)B * qd * 4);
            int32_t *dpos = tk_up(pos, sizeof pos), *dslot = tk_up(slot, sizeof slot);
            gpu_kv_rows kv = {dpos, dslot, cn, dpos, 0};  // each row's own key its slot's first new one
            float *gq = drows, *gkr = drows + (k - rows), *gvr = drows + (v - rows);
            cr_assert_eq(gpu_rope_kv_rows(tk_g, gq, ldq, gkr, gvr, ldkv, B, &cache, nh, n_kv, hd, max_seq, dinv, &kv,
                                          tk_s, &e),
                         0, "%s", e.msg);
            tk_poison(dout, (size_t)B * qd * 4);
            cr_assert_eq(
                gpu_attention_decode_rows(tk_g, dout, gq, ldq, &cache, B, nh, n_kv, hd, max_seq, &kv, tk_s, &e), 0,
                "%s", e.msg);
            // the CPU: rotate each row's q and k (q then k heads, as the GPU's rows)
            float *att = malloc((size_t)B * qd * 4), *gatt = malloc((size_t)B * qd * 4), *grows = malloc((size_t)n * 4);
            float *qk = malloc((size_t)(qd + kvd) * 4);
            for (int b = 0; b < B; b++) {
                memcpy(qk, q + b * ldq, (size_t)qd * 4), memcpy(qk + qd, k + b * ldkv, (size_t)kvd * 4);
                cpu_rope(qk, nh + n_kv, hd, pos[b], inv);
                memcpy(q + b * ldq, qk, (size_t)qd * 4), memcpy(k + b * ldkv, qk + qd, (size_t)kvd * 4);
            }
            char what[96];
            const char *layout = fused ? "fused" : "blocks";
            snprintf(what, sizeof what, "decode rows (%s, %s): rotated q, k", dj_kv_name(kt), layout);
            tk_down(grows, drows, (size_t)n * 4);
            tk_close(grows, rows, n, 1e-6, what);
            // each row's slot, from the GPU's rotated k and its v, stored as kvtype.h says
            for (int b = 0; b < B; b++)
                for (int64_t h = 0; h < n_kv; h++)
                    for (int w = 0; w < 2; w++) {
                        float *dst = (w ? vc : kc) + slot[b] * cn + (h * max_seq + pos[b]) * hd;
                        memcpy(dst, grows + (w ? v - rows : k - rows) + b * ldkv + h * hd, (size_t)hd * 4);
                        tk_kv_row(kt, dst, hd, row_bytes, &row_scale);
                    }
            for (int b = 0; b < B; b++)
                cpu_attention(att + b * qd, q + b * ldq, kc + slot[b] * cn, vc + slot[b] * cn, nh, n_kv, hd, pos[b],
                              max_seq);
            tk_kv_down(&cache, gk, gvc, all, hd);
            snprintf(what, sizeof what, "decode rows (%s, %s): caches", dj_kv_name(kt), layout);
            tk_close(gk, kc, all, 0, what);
            tk_close(gvc, vc, all, 0, what);
            snprintf(what, sizeof what, "decode rows (%s, %s): attention", dj_kv_name(kt), layout);
            tk_down(gatt, dout, (size_t)B * qd * 4);
            tk_close(gatt, att, B * qd, 1e-5, what);
            tk_kv_free(&cache), gpu_free(drows), gpu_free(dinv), gpu_free(dout), gpu_free(dpos), gpu_free(dslot);
            free(rows), free(att), free(gatt), free(grows), free(qk);
        }
    free(kc), free(vc), free(gk), free(gvc);
    tk_end("decode_rows");
}

// The cache types' rows as the kernels store them (gpu_kv_write, gpu_rope_kv), byte for byte what kvtype.h's rule
// gives on the CPU (dj_f32_to_f16, dj_kv_q8_row): rows of random values, an all-zero row, rows holding a NaN or an
// infinity, values at the f16 rounding ties, for head_dims whose rows are and are not 16-byte multiples.
static void tk_kv_store_case(int kt, int64_t n_kv, int64_t hd, int64_t T, int64_t pos0, int rope) {
    dj_err e;
    const int64_t nh = 2 * n_kv, max_seq = pos0 + T + 3, kvd = n_kv * hd, ld = nh * hd + 2 * kvd;
    const int64_t cn = n_kv * max_seq * hd;
    const size_t eb = dj_kv_elem_bytes(kt);
    float *rows = malloc((size_t)(T * ld) * 4), *inv = malloc((size_t)hd / 2 * 4);
    dj_config c = {0};
    c.head_dim = (uint32_t)hd, c.rope_theta = 10000.0f;
    cpu_rope_freqs(&c, inv);
    tk_fill(rows, T * ld, 4.0f);
    float *k0 = rows + nh * hd;  // the first row's k heads: the special values
    for (int64_t d = 0; d < hd; d++) k0[d] = 0.0f;  // an all-zero row (head 0)
    if (n_kv > 1) k0[hd + 1] = NAN, k0[hd + 3] = INFINITY;                       // head 1: a NaN and an infinity
    if (T > 1) rows[ld + nh * hd] = 1.0f + 1.0f / 2048, rows[ld + nh * hd + 1] = 1.0f + 3.0f / 2048;  // f16 ties
    float *drows = tk_up(rows, (size_t)(T * ld) * 4), *dinv = tk_up(inv, (size_t)hd / 2 * 4);
    uint8_t *zero = calloc((size_t)cn, eb > 4 ? eb : 4);
    gpu_kv_cache kv = {tk_up(zero, (size_t)cn * eb), tk_up(zero, (size_t)cn * eb), NULL, NULL, kt};
    if (kt == DJ_KV_Q8) kv.ks = tk_up(zero, (size_t)(cn / hd) * 4), kv.vs = tk_up(zero, (size_t)(cn / hd) * 4);
    int32_t *dpos = tk_pos((int32_t)pos0);
    int rc = rope ? gpu_rope_kv(tk_g, drows, ld, T, &kv, nh, n_kv, hd, max_seq, dinv, dpos, tk_s, &e)
                  : gpu_kv_write(&kv, drows + nh * hd, drows + nh * hd + kvd, ld, T, n_kv, hd, max_seq, dpos, tk_s, &e);
    char what[160];
    snprintf(what, sizeof what, "%s %s n_kv=%lld head_dim=%lld T=%lld pos0=%lld", rope ? "rope_kv" : "kv_write",
             dj_kv_name(kt), (long long)n_kv, (long long)hd, (long long)T, (long long)pos0);
    cr_assert_eq(rc, 0, "%s: %s", what, e.msg);
    tk_down(rows, drows, (size_t)(T * ld) * 4);  // k rotated by the GPU (rope_kv): what its cache rows hold
    uint8_t *got = malloc((size_t)cn * eb), *want = malloc((size_t)hd * eb);
    float *gs = malloc((size_t)(cn / hd) * 4), ws, *x = malloc((size_t)hd * 4);
    for (int w = 0; w < 2; w++) {
        tk_down(got, w ? kv.v : kv.k, (size_t)cn * eb);
        if (kt == DJ_KV_Q8) tk_down(gs, w ? kv.vs : kv.ks, (size_t)(cn / hd) * 4);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < n_kv; h++) {
                memcpy(x, rows + t * ld + nh * hd + w * kvd + h * hd, (size_t)hd * 4);
                tk_kv_row(kt, x, hd, want, &ws);
                const int64_t r = h * max_seq + pos0 + t;
                cr_expect(!memcmp(got + r * hd * eb, want, (size_t)hd * eb), "%s: %s row t=%lld head %lld differs",
                          what, w ? "v" : "k", (long long)t, (long long)h);
                if (kt == DJ_KV_Q8)
                    cr_expect(!memcmp(&gs[r], &ws, 4), "%s: %s row t=%lld head %lld: scale %g, want %g", what,
                              w ? "v" : "k", (long long)t, (long long)h, gs[r], ws);
            }
    }
    tk_kv_free(&kv), gpu_free(drows), gpu_free(dinv), gpu_free(dpos);
    free(rows), free(inv), free(zero), free(got), free(want), free(gs), free(x);
}

Test(kernels, kv_types_stored_as_kvtype_says) {
    tk_start("kv_types_stored_as_kvtype_says");
    for (int kt = 0; kt < DJ_KV_TYPES; kt++)
        for (int rope = 0; rope < 2; rope++) {
            tk_kv_store_case(kt, 3, 48, 5, 10, rope);
            tk_kv_store_case(kt, 2, 128, 3, 0, rope);
            tk_kv_store_case(kt, 2, 10, 4, 7, rope);   // q8 rows of 10 bytes, f16 rows of 20
            tk_kv_store_case(kt, 1, 256, 2, 50, rope);
        }
    tk_end("kv_types_stored_as_kvtype_says");
}

// gpu_attention_decode_rows for B rows, row b at pos[b] in slot slot[b] of n_slots, max_seq positions each (slot
// NULL: one sequence's rows in the cache given), n_kv kv heads of `group` query heads, head_dim hd; one_slot: the
// rows all of one slot, given by their slots (a step's run; the tensor-core kernel takes several a block over the
// same keys, each masked past its own position); fresh (NULL: none) each row's first key its pass writes, the keys
// below it copied before the kernels' wait. Each slot's cache past its deepest row NaN, so no read goes past it;
// against cpu_attention over each row's slot.
static void tk_attn_rows_case(int kt, int64_t group, int64_t n_kv, int64_t hd, int32_t B, const int32_t *slot,
                              int32_t n_slots, const int32_t *pos, const int32_t *fresh, int one_slot, int64_t max_seq,
                              const char *name) {
    dj_err e;
    const int64_t nh = n_kv * group, qd = nh * hd, cn = n_kv * max_seq * hd, all = n_slots * cn;
    float *kc = malloc((size_t)all * 4), *vc = malloc((size_t)all * 4), *q = malloc((size_t)B * qd * 4);
    float *ref = malloc((size_t)B * qd * 4), *got = malloc((size_t)B * qd * 4);
    for (int32_t sl = 0; sl < n_slots; sl++) {
        int32_t deepest = -1;
        for (int b = 0; b < B; b++)
            if ((slot ? slot[b] : 0) == sl && pos[b] > deepest) deepest = pos[b];
        tk_cache(kc + sl * cn, n_kv, max_seq, hd, deepest), tk_cache(vc + sl * cn, n_kv, max_seq, hd, deepest);
    }
    tk_fill(q, B * qd, 3.0f);
    gpu_kv_cache kv = tk_kv_up(kt, kc, vc, all, hd);
    float *dq = tk_up(q, (size_t)B * qd * 4), *dout = tk_dev((size_t)B * qd * 4);
    int32_t *dpos = tk_up(pos, (size_t)B * sizeof *pos), *dslot = slot ? tk_up(slot, (size_t)B * sizeof *slot) : NULL;
    int32_t *dfresh = fresh ? tk_up(fresh, (size_t)B * sizeof *fresh) : NULL;
    gpu_kv_rows rows = {dpos, dslot, slot ? cn : 0, dfresh, one_slot};
    tk_poison(dout, (size_t)B * qd * 4);
    char what[200];
    snprintf(what, sizeof what, "%s (%s, group %lld, head_dim %lld, %d rows)", name, dj_kv_name(kt), (long long)group,
             (long long)hd, B);
    cr_assert_eq(gpu_attention_decode_rows(tk_g, dout, dq, qd, &kv, B, nh, n_kv, hd, max_seq, &rows, tk_s, &e), 0,
                 "%s: %s", what, e.msg);
    tk_down(got, dout, (size_t)B * qd * 4);
    for (int b = 0; b < B; b++) {
        const int64_t off = (slot ? slot[b] : 0) * cn;
        cpu_attention(ref + b * qd, q + b * qd, kc + off, vc + off, nh, n_kv, hd, pos[b], max_seq);
        char row[260];
        snprintf(row, sizeof row, "%s, row %d at %d", what, b, pos[b]);
        if (!tk_close(got + b * qd, ref + b * qd, qd, kt == DJ_KV_Q8 ? 2e-5 : 1e-5, row)) break;  // as decode's
    }
    tk_kv_free(&kv), gpu_free(dq), gpu_free(dout), gpu_free(dpos), gpu_free(dslot), gpu_free(dfresh);
    free(kc), free(vc), free(q), free(ref), free(got);
}

// Deep contexts, where a split loops over several chunks of keys with the online softmax (the grid's splits are
// fewer than the context's chunks): one row with 8 kv heads (128 splits a head) at 9000 and 20000 keys, each type,
// head_dims whose stages fit twice (128, 64: two key slices a thread block) and once (f32 at 256); and rows of a
// step in three slots at their own depths (gpu_attention_decode_rows), one of them shallow.
Test(kernels, attention_decode_deep, .timeout = 600) {
    tk_start("attention_decode_deep");
    for (int kt = 0; kt < DJ_KV_TYPES; kt++) {
        tk_decode_case_kt(kt, 4, 8, 128, 20000, 0);
        tk_decode_case_kt(kt, 4, 8, 128, 9000, 20037);
        tk_decode_case_kt(kt, 2, 8, 64, 12000, 0);
    }
    tk_decode_case_kt(DJ_KV_F32, 2, 8, 256, 10000, 0);
    static const int32_t slot[3] = {2, 0, 1}, pos[3] = {8999, 100, 5000};
    for (int kt = 0; kt < DJ_KV_TYPES; kt++)
        tk_attn_rows_case(kt, 4, 8, 128, 3, slot, 3, pos, NULL, 0, 9000, "deep decode rows");
    tk_end("attention_decode_deep");
}

// The rows of a verification pass or a prompt's run (gpu_attention_decode_rows over one slot) at consecutive
// positions: 1 to 64 rows, from the context's start, across split and chunk boundaries and deep, for groups of 1-8
// query heads (1 to 16 rows a tensor-core block), head_dims 64 and 128, every KV type (f32 on the FMA kernel, a row a
// block); by slots as a step's run, its keys before the run's first copied early as step_fresh has them; and rows of
// one slot out of order.
Test(kernels, attention_decode_pass_rows, .timeout = 600) {
    tk_start("attention_decode_pass_rows");
    static const int32_t cases[][2] = {{1, 0}, {2, 14}, {4, 63}, {5, 250}, {9, 1000}, {17, 47}, {64, 300}};
    static const int64_t groups[] = {1, 2, 4, 8}, hds[] = {64, 128};
    int32_t pos[64], ones[64], first[64];
    for (int b = 0; b < 64; b++) ones[b] = 1;
    for (int kt = 0; kt < DJ_KV_TYPES; kt++)
        for (int gi = 0; gi < 4; gi++)
            for (int hi = 0; hi < 2; hi++)
                for (int ci = 0; ci < 7; ci++) {
                    for (int b = 0; b < cases[ci][0]; b++) pos[b] = cases[ci][1] + b;
                    tk_attn_rows_case(kt, groups[gi], 2, hds[hi], cases[ci][0], NULL, 1, pos, NULL, 0, 1100,
                                      "pass rows");
                }
    for (int kt = 0; kt < DJ_KV_TYPES; kt++) {  // by slots (slot 1 of 3), each row's first fresh key the run's first
        for (int b = 0; b < 64; b++) pos[b] = 100 + b, first[b] = 100;
        tk_attn_rows_case(kt, 4, 8, 128, 9, ones, 3, pos, first, 1, 512, "a run's rows by slots");
        tk_attn_rows_case(kt, 4, 8, 128, 64, ones, 3, pos, first, 1, 512, "a run's rows by slots");
        static const int32_t shuffled[6] = {300, 5, 77, 150, 0, 299}, none[6] = {0, 0, 0, 0, 0, 0};
        tk_attn_rows_case(kt, 4, 8, 128, 6, NULL, 1, shuffled, NULL, 0, 512, "pass rows out of order");
        tk_attn_rows_case(kt, 2, 4, 64, 6, ones, 3, shuffled, none, 1, 512, "a run's rows out of order by slots");
    }
    tk_end("attention_decode_pass_rows");
}

// Each row's first key its pass writes in its slot (gpu_kv_fresh; no GPU needed): the least position of the pass's
// rows in that slot, wherever they stand (a wanted row placed before its run's rows, slots out of order), alone where
// a slot has one row.
Test(kernels, kv_fresh_keys) {
    static const int32_t slot[8] = {3, 1, 3, 3, 0, 1, 5, 3}, pos[8] = {10, 40, 7, 8, 0, 39, 300, 9};
    static const int32_t want[8] = {7, 39, 7, 7, 0, 39, 300, 7};
    int32_t fresh[8], first[6];
    for (int i = 0; i < 6; i++) first[i] = -5;  // stale scratch
    gpu_kv_fresh(fresh, slot, pos, 8, first);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(fresh[i], want[i], "row %d (slot %d at %d): first new key %d, want %d", i, slot[i], pos[i],
                     fresh[i], want[i]);
    gpu_kv_fresh(fresh, slot + 6, pos + 6, 1, first);
    cr_assert_eq(fresh[0], 300, "one row: its own position");
}

// The decode split plan (gpu_attention_splits: the rule the kernels follow on the device, on the host; no GPU needed)
// over rows, kv heads, groups, slot sizes and depths: every key in exactly one split of the grid (span (ns - 1) < n <=
// span ns, ns <= the grid's splits), the grid within the combine's DEC_MAX_SPLITS (1024) and within the scratch
// gpu_attention_scratch sizes, spans of 16 or 32 keys or whole chunks of 64; then the rule's choices where they were
// measured: one row as before the rows' rule, fewer, longer splits from two rows (of 8 kv heads), 64 rows of 8
// kv heads in one split a short context, splits of 256 keys up to 512 blocks, deep contexts over half the grid.
Test(kernels, attention_split_plan) {
    static const int64_t rows[] = {1, 2, 3, 4, 5, 8, 16, 33, 64, 100, 256, 1000};
    static const int64_t kvs[][2] = {{8, 32}, {8, 8}, {1, 1}, {2, 24}, {32, 32}, {4, 128}};  // (kv heads, heads)
    static const int64_t seqs[] = {1, 17, 64, 100, 512, 1024, 1025, 8192, 32768};
    long cases = 0;
    for (size_t bi = 0; bi < sizeof rows / sizeof rows[0]; bi++)
        for (size_t ki = 0; ki < sizeof kvs / sizeof kvs[0]; ki++)
            for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++) {
                const int64_t B = rows[bi], nkv = kvs[ki][0], nh = kvs[ki][1], ms = seqs[si];
                for (int64_t pos = 0; pos < ms + 3; pos = pos < 1100 ? pos + 1 : pos * 5 / 4) {
                    int64_t ns_grid, span;
                    const int64_t ns = gpu_attention_splits(B, nh, nkv, ms, pos, &ns_grid, &span);
                    const int64_t n = (pos < ms ? pos : ms - 1) + 1;
                    cases++;
                    cr_assert(span >= 1 && ns >= 1 && span * (ns - 1) < n && n <= span * ns && ns <= ns_grid &&
                                  ns_grid <= 1024 && (span == 16 || span == 32 || span % 64 == 0),
                              "B=%lld kv=%lld heads=%lld max_seq=%lld pos=%lld: %lld splits of %lld keys, grid %lld",
                              (long long)B, (long long)nkv, (long long)nh, (long long)ms, (long long)pos,
                              (long long)ns, (long long)span, (long long)ns_grid);
                }
                int64_t ns_grid, span;
                gpu_attention_splits(B, nh, nkv, ms, 0, &ns_grid, &span);
                cr_assert_geq(gpu_attention_scratch(B, nh, nkv, 128, ms), (size_t)(B * nh * ns_grid * 130 * 4),
                              "B=%lld kv=%lld max_seq=%lld: the scratch holds the grid's partials", (long long)B,
                              (long long)nkv, (long long)ms);
            }
    cr_expect_gt(cases, 100000, "the sweep ran");
    // the choices: {B, kv heads, heads, max_seq, pos} -> {splits holding keys, span}
    static const int64_t want[][7] = {
        {1, 8, 32, 4096, 199, 13, 16},   {1, 8, 32, 4096, 299, 10, 32},  {1, 8, 32, 4096, 999, 16, 64},
        {2, 8, 32, 4096, 199, 7, 32},    {1, 8, 32, 32768, 19999, 32, 640}, {64, 8, 32, 512, 95, 1, 128},
        {64, 8, 32, 512, 479, 1, 512},   {16, 8, 32, 512, 95, 2, 64},    {16, 8, 32, 512, 479, 2, 256},
        {64, 8, 32, 8192, 1999, 8, 256}, {5, 8, 32, 512, 511, 4, 128},   {4, 8, 32, 4096, 199, 4, 64},
        {32, 8, 32, 2048, 999, 2, 512},  {16, 8, 32, 2048, 999, 4, 256},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t ns_grid, span;
        const int64_t *w = want[i];
        const int64_t ns = gpu_attention_splits(w[0], w[2], w[1], w[3], w[4], &ns_grid, &span);
        cr_expect(ns == w[5] && span == w[6], "B=%lld kv=%lld max_seq=%lld pos=%lld: %lld splits of %lld keys, "
                  "expected %lld of %lld", (long long)w[0], (long long)w[1], (long long)w[3], (long long)w[4],
                  (long long)ns, (long long)span, (long long)w[5], (long long)w[6]);
    }
}

// The rows of a server's step: 5, 16 and 64 rows at short depths in a cache of 512 positions a slot (the rows and
// heads alone fill the GPU there, so a short context takes fewer, longer splits than one row's), every depth a split
// boundary can fall on (16, 32 and 64 keys, either side), in slots out of order, the keys copied before the kernels'
// wait ending anywhere in a chunk (none, some, all but the row's own); each kv type, on the tensor-core kernel and on
// the FMA kernel.
Test(kernels, attention_decode_many_rows, .timeout = 600) {
    tk_start("attention_decode_many_rows");
    static const int32_t depths[] = {1,   2,   15,  16,  17,  31,  32,  33,  63,  64,  65,
                                     96,  127, 128, 129, 200, 255, 256, 257, 384, 511, 512};
    const int nd = (int)(sizeof depths / sizeof depths[0]);
    int32_t slot[64], pos[64], fresh[64];
    for (int b = 0; b < 64; b++) {
        slot[b] = (b * 29 + 7) % 64, pos[b] = depths[(b * 7) % nd] - 1;
        fresh[b] = pos[b] - (b * 13) % 80 > 0 ? pos[b] - (b * 13) % 80 : 0;
    }
    static const int32_t rows[] = {5, 16, 64};
    for (int tc = 1; tc >= 0; tc--) {
        gpu_set_tc_attn(tk_g, tc);
        for (int kt = 0; kt < DJ_KV_TYPES; kt++)
            for (int r = 0; r < 3; r++)
                tk_attn_rows_case(kt, 4, 8, 128, rows[r], slot, 64, pos, fresh, 0, 512,
                                  tc ? "many rows, tensor cores" : "many rows, FMA");
    }
    gpu_set_tc_attn(tk_g, 1);
    // head_dim 64 at 64 rows x 8 kv heads: the tensor-core kernel's three-blocks build of that head_dim (TD_MANY_MINB)
    for (int kt = DJ_KV_F16; kt < DJ_KV_TYPES; kt++)
        tk_attn_rows_case(kt, 4, 8, 64, 64, slot, 64, pos, fresh, 0, 512, "many rows, tensor cores");
    tk_end("attention_decode_many_rows");
}

// Decode and prefill (both kernels) over f16 and q8 caches against the CPU over what the caches' rows widen to: the
// kernels read each type's bytes and scales right, at every alignment a row can have.
Test(kernels, attention_kv_types, .timeout = 600) {
    tk_start("attention_kv_types");
    for (int kt = DJ_KV_F16; kt < DJ_KV_TYPES; kt++) {
        static const int64_t hds[] = {128, 64, 48, 24, 10};
        for (size_t hi = 0; hi < 5; hi++) {
            tk_decode_case_kt(kt, 4, 2, hds[hi], 300, 0);  // f16 at head_dim 64, 128: the tensor-core kernel
            tk_decode_case_kt(kt, 1, 2, hds[hi], 1, 0);
            gpu_set_tc_attn(tk_g, 0);  // the FMA kernels, decode and prefill
            tk_decode_case_kt(kt, 4, 2, hds[hi], 300, 0);
            tk_prefill_case_kt(kt, 2, 2, hds[hi], 70, 30, 1e-5);
            gpu_set_tc_attn(tk_g, 1);
            tk_prefill_case_kt(kt, 2, 2, hds[hi], 70, 30, 3e-5);  // the tensor cores where hd allows (not 24, 10)
        }
        tk_decode_case_kt(kt, 8, 1, 128, 4096, 0);
        tk_decode_case_kt(kt, 8, 3, 64, 2000, 0);  // a group of 8: every row of the tensor-core kernel's A but 8
        tk_decode_case_kt(kt, 3, 2, 256, 1000, 0);
        tk_decode_case_kt(kt, 4, 2, 128, 257, 4096);
        tk_prefill_case_kt(kt, 4, 2, 128, 512, 0, 3e-5);
        tk_prefill_case_kt(kt, 1, 1, 256, 100, 37, 3e-5);
    }
    tk_end("attention_kv_types");
}

// Decode captured once as a graph (RoPE on q and k, KV write, attention), replayed with only the
// position changing on the device: the graph-friendliness the engine relies on.
Test(kernels, decode_graph_replay) {
    tk_start("decode_graph_replay");
    dj_err e;
    const int64_t n_kv = 2, group = 4, nh = n_kv * group, hd = 64, max_seq = 600, qd = nh * hd, kvd = n_kv * hd;
    const int64_t ld = qd + 2 * kvd, cn = n_kv * max_seq * hd;
    dj_config c = {0};
    c.head_dim = (uint32_t)hd, c.rope_theta = 10000.0f;
    float inv[32];
    cpu_rope_freqs(&c, inv);
    float *kc = calloc((size_t)cn, 4), *vc = calloc((size_t)cn, 4), *row = malloc((size_t)ld * 4);
    float *ref = malloc((size_t)qd * 4), *got = malloc((size_t)qd * 4);
    float *dk = tk_dev((size_t)cn * 4), *dv = tk_dev((size_t)cn * 4), *drow = tk_dev((size_t)ld * 4);
    float *dout = tk_dev((size_t)qd * 4), *dinv = tk_up(inv, sizeof inv);
    int32_t *dpos = tk_pos(0);
    cr_assert_eq(gpu_memset(dk, 0, (size_t)cn * 4, tk_s, &e), 0, "%s", e.msg);
    cr_assert_eq(gpu_memset(dv, 0, (size_t)cn * 4, tk_s, &e), 0, "%s", e.msg);
    cr_assert_eq(gpu_reserve(tk_g, gpu_attention_scratch(1, nh, n_kv, hd, max_seq), &e), 0, "%s", e.msg);
    cudaGraphExec_t exec;
    cr_assert_eq(gpu_graph_begin(tk_s, &e), 0, "%s", e.msg);
    cr_assert_eq(gpu_rope(drow, 1, nh + n_kv, hd, ld, dinv, dpos, tk_s, &e), 0, "%s", e.msg);
    const gpu_kv_cache kv = tk_kv32(dk, dv);
    cr_assert_eq(gpu_kv_write(&kv, drow + qd, drow + qd + kvd, ld, 1, n_kv, hd, max_seq, dpos, tk_s, &e), 0, "%s",
                 e.msg);
    cr_assert_eq(gpu_attention_decode(tk_g, dout, drow, &kv, nh, n_kv, hd, max_seq, dpos, tk_s, &e), 0, "%s", e.msg);
    cr_assert_eq(gpu_graph_end(tk_s, &exec, &e), 0, "%s", e.msg);
    for (int32_t pos = 0; pos < 520; pos++) {
        tk_fill(row, ld, 2.0f);
        cr_assert_eq(gpu_stream_sync(tk_s, &e), 0, "replay failed: %s", e.msg);  // the last replay reads drow, dpos
        cr_assert_eq(gpu_h2d(drow, row, (size_t)ld * 4, &e), 0, "%s", e.msg);
        cr_assert_eq(gpu_h2d(dpos, &pos, sizeof pos, &e), 0, "%s", e.msg);
        cr_assert_eq(gpu_graph_launch(exec, tk_s, &e), 0, "%s", e.msg);
        cpu_rope(row, nh + n_kv, hd, pos, inv);
        for (int64_t h = 0; h < n_kv; h++)
            for (int64_t d = 0; d < hd; d++) {
                kc[(h * max_seq + pos) * hd + d] = row[qd + h * hd + d];
                vc[(h * max_seq + pos) * hd + d] = row[qd + kvd + h * hd + d];
            }
        if (pos % 37 != 0 && pos != 519) continue;
        tk_down(got, dout, (size_t)qd * 4);
        cpu_attention(ref, row, kc, vc, nh, n_kv, hd, pos, max_seq);
        char what[64];
        snprintf(what, sizeof what, "graph replay at pos %d", pos);
        if (!tk_close(got, ref, qd, 1e-5, what)) break;
    }
    gpu_graph_destroy(exec);
    gpu_free(dk), gpu_free(dv), gpu_free(drow), gpu_free(dout), gpu_free(dinv), gpu_free(dpos);
    free(kc), free(vc), free(row), free(ref), free(got);
    tk_end("decode_graph_replay");
}

// ---- sampling: gpu_pick against sampler_pick_u, the host's version of the same rule
// A row of n logits of one kind: 0 spread, 1 rounded (ties at every boundary), 2 flat, 3 spread with -infinity
// entries, 4 one NaN, 5 one +infinity, 6 all -infinity, 7 near-flat (distinct weights all close to the top's).
#define TK_KINDS 8
static void tk_logits(float *z, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++)
        z[i] = kind == 1   ? roundf(1.5f * tc_normal())
               : kind == 2 ? 0.25f
               : kind == 6 ? -INFINITY
               : kind == 7 ? 1e-4f * tc_normal()
                           : 3.0f * tc_normal();
    if (kind == 3)
        for (int64_t i = 0; i < n; i += 3) z[i] = -INFINITY;
    if (kind == 4 || kind == 5) z[tc_next() % (uint64_t)n] = kind == 4 ? NAN : INFINITY;
}

// One pick on the GPU with the sampler's arguments for draw u (counts uploaded whole when `whole`, else kept in
// step by the arguments' changes), against the host; the device counts must then equal the host's.
static void tk_pick_case(dj_sampler *smp, const float *z, int64_t n, float u, int32_t *d_counts, int whole,
                         const char *what) {
    dj_err e;
    dj_pick_args a;
    sampler_step_args(smp, &a);
    a.u = u;
    const int32_t *hc = sampler_counts(smp);
    if (hc && (whole || a.n_set < 0)) {
        cr_assert_eq(gpu_h2d(d_counts, hc, (size_t)n * 4, &e), 0, "%s", e.msg);
        a.n_set = 0;
    }
    float *dz = tk_up(z, (size_t)n * 4);
    dj_pick_args *da = tk_up(&a, sizeof a);
    int32_t *dout = tk_dev(4), got;
    tk_poison(dout, 4);
    void *sc = tk_dev(gpu_pick_scratch(1));
    cr_assert_eq(gpu_pick(sc, dout, dz, 1, n, da, hc ? d_counts : NULL, tk_s, &e), 0, "%s", e.msg);
    gpu_free(sc);
    tk_down(&got, dout, 4);
    int32_t want = sampler_pick_u(smp, z, u);
    cr_expect_eq(got, want, "pick %s n=%lld u=%.9g: got %d, want %d (seed %llu)", what, (long long)n, u, got, want,
                 (unsigned long long)tc_seed_used());
    if (hc) {
        int32_t *dc = malloc((size_t)n * 4);
        tk_down(dc, d_counts, (size_t)n * 4);
        cr_expect_eq(memcmp(dc, hc, (size_t)n * 4), 0, "pick %s: the device counts differ from the host's", what);
        free(dc);
    }
    gpu_free(dz), gpu_free(da), gpu_free(dout);
}

// DJINN_SANITIZER_QUICK=1 (compute-sanitizer's racecheck, ~1 s a launch here): three sizes, two settings a kind
// of row, one draw each.
Test(kernels, pick) {
    tk_start("pick");
    static const int64_t ns[] = {1, 7, 300, 5000, 32000, 128256};
    typedef struct {
        double temp, top_p, min_p;
        int64_t top_k;
        double rep, freq, pres;
    } setting;
    static const setting settings[] = {
        {0, 1, 0, 0, 1, 0, 0},          {1.0, 1.0, 0, 0, 1, 0, 0},      {0.6, 0.9, 0, 0, 1, 0, 0},
        {1.7, 0.05, 0, 0, 1, 0, 0},     {1.0, 0.5, 0, 0, 1, 0, 0},      {1.0, 1.0, 0, 5, 1, 0, 0},
        {1.0, 0.9, 0, 40, 1, 0, 0},     {0.8, 0.95, 0.05, 40, 1, 0, 0}, {1.0, 1.0, 0.3, 0, 1, 0, 0},
        {1.0, 0.9, 0, 0, 1.3, 0.2, 0.4}, {0, 1, 0, 0, 1.5, 0.5, 0.5},   {1.2, 0.7, 0.02, 1000, 1.1, 0.1, 0},
    };
    const int n_set = sizeof settings / sizeof settings[0];
    const char *quick_env = getenv("DJINN_SANITIZER_QUICK");
    const int quick = quick_env && *quick_env == '1';
    int checked = 0, not_top = 0, invalid = 0;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        const int64_t n = ns[ni];
        if (quick && ni != 0 && ni != 2 && ni != 5) continue;
        float *z = malloc((size_t)n * 4);
        int32_t *d_counts = tk_dev((size_t)n * 4);
        for (int kind = 0; kind < TK_KINDS; kind++) {
            tk_logits(z, n, kind);
            for (int si = 0; si < n_set; si++) {
                if (quick && si % 6 != kind % 6) continue;
                const setting *st = &settings[si];
                dj_sampling p = {.temp = st->temp, .top_p = st->top_p, .min_p = st->min_p, .top_k = st->top_k,
                                 .repeat_penalty = st->rep, .frequency_penalty = st->freq, .presence_penalty = st->pres,
                                 .repeat_last_n = 64};
                dj_err e;
                dj_sampler *smp = sampler_new_with(n, &p, 1, &e);
                cr_assert(smp, "%s", e.msg);
                for (int h = 0; h < 100; h++) sampler_accept(smp, (int32_t)(tc_next() % (uint64_t)(n < 20 ? n : 20)));
                char what[96];
                snprintf(what, sizeof what, "kind=%d setting=%d", kind, si);
                for (int k = quick; k < (quick ? 2 : 4); k++) {
                    const float u = k == 0 ? 0.0f : k == 1 ? 0.99999994f : tc_unif();
                    tk_pick_case(smp, z, n, u, d_counts, k == 0, what);
                    // then a token or two more in the window: the counts follow through the arguments' changes
                    sampler_accept(smp, (int32_t)(tc_next() % (uint64_t)n));
                    if (k & 1) sampler_accept(smp, (int32_t)(tc_next() % (uint64_t)n));
                    int32_t want = sampler_pick_u(smp, z, u);
                    checked++, invalid += want < 0, not_top += want >= 0 && want != dj_argmax(z, n);
                }
                sampler_free(smp);
            }
        }
        gpu_free(d_counts);
        free(z);
    }
    // the cases must exercise sampling, not only the argmax, and the rows without a distribution
    cr_expect(not_top > (quick ? 0 : checked / 4), "pick: only %d of %d picks differ from argmax", not_top, checked);
    cr_expect(invalid > 0 && invalid < checked / 2, "pick: %d of %d rows without a token", invalid, checked);
    tk_end("pick");
}

// Rows of a batch are independent: each gets its own arguments and counts.
Test(kernels, pick_rows) {
    tk_start("pick_rows");
    enum { R = 3, N = 5000 };
    float *z = malloc((size_t)R * N * 4);
    int32_t *counts = calloc((size_t)R * N, 4);
    dj_pick_args a[R];
    dj_sampler *smp[R];
    for (int r = 0; r < R; r++) {
        tk_logits(z + (size_t)r * N, N, r);
        dj_sampling p = DJ_SAMPLING_DEFAULT;
        p.top_k = r == 1 ? 40 : 0, p.repeat_penalty = 1.0 + 0.2 * r, p.temp = r == 2 ? 0 : 1;
        dj_err e;
        cr_assert(smp[r] = sampler_new_with(N, &p, 7 + r, &e), "%s", e.msg);
        for (int h = 0; h < 30; h++) sampler_accept(smp[r], (int32_t)(tc_next() % 50));
        sampler_step_args(smp[r], &a[r]);
        a[r].n_set = 0;
        if (sampler_counts(smp[r])) memcpy(counts + (size_t)r * N, sampler_counts(smp[r]), (size_t)N * 4);
    }
    dj_err e;
    float *dz = tk_up(z, (size_t)R * N * 4);
    dj_pick_args *da = tk_up(a, sizeof a);
    int32_t *dc = tk_up(counts, (size_t)R * N * 4), *dout = tk_dev(R * 4), got[R];
    tk_poison(dout, R * 4);
    void *sc = tk_dev(gpu_pick_scratch(R));
    cr_assert_eq(gpu_pick(sc, dout, dz, R, N, da, dc, tk_s, &e), 0, "%s", e.msg);
    gpu_free(sc);
    tk_down(got, dout, sizeof got);
    for (int r = 0; r < R; r++) {
        int32_t want = sampler_pick_u(smp[r], z + (size_t)r * N, a[r].u);
        cr_expect_eq(got[r], want, "row %d: got %d, want %d (seed %llu)", r, got[r], want,
                     (unsigned long long)tc_seed_used());
        sampler_free(smp[r]);
    }
    gpu_free(dz), gpu_free(da), gpu_free(dc), gpu_free(dout);
    free(z), free(counts);
    tk_end("pick_rows");
}

// ---- errors
Test(kernels, oom_names_what) {
    tk_start("oom_names_what");
    void *p = NULL;
    dj_err e = {{0}};
    cr_expect_eq(gpu_malloc(&p, (size_t)1 << 50, "the KV cache", &e), -1, "a 1 PiB allocation succeeded");
    cr_expect(p == NULL);
    cr_expect(strstr(e.msg, "GPU out of memory") && strstr(e.msg, "the KV cache"), "unclear OOM message: %s", e.msg);
    fprintf(stderr, "[kernels.oom_names_what] %s\n", e.msg);
    // the failed allocation must not poison later calls
    cr_expect_eq(gpu_malloc(&p, 1 << 20, "a small buffer", &e), 0, "%s", e.msg);
    gpu_free(p);
    tk_end("oom_names_what");
}
