// test_fuzz_regress.c: every input that crashed a fuzz target (tests/fuzz/), fed back to its parser. The bytes
// are copied from tests/fuzz/crashes/ so the test stands alone. The UB these inputs once triggered (NULL + 0)
// is reported by clang's UBSan only, not gcc's: `make fuzz-replay` (in CI) feeds the crash files themselves to
// the clang-built targets, which fail without the fix.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../api.h"
#include "../json.h"
#include "../convert/safetensors.h"
#include "../convert/tokjson.h"
#include "common.h"

// tests/fuzz/crashes/json_empty_object_null_offset: an empty container made json.c compute NULL + 0
// (its child stack was still unallocated), undefined behaviour caught by UBSan.
Test(fuzz_regress, json_empty_containers) {
    static const char *const docs[] = {"{}", "[]", " [ {}, [], {\"a\": []} ] ", "{\"a\":{}}"};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        dj_err e = {{0}};
        json_doc *d = json_parse(docs[i], strlen(docs[i]), &e);
        cr_assert_not_null(d, "%s: %s", docs[i], e.msg);
        const json_value *r = json_root(d);
        cr_expect(r->type == JSON_OBJECT || r->type == JSON_ARRAY, "%s: root is %s", docs[i], json_type_name(r->type));
        if (i == 0) cr_expect_eq(r->u.obj.n, 0);
        if (i == 1) cr_expect_eq(r->u.arr.n, 0);
        json_free(d);
    }
}

// tests/fuzz/crashes/safetensors_empty_header_null_offset: the same bug reached through a safetensors header "{}".
Test(fuzz_regress, safetensors_empty_header) {
    static const unsigned char bytes[] = {0x02, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    st_file f;
    dj_err e = {{0}};
    cr_assert_eq(st_parse(bytes, sizeof bytes, &f, &e), 0, "%s", e.msg);
    cr_expect_eq(f.n, 0);
    cr_expect_null(st_find(&f, "a"));
    st_free(&f);
}

// tests/fuzz/crashes/api_role_with_a_newline: a chat message's role "\nsystem" came back inside the error, which
// then was two lines (in the server's log too). Every error is one line: control characters a message quotes are
// written as escapes (dj_one_line), in dj_fail's messages and in the API's.
Test(fuzz_regress, errors_quoting_a_client_stay_one_line) {
    dj_err e = {{0}};
    cr_assert_eq(dj_fail(&e, "role '%s' then '%s'", "\nsys\ttem\r", "a\x01\x7f" "b"), -1);
    cr_expect_str_eq(e.msg, "role '\\nsys\\ttem\\r' then 'a\\x01\\x7fb'");
    dj_tokenizer *t = tc_load_tokenizer("tokenizers/llama3");
    const api_model m = {.tok = t, .chat = CHAT_LLAMA3, .ctx = 64, .vocab = tok_vocab_size(t), .n_layers = 4, .dim = 2};
    static const char *const bodies[] = {
        "{\"messages\": [{\"role\": \"\\nsystem\", \"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
        "{\"role\": \"a\\r\\n\\u0001\", \"content\": \"y\"}]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        api_req r;
        api_error err;
        cr_assert_eq(api_parse(&m, bodies[i], strlen(bodies[i]), 1, 7, &r, &err), -1, "%s", bodies[i]);
        cr_expect(err.status == 400 && strstr(err.msg, "role") && !strpbrk(err.msg, "\r\n\x01"), "%s: %s",
                  bodies[i], err.msg);
    }
    tok_free(t);
}

// tests/fuzz/crashes/tokjson_no_merges_null_memcpy: a BPE tokenizer.json without "merges" (a vocabulary of whole
// pieces only) made write_blob memcpy from a NULL list (UBSan: clang's, in `make fuzz-replay`). It builds, loads and
// encodes piece by piece.
Test(fuzz_regress, tokjson_without_merges) {
    char path[4096];
    tc_data_path(path, sizeof path, "models/stories260K/tokenizer.json");
    size_t n;
    char *s = tc_must_read(path, &n);
    char *m = strstr(s, "\"merges\"");
    cr_assert(m, "no merges in %s", path);
    memcpy(m + 1, "megres", 6);  // the key renamed: no merges
    uint8_t *blob = NULL;
    size_t bn = 0;
    dj_err e = {{0}};
    cr_assert_eq(tokjson_build(s, n, NULL, 0, NULL, 0, NULL, 0, &blob, &bn, &e), 0, "%s", e.msg);
    dj_tokenizer *t = tok_load(blob, bn, &e);
    cr_assert(t, "%s", e.msg);
    int32_t *ids = NULL;
    size_t ni = 0;
    cr_assert_eq(tok_encode(t, "the cat", 7, 0, &ids, &ni, &e), 0, "%s", e.msg);
    cr_expect_eq(ni, 8, "%zu ids for \"▁the▁cat\" without merges", ni);  // "▁" prepended, the space a "▁"
    free(ids), free(blob), free(s);
    tok_free(t);
}
