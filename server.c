// server.c: `djinn serve`: OpenAI's completions and chat completions (api.h) over HTTP/1.1 (http.h), one thread,
// one engine. A poll() loop serves every connection between scheduler turns (batch.h): requests are read, checked
// and queued; each turn admits queued requests into free KV slots, prefills a chunk of prompts and advances every
// running sequence one token in one batched step, and what the turn produced goes out at once. Nothing here blocks:
// sockets are non-blocking, every read and buffer has a bound, every connection a deadline.
#include "server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "batch.h"
#include "buf.h"
#include "chat.h"
#include "engine.h"
#include "fileio.h"
#include "gpu_host.h"
#include "http.h"
#include "keys.h"
#include "kvsize.h"
#include "kvtype.h"
#include "loader.h"
#include "pool.h"
#include "tokenizer.h"
#include "tp.h"

#define SRV_BODY_MAX ((size_t)8 << 20)   // a request body; more is refused (413)
#define SRV_OUT_MAX ((size_t)16 << 20)   // unsent output: a client that stops reading is dropped past it
#define SRV_OUT_PAUSE ((size_t)1 << 20)  // unsent output past which a connection's next requests wait
#define SRV_REJECT_MAX 32                // connections over --max-conns answered 503 at once; more are closed
#define SRV_READ_TURN ((size_t)1 << 20)  // bytes read from one connection in one turn
#define SRV_REQS_TURN 32                 // requests answered on one connection in one turn; the rest wait a turn
#define SRV_DRAIN_S 2.0                  // a closing connection reads (and drops) the client's bytes this long at most
#define SRV_FDS_OWN 64                   // descriptors the server needs besides its connections'
#define SRV_DEFAULT_BUFFER_MB 256
#define SRV_DEFAULT_CLIENT_SHARE 0.25
#define SRV_DEFAULT_CTX 8192  // the default context's cap: room for many slots where a model's is 128k
#define SRV_DEFAULT_PAUSED 16

static volatile sig_atomic_t srv_stop;
static void srv_on_signal(int sig) {
    (void)sig;
    srv_stop = 1, dj_load_cancel = 1;  // a model still loading stops within a chunk
}

// ---- options
typedef struct {
    const char *model, *host, *chat_template;
    dj_keys keys;            // none: every client one tenant, no key asked
    int port, force_cpu, threads, quiet, stream_all, kv_type;
    double ring_gb, kv_gb, park_gb, timeout_s, cpu_share, buffer_mb;  // kv_gb 0, park_gb < 0: from the memory
    double client_share;     // of --max-conns and --buffer-mb, what one client address may hold
    int64_t ctx, prefill_chunk;
    int32_t parallel, sessions, max_conns, breakpoints;
    int n_gpus, gpus[TP_MAX_GPUS];  // --gpus (0: one GPU, device 0)
} srv_opts;

static void srv_usage(FILE *f) {
    fprintf(f,
            "usage: djinn serve MODEL.bin [options]      (llama-server's -m/--model, --ctx-size, -np and -ngl work too)\n"
            "  --host ADDR          listen address (127.0.0.1; 0.0.0.0 for every interface)\n"
            "  --port N             TCP port (8080; 0: any free one, printed on stderr)\n"
            "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/* and /metrics (none); may be given\n"
            "                       several times: each key a tenant, whose sessions, paused breakpoints and cached\n"
            "                       prompts no other key's requests can reach\n"
            "  --api-key-file FILE  keys one a line, each a tenant (with --api-key too)\n"
            "  --chat-template llama2|llama3|FILE  /v1/chat/completions in this template, not the model's own\n"
            "  -c N                 context: positions per KV slot (the model's, at most %d, and at most what\n"
            "                       --kv-gb holds in one slot)\n"
            "  --kv-type T          the KV cache's elements: " DJ_KV_NAMES " (%s)\n"
            "  --kv-gb G            memory for KV slots, in GB: slots = G / (context x bytes a position), at most\n"
            "                       %d (a quarter of the GPU's memory; on the CPU of the host's available memory)\n"
            "  --parallel N         most sequences decoded together in one step (half the slots, the other half\n"
            "                       for idle sessions' caches; at least 1, at most %d)\n"
            "  --park-gb G          host memory for parked sessions' caches, in GB (half the host's available\n"
            "                       memory once the model is loaded)\n"
            "  --sessions N         sessions remembered (256); the least recently used idle one goes\n"
            "  --breakpoints N      paused breakpoints held (%d; 0: none taken); past it the oldest goes\n"
            "  --prefill-chunk N    most prompt tokens prefilled between two decode steps (256)\n"
            "  --max-conns N        open connections (256; lowered to what the descriptor limit allows); more get 503\n"
            "  --buffer-mb N        memory for all connections' requests being read, in MB (%d); past it nothing\n"
            "                       more is read (a request waits, up to --timeout) and new connections get 503\n"
            "  --client-share F     what one client address may hold of --max-conns and --buffer-mb (%g): past its\n"
            "                       connections 503, past its bytes its connections are not read (its request\n"
            "                       waits, up to --timeout); 1 behind a reverse proxy (every client its address)\n"
            "  --timeout S          seconds a request may take to arrive, an idle connection stays open and a\n"
            "                       client may leave output unread (60)\n"
            "  --ring-gb G          GPU memory for weights, in GB (as djinn's; per GPU)\n"
            "  --gpus N|IDS         several GPUs, each holding its part of every layer (as djinn's; default: every\n"
            "                       visible GPU the model splits over)\n"
            "  --cpu-share F|auto   fraction of each streamed layer's rows the CPU computes, in steps of any number\n"
            "                       of sequences (auto)\n"
            "  --threads N          CPU threads (the CPUs in the affinity mask)\n"
            "  --cpu                run on the CPU even with a GPU present\n"
            "  --stream-all         ablation (tests): keep no layer resident on the GPU, stream every layer\n"
            "  -q                   no line per request on stderr\n"
            "bounds: a request head 16 KB, a body 8 MB, %d requests of a connection answered a turn, its unsent\n"
            "  output 16 MB (reading pauses past 1 MB)\n"
            "endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics,\n"
            "  POST /v1/sessions/NAME/park, DELETE /v1/sessions/NAME; request fields beyond OpenAI's: session, park,\n"
            "  break_after_layer, resume, and llama.cpp's top_k, min_p, repeat_penalty, repeat_last_n, n_predict,\n"
            "  ignore_eos (docs/serving.md)\n",
            SRV_DEFAULT_CTX, dj_kv_name(DJ_KV_DEFAULT), KV_SLOTS_MAX, KV_PARALLEL_MAX, SRV_DEFAULT_PAUSED,
            SRV_DEFAULT_BUFFER_MB, SRV_DEFAULT_CLIENT_SHARE, SRV_REQS_TURN);
}

static int srv_bad_usage(const char *what, const char *arg) {
    fprintf(stderr, "djinn serve: %s%s%s%s (see djinn serve --help)\n", what, arg ? " '" : "", arg ? arg : "",
            arg ? "'" : "");
    return 2;
}

static int srv_no_value(const char *flag) {  // djinn's own words for it
    fprintf(stderr, "djinn serve: option '%s' needs a value (see djinn serve --help)\n", flag);
    return 2;
}

// llama-server's spellings of the same options: the name the server parses them under.
static const char *srv_canonical(const char *a) {
    static const char *const alias[][2] = {{"--model", "-m"},     {"--ctx-size", "-c"},  {"-np", "--parallel"},
                                           {"--n-gpu-layers", "-ngl"}, {"--gpu-layers", "-ngl"}};
    for (size_t k = 0; k < sizeof alias / sizeof *alias; k++)
        if (!strcmp(a, alias[k][0])) return alias[k][1];
    return a;
}

// A number within [lo, hi], or a usage error naming the flag.
static int srv_num(const char *flag, const char *v, double lo, double hi, int integer, double *out) {
    if (!v) return srv_no_value(flag);
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !(d >= lo && d <= hi) || (integer && d != floor(d))) {
        char what[160];
        snprintf(what, sizeof what, "%s wants %s from %g to %g", flag, integer ? "an integer" : "a number", lo, hi);
        return srv_bad_usage(what, v);
    }
    *out = d;
    return 0;
}

// A share in (0, 1], or a usage error naming the flag (none held is no share).
static int srv_share(const char *flag, const char *v, double *out) {
    int rc = srv_num(flag, v, 0, 1, 0, out);
    if (rc || *out > 0) return rc;
    char what[160];
    snprintf(what, sizeof what, "%s wants a number above 0, not", flag);
    return srv_bad_usage(what, v);
}

static int srv_parse(int argc, char **argv, srv_opts *o) {
    *o = (srv_opts){.host = "127.0.0.1", .port = 8080, .park_gb = -1, .timeout_s = 60, .prefill_chunk = 256,
                    .sessions = 256, .max_conns = 256, .cpu_share = -1, .breakpoints = SRV_DEFAULT_PAUSED,
                    .buffer_mb = SRV_DEFAULT_BUFFER_MB, .client_share = SRV_DEFAULT_CLIENT_SHARE,
                    .kv_type = DJ_KV_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = srv_canonical(argv[i]);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            srv_usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--cpu") || !strcmp(a, "-q") || !strcmp(a, "--stream-all")) {
            *(a[1] == 'q' ? &o->quiet : a[2] == 'c' ? &o->force_cpu : &o->stream_all) = 1;
            continue;
        }
        if (a[0] != '-') {
            if (o->model) return srv_bad_usage("a second model path", a);
            o->model = a;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;  // a missing value is reported once the flag is known
        double d = 0;
        int rc = 0;
        dj_err e = {{0}};
        if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--chat-template")) o->chat_template = v;
        else if (!strcmp(a, "-m") && v && o->model) return srv_bad_usage("a second model path", v);
        else if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "-ngl") && v)  // llama-server's layer count: said once, then the automatic sizing
            fprintf(stderr, "djinn serve: -ngl %s: %s\n", v, ENGINE_NGL_NOTE);
        else if (!strcmp(a, "--api-key")) rc = v && keys_add(&o->keys, v, strlen(v), a, &e) ? 2 : 0;
        else if (!strcmp(a, "--api-key-file")) rc = v && keys_add_file(&o->keys, v, &e) ? 2 : 0;
        else if (!strcmp(a, "--port")) rc = srv_num(a, v, 0, 65535, 1, &d), o->port = (int)d;
        else if (!strcmp(a, "--threads")) rc = srv_num(a, v, 1, 4096, 1, &d), o->threads = (int)d;
        else if (!strcmp(a, "-c")) rc = srv_num(a, v, 2, 1 << 24, 1, &d), o->ctx = (int64_t)d;
        else if (!strcmp(a, "--parallel")) rc = srv_num(a, v, 1, 4096, 1, &d), o->parallel = (int32_t)d;
        else if (!strcmp(a, "--sessions")) rc = srv_num(a, v, 1, 1 << 20, 1, &d), o->sessions = (int32_t)d;
        else if (!strcmp(a, "--max-conns")) rc = srv_num(a, v, 1, 65536, 1, &d), o->max_conns = (int32_t)d;
        else if (!strcmp(a, "--breakpoints")) rc = srv_num(a, v, 0, 65536, 1, &d), o->breakpoints = (int32_t)d;
        else if (!strcmp(a, "--prefill-chunk")) rc = srv_num(a, v, 1, 1 << 20, 1, &d), o->prefill_chunk = (int64_t)d;
        else if (!strcmp(a, "--timeout")) rc = srv_num(a, v, 0.1, 86400, 0, &d), o->timeout_s = d;
        else if (!strcmp(a, "--ring-gb")) rc = srv_num(a, v, 1e-3, 1e6, 0, &d), o->ring_gb = d;
        else if (!strcmp(a, "--gpus")) rc = v ? tp_parse_gpus(v, &o->n_gpus, o->gpus, &e) : 0;
        else if (!strcmp(a, "--kv-gb")) rc = srv_num(a, v, 1e-9, 1e6, 0, &d), o->kv_gb = d;
        else if (!strcmp(a, "--park-gb")) rc = srv_num(a, v, 0, 1e6, 0, &d), o->park_gb = d;
        else if (!strcmp(a, "--buffer-mb")) rc = srv_num(a, v, 1, 1 << 20, 0, &d), o->buffer_mb = d;
        else if (!strcmp(a, "--client-share")) rc = srv_share(a, v, &o->client_share);
        else if (!strcmp(a, "--kv-type"))
            rc = v && (o->kv_type = dj_kv_parse(v)) < 0 ? srv_bad_usage("--kv-type wants " DJ_KV_NAMES ", not", v) : 0;
        else if (!strcmp(a, "--cpu-share") && v && !strcmp(v, "auto")) o->cpu_share = -1;
        else if (!strcmp(a, "--cpu-share")) rc = srv_num(a, v, 0, 0.95, 0, &d), o->cpu_share = d;
        else return srv_bad_usage("unknown option", a);
        if (rc && e.msg[0]) return srv_bad_usage(e.msg, NULL);
        if (rc) return rc;
        if (!v) return srv_no_value(a);
    }
    if (!o->model) return srv_bad_usage("no model given", NULL);
    return 0;
}

// ---- the server's state
typedef struct srv_req srv_req;

// What a request asks for, known from its head.
typedef enum {
    ROUTE_HEALTH, ROUTE_METRICS, ROUTE_MODELS, ROUTE_MODEL, ROUTE_COMPLETION, ROUTE_CHAT, ROUTE_SESSION
} srv_route;

typedef struct {
    int fd;
    dj_buf in, out;
    size_t in_off;           // in's bytes before it are consumed (requests answered): compacted now and then, so
                             // that a thousand pipelined requests cost no thousand moves of what follows them
    size_t held;             // in's and out's capacity, as counted in the server's total
    int need_input;          // the next request is not whole in `in`: reading more is what lets it go on
    int more;                // whole requests wait in `in` for a later turn (SRV_REQS_TURN or unsent output)
    int eof;                 // the client sent its last byte: what is owed is sent, then the connection closes
    int hup_seen;            // its end was seen while it was not being read (the bytes before it are read later)
    int head_ok;             // the request being read passed the checks its head allows (route, key, method)
    srv_route route;         //   and asks for this,
    int32_t tenant;          //   with this key's tenant
    double t_read, t_wrote;  // the last byte read; the last progress writing
    double t_flushed;        // the last time nothing waited to be sent, or sending progressed: the unread-output
                             // deadline counts from here (a response made long after the last write is not late)
    double t_req;            // the first byte of the request being read (0: none under way)
    int closing;             // close once out is sent (and, draining, the client's unread bytes read)
    int draining;            // refused mid-request: the rest of its bytes are read and dropped before closing
    double t_drain;
    int keep_alive;          // the current request's
    int sent_continue;       // "100 Continue" sent for the request being read
    int rejected;            // refused at once (503): not counted
    int32_t client;          // its client's slot in srv.clients (-1: rejected, counted nowhere)
    srv_req *req;            // its completion under way (reading pauses until it ends)
} srv_conn;

// One client address and what its connections hold (the rejected ones aside), bounded by --client-share.
typedef struct {
    unsigned char addr[16];  // IPv6; IPv4 as ::ffff:a.b.c.d; all zero: a unix socket or an unknown family
    int32_t conns;           // its connections (0: the slot is free)
    int32_t at;              // its place in srv.client_order
    size_t held;             // the bytes of requests its connections hold (the sum of their srv_conn.held)
} srv_client;

// A completion request: its connection and job, and what its response has sent.
struct srv_req {
    srv_conn *c;             // NULL once the client left
    bt_job *job;
    api_resp resp;
    int stream, include_usage, role_sent;
    int started;             // its stream's head is out
    dj_buf text;             // the answer so far (a response that does not stream)
    int64_t n_ids;
    double t0;
};

typedef struct {
    srv_opts o;
    dj_model m;
    dj_tokenizer *tok;
    dj_engine eng;
    bt_sched *bt;
    api_model am;
    char model_name[256];
    int lfd;
    srv_conn **conns;
    int32_t n_conns, n_rejecting;
    size_t held, held_max;   // bytes buffered for all connections (srv_conn.held), and the bound (--buffer-mb)
    srv_client *clients;     // (max_conns) slots: a connection keeps its client's index while it lives
    int32_t *client_order;   // (max_conns) a permutation of the slots: the first n_clients are in use, the rest free
    int32_t n_clients;
    int32_t client_conns_max;  // the connections one client may hold (--client-share of --max-conns, rounded up)
    size_t client_held_max;    // the bytes one client's connections may hold (--client-share of --buffer-mb)
    int spare_fd;            // kept open to be given up when accept runs out of descriptors (-1: none)
    _Atomic int load_state;  // the loading thread's: 0 while it loads, 1 ready, -1 failed (-2: a usage error)
    dj_err load_err;         //   and why it failed
    int ready;               // the loop's own view: the model is loaded and the scheduler runs
    uint64_t shed;           // connections closed at once for want of a descriptor
    uint64_t seq;            // request ids
    uint64_t requests, errors;
    double t_start;
    uint64_t tok_bucket[10]; // generated tokens per second over the last ten seconds
    int64_t tok_second[10];
    uint64_t tok_seen;       // generated tokens counted into the buckets
} srv;

// ---- output to a connection
static void send_head(srv_conn *c, int status, const char *type, size_t len) {
    buf_fmt(&c->out, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n\r\n", status,
            http_reason(status), type, len, c->keep_alive ? "keep-alive" : "close");
    if (!c->keep_alive) c->closing = 1;
}

static void send_json(srv_conn *c, int status, const dj_buf *body) {
    send_head(c, status, "application/json", body->n);
    buf_add(&c->out, body->p ? body->p : "", body->n);
}

static void send_error(srv *s, srv_conn *c, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void send_error_code(srv *s, srv_conn *c, int status, const char *param, const char *code, const char *msg) {
    dj_buf b = {0};
    api_error_json(&b, status, param, code, msg);
    send_json(c, status, &b);
    buf_free(&b);
    s->errors++;
}
static void send_error(srv *s, srv_conn *c, int status, const char *param, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send_error_code(s, c, status, param, NULL, msg);
}

// ---- completions: the scheduler's callbacks write the response
static void req_free(srv_req *r) {
    if (!r) return;
    buf_free(&r->text);
    free(r);
}

static void on_started(void *owner, bt_job *j) {
    srv_req *r = owner;
    if (!r->stream) return;
    r->started = 1;
    buf_str(&r->c->out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                        "Connection: close\r\n\r\n");
    if (r->resp.chat) api_chunk(&r->c->out, &r->resp, 1, NULL, 0, NULL), r->role_sent = 1;  // the role first
}

static void on_text(void *owner, bt_job *j, const char *text, size_t n) {
    srv_req *r = owner;
    if (r->stream) api_chunk(&r->c->out, &r->resp, !r->role_sent && r->resp.chat, text, n, NULL), r->role_sent = 1;
    else buf_add(&r->text, text, n);
}

static srv *srv_self;  // the callbacks' server (one per process)

static void on_ended(void *owner, bt_job *j, const char *finish, const char *err) {
    srv_req *r = owner;
    srv *s = srv_self;
    srv_conn *c = r->c;
    api_usage u = {(int64_t)r->n_ids, j->n_gen, j->n_reused};
    if (err) {
        fprintf(stderr, "djinn serve: %s: %s\n", r->resp.id, err);
        if (r->started) {  // the stream began: an error event ends it
            dj_buf b = {0};
            api_error_json(&b, 500, NULL, NULL, err);
            buf_str(&c->out, "data: ");
            buf_add(&c->out, b.p, b.n - 1);
            buf_str(&c->out, "\n\n");
            buf_free(&b);
            c->closing = 1, s->errors++;
        } else {  // the scheduler's refusals of a breakpoint or resume carry their status
            send_error(s, c, j->status ? j->status : 500,
                       !j->status ? NULL : j->resume ? "resume" : j->brk ? "break_after_layer" : "session", "%s", err);
        }
    } else if (r->stream) {
        api_chunk(&c->out, &r->resp, 0, NULL, 0, finish);
        if (r->include_usage) api_usage_chunk(&c->out, &r->resp, &u);
        buf_str(&c->out, "data: [DONE]\n\n");
        c->closing = 1;  // the stream's body ends with the connection
    } else {
        dj_buf b = {0};
        api_brk k = {j->brk_id, j->layer, s->m.info.config.dim, j->brk_pos, (int64_t)j->n_ids - j->brk_pos,
                     j->ids + j->brk_pos, j->rows};
        api_response(&b, &r->resp, r->text.p ? r->text.p : "", r->text.n, finish, j->brk ? &k : NULL, &u);
        if (b.oom) send_error(s, c, 500, NULL, "out of memory");  // a breakpoint's answer is megabytes
        else send_json(c, 200, &b);
        buf_free(&b);
    }
    if (!s->o.quiet)
        fprintf(stderr, "djinn serve: %s: %" PRId64 " prompt tokens (%" PRId64 " cached), %" PRId64 " generated, %s, "
                        "%.3f s\n", r->resp.id, u.prompt, u.cached, u.completion, err ? "failed" : finish,
                dj_now() - r->t0);
    c->req = NULL;
    req_free(r);
}

// A completion request: checked, then queued (its response comes from the callbacks).
static void start_completion(srv *s, srv_conn *c, const char *body, size_t len, int chat) {
    api_req q;
    api_error err;
    uint64_t z = (uint64_t)(dj_now() * 1e9) + (++s->seq << 40);  // a fresh seed: the clock and a counter, mixed
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    if (api_parse(&s->am, body, len, chat, (z ^ (z >> 31)) >> 1, &q, &err)) {
        send_error_code(s, c, err.status, err.param, err.code, err.msg);
        return;
    }
    srv_req *r = calloc(1, sizeof *r);
    bt_job *j = calloc(1, sizeof *j);
    // a chat answer is a message, decoded on its own (a stream of its own); a completion continues its prompt's text
    dj_tok_stream *ts = chat ? tok_stream_new(s->tok) : NULL;
    if (!r || !j || (chat && !ts)) {
        free(r), free(j);
        if (ts) tok_stream_free(ts);
        api_req_free(&q);
        send_error(s, c, 500, NULL, "out of memory");
        return;
    }
    *j = (bt_job){.ids = q.ids, .n_ids = q.n_ids, .max_tokens = q.max_tokens, .ignore_eos = q.ignore_eos,
                  .smp = q.smp, .n_stops = q.n_stops, .park_after = q.park, .by_user = q.by_user, .kind = chat,
                  .brk = q.brk, .layer = q.layer, .resume = q.resume, .rows = q.rows, .n_rows = q.n_rows,
                  .tenant = c->tenant, .owner = r, .ts = ts};
    memcpy(j->stops, q.stops, sizeof j->stops);
    r->c = c, r->job = j, r->stream = q.stream, r->include_usage = q.include_usage;
    r->t0 = dj_now();
    snprintf(r->resp.id, sizeof r->resp.id, "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", s->requests + 1);
    r->resp.model = s->model_name, r->resp.created = (long long)time(NULL), r->resp.chat = chat;
    dj_err e = {{0}};
    int status = bt_submit(s->bt, j, q.session, &e);
    free(q.session);
    if (status) {
        const char *param = j->resume ? "resume" : "session";
        free(j->ids), free(j->rows), sampler_free(j->smp);
        if (j->ts) tok_stream_free(j->ts);
        for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
        free(j), req_free(r);
        send_error(s, c, status, param, "%s", e.msg);
        return;
    }
    r->n_ids = (int64_t)j->n_ids;  // a resume's prompt may be its paused state's
    c->req = r;
    s->requests++;
}

// ---- the other endpoints
// GET /v1/models (one: NULL) lists the model; GET /v1/models/ID (one: ID) is its object, or 404 for another ID.
static void send_models(srv *s, srv_conn *c, const char *one) {
    if (one && strcmp(one, s->model_name)) {
        send_error(s, c, 404, "model", "no model '%.256s' here: this server has '%s' (GET /v1/models)", one,
                   s->model_name);
        return;
    }
    dj_buf b = {0};
    buf_str(&b, one ? "{\"id\":" : "{\"object\":\"list\",\"data\":[{\"id\":");
    buf_json_str(&b, s->model_name, strlen(s->model_name));
    buf_fmt(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"djinn\",\"context_length\":%" PRId64 "}%s\n",
            (long long)s->t_start, s->am.ctx, one ? "" : "]}");
    send_json(c, 200, &b);
    buf_free(&b);
}

// The tokens generated since the last call go into this second's bucket.
static void count_tokens(srv *s) {
    uint64_t total = bt_generated(s->bt);
    int64_t sec = (int64_t)dj_now();
    int k = (int)(sec % 10);
    if (s->tok_second[k] != sec) s->tok_second[k] = sec, s->tok_bucket[k] = 0;
    s->tok_bucket[k] += total - s->tok_seen;
    s->tok_seen = total;
}

// Prometheus's text format: one line a figure.
static void metric(dj_buf *b, const char *name, const char *type, double v) {
    buf_fmt(b, "# TYPE djinn_%s %s\ndjinn_%s %.17g\n", name, type, name, v);
}

static void send_metrics(srv *s, srv_conn *c) {
    bt_stats t;
    bt_get_stats(s->bt, &t);
    count_tokens(s);
    int64_t now = (int64_t)dj_now();
    uint64_t recent = 0;
    for (int k = 0; k < 10; k++)
        if (s->tok_second[k] < now && s->tok_second[k] >= now - 10) recent += s->tok_bucket[k];
    dj_buf b = {0};
    metric(&b, "requests_total", "counter", (double)s->requests);
    metric(&b, "errors_total", "counter", (double)s->errors);
    metric(&b, "requests_active", "gauge", t.active);
    metric(&b, "requests_queued", "gauge", t.queued);
    metric(&b, "connections", "gauge", s->n_conns - s->n_rejecting);
    metric(&b, "connections_shed_total", "counter", (double)s->shed);
    metric(&b, "buffered_bytes", "gauge", (double)s->held);
    metric(&b, "kv_slots", "gauge", t.slots);
    metric(&b, "parallel", "gauge", t.parallel);
    metric(&b, "sessions", "gauge", t.sessions);
    metric(&b, "sessions_resident", "gauge", t.sessions_resident);
    metric(&b, "sessions_parked", "gauge", t.sessions_parked);
    metric(&b, "parked_bytes", "gauge", (double)t.parked_bytes);
    metric(&b, "parks_total", "counter", (double)t.parks);
    metric(&b, "restores_total", "counter", (double)t.restores);
    metric(&b, "park_bytes_total", "counter", (double)t.park_bytes_total);
    metric(&b, "restore_bytes_total", "counter", (double)t.restore_bytes_total);
    metric(&b, "park_seconds_total", "counter", t.park_s);
    metric(&b, "restore_seconds_total", "counter", t.restore_s);
    metric(&b, "cache_drops_total", "counter", (double)t.drops);
    metric(&b, "breakpoints_paused", "gauge", t.paused);
    metric(&b, "breakpoints_total", "counter", (double)t.breaks);
    metric(&b, "resumes_total", "counter", (double)t.resumes);
    metric(&b, "prompt_tokens_total", "counter", (double)t.prompt_tokens);
    metric(&b, "prompt_tokens_cached_total", "counter", (double)t.reused_tokens);
    metric(&b, "prefill_tokens_total", "counter", (double)t.prefill_tokens);
    metric(&b, "prefill_seconds_total", "counter", t.prefill_s);
    metric(&b, "generated_tokens_total", "counter", (double)t.gen_tokens);
    metric(&b, "decode_steps_total", "counter", (double)t.steps);
    metric(&b, "decode_rows_total", "counter", (double)t.step_rows);
    metric(&b, "decode_rows_max", "gauge", t.max_rows);
    metric(&b, "decode_seconds_total", "counter", t.decode_s);
    metric(&b, "decode_tokens_per_second", "gauge", t.decode_s > 0 ? (double)t.step_rows / t.decode_s : 0);
    // the scheduler's turns that ran a pass, and the host's part of them (outside the engine's pass)
    metric(&b, "turns_total", "counter", (double)t.turns);
    metric(&b, "turn_seconds_total", "counter", t.turn_s);
    metric(&b, "turn_host_seconds_total", "counter", t.turn_host_s);
    metric(&b, "turn_host_fraction", "gauge", t.turn_s > 0 ? t.turn_host_s / t.turn_s : 0);
    metric(&b, "tokens_per_second", "gauge", (double)recent / 10.0);
    dj_gpu_stats g;
    if (engine_gpu_stats(&s->eng, &g)) {
        metric(&b, "pcie_bytes_total", "counter", (double)g.copied_bytes);
        metric(&b, "pcie_gb_per_second", "gauge", g.copy_ms > 0 ? (double)g.copied_bytes / 1e6 / g.copy_ms : 0.0);
        // the parking copies as the device timed them (park_seconds_total: the host's calls, which only queue them)
        metric(&b, "gpu_park_bytes_total", "counter", (double)g.park_bytes);
        metric(&b, "gpu_park_seconds_total", "counter", g.park_ms / 1e3);
        metric(&b, "gpu_restore_bytes_total", "counter", (double)g.restore_bytes);
        metric(&b, "gpu_restore_seconds_total", "counter", g.restore_ms / 1e3);
    }
    send_head(c, 200, "text/plain; version=0.0.4", b.n);
    buf_add(&c->out, b.p ? b.p : "", b.n);
    buf_free(&b);
}

// "/v1/sessions/NAME" or ".../park": the name percent-decoded into out. 0, or -1 (a malformed escape, too long).
static int session_path(const char *p, char *out, size_t cap, int *park) {
    p += strlen("/v1/sessions/");
    size_t n = strlen(p), k = 0;
    *park = n > 5 && !strcmp(p + n - 5, "/park");
    if (*park) n -= 5;
    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)p[i];
        if (ch == '%') {
            if (i + 2 >= n || !isxdigit((unsigned char)p[i + 1]) || !isxdigit((unsigned char)p[i + 2])) return -1;
            char hex[3] = {p[i + 1], p[i + 2], 0};
            ch = (int)strtol(hex, NULL, 16), i += 2;
        } else if (ch == '/') {
            return -1;
        }
        if (!ch || k + 1 >= cap) return -1;
        out[k++] = (char)ch;
    }
    out[k] = 0;
    return k ? 0 : -1;
}

static void session_request(srv *s, srv_conn *c, const http_req *h) {
    char name[API_SESSION_MAX + 1];
    int park;
    if (session_path(h->path, name, sizeof name, &park)) {
        send_error(s, c, 400, NULL, "a session path is /v1/sessions/NAME (percent-encoded, 1 to %d bytes)",
                   API_SESSION_MAX);
        return;
    }
    dj_err e = {{0}};  // (the method was checked from the head: check_head)
    int64_t tokens = 0;
    int status = park ? bt_park(s->bt, c->tenant, name, &tokens, &e) : bt_forget(s->bt, c->tenant, name, &e);
    if (status) {
        send_error(s, c, status, NULL, "%s", e.msg);
        return;
    }
    dj_buf b = {0};
    buf_str(&b, "{\"session\":");
    buf_json_str(&b, name, strlen(name));
    if (park) buf_fmt(&b, ",\"parked\":true,\"tokens\":%" PRId64 "}\n", tokens);
    else buf_str(&b, ",\"deleted\":true}\n");
    send_json(c, 200, &b);
    buf_free(&b);
}

// ---- requests
// The tenant of the request's key (0 when the server has none), or -1.
static int32_t tenant_of(const srv *s, const http_req *h) {
    return s->o.keys.n ? keys_match(&s->o.keys, h->authorization) : 0;
}

// The checks a request's head allows, made before its body is read, so that a client without a key, or asking for
// nothing there is, gets its answer without the server holding its body: the route, the key, the method. 0 with
// c->route and c->tenant set; or -1, answered.
static int check_head(srv *s, srv_conn *c, const http_req *h) {
    const char *p = h->path, *m = h->method;
    static const struct {
        const char *path, *method;
        srv_route route;
    } routes[] = {{"/health", "GET", ROUTE_HEALTH},          {"/metrics", "GET", ROUTE_METRICS},
                  {"/v1/models", "GET", ROUTE_MODELS},       {"/v1/completions", "POST", ROUTE_COMPLETION},
                  {"/v1/chat/completions", "POST", ROUTE_CHAT}};
    const char *want = NULL;
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(p, routes[i].path)) want = routes[i].method, c->route = routes[i].route;
    if (!want && !strncmp(p, "/v1/models/", 11) && p[11]) want = "GET", c->route = ROUTE_MODEL;
    if (!want && !strncmp(p, "/v1/sessions/", 13)) {  // as session_request reads it: a malformed one is its 400
        char name[API_SESSION_MAX + 1];
        int park;
        want = session_path(p, name, sizeof name, &park) ? m : park ? "POST" : "DELETE", c->route = ROUTE_SESSION;
    }
    c->tenant = c->route == ROUTE_HEALTH ? 0 : tenant_of(s, h);
    const int refused = !want || c->tenant < 0 || strcmp(m, want);
    c->keep_alive = h->keep_alive && !refused;  // a refusal closes the connection (its body unread): it says so
    if (!want) send_error(s, c, 404, NULL, "no such endpoint: %s %s", m, p);
    else if (c->tenant < 0) send_error(s, c, 401, NULL, "a valid API key is required: 'Authorization: Bearer KEY'");
    else if (strcmp(m, want)) send_error(s, c, 405, NULL, "%s %s: use %s", m, p, want);
    return refused ? -1 : 0;
}

// /health's answer: {"status": status}.
static void send_health(srv_conn *c, int code, const char *status) {
    dj_buf b = {0};
    buf_fmt(&b, "{\"status\":\"%s\"}\n", status);
    send_json(c, code, &b);
    buf_free(&b);
}

// A whole request (head and body at body) whose head passed check_head: answered, or its completion queued.
static void handle_request(srv *s, srv_conn *c, const http_req *h, const char *body) {
    if (!s->ready) {  // the model is loading: /health says so, the rest waits for it
        if (c->route == ROUTE_HEALTH) send_health(c, 503, "loading");
        else send_error(s, c, 503, NULL, "the model is still loading: try again shortly (GET /health says when)");
        return;
    }
    switch (c->route) {
    case ROUTE_COMPLETION:
    case ROUTE_CHAT: start_completion(s, c, body, h->content_length, c->route == ROUTE_CHAT); break;
    case ROUTE_SESSION: session_request(s, c, h); break;
    case ROUTE_METRICS: send_metrics(s, c); break;
    case ROUTE_MODELS: send_models(s, c, NULL); break;
    case ROUTE_MODEL: send_models(s, c, h->path + 11); break;
    case ROUTE_HEALTH: send_health(c, 200, "ok"); break;
    }
}

// ---- connections
// The bytes of requests the connection holds, as counted in the server's total: called after they change (its
// buffer's room is at most about twice that, and goes back past 64 KB once empty). Unsent output has its bounds per
// connection: reading pauses past SRV_OUT_PAUSE, the connection goes past SRV_OUT_MAX.
static void conn_count(srv *s, srv_conn *c) {
    s->held = s->held - c->held + c->in.n;
    if (c->client >= 0) s->clients[c->client].held = s->clients[c->client].held - c->held + c->in.n;
    c->held = c->in.n;
}

// ---- clients: the connections and bytes one peer address holds
// The peer's address as a client's key: IPv4 in its IPv4-mapped IPv6 form (::ffff:a.b.c.d, the same client either
// way); a unix socket or an unknown family all zero, one key for all of them.
static void client_key(const struct sockaddr_storage *a, socklen_t len, unsigned char key[16]) {
    memset(key, 0, 16);
    if (a->ss_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)a)->sin_addr, 4);
    } else if (a->ss_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        memcpy(key, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
    }
}

// The slot of the client with this key, or -1 when none of its connections is open: O(clients).
static int32_t client_find(const srv *s, const unsigned char key[16]) {
    for (int32_t i = 0; i < s->n_clients; i++)
        if (!memcmp(s->clients[s->client_order[i]].addr, key, 16)) return s->client_order[i];
    return -1;
}

// A connection of the client in slot k (-1: a new client, given a free slot) is counted. Its slot.
static int32_t client_join(srv *s, int32_t k, const unsigned char key[16]) {
    if (k < 0) {  // a free slot is there: the accepted connections, hence their clients, are at most max_conns
        k = s->client_order[s->n_clients++];
        memcpy(s->clients[k].addr, key, 16), s->clients[k].held = 0;
    }
    s->clients[k].conns++;
    return k;
}

// A connection of the client in slot k closed (its bytes already uncounted): its last frees the slot, in O(1).
static void client_leave(srv *s, int32_t k) {
    srv_client *cl = &s->clients[k];
    if (--cl->conns) return;
    int32_t last = s->client_order[--s->n_clients];  // the last slot in use takes k's place in the order
    s->client_order[cl->at] = last, s->clients[last].at = cl->at;
    s->client_order[s->n_clients] = k, cl->at = s->n_clients;
}

static void conn_close(srv *s, int32_t i) {
    srv_conn *c = s->conns[i];
    if (c->req) {  // its job ends at the next turn, unheard
        bt_detach(s->bt, c->req->job);
        req_free(c->req);
    }
    if (c->rejected) s->n_rejecting--;
    close(c->fd);
    buf_free(&c->in), buf_free(&c->out);
    conn_count(s, c);
    if (c->client >= 0) client_leave(s, c->client);
    free(c);
    s->conns[i] = s->conns[--s->n_conns];
}

// A refusal that ends the connection: the response goes out, then what the client still sends is read and dropped
// for a while, so that closing with unread bytes does not reset the connection under the response. What it sent
// and was not read is dropped now.
static void refuse_and_drain(srv_conn *c) {
    c->keep_alive = 0, c->closing = 1, c->draining = 1;
    c->in.n = c->in_off = 0, c->need_input = 0, c->more = 0;
}

// Out of descriptors: the spare one is given up for a moment, so that the pending connection can be taken and
// closed at once (its client hears the close rather than waiting; the listening socket no longer stays readable
// and turns the loop into a spin). 0: one was shed; -1: none could be.
static int shed_one(srv *s) {
    if (s->spare_fd < 0) return -1;
    close(s->spare_fd);
    int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) close(fd), s->shed++;
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0 ? 0 : -1;
}

// Connections past --max-conns, past their address's --client-share of it, or while the buffered bytes are past
// --buffer-mb, get 503 at once (at most SRV_REJECT_MAX of them at a time; more are closed). 0, or -1 when
// descriptors ran out and none could be shed: the listening socket then waits a turn.
static int accept_all(srv *s) {
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof peer;
        int fd = accept4(s->lfd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            if (shed_one(s)) return -1;
            continue;
        }
        if (fd < 0) return 0;  // EAGAIN, or a connection that went away before it was taken
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        unsigned char key[16];
        client_key(&peer, peer_len, key);
        int32_t k = client_find(s, key);
        int full = s->held >= s->held_max, taken = s->n_conns - s->n_rejecting >= s->o.max_conns;
        int crowded = k >= 0 && s->clients[k].conns >= s->client_conns_max, over = full || taken || crowded;
        srv_conn *c = !over || s->n_rejecting < SRV_REJECT_MAX ? calloc(1, sizeof *c) : NULL;
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd, c->t_read = c->t_wrote = c->t_flushed = dj_now(), c->need_input = 1, c->client = -1;
        s->conns[s->n_conns++] = c;
        if (!over) c->client = client_join(s, k, key);
        else {
            c->rejected = 1, s->n_rejecting++;
            refuse_and_drain(c);
            char msg[200];
            snprintf(msg, sizeof msg, "%s: try again later",
                     full ? "the server holds as much of its clients' data as it may"
                     : taken ? "too many connections"
                           : "too many connections from this address (--client-share)");
            send_error_code(s, c, 503, NULL, NULL, msg);
        }
    }
}

// Whether the connection is to be read now: its next request needs bytes (nothing else waits on it, its unsent
// output is small, the server's buffers and its client's share of them have room), or it is being drained. Only a
// rejected connection has no client, and it drains.
static int conn_wants_input(const srv *s, const srv_conn *c) {
    if (c->eof) return 0;
    if (c->draining) return 1;
    return c->need_input && !c->req && !c->closing && c->out.n <= SRV_OUT_PAUSE && s->held < s->held_max &&
           s->clients[c->client].held < s->client_held_max;
}

static void conn_parse(srv *s, srv_conn *c, double now);

// Reads what the connection has, while its next request needs it (at most SRV_READ_TURN a turn, so that a fast
// sender does not hold the others up), parsing as it goes. The end of the client's input ends its requests: what
// is owed is still sent. 0: keep it; -1: close it now.
static int conn_read(srv *s, srv_conn *c, double now) {
    char tmp[65536];
    for (size_t total = 0; total < SRV_READ_TURN && conn_wants_input(s, c);) {
        ssize_t got = recv(c->fd, tmp, sizeof tmp, 0);
        if (got == 0) {
            c->eof = 1, c->need_input = 0;
            c->in.n = c->in_off = 0;  // the part of a request that will never be whole
            break;
        }
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR) continue;
            return -1;
        }
        c->t_read = now, total += (size_t)got;
        if (c->draining) continue;
        if (!c->t_req && !c->req) c->t_req = now;
        if (c->in_off && c->in_off >= c->in.n / 2) {  // compacted once the consumed part is half: moves stay linear
            buf_drop_front(&c->in, c->in_off);
            c->in_off = 0;
        }
        if (c->in.n - c->in_off + (size_t)got > HTTP_HEAD_MAX + SRV_BODY_MAX + sizeof tmp) return -1;  // a safeguard
        buf_add(&c->in, tmp, (size_t)got);
        conn_count(s, c);
        if (c->in.oom) return -1;
        conn_parse(s, c, now);
    }
    if (c->eof && c->draining && c->t_drain) return -1;  // refused, answered, and the client has finished
    return 0;
}

// Requests in c->in are answered (or their completion queued) while none is under way, at most SRV_REQS_TURN of
// them and while the unsent output stays under SRV_OUT_PAUSE; c->need_input says whether the next needs bytes.
static void conn_parse(srv *s, srv_conn *c, double now) {
    c->need_input = 0, c->more = 0;
    for (int answered = 0; !c->req && !c->closing;) {
        size_t n = c->in.n - c->in_off;
        const char *p = c->in.p + c->in_off;
        if (!n) {
            c->need_input = 1;
            break;
        }
        if (answered == SRV_REQS_TURN || c->out.n > SRV_OUT_PAUSE) {
            c->more = 1;
            break;
        }
        if (!c->t_req) c->t_req = now;
        http_req h;
        int status;
        const char *why;
        int rc = http_parse_head(p, n, SRV_BODY_MAX, &h, &status, &why);
        if (rc == 0) {
            c->need_input = 1;
            break;
        }
        if (rc < 0) {
            refuse_and_drain(c);
            send_error(s, c, status, NULL, "%s", why);
            break;
        }
        if (!c->head_ok && check_head(s, c, &h)) {
            refuse_and_drain(c);  // the body, if any, is not read
            break;
        }
        c->head_ok = 1;
        if (n < h.head_len + h.content_length) {  // the body is still coming
            if (h.expect_continue && !c->sent_continue) buf_str(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
            c->sent_continue = 1, c->need_input = 1;
            break;
        }
        handle_request(s, c, &h, p + h.head_len);
        c->t_req = 0, c->sent_continue = 0, c->head_ok = 0;  // the next request starts afresh
        c->in_off += h.head_len + h.content_length, answered++;
    }
    if (c->in_off == c->in.n) c->in.n = c->in_off = 0;
    if (!c->in.n && c->in.cap > 65536) buf_free(&c->in);  // a large body's room goes back
    conn_count(s, c);
}

// Sends what is pending. -1: the connection is done (the peer is gone, or the response is out and it closes).
static int conn_write(srv_conn *c, double now) {
    size_t sent = 0;
    int rc = 0;
    while (sent < c->out.n) {
        ssize_t w = send(c->fd, c->out.p + sent, c->out.n - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            rc = errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
            break;
        }
        c->t_wrote = c->t_flushed = now;
        sent += (size_t)w;
    }
    buf_drop_front(&c->out, sent);  // one move a turn, whatever the number of sends
    if (!c->out.n && c->out.cap > 65536) buf_free(&c->out);
    if (rc || c->out.n || c->req) return rc;
    if (c->eof && !c->more && !c->draining) return -1;  // all that was asked is answered
    if (!c->closing) return 0;
    if (!c->draining) {  // the response is out and the connection closes: a close() with bytes of the client's still
        if (c->eof) return -1;  // unread would reset it, destroying the response's tail in flight: they are read and
        c->draining = 1;        // dropped first, as after a refusal (at most SRV_DRAIN_S)
    }
    if (!c->t_drain) shutdown(c->fd, SHUT_WR), c->t_drain = now;  // the response is out: the client sees its end
    return c->eof ? -1 : 0;
}

// Why connection c should go now, or NULL: a deadline passed or a limit was crossed.
static const char *conn_expired(const srv *s, srv_conn *c, double now) {
    double t = s->o.timeout_s;
    if (c->draining && c->t_drain && now - c->t_drain > SRV_DRAIN_S) return "drained";
    if (c->out.n > SRV_OUT_MAX) return "too much unread output";
    if (c->out.n && now - c->t_flushed > t) return "output unread for --timeout";
    if (!c->req && !c->out.n && !c->in.n && !c->t_req && now - fmax(c->t_read, c->t_wrote) > t) return "idle";
    return NULL;
}

static int srv_listen(srv *s, dj_err *e) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->o.port)};
    if (inet_pton(AF_INET, s->o.host, &a.sin_addr) != 1)
        return dj_fail(e, "--host %s: not an IPv4 address", s->o.host);
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0) return dj_fail(e, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 128))
        return dj_fail(e, "cannot listen on %s:%d: %s", s->o.host, s->o.port, strerror(errno));
    socklen_t al = sizeof a;
    if (getsockname(s->lfd, (struct sockaddr *)&a, &al)) return dj_fail(e, "getsockname: %s", strerror(errno));
    fprintf(stderr, "djinn serve: listening on http://%s:%d\n", s->o.host, ntohs(a.sin_port));
    return 0;
}

static void srv_loop(srv *s) {
    // tests only: each turn with work takes at least this long, so a client can act in the middle of an answer
    const char *slow = getenv("DJINN_TEST_STEP_US");
    long step_us = slow ? strtol(slow, NULL, 10) : 0;
    struct pollfd *pf = calloc((size_t)s->o.max_conns + SRV_REJECT_MAX + 1, sizeof *pf);
    if (!pf) {
        fprintf(stderr, "djinn serve: out of memory\n");
        return;
    }
    double accept_after = 0;  // out of descriptors with none to shed: the listening socket rests until then
    int again = 0;            // requests wait in a connection's input for this turn (SRV_REQS_TURN)
    while (!srv_stop) {
        if (!s->ready) {  // the loading thread ended: serve, or stop with its error
            const int ls = atomic_load(&s->load_state);
            if (ls < 0) break;
            s->ready = ls == 1;
        }
        const int work = s->ready && bt_has_work(s->bt);
        double now = dj_now();
        pf[0] = (struct pollfd){.fd = s->lfd, .events = now >= accept_after ? POLLIN : 0};
        for (int32_t i = 0; i < s->n_conns; i++) {
            srv_conn *c = s->conns[i];
            short in = conn_wants_input(s, c) ? POLLIN | POLLRDHUP : c->hup_seen ? 0 : POLLRDHUP;
            short ev = (short)(in | (c->out.n ? POLLOUT : 0));
            pf[i + 1] = (struct pollfd){.fd = c->fd, .events = ev};  // errors and hang-ups come whatever ev is
        }
        int32_t n = s->n_conns;
        int ready = poll(pf, (nfds_t)n + 1, work || again ? 0 : now < accept_after || !s->ready ? 100 : 250);
        if (ready < 0 && errno != EINTR) {
            fprintf(stderr, "djinn serve: poll: %s\n", strerror(errno));
            break;
        }
        now = dj_now();
        // connections first (their indices match pf until one closes: go backwards), then new ones
        for (int32_t i = n - 1; i >= 0; i--) {
            srv_conn *c = s->conns[i];
            if (!c->out.n) c->t_flushed = now;
            short re = ready > 0 ? pf[i + 1].revents : 0;
            int drop = (re & (POLLERR | POLLNVAL)) || ((re & POLLHUP) && !conn_wants_input(s, c));
            if (!drop && (re & POLLRDHUP) && !conn_wants_input(s, c)) {
                // ended while not read: a request half sent will never be whole (nothing is owed: it goes now, its
                // bytes with it); else what it asked for is still answered
                drop = c->t_req && !c->req && !c->more && !c->draining;
                c->hup_seen = 1;
            } else if (!drop && (re & (POLLIN | POLLRDHUP | POLLHUP))) {
                drop = conn_read(s, c, now) < 0;
            }
            if (!drop && c->out.n) drop = conn_write(c, now) < 0;
            if (!drop && c->t_req && !c->req && !c->closing && now - c->t_req > s->o.timeout_s) {
                refuse_and_drain(c);
                send_error(s, c, 408, NULL, "the request did not arrive whole within %g s", s->o.timeout_s);
            }
            const char *why = drop ? NULL : conn_expired(s, c, now);
            if (why && c->out.n && !s->o.quiet)  // a client that stopped reading: worth a line, unlike an idle one
                fprintf(stderr, "djinn serve: a connection closed, its client does not read: %s (%zu bytes unsent)\n",
                        why, c->out.n);
            if (why) drop = 1;
            if (!drop && c->closing && !c->out.n && !c->req && !c->draining) drop = 1;
            if (drop) conn_close(s, i);
        }
        if (ready > 0 && (pf[0].revents & POLLIN) && accept_all(s)) accept_after = now + 0.1;
        if (s->ready) {
            if (step_us > 0 && bt_has_work(s->bt)) usleep((useconds_t)step_us);
            bt_step(s->bt);
            count_tokens(s);
        }
        // what the turn produced goes out now, not after the next poll; requests that waited (behind an answer on
        // their connection, or past the turn's SRV_REQS_TURN) are taken up
        now = dj_now();
        again = 0;
        for (int32_t i = s->n_conns - 1; i >= 0; i--) {
            srv_conn *c = s->conns[i];
            if (!c->req && !c->closing && !c->need_input) conn_parse(s, c, now);
            if ((c->out.n || c->closing || c->eof) && conn_write(c, now) < 0) {
                conn_close(s, i);
                continue;
            }
            again |= c->more && c->out.n <= SRV_OUT_PAUSE;
        }
    }
    free(pf);
}

// ---- set-up
// Descriptors for every connection, the ones refused at once and the server's own: the soft limit is raised to
// that where the hard one allows, else --max-conns is lowered to what fits, and said.
static int srv_fd_limit(srv_opts *o, dj_err *e) {
    struct rlimit rl;
    rlim_t need = (rlim_t)o->max_conns + SRV_REJECT_MAX + SRV_FDS_OWN;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return dj_fail(e, "getrlimit: %s", strerror(errno));
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) || getrlimit(RLIMIT_NOFILE, &rl))
            return dj_fail(e, "setrlimit: %s", strerror(errno));
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return 0;
    long long fit = (long long)rl.rlim_cur - SRV_REJECT_MAX - SRV_FDS_OWN;
    if (fit < 1)
        return dj_fail(e, "the descriptor limit (ulimit -n) is %llu: the server needs %d besides its connections",
                       (unsigned long long)rl.rlim_cur, SRV_REJECT_MAX + SRV_FDS_OWN + 1);
    fprintf(stderr, "djinn serve: --max-conns %d lowered to %lld: the descriptor limit (ulimit -n) is %llu\n",
            o->max_conns, fit, (unsigned long long)rl.rlim_cur);
    o->max_conns = (int32_t)fit;
    return 0;
}

// The KV cache's shape (kvsize.h): the memory (--kv-gb, else a quarter of the engine's), the context (-c, else the
// model's up to SRV_DEFAULT_CTX, cut to what the memory holds in one slot), the slots the memory holds, the sequences
// a step (--parallel, else half the slots) and the parking memory (--park-gb, else half what the host has free).
typedef struct {
    int64_t ctx;
    int32_t slots, parallel;
    double slot_gb, park_gb;
    char why_ctx[64], why_kv[64], why_par[64], why_park[64];  // where each came from, for the startup line
} srv_kv;

// 0; 2 with e set: the options do not fit this model.
static int srv_size_kv(const srv_opts *o, const dj_config *cfg, int gpu, srv_kv *kv, dj_err *e) {
    const char *mem = "--kv-gb", *type = dj_kv_name(o->kv_type);
    const uint64_t budget = o->kv_gb > 0 ? (uint64_t)llround(o->kv_gb * 1e9) : kv_budget(gpu, &mem);
    const uint64_t pos_bytes = engine_kv_pos_bytes(cfg, o->kv_type);
    const int64_t max_seq = cfg->max_seq_len, cap = max_seq < SRV_DEFAULT_CTX ? max_seq : SRV_DEFAULT_CTX;
    if (!budget) return dj_fail(e, "%s cannot be read: give --kv-gb", mem), 2;
    if (o->ctx > max_seq)
        return dj_fail(e, "-c %" PRId64 " is beyond the model's max_seq_len of %u", o->ctx, cfg->max_seq_len), 2;
    snprintf(kv->why_kv, sizeof kv->why_kv, "%s%s (%.4g GB)", o->kv_gb > 0 ? "" : "a quarter of ", mem,
             (double)budget / 1e9);
    kv->ctx = o->ctx ? o->ctx : kv_fit_context(pos_bytes, 1, budget, cap);
    if (o->ctx) snprintf(kv->why_ctx, sizeof kv->why_ctx, " (-c)");
    else if (kv->ctx == max_seq) snprintf(kv->why_ctx, sizeof kv->why_ctx, " (the model's)");
    else if (kv->ctx == cap) snprintf(kv->why_ctx, sizeof kv->why_ctx, " (the model's %u, at most %d)", cfg->max_seq_len,
                                      SRV_DEFAULT_CTX);
    else snprintf(kv->why_ctx, sizeof kv->why_ctx, " (of the model's %u: what the memory holds)", cfg->max_seq_len);
    kv->slot_gb = (double)pos_bytes * (double)kv->ctx / 1e9;
    if ((kv->slots = kv_slots(pos_bytes * (uint64_t)kv->ctx, budget)) < 1)
        return dj_fail(e, "%s holds no KV slot: one slot of %" PRId64 " positions takes %.4g GB (%s); lower -c or "
                          "raise --kv-gb", kv->why_kv, kv->ctx, kv->slot_gb, type), 2;
    kv->parallel = o->parallel ? o->parallel : kv_default_parallel(kv->slots);
    if (kv->parallel > kv->slots)
        return dj_fail(e, "--parallel %d needs as many KV slots, %s holds %d (%.4g GB each, %s): raise --kv-gb to "
                          "%.4g or lower --parallel", kv->parallel, kv->why_kv, kv->slots, kv->slot_gb, type,
                       kv->slot_gb * kv->parallel), 2;
    snprintf(kv->why_par, sizeof kv->why_par, o->parallel ? "" : " (half the slots, at most %d)", KV_PARALLEL_MAX);
    const uint64_t avail = host_mem_available();
    kv->park_gb = o->park_gb >= 0 ? o->park_gb : kv_park_gb(avail);
    snprintf(kv->why_park, sizeof kv->why_park, "%s", o->park_gb >= 0 ? "" : avail ? " (half the host's available "
             "memory)" : " (the host's memory unknown)");
    return 0;
}

// The model, its tokenizer, the engine and the scheduler, on a thread of their own while the server already answers
// (/health: 503 "loading"). 0; 1 with e set; 2 with e set (a usage error: the options do not fit this model).
static int srv_open_model(srv *s, dj_err *e) {
    srv_opts *o = &s->o;
    int use_gpu = !o->force_cpu && gpu_count() > 0;
    dj_load_opts lo = {.want_pinned = use_gpu, .quiet = !isatty(STDERR_FILENO)};  // progress on a terminal only
    if (model_load(o->model, &lo, &s->m, e)) return 1;
    const dj_config *cfg = &s->m.info.config;
    if (!(s->tok = tok_load(s->m.data + s->m.info.tok_off, (size_t)s->m.info.tok_size, e))) return 1;
    if (tok_vocab_size(s->tok) > (int32_t)cfg->vocab_size)
        return dj_fail(e, "%s: the tokenizer has more tokens than the model's vocabulary: a damaged file", o->model), 1;
    srv_kv kv;
    int rc = srv_size_kv(o, cfg, use_gpu, &kv, e);
    if (rc) return rc;
    const int64_t ctx = kv.ctx;
    chat_kind chat;
    if (chat_choose(o->chat_template, tok_chat_template(s->tok), &chat, e)) return 2;
    dj_gpu_opts go = {.ring_gb = o->ring_gb, .max_seq = ctx, .cpu_share = o->cpu_share, .stream_all = o->stream_all,
                      .kv_type = o->kv_type, .n_gpus = o->n_gpus};
    memcpy(go.gpus, o->gpus, sizeof go.gpus);
    if (use_gpu) engine_default_gpus(&go, cfg, "djinn serve");
    if (go.n_gpus > 1) go.consume = &s->m;  // its weights go to the GPUs' parts; the tokenizer stays
    if (engine_open(&s->eng, &s->m, &go, kv.slots, e)) return 1;
    int32_t breakpoints = o->breakpoints;
    if (!s->eng.set_probe && breakpoints == SRV_DEFAULT_PAUSED) {  // the default, where the engine has no probes
        breakpoints = 0;
        fprintf(stderr, "djinn serve: breakpoints are off: the %s engine has no probes\n", s->eng.name);
    }
    s->am = (api_model){s->tok, chat, ctx, cfg->vocab_size, cfg->n_layers, cfg->dim, breakpoints > 0};
    // a breakpoint's rows must come back in a resume's body, base64 (4 characters for 3 bytes) beside its fields
    int64_t brk_rows = (int64_t)((SRV_BODY_MAX - 65536) / 4 * 3 / (4 * (size_t)cfg->dim));
    bt_opts bo = {kv.parallel, o->prefill_chunk, o->sessions, (uint64_t)(kv.park_gb * 1e9), breakpoints,
                  brk_rows};
    bt_callbacks cb = {on_started, on_text, on_ended};
    if (!(s->bt = bt_new(&s->eng, s->tok, cfg, &bo, &cb, e))) return 1;
    fprintf(stderr, "djinn serve: %s on the %s engine: %d KV slot%s of %" PRId64 " positions%s, %s, %.3f GB of %s; "
                    "up to %d sequence%s a step%s; parking up to %.3g GB%s; chat template: %s\n", s->model_name,
            s->eng.name, kv.slots, kv.slots == 1 ? "" : "s", ctx, kv.why_ctx, dj_kv_name(s->eng.kv_type),
            kv.slot_gb * kv.slots, kv.why_kv, kv.parallel, kv.parallel == 1 ? "" : "s", kv.why_par, kv.park_gb,
            kv.why_park, chat_kind_name(s->am.chat));
    return 0;
}

static void *srv_load_thread(void *arg) {
    srv *s = arg;
    // tests only: the load waits for a byte on this descriptor, so a test can ask the loading server what it says
    const char *gate = getenv("DJINN_TEST_LOAD_GATE_FD");
    if (gate) {
        char byte;
        while (read(atoi(gate), &byte, 1) < 0 && errno == EINTR) {}
    }
    int rc = srv_open_model(s, &s->load_err);
    atomic_store(&s->load_state, rc ? -rc : 1);
    return NULL;
}

int serve_main(int argc, char **argv) {
    srv s = {.lfd = -1, .spare_fd = -1, .t_start = (double)time(NULL)};
    int prc = srv_parse(argc, argv, &s.o);
    if (prc) {
        keys_free(&s.o.keys);
        dj_err we;
        if (prc < 0 && stdout_flush(&we)) {  // --help's text not written (a full disk, a closed stdout)
            fprintf(stderr, "djinn serve: %s\n", we.msg);
            return 1;
        }
        return prc < 0 ? 0 : prc;
    }
    srv_opts *o = &s.o;
    s.held_max = (size_t)(o->buffer_mb * 1e6);
    s.client_held_max = (size_t)ceil(o->client_share * (double)s.held_max);
    if (o->threads) cpu_set_threads(o->threads);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, srv_on_signal);
    signal(SIGTERM, srv_on_signal);
    srv_self = &s;
    const char *base = strrchr(o->model, '/');
    snprintf(s.model_name, sizeof s.model_name, "%s", base ? base + 1 : o->model);
    dj_err e = {{0}};
    int rc = 1, loader = 0;
    pthread_t tid;
    if (access(o->model, R_OK)) {  // a missing model is said at once, not after the port is taken
        dj_fail(&e, "cannot open model %s: %s", o->model, strerror(errno));
        goto out;
    }
    if (srv_fd_limit(o, &e)) goto out;
    // of --max-conns as lowered to the descriptor limit; 0.1 x 30 is 3.0000000000000004 in doubles: 3, not 4
    s.client_conns_max = (int32_t)ceil(o->client_share * o->max_conns - 1e-9);
    s.clients = calloc((size_t)o->max_conns, sizeof *s.clients);
    s.client_order = calloc((size_t)o->max_conns, sizeof *s.client_order);
    if (!(s.conns = calloc((size_t)o->max_conns + SRV_REJECT_MAX, sizeof *s.conns)) || !s.clients ||
        !s.client_order) {
        dj_fail(&e, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < o->max_conns; i++) s.client_order[i] = i, s.clients[i].at = i;
    // the port first (a port in use is said before a long load), then the model while /health answers "loading"
    if (srv_listen(&s, &e)) goto out;
    if ((s.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        dj_fail(&e, "/dev/null: %s", strerror(errno));
        goto out;
    }
    sigset_t block, old;
    sigemptyset(&block), sigaddset(&block, SIGINT), sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);  // the signals reach the loop's thread, whose poll they wake
    int perr = pthread_create(&tid, NULL, srv_load_thread, &s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (perr) {
        dj_fail(&e, "pthread_create: %s", strerror(perr));
        goto out;
    }
    loader = 1;
    srv_loop(&s);
    pthread_join(tid, NULL), loader = 0;  // a stop during the load waits for it to end
    int ls = atomic_load(&s.load_state);
    if (ls < 0) {
        e = s.load_err;
        rc = -ls;
        goto out;
    }
    bt_stats t;
    bt_get_stats(s.bt, &t);
    fprintf(stderr, "djinn serve: stopped: %" PRIu64 " requests, %" PRIu64 " tokens generated\n", s.requests,
            t.gen_tokens);
    rc = 0;
out:
    if (loader) pthread_join(tid, NULL);
    if (rc && e.msg[0]) fprintf(stderr, "djinn serve: %s\n", e.msg);
    while (s.n_conns) conn_close(&s, s.n_conns - 1);
    free(s.conns), free(s.clients), free(s.client_order);
    bt_free(s.bt);
    if (s.lfd >= 0) close(s.lfd);
    if (s.spare_fd >= 0) close(s.spare_fd);
    keys_free(&o->keys);
    engine_close(&s.eng);
    if (s.tok) tok_free(s.tok);
    model_free(&s.m);
    cpu_pool_stop();
    return rc;
}
