// fuzz_tok.h: a real tokenizer for the fuzz targets that need one (fuzz_tokenizer, fuzz_api), built at startup
// from $DJINN_DATA's HF files through convert/tokjson.c.
#ifndef DJINN_FUZZ_TOK_H
#define DJINN_FUZZ_TOK_H

#include <stdio.h>
#include <stdlib.h>

#include "../../convert/tokjson.h"
#include "../../tokenizer.h"

// The tokenizer of data/rel (a folder of HF tokenizer files), or NULL, said on stderr under `who`'s name.
static inline dj_tokenizer *fuzz_real_tokenizer(const char *who, const char *data, const char *rel) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", data, rel);
    uint8_t *blob = NULL;
    size_t size = 0;
    dj_err e = {{0}};
    if (tokjson_build_dir(path, &blob, &size, &e)) {
        fprintf(stderr, "%s: %s: %s: skipping it\n", who, path, e.msg);
        return NULL;
    }
    dj_tokenizer *t = tok_load(blob, size, &e);
    if (!t) fprintf(stderr, "%s: %s: tok_load: %s: skipping it\n", who, path, e.msg);
    free(blob);  // tok_load copies what it keeps
    return t;
}

#endif
