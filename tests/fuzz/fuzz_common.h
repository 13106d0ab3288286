// fuzz_common.h: helpers shared by the libFuzzer targets in tests/fuzz/.
#ifndef DJINN_FUZZ_COMMON_H
#define DJINN_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// An invariant the parser promises was broken: abort loudly so libFuzzer saves the input as a crash.
#define FUZZ_CHECK(cond)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "fuzz: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                  \
        }                                                                             \
    } while (0)

// An error message as util.h promises it: NUL-terminated within its cap bytes, not empty, one line.
static inline int fuzz_one_line(const char *msg, size_t cap) {
    return memchr(msg, 0, cap) && msg[0] && !strchr(msg, '\n');
}

// Reads every byte of [p, p+n) so that ASan flags any span that leaves its buffer.
static inline unsigned fuzz_touch(const void *p, size_t n) {
    const volatile unsigned char *b = p;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += b[i];
    return s;
}

#endif
