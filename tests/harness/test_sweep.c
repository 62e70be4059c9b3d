/* Sweeps (--sweep, docs/harness.md, Planted bugs and Sweeps): with --global-batch every layout
 * trains the same logical model on the same tokens, so a world-8 sweep over ep 1/2/4/8 in both
 * orders agrees with its first run within the dtype's tolerance; a sweep file is parsed strictly
 * (errors at line:column); a sweep mixing worlds without --global-batch is refused; nothing is
 * written on refusal. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

static bool flag(const hx_json *obj, const char *key)
{
    const hx_json *v = hx_json_get(obj, key);
    if (!v || v->type != HX_JSON_BOOL)
        fail_msg("sweep.json: no boolean \"%s\"", key);
    return v->boolean;
}

static bool exists(const char *dir, const char *file)
{
    char path[2400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct stat st;
    return stat(path, &st) == 0;
}

/* Every run of the ep preset at world 8 agrees with the first within `limit`, and the runs
 * are ep 1, 2, 2, 4, 4, 8: both orders where they differ (at ep 1 and ep 8 they are one
 * layout, run once). */
static void ep_sweep_agrees(const char *dtype, double limit)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir(dtype));
    hx_test_run run;
    hx_test_harness(&run, "--sweep ep --world 8 --dtype %s --global-batch 250 --steps 3 --out %s",
                    dtype, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("ep sweep in %s exited %d\n%s%s", dtype, run.status, run.err, run.out);
    assert_non_null(strstr(run.out, "sweep [6/6] w8-ep8-ep-dp"));
    assert_non_null(strstr(run.out, "sweep ep: leaves out world 8, ep 1 dp-ep: the same groups as "
                                    "run 1"));
    assert_non_null(strstr(run.out, "sweep result: PASS (6 of 6 runs"));
    hx_json *s = hx_test_json(dir, "sweep.json");
    const hx_json *runs = hx_json_get(s, "runs");
    assert_non_null(runs);
    assert_int_equal(runs->count, 6);
    static const int eps[6] = {1, 2, 2, 4, 4, 8};
    static const char *const orders[6] = {"ep-dp", "ep-dp", "dp-ep", "ep-dp", "dp-ep", "ep-dp"};
    for (size_t i = 0; i < runs->count; i++) {
        const hx_json *r = &runs->items[i];
        assert_int_equal(hx_test_int(r, "world"), 8);
        assert_int_equal(hx_test_int(r, "ep"), eps[i]);
        assert_string_equal(hx_json_get(r, "order")->string, orders[i]);
        assert_true(flag(r, "checks_passed"));
        assert_true(flag(r, "agrees"));
        assert_true(hx_test_number(r, "max_loss_deviation") <= limit);
        assert_true(hx_test_number(r, "weight_deviation") <= limit);
        assert_true(hx_test_number(r, "tolerance") == limit);
        assert_int_equal(hx_json_get(r, "loss")->count, 3);
    }
    /* the layouts differ in their reduction order, not in what they compute: not bit-equal in
     * general; ep 1 in either order is one layout, run once */
    assert_string_equal(hx_json_get(s, "result")->string, "PASS");
    assert_int_equal(hx_json_get(s, "max_deviation_per_step")->count, 3);
    hx_json_free(s);
    assert_true(exists(dir, "sweep.md"));
    assert_true(exists(dir, "sweep.gp"));
    assert_true(exists(dir, "sweep.dat"));
    assert_true(exists(dir, "runs/01-w8-ep1-ep-dp-f32") ||
                exists(dir, "runs/01-w8-ep1-ep-dp-bf16"));
    if (system("command -v gnuplot >/dev/null 2>&1") == 0)
        assert_true(exists(dir, "sweep.png"));
}

static void test_ep_sweep_f32(void **state)
{
    (void)state;
    ep_sweep_agrees("f32", 1e-5);
}

static void test_ep_sweep_bf16(void **state)
{
    (void)state;
    ep_sweep_agrees("bf16", 1e-2);
}

static void write_text(const char *path, const char *text)
{
    assert_int_equal(hx_write_file(path, text, strlen(text)), SELDP_OK);
}

/* A sweep file: runs across worlds with --global-batch, names from the file. */
static void test_sweep_file(void **state)
{
    (void)state;
    const char *base = hx_test_dir("file");
    char file[1200], dir[1200];
    snprintf(file, sizeof file, "%s/sweep.json", base);
    snprintf(dir, sizeof dir, "%s/out", base);
    write_text(file, "[\n"
                     "  {\"name\": \"one\", \"world\": 1, \"ep\": 1},\n"
                     "  {\"world\": 4, \"ep\": 2, \"order\": \"dp-ep\", \"flow\": \"mean\"},\n"
                     "  {\"world\": 2, \"ep\": 2, \"fp32-master\": true}\n"
                     "]\n");
    hx_test_run run;
    hx_test_harness(&run, "--sweep %s --dtype f32 --global-batch 101 --steps 2 --out %s", file,
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("sweep file exited %d\n%s%s", run.status, run.err, run.out);
    hx_json *s = hx_test_json(dir, "sweep.json");
    const hx_json *runs = hx_json_get(s, "runs");
    assert_int_equal(runs->count, 3);
    assert_string_equal(hx_json_get(&runs->items[0], "name")->string, "one");
    assert_string_equal(hx_json_get(&runs->items[1], "name")->string, "w4-ep2-dp-ep-f32");
    assert_string_equal(hx_json_get(&runs->items[1], "flow")->string, "mean");
    assert_int_equal(hx_test_int(&runs->items[2], "world"), 2);
    assert_int_equal(hx_test_int(s, "global_batch"), 101);
    hx_json_free(s);
}

/* A layout whose step computes something else deviates in lockstep, and the sweep fails: with
 * --inject ep-scale the runs of ep > 1 scale their expert gradients by ep, the first (ep 1) does
 * not. Lockstep ratios are reported per run and per step. */
static void test_sweep_detects_deviation(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir("deviation"));
    hx_test_run run;
    hx_test_harness(&run, "--sweep ep --world 4 --dtype f32 --steps 2 --inject ep-scale --out %s",
                    dir);
    assert_int_equal(run.status, HX_EXIT_FAIL);
    assert_non_null(strstr(run.out, "DEVIATES"));
    hx_json *s = hx_test_json(dir, "sweep.json");
    assert_string_equal(hx_json_get(s, "result")->string, "FAIL");
    const hx_json *runs = hx_json_get(s, "runs");
    assert_true(flag(&runs->items[0], "agrees"));
    bool any = false;
    for (size_t i = 1; i < runs->count; i++) {
        const hx_json *r = &runs->items[i];
        if (!flag(r, "agrees")) {
            any = true;
            assert_true(flag(r, "lockstep"));
            assert_true(hx_test_number(r, "lockstep_gradients") > 1.0);
            assert_int_equal(hx_json_get(r, "lockstep_ratio")->count, 2);
        }
    }
    assert_true(any);
    assert_int_equal(hx_json_get(s, "max_lockstep_ratio_per_step")->count, 2);
    hx_json_free(s);
}

/* Lockstep runs agree where free-running ones part: a bf16 ep sweep over 10 steps at lr 0.1
 * routes a token differently at a near tie in some layouts, and their free-running losses part
 * by more than bf16's relative limit, yet every step from the same weights agrees. */
static void test_lockstep_agrees_where_free_runs_part(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir("lockstep"));
    hx_test_run run;
    hx_test_harness(&run,
                    "--sweep ep --world 8 --dtype bf16 --global-batch 255 --steps 10 --lr 0.1 "
                    "--out %s",
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("lockstep ep sweep exited %d\n%s%s", run.status, run.err, run.out);
    hx_json *s = hx_test_json(dir, "sweep.json");
    const hx_json *runs = hx_json_get(s, "runs");
    double parted = 0;
    for (size_t i = 1; i < runs->count; i++) {
        assert_true(flag(&runs->items[i], "agrees"));
        assert_true(hx_test_number(&runs->items[i], "lockstep_gradients") <= 1.0);
        parted = fmax(parted, hx_test_number(&runs->items[i], "max_loss_deviation"));
    }
    if (!(parted > 1e-2))
        fail_msg("no free-running curve parted (largest %.3e): the case no longer shows what "
                 "lockstep is for",
                 parted);
    hx_json_free(s);
}

/* Exit 2, one line on stderr holding `why`, and no output folder. */
static void expect_refusal(const char *sweep_text, const char *args, const char *why)
{
    const char *base = hx_test_dir("bad");
    char file[1200], dir[1200], expected[1400];
    snprintf(file, sizeof file, "%s/sweep.json", base);
    snprintf(dir, sizeof dir, "%s/out", base);
    if (sweep_text)
        write_text(file, sweep_text);
    hx_test_run run;
    hx_test_harness(&run, "--sweep %s %s --out %s", sweep_text ? file : "worlds", args, dir);
    if (run.status != HX_EXIT_USAGE)
        fail_msg("'%s' exited %d, expected 2; stderr: %s", sweep_text, run.status, run.err);
    snprintf(expected, sizeof expected, why, file);
    if (!strstr(run.err, expected))
        fail_msg("stderr '%s' lacks '%s'", run.err, expected);
    const char *nl = strchr(run.err, '\n');
    assert_non_null(nl);
    assert_int_equal(nl[1], '\0');
    struct stat st;
    assert_int_not_equal(stat(dir, &st), 0);
}

static void test_malformed_sweep_files(void **state)
{
    (void)state;
    const char *gb = "--global-batch 64";
    expect_refusal("[\n  {\"ep\": 2},\n]\n", gb, "%s:3:1: ");
    expect_refusal("[\n  {\"ep\": 2}\n", gb, "%s:3:1: ");
    expect_refusal("{\"ep\": 2}\n", gb, "%s:1:1: expected a list of 1 to 256 runs");
    expect_refusal("[]", gb, "%s:1:1: expected a list of 1 to 256 runs");
    expect_refusal("[\n  {\"ep\": 2},\n  4\n]\n", gb,
                   "%s:3:3: a run must be an object of harness options, not number");
    expect_refusal("[{\"ep\": 2, \"mp\": 2}]", gb, "%s:1:18: unknown key \"mp\"");
    expect_refusal("[{\"tp\": 0}]", gb, "%s:1:9: --tp '0': expected an integer in 1..4096");
    expect_refusal("[{\"ep\": \"two\"}]", gb, "%s:1:9: --ep 'two': expected an integer");
    expect_refusal("[{\"ep\": 2.5}]", gb, "%s:1:9: \"ep\": expected a string or an integer");
    expect_refusal("[{\"order\": \"tp-dq\"}]", gb, "%s:1:12: --order 'tp-dq'");
    expect_refusal("[{\"fp32-master\": 1}]", gb,
                   "%s:1:18: \"fp32-master\": expected true or false");
    expect_refusal("[{\"seed\": 7}]", gb,
                   "%s:1:11: \"seed\": the same in every run of a sweep; give --seed");
    expect_refusal("[{\"ep\": 2},\n {\"ep\": 3}]", gb, "%s:2:2: --ep 3: must be >= 1 and divide");
    expect_refusal("[{\"ep\": 2, \"ep\": 4}]", gb, "%s:1:12: ");
    expect_refusal("[{\"ep\": 2}]", "--global-batch 64 --dump /tmp/never",
                   "--sweep and --dump exclude each other");
    /* framework presets and the objective's keys */
    expect_refusal("[{\"framework\": \"megatron-1\"}]", gb, "%s:1:16: --framework 'megatron-1'");
    expect_refusal("[{\"framework\": \"torchtitan\", \"order\": \"ep-dp\"}]", gb,
                   "%s:1:2: layout torchtitan (world 8, tp 1, pp 1, cp 1, ep 4, order ep-dp): "
                   "torchtitan has no order");
    expect_refusal("[{\"aux-loss-scope\": \"both\"}]", gb,
                   "%s:1:21: --aux-loss-scope 'both': expected global or local");
    expect_refusal("[{\"aux-loss-coeff\": -1}]", gb, "%s:1:21: --aux-loss-coeff '-1'");
    expect_refusal("[{\"capacity-factor\": true}]", gb,
                   "%s:1:22: \"capacity-factor\": expected a string or an integer");
    expect_refusal("[{\"shared-expert-ff\": 8}]", gb,
                   "%s:1:23: \"shared-expert-ff\": the same in every run of a sweep");
    expect_refusal("[{\"ep\": 2},\n {\"inject\": \"local-aux\", \"aux-loss-coeff\": 0.01, "
                   "\"aux-loss-scope\": \"local\"}]",
                   gb, "%s:2:2: --inject local-aux: expected --aux-loss-coeff > 0 with");
}

/* Every framework preset at TP = PP = CP = ETP = 1, with each of its orders, trains the same
 * logical model: the frameworks sweep agrees within f32's tolerance. */
static void test_frameworks_sweep(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir("frameworks"));
    hx_test_run run;
    hx_test_harness(&run,
                    "--sweep frameworks --world 8 --ep 4 --dtype f32 --global-batch 255 --steps 2 "
                    "--out %s",
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("frameworks sweep exited %d\n%s%s", run.status, run.err, run.out);
    hx_json *s = hx_test_json(dir, "sweep.json");
    const hx_json *runs = hx_json_get(s, "runs");
    static const char *const expected[][2] = {{"megatron", "tp-cp-ep-dp-pp"},
                                              {"megatron", "tp-cp-dp-ep-pp"},
                                              {"megatron-0.9", "tp-cp-ep-dp-pp"},
                                              {"megatron-0.9", "tp-cp-dp-ep-pp"},
                                              {"deepspeed", "ep-dp"},
                                              {"deepspeed", "dp-ep"},
                                              {"torchtitan", "-"}};
    assert_int_equal(runs->count, 7);
    for (size_t i = 0; i < runs->count; i++) {
        const hx_json *r = &runs->items[i];
        assert_string_equal(hx_json_get(r, "framework")->string, expected[i][0]);
        assert_string_equal(hx_json_get(r, "order")->string, expected[i][1]);
        assert_int_equal(hx_test_int(r, "ep"), 4);
        assert_true(flag(r, "checks_passed"));
        assert_true(flag(r, "agrees"));
        assert_true(hx_test_number(r, "max_loss_deviation") <= 1e-5);
        assert_true(hx_test_number(r, "weight_deviation") <= 1e-5);
    }
    assert_string_equal(hx_json_get(&runs->items[0], "name")->string,
                        "w8-megatron-ep4-tp-cp-ep-dp-pp-f32");
    hx_json_free(s);
    /* a file names them too */
    const char *base = hx_test_dir("framework-file");
    char file[1200];
    snprintf(file, sizeof file, "%s/sweep.json", base);
    snprintf(dir, sizeof dir, "%s/out", base);
    write_text(file, "[{\"framework\": \"deepspeed\", \"order\": \"dp-ep\", \"ep\": 2},\n"
                     " {\"framework\": \"torchtitan\", \"ep\": 4}, {\"ep\": 8}]\n");
    hx_test_harness(&run, "--sweep %s --world 8 --dtype f32 --global-batch 99 --steps 2 --out %s",
                    file, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("framework file exited %d\n%s%s", run.status, run.err, run.out);
    s = hx_test_json(dir, "sweep.json");
    runs = hx_json_get(s, "runs");
    assert_string_equal(hx_json_get(&runs->items[0], "name")->string, "w8-deepspeed-ep2-dp-ep-f32");
    assert_string_equal(hx_json_get(&runs->items[1], "framework")->string, "torchtitan");
    assert_int_equal(hx_json_get(&runs->items[2], "framework")->type, HX_JSON_NULL);
    hx_json_free(s);
}

/* The load-balancing loss's scopes are two objectives: in one sweep each is compared with its
 * own first run and agrees across layouts (global over worlds too, local over the layouts of
 * one world, whose data shards are the same), while the two differ from each other. */
static void test_scope_sweep(void **state)
{
    (void)state;
    const char *base = hx_test_dir("scope");
    char file[1200], dir[1200];
    snprintf(file, sizeof file, "%s/sweep.json", base);
    snprintf(dir, sizeof dir, "%s/out", base);
    write_text(file, "[\n"
                     " {\"world\": 2, \"ep\": 1, \"aux-loss-coeff\": 0.01},\n"
                     " {\"world\": 8, \"ep\": 4, \"order\": \"dp-ep\", \"aux-loss-coeff\": 0.01},\n"
                     " {\"world\": 8, \"ep\": 2, \"aux-loss-coeff\": 0.01, \"aux-loss-scope\": "
                     "\"local\"},\n"
                     " {\"world\": 8, \"ep\": 8, \"aux-loss-coeff\": \"0.01\", \"aux-loss-scope\": "
                     "\"local\"}\n"
                     "]\n");
    hx_test_run run;
    hx_test_harness(&run, "--sweep %s --dtype f32 --global-batch 200 --steps 2 --out %s", file,
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("scope sweep exited %d\n%s%s", run.status, run.err, run.out);
    assert_non_null(strstr(run.out, "objective aux 0.01 local: compared with run 3; differs from "
                                    "run 1 (aux 0.01 global) by "));
    hx_json *s = hx_test_json(dir, "sweep.json");
    const hx_json *runs = hx_json_get(s, "runs");
    static const int baseline[] = {1, 1, 3, 3};
    for (size_t i = 0; i < 4; i++) {
        const hx_json *r = &runs->items[i];
        assert_int_equal(hx_test_int(r, "compared_with_run"), baseline[i]);
        assert_true(flag(r, "agrees"));
        assert_true(hx_test_number(r, "max_loss_deviation") <= 1e-5);
    }
    assert_string_equal(hx_json_get(&runs->items[2], "objective")->string, "aux 0.01 local");
    assert_true(hx_test_number(&runs->items[1], "objective_deviation_from_run_1") == 0);
    /* the local scope's loss is another objective: well beyond f32's tolerance from run 1 */
    assert_true(hx_test_number(&runs->items[2], "objective_deviation_from_run_1") > 1e-4);
    assert_true(hx_test_number(&runs->items[3], "objective_deviation_from_run_1") > 1e-4);
    hx_json_free(s);
    char path[1300], *md = NULL;
    snprintf(path, sizeof path, "%s/sweep.md", dir);
    assert_int_equal(hx_read_file(path, &md, NULL), SELDP_OK);
    assert_non_null(strstr(md, "## Objectives"));
    assert_non_null(strstr(md, "| 3 (w8-ep2-ep-dp-aux-local-f32) | aux 0.01 local | "));
    free(md);
}

/* Names that are neither a preset nor a file, and a sweep with nowhere to write. */
static void test_unknown_presets(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--sweep eps --global-batch 64 --out %s/x", hx_test_dir("unknown"));
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(
        strstr(run.err, "--sweep eps: not a preset (ep, frameworks, worlds, worlds-32) and "));
    hx_test_harness(&run, "--sweep ep --global-batch 64 --out none");
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "--sweep needs --out DIR"));
}

static void test_mixed_worlds_need_global_batch(void **state)
{
    (void)state;
    expect_refusal("[{\"world\": 8}, {\"world\": 4}]", "",
                   "--sweep %s mixes worlds without --global-batch");
    expect_refusal(NULL, "", "--sweep worlds mixes worlds without --global-batch");
    /* one world without --global-batch is allowed (it may still deviate) */
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir("worlds"));
    hx_test_run run;
    hx_test_harness(&run, "--sweep worlds --dtype f32 --global-batch 77 --steps 2 --out %s", dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("worlds sweep exited %d\n%s%s", run.status, run.err, run.out);
    assert_non_null(strstr(run.out, "sweep [4/4] w8-ep4"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ep_sweep_f32),
        cmocka_unit_test(test_ep_sweep_bf16),
        cmocka_unit_test(test_sweep_file),
        cmocka_unit_test(test_sweep_detects_deviation),
        cmocka_unit_test(test_lockstep_agrees_where_free_runs_part),
        cmocka_unit_test(test_malformed_sweep_files),
        cmocka_unit_test(test_unknown_presets),
        cmocka_unit_test(test_mixed_worlds_need_global_batch),
        cmocka_unit_test(test_frameworks_sweep),
        cmocka_unit_test(test_scope_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
