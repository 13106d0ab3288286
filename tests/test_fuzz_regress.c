// test_fuzz_regress.c: every input that crashed a fuzz target (tests/fuzz/), fed back to its parser. The bytes
// are copied from tests/fuzz/crashes/ so the test stands alone. The UB these inputs once triggered (NULL + 0)
// is reported by clang's UBSan only, not gcc's: `make fuzz-replay` (in CI) feeds the crash files themselves to
// the clang-built targets, which fail without the fix.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../json.h"
#include "../convert/safetensors.h"

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
