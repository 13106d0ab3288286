// test_trace.c: the decode step's timeline (trace.h) on synthetic intervals, without a GPU: each step's figures (the
// compute stream's waits, the copy stream's busy fraction with copies running ahead of their step, the link's GB/s,
// the CPU's part of the step), the JSON of the file parsed back (every field, intervals ordered by lane and start,
// each kind with its own fields), a trace cut short, and the refusals. The engine's side (events, the file) is
// trace_gpu in test_gpu.c; the command line's, cli::trace_flags.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../buf.h"
#include "../json.h"
#include "../trace.h"
#include "common.h"

static const uint8_t ttr_resident[3] = {0, 0, 1};  // two streamed layers, the head resident

static dj_trace *ttr_new(int steps) {
    tr_info in = {"GPU \"0\"", "f16", 2, ttr_resident, 0.5, 1000000000, 400000000};
    dj_err e;
    dj_trace *t = trace_new(&in, steps, &e);
    cr_assert(t, "%s", e.msg);
    return t;
}

static void ttr_add(dj_trace *t, tr_kind k, int step, int unit, int mat, double t0, double t1, double mid,
                    uint64_t bytes) {
    tr_span s = {k, step, unit, mat, t0, t1, mid, bytes};
    dj_err e;
    cr_assert_eq(trace_add(t, &s, &e), 0, "%s", e.msg);
}

// Two steps, [10, 30] and [30, 50] ms. The copy stream: each step's copies of layers 0 and 1 (400 and 600 MB), the
// first ones ahead of their step, and the third step's first copy (the pass after the last step). Step 1 waits
// 1.5 ms for copies and splits one matmul in each layer; step 2 none.
static dj_trace *ttr_two_steps(void) {
    dj_trace *t = ttr_new(2);
    dj_err e;
    ttr_add(t, TR_COPY, 1, 0, -1, 2, 6, 0, 400000000);   // ahead: before its step
    ttr_add(t, TR_COPY, 1, 1, -1, 8, 14, 0, 600000000);  // 4 ms inside step 1
    ttr_add(t, TR_COPY, 2, 0, -1, 20, 24, 0, 400000000);  // step 2's, inside step 1
    ttr_add(t, TR_COPY, 2, 1, -1, 26, 34, 0, 600000000);  // across the boundary: 4 ms in each
    ttr_add(t, TR_COPY, 3, 0, -1, 40, 44, 0, 400000000);  // the next pass's, inside step 2
    ttr_add(t, TR_WAIT, 1, 0, -1, 10, 10.5, 0, 0);
    ttr_add(t, TR_WAIT, 1, 1, -1, 14, 15, 0, 0);
    ttr_add(t, TR_UNIT, 1, 0, -1, 10.5, 14, 0, 0);
    ttr_add(t, TR_UNIT, 1, 1, -1, 15, 25, 0, 0);
    ttr_add(t, TR_UNIT, 1, 2, -1, 25, 30, 0, 0);
    ttr_add(t, TR_SPLIT, 1, 1, 0, 16, 20, 17, 0);  // added out of order: the file sorts them
    ttr_add(t, TR_SPLIT, 1, 0, 0, 11, 13, 12, 0);
    ttr_add(t, TR_WAIT_X, 1, 0, 0, 11.2, 11.5, 0, 0);
    ttr_add(t, TR_ROWS, 1, 0, 0, 11.5, 12.9, 0, 100000000);
    ttr_add(t, TR_WAIT_X, 1, 1, 0, 16.1, 16.4, 0, 0);
    ttr_add(t, TR_ROWS, 1, 1, 0, 16.4, 19.8, 0, 300000000);
    ttr_add(t, TR_WAIT, 2, 0, -1, 30, 30, 0, 0);
    ttr_add(t, TR_UNIT, 2, 0, -1, 30, 36, 0, 0);
    ttr_add(t, TR_WAIT, 2, 1, -1, 36, 36, 0, 0);
    ttr_add(t, TR_UNIT, 2, 1, -1, 36, 44, 0, 0);
    ttr_add(t, TR_UNIT, 2, 2, -1, 44, 50, 0, 0);
    cr_assert_eq(trace_window(t, 1, 10, 30, &e), 0, "%s", e.msg);
    cr_assert_eq(trace_window(t, 2, 30, 50, &e), 0, "%s", e.msg);
    return t;
}

#define TTR_NEAR(a, b)                                                                                  \
    cr_assert(fabs((double)(a) - (double)(b)) < 1e-9 * (1 + fabs((double)(b))), "%s = %.12g, want %.12g", #a, \
              (double)(a), (double)(b))

Test(trace, step_figures) {
    dj_trace *t = ttr_two_steps();
    cr_assert_eq(trace_steps(t), 2);
    tr_step s;
    trace_summary(t, 0, &s);
    cr_assert_eq(s.step, 1);
    TTR_NEAR(s.t0, 10);
    TTR_NEAR(s.t1, 30);
    TTR_NEAR(s.ms, 20);
    cr_assert_eq(s.copy_bytes, 1000000000ull);
    TTR_NEAR(s.copy_gbs, 100);    // 1 GB in 4 + 6 ms of copying
    TTR_NEAR(s.copy_busy, 0.6);   // 4 + 4 + 4 of its 20 ms: its own second copy, step 2's two
    TTR_NEAR(s.wait_ms, 1.5);
    cr_assert_eq(s.cpu_bytes, 400000000ull);
    TTR_NEAR(s.cpu_busy, 0.24);   // 1.4 + 3.4 ms
    TTR_NEAR(s.cpu_wait_ms, 0.6);
    TTR_NEAR(s.gpu_waits_cpu_ms, 4);  // 13 - 12, 20 - 17
    TTR_NEAR(s.weights_gbs, 70);  // 1.4 GB in 20 ms
    trace_summary(t, 1, &s);
    cr_assert_eq(s.step, 2);
    cr_assert_eq(s.copy_bytes, 1000000000ull);
    TTR_NEAR(s.copy_gbs, 1e9 / 12 / 1e6);
    TTR_NEAR(s.copy_busy, 0.4);  // its second copy's last 4 ms and the next pass's first
    TTR_NEAR(s.wait_ms, 0);
    TTR_NEAR(s.cpu_busy, 0);
    TTR_NEAR(s.gpu_waits_cpu_ms, 0);
    TTR_NEAR(s.weights_gbs, 50);
    trace_free(t);
}

static const json_value *ttr_get(const json_value *o, const char *key) {
    const json_value *v = json_get(o, key);
    cr_assert(v, "the trace lacks \"%s\"", key);
    return v;
}
static double ttr_num(const json_value *o, const char *key) {
    double d;
    cr_assert_eq(json_num(ttr_get(o, key), &d), 0, "\"%s\" is not a number", key);
    return d;
}

static json_doc *ttr_parse(const dj_trace *t) {
    dj_buf b = {0};
    cr_assert_eq(trace_json(t, &b), 0, "trace_json ran out of memory");
    dj_err e;
    json_doc *d = json_parse(b.p, b.n, &e);
    cr_assert(d, "the trace is not JSON: %s\n%s", e.msg, b.p);
    buf_free(&b);
    return d;
}

Test(trace, json_fields_and_order) {
    dj_trace *t = ttr_two_steps();
    json_doc *d = ttr_parse(t);
    const json_value *r = json_root(d);
    cr_assert_str_eq(json_str(ttr_get(r, "format")), "djinn-trace");
    cr_assert_eq(ttr_num(r, "version"), 1);
    cr_assert_str_eq(json_str(ttr_get(r, "device")), "GPU \"0\"");
    cr_assert_str_eq(json_str(ttr_get(r, "dtype")), "f16");
    cr_assert_eq(ttr_num(r, "n_layers"), 2);
    cr_assert_eq(ttr_num(r, "cpu_share"), 0.5);
    cr_assert_eq(ttr_num(r, "bytes_per_token"), 1e9);
    cr_assert_eq(ttr_num(r, "cpu_bytes_per_token"), 4e8);
    cr_assert_eq(ttr_num(r, "steps_asked"), 2);
    int complete;
    cr_assert(!json_bool(ttr_get(r, "complete"), &complete) && complete);
    const json_value *res = ttr_get(r, "resident");
    cr_assert(res->type == JSON_ARRAY && res->u.arr.n == 3);
    for (int u = 0; u < 3; u++) {
        double v;
        cr_assert(!json_num(&res->u.arr.items[u], &v) && v == ttr_resident[u], "resident[%d]", u);
    }
    // the steps: the summary's figures
    const json_value *st = ttr_get(r, "steps");
    cr_assert(st->type == JSON_ARRAY && st->u.arr.n == 2);
    for (int k = 0; k < 2; k++) {
        tr_step s;
        trace_summary(t, k, &s);
        const json_value *o = &st->u.arr.items[k];
        cr_assert_eq(ttr_num(o, "step"), k + 1);
        static const char *keys[] = {"t0", "t1", "ms", "copy_gb_s", "copy_busy", "wait_ms", "cpu_busy", "cpu_wait_ms",
                                     "gpu_waits_cpu_ms", "weights_gb_s"};
        const double want[] = {s.t0, s.t1, s.ms, s.copy_gbs, s.copy_busy, s.wait_ms, s.cpu_busy, s.cpu_wait_ms,
                               s.gpu_waits_cpu_ms, s.weights_gbs};
        for (int i = 0; i < 10; i++)
            cr_assert(fabs(ttr_num(o, keys[i]) - want[i]) <= 1e-3, "step %d %s: %g, want %g", k + 1, keys[i],
                      ttr_num(o, keys[i]), want[i]);
        cr_assert_eq(ttr_num(o, "copy_bytes"), (double)s.copy_bytes);
        cr_assert_eq(ttr_num(o, "cpu_bytes"), (double)s.cpu_bytes);
    }
    // the intervals: every one written, by lane (copy, compute, cpu), then by start; each kind with its fields
    const json_value *iv = ttr_get(r, "intervals");
    cr_assert(iv->type == JSON_ARRAY && iv->u.arr.n == 21, "%zu intervals", iv->u.arr.n);
    static const char *lanes[] = {"copy", "compute", "cpu"};
    int lane = 0, n_kind[6] = {0};
    double prev = -1;
    for (size_t i = 0; i < iv->u.arr.n; i++) {
        const json_value *o = &iv->u.arr.items[i];
        const char *ln = json_str(ttr_get(o, "lane")), *kind = json_str(ttr_get(o, "kind"));
        while (lane < 3 && strcmp(ln, lanes[lane])) lane++, prev = -1;
        cr_assert(lane < 3, "interval %zu: lane %s out of order", i, ln);
        double t0 = ttr_num(o, "t0"), t1 = ttr_num(o, "t1");
        cr_assert(t0 >= prev && t1 >= t0, "interval %zu (%s %s) at %g..%g after one at %g", i, ln, kind, t0, t1, prev);
        prev = t0;
        static const char *kinds[] = {"copy", "wait", "unit", "split", "wait_x", "rows"};
        static const int lane_of[] = {0, 1, 1, 1, 2, 2};
        int k = 0;
        while (k < 6 && strcmp(kind, kinds[k])) k++;
        cr_assert(k < 6 && lane_of[k] == lane, "interval %zu: kind %s in lane %s", i, kind, ln);
        n_kind[k]++;
        cr_assert_eq(json_get(o, "mat") != NULL, k >= 3, "interval %zu (%s): mat", i, kind);
        cr_assert_eq(json_get(o, "mid") != NULL, k == 3, "interval %zu (%s): mid", i, kind);
        cr_assert_eq(json_get(o, "bytes") != NULL, k == 0 || k == 5, "interval %zu (%s): bytes", i, kind);
        if (k == 3) cr_assert(ttr_num(o, "mid") == (ttr_num(o, "unit") ? 17 : 12), "interval %zu: mid", i);
        if (k == 0 && ttr_num(o, "t0") == 40) cr_assert_eq(ttr_num(o, "step"), 3, "the next pass's copy");
    }
    static const int want_kind[6] = {5, 4, 6, 2, 2, 2};
    for (int k = 0; k < 6; k++) cr_assert_eq(n_kind[k], want_kind[k], "kind %d: %d intervals", k, n_kind[k]);
    json_free(d);
    trace_free(t);
}

// A run that ended before the steps asked: the file says so.
Test(trace, cut_short) {
    dj_trace *t = ttr_new(3);
    dj_err e;
    cr_assert_eq(trace_window(t, 1, 0, 5, &e), 0, "%s", e.msg);
    json_doc *d = ttr_parse(t);
    int complete = 1;
    cr_assert(!json_bool(ttr_get(json_root(d), "complete"), &complete) && !complete);
    const json_value *st = ttr_get(json_root(d), "steps"), *iv = ttr_get(json_root(d), "intervals");
    cr_assert(st->u.arr.n == 1 && iv->type == JSON_ARRAY && iv->u.arr.n == 0);
    json_free(d);
    trace_free(t);
}

Test(trace, refusals) {
    tr_info in = {"gpu", "f16", 2, ttr_resident, 0, 0, 0};
    dj_err e;
    cr_assert_null(trace_new(&in, 0, &e));
    cr_assert(strstr(e.msg, "--trace-steps 0") && strstr(e.msg, "1 to 64"), "%s", e.msg);
    cr_assert_null(trace_new(&in, TRACE_STEPS_MAX + 1, &e));
    dj_trace *t = ttr_new(2);
    cr_assert_eq(trace_window(t, 2, 0, 1, &e), -1, "a step skipped");
    cr_assert(strstr(e.msg, "internal error"), "%s", e.msg);
    cr_assert_eq(trace_window(t, 1, 0, 1, &e), 0, "%s", e.msg);
    cr_assert_eq(trace_window(t, 2, 1, 2, &e), 0, "%s", e.msg);
    cr_assert_eq(trace_window(t, 3, 2, 3, &e), -1, "a step beyond those asked");
    cr_assert_eq(trace_close(t, &e), 0, "closing a tracer that never opened a file writes nothing");
    trace_free(t);
    trace_free(NULL);
}
