// test_convert.c: ./convert on the real stories260K checkpoint (f32 and f16, single file and sharded), on the
// committed F16/BF16 fixtures, on damaged checkpoints, and on a sparse 1.8 GB one (bounded memory, progress, a
// write error, Ctrl-C). Needs $DJINN_DATA (the shared test data); skips visibly without it.
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../convert/convert.h"
#include "../convert/safetensors.h"
#include "../model.h"
#include "../loader.h"
#include "../tokenizer.h"
#include "common.h"

// ---- helpers
static char stories[4096];

static void need_stories(void) { tc_data_path(stories, sizeof stories, "models/stories260K"); }

static int run_convert(const char *hf, const char *out, int dtype, const char *tok, dj_err *e) {
    convert_opts o = {.hf_dir = hf, .out_path = out, .tok_dir = tok, .dtype = dtype, .quiet = 1};
    return convert_run(&o, e);
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

// Writes stories260K's config.json into dir with `find` replaced by `replace` (find NULL: unchanged).
static void write_config(const char *dir, const char *find, const char *replace, const char *what) {
    char p[4200];
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", stories);
    char *cfg = tc_must_read(p, &n);
    if (find) {
        char *at = strstr(cfg, find);
        cr_assert(at, "%s: test edit '%s' not found in config.json", what, find);
        size_t fl = strlen(find), rl = strlen(replace);
        char *nc = malloc(n + rl + 1);
        memcpy(nc, cfg, (size_t)(at - cfg));
        memcpy(nc + (at - cfg), replace, rl);
        strcpy(nc + (at - cfg) + rl, at + fl);
        free(cfg);
        cfg = nc;
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    tc_write(p, cfg, strlen(cfg));
    free(cfg);
}

// Runs a shell command; its stderr in err; the exit status (128 + signal when killed).
static int run_cmd(const char *cmd, char *err, size_t errn) {
    char full[17000], ef[] = "/tmp/djinn_conv_err_XXXXXX";
    int fd = mkstemp(ef);
    close(fd);
    snprintf(full, sizeof full, "%s 2>%s >/dev/null", cmd, ef);
    int st = system(full);
    FILE *f = fopen(ef, "r");
    size_t k = fread(err, 1, errn - 1, f);
    err[k] = 0;
    fclose(f);
    unlink(ef);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// Writes a safetensors file holding `idx` tensors of `src` (in that order).
static void write_safetensors(const char *path, const st_file *src, const size_t *idx, size_t n) {
    size_t cap = 1 << 20, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = &src->tensors[idx[i]];
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
                                st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + t->nbytes));
        off += t->nbytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(h, 1, len, f);
    for (size_t i = 0; i < n; i++) fwrite(src->tensors[idx[i]].data, 1, src->tensors[idx[i]].nbytes, f);
    fclose(f);
    free(h);
}

static float source_elem(const st_tensor *t, uint64_t i) {
    uint16_t h;
    float f;
    if (t->dtype == ST_F32) {
        memcpy(&f, t->data + 4 * i, 4);
        return f;
    }
    memcpy(&h, t->data + 2 * i, 2);
    return t->dtype == ST_F16 ? dj_f16_to_f32(h) : dj_bf16_to_f32(h);
}

// One source tensor in model.bin: byte-for-byte the source where the dtype is kept, else the source value
// rounded to the output dtype (f16/bf16 -> f32 is exact).
static void expect_tensor(const dj_model *m, const st_file *st, const char *name, uint64_t off, uint32_t dtype) {
    const st_tensor *t = st_find(st, name);
    cr_assert(t, "source lacks %s", name);
    const uint8_t *got = m->data + off;
    int kept = (t->dtype == ST_F32 && dtype == DJ_F32) || (t->dtype == ST_F16 && dtype == DJ_F16) ||
               (t->dtype == ST_BF16 && dtype == DJ_BF16);
    if (kept) {
        cr_assert(memcmp(got, t->data, t->nbytes) == 0, "%s differs from the source (%s kept)", name,
                  dj_dtype_name(dtype));
        return;
    }
    uint64_t n = t->nbytes / st_dtype_size(t->dtype);
    for (uint64_t i = 0; i < n; i++) {
        float f = source_elem(t, i);
        if (dtype == DJ_F32) {
            float g;
            memcpy(&g, got + 4 * i, 4);
            cr_assert(memcmp(&f, &g, 4) == 0, "%s[%llu]: %g != %g", name, (unsigned long long)i, f, g);
        } else {
            uint16_t g, want = dtype == DJ_F16 ? dj_f32_to_f16(f) : dj_f32_to_bf16(f);
            memcpy(&g, got + 2 * i, 2);
            cr_assert_eq(g, want, "%s[%llu]: 0x%04x != 0x%04x", name, (unsigned long long)i, g, want);
        }
    }
}

// Every tensor of a loaded model.bin against the safetensors file it came from.
static void expect_all_tensors(const dj_model *m, const char *safetensors) {
    const dj_config *c = &m->info.config;
    size_t n;
    uint8_t *raw = (uint8_t *)tc_must_read(safetensors, &n);
    st_file st;
    dj_err e;
    cr_assert_eq(st_parse(raw, n, &st, &e), 0, "%s", e.msg);
    expect_tensor(m, &st, "model.embed_tokens.weight", m->info.embed_off, c->wtype);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const dj_layer_layout *L = &m->info.layer;
        uint64_t b = m->info.layer_off[l];
        struct { const char *fmt; uint64_t off; int norm; } ts[] = {
            {"model.layers.%u.input_layernorm.weight", L->attn_norm, 1},
            {"model.layers.%u.post_attention_layernorm.weight", L->ffn_norm, 1},
            {"model.layers.%u.self_attn.q_proj.weight", L->wq, 0},
            {"model.layers.%u.self_attn.k_proj.weight", L->wk, 0},
            {"model.layers.%u.self_attn.v_proj.weight", L->wv, 0},
            {"model.layers.%u.self_attn.o_proj.weight", L->wo, 0},
            {"model.layers.%u.mlp.gate_proj.weight", L->w_gate, 0},
            {"model.layers.%u.mlp.up_proj.weight", L->w_up, 0},
            {"model.layers.%u.mlp.down_proj.weight", L->w_down, 0},
        };
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            char name[128];
            snprintf(name, sizeof name, ts[i].fmt, l);
            expect_tensor(m, &st, name, b + ts[i].off, ts[i].norm ? DJ_F32 : c->wtype);
        }
    }
    expect_tensor(m, &st, "model.norm.weight", m->info.head_off + m->info.head.norm, DJ_F32);
    if (c->tied) cr_assert_eq(dj_lm_head_ptr(m), dj_embed_ptr(m));
    else expect_tensor(m, &st, "lm_head.weight", m->info.head_off + m->info.head.lm_head, c->wtype);
    st_free(&st);
    free(raw);
}

static void check_against_source(const char *bin, uint32_t dtype) {
    dj_model m;
    dj_load_opts lo = {.quiet = 1};
    dj_err e;
    cr_assert_eq(model_load(bin, &lo, &m, &e), 0, "%s", e.msg);
    const dj_config *c = &m.info.config;
    cr_assert_eq(c->dim, 64);
    cr_assert_eq(c->n_layers, 5);
    cr_assert_eq(c->n_heads, 8);
    cr_assert_eq(c->n_kv_heads, 4);
    cr_assert_eq(c->head_dim, 8);
    cr_assert_eq(c->hidden_dim, 172);
    cr_assert_eq(c->vocab_size, 512);
    cr_assert_eq(c->max_seq_len, 512);
    cr_assert_eq(c->tied, 1);
    cr_assert_eq(c->wtype, dtype);
    cr_assert_float_eq(c->norm_eps, 1e-5f, 1e-12f);
    cr_assert_float_eq(c->rope_theta, 10000.f, 1e-3f);
    cr_assert_eq(c->rope_type, DJ_ROPE_DEFAULT);
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", stories);
    expect_all_tensors(&m, p);
    model_free(&m);
}

// ---- the real checkpoint
Test(convert, stories_f32_and_f16_match_source) {
    need_stories();
    char *dir = tc_tmpdir("conv"), out[4200];
    dj_err e;
    uint32_t dts[] = {DJ_F32, DJ_F16, DJ_BF16};
    for (int i = 0; i < 3; i++) {
        snprintf(out, sizeof out, "%s/stories_%d.bin", dir, i);
        cr_assert_eq(run_convert(stories, out, (int)dts[i], NULL, &e), 0, "%s", e.msg);
        check_against_source(out, dts[i]);
        char tmp[4300];
        snprintf(tmp, sizeof tmp, "%s.tmp", out);
        cr_assert(!exists(tmp), "temporary file left behind");
    }
    // Default: F32 becomes F16.
    snprintf(out, sizeof out, "%s/stories_auto.bin", dir);
    cr_assert_eq(run_convert(stories, out, -1, NULL, &e), 0, "%s", e.msg);
    check_against_source(out, DJ_F16);
    tc_rm_rf(dir);
    free(dir);
}

// The committed F16 and BF16 fixtures with the default dtype: F16 stays f16, BF16 stays bf16, every weight
// byte-for-byte the source's (norms widened to f32 exactly). Run from the repository root.
Test(convert, f16_and_bf16_sources_keep_their_dtype) {
    need_stories();
    struct { const char *dir; st_dtype src; uint32_t out; uint32_t tied; } fx[] = {
        {"tests/fixtures/tied_gqa_f16", ST_F16, DJ_F16, 1},
        {"tests/fixtures/llama3_gqa_bf16", ST_BF16, DJ_BF16, 0},
    };
    char *dir = tc_tmpdir("conv"), out[4200], src[4200];
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        snprintf(src, sizeof src, "%s/model.safetensors", fx[i].dir);
        if (access(src, R_OK)) cr_skip_test("%s not found: run from the repository root", src);
        snprintf(out, sizeof out, "%s/fixture_%zu.bin", dir, i);
        dj_err e;
        cr_assert_eq(run_convert(fx[i].dir, out, -1, stories, &e), 0, "%s: %s", fx[i].dir, e.msg);
        dj_model m;
        dj_load_opts lo = {.quiet = 1};
        cr_assert_eq(model_load(out, &lo, &m, &e), 0, "%s", e.msg);
        cr_assert_eq(m.info.config.wtype, fx[i].out, "%s: wtype %s", fx[i].dir, dj_dtype_name(m.info.config.wtype));
        cr_assert_eq(m.info.config.tied, fx[i].tied, "%s", fx[i].dir);
        size_t n;
        uint8_t *raw = (uint8_t *)tc_must_read(src, &n);  // the fixture really is in the dtype this test is about
        st_file st;
        cr_assert_eq(st_parse(raw, n, &st, &e), 0, "%s", e.msg);
        for (size_t k = 0; k < st.n; k++)
            cr_assert_eq(st.tensors[k].dtype, fx[i].src, "%s: %s is %s", fx[i].dir, st.tensors[k].name,
                         st_dtype_name(st.tensors[k].dtype));
        st_free(&st);
        free(raw);
        expect_all_tensors(&m, src);
        model_free(&m);
    }
    tc_rm_rf(dir);
    free(dir);
}

// ---- sharded checkpoints
// stories260K's tensors (parsed from `raw`, which st points into).
typedef struct {
    uint8_t *raw;
    st_file st;
} source;

static void source_open(source *src) {
    char p[4200];
    size_t n;
    dj_err e;
    snprintf(p, sizeof p, "%s/model.safetensors", stories);
    src->raw = (uint8_t *)tc_must_read(p, &n);
    cr_assert_eq(st_parse(src->raw, n, &src->st, &e), 0, "%s", e.msg);
}

static void source_close(source *src) {
    st_free(&src->st);
    free(src->raw);
}

// Shard 1 takes the odd-numbered tensors, shard 2 the even ones (and, with `dup`, shard 1's first tensor too),
// beside stories260K's config.json.
static void write_shards(const char *hf, const st_file *st, int dup) {
    char p[4200];
    size_t *a = calloc(st->n, sizeof *a), *b = calloc(st->n + 1, sizeof *b), na = 0, nb = 0;
    for (size_t i = 0; i < st->n; i++) {
        if (i % 2) a[na++] = i;
        else b[nb++] = i;
    }
    if (dup) b[nb++] = a[0];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", hf);
    write_safetensors(p, st, a, na);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", hf);
    write_safetensors(p, st, b, nb);
    write_config(hf, NULL, NULL, "shards");
    free(a), free(b);
}

// Writes hf/model.safetensors.index.json mapping each name to its shard; the entry of `name` (if any) maps to
// the raw JSON `value` instead, and `extra` (if any) is one more raw member.
static void write_index(const char *hf, const st_file *st, const char *name, const char *value, const char *extra) {
    size_t cap = 1 << 20, len = 0;
    char *idx = malloc(cap), p[4200];
    len += (size_t)snprintf(idx, cap, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    for (size_t i = 0; i < st->n; i++) {
        char file[64];
        snprintf(file, sizeof file, "\"model-0000%d-of-00002.safetensors\"", i % 2 ? 1 : 2);
        const char *v = name && !strcmp(st->tensors[i].name, name) ? value : file;
        len += (size_t)snprintf(idx + len, cap - len, "%s\"%s\":%s", i ? "," : "", st->tensors[i].name, v);
    }
    len += (size_t)snprintf(idx + len, cap - len, "%s%s}}", extra ? "," : "", extra ? extra : "");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", hf);
    tc_write(p, idx, len);
    free(idx);
}

Test(convert, sharded_checkpoint_is_byte_identical) {
    need_stories();
    char *dir = tc_tmpdir("conv"), *hf = tc_tmpdir("conv"), single[4200], sharded[4200];
    dj_err e;
    snprintf(single, sizeof single, "%s/single.bin", dir);
    cr_assert_eq(run_convert(stories, single, DJ_F16, NULL, &e), 0, "%s", e.msg);
    source src;
    source_open(&src);
    write_shards(hf, &src.st, 0);
    write_index(hf, &src.st, NULL, NULL, NULL);
    snprintf(sharded, sizeof sharded, "%s/sharded.bin", dir);
    cr_assert_eq(run_convert(hf, sharded, DJ_F16, stories, &e), 0, "%s", e.msg);
    size_t n1, n2;
    uint8_t *b1 = (uint8_t *)tc_must_read(single, &n1), *b2 = (uint8_t *)tc_must_read(sharded, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0, "sharded conversion differs from single-file conversion");
    free(b1), free(b2);
    source_close(&src);
    tc_rm_rf(hf), tc_rm_rf(dir);
    free(hf), free(dir);
}

// Broken indexes and shards: one clear line naming the problem, exit 1 from ./convert, no output left.
typedef struct {
    const char *what;
    const char *index;          // the whole index text; NULL: generated, with the edits below
    const char *value;          // raw JSON for model.norm.weight's entry (NULL: its shard)
    const char *extra;          // one more raw weight_map member
    int dup;                    // shard 2 also holds a tensor of shard 1
    const char *needle;         // expected in the error
} shard_case;

static const shard_case shard_cases[] = {
    {"malformed index", "{\"weight_map\": {", .needle = "model.safetensors.index.json: json: line 1"},
    {"index not an object", "[1, 2]", .needle = "missing or empty \"weight_map\""},
    {"no weight_map", "{\"metadata\": {\"total_size\": 1}}", .needle = "missing or empty \"weight_map\""},
    {"empty weight_map", "{\"weight_map\": {}}", .needle = "missing or empty \"weight_map\""},
    {"weight_map an array", "{\"weight_map\": [\"model-00001-of-00002.safetensors\"]}",
     .needle = "missing or empty \"weight_map\""},
    {"shard in a subfolder", NULL, "\"sub/model-00001-of-00002.safetensors\"",
     .needle = "entry \"model.norm.weight\" must name a file in the same folder"},
    {"shard in the parent folder", NULL, "\"../model-00001-of-00002.safetensors\"",
     .needle = "entry \"model.norm.weight\" must name a file in the same folder"},
    {"shard named ..", NULL, "\"..\"", .needle = "entry \"model.norm.weight\" must name a file in the same folder"},
    {"absolute shard path", NULL, "\"/etc/passwd\"", .needle = "must name a file in the same folder"},
    {"empty shard name", NULL, "\"\"", .needle = "must name a file in the same folder"},
    {"shard name not a string", NULL, "3", .needle = "must name a file in the same folder"},
    {"missing shard file", NULL, "\"model-00003-of-00003.safetensors\"",
     .needle = "model-00003-of-00003.safetensors: No such file"},
    {"index names a tensor its shard lacks", .extra = "\"model.extra.weight\":\"model-00001-of-00002.safetensors\"",
     .needle = "tensor 'model.extra.weight' is not in"},
    {"tensor in two shards", .dup = 1, .needle = "appears in two shards: /tmp/djinn_conv_"},
};

Test(convert, broken_shards_fail_clearly) {
    need_stories();
    const char *bin = getenv("DJINN_BIN");
    if (!bin) cr_log_info("DJINN_BIN is not set: ./convert's exit status not checked");
    source src;
    source_open(&src);
    for (size_t i = 0; i < sizeof shard_cases / sizeof shard_cases[0]; i++) {
        const shard_case *sc = &shard_cases[i];
        char *hf = tc_tmpdir("conv"), out[4200], tmp[4300], p[4200];
        write_shards(hf, &src.st, sc->dup);
        if (sc->index) {
            snprintf(p, sizeof p, "%s/model.safetensors.index.json", hf);
            tc_write(p, sc->index, strlen(sc->index));
        } else {
            write_index(hf, &src.st, sc->value ? "model.norm.weight" : NULL, sc->value, sc->extra);
        }
        snprintf(out, sizeof out, "%s/out.bin", hf);
        snprintf(tmp, sizeof tmp, "%s.tmp", out);
        dj_err e = {{0}};
        cr_expect_eq(run_convert(hf, out, -1, stories, &e), -1, "%s: conversion succeeded", sc->what);
        cr_expect(strstr(e.msg, sc->needle), "%s: error '%s' should mention '%s'", sc->what, e.msg, sc->needle);
        cr_expect(!strchr(e.msg, '\n'), "%s: error is more than one line", sc->what);
        cr_expect(!exists(out) && !exists(tmp), "%s: output left behind", sc->what);
        if (bin) {
            char cmd[16384], err[8192];
            snprintf(cmd, sizeof cmd, "%s/convert -q %s %s --tokenizer %s", bin, hf, out, stories);
            int rc = run_cmd(cmd, err, sizeof err);
            cr_expect_eq(rc, 1, "%s: ./convert exit %d: %s", sc->what, rc, err);
            cr_expect(count_lines(err) == 1 && strstr(err, sc->needle), "%s: want one line with '%s': %s", sc->what,
                      sc->needle, err);
            cr_expect(!exists(out) && !exists(tmp), "%s: ./convert left output behind", sc->what);
        }
        tc_rm_rf(hf);
        free(hf);
    }
    source_close(&src);
}

// ---- damaged checkpoints: each a clear error naming the problem, and no output left behind
typedef struct {
    const char *what;
    const char *find, *replace;  // edit of config.json; find == NULL: leave it
    int weights;                 // 0 keep, 1 drop a tensor, 2 wrong shape, 3 add a bias, 4 bad dtype, 5 header > file,
                                 // 6 an F32 value beyond f16's range (the default output is f16)
    const char *needle;          // expected in the error
} bad_case;

static const bad_case bad_cases[] = {
    {"malformed json", "\"hidden_act\": \"silu\",", "\"hidden_act\": \"silu\"", 0, "config.json: json: line"},
    {"other architecture", "LlamaForCausalLM", "MistralForCausalLM", 0, "MistralForCausalLM"},
    {"other activation", "\"silu\"", "\"gelu\"", 0, "gelu"},
    {"attention bias", "\"attention_bias\": false", "\"attention_bias\": true", 0, "bias"},
    {"rope type", "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", 0, "yarn"},
    {"heads not dividing", "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3", 0, "n_kv_heads"},
    {"missing key", "\"hidden_size\": 64,", "", 0, "hidden_size"},
    {"negative size", "\"intermediate_size\": 172", "\"intermediate_size\": -172", 0, "intermediate_size"},
    {"wrong vocab", "\"vocab_size\": 512", "\"vocab_size\": 600", 0, "model.embed_tokens.weight"},
    {"missing tensor", NULL, NULL, 1, "model.layers.3.mlp.up_proj.weight"},
    {"wrong shape", NULL, NULL, 2, "expected [172, 64]"},
    {"bias tensor", NULL, NULL, 3, "bias"},
    {"integer dtype", NULL, NULL, 4, "I32"},
    {"header longer than file", NULL, NULL, 5, "safetensors"},
    {"tokenizer larger than vocab", "\"vocab_size\": 512", "\"vocab_size\": 500", 0, "500"},
    {"f16 overflow", NULL, NULL, 6, "tensor 'model.layers.2.mlp.down_proj.weight' holds 1e+06, beyond f16's range"},
};


static void make_bad_dir(const char *hf, const bad_case *bc) {
    char p[4200];
    size_t n;
    // An "attention_bias" edit needs the key present: stories260K's config has it.
    write_config(hf, bc->find, bc->replace, bc->what);

    snprintf(p, sizeof p, "%s/model.safetensors", stories);
    uint8_t *raw = (uint8_t *)tc_must_read(p, &n);
    dj_err e;
    st_file st;
    cr_assert_eq(st_parse(raw, n, &st, &e), 0, "%s", e.msg);
    size_t *idx = calloc(st.n + 1, sizeof *idx), k = 0;
    for (size_t i = 0; i < st.n; i++)
        if (!(bc->weights == 1 && !strcmp(st.tensors[i].name, "model.layers.3.mlp.up_proj.weight"))) idx[k++] = i;
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    if (bc->weights == 6) {
        const st_tensor *t = st_find(&st, "model.layers.2.mlp.down_proj.weight");
        float big = 1e6f;  // f16's largest finite value is 65504
        memcpy((uint8_t *)t->data + 4 * 100, &big, 4);
    }
    if (bc->weights == 2 || bc->weights == 4) {
        // Edit the metadata in the written header: a shape or a dtype.
        st_tensor *t = (st_tensor *)st_find(&st, "model.layers.1.mlp.gate_proj.weight");
        if (bc->weights == 2) t->shape[0] = 64, t->shape[1] = 172;
        if (bc->weights == 4) t->dtype = ST_I32;
        write_safetensors(p, &st, idx, k);
    } else if (bc->weights == 3) {
        // Every real tensor plus a bias vector (reusing some data bytes).
        st_tensor *all = calloc(st.n + 1, sizeof *all);
        memcpy(all, st.tensors, st.n * sizeof *all);
        all[st.n] = *st_find(&st, "model.norm.weight");
        all[st.n].name = "model.layers.1.mlp.gate_proj.bias";
        st_file ext = {.tensors = all, .n = st.n + 1};
        for (size_t i = 0; i <= st.n; i++) idx[i] = i;
        write_safetensors(p, &ext, idx, st.n + 1);
        free(all);
    } else {
        write_safetensors(p, &st, idx, k);
    }
    if (bc->weights == 5) {
        size_t wn;
        uint8_t *w = (uint8_t *)tc_must_read(p, &wn);
        uint64_t huge = wn;  // header length = whole file: runs past the end
        memcpy(w, &huge, 8);
        tc_write(p, w, wn);
        free(w);
    }
    st_free(&st);
    free(idx);
    free(raw);
}

Test(convert, damaged_checkpoints_fail_clearly) {
    need_stories();
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *bc = &bad_cases[i];
        char *hf = tc_tmpdir("conv"), out[4200], tmp[4300];
        make_bad_dir(hf, bc);
        snprintf(out, sizeof out, "%s/out.bin", hf);
        snprintf(tmp, sizeof tmp, "%s.tmp", out);
        dj_err e = {{0}};
        int rc = run_convert(hf, out, -1, stories, &e);
        cr_expect_eq(rc, -1, "%s: conversion succeeded", bc->what);
        cr_expect(strstr(e.msg, bc->needle), "%s: error '%s' should mention '%s'", bc->what, e.msg, bc->needle);
        cr_expect(!strchr(e.msg, '\n'), "%s: error is more than one line", bc->what);
        cr_expect(!exists(out) && !exists(tmp), "%s: output left behind", bc->what);
        tc_rm_rf(hf);
        free(hf);
    }
}

// The binary: one line on stderr, exit 1 (bad input) or 2 (bad usage), nothing left behind.
Test(convert, cli_errors) {
    const char *bin = getenv("DJINN_BIN");
    if (!bin) cr_skip_test("DJINN_BIN is not set: run through 'make test'");
    need_stories();
    char cmd[8192], err[8192], *dir = tc_tmpdir("conv");
    snprintf(cmd, sizeof cmd, "%s/convert", bin);
    if (access(cmd, X_OK)) cr_skip_test("%s/convert not built", bin);

    snprintf(cmd, sizeof cmd, "%s/convert /nonexistent %s/o.bin", bin, dir);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 1, "%s", err);
    cr_assert_eq(count_lines(err), 1, "want one line: %s", err);
    cr_assert(strstr(err, "/nonexistent"), "%s", err);

    snprintf(cmd, sizeof cmd, "%s/convert %s %s/o.bin --dtype f8", bin, stories, dir);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "f8"), "%s", err);
    snprintf(cmd, sizeof cmd, "%s/convert %s %s/o.bin --bogus", bin, stories, dir);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "--bogus"), "%s", err);
    cr_assert_eq(count_lines(err), 1, "an unknown option is one line, as djinn's: %s", err);
    snprintf(cmd, sizeof cmd, "%s/convert %s", bin, stories);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 2, "%s", err);
    cr_assert(count_lines(err) == 1 && strstr(err, "need HF_DIR and OUT.bin (see convert --help)\n"), "%s", err);
    // no arguments: the synopsis in one line, as djinn answers with one
    snprintf(cmd, sizeof cmd, "%s/convert", bin);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 2, "%s", err);
    const char *synopsis = "usage: convert HF_DIR OUT.bin [--dtype f16|bf16|f32|q8|q4]";
    cr_assert(count_lines(err) == 1 && !strncmp(err, synopsis, strlen(synopsis)) &&
                  strstr(err, "(see convert --help)\n"), "%s", err);
    // --help on stdout: the quantized formats' figures are model.h's (the bits a weight of a row of whole groups,
    // the group, the format version written), not words that outlive them
    char help[4400], want[200];
    snprintf(help, sizeof help, "%s/help.txt", dir);
    snprintf(cmd, sizeof cmd, "{ %s/convert --help > %s; }", bin, help);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 0, "%s", err);
    char *h = tc_must_read(help, NULL);
    const uint64_t n = DJ_QGROUP * DJ_ROW_ALIGN;
    snprintf(want, sizeof want, "(%.1f / %.1f bits per weight", dj_row_bytes(DJ_Q8, n) * 8.0 / n,
             dj_row_bytes(DJ_Q4, n) * 8.0 / n);
    cr_assert(strstr(h, want), "--help lacks '%s': %s", want, h);
    snprintf(want, sizeof want, "groups of %d along each row, a 16-bit scale and zero point each", DJ_QGROUP);
    cr_assert(strstr(h, want), "--help lacks '%s': %s", want, h);
    snprintf(want, sizeof want, "(model.bin format version %u)", DJ_VERSION);
    cr_assert(strstr(h, want) && !strstr(h, "f16 scale"), "--help: '%s', no f16 scale: %s", want, h);
    free(h);
    unlink(help);

    // Disk full (a file-size limit on the process): no output, one clear line, exit 1.
    snprintf(cmd, sizeof cmd, "ulimit -f 64; %s/convert -q %s %s/o.bin --dtype f32", bin, stories, dir);
    int rc = run_cmd(cmd, err, sizeof err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert_eq(count_lines(err), 1, "want one line: %s", err);
    cr_assert(!strncmp(err, "convert: writing ", 17) && strstr(err, "o.bin.tmp"), "%s", err);
    char o[4200], t[4300];
    snprintf(o, sizeof o, "%s/o.bin", dir);
    snprintf(t, sizeof t, "%s/o.bin.tmp", dir);
    cr_assert(!exists(o) && !exists(t), "output left behind after a write error");

    snprintf(cmd, sizeof cmd, "%s/convert -q %s %s/o.bin", bin, stories, dir);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 0, "%s", err);
    cr_assert(exists(o));
    tc_rm_rf(dir);
    free(dir);
}

// ---- OUT.bin.tmp: a live writer's is refused and left alone; a dead writer's is taken over
static void expect_content(const char *path, const char *want, const char *what) {
    size_t n;
    uint8_t *b = (uint8_t *)tc_must_read(path, &n);
    cr_assert(n == strlen(want) && !memcmp(b, want, n), "%s: %s was changed", what, path);
    free(b);
}

Test(convert, tmp_of_a_live_writer_is_refused_a_dead_ones_taken_over) {
    need_stories();
    char *dir = tc_tmpdir("conv"), out[4200], tmp[4300];
    snprintf(out, sizeof out, "%s/o.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    // a writer holds OUT.bin.tmp (the lock of a running conversion): refused, its file untouched
    tc_write(tmp, "busy", 4);
    int held = open(tmp, O_RDWR);
    cr_assert(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    dj_err e;
    cr_assert_eq(run_convert(stories, out, -1, NULL, &e), -1, "converted while another writer holds %s", tmp);
    cr_assert(strstr(e.msg, "another process is writing") && strstr(e.msg, tmp) && !strchr(e.msg, '\n'), "%s", e.msg);
    cr_assert(!exists(out));
    expect_content(tmp, "busy", "refused conversion");
    cr_assert_eq(run_convert("/nonexistent", out, -1, NULL, &e), -1);  // a failure before the output opens
    expect_content(tmp, "busy", "early failure");
    const char *bin = tc_bin_dir();
    char cmd[16384], err[8192];
    snprintf(cmd, sizeof cmd, "%s/convert -q %s %s", bin, stories, out);
    cr_assert_eq(run_cmd(cmd, err, sizeof err), 1, "%s", err);
    cr_assert(count_lines(err) == 1 && strstr(err, "another process is writing"), "%s", err);
    expect_content(tmp, "busy", "./convert");
    // the writer died (its lock with it): the next run takes the file over
    close(held);
    cr_assert_eq(run_convert(stories, out, -1, NULL, &e), 0, "%s", e.msg);
    cr_assert(exists(out) && !exists(tmp));
    // a symbolic link in its place is not followed
    cr_assert_eq(symlink("/etc/passwd", tmp), 0);
    cr_assert_eq(run_convert(stories, out, -1, NULL, &e), -1);
    cr_assert(strstr(e.msg, "symbolic link"), "%s", e.msg);
    unlink(tmp);
    tc_rm_rf(dir);
    free(dir);
}

// ---- the output is never an input, never a special file
Test(convert, output_never_replaces_an_input) {
    need_stories();
    char *hf = tc_tmpdir("conv"), p[4200];
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char src[4300];
        snprintf(src, sizeof src, "%s/%s", stories, files[i]);
        if (!exists(src)) continue;
        size_t n;
        char *b = tc_must_read(src, &n);
        snprintf(p, sizeof p, "%s/%s", hf, files[i]);
        tc_write(p, b, n);
        free(b);
    }
    dj_err e;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", hf, files[i]);
        if (!exists(p)) continue;
        struct stat before, after;
        cr_assert_eq(stat(p, &before), 0);
        cr_assert_eq(run_convert(hf, p, -1, NULL, &e), -1, "converted onto its input %s", files[i]);
        cr_assert(strstr(e.msg, "same file as") && !strchr(e.msg, '\n'), "%s: %s", files[i], e.msg);
        cr_assert(stat(p, &after) == 0 && after.st_ino == before.st_ino && after.st_size == before.st_size &&
                  after.st_mtim.tv_nsec == before.st_mtim.tv_nsec, "%s was replaced", files[i]);
    }
    // a hard link to an input is that input
    char ln[4300];
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    snprintf(ln, sizeof ln, "%s/other_name.bin", hf);
    cr_assert_eq(link(p, ln), 0);
    cr_assert_eq(run_convert(hf, ln, -1, NULL, &e), -1);
    cr_assert(strstr(e.msg, "same file as"), "%s", e.msg);
    unlink(ln);
    // --tokenizer's files are inputs too
    char *tok = tc_tmpdir("conv");
    snprintf(p, sizeof p, "%s/tokenizer.json", tok);
    size_t n;
    snprintf(ln, sizeof ln, "%s/tokenizer.json", stories);
    char *b = tc_must_read(ln, &n);
    tc_write(p, b, n);
    free(b);
    cr_assert_eq(run_convert(hf, p, -1, tok, &e), -1);
    cr_assert(strstr(e.msg, "same file as"), "%s", e.msg);
    // special files: a device node, a FIFO, a folder
    const char *specials[] = {"/dev/null", NULL, hf};
    char fifo[4300];
    snprintf(fifo, sizeof fifo, "%s/fifo", tok);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    specials[1] = fifo;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(run_convert(hf, specials[i], -1, NULL, &e), -1, "converted onto %s", specials[i]);
        cr_assert(strstr(e.msg, "not a regular file") || strstr(e.msg, "a character device") ||
                  strstr(e.msg, "a FIFO") || strstr(e.msg, "a folder"), "%s: %s", specials[i], e.msg);
    }
    struct stat sn;
    cr_assert(stat("/dev/null", &sn) == 0 && S_ISCHR(sn.st_mode), "/dev/null was replaced");
    tc_rm_rf(tok), tc_rm_rf(hf);
    free(tok), free(hf);
}

// ---- inputs that are not regular files, or too large for their kind: refused at once, never read
Test(convert, special_and_oversized_inputs, .timeout = 60) {
    need_stories();
    char *hf = tc_tmpdir("conv"), p[4200], src[4300];
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json"};
    dj_err e;
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        for (int kind = 0; kind < 3; kind++) {  // a FIFO (would block forever), /dev/zero (endless), a sparse 1 GB
            for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
                snprintf(p, sizeof p, "%s/%s", hf, files[i]);
                unlink(p);
                snprintf(src, sizeof src, "%s/%s", stories, files[i]);
                if (i != k) {
                    if (exists(src)) cr_assert_eq(symlink(src, p), 0);
                } else if (kind == 0) {
                    cr_assert_eq(mkfifo(p, 0644), 0);
                } else if (kind == 1) {
                    cr_assert_eq(symlink("/dev/zero", p), 0);
                } else {
                    int fd = open(p, O_WRONLY | O_CREAT, 0644);
                    cr_assert(fd >= 0 && ftruncate(fd, 1 << 30) == 0);
                    close(fd);
                }
            }
            char out[4300];
            snprintf(out, sizeof out, "%s/o.bin", hf);
            int rc = run_convert(hf, out, -1, NULL, &e);
            if (kind == 2 && !strcmp(files[k], "model.safetensors")) {  // big is fine for weights, zeros are not
                cr_assert_eq(rc, -1);
                continue;
            }
            cr_assert_eq(rc, -1, "%s as %s was accepted", files[k], kind == 0 ? "a FIFO" : kind == 1 ? "/dev/zero" : "1 GB");
            if (kind < 2)
                cr_assert(strstr(e.msg, "not a regular file") && strstr(e.msg, files[k]), "%s: %s", files[k], e.msg);
            else
                cr_assert(strstr(e.msg, "more than the"), "%s: %s", files[k], e.msg);
            cr_assert(!exists(out));
        }
    }
    tc_rm_rf(hf);
    free(hf);
}

// ---- --tokenizer DIR lends the tokenizer; the bos/eos ids stay the model's
// Links dir/name to stories260K's file of that name.
static void link_stories(const char *dir, const char *name) {
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/%s", stories, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    cr_assert_eq(symlink(src, dst), 0, "symlink %s", dst);
}

Test(convert, tokenizer_dir_keeps_model_eos_ids) {
    need_stories();
    char *model = tc_tmpdir("conv"), *tok = tc_tmpdir("conv"), p[4200], out[4200];
    // The model says eos 5 (config.json) and 5, 7 (generation_config.json); the lent folder's own model files
    // say 9 and 11, which must not count. tokenizer_config's eos_token "</s>" (id 2) does.
    write_config(model, "\"eos_token_id\": 2", "\"eos_token_id\": 5", "model eos");
    snprintf(p, sizeof p, "%s/generation_config.json", model);
    const char *gen = "{\"eos_token_id\": [5, 7]}";
    tc_write(p, gen, strlen(gen));
    link_stories(model, "model.safetensors");
    write_config(tok, "\"eos_token_id\": 2", "\"eos_token_id\": 9", "tokenizer eos");
    snprintf(p, sizeof p, "%s/generation_config.json", tok);
    gen = "{\"eos_token_id\": 11}";
    tc_write(p, gen, strlen(gen));
    link_stories(tok, "tokenizer.json");
    link_stories(tok, "tokenizer_config.json");
    snprintf(out, sizeof out, "%s/o.bin", model);
    dj_err e;
    cr_assert_eq(run_convert(model, out, DJ_F32, tok, &e), 0, "%s", e.msg);

    dj_model m;
    dj_load_opts lo = {.quiet = 1};
    cr_assert_eq(model_load(out, &lo, &m, &e), 0, "%s", e.msg);
    dj_tokenizer *t = tok_load(m.data + m.info.tok_off, m.info.tok_size, &e);
    cr_assert(t, "%s", e.msg);
    size_t n;
    const int32_t *ids = tok_eos_ids(t, &n);
    int seen[16] = {0};
    for (size_t i = 0; i < n; i++) {
        cr_assert(ids[i] >= 0 && ids[i] < 16, "eos id %d", ids[i]);
        seen[ids[i]]++;
    }
    cr_expect(n == 3 && seen[2] == 1 && seen[5] == 1 && seen[7] == 1, "eos ids: want {2, 5, 7}, got %zu ids", n);
    cr_expect(!seen[9] && !seen[11], "eos ids taken from the tokenizer folder's model files");
    cr_expect_eq(tok_bos(t), 1);  // the post-processor's <s>
    tok_free(t);
    model_free(&m);
    tc_rm_rf(model), tc_rm_rf(tok);
    free(model), free(tok);
}

// ---- a big checkpoint: bounded memory, progress, a write error after progress started, Ctrl-C
// A sparse F32 checkpoint, all zeros: 4 layers of dim 2048 and ffn 16384 (448 MiB of F32 each; the MLP
// matrices are 128 MiB apiece), tied, the stories260K vocabulary size. Its data is a hole made with ftruncate,
// so it costs no disk; the f16 output (0.9 GB) is real and deleted by each test.
#define BIG_DIM 2048
#define BIG_FFN 16384
#define BIG_LAYERS 4

static void write_sparse_checkpoint(const char *dir, int untied) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": %d, "
               "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": 16, "
               "\"num_key_value_heads\": 16, \"vocab_size\": 512, \"max_position_embeddings\": 512, "
               "\"tie_word_embeddings\": %s}", BIG_DIM, BIG_FFN, BIG_LAYERS, untied ? "false" : "true");
    fclose(f);
    size_t cap = 1 << 16, len = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
#define TENSOR(rows, cols, ...) do {                                                                         \
        uint64_t nb = 4ull * (rows) * ((cols) ? (cols) : 1);                                              \
        len += (size_t)snprintf(h + len, cap - len, "%s\"", len ? "," : "{");                             \
        len += (size_t)snprintf(h + len, cap - len, __VA_ARGS__);                                         \
        if (cols) len += (size_t)snprintf(h + len, cap - len, "\":{\"dtype\":\"F32\",\"shape\":[%d,%d]",   \
                                          (int)(rows), (int)(cols));                                      \
        else len += (size_t)snprintf(h + len, cap - len, "\":{\"dtype\":\"F32\",\"shape\":[%d]", (int)(rows)); \
        len += (size_t)snprintf(h + len, cap - len, ",\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, \
                                (unsigned long long)(off + nb));                                          \
        off += nb;                                                                                        \
    } while (0)
    TENSOR(512, BIG_DIM, "model.embed_tokens.weight");
    for (int l = 0; l < BIG_LAYERS; l++) {
        TENSOR(BIG_DIM, 0, "model.layers.%d.input_layernorm.weight", l);
        TENSOR(BIG_DIM, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        const char *attn[] = {"q", "k", "v", "o"};
        for (int i = 0; i < 4; i++) TENSOR(BIG_DIM, BIG_DIM, "model.layers.%d.self_attn.%s_proj.weight", l, attn[i]);
        TENSOR(BIG_FFN, BIG_DIM, "model.layers.%d.mlp.gate_proj.weight", l);
        TENSOR(BIG_FFN, BIG_DIM, "model.layers.%d.mlp.up_proj.weight", l);
        TENSOR(BIG_DIM, BIG_FFN, "model.layers.%d.mlp.down_proj.weight", l);
    }
    TENSOR(BIG_DIM, 0, "model.norm.weight");
    if (untied) TENSOR(512, BIG_DIM, "lm_head.weight");
#undef TENSOR
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    uint64_t hl = len;
    cr_assert(write(fd, &hl, 8) == 8 && write(fd, h, len) == (ssize_t)len);
    cr_assert_eq(ftruncate(fd, (off_t)(8 + len + off)), 0);
    close(fd);
    free(h);
}

// Starts DJINN_BIN/convert HF OUT --tokenizer stories [-q] with resource `res` limited to `lim` (res < 0: none)
// and its stderr on a pipe (*err_fd). Exit 120/121: the limit or the exec failed in the child.
static const char *spawn_dtype;  // --dtype for spawn_convert's runs (NULL: the source's own)

static pid_t spawn_convert(const char *hf, const char *out, int quiet, int res, rlim_t lim, int *err_fd) {
    char bin[4200];
    snprintf(bin, sizeof bin, "%s/convert", getenv("DJINN_BIN"));
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        // the dispositions a shell gives a command it runs, whatever this process inherited (a job a shell put in
        // the background ignores SIGINT and SIGQUIT, and an ignored signal stays ignored across exec)
        const int sigs[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1, SIGABRT, SIGPIPE};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(fds[1], 2);
        close(fds[0]), close(fds[1]);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        if (res >= 0) {
            struct rlimit rl = {lim, lim};
            if (setrlimit(res, &rl)) _exit(120);
        }
        char *argv[9] = {bin, (char *)hf, (char *)out, "--tokenizer", stories};
        int a = 5;
        if (spawn_dtype) argv[a++] = "--dtype", argv[a++] = (char *)spawn_dtype;
        if (quiet) argv[a++] = "-q";
        execv(bin, argv);
        _exit(121);
    }
    close(fds[1]);
    *err_fd = fds[0];
    return pid;
}

// Waits for a child from spawn_convert: its exit status (128 + the signal that killed it), its stderr in buf.
static int finish_child(pid_t pid, int fd, char *buf, size_t cap) {
    int st;
    size_t len = 0;
    char sink[4096];  // past cap: keep draining, so the child never blocks on a full pipe
    for (ssize_t k; (k = read(fd, len < cap - 1 ? buf + len : sink, len < cap - 1 ? cap - 1 - len : sizeof sink)) > 0;)
        if (len < cap - 1) len += (size_t)k;
    buf[len] = 0;
    close(fd);
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st)) return 128 + WTERMSIG(st);
    cr_assert(WEXITSTATUS(st) != 120 && WEXITSTATUS(st) != 121, "./convert could not be started: %s", buf);
    return WEXITSTATUS(st);
}

// Runs a conversion to the end: its exit status, its stderr in buf.
static int convert_child(const char *hf, const char *out, int quiet, int res, rlim_t lim, char *buf, size_t cap) {
    int fd;
    pid_t pid = spawn_convert(hf, out, quiet, res, lim, &fd);
    return finish_child(pid, fd, buf, cap);
}

// Waits (up to a minute) until the child is writing OUT.bin.tmp: the file has bytes. Its mere existence is not
// enough: the writer creates it and only then locks it, and a second writer that comes between the two takes the
// unlocked tmp over as a dead writer's.
static int has_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

static void wait_writing(pid_t pid, const char *tmp) {
    for (int i = 0; i < 60000 && !has_bytes(tmp); i++) {
        int st;
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "./convert ended before writing %s", tmp);
        usleep(1000);
    }
    cr_assert(has_bytes(tmp), "./convert has not written to %s after a minute", tmp);
}

// A temporary folder holding the sparse checkpoint, and the output paths in it.
typedef struct {
    char *dir;
    char out[4200], tmp[4300];
} big_ckpt;

static void big_setup_as(big_ckpt *b, int untied) {
    need_stories();
    const char *bin = getenv("DJINN_BIN");
    if (!bin) cr_skip_test("DJINN_BIN is not set: run through 'make test'");
    char p[4200];
    snprintf(p, sizeof p, "%s/convert", bin);
    if (access(p, X_OK)) cr_skip_test("%s not built", p);
    b->dir = tc_tmpdir("conv");
    write_sparse_checkpoint(b->dir, untied);
    snprintf(b->out, sizeof b->out, "%s/big.bin", b->dir);
    snprintf(b->tmp, sizeof b->tmp, "%s.tmp", b->out);
}

static void big_setup(big_ckpt *b) { big_setup_as(b, 0); }

static void big_teardown(big_ckpt *b) {
    tc_rm_rf(b->dir);
    free(b->dir);
}

// RLIMIT_DATA counts malloc (brk and private writable mappings). The limit is what converting the 1 MB stories260K
// checkpoint needs (its two 16 MiB staging buffers, the JSON of its tokenizer) plus 32 MiB: converting 1.8 GB must
// not need more, so neither the model, nor a layer, nor one of its 64 MiB output tensors can be held in memory.
Test(convert_big, bounded_memory, .timeout = 120) {
#ifdef DJ_TEST_ASAN
    cr_skip_test("ASan build: its shadow memory makes a memory limit meaningless (runs in the plain 'make test')");
#endif
    big_ckpt b;
    big_setup(&b);
    char out[4200], err[1 << 16];
    snprintf(out, sizeof out, "%s/tiny.bin", b.dir);
    // The smallest limit (8 MiB steps) under which stories260K converts. Below it the converter fails; so may
    // the CUDA libraries it links, in their loader or their static constructors (even a crash): all count as
    // "too little" here.
    rlim_t lo = 32u << 20, hi = 1u << 30;
    cr_assert_eq(convert_child(stories, out, 1, RLIMIT_DATA, hi, err, sizeof err), 0, "even 1 GiB is too little: %s",
                 err);
    while (hi - lo > (8u << 20)) {
        rlim_t mid = lo + (hi - lo) / 2;
        unlink(out);
        if (convert_child(stories, out, 1, RLIMIT_DATA, mid, err, sizeof err) == 0) hi = mid;
        else lo = mid;
    }
    unlink(out);
    rlim_t limit = hi + (32u << 20);
    cr_log_info("stories260K converts in %llu MiB of data; the 1.8 GB checkpoint gets %llu MiB",
                (unsigned long long)(hi >> 20), (unsigned long long)(limit >> 20));

    setenv("DJINN_PROGRESS", "1", 1);  // the running progress line, though stderr is a pipe
    int rc = convert_child(b.dir, b.out, 0, RLIMIT_DATA, limit, err, sizeof err);
    unsetenv("DJINN_PROGRESS");
    cr_assert_eq(rc, 0, "exit %d under a %llu MiB data limit: %s", rc, (unsigned long long)(limit >> 20), err);
    // Progress on stderr: GB done of the total, GB/s, ETA (writing and syncing 0.9 GB takes well over the 0.25 s
    // between progress lines); then the summary.
    cr_expect(strstr(err, " / 0.9") && strstr(err, "GB/s, ETA"), "no progress line: %s", err);
    cr_expect(strstr(err, " GB in "), "no summary line: %s", err);
    // The output's header and section table check out against its size.
    struct stat sb;
    cr_assert_eq(stat(b.out, &sb), 0);
    int fd = open(b.out, O_RDONLY);
    uint8_t *head = malloc(1 << 20);
    cr_assert_eq(read(fd, head, 1 << 20), 1 << 20);
    close(fd);
    dj_model_info info;
    dj_err e;
    cr_assert_eq(model_parse(head, 1 << 20, (uint64_t)sb.st_size, &info, &e), 0, "%s", e.msg);
    cr_expect(info.config.n_layers == BIG_LAYERS && info.config.hidden_dim == BIG_FFN && info.config.wtype == DJ_F16);
    dj_info_free(&info);
    free(head);
    big_teardown(&b);
}

// A write error once progress is on screen: the error is a line of its own, the only one after the progress.
// The converter's test hook (DJINN_TEST_PROGRESS_AT) puts a progress line out at 64 MiB, whatever the clock says,
// so it is on screen before the 300 MiB file-size limit is reached however fast or slow the machine is.
Test(convert_big, write_error_after_progress, .timeout = 120) {
    big_ckpt b;
    big_setup(&b);
    const char *dtypes[] = {NULL, "q8"};  // f16, written in order; q8, written by every thread
    for (int d = 0; d < 2; d++) {
        char err[1 << 16];
        int fd;
        setenv("DJINN_PROGRESS", "1", 1);  // the running progress line, though stderr is a pipe
        setenv("DJINN_TEST_PROGRESS_AT", "67108864", 1);
        spawn_dtype = dtypes[d];
        pid_t pid = spawn_convert(b.dir, b.out, 0, RLIMIT_FSIZE, 300u << 20, &fd);
        spawn_dtype = NULL;
        unsetenv("DJINN_PROGRESS");
        unsetenv("DJINN_TEST_PROGRESS_AT");
        int rc = finish_child(pid, fd, err, sizeof err);
        cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
        const char *at = strstr(err, "convert: writing ");
        cr_assert(at, "no write error: %s", err);
        cr_assert(strstr(err, "GB/s, ETA") && strstr(err, "GB/s, ETA") < at, "no progress before the error: %s", err);
        cr_assert(at[-1] == '\n', "the error does not start a line: ...%.80s", at - 80 > err ? at - 80 : err);
        cr_assert(strstr(at, "big.bin.tmp: File too large\n") && !strchr(at, '\n')[1], "want one error line: %s", at);
        cr_assert(!exists(b.out) && !exists(b.tmp), "output left behind after a write error");
    }
    big_teardown(&b);
}

// Killed while it writes (SIGTERM, SIGHUP, Ctrl-C): the conversion dies of that signal and leaves neither OUT.bin
// nor OUT.bin.tmp (fileio's kill table names the tmp it holds).
Test(convert_big, killed_leaves_no_tmp, .timeout = 120) {
    big_ckpt b;
    big_setup(&b);
    const int sigs[] = {SIGTERM, SIGHUP, SIGINT};
    for (int k = 0; k < 3; k++) {
        char err[1 << 16];
        int fd;
        pid_t pid = spawn_convert(b.dir, b.out, 1, -1, 0, &fd);
        wait_writing(pid, b.tmp);
        kill(pid, sigs[k]);
        int rc = finish_child(pid, fd, err, sizeof err);
        cr_assert_eq(rc, 128 + sigs[k], "signal %d: exit %d: %s", sigs[k], rc, err);
        cr_assert(!exists(b.out) && !exists(b.tmp), "killed by signal %d: output left behind", sigs[k]);
    }
    big_teardown(&b);
}

// A write error in the output's last rows, those of a q8 lm_head: only the threads writing them see it, as no write
// follows (the lm_head ends the file), so a lost error would leave a short model renamed into place.
Test(convert_big, write_error_in_the_last_rows, .timeout = 120) {
    big_ckpt b;
    big_setup_as(&b, 1);
    char err[1 << 16];
    int fd;
    spawn_dtype = "q8";
    pid_t pid = spawn_convert(b.dir, b.out, 1, -1, 0, &fd);
    int rc = finish_child(pid, fd, err, sizeof err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    struct stat sb;
    cr_assert_eq(stat(b.out, &sb), 0);
    cr_assert_eq(unlink(b.out), 0);
    pid = spawn_convert(b.dir, b.out, 1, RLIMIT_FSIZE, (rlim_t)sb.st_size - 4096, &fd);
    rc = finish_child(pid, fd, err, sizeof err);
    spawn_dtype = NULL;
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(count_lines(err) == 1 && strstr(err, "convert: writing ") && strstr(err, "big.bin.tmp: File too large"),
              "want one write error line: %s", err);
    cr_assert(!exists(b.out) && !exists(b.tmp), "output left behind after a write error");
    big_teardown(&b);
}

Test(convert_big, input_truncated_during_conversion, .timeout = 120) {
    big_ckpt b;
    big_setup(&b);
    char st_path[4300];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", b.dir);
    struct stat sb;
    cr_assert_eq(stat(st_path, &sb), 0);
    const char *dtypes[] = {NULL, "q8"};  // f16, read in order; q8, read by every thread
    for (int d = 0; d < 2; d++) {
        char err[1 << 16];
        cr_assert_eq(truncate(st_path, sb.st_size), 0);  // the sparse file whole again (zeros)
        int fd;
        spawn_dtype = dtypes[d];
        pid_t pid = spawn_convert(b.dir, b.out, 1, -1, 0, &fd);
        spawn_dtype = NULL;
        wait_writing(pid, b.tmp);
        kill(pid, SIGSTOP);
        cr_assert_eq(truncate(st_path, sb.st_size / 2), 0);
        kill(pid, SIGCONT);
        int rc = finish_child(pid, fd, err, sizeof err);
        cr_assert_eq(rc, 1, "%s: exit %d (128 + %d is SIGBUS): %s", dtypes[d] ? dtypes[d] : "f16", rc, SIGBUS, err);
        cr_assert(count_lines(err) == 1 && (strstr(err, "truncated or changed") || strstr(err, "changed while")),
                  "%s", err);
        cr_assert(!exists(b.out) && !exists(b.tmp), "output left behind");
    }
    big_teardown(&b);
}

// More inputs than a fixed list would hold: stories260K's tensors in one shard and 4200 more shards of one ignored
// rotary table each. The output named as the last shard is refused as the first is, and neither is touched.
Test(convert, output_never_replaces_a_late_shard) {
    need_stories();
    enum { EXTRA = 4200 };
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < EXTRA + 64)
        cr_skip_test("the open-file limit (%llu) is below the %d shards this case opens", (unsigned long long)rl.rlim_max,
                     EXTRA + 1);
    const rlim_t soft = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    char *hf = tc_tmpdir("conv"), p[4200];
    link_stories(hf, "config.json"), link_stories(hf, "tokenizer.json");
    source src;
    source_open(&src);
    size_t *all = malloc(src.st.n * sizeof *all);
    cr_assert(all);
    for (size_t i = 0; i < src.st.n; i++) all[i] = i;
    snprintf(p, sizeof p, "%s/model-00000.safetensors", hf);
    write_safetensors(p, &src.st, all, src.st.n);
    size_t cap = (size_t)(EXTRA + src.st.n) * 96 + 256, len = 0;
    char *idx = malloc(cap);
    cr_assert(idx);
    len += (size_t)snprintf(idx, cap, "{\"weight_map\":{");
    for (size_t i = 0; i < src.st.n; i++)
        len += (size_t)snprintf(idx + len, cap - len, "\"%s\":\"model-00000.safetensors\",", src.st.tensors[i].name);
    for (int i = 1; i <= EXTRA; i++) {
        char hdr[160], file[96];
        const int hn = snprintf(hdr, sizeof hdr,
                                "{\"r%d.rotary_emb.inv_freq\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", i);
        uint8_t buf[8 + 160 + 4] = {0};
        const uint64_t h64 = (uint64_t)hn;
        memcpy(buf, &h64, 8), memcpy(buf + 8, hdr, (size_t)hn);
        snprintf(file, sizeof file, "model-%05d.safetensors", i);
        snprintf(p, sizeof p, "%s/%s", hf, file);
        tc_write(p, buf, 8 + (size_t)hn + 4);
        len += (size_t)snprintf(idx + len, cap - len, "%s\"r%d.rotary_emb.inv_freq\":\"%s\"", i > 1 ? "," : "", i, file);
    }
    len += (size_t)snprintf(idx + len, cap - len, "}}");
    cr_assert_lt(len, cap);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", hf);
    tc_write(p, idx, len);
    dj_err e;
    const int shards[2] = {1, EXTRA};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/model-%05d.safetensors", hf, shards[k]);
        struct stat before, after;
        cr_assert_eq(stat(p, &before), 0);
        cr_expect_eq(run_convert(hf, p, -1, NULL, &e), -1, "converted onto shard %d of %d", shards[k], EXTRA + 1);
        cr_expect(strstr(e.msg, "same file as"), "shard %d: %s", shards[k], e.msg);
        cr_expect(stat(p, &after) == 0 && after.st_ino == before.st_ino && after.st_size == before.st_size,
                  "shard %d was replaced", shards[k]);
    }
    rl.rlim_cur = soft;
    setrlimit(RLIMIT_NOFILE, &rl);
    source_close(&src);
    free(all), free(idx);
    tc_rm_rf(hf);
    free(hf);
}

// ---- weights that are not numbers: refused by the tensor's name, in any source dtype
Test(convert, non_finite_weights_refused_by_name) {
    need_stories();
    char src[4300];
    snprintf(src, sizeof src, "%s/fixtures/tied_gqa_f16/model.safetensors", tc_tests_dir());
    const struct { const char *ckpt; const char *tensor; uint32_t bits; const char *want; } cases[] = {
        {NULL, "model.layers.2.mlp.down_proj.weight", 0x7fc00000u, "NaN"},          // stories260K: F32
        {NULL, "model.norm.weight", 0xff800000u, "an infinity"},                     // a norm, -inf
        {src, "model.layers.0.self_attn.k_proj.weight", 0x7c00u, "an infinity"},     // f16 source
        {src, "model.embed_tokens.weight", 0x7e00u, "NaN"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char *hf = tc_tmpdir("conv"), p[4400], in[4400], out[4400];
        if (cases[c].ckpt) {
            snprintf(in, sizeof in, "%s", cases[c].ckpt);
        } else {
            snprintf(in, sizeof in, "%s/model.safetensors", stories);
        }
        size_t n;
        uint8_t *raw = (uint8_t *)tc_must_read(in, &n);
        st_file f;
        dj_err e;
        cr_assert_eq(st_parse(raw, n, &f, &e), 0, "%s", e.msg);
        const st_tensor *t = st_find(&f, cases[c].tensor);
        cr_assert(t, "%s has no %s", in, cases[c].tensor);
        size_t es = st_dtype_size(t->dtype), at = (size_t)(t->nbytes / es / 2);  // the middle element
        memcpy((uint8_t *)t->data + at * es, &cases[c].bits, es);
        st_free(&f);
        snprintf(p, sizeof p, "%s/model.safetensors", hf);
        tc_write(p, raw, n);
        free(raw);
        // the rest of the folder from where the weights came
        char dir[4300];
        snprintf(dir, sizeof dir, "%s", cases[c].ckpt ? cases[c].ckpt : stories);
        if (cases[c].ckpt) *strrchr(dir, '/') = 0;
        const char *names[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 4; i++) {
            snprintf(in, sizeof in, "%s/%s", dir, names[i]);
            snprintf(p, sizeof p, "%s/%s", hf, names[i]);
            if (exists(in)) cr_assert_eq(symlink(in, p), 0);
        }
        snprintf(out, sizeof out, "%s/o.bin", hf);
        char elem[64];
        snprintf(elem, sizeof elem, "at element %zu:", at);
        const int dtypes[] = {-1, DJ_Q8, DJ_Q4};  // the source's dtype; quantized, each thread checking its rows
        for (int d = 0; d < 3; d++) {
            int rc = run_convert(hf, out, dtypes[d], cases[c].ckpt ? stories : NULL, &e);
            cr_assert_eq(rc, -1, "case %zu, dtype %d: converted weights holding %s", c, dtypes[d], cases[c].want);
            cr_assert(strstr(e.msg, cases[c].tensor) && strstr(e.msg, cases[c].want) && strstr(e.msg, elem),
                      "case %zu, dtype %d: %s (want %s)", c, dtypes[d], e.msg, elem);
            cr_assert(!exists(out));
        }
        tc_rm_rf(hf);
        free(hf);
    }
}

// ---- shapes and the tokenizer's size, checked exactly: a vector stored as a one-column matrix, a matrix whose bytes
// fit the expected shape in another dtype, a tokenizer of one token more than the model's vocabulary
// stories260K's safetensors read into *raw (malloc'd) and parsed into st; the tensor `name` of it.
static st_tensor *stories_tensor(uint8_t **raw, st_file *st, const char *name) {
    char p[4200];
    size_t n;
    snprintf(p, sizeof p, "%s/model.safetensors", stories);
    *raw = (uint8_t *)tc_must_read(p, &n);
    dj_err e;
    cr_assert_eq(st_parse(*raw, n, st, &e), 0, "%s", e.msg);
    st_tensor *t = (st_tensor *)st_find(st, name);
    cr_assert(t, "no %s", name);
    return t;
}

// Every tensor of st, in its order, into a safetensors file at path.
static void write_all_tensors(const char *path, const st_file *st) {
    size_t *idx = calloc(st->n, sizeof *idx);
    for (size_t i = 0; i < st->n; i++) idx[i] = i;
    write_safetensors(path, st, idx, st->n);
    free(idx);
}

static void write_stories_with(const char *hf, const char *name, int dtype, int ndim, int64_t d0, int64_t d1) {
    char p[4200];
    write_config(hf, NULL, NULL, name);
    uint8_t *raw;
    st_file st;
    st_tensor *t = stories_tensor(&raw, &st, name);
    t->dtype = dtype, t->ndim = ndim, t->shape[0] = d0, t->shape[1] = d1;
    snprintf(p, sizeof p, "%s/model.safetensors", hf);
    write_all_tensors(p, &st);
    st_free(&st);
    free(raw);
}

Test(convert, shapes_and_tokenizer_size_exactly) {
    need_stories();
    static const struct { const char *name; int dtype, ndim; int64_t d0, d1; const char *needle; } cases[] = {
        {"model.norm.weight", ST_F32, 2, 64, 1, "expected [64]"},  // the same floats, one more dimension
        {"model.layers.1.mlp.gate_proj.weight", ST_F16, 2, 172, 128, "expected [172, 64]"},  // the same bytes
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *hf = tc_tmpdir("conv"), out[4200];
        write_stories_with(hf, cases[i].name, cases[i].dtype, cases[i].ndim, cases[i].d0, cases[i].d1);
        snprintf(out, sizeof out, "%s/out.bin", hf);
        dj_err e = {{0}};
        cr_expect_eq(run_convert(hf, out, DJ_F32, stories, &e), -1, "%s stored as [%lld, %lld]: converted",
                     cases[i].name, (long long)cases[i].d0, (long long)cases[i].d1);
        cr_expect(strstr(e.msg, cases[i].needle), "%s: '%s' should say '%s'", cases[i].name, e.msg, cases[i].needle);
        tc_rm_rf(hf);
        free(hf);
    }
    // a tokenizer of 513 tokens (one added after the 512 of the model's vocabulary) beside vocab_size 512
    char *model = tc_tmpdir("conv"), *tok = tc_tmpdir("conv"), p[4200], out[4200];
    write_config(model, NULL, NULL, "model");
    link_stories(model, "model.safetensors");
    link_stories(tok, "tokenizer_config.json");
    snprintf(p, sizeof p, "%s/tokenizer.json", stories);
    size_t n;
    char *tj = tc_must_read(p, &n), *at = strstr(tj, "\"added_tokens\": [");
    cr_assert(at, "no added_tokens in %s", p);
    at += strlen("\"added_tokens\": [");
    const char *extra = "{\"id\": 512, \"content\": \"<extra>\", \"single_word\": false, \"lstrip\": false, "
                        "\"rstrip\": false, \"normalized\": false, \"special\": true}, ";
    char *edited = malloc(n + strlen(extra) + 1);
    memcpy(edited, tj, (size_t)(at - tj));
    strcpy(edited + (at - tj), extra);
    strcat(edited, at);
    snprintf(p, sizeof p, "%s/tokenizer.json", tok);
    tc_write(p, edited, strlen(edited));
    snprintf(out, sizeof out, "%s/o.bin", model);
    dj_err e = {{0}};
    cr_expect_eq(run_convert(model, out, DJ_F32, tok, &e), -1, "a tokenizer of 513 tokens for a vocabulary of 512");
    cr_expect(strstr(e.msg, "513 tokens"), "%s", e.msg);
    free(tj), free(edited);
    tc_rm_rf(model), tc_rm_rf(tok);
    free(model), free(tok);
}

// A file touched while the converter reads it (same size, same zeros, a new time): refused at the end, as a file
// that may have changed between the reads, and nothing written.
Test(convert_big, input_touched_during_conversion, .timeout = 120) {
    big_ckpt b;
    big_setup(&b);
    char st_path[4300], err[1 << 16];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", b.dir);
    int fd;
    pid_t pid = spawn_convert(b.dir, b.out, 1, -1, 0, &fd);
    wait_writing(pid, b.tmp);
    kill(pid, SIGSTOP);
    cr_assert_eq(utimensat(AT_FDCWD, st_path, NULL, 0), 0);  // now
    kill(pid, SIGCONT);
    int rc = finish_child(pid, fd, err, sizeof err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert(count_lines(err) == 1 && strstr(err, "changed while"), "%s", err);
    cr_assert(!exists(b.out) && !exists(b.tmp), "output left behind");
    big_teardown(&b);
}

// A weight that is not a number as the first element of its tensor (the first of a chunk read), in the source's
// dtype and quantized.
Test(convert, non_finite_first_weight_refused) {
    need_stories();
    char *hf = tc_tmpdir("conv"), out[4400];
    uint8_t *raw;
    st_file f;
    dj_err e;
    st_tensor *t = stories_tensor(&raw, &f, "model.layers.0.self_attn.q_proj.weight");
    const uint32_t nan = 0x7fc00000u;
    memcpy((uint8_t *)t->data, &nan, 4);
    snprintf(out, sizeof out, "%s/model.safetensors", hf);
    write_all_tensors(out, &f);
    st_free(&f);
    free(raw);
    const char *names[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) link_stories(hf, names[i]);
    snprintf(out, sizeof out, "%s/o.bin", hf);
    const int dtypes[] = {-1, DJ_Q8};
    for (int d = 0; d < 2; d++) {
        cr_expect_eq(run_convert(hf, out, dtypes[d], NULL, &e), -1, "dtype %d: a NaN first weight converted", dtypes[d]);
        cr_expect(strstr(e.msg, "q_proj") && strstr(e.msg, "NaN") && strstr(e.msg, "at element 0:"), "dtype %d: %s",
                  dtypes[d], e.msg);
    }
    tc_rm_rf(hf);
    free(hf);
}
