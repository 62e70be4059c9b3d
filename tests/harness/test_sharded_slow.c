/* The sharded tiny-moe in larger worlds (label slow): 16 and 32 ranks with tensor, pipeline
 * and expert parallelism under every framework preset, the README's grid run among them,
 * with its groups in report.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

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

/* The run the issue names, and its groups as Megatron-Core builds them. */
static void megatron_world16(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("megatron16");
    char out[600];
    snprintf(out, sizeof out, "%s", dir);
    hx_test_run run;
    hx_test_harness(&run,
                    "--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --shared-expert-ff 64 "
                    "--quiet --out %s",
                    out);
    if (run.status != HX_EXIT_PASS)
        fail_msg("exit %d\n%s%s", run.status, run.err, run.out);
    hx_json *report = hx_test_report(out);
    const hx_json *layout = hx_json_get(report, "layout");
    assert_non_null(layout);
    assert_int_equal(hx_test_int(layout, "tp"), 2);
    assert_int_equal(hx_test_int(layout, "pp"), 2);
    assert_int_equal(hx_test_int(layout, "etp"), 2);
    const hx_json *groups = hx_json_get(layout, "groups");
    assert_non_null(groups);
    char text[512];
    group_text(groups, "tp", text, sizeof text);
    assert_string_equal(text, "[[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], "
                              "[14, 15]]");
    group_text(groups, "pp", text, sizeof text);
    assert_string_equal(text, "[[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], "
                              "[7, 15]]");
    group_text(groups, "dp", text, sizeof text);
    assert_string_equal(text, "[[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]");
    group_text(groups, "embedding", text, sizeof text);
    assert_string_equal(text, "[[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], "
                              "[7, 15]]");
    int64_t tested, failed;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_json_free(report);
}

static void world16(void **state)
{
    (void)state;
    hx_test_run_passes("--framework megatron --world 16 --tp 2 --pp 2 --ep 4 --dtype f32 "
                       "--expert-reduce mean");
    hx_test_run_passes("--framework megatron --world 16 --tp 2 --pp 2 --cp 2 --etp 1 --ep 2 "
                       "--dtype bf16 --shared-expert-ff 32");
    hx_test_run_passes("--framework deepspeed --world 16 --tp 2 --pp 2 --ep 4 --dtype f16");
    hx_test_run_passes("--framework torchtitan --world 16 --tp 2 --pp 2 --ep 4 --dtype f32 "
                       "--shared-expert-ff 32 --policy zero");
    hx_test_run_passes("--framework megatron-0.9 --world 16 --tp 2 --pp 2 --ep 2 --dtype bf16");
}

static void world32(void **state)
{
    (void)state;
    hx_test_run_passes("--framework megatron --world 32 --tp 2 --pp 2 --ep 4 --dtype bf16 "
                       "--shared-expert-ff 32");
    hx_test_run_passes("--framework megatron --world 32 --tp 2 --pp 2 --cp 2 --ep 2 --dtype f32 "
                       "--expert-reduce mean");
    hx_test_run_passes("--framework deepspeed --world 32 --tp 2 --pp 2 --ep 4 --dtype f32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(megatron_world16),
        cmocka_unit_test(world16),
        cmocka_unit_test(world32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
