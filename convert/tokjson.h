// tokjson.h: tokenizer.json (+ tokenizer_config.json, generation_config.json, config.json) -> the engine's
// binary tokenizer section. Refuses, by name, any tokenizer.json configuration the engine does not implement.
#ifndef DJINN_TOKJSON_H
#define DJINN_TOKJSON_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

// Pure core: the contents of tokenizer.json (required) and of tokenizer_config.json, generation_config.json and
// config.json (each NULL when the file is absent) -> the section; *blob is malloc'd.
int tokjson_build(const char *tokenizer_json, size_t tokenizer_json_len, const char *tokenizer_config,
                  size_t tokenizer_config_len, const char *generation_config, size_t generation_config_len,
                  const char *config, size_t config_len, uint8_t **blob, size_t *blob_size, dj_err *e);

// Reads the tokenizer files of a HuggingFace model directory; *blob is malloc'd.
int tokjson_build_dir(const char *hf_dir, uint8_t **blob, size_t *blob_size, dj_err *e);
// The same with the tokenizer taken from another folder (./convert --tokenizer): tokenizer.json and
// tokenizer_config.json from tok_dir, the model's config.json and generation_config.json (its bos/eos ids)
// from model_dir.
int tokjson_build_dirs(const char *tok_dir, const char *model_dir, uint8_t **blob, size_t *blob_size, dj_err *e);

#endif
