/* seldp-harness under mpirun, one rank per process: entries of the regression matrix on as
 * many ranks as processes pass every check (and the checks tested something); --backend
 * auto picks a multi-process transport under mpirun; only rank 0 prints; a planted defect
 * fails on every rank (exit 1); a rank that fails stops every rank at once; a world other
 * than the process count is a usage error on every rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_mpi.h"

/* The report in dir (rank 0's) passed with the grads, routing and initialize checks tested,
 * on a world of every process over MPI; false, with the reason printed, otherwise. */
static bool report_ok(const char *dir, const char *args)
{
    bool ok = true;
    hx_json *report = hx_test_report(dir);
    const hx_json *options = hx_json_get(report, "options");
    const hx_json *transport = options ? hx_json_get(options, "transport") : NULL;
    const hx_json *passed = hx_json_get(report, "passed");
    if (!options || hx_test_int(options, "world") != mt_size || !transport ||
        (strcmp(transport->string, "mpi") != 0 && strcmp(transport->string, "nccl") != 0) ||
        !passed || !passed->boolean) {
        print_error("%s: report.json: not a passed run of %d ranks over MPI\n", args, mt_size);
        ok = false;
    }
    static const char *const checks[] = {
        "reduced gradients vs the FP64 reference", "replicas equal their root after initialize",
        "tokens per expert equal the reference's", "reduced gradients bit-identical in each group"};
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        int64_t tested = 0, failed = 0;
        hx_test_check(report, checks[i], &tested, &failed);
        if (tested == 0 || failed != 0) {
            print_error("%s: \"%s\" tested %lld, failed %lld\n", args, checks[i], (long long)tested,
                        (long long)failed);
            ok = false;
        }
    }
    hx_json_free(report);
    return ok;
}

static void run_entry(const char *args)
{
    const char *dir = hm_dir("entry");
    hx_test_run run;
    hx_test_harness(&run, "--backend mpi %s --steps 2 --tokens 24 --quiet --timeout 20 --out %s",
                    args, dir);
    hm_expect_status(&run, HX_EXIT_PASS, args);
    hm_expect_everywhere(mt_rank != 0 || report_ok(dir, args), args);
}

static void test_matrix_entries(void **state)
{
    (void)state;
    int W = mt_size, half = mt_size / 2 ? mt_size / 2 : 1;
    char args[512];
    snprintf(args, sizeof args,
             "--world %d --ep %d --dtype bf16 --quant none --expert-reduce sum --policy error "
             "--seed 71",
             W, W);
    run_entry(args);
    snprintf(args, sizeof args,
             "--world %d --ep %d --order dp-ep --dtype f16 --quant nf4 --expert-reduce mean "
             "--policy zero --seed 72",
             W, half);
    run_entry(args);
    snprintf(args, sizeof args,
             "--world %d --ep 1 --dtype f32 --quant awq --expert-reduce sum --policy zero "
             "--fp32-master --seed 73",
             W);
    run_entry(args);
    snprintf(args, sizeof args,
             "--world %d --ep %d --dtype bf16 --expert-reduce mean --roots spread --experts 4 "
             "--seed 74",
             W, half);
    run_entry(args);
}

static void test_auto_under_mpirun(void **state)
{
    (void)state;
    const char *dir = hm_dir("auto");
    hx_test_run run;
    /* no --backend, no --world: mpirun decides */
    hx_test_harness(&run, "--steps 1 --tokens 16 --timeout 20 --out %s", dir);
    hm_expect_status(&run, HX_EXIT_PASS, "seldp-harness under mpirun");
    bool ok = mt_rank != 0 || report_ok(dir, "auto");
    /* rank 0 prints the progress and the result; the other ranks stay silent */
    if (mt_rank == 0 && (!strstr(run.out, "one per MPI process") || !strstr(run.out, "step 1/1") ||
                         !strstr(run.out, "result: PASS"))) {
        print_error("rank 0 printed:\n%s\n", run.out);
        ok = false;
    } else if (mt_rank != 0 && (run.out[0] || run.err[0])) {
        print_error("rank %d printed:\n%s%s\n", mt_rank, run.out, run.err);
        ok = false;
    }
    hm_expect_everywhere(ok, "output under mpirun");
}

static void test_planted_defects_fail_everywhere(void **state)
{
    (void)state;
    static const char *const faults[] = {"grad", "replica"};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        hx_test_run run;
        char what[64];
        snprintf(what, sizeof what, "--inject %s", faults[i]);
        hx_test_harness(&run,
                        "--backend mpi --inject %s --steps 1 --tokens 16 --timeout 20 --quiet "
                        "--out none",
                        faults[i]);
        hm_expect_status(&run, HX_EXIT_FAIL, what);
        bool reported = mt_rank != 0 || strstr(run.out, "result: FAIL");
        if (!reported)
            print_error("%s: rank 0 printed no failure:\n%s\n", what, run.out);
        hm_expect_everywhere(reported, what);
    }
}

/* The last rank fails in its first step: every rank stops at once (long before the
 * timeout) with exit 1, the failing rank with its own reason, the others with the abort. */
static void test_failing_rank_stops_everyone(void **state)
{
    (void)state;
    hx_test_run run;
    double t0 = mt_now();
    hx_test_harness(&run, "--backend mpi --inject fail --steps 2 --tokens 16 --timeout 30 "
                          "--quiet --out none");
    double took = mt_now() - t0;
    hm_expect_status(&run, HX_EXIT_FAIL, "--inject fail");
    const char *want =
        mt_rank == mt_size - 1 ? "--inject fail: a planted failure in step 1" : "aborted the world";
    bool ok = strstr(run.err, want) != NULL && took < 15.0;
    if (!ok)
        print_error("rank %d: after %.1f s printed '%s', expected '%s'\n", mt_rank, took, run.err,
                    want);
    hm_expect_everywhere(ok, "a failing rank stops every rank");
}

/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool same = hx_read_file(a, &x, &nx) == SELDP_OK && hx_read_file(b, &y, &ny) == SELDP_OK &&
                nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* A sharded grid, one rank per process: it passes, a planted bug is named, and its dump equals
 * the same run's on threads bit for bit (rank 0 runs that one in-process). */
static void test_sharded_grid(void **state)
{
    (void)state;
    const char *grid = mt_size == 4 ? "--framework megatron --tp 2 --pp 2 --ep 1"
                                    : "--framework megatron --tp 2 --ep 1";
    char mpi_dir[1200], thr_dir[1400], args[512];
    snprintf(mpi_dir, sizeof mpi_dir, "%s", hm_dir("grid"));
    snprintf(args, sizeof args, "%s --steps 2 --tokens 24 --timeout 20 --quiet --out none", grid);
    hx_test_run run;
    hx_test_harness(&run, "--backend mpi %s --dump %s/mpi", args, mpi_dir);
    hm_expect_status(&run, HX_EXIT_PASS, grid);
    bool ok = true;
    if (mt_rank == 0) {
        hx_test_run threads;
        snprintf(thr_dir, sizeof thr_dir, "%s/threads", mpi_dir);
        hx_test_harness(&threads, "--backend host --world %d %s --dump %s", mt_size, args, thr_dir);
        ok = threads.status == HX_EXIT_PASS;
        static const char *const files[] = {"manifest.json", "rank0.safetensors",
                                            "rank1.safetensors"};
        for (size_t i = 0; ok && i < 3; i++) {
            char a[1600], b[1600];
            snprintf(a, sizeof a, "%s/mpi/%s", mpi_dir, files[i]);
            snprintf(b, sizeof b, "%s/%s", thr_dir, files[i]);
            ok = same_file(a, b);
            if (!ok)
                print_error("%s: %s differs between processes and threads\n", grid, files[i]);
        }
    }
    hm_expect_everywhere(ok, "a sharded grid under mpirun");
    if (mt_size != 4)
        return; /* tp 2 on 2 ranks: the tied embedding has one copy, nothing to plant */
    hx_test_harness(&run,
                    "--backend mpi %s --inject tied-twice --steps 1 --tokens 24 --timeout 20 "
                    "--out none",
                    grid);
    hm_expect_status(&run, HX_EXIT_FAIL, "a planted bug on a sharded grid");
    ok = mt_rank != 0 || strstr(run.out, "the tied embedding reduced twice?") != NULL;
    if (!ok)
        print_error("no diagnosis of tied-twice:\n%s\n", run.out);
    hm_expect_everywhere(ok, "a planted bug named under mpirun");
}

static void test_world_must_match_processes(void **state)
{
    (void)state;
    hx_test_run run;
    char args[128], want[128];
    snprintf(args, sizeof args, "--backend mpi --world %d --ep 1 --out none", mt_size + 1);
    hx_test_harness(&run, "%s", args);
    hm_expect_status(&run, HX_EXIT_USAGE, args);
    snprintf(want, sizeof want, "--world %d: mpirun started %d processes", mt_size + 1, mt_size);
    bool said = strstr(run.err, want) != NULL;
    if (!said)
        print_error("rank %d: '%s' printed '%s', expected '%s'\n", mt_rank, args, run.err, want);
    hm_expect_everywhere(said, args);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_matrix_entries),
        MT_TEST(test_auto_under_mpirun),
        MT_TEST(test_planted_defects_fail_everywhere),
        MT_TEST(test_failing_rank_stops_everyone),
        MT_TEST(test_world_must_match_processes),
        MT_TEST(test_sharded_grid),
    };
    return mt_main(argc, argv, "mpi_harness", tests, sizeof tests / sizeof tests[0]);
}
