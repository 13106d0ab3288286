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

// ---- extras (added by the tokenizer engineer)
// The piece of id as the decoder sees it (byte-level: raw bytes; SentencePiece-style: with "▁"), not
// NUL-terminated; NULL for an id outside the vocabulary.
const char *tok_piece(const dj_tokenizer *t, int32_t id, size_t *len);
// Every eos/eot id of the model (generation_config, config.json and tokenizer_config together).
const int32_t *tok_eos_ids(const dj_tokenizer *t, size_t *n);

// ---- the tokenizer section (written by convert/tokjson.c, read by tok_load)
// Little-endian. A fixed 256-byte, zero-padded header:
//   0  char[8] "DJINNTOK"          8  u32 version (TOK_VERSION)    12 u32 type (TOK_TYPE_*)
//  16  u32 flags (TOK_F_*)         20 i32 unk_id (-1: none)        24 i32 bos_id (-1: none)
//  28  i32 eos_append_id (-1: none; appended by the post-processor when TOK_F_ADD_EOS)
//  32  u32 n_vocab  36 u32 n_merges  40 u32 n_added  44 u32 n_eos (<= TOK_MAX_EOS)
//  48  u32 pretok (TOK_PRE_*)      52 u32 prepend_scheme (TOK_PREPEND_*, Metaspace only)
//  56  u32 strip_start (SentencePiece-style decoder: Strip(" ", start, 0) after Fuse)   60 u32 0
//  64  TOK_N_SEC x {u64 offset, u64 size} from the start of the section, each validated on load:
//      TOK_SEC_PIECE_OFF  u64[n_vocab + 1]: piece i is pool[off[i], off[i+1]); off[0] = 0, nondecreasing
//      TOK_SEC_ATTR       u8[n_vocab]: TOK_A_* bits
//      TOK_SEC_POOL       bytes of every piece and added-token content
//      TOK_SEC_MERGES     u32[n_merges][3]: (left id, right id, merged id), in rank order (rank = index)
//      TOK_SEC_ADDED      n_added x {u32 id, u32 0, u64 pool offset, u64 length}: added-token contents, the
//                         strings matched in the text before normalization (special or not)
//      TOK_SEC_EOS        i32[n_eos]
//      TOK_SEC_TEMPLATE   the chat template, UTF-8, no NUL
// Pieces are what the decoder consumes: byte-level vocabularies are stored as raw bytes (the GPT-2
// byte-to-unicode mapping is undone at convert time); SentencePiece-style pieces keep their "▁".
#define TOK_MAGIC "DJINNTOK"
#define TOK_VERSION 1u
#define TOK_MAX_EOS 1024  // eos/eot ids a tokenizer may name
#define TOK_HEADER_SIZE 256u
enum { TOK_TYPE_SPM = 1,        // BPE over characters, "▁" for spaces, optional <0xNN> byte fallback (Llama 2)
       TOK_TYPE_BYTELEVEL = 2 };  // BPE over bytes, ByteLevel decoder (Llama 3)
enum {
    TOK_F_ADD_BOS = 1u << 0,         // the post-processor puts bos_id first
    TOK_F_ADD_EOS = 1u << 1,         // the post-processor appends eos_append_id
    TOK_F_NORM_PREPEND = 1u << 2,    // normalizer Prepend("▁") on every non-empty segment (legacy Llama)
    TOK_F_NORM_REPLACE = 1u << 3,    // normalizer Replace(" ", "▁")
    TOK_F_METASPACE_SPLIT = 1u << 4, // Metaspace pre-tokenizer with split: true
    TOK_F_IGNORE_MERGES = 1u << 5,   // a pre-token found whole in the vocabulary is one token
    TOK_F_BYTE_FALLBACK = 1u << 6,   // unknown characters become <0xNN> pieces
    TOK_F_FUSE_UNK = 1u << 7,        // consecutive unknown characters become one unk
};
#define TOK_F_ALL 0xffu
enum { TOK_PRE_NONE = 0, TOK_PRE_METASPACE = 1, TOK_PRE_LLAMA3 = 2 };
enum { TOK_PREPEND_ALWAYS = 0, TOK_PREPEND_FIRST = 1, TOK_PREPEND_NEVER = 2 };
enum { TOK_SEC_PIECE_OFF, TOK_SEC_ATTR, TOK_SEC_POOL, TOK_SEC_MERGES, TOK_SEC_ADDED, TOK_SEC_EOS, TOK_SEC_TEMPLATE,
       TOK_N_SEC };
enum {
    TOK_A_EXISTS = 1u << 0,   // the id is defined (vocabularies may have holes)
    TOK_A_MODEL = 1u << 1,    // in the BPE model's vocabulary (BPE may produce it)
    TOK_A_ADDED = 1u << 2,    // an added token
    TOK_A_SPECIAL = 1u << 3,  // a special added token: skipped by decode
};

#endif
