/* --clip-grad (docs/library.md, Global gradient norm): the global gradient norm over the rank's
 * sessions matches the FP64 reference's norm of the logical gradient on every layout tested, and
 * the SGD update uses the clipped gradients: a max_norm above the norm changes nothing, a vanishing
 * one stops the training as a zero learning rate would. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

#define STEPS 3

/* Run the harness and return its report; losses[] receives the per-step losses. */
static hx_json *run_losses(const char *name, const char *args, double *losses)
{
    hx_test_run run;
    const char *dir = hx_test_dir(name);
    hx_test_harness(&run, "%s --steps %d --quiet --out %s", args, STEPS, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("'%s' exited %d: %s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    const hx_json *steps = hx_json_get(report, "steps");
    assert_non_null(steps);
    assert_int_equal(steps->count, STEPS);
    for (size_t i = 0; i < STEPS; i++)
        losses[i] = hx_json_get(&steps->items[i], "loss")->number;
    return report;
}

static void norm_matches_the_reference_on_every_layout(void **state)
{
    (void)state;
    static const char *const layouts[] = {
        "--world 4 --ep 2 --dtype f32",
        "--world 8 --ep 4 --order dp-ep --dtype bf16 --expert-reduce mean",
        "--world 6 --ep 3 --experts 6 --dtype f16 --quant nf4 --fp32-master",
        "--world 1 --ep 1 --dtype f32",
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char args[256];
        double losses[STEPS];
        int64_t tested = 0, failed = 0;
        snprintf(args, sizeof args, "%s --clip-grad 0.05", layouts[i]);
        hx_json *report = run_losses("layouts", args, losses);
        hx_test_check(report, "global gradient norm vs the FP64 reference", &tested, &failed);
        if (tested < STEPS || failed != 0)
            fail_msg("'%s': the norm check tested %lld, failed %lld", args, (long long)tested,
                     (long long)failed);
        hx_json_free(report);
    }
}

static void update_uses_the_clipped_gradients(void **state)
{
    (void)state;
    const char *base = "--world 4 --ep 2 --dtype f32 --fp32-master --seed 77";
    char args[256];
    double plain[STEPS], high[STEPS], frozen[STEPS], tiny[STEPS];
    int64_t tested = 0, failed = 0;

    snprintf(args, sizeof args, "%s --lr 0.5", base);
    hx_json_free(run_losses("plain", args, plain));
    /* a max_norm far above the norm: the same training, bit for bit */
    snprintf(args, sizeof args, "%s --lr 0.5 --clip-grad 1e30", base);
    hx_json *report = run_losses("high", args, high);
    hx_test_check(report, "global gradient norm vs the FP64 reference", &tested, &failed);
    assert_true(tested >= STEPS);
    assert_int_equal(failed, 0);
    hx_json_free(report);
    /* without the check the report leaves the norm untested */
    snprintf(args, sizeof args, "%s --lr 0", base);
    report = run_losses("frozen", args, frozen);
    hx_test_check(report, "global gradient norm vs the FP64 reference", &tested, &failed);
    assert_int_equal(tested, 0);
    hx_json_free(report);
    /* a vanishing max_norm: the updates vanish, as with a zero learning rate */
    snprintf(args, sizeof args, "%s --lr 0.5 --clip-grad 1e-12", base);
    hx_json_free(run_losses("tiny", args, tiny));

    for (int s = 0; s < STEPS; s++) {
        if (high[s] != plain[s])
            fail_msg("step %d: loss %.17g with --clip-grad 1e30, %.17g without", s + 1, high[s],
                     plain[s]);
        if (fabs(tiny[s] - frozen[s]) > 1e-9)
            fail_msg("step %d: loss %.17g with --clip-grad 1e-12, %.17g with --lr 0", s + 1,
                     tiny[s], frozen[s]);
    }
    /* and the unclipped training did move away from the frozen one */
    if (!(fabs(plain[STEPS - 1] - frozen[STEPS - 1]) > 1e-3))
        fail_msg("the losses with --lr 0.5 (%.9g) and --lr 0 (%.9g) do not differ: the test "
                 "cannot tell clipping from none",
                 plain[STEPS - 1], frozen[STEPS - 1]);
}

static void bad_clip_grad_is_a_usage_error(void **state)
{
    (void)state;
    static const char *const args[] = {"--clip-grad -1", "--clip-grad many", "--clip-grad nan"};
    for (size_t i = 0; i < 3; i++) {
        hx_test_run run;
        hx_test_harness(&run, "%s --out none", args[i]);
        if (run.status != HX_EXIT_USAGE || !strstr(run.err, "--clip-grad"))
            fail_msg("'%s' exited %d, expected %d with a message naming --clip-grad: %s", args[i],
                     run.status, HX_EXIT_USAGE, run.err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(norm_matches_the_reference_on_every_layout),
        cmocka_unit_test(update_uses_the_clipped_gradients),
        cmocka_unit_test(bad_clip_grad_is_a_usage_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
