// json.c: strict RFC 8259 parser. One pass over the bytes with an explicit container stack (no
// recursion, depth capped at JSON_MAX_DEPTH), every node and string in one arena owned by the json_doc.
#include "json.h"

#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 512

// ---- arena
// Bump allocator over a list of chunks; freeing the doc frees the chunks. Chunks grow geometrically so a
// 7 MB tokenizer.json costs a few dozen mallocs, not 400k.
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    alignas(max_align_t) unsigned char data[];
} arena_chunk;

struct json_doc {
    arena_chunk *chunks;  // head is the chunk being filled
    size_t next_cap;
    json_value root;
};

#define ARENA_ALIGN (sizeof(max_align_t))

static void *arena_alloc(json_doc *d, size_t n) {
    size_t need = (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (need < n) return NULL;
    arena_chunk *c = d->chunks;
    if (!c || c->cap - c->used < need) {
        size_t cap = d->next_cap > need ? d->next_cap : need;
        if (cap > SIZE_MAX - sizeof(arena_chunk)) return NULL;
        c = malloc(sizeof(arena_chunk) + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = d->chunks;
        d->chunks = c;
        if (d->next_cap < ((size_t)16 << 20)) d->next_cap *= 2;
    }
    void *p = c->data + c->used;
    c->used += need;
    return p;
}

// Gives back the tail of the most recent allocation p (allocated with `had` bytes, now using `keep`).
static void arena_shrink(json_doc *d, void *p, size_t had, size_t keep) {
    arena_chunk *c = d->chunks;
    size_t h = (had + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    size_t k = (keep + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (c && (unsigned char *)p + h == c->data + c->used) c->used -= h - k;
}

void json_free(json_doc *d) {
    if (!d) return;
    arena_chunk *c = d->chunks;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(d);
}

const json_value *json_root(const json_doc *d) { return d ? &d->root : NULL; }

// ---- parser state
typedef struct {
    const unsigned char *start, *p, *end;
    json_doc *doc;
    dj_err *e;
    // Children of all open containers, innermost last: an array's elements have key == NULL.
    json_member *tmp;
    size_t ntmp, captmp;
} jparser;

typedef struct {
    int is_obj;
    size_t base;  // first child in tmp
} jframe;

// Reports at byte `at`: line and column (columns count characters, not bytes) are 1-based.
static int jerr(jparser *ps, const unsigned char *at, const char *what) {
    size_t line = 1, col = 1;
    for (const unsigned char *q = ps->start; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else if ((*q & 0xC0) != 0x80) {
            col++;
        }
    }
    return dj_fail(ps->e, "json: line %zu, column %zu: %s", line, col, what);
}

static int jerr_oom(jparser *ps) { return jerr(ps, ps->p, "out of memory"); }

static void skip_ws(jparser *ps) {
    const unsigned char *p = ps->p, *end = ps->end;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

// Describes the byte at ps->p (or end of input) for "expected X" errors.
static int jerr_expected(jparser *ps, const char *expected) {
    char buf[160];
    if (ps->p >= ps->end) {
        snprintf(buf, sizeof buf, "unexpected end of input, expected %s", expected);
    } else if (*ps->p >= 0x21 && *ps->p < 0x7f) {
        snprintf(buf, sizeof buf, "unexpected '%c', expected %s", *ps->p, expected);
    } else {
        snprintf(buf, sizeof buf, "unexpected byte 0x%02x, expected %s", *ps->p, expected);
    }
    return jerr(ps, ps->p, buf);
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads 4 hex digits at q (bounded by lim); -1 when malformed.
static long read_hex4(const unsigned char *q, const unsigned char *lim) {
    if (lim - q < 4) return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(q[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

// Length of a valid UTF-8 sequence starting at q (bounded by lim), 0 when invalid (overlong forms,
// encoded surrogates and code points above U+10FFFF are invalid).
static int utf8_len(const unsigned char *q, const unsigned char *lim) {
    unsigned char c = q[0];
    size_t avail = (size_t)(lim - q);
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return avail >= 2 && (q[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (avail < 3 || (q[1] & 0xC0) != 0x80 || (q[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && q[1] < 0xA0) return 0;   // overlong
        if (c == 0xED && q[1] >= 0xA0) return 0;  // UTF-16 surrogate
        return 3;
    }
    if (c < 0xF5) {
        if (avail < 4 || (q[1] & 0xC0) != 0x80 || (q[2] & 0xC0) != 0x80 || (q[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && q[1] < 0x90) return 0;   // overlong
        if (c == 0xF4 && q[1] >= 0x90) return 0;  // above U+10FFFF
        return 4;
    }
    return 0;
}

static size_t put_utf8(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

// ---- strings
// ps->p is at the opening quote. The unescaped form is never longer than the raw text, so one arena
// block of the raw length is filled and its tail given back.
static int parse_string(jparser *ps, const char **out, size_t *out_len) {
    const unsigned char *p = ps->p + 1, *end = ps->end;
    const unsigned char *q = p;  // find the closing quote: escapes are skipped whole
    while (q < end && *q != '"') {
        if (*q != '\\') q++;
        else if (end - q >= 2) q += 2;
        else q = end;
    }
    size_t raw = (size_t)(q - p);
    unsigned char *buf = arena_alloc(ps->doc, raw + 1), *o = buf;
    if (!buf) return jerr_oom(ps);
    while (p < q) {
        unsigned char c = *p;
        if (c >= 0x20 && c != '\\' && c < 0x80) {
            *o++ = c;
            p++;
        } else if (c < 0x20) {
            char what[64];
            snprintf(what, sizeof what, "unescaped control character 0x%02x in string", c);
            return jerr(ps, p, what);
        } else if (c >= 0x80) {
            int len = utf8_len(p, q);
            if (!len) return jerr(ps, p, "invalid UTF-8 in string");
            memcpy(o, p, (size_t)len);
            o += len;
            p += len;
        } else {  // backslash
            if (q - p < 2) return jerr(ps, p, "unterminated escape in string");
            unsigned char x = p[1];
            switch (x) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '/': *o++ = '/'; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u': {
                long u = read_hex4(p + 2, q);
                if (u < 0) return jerr(ps, p, "bad \\u escape: expected 4 hex digits");
                uint32_t cp = (uint32_t)u;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return jerr(ps, p, "unpaired low surrogate in \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    long lo = (q - p >= 12 && p[6] == '\\' && p[7] == 'u') ? read_hex4(p + 8, q) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) return jerr(ps, p, "unpaired high surrogate in \\u escape");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                    p += 6;
                }
                o += put_utf8(o, cp);
                p += 4;  // the 2 below complete "\uXXXX"
                break;
            }
            default: {
                char what[64];
                if (x >= 0x21 && x < 0x7f) snprintf(what, sizeof what, "invalid escape '\\%c' in string", x);
                else snprintf(what, sizeof what, "invalid escape (byte 0x%02x) in string", x);
                return jerr(ps, p, what);
            }
            }
            p += 2;
        }
    }
    if (q >= end) return jerr(ps, ps->p, "unterminated string");
    *o = 0;
    size_t len = (size_t)(o - buf);
    arena_shrink(ps->doc, buf, raw + 1, len + 1);
    *out = (const char *)buf;
    *out_len = len;
    ps->p = q + 1;
    return 0;
}

// ---- numbers
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; integers that fit int64 are kept exactly.
static int parse_number(jparser *ps, json_value *v) {
    const unsigned char *s = ps->p, *p = s, *end = ps->end;
    int neg = 0, is_int = 1;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') return jerr(ps, p, "invalid number: expected a digit");
    uint64_t mag = 0;
    int fits = 1;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') return jerr(ps, s, "invalid number: leading zeros are not allowed");
    } else {
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            uint64_t d = (uint64_t)(*p - '0');
            if (mag > (UINT64_MAX - d) / 10) fits = 0;
            else mag = mag * 10 + d;
        }
    }
    if (p < end && *p == '.') {
        is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return jerr(ps, p, "invalid number: expected a digit after '.'");
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_int = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return jerr(ps, p, "invalid number: expected a digit in the exponent");
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    v->type = JSON_NUMBER;
    v->u.number.i = 0;
    v->u.number.is_int = 0;
    if (is_int && fits && mag <= (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) {
        int64_t i = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
        v->u.number.i = i;
        v->u.number.is_int = 1;
        v->u.number.num = (neg && mag == 0) ? -0.0 : (double)i;
    } else {  // strtod needs a NUL-terminated copy: the input is not terminated
        size_t len = (size_t)(p - s);
        char small[64], *buf = len < sizeof small ? small : malloc(len + 1);
        if (!buf) return jerr_oom(ps);
        memcpy(buf, s, len);
        buf[len] = 0;
        double x = strtod(buf, NULL);
        if (buf != small) free(buf);
        if (isinf(x)) return jerr(ps, s, "number out of range for a double");
        v->u.number.num = x;
    }
    ps->p = p;
    return 0;
}

// ---- values
static int match_lit(jparser *ps, const char *lit) {
    size_t len = strlen(lit);
    if ((size_t)(ps->end - ps->p) < len || memcmp(ps->p, lit, len) != 0) {
        // point at the first differing byte so truncations report end of input
        const unsigned char *q = ps->p;
        size_t i = 0;
        while (q < ps->end && i < len && *q == (unsigned char)lit[i]) q++, i++;
        char what[64];
        snprintf(what, sizeof what, q >= ps->end ? "unexpected end of input in '%s'" : "invalid literal, expected '%s'", lit);
        return jerr(ps, q, what);
    }
    ps->p += len;
    return 0;
}

static int push_tmp(jparser *ps, const char *key, size_t key_len) {
    if (ps->ntmp == ps->captmp) {
        size_t cap = ps->captmp ? ps->captmp * 2 : 256;
        json_member *t = realloc(ps->tmp, cap * sizeof *t);
        if (!t) return jerr_oom(ps);
        ps->tmp = t;
        ps->captmp = cap;
    }
    json_member *m = &ps->tmp[ps->ntmp++];
    m->key = key;
    m->key_len = key_len;
    memset(&m->value, 0, sizeof m->value);
    return 0;
}

// Parses `"key" :` inside an object and pushes the member whose value comes next.
static int parse_key(jparser *ps) {
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') return jerr_expected(ps, "a string key");
    const char *key;
    size_t key_len;
    if (parse_string(ps, &key, &key_len)) return -1;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') return jerr_expected(ps, "':' after object key");
    ps->p++;
    return push_tmp(ps, key, key_len);
}

// Pushes the slot for the next child: an object's key comes first, an array's element has none.
static int open_child(jparser *ps, const jframe *f) { return f->is_obj ? parse_key(ps) : push_tmp(ps, NULL, 0); }

// Moves the children of the innermost container out of tmp into the arena.
static int close_container(jparser *ps, const jframe *f, json_value *v) {
    size_t n = ps->ntmp - f->base;
    json_member *kids = n ? ps->tmp + f->base : NULL;  // tmp is NULL until the first child: no NULL + 0
    // n * sizeof cannot overflow: tmp already holds n members, and a value is smaller than a member
    void *dst = NULL;
    if (n && !(dst = arena_alloc(ps->doc, n * (f->is_obj ? sizeof(json_member) : sizeof(json_value)))))
        return jerr_oom(ps);
    if (f->is_obj) {
        v->type = JSON_OBJECT;
        v->u.obj.n = n;
        v->u.obj.members = dst;
        if (n) memcpy(dst, kids, n * sizeof(json_member));
    } else {
        v->type = JSON_ARRAY;
        v->u.arr.n = n;
        v->u.arr.items = dst;
        for (size_t i = 0; i < n; i++) v->u.arr.items[i] = kids[i].value;
    }
    ps->ntmp = f->base;
    return 0;
}

static int parse_doc(jparser *ps) {
    jframe stack[JSON_MAX_DEPTH];
    int depth = 0;
    json_value v;
    for (;;) {
        // expect a value
        skip_ws(ps);
        if (ps->p >= ps->end) return jerr_expected(ps, "a value");
        unsigned char c = *ps->p;
        memset(&v, 0, sizeof v);
        if (c == '[' || c == '{') {
            if (depth == JSON_MAX_DEPTH) return jerr(ps, ps->p, "nesting deeper than 512");
            jframe *f = &stack[depth++];
            f->is_obj = c == '{';
            f->base = ps->ntmp;
            ps->p++;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == (f->is_obj ? '}' : ']')) {
                ps->p++;
                if (close_container(ps, f, &v)) return -1;
                depth--;
            } else {
                if (open_child(ps, f)) return -1;
                continue;  // the first child
            }
        } else if (c == '"') {
            v.type = JSON_STRING;
            if (parse_string(ps, &v.u.str.s, &v.u.str.len)) return -1;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (parse_number(ps, &v)) return -1;
        } else if (c == 't' || c == 'f') {
            if (match_lit(ps, c == 't' ? "true" : "false")) return -1;
            v.type = JSON_BOOL;
            v.u.boolean = c == 't';
        } else if (c == 'n') {
            if (match_lit(ps, "null")) return -1;
            v.type = JSON_NULL;
        } else {
            return jerr_expected(ps, "a value");
        }
        // a complete value v: store it in its container, then close containers as far as they end
        for (;;) {
            if (depth == 0) {
                ps->doc->root = v;
                return 0;
            }
            jframe *f = &stack[depth - 1];
            ps->tmp[ps->ntmp - 1].value = v;
            skip_ws(ps);
            char close = f->is_obj ? '}' : ']';
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                if (open_child(ps, f)) return -1;
                break;  // the next child
            }
            if (ps->p < ps->end && *ps->p == close) {
                ps->p++;
                if (close_container(ps, f, &v)) return -1;
                depth--;
                continue;
            }
            return jerr_expected(ps, f->is_obj ? "',' or '}' after object member" : "',' or ']' after array element");
        }
    }
}

json_doc *json_parse(const char *text, size_t n, dj_err *e) {
    json_doc *d = calloc(1, sizeof *d);
    if (!d) {
        dj_fail(e, "json: line 1, column 1: out of memory");
        return NULL;
    }
    // first chunk sized to the input: strings take at most n bytes, nodes usually a little more
    d->next_cap = n / 2 > 4096 ? n / 2 : 4096;
    jparser ps = {.start = (const unsigned char *)text, .p = (const unsigned char *)text,
                  .end = (const unsigned char *)text + n, .doc = d, .e = e};
    int rc = parse_doc(&ps);
    if (rc == 0) {
        skip_ws(&ps);
        if (ps.p < ps.end) rc = jerr_expected(&ps, "end of input after the value");
    }
    free(ps.tmp);
    if (rc) {
        json_free(d);
        return NULL;
    }
    return d;
}

// ---- lookups
const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return NULL;
    size_t len = strlen(key);
    for (size_t i = obj->u.obj.n; i-- > 0;) {
        const json_member *m = &obj->u.obj.members[i];
        if (m->key_len == len && memcmp(m->key, key, len) == 0) return &m->value;
    }
    return NULL;
}

int json_int(const json_value *v, int64_t *out) {
    if (!v || v->type != JSON_NUMBER || !v->u.number.is_int) return -1;
    *out = v->u.number.i;
    return 0;
}

int json_num(const json_value *v, double *out) {
    if (!v || v->type != JSON_NUMBER) return -1;
    *out = v->u.number.num;
    return 0;
}

int json_bool(const json_value *v, int *out) {
    if (!v || v->type != JSON_BOOL) return -1;
    *out = v->u.boolean;
    return 0;
}

const char *json_str(const json_value *v) { return v && v->type == JSON_STRING ? v->u.str.s : NULL; }

int json_opt_bool(const json_value *obj, const char *key, const char *where, int dflt, int *out, dj_err *e) {
    const json_value *v = json_get(obj, key);
    *out = dflt;
    if (!v || v->type == JSON_NULL) return 0;
    if (json_bool(v, out))
        return dj_fail(e, "%s: \"%.120s\" must be true or false, not a %s", where, key, json_type_name(v->type));
    return 0;
}

const char *json_type_name(json_type t) {
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "bool";
    case JSON_NUMBER: return "number";
    case JSON_STRING: return "string";
    case JSON_ARRAY: return "array";
    case JSON_OBJECT: return "object";
    }
    return "?";
}
