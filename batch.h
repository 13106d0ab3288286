// batch.h: continuous batching over one engine's KV slots (engine.h), for the server. Requests ("jobs") queue; a
// job joins as soon as a slot is free and fewer than `parallel` sequences run; its prompt is prefilled a chunk at a
// time (at most prefill_chunk tokens a step, over every job still prefilling), and every sequence past its prefill
// advances one token per step, all of them in one step_rows pass. A job ends at an end token, a stop string, max_tokens
// or the end of the context.
//
// A slot keeps the tokens its cache holds after its job ends, and the next job of the same tenant that takes it
// prefills only what follows the longest common prefix of its prompt with them (another tenant's job prefills all:
// how much of a prompt was cached must not tell one tenant what another asked). A job may name a session, one of
// its tenant's (another tenant's session of the same name is another session): the session keeps its slot between
// jobs (its next turn, the same conversation plus new messages, prefills only the new tokens). When a job
// needs a slot and none is free, the least recently used idle session's cache is parked in host memory (the
// engine's park), and restored into a slot when the session speaks again; past the parking budget the least
// recently used parked caches are dropped (their next turn prefills everything: slower, the same text).
//
// Breakpoints. A breakpoint job runs its prompt's new positions as any job does, their residual stream after its
// layer copied out on the way (a probe tap, probe.h: by KV slot and position, so rows of other sequences in the same
// pass are never touched), and ends there with finish "breakpoint", generating nothing. Its session (a hidden one
// when the job names none) keeps the cache and is paused: it takes no other job until a resume job names the
// paused state (brk-ID). The resume runs the same positions again from the cache's prefix with those rows written
// over the residual stream after the layer (layers up to it recompute the same keys and values, the later ones
// read the rows sent), then generates as any job. At most max_paused states are held; past that the oldest is
// dropped, and a resume of it is refused with the reason.
#ifndef DJINN_BATCH_H
#define DJINN_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"
#include "stops.h"
#include "tokenizer.h"

#define BT_STOPS 4  // stop strings a job may have (OpenAI's limit)

typedef struct bt_sched bt_sched;
typedef struct bt_job bt_job;

typedef struct {
    int32_t parallel;       // most sequences in one step (<= the engine's slots)
    int64_t prefill_chunk;  // most prompt tokens prefilled per step
    int32_t max_sessions;   // sessions remembered; the least recently used idle one is forgotten past it
    uint64_t park_bytes;    // host memory for parked caches
    int32_t max_paused;     // paused states held (0: no breakpoints)
    int64_t brk_rows;       // most positions a breakpoint may return (a resume must carry them back)
} bt_opts;

// What a job reports to its owner (the server's connection side); owner is the job's `owner`.
typedef struct {
    void (*started)(void *owner, bt_job *j);  // prefill done, the first token picked
    void (*text)(void *owner, bt_job *j, const char *text, size_t n);  // a piece of the answer (stop strings held back)
    // the job has ended: finish "stop" or "length", or err (one line) when it failed; the job is freed after this
    void (*ended)(void *owner, bt_job *j, const char *finish, const char *err);
} bt_callbacks;

struct bt_job {
    // ---- the request, set before bt_submit (the job then owns ids, smp, stops and rows)
    int32_t *ids;        // the prompt (n_ids >= 1)
    size_t n_ids;
    int64_t max_tokens;  // < 0: until an end token or the context's end
    int ignore_eos;      // an end token does not end the answer (it adds no text): max_tokens, a stop string or the
                         //   context does
    dj_sampler *smp;
    char *stops[BT_STOPS];
    int n_stops;
    int park_after;      // park the session's cache as soon as the answer ends (its client waits on a tool)
    int by_user;         // the session was named by OpenAI's "user" (which clients send on every request, as an
                         //   end user's id): its cache serves the job only while the session is free; where it has
                         //   a job under way or is paused, this one runs without it rather than wait or be refused
                         //   (park, a breakpoint and a resume need their session: for them it is one as "session")
    int kind;            // the owner's kind of request (its endpoint): a paused state resumes through its own
    int brk;             // a breakpoint after `layer`: ends with finish "breakpoint" and rows filled
    uint32_t layer;      //   (a resume's: its paused state's, set by bt_submit)
    uint64_t resume;     // > 0: resumes the paused state brk-<resume> with rows (n_rows floats), the job's own;
    float *rows;         //   ids may then be NULL (the paused prompt), else must be it
    int64_t n_rows;
    int32_t tenant;      // whose request (the server's API key): sessions, paused states and cached prefixes are
                         //   found only by requests of the tenant that made them
    void *owner;         // NULL once the owner left (bt_detach): the job ends at the next step, silently
    // ---- its progress, read by the owner
    int64_t n_gen;       // tokens generated
    int64_t n_reused;    // prompt tokens whose cache was reused (not prefilled)
    int status;          // the HTTP status of the error the job ended with (0: 500)
    int64_t brk_pos;     // the first of its positions: rows (n_ids - brk_pos, dim), a breakpoint's filled
    uint64_t brk_id;     // the paused state a breakpoint made
    // ---- the scheduler's
    int state;           // queued, prefilling, decoding
    int32_t slot;
    int64_t done;        // prompt positions in the slot's cache
    int32_t next;        // the token the last pass picked
    struct bt_session *sess;
    dj_tok_stream *ts;
    dj_held held;
    bt_job *next_queued;
};

// The engine must have slots (step_rows, park, restore): else NULL with e naming what it lacks. c: the model's.
bt_sched *bt_new(dj_engine *eng, const dj_tokenizer *tok, const dj_config *c, const bt_opts *o, const bt_callbacks *cb,
                 dj_err *e);
void bt_free(bt_sched *s);  // jobs still there end without callbacks
// Queues a job under a session name (NULL: none) of its tenant's; a session's jobs run one after the other, in
// order (a job by_user runs without its session instead of waiting, or of a 503 or 409 below). 0; or an HTTP status
// with e set: 503 when every remembered session has a job or is paused; 409 when the session is paused (and j no
// resume of it); a resume: 404 (no such id), 410 (resumed already, dropped, its session deleted or its cache lost),
// 400 (another session, endpoint or prompt, rows of another shape). On an error the caller keeps the job.
int bt_submit(bt_sched *s, bt_job *j, const char *session, dj_err *e);
// The owner left: no more callbacks; the job ends at the next step (a session keeps what its cache holds).
void bt_detach(bt_sched *s, bt_job *j);
int bt_has_work(const bt_sched *s);
// One turn: jobs join, at most prefill_chunk prompt tokens are prefilled, and one decode step runs every sequence
// past its prefill. Callbacks run from here.
void bt_step(bt_sched *s);
// A session's cache parked at once (its client waits on a tool); forgotten altogether. 0; or 404 (no such
// session), 409 (a job of it is queued or running), 500 (the engine failed), with e set. *tokens: the positions its
// cache holds.
int bt_park(bt_sched *s, int32_t tenant, const char *session, int64_t *tokens, dj_err *e);
int bt_forget(bt_sched *s, int32_t tenant, const char *session, dj_err *e);

typedef struct {
    int32_t slots, parallel, active, queued;
    int32_t sessions, sessions_resident, sessions_parked;
    uint64_t parked_bytes;
    uint64_t parks, restores, drops;          // caches parked, restored, dropped (beyond the budget)
    uint64_t park_bytes_total, restore_bytes_total;
    double park_s, restore_s;
    int32_t paused;                           // paused states held
    uint64_t breaks, resumes;                 // breakpoints made, resumed
    uint64_t steps, step_rows;                // decode steps and the rows they ran
    int32_t max_rows;                         // the largest step
    uint64_t prompt_tokens, reused_tokens, prefill_tokens, gen_tokens;
    double prefill_s, decode_s;
    // turns that ran a pass: their time (bt_step's, from admitting to sampling) and the part of it the host spent
    // outside the engine's pass (the scheduler, sampling, the text)
    uint64_t turns;
    double turn_s, turn_host_s;
} bt_stats;
void bt_get_stats(const bt_sched *s, bt_stats *out);
uint64_t bt_generated(const bt_sched *s);  // tokens generated so far

#endif
