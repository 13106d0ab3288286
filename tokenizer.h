// tokenizer.h: the engine's tokenizer, loaded from model.bin's tokenizer section (written by ./convert from
// tokenizer.json). Gives exactly the ids and text that HF `tokenizers` gives for the same tokenizer.json.
#ifndef DJINN_TOKENIZER_H
#define DJINN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct dj_tokenizer dj_tokenizer;

// Parses and validates a tokenizer section (pure: bytes in). NULL with e set on a corrupt section.
dj_tokenizer *tok_load(const void *blob, size_t n, dj_err *e);
void tok_free(dj_tokenizer *t);

int32_t tok_vocab_size(const dj_tokenizer *t);
int32_t tok_bos(const dj_tokenizer *t);                 // -1 when the model has none
int tok_is_eos(const dj_tokenizer *t, int32_t id);      // any eos/eot id of the model
const char *tok_chat_template(const dj_tokenizer *t);   // "" when none

// text -> ids; special tokens written in the text are matched as special tokens; BOS added as the
// post-processor says when add_special is 1. *ids is malloc'd. Malformed UTF-8: error (e set), -1.
int tok_encode(const dj_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, size_t *n_ids,
               dj_err *e);
// ids -> text, as HF decode(ids, skip_special_tokens=True). Returns a malloc'd NUL-terminated string.
char *tok_decode(const dj_tokenizer *t, const int32_t *ids, size_t n, size_t *len);

// Streaming decode, one id at a time: the concatenation of every push and the final flush equals
// tok_decode of all ids pushed; never emits part of a UTF-8 character.
typedef struct dj_tok_stream dj_tok_stream;
dj_tok_stream *tok_stream_new(const dj_tokenizer *t);
// Returns the text that became final with this id (valid until the next call; *len may be 0).
const char *tok_stream_push(dj_tok_stream *s, int32_t id, size_t *len);
const char *tok_stream_flush(dj_tok_stream *s, size_t *len);
void tok_stream_free(dj_tok_stream *s);

#endif
