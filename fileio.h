// fileio.h: how djinn and the converter touch files, so that no input hangs them or grows them without bound and
// no output replaces an input or is left half-written.
//   inputs   opened without blocking (a FIFO does not hang the open), refused unless a regular file, read with
//            a bound that fits their kind, a short read reported as a file that changed
//   outputs  written as PATH.tmp beside PATH, created and locked (flock) by the writer, renamed onto PATH when
//            complete. A PATH.tmp whose writer died (any signal, a crash: the lock dies with the process) is taken
//            over; one whose writer is alive is refused, so two writers never share one output. PATH itself must
//            be absent or a regular file, and never one of the run's inputs.
//   kills    while PATH.tmp is this process's (from out_open to out_commit or out_abort) its name is kept in a table
//            that out_kill_handler reads, so that a run killed by a signal removes its half-written outputs first.
#ifndef DJINN_FILEIO_H
#define DJINN_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "util.h"

// ---- inputs
// Opens path for reading; `what` names it in errors ("model", "reference", "config.json"). Returns the descriptor
// (close-on-exec, blocking mode for reads), or -1.
int in_open(const char *path, const char *what, struct stat *st, dj_err *e);
// The whole file (at most `max` bytes) into a malloc'd, NUL-terminated buffer; *n without the NUL.
int in_read_all(const char *path, const char *what, size_t max, char **buf, size_t *n, dj_err *e);
// Like in_read_all; an absent file gives *buf = NULL and 0.
int in_read_optional(const char *path, const char *what, size_t max, char **buf, size_t *n, dj_err *e);
// n bytes at offset off, all of them (retrying short reads); a file that ends early is reported as changed.
int in_pread(int fd, void *buf, size_t n, uint64_t off, const char *path, dj_err *e);
// 0 while the file behind fd is the one in_open saw (size and modification time), else an error naming path.
int in_unchanged(int fd, const struct stat *st, const char *path, dj_err *e);

// ---- outputs
// 1 when a and b name the same file: the same device and inode, or, for a path that does not exist yet, the same
// name in the same folder.
int same_file(const char *a, const char *b);
// Checks an output before any long work: its folder exists, PATH is absent or a regular file, and it is none of
// `others` (the run's inputs, and its other outputs). `what` names it ("--logits").
int out_check(const char *path, const char *what, const char *const *others, int n_others, dj_err *e);

typedef struct {
    int fd;              // -1: closed
    char *path, *tmp;    // malloc'd
    const char *what;
    int kill_slot;       // its place in out_kill_handler's table; -1: none
} dj_out;
// out_check, then PATH.tmp created (or taken over from a dead writer) and locked, empty, and its name kept for
// out_kill_handler until out_commit or out_abort.
int out_open(dj_out *o, const char *path, const char *what, const char *const *others, int n_others, dj_err *e);
int out_write(dj_out *o, const void *p, size_t n, dj_err *e);
// n bytes at offset off of PATH.tmp, leaving the descriptor's position alone (threads may write their parts side by
// side); out_seek then sets the position for the writes that follow.
int out_pwrite(const dj_out *o, const void *p, size_t n, uint64_t off, dj_err *e);
int out_seek(dj_out *o, uint64_t off, dj_err *e);
// Flushes to disk (sync: fsync first), closes and renames PATH.tmp onto PATH.
int out_commit(dj_out *o, int sync, dj_err *e);
// Closes and removes PATH.tmp (while it is this writer's); safe on a closed or zeroed dj_out.
void out_abort(dj_out *o);

// ---- outputs of a killed run
// The table holds OUT_KILL_SLOTS names at once, more than the five outputs djinn can write in one run (the
// converter writes one). A PATH.tmp that finds no free slot is not kept: a kill leaves it, and the next run writing
// PATH takes it over (its lock died with this process).
enum { OUT_KILL_SLOTS = 8 };
// Removes every PATH.tmp this process holds open, then dies of sig (its default action). Async-signal-safe.
void out_kill_handler(int sig);
// out_kill_handler for SIGTERM and SIGHUP; a program that handles SIGINT itself installs it there when it wants a
// Ctrl-C to kill. The handler may only be installed for these three: fileio holds them while a name changes.
void out_kill_arm(void);

// stdout flushed: 0, or -1 with "cannot write to stdout: REASON" (a full disk, a closed file, a reader gone) in e.
int stdout_flush(dj_err *e);

#endif
