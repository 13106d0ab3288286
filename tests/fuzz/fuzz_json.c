// fuzz_json.c: libFuzzer target for json.c. Arbitrary bytes -> json_parse; on success walk the whole
// tree through the public getters and check what json.h promises about it.
#include <stdint.h>
#include <string.h>

#include "../../json.h"
#include "fuzz_common.h"

static void walk(const json_value *v, int depth) {
    FUZZ_CHECK(depth <= 513);  // json.h: nesting deeper than 512 is rejected
    FUZZ_CHECK(json_type_name(v->type) != NULL);
    int64_t i;
    double d;
    int b;
    switch (v->type) {
    case JSON_NULL: break;
    case JSON_BOOL:
        FUZZ_CHECK(json_bool(v, &b) == 0 && (b == 0 || b == 1));
        break;
    case JSON_NUMBER:
        FUZZ_CHECK(json_num(v, &d) == 0);
        if (v->u.number.is_int) FUZZ_CHECK(json_int(v, &i) == 0 && (double)i == v->u.number.num);
        else FUZZ_CHECK(json_int(v, &i) == -1);
        break;
    case JSON_STRING:
        FUZZ_CHECK(json_str(v) == v->u.str.s);
        FUZZ_CHECK(v->u.str.s[v->u.str.len] == '\0');
        fuzz_touch(v->u.str.s, v->u.str.len);
        break;
    case JSON_ARRAY:
        FUZZ_CHECK(json_get(v, "x") == NULL);
        for (size_t k = 0; k < v->u.arr.n; k++) walk(&v->u.arr.items[k], depth + 1);
        break;
    case JSON_OBJECT:
        for (size_t k = 0; k < v->u.obj.n; k++) {
            const json_member *m = &v->u.obj.members[k];
            FUZZ_CHECK(m->key[m->key_len] == '\0');
            fuzz_touch(m->key, m->key_len);
            // json_get matches NUL-terminated keys: keys with an escaped NUL inside cannot be looked up.
            if (strlen(m->key) == m->key_len) FUZZ_CHECK(json_get(v, m->key) != NULL);
            walk(&m->value, depth + 1);
        }
        break;
    default: FUZZ_CHECK(!"unknown json type");
    }
    if (v->type != JSON_OBJECT) FUZZ_CHECK(json_get(v, "") == NULL);
    if (v->type != JSON_STRING) FUZZ_CHECK(json_str(v) == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    dj_err e = {{0}};
    json_doc *d = json_parse((const char *)data, n, &e);
    if (!d) {
        FUZZ_CHECK(e.msg[0] != '\0');  // every failure says why
        return 0;
    }
    walk(json_root(d), 0);
    json_free(d);
    return 0;
}
