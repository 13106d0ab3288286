// fuzz_api.c: libFuzzer target for api.c's request parser (api_parse), the body of a POST from any client. The
// first input byte picks the endpoint (bit 0: chat), the model (bits 1-2: the llama3 tokenizer with Llama 3's
// template, the llama2 one with Llama 2's, the llama3 one with none or an unknown one), the context (bit 3: 64 or
// 8192 tokens) and whether breakpoints are on (bit 4); the rest is the body. The tokenizers are built once at startup
// from $DJINN_DATA (without it nothing is fuzzed, said once on stderr). Checks what api.h promises: a request, or
// one error with its status and a one-line message and nothing left to free; a request's prompt in the
// vocabulary and the context, its limits in their ranges, its residual rows whole and finite.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../api.h"
#include "fuzz_common.h"
#include "fuzz_tok.h"

static dj_tokenizer *tok[2];  // llama3, llama2; NULL when not found

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const char *const dirs[2] = {"tokenizers/llama3", "tokenizers/llama2"};
    const char *data = getenv("DJINN_DATA");
    if (!data) {
        fprintf(stderr, "fuzz_api: DJINN_DATA not set: nothing to fuzz (the parser needs a tokenizer)\n");
        return 0;
    }
    for (int i = 0; i < 2; i++) tok[i] = fuzz_real_tokenizer("fuzz_api", data, dirs[i]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int sel = data[0], chat = sel & 1, which = (sel >> 1) & 3;
    static const chat_kind kinds[4] = {CHAT_LLAMA3, CHAT_LLAMA2, CHAT_NONE, CHAT_UNKNOWN};
    const dj_tokenizer *t = tok[which == 1];
    if (!t) return 0;
    api_model m = {.tok = t, .chat = kinds[which], .ctx = sel & 8 ? 8192 : 64, .vocab = tok_vocab_size(t),
                   .n_layers = 4, .dim = 2, .breakpoints = (sel >> 4) & 1};
    api_req r;
    api_error err;
    const int rc = api_parse(&m, (const char *)data + 1, size - 1, chat, 7, &r, &err);
    FUZZ_CHECK(rc == 0 || rc == -1);
    if (rc == -1) {
        FUZZ_CHECK(err.status == 400 || err.status == 404 || err.status == 500);
        FUZZ_CHECK(fuzz_one_line(err.msg, sizeof err.msg));
        if (err.param) fuzz_touch(err.param, strlen(err.param));
        FUZZ_CHECK(!r.ids && !r.smp && !r.session && !r.rows && r.n_stops == 0);  // nothing left to free
        return 0;
    }
    FUZZ_CHECK(r.chat == chat && r.smp);
    FUZZ_CHECK(r.max_tokens == -1 || (r.max_tokens >= 1 && r.max_tokens <= INT32_MAX));
    if (r.ids) {
        FUZZ_CHECK(r.n_ids >= 1 && (int64_t)r.n_ids < m.ctx);
        for (size_t i = 0; i < r.n_ids; i++) FUZZ_CHECK(r.ids[i] >= 0 && r.ids[i] < m.vocab);
    } else {
        FUZZ_CHECK(r.resume && r.n_ids == 0);  // only a resume may leave out the prompt
    }
    FUZZ_CHECK(r.n_stops >= 0 && r.n_stops <= BT_STOPS);
    for (int i = 0; i < r.n_stops; i++) FUZZ_CHECK(r.stops[i] && r.stops[i][0]);
    if (r.session) FUZZ_CHECK(strlen(r.session) >= 1 && strlen(r.session) <= API_SESSION_MAX);
    FUZZ_CHECK(!r.park || r.session);
    FUZZ_CHECK(!r.brk || (m.breakpoints && r.layer < m.n_layers && !r.resume && !r.stream));
    FUZZ_CHECK(!r.resume || m.breakpoints);
    FUZZ_CHECK(!r.rows || (r.resume && r.n_rows % m.dim == 0));
    for (int64_t i = 0; r.rows && i < r.n_rows; i++) FUZZ_CHECK(isfinite(r.rows[i]));
    api_req_free(&r);
    return 0;
}
