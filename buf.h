// buf.h: a growing byte buffer, and JSON text and base64 written into it (the server's responses). An allocation
// failure is remembered (oom) and later appends do nothing, so a writer checks once at the end.
#ifndef DJINN_BUF_H
#define DJINN_BUF_H

#include <stddef.h>

typedef struct {
    char *p;  // NUL-terminated when not NULL
    size_t n, cap;
    int oom;
} dj_buf;

void buf_add(dj_buf *b, const void *s, size_t n);
void buf_str(dj_buf *b, const char *s);
void buf_fmt(dj_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// s[0..n) as a JSON string literal (quotes, escapes; invalid UTF-8 bytes become U+FFFD).
void buf_json_str(dj_buf *b, const char *s, size_t n);
// s[0..n) as base64 (RFC 4648's alphabet, '=' padding), no quotes.
void buf_base64(dj_buf *b, const void *s, size_t n);
void buf_drop_front(dj_buf *b, size_t n);  // the first n bytes leave
void buf_free(dj_buf *b);

#endif
