// fuzz_model.c: libFuzzer target for model_parse (model.c). Each input is parsed three ways:
//   1. as a whole model.bin (file_size = n): the parser on arbitrary bytes, header padding included;
//   2. as a compact image, so that small inputs reach every check: input [0, 128) is the header, [128, n) is
//      the file from offset 4096 on (the section table, then section bytes), the padding in between is
//      zero and the file is zero-extended to the size its header states (at most 4 MiB);
//   3. as the loader does: only header + section table in a buffer of exactly that size, against the stated
//      file size; it must reach the same verdict as 2, and fail against any other file size.
// On success every section and every tensor of the layouts must lie inside the file (ASan checks the bytes),
// the tokenizer section goes through tok_load, and re-serialising the header must parse the same.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../model.h"
#include "../../tokenizer.h"
#include "fuzz_common.h"

#define FUZZ_MAX_FILE (4u << 20)

// [off, off+size) inside [0, n).
static void check_span(const uint8_t *data, size_t n, uint64_t off, uint64_t size) {
    uint64_t end;
    FUZZ_CHECK(!dj_add_u64(off, size, &end) && end <= n);
    if (size) fuzz_touch(data + off, 1), fuzz_touch(data + end - 1, 1);
}

static void check_info(const uint8_t *data, size_t n, const dj_model_info *m) {
    const dj_config *c = &m->config;
    const dj_layer_layout *L = &m->layer;
    uint32_t wt = c->wtype;
    FUZZ_CHECK(dj_row_bytes(wt, 1) > 0 && m->file_size == n);
    check_span(data, n, m->tok_off, m->tok_size);
    check_span(data, n, m->embed_off, m->embed_size);
    FUZZ_CHECK(m->embed_size == dj_matrix_bytes(c->embed_type, c->vocab_size, c->dim));
    check_span(data, n, m->head_off, m->head_size);
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t dim = c->dim, hid = c->hidden_dim;
    // Every tensor of the slab, with the shapes model.h gives, in order, aligned, inside the slab.
    const struct { uint64_t off, bytes; } t[] = {
        {L->attn_norm, dim * 4}, {L->ffn_norm, dim * 4}, {L->wq, dj_matrix_bytes(wt, q, dim)},
        {L->wk, dj_matrix_bytes(wt, kv, dim)}, {L->wv, dj_matrix_bytes(wt, kv, dim)},
        {L->wo, dj_matrix_bytes(wt, dim, q)}, {L->w_gate, dj_matrix_bytes(wt, hid, dim)},
        {L->w_up, dj_matrix_bytes(wt, hid, dim)}, {L->w_down, dj_matrix_bytes(wt, dim, hid)},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        FUZZ_CHECK(t[i].off % DJ_TENSOR_ALIGN == 0 && t[i].off + t[i].bytes <= L->size);
        if (i) FUZZ_CHECK(t[i].off >= t[i - 1].off + t[i - 1].bytes);
    }
    FUZZ_CHECK(L->size % DJ_SECTION_ALIGN == 0);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        FUZZ_CHECK(m->layer_off[l] % DJ_SECTION_ALIGN == 0);
        check_span(data, n, m->layer_off[l], L->size);
    }
    FUZZ_CHECK(m->head_size == m->head.size);
    FUZZ_CHECK(c->tied ? m->head.size >= dim * 4
                       : m->head.lm_head + dj_matrix_bytes(c->head_type, c->vocab_size, dim) <= m->head.size);

    dj_err e = {{0}};
    dj_tokenizer *tok = tok_load(data + m->tok_off, m->tok_size, &e);
    if (tok) tok_free(tok);
    else FUZZ_CHECK(e.msg[0] != '\0');

    // Re-serialising the parsed info gives a header that parses to the same offsets.
    uint64_t hb = model_header_bytes(c->n_layers);
    uint8_t *buf = malloc(hb);
    FUZZ_CHECK(buf && model_write_header(m, buf, hb, &e) == 0);
    dj_model_info m2;
    FUZZ_CHECK(model_parse(buf, hb, n, &m2, &e) == 0);
    FUZZ_CHECK(m2.tok_off == m->tok_off && m2.embed_off == m->embed_off && m2.head_off == m->head_off);
    for (uint32_t l = 0; l < c->n_layers; l++) FUZZ_CHECK(m2.layer_off[l] == m->layer_off[l]);
    dj_info_free(&m2);
    free(buf);
}

// Parses data[0, n) as a file of file_size bytes; checks the result when the buffer is the whole file.
static int parse(const uint8_t *data, size_t n, uint64_t file_size) {
    dj_model_info m;
    dj_err e = {{0}};
    if (model_parse(data, n, file_size, &m, &e)) {
        FUZZ_CHECK(e.msg[0] != '\0');  // every failure says why
        return -1;
    }
    if (n == file_size) check_info(data, n, &m);
    dj_info_free(&m);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    parse(data, n, n);  // 1

    if (n < sizeof(dj_disk_header)) return 0;
    dj_disk_header h;
    memcpy(&h, data, sizeof h);
    uint64_t body = n - sizeof h, min = DJ_HEADER_SIZE + body;  // the compact image's own bytes
    if (h.file_size < min || h.file_size > FUZZ_MAX_FILE) return 0;
    uint8_t *file = calloc(1, h.file_size);
    FUZZ_CHECK(file);
    memcpy(file, data, sizeof h);
    memcpy(file + DJ_HEADER_SIZE, data + sizeof h, body);
    int rc = parse(file, h.file_size, h.file_size);  // 2

    uint64_t pre = DJ_HEADER_SIZE + (uint64_t)h.n_sections * sizeof(dj_disk_section);
    if (pre <= h.file_size) {
        uint8_t *p = malloc(pre);  // exactly header + table, so that ASan catches any read past it
        FUZZ_CHECK(p);
        memcpy(p, file, pre);
        FUZZ_CHECK(parse(p, pre, h.file_size) == rc);  // 3
        FUZZ_CHECK(parse(p, pre, h.file_size + 1) == -1);  // a file longer than its header says is refused
        free(p);
    }
    free(file);
    return 0;
}
