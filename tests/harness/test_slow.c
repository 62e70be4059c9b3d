/* Larger simulated worlds (label `slow`): 16 and 32 ranks in the layouts of DeepSpeed and
 * Megatron-Core and their transpose, every dtype, both expert flows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

static void run_ok(const char *args)
{
    const char *dir = hx_test_dir("slow");
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 2 --quiet --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested, failed;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_json_free(report);
}

static void test_world16(void **state)
{
    (void)state;
    run_ok("--world 16 --ep 4 --order ep-dp --dtype bf16");
    run_ok("--world 16 --ep 4 --order dp-ep --dtype f16 --expert-reduce mean");
    run_ok("--world 16 --ep 8 --experts 16 --dtype f32 --quant nf4 --policy zero");
    run_ok("--world 16 --ep 16 --experts 16 --dtype bf16 --quant awq --fp32-master");
    run_ok("--world 16 --ep 2 --dtype f32 --tokens 4 --token-spread 4 --expert-reduce mean");
}

static void test_world32(void **state)
{
    (void)state;
    run_ok("--world 32 --ep 8 --order ep-dp --dtype bf16");
    run_ok("--world 32 --ep 8 --order dp-ep --dtype f32 --expert-reduce mean --policy zero");
    run_ok("--world 32 --ep 32 --experts 32 --dtype f16 --fp32-master");
    run_ok("--world 32 --ep 4 --dtype bf16 --quant nf4 --roots spread");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world16),
        cmocka_unit_test(test_world32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
