// trace.c: the decode step's timeline (trace.h): the record and its JSON, then the events that fill it.
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "kernels.h"

// A mark on the compute stream: an event and what it stands for.
enum { M_PASS, M_UNIT0, M_UNIT1, M_SPLIT0, M_SPLIT1, M_SPLIT2 };
typedef struct {
    int what, unit, mat;
    double h0, h1, h2;  // M_SPLIT2: the host's clock (dj_now, s)
    uint64_t bytes;     // M_SPLIT2: weights the CPU read
} tr_mark;

struct dj_trace {
    // the record
    tr_info in;
    uint8_t *resident;   // (n_layers + 1), the engine's copy
    char *device, *dtype;
    int want;            // steps to record
    tr_span *sp;
    size_t n, cap;
    double win[TRACE_STEPS_MAX][2];  // each step's window (ms)
    int n_win;
    // the engine's side
    cudaStream_t compute, copy;
    int quiet;
    dj_out out;
    char *path;          // the file's (out's is freed when it is written)
    int opened, written;
    cudaEvent_t origin;
    double host0;        // dj_now() when the origin was seen done
    int64_t decode;      // decode passes seen (the first: the origin's)
    int64_t issued0;     // the copies (stream.c's seqs) issued before the origin: all complete when it was recorded
    int rec;             // the pass running: 0 not recorded, 1 recorded (step `step`), 2 only its copies
    int step;
    int unit;            // the unit whose work is being enqueued
    cudaEvent_t *ev;     // (cap_mk) this pass's marks
    tr_mark *mk;
    int n_mk, cap_mk;
};

// ---- the record
dj_trace *trace_new(const tr_info *in, int steps, dj_err *e) {
    if (steps < 1 || steps > TRACE_STEPS_MAX) {
        dj_fail(e, "--trace-steps %d: trace 1 to %d decode steps", steps, TRACE_STEPS_MAX);
        return NULL;
    }
    dj_trace *t = calloc(1, sizeof *t);
    if (t) {
        t->out.fd = -1;
        t->in = *in;
        t->want = steps;
        t->resident = calloc((size_t)in->n_layers + 1, 1);
        t->device = strdup(in->device ? in->device : "?");
        t->dtype = strdup(in->dtype ? in->dtype : "?");
    }
    if (!t || !t->resident || !t->device || !t->dtype) {
        trace_free(t);
        dj_fail(e, "out of memory for the trace");
        return NULL;
    }
    if (in->resident) memcpy(t->resident, in->resident, (size_t)in->n_layers + 1);
    t->in.resident = t->resident, t->in.device = t->device, t->in.dtype = t->dtype;
    return t;
}

void trace_free(dj_trace *t) {
    if (!t) return;
    out_abort(&t->out);
    if (t->origin) gpu_event_destroy(t->origin);
    for (int i = 0; t->ev && i < t->cap_mk; i++) gpu_event_destroy(t->ev[i]);
    free(t->ev), free(t->mk), free(t->sp), free(t->resident), free(t->device), free(t->dtype), free(t->path);
    free(t);
}

int trace_add(dj_trace *t, const tr_span *s, dj_err *e) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        tr_span *p = realloc(t->sp, cap * sizeof *p);
        if (!p) return dj_fail(e, "out of memory for the trace");
        t->sp = p, t->cap = cap;
    }
    t->sp[t->n++] = *s;
    return 0;
}

int trace_window(dj_trace *t, int step, double t0, double t1, dj_err *e) {
    if (step != t->n_win + 1 || step > t->want)
        return dj_fail(e, "internal error: trace step %d after %d of %d", step, t->n_win, t->want);
    t->win[t->n_win][0] = t0, t->win[t->n_win][1] = t1;
    t->n_win++;
    return 0;
}

int trace_steps(const dj_trace *t) { return t->n_win; }

static double overlap(double a0, double a1, double b0, double b1) {
    double lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0;
}

void trace_summary(const dj_trace *t, int k, tr_step *o) {
    memset(o, 0, sizeof *o);
    o->step = k + 1, o->t0 = t->win[k][0], o->t1 = t->win[k][1], o->ms = o->t1 - o->t0;
    double copy_ms = 0, busy = 0, rows = 0;
    for (size_t i = 0; i < t->n; i++) {
        const tr_span *s = &t->sp[i];
        double d = s->t1 - s->t0;
        if (s->kind == TR_COPY) busy += overlap(s->t0, s->t1, o->t0, o->t1);  // one stream: copies never overlap
        if (s->step != o->step) continue;
        switch (s->kind) {
        case TR_COPY: o->copy_bytes += s->bytes, copy_ms += d; break;
        case TR_WAIT: o->wait_ms += d; break;
        case TR_SPLIT: o->gpu_waits_cpu_ms += s->t1 - s->mid; break;
        case TR_WAIT_X: o->cpu_wait_ms += d; break;
        case TR_ROWS: o->cpu_bytes += s->bytes, rows += d; break;
        case TR_UNIT: break;
        }
    }
    o->copy_gbs = copy_ms > 0 ? (double)o->copy_bytes / copy_ms / 1e6 : 0;
    o->copy_busy = o->ms > 0 ? busy / o->ms : 0;
    o->cpu_busy = o->ms > 0 ? rows / o->ms : 0;
    o->weights_gbs = o->ms > 0 ? (double)(o->copy_bytes + o->cpu_bytes) / o->ms / 1e6 : 0;
}

// Every step's figures.
static void all_steps(const dj_trace *t, tr_step *out) {
    for (int k = 0; k < t->n_win; k++) trace_summary(t, k, &out[k]);
}

static const char *lane_of(tr_kind k) {
    return k == TR_COPY ? "copy" : k == TR_WAIT_X || k == TR_ROWS ? "cpu" : "compute";
}
static const char *kind_name(tr_kind k) {
    static const char *names[] = {"copy", "wait", "unit", "split", "wait_x", "rows"};
    return names[k];
}

// By lane (copy, compute, cpu), then start, then end.
static int span_order(const void *a, const void *b) {
    const tr_span *x = a, *y = b;
    int lx = x->kind == TR_COPY ? 0 : x->kind == TR_WAIT_X || x->kind == TR_ROWS ? 2 : 1;
    int ly = y->kind == TR_COPY ? 0 : y->kind == TR_WAIT_X || y->kind == TR_ROWS ? 2 : 1;
    if (lx != ly) return lx - ly;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    return (x->t1 > y->t1) - (x->t1 < y->t1);
}

int trace_json(const dj_trace *t, dj_buf *b) {
    const tr_info *in = &t->in;
    buf_str(b, "{\"format\": \"djinn-trace\", \"version\": 1, \"device\": ");
    buf_json_str(b, in->device, strlen(in->device));
    buf_str(b, ", \"dtype\": ");
    buf_json_str(b, in->dtype, strlen(in->dtype));
    buf_fmt(b, ", \"n_layers\": %d, \"resident\": [", in->n_layers);
    for (int u = 0; u <= in->n_layers; u++) buf_fmt(b, "%s%d", u ? ", " : "", in->resident[u] ? 1 : 0);
    buf_fmt(b, "],\n \"cpu_share\": %.4f, \"bytes_per_token\": %llu, \"cpu_bytes_per_token\": %llu, "
               "\"steps_asked\": %d, \"complete\": %s,\n",
            in->cpu_share, (unsigned long long)in->bytes_per_token, (unsigned long long)in->cpu_bytes_per_token,
            t->want, t->n_win == t->want ? "true" : "false");
    buf_str(b, " \"units\": \"0 .. n_layers - 1 the layers, n_layers the head\",\n"
               " \"times\": \"ms from one event recorded after both streams were synchronised\",\n \"steps\": [");
    tr_step st[TRACE_STEPS_MAX];
    all_steps(t, st);
    for (const tr_step *s = st; s < st + t->n_win; s++)
        buf_fmt(b, "%s\n  {\"step\": %d, \"t0\": %.4f, \"t1\": %.4f, \"ms\": %.4f, \"copy_bytes\": %llu, "
                   "\"copy_gb_s\": %.3f, \"copy_busy\": %.4f, \"wait_ms\": %.4f, \"cpu_bytes\": %llu, "
                   "\"cpu_busy\": %.4f, \"cpu_wait_ms\": %.4f, \"gpu_waits_cpu_ms\": %.4f, \"weights_gb_s\": %.3f}",
                s > st ? "," : "", s->step, s->t0, s->t1, s->ms, (unsigned long long)s->copy_bytes, s->copy_gbs,
                s->copy_busy, s->wait_ms, (unsigned long long)s->cpu_bytes, s->cpu_busy, s->cpu_wait_ms,
                s->gpu_waits_cpu_ms, s->weights_gbs);
    buf_str(b, "],\n \"intervals\": [");
    tr_span *sp = t->n ? malloc(t->n * sizeof *sp) : NULL;
    if (t->n && !sp) return -1;
    if (t->n) memcpy(sp, t->sp, t->n * sizeof *sp), qsort(sp, t->n, sizeof *sp, span_order);  // none: NULL
    for (size_t i = 0; i < t->n; i++) {
        const tr_span *s = &sp[i];
        buf_fmt(b, "%s\n  {\"lane\": \"%s\", \"kind\": \"%s\", \"step\": %d, \"unit\": %d, \"t0\": %.4f, \"t1\": %.4f",
                i ? "," : "", lane_of(s->kind), kind_name(s->kind), s->step, s->unit, s->t0, s->t1);
        if (s->kind == TR_SPLIT || s->kind == TR_WAIT_X || s->kind == TR_ROWS) buf_fmt(b, ", \"mat\": %d", s->mat);
        if (s->kind == TR_SPLIT) buf_fmt(b, ", \"mid\": %.4f", s->mid);
        if (s->kind == TR_COPY || s->kind == TR_ROWS) buf_fmt(b, ", \"bytes\": %llu", (unsigned long long)s->bytes);
        buf_str(b, "}");
    }
    free(sp);
    buf_str(b, "]}\n");
    return b->oom ? -1 : 0;
}

// ---- the file and the summary
static void print_summary(const dj_trace *t) {
    tr_step st[TRACE_STEPS_MAX];
    all_steps(t, st);
    for (const tr_step *s = st; s < st + t->n_win; s++)
        fprintf(stderr, "trace: step %d: %.1f ms, %.2f GB of weights (%.1f GB/s); copies %.2f GB at %.1f GB/s, the "
                        "copy stream busy %.0f%%; the compute stream waited %.1f ms for copies and %.1f ms for the "
                        "CPU's rows; the CPU share busy %.0f%% (%.2f GB), waited %.1f ms for x\n",
                s->step, s->ms, (double)(s->copy_bytes + s->cpu_bytes) / 1e9, s->weights_gbs,
                (double)s->copy_bytes / 1e9, s->copy_gbs, 100 * s->copy_busy, s->wait_ms, s->gpu_waits_cpu_ms,
                100 * s->cpu_busy, (double)s->cpu_bytes / 1e9, s->cpu_wait_ms);
}

static int write_file(dj_trace *t, dj_err *e) {
    dj_buf b = {0};
    int rc = trace_json(t, &b) ? dj_fail(e, "out of memory for the trace") : 0;
    if (!rc && (out_write(&t->out, b.p, b.n, e) || out_commit(&t->out, 0, e))) rc = -1;
    buf_free(&b);
    t->written = 1;  // written or failed: never again
    if (!rc && !t->quiet) {
        print_summary(t);
        fprintf(stderr, "trace: %d decode step%s written to %s\n", t->n_win, t->n_win == 1 ? "" : "s", t->path);
    }
    return rc;
}

int trace_close(dj_trace *t, dj_err *e) {
    if (!t || !t->opened || t->written) return 0;
    if (!t->quiet && t->n_win < t->want)
        fprintf(stderr, "trace: the run ended after %d of the %d decode steps asked\n", t->n_win, t->want);
    return write_file(t, e);
}

int trace_done(const dj_trace *t) { return t->written; }

// ---- the engine's side
dj_trace *trace_open(const char *path, int steps, const tr_info *in, cudaStream_t compute, cudaStream_t copy,
                     int quiet, dj_err *e) {
    dj_trace *t = trace_new(in, steps, e);
    if (!t) return NULL;
    t->compute = compute, t->copy = copy, t->quiet = quiet;
    // every mark a pass can make: a pass, each unit's two, three for each split matmul (at most 7 a layer, 1 head)
    t->cap_mk = 1 + 2 * (in->n_layers + 1) + 3 * (7 * in->n_layers + 1);
    t->ev = calloc((size_t)t->cap_mk, sizeof *t->ev);
    t->mk = calloc((size_t)t->cap_mk, sizeof *t->mk);
    t->path = strdup(path);
    if (!t->ev || !t->mk || !t->path) {
        trace_free(t);
        dj_fail(e, "out of memory for the trace");
        return NULL;
    }
    int rc = gpu_event_create(&t->origin, 1, e);
    for (int i = 0; !rc && i < t->cap_mk; i++) rc = gpu_event_create(&t->ev[i], 1, e);
    if (rc || out_open(&t->out, path, "--trace", NULL, 0, e)) {
        trace_free(t);
        return NULL;
    }
    t->opened = 1;
    return t;
}

// ms of ev after the origin (both complete); `before`: ev was recorded before the origin and completed before it
// (a copy issued ahead of it), timed from ev to the origin and negated, so that no elapsed time is ever negative.
static int since_origin(const dj_trace *t, cudaEvent_t ev, int before, double *ms, dj_err *e) {
    float f;
    if (before ? gpu_event_ms(&f, ev, t->origin, e) : gpu_event_ms(&f, t->origin, ev, e)) return -1;
    *ms = before ? -(double)f : f;
    return 0;
}

static int mark(dj_trace *t, int what, int unit, int mat, dj_err *e) {
    if (t->rec != 1) return 0;
    if (t->n_mk == t->cap_mk) return dj_fail(e, "internal error: more than %d trace marks in a pass", t->cap_mk);
    t->mk[t->n_mk] = (tr_mark){.what = what, .unit = unit, .mat = mat};
    return gpu_event_record(t->ev[t->n_mk++], t->compute, e);
}

int trace_pass_begin_(dj_trace *t, int64_t T, int64_t issued, dj_err *e) {
    t->n_mk = 0, t->rec = 0;
    if (t->written) return 0;
    if (t->n_win == t->want) {  // the pass after the last step: the copies the step issued ahead for it
        t->rec = 2;
        return 0;
    }
    if (T != 1) return 0;
    if (t->decode++ == 0) {  // the origin
        if (gpu_stream_sync(t->compute, e) || gpu_stream_sync(t->copy, e) ||
            gpu_event_record(t->origin, t->compute, e) || gpu_event_sync(t->origin, e))
            return -1;
        t->host0 = dj_now();
        t->issued0 = issued;
        return 0;
    }
    t->rec = 1, t->step = t->n_win + 1;
    return mark(t, M_PASS, -1, -1, e);
}

int trace_unit_(dj_trace *t, int unit, int end, dj_err *e) {
    t->unit = unit;
    return mark(t, end ? M_UNIT1 : M_UNIT0, unit, -1, e);
}

int trace_split_(dj_trace *t, int mat, int stage, dj_err *e) {
    return mark(t, stage ? M_SPLIT1 : M_SPLIT0, t->unit, mat, e);
}

int trace_split_placed_(dj_trace *t, int mat, int *at, dj_err *e) {
    if (t->rec != 1) return 0;
    if (mark(t, M_SPLIT2, t->unit, mat, e)) return -1;
    *at = t->n_mk - 1;
    return 0;
}

int trace_split_times_(dj_trace *t, int at, double h0, double h1, double h2, uint64_t bytes, dj_err *e) {
    if (at < 0) return 0;
    if (t->rec != 1 || at >= t->n_mk || t->mk[at].what != M_SPLIT2)
        return dj_fail(e, "internal error: a trace's split times without their mark");
    tr_mark *m = &t->mk[at];
    m->h0 = h0, m->h1 = h1, m->h2 = h2, m->bytes = bytes;
    return 0;
}

int trace_copy_(dj_trace *t, int64_t seq, int unit, uint64_t bytes, cudaEvent_t c0, cudaEvent_t c1, cudaEvent_t w0,
                cudaEvent_t w1, dj_err *e) {
    if (!t->rec) return 0;
    tr_span c = {.kind = TR_COPY, .step = t->rec == 1 ? t->step : t->want + 1, .unit = unit, .mat = -1,
                 .bytes = bytes};
    int before = seq < t->issued0;  // a ring that holds more than a pass: the first step's copies went before
    if (since_origin(t, c0, before, &c.t0, e) || since_origin(t, c1, before, &c.t1, e) || trace_add(t, &c, e))
        return -1;
    if (t->rec != 1) return 0;  // the last step's copies ahead: their waits are the next pass's
    tr_span w = {.kind = TR_WAIT, .step = t->step, .unit = unit, .mat = -1};
    return since_origin(t, w0, 0, &w.t0, e) || since_origin(t, w1, 0, &w.t1, e) || trace_add(t, &w, e) ? -1 : 0;
}

// Host seconds (dj_now) as ms from the origin.
static double host_ms(const dj_trace *t, double h) { return (h - t->host0) * 1e3; }

int trace_pass_end_(dj_trace *t, dj_err *e) {
    if (t->rec == 2) return write_file(t, e);
    if (t->rec != 1) return 0;
    double begin = 0, end = 0, u0 = 0, s0 = 0, s1 = 0;
    for (int i = 0; i < t->n_mk; i++) {
        const tr_mark *m = &t->mk[i];
        double ms;
        if (since_origin(t, t->ev[i], 0, &ms, e)) return -1;
        tr_span s = {.step = t->step, .unit = m->unit, .mat = m->mat};
        switch (m->what) {
        case M_PASS: begin = end = ms; break;
        case M_UNIT0: u0 = ms; break;
        case M_SPLIT0: s0 = ms; break;
        case M_SPLIT1: s1 = ms; break;
        case M_UNIT1:
            s.kind = TR_UNIT, s.t0 = u0, s.t1 = end = ms;
            if (trace_add(t, &s, e)) return -1;
            break;
        case M_SPLIT2:
            s.kind = TR_SPLIT, s.t0 = s0, s.mid = s1, s.t1 = ms;
            if (trace_add(t, &s, e)) return -1;
            s.kind = TR_WAIT_X, s.t0 = host_ms(t, m->h0), s.t1 = host_ms(t, m->h1);
            if (trace_add(t, &s, e)) return -1;
            s.kind = TR_ROWS, s.t0 = s.t1, s.t1 = host_ms(t, m->h2), s.bytes = m->bytes;
            if (trace_add(t, &s, e)) return -1;
            break;
        }
    }
    t->n_mk = 0;
    return trace_window(t, t->step, begin, end, e);
}
