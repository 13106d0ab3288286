// stops.h: stop strings over text that arrives in pieces (token by token): the text is held back while its end
// could still begin a stop string, so a stop string that spans pieces is caught and never shown.
#ifndef DJINN_STOPS_H
#define DJINN_STOPS_H

#include <stddef.h>

#include "util.h"

typedef struct {
    char *buf;
    size_t len, cap;
} dj_held;

typedef int (*dj_emit_fn)(void *ctx, const char *text, size_t n, dj_err *e);  // 0, or -1 with e set

// Appends text to the held text; returns the index of the first stop string found in it (the held text then ends
// just before it, not emitted), -1 after emitting all but the longest tail that is a proper prefix of some stop
// string, -2 on an error (out of memory, or emit's).
int held_feed(dj_held *h, const char *text, size_t n, const char *const *stops, int n_stops, dj_emit_fn emit,
              void *ctx, dj_err *e);
void held_free(dj_held *h);

#endif
