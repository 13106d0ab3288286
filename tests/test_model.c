// test_model.c: the model.bin format: layout, header round trip, and model_parse on damaged input.
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "../gpu_host.h"
#include "../loader.h"
#include "../model.h"

// A small GQA config with untied head.
static dj_config small_config(void) {
    dj_config c = {.dim = 64, .n_layers = 3, .n_heads = 8, .n_kv_heads = 4, .head_dim = 8, .hidden_dim = 172,
                   .vocab_size = 512, .max_seq_len = 256, .tied = 0, .norm_eps = 1e-5f,
                   .rope_theta = 10000.f, .rope_type = DJ_ROPE_DEFAULT};
    dj_config_set_wtype(&c, DJ_F16);
    return c;
}

// A whole file image: header written by the real writer, sections filled with a byte pattern.
static uint8_t *make_image(const dj_config *c, uint64_t tok_size, dj_model_info *info) {
    dj_err e;
    cr_assert_eq(model_plan(c, tok_size, info, &e), 0, "%s", e.msg);
    uint8_t *img = malloc(info->file_size);
    cr_assert(img);
    for (uint64_t i = 0; i < info->file_size; i++) img[i] = (uint8_t)(i * 131 + 7);
    uint64_t hb = model_header_bytes(c->n_layers);
    cr_assert_eq(model_write_header(info, img, hb, &e), 0, "%s", e.msg);
    return img;
}

// Writes a small model image (make_image) to a fresh temp file named in path (a mkstemp template).
static uint8_t *write_image(const dj_config *c, char *path, dj_model_info *plan) {
    uint8_t *img = make_image(c, 100, plan);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, img, plan->file_size), (ssize_t)plan->file_size);
    close(fd);
    return img;
}

// Recomputes the header CRC after a deliberate edit, so that the structural checks are what is tested.
// The tables' length is clamped to the image's real tables (edits of n_sections fail before the CRC).
static void fix_crc(uint8_t *img, uint32_t real_sections) {
    dj_disk_header h;
    memcpy(&h, img, sizeof h);
    h.crc = 0;
    memcpy(img, &h, sizeof h);
    uint32_t crc = dj_crc32(0, img, DJ_HEADER_SIZE);
    uint32_t ns = h.n_sections < real_sections ? h.n_sections : real_sections;
    uint32_t nt = h.n_tensors < DJ_N_TENSOR_KINDS ? h.n_tensors : DJ_N_TENSOR_KINDS;
    crc = dj_crc32(crc, img + DJ_HEADER_SIZE, (size_t)ns * sizeof(dj_disk_section) + nt * sizeof(dj_disk_tensor));
    h.crc = crc;
    memcpy(img, &h, sizeof h);
}

static dj_disk_section *section(uint8_t *img, uint32_t i) {
    return (dj_disk_section *)(img + DJ_HEADER_SIZE) + i;
}

static dj_disk_tensor *tensor(uint8_t *img, uint32_t n_sections, uint32_t i) {
    return (dj_disk_tensor *)(img + DJ_HEADER_SIZE + n_sections * sizeof(dj_disk_section)) + i;
}

static void expect_parse_error(const uint8_t *img, size_t n, uint64_t file_size, const char *needle) {
    dj_model_info m;
    dj_err e = {{0}};
    int rc = model_parse(img, n, file_size, &m, &e);
    cr_assert_eq(rc, -1, "parse accepted a damaged file (expected error containing '%s')", needle);
    cr_assert(strlen(e.msg) > 0 && !strchr(e.msg, '\n'), "error must be one non-empty line: '%s'", e.msg);
    if (needle) cr_assert(strstr(e.msg, needle), "error '%s' should mention '%s'", e.msg, needle);
}

Test(model_format, layout_alignment_and_fusion) {
    dj_config c = small_config();
    dj_layer_layout L;
    dj_head_layout H;
    dj_err e;
    cr_assert_eq(dj_layout(&c, &L, &H, &e), 0, "%s", e.msg);
    uint64_t offs[] = {L.attn_norm, L.ffn_norm, L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down};
    for (int i = 0; i < 9; i++) cr_assert_eq(offs[i] % DJ_TENSOR_ALIGN, 0);
    for (int i = 1; i < 9; i++) cr_assert_gt(offs[i], offs[i - 1]);
    cr_assert_eq(L.size % DJ_SECTION_ALIGN, 0);
    cr_assert_geq(L.size, L.w_down + (uint64_t)c.dim * c.hidden_dim * 2);
    // 64*64*2 bytes is a multiple of 256: q, k, v are one fused matrix
    cr_assert_eq(L.wk, L.wq + 64ull * 64 * 2);
    cr_assert_eq(L.wv, L.wk + 32ull * 64 * 2);
    cr_assert_eq(H.lm_head % DJ_TENSOR_ALIGN, 0);
    cr_assert_geq(H.size, H.lm_head + 512ull * 64 * 2);
    c.tied = 1;
    cr_assert_eq(dj_layout(&c, &L, &H, &e), 0);
    cr_assert_eq(H.size, DJ_SECTION_ALIGN);
}

Test(model_format, config_limits) {
    dj_err e;
    dj_config c = small_config();
    cr_assert_eq(dj_config_validate(&c, &e), 0, "%s", e.msg);
    dj_config bad[12];
    for (int i = 0; i < 12; i++) bad[i] = c;
    bad[0].dim = 0;
    bad[1].n_kv_heads = 3;          // does not divide 8
    bad[2].head_dim = 7;            // odd
    bad[3].n_layers = 0;
    bad[4].vocab_size = 1u << 30;
    bad[5].wtype = 9;
    bad[6].norm_eps = 0;
    bad[7].rope_type = 5;
    bad[8].rope_type = DJ_ROPE_LLAMA3;  // without its parameters
    bad[9].tied = 2;
    bad[10].hidden_dim = 0;
    bad[11].n_kv_heads = 16;        // more kv heads than heads
    for (int i = 0; i < 12; i++) {
        e.msg[0] = 0;
        cr_assert_eq(dj_config_validate(&bad[i], &e), -1, "bad config %d accepted", i);
        cr_assert(e.msg[0], "bad config %d: no message", i);
    }
}

Test(model_format, header_round_trip) {
    dj_config c = small_config();
    c.rope_type = DJ_ROPE_LLAMA3, c.rope_factor = 8, c.rope_low_freq = 1, c.rope_high_freq = 4, c.rope_orig_max = 64;
    dj_model_info plan, got;
    uint8_t *img = make_image(&c, 5000, &plan);
    dj_err e;
    cr_assert_eq(model_parse(img, plan.file_size, plan.file_size, &got, &e), 0, "%s", e.msg);
    cr_assert_eq(memcmp(&got.config, &c, sizeof c), 0);
    cr_assert_eq(got.tok_off, plan.tok_off);
    cr_assert_eq(got.tok_size, 5000);
    cr_assert_eq(got.embed_off, plan.embed_off);
    cr_assert_eq(got.head_off, plan.head_off);
    for (uint32_t l = 0; l < c.n_layers; l++) {
        cr_assert_eq(got.layer_off[l], plan.layer_off[l]);
        cr_assert_eq(got.layer_off[l] % DJ_SECTION_ALIGN, 0);
    }
    dj_info_free(&got);
    // Only the header and the table need to be in memory.
    cr_assert_eq(model_parse(img, model_header_bytes(c.n_layers), plan.file_size, &got, &e), 0, "%s", e.msg);
    dj_info_free(&got);
    dj_info_free(&plan);
    free(img);
}

Test(model_format, truncated_at_many_cut_points) {
    dj_config c = small_config();
    dj_model_info plan;
    uint8_t *img = make_image(&c, 100, &plan);
    uint64_t size = plan.file_size;
    for (uint64_t cut = 0; cut < size; cut += (cut < 8192 ? 61 : 4093)) {
        // The file is shorter than its header says, whatever part of it is in memory.
        expect_parse_error(img, (size_t)(cut < model_header_bytes(3) ? cut : model_header_bytes(3)), cut, NULL);
    }
    expect_parse_error(img, (size_t)size - 1, size - 1, "truncated");
    dj_info_free(&plan);
    free(img);
}

Test(model_format, every_flipped_header_byte_is_caught) {
    dj_config c = small_config();
    dj_model_info plan;
    uint8_t *img = make_image(&c, 100, &plan);
    size_t hb = DJ_HEADER_SIZE + (c.n_layers + 3) * sizeof(dj_disk_section);
    for (size_t i = 0; i < hb; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            img[i] ^= (uint8_t)(1u << bit);
            expect_parse_error(img, plan.file_size, plan.file_size, NULL);
            img[i] ^= (uint8_t)(1u << bit);
        }
    }
    dj_info_free(&plan);
    free(img);
}

Test(model_format, structural_errors_with_valid_crc) {
    dj_config c = small_config();
    dj_model_info plan;
    uint8_t *img = make_image(&c, 100, &plan);
    uint64_t size = plan.file_size;
    uint8_t *copy = malloc(size);

#define CASE(edit, needle)                                  \
    do {                                                    \
        memcpy(copy, img, size);                            \
        {                                                   \
            uint8_t *im = copy;                             \
            dj_disk_header h;                               \
            memcpy(&h, im, sizeof h);                       \
            edit;                                           \
            memcpy(im, &h, sizeof h);                       \
            (void)section, (void)tensor;                    \
            fix_crc(im, c.n_layers + 3);                     \
        }                                                   \
        expect_parse_error(copy, size, size, needle);       \
    } while (0)

    CASE(memcpy(h.magic, "NOTDJINN", 8), "magic");
    CASE(h.version = DJ_VERSION + 1, "newer than this build reads");
    CASE(h.version = 0, "version 0");
    CASE(h.header_size = 8192, "header size");
    CASE(h.config.dim = 1u << 30, "dim");
    CASE(h.config.n_layers = 100000, "n_layers");
    CASE(h.config.n_heads = 7, "n_kv_heads");
    CASE(h.config.vocab_size = 513, "embedding");       // section sizes no longer match the config
    CASE(h.config.hidden_dim = 100, "layer");
    CASE(h.config.tied = 1, "entries in the tensor table");                     // no lm_head entry then
    CASE(h.n_sections = 2, "sections");
    CASE(h.n_sections = 0xffffffffu, "sections");
    CASE(section(im, 3)->offset = size, "outside the file");                        // offset past the end
    CASE(section(im, 3)->offset = 0xfffffffffffff000ull, "outside the file");       // offset + size overflows
    CASE(section(im, 3)->offset += 1, "misaligned");
    CASE(section(im, 3)->offset = section(im, 2)->offset, "overlaps");              // two layers on one slab
    CASE(section(im, 0)->offset = 0, "outside");                                    // over the header
    CASE(section(im, 3)->index = 0, "duplicate");
    CASE(section(im, 3)->index = 77, "index");
    CASE(section(im, 3)->kind = 9, "unknown kind");
    CASE(section(im, 0)->size = 0, "empty");
    CASE(section(im, 1)->size += 4096, "bytes");
    CASE(im[200] = 1, "padding");
    CASE(h.pad[11] = 1, "padding");                                                  // inside the 128-byte struct
    CASE(h.config.reserved = 7, "reserved config word");
    CASE(h.config.embed_type = DJ_F32, "embeddings in f32 beside f16 layers");
    CASE(h.n_tensors = 3, "entries in the tensor table");
    CASE(tensor(im, c.n_layers + 3, 6)->rows += 1, "tensor table: w_gate");             // a shape
    CASE(tensor(im, c.n_layers + 3, 2)->offset += 256, "tensor table: wq");              // an offset
    CASE(tensor(im, c.n_layers + 3, 9)->dtype = DJ_BF16, "tensor table: embeddings");   // a dtype
    CASE(tensor(im, c.n_layers + 3, 0)->kind = DJ_T_LM_HEAD, "entry 0 is 'lm_head'");
    CASE(h.config.rope_factor = 8, "llama3 rope fields");                           // ignored under default RoPE
    CASE(h.config.rope_orig_max = 64, "llama3 rope fields");
    CASE(section(im, 3)->reserved = 1, "reserved field");
    CASE(section(im, 0)->index = 5, "expected 0");                                  // tokenizer section
#undef CASE
    free(copy);
    dj_info_free(&plan);
    free(img);
}

Test(model_format, load_errors) {
    dj_model m;
    dj_load_opts o = {.quiet = 1};
    dj_err e;
    cr_assert_eq(model_load("/nonexistent/model.bin", &o, &m, &e), -1);
    cr_assert(strstr(e.msg, "cannot open"), "%s", e.msg);
    cr_assert_eq(model_load("/tmp", &o, &m, &e), -1);
    cr_assert(strstr(e.msg, "regular file"), "%s", e.msg);

    // A real file, then the same file truncated.
    dj_config c = small_config();
    dj_model_info plan;
    char path[] = "/tmp/djinn_test_model_XXXXXX";
    uint8_t *img = write_image(&c, path, &plan);
    cr_assert_eq(model_load(path, &o, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(memcmp(m.data, img, plan.file_size), 0);
    cr_assert_eq(dj_layer_ptr(&m, 1), m.data + plan.layer_off[1]);
    cr_assert_eq(dj_lm_head_ptr(&m), m.data + plan.head_off + plan.head.lm_head);
    model_free(&m);
    cr_assert_eq(truncate(path, (off_t)plan.file_size - 4096), 0);
    cr_assert_eq(model_load(path, &o, &m, &e), -1);
    cr_assert(strstr(e.msg, "truncated"), "%s", e.msg);
    cr_assert(strstr(e.msg, path), "error should name the file: %s", e.msg);
    unlink(path);
    dj_info_free(&plan);
    free(img);
}

// A load after Ctrl-C (loader.h's dj_load_cancel) fails with "interrupted", holding nothing (the model zeroed; under
// ASan a leak of its memory fails the test); the flag cleared, the same file loads.
Test(model_format, cancelled_load_fails_and_frees) {
    dj_config c = small_config();
    dj_model_info plan;
    char path[] = "/tmp/djinn_test_model_XXXXXX";
    uint8_t *img = write_image(&c, path, &plan);
    dj_model m;
    dj_load_opts o = {.quiet = 1};
    dj_err e;
    dj_load_cancel = 1;
    cr_assert_eq(model_load(path, &o, &m, &e), -1, "a load after Ctrl-C went through");
    cr_assert(strstr(e.msg, ": interrupted") && !m.data && !m.info.layer_off, "%s", e.msg);
    dj_load_cancel = 0;
    cr_assert_eq(model_load(path, &o, &m, &e), 0, "%s", e.msg);
    model_free(&m);
    unlink(path);
    dj_info_free(&plan);
    free(img);
}

// llama.cpp's GGUF files are named as such, whatever their length, with the way to a Djinn model; a near miss of the
// magic is a plain bad magic.
Test(model_format, gguf_is_recognised) {
    uint8_t img[DJ_HEADER_SIZE + 64] = "GGUF\3\0\0\0";
    for (size_t n = 4; n <= sizeof img; n += sizeof img - 4)
        expect_parse_error(img, n, n, "a GGUF file (llama.cpp's format), which Djinn does not read: convert the "
                                      "Hugging Face checkpoint with ./convert/convert instead");
    img[3] = 'X';
    expect_parse_error(img, sizeof img, sizeof img, "not a Djinn model (bad magic)");
}

// ---- dtype conversions
Test(dtype, f16_round_trip_all_values) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dj_f16_to_f32((uint16_t)h);
        if (f != f) {
            cr_assert_eq(dj_f32_to_f16(f) & 0x7c00, 0x7c00);
            continue;
        }
        cr_assert_eq(dj_f32_to_f16(f), h, "f16 0x%04x -> %g -> 0x%04x", h, f, dj_f32_to_f16(f));
    }
}

Test(dtype, f16_rounds_to_nearest_even) {
    // Midpoints between neighbouring f16 values round to the even one; just above rounds up.
    for (uint32_t h = 0; h < 0x7bff; h += 37) {
        float a = dj_f16_to_f32((uint16_t)h), b = dj_f16_to_f32((uint16_t)(h + 1));
        double mid = ((double)a + (double)b) / 2;
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        cr_assert_eq(dj_f32_to_f16((float)mid), even, "midpoint of 0x%04x", h);
        cr_assert_eq(dj_f32_to_f16(nextafterf((float)mid, 1e9f)), h + 1, "above midpoint of 0x%04x", h);
        cr_assert_eq(dj_f32_to_f16(nextafterf((float)mid, -1e9f)), h, "below midpoint of 0x%04x", h);
    }
    cr_assert_eq(dj_f32_to_f16(65504.f), 0x7bff);
    cr_assert_eq(dj_f32_to_f16(65520.f), 0x7c00);  // rounds to inf
    cr_assert_eq(dj_f32_to_f16(-1e10f), 0xfc00);
    cr_assert_eq(dj_f32_to_f16(1e-10f), 0);
}

Test(dtype, bf16_round_trip_and_rounding) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dj_bf16_to_f32((uint16_t)h);
        if (f != f) continue;
        cr_assert_eq(dj_f32_to_bf16(f), h);
    }
    cr_assert_eq(dj_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie -> even
    cr_assert_eq(dj_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // tie -> even (up)
    cr_assert_eq(dj_f32_to_bf16(1.0f + 1.0f / 200), 0x3f81);
}

// Loading for the GPU page-locks the travelling sections. Where that is refused (here: no driver on the CPU
// machines), the load still succeeds, pageable, with one warning that names the cost; on the GPU machine
// the same load must come out pinned.
Test(model_format, page_locking_refused_falls_back_with_warning, .init = cr_redirect_stderr) {
    dj_config c = small_config();
    dj_model_info plan;
    char path[] = "/tmp/djinn_test_pin_XXXXXX";
    uint8_t *img = write_image(&c, path, &plan);
    dj_model m;
    dj_load_opts o = {.want_pinned = 1, .quiet = 1};
    dj_err e;
    int rc = model_load(path, &o, &m, &e);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", e.msg);
    cr_assert_eq(memcmp(m.data, img, plan.file_size), 0);
    cr_assert(m.pin_tried);
    fflush(stderr);
    char err[2048] = {0};
    size_t n = fread(err, 1, sizeof err - 1, cr_get_redirected_stderr());
    err[n] = 0;
    if (gpu_count() > 0) {
        cr_assert(m.pinned, "page-locking failed on a GPU machine: %s", err);
        cr_assert_eq(n, 0, "unexpected output: %s", err);
    } else {
        cr_assert(!m.pinned);
        cr_assert(strstr(err, "warning: could not page-lock") && strstr(err, "7 GB/s instead of ~50 GB/s"), "%s", err);
        cr_assert_eq(strchr(err, '\n'), err + n - 1, "want exactly one line: %s", err);
    }
    model_free(&m);
    dj_info_free(&plan);
    free(img);
}

// A file cut short or rewritten while it loads: the loader reports it (a mapping would have died of SIGBUS
// later, or computed with a mix of two files). The loader's test hook changes the file exactly between the
// header's check and the sections' reads, so no clock decides whether the change lands during the load.
typedef struct {
    const char *path;
    off_t to;  // truncate to this size; -1: overwrite a page at `at`, same size
    off_t at;
    int calls;
} change_job;

static void change_now(void *arg) {
    change_job *j = arg;
    j->calls++;
    if (j->to >= 0) {
        cr_assert_eq(truncate(j->path, j->to), 0, "truncate: %s", strerror(errno));
        return;
    }
    static const char junk[4096] = {1};
    int fd = open(j->path, O_WRONLY);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    cr_assert_eq(pwrite(fd, junk, sizeof junk, j->at), (ssize_t)sizeof junk, "rewrite: %s", strerror(errno));
    close(fd);
}

// Loads a small model while the hook changes it as `truncate_it` says (1: cut in the middle of the layers; 0:
// a page there rewritten, same size); returns model_load's result, the message in *e.
static int load_while_changing(int truncate_it, dj_err *e) {
    dj_config c = small_config();
    dj_model_info plan;
    char path[] = "/tmp/djinn_test_change_XXXXXX";
    uint8_t *img = write_image(&c, path, &plan);
    // An old modification time: the rewrite's own is then another, however coarse the file system's clock.
    struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    off_t mid = (off_t)plan.layer_off[1];
    cr_assert_gt(mid, (off_t)plan.header_bytes);
    change_job j = {path, truncate_it ? mid : -1, mid, 0};
    dj_model m;
    dj_load_opts lo = {.quiet = 1, .test_hook_after_header = change_now, .test_hook_arg = &j};
    int rc = model_load(path, &lo, &m, e);
    cr_assert_eq(j.calls, 1, "the loader called its hook %d times", j.calls);
    unlink(path);
    if (rc == 0) model_free(&m);
    free(img);
    dj_info_free(&plan);
    return rc;
}

Test(model_format, file_truncated_while_loading) {
    dj_err e;
    cr_assert_eq(load_while_changing(1, &e), -1, "a file truncated while loading was accepted");
    cr_assert(strstr(e.msg, "shrank"), "%s", e.msg);
}

Test(model_format, file_rewritten_while_loading) {
    dj_err e;
    cr_assert_eq(load_while_changing(0, &e), -1, "a file rewritten in place while loading was accepted");
    cr_assert(strstr(e.msg, "changed on disk"), "%s", e.msg);
}

// A config field changed by a few units, the CRC recomputed: the layer slab, rounded up to 4096 bytes, keeps its
// size, so the section table cannot tell; the tensor table can.
Test(model_format, small_config_edits_caught_by_the_tensor_table) {
    dj_config c = small_config();
    dj_model_info plan;
    uint8_t *img = make_image(&c, 100, &plan);
    uint64_t size = plan.file_size;
    int tried = 0;
    for (uint32_t field = 0; field < 3; field++)
        for (int delta = -3; delta <= 3; delta++) {
            if (!delta) continue;
            dj_config d = c;
            if (field == 0) d.hidden_dim = (uint32_t)((int)c.hidden_dim + delta);
            else if (field == 1) d.vocab_size = (uint32_t)((int)c.vocab_size + delta);
            else if (delta % 2 == 0) d.head_dim = (uint32_t)((int)c.head_dim + delta);
            else continue;
            dj_layer_layout L;
            dj_head_layout H;
            dj_err e;
            if (dj_layout(&d, &L, &H, &e) || L.size != plan.layer.size || H.size != plan.head.size) continue;
            if (field == 1) continue;  // the embeddings' section is exact: a vocabulary edit fails there first
            uint8_t *copy = malloc(size);
            memcpy(copy, img, size);
            dj_disk_header h;
            memcpy(&h, copy, sizeof h);
            h.config = d;
            memcpy(copy, &h, sizeof h);
            fix_crc(copy, c.n_layers + 3);
            expect_parse_error(copy, size, size, "tensor table");
            free(copy);
            tried++;
        }
    cr_assert_gt(tried, 2, "no edit kept the slab sizes: the test tests nothing");
    dj_info_free(&plan);
    free(img);
}

// Version 1 files (no tensor table, one dtype) still parse; a version 1 header with table entries does not.
Test(model_format, version_1_still_reads) {
    dj_config c = small_config();
    dj_model_info plan, got;
    uint8_t *img = make_image(&c, 100, &plan);
    uint64_t size = plan.file_size;
    dj_disk_header h;
    memcpy(&h, img, sizeof h);
    h.version = 1, h.n_tensors = 0, h.config.embed_type = h.config.head_type = 0;
    memcpy(img, &h, sizeof h);
    memset(tensor(img, c.n_layers + 3, 0), 0, DJ_N_TENSOR_KINDS * sizeof(dj_disk_tensor));
    fix_crc(img, c.n_layers + 3);
    dj_err e;
    cr_assert_eq(model_parse(img, size, size, &got, &e), 0, "%s", e.msg);
    cr_assert(got.version == 1 && got.config.embed_type == DJ_F16 && got.config.head_type == DJ_F16);
    cr_assert(got.tok_off == plan.tok_off && got.layer_off[2] == plan.layer_off[2]);
    dj_info_free(&got);
    h.n_tensors = 5;
    memcpy(img, &h, sizeof h);
    fix_crc(img, c.n_layers + 3);
    expect_parse_error(img, size, size, NULL);
    dj_info_free(&plan);
    free(img);
}

// A version 2 file of q8 or q4 weights held them symmetric (an f16 scale, no zero point): refused by name, where the
// same file as version 3 parses, and a version 2 file of f16 weights still does.
Test(model_format, version_2_quantized_refused) {
    const uint32_t wts[] = {DJ_F16, DJ_Q8, DJ_Q4};
    for (size_t i = 0; i < sizeof wts / sizeof *wts; i++) {
        const uint32_t wt = wts[i];
        dj_config c = small_config();
        dj_config_set_wtype(&c, wt);
        if (dj_is_quant(wt)) c.embed_type = c.head_type = DJ_Q8;
        dj_model_info plan, got;
        uint8_t *img = make_image(&c, 100, &plan);
        uint64_t size = plan.file_size;
        dj_err e;
        cr_assert_eq(model_parse(img, size, size, &got, &e), 0, "%s", e.msg);
        dj_info_free(&got);
        dj_disk_header h;
        memcpy(&h, img, sizeof h);
        h.version = 2;
        memcpy(img, &h, sizeof h);
        fix_crc(img, c.n_layers + 3);
        if (wt == DJ_F16) {
            cr_assert_eq(model_parse(img, size, size, &got, &e), 0, "%s", e.msg);
            dj_info_free(&got);
        } else {
            expect_parse_error(img, size, size, wt == DJ_Q8 ? "version 2 file with q8 weights"
                                                            : "version 2 file with q4 weights");
        }
        dj_info_free(&plan);
        free(img);
    }
}

// ---- each header field's refusal alone, at its limit
// A config edit on small_config() (a default-RoPE one, or a llama3 one for its fields), the message it must give when
// refused (NULL: accepted).
typedef struct {
    const char *what;
    void (*edit)(dj_config *c, double v);
    double v;
    int llama3;          // start from the llama3 config
    const char *needle;  // NULL: accepted
    int layout;          // the edit changes the layout (model_parse of an accepted one fails on the sections)
} tm_field_case;

static dj_config tm_llama3_config(void) {
    dj_config c = small_config();
    c.rope_type = DJ_ROPE_LLAMA3, c.rope_factor = 8, c.rope_low_freq = 1, c.rope_high_freq = 4, c.rope_orig_max = 64;
    return c;
}

#define TM_SETTER(field, type) \
    static void tm_set_##field(dj_config *c, double v) { c->field = (type)v; }
TM_SETTER(dim, uint32_t)
TM_SETTER(n_layers, uint32_t)
TM_SETTER(n_heads, uint32_t)
TM_SETTER(n_kv_heads, uint32_t)
TM_SETTER(head_dim, uint32_t)
TM_SETTER(hidden_dim, uint32_t)
TM_SETTER(vocab_size, uint32_t)
TM_SETTER(max_seq_len, uint32_t)
TM_SETTER(wtype, uint32_t)
TM_SETTER(tied, uint32_t)
TM_SETTER(norm_eps, float)
TM_SETTER(rope_theta, float)
TM_SETTER(rope_type, uint32_t)
TM_SETTER(rope_factor, float)
TM_SETTER(rope_low_freq, float)
TM_SETTER(rope_high_freq, float)
TM_SETTER(rope_orig_max, uint32_t)
TM_SETTER(embed_type, uint32_t)
TM_SETTER(head_type, uint32_t)
TM_SETTER(reserved, uint32_t)
#undef TM_SETTER

static const tm_field_case tm_fields[] = {
    {"dim 0", tm_set_dim, 0, 0, "dim 0 out of range", 1},
    {"dim 65536", tm_set_dim, 65536, 0, NULL, 1},
    {"dim 65537", tm_set_dim, 65537, 0, "dim 65537 out of range", 1},
    {"n_layers 0", tm_set_n_layers, 0, 0, "n_layers 0", 1},
    {"n_layers max", tm_set_n_layers, DJ_MAX_LAYERS, 0, NULL, 1},
    {"n_layers max + 1", tm_set_n_layers, DJ_MAX_LAYERS + 1, 0, "n_layers 1025", 1},
    {"n_heads 0", tm_set_n_heads, 0, 0, "n_heads 0", 1},
    {"n_heads 1024", tm_set_n_heads, 1024, 0, NULL, 1},
    {"n_heads 1025", tm_set_n_heads, 1025, 0, "n_heads 1025", 1},
    {"n_kv_heads 0", tm_set_n_kv_heads, 0, 0, "n_kv_heads 0 must divide", 1},
    {"n_kv_heads 1", tm_set_n_kv_heads, 1, 0, NULL, 1},
    {"n_kv_heads = n_heads", tm_set_n_kv_heads, 8, 0, NULL, 1},
    {"n_kv_heads > n_heads", tm_set_n_kv_heads, 16, 0, "n_kv_heads 16 must divide", 1},
    {"n_kv_heads not dividing", tm_set_n_kv_heads, 3, 0, "n_kv_heads 3 must divide", 1},
    {"head_dim 0", tm_set_head_dim, 0, 0, "head_dim 0", 1},
    {"head_dim 2", tm_set_head_dim, 2, 0, NULL, 1},
    {"head_dim 1024", tm_set_head_dim, 1024, 0, NULL, 1},
    {"head_dim 1026", tm_set_head_dim, 1026, 0, "head_dim 1026", 1},
    {"head_dim odd", tm_set_head_dim, 9, 0, "head_dim 9", 1},
    {"hidden_dim 0", tm_set_hidden_dim, 0, 0, "hidden_dim 0", 1},
    {"hidden_dim 2^20", tm_set_hidden_dim, 1 << 20, 0, NULL, 1},
    {"hidden_dim 2^20 + 1", tm_set_hidden_dim, (1 << 20) + 1, 0, "hidden_dim 1048577", 1},
    {"vocab_size 0", tm_set_vocab_size, 0, 0, "vocab_size 0", 1},
    {"vocab_size 2^22", tm_set_vocab_size, 1 << 22, 0, NULL, 1},
    {"vocab_size 2^22 + 1", tm_set_vocab_size, (1 << 22) + 1, 0, "vocab_size 4194305", 1},
    {"max_seq_len 0", tm_set_max_seq_len, 0, 0, "max_seq_len 0", 0},
    {"max_seq_len 1", tm_set_max_seq_len, 1, 0, NULL, 0},
    {"max_seq_len 2^24", tm_set_max_seq_len, 1 << 24, 0, NULL, 0},
    {"max_seq_len 2^24 + 1", tm_set_max_seq_len, (1 << 24) + 1, 0, "max_seq_len 16777217", 0},
    {"wtype unknown", tm_set_wtype, 9, 0, "unknown weight dtype 9", 1},
    {"tied 2", tm_set_tied, 2, 0, "tied flag 2", 1},
    {"norm_eps 0", tm_set_norm_eps, 0, 0, "norm_eps", 0},
    {"norm_eps tiny", tm_set_norm_eps, 1e-30, 0, NULL, 0},
    {"norm_eps 0.999", tm_set_norm_eps, 0.999, 0, NULL, 0},
    {"norm_eps 1", tm_set_norm_eps, 1, 0, "norm_eps", 0},
    {"norm_eps NaN", tm_set_norm_eps, NAN, 0, "norm_eps", 0},
    {"norm_eps negative", tm_set_norm_eps, -1e-5, 0, "norm_eps", 0},
    {"rope_theta 0", tm_set_rope_theta, 0, 0, "rope_theta", 0},
    {"rope_theta tiny", tm_set_rope_theta, 1e-30, 0, NULL, 0},
    {"rope_theta under 1e12", tm_set_rope_theta, 9.99e11, 0, NULL, 0},
    {"rope_theta 1e12", tm_set_rope_theta, 1e12, 0, "rope_theta", 0},
    {"rope_theta infinite", tm_set_rope_theta, INFINITY, 0, "rope_theta", 0},
    {"rope_theta NaN", tm_set_rope_theta, NAN, 0, "rope_theta", 0},
    {"rope type 2", tm_set_rope_type, 2, 0, "unknown rope type 2", 0},
    {"llama3 as set", tm_set_rope_type, DJ_ROPE_LLAMA3, 1, NULL, 0},
    {"llama3 factor 1", tm_set_rope_factor, 1, 1, NULL, 0},
    {"llama3 factor under 1", tm_set_rope_factor, 0.999, 1, "rope factor", 0},
    {"llama3 factor under 1e6", tm_set_rope_factor, 999999, 1, NULL, 0},
    {"llama3 factor 1e6", tm_set_rope_factor, 1e6, 1, "rope factor", 0},
    {"llama3 factor NaN", tm_set_rope_factor, NAN, 1, "rope factor", 0},
    {"llama3 low 0", tm_set_rope_low_freq, 0, 1, "low_freq_factor", 0},
    {"llama3 low tiny", tm_set_rope_low_freq, 1e-30, 1, NULL, 0},
    {"llama3 low = high", tm_set_rope_low_freq, 4, 1, "low_freq_factor", 0},
    {"llama3 low just under high", tm_set_rope_low_freq, 3.999, 1, NULL, 0},
    {"llama3 high = low", tm_set_rope_high_freq, 1, 1, "high_freq_factor", 0},
    {"llama3 high under 1e6", tm_set_rope_high_freq, 999999, 1, NULL, 0},
    {"llama3 high 1e6", tm_set_rope_high_freq, 1e6, 1, "high_freq_factor", 0},
    {"llama3 original_max 0", tm_set_rope_orig_max, 0, 1, "original_max_position_embeddings", 0},
    {"llama3 original_max 1", tm_set_rope_orig_max, 1, 1, NULL, 0},
    {"llama3 original_max 2^32 - 1", tm_set_rope_orig_max, 4294967295.0, 1, NULL, 0},
    {"default rope with a factor", tm_set_rope_factor, 8, 0, "llama3 rope fields", 0},
    {"default rope with low_freq", tm_set_rope_low_freq, 1, 0, "llama3 rope fields", 0},
    {"default rope with high_freq", tm_set_rope_high_freq, 4, 0, "llama3 rope fields", 0},
    {"default rope with original_max", tm_set_rope_orig_max, 1, 0, "llama3 rope fields", 0},
    {"embeddings in q8 beside f16", tm_set_embed_type, DJ_Q8, 0, "embeddings in q8 beside f16", 1},
    {"embeddings in f32 beside f16", tm_set_embed_type, DJ_F32, 0, "embeddings in f32 beside f16", 1},
    {"lm_head in bf16 beside f16", tm_set_head_type, DJ_BF16, 0, "lm_head in bf16 beside f16", 1},
    {"reserved 1", tm_set_reserved, 1, 0, "reserved config word is 1", 0},
};

// Each case through dj_config_validate, and through model_parse of a whole file whose header holds it (its CRC
// made right, so that the config check is what answers): a refusal names the field; an accepted value that leaves
// the layout alone parses.
Test(model_format, each_header_field_at_its_limit) {
    dj_model_info plan[2];
    dj_config base[2] = {small_config(), tm_llama3_config()};
    uint8_t *img[2] = {make_image(&base[0], 100, &plan[0]), make_image(&base[1], 100, &plan[1])};
    uint64_t size = plan[0].file_size;
    cr_assert_eq(plan[1].file_size, size);
    uint8_t *copy = malloc(size);
    for (size_t k = 0; k < sizeof tm_fields / sizeof *tm_fields; k++) {
        const tm_field_case *t = &tm_fields[k];
        dj_config c = base[t->llama3];
        t->edit(&c, t->v);
        dj_err e = {{0}};
        int rc = dj_config_validate(&c, &e);
        if (!t->needle) {
            cr_assert_eq(rc, 0, "%s: refused: %s", t->what, e.msg);
        } else {
            cr_assert_eq(rc, -1, "%s: accepted", t->what);
            cr_assert(strstr(e.msg, t->needle), "%s: '%s' lacks '%s'", t->what, e.msg, t->needle);
        }
        memcpy(copy, img[t->llama3], size);
        dj_disk_header h;
        memcpy(&h, copy, sizeof h);
        h.config = c;
        memcpy(copy, &h, sizeof h);
        fix_crc(copy, base[0].n_layers + 3);
        if (t->needle) {
            expect_parse_error(copy, size, size, t->needle);
            dj_model_info got;
            cr_assert_eq(model_parse(copy, size, size, &got, &e), -1);
            cr_assert(!strncmp(e.msg, "bad config in header: ", 22), "%s: '%s'", t->what, e.msg);
        } else if (!t->layout) {
            dj_model_info got;
            cr_assert_eq(model_parse(copy, size, size, &got, &e), 0, "%s: model_parse: %s", t->what, e.msg);
            cr_assert_eq(memcmp(&got.config, &c, sizeof c), 0, "%s", t->what);
            dj_info_free(&got);
        }
    }
    // quantized layers take q8 embeddings and lm_head
    for (uint32_t wt = DJ_Q8; wt <= DJ_Q4; wt++) {
        dj_config c = small_config();
        dj_config_set_wtype(&c, wt);
        dj_err e = {{0}};
        cr_assert_eq(dj_config_validate(&c, &e), 0, "%s layers: %s", dj_dtype_name(wt), e.msg);
        c.embed_type = c.head_type = DJ_Q8;
        cr_assert_eq(dj_config_validate(&c, &e), 0, "q8 beside %s layers: %s", dj_dtype_name(wt), e.msg);
        c.head_type = DJ_F16;
        cr_assert_eq(dj_config_validate(&c, &e), -1, "an f16 lm_head beside %s layers", dj_dtype_name(wt));
    }
    free(copy);
    for (int i = 0; i < 2; i++) dj_info_free(&plan[i]), free(img[i]);
}
