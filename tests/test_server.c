// test_server.c: `djinn serve` ($DJINN_BIN/djinn) on the CPU engine with stories260K converted here, driven over
// real sockets: answers equal the command line's text for the same greedy or seeded run (both endpoints, streaming
// and not), through this file's own HTTP client, curl and OpenAI's npm client; many clients at once get what each
// gets alone; a client that leaves mid-stream, malformed or oversized requests, too many connections and slow
// clients get their status or a clean close while the server goes on serving; sessions parked and restored under a
// small --kv-gb continue exactly as if they had stayed. Every wait is bounded: a server is ready when /health
// answers, and a figure is awaited by polling /metrics.
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../buf.h"
#include "../gpu_host.h"
#include "../http.h"
#include "../json.h"
#include "../kvtype.h"
#include "../tokenizer.h"
#include "../util.h"
#include "common.h"

#define TS_WAIT_S 30.0  // the longest any wait here lasts

typedef struct {
    char dir[256];
    char model[512];  // stories260K, f32
    char chat[512];   // the same with a Llama 2 chat template
} ts_env;

typedef struct {
    pid_t pid;
    int port;
    char err[600];  // its stderr
} ts_srv;

static char ts_djinn[1100], ts_convert[1100];

// ---- processes
// Runs argv with stdin from `in` (NULL: /dev/null) and stdout into `out`, stderr into `err`; returns the exit code.
static int ts_run(char *const argv[], const char *in, const char *out, const char *err) {
    return tc_run(argv, in ? in : "/dev/null", out, 0, err, 120);
}

// stories260K converted into t->dir as `name` with tokenizer_config.json `cfg` (tc_convert_with_config; its folder
// in t->dir/<name>_tok); its path into `model`.
static void ts_convert_with_config(const ts_env *t, const char *name, const char *cfg, char *model, size_t cap) {
    char out[400], err[400];
    snprintf(out, sizeof out, "%s/convert.out", t->dir);
    snprintf(err, sizeof err, "%s/convert.err", t->dir);
    cr_assert_eq(tc_convert_with_config(ts_convert, t->dir, name, cfg, model, cap, out, err), 0, "convert (%s) failed",
                 name);
}

// stories260K converted twice into a fresh folder: as it is, and with a Llama 2 chat template (as test_cli's).
static void ts_setup(ts_env *t) {
    memset(t, 0, sizeof *t);
    const char *bin = tc_bin_dir();
    char src[1100];
    tc_data_path(src, sizeof src, "models/stories260K");
    snprintf(ts_djinn, sizeof ts_djinn, "%s/djinn", bin);
    snprintf(ts_convert, sizeof ts_convert, "%s/convert", bin);
    cr_assert(!access(ts_djinn, X_OK) && !access(ts_convert, X_OK), "%s or %s is not built", ts_djinn, ts_convert);
    char *d = tc_tmpdir("server");
    snprintf(t->dir, sizeof t->dir, "%s", d);
    free(d);
    char out[400], err[400];
    snprintf(out, sizeof out, "%s/convert.out", t->dir);
    snprintf(err, sizeof err, "%s/convert.err", t->dir);
    snprintf(t->model, sizeof t->model, "%s/stories.bin", t->dir);
    cr_assert_eq(ts_run((char *[]){ts_convert, src, t->model, "--dtype", "f32", "-q", NULL}, NULL, out, err), 0,
                 "convert failed");
    const char *cfg = "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\", \"eos_token\": "
                      "\"</s>\", \"chat_template\": \"{% for m in messages %}{{ bos_token + '[INST] ' + m['content'] + "
                      "' [/INST]' }}<<SYS>>{% endfor %}\"}";
    ts_convert_with_config(t, "chat", cfg, t->chat, sizeof t->chat);
}

static void ts_teardown(ts_env *t) {
    tc_rm_rf(t->dir);
}

// ---- an HTTP client
// Client threads call what has no assertion here (a failed assertion ends the test from its own thread only); a
// signal (SIGCHLD of a server stopped and continued) interrupts a socket call with a timeout even under SA_RESTART:
// it is retried.

// rcvbuf > 0: the socket's receive buffer, set before connecting (so the window the server sees is that small).
// src: the loopback address the client connects from (NULL: 127.0.0.1), another client to the server. -1 when it
// cannot connect.
static int ts_connect_src(int port, int rcvbuf, const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct timeval tv = {(time_t)TS_WAIT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)}, from = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (src && (inet_pton(AF_INET, src, &from.sin_addr) != 1 || bind(fd, (struct sockaddr *)&from, sizeof from))) {
        close(fd);
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int ts_connect_rcvbuf(int port, int rcvbuf) { return ts_connect_src(port, rcvbuf, NULL); }
static int ts_connect(int port) { return ts_connect_src(port, 0, NULL); }

// 0, or -1 with errno.
static int ts_send_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w, n -= (size_t)w;
    }
    return 0;
}

static void ts_send(int fd, const char *s, size_t n) {
    cr_assert(!ts_send_all(fd, s, n), "send failed: %s", strerror(errno));
}

// Everything the server sends until it closes or resets the connection; malloc'd, NUL-terminated. NULL with errno
// on an error (TS_WAIT_S without a byte is one).
static char *ts_recv_all(int fd, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    for (;;) {
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
        ssize_t got = recv(fd, b + n, cap - n, 0);
        if (got == 0 || (got < 0 && errno == ECONNRESET)) break;
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int err = errno;
            free(b);
            errno = err;
            return NULL;
        }
        n += (size_t)got;
    }
    b[n] = 0;
    if (len) *len = n;
    return b;
}

static char *ts_read_all(int fd, size_t *len) {
    char *b = ts_recv_all(fd, len);
    cr_assert(b, "reading the response: %s", strerror(errno));
    return b;
}

typedef struct {
    int status;
    char *raw;   // the whole response
    char *body;  // inside raw
} ts_resp;

static void ts_resp_parse(ts_resp *r) {
    r->status = 0, r->body = NULL;
    if (sscanf(r->raw, "HTTP/1.1 %d", &r->status) != 1) return;
    char *end = strstr(r->raw, "\r\n\r\n");
    r->body = end ? end + 4 : r->raw + strlen(r->raw);
}

// One request on a connection of its own (Connection: close) from loopback address src (NULL: 127.0.0.1);
// `headers` extra lines, each ending "\r\n".
static ts_resp ts_http_src(const char *src, int port, const char *method, const char *path, const char *headers,
                           const char *body) {
    int fd = ts_connect_src(port, 0, src);
    cr_assert(fd >= 0, "cannot connect to port %d from %s: %s", port, src ? src : "127.0.0.1", strerror(errno));
    char head[2048];
    int k = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n",
                     method, path, headers ? headers : "", body ? strlen(body) : 0);
    ts_send(fd, head, (size_t)k);
    if (body) ts_send(fd, body, strlen(body));
    ts_resp r = {0};
    r.raw = ts_read_all(fd, NULL);
    close(fd);
    ts_resp_parse(&r);
    return r;
}

static ts_resp ts_http(int port, const char *method, const char *path, const char *headers, const char *body) {
    return ts_http_src(NULL, port, method, path, headers, body);
}

static ts_resp ts_post(int port, const char *path, const char *body) { return ts_http(port, "POST", path, NULL, body); }

// The answer's text: a JSON response's choices[0].text or .message.content, or a stream's pieces joined (the
// stream must end with [DONE]). finish: its finish_reason (may be NULL).
static char *ts_text(const ts_resp *r, int chat, int stream, char *finish, size_t fcap) {
    cr_assert_eq(r->status, 200, "status %d: %s", r->status, r->raw);
    dj_err e;
    if (finish) finish[0] = 0;
    if (!stream) {
        json_doc *d = json_parse(r->body, strlen(r->body), &e);
        cr_assert(d, "%s: %s", e.msg, r->body);
        const json_value *ch = json_get(json_root(d), "choices");
        cr_assert(ch && ch->type == JSON_ARRAY && ch->u.arr.n == 1, "%s", r->body);
        const json_value *c0 = &ch->u.arr.items[0];
        const char *t = chat ? json_str(json_get(json_get(c0, "message"), "content")) : json_str(json_get(c0, "text"));
        cr_assert(t, "no text in %s", r->body);
        if (finish) snprintf(finish, fcap, "%s", json_str(json_get(c0, "finish_reason")));
        char *out = strdup(t);
        json_free(d);
        return out;
    }
    size_t cap = 4096, n = 0;
    char *out = calloc(cap, 1);
    int done = 0;
    for (char *line = r->body; line && *line;) {
        char *nl = strstr(line, "\n\n");
        cr_assert(nl, "an event without its blank line: %s", line);
        *nl = 0;
        cr_assert(!strncmp(line, "data: ", 6), "not an SSE data line: %s", line);
        const char *data = line + 6;
        if (!strcmp(data, "[DONE]")) {
            done = 1;
            cr_assert_eq(nl[2], 0, "events after [DONE]: %s", nl + 2);
            break;
        }
        json_doc *d = json_parse(data, strlen(data), &e);
        cr_assert(d, "%s: %s", e.msg, data);
        const json_value *ch = json_get(json_root(d), "choices");
        cr_assert(!json_get(json_root(d), "error"), "an error event: %s", data);
        if (ch && ch->u.arr.n) {
            const json_value *c0 = &ch->u.arr.items[0];
            const char *t = chat ? json_str(json_get(json_get(c0, "delta"), "content")) : json_str(json_get(c0, "text"));
            if (t) {
                size_t l = strlen(t);
                while (n + l + 1 > cap) out = realloc(out, cap *= 2);
                memcpy(out + n, t, l + 1), n += l;
            }
            const char *f = json_str(json_get(c0, "finish_reason"));
            if (f && finish) snprintf(finish, fcap, "%s", f);
        }
        json_free(d);
        line = nl + 2;
    }
    cr_assert(done, "the stream did not end with [DONE]: %s", r->body);
    return out;
}

// ---- the server
// The engine the servers and the command lines of a test run on: the CPU's (--cpu), or the GPU's (the gpu_ tests);
// on the GPU, servers keep no layer resident when ts_gpu_streamed (--stream-all).
static int ts_on_gpu, ts_gpu_streamed;
static int ts_nofile;  // > 0: the servers ts_start starts have this descriptor limit (soft and hard)
static int ts_gate = -1;  // >= 0: the servers ts_start starts load their model once a byte can be read from it

// Starts `djinn serve MODEL --port 0 --cpu` (ts_on_gpu: without --cpu) with `extra` arguments (NULL-terminated); ready when its port is on
// stderr and /health answers.
static void ts_start(ts_srv *s, const ts_env *t, const char *model, const char *const *extra) {
    static int count;
    memset(s, 0, sizeof *s);
    snprintf(s->err, sizeof s->err, "%s/serve%d.err", t->dir, count++);
    char *argv[48] = {ts_djinn, "serve", (char *)model, "--port", "0", "--threads", "2"};
    int a = 7;
    if (!ts_on_gpu) argv[a++] = "--cpu";
    if (ts_on_gpu && ts_gpu_streamed) argv[a++] = "--stream-all";
    for (int i = 0; extra && extra[i]; i++) argv[a++] = (char *)extra[i];
    argv[a] = NULL;
    pid_t test = getpid();
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that fails before ts_stop leaves no server, stopped or not
        if (getppid() != test) _exit(1);
        struct rlimit rl = {(rlim_t)ts_nofile, (rlim_t)ts_nofile};
        if (ts_nofile > 0 && setrlimit(RLIMIT_NOFILE, &rl)) _exit(126);
        if (ts_gate >= 0 && (dup2(ts_gate, 3) != 3 || setenv("DJINN_TEST_LOAD_GATE_FD", "3", 1))) _exit(126);
        int o = open("/dev/null", O_WRONLY), e = open(s->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 0), dup2(o, 1), dup2(e, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    for (double t0 = dj_now(); !s->port && dj_now() - t0 < TS_WAIT_S; usleep(10000)) {
        char *err = tc_read(s->err, NULL);
        const char *at = err ? strstr(err, "listening on http://127.0.0.1:") : NULL;
        if (at) s->port = atoi(at + strlen("listening on http://127.0.0.1:"));
        int st;
        if (!s->port && waitpid(s->pid, &st, WNOHANG) == s->pid)
            cr_assert_fail("djinn serve exited before listening: %s", err ? err : "");
        free(err);
    }
    cr_assert(s->port > 0, "djinn serve did not listen within %g s", TS_WAIT_S);
    if (ts_gate >= 0) return;  // its load waits for the test
    ts_resp r = {0};
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(10000)) {  // 503 "loading" until the model is in
        r = ts_http(s->port, "GET", "/health", NULL, NULL);
        if (r.status != 503) break;
        free(r.raw), r.raw = NULL;
    }
    cr_assert(r.raw, "/health said 'loading' for %g s", TS_WAIT_S);
    cr_assert_eq(r.status, 200, "/health: %s", r.raw);
    free(r.raw);
}

// ts_start on the plain model, each turn with work taking at least 2 ms (DJINN_TEST_STEP_US): a client can act in
// the middle of another's answer.
static void ts_start_slow_us(ts_srv *s, const ts_env *t, const char *const *extra, const char *step_us) {
    setenv("DJINN_TEST_STEP_US", step_us, 1);
    ts_start(s, t, t->model, extra);
    unsetenv("DJINN_TEST_STEP_US");
}

static void ts_start_slow(ts_srv *s, const ts_env *t, const char *const *extra) { ts_start_slow_us(s, t, extra, "2000"); }

// stories260K's bytes a position in KV type `type`: K and V over 5 layers of 4 KV heads of head_dim 8.
static uint64_t ts_pos_bytes(int type) { return 2 * 5 * 4 * dj_kv_row_bytes(type, 8); }

// --kv-gb for n KV slots of stories260K's 512 positions in the server's default KV type (half a slot to spare).
static const char *ts_kv_gb(int n, char buf[32]) {
    snprintf(buf, 32, "%.9g", (n + 0.5) * 512 * (double)ts_pos_bytes(DJ_KV_DEFAULT) / 1e9);
    return buf;
}

// SIGTERM: the server stops cleanly (exit 0; under ASan, with no leak).
static void ts_stop(ts_srv *s) {
    kill(s->pid, SIGTERM);
    int st = 0;
    pid_t got = 0;
    for (double t0 = dj_now(); !got && dj_now() - t0 < TS_WAIT_S; usleep(10000)) got = waitpid(s->pid, &st, WNOHANG);
    if (!got) kill(s->pid, SIGKILL), waitpid(s->pid, &st, 0);
    char *err = tc_read(s->err, NULL);
    cr_assert(got, "djinn serve did not stop on SIGTERM: %s", err);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "djinn serve exited %d (signal %d): %s",
              WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0, err);
    free(err);
}

// A figure from /metrics.
static double ts_metric(const ts_srv *s, const char *name) {
    ts_resp r = ts_http(s->port, "GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    char key[200];
    snprintf(key, sizeof key, "\ndjinn_%s ", name);
    const char *at = strstr(r.body - 1, key);
    cr_assert(at, "no %s in %s", name, r.body);
    double v = atof(at + strlen(key));
    free(r.raw);
    return v;
}

// Polls /metrics until `name` reaches `want` (or TS_WAIT_S pass: a failure).
static void ts_await_metric(const ts_srv *s, const char *name, double want) {
    double v = -1;
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(5000))
        if ((v = ts_metric(s, name)) == want) return;
    cr_assert_fail("%s stayed %g, not %g", name, v, want);
}

// Polls the server's stderr until it holds `text` (or TS_WAIT_S pass: a failure).
static void ts_await_log(const ts_srv *s, const char *text) {
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(10000)) {
        char *err = tc_read(s->err, NULL);
        int found = err && strstr(err, text);
        free(err);
        if (found) return;
    }
    char *err = tc_read(s->err, NULL);
    cr_assert_fail("no '%s' on the server's stderr: %s", text, err ? err : "");
}

// ---- what the command line says
// djinn's greedy (temp 0) or seeded text for a prompt, without the prompt it prints first.
static char *ts_cli(const ts_env *t, const char *prompt, int n, const char *temp, const char *seed) {
    char out[400], err[400], ns[16];
    snprintf(out, sizeof out, "%s/cli.out", t->dir);
    snprintf(err, sizeof err, "%s/cli.err", t->dir);
    snprintf(ns, sizeof ns, "%d", n);
    char *argv[16] = {ts_djinn, (char *)t->model, "-p", (char *)prompt, "-n", ns, "-t", (char *)temp};
    int a = 8;
    if (!ts_on_gpu) argv[a++] = "--cpu";
    if (seed) argv[a++] = "-s", argv[a++] = (char *)seed, argv[a++] = "--top-p", argv[a++] = "0.9";
    argv[a] = NULL;
    cr_assert_eq(ts_run(argv, NULL, out, err), 0, "djinn -p failed");
    char *text = tc_must_read(out, NULL);
    size_t pl = strlen(prompt), tl = strlen(text);
    cr_assert(tl > pl && !strncmp(text, prompt, pl) && text[tl - 1] == '\n', "unexpected CLI output: %s", text);
    text[tl - 1] = 0;
    memmove(text, text + pl, tl - pl);
    return text;
}

// djinn --chat's answer to one user line (with a system text): greedy (seed NULL) or seeded with top-p 0.9.
static char *ts_cli_chat(const ts_env *t, const char *system, const char *user, int n, const char *temp,
                         const char *seed) {
    char in[400], out[400], err[400], ns[16];
    snprintf(in, sizeof in, "%s/chat.in", t->dir);
    snprintf(out, sizeof out, "%s/chat.out", t->dir);
    snprintf(err, sizeof err, "%s/chat.err", t->dir);
    snprintf(ns, sizeof ns, "%d", n);
    char line[512];
    int k = snprintf(line, sizeof line, "%s\n", user);
    tc_write(in, line, (size_t)k);
    char *argv[16] = {ts_djinn, (char *)t->chat, "--chat", "--system", (char *)system, "-n", ns, "-t", (char *)temp,
                      "--cpu"};
    int a = 10;
    if (seed) argv[a++] = "-s", argv[a++] = (char *)seed, argv[a++] = "--top-p", argv[a++] = "0.9";
    argv[a] = NULL;
    cr_assert_eq(ts_run(argv, in, out, err), 0, "djinn --chat failed");
    char *text = tc_must_read(out, NULL);
    size_t tl = strlen(text);
    cr_assert(tl && text[tl - 1] == '\n', "%s", text);
    text[tl - 1] = 0;
    return text;
}

// The prompt as a JSON string (a turn's prompt holds the model's text: newlines, quotes).
static char *ts_completion_body(const char *prompt, int n, const char *more) {
    dj_buf b = {0};
    buf_str(&b, "{\"model\":\"m\",\"prompt\":");
    buf_json_str(&b, prompt, strlen(prompt));
    buf_fmt(&b, ",\"max_tokens\":%d%s%s}", n, more ? "," : "", more ? more : "");
    cr_assert(!b.oom);
    return b.p;
}

// POST /v1/completions; the text.
static char *ts_complete(const ts_srv *s, const char *prompt, int n, const char *more, int stream, char *finish) {
    char extra[400];
    snprintf(extra, sizeof extra, "%s%s\"stream\":%s", more ? more : "", more ? "," : "", stream ? "true" : "false");
    char *body = ts_completion_body(prompt, n, extra);
    ts_resp r = ts_post(s->port, "/v1/completions", body);
    char *text = ts_text(&r, 0, stream, finish, 16);
    free(body), free(r.raw);
    return text;
}

// A completion request with the JSON fields `more` sent on a connection of its own, which closes after the answer;
// the socket, or -1 (no assertion: client threads call it).
static int ts_send_completion(int port, const char *prompt, int n, const char *more) {
    int fd = ts_connect(port);
    char *body = ts_completion_body(prompt, n, more);
    char head[256];
    int k = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n", strlen(body));
    if (fd >= 0 && (ts_send_all(fd, head, (size_t)k) || ts_send_all(fd, body, strlen(body)))) close(fd), fd = -1;
    free(body);
    return fd;
}

// A greedy one.
static int ts_open_completion(int port, const char *prompt, int n, int stream) {
    return ts_send_completion(port, prompt, n, stream ? "\"temperature\":0,\"stream\":true" : "\"temperature\":0");
}

// ---- answers equal the command line's
static const char *const ts_prompts[] = {"Once upon a time", "The little dog", "Tom and Lily went to", "One day, a cat",
                                         "She was very happy because", "The sun was", "Ben had a big red ball",
                                         "In the park", "Mom said", "The bird flew"};

// A prompt of token ids (as evaluation harnesses send it) answers as its text does: the ids of the text, BOS first.
Test(server, token_id_prompt_answers_as_its_text) {
    ts_env t;
    ts_setup(&t);
    dj_tokenizer *tok = tc_load_tokenizer("models/stories260K");
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    int32_t *ids;
    size_t n;
    dj_err e;
    cr_assert_eq(tok_encode(tok, ts_prompts[2], strlen(ts_prompts[2]), 1, &ids, &n, &e), 0, "%s", e.msg);
    char body[2048];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"prompt\": [");
    for (size_t i = 0; i < n; i++) at += (size_t)snprintf(body + at, sizeof body - at, "%s%d", i ? "," : "", ids[i]);
    snprintf(body + at, sizeof body - at, "], \"max_tokens\": 20, \"temperature\": 0}");
    ts_resp r = ts_post(s.port, "/v1/completions", body);
    char *got = ts_text(&r, 0, 0, NULL, 0);
    char *want = ts_complete(&s, ts_prompts[2], 20, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want, "token ids against their text");
    char usage[64];
    snprintf(usage, sizeof usage, "\"prompt_tokens\":%zu", n);
    cr_assert(strstr(r.body, usage), "%s", r.body);
    free(got), free(want), free(r.raw), free(ids);
    tok_free(tok);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, completions_equal_the_command_line) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    char finish[16];
    for (int i = 0; i < 3; i++) {
        char *want = ts_cli(&t, ts_prompts[i], 40, "0", NULL);
        for (int stream = 0; stream < 2; stream++) {
            char *got = ts_complete(&s, ts_prompts[i], 40, "\"temperature\":0", stream, finish);
            cr_assert_str_eq(got, want, "greedy '%s' (stream %d): the server's text differs from djinn -p's",
                             ts_prompts[i], stream);
            cr_assert_str_eq(finish, "length");
            free(got);
        }
        free(want);
        want = ts_cli(&t, ts_prompts[i], 30, "0.8", "1234");
        for (int stream = 0; stream < 2; stream++) {
            char *got = ts_complete(&s, ts_prompts[i], 30, "\"temperature\":0.8,\"top_p\":0.9,\"seed\":1234", stream,
                                    finish);
            cr_assert_str_eq(got, want, "seeded '%s' (stream %d): the server's text differs from djinn -s's",
                             ts_prompts[i], stream);
            free(got);
        }
        free(want);
    }
    // usage: the prompt's tokens, the generated ones, and the cached prefix of the same prompt asked again: all of
    // it but its last token, whose pass runs again to give the first pick. The prompts asked in between share only
    // BOS with it: they took other slots and left its cache alone.
    char *body = ts_completion_body(ts_prompts[0], 7, "\"temperature\":0");
    ts_resp r = ts_post(s.port, "/v1/completions", body);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    cr_assert(strstr(r.body, "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12,"
                             "\"prompt_tokens_details\":{\"cached_tokens\":4}}"),
              "usage: %s", r.body);
    free(body), free(r.raw);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, chat_equals_the_command_line_chat) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.chat, NULL);
    const char *users[] = {"Tell me a story", "Hello there"};
    struct {
        const char *temp, *seed, *fields;
    } runs[] = {{"0", NULL, "\"temperature\":0"}, {"0.8", "1234", "\"temperature\":0.8,\"top_p\":0.9,\"seed\":1234"}};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) {
            char *want = ts_cli_chat(&t, "Be brief.", users[i], 30, runs[k].temp, runs[k].seed);
            for (int stream = 0; stream < 2; stream++) {
                char body[512], finish[16];
                snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":"
                         "\"Be brief.\"},{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":30,%s,\"stream\":%s}",
                         users[i], runs[k].fields, stream ? "true" : "false");
                ts_resp r = ts_post(s.port, "/v1/chat/completions", body);
                if (!stream) cr_assert(strstr(r.body, "\"role\":\"assistant\""), "%s", r.body);
                else cr_assert(strstr(r.body, "\"delta\":{\"role\":\"assistant\"}"), "the role first: %s", r.body);
                char *got = ts_text(&r, 1, stream, finish, sizeof finish);
                cr_assert_str_eq(got, want, "'%s' (%s, stream %d): the server's answer differs from djinn --chat's",
                                 users[i], runs[k].seed ? "seeded" : "greedy", stream);
                cr_assert(!strcmp(finish, "stop") || !strcmp(finish, "length"), "finish_reason '%s'", finish);
                free(got), free(r.raw);
            }
            free(want);
        }
    ts_stop(&s);
    ts_teardown(&t);
}

// ---- real clients that no one here wrote
Test(server, curl_client) {
    if (system("command -v curl >/dev/null 2>&1"))
        cr_skip_test("curl is not installed (make test installs it when run as root)");
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--api-key", "sekrit", NULL});
    char *want = ts_cli(&t, ts_prompts[1], 25, "0", NULL);
    char url[100], out[400], err[400];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", s.port);
    snprintf(out, sizeof out, "%s/curl.out", t.dir);
    snprintf(err, sizeof err, "%s/curl.err", t.dir);
    for (int stream = 0; stream < 2; stream++) {
        char *body = ts_completion_body(ts_prompts[1], 25, stream ? "\"temperature\":0,\"stream\":true"
                                                                  : "\"temperature\":0");
        char *argv[] = {"curl", "-sS", "-N", "-i", "--max-time", "30", "-H", "Authorization: Bearer sekrit", "-H",
                        "Content-Type: application/json", "-d", body, url, NULL};
        cr_assert_eq(ts_run(argv, NULL, out, err), 0, "curl failed: %s", tc_read(err, NULL));
        ts_resp r = {0};
        r.raw = tc_must_read(out, NULL);
        ts_resp_parse(&r);
        char *got = ts_text(&r, 0, stream, NULL, 0);
        cr_assert_str_eq(got, want, "curl (stream %d): %s", stream, r.raw);
        free(got), free(r.raw), free(body);
    }
    char *argv[] = {"curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30", url, "-d", "{}", NULL};
    cr_assert_eq(ts_run(argv, NULL, out, err), 0);
    char *code = tc_must_read(out, NULL);
    cr_assert_str_eq(code, "401", "no key: %s", code);
    free(code), free(want);
    ts_stop(&s);
    ts_teardown(&t);
}

// OpenAI's npm client: `node tests/npm/SCRIPT BASE_URL sekrit "Once upon a time" "Tell me a story" 30 [EXTRA]`
// against a server on the chat model with --api-key sekrit (the test skips without node or the package). Its
// output (one JSON object) parsed, and the command line's greedy texts for both: the chat model's completions are
// stories260K's, so its prompt text is the command line's too.
typedef struct {
    ts_env t;
    ts_srv s;
    char *out, *cli_t, *cli_c;
    json_doc *d;
} ts_node;

static void ts_node_run(ts_node *n, const char *name, const char *extra) {
    if (system("command -v node >/dev/null 2>&1")) cr_skip_test("node is not installed: no OpenAI npm client to run");
    char script[1200], pkg[1200];
    snprintf(script, sizeof script, "%s/npm/%s", tc_tests_dir(), name);
    snprintf(pkg, sizeof pkg, "%s/npm/node_modules/openai/package.json", tc_tests_dir());
    if (access(pkg, R_OK))
        cr_skip_test("the openai npm package is not in %s/npm/node_modules: 'make test' installs it with npm when "
                     "npm can reach its registry", tc_tests_dir());
    ts_setup(&n->t);
    ts_start(&n->s, &n->t, n->t.chat, (const char *[]){"--api-key", "sekrit", NULL});
    char base[100], out[400], err[400];
    snprintf(base, sizeof base, "http://127.0.0.1:%d/v1", n->s.port);
    snprintf(out, sizeof out, "%s/node.out", n->t.dir);
    snprintf(err, sizeof err, "%s/node.err", n->t.dir);
    char *argv[] = {"node", script, base, "sekrit", "Once upon a time", "Tell me a story", "30", (char *)extra, NULL};
    int rc = ts_run(argv, NULL, out, err);
    n->out = tc_must_read(out, NULL);
    cr_assert_eq(rc, 0, "node failed: %s %s", n->out, tc_read(err, NULL));
    n->cli_t = ts_cli(&n->t, "Once upon a time", 30, "0", NULL);
    n->cli_c = ts_cli_chat(&n->t, "Be brief.", "Tell me a story", 30, "0", NULL);
    dj_err e;
    n->d = json_parse(n->out, strlen(n->out), &e);
    cr_assert(n->d, "%s: %s", e.msg, n->out);
}

static void ts_node_end(ts_node *n) {
    json_free(n->d);
    free(n->out), free(n->cli_t), free(n->cli_c);
    ts_stop(&n->s);
    ts_teardown(&n->t);
}

Test(server, openai_node_client) {
    ts_node n;
    ts_node_run(&n, "openai_client.mjs", NULL);
    const json_value *o = json_root(n.d);
    const char *got = n.out;
    cr_assert_str_eq(json_str(json_get(o, "completion")), n.cli_t, "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "completion_stream")), n.cli_t, "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "chat")), n.cli_c, "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "chat_stream")), n.cli_c, "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "chat_role")), "assistant", "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "completion_finish")), "length", "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "wrong_key")), "AuthenticationError 401", "%s", got);
    int64_t total;
    cr_assert(!json_int(json_get(json_get(o, "chat_stream_usage"), "completion_tokens"), &total) && total > 0, "%s", got);
    ts_node_end(&n);
}

// ---- many clients at once
typedef struct {
    int port, i, stream;
    char *text;
    _Atomic int *sent;  // counts the clients whose request is out (in the kernel's buffers), or failed
} ts_client;

static void *ts_client_run(void *arg) {
    ts_client *c = arg;
    int fd = ts_open_completion(c->port, ts_prompts[c->i], 60, c->stream);
    atomic_fetch_add(c->sent, 1);
    if (fd >= 0) c->text = ts_recv_all(fd, NULL), close(fd);  // the raw response: the main thread parses it
    return NULL;
}

// Ten clients at once, every other one streaming, --parallel 4: each text is the command line's for its prompt.
// The server is stopped (SIGSTOP) while they connect and send, so all ten requests are there at its next turn:
// four join at once and the step runs them together (decode_rows_max is 4), the others join as those end.
static void ts_concurrent_clients(void) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--parallel", "4", NULL});
    enum { N = 10 };
    ts_client c[N];
    pthread_t th[N];
    kill(s.pid, SIGSTOP);
    _Atomic int sent = 0;
    for (int i = 0; i < N; i++) {
        c[i] = (ts_client){s.port, i, i % 2, NULL, &sent};
        cr_assert_eq(pthread_create(&th[i], NULL, ts_client_run, &c[i]), 0);
    }
    // the clients' connects and sends complete into the kernel's buffers while the server is stopped
    for (double t0 = dj_now(); atomic_load(&sent) < N && dj_now() - t0 < TS_WAIT_S; usleep(1000)) {}
    kill(s.pid, SIGCONT);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        cr_assert(c[i].text, "client %d could not connect, send or read", i);
        ts_resp r = {0};
        r.raw = c[i].text;
        ts_resp_parse(&r);
        char *got = ts_text(&r, 0, c[i].stream, NULL, 0), *want = ts_cli(&t, ts_prompts[i], 60, "0", NULL);
        cr_assert_str_eq(got, want, "client %d ('%s'): batching changed its greedy text", i, ts_prompts[i]);
        free(got), free(want), free(r.raw);
    }
    cr_assert_eq(ts_metric(&s, "decode_rows_max"), 4, "the step never ran four sequences together");
    cr_assert_eq(ts_metric(&s, "requests_total"), N);
    // every turn that ran a pass is counted (at least the decode steps), its time holds the passes' and the host's
    const double turns = ts_metric(&s, "turns_total"), turn_s = ts_metric(&s, "turn_seconds_total");
    const double host_s = ts_metric(&s, "turn_host_seconds_total");
    const double pass_s = ts_metric(&s, "decode_seconds_total") + ts_metric(&s, "prefill_seconds_total");
    cr_assert_geq(turns, ts_metric(&s, "decode_steps_total"), "turns_total %g", turns);
    cr_assert(host_s > 0 && turn_s >= pass_s + host_s - 1e-4 && turn_s <= pass_s + host_s + 1e-4,
              "a turn's %g s are not its passes' %g s and the host's %g s", turn_s, pass_s, host_s);
    const double frac = ts_metric(&s, "turn_host_fraction");
    cr_assert(fabs(frac - host_s / turn_s) < 1e-3, "turn_host_fraction %g, not %g", frac, host_s / turn_s);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, concurrent_clients_each_get_their_own_text) { ts_concurrent_clients(); }

// The GPU engine behind the server (the GPU machine): batched passes on the device give each client the text the
// GPU's command line gives (greedy; stories260K in f32, where a batch's tensor-core-free matmuls and the lone
// step's GEMV agree to ~1e-6).
Test(server, gpu_concurrent_clients_each_get_their_own_text) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (GPU tests run on the GPU machine)");
    ts_on_gpu = 1;
    ts_concurrent_clients();
}

// ---- clients that leave, and bad clients
// A connection closed with a reset (SO_LINGER of 0), as a client that is killed or gives up leaves: the server
// cannot take that for a half-close.
static void ts_abort(int fd) {
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

// Clients that leave before their answer is whole: one closes in the middle of a stream (its next token meets a
// reset), one whose request waits in the queue (--parallel 1) and one whose answer (not streamed) is being
// generated reset their connections (a plain close of those two is a half-close to the server, whose answer is
// still owed: half_closed_clients_get_their_answers). Their sequences end (no more tokens are spent on them: a
// queued one never runs) and the server goes on serving. Each turn takes 2 ms here (DJINN_TEST_STEP_US), so an
// answer of 400 tokens is certainly under way when its client leaves.
Test(server, clients_that_leave_end_their_sequences) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start_slow(&s, &t, (const char *[]){"--parallel", "1", NULL});
    int streamed = ts_open_completion(s.port, "Once upon a time", 400, 1);
    cr_assert(streamed >= 0, "cannot send a request");
    char buf[4096] = {0};
    size_t n = 0;
    while (n < sizeof buf - 1 && !strstr(buf, "\"text\":")) {
        ssize_t got = recv(streamed, buf + n, sizeof buf - 1 - n, 0);
        cr_assert(got > 0, "the stream did not begin");
        n += (size_t)got, buf[n] = 0;
    }
    int queued = ts_open_completion(s.port, "The little dog", 400, 0);
    cr_assert(queued >= 0, "cannot send a request");
    ts_await_metric(&s, "requests_queued", 1);
    ts_abort(queued);  // before it ran
    ts_await_metric(&s, "requests_queued", 0);
    close(streamed);  // mid-stream
    ts_await_metric(&s, "requests_active", 0);
    double gen = ts_metric(&s, "generated_tokens_total");
    cr_assert_lt(gen, 400, "%g tokens: the stream ran to its end after its client left, or the queued one ran", gen);
    int waiting = ts_open_completion(s.port, "The little dog", 400, 0);
    cr_assert(waiting >= 0, "cannot send a request");
    ts_await_metric(&s, "requests_active", 1);
    ts_abort(waiting);  // while its answer is generated
    ts_await_metric(&s, "requests_active", 0);
    double gen2 = ts_metric(&s, "generated_tokens_total");
    cr_assert_lt(gen2 - gen, 400, "the answer ran to its end (%g tokens) after its client left", gen2 - gen);
    char *want = ts_cli(&t, "Once upon a time", 20, "0", NULL), *got = ts_complete(&s, "Once upon a time", 20,
                                                                                  "\"temperature\":0", 1, NULL);
    cr_assert_str_eq(got, want, "after the disconnects");
    cr_assert_eq(ts_metric(&s, "requests_total"), 4);
    free(want), free(got);
    ts_stop(&s);
    ts_teardown(&t);
}

// A request answered with `status` and an OpenAI error whose message holds `msg` (and whose param is `param`).
static void ts_expect_error(const ts_resp *r, int status, const char *msg, const char *param) {
    cr_assert_eq(r->status, status, "expected %d: %s", status, r->raw);
    cr_assert(strstr(r->body, "{\"error\":{\"message\":") && strstr(r->body, msg), "expected '%s' in %s", msg, r->body);
    if (param) {
        char p[100];
        snprintf(p, sizeof p, "\"param\":\"%s\"", param);
        cr_assert(strstr(r->body, p), "expected param %s: %s", param, r->body);
    }
}

// Requests each answered with their error.
typedef struct {
    const char *path, *body;
    int status;
    const char *msg, *param;
} ts_case;

static void ts_expect_cases(const ts_srv *s, const ts_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        ts_resp r = ts_post(s->port, cases[i].path, cases[i].body);
        ts_expect_error(&r, cases[i].status, cases[i].msg, cases[i].param);
        free(r.raw);
    }
}

// A raw request on a connection of its own; the response (the server closes after a refused request).
static ts_resp ts_raw(int port, const char *req, size_t n) {
    int fd = ts_connect(port);
    cr_assert(fd >= 0);
    ts_send(fd, req, n);
    ts_resp r = {0};
    r.raw = ts_read_all(fd, NULL);
    close(fd);
    ts_resp_parse(&r);
    return r;
}

Test(server, bad_requests_get_their_status) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"-c", "64", NULL});
    const char *C = "/v1/completions";
    const ts_case cases[] = {
        {C, "{\"prompt\": \"x\",", 400, "not valid JSON", NULL},
        {C, "", 400, "not valid JSON", NULL},
        {C, "[1, 2]", 400, "must be a JSON object", NULL},
        {C, "{\"prompt\": 5}", 400, "'prompt' must be a string", "prompt"},
        {C, "{\"prompt\": \"x\", \"max_tokens\": \"5\"}", 400, "'max_tokens' must be a number, not a string", "max_tokens"},
        {C, "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "'max_tokens' must be an integer", "max_tokens"},
        {C, "{\"prompt\": \"x\", \"temperature\": -1}", 400, "'temperature' must be within", "temperature"},
        {C, "{\"prompt\": \"x\", \"stream\": 1}", 400, "'stream' must be a bool", "stream"},
        {C, "{\"prompt\": \"x\", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", 400, "up to 4", "stop"},
        {C, "{\"prompt\": \"x\", \"n\": 2}", 400, "'n' must be 1: a request answers with one choice", "n"},
        {C, "{\"prompt\": \"x\", \"echo\": true}", 400, "'echo' is not supported", "echo"},
        {C, "{\"prompt\": \"x\", \"park\": true}", 400, "'park' needs a session", "park"},
        {C, "{\"prompt\": \"x\\u0000y\"}", 400, "NUL", "prompt"},
        {C, "{\"prompt\": \"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
            "sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four\"}",
         400, "the context holds 64", "prompt"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 400,
         "no chat template", "messages"},
        {"/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "'messages' must be an array", "messages"},
        {"/v1/nothing", "{}", 404, "no such endpoint", NULL},
    };
    ts_expect_cases(&s, cases, sizeof cases / sizeof *cases);
    ts_resp r = ts_post(s.port, C, cases[0].body);  // OpenAI's code where it has one (clients act on it)
    cr_assert(strstr(r.body, "\"code\":null"), "%s", r.body);
    free(r.raw);
    int again = 1;  // requests refused twice
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (strstr(cases[i].msg, "the context holds")) {
            r = ts_post(s.port, C, cases[i].body);
            cr_assert(strstr(r.body, "\"code\":\"context_length_exceeded\""), "%s", r.body);
            free(r.raw), again++;
        }
    r = ts_http(s.port, "GET", C, NULL, NULL);
    ts_expect_error(&r, 405, "use POST", NULL);
    free(r.raw);
    // the head: a body over 8 MB (refused from its Content-Length, before it is sent), a head over 16 KB, chunked
    // bodies, garbage
    const char big[] = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 9000000\r\n\r\n";
    r = ts_raw(s.port, big, sizeof big - 1);
    ts_expect_error(&r, 413, "over the size limit", NULL);
    free(r.raw);
    // the same with the body sent all the same (no waiting for 100 Continue): what arrives after the refusal is
    // read and dropped, so the client gets its 413 rather than a reset
    char *whole = malloc(sizeof big - 1 + 9000000);
    memcpy(whole, big, sizeof big - 1);
    memset(whole + sizeof big - 1, 'a', 9000000);
    r = ts_raw(s.port, whole, sizeof big - 1 + 9000000);
    ts_expect_error(&r, 413, "over the size limit", NULL);
    free(r.raw), free(whole);
    char *huge = malloc(20000);
    int k = sprintf(huge, "GET /health HTTP/1.1\r\nX-Pad: ");
    memset(huge + k, 'a', 18000);
    memcpy(huge + k + 18000, "\r\n\r\n", 4);
    r = ts_raw(s.port, huge, (size_t)k + 18004);
    ts_expect_error(&r, 431, "exceeds 16 KB", NULL);
    free(r.raw), free(huge);
    const char chunked[] = "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    r = ts_raw(s.port, chunked, sizeof chunked - 1);
    ts_expect_error(&r, 501, "chunked", NULL);
    free(r.raw);
    const char junk[] = "HELLO\r\n\r\n";
    r = ts_raw(s.port, junk, sizeof junk - 1);
    ts_expect_error(&r, 400, "malformed", NULL);
    free(r.raw);
    // and it still answers as the command line does
    char *want = ts_cli(&t, "Once upon a time", 20, "0", NULL);
    char *got = ts_complete(&s, "Once upon a time", 20, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want);
    free(want), free(got);
    cr_assert_eq(ts_metric(&s, "errors_total"), sizeof cases / sizeof *cases + again + 6);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, api_key) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--api-key", "sekrit", NULL});
    ts_resp r = ts_http(s.port, "GET", "/v1/models", NULL, NULL);
    ts_expect_error(&r, 401, "API key", NULL);
    cr_assert(strstr(r.body, "authentication_error") && strstr(r.body, "\"code\":\"invalid_api_key\""), "%s", r.body);
    free(r.raw);
    r = ts_http(s.port, "GET", "/v1/models", "Authorization: Bearer wrong\r\n", NULL);
    ts_expect_error(&r, 401, "API key", NULL);
    free(r.raw);
    r = ts_http(s.port, "GET", "/metrics", NULL, NULL);
    ts_expect_error(&r, 401, "API key", NULL);
    free(r.raw);
    r = ts_http(s.port, "POST", "/v1/completions", NULL, "{\"prompt\": \"x\"}");
    ts_expect_error(&r, 401, "API key", NULL);
    free(r.raw);
    r = ts_http(s.port, "GET", "/v1/models", "Authorization: Bearer sekrit\r\n", NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    cr_assert(strstr(r.body, "\"id\":\"stories.bin\"") && strstr(r.body, "\"context_length\":512"), "%s", r.body);
    free(r.raw);
    r = ts_http(s.port, "GET", "/health", NULL, NULL);  // no key needed
    cr_assert_eq(r.status, 200, "%s", r.raw);
    free(r.raw);
    ts_stop(&s);
    ts_teardown(&t);
}

// A connection closed gives its place back: the server notices at its next turn, and /health is then answered 200.
static void ts_served_again(int port) {
    ts_resp r = {0};
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(5000)) {
        r = ts_http(port, "GET", "/health", NULL, NULL);
        if (r.status == 200) break;
        free(r.raw), r.raw = NULL;
    }
    cr_assert(r.raw, "a freed place was not available again");
    free(r.raw);
}

// --max-conns 3: a fourth connection gets 503 and is closed; when one of the three leaves, a new one is served.
// Requests pipelined on a kept-alive connection are answered in order.
Test(server, connections_limit_and_keep_alive) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--max-conns", "3", "--client-share", "1", NULL});
    int fd[3];
    const char health2[] = "GET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n";
    for (int i = 0; i < 3; i++) {  // three kept-alive connections, each answered twice (so accepted and counted)
        fd[i] = ts_connect(s.port);
        ts_send(fd[i], health2, sizeof health2 - 1);
        char buf[4096] = {0};
        size_t n = 0;
        while (!strstr(buf, "\"object\":\"list\"") && n < sizeof buf - 1) {
            ssize_t got = recv(fd[i], buf + n, sizeof buf - 1 - n, 0);
            cr_assert(got > 0, "connection %d: no second answer: %s", i, buf);
            n += (size_t)got;
        }
        char *second = strstr(buf + 1, "HTTP/1.1 200");
        cr_assert(!strncmp(buf, "HTTP/1.1 200", 12) && strstr(buf, "{\"status\":\"ok\"}") && second &&
                  strstr(second, "\"object\":\"list\"") && strstr(buf, "Connection: keep-alive"),
                  "pipelined answers, in order: %s", buf);
    }
    ts_resp r = ts_http(s.port, "GET", "/health", NULL, NULL);
    ts_expect_error(&r, 503, "too many connections", NULL);
    free(r.raw);
    close(fd[0]);
    ts_served_again(s.port);
    close(fd[1]), close(fd[2]);
    ts_stop(&s);
    ts_teardown(&t);
}

// How answers end. A refusal (404, 405) closes its connection, its body unread, so it says "Connection: close"
// rather than promising keep-alive. A streamed answer's tail survives a client that sends more while it streams
// (bytes the server never reads, which a bare close() would answer with a reset that destroys the tail in flight).
// An HTTP/1.0 client's "Expect: 100-continue" is ignored: 1.0 has no 1xx answers.
Test(server, answers_end_as_they_say) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start_slow(&s, &t, NULL);
    const char *refused[] = {"GET /no/such/path HTTP/1.1\r\nHost: t\r\n\r\n",
                             "GET /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n"};
    const int status[] = {404, 405};
    for (int i = 0; i < 2; i++) {
        ts_resp r = ts_raw(s.port, refused[i], strlen(refused[i]));
        cr_expect_eq(r.status, status[i], "%s", r.raw);
        cr_expect(strstr(r.raw, "Connection: close") && !strstr(r.raw, "keep-alive"), "a refusal that closes: %s", r.raw);
        free(r.raw);
    }
    for (int k = 0; k < 5; k++) {
        int fd = ts_open_completion(s.port, ts_prompts[k % 4], 48, 1);
        cr_assert(fd >= 0);
        char first[4096];
        ssize_t got = recv(fd, first, sizeof first - 1, 0);  // the stream is under way (2 ms a token)
        cr_assert(got > 0, "no first chunk");
        first[got] = 0;
        const char more[] = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
        ts_send(fd, more, sizeof more - 1);
        usleep(500000);  // the stream ends (48 tokens, 2 ms each) with its tail still unread here
        char *rest = ts_read_all(fd, NULL);
        cr_expect(strstr(rest, "data: [DONE]") || strstr(first, "data: [DONE]"), "stream %d lost its end: %s%s", k,
                  first, rest);
        free(rest);
        close(fd);
    }
    char *body = ts_completion_body("Once upon a time", 4, "\"temperature\":0");
    char head[256];
    int n = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: %zu\r\n\r\n",
                     strlen(body));
    int fd = ts_connect(s.port);
    cr_assert(fd >= 0);
    ts_send(fd, head, (size_t)n);
    struct pollfd pf = {fd, POLLIN, 0};
    cr_expect_eq(poll(&pf, 1, 300), 0, "an HTTP/1.0 client's head was answered before its body");  // no 100 Continue
    ts_send(fd, body, strlen(body));
    ts_resp r = {0};
    r.raw = ts_read_all(fd, NULL);
    close(fd);
    ts_resp_parse(&r);
    cr_expect(!strstr(r.raw, " 100 Continue") && r.status == 200, "HTTP/1.0 with Expect: %s", r.raw);
    free(r.raw), free(body);
    ts_stop(&s);
    ts_teardown(&t);
}

// "ignore_eos": true (llama.cpp's, vLLM's): an end token neither ends the answer nor adds text. stories260K converted
// with "." as its end token ends a greedy story at its first sentence; with ignore_eos the same request runs to its
// max_tokens, its text the first answer's and more, no "." in it, streamed or not. Any other value than a boolean is
// refused by name.
Test(server, ignore_eos_runs_to_the_limit) {
    ts_env t;
    ts_setup(&t);
    char model[600];
    ts_convert_with_config(&t, "dot", "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\", "
                           "\"eos_token\": \".\"}", model, sizeof model);
    ts_srv s;
    ts_start(&s, &t, model, NULL);
    char finish[16];
    char *plain = ts_complete(&s, "Once upon a time", 60, "\"temperature\":0", 0, finish);
    cr_assert_str_eq(finish, "stop", "no end token in 60 greedy tokens: '%s'", plain);
    for (int stream = 0; stream < 2; stream++) {
        char *all = ts_complete(&s, "Once upon a time", 60, "\"temperature\":0,\"ignore_eos\":true", stream, finish);
        cr_assert_str_eq(finish, "length", "stream %d: '%s'", stream, all);
        cr_assert(!strncmp(all, plain, strlen(plain)) && strlen(all) > strlen(plain) && !strchr(all, '.'),
                  "stream %d: '%s' after '%s'", stream, all, plain);
        free(all);
    }
    char *body = ts_completion_body("Once upon a time", 60, "\"temperature\":0,\"ignore_eos\":true");
    ts_resp r = ts_post(s.port, "/v1/completions", body);
    cr_assert(r.status == 200 && strstr(r.body, "\"completion_tokens\":60,"), "%s", r.raw);
    free(r.raw), free(body);
    body = ts_completion_body("Once upon a time", 60, "\"ignore_eos\":\"yes\"");
    r = ts_post(s.port, "/v1/completions", body);
    ts_expect_error(&r, 400, "'ignore_eos' must be a bool", "ignore_eos");
    free(r.raw), free(body), free(plain);
    ts_stop(&s);
    ts_teardown(&t);
}

// --timeout 1: a client that sends half a request head and stalls gets 408 and is closed; one that asks for a
// stream and never reads does not hold anyone else up; one that pipelines requests and reads none of the answers
// (more of them than both sockets' buffers hold: Linux grows a send buffer to 4 MB at most) is closed once its
// unsent output has waited --timeout, with a line on the server's stderr. Another client is served meanwhile.
Test(server, slow_clients) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--timeout", "1", NULL});
    int stalled = ts_connect(s.port);
    ts_send(stalled, "POST /v1/completions HTTP/1.1\r\nContent-Le", 41);
    int sleeper = ts_open_completion(s.port, "Once upon a time", 300, 1);
    cr_assert(stalled >= 0 && sleeper >= 0);
    ts_resp m = ts_http(s.port, "GET", "/metrics", NULL, NULL);
    const char get[] = "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
    size_t n_get = ((size_t)8 << 20) / strlen(m.raw) + 1, answers = n_get * strlen(m.raw);  // about 8 MB
    free(m.raw);
    char *gets = malloc(n_get * (sizeof get - 1));
    for (size_t i = 0; i < n_get; i++) memcpy(gets + i * (sizeof get - 1), get, sizeof get - 1);
    int deaf = ts_connect_rcvbuf(s.port, 4096);
    ts_send(deaf, gets, n_get * (sizeof get - 1));
    free(gets);
    char *want = ts_cli(&t, "The sun was", 20, "0", NULL);
    char *got = ts_complete(&s, "The sun was", 20, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want, "served beside a stalled, a sleeping and a deaf client");
    ts_resp r = {0};
    r.raw = ts_read_all(stalled, NULL);  // within the server's timeout and its drain, well inside ours
    ts_resp_parse(&r);
    ts_expect_error(&r, 408, "did not arrive whole", NULL);
    free(r.raw), free(want), free(got);
    close(stalled);
    ts_await_log(&s, "its client does not read: output unread for --timeout");
    size_t n;
    char *part = ts_read_all(deaf, &n);  // what the sockets held, then the end: the rest was dropped
    cr_assert(!strncmp(part, "HTTP/1.1 200", 12) && n < answers, "%zu of %zu bytes", n, answers);
    free(part);
    close(sleeper), close(deaf);
    ts_await_metric(&s, "connections", 1);  // /metrics' own
    ts_stop(&s);
    ts_teardown(&t);
}

// ---- sessions, parking and restoring
// The answer of a session's turn: a completion with "session".
static char *ts_turn(const ts_srv *s, const char *session, const char *prompt, int n, int park, int64_t *cached) {
    char more[300];
    snprintf(more, sizeof more, "\"temperature\":0,\"session\":\"%s\"%s", session, park ? ",\"park\":true" : "");
    char *body = ts_completion_body(prompt, n, more);
    ts_resp r = ts_post(s->port, "/v1/completions", body);
    char *text = ts_text(&r, 0, 0, NULL, 0);
    const char *c = strstr(r.body, "\"cached_tokens\":");
    cr_assert(c, "%s", r.body);
    if (cached) *cached = atoll(c + 16);
    free(body), free(r.raw);
    return text;
}

// OpenAI's clients send "user" (an end user's id) on every request, side by side: it names a session whose cache a
// request uses while the session is free, but a second request of the same user runs at once without it, where
// requests naming a "session" run one after the other. Each turn takes 10 ms (DJINN_TEST_STEP_US): 300 tokens keep
// the first answer under way for 3 s.
Test(server, user_requests_run_side_by_side) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start_slow_us(&s, &t, NULL, "10000");
    const char *who[] = {"\"temperature\":0,\"user\":\"dana\"", "\"temperature\":0,\"session\":\"erin\""};
    for (int k = 0; k < 2; k++) {
        int a = ts_send_completion(s.port, "Once upon a time", 300, who[k]);
        cr_assert(a >= 0, "cannot send a request");
        ts_await_metric(&s, "requests_active", 1);
        int b = ts_send_completion(s.port, "The little dog", 300, who[k]);
        cr_assert(b >= 0, "cannot send a request");
        if (k == 0) {
            ts_await_metric(&s, "requests_active", 2);
        } else {
            ts_await_metric(&s, "requests_queued", 1);
            cr_assert_eq(ts_metric(&s, "requests_active"), 1, "a session's second request ran beside its first");
        }
        ts_abort(a), ts_abort(b);
        ts_await_metric(&s, "requests_active", 0);
        ts_await_metric(&s, "requests_queued", 0);
    }
    // the session a user names keeps its cache for the user's next turn (the first request above kept it)
    const char *more = "\"temperature\":0,\"user\":\"fay\"";
    char *body = ts_completion_body("Once upon a time", 20, more);
    ts_resp r = ts_post(s.port, "/v1/completions", body);
    char *first = ts_text(&r, 0, 0, NULL, 0);
    free(body), free(r.raw);
    char prompt2[1024];
    snprintf(prompt2, sizeof prompt2, "Once upon a time%s The end. Then", first);
    body = ts_completion_body(prompt2, 10, more);
    r = ts_post(s.port, "/v1/completions", body);
    const char *c = strstr(r.body, "\"cached_tokens\":");
    cr_assert(r.status == 200 && c && atoll(c + 16) > 10, "the user's second turn found no cache: %s", r.raw);
    free(body), free(r.raw), free(first);
    ts_stop(&s);
    ts_teardown(&t);
}

// Three sessions of two turns on a server with two KV slots (--kv-gb for two slots of 512 positions) and one with
// plenty: the second turns' texts are the same, and the same as a request without a session (every token
// prefilled). On the small one, the third session's first turn parks the least recently used session's cache
// (alice's); in the second turns each session finds the other two's caches in the slots, so each parks the least
// recently used of them and restores its own (its prompt's cached tokens say the cache was there).
static void ts_sessions_parked(void) {
    ts_env t;
    ts_setup(&t);
    ts_srv big, small;
    ts_start(&big, &t, t.model, NULL);
    char kv_gb[32];
    ts_start(&small, &t, t.model, (const char *[]){"--kv-gb", ts_kv_gb(2, kv_gb), "--parallel", "1", NULL});
    cr_assert_eq(ts_metric(&small, "kv_slots"), 2);
    const char *names[] = {"alice", "bob", "carol"};
    char *first[3], prompt2[3][2048];
    for (int i = 0; i < 3; i++) {
        first[i] = ts_turn(&small, names[i], ts_prompts[i], 40, 0, NULL);
        char *b = ts_turn(&big, names[i], ts_prompts[i], 40, 0, NULL);
        cr_assert_str_eq(first[i], b);
        free(b);
        snprintf(prompt2[i], sizeof prompt2[i], "%s%s The end. Then", ts_prompts[i], first[i]);
    }
    // alice was the least recently used when carol came: parked
    cr_assert_eq(ts_metric(&small, "parks_total"), 1);
    cr_assert_eq(ts_metric(&small, "sessions_parked"), 1);
    // the slot holds the prompt's 5 positions and 39 of the 40 tokens: the last one picked ends the answer unrun
    cr_assert_eq(ts_metric(&small, "park_bytes_total"), 44 * ts_pos_bytes(DJ_KV_DEFAULT), "alice's 5 + 39 positions");
    for (int i = 0; i < 3; i++) {
        int64_t cached;
        char *got = ts_turn(&small, names[i], prompt2[i], 50, 0, &cached);
        char *stay = ts_turn(&big, names[i], prompt2[i], 50, 0, NULL);
        char *none = ts_complete(&big, prompt2[i], 50, "\"temperature\":0", 0, NULL);
        cr_assert_str_eq(got, stay, "%s: parking changed the continuation", names[i]);
        cr_assert_str_eq(got, none, "%s: the kept cache changed the continuation", names[i]);
        cr_assert_gt(cached, 30, "%s's second turn did not find its cache (%ld tokens cached)", names[i], (long)cached);
        free(got), free(stay), free(none);
    }
    cr_assert_eq(ts_metric(&small, "restores_total"), 3, "each cache came back from host memory");
    cr_assert_eq(ts_metric(&small, "parks_total"), 4, "bob's, carol's and alice's caches made room in turn");
    cr_assert_eq(ts_metric(&small, "restore_bytes_total"),
                 ts_metric(&small, "park_bytes_total") - ts_metric(&small, "parked_bytes"),
                 "every cache parked and not parked now came back whole");
    // a session parked on request, and with "park": true after its answer
    ts_resp r = ts_http(small.port, "POST", "/v1/sessions/carol/park", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    cr_assert(strstr(r.body, "\"session\":\"carol\",\"parked\":true,\"tokens\":"), "%s", r.body);
    free(r.raw);
    double parks = ts_metric(&small, "parks_total");
    char third[3000];
    snprintf(third, sizeof third, "%s Once more,", prompt2[0]);
    char *a = ts_turn(&small, "alice", third, 20, 1, NULL), *a_big = ts_turn(&big, "alice", third, 20, 0, NULL);
    cr_assert_str_eq(a, a_big);
    cr_assert_eq(ts_metric(&small, "parks_total"), parks + 1, "'park': true did not park alice after her answer");
    free(a), free(a_big);
    r = ts_http(small.port, "DELETE", "/v1/sessions/bob", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    free(r.raw);
    r = ts_http(small.port, "DELETE", "/v1/sessions/bob", NULL, NULL);
    ts_expect_error(&r, 404, "no session 'bob'", NULL);
    free(r.raw);
    r = ts_http(small.port, "GET", "/v1/sessions/alice/park", NULL, NULL);
    ts_expect_error(&r, 405, "use POST", NULL);
    free(r.raw);
    cr_assert_eq(ts_metric(&small, "sessions"), 2);
    for (int i = 0; i < 3; i++) free(first[i]);
    ts_stop(&small);
    ts_stop(&big);
    ts_teardown(&t);
}

Test(server, sessions_parked_and_restored_continue_exactly) { ts_sessions_parked(); }

// The same on the GPU engine: the caches parked to page-locked host memory on the parking stream and back.
Test(server, gpu_sessions_parked_and_restored_continue_exactly) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (GPU tests run on the GPU machine)");
    ts_on_gpu = 1;
    ts_sessions_parked();
}

// --park-gb too small for any cache: a session that must leave its slot loses its cache instead (counted as a
// drop), and its next turn prefills everything: the same text.
Test(server, sessions_beyond_the_parking_budget_lose_only_time) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    char kv_gb[32];
    ts_start(&s, &t, t.model, (const char *[]){"--kv-gb", ts_kv_gb(1, kv_gb), "--park-gb", "0.00001", NULL});
    cr_assert_eq(ts_metric(&s, "kv_slots"), 1);
    char *a1 = ts_turn(&s, "a", ts_prompts[0], 30, 0, NULL), *b1 = ts_turn(&s, "b", ts_prompts[1], 30, 0, NULL);
    char p2[1024];
    snprintf(p2, sizeof p2, "%s%s And", ts_prompts[0], a1);
    int64_t cached;
    char *a2 = ts_turn(&s, "a", p2, 30, 0, &cached), *none = ts_complete(&s, p2, 30, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(a2, none);
    cr_assert_eq(cached, 0, "a's cache was dropped, yet %ld tokens were cached", (long)cached);
    cr_assert_eq(ts_metric(&s, "parks_total"), 0);
    cr_assert_geq(ts_metric(&s, "cache_drops_total"), 1);
    free(a1), free(b1), free(a2), free(none);
    ts_stop(&s);
    ts_teardown(&t);
}

// ---- breakpoints: a request stops after a layer and answers with the residual stream; a resume sends it back
// The answer to a breakpoint request, parsed.
typedef struct {
    char id[32];
    int64_t layer, dim, pos, count, prompt_tokens, cached;
    float *rows;  // (count, dim), the residual decoded by this file's own base64 reader
} ts_brk;

// base64 (RFC 4648, padded) read here, apart from the server's code: malloc'd bytes, *n of them.
static unsigned char *ts_unbase64(const char *s, size_t *n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = strlen(s);
    cr_assert(len % 4 == 0, "base64 of %zu characters", len);
    unsigned char *out = malloc(len / 4 * 3 + 1);
    *n = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            const char *at = s[i + j] == '=' ? NULL : strchr(abc, s[i + j]);
            cr_assert(at || (s[i + j] == '=' && i + 4 == len && j >= 2), "not base64 at %zu", i + j);
            pad += !at;
            v = v << 6 | (uint32_t)(at ? at - abc : 0);
        }
        unsigned char b[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
        memcpy(out + *n, b, (size_t)(3 - pad)), *n += (size_t)(3 - pad);
    }
    return out;
}

// A breakpoint request (its JSON body) to `path`, with `headers` (NULL: none): status 200, no text, finish_reason
// "breakpoint", the fields.
static ts_brk ts_break_h(const ts_srv *s, const char *path, const char *headers, const char *body) {
    ts_resp r = ts_http(s->port, "POST", path, headers, body);
    cr_assert_eq(r.status, 200, "a breakpoint: %s", r.raw);
    dj_err e;
    json_doc *d = json_parse(r.body, strlen(r.body), &e);
    cr_assert(d, "%s: %s", e.msg, r.body);
    const json_value *o = json_root(d), *bk = json_get(o, "breakpoint"), *u = json_get(o, "usage");
    const json_value *c0 = &json_get(o, "choices")->u.arr.items[0];
    cr_assert_str_eq(json_str(json_get(c0, "finish_reason")), "breakpoint", "%s", r.body);
    ts_brk b = {0};
    int64_t gen = -1;
    cr_assert(bk && !json_int(json_get(bk, "layer"), &b.layer) && !json_int(json_get(bk, "dim"), &b.dim) &&
              !json_int(json_get(bk, "position"), &b.pos) && !json_int(json_get(bk, "count"), &b.count) &&
              !json_int(json_get(u, "prompt_tokens"), &b.prompt_tokens) &&
              !json_int(json_get(json_get(u, "prompt_tokens_details"), "cached_tokens"), &b.cached) &&
              !json_int(json_get(u, "completion_tokens"), &gen) && gen == 0, "%s", r.body);
    cr_assert_str_eq(json_str(json_get(bk, "dtype")), "float32");
    cr_assert_eq(json_get(bk, "tokens")->u.arr.n, (size_t)b.count, "%s", r.body);
    cr_assert_eq(b.pos + b.count, b.prompt_tokens, "the positions returned run to the prompt's end: %s", r.body);
    snprintf(b.id, sizeof b.id, "%s", json_str(json_get(bk, "id")));
    size_t n;
    b.rows = (float *)(void *)ts_unbase64(json_str(json_get(bk, "residual")), &n);
    cr_assert_eq(n, (size_t)(b.count * b.dim) * 4, "the residual's bytes: %s", r.body);
    json_free(d);
    free(r.raw);
    return b;
}

static ts_brk ts_break(const ts_srv *s, const char *path, const char *body) { return ts_break_h(s, path, NULL, body); }

// The body of a resume of b with rows (b's shape), after the fields `more` (NULL: none).
static char *ts_resume_body(const ts_brk *b, const float *rows, const char *more) {
    dj_buf x = {0};
    buf_fmt(&x, "{\"model\":\"m\",%s%s\"resume\":{\"id\":\"%s\",\"residual\":\"", more ? more : "", more ? "," : "",
            b->id);
    buf_base64(&x, rows, (size_t)(b->count * b->dim) * 4);
    buf_str(&x, "\"}}");
    cr_assert(!x.oom);
    return x.p;
}

// A resume of b with rows to `path`; its text (stream: streamed). cached: the usage's cached tokens.
static char *ts_resume(const ts_srv *s, const char *path, const ts_brk *b, const float *rows, const char *more,
                       int stream, int64_t *cached) {
    char fields[1024];
    snprintf(fields, sizeof fields, "%s%s", more, stream ? ",\"stream\":true" : "");
    char *body = ts_resume_body(b, rows, fields);
    ts_resp r = ts_post(s->port, path, body);
    char *text = ts_text(&r, !strcmp(path, "/v1/chat/completions"), stream, NULL, 0);
    if (cached) {
        const char *at = strstr(r.body, "\"cached_tokens\":");
        cr_assert(at, "%s", r.body);
        *cached = atoll(at + 16);
    }
    free(body), free(r.raw);
    return text;
}

// djinn -p PROMPT -n 0 --dump-act LAYER: the prompt's rows after LAYER (n positions, dim each), by position.
static float *ts_cli_dump(const ts_env *t, const char *prompt, int layer, int64_t n, int64_t dim) {
    char out[400], err[400], act[400], ls[16];
    snprintf(out, sizeof out, "%s/dump.out", t->dir);
    snprintf(err, sizeof err, "%s/dump.err", t->dir);
    snprintf(act, sizeof act, "%s/act.bin", t->dir);
    snprintf(ls, sizeof ls, "%d", layer);
    char *argv[16] = {ts_djinn, (char *)t->model, "-p", (char *)prompt, "-n", "0", "--dump-act", ls, act};
    argv[9] = ts_on_gpu ? NULL : "--cpu";
    cr_assert_eq(ts_run(argv, NULL, out, err), 0, "djinn --dump-act failed: %s", tc_read(err, NULL));
    size_t size;
    unsigned char *d = (unsigned char *)tc_must_read(act, &size);
    size_t rec = 16 + 4 * (size_t)dim;
    cr_assert_eq(size, 256 + (size_t)n * rec, "the dump holds %zu bytes for %ld positions", size, (long)n);
    float *rows = malloc((size_t)(n * dim) * 4);
    for (int64_t i = 0; i < n; i++) {
        uint32_t h[2];
        memcpy(h, d + 256 + (size_t)i * rec, 8);
        cr_assert(h[0] == (uint32_t)layer && h[1] < n);
        memcpy(rows + (int64_t)h[1] * dim, d + 256 + (size_t)i * rec + 16, 4 * (size_t)dim);
    }
    free(d);
    return rows;
}

// Rows against rows: bitwise on the CPU, each row within 1e-5 relative L2 on the GPU (another pass's sums).
static void ts_rows_same(const float *got, const float *want, int64_t n, int64_t dim, const char *what) {
    for (int64_t r = 0; r < n; r++) {
        if (ts_on_gpu) {
            double d = tc_rel_l2(got + r * dim, want + r * dim, dim);
            cr_assert(d <= 1e-5, "%s: row %ld: relative L2 %.3e", what, (long)r, d);
        } else {
            cr_assert(!memcmp(got + r * dim, want + r * dim, 4 * (size_t)dim), "%s: row %ld differs", what, (long)r);
        }
    }
}

// Breakpoints without a session, after the first, a middle and the last layer: every position of the prompt comes
// back (the command line's --dump-act rows: bitwise on the CPU), and a resume with the residual unchanged gives the
// command line's text: greedy, streamed or not, and (on the CPU) seeded sampling and a chat, streamed. On the chat
// model's server: its completions are stories260K's.
static void ts_breakpoint_exact(void) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.chat, NULL);
    const int layers[] = {0, 2, 4};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            const char *p = ts_prompts[i];
            char more[100];
            snprintf(more, sizeof more, "\"temperature\":0,\"break_after_layer\":%d", layers[k]);
            char *body = ts_completion_body(p, 40, more), *want = ts_cli(&t, p, 40, "0", NULL);
            ts_brk b = ts_break(&s, "/v1/completions", body);
            cr_assert(b.layer == layers[k] && b.dim == 64 && b.pos == 0 && b.cached == 0, "'%s' after %d", p,
                      layers[k]);
            if (k == 1) {
                float *cli = ts_cli_dump(&t, p, layers[k], b.count, b.dim);
                ts_rows_same(b.rows, cli, b.count, b.dim, "the breakpoint's rows against --dump-act's");
                free(cli);
            }
            char *got = ts_resume(&s, "/v1/completions", &b, b.rows, "\"max_tokens\":40,\"temperature\":0", i, NULL);
            cr_assert_str_eq(got, want, "'%s' resumed after layer %d unchanged (stream %d): not djinn -p's text", p,
                             layers[k], i);
            free(body), free(want), free(got), free(b.rows);
        }
    if (!ts_on_gpu) {  // the GPU's command line picks its tokens on the device: seeded runs differ from the host's
        const char *fields = "\"temperature\":0.8,\"top_p\":0.9,\"seed\":1234";
        char more[200];
        snprintf(more, sizeof more, "%s,\"break_after_layer\":3", fields);
        char *body = ts_completion_body(ts_prompts[2], 30, more), *want = ts_cli(&t, ts_prompts[2], 30, "0.8", "1234");
        ts_brk b = ts_break(&s, "/v1/completions", body);
        snprintf(more, sizeof more, "\"prompt\":\"%s\",\"max_tokens\":30,%s", ts_prompts[2], fields);
        char *got = ts_resume(&s, "/v1/completions", &b, b.rows, more, 0, NULL);
        cr_assert_str_eq(got, want, "seeded: resumed unchanged, not djinn -s's text");
        free(body), free(want), free(got), free(b.rows);
        const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                           "\"content\":\"Tell me a story\"}],\"max_tokens\":30,\"temperature\":0";
        snprintf(more, sizeof more, "{%s,\"break_after_layer\":1}", msgs);
        b = ts_break(&s, "/v1/chat/completions", more);
        want = ts_cli_chat(&t, "Be brief.", "Tell me a story", 30, "0", NULL);
        got = ts_resume(&s, "/v1/chat/completions", &b, b.rows, msgs, 1, NULL);
        cr_assert_str_eq(got, want, "a chat resumed unchanged, streamed: not djinn --chat's answer");
        free(want), free(got), free(b.rows);
    }
    cr_assert_eq(ts_metric(&s, "breakpoints_paused"), 0, "every paused state was resumed");
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, breakpoint_resumed_unchanged_equals_the_plain_run) { ts_breakpoint_exact(); }

// A breakpoint in a session's second turn: only the new positions come back (the cache holds the rest); the
// session is paused (an ordinary request in it is refused), survives being parked, and the resume, naming the
// session and the prompt, gives the text of the same prompt asked without a session; then the session goes on.
static void ts_breakpoint_session(void) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    char *first = ts_turn(&s, "alice", ts_prompts[0], 30, 0, NULL), p2[2048], p3[4096];
    snprintf(p2, sizeof p2, "%s%s The end. Then", ts_prompts[0], first);
    char *body = ts_completion_body(p2, 40, "\"temperature\":0,\"session\":\"alice\",\"break_after_layer\":3");
    ts_brk b = ts_break(&s, "/v1/completions", body);
    cr_assert(b.pos > 30 && b.pos == b.cached && b.count < 10, "positions %ld.. of %ld: the cache held the start",
              (long)b.pos, (long)b.prompt_tokens);
    free(body);
    body = ts_completion_body(p2, 5, "\"session\":\"alice\"");
    ts_resp r = ts_post(s.port, "/v1/completions", body);
    ts_expect_error(&r, 409, "paused at breakpoint brk-", "session");
    free(body), free(r.raw);
    r = ts_http(s.port, "POST", "/v1/sessions/alice/park", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    free(r.raw);
    dj_buf more = {0};
    buf_str(&more, "\"prompt\":");
    buf_json_str(&more, p2, strlen(p2));
    buf_str(&more, ",\"session\":\"alice\",\"max_tokens\":40,\"temperature\":0");
    int64_t cached;
    char *got = ts_resume(&s, "/v1/completions", &b, b.rows, more.p, 0, &cached),
         *want = ts_complete(&s, p2, 40, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want, "a session's turn resumed unchanged: not the text of the same prompt");
    cr_assert_eq(cached, b.pos, "the resume ran the paused positions again from the kept cache");
    cr_assert_geq(ts_metric(&s, "restores_total"), 1, "the parked cache came back");
    snprintf(p3, sizeof p3, "%s%s Once more,", p2, got);
    char *third = ts_turn(&s, "alice", p3, 20, 0, &cached);
    char *plain = ts_complete(&s, p3, 20, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(third, plain, "the session's next turn");
    cr_assert_gt(cached, b.pos + b.count, "the next turn found the session's cache");
    free(first), free(got), free(want), free(third), free(plain), free(b.rows), buf_free(&more);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, breakpoint_in_a_sessions_second_turn) { ts_breakpoint_session(); }

// A changed residual changes what follows: noise of three times the rows' own size (at their size a rare seed,
// 1824812431599081, left the text as it was), the rows negated, and another prompt's rows
// (of as many tokens): after the last layer its rows alone make the next token, so one token resumed is exactly
// that prompt's first token; after a middle layer the text is not the plain one.
static void ts_breakpoint_changed(void) {
    tc_rng_fresh("server.breakpoint_changed");
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    const char *p1 = "Once upon a time, there was a dog", *p2 = "Once upon a time, there was a cat";
    char *plain1 = ts_cli(&t, p1, 30, "0", NULL), *first2 = ts_cli(&t, p2, 1, "0", NULL);
    const char *resume = "\"max_tokens\":30,\"temperature\":0", *one = "\"max_tokens\":1,\"temperature\":0";
    char *b1 = ts_completion_body(p1, 30, "\"temperature\":0,\"break_after_layer\":2");
    for (int how = 0; how < 2; how++) {  // noise, negated
        ts_brk b = ts_break(&s, "/v1/completions", b1);
        double ss = 0;
        for (int64_t i = 0; i < b.count * b.dim; i++) ss += (double)b.rows[i] * b.rows[i];
        float rms = (float)sqrt(ss / (double)(b.count * b.dim));
        for (int64_t i = 0; i < b.count * b.dim; i++)
            b.rows[i] = how ? -b.rows[i] : b.rows[i] + 3.0f * rms * tc_normal();
        char *got = ts_resume(&s, "/v1/completions", &b, b.rows, resume, 0, NULL);
        cr_assert_str_neq(got, plain1, "the residual %s, and the text the plain one (seed %llu)",
                          how ? "negated" : "noised", (unsigned long long)tc_seed_used());
        free(got), free(b.rows);
    }
    for (int last = 0; last < 2; last++) {
        char more[100];
        snprintf(more, sizeof more, "\"temperature\":0,\"break_after_layer\":%d", last ? 4 : 2);
        char *bd = ts_completion_body(p1, 30, more), *bc = ts_completion_body(p2, 30, more);
        ts_brk dog = ts_break(&s, "/v1/completions", bd), cat = ts_break(&s, "/v1/completions", bc);
        cr_assert_eq(dog.count, cat.count, "the two prompts' token counts differ: pick others");
        char *got = ts_resume(&s, "/v1/completions", &dog, cat.rows, last ? one : resume, 0, NULL);
        if (last) cr_assert_str_eq(got, first2, "after the last layer, the other prompt's rows make its next token");
        else cr_assert_str_neq(got, plain1, "another prompt's rows after layer 2, and the text the plain one");
        // the cat's own paused state, resumed unchanged, is untouched by the other's
        char *cat_text = ts_resume(&s, "/v1/completions", &cat, cat.rows, one, 0, NULL);
        cr_assert_str_eq(cat_text, first2);
        free(bd), free(bc), free(got), free(cat_text), free(dog.rows), free(cat.rows);
    }
    free(b1), free(plain1), free(first2);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, breakpoint_changed_residual_changes_the_text) { ts_breakpoint_changed(); }

// An ordinary request in the middle of its answer (streaming, 5 ms a turn) while another client breaks and resumes
// twice (the residual noised, then unchanged) on a prompt longer than the first one's answer so far: the passes
// that copy the rows of positions 0..N-1 out and write them over hold the other request's decode row of a position
// among them. Its text is the command line's, and so is the unchanged resume's: a tap touches its own slot's rows.
typedef struct {
    int port;
    char *raw;
    volatile int done;
} ts_bystander;

static void *ts_bystander_run(void *arg) {
    ts_bystander *b = arg;
    int fd = ts_open_completion(b->port, "The little dog", 300, 1);
    if (fd >= 0) b->raw = ts_recv_all(fd, NULL), close(fd);
    b->done = 1;
    return NULL;
}

static void ts_breakpoint_beside(void) {
    tc_rng_fresh("server.breakpoint_beside");
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    // 5 ms a turn: the other request's 300 tokens outlast both breakpoints and resumes on either engine
    ts_start_slow_us(&s, &t, (const char *[]){"--parallel", "4", NULL}, "5000");
    char prompt[2048] = "";
    for (int i = 0; i < 12; i++)
        strcat(prompt, "Once upon a time, there was a little girl named Lily. She loved to play. ");
    strcat(prompt, "One day");
    char *want = ts_cli(&t, prompt, 20, "0", NULL);  // before the other request starts: a GPU engine's start is slow
    ts_bystander by = {s.port, NULL, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, ts_bystander_run, &by), 0);
    ts_await_metric(&s, "requests_active", 1);
    char *body = ts_completion_body(prompt, 20, "\"temperature\":0,\"break_after_layer\":2");
    for (int changed = 1; changed >= 0; changed--) {
        ts_brk b = ts_break(&s, "/v1/completions", body);
        for (int64_t i = 0; changed && i < b.count * b.dim; i++) b.rows[i] += 3 * tc_normal();
        char *got = ts_resume(&s, "/v1/completions", &b, b.rows, "\"max_tokens\":20,\"temperature\":0", 0, NULL);
        if (changed) cr_assert_str_neq(got, want, "noise over the residual changed nothing");
        else cr_assert_str_eq(got, want, "resumed unchanged beside another request");
        // the other request's position is at most its prompt's 4 and the tokens generated by anyone so far
        double gen = ts_metric(&s, "generated_tokens_total");
        cr_assert(changed ? 4 + gen < b.count : !by.done, "the other request was past the tapped positions (%g tokens "
                  "generated) or done: the passes shared no position", gen);
        free(got), free(b.rows);
    }
    pthread_join(th, NULL);
    cr_assert(by.raw, "the other request got no answer");
    ts_resp r = {0};
    r.raw = by.raw;
    ts_resp_parse(&r);
    char *other = ts_text(&r, 0, 1, NULL, 0), *other_want = ts_cli(&t, "The little dog", 300, "0", NULL);
    cr_assert_str_eq(other, other_want, "a request beside breakpoints: not djinn -p's text");
    free(other), free(other_want), free(r.raw), free(want), free(body);
    ts_stop(&s);
    ts_teardown(&t);
}

Test(server, breakpoint_beside_another_request) { ts_breakpoint_beside(); }

// What is refused, each with its status and the field at fault, while the server goes on serving: a breakpoint
// with a stream, of a layer the model lacks, with a resume; resumes of an unknown id, a malformed one, a residual
// that is not base64, of the wrong size or shape, not finite, with another prompt, session or endpoint (none of
// which spends the paused state), of an id resumed already, dropped as the oldest of --breakpoints 2, or whose
// session was deleted; an ordinary request in a paused session, at once and when queued behind the breakpoint
// that pauses it; a resume after the session's cache was dropped beyond --park-gb; breakpoints on a server with
// --breakpoints 0.
Test(server, breakpoint_refusals) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.chat, (const char *[]){"--breakpoints", "2", NULL});
    const char *C = "/v1/completions";
#define TS_P "\"prompt\":\"Once upon a time\",\"max_tokens\":10"
    const char *P = TS_P;
    char body[600];
    const ts_case cases[] = {
        {C, "{" TS_P ",\"break_after_layer\":2,\"stream\":true}", 400,
         "'stream' cannot be used with 'break_after_layer'", "stream"},
        {C, "{" TS_P ",\"break_after_layer\":5}", 400, "'break_after_layer' must be an integer within [0, 4]",
         "break_after_layer"},
        {C, "{" TS_P ",\"break_after_layer\":-1}", 400, "within [0, 4]", "break_after_layer"},
        {C, "{" TS_P ",\"break_after_layer\":1.5}", 400, "must be an integer", "break_after_layer"},
        {C, "{" TS_P ",\"break_after_layer\":\"2\"}", 400, "must be a number", "break_after_layer"},
        {C, "{" TS_P ",\"break_after_layer\":2,\"resume\":{\"id\":\"brk-1\",\"residual\":\"AAAA\"}}", 400, "not both",
         "resume"},
        {C, "{" TS_P ",\"resume\":{\"id\":\"nope\",\"residual\":\"AAAA\"}}", 404, "no paused state 'nope'", "resume"},
        {C, "{" TS_P ",\"resume\":{\"id\":\"brk-01\",\"residual\":\"AAAA\"}}", 404, "no paused state 'brk-01'",
         "resume"},
        {C, "{" TS_P ",\"resume\":{\"id\":\"brk-1\"}}", 400, "'resume' must be {\\\"id\\\"", "resume"},
        {C, "{" TS_P ",\"resume\":\"brk-1\"}", 400, "'resume' must be an object", "resume"},
    };
#undef TS_P
    ts_expect_cases(&s, cases, sizeof cases / sizeof *cases);
    float row[64] = {0};
    ts_brk none = {"brk-999", 2, 64, 0, 1, 0, 0, NULL};
    char *unknown = ts_resume_body(&none, row, P);
    ts_resp r = ts_post(s.port, C, unknown);
    ts_expect_error(&r, 404, "no paused state brk-999", "resume");
    free(r.raw), free(unknown);
    // a paused state refused every way that does not spend it, then resumed, then resumed again
    snprintf(body, sizeof body, "{%s,\"temperature\":0,\"break_after_layer\":1}", P);
    ts_brk b = ts_break(&s, C, body);
    float *rows = malloc((size_t)((b.count + 1) * b.dim) * 4);
    memcpy(rows, b.rows, (size_t)(b.count * b.dim) * 4);
    ts_brk fewer = b, more = b;
    fewer.count--, more.count++;
    char *bad[6];
    bad[0] = ts_resume_body(&fewer, rows, NULL);
    bad[1] = ts_resume_body(&more, rows, NULL);
    rows[3] = NAN;
    bad[2] = ts_resume_body(&b, rows, NULL);
    rows[3] = b.rows[3];
    bad[3] = ts_resume_body(&b, rows, "\"prompt\":\"Once upon a time there\"");
    bad[4] = ts_resume_body(&b, rows, "\"session\":\"bob\"");
    bad[5] = ts_resume_body(&b, rows, "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]");
    const char *bad_msg[] = {"is 5 positions x 64 (1280 bytes)", "is 5 positions x 64", "row 0, element 3 is NaN",
                             "the prompt differs from the one brk-", "made without a session",
                             "made through the other endpoint"};
    for (int i = 0; i < 6; i++) {
        ts_resp r = ts_post(s.port, i == 5 ? "/v1/chat/completions" : C, bad[i]);
        ts_expect_error(&r, 400, bad_msg[i], "resume");
        free(r.raw), free(bad[i]);
    }
    const char *b64[][2] = {{"@@@@", "is not base64: byte 0 (0x40)"},
                            {"AAA", "not a multiple of 4"},
                            {"AAAA", "holds 3 bytes: not rows of the model's 64 float32"},
                            {"AA=A", "is not base64: byte 2"}};
    for (int i = 0; i < 4; i++) {
        char rb[300];
        snprintf(rb, sizeof rb, "{%s,\"resume\":{\"id\":\"%s\",\"residual\":\"%s\"}}", P, b.id, b64[i][0]);
        ts_resp r = ts_post(s.port, C, rb);
        ts_expect_error(&r, 400, b64[i][1], "resume");
        free(r.raw);
    }
    char *want = ts_cli(&t, "Once upon a time", 10, "0", NULL);
    char *got = ts_resume(&s, C, &b, b.rows, "\"max_tokens\":10,\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want, "resumed after the refusals");
    free(got);
    char *again = ts_resume_body(&b, b.rows, NULL);
    r = ts_post(s.port, C, again);
    ts_expect_error(&r, 410, "was resumed already", "resume");
    free(r.raw), free(again), free(b.rows), free(rows);
    // --breakpoints 2: the third breakpoint drops the oldest paused state
    ts_brk k[3];
    for (int i = 0; i < 3; i++) k[i] = ts_break(&s, C, body);
    cr_assert_eq(ts_metric(&s, "breakpoints_paused"), 2);
    again = ts_resume_body(&k[0], k[0].rows, NULL);
    r = ts_post(s.port, C, again);
    ts_expect_error(&r, 410, "was dropped: the server holds 2 paused states", "resume");
    free(r.raw), free(again);
    for (int i = 1; i < 3; i++) {
        got = ts_resume(&s, C, &k[i], k[i].rows, "\"max_tokens\":10,\"temperature\":0", 0, NULL);
        cr_assert_str_eq(got, want, "a paused state beside the one dropped");
        free(got);
    }
    for (int i = 0; i < 3; i++) free(k[i].rows);
    // a paused session: an ordinary request refused, then the session deleted
    snprintf(body, sizeof body, "{%s,\"session\":\"carol\",\"break_after_layer\":0}", P);
    b = ts_break(&s, C, body);
    snprintf(body, sizeof body, "{%s,\"session\":\"carol\"}", P);
    r = ts_post(s.port, C, body);
    ts_expect_error(&r, 409, "session 'carol' is paused at breakpoint", "session");
    free(r.raw);
    snprintf(body, sizeof body, "{%s,\"user\":\"carol\"}", P);  // OpenAI's end-user id: served without the session
    r = ts_post(s.port, C, body);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    free(r.raw);
    cr_assert_eq(ts_metric(&s, "breakpoints_paused"), 1, "the request by 'user' touched the paused session");
    r = ts_http(s.port, "DELETE", "/v1/sessions/carol", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    free(r.raw);
    again = ts_resume_body(&b, b.rows, NULL);
    r = ts_post(s.port, C, again);
    ts_expect_error(&r, 410, "ended with its session, which was deleted", "resume");
    free(r.raw), free(again), free(b.rows);
    cr_assert_eq(ts_metric(&s, "breakpoints_paused"), 0);
    got = ts_complete(&s, "Once upon a time", 10, "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want, "served on after the refusals");
    free(got);
    ts_stop(&s);
    // one KV slot, no room to park: the paused session's cache is dropped when another request needs the slot
    char kv_gb[32];
    ts_start(&s, &t, t.model, (const char *[]){"--kv-gb", ts_kv_gb(1, kv_gb), "--park-gb", "0.00001", NULL});
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time, there was a little girl named Lily. She loved to\","
             "\"session\":\"a\",\"break_after_layer\":2}");  // more positions than 10 KB of parking hold
    b = ts_break(&s, C, body);
    got = ts_complete(&s, "The sun was", 5, "\"temperature\":0", 0, NULL);
    free(got);
    again = ts_resume_body(&b, b.rows, NULL);
    r = ts_post(s.port, C, again);
    ts_expect_error(&r, 410, "ended with its session's KV cache, dropped", "resume");
    free(r.raw), free(again), free(b.rows);
    ts_stop(&s);
    // --parallel 1: an ordinary request of a session queued behind the breakpoint that pauses it
    ts_start_slow(&s, &t, (const char *[]){"--parallel", "1", NULL});
    int busy = ts_open_completion(s.port, "The little dog", 100, 0);
    ts_await_metric(&s, "requests_active", 1);
    snprintf(body, sizeof body, "{%s,\"session\":\"d\",\"break_after_layer\":2}", P);
    int fd[2] = {ts_connect(s.port), ts_connect(s.port)};
    for (int i = 0; i < 2; i++) {
        if (i) snprintf(body, sizeof body, "{%s,\"session\":\"d\"}", P);
        char head[200];
        int n = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                         "Content-Length: %zu\r\n\r\n", strlen(body));
        ts_send(fd[i], head, (size_t)n), ts_send(fd[i], body, strlen(body));
        ts_await_metric(&s, "requests_queued", i + 1);
    }
    r = (ts_resp){0};
    r.raw = ts_read_all(fd[1], NULL);
    ts_resp_parse(&r);
    ts_expect_error(&r, 409, "was paused at breakpoint brk-1 by an earlier request", "session");
    free(r.raw);
    r.raw = ts_read_all(fd[0], NULL);
    ts_resp_parse(&r);
    cr_assert(r.status == 200 && strstr(r.body, "\"finish_reason\":\"breakpoint\""), "%s", r.raw);
    free(r.raw), free(ts_read_all(busy, NULL));
    close(fd[0]), close(fd[1]), close(busy);
    ts_stop(&s);
    // --breakpoints 0
    ts_start(&s, &t, t.model, (const char *[]){"--breakpoints", "0", NULL});
    snprintf(body, sizeof body, "{%s,\"break_after_layer\":2}", P);
    r = ts_post(s.port, C, body);
    ts_expect_error(&r, 400, "breakpoints are off on this server", "break_after_layer");
    free(r.raw);
    snprintf(body, sizeof body, "{%s,\"resume\":{\"id\":\"brk-1\",\"residual\":\"AAAA\"}}", P);
    r = ts_post(s.port, C, body);
    ts_expect_error(&r, 400, "breakpoints are off on this server", "resume");
    free(r.raw), free(want);
    ts_stop(&s);
    ts_teardown(&t);
}

// OpenAI's npm client (tests/npm/breakpoint_client.mjs) driving breakpoints and resumes through both endpoints: the
// fields beyond OpenAI's in its bodies, the answer's "breakpoint" read from what it parsed.
Test(server, breakpoint_openai_node_client) {
    ts_node n;
    ts_node_run(&n, "breakpoint_client.mjs", "2");
    const char *got = n.out;
    const json_value *o = json_root(n.d), *bk = json_get(o, "breakpoint"), *again = json_get(o, "again");
    int64_t layer, dim, pos, count, floats, status;
    cr_assert(!json_int(json_get(bk, "layer"), &layer) && layer == 2 && !json_int(json_get(bk, "dim"), &dim) &&
              dim == 64 && !json_int(json_get(bk, "position"), &pos) && pos == 0 &&
              !json_int(json_get(bk, "count"), &count) && count == 5 && !json_int(json_get(bk, "floats"), &floats) &&
              floats == count * dim, "%s", got);
    cr_assert_str_eq(json_str(json_get(bk, "finish")), "breakpoint", "%s", got);
    cr_assert_str_eq(json_str(json_get(bk, "text")), "", "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "resumed")), n.cli_t, "%s", got);
    cr_assert_str_neq(json_str(json_get(o, "changed")), n.cli_t, "a changed residual, and the plain text: %s", got);
    cr_assert_str_eq(json_str(json_get(o, "chat_finish")), "breakpoint", "%s", got);
    cr_assert_str_eq(json_str(json_get(o, "chat_resumed_stream")), n.cli_c, "%s", got);
    cr_assert(!json_int(json_get(again, "status"), &status) && status == 410 &&
              strstr(json_str(json_get(again, "message")), "was resumed already") &&
              !strcmp(json_str(json_get(again, "param")), "resume"), "%s", got);
    ts_node_end(&n);
}

// The same on the GPU engine (the GPU machine): all resident, then every layer streamed (--stream-all), the taps
// in probe_gpu.c; texts against the GPU's command line (greedy), rows against its --dump-act to 1e-5.
static void ts_breakpoints_gpu(int streamed) {
    if (gpu_count() == 0) cr_skip_test("no GPU: cudaGetDeviceCount found no usable device (GPU tests run on the GPU machine)");
    ts_on_gpu = 1, ts_gpu_streamed = streamed;
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);  // breakpoints need probes, which one GPU has (the default takes all)
    ts_breakpoint_exact();
    ts_breakpoint_session();
    ts_breakpoint_changed();
    ts_breakpoint_beside();
    unsetenv("CUDA_VISIBLE_DEVICES");
}

Test(server, gpu_breakpoints) { ts_breakpoints_gpu(0); }
Test(server, gpu_breakpoints_streamed) { ts_breakpoints_gpu(1); }

// ---- the command line
// The sizes a server takes from the memory when no flag gives them (kvsize.h), with DJINN_TEST_MEM standing for the
// host's available memory: the KV slots fill a quarter of it, half of them decode together, parking takes half of it;
// the startup line states each figure, where it came from and the KV type, /metrics the slots and sequences. Under
// one slot of the model's 512 positions, the context is cut to 256.
static void ts_sizes_case(const ts_env *t, int kv_type, uint64_t mem, const char *want_slots, double slots,
                          double parallel) {
    char m[32], want[300], *args[] = {"--kv-type", (char *)dj_kv_name(kv_type), NULL};
    snprintf(m, sizeof m, "%llu", (unsigned long long)mem);
    setenv("DJINN_TEST_MEM", m, 1);
    ts_srv s;
    ts_start(&s, t, t->model, (const char *const *)args);
    unsetenv("DJINN_TEST_MEM");
    char *err = tc_must_read(s.err, NULL);
    cr_expect(strstr(err, want_slots), "not '%s' in: %s", want_slots, err);
    snprintf(want, sizeof want, "of a quarter of the host's available memory (%.4g GB); up to %g sequence%s a step "
             "(half the slots, at most 256); parking up to %.3g GB (half the host's available memory)",
             (double)(mem / 4) / 1e9, parallel, parallel == 1 ? "" : "s", (double)(mem / 2) / 1e9);
    cr_expect(strstr(err, want), "not '%s' in: %s", want, err);
    cr_expect_eq(ts_metric(&s, "kv_slots"), slots);
    cr_expect_eq(ts_metric(&s, "parallel"), parallel);
    free(err);
    ts_stop(&s);
}

Test(server, sizes_from_memory) {
    ts_env t;
    ts_setup(&t);
    const uint64_t f16 = ts_pos_bytes(DJ_KV_F16), f32 = ts_pos_bytes(DJ_KV_F32);
    ts_sizes_case(&t, DJ_KV_F16, 4 * 10 * 512 * f16 + 3, "10 KV slots of 512 positions (the model's), f16, ", 10, 5);
    ts_sizes_case(&t, DJ_KV_F32, 4 * 10 * 512 * f32 - 4, "9 KV slots of 512 positions (the model's), f32, ", 9, 4);
    ts_sizes_case(&t, DJ_KV_F32, 4 * 511 * f32, "1 KV slot of 256 positions (of the model's 512: what the memory "
                  "holds), f32, ", 1, 1);
    ts_teardown(&t);
}

Test(server, usage_errors) {
    ts_env t;
    ts_setup(&t);
    char out[400], err[400];
    snprintf(out, sizeof out, "%s/u.out", t.dir);
    snprintf(err, sizeof err, "%s/u.err", t.dir);
    cr_assert_eq(ts_run((char *[]){ts_djinn, "serve", "--help", NULL}, NULL, out, err), 0);
    char *help = tc_must_read(out, NULL);
    const char *flags[] = {"--host",     "--port",     "--api-key", "--api-key-file", "--buffer-mb",
                           "--parallel", "--kv-gb",    "--park-gb", "--sessions",     "--prefill-chunk",
                           "--max-conns", "--timeout", "/v1/sessions/NAME/park", "--kv-type", "--client-share",
                           "ignore_eos"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        cr_assert(strstr(help, flags[i]), "%s: %s", flags[i], help);
    free(help);
    char tpl[500], tpl_msg[600];  // an empty --chat-template: refused by name once the model is read, not served
    snprintf(tpl, sizeof tpl, "%s/empty.jinja", t.dir);
    snprintf(tpl_msg, sizeof tpl_msg, "--chat-template %s is empty", tpl);
    tc_write(tpl, "", 0);
    struct {
        const char *a[6];
        int code, flag;  // flag: a bad flag, refused before the model is read: one line sending to --help
        const char *msg;
    } cases[] = {
        {{"--bogus", NULL}, 2, 1, "unknown option '--bogus'"},
        {{"--bogus", "3", NULL}, 2, 1, "unknown option '--bogus'"},
        {{"--port", NULL}, 2, 1, "option '--port' needs a value"},
        {{"--host", NULL}, 2, 1, "option '--host' needs a value"},
        {{"--port", "70000", NULL}, 2, 1, "--port wants an integer"},
        {{"--parallel", "0", NULL}, 2, 1, "--parallel wants"},
        {{"--kv-gb", "0.0001", NULL}, 2, 0, "holds no KV slot"},
        {{"--kv-gb", "0.0014", "--parallel", "5", NULL}, 2, 0, "--parallel 5 needs as many KV slots"},  // 4 at f16
        {{"--kv-type", "f64", NULL}, 2, 1, "--kv-type wants f32|f16|q8, not 'f64'"},
        {{"-c", "100000", NULL}, 2, 0, "beyond the model's max_seq_len"},
        {{"--host", "nowhere", "--port", "0", NULL}, 1, 0, "not an IPv4 address"},
        {{"--api-key", "", NULL}, 2, 1, "--api-key: a key holds 1 to 256 characters, not 0"},
        {{"--api-key", "a b", NULL}, 2, 1, "visible ASCII characters only (no spaces), not byte 0x20 at 2"},
        {{"--api-key", "k", "--api-key", "k", NULL}, 2, 1, "--api-key: a key given twice"},
        {{"--api-key-file", "/nonexistent/keys", NULL}, 2, 1, "/nonexistent/keys"},
        {{"--api-key-file", NULL}, 2, 1, "option '--api-key-file' needs a value"},
        {{"--buffer-mb", "0", NULL}, 2, 1, "--buffer-mb wants a number"},
        {{"--client-share", "0", NULL}, 2, 1, "--client-share wants a number above 0, not '0'"},
        {{"--client-share", "1.5", NULL}, 2, 1, "--client-share wants a number from 0 to 1"},
        {{"--client-share", "nan", NULL}, 2, 1, "--client-share wants a number from 0 to 1"},
        {{"--client-share", "x", NULL}, 2, 1, "--client-share wants a number from 0 to 1"},
        {{"--client-share", NULL}, 2, 1, "option '--client-share' needs a value"},
        {{"--port", "0", "--chat-template", tpl, NULL}, 2, 0, tpl_msg},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *argv[12] = {ts_djinn, "serve", t.model, "--cpu"};
        int a = 4;
        for (int j = 0; cases[i].a[j]; j++) argv[a++] = (char *)cases[i].a[j];
        argv[a] = NULL;
        int rc = ts_run(argv, NULL, out, err);
        char *e = tc_must_read(err, NULL);
        cr_assert_eq(rc, cases[i].code, "%s: exit %d: %s", cases[i].a[0], rc, e);
        cr_assert(strstr(e, cases[i].msg), "%s: %s", cases[i].a[0], e);
        if (cases[i].flag) {
            const char *tail = "(see djinn serve --help)\n";
            size_t el = strlen(e), tl = strlen(tail);
            cr_assert(el > tl && !strcmp(e + el - tl, tail) && strchr(e, '\n') == e + el - 1, "%s: %s", cases[i].a[0],
                      e);
        }
        free(e);
    }
    int rc = ts_run((char *[]){ts_djinn, "serve", "/nonexistent.bin", "--cpu", NULL}, NULL, out, err);
    cr_assert_eq(rc, 1);
    ts_teardown(&t);
}

// The request head's parser alone (http.c): a head is taken whole, with what it says; a request line or a header
// line ended by a bare CR, or anything else malformed, is refused with its status; a prefix of a head is "not yet".
Test(http, head_parse) {
    http_req r;
    int st = 0;
    const char *why = NULL;
    const char ok[] = "POST /v1/completions?x=1 HTTP/1.1\r\nContent-Length: 12\r\nConnection: close\r\n"
                      "Authorization:  Bearer k \r\nExpect: 100-continue\r\n\r\n{\"prompt\": 1}";
    cr_assert_eq(http_parse_head(ok, sizeof ok - 1, 100, &r, &st, &why), 1, "%s", why);
    cr_expect_str_eq(r.method, "POST");
    cr_expect_str_eq(r.path, "/v1/completions");
    cr_expect_str_eq(r.authorization, "Bearer k");
    cr_expect(r.minor == 1 && r.content_length == 12 && !r.keep_alive && r.expect_continue);
    cr_expect_eq(r.head_len, sizeof ok - 1 - 13);
    for (size_t n = 0; n < r.head_len; n++)
        cr_expect_eq(http_parse_head(ok, n, 100, &r, &st, &why), 0, "a prefix of %zu bytes", n);
    cr_expect_eq(http_parse_head(ok, sizeof ok - 1, 11, &r, &st, &why), -1);
    cr_expect_eq(st, 413);
    static const struct { const char *head; int status; } bad[] = {
        {"GET / HTTP/1.1\rXA: b\r\n\r\n", 400},         // the request line ended by a bare CR
        {"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n", 400},     // a header line with a bare CR
        {"GET / HTTP/1.1\r\n a: b\r\n\r\n", 400},        // a folded header line
        {"get / HTTP/1.1\r\n\r\n", 400},
        {"GET x HTTP/1.1\r\n\r\n", 400},
        {"GET / HTTP/2.0\r\n\r\n", 505},
        {"GET / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
        {"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        st = 0, why = NULL;
        cr_expect_eq(http_parse_head(bad[i].head, strlen(bad[i].head), 100, &r, &st, &why), -1, "%s", bad[i].head);
        cr_expect(st == bad[i].status && why && why[0], "%s: status %d, want %d", bad[i].head, st, bad[i].status);
    }
}

// ---- hostile clients: none can stall, starve or read another
// One request's answer on a connection of its own whose client, having sent it, shuts its side down (SHUT_WR: no
// more requests): everything the server sends until it closes.
static char *ts_half_closed(int port, const char *req, size_t n) {
    int fd = ts_connect(port);
    cr_assert(fd >= 0);
    ts_send(fd, req, n);
    cr_assert(!shutdown(fd, SHUT_WR));
    char *got = ts_read_all(fd, NULL);
    close(fd);
    return got;
}

// How many times `what` occurs in s.
static size_t ts_count(const char *s, const char *what) {
    size_t k = 0;
    for (const char *at = s; (at = strstr(at, what)); at += strlen(what)) k++;
    return k;
}

// A client that half-closes (the request, then shutdown(SHUT_WR), as `nc -N` does) gets every answer it is owed,
// then the end of the connection: a request with "Connection: close", two pipelined ones on a kept-alive connection,
// a completion and a streamed completion (the same text as the command line's).
Test(server, half_closed_clients_get_their_answers) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    const char one[] = "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
    char *got = ts_half_closed(s.port, one, sizeof one - 1);
    cr_assert(!strncmp(got, "HTTP/1.1 200", 12) && strstr(got, "{\"status\":\"ok\"}"), "%s", got);
    free(got);
    const char two[] = "GET /health HTTP/1.1\r\n\r\nGET /v1/models HTTP/1.1\r\n\r\n";
    got = ts_half_closed(s.port, two, sizeof two - 1);
    cr_assert(ts_count(got, "HTTP/1.1 200") == 2 && strstr(got, "{\"status\":\"ok\"}") &&
              strstr(got, "\"object\":\"list\""), "%s", got);
    free(got);
    char *want = ts_cli(&t, "Once upon a time", 20, "0", NULL);
    for (int stream = 0; stream < 2; stream++) {
        char *body = ts_completion_body("Once upon a time", 20, stream ? "\"temperature\":0,\"stream\":true"
                                                                       : "\"temperature\":0");
        char req[1024];
        int k = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s",
                         strlen(body), body);
        ts_resp r = {.raw = ts_half_closed(s.port, req, (size_t)k)};
        ts_resp_parse(&r);
        char *text = ts_text(&r, 0, stream, NULL, 0);
        cr_assert_str_eq(text, want, "stream %d", stream);
        free(text), free(r.raw), free(body);
    }
    free(want);
    ts_stop(&s);
    ts_teardown(&t);
}

// A flood on one connection: a completion and, in the same write, 4 MB of pipelined GET /health (the last one
// "Connection: close"), its answers read by a thread of their own.
typedef struct {
    int fd;
    size_t n_health;      // pipelined after the completion
    size_t answers;       // "HTTP/1.1 200" seen once the server closed
    volatile int answered_completion;
    int ok;
} ts_flood;

static void *ts_flood_send(void *arg) {
    ts_flood *f = arg;
    char *body = ts_completion_body("Once upon a time", 60, "\"temperature\":0");
    dj_buf b = {0};
    buf_fmt(&b, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
    for (size_t i = 0; i + 1 < f->n_health; i++) buf_str(&b, "GET /health HTTP/1.1\r\n\r\n");
    buf_str(&b, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
    f->ok = !b.oom && !ts_send_all(f->fd, b.p, b.n);
    buf_free(&b), free(body);
    return NULL;
}

static void *ts_flood_read(void *arg) {
    ts_flood *f = arg;
    size_t cap = 1 << 20, n = 0, tail = 0;  // only the last bytes are kept: an answer may straddle two reads
    char *buf = malloc(cap + 1);
    for (;;) {
        ssize_t got = recv(f->fd, buf + tail, cap - tail, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n = tail + (size_t)got, buf[n] = 0;
        if (strstr(buf, "\"text_completion\"")) f->answered_completion = 1;
        f->answers += ts_count(buf, "HTTP/1.1 200");
        tail = n < 16 ? n : 16;  // "HTTP/1.1 200" is 12 bytes: a straddling one is whole in the next window
        f->answers -= ts_count(buf + n - tail, "HTTP/1.1 200");
        memmove(buf, buf + n - tail, tail);
    }
    buf[tail] = 0;
    f->answers += ts_count(buf, "HTTP/1.1 200");
    free(buf);
    return NULL;
}

// The flood's connection is answered at most SRV_REQS_TURN requests a turn, its input consumed with an offset and
// read no further while its next requests wait, so that other clients are answered meanwhile and the server holds
// about one read of it (before: the 4 MB answered in one pass that moved the rest of the input down after each
// request, holding everyone up for over a minute). Every pipelined request is answered, in one stream.
Test(server, pipelined_flood_does_not_stall_others) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    ts_flood f = {.fd = ts_connect(s.port), .n_health = ((size_t)4 << 20) / 24};
    cr_assert(f.fd >= 0);
    pthread_t snd, rcv;
    pthread_create(&snd, NULL, ts_flood_send, &f);
    pthread_create(&rcv, NULL, ts_flood_read, &f);
    for (double t0 = dj_now(); !f.answered_completion && dj_now() - t0 < TS_WAIT_S; usleep(1000)) {}
    cr_assert(f.answered_completion, "the flood's completion was not answered");
    // the pipelined requests are now answered: others are served beside them
    double held_max = 0;
    for (int i = 0; i < 20; i++) {
        ts_resp r = ts_http(s.port, "GET", "/health", NULL, NULL);
        cr_assert_eq(r.status, 200, "a client beside the flood: %s", r.raw);
        free(r.raw);
        held_max = fmax(held_max, ts_metric(&s, "buffered_bytes"));
    }
    pthread_join(snd, NULL);
    pthread_join(rcv, NULL);
    close(f.fd);
    cr_assert(f.ok, "sending the flood failed");
    cr_assert_eq(f.answers, f.n_health + 1, "%zu answers to %zu requests", f.answers, f.n_health + 1);
    // what the server holds of the flood's input: one turn's reads at most (1 MB and a read), far from its 4 MB
    cr_assert_lt(held_max, 3e6, "the server held %g bytes of requests", held_max);
    cr_assert_lt(ts_metric(&s, "buffered_bytes"), 1000, "the flood's bytes are still held");
    ts_stop(&s);
    ts_teardown(&t);
}

// Refusals that the head decides (no key or a wrong one, no such endpoint, the wrong method) come before the body is
// read: a client announcing 8 MB and sending none gets its answer at once, not 408 after --timeout (before: the key,
// route and method were checked once the whole body had arrived). Past --buffer-mb of requests held for all
// connections, nothing more is read and a new connection gets 503; once the holders leave, clients are served.
Test(server, refused_from_the_head_and_bounded_in_all) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model,
             (const char *[]){"--api-key", "k", "--buffer-mb", "2", "--timeout", "20", "--client-share", "1", NULL});
    static const struct {
        const char *head;
        int status;
        const char *msg;
    } cases[] = {
        {"POST /v1/completions HTTP/1.1\r\nContent-Length: 8000000\r\n\r\n", 401, "API key"},
        {"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer x\r\nContent-Length: 8000000\r\n\r\n", 401, "API key"},
        {"POST /v1/nothing HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 8000000\r\n\r\n", 404, "no such"},
        {"GET /v1/completions HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 8000000\r\n\r\n", 405, "use POST"},
        {"PUT /v1/sessions/a/park HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 8000000\r\n\r\n", 405,
         "use POST"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ts_resp r = ts_raw(s.port, cases[i].head, strlen(cases[i].head));  // the head, then silence
        ts_expect_error(&r, cases[i].status, cases[i].msg, NULL);
        free(r.raw);
    }
    // two clients with the key send most of 8 MB bodies and hold them: past 2 MB the server reads no more, and a new
    // connection hears why
    const char head[] = "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 8000000\r\n\r\n";
    char *part = malloc(1500000);
    memset(part, ' ', 1500000);
    int hold[2];
    for (int i = 0; i < 2; i++) {
        hold[i] = ts_connect(s.port);
        cr_assert(hold[i] >= 0);
        ts_send(hold[i], head, sizeof head - 1);
        ts_send(hold[i], part, 1500000);  // the sockets' buffers take what the server does not read
    }
    free(part);
    ts_resp r = {0};
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(10000)) {
        r = ts_http(s.port, "GET", "/health", NULL, NULL);
        if (r.status == 503) break;
        free(r.raw), r.raw = NULL;
    }
    cr_assert(r.raw, "the server went on taking connections past --buffer-mb");
    ts_expect_error(&r, 503, "holds as much of its clients' data as it may", NULL);
    free(r.raw);
    close(hold[0]), close(hold[1]);  // their requests can never be whole: the server lets them go at once
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(10000)) {
        r = ts_http(s.port, "GET", "/v1/models", "Authorization: Bearer k\r\n", NULL);
        if (r.status == 200) break;
        free(r.raw), r.raw = NULL;
    }
    cr_assert(r.raw, "the server did not serve again once the holders left");
    free(r.raw);
    ts_stop(&s);
    ts_teardown(&t);
}

// One kept-alive GET /health on fd, answered 200 (the connection is then accepted and counted).
static void ts_health_kept(int fd) {
    const char req[] = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    ts_send(fd, req, sizeof req - 1);
    char buf[1024] = {0};
    for (size_t n = 0; !strstr(buf, "{\"status\":\"ok\"}") && n < sizeof buf - 1;) {
        ssize_t got = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        cr_assert(got > 0, "no answer to a kept-alive /health: %s", buf);
        n += (size_t)got;
    }
    cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "%s", buf);
}

// --client-share: one address holds at most its share of --max-conns (a quarter of 8: 2, closing ones counted), so
// that it cannot take every place. Its third connection gets 503 naming the bound, while another address
// (127.0.0.2) is served; once one of its connections closes, it is served again.
Test(server, one_address_holds_its_share_of_connections) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--max-conns", "8", "--client-share", "0.25", NULL});
    int fd[2];
    for (int i = 0; i < 2; i++) {
        fd[i] = ts_connect(s.port);
        cr_assert(fd[i] >= 0);
        ts_health_kept(fd[i]);
    }
    ts_resp r = ts_http(s.port, "GET", "/health", NULL, NULL);
    ts_expect_error(&r, 503, "too many connections from this address (--client-share)", NULL);
    cr_assert(strstr(r.raw, "Connection: close"), "%s", r.raw);
    free(r.raw);
    r = ts_http_src("127.0.0.2", s.port, "GET", "/health", NULL, NULL);
    cr_assert_eq(r.status, 200, "another address was not served: %s", r.raw);
    free(r.raw);
    char *body = ts_completion_body("Once upon a time", 4, NULL);
    r = ts_http_src("127.0.0.2", s.port, "POST", "/v1/completions", NULL, body);
    cr_assert_eq(r.status, 200, "another address's completion: %s", r.raw);
    free(r.raw), free(body);
    r = ts_http_src("127.0.0.2", s.port, "GET", "/metrics", NULL, NULL);  // the refusal counted in the errors
    cr_assert(r.status == 200 && strstr(r.body, "\ndjinn_errors_total 1\n"), "%s", r.raw);
    free(r.raw);
    close(fd[0]);
    ts_served_again(s.port);
    for (int i = 3; i < 3 + 2 * 8; i++) {  // more addresses, one after another, than --max-conns: slots are freed
        char src[32];
        snprintf(src, sizeof src, "127.0.0.%d", i);
        r = ts_http_src(src, s.port, "GET", "/health", NULL, NULL);
        cr_assert_eq(r.status, 200, "%s: %s", src, r.raw);
        free(r.raw);
    }
    close(fd[1]);
    ts_stop(&s);
    ts_teardown(&t);
}

// --client-share of --buffer-mb: one address sending a large body and holding it unfinished is read up to its share
// (half of 1 MB) and no further, so the server's buffer keeps room: another address's request is answered at once
// (before: the holder filled all of --buffer-mb and every new connection got 503 until --timeout).
Test(server, one_address_holds_its_share_of_the_buffer) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--buffer-mb", "1", "--client-share", "0.5", "--timeout", "20", NULL});
    const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 4000000\r\n\r\n";
    const size_t part = 1500000;
    char *fill = malloc(part);
    memset(fill, ' ', part);
    int hold = ts_connect(s.port);
    cr_assert(hold >= 0);
    ts_send(hold, head, sizeof head - 1);
    ts_send(hold, fill, part);  // the sockets' buffers take what the server does not read
    free(fill);
    double held = 0;  // the holder's share read, seen from the other address
    for (double t0 = dj_now(); held < 500000 && dj_now() - t0 < TS_WAIT_S; usleep(10000)) {
        ts_resp r = ts_http_src("127.0.0.2", s.port, "GET", "/metrics", NULL, NULL);
        cr_assert_eq(r.status, 200, "another address's /metrics: %s", r.raw);
        const char *at = strstr(r.body, "\ndjinn_buffered_bytes ");
        cr_assert(at, "%s", r.body);
        held = atof(at + strlen("\ndjinn_buffered_bytes "));
        free(r.raw);
    }
    cr_assert(held >= 500000 && held < 1000000, "the holder's bytes read: %g (its share: 500000 and a read)", held);
    char *body = ts_completion_body("Once upon a time", 4, NULL);
    ts_resp r = ts_http_src("127.0.0.2", s.port, "POST", "/v1/completions", NULL, body);
    cr_assert_eq(r.status, 200, "another address's completion beside the holder: %s", r.raw);
    free(r.raw), free(body);
    close(hold);
    ts_stop(&s);
    ts_teardown(&t);
}

// The lowest descriptor number the process has free (/proc/PID/fd): what its next open or accept would get.
static int ts_lowest_free_fd(pid_t pid) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    for (int fd = 0;; fd++) {
        char path[96];
        snprintf(path, sizeof path, "%s/%d", dir, fd);
        struct stat st;
        if (lstat(path, &st)) return fd;
    }
}

// Descriptors. Under a hard limit of 128 the server says it lowers --max-conns 256 to what fits (128 less its own
// 64 and the 32 it may refuse at once). Then, its soft limit lowered from outside to the descriptors it has open,
// a new client's connection is taken and closed at once (a spare descriptor given up for it), not left pending
// while accept fails and the listening socket keeps poll awake (before: 100% CPU and no answer). With the limit
// back, it serves as before and counts the connection it shed.
Test(server, out_of_descriptors) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_nofile = 128;
    ts_start(&s, &t, t.model, (const char *[]){"--max-conns", "256", NULL});
    ts_nofile = 0;
    char *err = tc_read(s.err, NULL);
    cr_assert(err && strstr(err, "--max-conns 256 lowered to 32: the descriptor limit (ulimit -n) is 128"), "%s", err);
    free(err);
    cr_assert_eq(ts_metric(&s, "connections_shed_total"), 0);
    int idle = ts_connect(s.port);  // an idle client's connection: taken before the limit, kept after it
    ts_await_metric(&s, "connections", 2);
    // the answered connections close once their clients' ends are read (a closing connection drains first): the
    // lowest free descriptor settles (the same for 200 ms) before the limit is set to it
    int lowest = ts_lowest_free_fd(s.pid), same = 0;
    for (double t0 = dj_now(); same < 10 && dj_now() - t0 < TS_WAIT_S; usleep(20000)) {
        const int now = ts_lowest_free_fd(s.pid);
        same = now == lowest ? same + 1 : 0, lowest = now;
    }
    cr_assert_eq(same, 10, "the server's descriptors did not settle");
    struct rlimit low = {(rlim_t)lowest, 128}, back = {128, 128};
    cr_assert(!prlimit(s.pid, RLIMIT_NOFILE, &low, NULL), "prlimit: %s", strerror(errno));
    int fd = ts_connect(s.port);
    cr_assert(fd >= 0);
    char c;
    ssize_t got = recv(fd, &c, 1, 0);
    int e = errno;
    cr_assert(got == 0 || (got < 0 && e == ECONNRESET), "the connection was not shed: recv %zd (%s)", got,
              got < 0 ? strerror(e) : "a byte");
    close(fd);
    cr_assert(!prlimit(s.pid, RLIMIT_NOFILE, &back, NULL), "prlimit: %s", strerror(errno));
    cr_assert_geq(ts_metric(&s, "connections_shed_total"), 1);
    ts_resp r = ts_http(s.port, "GET", "/health", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    free(r.raw);
    close(idle);
    ts_stop(&s);
    ts_teardown(&t);
}

// A token that decodes to no bytes before anything is held back (a byte-fallback piece at a high temperature) with
// stop strings: the hold-back neither moves nor searches a NULL buffer (the sanitized build aborted on it).
Test(server, stop_strings_beside_tokens_of_no_bytes) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.model, NULL);
    for (int seed = 0; seed < 4; seed++) {
        char body[200];
        snprintf(body, sizeof body, "{\"prompt\":\"hi\",\"max_tokens\":%d,\"temperature\":1000,\"seed\":%d%s}",
                 seed ? 8 : 1, seed, seed & 1 ? ",\"stop\":[\"zz\"]" : "");
        ts_resp r = ts_post(s.port, "/v1/completions", body);
        cr_assert_eq(r.status, 200, "%s: %s", body, r.raw);
        free(r.raw);
    }
    ts_stop(&s);
    ts_teardown(&t);
}

// A request on the tenant of `key`: its status, and its usage's cached tokens (-1: none said) and text (malloc'd).
static int ts_as(const ts_srv *s, const char *key, const char *method, const char *path, const char *body,
                 int64_t *cached, char **text) {
    char h[200];
    snprintf(h, sizeof h, "Authorization: Bearer %s\r\n", key);
    ts_resp r = ts_http(s->port, method, path, h, body);
    const char *c = strstr(r.body, "\"cached_tokens\":");
    if (cached) *cached = c ? atoll(c + 16) : -1;
    if (text) *text = r.status == 200 ? ts_text(&r, 0, 0, NULL, 0) : NULL;
    int st = r.status;
    free(r.raw);
    return st;
}

// Tenants: keys from --api-key and --api-key-file (a CRLF line, a blank one). What one tenant's requests leave in
// the server (a prompt's cache in a slot, a session, its parked cache, a paused breakpoint) is found only by the
// same tenant's: another's identical prompt is prefilled whole (before: its cached_tokens told how much of the
// prompt another client had sent), another's same session name is another session, another's park, delete or
// resume of it is not found. The Bearer scheme is taken in any case.
Test(server, tenants_see_only_their_own) {
    ts_env t;
    ts_setup(&t);
    char keyfile[400];
    snprintf(keyfile, sizeof keyfile, "%s/keys.txt", t.dir);
    tc_write(keyfile, "bob-key\r\n\ncarol-key\n", 20);
    ts_srv s;
    ts_start(&s, &t, t.model, (const char *[]){"--api-key", "alice-key", "--api-key-file", keyfile, NULL});
    const char *P = "Once upon a time there was a little girl named Lily. She loved to play in the park";
    const char *Q = "The little dog ran to the park with his friend Tom, and they played all day in the sun";
    char *body = ts_completion_body(P, 10, "\"temperature\":0");
    int64_t ca, cb, ca2;
    char *ta, *tb, *ta2;
    cr_assert_eq(ts_as(&s, "alice-key", "POST", "/v1/completions", body, &ca, &ta), 200);
    cr_assert_eq(ts_as(&s, "bob-key", "POST", "/v1/completions", body, &cb, &tb), 200);
    cr_assert_eq(ts_as(&s, "alice-key", "POST", "/v1/completions", body, &ca2, &ta2), 200);
    cr_assert_str_eq(ta, tb, "the same greedy answer for both");
    cr_assert_eq(cb, 0, "bob's prompt found %ld tokens of alice's cached", (long)cb);
    cr_assert_gt(ca2, 10, "alice's own prefix was not reused (%ld cached)", (long)ca2);
    free(body), free(ta), free(tb), free(ta2);
    // sessions: alice's "s", parked; bob can neither park nor delete it, and his "s" is his own
    char *b1 = ts_completion_body(Q, 10, "\"temperature\":0,\"session\":\"s\"");
    cr_assert_eq(ts_as(&s, "alice-key", "POST", "/v1/completions", b1, NULL, &ta), 200);
    cr_assert_eq(ts_as(&s, "bob-key", "POST", "/v1/sessions/s/park", NULL, NULL, NULL), 404);
    cr_assert_eq(ts_as(&s, "bob-key", "DELETE", "/v1/sessions/s", NULL, NULL, NULL), 404);
    cr_assert_eq(ts_as(&s, "bob-key", "DELETE", "/v1/sessions/park", NULL, NULL, NULL), 404);  // a name, not a verb
    cr_assert_eq(ts_as(&s, "alice-key", "POST", "/v1/sessions/s/park", NULL, NULL, NULL), 200);
    char p2[1024];
    snprintf(p2, sizeof p2, "%s%s Then", Q, ta);
    char *b2 = ts_completion_body(p2, 10, "\"temperature\":0,\"session\":\"s\"");
    cr_assert_eq(ts_as(&s, "bob-key", "POST", "/v1/completions", b2, &cb, &tb), 200);
    cr_assert_eq(cb, 0, "bob's session 's' found %ld tokens of alice's", (long)cb);
    cr_assert_eq(ts_as(&s, "alice-key", "POST", "/v1/completions", b2, &ca, &ta2), 200);
    cr_assert_gt(ca, 10, "alice's session lost its parked cache (%ld cached)", (long)ca);
    cr_assert_str_eq(ta2, tb);
    free(b1), free(b2), free(ta), free(tb), free(ta2);
    // a paused breakpoint: resumed by its own tenant only
    char *bb = ts_completion_body(P, 10, "\"temperature\":0,\"break_after_layer\":2");
    ts_brk k = ts_break_h(&s, "/v1/completions", "Authorization: Bearer alice-key\r\n", bb);
    char *rb = ts_resume_body(&k, k.rows, "\"temperature\":0,\"max_tokens\":10");
    char h[100];
    snprintf(h, sizeof h, "Authorization: Bearer bob-key\r\n");
    ts_resp r = ts_http(s.port, "POST", "/v1/completions", h, rb);
    ts_expect_error(&r, 404, "no paused state", NULL);
    free(r.raw);
    cr_assert_eq(ts_as(&s, "alice-key", "POST", "/v1/completions", rb, NULL, &ta), 200);
    free(ta), free(bb), free(rb), free(k.rows);
    // the scheme in any case, spaces before the key; a key's prefix, another scheme, none at all: refused
    static const struct {
        const char *h;
        int status;
    } auth[] = {{"authorization: BEARER carol-key\r\n", 200}, {"Authorization: bearer   carol-key\r\n", 200},
                {"Authorization: Bearer carol-ke\r\n", 401},   {"Authorization: Bearer carol-keyy\r\n", 401},
                {"Authorization: Basic carol-key\r\n", 401},   {"Authorization: carol-key\r\n", 401},
                {"Authorization: Bearer \r\n", 401}};
    for (size_t i = 0; i < sizeof auth / sizeof *auth; i++) {
        r = ts_http(s.port, "GET", "/v1/models", auth[i].h, NULL);
        cr_assert_eq(r.status, auth[i].status, "%s: %s", auth[i].h, r.raw);
        free(r.raw);
    }
    ts_stop(&s);
    ts_teardown(&t);
}

// The port is taken before the model is loaded: while it loads, /health answers 503 {"status":"loading"} and every
// other endpoint 503 (a client can wait for it), and a port already in use is said at once, before any load
// (before: "Address already in use" came after the whole load). The load here waits for a byte from the test
// (DJINN_TEST_LOAD_GATE_FD), so what the loading server says is asked while it is certainly loading.
Test(server, port_first_then_the_model) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    int gate[2];
    cr_assert(!pipe(gate));
    ts_gate = gate[0];
    ts_start(&s, &t, t.model, NULL);
    ts_gate = -1;
    close(gate[0]);
    ts_resp r = ts_http(s.port, "GET", "/health", NULL, NULL);
    cr_assert(r.status == 503 && strstr(r.body, "{\"status\":\"loading\"}"), "%s", r.raw);
    free(r.raw);
    char *body = ts_completion_body("Once upon a time", 8, "\"temperature\":0");
    r = ts_post(s.port, "/v1/completions", body);
    ts_expect_error(&r, 503, "still loading", NULL);
    free(r.raw);
    r = ts_http(s.port, "GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 503, "%s", r.raw);
    free(r.raw);
    char *err = tc_read(s.err, NULL);
    cr_assert(err && !strstr(err, "loading:") && !strstr(err, "engine"), "the model loaded before the gate: %s", err);
    free(err);
    // a second server on the same port: refused before it loads anything
    char port[16], out[400], errp[400];
    snprintf(port, sizeof port, "%d", s.port);
    snprintf(out, sizeof out, "%s/busy.out", t.dir);
    snprintf(errp, sizeof errp, "%s/busy.err", t.dir);
    int rc = ts_run((char *[]){ts_djinn, "serve", t.model, "--cpu", "--port", port, NULL}, NULL, out, errp);
    err = tc_must_read(errp, NULL);
    cr_assert(rc == 1 && strstr(err, "cannot listen on 127.0.0.1") && !strstr(err, "loading:"), "exit %d: %s", rc, err);
    free(err);
    cr_assert_eq(write(gate[1], "g", 1), 1);
    close(gate[1]);
    for (double t0 = dj_now(); dj_now() - t0 < TS_WAIT_S; usleep(10000)) {
        r = ts_http(s.port, "GET", "/health", NULL, NULL);
        if (r.status == 200) break;
        free(r.raw), r.raw = NULL;
    }
    cr_assert(r.raw, "the server did not finish loading");
    free(r.raw);
    char *want = ts_cli(&t, "Once upon a time", 8, "0", NULL), *got = ts_complete(&s, "Once upon a time", 8,
                                                                                  "\"temperature\":0", 0, NULL);
    cr_assert_str_eq(got, want);
    free(want), free(got), free(body);
    ts_stop(&s);
    ts_teardown(&t);
}

// ---- what OpenAI's clients send beyond the basics: each honored, never silently dropped. The answer's limit under
// its newer name on both endpoints (and llama.cpp's n_predict), a developer message, text parts, GET /v1/models/ID.
Test(server, what_clients_send) {
    ts_env t;
    ts_setup(&t);
    ts_srv s;
    ts_start(&s, &t, t.chat, NULL);
    static const struct {
        const char *path, *body;
    } limited[] = {
        {"/v1/completions", "{\"prompt\": \"Once upon a time\", \"temperature\": 0, \"max_completion_tokens\": 5}"},
        {"/v1/completions", "{\"prompt\": \"Once upon a time\", \"temperature\": 0, \"n_predict\": 5}"},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, {\"role\": "
                                 "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"Tell me\"}, {\"type\": "
                                 "\"text\", \"text\": \" a story\"}]}], \"temperature\": 0, \"max_tokens\": 5, "
                                 "\"max_completion_tokens\": null, \"metadata\": {\"a\": \"b\"}, \"store\": false}"},
    };
    for (size_t i = 0; i < sizeof limited / sizeof *limited; i++) {
        ts_resp r = ts_post(s.port, limited[i].path, limited[i].body);
        cr_assert_eq(r.status, 200, "%s: %s", limited[i].body, r.raw);
        cr_assert(strstr(r.body, "\"completion_tokens\":5,") && strstr(r.body, "\"finish_reason\":\"length\""),
                  "%s: not limited to 5 tokens: %s", limited[i].body, r.body);
        free(r.raw);
    }
    ts_resp r = ts_http(s.port, "GET", "/v1/models/chat.bin", NULL, NULL);
    cr_assert_eq(r.status, 200, "%s", r.raw);
    const char *model = "{\"id\":\"chat.bin\",\"object\":\"model\",";  // the object itself, not a list
    cr_assert(!strncmp(r.body, model, strlen(model)), "%s", r.body);
    free(r.raw);
    r = ts_http(s.port, "GET", "/v1/models/gpt-4o", NULL, NULL);
    ts_expect_error(&r, 404, "no model 'gpt-4o'", "model");
    free(r.raw);
    r = ts_http(s.port, "POST", "/v1/models/chat.bin", NULL, "{}");
    ts_expect_error(&r, 405, "use GET", NULL);
    free(r.raw);
    ts_stop(&s);
    ts_teardown(&t);
}
