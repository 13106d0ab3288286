// api.h: OpenAI's completions and chat completions as `djinn serve` speaks them: a request body checked and turned
// into prompt ids and sampler settings (pure apart from the tokenizer: bytes in, a request or one error out), and
// the JSON of responses, stream chunks and errors.
#ifndef DJINN_API_H
#define DJINN_API_H

#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "buf.h"
#include "chat.h"
#include "sampler.h"
#include "tokenizer.h"

#define API_SESSION_MAX 256  // bytes of a session name

typedef struct {
    const dj_tokenizer *tok;
    chat_kind chat;       // the model's template (chat completions need Llama 2's or Llama 3's)
    int64_t ctx, vocab;   // the context a prompt must leave room in; the logits' width
    uint32_t n_layers, dim;
    int breakpoints;      // breakpoints and resumes are taken (else refused by name)
} api_model;

typedef struct {
    int chat, stream, include_usage;
    int park;             // "park": true: the session's cache is parked when the answer ends
    char *session;        // "session", else "user"; NULL: none
    int by_user;          // the session was named by "user" (OpenAI's end-user id): a hint (bt_job.by_user)
    int32_t *ids;         // the prompt
    size_t n_ids;
    int64_t max_tokens;   // -1: until an end token or the context's end
    int ignore_eos;       // "ignore_eos": true (llama.cpp's, vLLM's): an end token neither ends the answer nor adds text
    dj_sampler *smp;      // seeded with "seed", or a fresh seed
    char *stops[BT_STOPS];
    int n_stops;
    int brk;              // "break_after_layer": L, stop after layer `layer`
    uint32_t layer;
    uint64_t resume;      // "resume": {"id": "brk-N", ...}: N; 0: none (a resume may leave out the prompt: ids NULL)
    float *rows;          // its "residual": n_rows floats, base64 of little-endian float32 decoded, all finite
    int64_t n_rows;
} api_req;

typedef struct {
    int status;           // 400, or 500 (out of memory, a tokenizer failure)
    const char *param;    // the field at fault, or NULL
    const char *code;     // OpenAI's code for it where one applies (clients act on it), else NULL
    char msg[512];
} api_error;

// The body of POST /v1/completions (chat 0) or /v1/chat/completions (chat 1) into r; 0, or -1 with err filled.
// fresh_seed: the seed when the request names none.
int api_parse(const api_model *m, const char *body, size_t n, int chat, uint64_t fresh_seed, api_req *r,
              api_error *err);
void api_req_free(api_req *r);  // what r still owns

// The response's identity, in every chunk.
typedef struct {
    char id[48];
    const char *model;
    long long created;
    int chat;
} api_resp;

typedef struct {
    int64_t prompt, completion, cached;  // tokens: the prompt's, generated, the prompt's reused from a kept cache
} api_usage;

// One server-sent event: a piece of text (finish NULL), or the end (text NULL, finish set). role: the first chunk of
// a chat stream carries the assistant's role.
void api_chunk(dj_buf *b, const api_resp *r, int role, const char *text, size_t n, const char *finish);
// The stream's usage event (stream_options.include_usage), then its end.
void api_usage_chunk(dj_buf *b, const api_resp *r, const api_usage *u);
// A breakpoint's answer: the residual stream after `layer` at positions pos .. pos+count-1.
typedef struct {
    uint64_t id;            // brk-<id>, the paused state
    uint32_t layer, dim;
    int64_t pos, count;
    const int32_t *tokens;  // (count) the tokens at those positions
    const float *rows;      // (count, dim)
} api_brk;

// The whole response of a request that did not stream; brk (else NULL): a breakpoint's, with its "breakpoint".
void api_response(dj_buf *b, const api_resp *r, const char *text, size_t n, const char *finish, const api_brk *brk,
                  const api_usage *u);
// OpenAI's error shape: {"error": {"message", "type", "param", "code"}}; code NULL: OpenAI's for the status where it
// has one ("invalid_api_key" for 401), else null.
void api_error_json(dj_buf *b, int status, const char *param, const char *code, const char *msg);

#endif
