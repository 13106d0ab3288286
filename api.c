// api.c: OpenAI's request and response shapes (api.h).
#include "api.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

// ---- request fields
// The first problem found is the one reported; checks after it do nothing.
typedef struct {
    api_error *err;
    int failed;
} api_check;

static void refuse(api_check *k, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(api_check *k, int status, const char *param, const char *fmt, ...) {
    if (k->failed) return;
    k->failed = 1;
    k->err->status = status, k->err->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err->msg, sizeof k->err->msg, fmt, ap);
    va_end(ap);
    dj_one_line(k->err->msg, sizeof k->err->msg);
}

// A field of the wrong type is refused by name; an absent field (or null) keeps its default: NULL.
static const json_value *field(api_check *k, const json_value *obj, const char *name, json_type want) {
    const json_value *v = json_get(obj, name);
    if (!v || v->type == JSON_NULL || k->failed) return NULL;
    if (v->type != want) {
        int an = want == JSON_ARRAY || want == JSON_OBJECT, an_v = v->type == JSON_ARRAY || v->type == JSON_OBJECT;
        refuse(k, 400, name, "'%s' must be a%s %s, not a%s %s", name, an ? "n" : "", json_type_name(want),
               an_v ? "n" : "", json_type_name(v->type));
        return NULL;
    }
    return v;
}

static void number_field(api_check *k, const json_value *obj, const char *name, double lo, double hi, double *out) {
    const json_value *v = field(k, obj, name, JSON_NUMBER);
    if (!v) return;
    if (!(v->u.number.num >= lo && v->u.number.num <= hi))
        refuse(k, 400, name, "'%s' must be within [%g, %g]", name, lo, hi);
    else
        *out = v->u.number.num;
}

// v as an integer, written as one or as a whole number (Python's json writes 42.0 for a float 42): exact up to 2^53.
// 0, or -1 (not a number, or not whole).
static int whole_number(const json_value *v, int64_t *out) {
    if (v->type != JSON_NUMBER) return -1;
    const double x = v->u.number.num;
    if (v->u.number.is_int) *out = v->u.number.i;
    else if (x == floor(x) && fabs(x) <= 9007199254740992.0) *out = (int64_t)x;
    else return -1;
    return 0;
}

static void int_field(api_check *k, const json_value *obj, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    const json_value *v = field(k, obj, name, JSON_NUMBER);
    int64_t i;
    if (!v) return;
    if (whole_number(v, &i) || i < lo || i > hi)
        refuse(k, 400, name, "'%s' must be an integer within [%" PRId64 ", %" PRId64 "]", name, lo, hi);
    else *out = i;
}

// The answer's limit, by the first of its names sent (null is not sent): OpenAI's max_completion_tokens (the newer
// name), max_tokens, llama.cpp's n_predict (-1: none); either endpoint. The names after it are not read.
static void limit_field(api_check *k, const json_value *root, int64_t *out) {
    static const char *const names[] = {"max_completion_tokens", "max_tokens", "n_predict"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const json_value *v = json_get(root, names[i]);
        if (!v || v->type == JSON_NULL) continue;
        int n_predict = !strcmp(names[i], "n_predict");
        int64_t lim = 0;
        int_field(k, root, names[i], n_predict ? -1 : 1, INT32_MAX, &lim);
        if (!k->failed && !lim) refuse(k, 400, names[i], "'n_predict' must be -1 (no limit) or at least 1");
        if (!k->failed) *out = lim;
        return;
    }
}

// Features the server does not have are refused by name rather than ignored: a client would get something else
// than it asked for.
static void unsupported(api_check *k, const json_value *root) {
    static const char *const off[] = {"echo", "logprobs", "top_logprobs"};  // false or 0 is fine
    for (size_t i = 0; i < sizeof off / sizeof *off; i++) {
        const json_value *v = json_get(root, off[i]);
        if (v && v->type != JSON_NULL && !(v->type == JSON_BOOL && !v->u.boolean) &&
            !(v->type == JSON_NUMBER && v->u.number.num == 0))
            refuse(k, 400, off[i], "'%s' is not supported", off[i]);
    }
    static const char *const absent[] = {"suffix", "tools", "functions", "function_call", "tool_choice"};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++) {
        const json_value *v = json_get(root, absent[i]);
        if (v && v->type != JSON_NULL && !(v->type == JSON_ARRAY && !v->u.arr.n))
            refuse(k, 400, absent[i], "'%s' is not supported", absent[i]);
    }
    const json_value *lb = field(k, root, "logit_bias", JSON_OBJECT);
    if (lb && lb->u.obj.n) refuse(k, 400, "logit_bias", "'logit_bias' is not supported");
    static const char *const one_choice[] = {"n", "best_of"};  // one choice a request: more are refused, not dropped
    for (size_t i = 0; i < 2; i++) {
        const json_value *v = field(k, root, one_choice[i], JSON_NUMBER);
        if (v && !(v->u.number.num == 1))
            refuse(k, 400, one_choice[i], "'%s' must be 1: a request answers with one choice (send several requests "
                                             "for more)", one_choice[i]);
    }
    const json_value *rf = field(k, root, "response_format", JSON_OBJECT);
    const char *rt = rf ? json_str(json_get(rf, "type")) : NULL;
    if (rf && (!rt || strcmp(rt, "text")))
        refuse(k, 400, "response_format", "only 'response_format' {\"type\": \"text\"} is supported");
}

// A message's content: a string, or an array of parts whose "text" parts are joined. malloc'd.
static char *message_text(api_check *k, const json_value *msg, size_t i) {
    const json_value *c = json_get(msg, "content");
    dj_buf b = {0};
    if (c && c->type == JSON_STRING) {
        buf_add(&b, c->u.str.s, c->u.str.len);
    } else if (c && c->type == JSON_ARRAY) {
        for (size_t j = 0; j < c->u.arr.n && !k->failed; j++) {
            const json_value *part = &c->u.arr.items[j];
            const char *type = json_str(json_get(part, "type"));
            const json_value *text = json_get(part, "text");
            if (!type || strcmp(type, "text") || !text || text->type != JSON_STRING)
                refuse(k, 400, "messages", "messages[%zu].content[%zu]: %s%.32s%s: only text parts "
                       "({\"type\": \"text\", \"text\": \"...\"}) are supported (no images, audio or files)", i, j,
                       type ? "a part of type '" : "a part without a type", type ? type : "", type ? "'" : "");
            else
                buf_add(&b, text->u.str.s, text->u.str.len);
        }
    } else if (c && c->type != JSON_NULL) {
        refuse(k, 400, "messages", "messages[%zu].content must be a string or an array of text parts", i);
    }
    if (!k->failed && b.n && memchr(b.p, 0, b.n))
        refuse(k, 400, "messages", "messages[%zu].content holds a NUL character", i);
    if (!k->failed && !b.p) buf_add(&b, "", 0);
    if (!k->failed && b.oom) refuse(k, 500, NULL, "out of memory");
    if (k->failed) {
        buf_free(&b);
        return NULL;
    }
    return b.p;
}

// A base64 digit's value (RFC 4648's alphabet), or -1.
static int b64_digit(unsigned c) {
    return c - 'A' < 26 ? (int)(c - 'A') : c - 'a' < 26 ? (int)(c - 'a') + 26 : c - '0' < 10 ? (int)(c - '0') + 52
         : c == '+' ? 62 : c == '/' ? 63 : -1;
}

// "resume": {"id": "brk-N", "residual": base64 of little-endian float32 rows}: N and the rows (dim floats each,
// all finite). Only RFC 4648's alphabet with its '=' padding is base64 here.
static void resume_field(api_check *k, const api_model *m, const json_value *rs, api_req *r) {
    const json_value *id = json_get(rs, "id"), *res = json_get(rs, "residual");
    if (!id || id->type != JSON_STRING || !res || res->type != JSON_STRING) {
        refuse(k, 400, "resume", "'resume' must be {\"id\": \"brk-N\", \"residual\": \"BASE64\"}: the id a breakpoint "
                                 "answered with and its residual, changed or not");
        return;
    }
    const char *s = id->u.str.s;
    size_t len = id->u.str.len, nd = len > 4 ? strspn(s + 4, "0123456789") : 0;
    if (strncmp(s, "brk-", 4) || !nd || nd != len - 4 || nd > 18 || s[4] == '0') {
        refuse(k, 404, "resume", "no paused state '%.*s': a breakpoint's answer names its id, brk-N",
               (int)(len > 64 ? 64 : len), s);
        return;
    }
    r->resume = strtoull(s + 4, NULL, 10);
    const unsigned char *t = (const unsigned char *)res->u.str.s;
    size_t tn = res->u.str.len;
    if (tn % 4 || !tn) {
        refuse(k, 400, "resume", "'resume.residual' is not base64: %zu characters, not a multiple of 4", tn);
        return;
    }
    size_t pad = t[tn - 1] == '=' ? t[tn - 2] == '=' ? 2 : 1 : 0, bytes = tn / 4 * 3 - pad, row = 4 * (size_t)m->dim;
    unsigned char *out = malloc(bytes + 3);
    if (!out) {
        refuse(k, 500, NULL, "out of memory");
        return;
    }
    for (size_t i = 0; i < tn; i += 4) {
        uint32_t v = 0;
        for (size_t j = 0; j < 4; j++) {
            int d = b64_digit(t[i + j]);
            if (d < 0 && !(t[i + j] == '=' && i + j >= tn - pad)) {
                refuse(k, 400, "resume", "'resume.residual' is not base64: byte %zu (0x%02x)", i + j, t[i + j]);
                free(out);
                return;
            }
            v = v << 6 | (uint32_t)(d < 0 ? 0 : d);
        }
        out[i / 4 * 3] = (unsigned char)(v >> 16), out[i / 4 * 3 + 1] = (unsigned char)(v >> 8);
        out[i / 4 * 3 + 2] = (unsigned char)v;
    }
    r->rows = (float *)(void *)out, r->n_rows = (int64_t)(bytes / 4);  // little-endian, as the host
    if (bytes % row) {
        refuse(k, 400, "resume", "'resume.residual' holds %zu bytes: not rows of the model's %u float32 (%zu bytes "
                                 "each)", bytes, m->dim, row);
        return;
    }
    for (int64_t i = 0; i < r->n_rows; i++)
        if (!isfinite(r->rows[i])) {
            refuse(k, 400, "resume", "'resume.residual': row %" PRId64 ", element %" PRId64 " is %s", i / m->dim,
                   i % m->dim, isnan(r->rows[i]) ? "NaN" : "infinite");
            return;
        }
}

// A prompt of token ids (OpenAI's other form of it, which evaluation harnesses send): taken as they are, no BOS added.
static void prompt_token_ids(api_check *k, const api_model *m, const json_value *p, api_req *r) {
    const size_t n = p->u.arr.n;
    if (!n) {
        refuse(k, 400, "prompt", "'prompt' as token ids must hold at least one");
        return;
    }
    if (!(r->ids = malloc(n * sizeof *r->ids))) {
        refuse(k, 500, NULL, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        if (whole_number(&p->u.arr.items[i], &id) || id < 0 || id >= m->vocab) {
            refuse(k, 400, "prompt", "prompt[%zu] must be a token id, an integer from 0 to %" PRId64, i, m->vocab - 1);
            return;
        }
        r->ids[i] = (int32_t)id;
    }
    r->n_ids = n;
}

// The prompt's ids: a completion's text (BOS added as the command line adds it) or token ids, or the chat's messages
// in the model's template.
static void prompt_ids(api_check *k, const api_model *m, const json_value *root, api_req *r) {
    dj_err e = {{0}};
    if (!r->chat) {
        const json_value *p = json_get(root, "prompt");
        if (p && p->type == JSON_ARRAY && p->u.arr.n && p->u.arr.items[0].type != JSON_NUMBER) {  // of prompts
            if (p->u.arr.n > 1) {
                refuse(k, 400, "prompt", "'prompt' holds %zu prompts: a request answers one", p->u.arr.n);
                return;
            }
            p = &p->u.arr.items[0];  // one: text or token ids
        }
        if (p && p->type == JSON_ARRAY) {
            prompt_token_ids(k, m, p, r);
            return;
        }
        if (!p || p->type != JSON_STRING)
            refuse(k, 400, "prompt", "'prompt' must be a string or an array of token ids (or an array of one of them)");
        else if (memchr(p->u.str.s, 0, p->u.str.len))
            refuse(k, 400, "prompt", "'prompt' holds a NUL character");
        else if (tok_encode(m->tok, p->u.str.s, p->u.str.len, 1, &r->ids, &r->n_ids, &e))
            refuse(k, 400, "prompt", "%s", e.msg);
        if (k->failed) return;
        int32_t bos = tok_bos(m->tok);  // a prompt that writes the BOS token's text gets one BOS, as with -p
        if (bos >= 0 && r->n_ids >= 2 && r->ids[0] == bos && r->ids[1] == bos)
            memmove(r->ids, r->ids + 1, (--r->n_ids) * sizeof *r->ids);
        if (!r->n_ids) refuse(k, 400, "prompt", "the prompt is empty and the model has no BOS token");
        return;
    }
    const json_value *msgs = field(k, root, "messages", JSON_ARRAY);
    if (!k->failed && (!msgs || !msgs->u.arr.n)) refuse(k, 400, "messages", "'messages' must be a non-empty array");
    if (!k->failed && m->chat != CHAT_LLAMA2 && m->chat != CHAT_LLAMA3)
        refuse(k, 400, "messages", "the model has %s chat template: use /v1/completions with the prompt written out",
               m->chat == CHAT_NONE ? "no" : "an unknown");
    if (k->failed) return;
    size_t n = msgs->u.arr.n;
    const char **roles = calloc(n, sizeof *roles);
    char **texts = calloc(n, sizeof *texts);
    if (!roles || !texts) refuse(k, 500, NULL, "out of memory");
    for (size_t i = 0; i < n && !k->failed; i++) {
        const json_value *msg = &msgs->u.arr.items[i];
        if (msg->type != JSON_OBJECT) refuse(k, 400, "messages", "messages[%zu] must be an object", i);
        else if (!(roles[i] = json_str(json_get(msg, "role"))))
            refuse(k, 400, "messages", "messages[%zu].role must be a string", i);
        else texts[i] = message_text(k, msg, i);
    }
    if (!k->failed && chat_prompt_ids(m->tok, m->chat, roles, (const char *const *)texts, n, &r->ids, &r->n_ids, &e))
        refuse(k, 400, "messages", "%s", e.msg);
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(texts), free(roles);
}

int api_parse(const api_model *m, const char *body, size_t n, int chat, uint64_t fresh_seed, api_req *r,
              api_error *err) {
    memset(r, 0, sizeof *r);
    memset(err, 0, sizeof *err);
    api_check k = {err, 0};
    dj_err e = {{0}};
    json_doc *doc = json_parse(body, n, &e);
    if (!doc) {
        refuse(&k, 400, NULL, "the body is not valid JSON: %s", e.msg);
        return -1;
    }
    const json_value *root = json_root(doc);
    if (root->type != JSON_OBJECT) refuse(&k, 400, NULL, "the body must be a JSON object");
    r->chat = chat;
    dj_sampling sp = DJ_SAMPLING_DEFAULT;
    sp.top_p = 1.0;  // OpenAI's defaults: temperature 1, top_p 1
    r->max_tokens = chat ? -1 : 16;
    field(&k, root, "model", JSON_STRING);  // any name: there is one model
    unsupported(&k, root);
    limit_field(&k, root, &r->max_tokens);
    int64_t top_k = 0, last_n = sp.repeat_last_n, seed = 0;
    number_field(&k, root, "temperature", 0, 1e6, &sp.temp);
    number_field(&k, root, "top_p", 0, 1, &sp.top_p);
    number_field(&k, root, "min_p", 0, 1, &sp.min_p);
    int_field(&k, root, "top_k", 0, INT32_MAX, &top_k);
    number_field(&k, root, "presence_penalty", -2, 2, &sp.presence_penalty);
    number_field(&k, root, "frequency_penalty", -2, 2, &sp.frequency_penalty);
    number_field(&k, root, "repeat_penalty", 1e-3, 1e3, &sp.repeat_penalty);
    int_field(&k, root, "repeat_last_n", 0, 1 << 24, &last_n);
    const json_value *sv = field(&k, root, "seed", JSON_NUMBER);
    int_field(&k, root, "seed", INT64_MIN, INT64_MAX, &seed);
    const json_value *v = field(&k, root, "stream", JSON_BOOL);
    r->stream = v && v->u.boolean;
    const json_value *so = field(&k, root, "stream_options", JSON_OBJECT);
    v = so ? field(&k, so, "include_usage", JSON_BOOL) : NULL;
    r->include_usage = v && v->u.boolean;
    v = field(&k, root, "ignore_eos", JSON_BOOL);
    r->ignore_eos = v && v->u.boolean;
    v = field(&k, root, "park", JSON_BOOL);
    r->park = v && v->u.boolean;
    const json_value *sess = field(&k, root, "session", JSON_STRING);
    if (!sess) sess = field(&k, root, "user", JSON_STRING);
    if (sess) {
        const char *name = sess == json_get(root, "session") ? "session" : "user";
        if (!sess->u.str.len || sess->u.str.len > API_SESSION_MAX || memchr(sess->u.str.s, 0, sess->u.str.len))
            refuse(&k, 400, name, "'%s' must be 1 to %d bytes, without NUL", name, API_SESSION_MAX);
        else if (!(r->session = strdup(sess->u.str.s)))
            refuse(&k, 500, NULL, "out of memory");
        r->by_user = name[0] == 'u';
    }
    if (r->park && !r->session) refuse(&k, 400, "park", "'park' needs a session ('session' or 'user')");
    int64_t layer = -1;
    int_field(&k, root, "break_after_layer", 0, (int64_t)m->n_layers - 1, &layer);
    r->brk = layer >= 0, r->layer = r->brk ? (uint32_t)layer : 0;
    const json_value *rs = field(&k, root, "resume", JSON_OBJECT);
    if ((r->brk || rs) && !m->breakpoints)
        refuse(&k, 400, r->brk ? "break_after_layer" : "resume",
               "breakpoints are off on this server (--breakpoints 0)");
    if (r->brk && rs) refuse(&k, 400, "resume", "a request either breaks ('break_after_layer') or resumes: not both");
    if (r->brk && r->stream)
        refuse(&k, 400, "stream", "'stream' cannot be used with 'break_after_layer': a breakpoint answers once, with "
                                  "the residual stream (stream the resume)");
    if (rs && !k.failed) resume_field(&k, m, rs, r);
    const json_value *st = json_get(root, "stop");
    if (!k.failed && st && st->type != JSON_NULL) {
        size_t ns = st->type == JSON_STRING ? 1 : st->type == JSON_ARRAY ? st->u.arr.n : 0;
        int ok = (st->type == JSON_STRING || st->type == JSON_ARRAY) && ns <= BT_STOPS;
        for (size_t i = 0; ok && i < ns; i++) {
            const json_value *one = st->type == JSON_STRING ? st : &st->u.arr.items[i];
            ok = one->type == JSON_STRING && one->u.str.len > 0 && !memchr(one->u.str.s, 0, one->u.str.len);
            if (ok && !(r->stops[r->n_stops++] = strdup(one->u.str.s))) ok = 0;
        }
        if (!ok) refuse(&k, 400, "stop", "'stop' must be a non-empty string or an array of up to %d of them", BT_STOPS);
    }
    const json_value *pv = json_get(root, chat ? "messages" : "prompt");
    if (!k.failed && !(r->resume && (!pv || pv->type == JSON_NULL)))  // a resume's prompt is optional
        prompt_ids(&k, m, root, r);
    if (!k.failed && (int64_t)r->n_ids >= m->ctx) {
        refuse(&k, 400, chat ? "messages" : "prompt",
               "the prompt is %zu tokens: the context holds %" PRId64 ", with room for at least one new token",
               r->n_ids, m->ctx);
        err->code = "context_length_exceeded";  // OpenAI's: clients that shorten the conversation look for it
    }
    sp.top_k = top_k, sp.repeat_last_n = last_n;
    if (!k.failed && !(r->smp = sampler_new_with(m->vocab, &sp, sv ? (uint64_t)seed : fresh_seed, &e)))
        refuse(&k, 400, NULL, "%s", e.msg);
    json_free(doc);
    if (k.failed) api_req_free(r);
    return k.failed ? -1 : 0;
}

void api_req_free(api_req *r) {
    free(r->ids), free(r->rows);
    free(r->session);
    sampler_free(r->smp);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

// ---- responses
static void resp_prefix(dj_buf *b, const api_resp *r, const char *object) {
    buf_fmt(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->id, object, r->created);
    buf_json_str(b, r->model, strlen(r->model));
}

void api_chunk(dj_buf *b, const api_resp *r, int role, const char *text, size_t n, const char *finish) {
    buf_str(b, "data: ");
    resp_prefix(b, r, r->chat ? "chat.completion.chunk" : "text_completion");
    if (r->chat) {
        buf_str(b, ",\"choices\":[{\"index\":0,\"delta\":{");
        if (role) buf_str(b, "\"role\":\"assistant\"");
        if (text) buf_str(b, role ? ",\"content\":" : "\"content\":"), buf_json_str(b, text, n);
        buf_str(b, "},\"logprobs\":null,\"finish_reason\":");
    } else {
        buf_str(b, ",\"choices\":[{\"text\":");
        buf_json_str(b, text ? text : "", text ? n : 0);
        buf_str(b, ",\"index\":0,\"logprobs\":null,\"finish_reason\":");
    }
    if (finish) buf_fmt(b, "\"%s\"", finish);
    else buf_str(b, "null");
    buf_str(b, "}]}\n\n");
}

static void usage_json(dj_buf *b, const api_usage *u) {
    buf_fmt(b, "\"usage\":{\"prompt_tokens\":%" PRId64 ",\"completion_tokens\":%" PRId64 ",\"total_tokens\":%" PRId64
               ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRId64 "}}",
            u->prompt, u->completion, u->prompt + u->completion, u->cached);
}

void api_usage_chunk(dj_buf *b, const api_resp *r, const api_usage *u) {
    buf_str(b, "data: ");
    resp_prefix(b, r, r->chat ? "chat.completion.chunk" : "text_completion");
    buf_str(b, ",\"choices\":[],");
    usage_json(b, u);
    buf_str(b, "}\n\n");
}

void api_response(dj_buf *b, const api_resp *r, const char *text, size_t n, const char *finish, const api_brk *brk,
                  const api_usage *u) {
    resp_prefix(b, r, r->chat ? "chat.completion" : "text_completion");
    if (r->chat) {
        buf_str(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
        buf_json_str(b, text, n);
        buf_fmt(b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}],", finish);
    } else {
        buf_str(b, ",\"choices\":[{\"text\":");
        buf_json_str(b, text, n);
        buf_fmt(b, ",\"index\":0,\"logprobs\":null,\"finish_reason\":\"%s\"}],", finish);
    }
    if (brk) {
        buf_fmt(b, "\"breakpoint\":{\"id\":\"brk-%" PRIu64 "\",\"layer\":%u,\"dim\":%u,\"position\":%" PRId64
                   ",\"count\":%" PRId64 ",\"tokens\":[", brk->id, brk->layer, brk->dim, brk->pos, brk->count);
        for (int64_t i = 0; i < brk->count; i++) buf_fmt(b, i ? ",%d" : "%d", brk->tokens[i]);
        buf_str(b, "],\"dtype\":\"float32\",\"residual\":\"");
        buf_base64(b, brk->rows, (size_t)(brk->count * brk->dim) * sizeof *brk->rows);
        buf_str(b, "\"},");
    }
    usage_json(b, u);
    buf_str(b, "}\n");
}

void api_error_json(dj_buf *b, int status, const char *param, const char *code, const char *msg) {
    const char *type = status == 401   ? "authentication_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    if (!code && status == 401) code = "invalid_api_key";
    buf_str(b, "{\"error\":{\"message\":");
    buf_json_str(b, msg, strlen(msg));
    buf_fmt(b, ",\"type\":\"%s\",\"param\":", type);
    if (param) buf_json_str(b, param, strlen(param));
    else buf_str(b, "null");
    if (code) buf_fmt(b, ",\"code\":\"%s\"}}\n", code);
    else buf_str(b, ",\"code\":null}}\n");
}
