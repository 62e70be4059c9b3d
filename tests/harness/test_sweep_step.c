/* Lockstep sweeps with the training step's options (docs/harness.md, Sweeps): AdamW's moments
 * and step counts, --zero 1's ranges and the loss scale go with the recorded weights, so a run
 * follows the first in lockstep under each; the update is compared with what the two runs'
 * gradients explain. A --zero 1 run follows a --zero 0 --fp32-master run with nothing to
 * explain (the same bits); a skipped step compares no gradients; a planted bug still deviates. */
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
#include "json.h"
#include "util.h"

/* The sweep `args` exits `want`; its sweep.json (the caller frees it). */
static hx_json *sweep(const char *name, int want, const char *args)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/out", hx_test_dir(name));
    hx_test_run run;
    hx_test_harness(&run, "%s --out %s", args, dir);
    if (run.status != want)
        fail_msg("seldp-harness %s: exit %d, expected %d\n%s%s", args, run.status, want, run.err,
                 run.out);
    return hx_test_json(dir, "sweep.json");
}

/* Every run after the first in lockstep with it and agreeing, each ratio below `limit`. */
static void all_agree(const hx_json *s, double limit, const char *what)
{
    const hx_json *runs = hx_json_get(s, "runs");
    assert_non_null(runs);
    assert_true(runs->count >= 2);
    for (size_t i = 1; i < runs->count; i++) {
        const hx_json *r = &runs->items[i];
        const hx_json *lock = hx_json_get(r, "lockstep");
        if (!lock || lock->type != HX_JSON_BOOL || !lock->boolean)
            fail_msg("%s: run %zu not in lockstep", what, i + 1);
        double worst =
            fmax(hx_test_number(r, "lockstep_loss"), fmax(hx_test_number(r, "lockstep_gradients"),
                                                          hx_test_number(r, "lockstep_update")));
        if (!(worst <= limit))
            fail_msg("%s: run %zu: lockstep ratio %g over %g", what, i + 1, worst, limit);
    }
}

static void adamw_in_lockstep(void **state)
{
    (void)state;
    /* bf16 with clipping and lr 0.1 (every element's step near lr), f32 with micro-batches */
    hx_json *s = sweep("adamw", HX_EXIT_PASS,
                       "--sweep ep --world 8 --optimizer adamw --lr 0.1 --clip-grad 0.5 --steps 6 "
                       "--global-batch 256 --quiet");
    all_agree(s, 1.0, "adamw bf16");
    hx_json_free(s);
    s = sweep("adamw_f32", HX_EXIT_PASS,
              "--sweep ep --world 4 --optimizer adamw --lr 0.01 --dtype f32 --micro-batches 2 "
              "--steps 4 --global-batch 256 --quiet");
    all_agree(s, 1.0, "adamw f32");
    hx_json_free(s);
}

static void zero_in_lockstep(void **state)
{
    (void)state;
    char file[1300];
    snprintf(file, sizeof file, "%s/zero.json", hx_test_dir("zero"));
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("[{\"world\": 8, \"ep\": 4, \"zero\": 0}, {\"world\": 8, \"ep\": 4, \"zero\": 1},\n"
          " {\"world\": 8, \"ep\": 2, \"zero\": 1}, {\"world\": 4, \"ep\": 4, \"zero\": 1}]\n",
          f);
    fclose(f);
    char args[1600];
    snprintf(args, sizeof args,
             "--sweep %s --fp32-master --optimizer adamw --lr 0.01 --clip-grad 0.3 --steps 4 "
             "--global-batch 256 --quiet",
             file);
    hx_json *s = sweep("zero_out", HX_EXIT_PASS, args);
    all_agree(s, 1.0, "zero");
    /* the same layout under --zero 1: the same bits, nothing for the bounds to absorb (the
     * update's ratio is the FP64 rounding of the two clipping coefficients' difference) */
    const hx_json *r = &hx_json_get(s, "runs")->items[1];
    assert_true(hx_test_number(r, "lockstep_gradients") == 0.0);
    assert_true(hx_test_number(r, "lockstep_update") < 1e-6);
    hx_json_free(s);
}

static void loss_scale_in_lockstep(void **state)
{
    (void)state;
    /* the overflow of step 2 skipped by every run; the dynamic scale followed */
    hx_json *s =
        sweep("scale", HX_EXIT_PASS,
              "--sweep ep --world 8 --dtype f16 --loss-scale dynamic --loss-scale-window 1 "
              "--inject-overflow 2 --optimizer adamw --lr 0.01 --zero 1 --steps 4 --global-batch "
              "256 --quiet");
    all_agree(s, 1.0, "loss scale");
    hx_json_free(s);
}

static void bug_still_deviates(void **state)
{
    (void)state;
    hx_json *s = sweep("bug", HX_EXIT_FAIL,
                       "--sweep ep --world 8 --optimizer adamw --lr 0.01 --zero 1 --steps 2 "
                       "--global-batch 256 --inject ep-scale --quiet");
    const hx_json *runs = hx_json_get(s, "runs");
    int deviates = 0;
    for (size_t i = 1; i < runs->count; i++)
        deviates += hx_test_number(&runs->items[i], "lockstep_gradients") > 1.0;
    assert_true(deviates > 0);
    hx_json_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(adamw_in_lockstep),
        cmocka_unit_test(zero_in_lockstep),
        cmocka_unit_test(loss_scale_in_lockstep),
        cmocka_unit_test(bug_still_deviates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
