/* The post-step check never fails a correct run (docs/tolerances.md, The update): AdamW for 50
 * steps at several learning rates and dtypes, on an expert-parallel layout and a Megatron grid,
 * with micro-batches; every check passes and the post-step check's worst ratio stays below 1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

static void run_passes(const char *args)
{
    hx_test_run run;
    const char *dir = hx_test_dir("report");
    hx_test_harness(&run, "--timeout 120 --quiet --out %s %s", dir, args);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, "updates equal the FP64 optimizer step", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_json_free(report);
}

static void fifty_steps(void **state)
{
    (void)state;
    static const char *const lrs[] = {"0.001", "0.01", "0.1"};
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    char args[512];
    for (size_t i = 0; i < 3; i++) {
        snprintf(args, sizeof args,
                 "--world 8 --ep 4 --optimizer adamw --micro-batches 4 --steps 50 --lr %s "
                 "--dtype %s --weight-decay 0.01",
                 lrs[i], dtypes[i]);
        run_passes(args);
    }
    run_passes("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --optimizer adamw "
               "--micro-batches 4 --steps 50 --lr 0.003 --tokens 32");
    run_passes("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --optimizer adamw "
               "--micro-batches 4 --steps 50 --lr 0.01 --dtype f32 --tokens 32");
    run_passes("--framework deepspeed --world 8 --ep 4 --optimizer adamw --micro-batches 4 "
               "--steps 50 --lr 0.01 --clip-grad 1");
    run_passes("--framework torchtitan --world 8 --ep 4 --optimizer adamw --micro-batches 4 "
               "--steps 50 --lr 0.01 --dtype f32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fifty_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
