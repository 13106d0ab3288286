// chat.h: the chat templates djinn knows, recognised from the one stored in model.bin (tokenizer_config.json's
// chat_template), and the token ids each turn of a conversation appends to the KV cache.
//   Llama 2  [BOS] "[INST] " (first turn: "<<SYS>>\n" system "\n<</SYS>>\n\n") user " [/INST]"; an answer ends " </s>"
//   Llama 3  [BOS] (first turn: "<|start_header_id|>system<|end_header_id|>\n\n" system "<|eot_id|>")
//            "<|start_header_id|>user<|end_header_id|>\n\n" user "<|eot_id|><|start_header_id|>assistant
//            <|end_header_id|>\n\n"; an answer ends "<|eot_id|>"
// The user's and the system's text are stripped of surrounding whitespace, as the templates do.
#ifndef DJINN_CHAT_H
#define DJINN_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "util.h"

typedef enum { CHAT_NONE, CHAT_LLAMA2, CHAT_LLAMA3, CHAT_UNKNOWN } chat_kind;

// Which template `tmpl` is: CHAT_NONE for "", CHAT_UNKNOWN for one that is neither Llama 2's nor Llama 3's.
chat_kind chat_recognise(const char *tmpl);
// --chat-template's value: "llama2", "llama3", or a file holding a Jinja template (recognised as above); `model` is the
// template model.bin holds, taken when choice is NULL (CHAT_NONE/CHAT_UNKNOWN as chat_recognise); -1 with e set when
// the file cannot be read, or is empty or not recognised.
int chat_choose(const char *choice, const char *model, chat_kind *k, dj_err *e);
const char *chat_kind_name(chat_kind k);

// The ids of one user turn, *ids malloc'd: `first` for the conversation's first (BOS and the system text, when
// given); after it they begin with the end of the previous answer: prev_end, the end token the model sampled, or
// for -1 (an answer cut short by -n or Ctrl-C) the template's own end. The assistant's answer follows these ids.
int chat_turn_ids(const dj_tokenizer *tok, chat_kind k, const char *system, const char *user, int first,
                  int32_t prev_end, int32_t **ids, size_t *n, dj_err *e);

// A whole conversation as the prompt of the next answer (the API's messages), ending with a user message; "developer"
// is the system message. Llama 2: an optional system message first, then user and assistant alternating (as its
// template demands); Llama 3: system, user and assistant messages in any order (as its template writes them). An
// earlier answer is encoded as the model would have written it and closed by the next turn. *ids malloc'd.
int chat_prompt_ids(const dj_tokenizer *tok, chat_kind k, const char *const *roles, const char *const *contents,
                    size_t n, int32_t **ids, size_t *n_ids, dj_err *e);

#endif
