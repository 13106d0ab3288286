// gen_seeds.c: writes the generated part of the fuzz seed corpus (`make fuzz-seeds`): small valid model.bin
// images (in fuzz_model's compact form), small safetensors files, two hand-built tokenizer sections, texts and id
// arrays for the real tokenizers, HTTP request heads and API request bodies. Usage: gen_seeds CORPUS_DIR
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../model.h"
#include "../../tokenizer.h"

static void put(const char *dir, const char *sub, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/seed_%s", dir, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) dj_die("cannot write %s", path);
}

// ---- model.bin, in fuzz_model's compact form: the 128-byte header, then the file from offset 4096 (the section
// table, then the tokenizer section when `with_tok`); the fuzz target zero-fills the rest.
static void model_seed(const char *dir, const char *name, const dj_config *c, const void *tok, size_t tok_n,
                       int with_tok) {
    dj_model_info m;
    dj_err e;
    if (model_plan(c, tok_n, &m, &e)) dj_die("%s: %s", name, e.msg);
    uint64_t hb = model_header_bytes(c->n_layers), end = with_tok ? m.tok_off + tok_n : hb;
    uint8_t *img = calloc(1, end);
    if (!img) dj_die("out of memory");
    if (model_write_header(&m, img, hb, &e)) dj_die("%s: %s", name, e.msg);
    if (with_tok) memcpy(img + m.tok_off, tok, tok_n);
    else end = DJ_HEADER_SIZE + (c->n_layers + 3) * sizeof(dj_disk_section);
    memmove(img + sizeof(dj_disk_header), img + DJ_HEADER_SIZE, end - DJ_HEADER_SIZE);
    put(dir, "fuzz_model", name, img, sizeof(dj_disk_header) + end - DJ_HEADER_SIZE);
    free(img);
    dj_info_free(&m);
}

// ---- safetensors: 8-byte header length, JSON header, data
static void st_seed(const char *dir, const char *name, const char *json, size_t data_n) {
    size_t h = strlen(json);
    uint8_t *b = calloc(1, 8 + h + data_n);
    if (!b) dj_die("out of memory");
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    for (size_t i = 0; i < data_n; i++) b[8 + h + i] = (uint8_t)(i * 37);
    put(dir, "fuzz_safetensors", name, b, 8 + h + data_n);
    free(b);
}

// ---- tokenizer sections, hand-built small (the real ones are tens of KB to MB): the layout of tokenizer.h
typedef struct {
    uint32_t type, flags, pretok, strip;
    int32_t unk, bos;
    const char *const *pieces;  // n_vocab, NULL-terminated
    const uint8_t *attr;
    const uint32_t (*merges)[3];
    uint32_t n_merges;
    const uint32_t *added;  // ids whose piece is also an added-token content
    uint32_t n_added;
    int32_t eos;
    const char *tmpl;
} tiny_tok;

static size_t tiny_blob(const tiny_tok *t, uint8_t *b, size_t cap) {
    uint32_t nv = 0;
    while (t->pieces[nv]) nv++;
    uint64_t off = TOK_HEADER_SIZE, secoff[TOK_N_SEC], secsz[TOK_N_SEC];
    uint64_t pool = 0;
    for (uint32_t i = 0; i < nv; i++) pool += strlen(t->pieces[i]);
    secsz[TOK_SEC_PIECE_OFF] = 8ull * (nv + 1), secsz[TOK_SEC_ATTR] = nv, secsz[TOK_SEC_POOL] = pool;
    secsz[TOK_SEC_MERGES] = 12ull * t->n_merges, secsz[TOK_SEC_ADDED] = 24ull * t->n_added;
    secsz[TOK_SEC_EOS] = 4, secsz[TOK_SEC_TEMPLATE] = strlen(t->tmpl);
    for (int i = 0; i < TOK_N_SEC; i++) secoff[i] = off, off = dj_align_up(off + secsz[i], 8);
    if (off > cap) dj_die("tiny tokenizer too large");
    memset(b, 0, off);
    memcpy(b, TOK_MAGIC, 8);
    uint32_t h32[] = {TOK_VERSION, t->type, t->flags, (uint32_t)t->unk, (uint32_t)t->bos, UINT32_MAX, nv, t->n_merges,
                      t->n_added, 1, t->pretok, 0, t->strip};
    memcpy(b + 8, h32, sizeof h32);
    for (int i = 0; i < TOK_N_SEC; i++) memcpy(b + 64 + 16 * i, &secoff[i], 8), memcpy(b + 72 + 16 * i, &secsz[i], 8);
    uint64_t at = 0, *po = (uint64_t *)(b + secoff[TOK_SEC_PIECE_OFF]), pstart[64];
    for (uint32_t i = 0; i < nv; i++) {
        size_t len = strlen(t->pieces[i]);
        po[i] = pstart[i] = at;
        memcpy(b + secoff[TOK_SEC_POOL] + at, t->pieces[i], len);
        at += len;
    }
    po[nv] = at;
    memcpy(b + secoff[TOK_SEC_ATTR], t->attr, nv);
    memcpy(b + secoff[TOK_SEC_MERGES], t->merges, 12ull * t->n_merges);
    for (uint32_t i = 0; i < t->n_added; i++) {
        uint8_t *a = b + secoff[TOK_SEC_ADDED] + 24ull * i;
        uint64_t o = pstart[t->added[i]], l = strlen(t->pieces[t->added[i]]);
        memcpy(a, &t->added[i], 4), memcpy(a + 8, &o, 8), memcpy(a + 16, &l, 8);
    }
    memcpy(b + secoff[TOK_SEC_EOS], &t->eos, 4);
    memcpy(b + secoff[TOK_SEC_TEMPLATE], t->tmpl, strlen(t->tmpl));
    return off;
}

// ---- tokenizer inputs: one selector byte (see fuzz_tokenizer.c), then the payload
// An input of a target whose first byte selects (fuzz_tokenizer, fuzz_http, fuzz_api): sel, then p.
static void sel_seed(const char *dir, const char *target, const char *name, uint8_t sel, const void *p, size_t n) {
    uint8_t *b = malloc(n + 1);
    if (!b) dj_die("out of memory");
    b[0] = sel;
    memcpy(b + 1, p, n);
    put(dir, target, name, b, n + 1);
    free(b);
}
static void tok_seed(const char *dir, const char *name, uint8_t sel, const void *p, size_t n) {
    sel_seed(dir, "fuzz_tokenizer", name, sel, p, n);
}

int main(int argc, char **argv) {
    if (argc != 2) dj_die("usage: gen_seeds CORPUS_DIR");
    const char *dir = argv[1];
    dj_config c = {.dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .hidden_dim = 16,
                   .vocab_size = 4, .max_seq_len = 16, .tied = 1, .norm_eps = 1e-5f,
                   .rope_theta = 10000};
    dj_config_set_wtype(&c, DJ_F32);
    static const uint8_t small_tok[16] = "DJINNTOK";
    model_seed(dir, "f32_tied", &c, small_tok, sizeof small_tok, 0);
    dj_config c2 = c;
    dj_config_set_wtype(&c2, DJ_F16), c2.tied = 0, c2.n_layers = 2, c2.n_kv_heads = 2;
    model_seed(dir, "f16_untied_2layers", &c2, small_tok, sizeof small_tok, 0);
    dj_config c3 = c;
    dj_config_set_wtype(&c3, DJ_BF16), c3.rope_type = DJ_ROPE_LLAMA3, c3.rope_factor = 8, c3.rope_low_freq = 1,
    c3.rope_high_freq = 4, c3.rope_orig_max = 8192, c3.head_dim = 6, c3.vocab_size = 300;
    model_seed(dir, "bf16_llama3", &c3, small_tok, sizeof small_tok, 0);

    st_seed(dir, "f32", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16);
    st_seed(dir, "mixed",
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"model.layers.0.w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
            "\"model.norm\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[6,10]},"
            "\"scalar\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[10,18]},"
            "\"empty\":{\"dtype\":\"F8_E4M3\",\"shape\":[0,5],\"data_offsets\":[18,18]},"
            "\"u8\":{\"dtype\":\"U8\",\"shape\":[2,1,1],\"data_offsets\":[18,20]}}    ",
            20);
    st_seed(dir, "empty", "{}", 0);

    enum { E = TOK_A_EXISTS, M = TOK_A_MODEL, A = TOK_A_ADDED | TOK_A_SPECIAL };
    static const char *const spm_pieces[] = {"<unk>", "<s>", "</s>", "<0x41>", "<0xC3>", "<0xA9>", "\xe2\x96\x81", "a",
                                             "b", "\xe2\x96\x81" "a", "ab", "<|x|>", NULL};
    static const uint8_t spm_attr[] = {E | M | A, E | M | A, E | M | A, E | M, E | M, E | M, E | M, E | M, E | M, E | M, E | M, E | A};
    static const uint32_t spm_merges[][3] = {{6, 7, 9}, {7, 8, 10}};
    static const uint32_t spm_added[] = {1, 2, 11};
    const tiny_tok spm = {TOK_TYPE_SPM, TOK_F_ADD_BOS | TOK_F_NORM_PREPEND | TOK_F_NORM_REPLACE | TOK_F_BYTE_FALLBACK |
                          TOK_F_FUSE_UNK, TOK_PRE_NONE, 1, 0, 1, spm_pieces, spm_attr, spm_merges, 2, spm_added, 3, 2,
                          "{{ x }}"};
    static const char *const bl_pieces[] = {"a", "b", " ", "ab", " ab", "\xc3", "\xa9", "\xc3\xa9", "\n", "<|bos|>",
                                            "<|eot|>", NULL};
    static const uint8_t bl_attr[] = {E | M, E | M, E | M, E | M, E | M, E | M, E | M, E | M, E | M, E | A, E | A};
    static const uint32_t bl_merges[][3] = {{0, 1, 3}, {2, 3, 4}, {5, 6, 7}};
    static const uint32_t bl_added[] = {9, 10};
    const tiny_tok bl = {TOK_TYPE_BYTELEVEL, TOK_F_ADD_BOS | TOK_F_IGNORE_MERGES, TOK_PRE_LLAMA3, 0, -1, 9, bl_pieces,
                         bl_attr, bl_merges, 3, bl_added, 2, 10, ""};
    uint8_t blob[2048];
    size_t bn = tiny_blob(&spm, blob, sizeof blob);
    tok_seed(dir, "load_spm", 0, blob, bn);
    bn = tiny_blob(&bl, blob, sizeof blob);
    tok_seed(dir, "load_bytelevel", 0, blob, bn);
    static const char *const texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "<|begin_of_text|>Hello world!<|eot_id|>  \n\n\tx",
        "<s> caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80 12345678 it's I'LL don't",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c </s><unk>",
    };
    for (int sel = 1; sel <= 3; sel++)
        for (int i = 0; i < 4; i++) {
            char name[64];
            snprintf(name, sizeof name, "text%d_%d", sel, i);
            tok_seed(dir, name, (uint8_t)(sel | (i & 1) << 7), texts[i], strlen(texts[i]));
        }
    static const int32_t llama3_ids[] = {128000, 2028, 374, 264, 1296, 11914, 13, 128009, 9468, 239, 222};
    static const int32_t llama2_ids[] = {1, 9038, 2501, 263, 931, 29892, 3, 231, 132, 133, 2};
    static const int32_t tiny_ids[] = {1, 403, 407, 261, 3, 200, 201, 2, 511};
    tok_seed(dir, "ids_llama3", 4, llama3_ids, sizeof llama3_ids);
    tok_seed(dir, "ids_llama2", 5, llama2_ids, sizeof llama2_ids);
    tok_seed(dir, "ids_stories", 6, tiny_ids, sizeof tiny_ids);

    // request heads as clients send them (fuzz_http: first byte, the body limit: 3 is 2^40)
    static const char *const heads[] = {
        ("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type: application/json\r\n"
         "Authorization: Bearer sk-test\r\nContent-Length: 16\r\nConnection: keep-alive\r\n\r\n{\"messages\": []}"),
        "GET /health?x=1 HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length:  12 \r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
    };
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "head_%d", i);
        sel_seed(dir, "fuzz_http", name, (uint8_t)(i == 0 ? 1 : 3), heads[i], strlen(heads[i]));
    }
    // request bodies (fuzz_api: first byte bit 0 chat, bits 1-2 the model, bit 3 the long context, bit 4
    // breakpoints)
    static const struct { uint8_t sel; const char *body; } bodies[] = {
        {8, "{\"model\": \"m\", \"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0.7, "
            "\"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"seed\": -3, \"stop\": [\"\\n\", \"The end\"], "
            "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"echo\": false, \"ignore_eos\": true}"},
        {9, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
            "\"content\": [{\"type\": \"text\", \"text\": \"Hi \\u00e9\"}]}, {\"role\": \"assistant\", "
            "\"content\": \"Hello\"}, {\"role\": \"user\", \"content\": \"More\"}], \"max_completion_tokens\": 5, "
            "\"session\": \"s1\", \"park\": true, \"presence_penalty\": 1.5, \"repeat_penalty\": 1.1}"},
        {11, "{\"messages\": [{\"role\": \"user\", \"content\": \"[INST] hi\"}], \"user\": \"u\", "
             "\"response_format\": {\"type\": \"text\"}, \"n\": 1}"},
        {24, "{\"prompt\": \"x\", \"break_after_layer\": 2}"},
        {24, "{\"prompt\": \"x\", \"break_after_layer\": 1, \"stream\": true}"},
        {24, "{\"resume\": {\"id\": \"brk-12\", \"residual\": \"AACAPwAAAEAAAEBAAACAwA==\"}, \"max_tokens\": 3}"},
        {25, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"resume\": {\"id\": \"brk-1\", "
             "\"residual\": \"AACAPwAAAEA=\"}}"},
        {0, "{\"prompt\": [\"one\"], \"logit_bias\": {}, \"tools\": [], \"frequency_penalty\": -2}"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        char name[32];
        snprintf(name, sizeof name, "body_%zu", i);
        sel_seed(dir, "fuzz_api", name, bodies[i].sel, bodies[i].body, strlen(bodies[i].body));
    }
    return 0;
}
