/* Verdicts a researcher can trust (docs/tolerances.md): no false alarm on long correct runs of
 * every dtype, every planted bug caught and named at its first step in every dtype, the
 * resolution of the bf16 checks, the bounds' own arithmetic, the report's group table as the
 * run's replica sets, and outputs that cannot be written refused before any step. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bounds.h"
#include "cli.h"
#include "harness_test.h"

static double number(const hx_json *obj, const char *key)
{
    const hx_json *v = hx_json_get(obj, key);
    if (!v || v->type != HX_JSON_NUMBER)
        fail_msg("no number \"%s\"", key);
    return v->number;
}

static const hx_json *check_of(const hx_json *report, const char *name)
{
    const hx_json *checks = hx_json_get(report, "checks");
    for (size_t i = 0; checks && i < checks->count; i++)
        if (strcmp(hx_json_get(&checks->items[i], "name")->string, name) == 0)
            return &checks->items[i];
    fail_msg("no check \"%s\"", name);
    return NULL;
}

/* ---- the tolerance model's arithmetic ------------------------------------------------------ */

static void ulps_and_rounding(void **state)
{
    (void)state;
    assert_true(hx_ulp(SELDP_BF16, 1.0) == ldexp(1.0, -7));
    assert_true(hx_ulp(SELDP_BF16, 1.5) == ldexp(1.0, -7));
    assert_true(hx_ulp(SELDP_BF16, 2.0) == ldexp(1.0, -6));
    assert_true(hx_ulp(SELDP_F16, 1.0) == ldexp(1.0, -10));
    assert_true(hx_ulp(SELDP_F16, 1e-7) == ldexp(1.0, -24)); /* subnormal */
    assert_true(hx_ulp(SELDP_F32, -3.0) == ldexp(1.0, -22));
    assert_true(hx_round_to(SELDP_BF16, 1.0 + ldexp(1.0, -9)) == 1.0);
    assert_true(hx_round_to(SELDP_F16, 65504.0) == 65504.0);
    assert_true(hx_unit_roundoff(SELDP_BF16) == ldexp(1.0, -8));
    hx_tolerance t = hx_tolerance_of(&(tm_config)TM_CONFIG_INIT, SELDP_BF16);
    assert_true(t.c == 6.0 && t.u_c == ldexp(1.0, -24) && t.u_r == ldexp(1.0, -8));
}

/* The bound of a tensor grows with its magnitudes and its roundings, and a scale error well
 * above the best-fit scale's bound is seen by it while the norm bound does not see it. */
static void fit_bounds(void **state)
{
    (void)state;
    hx_tolerance t = hx_tolerance_of(&(tm_config)TM_CONFIG_INIT, SELDP_BF16);
    hx_fit exact = {0}, scaled = {0};
    const size_t n = 4096;
    for (size_t i = 0; i < n; i++) {
        double g = sin((double)i) + 0.1, m = 10.0 * fabs(g);
        double r = hx_round_to(SELDP_BF16, g); /* one rounding: within its bound */
        hx_fit_add(&exact, r, g, m, fabs(g));
        hx_fit_add(&scaled, hx_round_to(SELDP_BF16, 1.002 * g), g, m, fabs(g));
    }
    double b = hx_fit_bound(&t, &exact, 1, true), b_model = hx_fit_bound(&t, &exact, 1, false);
    assert_true(sqrt(exact.err2) <= b);
    assert_true(b_model < b);
    assert_true(b_model == t.c * t.u_c * sqrt(exact.mag2));
    assert_true(fabs(hx_fit_scale(&exact) - 1.0) <= hx_fit_scale_bound(&t, &exact, 1, true));
    /* 2e-3 relative: below bf16's norm bound (~8e-3), above the scale's (~3e-4 here) */
    assert_true(sqrt(scaled.err2) <= hx_fit_bound(&t, &scaled, 1, true));
    assert_true(fabs(hx_fit_scale(&scaled) - 1.0) > hx_fit_scale_bound(&t, &scaled, 1, true));
}

/* ---- no false alarm ------------------------------------------------------------------------ */

/* One long run per dtype, at a learning rate that drives the model to confidence: the
 * per-token contributions cancel and a fixed relative limit would cry wolf (1e-5 fails an f32
 * world of 1 after about 20 steps). */
static void long_run(const char *args)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("long"));
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 200 --lr 0.5 --quiet --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s --steps 200: exit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *r = hx_test_report(dir);
    /* the run converged: the last loss far below the first */
    const hx_json *steps = hx_json_get(r, "steps");
    double first = number(&steps->items[0], "loss");
    double last = number(&steps->items[steps->count - 1], "loss");
    assert_true(last < 0.1 * first);
    hx_json_free(r);
}

static void long_run_f32(void **state)
{
    (void)state;
    long_run("--world 1 --ep 1 --dtype f32");
}

static void long_run_bf16(void **state)
{
    (void)state;
    long_run("--world 2 --ep 2 --dtype bf16");
}

static void long_run_f16(void **state)
{
    (void)state;
    long_run("--world 2 --ep 1 --dtype f16");
}

/* A wider model in bf16 at a high learning rate: the feature sums of the backward drift as
 * the token sums do (a bound without that term failed this run's router and embedding
 * gradients at step 4). */
static void wide_model_bf16(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("wide"));
    hx_test_run run;
    hx_test_harness(&run,
                    "--world 2 --ep 2 --dtype bf16 --d-model 256 --d-ff 512 --steps 6 --lr 0.3 "
                    "--quiet --out %s",
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("wide bf16 run: exit %d\n%s%s", run.status, run.err, run.out);
}

/* A run that leaves f16's range (lr 1 on a wide model): the step where the members' f16 parts
 * overflow and every later one are left unchecked and said to be, the steps before keep their
 * verdict, and the run is not reported as a failure of its layout. The step it diverges at
 * depends on the FP32 rounding of the machine's OpenBLAS kernels (7 on one CPU, 8 on another),
 * so the test asks for a step after the first and before the last, and the same one everywhere. */
static void diverged_run(void **state)
{
    (void)state;
    char dir[1200], said[64];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("diverged"));
    hx_test_run run;
    hx_test_harness(&run,
                    "--world 8 --ep 8 --d-model 256 --d-ff 256 --dtype f16 --lr 1.0 --steps 9 "
                    "--seed 317 --out %s",
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("diverging f16 run: exit %d\n%s%s", run.status, run.err, run.out);
    hx_json *r = hx_test_report(dir);
    const hx_json *d = hx_json_get(r, "diverged");
    if (!d)
        fail_msg("diverging f16 run: no divergence reported\n%s", run.out);
    long step = (long)hx_test_int(d, "step");
    if (step < 2 || step > 9)
        fail_msg("diverging f16 run: diverged at step %ld, expected 2..9\n%s", step, run.out);
    snprintf(said, sizeof said, "diverged: step %ld: ", step);
    if (!strstr(run.out, said))
        fail_msg("diverging f16 run: '%s' not printed\n%s", said, run.out);
    const hx_json *steps = hx_json_get(r, "steps");
    assert_int_equal(steps->count, 9);
    for (size_t i = 0; i < steps->count; i++)
        assert_int_equal(hx_json_get(&steps->items[i], "diverged")->boolean, (long)i >= step - 1);
    hx_json_free(r);
}

/* ---- no miss ------------------------------------------------------------------------------- */

/* Every planted framework bug fails a check at step 1 in f32, bf16 and f16, and is named. */
static void bugs_caught_at_step_one(void **state)
{
    (void)state;
    static const struct {
        const char *bug, *args, *named;
    } bugs[] = {
        {"ep-scale", "--world 8 --ep 4", "expert grads scaled by the EP size? (DeepSpeed #6545)"},
        {"world-div", "--world 8 --ep 4",
         "divided by the world size instead of the expert-data size?"},
        {"rank-mean", "--world 4 --ep 2",
         "a per-rank token mean instead of the global token mean? (torchtitan #1842)"},
        {"tied-twice", "--world 4 --ep 2", "the tied embedding reduced twice?"},
        {"local-aux", "--world 4 --ep 2 --aux-loss-coeff 0.01",
         "with the load-balancing loss in global scope: its statistics f_e normalized by each "
         "data shard's own token count"},
    };
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    for (size_t b = 0; b < sizeof bugs / sizeof bugs[0]; b++) {
        for (size_t d = 0; d < 3; d++) {
            char dir[1200];
            snprintf(dir, sizeof dir, "%s", hx_test_dir("bug"));
            hx_test_run run;
            hx_test_harness(&run, "%s --dtype %s --inject %s --steps 1 --out %s", bugs[b].args,
                            dtypes[d], bugs[b].bug, dir);
            if (run.status != HX_EXIT_FAIL || !strstr(run.out, "diagnosis: step 1: ") ||
                !strstr(run.out, bugs[b].named))
                fail_msg("--inject %s --dtype %s: exit %d, not named '%s' at step 1:\n%s",
                         bugs[b].bug, dtypes[d], run.status, bugs[b].named, run.out);
            hx_json *r = hx_test_report(dir);
            const hx_json *steps = hx_json_get(r, "steps");
            assert_true(hx_test_int(&steps->items[0], "failures") > 0);
            hx_json_free(r);
        }
    }
}

/* In the default bf16 run the router and expert checks resolve a relative scale error of
 * 1e-3 and better: the ranks' FP32 gradients are checked before the export rounding. */
static void bf16_resolution(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("resolution"));
    hx_test_run run;
    hx_test_harness(&run, "--quiet --out %s", dir);
    assert_int_equal(run.status, HX_EXIT_PASS);
    hx_json *r = hx_test_report(dir);
    const hx_json *classes = hx_json_get(r, "tensor_classes");
    int seen = 0;
    for (size_t i = 0; i < classes->count; i++) {
        const hx_json *c = &classes->items[i];
        const char *name = hx_json_get(c, "class")->string;
        if (strcmp(name, "router") && strcmp(name, "expert.w1") && strcmp(name, "expert.w2"))
            continue;
        seen++;
        double res = number(c, "ranks_gradients_resolution");
        if (!(res > 0 && res <= 1e-3))
            fail_msg("%s: resolution %.3e in bf16", name, res);
    }
    assert_int_equal(seen, 3);
    /* every metric check reports its bound and resolution */
    const hx_json *grad = check_of(r, "reduced gradients vs the FP64 reference");
    assert_true(number(grad, "worst") <= 1.0);
    assert_true(number(grad, "bound") > 0 && number(grad, "resolution") > 0);
    const hx_json *red = check_of(r, "reductions equal the FP64 mean or sum of their inputs");
    assert_true(hx_test_int(red, "tested") > 0);
    hx_json_free(r);
}

/* ---- reports that match the run ------------------------------------------------------------ */

/* The set of sorted rank lists of a JSON list of lists, as text, for comparison. */
static void rank_lists(const hx_json *lists, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; lists && i < lists->count && at + 16 < size; i++) {
        const hx_json *l = &lists->items[i];
        at += (size_t)snprintf(buf + at, size - at, "[");
        for (size_t k = 0; k < l->count && at + 16 < size; k++)
            at += (size_t)snprintf(buf + at, size - at, "%s%lld", k ? "," : "",
                                   (long long)l->items[k].number);
        at += (size_t)snprintf(buf + at, size - at, "]");
    }
}

/* The groups a sharded run reduced over are its layout's: the dense sets are groups.dp, the
 * expert-data sets groups.expert_dp, rank for rank, on every framework preset. */
static void group_table_is_the_layout(void **state)
{
    (void)state;
    static const char *const grids[] = {
        "--framework megatron --world 16 --tp 2 --pp 2 --cp 2 --ep 2",
        "--framework megatron-0.9 --world 8 --tp 2 --ep 2",
        "--framework deepspeed --world 8 --tp 2 --pp 2 --ep 2",
        "--framework torchtitan --world 8 --tp 2 --ep 2",
    };
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s", hx_test_dir("groups"));
        hx_test_run run;
        hx_test_harness(&run, "%s --steps 1 --quiet --out %s", grids[g], dir);
        if (run.status != HX_EXIT_PASS)
            fail_msg("%s: exit %d\n%s%s", grids[g], run.status, run.err, run.out);
        hx_json *r = hx_test_report(dir);
        const hx_json *layout = hx_json_get(hx_json_get(r, "layout"), "groups");
        const hx_json *sets = hx_json_get(r, "groups");
        static const char *const kinds[2][2] = {{"dense", "dp"}, {"expert-data", "expert_dp"}};
        for (int k = 0; k < 2; k++) {
            hx_json lists = {.type = HX_JSON_ARRAY};
            hx_json items[256];
            lists.items = items;
            for (size_t i = 0; i < sets->count && lists.count < 256; i++)
                if (strcmp(hx_json_get(&sets->items[i], "kind")->string, kinds[k][0]) == 0)
                    items[lists.count++] = *hx_json_get(&sets->items[i], "ranks");
            char a[4096], b[4096];
            rank_lists(&lists, a, sizeof a);
            rank_lists(hx_json_get(layout, kinds[k][1]), b, sizeof b);
            if (strcmp(a, b) != 0)
                fail_msg("%s: the %s sets %s, layout.groups.%s %s", grids[g], kinds[k][0], a,
                         kinds[k][1], b);
        }
        /* Megatron with cp > 1 names the dense group dp-cp */
        for (size_t i = 0; i < sets->count; i++) {
            const hx_json *s = &sets->items[i];
            if (strcmp(hx_json_get(s, "kind")->string, "dense") == 0 && strstr(grids[g], "--cp 2"))
                assert_string_equal(hx_json_get(s, "name")->string, "dp-cp");
        }
        hx_json_free(r);
    }
}

/* --roots decides the roots of a grid's sets, and the report shows the roots the run used. */
static void roots_on_grids(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("roots"));
    char ckpt[1300];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    hx_test_run run;
    hx_test_harness(&run,
                    "--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --roots last --steps 1 "
                    "--quiet --out %s --save %s",
                    dir, ckpt);
    assert_int_equal(run.status, HX_EXIT_PASS);
    /* the roots write the checkpoint, the last stage's tied copy among them */
    hx_test_run resumed;
    hx_test_harness(&resumed, "--world 4 --ep 2 --steps 2 --quiet --out none --resume %s", ckpt);
    if (resumed.status != HX_EXIT_PASS)
        fail_msg("resume of a --roots last grid: exit %d\n%s%s", resumed.status, resumed.err,
                 resumed.out);
    hx_json *r = hx_test_report(dir);
    const hx_json *sets = hx_json_get(r, "groups");
    for (size_t i = 0; i < sets->count; i++) {
        const hx_json *ranks = hx_json_get(&sets->items[i], "ranks");
        assert_int_equal(hx_test_int(&sets->items[i], "root"),
                         (int64_t)ranks->items[ranks->count - 1].number);
    }
    hx_json_free(r);
}

/* ---- outputs ------------------------------------------------------------------------------- */

static void unwritable_outputs_refused(void **state)
{
    (void)state;
    char file[1200];
    snprintf(file, sizeof file, "%s/a-file", hx_test_dir("outputs"));
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    static const char *const options[] = {"--out", "--dump", "--save"};
    for (size_t i = 0; i < 3; i++) {
        hx_test_run run;
        hx_test_harness(&run, "%s %s/sub --steps 1", options[i], file);
        if (run.status != HX_EXIT_USAGE || !strstr(run.err, options[i]) ||
            strchr(run.err, '\n') != run.err + strlen(run.err) - 1 || strstr(run.out, "step 1/"))
            fail_msg("%s under a file: exit %d, stderr \"%s\"", options[i], run.status, run.err);
    }
    hx_test_run run;
    hx_test_harness(&run, "--summary %s --steps 1 --out none", hx_test_dir("outputs"));
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "--summary"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ulps_and_rounding), cmocka_unit_test(fit_bounds),
        cmocka_unit_test(long_run_f32),      cmocka_unit_test(long_run_bf16),
        cmocka_unit_test(long_run_f16),      cmocka_unit_test(wide_model_bf16),
        cmocka_unit_test(diverged_run),      cmocka_unit_test(bugs_caught_at_step_one),
        cmocka_unit_test(bf16_resolution),   cmocka_unit_test(group_table_is_the_layout),
        cmocka_unit_test(roots_on_grids),    cmocka_unit_test(unwritable_outputs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
