// hfconfig.c: config.json -> dj_config (see hfconfig.h).
#include "hfconfig.h"

#include <math.h>
#include <string.h>

#include "../json.h"

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

// ---- rope: theta and scaling from rope_parameters (transformers 5) and/or rope_theta + rope_scaling (classic)
// One block (rope_parameters or rope_scaling) -> c's rope_type and llama3 fields. A block must say its type:
// without "rope_type"/"type" it is taken as default RoPE only when it holds nothing else than rope_theta, since
// scaling values without a type (e.g. {"factor": 4.0}) mean something the engine cannot guess.
static int rope_block(const json_value *blk, const char *name, dj_config *c, dj_err *e) {
    const json_value *rt = json_get(blk, "rope_type"), *ty = json_get(blk, "type");
    const json_value *tv = rt ? rt : ty;
    const char *key = rt ? "rope_type" : "type";
    c->rope_type = DJ_ROPE_DEFAULT;
    if (!tv) {
        for (size_t i = 0; i < blk->u.obj.n; i++)
            if (strcmp(blk->u.obj.members[i].key, "rope_theta"))
                return dj_fail(e, "config.json: \"%s\" has no \"rope_type\" (or \"type\") but holds \"%s\": say which "
                               "RoPE it means (supported: default, llama3)", name, blk->u.obj.members[i].key);
        return 0;
    }
    const char *type = json_str(tv);
    if (!type)
        return dj_fail(e, "config.json: \"%s\".\"%s\" is a %s, expected a string (supported: default, llama3)", name,
                       key, json_type_name(tv->type));
    if (rt && ty && (!json_str(ty) || strcmp(type, json_str(ty))))
        return dj_fail(e, "config.json: \"%s\" has both \"rope_type\" and \"type\", and they differ", name);
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return dj_fail(e, "config.json: RoPE type \"%s\" is not supported (supported: default, llama3)", type);
    c->rope_type = DJ_ROPE_LLAMA3;
    static const char *need[] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
    for (int i = 0; i < 4; i++)
        if (!json_get(blk, need[i])) return dj_fail(e, "config.json: llama3 RoPE scaling needs \"%s\"", need[i]);
    int64_t orig;
    if (get_f32(blk, "factor", 0, &c->rope_factor, e) || get_f32(blk, "low_freq_factor", 0, &c->rope_low_freq, e) ||
        get_f32(blk, "high_freq_factor", 0, &c->rope_high_freq, e))
        return -1;
    if (json_int(json_get(blk, "original_max_position_embeddings"), &orig) || orig <= 0 || orig > UINT32_MAX)
        return dj_fail(e, "config.json: \"original_max_position_embeddings\" must be a positive integer");
    c->rope_orig_max = (uint32_t)orig;
    return 0;
}

static const char *rope_name(uint32_t t) { return t == DJ_ROPE_LLAMA3 ? "llama3" : "default"; }

// rope_scaling: null is common and means default RoPE. When a checkpoint carries both rope_parameters and
// rope_scaling (configs saved across transformers versions), both are read and must agree; so must
// rope_parameters.rope_theta and a top-level rope_theta.
static int parse_rope(const json_value *root, dj_config *c, dj_err *e) {
    const json_value *rp = json_get(root, "rope_parameters"), *rs = json_get(root, "rope_scaling");
    if (rp && rp->type != JSON_OBJECT && rp->type != JSON_NULL)
        return dj_fail(e, "config.json: \"rope_parameters\" must be an object");
    if (rs && rs->type != JSON_OBJECT && rs->type != JSON_NULL)
        return dj_fail(e, "config.json: \"rope_scaling\" must be an object or null");
    int has_p = rp && rp->type == JSON_OBJECT, has_s = rs && rs->type == JSON_OBJECT;
    // theta: rope_parameters.rope_theta, else top-level rope_theta, else HF's default 10000
    float theta_top;
    if (get_f32(root, "rope_theta", 10000.0, &theta_top, e)) return -1;
    c->rope_theta = theta_top;
    if (has_p && json_get(rp, "rope_theta")) {
        if (get_f32(rp, "rope_theta", 0, &c->rope_theta, e)) return -1;
        const json_value *top = json_get(root, "rope_theta");
        if (top && top->type != JSON_NULL && theta_top != c->rope_theta)
            return dj_fail(e, "config.json: \"rope_theta\" %g disagrees with \"rope_parameters\".\"rope_theta\" %g",
                           theta_top, c->rope_theta);
    }
    // HF rotates only head_dim * partial_rotary_factor dims when it is set; the engine rotates them all.
    const json_value *holders[2] = {root, has_p ? rp : NULL};
    for (int i = 0; i < 2; i++) {
        float prf;
        if (holders[i] && get_f32(holders[i], "partial_rotary_factor", 1.0, &prf, e)) return -1;
        if (holders[i] && prf != 1.0f)
            return dj_fail(e, "config.json: partial_rotary_factor %g is not supported (only 1: RoPE on every dim)", prf);
    }
    dj_config s = *c;
    if (has_p && rope_block(rp, "rope_parameters", c, e)) return -1;
    if (has_s && rope_block(rs, "rope_scaling", has_p ? &s : c, e)) return -1;
    if (has_p && has_s) {
        if (s.rope_type != c->rope_type)
            return dj_fail(e, "config.json: \"rope_parameters\" says RoPE type %s but \"rope_scaling\" says %s: they "
                           "must agree", rope_name(c->rope_type), rope_name(s.rope_type));
        if (c->rope_type == DJ_ROPE_LLAMA3 &&
            (s.rope_factor != c->rope_factor || s.rope_low_freq != c->rope_low_freq ||
             s.rope_high_freq != c->rope_high_freq || s.rope_orig_max != c->rope_orig_max))
            return dj_fail(e, "config.json: \"rope_parameters\" and \"rope_scaling\" hold different llama3 values: "
                           "they must agree");
    }
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
    // hidden_act: absent means HF's default, silu; anything else present (null, a number) is refused.
    const json_value *actv = json_get(root, "hidden_act");
    const char *act = json_str(actv);
    if (actv && !act) {
        dj_fail(e, "config.json: \"hidden_act\" is a %s, expected a string (supported: silu)", json_type_name(actv->type));
        goto out;
    }
    if (act && strcmp(act, "silu")) {
        dj_fail(e, "config.json: activation \"%s\" is not supported (only silu)", act);
        goto out;
    }
    int attn_bias, mlp_bias, tied;
    if (json_opt_bool(root, "attention_bias", "config.json", 0, &attn_bias, e) ||
        json_opt_bool(root, "mlp_bias", "config.json", 0, &mlp_bias, e) ||
        json_opt_bool(root, "tie_word_embeddings", "config.json", 0, &tied, e))
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
    dj_config_set_wtype(c, DJ_F16);  // placeholder that validates; the converter sets the real one
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
