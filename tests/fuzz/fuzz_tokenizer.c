// fuzz_tokenizer.c: libFuzzer target for tokenizer.c. The first input byte picks what the rest is:
//   (b & 0x7f) % 7 == 0     a tokenizer section for tok_load (the section parser on arbitrary bytes)
//   ... == 1..3  text for tok_encode with the real llama3 / llama2 / stories260K tokenizer (bit 7: add_special)
//   ... == 4..6  an int32 id array for tok_decode and the stream decoder with the same tokenizers
// The real tokenizers are built once at startup from $DJINN_DATA through convert/tokjson.c; without
// DJINN_DATA only the section parser is fuzzed (said once on stderr).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fuzz_tok.h"

#define N_REAL 3
static dj_tokenizer *real_tok[N_REAL];  // llama3, llama2, stories260K; NULL when not found

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const char *const dirs[N_REAL] = {"tokenizers/llama3", "tokenizers/llama2", "models/stories260K"};
    const char *data = getenv("DJINN_DATA");
    if (!data) {
        fprintf(stderr, "fuzz_tokenizer: DJINN_DATA not set: fuzzing tok_load only\n");
        return 0;
    }
    for (int i = 0; i < N_REAL; i++) real_tok[i] = fuzz_real_tokenizer("fuzz_tokenizer", data, dirs[i]);
    return 0;
}

// Strict UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF).
static int utf8_ok(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) k = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) k = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) k = 4, cp = c & 0x07, min = 0x10000;
        else return 0;
        if (k > n - i) return 0;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k;
    }
    return 1;
}

// tok_decode and the stream decoder agree. With a real tokenizer (pieces from JSON, so valid UTF-8, or raw bytes
// decoded lossily) the text is valid UTF-8; a corrupt section may hold pieces that are not (want_utf8 = 0).
static void check_decode(const dj_tokenizer *t, const int32_t *ids, size_t n, int want_utf8) {
    size_t len = 0;
    char *text = tok_decode(t, ids, n, &len);
    FUZZ_CHECK(text != NULL);
    FUZZ_CHECK(text[len] == '\0');
    if (want_utf8) FUZZ_CHECK(utf8_ok((const uint8_t *)text, len));
    dj_tok_stream *st = tok_stream_new(t);
    FUZZ_CHECK(st != NULL);
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t k = 0;
        const char *p = i < n ? tok_stream_push(st, ids[i], &k) : tok_stream_flush(st, &k);
        FUZZ_CHECK(p != NULL);
        FUZZ_CHECK(k <= len - at && memcmp(text + at, p, k) == 0);
        if (want_utf8) FUZZ_CHECK(utf8_ok((const uint8_t *)p, k));  // never part of a character
        at += k;
    }
    FUZZ_CHECK(at == len);
    tok_stream_free(st);
    free(text);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        const char *p = tok_piece(t, ids[i], &k);
        if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) FUZZ_CHECK(p == NULL);
        if (p) fuzz_touch(p, k);
        (void)tok_is_eos(t, ids[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n == 0) return 0;
    int sel = (data[0] & 0x7f) % 7, add_special = data[0] >> 7;
    const uint8_t *p = data + 1;
    size_t m = n - 1;
    dj_err e = {{0}};
    if (sel == 0 || !real_tok[(sel - 1) % N_REAL]) {
        // A copy of exactly the section, so that ASan catches any read past it.
        uint8_t *blob = malloc(m ? m : 1);
        FUZZ_CHECK(blob);
        memcpy(blob, p, m);
        dj_tokenizer *t = tok_load(blob, m, &e);
        if (!t) {
            FUZZ_CHECK(e.msg[0] != '\0');
        } else {
            // A section that loads must be usable: encode and decode a little with it.
            int32_t *ids = NULL;
            size_t n_ids = 0;
            static const char text[] = "Hello world <|begin_of_text|> \xe2\x96\x81x\n\n  12345 caf\xc3\xa9 \xf0\x9f\x98\x80";
            if (tok_encode(t, text, sizeof text - 1, 1, &ids, &n_ids, &e) == 0) {
                for (size_t i = 0; i < n_ids; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok_vocab_size(t));
                check_decode(t, ids, n_ids, 0);
                free(ids);
            }
            int32_t probe[] = {-1, 0, 1, 2, 3, tok_vocab_size(t) - 1, tok_vocab_size(t), INT32_MAX, INT32_MIN};
            check_decode(t, probe, sizeof probe / sizeof probe[0], 0);
            (void)tok_chat_template(t), (void)tok_bos(t);
            size_t n_eos = 0;
            const int32_t *eos = tok_eos_ids(t, &n_eos);
            if (n_eos) fuzz_touch(eos, n_eos * sizeof *eos);
            tok_free(t);
        }
        free(blob);
        return 0;
    }
    const dj_tokenizer *t = real_tok[(sel - 1) % N_REAL];
    if (sel <= 3) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int rc = tok_encode(t, (const char *)p, m, add_special, &ids, &n_ids, &e);
        if (!utf8_ok(p, m)) {
            FUZZ_CHECK(rc == -1 && e.msg[0] != '\0');  // malformed UTF-8 is an error
            return 0;
        }
        FUZZ_CHECK(rc == 0);  // valid UTF-8 always encodes
        for (size_t i = 0; i < n_ids; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok_vocab_size(t));
        check_decode(t, ids, n_ids, 1);
        free(ids);
    } else {
        size_t n_ids = m / sizeof(int32_t);
        int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
        FUZZ_CHECK(ids);
        memcpy(ids, p, n_ids * sizeof *ids);
        check_decode(t, ids, n_ids, 1);
        free(ids);
    }
    return 0;
}
