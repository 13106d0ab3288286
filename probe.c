// probe.c: activation dumps and control vectors (probe.h): parsing the options, reading the vectors, the rows the
// engines hand over after their layers, the dump file.
#include "probe.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROBE_BUF ((size_t)1 << 20)  // records gathered before a write
#define PROBE_REC_HEAD 16u           // u32 layer, u32 pos, i32 token, u32 slot

typedef struct {
    int32_t slot;
    uint32_t layer;
    int64_t pos0, n, n_seen;
    int replace;
    float *rows;        // (n, dim), the caller's
    uint8_t *seen;      // (n): that row has passed
} probe_tap_t;

struct dj_probe {
    uint32_t dim, n_layers;
    float **vec;        // (n_layers): NULL, or the vector added after that layer (dim), scales applied
    uint8_t *dumped;    // (n_layers): 1 when that layer's rows are recorded
    uint32_t n_dumped;
    dj_out out;         // the dump (fd -1: none, or already renamed into place)
    uint8_t *buf;       // records not written yet
    size_t used, cap;
    uint64_t n_records;
    int failed;         // a write failed: err says what, and every later call returns it
    dj_err err;
    probe_tap_t *taps;  // (n_taps), one a slot
    int32_t n_taps, cap_taps;
    uint32_t *n_tapped; // (n_layers): the taps after that layer
};

// ---- options
// A decimal layer number below n_layers (n_layers 0: any), all of s.
static int parse_layer(const char *s, size_t n, uint32_t n_layers, uint32_t *out, const char *what, dj_err *e) {
    uint64_t v = 0;
    if (n == 0 || n > 9) return dj_fail(e, "%s: '%.*s' is not a layer number", what, (int)n, s);
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return dj_fail(e, "%s: '%.*s' is not a layer number", what, (int)n, s);
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (n_layers && v >= n_layers)
        return dj_fail(e, "%s: layer %" PRIu64 " does not exist (the model has %u layers: 0 to %u)", what, v, n_layers,
                       n_layers - 1);
    *out = (uint32_t)v;
    return 0;
}

int probe_parse_layers(const char *spec, uint32_t n_layers, uint8_t *mask, dj_err *e) {
    if (!strcmp(spec, "all")) {
        if (mask) memset(mask, 1, n_layers);
        return 0;
    }
    if (mask) memset(mask, 0, n_layers);
    for (const char *s = spec;;) {
        size_t n = strcspn(s, ",");
        uint32_t l;
        if (parse_layer(s, n, n_layers, &l, "layer list", e)) return -1;
        if (mask && mask[l]) return dj_fail(e, "layer list: layer %u is listed twice", l);
        if (mask) mask[l] = 1;
        if (!s[n]) return 0;
        s += n + 1;
    }
}

int probe_parse_steer(const char *spec, uint32_t n_layers, uint32_t *layer, char **file, double *scale, dj_err *e) {
    const char *c1 = strchr(spec, ':');
    *file = NULL, *scale = 1;
    if (!c1 || !c1[1]) return dj_fail(e, "'%s' is not LAYER:FILE[:SCALE]", spec);
    if (parse_layer(spec, (size_t)(c1 - spec), n_layers, layer, "--steer", e)) return -1;
    const char *f = c1 + 1, *last = strrchr(f, ':');
    size_t n = strlen(f);
    if (last) {  // a last part that is a number is the scale; otherwise the ':' belongs to the file's name
        char *end;
        errno = 0;
        double v = strtod(last + 1, &end);
        if (last[1] && !*end && !errno) {
            if (!isfinite(v)) return dj_fail(e, "--steer: the scale in '%s' is not finite", spec);
            *scale = v, n = (size_t)(last - f);
        }
    }
    if (!n) return dj_fail(e, "'%s' names no vector file (LAYER:FILE[:SCALE])", spec);
    if (!(*file = strndup(f, n))) return dj_fail(e, "out of memory");
    return 0;
}

// ---- the probe
dj_probe *probe_new(const dj_config *c, dj_err *e) {
    dj_probe *p = calloc(1, sizeof *p);
    if (p) {
        p->vec = calloc(c->n_layers, sizeof *p->vec);
        p->dumped = calloc(c->n_layers, 1);
        p->n_tapped = calloc(c->n_layers, sizeof *p->n_tapped);
    }
    if (!p || !p->vec || !p->dumped || !p->n_tapped) {
        probe_free(p);
        dj_fail(e, "out of memory");
        return NULL;
    }
    p->dim = c->dim, p->n_layers = c->n_layers;
    p->out.fd = -1;
    return p;
}

void probe_free(dj_probe *p) {
    if (!p) return;
    out_abort(&p->out);
    for (uint32_t l = 0; p->vec && l < p->n_layers; l++) free(p->vec[l]);
    for (int32_t i = 0; i < p->n_taps; i++) free(p->taps[i].seen);
    free(p->vec), free(p->dumped), free(p->buf), free(p->taps), free(p->n_tapped);
    free(p);
}

int probe_add_vector(dj_probe *p, uint32_t layer, const float *v, double scale, dj_err *e) {
    if (layer >= p->n_layers)
        return dj_fail(e, "--steer: layer %u does not exist (the model has %u layers)", layer, p->n_layers);
    if (!p->vec[layer]) {
        if (!(p->vec[layer] = malloc((size_t)p->dim * sizeof(float)))) return dj_fail(e, "out of memory");
        for (uint32_t i = 0; i < p->dim; i++) p->vec[layer][i] = -0.0f;
    }
    float *d = p->vec[layer];
    for (uint32_t i = 0; i < p->dim; i++)  // first: a vector times its scale (plus the layer's others) must stay finite
        if (!isfinite(d[i] + (float)((double)v[i] * scale)))
            return dj_fail(e, "--steer: layer %u's vector times its scale %g overflows a float at element %u", layer,
                           scale, i);
    for (uint32_t i = 0; i < p->dim; i++) {
        float s = d[i] + (float)((double)v[i] * scale);
        d[i] = s == 0.0f ? -0.0f : s;  // see probe_vector: zeros leave the stream as it is
    }
    return 0;
}

int probe_add_steer(dj_probe *p, const char *spec, dj_err *e) {
    uint32_t layer;
    char *file, *data = NULL;
    double scale;
    size_t n;
    if (probe_parse_steer(spec, p->n_layers, &layer, &file, &scale, e)) return -1;
    int rc = -1;
    const size_t want = (size_t)p->dim * sizeof(float);
    if (in_read_all(file, "steering vector", want + 4096, &data, &n, e)) goto out;
    if (n != want) {
        dj_fail(e, "--steer: %s holds %zu bytes, not a vector of the model's %u floats (%zu bytes)", file, n, p->dim,
                want);
        goto out;
    }
    float *v = (float *)(void *)data;  // in_read_all's buffer is malloc'd: aligned for floats
    for (uint32_t i = 0; i < p->dim; i++)
        if (!isfinite(v[i])) {
            dj_fail(e, "--steer: %s: element %u is %s", file, i, isnan(v[i]) ? "NaN" : "infinite");
            goto out;
        }
    rc = probe_add_vector(p, layer, v, scale, e);
out:
    free(file), free(data);
    return rc;
}

// ---- the dump
static void put_u32(uint8_t *b, uint32_t v) { memcpy(b, &v, 4); }
static void put_u64(uint8_t *b, uint64_t v) { memcpy(b, &v, 8); }

static void dump_header(const dj_probe *p, uint8_t h[PROBE_HEADER]) {
    memset(h, 0, PROBE_HEADER);
    memcpy(h, PROBE_MAGIC, 8);
    put_u32(h + 8, PROBE_VERSION), put_u32(h + 12, PROBE_HEADER), put_u32(h + 16, p->dim);
    put_u32(h + 20, p->n_layers), put_u64(h + 24, p->n_records);
    put_u64(h + 32, PROBE_REC_HEAD + 4ull * p->dim), put_u32(h + 40, p->n_dumped);
    for (uint32_t l = 0; l < p->n_layers; l++)
        if (p->dumped[l]) h[64 + l / 8] |= (uint8_t)(1u << (l % 8));
}

int probe_open_dump(dj_probe *p, const char *layers, dj_out *out, dj_err *e) {
    p->out = *out;
    out->fd = -1, out->tmp = out->path = NULL;  // the probe's now
    if (p->n_layers > 8 * 128) return dj_fail(e, "--dump-act: %u layers do not fit the header's mask", p->n_layers);
    if (probe_parse_layers(layers, p->n_layers, p->dumped, e)) return -1;
    for (uint32_t l = 0; l < p->n_layers; l++) p->n_dumped += p->dumped[l];
    size_t rec = PROBE_REC_HEAD + 4 * (size_t)p->dim;
    p->cap = rec > PROBE_BUF ? rec : PROBE_BUF;
    if (!(p->buf = malloc(p->cap))) return dj_fail(e, "out of memory");
    uint8_t h[PROBE_HEADER];
    dump_header(p, h);
    return out_write(&p->out, h, sizeof h, e);
}

static int flush(dj_probe *p, dj_err *e) {
    if (p->used && out_write(&p->out, p->buf, p->used, &p->err)) {
        p->failed = 1;
        if (e) *e = p->err;
        return -1;
    }
    p->used = 0;
    return 0;
}

int probe_finish(dj_probe *p, dj_err *e) {
    if (p->failed) return e ? (*e = p->err, -1) : -1;
    if (p->out.fd < 0) return 0;
    if (flush(p, e)) return -1;
    uint8_t h[PROBE_HEADER];
    dump_header(p, h);  // now with the record count
    if (pwrite(p->out.fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        return dj_fail(e, "writing %s: %s", p->out.tmp, strerror(errno));
    return out_commit(&p->out, 0, e);
}

// ---- taps
int probe_tap(dj_probe *p, int32_t slot, uint32_t layer, int64_t pos0, int64_t n, int replace, float *rows, dj_err *e) {
    if (layer >= p->n_layers) return dj_fail(e, "tap: layer %u does not exist (%u layers)", layer, p->n_layers);
    if (n < 1 || pos0 < 0) return dj_fail(e, "tap: %lld positions from %lld", (long long)n, (long long)pos0);
    for (int32_t i = 0; i < p->n_taps; i++)
        if (p->taps[i].slot == slot) return dj_fail(e, "tap: KV slot %d is tapped already", slot);
    if (p->n_taps == p->cap_taps) {
        int32_t cap = p->cap_taps ? 2 * p->cap_taps : 8;
        probe_tap_t *t = realloc(p->taps, (size_t)cap * sizeof *t);
        if (!t) return dj_fail(e, "out of memory");
        p->taps = t, p->cap_taps = cap;
    }
    uint8_t *seen = calloc((size_t)n, 1);
    if (!seen) return dj_fail(e, "out of memory");
    p->taps[p->n_taps++] = (probe_tap_t){slot, layer, pos0, n, 0, replace, rows, seen};
    p->n_tapped[layer]++;
    return 0;
}

int64_t probe_untap(dj_probe *p, int32_t slot) {
    for (int32_t i = 0; i < p->n_taps; i++) {
        probe_tap_t *t = &p->taps[i];
        if (t->slot != slot) continue;
        int64_t seen = t->n_seen;
        p->n_tapped[t->layer]--;
        free(t->seen);
        *t = p->taps[--p->n_taps];
        return seen;
    }
    return 0;
}

int probe_tapped(const dj_probe *p, uint32_t layer) { return p->n_tapped[layer] > 0; }
int probe_any_tap(const dj_probe *p) { return p->n_taps > 0; }

float *probe_tap_row(dj_probe *p, uint32_t layer, int32_t slot, int64_t pos, int *replace) {
    for (int32_t i = 0; i < p->n_taps; i++) {
        probe_tap_t *t = &p->taps[i];
        if (t->slot != slot || t->layer != layer || pos < t->pos0 || pos - t->pos0 >= t->n) continue;
        int64_t r = pos - t->pos0;
        t->n_seen += !t->seen[r];
        t->seen[r] = 1;
        *replace = t->replace;
        return t->rows + r * (int64_t)p->dim;
    }
    return NULL;
}

const float *probe_tap_peek(const dj_probe *p, uint32_t layer, int32_t slot, int64_t pos, int *replace) {
    for (int32_t i = 0; i < p->n_taps; i++) {
        const probe_tap_t *t = &p->taps[i];
        if (t->slot != slot || t->layer != layer || pos < t->pos0 || pos - t->pos0 >= t->n) continue;
        *replace = t->replace;
        return t->rows + (pos - t->pos0) * (int64_t)p->dim;
    }
    return NULL;
}

uint32_t probe_dim(const dj_probe *p) { return p->dim; }
int probe_dumps(const dj_probe *p, uint32_t layer) { return p->out.fd >= 0 && p->dumped[layer]; }
int probe_any_dump(const dj_probe *p) { return p->out.fd >= 0 && p->n_dumped > 0; }
const float *probe_vector(const dj_probe *p, uint32_t layer) { return p->vec[layer]; }

int probe_record(dj_probe *p, uint32_t layer, const float *x, int64_t T, const int32_t *tokens, const int64_t *pos,
                 const int32_t *slots, dj_err *e) {
    if (p->failed) return e ? (*e = p->err, -1) : -1;
    if (!probe_dumps(p, layer)) return 0;
    size_t row = 4 * (size_t)p->dim, rec = PROBE_REC_HEAD + row;
    for (int64_t t = 0; t < T; t++) {
        if (p->used + rec > p->cap && flush(p, e)) return -1;
        uint8_t *b = p->buf + p->used;
        put_u32(b, layer), put_u32(b + 4, (uint32_t)pos[t]), put_u32(b + 8, (uint32_t)tokens[t]);
        put_u32(b + 12, (uint32_t)slots[t]);
        memcpy(b + PROBE_REC_HEAD, x + t * (int64_t)p->dim, row);
        p->used += rec;
        p->n_records++;
    }
    return 0;
}

int probe_rows(dj_probe *p, uint32_t layer, float *x, int64_t T, const int32_t *tokens, const int64_t *pos,
               const int32_t *slots, dj_err *e) {
    const float *v = p->vec[layer];
    int64_t dim = p->dim;
    if (v)
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < dim; i++) x[t * dim + i] += v[i];
    for (int64_t t = 0; p->n_tapped[layer] && t < T; t++) {
        int replace;
        float *r = probe_tap_row(p, layer, slots[t], pos[t], &replace), *row = x + t * dim;
        if (r) memcpy(replace ? row : r, replace ? r : row, (size_t)dim * sizeof *row);
    }
    return probe_record(p, layer, x, T, tokens, pos, slots, e);
}
