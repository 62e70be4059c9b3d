/* --micro-batches: gradient accumulation (docs/harness.md, The training step). Every rank runs M
 * micro-batches, accumulates and reduces once; the reference's objective is the mean token loss
 * over every micro-batch's tokens plus each micro-batch's router losses weighted 1/M.
 *   - accumulation equals one big batch where the objective does not depend on the cut (no
 *     router losses, no capacity): the reduced gradients of M = 4 and M = 1 on the same global
 *     batch agree to FP32 rounding, and both runs pass;
 *   - with router losses and capacity the objective is per micro-batch: the gradients differ
 *     from one batch's by far more than rounding, and the run passes against the reference that
 *     computes exactly that (so the reference follows the cut);
 *   - the layouts (expert parallel, both flows, a Megatron grid with tp, pp and ep, cp) pass;
 *   - the manifest records the cut: micro_batches and every rank's micro_batch_sizes;
 *   - bad input: one line, exit 2. */
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

#define COMMON "--quiet --out none --timeout 60"

static void run_dump(const char *args, const char *dir)
{
    hx_test_run run;
    hx_test_harness(&run, "%s %s --dump %s", COMMON, args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
}

static void passes(const char *args)
{
    hx_test_run run;
    hx_test_harness(&run, "%s %s", COMMON, args);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
}

static hx_st_file *read_rank(const char *dir, int r)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/rank%d.safetensors", dir, r);
    hx_st_file *f = NULL;
    if (hx_st_read(path, &f) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return f;
}

/* ||a - b|| / ||b|| over every F32 gradient of rank r's two dumps. */
static double grad_difference(const char *da, const char *db, int r)
{
    hx_st_file *a = read_rank(da, r), *b = read_rank(db, r);
    double num = 0, den = 0;
    int grads = 0;
    for (size_t i = 0; i < hx_st_count(a); i++) {
        const hx_st_tensor *x = hx_st_at(a, i);
        if (strncmp(x->name, "grad/", 5) != 0)
            continue;
        const hx_st_tensor *y = hx_st_find(b, x->name);
        if (!y)
            fail_msg("rank %d: %s in one dump only", r, x->name);
        assert_int_equal(x->dtype, SELDP_F32);
        assert_int_equal(x->nbytes, y->nbytes);
        const float *p = x->data, *q = y->data;
        for (size_t j = 0; j < x->nbytes / sizeof(float); j++) {
            num += ((double)p[j] - q[j]) * ((double)p[j] - q[j]);
            den += (double)q[j] * q[j];
        }
        grads++;
    }
    assert_true(grads > 0);
    hx_st_file_free(a);
    hx_st_file_free(b);
    return sqrt(num / den);
}

static void accumulation_equals_one_batch(void **state)
{
    (void)state;
    char one[1200], four[1200];
    const char *base = "--world 8 --ep 4 --dtype f32 --global-batch 512 --steps 1";
    char args[512];
    snprintf(one, sizeof one, "%s", hx_test_dir("one"));
    run_dump(base, one);
    snprintf(four, sizeof four, "%s", hx_test_dir("four"));
    snprintf(args, sizeof args, "%s --micro-batches 4", base);
    run_dump(args, four);
    for (int r = 0; r < 8; r++) {
        double d = grad_difference(four, one, r);
        if (!(d < 1e-5))
            fail_msg("rank %d: accumulated gradients differ from one batch's by %g", r, d);
    }
}

static void router_losses_per_micro_batch(void **state)
{
    (void)state;
    char one[1200], four[1200];
    const char *base = "--world 8 --ep 4 --dtype f32 --global-batch 512 --steps 1 "
                       "--aux-loss-coeff 0.05 --z-loss-coeff 0.01 --capacity-factor 1.0";
    char args[512];
    snprintf(one, sizeof one, "%s", hx_test_dir("one"));
    run_dump(base, one);
    snprintf(four, sizeof four, "%s", hx_test_dir("four"));
    snprintf(args, sizeof args, "%s --micro-batches 4", base);
    run_dump(args, four); /* passes against the per-micro-batch reference */
    double worst = 0;
    for (int r = 0; r < 8; r++)
        worst = fmax(worst, grad_difference(four, one, r));
    if (!(worst > 1e-3))
        fail_msg("the router losses of 4 micro-batches moved the gradients by %g only", worst);
}

static void layouts_pass(void **state)
{
    (void)state;
    passes("--world 8 --ep 4 --micro-batches 4 --steps 3 --tokens 32");
    passes("--world 8 --ep 4 --micro-batches 4 --steps 3 --tokens 32 --dtype f32 "
           "--expert-reduce mean --aux-loss-coeff 0.01 --aux-loss-scope local");
    passes("--world 8 --ep 4 --micro-batches 2 --steps 2 --tokens 32 --shared-expert-ff 32 "
           "--aux-loss-coeff 0.01 --z-loss-coeff 0.001 --capacity-factor 1.25");
    passes("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --micro-batches 4 --steps 2 "
           "--tokens 16 --dtype f32 --aux-loss-coeff 0.01");
    passes("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --micro-batches 4 --steps 2 "
           "--global-batch 256 --aux-loss-coeff 0.01");
    passes("--framework megatron --world 8 --cp 2 --ep 2 --micro-batches 2 --steps 2 --tokens 16 "
           "--aux-loss-coeff 0.01 --aux-loss-scope local --capacity-factor 1.0");
}

static void manifest_records_the_cut(void **state)
{
    (void)state;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("manifest"));
    run_dump("--world 4 --ep 2 --micro-batches 4 --global-batch 200 --steps 1", dir);
    char path[1300];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    hx_json *m = NULL;
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    if (hx_json_parse(text, len, path, &m) != SELDP_OK)
        fail_msg("%s: %s", path, hx_last_error());
    assert_int_equal(hx_test_int(m, "micro_batches"), 4);
    const hx_json *sizes = hx_json_get(m, "micro_batch_sizes");
    assert_non_null(sizes);
    assert_int_equal(sizes->count, 4);
    for (size_t r = 0; r < 4; r++) {
        const hx_json *row = &sizes->items[r];
        assert_int_equal(row->count, 4);
        for (size_t k = 0; k < 4; k++) /* 200 / 4 micro-batches / 4 ranks */
            assert_int_equal(row->items[k].integer, 50 / 4 + (r < 50 % 4 ? 1 : 0));
    }
    hx_json_free(m);
    free(text);
}

static void usage_error(const char *args, const char *needle)
{
    hx_test_usage_error(needle, "%s %s", COMMON, args);
}

static void bad_input(void **state)
{
    (void)state;
    usage_error("--micro-batches 3 --global-batch 100", "must divide --global-batch 100");
    usage_error("--micro-batches 2 --overlap --world 4 --pp 2 --ep 2",
                "with --overlap: needs one pipeline stage");
    usage_error("--micro-batches 0", "--micro-batches '0': expected an integer in 1..4096");
    usage_error("--micro-batches x", "expected an integer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accumulation_equals_one_batch),
        cmocka_unit_test(router_losses_per_micro_batch),
        cmocka_unit_test(layouts_pass),
        cmocka_unit_test(manifest_records_the_cut),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
