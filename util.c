// util.c: errors, timing, progress lines and CRC-32 for host code.
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ---- errors
void dj_one_line(char *msg, size_t cap) {
    char t[1024];
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p && o + 1 < sizeof t; p++) {
        if (*p >= 0x20 && *p != 0x7f) {
            t[o++] = (char)*p;
            continue;
        }
        const char *esc = *p == '\n' ? "\\n" : *p == '\r' ? "\\r" : *p == '\t' ? "\\t" : NULL;
        char hex[5];
        if (!esc) snprintf(hex, sizeof hex, "\\x%02x", *p), esc = hex;
        size_t k = strlen(esc);
        if (o + k + 1 > sizeof t) break;
        memcpy(t + o, esc, k), o += k;
    }
    t[o] = 0;
    snprintf(msg, cap, "%s", t);
}

int dj_fail(dj_err *e, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        dj_one_line(e->msg, sizeof e->msg);
    }
    return -1;
}

void dj_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("djinn: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

// ---- time and progress
double dj_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dj_progress_start(dj_progress *p, const char *what, uint64_t total, int enabled) {
    p->what = what;
    p->total = total;
    p->t0 = p->last = dj_now();
    p->enabled = enabled;
    const char *force = getenv("DJINN_PROGRESS");  // "1": the running line even into a pipe (tests, `script` logs)
    p->tty = isatty(STDERR_FILENO) || (force && !strcmp(force, "1"));
    p->shown = 0;
}

void dj_progress_update(dj_progress *p, uint64_t done) {
    if (!p->enabled || !p->tty) return;
    double now = dj_now();
    if (now - p->last < 0.25) return;
    p->last = now;
    double dt = now - p->t0, rate = dt > 0 ? (double)done / dt : 0;
    double eta = rate > 0 && p->total > done ? (double)(p->total - done) / rate : 0;
    fprintf(stderr, "\r%s: %.2f / %.2f GB, %.2f GB/s, ETA %.0f s   ", p->what, (double)done / 1e9,
            (double)p->total / 1e9, rate / 1e9, eta);
    fflush(stderr);
    p->shown = 1;
}

void dj_progress_end(dj_progress *p, uint64_t done) {
    if (!p->enabled) return;
    double dt = dj_now() - p->t0;
    fprintf(stderr, "%s%s: %.2f GB in %.2f s (%.2f GB/s)%s\n", p->tty ? "\r" : "", p->what, (double)done / 1e9, dt,
            dt > 0 ? (double)done / dt / 1e9 : 0.0, p->tty ? "              " : "");
    p->shown = 0;
}

void dj_progress_abort(dj_progress *p) {
    if (p->enabled && p->shown) fputc('\n', stderr);
    p->shown = 0;
}

// ---- CRC-32 (IEEE 802.3 polynomial, reflected), table built on first use
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t dj_crc32(uint32_t crc, const void *data, size_t n) {
    if (!crc_table[1]) crc_init();  // idempotent: racing threads write the same values
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}
