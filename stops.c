// stops.c: held text and stop strings (stops.h).
#include "stops.h"

#include <stdlib.h>
#include <string.h>

int held_feed(dj_held *h, const char *text, size_t n, const char *const *stops, int n_stops, dj_emit_fn emit,
              void *ctx, dj_err *e) {
    if (h->len + n > h->cap) {
        size_t cap = (h->len + n) * 2 + 64;
        char *b = realloc(h->buf, cap);
        if (!b) return dj_fail(e, "out of memory"), -2;
        h->buf = b, h->cap = cap;
    }
    if (n) memcpy(h->buf + h->len, text, n);
    h->len += n;
    if (!h->len) return -1;  // nothing held, nothing new (a token that decodes to no bytes): buf may be NULL
    size_t first = h->len;
    int which = -1;
    for (int k = 0; k < n_stops; k++) {
        if (!stops[k][0]) continue;  // an empty stop string matches nothing (callers refuse it; no wrap below)
        const char *at = memmem(h->buf, h->len, stops[k], strlen(stops[k]));
        if (at && (size_t)(at - h->buf) < first) first = (size_t)(at - h->buf), which = k;
    }
    if (which >= 0) {
        h->len = first;
        return which;
    }
    size_t keep = 0;  // the longest proper prefix of a stop string that the held text ends with
    for (int k = 0; k < n_stops; k++) {
        size_t sl = strlen(stops[k]);
        if (!sl) continue;
        for (size_t m = sl - 1 < h->len ? sl - 1 : h->len; m > keep; m--)
            if (!memcmp(h->buf + h->len - m, stops[k], m)) {
                keep = m;
                break;
            }
    }
    if (emit(ctx, h->buf, h->len - keep, e)) return -2;
    memmove(h->buf, h->buf + h->len - keep, keep);
    h->len = keep;
    return -1;
}

void held_free(dj_held *h) {
    free(h->buf);
    memset(h, 0, sizeof *h);
}
