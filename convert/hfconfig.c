// hfconfig.c: config.json -> dj_config (see hfconfig.h).
#include "hfconfig.h"

#include <math.h>
#include <string.h>

#include "json.h"

// ---- typed field readers: absent -> default (when allowed), wrong type or range -> named error
static int get_u32(const json_value *root, const char *key, int required, uint32_t dflt, uint32_t *out, dj_err *e) {
    const json_value *v = json_get(root, key);
    if (!v || v->type == JSON_NULL) {
        if (required) return dj_fail(e, "config.json: missing \"%s\"", key);
        *out = dflt;
        return 0;
    }
    int64_t i;
    if (json_int(v, &i) || i < 0 || i > UINT32_MAX)
        return dj_fail(e, "config.json: \"%s\" must be a non-negative integer", key);
    *out = (uint32_t)i;
    return 0;
}

static int get_f32(const json_value *obj, const char *key, double dflt, float *out, dj_err *e) {
    const json_value *v = json_get(obj, key);
    double d = dflt;
    if (v && v->type != JSON_NULL && json_num(v, &d)) return dj_fail(e, "config.json: \"%s\" must be a number", key);
    if (!isfinite(d)) return dj_fail(e, "config.json: \"%s\" is not finite", key);
    *out = (float)d;
    return 0;
}

static int get_bool(const json_value *root, const char *key, int dflt, int *out, dj_err *e) {
    const json_value *v = json_get(root, key);
    *out = dflt;
    if (v && v->type != JSON_NULL && json_bool(v, out)) return dj_fail(e, "config.json: \"%s\" must be true or false", key);
    return 0;
}

// ---- rope: theta and scaling from rope_parameters (transformers 5) or rope_theta + rope_scaling (classic)
static int parse_rope(const json_value *root, dj_config *c, dj_err *e) {
    const json_value *rp = json_get(root, "rope_parameters"), *rs = json_get(root, "rope_scaling");
    if (rp && rp->type != JSON_OBJECT && rp->type != JSON_NULL)
        return dj_fail(e, "config.json: \"rope_parameters\" must be an object");
    if (rs && rs->type != JSON_OBJECT && rs->type != JSON_NULL)
        return dj_fail(e, "config.json: \"rope_scaling\" must be an object or null");
    const json_value *scal = (rp && rp->type == JSON_OBJECT) ? rp : (rs && rs->type == JSON_OBJECT) ? rs : NULL;
    // theta: rope_parameters.rope_theta, else top-level rope_theta, else HF's default 10000
    const json_value *theta_src = (rp && json_get(rp, "rope_theta")) ? rp : root;
    if (get_f32(theta_src, "rope_theta", 10000.0, &c->rope_theta, e)) return -1;
    c->rope_type = DJ_ROPE_DEFAULT;
    if (!scal) return 0;
    const char *type = json_str(json_get(scal, "rope_type"));
    if (!type) type = json_str(json_get(scal, "type"));
    if (!type || !strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return dj_fail(e, "config.json: RoPE type \"%s\" is not supported (supported: default, llama3)", type);
    c->rope_type = DJ_ROPE_LLAMA3;
    static const char *need[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (int i = 0; i < 4; i++)
        if (!json_get(scal, need[i])) return dj_fail(e, "config.json: llama3 RoPE scaling needs \"%s\"", need[i]);
    int64_t orig;
    if (get_f32(scal, "factor", 0, &c->rope_factor, e) || get_f32(scal, "low_freq_factor", 0, &c->rope_low_freq, e) ||
        get_f32(scal, "high_freq_factor", 0, &c->rope_high_freq, e))
        return -1;
    if (json_int(json_get(scal, "original_max_position_embeddings"), &orig) || orig <= 0 || orig > UINT32_MAX)
        return dj_fail(e, "config.json: \"original_max_position_embeddings\" must be a positive integer");
    c->rope_orig_max = (uint32_t)orig;
    return 0;
}

// ---- the whole config
int hf_config_parse(const char *text, size_t n, dj_config *c, dj_err *e) {
    memset(c, 0, sizeof *c);
    dj_err je;
    json_doc *doc = json_parse(text, n, &je);
    if (!doc) return dj_fail(e, "config.json: %s", je.msg);
    const json_value *root = json_root(doc);
    int rc = -1;
    if (root->type != JSON_OBJECT) {
        dj_fail(e, "config.json: top level must be an object");
        goto out;
    }
    // Architecture: LlamaForCausalLM (model_type "llama"); anything else is refused by name.
    const json_value *arch = json_get(root, "architectures");
    const char *model_type = json_str(json_get(root, "model_type"));
    if (arch && arch->type == JSON_ARRAY && arch->u.arr.n > 0) {
        const char *a = json_str(&arch->u.arr.items[0]);
        if (!a || strcmp(a, "LlamaForCausalLM")) {
            dj_fail(e, "config.json: architecture \"%s\" is not supported (only LlamaForCausalLM)", a ? a : "?");
            goto out;
        }
    } else if (!model_type || strcmp(model_type, "llama")) {
        dj_fail(e, "config.json: model_type \"%s\" is not supported (only llama / LlamaForCausalLM)",
                model_type ? model_type : "(missing)");
        goto out;
    }
    if (model_type && strcmp(model_type, "llama")) {
        dj_fail(e, "config.json: model_type \"%s\" is not supported (only llama)", model_type);
        goto out;
    }
    // Constants the engine hard-codes.
    const char *act = json_str(json_get(root, "hidden_act"));
    if (act && strcmp(act, "silu")) {
        dj_fail(e, "config.json: activation \"%s\" is not supported (only silu)", act);
        goto out;
    }
    int attn_bias, mlp_bias, tied;
    if (get_bool(root, "attention_bias", 0, &attn_bias, e) || get_bool(root, "mlp_bias", 0, &mlp_bias, e) ||
        get_bool(root, "tie_word_embeddings", 0, &tied, e))
        goto out;
    if (attn_bias || mlp_bias) {
        dj_fail(e, "config.json: %s biases are not supported", attn_bias ? "attention" : "MLP");
        goto out;
    }
    c->tied = (uint32_t)tied;
    if (get_u32(root, "hidden_size", 1, 0, &c->dim, e) || get_u32(root, "num_hidden_layers", 1, 0, &c->n_layers, e) ||
        get_u32(root, "num_attention_heads", 1, 0, &c->n_heads, e) ||
        get_u32(root, "intermediate_size", 1, 0, &c->hidden_dim, e) ||
        get_u32(root, "vocab_size", 1, 0, &c->vocab_size, e) ||
        get_u32(root, "max_position_embeddings", 1, 0, &c->max_seq_len, e))
        goto out;
    if (get_u32(root, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads, e)) goto out;
    if (c->n_heads == 0) {
        dj_fail(e, "config.json: num_attention_heads is 0");
        goto out;
    }
    if (get_u32(root, "head_dim", 0, c->dim / c->n_heads, &c->head_dim, e)) goto out;
    if (get_f32(root, "rms_norm_eps", 1e-6, &c->norm_eps, e)) goto out;
    if (parse_rope(root, c, e)) goto out;
    c->wtype = DJ_F16;  // placeholder that validates; the converter sets the real one
    dj_err ve;
    if (dj_config_validate(c, &ve)) {
        dj_fail(e, "config.json: %s", ve.msg);
        goto out;
    }
    rc = 0;
out:
    json_free(doc);
    return rc;
}
