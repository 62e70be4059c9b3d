/* Checkpoints of the training step (docs/harness.md, Checkpoints): the optimizer state (FP32
 * masters, AdamW's moments, every parameter's step count) and the loss scale are saved; a resume
 * under the same layout gives the uninterrupted run's dump bit for bit, a --zero 1 checkpoint
 * (its state made whole from the ranges' owners) resumes under --zero 1 bit for bit and under
 * --zero 0 --fp32-master as that run would have gone on, and under another world within the
 * tolerance; a change of optimizer is refused. */
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
#include "safetensors.h"

static void run_ok(const char *fmt, ...)
{
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    hx_test_run run;
    hx_test_harness(&run, "--quiet --out none --timeout 60 %s", args);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
}

static char *slurp(const char *dir, int r, size_t *len)
{
    char path[1300];
    char *data = NULL;
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, r);
    if (hx_read_file(path, &data, len) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return data;
}

static void same_dumps(const char *a, const char *b, int world, const char *what)
{
    for (int r = 0; r < world; r++) {
        size_t na = 0, nb = 0;
        char *x = slurp(a, r, &na), *y = slurp(b, r, &nb);
        if (na != nb || memcmp(x, y, na) != 0)
            fail_msg("%s: rank %d's dump differs from the uninterrupted run's", what, r);
        free(x);
        free(y);
    }
}

/* Uninterrupted to 4 steps, and saved at 2 then resumed to 4 (with `resume` options). */
static void resume_case(const char *args, const char *resume, int world, const char *what)
{
    char full[1200], save[1200], res[1200];
    snprintf(full, sizeof full, "%s", hx_test_dir("full"));
    snprintf(save, sizeof save, "%s", hx_test_dir("save"));
    snprintf(res, sizeof res, "%s", hx_test_dir("resumed"));
    run_ok("%s %s --steps 4 --dump %s", args, resume, full);
    run_ok("%s --steps 2 --save %s", args, save);
    run_ok("%s %s --steps 4 --resume %s --dump %s", args, resume, save, res);
    same_dumps(full, res, world, what);
}

static void same_layout_bits(void **state)
{
    (void)state;
    resume_case("--optimizer adamw --lr 0.01 --weight-decay 0.01", "", 8, "adamw bf16");
    resume_case("--optimizer adamw --lr 0.01 --dtype f32 --micro-batches 2", "", 8, "adamw f32");
    resume_case("--dtype f16 --loss-scale dynamic --inject-overflow 1 --optimizer adamw --lr 0.01",
                "", 8, "loss scale");
    resume_case("--optimizer adamw --lr 0.01 --zero 1 --global-batch 512", "", 8, "zero 1");
    resume_case("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --optimizer adamw --lr 0.01 "
                "--tokens 16",
                "", 8, "megatron grid");
}

static void zero1_to_zero0(void **state)
{
    (void)state;
    char full[1200], save[1200], res[1200];
    const char *args = "--optimizer adamw --lr 0.01 --global-batch 512";
    snprintf(full, sizeof full, "%s", hx_test_dir("zero0"));
    snprintf(save, sizeof save, "%s", hx_test_dir("save1"));
    snprintf(res, sizeof res, "%s", hx_test_dir("resumed0"));
    /* --zero 1 equals --zero 0 --fp32-master bit for bit, so the resumed run must too */
    run_ok("%s --fp32-master --steps 4 --dump %s", args, full);
    run_ok("%s --zero 1 --steps 2 --save %s", args, save);
    run_ok("%s --fp32-master --steps 4 --resume %s --dump %s", args, save, res);
    same_dumps(full, res, 8, "zero 1 -> zero 0");
    /* world 8 under --zero 1 to world 4 under --zero 0: the same logical run within rounding */
    snprintf(res, sizeof res, "%s", hx_test_dir("world4"));
    run_ok("%s --fp32-master --world 4 --ep 2 --dtype f32 --steps 4 --dump %s", args, full);
    run_ok("%s --zero 1 --dtype f32 --steps 2 --save %s", args, save);
    run_ok("%s --fp32-master --world 4 --ep 2 --dtype f32 --steps 4 --resume %s --dump %s", args,
           save, res);
    char path[1300];
    snprintf(path, sizeof path, "%s/rank0.safetensors", full);
    hx_st_file *a = NULL, *b = NULL;
    assert_int_equal(hx_st_read(path, &a), SELDP_OK);
    snprintf(path, sizeof path, "%s/rank0.safetensors", res);
    assert_int_equal(hx_st_read(path, &b), SELDP_OK);
    const char *names[] = {"param_next/embed.weight", "param_next/layers.0.router.weight",
                           "param_next/final_norm.weight"};
    for (size_t k = 0; k < 3; k++) {
        const hx_st_tensor *x = hx_st_find(a, names[k]), *y = hx_st_find(b, names[k]);
        assert_non_null(x);
        assert_non_null(y);
        const float *p = x->data, *q = y->data;
        double num = 0, den = 0;
        for (size_t j = 0; j < x->nbytes / 4; j++) {
            num += ((double)p[j] - q[j]) * ((double)p[j] - q[j]);
            den += (double)p[j] * p[j];
        }
        if (!(sqrt(num / den) < 1e-5))
            fail_msg("%s: the resumed world-4 run is %g off the world-4 run", names[k],
                     sqrt(num / den));
    }
    hx_st_file_free(a);
    hx_st_file_free(b);
}

static void optimizer_change_refused(void **state)
{
    (void)state;
    char save[1200];
    snprintf(save, sizeof save, "%s", hx_test_dir("adamw"));
    run_ok("--optimizer adamw --lr 0.01 --steps 1 --save %s", save);
    hx_test_run run;
    hx_test_harness(&run, "--out none --steps 2 --resume %s", save);
    assert_int_equal(run.status, HX_EXIT_USAGE);
    if (!strstr(run.err, "saved with --optimizer adamw"))
        fail_msg("stderr: %s", run.err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_layout_bits),
        cmocka_unit_test(zero1_to_zero0),
        cmocka_unit_test(optimizer_change_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
