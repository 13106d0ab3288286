// test_hfconfig.c: hf_config_parse (config.json -> dj_config), table-driven: the classic keys, the
// transformers-5 keys, head_dim, GQA, tied heads, and every refusal, each a one-line error naming what it found.
// Then the committed fixtures' and stories260K's real config.json files.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../convert/hfconfig.h"
#include "common.h"

// ---- the table
// A small valid Llama config (dim 64, 8 heads): `arch` replaces the architecture keys, `keys` is appended.
#define LLAMA "\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\""
#define BASE_FMT "{%s, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, " \
                 "\"intermediate_size\": 172, \"vocab_size\": 512, \"max_position_embeddings\": 512%s}"
#define L3(factor, lo, hi, orig) "\"factor\": " factor ", \"low_freq_factor\": " lo ", \"high_freq_factor\": " hi \
                                 ", \"original_max_position_embeddings\": " orig

typedef struct {
    const char *what;
    const char *keys;   // appended to the base object: ", \"key\": value ..."
    const char *arch;   // NULL: LlamaForCausalLM / llama
    const char *error;  // NULL: must parse; else the error must contain this
    // When it parses; 0 means HF's default (head_dim dim/n_heads = 8, n_kv_heads = n_heads, theta 10000).
    uint32_t head_dim, n_kv_heads, tied, rope_type;
    float theta, factor, low, high;
    uint32_t orig;
} cfg_case;

static const cfg_case cases[] = {
    // accepted
    {"HF defaults", "", .error = NULL},
    {"explicit silu, no biases", ", \"hidden_act\": \"silu\", \"attention_bias\": false, \"mlp_bias\": false", .error = NULL},
    {"model_type without architectures", "", .arch = "\"model_type\": \"llama\""},
    {"classic rope_theta, rope_scaling null, torch_dtype",
     ", \"rope_theta\": 500000.0, \"rope_scaling\": null, \"torch_dtype\": \"bfloat16\"", .theta = 5e5f},
    {"classic llama3 via rope_type",
     ", \"rope_theta\": 500000.0, \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}",
     .rope_type = DJ_ROPE_LLAMA3, .theta = 5e5f, .factor = 8, .low = 1, .high = 4, .orig = 8192},
    {"classic llama3 via type",
     ", \"rope_theta\": 500000.0, \"rope_scaling\": {" L3("32", "1", "4", "8192") ", \"type\": \"llama3\"}",
     .rope_type = DJ_ROPE_LLAMA3, .theta = 5e5f, .factor = 32, .low = 1, .high = 4, .orig = 8192},
    {"rope_type and type agreeing", ", \"rope_scaling\": {\"rope_type\": \"default\", \"type\": \"default\"}", .error = NULL},
    {"transformers 5: rope_parameters default, dtype",
     ", \"rope_parameters\": {\"rope_theta\": 50000.0, \"rope_type\": \"default\"}, \"dtype\": \"float16\"",
     .theta = 5e4f},
    {"transformers 5: rope_parameters llama3",
     ", \"rope_parameters\": {" L3("8.0", "1.0", "4.0", "32") ", \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}",
     .rope_type = DJ_ROPE_LLAMA3, .theta = 5e5f, .factor = 8, .low = 1, .high = 4, .orig = 32},
    {"rope_parameters holding only rope_theta", ", \"rope_parameters\": {\"rope_theta\": 20000.0}",
     .theta = 2e4f},
    {"rope_parameters and rope_scaling null", ", \"rope_parameters\": {\"rope_theta\": 1e6, \"rope_type\": \"default\"}"
     ", \"rope_scaling\": null", .theta = 1e6f},
    {"rope_parameters and rope_scaling agreeing",
     ", \"rope_theta\": 500000.0, \"rope_scaling\": {" L3("8", "1", "4", "8192") ", \"rope_type\": \"llama3\"}"
     ", \"rope_parameters\": {" L3("8.0", "1.0", "4.0", "8192") ", \"rope_theta\": 500000, \"rope_type\": \"llama3\"}",
     .rope_type = DJ_ROPE_LLAMA3, .theta = 5e5f, .factor = 8, .low = 1, .high = 4, .orig = 8192},
    {"llama3 original context 1", ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "1") ", \"rope_type\": \"llama3\"}",
     .rope_type = DJ_ROPE_LLAMA3, .factor = 8, .low = 1, .high = 4, .orig = 1},
    {"llama3 original context 2^32 - 1",
     ", \"rope_scaling\": {" L3("1", "1", "4", "4294967295") ", \"rope_type\": \"llama3\"}",
     .rope_type = DJ_ROPE_LLAMA3, .factor = 1, .low = 1, .high = 4, .orig = 4294967295u},
    {"partial_rotary_factor 1", ", \"partial_rotary_factor\": 1.0", .error = NULL},
    {"head_dim", ", \"head_dim\": 16", .head_dim = 16},
    {"GQA", ", \"num_key_value_heads\": 2", .n_kv_heads = 2},
    {"tied", ", \"tie_word_embeddings\": true", .tied = 1},

    // refused
    {"attention bias", ", \"attention_bias\": true", .error = "attention biases are not supported"},
    {"MLP bias", ", \"mlp_bias\": true", .error = "MLP biases are not supported"},
    {"tied as a string", ", \"tie_word_embeddings\": \"true\"",
     .error = "\"tie_word_embeddings\" must be true or false, not a string"},
    {"bias as a number", ", \"attention_bias\": 0", .error = "\"attention_bias\" must be true or false, not a number"},
    {"other architecture", "", .arch = "\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"llama\"",
     .error = "architecture \"MistralForCausalLM\""},
    {"architecture / model_type mismatch", "",
     .arch = "\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"mistral\"",
     .error = "model_type \"mistral\""},
    {"other model_type", "", .arch = "\"model_type\": \"gpt2\"", .error = "model_type \"gpt2\""},
    {"no architecture at all", "", .arch = "\"torch_dtype\": \"float32\"", .error = "model_type \"(missing)\""},
    {"other activation", ", \"hidden_act\": \"gelu\"", .error = "activation \"gelu\""},
    {"non-string activation", ", \"hidden_act\": 1", .error = "\"hidden_act\" is a number"},
    {"null activation", ", \"hidden_act\": null", .error = "\"hidden_act\" is a null"},
    {"other RoPE type", ", \"rope_scaling\": {\"factor\": 4.0, \"rope_type\": \"yarn\"}", .error = "RoPE type \"yarn\""},
    {"linear via type", ", \"rope_scaling\": {\"factor\": 2.0, \"type\": \"linear\"}", .error = "RoPE type \"linear\""},
    {"rope_scaling without a type", ", \"rope_scaling\": {\"factor\": 4.0}",
     .error = "\"rope_scaling\" has no \"rope_type\" (or \"type\") but holds \"factor\""},
    {"rope_parameters with scaling but no type", ", \"rope_parameters\": {\"rope_theta\": 1e4, \"factor\": 8.0}",
     .error = "\"rope_parameters\" has no \"rope_type\" (or \"type\") but holds \"factor\""},
    {"non-string rope type", ", \"rope_scaling\": {\"factor\": 4.0, \"type\": 3}",
     .error = "\"rope_scaling\".\"type\" is a number, expected a string"},
    {"null rope_type", ", \"rope_parameters\": {\"rope_theta\": 1e4, \"rope_type\": null}",
     .error = "\"rope_parameters\".\"rope_type\" is a null, expected a string"},
    {"rope_type and type differing", ", \"rope_scaling\": {\"rope_type\": \"default\", \"type\": \"linear\"}",
     .error = "both \"rope_type\" and \"type\", and they differ"},
    {"rope_scaling a string", ", \"rope_scaling\": \"llama3\"", .error = "\"rope_scaling\" must be an object or null"},
    {"rope_parameters default, rope_scaling llama3",
     ", \"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"default\"}, \"rope_scaling\": {"
     L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}",
     .error = "\"rope_parameters\" says RoPE type default but \"rope_scaling\" says llama3"},
    {"llama3 values differing",
     ", \"rope_parameters\": {" L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}, \"rope_scaling\": {"
     L3("4.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}", .error = "different llama3 values"},
    // rope_parameters and rope_scaling disagreeing in one llama3 value each
    {"llama3 low_freq_factor differing",
     ", \"rope_parameters\": {" L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}, \"rope_scaling\": {"
     L3("8.0", "2.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}", .error = "different llama3 values"},
    {"llama3 high_freq_factor differing",
     ", \"rope_parameters\": {" L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}, \"rope_scaling\": {"
     L3("8.0", "1.0", "3.0", "8192") ", \"rope_type\": \"llama3\"}", .error = "different llama3 values"},
    {"llama3 original context differing",
     ", \"rope_parameters\": {" L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}, \"rope_scaling\": {"
     L3("8.0", "1.0", "4.0", "8191") ", \"rope_type\": \"llama3\"}", .error = "different llama3 values"},
    {"llama3 original context differing, the other way",
     ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "4096") ", \"rope_type\": \"llama3\"}, \"rope_parameters\": {"
     L3("8.0", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}", .error = "different llama3 values"},
    // original_max_position_embeddings: a positive integer up to 2^32 - 1
    {"llama3 original context 0", ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "0") ", \"rope_type\": \"llama3\"}",
     .error = "\"original_max_position_embeddings\" must be a positive integer"},
    {"llama3 original context -1", ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "-1") ", \"rope_type\": \"llama3\"}",
     .error = "\"original_max_position_embeddings\" must be a positive integer"},
    {"llama3 original context 2^32",
     ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "4294967296") ", \"rope_type\": \"llama3\"}",
     .error = "\"original_max_position_embeddings\" must be a positive integer"},
    {"llama3 original context 8192.5",
     ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "8192.5") ", \"rope_type\": \"llama3\"}",
     .error = "\"original_max_position_embeddings\" must be a positive integer"},
    {"llama3 original context a string",
     ", \"rope_scaling\": {" L3("8.0", "1.0", "4.0", "\"8192\"") ", \"rope_type\": \"llama3\"}",
     .error = "\"original_max_position_embeddings\" must be a positive integer"},
    {"llama3 factor a string", ", \"rope_scaling\": {" L3("\"8\"", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}",
     .error = "\"factor\" must be a number"},
    {"llama3 without original context", ", \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, "
     "\"high_freq_factor\": 4.0, \"rope_type\": \"llama3\"}",
     .error = "llama3 RoPE scaling needs \"original_max_position_embeddings\""},
    {"llama3 factor under 1", ", \"rope_scaling\": {" L3("0.5", "1.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}",
     .error = "llama3 rope factor 0.5 out of range"},
    {"rope_theta differing", ", \"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_theta\": 500000.0, "
     "\"rope_type\": \"default\"}", .error = "\"rope_theta\" 10000 disagrees with \"rope_parameters\".\"rope_theta\" 500000"},
    {"llama3 without factor",
     ", \"rope_scaling\": {\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
     "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}", .error = "llama3 RoPE scaling needs \"factor\""},
    // llama3 divides by high_freq_factor - low_freq_factor
    {"llama3 with low_freq_factor == high_freq_factor",
     ", \"rope_scaling\": {" L3("8.0", "4.0", "4.0", "8192") ", \"rope_type\": \"llama3\"}",
     .error = "0 < low_freq_factor (4) < high_freq_factor (4)"},
    {"partial rotary", ", \"partial_rotary_factor\": 0.5", .error = "partial_rotary_factor 0.5 is not supported"},
    {"partial rotary in rope_parameters",
     ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}",
     .error = "partial_rotary_factor 0.25 is not supported"},
};

Test(hfconfig, table) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const cfg_case *k = &cases[i];
        char text[4096];
        int n = snprintf(text, sizeof text, BASE_FMT, k->arch ? k->arch : LLAMA, k->keys);
        cr_assert(n > 0 && (size_t)n < sizeof text, "%s: test config too long", k->what);
        dj_config c;
        dj_err e = {{0}};
        int rc = hf_config_parse(text, (size_t)n, &c, &e);
        if (k->error) {
            cr_expect_eq(rc, -1, "%s: accepted", k->what);
            cr_expect(strstr(e.msg, k->error), "%s: error '%s' should contain '%s'", k->what, e.msg, k->error);
            cr_expect(!strncmp(e.msg, "config.json: ", 13) && !strchr(e.msg, '\n'),
                      "%s: want one line naming config.json: '%s'", k->what, e.msg);
            continue;
        }
        cr_expect_eq(rc, 0, "%s: %s", k->what, e.msg);
        if (rc) continue;
        cr_expect_eq(c.dim, 64, "%s", k->what);
        cr_expect_eq(c.n_layers, 2, "%s", k->what);
        cr_expect_eq(c.n_heads, 8, "%s", k->what);
        cr_expect_eq(c.hidden_dim, 172, "%s", k->what);
        cr_expect_eq(c.vocab_size, 512, "%s", k->what);
        cr_expect_eq(c.max_seq_len, 512, "%s", k->what);
        cr_expect_eq(c.head_dim, k->head_dim ? k->head_dim : 8, "%s", k->what);
        cr_expect_eq(c.n_kv_heads, k->n_kv_heads ? k->n_kv_heads : 8, "%s", k->what);
        cr_expect_eq(c.tied, k->tied, "%s", k->what);
        cr_expect_eq(c.norm_eps, 1e-6f, "%s: norm_eps %g", k->what, c.norm_eps);
        cr_expect_eq(c.rope_theta, k->theta ? k->theta : 10000.f, "%s: theta %g", k->what, c.rope_theta);
        cr_expect_eq(c.rope_type, k->rope_type, "%s: rope type %u", k->what, c.rope_type);
        if (k->rope_type == DJ_ROPE_LLAMA3) {
            cr_expect_eq(c.rope_factor, k->factor, "%s: factor %g", k->what, c.rope_factor);
            cr_expect_eq(c.rope_low_freq, k->low, "%s: low_freq_factor %g", k->what, c.rope_low_freq);
            cr_expect_eq(c.rope_high_freq, k->high, "%s: high_freq_factor %g", k->what, c.rope_high_freq);
            cr_expect_eq(c.rope_orig_max, k->orig, "%s: original_max_position_embeddings %u", k->what, c.rope_orig_max);
        }
    }
}

// ---- real files: the committed fixtures (run from the repository root) and stories260K
Test(hfconfig, committed_configs) {
    struct {
        const char *path;
        uint32_t dim, heads, kv, head_dim, tied, rope_type;
        float theta, eps;
    } files[] = {
        {"tests/fixtures/tied_gqa_f16/config.json", 96, 6, 2, 16, 1, DJ_ROPE_DEFAULT, 1e4f, 1e-6f},
        {"tests/fixtures/mha_untied_f16/config.json", 64, 4, 4, 32, 0, DJ_ROPE_DEFAULT, 5e4f, 1e-5f},
        {"tests/fixtures/llama3_gqa_bf16/config.json", 128, 4, 2, 48, 0, DJ_ROPE_LLAMA3, 5e5f, 1e-5f},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        size_t n;
        char *text = tc_read(files[i].path, &n);
        if (!text) cr_skip_test("%s not found: run from the repository root", files[i].path);
        dj_config c;
        dj_err e;
        cr_assert_eq(hf_config_parse(text, n, &c, &e), 0, "%s: %s", files[i].path, e.msg);
        cr_expect_eq(c.dim, files[i].dim, "%s", files[i].path);
        cr_expect_eq(c.n_heads, files[i].heads, "%s", files[i].path);
        cr_expect_eq(c.n_kv_heads, files[i].kv, "%s", files[i].path);
        cr_expect_eq(c.head_dim, files[i].head_dim, "%s", files[i].path);
        cr_expect_eq(c.tied, files[i].tied, "%s", files[i].path);
        cr_expect_eq(c.rope_type, files[i].rope_type, "%s", files[i].path);
        cr_expect_eq(c.rope_theta, files[i].theta, "%s", files[i].path);
        cr_expect_eq(c.norm_eps, files[i].eps, "%s", files[i].path);
        if (c.rope_type == DJ_ROPE_LLAMA3)
            cr_expect(c.rope_factor == 8 && c.rope_low_freq == 1 && c.rope_high_freq == 4 && c.rope_orig_max == 32,
                      "%s: llama3 values", files[i].path);
        free(text);
    }
    char p[4200];
    tc_data_path(p, sizeof p, "models/stories260K/config.json");
    size_t n;
    char *text = tc_read(p, &n);
    if (!text) cr_skip_test("shared data missing: %s not found", p);
    dj_config c;
    dj_err e;
    cr_assert_eq(hf_config_parse(text, n, &c, &e), 0, "%s: %s", p, e.msg);
    cr_expect(c.dim == 64 && c.n_layers == 5 && c.n_kv_heads == 4 && c.tied == 1 && c.rope_type == DJ_ROPE_DEFAULT &&
              c.rope_theta == 10000.f, "%s: wrong values", p);
    free(text);
}
