// test_safetensors.c: the safetensors parser on files built in memory (valid, corrupt, truncated,
// mutated) and on the real stories260K checkpoint. Each file is an exact-size heap buffer so that ASan
// catches any read past its end.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../convert/safetensors.h"
#include "common.h"

// ---- helpers
typedef struct {
    uint8_t *bytes;
    size_t n;
} tst_buf;

// 8-byte little-endian header length `hlen`, then `header`, then `data_size` bytes with data[i] = i.
static tst_buf tst_build_len(const char *header, uint64_t hlen, size_t data_size) {
    size_t hl = strlen(header);
    tst_buf b = {malloc(8 + hl + data_size), 8 + hl + data_size};
    cr_assert_not_null(b.bytes);
    for (int i = 0; i < 8; i++) b.bytes[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b.bytes + 8, header, hl);
    for (size_t i = 0; i < data_size; i++) b.bytes[8 + hl + i] = (uint8_t)i;
    return b;
}

static tst_buf tst_build(const char *header, size_t data_size) {
    return tst_build_len(header, strlen(header), data_size);
}

// Parses and expects failure with every `want` substring (NULL-terminated list) in the message.
static void tst_fails(tst_buf b, const char *want1, const char *want2) {
    st_file f;
    dj_err e = {{0}};
    int rc = st_parse(b.bytes, b.n, &f, &e);
    if (rc == 0) st_free(&f);
    cr_assert_eq(rc, -1, "should fail: %.*s", (int)(b.n > 8 ? b.n - 8 : 0), (const char *)b.bytes + 8);
    cr_assert(strncmp(e.msg, "safetensors: ", 13) == 0, "message '%s'", e.msg);
    if (want1) cr_assert(strstr(e.msg, want1) != NULL, "message '%s' lacks '%s'", e.msg, want1);
    if (want2) cr_assert(strstr(e.msg, want2) != NULL, "message '%s' lacks '%s'", e.msg, want2);
    cr_assert_null(f.tensors, "no table on failure");
    free(b.bytes);
}

// A header whose only tensor "w" has the given fields, with `data_size` bytes of data.
static void tst_one_fails(const char *fields, size_t data_size, const char *want) {
    char header[1024];
    snprintf(header, sizeof header, "{\"w\": {%s}}", fields);
    tst_fails(tst_build(header, data_size), "tensor 'w'", want);
}

// Three tensors of different dtypes given out of name order, metadata, and a hole-free 40-byte data area.
static const char *TST_VALID =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"layer.b\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [24, 32]},"
    " \"layer.a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
    " \"layer.c\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [32, 40]}}   ";

// ---- valid files
Test(safetensors, valid_three_dtypes) {
    tst_buf b = tst_build(TST_VALID, 40);
    size_t hl = strlen(TST_VALID);
    // real values for checking that data points at the right bytes
    float fa[6] = {1, -2, 3.5f, 0, 1e-3f, 65504};
    memcpy(b.bytes + 8 + hl, fa, sizeof fa);
    uint16_t hb[4] = {dj_f32_to_f16(1.0f), dj_f32_to_f16(-0.5f), dj_f32_to_f16(2.0f), dj_f32_to_f16(1024.0f)};
    memcpy(b.bytes + 8 + hl + 24, hb, sizeof hb);
    uint16_t hc[4] = {dj_f32_to_bf16(3.0f), dj_f32_to_bf16(-7.0f), dj_f32_to_bf16(0.25f), dj_f32_to_bf16(1e10f)};
    memcpy(b.bytes + 8 + hl + 32, hc, sizeof hc);

    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(f.n, 3);
    cr_assert_str_eq(f.tensors[0].name, "layer.a");
    cr_assert_str_eq(f.tensors[1].name, "layer.b");
    cr_assert_str_eq(f.tensors[2].name, "layer.c");

    const st_tensor *a = st_find(&f, "layer.a");
    cr_assert_not_null(a);
    cr_assert_eq(a->dtype, ST_F32);
    cr_assert_eq(a->ndim, 2);
    cr_assert_eq(a->shape[0], 2);
    cr_assert_eq(a->shape[1], 3);
    cr_assert_eq(a->nbytes, 24);
    cr_assert_eq(a->data, b.bytes + 8 + hl);
    float ga[6];
    memcpy(ga, a->data, sizeof ga);
    cr_assert_eq(memcmp(ga, fa, sizeof fa), 0);

    const st_tensor *t = st_find(&f, "layer.b");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, ST_F16);
    cr_assert_eq(t->ndim, 1);
    cr_assert_eq(t->shape[0], 4);
    cr_assert_eq(t->nbytes, 8);
    uint16_t h;
    memcpy(&h, t->data + 2, 2);
    cr_assert_eq(dj_f16_to_f32(h), -0.5f);

    t = st_find(&f, "layer.c");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, ST_BF16);
    cr_assert_eq(t->nbytes, 8);
    memcpy(&h, t->data + 2, 2);
    cr_assert_eq(dj_bf16_to_f32(h), -7.0f);

    cr_assert_null(st_find(&f, "layer"));
    cr_assert_null(st_find(&f, "layer.d"));
    cr_assert_null(st_find(&f, "a"));
    cr_assert_null(st_find(&f, "zzz"));
    cr_assert_null(st_find(&f, "__metadata__"));
    cr_assert_null(st_find(&f, ""));
    st_free(&f);
    cr_assert_null(f.tensors);
    free(b.bytes);
}

Test(safetensors, find_many) {
    // 100 tensors in reverse name order, each 4 bytes
    char *header = malloc(100 * 100 + 16);
    cr_assert_not_null(header);
    size_t at = 0;
    at += (size_t)sprintf(header + at, "{");
    for (int i = 99; i >= 0; i--)
        at += (size_t)sprintf(header + at, "%s\"t%03d\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [%d, %d]}",
                              i == 99 ? "" : ",", i, 4 * i, 4 * i + 4);
    sprintf(header + at, "}");
    tst_buf b = tst_build(header, 400);
    free(header);
    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(f.n, 100);
    for (int i = 0; i < 100; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%03d", i);
        const st_tensor *t = st_find(&f, name);
        cr_assert_not_null(t, "%s", name);
        cr_assert_str_eq(t->name, name);
        cr_assert_eq(t->ndim, 0, "a scalar");
        cr_assert_eq(t->nbytes, 4);
        cr_assert_eq(t->data[0], (uint8_t)(4 * i));
        cr_assert_eq(&f.tensors[i], t, "sorted by name");
    }
    cr_assert_null(st_find(&f, "t100"));
    cr_assert_null(st_find(&f, "t"));
    st_free(&f);
    free(b.bytes);
}

Test(safetensors, empty_and_zero_size) {
    st_file f;
    dj_err e;
    tst_buf b = tst_build("{}", 0);
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(f.n, 0);
    cr_assert_null(st_find(&f, "x"));
    st_free(&f);
    free(b.bytes);

    // a zero-element tensor owns no bytes, so it may sit anywhere in the data, even at its end
    b = tst_build("{\"z\": {\"dtype\": \"F32\", \"shape\": [3, 0], \"data_offsets\": [2, 2]},"
                  " \"e\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [4, 4]},"
                  " \"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4);
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(f.n, 3);
    cr_assert_eq(st_find(&f, "z")->nbytes, 0);
    cr_assert_eq(st_find(&f, "z")->shape[1], 0);
    st_free(&f);
    free(b.bytes);

    // extra data after the last tensor and unknown fields in an entry are tolerated
    b = tst_build("{\"x\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2], \"extra\": [1]}}", 10);
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    st_free(&f);
    free(b.bytes);
}

Test(safetensors, every_dtype) {
    const char *names[] = {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
                           "F8_E4M3", "F8_E5M2"};
    const size_t sizes[] = {1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 1, 1};
    cr_assert_eq(sizeof names / sizeof names[0], ST_DTYPE_COUNT);
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        cr_assert_str_eq(st_dtype_name((st_dtype)i), names[i]);
        cr_assert_eq(st_dtype_size((st_dtype)i), sizes[i]);
        char header[256];
        snprintf(header, sizeof header, "{\"t\": {\"dtype\": \"%s\", \"shape\": [3], \"data_offsets\": [0, %zu]}}",
                 names[i], 3 * sizes[i]);
        tst_buf b = tst_build(header, 3 * sizes[i]);
        st_file f;
        dj_err e;
        cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s: %s", names[i], e.msg);
        cr_assert_eq(f.tensors[0].dtype, (st_dtype)i);
        cr_assert_eq(f.tensors[0].nbytes, 3 * sizes[i]);
        st_free(&f);
        free(b.bytes);
    }
}

// ---- corrupt files
Test(safetensors, header_length) {
    tst_fails(tst_build_len("{}", 3, 0), "header length 3", "exceeds");                  // 1 byte past the file
    tst_fails(tst_build_len("{}", 1000, 0), "exceeds", NULL);
    tst_fails(tst_build_len("{}", (uint64_t)1 << 63, 0), "100 MB", NULL);
    tst_fails(tst_build_len("{}", UINT64_MAX, 0), "100 MB", NULL);
    tst_fails(tst_build_len("{}", 100000001, 0), "100 MB", NULL);
    tst_fails(tst_build_len("{}", 0, 2), "json: line 1", NULL);  // empty header
    for (size_t n = 0; n < 8; n++) {  // too short for the length itself
        tst_buf b = tst_build("", 0);
        b.bytes = realloc(b.bytes, n ? n : 1);
        b.n = n;
        tst_fails(b, "too short", NULL);
    }
}

Test(safetensors, header_not_object) {
    tst_fails(tst_build("[1, 2]", 0), "header must be a JSON object", "array");
    tst_fails(tst_build("\"x\"", 0), "header must be a JSON object", NULL);
    tst_fails(tst_build("null", 0), "header must be a JSON object", NULL);
    tst_fails(tst_build("{\"a\": 1", 0), "header: json: line 1", NULL);
    tst_fails(tst_build("{\"a\": 1} x", 0), "header: json: line 1", NULL);
    tst_fails(tst_build("{\"w\": 5}", 0), "tensor 'w'", "object");
    tst_fails(tst_build("{\"w\": [0, 4]}", 4), "tensor 'w'", "object");
}

Test(safetensors, metadata) {
    tst_fails(tst_build("{\"__metadata__\": {\"format\": 1}}", 0), "__metadata__", "string");
    tst_fails(tst_build("{\"__metadata__\": [\"pt\"]}", 0), "__metadata__", "object");
    tst_fails(tst_build("{\"__metadata__\": \"pt\"}", 0), "__metadata__", NULL);
    // a metadata map may be empty
    tst_buf b = tst_build("{\"__metadata__\": {}, \"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1);
    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(f.n, 1);
    st_free(&f);
    free(b.bytes);
}

Test(safetensors, bad_entries) {
    tst_one_fails("\"dtype\": \"F7\", \"shape\": [1], \"data_offsets\": [0, 4]", 4, "unknown dtype \"F7\"");
    tst_one_fails("\"dtype\": \"f32\", \"shape\": [1], \"data_offsets\": [0, 4]", 4, "unknown dtype");
    tst_one_fails("\"dtype\": \"\", \"shape\": [1], \"data_offsets\": [0, 4]", 4, "unknown dtype");
    tst_one_fails("\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]", 4, "dtype");
    tst_one_fails("\"shape\": [1], \"data_offsets\": [0, 4]", 4, "missing \"dtype\"");
    tst_one_fails("\"dtype\": \"F32\", \"data_offsets\": [0, 4]", 4, "missing \"shape\"");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1]", 4, "missing \"data_offsets\"");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]", 4, "shape");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]", 4, "shape[0]");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1, 1.5], \"data_offsets\": [0, 4]", 4, "shape[1]");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1e0], \"data_offsets\": [0, 4]", 4, "shape[0]");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]", 4, "shape[0]");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1, 1, 1, 1, 1], \"data_offsets\": [0, 4]", 4, "dimensions");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 16], \"data_offsets\": [0, 4]", 4, "overflow");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [9223372036854775807, 3], \"data_offsets\": [0, 4]", 4, "overflow");
    tst_one_fails("\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 4]", 4, "overflow");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]", 4, "data_offsets");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]", 8, "data_offsets");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"0\": 4}", 4, "data_offsets");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]", 4, "data_offsets");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0.0, 4]", 4, "data_offsets");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 0]", 4, "begin 4 > end 0");
}

Test(safetensors, size_mismatch) {
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]", 8, "span 4 bytes");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 12]", 12, "need 8");
    tst_one_fails("\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]", 24, "need 12");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 4]", 4, "need 0");
}

Test(safetensors, offsets_outside_data) {
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 7, "past the 7 bytes");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]", 8, "past");
    tst_one_fails("\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [9, 9]", 8, "past");
    tst_one_fails("\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [9223372036854775806, 9223372036854775807]", 8,
                  "past");
    tst_one_fails("\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [9223372036854775808, 9223372036854775808]", 8,
                  "data_offsets");
    tst_one_fails("\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [18446744073709551615, 0]", 8, "data_offsets");
}

Test(safetensors, overlaps) {
    tst_fails(tst_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12),
              "overlaps", "'a'");
    // the same range twice
    tst_fails(tst_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                        " \"b\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]}}", 8),
              "overlaps", NULL);
    // one inside another, listed first and with a later name
    tst_fails(tst_build("{\"z\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                        " \"a\": {\"dtype\": \"U8\", \"shape\": [16], \"data_offsets\": [0, 16]},"
                        " \"m\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [16, 20]}}", 20),
              "tensor 'z'", "overlaps tensor 'a'");
    // adjacent ranges are fine
    tst_buf b = tst_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]},"
                          " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 16);
    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    st_free(&f);
    free(b.bytes);
}

Test(safetensors, duplicates) {
    // the same name twice is refused even when the entries are identical or disjoint
    tst_fails(tst_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                        " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8),
              "tensor 'a'", "twice");
    tst_fails(tst_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                        " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
                        " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8),
              "tensor 'a'", "twice");
    // names that differ only after an escaped NUL cannot be told apart by C strings: refused
    tst_fails(tst_build("{\"a\\u0000x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1), "NUL",
              NULL);
    // a field given twice in one entry is ambiguous (which one counts?): refused, whichever it is
    tst_one_fails("\"dtype\": \"F32\", \"dtype\": \"F16\", \"shape\": [1], \"data_offsets\": [0, 4]", 4,
                  "\"dtype\" appears twice");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [2], \"shape\": [1], \"data_offsets\": [0, 4]", 4,
                  "\"shape\" appears twice");
    tst_one_fails("\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8], \"data_offsets\": [0, 4]", 8,
                  "\"data_offsets\" appears twice");
    // "__metadata__" spelled differently is an ordinary (bad) tensor entry
    tst_fails(tst_build("{\"__metadata_\": {\"format\": \"pt\"}}", 0), "tensor '__metadata_'", "dtype");
}

Test(safetensors, every_truncation_fails) {
    tst_buf good = tst_build(TST_VALID, 40);
    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(good.bytes, good.n, &f, &e), 0, "%s", e.msg);
    st_free(&f);
    for (size_t k = 0; k < good.n; k++) {
        uint8_t *cut = malloc(k ? k : 1);
        cr_assert_not_null(cut);
        memcpy(cut, good.bytes, k);
        tst_fails((tst_buf){cut, k}, NULL, NULL);
    }
    free(good.bytes);
}

Test(safetensors, mutations_never_crash) {
    // random byte edits of a valid file: each result is a consistent table or a clean error
    tst_buf good = tst_build(TST_VALID, 40);
    uint8_t *buf = malloc(good.n);
    cr_assert_not_null(buf);
    const char alphabet[] = "{}[]:,\"\\0123456789-.eE FBU_x\x80\xff\x00";
    uint32_t rng = 777;
    int parsed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, good.bytes, good.n);
        int edits = 1 + iter % 3;
        for (int k = 0; k < edits; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = (rng >> 8) % good.n;
            rng = rng * 1664525u + 1013904223u;
            if (at < 8 && iter % 2) buf[at] = (uint8_t)(rng >> 24);  // the length field too
            else buf[at] = (uint8_t)alphabet[(rng >> 8) % (sizeof alphabet - 1)];
        }
        st_file f;
        dj_err e = {{0}};
        if (st_parse(buf, good.n, &f, &e) == 0) {
            parsed++;
            for (size_t i = 0; i < f.n; i++) {
                const st_tensor *t = &f.tensors[i];
                cr_assert(t->data >= buf + 8 && t->data + t->nbytes <= buf + good.n, "tensor inside the file");
                cr_assert_eq(st_find(&f, t->name), t);
                if (i) cr_assert_lt(strcmp(f.tensors[i - 1].name, t->name), 0);
            }
            st_free(&f);
        } else {
            cr_assert(strncmp(e.msg, "safetensors: ", 13) == 0, "message '%s'", e.msg);
        }
    }
    free(buf);
    free(good.bytes);
    cr_assert_gt(parsed, 0, "some edits (e.g. padding) keep the file valid");
}

// ---- the real checkpoint
Test(safetensors, real_stories260k) {
    char path[4096];
    tc_data_path(path, sizeof path, "models/stories260K/model.safetensors");
    size_t len;
    uint8_t *bytes = (uint8_t *)tc_must_read(path, &len);
    cr_assert_gt(len, 8);

    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(bytes, (size_t)len, &f, &e), 0, "%s", e.msg);
    cr_assert_eq(f.n, 2 + 5 * 9, "embeddings, final norm and 9 tensors per layer (tied lm_head)");
    const st_tensor *t = st_find(&f, "model.embed_tokens.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->dtype, ST_F32);
    cr_assert_eq(t->ndim, 2);
    cr_assert_eq(t->shape[0], 512);
    cr_assert_eq(t->shape[1], 64);
    cr_assert_eq(t->nbytes, 512 * 64 * 4);
    t = st_find(&f, "model.layers.4.self_attn.k_proj.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->shape[0], 32, "4 KV heads of 8");
    cr_assert_eq(t->shape[1], 64);
    t = st_find(&f, "model.layers.0.mlp.down_proj.weight");
    cr_assert_eq(t->shape[0], 64);
    cr_assert_eq(t->shape[1], 172);
    t = st_find(&f, "model.norm.weight");
    cr_assert_not_null(t);
    cr_assert_eq(t->ndim, 1);
    cr_assert_eq(t->shape[0], 64);
    uint64_t total = 0;
    for (size_t i = 0; i < f.n; i++) {
        cr_assert_eq(f.tensors[i].dtype, ST_F32, "%s", f.tensors[i].name);
        total += f.tensors[i].nbytes;
        float x;
        for (uint64_t k = 0; k < f.tensors[i].nbytes / 4; k++) {
            memcpy(&x, f.tensors[i].data + 4 * k, 4);  // data need not be 4-aligned in the file
            cr_assert(isfinite(x), "%s[%llu] is not finite", f.tensors[i].name, (unsigned long long)k);
        }
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
    cr_assert_eq(total, (uint64_t)len - 8 - hlen, "the tensors cover the whole data area");
    cr_assert_null(st_find(&f, "lm_head.weight"));
    st_free(&f);
    free(bytes);
}

// Parses b and expects success.
static void tst_parses(tst_buf b) {
    st_file f;
    dj_err e;
    cr_assert_eq(st_parse(b.bytes, b.n, &f, &e), 0, "%s", e.msg);
    st_free(&f);
    free(b.bytes);
}

// Ranges that share exactly one byte overlap; ranges that touch do not.
Test(safetensors, overlap_of_one_byte) {
    tst_fails(tst_build("{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
                        " \"b\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [7, 15]}}", 15),
              "tensor 'b'", "overlaps tensor 'a'");
    tst_parses(tst_build("{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
                         " \"b\": {\"dtype\": \"U8\", \"shape\": [7], \"data_offsets\": [8, 15]}}", 15));
}
