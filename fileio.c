// fileio.c: inputs that cannot hang or flood, outputs that cannot clobber or be left half-written (fileio.h).
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

// ---- inputs
static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a folder" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int in_open(const char *path, const char *what, struct stat *st, dj_err *e) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return dj_fail(e, "cannot open %s %s: %s", what, path, strerror(errno));
    if (fstat(fd, st)) {
        int err = errno;
        close(fd);
        return dj_fail(e, "cannot read %s %s: %s", what, path, strerror(err));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return dj_fail(e, "%s %s is %s, not a regular file", what, path, kind_of(st->st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
        int err = errno;
        close(fd);
        return dj_fail(e, "cannot read %s %s: %s", what, path, strerror(err));
    }
    return fd;
}

int in_pread(int fd, void *buf, size_t n, uint64_t off, const char *path, dj_err *e) {
    uint8_t *b = buf;
    while (n) {
        ssize_t got = pread(fd, b, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return dj_fail(e, "read error in %s at byte %llu: %s", path, (unsigned long long)off, strerror(errno));
        if (got == 0)
            return dj_fail(e, "%s ended at byte %llu, before its expected end (truncated or changed while read)", path,
                           (unsigned long long)off);
        b += got, n -= (size_t)got, off += (uint64_t)got;
    }
    return 0;
}

int in_unchanged(int fd, const struct stat *st, const char *path, dj_err *e) {
    struct stat now;
    if (fstat(fd, &now) || now.st_size != st->st_size || now.st_mtim.tv_sec != st->st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != st->st_mtim.tv_nsec)
        return dj_fail(e, "%s changed while it was read: run again once it is complete", path);
    return 0;
}

static int read_all(const char *path, const char *what, size_t max, int optional, char **buf, size_t *n, dj_err *e) {
    *buf = NULL, *n = 0;
    struct stat st;
    if (optional && access(path, F_OK) && errno == ENOENT) return 0;
    int fd = in_open(path, what, &st, e);
    if (fd < 0) return -1;
    int rc = -1;
    if ((uint64_t)st.st_size > max) {
        if (max >> 20)
            dj_fail(e, "%s %s is %lld bytes, more than the %zu MB such a file may have", what, path,
                    (long long)st.st_size, max >> 20);
        else  // a limit under 1 MB (a steering vector's): in bytes, not "0 MB"
            dj_fail(e, "%s %s is %lld bytes, more than the %zu bytes such a file may have", what, path,
                    (long long)st.st_size, max);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    char *b = malloc(size + 1);
    if (!b) {
        dj_fail(e, "out of memory reading %s", path);
        goto out;
    }
    if (in_pread(fd, b, size, 0, path, e) || in_unchanged(fd, &st, path, e)) {
        free(b);
        goto out;
    }
    b[size] = 0;
    *buf = b, *n = size;
    rc = 0;
out:
    close(fd);
    return rc;
}

int in_read_all(const char *path, const char *what, size_t max, char **buf, size_t *n, dj_err *e) {
    return read_all(path, what, max, 0, buf, n, e);
}

int in_read_optional(const char *path, const char *what, size_t max, char **buf, size_t *n, dj_err *e) {
    return read_all(path, what, max, 1, buf, n, e);
}

// ---- outputs
// The folder and file name of path (copies; free both).
static void split_path(const char *path, char **dir, char **name) {
    char *a = strdup(path), *b = strdup(path);
    *dir = a ? strdup(dirname(a)) : NULL;
    *name = b ? strdup(basename(b)) : NULL;
    free(a), free(b);
}

int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    int ha = stat(a, &sa) == 0, hb = stat(b, &sb) == 0;
    if (ha && hb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ha || hb) return 0;
    char *da, *na, *db, *nb;
    split_path(a, &da, &na);
    split_path(b, &db, &nb);
    // two absent names: the same name in the same (existing) folder
    int same = da && na && db && nb && !strcmp(na, nb) && stat(da, &sa) == 0 && same_file(da, db);
    free(da), free(na), free(db), free(nb);
    return same;
}

int out_check(const char *path, const char *what, const char *const *others, int n_others, dj_err *e) {
    struct stat st;
    if (!*path) return dj_fail(e, "%s: an empty path", what);
    if (lstat(path, &st) == 0) {
        struct stat target;
        if (S_ISLNK(st.st_mode) && stat(path, &target) == 0) st = target;
        if (!S_ISLNK(st.st_mode) && !S_ISREG(st.st_mode))
            return dj_fail(e, "%s %s is %s: give the path of a regular file to write", what, path, kind_of(st.st_mode));
    }
    for (int i = 0; i < n_others; i++)
        if (others[i] && same_file(path, others[i]))
            return dj_fail(e, "%s %s is the same file as %s: it would be overwritten; write elsewhere", what, path,
                           others[i]);
    char *dir, *name;
    split_path(path, &dir, &name);
    int ok = dir && stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
    int rc = ok ? 0 : dj_fail(e, "%s %s: the folder %s does not exist", what, path, dir ? dir : "?");
    free(dir), free(name);
    return rc;
}

// Creates (or takes over) path.tmp, locked: a tmp held by a live writer is refused; a stale one (its writer died,
// releasing the lock) is reused. The inode locked must still be the one at the path (a writer finishing renames
// its tmp away between our open and our lock).
static int open_tmp(dj_out *o, dj_err *e) {
    for (int tries = 0; tries < 8; tries++) {
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0) {
            if (errno == ELOOP) return dj_fail(e, "%s is a symbolic link: remove it and run again", o->tmp);
            return dj_fail(e, "cannot create %s: %s", o->tmp, strerror(errno));
        }
        struct stat a, b;
        if (fstat(fd, &a) || !S_ISREG(a.st_mode)) {
            close(fd);
            return dj_fail(e, "%s exists and is not a regular file: remove it and run again", o->tmp);
        }
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int err = errno;
            close(fd);
            if (err == EWOULDBLOCK)
                return dj_fail(e, "another process is writing %s (it holds %s): wait for it to finish", o->path,
                               o->tmp);
            return dj_fail(e, "cannot lock %s: %s", o->tmp, strerror(err));
        }
        if (stat(o->tmp, &b) || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
            close(fd);  // renamed or removed meanwhile: a fresh one
            continue;
        }
        if (ftruncate(fd, 0)) {
            int err = errno;
            close(fd);
            return dj_fail(e, "cannot write %s: %s", o->tmp, strerror(err));
        }
        o->fd = fd;
        return 0;
    }
    return dj_fail(e, "%s keeps changing under this process: is another one writing %s?", o->tmp, o->path);
}

// ---- the table a kill reads
// A slot is written only while the signals are held in the writing thread; `owned` goes up after its name is
// complete, so a handler that sees it set reads a whole name.
static struct {
    char tmp[PATH_MAX];  // every name open() accepted fits: it refuses one of PATH_MAX bytes or more
    volatile sig_atomic_t owned;
} kill_table[OUT_KILL_SLOTS];

// The signals whose handler may remove o->tmp are held while the file and its slot change together.
static void hold(sigset_t *old) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT), sigaddset(&s, SIGTERM), sigaddset(&s, SIGHUP);
    sigprocmask(SIG_BLOCK, &s, old);
}

// A free slot naming tmp (created by open_tmp, so it fits), or -1: none free (fileio.h says what a kill then leaves).
static int kill_claim(const char *tmp) {
    size_t n = strlen(tmp);
    for (int k = 0; k < OUT_KILL_SLOTS; k++)
        if (!kill_table[k].owned) {
            memcpy(kill_table[k].tmp, tmp, n + 1);
            atomic_thread_fence(memory_order_release);  // a handler on another thread must not see the flag first
            kill_table[k].owned = 1;
            return k;
        }
    return -1;
}

static void kill_release(dj_out *o) {
    if (o->kill_slot >= 0) kill_table[o->kill_slot].owned = 0;
    o->kill_slot = -1;
}

void out_kill_handler(int sig) {
    for (int k = 0; k < OUT_KILL_SLOTS; k++)
        if (kill_table[k].owned) unlink(kill_table[k].tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

void out_kill_arm(void) {
    signal(SIGTERM, out_kill_handler);
    signal(SIGHUP, out_kill_handler);
}

int out_open(dj_out *o, const char *path, const char *what, const char *const *others, int n_others, dj_err *e) {
    memset(o, 0, sizeof *o);
    o->fd = -1, o->what = what, o->kill_slot = -1;
    if (out_check(path, what, others, n_others, e)) return -1;
    o->path = strdup(path);
    o->tmp = malloc(strlen(path) + 5);
    if (!o->path || !o->tmp) {
        out_abort(o);
        return dj_fail(e, "out of memory");
    }
    sprintf(o->tmp, "%s.tmp", path);
    for (int i = 0; i < n_others; i++)
        if (others[i] && same_file(o->tmp, others[i])) {
            out_abort(o);
            return dj_fail(e, "%s would be written as %s.tmp, which is %s: write elsewhere", what, path, others[i]);
        }
    sigset_t old;
    hold(&old);
    int rc = open_tmp(o, e);
    if (!rc) o->kill_slot = kill_claim(o->tmp);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (rc) out_abort(o);
    return rc;
}

int out_write(dj_out *o, const void *p, size_t n, dj_err *e) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(o->fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dj_fail(e, "writing %s: %s", o->tmp, k < 0 ? strerror(errno) : "no space left");
        b += k, n -= (size_t)k;
    }
    return 0;
}

int out_pwrite(const dj_out *o, const void *p, size_t n, uint64_t off, dj_err *e) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = pwrite(o->fd, b, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dj_fail(e, "writing %s: %s", o->tmp, k < 0 ? strerror(errno) : "no space left");
        b += k, n -= (size_t)k, off += (uint64_t)k;
    }
    return 0;
}

int out_seek(dj_out *o, uint64_t off, dj_err *e) {
    if (lseek(o->fd, (off_t)off, SEEK_SET) < 0) return dj_fail(e, "writing %s: %s", o->tmp, strerror(errno));
    return 0;
}

int out_commit(dj_out *o, int sync, dj_err *e) {
    if (sync && fsync(o->fd)) return dj_fail(e, "writing %s: %s", o->tmp, strerror(errno));
    // Renamed while still locked, so that no other writer can take the tmp over between the rename and the close.
    sigset_t old;
    hold(&old);
    int rc = 0;
    if (rename(o->tmp, o->path)) rc = dj_fail(e, "cannot rename %s to %s: %s", o->tmp, o->path, strerror(errno));
    else kill_release(o);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (rc) return -1;
    int fd = o->fd;
    o->fd = -1;
    if (close(fd)) return dj_fail(e, "writing %s: %s", o->path, strerror(errno));
    free(o->path), free(o->tmp);
    o->path = o->tmp = NULL;
    return 0;
}

void out_abort(dj_out *o) {
    if (o->tmp && o->fd >= 0) {
        sigset_t old;
        hold(&old);
        unlink(o->tmp);  // still locked: it is ours
        kill_release(o);
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(o->fd);
        o->fd = -1;
    }
    free(o->path), free(o->tmp);
    o->path = o->tmp = NULL;
}

int stdout_flush(dj_err *e) {
    if (fflush(stdout) || ferror(stdout)) return dj_fail(e, "cannot write to stdout: %s", strerror(errno));
    return 0;
}
