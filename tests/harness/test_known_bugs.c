/* The known framework bugs (harness/check/bugs.c, docs/harness.md, Planted bugs): the table is the
 * one docs/harness.md shows and --inject accepts; each planted bug of the second set fails the
 * checks at step 1 in f32 and in bf16 (half-accum in its half dtypes) on replicated and sharded
 * layouts and is named with its citation, the clean run of the same layout passes without a
 * diagnosis, and a layout where the bug cannot show is refused (exit 2, one line). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bugs.h"
#include "cli.h"
#include "harness_test.h"
#include "json.h"
#include "util.h"

/* One layout per bug besides its table demo, sharded where the demo is not (or the other way),
 * the check that must fail, and what the diagnosis must say of the factor. */
typedef struct case_t {
    const char *name;
    const char *other; /* a second layout where it shows */
    const char *check; /* the check that fails at step 1 */
    const char *seen;  /* part of the diagnosis's finding on the demo layout */
} case_t;

static const case_t cases[] = {
    {"router-tp", "--world 8 --tp 2 --pp 2 --ep 2", "reduced gradients vs the FP64 reference",
     "of the reference (1/tp, tp 2) and differ between the TP ranks"},
    {"aux-cp", "--world 8 --tp 2 --cp 2 --ep 2 --aux-loss-coeff 0.1",
     "ranks' FP32 gradients vs the FP64 reference",
     "match the FP64 reference whose router-loss coefficients are 1/2"},
    {"aux-dp", "--world 8 --pp 2 --ep 2 --aux-loss-coeff 0.1",
     "ranks' FP32 gradients vs the FP64 reference",
     "match the FP64 reference whose load-balancing coefficient is 1/4"},
    {"norm-per-group", "--world 4 --tp 2 --ep 2 --clip-grad 1",
     "global gradient norm vs the FP64 reference",
     "the global gradient norm differs from the FP64 reference's while every reduced gradient "
     "agrees"},
    /* replicated, the dense group is the EP group's size: ep-scale is named first, edp1-skip
     * beside it */
    {"edp1-skip", "--world 4 --ep 4", "reduced gradients vs the FP64 reference",
     "are 2\xc3\x97 too large (the dense data-parallel size 2; expert-data groups of one rank)"},
    {"shared-expert-tp", "--world 8 --tp 2 --pp 2 --ep 2 --shared-expert-ff 32",
     "reduced gradients vs the FP64 reference",
     "what the ranks passed was already off, a reduction over the TP group (tp 2)"},
    {"tied-zero", "--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --zero 1",
     "reductions equal the FP64 mean or sum of their inputs",
     "its reduce-scattered ranges are off the sum of the gradients the ranks passed"},
    {"half-accum", "--world 8 --tp 2 --ep 2",
     "reductions equal the FP64 mean or sum of their inputs",
     "by more than one ulp of the bf16 result while their scale is right"},
};

static const hx_bug *bug_named(const char *name)
{
    for (int i = 0; i < hx_bug_count(); i++)
        if (strcmp(hx_bug_at(i)->name, name) == 0)
            return hx_bug_at(i);
    fail_msg("no known bug %s", name);
    return NULL;
}

/* `known bug NAME (citation)`, as the diagnosis names it. */
static void named(const hx_bug *bug, char *buf, size_t size)
{
    if (bug->citation[0])
        snprintf(buf, size, "known bug %s (%s)", bug->name, bug->citation);
    else
        snprintf(buf, size, "known bug %s: ", bug->name);
}

/* `args` with the bug planted fails `check` at step 1 and the diagnosis names it (and says
 * `seen` when given); the same run without it passes with no diagnosis. */
static void fails_and_is_named(const hx_bug *bug, const char *args, const char *dtype,
                               const char *check, const char *seen)
{
    char dir[1200], name[600];
    snprintf(dir, sizeof dir, "%s", hx_test_dir(bug->name));
    named(bug, name, sizeof name);
    hx_test_run run;
    hx_test_harness(&run, "%s --dtype %s --inject %s --steps 2 --out %s", args, dtype, bug->name,
                    dir);
    if (run.status != HX_EXIT_FAIL || !strstr(run.out, "diagnosis: step 1: ") ||
        !strstr(run.out, name) || (seen && !strstr(run.out, seen)))
        fail_msg("--inject %s %s --dtype %s: exit %d, expected 1 with a step-1 diagnosis naming "
                 "'%s'%s%s\n%s%s",
                 bug->name, args, dtype, run.status, name, seen ? " and saying " : "",
                 seen ? seen : "", run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, check, &tested, &failed);
    if (failed == 0)
        fail_msg("--inject %s %s --dtype %s: the check '%s' did not fail", bug->name, args, dtype,
                 check);
    const hx_json *steps = hx_json_get(report, "steps");
    assert_non_null(steps);
    assert_true(steps->count > 0);
    assert_true(hx_test_int(&steps->items[0], "failures") > 0);
    const hx_json *d = hx_json_get(report, "diagnosis");
    assert_non_null(d);
    assert_int_equal(d->type, HX_JSON_STRING);
    assert_non_null(strstr(d->string, name));
    hx_json_free(report);
    /* the clean run of the same layout passes and says nothing */
    hx_test_harness(&run, "%s --dtype %s --steps 2 --out %s", args, dtype, dir);
    if (run.status != HX_EXIT_PASS || strstr(run.out, "diagnosis"))
        fail_msg("%s --dtype %s without --inject: exit %d, expected a pass with no "
                 "diagnosis\n%s%s",
                 args, dtype, run.status, run.err, run.out);
    report = hx_test_report(dir);
    d = hx_json_get(report, "diagnosis");
    assert_non_null(d);
    assert_int_equal(d->type, HX_JSON_NULL);
    hx_json_free(report);
}

static const char *first_dtype(const hx_bug *bug)
{
    return bug->fault == HX_FAULT_HALF_ACCUM ? "f16" : "f32";
}

/* Every planted bug of the table (the first set too) on its demo layout, in f32 (half-accum:
 * f16) and in the default bf16. */
static void test_table_demos(void **state)
{
    (void)state;
    for (int i = 0; i < hx_bug_count(); i++) {
        const hx_bug *bug = hx_bug_at(i);
        if (bug->pending)
            continue;
        const char *check = "reduced gradients vs the FP64 reference";
        const char *seen = NULL;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            if (strcmp(cases[c].name, bug->name) == 0) {
                check = cases[c].check;
                seen = strcmp(bug->name, "half-accum") ? cases[c].seen : NULL;
            }
        if (bug->fault == HX_FAULT_LOCAL_AUX)
            check = "ranks' FP32 gradients vs the FP64 reference";
        if (bug->fault == HX_FAULT_TIED_TWICE)
            check = "reductions equal the FP64 mean or sum of their inputs";
        if (bug->fault == HX_FAULT_FOUND_INF_LOCAL) {
            /* loss scaling is f16's alone: the mistake is in its skip */
            fails_and_is_named(bug, bug->demo, "f16", "updates equal the FP64 optimizer step",
                               seen);
            continue;
        }
        fails_and_is_named(bug, bug->demo, first_dtype(bug), check, seen);
        fails_and_is_named(bug, bug->demo, "bf16", check, seen);
    }
}

/* The second set on another layout: sharded where the demo is replicated, with other sizes. */
static void test_other_layouts(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const hx_bug *bug = bug_named(cases[c].name);
        bool half = bug->fault == HX_FAULT_HALF_ACCUM;
        fails_and_is_named(bug, cases[c].other, half ? "f16" : "f32", cases[c].check, NULL);
        fails_and_is_named(bug, cases[c].other, "bf16", cases[c].check, NULL);
    }
}

/* Refused where it cannot show: exit 2, one line naming what it needs, nothing written. */
static void test_refused(void **state)
{
    (void)state;
    static const struct {
        const char *args, *why;
    } refused[] = {
        {"--inject router-tp --world 4 --ep 2", "--inject router-tp: needs tensor parallelism"},
        {"--inject shared-expert-tp --world 4 --ep 2 --shared-expert-ff 32",
         "--inject shared-expert-tp: needs tensor parallelism"},
        {"--inject shared-expert-tp --world 4 --tp 2 --ep 2",
         "--inject shared-expert-tp: needs a shared expert"},
        {"--inject aux-cp --world 4 --ep 2 --aux-loss-coeff 0.1",
         "--inject aux-cp: needs context parallelism"},
        {"--inject aux-cp --world 4 --cp 2 --ep 2", "--inject aux-cp: needs a router loss"},
        {"--inject aux-dp --world 1 --ep 1 --aux-loss-coeff 0.1",
         "--inject aux-dp: needs data parallelism"},
        {"--inject aux-dp --world 4 --cp 4 --ep 2 --aux-loss-coeff 0.1",
         "--inject aux-dp: needs data parallelism"},
        {"--inject aux-dp --world 4 --ep 2 --aux-loss-coeff 0.1 --aux-loss-scope local",
         "--inject aux-dp: needs --aux-loss-coeff > 0 with --aux-loss-scope global"},
        {"--inject norm-per-group --world 4 --ep 2", "--inject norm-per-group: needs --clip-grad"},
        {"--inject norm-per-group --world 4 --ep 1 --clip-grad 1",
         "--inject norm-per-group: needs expert parallelism"},
        {"--inject edp1-skip --world 4 --ep 2",
         "--inject edp1-skip: needs expert-data groups of one rank"},
        {"--inject edp1-skip --world 1 --ep 1",
         "--inject edp1-skip: needs a dense data-parallel group of 2 ranks"},
        {"--inject half-accum --world 4 --ep 2 --dtype f32",
         "--inject half-accum: needs half-precision gradients"},
        {"--inject half-accum --world 4 --ep 2 --dtype bf16 --fp32-master",
         "--inject half-accum: needs half-precision gradients"},
        {"--inject half-accum --world 2 --ep 2 --dtype bf16",
         "--inject half-accum: needs a replica set of 3 ranks or more"},
        {"--inject aux-microbatch --world 4 --ep 2",
         "--inject aux-microbatch: needs --micro-batches 2 or more"},
        {"--inject aux-microbatch --world 4 --ep 2 --micro-batches 2",
         "--inject aux-microbatch: needs a router loss"},
        {"--inject last-microbatch --world 4 --ep 2",
         "--inject last-microbatch: needs --micro-batches 2 or more"},
        {"--inject tied-zero --world 4 --pp 2 --ep 2", "--inject tied-zero: needs --zero 1"},
        {"--inject tied-zero --world 4 --ep 2 --zero 1", "--inject tied-zero: needs a pipeline"},
        {"--inject tied-zero --world 2 --pp 2 --ep 1 --zero 1",
         "--inject tied-zero: needs 2 data-parallel ranks or more per stage"},
        /* planted in the all-reduce path alone */
        {"--inject tied-twice --world 4 --pp 2 --ep 2 --zero 1",
         "--zero 1 cannot run here: --inject tied-twice"},
        {"--inject half-accum --world 4 --ep 2 --dtype bf16 --zero 1",
         "--zero 1 cannot run here: --inject half-accum"},
        {"--inject grad --world 4 --ep 2 --zero 1", "--zero 1 cannot run here: --inject grad"},
        {"--inject found-inf-local --world 4 --ep 2",
         "--inject found-inf-local: needs --loss-scale"},
        {"--inject found-inf-local --world 4 --ep 2 --dtype f16 --loss-scale dynamic",
         "--inject found-inf-local: needs --loss-scale and --inject-overflow"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/out", hx_test_dir("refused"));
        hx_test_run run;
        hx_test_harness(&run, "%s --steps 1 --out %s", refused[i].args, dir);
        if (run.status != HX_EXIT_USAGE || !strstr(run.err, refused[i].why) ||
            strchr(run.err, '\n') != run.err + strlen(run.err) - 1)
            fail_msg("seldp-harness %s: exit %d, stderr \"%s\"; expected exit 2 and one line "
                     "with \"%s\"",
                     refused[i].args, run.status, run.err, refused[i].why);
        char path[1300];
        snprintf(path, sizeof path, "%s/report.json", dir);
        FILE *f = fopen(path, "r");
        if (f)
            fclose(f);
        assert_null(f);
    }
}

/* One table: every framework fault has one row with a unique name that --inject parses, and
 * docs/harness.md shows the table as seldp-bugs prints it. */
static void test_one_table(void **state)
{
    (void)state;
    int rows = 0;
    for (int f = HX_FAULT_EP_SCALE; f < HX_FAULT_COUNT; f++) {
        const hx_bug *bug = hx_bug_of((hx_fault)f);
        assert_non_null(bug);
        assert_string_equal(hx_fault_name((hx_fault)f), bug->name);
        assert_true(bug->mistake[0] && bug->needs[0] && bug->signature[0] && bug->demo[0]);
        rows++;
    }
    assert_int_equal(rows, hx_bug_count());
    assert_int_equal(hx_bug_count(), 16);
    for (int i = 0; i < hx_bug_count(); i++)
        for (int j = i + 1; j < hx_bug_count(); j++)
            assert_true(strcmp(hx_bug_at(i)->name, hx_bug_at(j)->name) != 0);
    hx_buf b = {0};
    hx_bugs_markdown(&b);
    assert_true(hx_buf_ok(&b));
    char *doc = NULL;
    assert_int_equal(hx_read_file(HX_TEST_DOCS "/harness.md", &doc, NULL), SELDP_OK);
    if (!strstr(doc, hx_buf_str(&b)))
        fail_msg("docs/harness.md's known-bug table differs from the table (regenerate it with "
                 "seldp-bugs):\n%s",
                 hx_buf_str(&b));
    free(doc);
    hx_buf_free(&b);
    /* the bugs whose option does not exist yet name it */
    int pending = 0;
    for (int i = 0; i < hx_bug_count(); i++)
        pending += hx_bug_at(i)->pending != NULL;
    assert_int_equal(pending, 0);
}

/* Under the distributed optimizer (and with micro-batches overlapped) the bugs planted in the
 * export, the weights and the model act as they do on the all-reduce path, and are named. */
static void test_other_steps(void **state)
{
    (void)state;
    static const struct {
        const char *name, *args;
    } runs[] = {
        {"ep-scale", "--world 4 --pp 2 --ep 2 --zero 1"},
        {"shared-expert-tp", "--world 4 --tp 2 --ep 2 --shared-expert-ff 32 --zero 1"},
        {"last-microbatch", "--world 8 --ep 4 --micro-batches 4 --zero 1"},
        {"aux-cp", "--world 4 --cp 2 --ep 2 --aux-loss-coeff 0.1 --zero 1"},
        /* with M = ep the experts alone are x M: not every gradient, not last-microbatch */
        {"ep-scale", "--world 8 --ep 4 --micro-batches 4 --overlap"},
        {"tied-zero", "--world 4 --pp 2 --ep 2 --zero 1 --overlap"},
        {"found-inf-local", "--world 4 --ep 2 --optimizer adamw --loss-scale dynamic "
                            "--inject-overflow 1 --zero 1"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const hx_bug *bug = bug_named(runs[i].name);
        const char *check = "reduced gradients vs the FP64 reference";
        const char *dtype = "f32";
        if (bug->fault == HX_FAULT_AUX_CP)
            check = "ranks' FP32 gradients vs the FP64 reference";
        if (bug->fault == HX_FAULT_FOUND_INF_LOCAL) {
            check = "updates equal the FP64 optimizer step";
            dtype = "f16";
        }
        fails_and_is_named(bug, runs[i].args, dtype, check, NULL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_table),   cmocka_unit_test(test_refused),
        cmocka_unit_test(test_table_demos), cmocka_unit_test(test_other_layouts),
        cmocka_unit_test(test_other_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
