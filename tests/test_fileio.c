// test_fileio.c: the outputs' kill table (fileio.h), in a child process killed while it holds outputs open: its
// PATH.tmp files are removed, and only those it holds: one committed or aborted is released (a PATH.tmp of that name
// made since by another writer is left), one a live writer holds is never taken, a dead writer's taken over is held;
// a slot released is used again, and the outputs past OUT_KILL_SLOTS are left to the next run's takeover.
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../fileio.h"
#include "common.h"

static int exists(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

// DIR/name as a foreign file (another writer's), holding "x".
static void write_foreign(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1 || close(fd)) _exit(100);
}

// In the child: DIR/name opened as an output; a failure ends the child with exit `code`.
static void open_or_exit(dj_out *o, const char *dir, const char *name, int code) {
    char p[4200];
    dj_err e;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (out_open(o, p, name, NULL, 0, &e)) _exit(code);
}

// Runs body(dir) in a child that armed out_kill_handler (fileio's own, as djinn and the converter do), then kills
// it with sig once body is done: the child must die of sig. A body that fails exits with the number of its step.
static void killed_after(void (*body)(const char *dir), const char *dir, int sig) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        out_kill_arm();
        signal(SIGINT, out_kill_handler);
        body(dir);
        if (write(p[1], "r", 1) != 1) _exit(101);
        for (;;) pause();
    }
    close(p[1]);
    char c;
    if (read(p[0], &c, 1) == 1) kill(pid, sig);
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == sig, "signal %d: the child ended with status %#x (exit %d: its step)",
              sig, st, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

// a.bin committed and b.bin aborted, each tmp then made again by another writer; c.bin and d.bin held
static void commit_abort_hold(const char *dir) {
    dj_out a, b, c, d;
    dj_err e;
    open_or_exit(&a, dir, "a.bin", 1), open_or_exit(&b, dir, "b.bin", 2);
    open_or_exit(&c, dir, "c.bin", 3), open_or_exit(&d, dir, "d.bin", 4);
    if (out_write(&a, "a", 1, &e) || out_commit(&a, 0, &e)) _exit(5);
    out_abort(&b);
    write_foreign(dir, "a.bin.tmp"), write_foreign(dir, "b.bin.tmp");
}

Test(fileio, kill_removes_the_tmp_files_held_and_no_other) {
    const int sigs[] = {SIGTERM, SIGHUP, SIGINT};
    for (int k = 0; k < 3; k++) {
        char *dir = tc_tmpdir("fileio");
        killed_after(commit_abort_hold, dir, sigs[k]);
        cr_expect(!exists(dir, "c.bin.tmp") && !exists(dir, "d.bin.tmp"), "signal %d: a held tmp was left", sigs[k]);
        cr_expect(exists(dir, "a.bin") && !exists(dir, "c.bin") && !exists(dir, "d.bin"), "signal %d", sigs[k]);
        cr_expect(exists(dir, "a.bin.tmp"), "signal %d: removed another writer's tmp of a committed output", sigs[k]);
        cr_expect(exists(dir, "b.bin.tmp"), "signal %d: removed another writer's tmp of an aborted output", sigs[k]);
        tc_rm_rf(dir);
        free(dir);
    }
}

// live.bin.tmp is locked by the test (a live writer): refused, so not this child's; dead.bin.tmp's writer is gone:
// taken over, so this child's
static void refused_and_taken_over(const char *dir) {
    dj_out live, dead;
    char p[4200];
    dj_err e;
    snprintf(p, sizeof p, "%s/live.bin", dir);
    if (!out_open(&live, p, "live", NULL, 0, &e)) _exit(1);
    open_or_exit(&dead, dir, "dead.bin", 2);
}

Test(fileio, kill_leaves_a_live_writers_tmp_and_removes_one_taken_over) {
    char *dir = tc_tmpdir("fileio"), live[4200], dead[4200];
    snprintf(live, sizeof live, "%s/live.bin.tmp", dir);
    snprintf(dead, sizeof dead, "%s/dead.bin.tmp", dir);
    tc_write(live, "busy", 4), tc_write(dead, "stale", 5);
    int held = open(live, O_RDWR);
    cr_assert(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    killed_after(refused_and_taken_over, dir, SIGTERM);
    char *left = tc_read(live, NULL);
    cr_expect(left && !strcmp(left, "busy"), "the live writer's tmp was touched");
    cr_expect(!exists(dir, "dead.bin.tmp"), "a tmp taken over from a dead writer was left");
    free(left);
    close(held);
    tc_rm_rf(dir);
    free(dir);
}

// OUT_KILL_SLOTS outputs committed, then OUT_KILL_SLOTS + 2 held: the slots the first freed name the first of these
static void slots_used_again(const char *dir) {
    dj_out o[OUT_KILL_SLOTS + 2];
    char name[32];
    dj_err e;
    for (int k = 0; k < OUT_KILL_SLOTS; k++) {
        snprintf(name, sizeof name, "first%d", k);
        open_or_exit(&o[k], dir, name, 1);
        if (out_commit(&o[k], 0, &e)) _exit(2);
    }
    for (int k = 0; k < OUT_KILL_SLOTS + 2; k++) {
        snprintf(name, sizeof name, "then%d", k);
        open_or_exit(&o[k], dir, name, 3);
    }
}

Test(fileio, slots_freed_are_used_again_and_outputs_past_them_left) {
    char *dir = tc_tmpdir("fileio"), name[32];
    killed_after(slots_used_again, dir, SIGTERM);
    for (int k = 0; k < OUT_KILL_SLOTS + 2; k++) {
        snprintf(name, sizeof name, "then%d.tmp", k);
        if (k < OUT_KILL_SLOTS) cr_expect(!exists(dir, name), "%s was left: its slot was not free", name);
        else cr_expect(exists(dir, name), "%s, past the table, was removed", name);
    }
    tc_rm_rf(dir);
    free(dir);
}
