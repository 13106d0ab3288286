// safetensors.c: validates a safetensors container held in memory and builds a name-sorted tensor table
// pointing into it. Nothing is copied but the table; names live in the parsed JSON header.
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "../json.h"

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

// ---- dtypes
static const struct {
    const char *name;
    size_t size;
} st_dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},     [ST_I16] = {"I16", 2},
    [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},   [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},
    [ST_U32] = {"U32", 4},   [ST_F32] = {"F32", 4},   [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},   [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? st_dtypes[t].name : "?"; }
size_t st_dtype_size(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? st_dtypes[t].size : 0; }

static int dtype_from_name(const char *s, st_dtype *out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return -1;
}

// ---- one tensor entry
// Names in messages are cut so that a hostile header cannot push the reason out of the 512-byte line.
#define TNAME "safetensors: tensor '%.120s': "

// data: the data section's first byte at file offset data_off, of which `have` bytes are in memory.
static int parse_entry(const json_member *m, const uint8_t *data, uint64_t data_off, uint64_t have, uint64_t data_size,
                       st_tensor *t, dj_err *e) {
    const char *name = m->key;
    const json_value *v = &m->value;
    if (strlen(name) != m->key_len) return dj_fail(e, TNAME "name contains a NUL byte", name);
    if (v->type != JSON_OBJECT) return dj_fail(e, TNAME "expected an object, found %s", name, json_type_name(v->type));
    memset(t, 0, sizeof *t);
    t->name = name;
    // A field given twice is ambiguous (json_get would take the last; safetensors' own parser refuses it).
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    int seen[3] = {0};
    for (size_t i = 0; i < v->u.obj.n; i++)
        for (int k = 0; k < 3; k++)
            if (!strcmp(v->u.obj.members[i].key, fields[k]) && seen[k]++)
                return dj_fail(e, TNAME "\"%s\" appears twice", name, fields[k]);

    const json_value *dt = json_get(v, "dtype");
    if (!dt) return dj_fail(e, TNAME "missing \"dtype\"", name);
    if (!json_str(dt)) return dj_fail(e, TNAME "\"dtype\" must be a string, found %s", name, json_type_name(dt->type));
    if (dtype_from_name(json_str(dt), &t->dtype))
        return dj_fail(e, TNAME "unknown dtype \"%.40s\"", name, json_str(dt));

    const json_value *sh = json_get(v, "shape");
    if (!sh) return dj_fail(e, TNAME "missing \"shape\"", name);
    if (sh->type != JSON_ARRAY) return dj_fail(e, TNAME "\"shape\" must be an array, found %s", name, json_type_name(sh->type));
    if (sh->u.arr.n > ST_MAX_DIMS)
        return dj_fail(e, TNAME "%zu dimensions, at most %d supported", name, sh->u.arr.n, ST_MAX_DIMS);
    t->ndim = (int)sh->u.arr.n;
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d;
        if (json_int(&sh->u.arr.items[i], &d) || d < 0)
            return dj_fail(e, TNAME "shape[%d] is not a non-negative integer", name, i);
        t->shape[i] = d;
        if (dj_mul_u64(numel, (uint64_t)d, &numel)) return dj_fail(e, TNAME "shape product overflows", name);
    }
    if (dj_mul_u64(numel, st_dtypes[t->dtype].size, &t->nbytes))
        return dj_fail(e, TNAME "byte size overflows", name);

    const json_value *off = json_get(v, "data_offsets");
    if (!off) return dj_fail(e, TNAME "missing \"data_offsets\"", name);
    int64_t b, en;
    if (off->type != JSON_ARRAY || off->u.arr.n != 2 || json_int(&off->u.arr.items[0], &b) ||
        json_int(&off->u.arr.items[1], &en) || b < 0 || en < 0)
        return dj_fail(e, TNAME "\"data_offsets\" must be [begin, end] with non-negative integers", name);
    if (b > en) return dj_fail(e, TNAME "data_offsets begin %lld > end %lld", name, (long long)b, (long long)en);
    if ((uint64_t)en > data_size)
        return dj_fail(e, TNAME "data_offsets end %lld is past the %llu bytes of data", name, (long long)en,
                       (unsigned long long)data_size);
    if ((uint64_t)(en - b) != t->nbytes)
        return dj_fail(e, TNAME "data_offsets span %lld bytes but shape and %s need %llu", name,
                       (long long)(en - b), st_dtypes[t->dtype].name, (unsigned long long)t->nbytes);
    t->offset = data_off + (uint64_t)b;
    t->data = (uint64_t)en <= have ? data + b : NULL;
    return 0;
}

// ---- the table
typedef struct {
    uint64_t begin, end;
    const char *name;
} st_span;

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_span(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// Every non-empty byte range may belong to one tensor only; empty tensors own no bytes.
static int check_overlaps(const st_tensor *ts, size_t n, dj_err *e) {
    st_span *sp = malloc((n ? n : 1) * sizeof *sp);
    if (!sp) return dj_fail(e, "safetensors: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ts[i].nbytes) continue;
        uint64_t b = ts[i].offset;
        sp[m++] = (st_span){b, b + ts[i].nbytes, ts[i].name};
    }
    qsort(sp, m, sizeof *sp, cmp_span);
    int rc = 0;
    for (size_t i = 1; i < m; i++) {
        if (sp[i].begin < sp[i - 1].end) {
            rc = dj_fail(e, TNAME "data [%llu, %llu) overlaps tensor '%.120s' [%llu, %llu)", sp[i].name,
                         (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end, sp[i - 1].name,
                         (unsigned long long)sp[i - 1].begin, (unsigned long long)sp[i - 1].end);
            break;
        }
    }
    free(sp);
    return rc;
}

static int check_metadata(const json_value *v, dj_err *e) {
    if (v->type != JSON_OBJECT)
        return dj_fail(e, "safetensors: \"__metadata__\" must be an object, found %s", json_type_name(v->type));
    for (size_t i = 0; i < v->u.obj.n; i++) {
        const json_member *m = &v->u.obj.members[i];
        if (m->value.type != JSON_STRING)
            return dj_fail(e, "safetensors: \"__metadata__\" entry '%.120s' must be a string, found %s", m->key,
                           json_type_name(m->value.type));
    }
    return 0;
}

int st_header_size(const void *first8, uint64_t file_size, uint64_t *size, dj_err *e) {
    const uint8_t *b = first8;
    if (file_size < 8)
        return dj_fail(e, "safetensors: file is %llu bytes, too short for the 8-byte header length",
                       (unsigned long long)file_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > ST_MAX_HEADER)
        return dj_fail(e, "safetensors: header length %llu exceeds the 100 MB limit (corrupt or not a safetensors file)",
                       (unsigned long long)hlen);
    if (hlen > file_size - 8)
        return dj_fail(e, "safetensors: header length %llu exceeds the %llu bytes after the length field (truncated "
                          "file?)", (unsigned long long)hlen, (unsigned long long)(file_size - 8));
    *size = 8 + hlen;
    return 0;
}

int st_parse(const void *bytes, size_t n, st_file *out, dj_err *e) { return st_parse_head(bytes, n, n, out, e); }

int st_parse_head(const void *bytes, size_t n, uint64_t file_size, st_file *out, dj_err *e) {
    memset(out, 0, sizeof *out);
    const uint8_t *b = bytes;
    uint64_t head;
    if (st_header_size(b, n < 8 ? n : file_size, &head, e)) return -1;
    if (head > n)
        return dj_fail(e, "safetensors: internal error: %zu header bytes given, %llu needed", n,
                       (unsigned long long)head);
    uint64_t hlen = head - 8;
    const uint8_t *data = b + head;
    uint64_t data_size = file_size - head, have = n - head;

    dj_err je;
    json_doc *doc = json_parse((const char *)b + 8, (size_t)hlen, &je);
    if (!doc) return dj_fail(e, "safetensors: header: %s", je.msg);
    const json_value *root = json_root(doc);
    if (root->type != JSON_OBJECT) {
        json_type t = root->type;
        json_free(doc);
        return dj_fail(e, "safetensors: header must be a JSON object, found %s", json_type_name(t));
    }

    size_t cap = root->u.obj.n ? root->u.obj.n : 1, nt = 0;
    st_tensor *ts = malloc(cap * sizeof *ts);
    if (!ts) {
        json_free(doc);
        return dj_fail(e, "safetensors: out of memory");
    }
    int rc = 0;
    for (size_t i = 0; i < root->u.obj.n && !rc; i++) {
        const json_member *m = &root->u.obj.members[i];
        if (strcmp(m->key, "__metadata__") == 0 && m->key_len == 12) rc = check_metadata(&m->value, e);
        else rc = parse_entry(m, data, head, have, data_size, &ts[nt++], e);
    }
    if (!rc) {
        qsort(ts, nt, sizeof *ts, cmp_tensor_name);
        for (size_t i = 1; i < nt && !rc; i++)
            if (strcmp(ts[i - 1].name, ts[i].name) == 0) rc = dj_fail(e, TNAME "appears twice in the header", ts[i].name);
    }
    if (!rc) rc = check_overlaps(ts, nt, e);
    if (rc) {
        free(ts);
        json_free(doc);
        return -1;
    }
    out->tensors = ts;
    out->n = nt;
    out->priv = doc;
    return 0;
}

void st_free(st_file *f) {
    if (!f) return;
    free(f->tensors);
    json_free(f->priv);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}
