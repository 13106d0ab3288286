// buf.c: the growing buffer, its JSON strings and base64 (buf.h).
#include "buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_add(dj_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2 + 64;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void buf_str(dj_buf *b, const char *s) { buf_add(b, s, strlen(s)); }

void buf_fmt(dj_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)k < sizeof small) {
        buf_add(b, small, (size_t)k);
        return;
    }
    char *big = malloc((size_t)k + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    buf_add(b, big, (size_t)k);
    free(big);
}

// The length of the valid UTF-8 sequence at s (at most n bytes), 0 when there is none.
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || len > n || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4)) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (len == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;  // overlong, surrogate
    if (len == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
    return len;
}

void buf_json_str(dj_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    buf_add(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            buf_add(b, e, 2), i++;
        } else if (c < 0x20) {
            const char *named = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (named) buf_str(b, named);
            else buf_fmt(b, "\\u%04x", c);
            i++;
        } else {
            size_t len = utf8_len(u + i, n - i);
            if (len) buf_add(b, u + i, len), i += len;
            else buf_str(b, "\xef\xbf\xbd"), i++;
        }
    }
    buf_add(b, "\"", 1);
}

void buf_base64(dj_buf *b, const void *s, size_t n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *u = s;
    char q[4 * 256];
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        for (; i < n && k < sizeof q; i += 3, k += 4) {
            uint32_t v = (uint32_t)u[i] << 16 | (i + 1 < n ? (uint32_t)u[i + 1] << 8 : 0) | (i + 2 < n ? u[i + 2] : 0);
            q[k] = abc[v >> 18], q[k + 1] = abc[v >> 12 & 63];
            q[k + 2] = i + 1 < n ? abc[v >> 6 & 63] : '=', q[k + 3] = i + 2 < n ? abc[v & 63] : '=';
        }
        buf_add(b, q, k);
    }
}

void buf_drop_front(dj_buf *b, size_t n) {
    if (n >= b->n) {
        b->n = 0;
        if (b->p) b->p[0] = 0;
        return;
    }
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    b->p[b->n] = 0;
}

void buf_free(dj_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
