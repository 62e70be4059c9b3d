/* --save / --resume under mpirun, one rank per process: each process writes its own shard and
 * rank 0 the index; resuming at step 2 and training to 4 equals an uninterrupted run to 4 bit
 * for bit; a checkpoint saved by 8 rank threads in one process resumes on the processes within
 * FP32's tolerance of the uninterrupted 8-rank run. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt_test.h"
#include "cli.h"
#include "harness_mpi.h"

#define ARGS "--dtype f32 --global-batch 96 --quiet --timeout 30 --out none"

static char *dir_of(const char *name)
{
    char *d = strdup(hm_dir(name));
    assert_non_null(d);
    return d;
}

static void run_all(const char *what, const char *fmt, ...)
{
    char args[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    hx_test_run run;
    hx_test_harness(&run, "%s", args);
    hm_expect_status(&run, HX_EXIT_PASS, what);
}

static void test_resume_same_layout(void **state)
{
    (void)state;
    char *full = dir_of("full"), *k = dir_of("k"), *resumed = dir_of("resumed");
    int ep = mt_size >= 2 ? 2 : 1;
    run_all("uninterrupted", "--backend mpi --ep %d --steps 4 " ARGS " --save %s", ep, full);
    run_all("to step 2", "--backend mpi --ep %d --steps 2 " ARGS " --save %s", ep, k);
    run_all("resumed", "--backend mpi --ep %d --steps 4 " ARGS " --resume %s --save %s", ep, k,
            resumed);
    if (mt_rank == 0) {
        ckpt_test a, b;
        ckpt_test_read(full, &a);
        ckpt_test_read(resumed, &b);
        ckpt_test_same(&a, &b, "resumed under mpirun");
        ckpt_test_free(&a);
        ckpt_test_free(&b);
    }
    free(full);
    free(k);
    free(resumed);
}

static void test_threads_to_processes(void **state)
{
    (void)state;
    char *full = dir_of("threads-full"), *k = dir_of("threads-k");
    char *resumed = dir_of("processes-resumed");
    bool ok = true;
    if (mt_rank == 0) {
        hx_test_run run;
        hx_test_harness(&run, "--backend host --world 8 --ep 4 --steps 4 " ARGS " --save %s", full);
        ok = run.status == HX_EXIT_PASS;
        hx_test_harness(&run, "--backend host --world 8 --ep 4 --steps 2 " ARGS " --save %s", k);
        ok = ok && run.status == HX_EXIT_PASS;
        if (!ok)
            print_error("the in-process runs failed: %s\n", run.err);
    }
    hm_expect_everywhere(ok, "in-process runs of 8 ranks");
    run_all("resumed on the processes",
            "--backend mpi --ep 1 --steps 4 " ARGS " --resume %s --save %s", k, resumed);
    if (mt_rank == 0) {
        ckpt_test a, b;
        ckpt_test_read(full, &a);
        ckpt_test_read(resumed, &b);
        char worst[160] = "";
        double d = ckpt_test_distance(&b, &a, worst, sizeof worst);
        if (!(d <= 1e-5))
            fail_msg("8 threads -> %d processes: %s differs by %.3e", mt_size, worst, d);
        ckpt_test_free(&a);
        ckpt_test_free(&b);
    }
    free(full);
    free(k);
    free(resumed);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_resume_same_layout),
        MT_TEST(test_threads_to_processes),
    };
    return mt_main(argc, argv, "mpi_checkpoint", tests, sizeof tests / sizeof tests[0]);
}
