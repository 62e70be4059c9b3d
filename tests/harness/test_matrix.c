/* The regression matrix: worlds 1, 2, 4, 8 with every expert-parallel size that divides them,
 * both orders, and for each layout the full product of dtype (f32, bf16, f16), expert format
 * (none, nf4, awq), expert flow (sum, mean) and missing-gradient policy (error, zero); FP32
 * master weights alternate. Every run must pass every check (docs/harness.md, Checks), and the
 * checks must have tested something. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

static const char *const dtypes[] = {"f32", "bf16", "f16"};
static const char *const quants[] = {"none", "nf4", "awq"};
static const char *const orders[] = {"ep-dp", "dp-ep"};

/* One run; on failure, show the command and what the harness said. */
static void run_case(const char *dir, const char *args)
{
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 2 --tokens 24 --quiet --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested, failed;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_test_check(report, "replicas equal their root after initialize", &tested, &failed);
    assert_true(tested > 0);
    hx_test_check(report, "tokens per expert equal the reference's", &tested, &failed);
    assert_true(tested > 0);
    hx_json_free(report);
}

static void run_world(int world)
{
    static const char *const flows[] = {"sum", "mean"};
    static const char *const policies[] = {"error", "zero"};
    const char *dir = hx_test_dir("matrix");
    int index = 0;
    for (int ep = 1; ep <= world; ep *= 2) {
        for (int o = 0; o < 2; o++) {
            if (o == 1 && (ep == 1 || ep == world))
                continue; /* the transpose of a trivial layout is the same layout */
            for (int d = 0; d < 3; d++) {
                for (int q = 0; q < 3; q++) {
                    for (int f = 0; f < 2; f++) {
                        for (int p = 0; p < 2; p++) {
                            char args[256];
                            snprintf(args, sizeof args,
                                     "--world %d --ep %d --order %s --dtype %s --quant %s "
                                     "--expert-reduce %s --policy %s%s --seed %d",
                                     world, ep, orders[o], dtypes[d], quants[q], flows[f],
                                     policies[p], index % 2 ? " --fp32-master" : "",
                                     1000 * world + index);
                            run_case(dir, args);
                            index++;
                        }
                    }
                }
            }
        }
    }
}

static void test_world1(void **state)
{
    (void)state;
    run_world(1);
}

static void test_world2(void **state)
{
    (void)state;
    run_world(2);
}

static void test_world4(void **state)
{
    (void)state;
    run_world(4);
}

static void test_world8(void **state)
{
    (void)state;
    run_world(8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world1),
        cmocka_unit_test(test_world2),
        cmocka_unit_test(test_world4),
        cmocka_unit_test(test_world8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
