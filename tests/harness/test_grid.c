/* The framework presets of the harness (docs/harness.md, Framework presets): --print-layout prints
 * any combination's groups and exits 0 without training; sizes the sharded model cannot split are
 * refused (exit 2, one line), as are the frameworks' rejections; report.json's layout carries the
 * sizes and every group kind, and still loads back as a layout file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

static void expect_out(const hx_test_run *run, const char *text)
{
    if (!strstr(run->out, text))
        fail_msg("stdout lacks \"%s\":\n%s", text, run->out);
}

static void expect_usage(const char *args, const char *why)
{
    hx_test_run run;
    hx_test_harness(&run, "%s", args);
    if (run.status != HX_EXIT_USAGE || !strstr(run.err, why) ||
        strchr(run.err, '\n') != run.err + strlen(run.err) - 1)
        fail_msg("seldp-harness %s: exit %d, stderr \"%s\"; expected exit 2 and one line with "
                 "\"%s\"",
                 args, run.status, run.err, why);
    if (strstr(run.out, "result:"))
        fail_msg("seldp-harness %s trained:\n%s", args, run.out);
}

static void print_layout_megatron_docstring(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--print-layout --framework megatron --world 16 --tp 2 --pp 4 --ep 1");
    assert_int_equal(run.status, HX_EXIT_PASS);
    /* initialize_model_parallel's docstring, 16 GPUs, tp 2, pp 4 */
    expect_out(&run,
               "  dp          8 x 2  [0,2] [1,3] [4,6] [5,7] [8,10] [9,11] [12,14] [13,15]\n");
    expect_out(&run,
               "  tp          8 x 2  [0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]\n");
    expect_out(&run, "  pp          4 x 4  [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]\n");
    expect_out(&run, "  embedding   4 x 2  [0,12] [1,13] [2,14] [3,15]\n");
    if (strstr(run.out, "result:") || run.err[0])
        fail_msg("--print-layout trained or complained: %s%s", run.out, run.err);
}

static void print_layout_every_framework(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--print-layout --framework deepspeed --world 16 --tp 2 --ep 4 --etp 2");
    assert_int_equal(run.status, HX_EXIT_PASS);
    /* groups.py's E + M + D example */
    expect_out(&run, "  ep          4 x 4  [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]\n");
    expect_out(&run,
               "  expert_dp   8 x 2  [0,8] [1,9] [2,10] [3,11] [4,12] [5,13] [6,14] [7,15]\n");
    hx_test_harness(&run, "--print-layout --framework torchtitan --world 8 --tp 2 --ep 2");
    assert_int_equal(run.status, HX_EXIT_PASS);
    expect_out(&run, "  ep          4 x 2  [0,1] [2,3] [4,5] [6,7]\n");
    expect_out(&run, "  expert_dp   2 x 4  [0,2,4,6] [1,3,5,7]\n");
    hx_test_harness(&run, "--print-layout --framework megatron-0.9 --world 8 --ep 2 --order "
                          "tp-cp-dp-ep-pp");
    assert_int_equal(run.status, HX_EXIT_PASS);
    expect_out(&run, "  ep          4 x 2  [0,4] [1,5] [2,6] [3,7]\n");
    expect_out(&run, "  expert_dp   2 x 4  [0-3] [4-7]\n");
}

static void refusals_and_rejections(void **state)
{
    (void)state;
    /* what the sharded tiny-moe needs of the sizes (test_sharded.c trains the others) */
    expect_usage("--world 8 --ep 2 --pp 2 --layers 3 --out none",
                 "--pp 2: must divide the layers (--layers 3)");
    expect_usage("--world 8 --ep 2 --tp 2 --vocab 63 --out none",
                 "--tp 2: must divide the vocabulary (--vocab 63)");
    expect_usage("--world 8 --ep 2 --etp 2 --framework torchtitan --out none",
                 "Currently we only support ETP=TP or ETP=1");
    expect_usage("--print-layout --world 12 --tp 5 --ep 1",
                 "layout megatron (world 12, tp 5, pp 1, cp 1, ep 1): world_size (12) is not "
                 "divisible by 5");
    expect_usage("--print-layout --framework deepspeed --cp 2",
                 "DeepSpeed's groups (deepspeed/utils/groups.py) have no context parallelism");
    expect_usage("--print-layout --framework megatron --order tp-cp-ep-dp-pp --world 8 --ep 3",
                 "world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size "
                 "(3)");
    expect_usage("--print-layout --framework megatron --world 16 --pp 2 --ep 2 --order "
                 "tp-pp-ep-dp-cp",
                 "When not using pp-last rank ordering");
    expect_usage("--framework gpt", "--framework 'gpt': expected megatron, megatron-0.9, "
                                    "deepspeed or torchtitan");
    expect_usage("--tp 0", "--tp '0': expected an integer in 1..4096");
    expect_usage("--order tp-cp-ep-dq", "--order 'tp-cp-ep-dq': expected ep-dp or dp-ep");
    expect_usage("--layout-file x.json --tp 2",
                 "--layout-file and --framework/--tp/--pp/--cp/--etp exclude each other");
}

static void print_layout_file(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--print-layout --layout-file %s", hx_test_layout("hot-expert.json"));
    if (run.status != HX_EXIT_PASS)
        fail_msg("exit %d: %s", run.status, run.err);
    expect_out(&run, "layout: hot-expert.json");
    if (strstr(run.out, "result:"))
        fail_msg("--print-layout trained:\n%s", run.out);
}

/* groups.<kind> of report.json's layout as text "[[0, 1], [2, 3]]". */
static void group_text(const hx_json *groups, const char *kind, char *buf, size_t size)
{
    const hx_json *list = hx_json_get(groups, kind);
    assert_non_null(list);
    size_t n = (size_t)snprintf(buf, size, "[");
    for (size_t g = 0; g < list->count && n < size; g++) {
        const hx_json *ranks = &list->items[g];
        n += (size_t)snprintf(buf + n, size - n, "%s[", g ? ", " : "");
        for (size_t i = 0; i < ranks->count && n < size; i++)
            n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "",
                                  (long long)ranks->items[i].integer);
        n += (size_t)snprintf(buf + n, size - n, "]");
    }
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

static void report_groups(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("deepspeed");
    char out[512];
    snprintf(out, sizeof out, "%s", dir);
    hx_test_run run;
    hx_test_harness(&run,
                    "--framework deepspeed --order dp-ep --world 4 --ep 2 --steps 1 --quiet "
                    "--out %s",
                    out);
    if (run.status != HX_EXIT_PASS)
        fail_msg("exit %d: %s%s", run.status, run.err, run.out);
    hx_json *report = hx_test_report(out);
    const hx_json *layout = hx_json_get(report, "layout");
    assert_non_null(layout);
    const hx_json *framework = hx_json_get(layout, "framework");
    assert_non_null(framework);
    assert_string_equal(framework->string, "deepspeed");
    assert_int_equal(hx_test_int(layout, "tp"), 1);
    assert_int_equal(hx_test_int(layout, "ep"), 2);
    assert_int_equal(hx_test_int(layout, "etp"), 1);
    const hx_json *groups = hx_json_get(layout, "groups");
    assert_non_null(groups);
    char text[256];
    group_text(groups, "ep", text, sizeof text);
    assert_string_equal(text, "[[0, 2], [1, 3]]");
    group_text(groups, "expert_dp", text, sizeof text);
    assert_string_equal(text, "[[0, 1], [2, 3]]");
    group_text(groups, "dp", text, sizeof text);
    assert_string_equal(text, "[[0, 1, 2, 3]]");
    group_text(groups, "tp", text, sizeof text);
    assert_string_equal(text, "[[0], [1], [2], [3]]");
    group_text(groups, "embedding", text, sizeof text);
    assert_string_equal(text, "[[0], [1], [2], [3]]");

    hx_json_free(report);

    /* the report's layout, cut out of report.json, is a layout file reproducing the run */
    char *text_report = NULL, path[600];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/report.json", out);
    assert_int_equal(hx_read_file(path, &text_report, &len), SELDP_OK);
    const char *start = strstr(text_report, "\"layout\": ");
    assert_non_null(start);
    start += strlen("\"layout\": ");
    const char *end = start;
    int depth = 0;
    do {
        depth += *end == '{' ? 1 : *end == '}' ? -1 : 0;
        end++;
    } while (depth > 0 && *end);
    snprintf(path, sizeof path, "%s/layout.json", out);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fwrite(start, 1, (size_t)(end - start), f);
    fclose(f);
    free(text_report);
    hx_test_harness(&run, "--layout-file %s --steps 1 --quiet --out none", path);
    if (run.status != HX_EXIT_PASS)
        fail_msg("--layout-file of the report's layout: exit %d: %s", run.status, run.err);
}

/* A Megatron order string reproduces the transposed layout the old dp-ep named. */
static void megatron_order_string(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--order tp-cp-dp-ep-pp --world 4 --ep 2 --steps 1 --out none");
    if (run.status != HX_EXIT_PASS)
        fail_msg("exit %d: %s", run.status, run.err);
    expect_out(&run, "layout: megatron tp-cp-dp-ep-pp, world 4, ep 2");
    expect_out(&run, "e0 [0,2]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(print_layout_megatron_docstring),
        cmocka_unit_test(print_layout_every_framework),
        cmocka_unit_test(refusals_and_rejections),
        cmocka_unit_test(print_layout_file),
        cmocka_unit_test(report_groups),
        cmocka_unit_test(megatron_order_string),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
