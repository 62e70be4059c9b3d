/* A save killed at a random point (a child process running seldp-harness --save-every 1, sent
 * SIGKILL) never leaves the previous checkpoint unloadable and never gets a half-written one
 * accepted: after every kill the directory's index.json names a complete checkpoint whose
 * every byte checks, of a step no older than the last one seen, and a resume from it runs.
 *
 * The default run kills 40 children; with the argument "full" (label slow) 150. The kill times
 * are drawn from a fixed seed over the measured length of an uninterrupted child, so that
 * they land in every phase: shard writes, fsyncs, renames, the index, the clean-up. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "cli.h"
#include "harness_test.h"
#include "options.h"

#define CHILD_ARGS                                                                                 \
    "--world 4 --ep 2 --dtype bf16 --global-batch 32 --d-model 32 --d-ff 64 --steps 40 "           \
    "--save-every 1 --quiet --out none"

static int kills = 40;
static char dir[1024];

static void split(char *line, char **argv, int *argc)
{
    *argc = 0;
    argv[(*argc)++] = "seldp-harness";
    for (char *tok = strtok(line, " "); tok && *argc < 63; tok = strtok(NULL, " "))
        argv[(*argc)++] = tok;
    argv[*argc] = NULL;
}

/* A child that trains and saves after every step; the parent kills it after `delay_s`
 * (never, when negative). Returns true when the child was killed before it exited. */
static bool child_run(double delay_s)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char line[1400];
        char *argv[64];
        int argc = 0;
        snprintf(line, sizeof line, CHILD_ARGS " --save %s", dir);
        split(line, argv, &argc);
        FILE *null = fopen("/dev/null", "w");
        _exit(hx_main(argc, argv, null ? null : stdout, null ? null : stderr));
    }
    if (delay_s >= 0) {
        struct timespec ts = {(time_t)delay_s, (long)((delay_s - (double)(time_t)delay_s) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        return true;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), HX_EXIT_PASS);
    return false;
}

/* The directory's file names, one per line between newlines. */
static void listing(char *buf, size_t size)
{
    size_t len = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    buf[len++] = '\n';
    for (struct dirent *e; (e = readdir(d)) && len + strlen(e->d_name) + 2 < size;)
        len += (size_t)snprintf(buf + len, size - len, "%s\n", e->d_name);
    buf[len] = '\0';
    closedir(d);
}

/* Files of a save that did not finish: temporary files and shards that the index does not
 * name and that were not there before (`before`, from listing). */
static int leftovers(const char *before)
{
    int n = 0;
    char line[300];
    DIR *d = opendir(dir);
    assert_non_null(d);
    char *index = NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/index.json", dir);
    assert_int_equal(hx_read_file(path, &index, NULL), SELDP_OK);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "index.json") == 0)
            continue;
        snprintf(line, sizeof line, "\n%s\n", e->d_name);
        n += strstr(index, e->d_name) == NULL && strstr(before, line) == NULL;
    }
    closedir(d);
    free(index);
    return n;
}

static void test_kill_during_save(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "%s/ckpt", hx_test_dir(kills > 40 ? "kill-full" : "kill"));
    char line[1400];
    char *argv[64];
    int argc = 0;
    snprintf(line, sizeof line, CHILD_ARGS " --save %s", dir);
    split(line, argv, &argc);
    hx_options opts;
    hx_options_default(&opts);
    assert_int_equal(hx_options_parse(argc, argv, &opts, stdout, stderr), HX_PARSE_RUN);

    /* an uninterrupted child: the first complete checkpoint, and the length of a run */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_false(child_run(-1));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double length = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    uint64_t rng = 0x5eed5eedULL;
    int killed = 0, interrupted = 0, resumed = 0;
    static char before[1 << 16];
    for (int i = 0; i < kills; i++) {
        listing(before, sizeof before);
        /* skip the start-up (threads, groups) most of the time: aim at the saves */
        double u = (double)(tm_splitmix64(&rng) >> 11) * 0x1.0p-53;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (!child_run(u * length)) {
            /* finished before the kill: a complete run, nothing to learn but that a run takes
             * no longer than this (the first run's length may have been stretched by a busy
             * machine; the kills aim inside the shortest bound seen) */
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double took =
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            length = took < length ? took : length;
            continue;
        }
        killed++;
        hx_ckpt *c = NULL;
        seldp_status st = hx_ckpt_open(dir, &c);
        if (st == SELDP_OK)
            st = hx_ckpt_verify(c, &opts);
        if (st != SELDP_OK)
            fail_msg("kill %d at %.3f s: the checkpoint left behind does not load: %s", i + 1,
                     u * length, hx_last_error());
        int step = hx_ckpt_step(c);
        hx_ckpt_close(c);
        assert_true(step >= 1);
        interrupted += leftovers(before) > 0;
        if (i % 10 == 0) {
            hx_test_run run;
            hx_test_harness(&run,
                            "--world 2 --ep 1 --dtype bf16 --global-batch 32 --steps %d --quiet "
                            "--out none --resume %s",
                            step + 1, dir);
            if (run.status != HX_EXIT_PASS)
                fail_msg("resume after kill %d: exit %d\n%s", i + 1, run.status, run.err);
            resumed++;
        }
    }
    print_message("%d children killed (%d inside a save, leaving its files behind), %d "
                  "checkpoints verified, %d resumed, 0 refused, 0 half-written accepted\n",
                  killed, interrupted, killed, resumed);
    assert_true(killed >= kills / 2);
    assert_true(interrupted > 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "full") == 0)
        kills = 150;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_during_save),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
