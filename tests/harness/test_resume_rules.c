/* The resume rules (resume.h), one table: the settings that may change on --resume (layout,
 * world, --steps) do, the refused ones are one line naming the setting and both values
 * (seed, global batch, the model, the dtype, the token stream), and the recorded ones (learning
 * rate, router coefficients) run with a line saying what changed. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "interop_test.h"
#include "resume.h"

static char saved[1024]; /* world 4, ep 2, f32, global batch 64, aux 0.01: step 1 */

static int setup(void **state)
{
    (void)state;
    snprintf(saved, sizeof saved, "%s", hx_test_dir("saved"));
    it_run run;
    it_main(&run,
            "--world 4 --ep 2 --dtype f32 --global-batch 64 --aux-loss-coeff 0.01 --lr 0.5 "
            "--steps 1 --save %s --out none --quiet",
            saved);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_free(&run);
    return 0;
}

/* Every row states its rule and why; the three kinds are all there. */
static void the_table(void **state)
{
    (void)state;
    int counts[3] = {0};
    for (size_t i = 0; i < hx_resume_setting_count(); i++) {
        const hx_resume_setting *s = hx_resume_setting_at(i);
        assert_non_null(s);
        assert_true(s->name[0] && s->reason[0]);
        counts[s->rule]++;
    }
    assert_null(hx_resume_setting_at(hx_resume_setting_count()));
    assert_true(counts[HX_RESUME_MAY_CHANGE] >= 3);
    assert_true(counts[HX_RESUME_REFUSED] >= 5);
    assert_true(counts[HX_RESUME_RECORDED] >= 2);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    hx_resume_print_rules(f);
    fclose(f);
    static const char *const expected[] = {"may change  the layout (--ep --order --framework",
                                           "may change  --world",
                                           "may change  --steps",
                                           "refused     --seed",
                                           "refused     --global-batch",
                                           "refused     --dtype",
                                           "recorded    --lr",
                                           "recorded    --aux-loss-coeff",
                                           "recorded    --z-loss-coeff",
                                           "recorded    --capacity-factor"};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        it_has(text, expected[i], "the rules");
    free(text);
}

static void may_change(void **state)
{
    (void)state;
    it_run run;
    /* another world, layout and order, more steps: resharded, and no note */
    it_main(&run,
            "--world 8 --ep 4 --order dp-ep --dtype f32 --global-batch 64 --aux-loss-coeff "
            "0.01 --steps 3 --resume %s --out none",
            saved);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out, "result: PASS", "stdout");
    if (strstr(run.out, "resume: "))
        fail_msg("a change that may happen was noted:\n%s", run.out);
    it_free(&run);
    it_main(&run,
            "--framework megatron --world 4 --tp 2 --ep 2 --dtype f32 --global-batch 64 "
            "--aux-loss-coeff 0.01 --steps 2 --resume %s --out none --quiet",
            saved);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_free(&run);
}

static void refused(void **state)
{
    (void)state;
    static const struct {
        const char *args, *why;
    } cases[] = {
        {"--seed 7 --dtype f32 --global-batch 64",
         "the checkpoint's model has seed 1234, this run's 7: the seed draws every rank's "
         "tokens; a resumed run continues the checkpoint's stream (resume with --seed 1234)"},
        {"--dtype f32 --global-batch 32",
         "the checkpoint's global batch is 64 tokens a step, this run's 32: the global stream "
         "continues with the checkpoint's tokens per step (resume with --global-batch 64)"},
        {"--dtype f32", "the checkpoint's token stream is global, this run's per-rank"},
        {"--dtype bf16 --global-batch 64", "dtype change: the checkpoint holds f32 parameters"},
        {"--dtype f32 --global-batch 64 --layers 3",
         "the checkpoint's model has layers 2, this run's 3: a resumed run trains the "
         "checkpoint's model (resume with --layers 2)"},
        {"--dtype f32 --global-batch 64 --shared-expert-ff 16",
         "the checkpoint's model has d_ff_shared 0, this run's 16"},
        {"--dtype f32 --global-batch 64 --fp32-master",
         "the checkpoint was saved without --fp32-master, this run is with it"},
        {"--dtype f32 --global-batch 64 --steps 1", "leaves nothing to train"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        it_run run;
        it_main(&run, "--world 4 --ep 2 --aux-loss-coeff 0.01 --steps 2 %s --resume %s --out none",
                cases[i].args, saved);
        it_expect(&run, HX_EXIT_USAGE, cases[i].why);
        it_free(&run);
    }
}

static void recorded(void **state)
{
    (void)state;
    it_run run;
    it_main(&run,
            "--world 4 --ep 2 --dtype f32 --global-batch 64 --aux-loss-coeff 0.02 "
            "--z-loss-coeff 0.001 --lr 0.1 --steps 2 --resume %s --out none",
            saved);
    it_expect(&run, HX_EXIT_PASS, NULL);
    it_has(run.out,
           "resume: --lr 0.1: the checkpoint trained with 0.5; the steps from the checkpoint on "
           "take the new rate\n",
           "stdout");
    it_has(run.out, "resume: --aux-loss-coeff 0.02: the checkpoint trained with 0.01;", "stdout");
    it_has(run.out, "resume: --z-loss-coeff 0.001: the checkpoint trained with 0;", "stdout");
    assert_int_equal(it_lines_with(run.out, "resume: "), 3);
    it_has(run.out, "result: PASS", "stdout");
    it_free(&run);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_table),
        cmocka_unit_test(may_change),
        cmocka_unit_test(refused),
        cmocka_unit_test(recorded),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
