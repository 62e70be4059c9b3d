/* No false alarm on correct runs far longer and larger than the regression tests' (label slow;
 * docs/tolerances.md): every run and sweep here must pass. worlds 1 and 8 in f32, bf16 and
 * f16 for 200 steps at lr 0.5; d_model 128 and 256; every router option, the shared expert,
 * NF4 and AWQ experts and FP32 master weights for 100 steps; a Megatron grid of 16 ranks with a
 * shared expert for 50 steps; the ep, frameworks and worlds sweeps in bf16 and f32 for 50
 * steps (in lockstep). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

static void passes(const char *fmt, const char *arg)
{
    char args[512];
    snprintf(args, sizeof args, fmt, arg);
    hx_test_run run;
    hx_test_harness(&run, "%s --quiet --out none", args);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s: exit %d (a correct run must pass)\n%s%s", args, run.status,
                 run.err, run.out);
    printf("  ok: %s\n", args);
}

static void long_runs(void **state)
{
    (void)state;
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    for (int d = 0; d < 3; d++) {
        passes("--world 1 --ep 1 --dtype %s --steps 200 --lr 0.5", dtypes[d]);
        passes("--world 8 --ep 4 --dtype %s --steps 200 --lr 0.5", dtypes[d]);
    }
}

static void larger_models(void **state)
{
    (void)state;
    passes("--world 4 --ep 2 --dtype %s --d-model 128 --d-ff 256 --global-batch 256 --seed 5 "
           "--steps 50",
           "f32");
    passes("--world 2 --ep 2 --dtype %s --d-model 256 --d-ff 512 --steps 30 --lr 0.3", "f32");
    passes("--world 2 --ep 2 --dtype %s --d-model 256 --d-ff 512 --steps 30 --lr 0.3", "bf16");
}

/* At the edges: a high learning rate on wide models. Router probabilities underflow in FP32
 * (the model's top-K ties at 0 where the logits differ by units), gates near 1e-38, adapters
 * aligned with their gradient, f16 gradients below its subnormals. */
static void edges(void **state)
{
    (void)state;
    passes("--world 8 --ep 8 --d-model 256 --d-ff 256 --dtype %s --lr 1.0 --steps 8 --seed 644 "
           "--aux-loss-coeff 0.01",
           "f32");
    passes("--world 1 --ep 1 --d-model 256 --d-ff 256 --dtype %s --lr 1.0 --steps 10 --seed 458 "
           "--z-loss-coeff 0.001",
           "f16");
    passes("--world 2 --ep 1 --d-model 256 --d-ff 512 --dtype %s --lr 1.0 --steps 20 --seed 850 "
           "--quant nf4",
           "f32");
}

static void options_for_100_steps(void **state)
{
    (void)state;
    static const char *const options[] = {
        "--aux-loss-coeff 0.01",
        "--aux-loss-coeff 0.02 --aux-loss-scope local",
        "--z-loss-coeff 0.001",
        "--capacity-factor 1.0",
        "--aux-loss-coeff 0.01 --z-loss-coeff 0.001 --capacity-factor 1.25",
        "--shared-expert-ff 64",
        "--quant nf4",
        "--quant awq",
        "--fp32-master",
    };
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        passes("--world 8 --ep 4 --steps 100 %s", options[i]);
}

static void grid_for_50_steps(void **state)
{
    (void)state;
    passes("%s --world 16 --tp 2 --pp 2 --ep 2 --shared-expert-ff 64 --steps 50", "--framework "
                                                                                  "megatron");
}

static void sweeps(void **state)
{
    (void)state;
    static const char *const presets[] = {"ep", "frameworks", "worlds"};
    static const char *const dtypes[] = {"bf16", "f32"};
    for (int p = 0; p < 3; p++) {
        for (int d = 0; d < 2; d++) {
            char args[512];
            snprintf(args, sizeof args,
                     "--sweep %s --world 8 --dtype %s --global-batch 256 --steps 50 --quiet --out "
                     "%s",
                     presets[p], dtypes[d], hx_test_dir(presets[p]));
            hx_test_run run;
            hx_test_harness(&run, "%s", args);
            if (run.status != HX_EXIT_PASS)
                fail_msg("seldp-harness %s: exit %d (a correct sweep must pass)\n%s%s", args,
                         run.status, run.err, run.out);
            printf("  ok: %s\n", args);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(long_runs),         cmocka_unit_test(edges),
        cmocka_unit_test(larger_models),     cmocka_unit_test(options_for_100_steps),
        cmocka_unit_test(grid_for_50_steps), cmocka_unit_test(sweeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
