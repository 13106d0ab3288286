// json.h: a strict RFC 8259 JSON parser, shared by the converter (config.json, safetensors headers,
// tokenizer.json) and the server (request bodies). Pure: it takes bytes and returns a tree or one error line. The
// engine (the forward passes) never uses it.
#ifndef DJINN_JSON_H
#define DJINN_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
typedef struct json_member json_member;

struct json_value {
    json_type type;
    union {
        int boolean;
        struct {
            double num;       // always set
            int64_t i;        // set when is_int
            int is_int;       // the literal is an integer (no '.', 'e') that fits int64
        } number;
        struct {
            const char *s;    // UTF-8, unescaped, NUL-terminated (may also contain "\u0000" as a NUL byte)
            size_t len;
        } str;
        struct {
            json_value *items;
            size_t n;
        } arr;
        struct {
            json_member *members;  // in document order
            size_t n;
        } obj;
    } u;
};

struct json_member {
    const char *key;  // unescaped, NUL-terminated
    size_t key_len;
    json_value value;
};

typedef struct json_doc json_doc;  // owns every node and string of one parse (one arena)

// Parses exactly one JSON value (surrounding whitespace allowed) from text[0..n). Rejects: trailing
// garbage, invalid UTF-8 in strings, bad escapes, unpaired surrogates, control characters in strings,
// leading zeros, nesting deeper than 512. On error returns NULL with "json: line L, column C: what".
json_doc *json_parse(const char *text, size_t n, dj_err *e);
const json_value *json_root(const json_doc *d);
void json_free(json_doc *d);

// Lookups: NULL when obj is not an object or the key is absent (the last duplicate wins).
const json_value *json_get(const json_value *obj, const char *key);
// Typed getters: 0 on success; -1 when v is NULL or of another type (or, for ints, not an integer).
int json_int(const json_value *v, int64_t *out);
int json_num(const json_value *v, double *out);  // integer or real
int json_bool(const json_value *v, int *out);
const char *json_str(const json_value *v);        // NULL unless a string
const char *json_type_name(json_type t);          // "null", "bool", "number", "string", "array", "object"
// An optional flag: *out = obj's key as a bool, dflt where it is absent or null; 0, or -1 with "WHERE: \"KEY\" must
// be true or false, not a TYPE" in e where it holds anything else (read as absent, a "true" string or a 1 would
// turn the flag off unnoticed).
int json_opt_bool(const json_value *obj, const char *key, const char *where, int dflt, int *out, dj_err *e);

#endif
