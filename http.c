// http.c: the request head (http.h).
#include "http.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

const char *http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

static int refuse(int *status, const char **why, int s, const char *w) {
    *status = s, *why = w;
    return -1;
}

// The value of a header line (after "name:"), without the whitespace around it, into out (cap bytes).
static int header_value(const char *v, const char *end, char *out, size_t cap) {
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    if ((size_t)(end - v) >= cap) return -1;
    memcpy(out, v, (size_t)(end - v));
    out[end - v] = 0;
    return 0;
}

int http_parse_head(const char *buf, size_t n, size_t max_body, http_req *r, int *status, const char **why) {
    const char *end = NULL;
    for (size_t i = 3; i < n && i < HTTP_HEAD_MAX; i++)
        if (buf[i] == '\n' && buf[i - 1] == '\r' && buf[i - 2] == '\n' && buf[i - 3] == '\r') {
            end = buf + i + 1;
            break;
        }
    if (!end) return n >= HTTP_HEAD_MAX ? refuse(status, why, 431, "the request head exceeds 16 KB") : 0;
    memset(r, 0, sizeof *r);
    r->head_len = (size_t)(end - buf);
    // request line: METHOD SP target SP HTTP/1.x CRLF
    const char *p = buf, *eol = memchr(buf, '\r', r->head_len);  // a CR is there: the blank line's
    const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    if (eol[1] != '\n' || !sp1 || sp1 == p || (size_t)(sp1 - p) >= sizeof r->method)
        return refuse(status, why, 400, "a malformed request line");
    memcpy(r->method, p, (size_t)(sp1 - p));
    for (const char *q = p; q < sp1; q++)
        if (*q < 'A' || *q > 'Z') return refuse(status, why, 400, "a malformed request line");
    const char *t = sp1 + 1, *sp2 = memchr(t, ' ', (size_t)(eol - t));
    if (!sp2 || sp2 == t || *t != '/') return refuse(status, why, 400, "a malformed request target");
    const char *qm = memchr(t, '?', (size_t)(sp2 - t)), *tend = qm ? qm : sp2;
    if ((size_t)(tend - t) >= sizeof r->path) return refuse(status, why, 400, "a request target over 1 KB");
    memcpy(r->path, t, (size_t)(tend - t));
    for (const char *q = t; q < sp2; q++)
        if ((unsigned char)*q <= ' ' || *q == 0x7f) return refuse(status, why, 400, "a malformed request target");
    if (eol - sp2 - 1 != 8 || memcmp(sp2 + 1, "HTTP/1.", 7) || sp2[8] < '0' || sp2[8] > '9')
        return refuse(status, why, eol - sp2 - 1 == 8 && !memcmp(sp2 + 1, "HTTP/", 5) ? 505 : 400,
                      "not an HTTP/1.x request");
    r->minor = sp2[8] - '0';
    r->keep_alive = r->minor >= 1;
    int have_length = 0;
    // headers: name ":" value CRLF, until the blank line
    for (p = eol + 2; p < end - 2; p = eol + 2) {
        eol = memchr(p, '\r', (size_t)(end - p));
        if (!eol || eol[1] != '\n') return refuse(status, why, 400, "a malformed header line");
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || colon == p) return refuse(status, why, 400, "a malformed header line");
        for (const char *q = p; q < colon; q++)
            if ((unsigned char)*q <= ' ' || *q == 0x7f) return refuse(status, why, 400, "a malformed header name");
        for (const char *q = colon + 1; q < eol; q++)
            if (*q == '\n' || *q == 0) return refuse(status, why, 400, "a malformed header value");
        size_t nl = (size_t)(colon - p);
        char v[512];
        if (nl == 14 && !strncasecmp(p, "content-length", nl)) {
            if (header_value(colon + 1, eol, v, sizeof v) || !v[0] || have_length)
                return refuse(status, why, 400, "a bad Content-Length");
            uint64_t len = 0;
            for (const char *q = v; *q; q++) {
                if (*q < '0' || *q > '9' || len > (uint64_t)1 << 40)
                    return refuse(status, why, 400, "a bad Content-Length");
                len = len * 10 + (uint64_t)(*q - '0');
            }
            if (len > max_body) return refuse(status, why, 413, "the request body is over the size limit");
            r->content_length = (size_t)len, have_length = 1;
        } else if (nl == 17 && !strncasecmp(p, "transfer-encoding", nl)) {
            return refuse(status, why, 501, "chunked request bodies are not supported: send Content-Length");
        } else if (nl == 10 && !strncasecmp(p, "connection", nl)) {
            if (header_value(colon + 1, eol, v, sizeof v)) continue;
            if (strcasestr(v, "close")) r->keep_alive = 0;
            else if (strcasestr(v, "keep-alive")) r->keep_alive = 1;
        } else if (nl == 6 && !strncasecmp(p, "expect", nl)) {
            // HTTP/1.0 has no 1xx responses: its expectation is ignored (RFC 9110, 10.1.1)
            if (r->minor >= 1 && !header_value(colon + 1, eol, v, sizeof v) && !strcasecmp(v, "100-continue"))
                r->expect_continue = 1;
        } else if (nl == 13 && !strncasecmp(p, "authorization", nl)) {
            if (header_value(colon + 1, eol, r->authorization, sizeof r->authorization))
                return refuse(status, why, 431, "an Authorization header over 511 bytes");
        }
    }
    return 1;
}
