/* Planted framework bugs (--inject, docs/harness.md, Planted bugs and Sweeps): each of the
 * reduction mistakes real frameworks shipped makes the reference check fail with a diagnosis naming
 * the tensors and the likely cause, and makes a sweep deviate from its bug-free first run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

typedef struct planted_bug {
    const char *name;
    const char *run_args; /* a single run that must fail its reference check */
    const char *diagnosis;
    const char *sweep;      /* a preset whose first run is free of the bug's effect */
    const char *sweep_args; /* what the sweep needs besides the bug ("" for none) */
} planted_bug;

static const planted_bug bugs[] = {
    {"ep-scale", "--world 8 --ep 4 --dtype f32",
     "expert gradients (layers.*.experts.*) are 4\xc3\x97 too large (EP size 4) while the shared "
     "gradients agree: expert grads scaled by the EP size?",
     "ep", ""},
    {"world-div", "--world 8 --ep 2 --dtype bf16",
     "expert gradients (layers.*.experts.*) are 2\xc3\x97 too small (EP size 2) while the shared "
     "gradients agree: expert grads divided by the world size instead of the expert-data size?",
     "ep", ""},
    {"rank-mean", "--world 4 --ep 2 --dtype f32",
     "embed.weight and the shared gradients (norms, routers) deviate without a common scale",
     "worlds", ""},
    {"tied-twice", "--world 4 --ep 2 --dtype f32",
     "the gradient of embed.weight (tied as lm_head.weight) is 4\xc3\x97 too large while every "
     "other gradient agrees: the tied embedding reduced twice?",
     "worlds", ""},
    /* the first run of the worlds sweep (world 1) is one data shard: local equals global */
    {"local-aux", "--world 4 --ep 2 --dtype f32 --aux-loss-coeff 0.01",
     "the router weights (layers.*.router.weight) deviate most", "worlds", "--aux-loss-coeff 0.01"},
};

/* The reference check of one run fails and the diagnosis names the bug. */
static void check_run(const planted_bug *bug)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("run"));
    hx_test_run run;
    hx_test_harness(&run, "%s --inject %s --steps 2 --out %s", bug->run_args, bug->name, dir);
    if (run.status != HX_EXIT_FAIL)
        fail_msg("--inject %s exited %d\n%s%s", bug->name, run.status, run.err, run.out);
    if (!strstr(run.out, "diagnosis: step 1: ") || !strstr(run.out, bug->diagnosis))
        fail_msg("--inject %s: no diagnosis '%s' in\n%s", bug->name, bug->diagnosis, run.out);
    /* the reference check fails; the bug is the same on every rank, so replicas still agree */
    hx_json *report = hx_test_report(dir);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(failed > 0);
    hx_test_check(report, "reduced gradients bit-identical in each group", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    /* report.json and report.md carry the diagnosis */
    const hx_json *d = hx_json_get(report, "diagnosis");
    assert_non_null(d);
    assert_int_equal(d->type, HX_JSON_STRING);
    if (!strstr(d->string, bug->diagnosis))
        fail_msg("report.json of --inject %s: diagnosis '%s'", bug->name, d->string);
    assert_string_equal(hx_json_get(report, "inject")->string, bug->name);
    hx_json_free(report);
    char path[1300], *md = NULL, want[200];
    snprintf(path, sizeof path, "%s/report.md", dir);
    assert_int_equal(hx_read_file(path, &md, NULL), SELDP_OK);
    snprintf(want, sizeof want, "**Diagnosis** (inject %s): step 1: ", bug->name);
    if (!strstr(md, want) || !strstr(md, bug->diagnosis))
        fail_msg("report.md of --inject %s lacks its diagnosis", bug->name);
    free(md);
}

/* A sweep whose first run is unaffected deviates, and names the bug. */
static void check_sweep(const planted_bug *bug)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir(bug->name));
    hx_test_run run;
    hx_test_harness(&run,
                    "--sweep %s --world 8 --dtype f32 --global-batch 255 --steps 2 %s "
                    "--inject %s --out %s",
                    bug->sweep, bug->sweep_args, bug->name, dir);
    if (run.status != HX_EXIT_FAIL)
        fail_msg("sweep with --inject %s exited %d\n%s%s", bug->name, run.status, run.err, run.out);
    assert_non_null(strstr(run.out, "DEVIATES"));
    char path[1300], *md = NULL;
    snprintf(path, sizeof path, "%s/sweep.md", dir);
    assert_int_equal(hx_read_file(path, &md, NULL), SELDP_OK);
    assert_non_null(strstr(md, "# Sweep "));
    assert_non_null(strstr(md, ": FAIL"));
    assert_non_null(strstr(md, "## Findings"));
    /* the sweep's findings carry the diagnosis: the worst ep / world gives its own factor,
     * so look for the cause only */
    const char *cause = strstr(bug->diagnosis, ": ");
    const char *needle = cause ? cause + 2 : bug->diagnosis;
    if (strcmp(bug->name, "rank-mean") == 0)
        needle = "a per-rank token mean instead of the global token mean? (torchtitan #1842)";
    if (strcmp(bug->name, "local-aux") == 0)
        needle = "the router weights (layers.*.router.weight) deviate most";
    if (!strstr(md, needle))
        fail_msg("sweep.md of --inject %s lacks '%s':\n%s", bug->name, needle, md);
    free(md);
}

static void test_ep_scale(void **state)
{
    (void)state;
    check_run(&bugs[0]);
    check_sweep(&bugs[0]);
}

static void test_world_div(void **state)
{
    (void)state;
    check_run(&bugs[1]);
    check_sweep(&bugs[1]);
}

static void test_rank_mean(void **state)
{
    (void)state;
    check_run(&bugs[2]);
    check_sweep(&bugs[2]);
}

/* A planted bug whose effect is nil on the chosen layout is refused before anything runs: exit
 * 2, one line naming what it needs (never a run that announces a failure and passes). The
 * absent self-test, whose defect depends on the routing, is refused after a run that found
 * no expert to plant it on. */
static void test_refused_where_it_cannot_show(void **state)
{
    (void)state;
    static const struct {
        const char *args, *why;
    } cases[] = {
        {"--inject ep-scale --world 4 --ep 1", "--inject ep-scale: needs expert parallelism"},
        {"--inject world-div --world 4 --ep 1", "--inject world-div: needs expert parallelism"},
        {"--inject rank-mean --world 4 --ep 2 --global-batch 256",
         "--inject rank-mean: needs ranks holding different token counts: --global-batch 256 "
         "splits evenly over 4 ranks"},
        {"--inject rank-mean --world 4 --ep 2 --token-spread 0",
         "--token-spread 0 gives every rank --tokens 64"},
        {"--inject rank-mean --world 1 --ep 1", "--inject rank-mean: needs 2 data shards"},
        {"--inject tied-twice --world 1 --ep 1",
         "--inject tied-twice: needs the tied embedding replicated on 2 ranks"},
        {"--inject local-aux --aux-loss-coeff 0.01 --world 1 --ep 1",
         "--inject local-aux: needs 2 data shards"},
        {"--inject replica --world 1 --ep 1", "--inject replica: needs 2 ranks"},
        {"--inject absent --world 2 --ep 1 --experts 4",
         "--inject absent: needs an expert no token reaches on rank 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hx_test_run run;
        hx_test_harness(&run, "%s --dtype f32 --steps 2 --out none", cases[i].args);
        if (run.status != HX_EXIT_USAGE || !strstr(run.err, cases[i].why) ||
            strchr(run.err, '\n') != run.err + strlen(run.err) - 1)
            fail_msg("seldp-harness %s: exit %d, stderr \"%s\"; expected exit 2 and one line "
                     "with \"%s\"",
                     cases[i].args, run.status, run.err, cases[i].why);
    }
    /* where it can show, it does: an absent expert planted is caught */
    hx_test_run run;
    hx_test_harness(&run, "--inject absent --world 2 --ep 1 --experts 64 --tokens 4 --dtype f32 "
                          "--steps 2 --out none");
    assert_int_equal(run.status, HX_EXIT_FAIL);
}

static void test_tied_twice(void **state)
{
    (void)state;
    check_run(&bugs[3]);
    check_sweep(&bugs[3]);
}

static void test_local_aux(void **state)
{
    (void)state;
    check_run(&bugs[4]);
    check_sweep(&bugs[4]);
    /* the diagnosis names the cause */
    hx_test_run run;
    hx_test_harness(&run, "%s --inject local-aux --steps 1 --out none", bugs[4].run_args);
    assert_int_equal(run.status, HX_EXIT_FAIL);
    assert_non_null(strstr(run.out, "with the load-balancing loss in global scope: its statistics "
                                    "f_e normalized by each data shard's own token count"));
    /* in local scope the same statistics are right: the bug needs the global scope, and a
     * load-balancing loss at all; refused before anything is written */
    const char *refused[] = {"--aux-loss-coeff 0.01 --aux-loss-scope local", ""};
    for (size_t i = 0; i < 2; i++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/out", hx_test_dir(i ? "refused-off" : "refused-local"));
        hx_test_harness(&run, "--world 4 --ep 2 --dtype f32 %s --inject local-aux --out %s",
                        refused[i], dir);
        assert_int_equal(run.status, HX_EXIT_USAGE);
        assert_non_null(strstr(run.err, "--inject local-aux: expected --aux-loss-coeff > 0 with "
                                        "--aux-loss-scope global"));
        assert_non_null(strstr(run.err, i ? "no load-balancing loss" : "--aux-loss-scope local"));
        assert_null(strchr(strchr(run.err, '\n') + 1, '\n')); /* one line */
        assert_int_not_equal(access(dir, F_OK), 0);
    }
}

/* Without a planted bug, the same runs pass and give no diagnosis. */
static void test_no_bug(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bugs / sizeof bugs[0]; i++) {
        hx_test_run run;
        hx_test_harness(&run, "%s --steps 2 --out none", bugs[i].run_args);
        if (run.status != HX_EXIT_PASS)
            fail_msg("%s exited %d\n%s%s", bugs[i].run_args, run.status, run.err, run.out);
        assert_null(strstr(run.out, "diagnosis:"));
    }
    /* a passing run's report has none */
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("clean"));
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 1 --out %s", bugs[0].run_args, dir);
    assert_int_equal(run.status, HX_EXIT_PASS);
    hx_json *report = hx_test_report(dir);
    assert_int_equal(hx_json_get(report, "diagnosis")->type, HX_JSON_NULL);
    assert_string_equal(hx_json_get(report, "inject")->string, "none");
    hx_json_free(report);
}

/* Defects that are not reduction mistakes are not blamed on one: a gradient doubled on one
 * rank breaks the replicas. */
static void test_not_a_framework_bug(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--inject grad --steps 1 --out none");
    assert_int_equal(run.status, HX_EXIT_FAIL);
    if (!strstr(run.out, "diagnosis: step 1: the replicas of a reduced gradient differ: a defect "
                         "on one rank"))
        fail_msg("--inject grad: unexpected diagnosis in\n%s", run.out);
    assert_null(strstr(run.out, "DeepSpeed"));
    assert_null(strstr(run.out, "torchtitan"));
}

static void test_inject_names(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--inject ep_scale");
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "a framework bug: ep-scale, rank-mean, world-div, tied-twice, "
                                    "local-aux, router-tp, aux-cp, aux-dp, aux-microbatch"));
    hx_test_harness(&run, "--help");
    assert_non_null(strstr(run.out, "--inject FAULT"));
    assert_non_null(strstr(run.out, "ep-scale,"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_scale),     cmocka_unit_test(test_world_div),
        cmocka_unit_test(test_rank_mean),    cmocka_unit_test(test_tied_twice),
        cmocka_unit_test(test_no_bug),       cmocka_unit_test(test_not_a_framework_bug),
        cmocka_unit_test(test_inject_names), cmocka_unit_test(test_refused_where_it_cannot_show),
        cmocka_unit_test(test_local_aux),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
