/* The two expert flows (docs/harness.md, The step) agree: `sum` of gradients normalized by the
 * global token count, and `reduce` weighted by the expert-parallel group's tokens. Both runs use
 * the same seed, so their dumps hold the same step; every reduced gradient of every rank must match
 * within the tolerance of its dtype (shared gradients, reduced the same way, bit for bit),
 * and the global weights must be what each flow promises. */
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

static double *as_f64(const hx_st_tensor *t, size_t *n)
{
    size_t count = t->nbytes / seldp_dtype_size(t->dtype);
    double *v = calloc(count ? count : 1, sizeof *v);
    float *f = calloc(count ? count : 1, sizeof *f);
    assert_non_null(v);
    assert_non_null(f);
    if (t->dtype == SELDP_F32)
        memcpy(f, t->data, count * sizeof *f);
    else if (t->dtype == SELDP_F16 || t->dtype == SELDP_BF16)
        seldp_half_to_f32(t->dtype, t->data, f, count);
    else
        fail_msg("%s: unexpected dtype %s", t->name, seldp_dtype_name(t->dtype));
    for (size_t i = 0; i < count; i++)
        v[i] = f[i];
    free(f);
    *n = count;
    return v;
}

static double tolerance(seldp_dtype d)
{
    return d == SELDP_BF16 ? 1e-2 : d == SELDP_F16 ? 2e-3 : 1e-5;
}

static hx_json *read_manifest(const char *dir)
{
    char path[1200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    hx_json *m = NULL;
    if (hx_json_parse(text, len, path, &m) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    free(text);
    return m;
}

static void compare_flows(const char *args)
{
    char sum_dir[1200], mean_dir[1200];
    snprintf(sum_dir, sizeof sum_dir, "%s", hx_test_dir("sum"));
    snprintf(mean_dir, sizeof mean_dir, "%s", hx_test_dir("mean"));
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 1 --quiet --out none --expert-reduce sum --dump %s", args,
                    sum_dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("sum flow: %s\n%s%s", args, run.err, run.out);
    hx_test_harness(&run, "%s --steps 1 --quiet --out none --expert-reduce mean --dump %s", args,
                    mean_dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("mean flow: %s\n%s%s", args, run.err, run.out);

    hx_json *ms = read_manifest(sum_dir), *mm = read_manifest(mean_dir);
    int world = (int)hx_test_int(ms, "world");
    int64_t tokens = hx_test_int(ms, "global_tokens");
    assert_int_equal(tokens, hx_test_int(mm, "global_tokens"));
    /* shared: reduce weighted by tokens in both; experts: mean's global weight is the global
     * token count, sum's the number of active owners (at most the group's size) */
    const hx_json *gs = hx_json_get(hx_json_get(ms, "global_weights"), "expert_data_groups");
    const hx_json *gm = hx_json_get(hx_json_get(mm, "global_weights"), "expert_data_groups");
    assert_non_null(gs);
    assert_non_null(gm);
    assert_int_equal(
        hx_test_int(hx_json_get(hx_json_get(ms, "global_weights"), "shared"), "global_weight"),
        tokens);
    for (size_t d = 0; d < gm->count; d++) {
        assert_int_equal(hx_test_int(&gm->items[d], "global_weight"), tokens);
        int64_t active = hx_test_int(&gs->items[d], "global_weight");
        const hx_json *ranks = hx_json_get(&gs->items[d], "ranks");
        assert_true(active >= 1 && active <= (int64_t)ranks->count);
    }
    hx_json_free(ms);
    hx_json_free(mm);

    size_t compared = 0, experts = 0;
    for (int r = 0; r < world; r++) {
        char a_path[1300], b_path[1300];
        snprintf(a_path, sizeof a_path, "%s/rank%d.safetensors", sum_dir, r);
        snprintf(b_path, sizeof b_path, "%s/rank%d.safetensors", mean_dir, r);
        hx_st_file *a = NULL, *b = NULL;
        if (hx_st_read(a_path, &a) != SELDP_OK || hx_st_read(b_path, &b) != SELDP_OK)
            fail_msg("%s", hx_last_error());
        for (size_t i = 0; i < hx_st_count(a); i++) {
            const hx_st_tensor *x = hx_st_at(a, i);
            if (strncmp(x->name, "grad/", 5) != 0)
                continue;
            const hx_st_tensor *y = hx_st_find(b, x->name);
            if (!y)
                fail_msg("rank %d: %s reduced by sum, absent after mean (%s)", r, x->name, args);
            assert_int_equal(x->dtype, y->dtype);
            assert_int_equal(x->nbytes, y->nbytes);
            bool expert = strstr(x->name, ".experts.") != NULL;
            if (!expert) {
                if (memcmp(x->data, y->data, x->nbytes) != 0)
                    fail_msg("rank %d: shared %s differs between the runs (%s)", r, x->name, args);
            } else {
                size_t n = 0, m = 0;
                double *u = as_f64(x, &n), *v = as_f64(y, &m);
                double diff = 0, norm = 0;
                for (size_t k = 0; k < n; k++) {
                    diff += (u[k] - v[k]) * (u[k] - v[k]);
                    norm += v[k] * v[k];
                }
                double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
                if (!(rel <= tolerance(x->dtype)))
                    fail_msg("rank %d: %s: sum and mean flows differ by %.3e > %.0e (%s)", r,
                             x->name, rel, tolerance(x->dtype), args);
                free(u);
                free(v);
                experts++;
            }
            compared++;
        }
        /* and nothing only the mean flow has */
        for (size_t i = 0; i < hx_st_count(b); i++)
            if (strncmp(hx_st_at(b, i)->name, "grad/", 5) == 0)
                assert_non_null(hx_st_find(a, hx_st_at(b, i)->name));
        hx_st_file_free(a);
        hx_st_file_free(b);
    }
    assert_true(compared > 0);
    assert_true(experts > 0);
}

static void test_dense(void **state)
{
    (void)state;
    compare_flows("--world 8 --ep 4 --dtype bf16");
    compare_flows("--world 4 --ep 2 --order dp-ep --dtype f32");
    compare_flows("--world 8 --ep 2 --dtype f16 --policy zero");
    compare_flows("--world 2 --ep 1 --dtype f32 --fp32-master");
}

static void test_quantized(void **state)
{
    (void)state;
    compare_flows("--world 4 --ep 2 --dtype bf16 --quant nf4");
    compare_flows("--world 8 --ep 4 --dtype f16 --quant awq --fp32-master");
}

static void test_redundant_and_uneven(void **state)
{
    (void)state;
    char args[1200];
    /* a hot expert with two replicas per EP group: its owners split each group's tokens */
    snprintf(args, sizeof args, "--layout-file %s --dtype f32", hx_test_layout("hot-expert.json"));
    compare_flows(args);
    snprintf(args, sizeof args, "--layout-file %s --dtype bf16 --policy zero",
             hx_test_layout("uneven.json"));
    compare_flows(args);
    /* very uneven token counts, some ranks without any */
    compare_flows("--world 8 --ep 4 --dtype f32 --tokens 6 --token-spread 6");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_quantized),
        cmocka_unit_test(test_redundant_and_uneven),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
