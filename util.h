// util.h: small shared helpers for host code: errors, timing, progress, CRC32, and the
// f16/bf16 <-> f32 conversions used by both the converter and the CPU reference.
#ifndef DJINN_UTIL_H
#define DJINN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- errors
// Every fallible function takes a dj_err* and returns 0 on success, -1 on failure with
// e->msg set to one human-readable line (no trailing newline). e may be NULL.
typedef struct {
    char msg[512];
} dj_err;

#if defined(__GNUC__)
#define DJ_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DJ_PRINTF(a, b)
#endif

int dj_fail(dj_err *e, const char *fmt, ...) DJ_PRINTF(2, 3);  // sets e->msg (dj_one_line), returns -1
// msg (cap bytes, NUL-terminated) made one line of printable text: control characters it quotes (a client's or a
// file's string, say) are written as \n, \r, \t or \xNN, truncated at cap.
void dj_one_line(char *msg, size_t cap);
void dj_die(const char *fmt, ...) DJ_PRINTF(1, 2);            // "djinn: <msg>\n" to stderr, exit(1)
double dj_now(void);                                          // monotonic seconds
uint32_t dj_crc32(uint32_t crc, const void *data, size_t n);  // zlib CRC-32; start with crc = 0

// ---- progress (stderr)
// The running line (rewritten in place with \r) only when stderr is a terminal (or DJINN_PROGRESS=1); a log file
// gets the final line.
typedef struct {
    const char *what;    // "converting", "loading"
    uint64_t total;      // bytes expected
    double t0, last;     // start time, last print time
    int enabled;         // 0: silent (tests)
    int tty;             // stderr is a terminal: the running line is shown
    int shown;           // a progress line is on screen without its newline
} dj_progress;
void dj_progress_start(dj_progress *p, const char *what, uint64_t total, int enabled);
void dj_progress_update(dj_progress *p, uint64_t done);  // at most ~4 lines/s: GB done, GB/s, ETA
void dj_progress_end(dj_progress *p, uint64_t done);     // final line with total time and GB/s
// On failure, before the error line: ends an unfinished progress line so the error starts a line of its own.
void dj_progress_abort(dj_progress *p);

// ---- overflow-checked size arithmetic: return 0 on success, -1 on overflow
static inline int dj_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return -1;
    *out = a * b;
    return 0;
}
static inline int dj_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (b > UINT64_MAX - a) return -1;
    *out = a + b;
    return 0;
}
static inline uint64_t dj_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }  // a: power of two

// ---- half-precision conversions (round to nearest even; NaN stays NaN)
static inline float dj_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t dj_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));  // inf/nan
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520: overflow to inf
    if (ax < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
        if (ax < 0x33000000u) return (uint16_t)sign;  // < 2^-25 rounds to 0
        // value = man * 2^(e-150); the f16 subnormal unit is 2^-24, so units = man >> (126 - e), e in 102..112
        uint32_t man = (ax & 0x7fffffu) | 0x800000u, s = (uint32_t)(126 - (int)(ax >> 23));
        uint32_t q = man >> s, rem = man & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1);  // round mantissa to 10 bits, nearest even
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}
static inline float dj_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t dj_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

// One spin-wait step (x86's pause: a polling loop yields the core's pipeline to its sibling; elsewhere nothing).
static inline void dj_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#ifdef __cplusplus
}
#endif

#endif
