// chat.c: chat templates and the ids of a turn (chat.h).
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "fileio.h"

chat_kind chat_recognise(const char *tmpl) {
    if (!tmpl || !tmpl[0]) return CHAT_NONE;
    if (strstr(tmpl, "[INST]") && strstr(tmpl, "[/INST]") && strstr(tmpl, "<<SYS>>")) return CHAT_LLAMA2;
    if (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "<|end_header_id|>") && strstr(tmpl, "<|eot_id|>"))
        return CHAT_LLAMA3;
    return CHAT_UNKNOWN;
}

const char *chat_kind_name(chat_kind k) {
    return k == CHAT_LLAMA2 ? "Llama 2 ([INST])" : k == CHAT_LLAMA3 ? "Llama 3 (headers)" : k == CHAT_NONE ? "none"
                                                                                                       : "unknown";
}

static const char BLANKS[] = " \t\n\r\f\v";  // what the templates' strip removes

static void add_stripped(dj_buf *b, const char *s) {
    const char *end = s + strlen(s);
    while (s < end && strchr(BLANKS, *s)) s++;
    while (end > s && strchr(BLANKS, end[-1])) end--;
    buf_add(b, s, (size_t)(end - s));
}

static int is_blank(const char *s) { return !s[strspn(s, BLANKS)]; }

// One message of Llama 3's template: its role's header, its text stripped, <|eot_id|>.
static void add_llama3_message(dj_buf *b, const char *role, const char *text) {
    buf_str(b, "<|start_header_id|>"), buf_str(b, role), buf_str(b, "<|end_header_id|>\n\n");
    add_stripped(b, text), buf_str(b, "<|eot_id|>");
}
#define LLAMA3_ANSWER "<|start_header_id|>assistant<|end_header_id|>\n\n"  // the header the answer follows

// b's text tokenized, its special tokens read as such, into *t (malloc'd); b freed either way.
static int encode_buf(const dj_tokenizer *tok, dj_buf *b, int32_t **t, size_t *nt, dj_err *e) {
    *t = NULL, *nt = 0;
    int rc = b->oom ? dj_fail(e, "out of memory") : tok_encode(tok, b->p ? b->p : "", b->n, 0, t, nt, e);
    free(b->p);
    return rc ? -1 : 0;
}

int chat_turn_ids(const dj_tokenizer *tok, chat_kind k, const char *system, const char *user, int first,
                  int32_t prev_end, int32_t **ids, size_t *n, dj_err *e) {
    *ids = NULL, *n = 0;
    if (k != CHAT_LLAMA2 && k != CHAT_LLAMA3) return dj_fail(e, "chat: no template to build a turn with");
    dj_buf b = {0};
    int close = !first && prev_end < 0;  // the template's end text, for an answer cut short
    int sys = first && system && !is_blank(system);
    if (k == CHAT_LLAMA2) {
        if (close) buf_str(&b, " </s>");
        buf_str(&b, "[INST] ");
        if (sys) buf_str(&b, "<<SYS>>\n"), add_stripped(&b, system), buf_str(&b, "\n<</SYS>>\n\n");
        add_stripped(&b, user);
        buf_str(&b, " [/INST]");
    } else {
        if (close) buf_str(&b, "<|eot_id|>");
        if (sys) add_llama3_message(&b, "system", system);
        add_llama3_message(&b, "user", user);
        buf_str(&b, LLAMA3_ANSWER);
    }
    int32_t *t;
    size_t nt;
    if (encode_buf(tok, &b, &t, &nt, e)) return -1;
    // Llama 2 opens every user turn with BOS (after the closing " </s>" of the answer before); Llama 3 the first.
    int32_t bos = tok_bos(tok);
    int with_bos = bos >= 0 && (k == CHAT_LLAMA2 || first);
    int32_t *out = malloc((nt + 2) * sizeof *out);
    if (!out) {
        free(t);
        return dj_fail(e, "out of memory");
    }
    size_t m = 0, split = 0;
    if (!first && prev_end >= 0) out[m++] = prev_end;
    if (k == CHAT_LLAMA2 && close)  // the closing " </s>" comes before the BOS of the new turn
        for (; split < nt && split < 2; split++) {
            out[m++] = t[split];
            if (tok_is_eos(tok, t[split])) {
                split++;
                break;
            }
        }
    if (with_bos) out[m++] = bos;
    memcpy(out + m, t + split, (nt - split) * sizeof *out);
    m += nt - split;
    free(t);
    *ids = out, *n = m;
    return 0;
}

// Llama 3's template renders the messages in any order of roles, each under its header with its text stripped, BOS
// first and the assistant's header last: two user messages in a row, or a system message after the first, are
// text it writes as HF's template does (Llama 2's template refuses them, and so does chat_prompt_ids there).
// OpenAI's "developer" is rendered as "system", the one name Llama 3 has for it; a system message of nothing but
// spaces is left out, as chat_turn_ids leaves it out. The last message must be the user's.
static int llama3_prompt_ids(const dj_tokenizer *tok, const char *const *roles, const char *const *contents, size_t n,
                             int32_t **ids, size_t *n_ids, dj_err *e) {
    static const char *const known[] = {"system", "developer", "user", "assistant"};
    dj_buf b = {0};
    for (size_t j = 0; j < n; j++) {
        size_t r = 0;
        while (r < 4 && strcmp(roles[j], known[r])) r++;
        if (r == 4) {
            free(b.p);
            return dj_fail(e, "messages[%zu]: role '%.32s' is not one of system, developer, user and assistant", j,
                           roles[j]);
        }
        if (r < 2 && is_blank(contents[j])) continue;
        add_llama3_message(&b, r < 2 ? "system" : known[r], contents[j]);
    }
    if (!n || strcmp(roles[n - 1], "user")) {
        free(b.p);
        return dj_fail(e, "messages: the last message is not the user's");
    }
    buf_str(&b, LLAMA3_ANSWER);
    int32_t *t;
    size_t nt;
    if (encode_buf(tok, &b, &t, &nt, e)) return -1;
    const int32_t bos = tok_bos(tok);
    int32_t *out = bos >= 0 ? realloc(t, (nt + 1) * sizeof *t) : t;
    if (!out) {
        free(t);
        return dj_fail(e, "out of memory");
    }
    if (bos >= 0) memmove(out + 1, out, nt * sizeof *out), out[0] = bos, nt++;
    *ids = out, *n_ids = nt;
    return 0;
}

// Llama 2's template: an optional system message first, then user and assistant alternating, ending with user (its
// template refuses anything else); each user turn as chat_turn_ids builds it, each answer closed by the next turn.
static int llama2_prompt_ids(const dj_tokenizer *tok, const char *const *roles, const char *const *contents, size_t n,
                             int32_t **ids, size_t *n_ids, dj_err *e) {
    size_t i = 0;
    const char *system = NULL;
    // OpenAI's "developer" is the system message under its newer name
    if (n && (!strcmp(roles[0], "system") || !strcmp(roles[0], "developer"))) system = contents[0], i = 1;
    if (i == n) return dj_fail(e, "messages: no user message");
    int32_t *all = NULL;
    size_t m = 0;
    for (size_t j = i; j < n; j++) {
        int user = (j - i) % 2 == 0;
        if (strcmp(roles[j], user ? "user" : "assistant")) {
            free(all);
            return dj_fail(e, "messages[%zu]: role '%s' where '%s' belongs (after an optional system or developer "
                              "message, user and assistant alternate, ending with user)",
                           j, roles[j], user ? "user" : "assistant");
        }
        int32_t *t = NULL;
        size_t nt = 0;
        int rc;
        if (user) {
            rc = chat_turn_ids(tok, CHAT_LLAMA2, system, contents[j], j == i, -1, &t, &nt, e);
        } else {  // an earlier answer as the model would have written it: its end comes with the next turn
            dj_buf b = {0};
            buf_str(&b, " ");
            add_stripped(&b, contents[j]);
            rc = encode_buf(tok, &b, &t, &nt, e);
        }
        int32_t *grown = rc ? NULL : realloc(all, (m + nt + 1) * sizeof *all);
        if (!grown) {
            free(t), free(all);
            return rc ? -1 : dj_fail(e, "out of memory");
        }
        all = grown;
        memcpy(all + m, t, nt * sizeof *t);
        m += nt;
        free(t);
    }
    if ((n - i) % 2 == 0) {
        free(all);
        return dj_fail(e, "messages: the last message is not the user's");
    }
    *ids = all, *n_ids = m;
    return 0;
}

int chat_prompt_ids(const dj_tokenizer *tok, chat_kind k, const char *const *roles, const char *const *contents,
                    size_t n, int32_t **ids, size_t *n_ids, dj_err *e) {
    *ids = NULL, *n_ids = 0;
    if (k == CHAT_LLAMA3) return llama3_prompt_ids(tok, roles, contents, n, ids, n_ids, e);
    if (k == CHAT_LLAMA2) return llama2_prompt_ids(tok, roles, contents, n, ids, n_ids, e);
    return dj_fail(e, "the model has no chat template it knows");
}

int chat_choose(const char *choice, const char *model, chat_kind *k, dj_err *e) {
    if (!choice) return *k = chat_recognise(model), 0;
    if (!strcmp(choice, "llama2")) return *k = CHAT_LLAMA2, 0;
    if (!strcmp(choice, "llama3")) return *k = CHAT_LLAMA3, 0;
    char *text;
    size_t n;
    if (in_read_all(choice, "--chat-template", (size_t)1 << 20, &text, &n, e)) return -1;
    *k = chat_recognise(text);
    free(text);
    // the file given, not the model's template, is what fails
    if (*k == CHAT_NONE)
        return dj_fail(e, "--chat-template %s is empty: give a file holding a Jinja chat_template, or llama2 or "
                          "llama3", choice);
    if (*k == CHAT_UNKNOWN)
        return dj_fail(e, "--chat-template %s is neither Llama 2's template ([INST], <<SYS>>) nor Llama 3's "
                          "(<|start_header_id|>): give llama2 or llama3", choice);
    return 0;
}
