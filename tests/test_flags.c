// test_flags.c: the habits a llama.cpp user brings, on djinn and djinn serve ($DJINN_BIN) with stories260K: llama.cpp's
// spellings give byte for byte what Djinn's own give; -t with a whole number of 2 or more (a thread count there) is
// refused with one line naming --threads and --temp, while --temp 8 is a temperature; -n -1 runs to the context's
// end; -ngl is answered with one line and ignored; llama-server's -m, --ctx-size and -np reach the server's options.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

typedef struct {
    char dir[256], model[400], out[400], err[400], djinn[1100];
} tf_env;

static void tf_setup(tf_env *t) {
    char *d = tc_tmpdir("flags"), src[1100], convert[1100];
    snprintf(t->dir, sizeof t->dir, "%s", d);
    free(d);
    tc_data_path(src, sizeof src, "models/stories260K");
    snprintf(t->djinn, sizeof t->djinn, "%s/djinn", tc_bin_dir());
    snprintf(convert, sizeof convert, "%s/convert", tc_bin_dir());
    snprintf(t->model, sizeof t->model, "%s/s.bin", t->dir);
    snprintf(t->out, sizeof t->out, "%s/out", t->dir);
    snprintf(t->err, sizeof t->err, "%s/err", t->dir);
    cr_assert_eq(tc_run((char *[]){convert, src, t->model, "--dtype", "f32", "-q", NULL}, "/dev/null", t->out, 0,
                        t->err, 120), 0, "convert failed");
}

// Runs djinn with argv[1..] (argv[0] is replaced by the binary); the exit code, stdout and stderr (malloc'd).
static int tf_run(tf_env *t, char **argv, char **out, char **err) {
    argv[0] = t->djinn;
    int rc = tc_run(argv, "/dev/null", t->out, 0, t->err, 120);
    *out = tc_must_read(t->out, NULL), *err = tc_must_read(t->err, NULL);
    return rc;
}

Test(flags, llama_cpp_spellings_mean_the_same) {
    tf_env t;
    tf_setup(&t);
    char *o1, *e1, *o2, *e2;
    int r1 = tf_run(&t, (char *[]){NULL, t.model, "-p", "Once upon a time", "-n", "24", "-t", "0.8", "-s", "7", "-c",
                                   "64", "--stop", "park", "--cpu", NULL}, &o1, &e1);
    int r2 = tf_run(&t, (char *[]){NULL, "-m", t.model, "--prompt", "Once upon a time", "--n-predict", "24", "--temp",
                                   "0.8", "--seed", "7", "--ctx-size", "64", "-r", "park", "--cpu", NULL}, &o2, &e2);
    cr_assert(r1 == 0 && r2 == 0, "exit %d and %d: %s / %s", r1, r2, e1, e2);
    cr_assert_str_eq(o2, o1, "llama.cpp's spellings gave another text");
    free(o1), free(e1), free(o2), free(e2);
    tc_rm_rf(t.dir);
}

Test(flags, t_as_a_thread_count_is_refused) {
    tf_env t;
    tf_setup(&t);
    static const char *const refused[] = {"8", "2", "16"}, *const taken[] = {"1", "0", "1.5", "2.0", "0.7"};
    char *o, *e;
    for (size_t i = 0; i < 3; i++) {
        int rc = tf_run(&t, (char *[]){NULL, t.model, "-p", "hi", "-n", "2", "-t", (char *)refused[i], "--cpu", NULL},
                        &o, &e);
        cr_assert(rc == 2 && strstr(e, "--threads") && strstr(e, "--temp") && !*o && strchr(e, '\n') == e + strlen(e) - 1,
                  "-t %s: exit %d, stdout '%s', stderr '%s'", refused[i], rc, o, e);
        free(o), free(e);
    }
    for (size_t i = 0; i < 5; i++) {
        int rc = tf_run(&t, (char *[]){NULL, t.model, "-p", "hi", "-n", "2", "-t", (char *)taken[i], "-s", "1", "--cpu",
                                       NULL}, &o, &e);
        cr_assert_eq(rc, 0, "-t %s: %s", taken[i], e);
        free(o), free(e);
    }
    int rc = tf_run(&t, (char *[]){NULL, t.model, "-p", "hi", "-n", "2", "--temp", "8", "-s", "1", "--cpu", NULL}, &o, &e);
    cr_assert_eq(rc, 0, "--temp 8 is a temperature: %s", e);
    free(o), free(e);
    tc_rm_rf(t.dir);
}

Test(flags, n_minus_one_runs_to_the_context) {
    tf_env t;
    tf_setup(&t);
    char *o, *e;
    int rc = tf_run(&t, (char *[]){NULL, t.model, "-p", "Once", "-n", "-1", "-t", "0", "-c", "24", "--cpu", NULL}, &o, &e);
    // "Once" is BOS and one token: 22 new tokens fill the context of 24
    cr_assert(rc == 0 && strstr(e, "stopped after 22 new tokens: the context of 24 tokens is full"), "exit %d: %s", rc,
              e);
    free(o), free(e);
    rc = tf_run(&t, (char *[]){NULL, t.model, "-n", "-2", "--cpu", NULL}, &o, &e);
    cr_assert(rc == 2 && strstr(e, "-n needs a count >= 0 (-1: until the context is full)"), "exit %d: %s", rc, e);
    free(o), free(e);
    tc_rm_rf(t.dir);
}

Test(flags, ngl_is_answered_and_ignored) {
    tf_env t;
    tf_setup(&t);
    char *o1, *e1, *o2, *e2;
    int r1 = tf_run(&t, (char *[]){NULL, t.model, "-p", "hi", "-n", "8", "-t", "0", "--cpu", NULL}, &o1, &e1);
    int r2 = tf_run(&t, (char *[]){NULL, t.model, "-p", "hi", "-n", "8", "-t", "0", "--cpu", "-ngl", "99", NULL}, &o2,
                    &e2);
    cr_assert(r1 == 0 && r2 == 0, "%s / %s", e1, e2);
    cr_assert_str_eq(o2, o1);
    cr_assert(strstr(e2, "-ngl 99: Djinn sizes the GPU's share by memory, not layers: --ring-gb"), "%s", e2);
    free(o1), free(e1), free(o2), free(e2);
    tc_rm_rf(t.dir);
}

// The server's refusals after reading the model say which options reached it: -m is the model, --ctx-size the
// context (-c), -np the sequences a step (--parallel).
Test(flags, llama_server_spellings) {
    tf_env t;
    tf_setup(&t);
    char *o, *e;
    int rc = tf_run(&t, (char *[]){NULL, "serve", "-m", t.model, "--cpu", "--port", "0", "--ctx-size", "64", "--kv-gb",
                                   "0.00001", NULL}, &o, &e);
    cr_assert(rc == 2 && strstr(e, "one slot of 64 positions"), "exit %d: %s", rc, e);
    free(o), free(e);
    rc = tf_run(&t, (char *[]){NULL, "serve", "--model", t.model, "--cpu", "--port", "0", "-c", "512", "-np", "5",
                               "--kv-gb", "0.0014", NULL}, &o, &e);  // 4 slots of f16, 2 of f32
    cr_assert(rc == 2 && strstr(e, "--parallel 5 needs as many KV slots"), "exit %d: %s", rc, e);
    free(o), free(e);
    rc = tf_run(&t, (char *[]){NULL, "serve", t.model, "-m", t.model, NULL}, &o, &e);
    cr_assert(rc == 2 && strstr(e, "a second model path"), "exit %d: %s", rc, e);
    free(o), free(e);
    tc_rm_rf(t.dir);
}

// What djinn says about itself and its start: --version names the model.bin version the converter writes (model.h's
// DJ_VERSION, 3); a missing model is the first and only line (no GPU probe before it); a run into a log says its
// load in one line and "1 thread" in the singular.
Test(flags, the_first_lines) {
    tf_env t;
    tf_setup(&t);
    char *o, *e;
    int rc = tf_run(&t, (char *[]){NULL, "--version", NULL}, &o, &e);
    cr_assert(rc == 0 && strstr(o, "model.bin version 3,") && !strstr(o, "versions 1 and 2"), "%s", o);
    free(o), free(e);
    rc = tf_run(&t, (char *[]){NULL, "/nonexistent/m.bin", "-p", "hi", NULL}, &o, &e);
    cr_assert(rc == 1 && !strncmp(e, "djinn: cannot open model /nonexistent/m.bin:", 44) && strchr(e, '\n') ==
              e + strlen(e) - 1, "exit %d: %s", rc, e);
    free(o), free(e);
    rc = tf_run(&t, (char *[]){NULL, t.model, "-p", "hi", "-n", "2", "-t", "0", "--cpu", "--threads", "1", NULL}, &o, &e);
    cr_assert_eq(rc, 0, "%s", e);
    int loads = 0;
    for (const char *p = e; (p = strstr(p, "load")); p++) loads += p == e || p[-1] == '\n' || !strncmp(p, "loaded", 6);
    cr_assert(loads == 1 && strstr(e, "(--cpu), 1 thread\n"), "%d load lines: %s", loads, e);
    free(o), free(e);
    tc_rm_rf(t.dir);
}

// stories260K holds no chat template: --chat refuses it by name, --chat-template llama2 chats in Llama 2's (the
// same ids as a model converted with that template: the same text), and a template file that cannot be read is
// one line.
Test(flags, chat_template_for_a_model_without_one) {
    tf_env t;
    tf_setup(&t);
    char in[500], *o, *e;
    snprintf(in, sizeof in, "%s/in", t.dir);
    tc_write(in, "Tell me about a cat.\n", 21);
    char *argv[] = {t.djinn, t.model, "--chat", "-n", "20", "-t", "0", "--cpu", NULL, NULL, NULL};
    int rc = tc_run(argv, in, t.out, 0, t.err, 120);
    e = tc_must_read(t.err, NULL);
    cr_assert(rc == 1 && strstr(e, "--chat-template llama2|llama3|FILE"), "exit %d: %s", rc, e);
    free(e);
    argv[8] = "--chat-template", argv[9] = "llama2";
    rc = tc_run(argv, in, t.out, 0, t.err, 120);
    o = tc_must_read(t.out, NULL), e = tc_must_read(t.err, NULL);
    cr_assert(rc == 0 && strlen(o) > 20 && strstr(e, "Llama 2 ([INST]) template"), "exit %d: %s / %s", rc, o, e);
    free(o), free(e);
    argv[9] = "/nonexistent/template.jinja";
    rc = tc_run(argv, in, t.out, 0, t.err, 120);
    e = tc_must_read(t.err, NULL);
    const char *last = strstr(e, "djinn: cannot open --chat-template /nonexistent/template.jinja");
    cr_assert(rc == 1 && last && strchr(last, '\n') == e + strlen(e) - 1, "exit %d: %s", rc, e);  // the last line
    free(e);
    // a file that is empty or holds a template neither Llama 2's nor 3's: the file is named, not the model blamed
    char tpl[500], want[600];
    snprintf(tpl, sizeof tpl, "%s/template.jinja", t.dir);
    argv[9] = tpl;
    for (int k = 0; k < 2; k++) {
        tc_write(tpl, "hello {{ messages }}", k ? 20 : 0);
        snprintf(want, sizeof want, "djinn: --chat-template %s is %s", tpl, k ? "neither Llama 2's" : "empty");
        rc = tc_run(argv, in, t.out, 0, t.err, 120);
        e = tc_must_read(t.err, NULL);
        cr_assert(rc == 1 && strstr(e, want) && !strstr(e, "the model's"), "exit %d: %s", rc, e);
        free(e);
    }
    tc_rm_rf(t.dir);
}

// The README's table of flags and the programs' --help say the same: every option line of `djinn --help` (a line
// that starts with spaces and a dash) names a flag in the table's first column, and every flag there that the
// table gives to `run` is in djinn's --help, every one it gives to `serve` in serve's (`both`: in both). The table is
// the README's "| flag | for | meaning [default] |".
static char *tf_help(tf_env *t, int serve) {
    char *o, *e;
    int rc = tf_run(t, serve ? (char *[]){NULL, "serve", "--help", NULL} : (char *[]){NULL, "--help", NULL}, &o, &e);
    cr_assert_eq(rc, 0, "%s", e);
    free(e);
    return o;
}

// The flags (a dash and letters) in s[0..n) that stand in backquotes, or at a line's start after spaces (help's
// option lines), each followed by a space: into out, separated by spaces.
static void tf_flags(const char *s, size_t n, int help, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int start = help ? (s[i] == '-' && i > 0 && s[i - 1] == ' ' && (i < 2 || s[i - 2] == ' ' || s[i - 2] == '\n'))
                         : (s[i] == '-' && i > 0 && (s[i - 1] == '`' || s[i - 1] == ' '));
        if (help && start) {  // only where the line holds nothing but spaces before it
            size_t j = i;
            while (j > 0 && s[j - 1] == ' ') j--;
            start = j == 0 || s[j - 1] == '\n';
        }
        if (!start || i + 1 >= n || !(s[i + 1] == '-' || (s[i + 1] >= 'a' && s[i + 1] <= 'z'))) continue;
        size_t j = i + 1;
        while (j < n && (s[j] == '-' || (s[j] >= 'a' && s[j] <= 'z') || (s[j] >= '0' && s[j] <= '9'))) j++;
        if (k + (j - i) + 2 < cap) memcpy(out + k, s + i, j - i), k += j - i, out[k++] = ' ';
        i = j;
    }
    out[k] = 0;
}

// Whether flag (n bytes) stands in text as a word of its own (between spaces, slashes, commas or parentheses).
static int tf_has(const char *text, const char *flag, size_t n) {
    for (const char *p = text; (p = strstr(p, flag)); p += n)
        if ((p == text || strchr(" /(,\n", p[-1])) && strchr(" /),\n", p[n])) return 1;
    return 0;
}

Test(flags, readme_table_and_help_agree) {
    tf_env t;
    tf_setup(&t);
    char path[1200];
    snprintf(path, sizeof path, "%s/../README.md", tc_tests_dir());
    char *readme = tc_must_read(path, NULL);
    const char *table = strstr(readme, "| flag | for | meaning [default] |");
    cr_assert(table, "no flag table in %s", path);
    static char in_run[8192], in_serve[8192], all[16384], help_run[8192], help_serve[8192];
    in_run[0] = in_serve[0] = all[0] = 0;
    for (const char *line = strchr(table, '\n') + 1; *line == '|'; line = strchr(line, '\n') + 1) {
        const char *c1 = strchr(line + 1, '|'), *c2 = c1 ? strchr(c1 + 1, '|') : NULL;
        cr_assert(c1 && c2, "a malformed table line: %.80s", line);
        char flags[1024];
        tf_flags(line, (size_t)(c1 - line), 0, flags, sizeof flags);
        int run = !!memmem(c1, (size_t)(c2 - c1), " run ", 5) || !!memmem(c1, (size_t)(c2 - c1), " both ", 6);
        int serve = !!memmem(c1, (size_t)(c2 - c1), " serve ", 7) || !!memmem(c1, (size_t)(c2 - c1), " both ", 6);
        if (run) strncat(in_run, flags, sizeof in_run - strlen(in_run) - 1);
        if (serve) strncat(in_serve, flags, sizeof in_serve - strlen(in_serve) - 1);
        strncat(all, flags, sizeof all - strlen(all) - 1);
    }
    char *hr = tf_help(&t, 0), *hs = tf_help(&t, 1);
    tf_flags(hr, strlen(hr), 1, help_run, sizeof help_run);
    tf_flags(hs, strlen(hs), 1, help_serve, sizeof help_serve);
    cr_assert(strlen(help_run) > 100 && strlen(help_serve) > 50, "help without options? %s / %s", help_run, help_serve);
    const struct {
        const char *from, *to, *what;
    } checks[] = {{help_run, all, "djinn --help's option is not in the README's table"},
                  {help_serve, all, "djinn serve --help's option is not in the README's table"},
                  {in_run, hr, "the README's table gives djinn an option its --help lacks"},
                  {in_serve, hs, "the README's table gives djinn serve an option its --help lacks"}};
    for (size_t c = 0; c < 4; c++)
        for (const char *p = checks[c].from; *p;) {
            const char *sp = strchr(p, ' ');
            char f[64];
            snprintf(f, sizeof f, "%.*s", (int)(sp - p), p);
            // -h is --help's other name; the table's serve rows may name djinn's own flags in prose
            if (strcmp(f, "-h")) cr_expect(tf_has(checks[c].to, f, strlen(f)), "%s: %s", checks[c].what, f);
            p = sp + 1;
        }
    free(hr), free(hs), free(readme);
    tc_rm_rf(t.dir);
}
