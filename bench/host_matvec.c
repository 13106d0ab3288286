// bench/host_matvec.c: the CPU share's matvec as a host memory reader, over q4, q8 or f16 rows (host_matvec.h).
#include "host_matvec.h"

#include <stdlib.h>
#include <string.h>

#include "../cpu.h"
#include "../quant.h"
#include "../util.h"

#define HM_PARTS 256

typedef struct {
    uint8_t *buf;
    const uint8_t *row;
    size_t rb, rows;
} hm_fill;

static void fill_task(void *ctx, int64_t b, int64_t e) {
    const hm_fill *j = ctx;
    for (int64_t part = b; part < e; part++)
        for (size_t r = j->rows * (size_t)part / HM_PARTS; r < j->rows * (size_t)(part + 1) / HM_PARTS; r++)
            memcpy(j->buf + r * j->rb, j->row, j->rb);
}

static size_t hm_row_bytes(uint32_t dt) { return (size_t)dj_row_bytes(dt, HOST_MATVEC_IN); }

static size_t hm_bytes(uint32_t dt, size_t bytes) { return bytes / hm_row_bytes(dt) * hm_row_bytes(dt); }

static void hm_fill_rows(uint32_t dt, uint8_t *buf, size_t bytes) {
    size_t rb = hm_row_bytes(dt);
    float *w = malloc(HOST_MATVEC_IN * sizeof *w);
    uint8_t *row = malloc(rb);
    if (!w || !row) dj_die("host_matvec: out of memory");
    uint64_t st = 12345;
    for (int i = 0; i < HOST_MATVEC_IN; i++) {  // uniform in [-0.05, 0.05): the weights' scale of a real layer
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        w[i] = ((float)(st >> 40) / (float)(1 << 24) - 0.5f) * 0.1f;
    }
    if (dt == DJ_F16)
        for (int i = 0; i < HOST_MATVEC_IN; i++) ((uint16_t *)row)[i] = dj_f32_to_f16(w[i]);
    else if (quant_row(dt, w, HOST_MATVEC_IN, row, NULL, NULL))
        dj_die("host_matvec: quant_row failed");
    hm_fill j = {buf, row, rb, bytes / rb};
    cpu_parallel_for(HM_PARTS, 1e12, fill_task, &j);
    free(w), free(row);
}

// One row at a time as the share computes a decode step's rows: cpu_matvec_multi with T = 1 (cpu_matvec, or the
// AVX-512 tiles for f16 where the CPU has them).
static double hm_pass(uint32_t dt, const uint8_t *buf, size_t bytes) {
    static float x[HOST_MATVEC_IN], *y;
    static size_t y_rows;
    size_t rows = hm_bytes(dt, bytes) / hm_row_bytes(dt);
    if (y_rows < rows) {
        free(y);
        if (!(y = malloc(rows * sizeof *y))) dj_die("host_matvec: out of memory");
        y_rows = rows;
        for (int i = 0; i < HOST_MATVEC_IN; i++) x[i] = (float)((i * 37) % 101 - 50) * 0.02f;
    }
    double t0 = dj_now();
    cpu_matvec_multi(y, x, buf, dt, 1, HOST_MATVEC_IN, (int64_t)rows);
    return dj_now() - t0;
}

size_t host_q4_bytes(size_t bytes) { return hm_bytes(DJ_Q4, bytes); }
void host_q4_fill(uint8_t *buf, size_t bytes) { hm_fill_rows(DJ_Q4, buf, bytes); }
double host_q4_pass(const uint8_t *buf, size_t bytes) { return hm_pass(DJ_Q4, buf, bytes); }
size_t host_q8_bytes(size_t bytes) { return hm_bytes(DJ_Q8, bytes); }
void host_q8_fill(uint8_t *buf, size_t bytes) { hm_fill_rows(DJ_Q8, buf, bytes); }
double host_q8_pass(const uint8_t *buf, size_t bytes) { return hm_pass(DJ_Q8, buf, bytes); }
size_t host_f16_bytes(size_t bytes) { return hm_bytes(DJ_F16, bytes); }
void host_f16_fill(uint8_t *buf, size_t bytes) { hm_fill_rows(DJ_F16, buf, bytes); }
double host_f16_pass(const uint8_t *buf, size_t bytes) { return hm_pass(DJ_F16, buf, bytes); }
