// fuzz_tokjson.c: libFuzzer target for convert/tokjson.c, which turns a model's tokenizer files into the
// engine's tokenizer section. The input is up to four texts separated by 0xFF bytes (never in JSON, which is
// UTF-8): tokenizer.json, then tokenizer_config.json, generation_config.json and config.json (each absent when
// the input has fewer parts). Checks: a failure says why on one line; a section it builds loads in the engine
// (tok_load), whose encoding of a fixed text gives ids in its vocabulary that decode without error.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../convert/tokjson.h"
#include "../../tokenizer.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *part[4] = {NULL, NULL, NULL, NULL};
    size_t len[4] = {0, 0, 0, 0};
    const uint8_t *p = data, *end = data + n;
    for (int k = 0;; k++) {  // the fourth part takes the rest
        const uint8_t *sep = k < 3 ? memchr(p, 0xFF, (size_t)(end - p)) : NULL;
        part[k] = (const char *)p, len[k] = (size_t)((sep ? sep : end) - p);
        if (!sep) break;
        p = sep + 1;
    }
    uint8_t *blob = NULL;
    size_t bn = 0;
    dj_err e = {{0}};
    if (tokjson_build(part[0], len[0], part[1], len[1], part[2], len[2], part[3], len[3], &blob, &bn, &e)) {
        FUZZ_CHECK(fuzz_one_line(e.msg, sizeof e.msg));
        FUZZ_CHECK(blob == NULL);
        return 0;
    }
    FUZZ_CHECK(blob && bn > 0);
    dj_tokenizer *t = tok_load(blob, bn, &e);
    if (!t) fprintf(stderr, "fuzz_tokjson: a built section does not load: %s\n", e.msg);
    FUZZ_CHECK(t != NULL);
    static const char text[] = "Hello world! caf\xc3\xa9 <s> \xe2\x96\x81 12 \xf0\x9f\x98\x80\n";
    int32_t *ids = NULL;
    size_t ni = 0;
    if (tok_encode(t, text, sizeof text - 1, 1, &ids, &ni, &e) == 0) {
        for (size_t i = 0; i < ni; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok_vocab_size(t));
        size_t dl = 0;
        char *dec = tok_decode(t, ids, ni, &dl);
        FUZZ_CHECK(dec != NULL);
        free(dec);
        free(ids);
    } else {
        FUZZ_CHECK(fuzz_one_line(e.msg, sizeof e.msg));
    }
    tok_free(t);
    free(blob);
    return 0;
}
