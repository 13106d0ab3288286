// tokjson.h: tokenizer.json (+ tokenizer_config.json, generation_config.json, config.json) -> the engine's
// binary tokenizer section. Refuses, by name, any tokenizer.json configuration the engine does not implement.
#ifndef DJINN_TOKJSON_H
#define DJINN_TOKJSON_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

// Reads the tokenizer files of a HuggingFace model directory; *blob is malloc'd.
int tokjson_build_dir(const char *hf_dir, uint8_t **blob, size_t *blob_size, dj_err *e);

#endif
