/* --optimizer sgd|adamw and the post-step check (docs/harness.md, Optimizers): every rank's
 * update against the FP64 step of the state it started from and the gradient it used.
 *   - AdamW passes every check, the post-step check included (it tested something), on an
 *     expert-parallel layout in bf16, f16 (FP32 masters) and f32, with weight decay and clipping,
 *     with micro-batches, and on a Megatron grid (tp, pp, ep);
 *   - SGD's updates are checked too;
 *   - the dump holds what recomputes the step: from param/ (or opt/.../master), grad/,
 *     opt/.../exp_avg and exp_avg_sq before the step and the `optimizer` metadata (its
 *     hyperparameters and each parameter's step count), an independent FP64 AdamW reproduces
 *     param_next/ within its storage rounding;
 *   - bad hyperparameters: one line, exit 2. */
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
#include "checks.h"
#include "safetensors.h"
#include "run.h"

#define COMMON "--timeout 60"

/* Run with a report; the post-step check must have tested something and found nothing. */
static void passes_with_update_check(const char *args)
{
    hx_test_run run;
    const char *dir = hx_test_dir("report");
    hx_test_harness(&run, "%s %s --quiet --out %s", COMMON, args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, "updates equal the FP64 optimizer step", &tested, &failed);
    if (tested == 0 || failed != 0)
        fail_msg("%s: the post-step check tested %lld, failed %lld", args, (long long)tested,
                 (long long)failed);
    hx_json_free(report);
}

static void adamw_passes(void **state)
{
    (void)state;
    passes_with_update_check("--world 8 --ep 4 --optimizer adamw --lr 0.01 --steps 4");
    passes_with_update_check("--world 8 --ep 4 --optimizer adamw --lr 0.003 --dtype f32 "
                             "--weight-decay 0.1 --steps 4");
    passes_with_update_check("--world 8 --ep 4 --optimizer adamw --lr 0.01 --dtype f16 "
                             "--clip-grad 0.5 --steps 4");
    passes_with_update_check("--world 8 --ep 4 --optimizer adamw --lr 0.01 --micro-batches 4 "
                             "--expert-reduce mean --steps 3");
    passes_with_update_check("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --optimizer "
                             "adamw --lr 0.01 --micro-batches 4 --tokens 16 --steps 3");
    passes_with_update_check("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --optimizer "
                             "adamw --lr 0.01 --dtype f32 --tokens 16 --steps 3");
}

static void sgd_updates_checked(void **state)
{
    (void)state;
    passes_with_update_check("--world 8 --ep 4 --steps 3");
    passes_with_update_check("--world 8 --ep 4 --steps 3 --fp32-master --dtype f16");
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

static double element(const hx_st_tensor *t, size_t i)
{
    float x = 0;
    seldp_tensor one = {0};
    one.dtype = t->dtype;
    one.ndim = 1;
    one.shape[0] = 1;
    one.device = SELDP_HOST_DEVICE;
    one.data = (char *)t->data + i * seldp_dtype_size(t->dtype);
    hx_tensor_to_f32(&one, &x);
    return x;
}

static double number(const hx_json *o, const char *key)
{
    const hx_json *v = hx_json_get(o, key);
    if (!v || v->type != HX_JSON_NUMBER)
        fail_msg("optimizer metadata: no number %s", key);
    return v->number;
}

/* An AdamW step recomputed from the dump alone, in FP64, against param_next/. */
static void recompute_from_dump(const char *args, double rel)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("dump"));
    hx_test_run run;
    hx_test_harness(&run, "%s %s --quiet --out none --dump %s", COMMON, args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_st_file *f = read_rank(dir, 0);
    const char *meta = hx_st_metadata(f, "optimizer");
    assert_non_null(meta);
    hx_json *o = NULL;
    assert_int_equal(hx_json_parse(meta, strlen(meta), "optimizer", &o), SELDP_OK);
    const double lr = number(o, "lr"), b1 = number(o, "beta1"), b2 = number(o, "beta2");
    const double eps = number(o, "eps"), wd = number(o, "weight_decay");
    const hx_json *steps = hx_json_get(o, "steps");
    assert_non_null(steps);
    int compared = 0;
    for (size_t i = 0; i < hx_st_count(f); i++) {
        const hx_st_tensor *g = hx_st_at(f, i);
        if (strncmp(g->name, "grad/", 5) != 0)
            continue;
        const char *path = g->name + 5;
        char name[400];
        snprintf(name, sizeof name, "opt/%s/exp_avg", path);
        const hx_st_tensor *m = hx_st_find(f, name);
        snprintf(name, sizeof name, "opt/%s/exp_avg_sq", path);
        const hx_st_tensor *v = hx_st_find(f, name);
        snprintf(name, sizeof name, "opt/%s/master", path);
        const hx_st_tensor *w = hx_st_find(f, name);
        snprintf(name, sizeof name, "param/%s", path);
        if (!w)
            w = hx_st_find(f, name);
        snprintf(name, sizeof name, "param_next/%s", path);
        const hx_st_tensor *next = hx_st_find(f, name);
        const hx_json *t0 = hx_json_get(steps, path);
        if (!m || !v || !w || !next || !t0)
            fail_msg("%s: the dump lacks what recomputes its update", path);
        double t = (double)t0->integer + 1;
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        size_t n = next->nbytes / seldp_dtype_size(next->dtype);
        for (size_t j = 0; j < n; j++) {
            double gj = element(g, j);
            double mj = b1 * element(m, j) + (1 - b1) * gj;
            double vj = b2 * element(v, j) + (1 - b2) * gj * gj;
            double want = element(w, j) * (1 - lr * wd) - lr / bc1 * mj / (sqrt(vj / bc2) + eps);
            double got = element(next, j);
            if (!(fabs(got - want) <= rel * fabs(want) + 1e-6 * lr))
                fail_msg("%s[%zu]: param_next %.9g, the step recomputed from the dump %.9g", path,
                         j, got, want);
        }
        compared++;
    }
    assert_true(compared > 5);
    hx_json_free(o);
    hx_st_file_free(f);
}

static void dump_recomputes_the_step(void **state)
{
    (void)state;
    recompute_from_dump(
        "--world 4 --ep 2 --optimizer adamw --lr 0.01 --weight-decay 0.05 --steps 3 "
        "--dtype f32",
        1e-5);
    /* bf16 parameters: FP32 masters in the dump, param_next their rounding */
    recompute_from_dump("--world 4 --ep 2 --optimizer adamw --lr 0.01 --steps 3", 0x1p-8 + 1e-5);
}

static void usage_error(const char *args, const char *needle)
{
    hx_test_usage_error(needle, "%s --out none %s", COMMON, args);
}

static void bad_input(void **state)
{
    (void)state;
    usage_error("--optimizer adam", "--optimizer 'adam': expected sgd or adamw");
    usage_error("--optimizer adamw --adam-beta1 1", "expected a number in [0, 1)");
    usage_error("--optimizer adamw --adam-beta2 -0.1", "expected a number in [0, 1)");
    usage_error("--optimizer adamw --adam-eps 0", "expected a number in (0, 1]");
    usage_error("--optimizer adamw --weight-decay 1.5", "expected a number in [0, 1]");
    usage_error("--adam-beta1 0.8", "need --optimizer adamw");
    usage_error("--optimizer adamw --weight-decay 1 --lr 1", "must be below 1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(adamw_passes),
        cmocka_unit_test(sgd_updates_checked),
        cmocka_unit_test(dump_recomputes_the_step),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
