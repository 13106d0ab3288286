// bench/host_matvec.c: the CPU share's q4 matvec as a host memory reader (host_matvec.h).
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

size_t host_q4_bytes(size_t bytes) {
    size_t rb = (size_t)dj_row_bytes(DJ_Q4, HOST_MATVEC_IN);
    return bytes / rb * rb;
}

void host_q4_fill(uint8_t *buf, size_t bytes) {
    size_t rb = (size_t)dj_row_bytes(DJ_Q4, HOST_MATVEC_IN);
    float *w = malloc(HOST_MATVEC_IN * sizeof *w);
    uint8_t *row = malloc(rb);
    if (!w || !row) dj_die("host_q4_fill: out of memory");
    uint64_t st = 12345;
    for (int i = 0; i < HOST_MATVEC_IN; i++) {  // uniform in [-0.05, 0.05): the weights' scale of a real layer
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        w[i] = ((float)(st >> 40) / (float)(1 << 24) - 0.5f) * 0.1f;
    }
    if (quant_row(DJ_Q4, w, HOST_MATVEC_IN, row, 0, NULL, NULL)) dj_die("host_q4_fill: quant_row failed");
    hm_fill j = {buf, row, rb, bytes / rb};
    cpu_parallel_for(HM_PARTS, 1e12, fill_task, &j);
    free(w), free(row);
}

double host_q4_pass(const uint8_t *buf, size_t bytes) {
    static float x[HOST_MATVEC_IN], *y;
    static size_t y_rows;
    size_t rows = host_q4_bytes(bytes) / (size_t)dj_row_bytes(DJ_Q4, HOST_MATVEC_IN);
    if (y_rows < rows) {
        free(y);
        if (!(y = malloc(rows * sizeof *y))) dj_die("host_q4_pass: out of memory");
        y_rows = rows;
        for (int i = 0; i < HOST_MATVEC_IN; i++) x[i] = (float)((i * 37) % 101 - 50) * 0.02f;
    }
    double t0 = dj_now();
    cpu_matvec(y, x, buf, DJ_Q4, HOST_MATVEC_IN, (int64_t)rows);
    return dj_now() - t0;
}
