/* Runs beyond the matrix: layout files with a redundant hot expert and uneven groups, uneven
 * token counts down to ranks without tokens, experts that no token reaches, and planted
 * defects (--inject) that the checks must catch. */
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

static hx_json *pass(const char *dir, const char *fmt, ...)
{
    char args[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    hx_test_run run;
    hx_test_harness(&run, "%s --quiet --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    return hx_test_report(dir);
}

static hx_json *read_json(const char *dir, const char *file)
{
    char path[1300], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    hx_json *v = NULL;
    if (hx_json_parse(text, len, path, &v) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    free(text);
    return v;
}

static void test_layout_files(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("files");
    const char *variants[] = {"--dtype bf16", "--dtype f32 --expert-reduce mean --policy zero",
                              "--dtype f16 --quant nf4 --fp32-master",
                              "--dtype bf16 --quant awq --expert-reduce mean",
                              "--dtype f32 --tokens 1 --token-spread 1 --seed 3"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        hx_json *report =
            pass(dir, "--layout-file %s %s", hx_test_layout("hot-expert.json"), variants[v]);
        /* the hot expert's expert-data group spans all four ranks, rooted at rank 0 */
        const hx_json *groups = hx_json_get(report, "groups");
        bool hot = false;
        for (size_t g = 0; g < groups->count; g++) {
            const hx_json *ranks = hx_json_get(&groups->items[g], "ranks");
            const hx_json *experts = hx_json_get(&groups->items[g], "experts");
            if (ranks->count == 4 && experts->count == 1 && experts->items[0].integer == 0)
                hot = hx_test_int(&groups->items[g], "tensors") > 0;
        }
        assert_true(hot);
        assert_int_equal(hx_test_int(hx_json_get(report, "layout"), "shared_root"), 1);
        hx_json_free(report);
        hx_json_free(pass(dir, "--layout-file %s %s", hx_test_layout("uneven.json"), variants[v]));
    }
}

static void test_uneven_tokens(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("uneven");
    char dump[1200];
    snprintf(dump, sizeof dump, "%s/dump", dir);
    const char *flows[] = {
        "--expert-reduce sum --policy error", "--expert-reduce mean --policy zero",
        "--expert-reduce mean --policy error", "--expert-reduce sum --policy zero"};
    for (int f = 0; f < 4; f++) {
        /* seed 14 gives ranks 1 and 3 no tokens in step 1 */
        hx_json_free(pass(dir,
                          "--world 8 --ep 4 --tokens 4 --token-spread 4 --seed 14 --steps 1 "
                          "--dump %s %s",
                          dump, flows[f]));
        hx_json *manifest = read_json(dump, "manifest.json");
        const hx_json *counts = hx_json_get(manifest, "token_counts");
        assert_int_equal(counts->count, 8);
        int zeros = 0;
        int64_t lo = 1 << 30, hi = 0;
        for (size_t r = 0; r < counts->count; r++) {
            zeros += counts->items[r].integer == 0;
            lo = counts->items[r].integer < lo ? counts->items[r].integer : lo;
            hi = counts->items[r].integer > hi ? counts->items[r].integer : hi;
        }
        assert_int_equal(zeros, 2);
        assert_true(hi > lo + 3);
        hx_json_free(manifest);
    }
    /* the default run draws different counts on every rank too */
    hx_json_free(pass(dir, "--steps 1 --dump %s", dump));
    hx_json *manifest = read_json(dump, "manifest.json");
    const hx_json *counts = hx_json_get(manifest, "token_counts");
    assert_int_not_equal(counts->items[0].integer, counts->items[1].integer);
    hx_json_free(manifest);
}

/* With V = 3 and K = 1 each layer routes at most three distinct token ids: at least five of
 * the eight experts of every layer receive no token anywhere. */
static void test_unreached_experts(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("absent");
    char dump[1200];
    snprintf(dump, sizeof dump, "%s/dump", dir);
    const char *variants[] = {"--policy error", "--policy zero --expert-reduce mean",
                              "--policy zero --quant nf4",
                              "--policy error --quant awq --fp32-master"};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        hx_json *report =
            pass(dir, "--vocab 3 --top-k 1 --steps 1 --dump %s %s", dump, variants[v]);
        int64_t tested, failed;
        hx_test_check(report, "experts no token reached stay absent", &tested, &failed);
        assert_true(tested > 0);
        assert_int_equal(failed, 0);
        const hx_json *load = hx_json_get(report, "expert_tokens");
        int unreached = 0, reached = 0;
        for (int r = 0; r < 8; r++) {
            char path[1300];
            snprintf(path, sizeof path, "%s/rank%d.safetensors", dump, r);
            hx_st_file *f = NULL;
            if (hx_st_read(path, &f) != SELDP_OK)
                fail_msg("%s", hx_last_error());
            for (size_t l = 0; l < load->count; l++) {
                for (size_t e = 0; e < load->items[l].count; e++) {
                    char param[128], grad[128];
                    const char *w = strstr(variants[v], "quant") ? "w1.lora_a.weight" : "w1.weight";
                    snprintf(param, sizeof param, "param/layers.%zu.experts.%zu.%s", l, e, w);
                    snprintf(grad, sizeof grad, "grad/layers.%zu.experts.%zu.%s", l, e, w);
                    if (!hx_st_find(f, param))
                        continue; /* not an owner */
                    bool none = load->items[l].items[e].integer == 0;
                    if (none && hx_st_find(f, grad))
                        fail_msg("rank %d holds %s of an expert no token reached (%s)", r, grad,
                                 variants[v]);
                    if (!none && !hx_st_find(f, grad))
                        fail_msg("rank %d lacks %s (%s)", r, grad, variants[v]);
                    unreached += none;
                    reached += !none;
                }
            }
            hx_st_file_free(f);
        }
        assert_true(unreached >= 5 * 2);
        assert_true(reached > 0);
        hx_json_free(report);
    }
}

/* A planted defect must turn the run into a failure, reported by the right check. */
static void expect_caught(const char *args, const char *check)
{
    const char *dir = hx_test_dir("inject");
    hx_test_run run;
    hx_test_harness(&run, "%s --quiet --out %s", args, dir);
    if (run.status != HX_EXIT_FAIL)
        fail_msg("%s: exit %d, expected %d\n%s", args, run.status, HX_EXIT_FAIL, run.out);
    assert_non_null(strstr(run.out, "result: FAIL"));
    hx_json *report = hx_test_report(dir);
    int64_t tested, failed;
    hx_test_check(report, check, &tested, &failed);
    if (failed == 0)
        fail_msg("%s: check \"%s\" did not fail", args, check);
    assert_false(hx_json_get(report, "passed")->boolean);
    hx_json_free(report);
}

static void test_planted_defects(void **state)
{
    (void)state;
    expect_caught("--inject grad --steps 1", "reduced gradients vs the FP64 reference");
    expect_caught("--inject grad --steps 1", "reduced gradients bit-identical in each group");
    expect_caught("--inject replica --steps 1", "replicas equal their root after initialize");
    expect_caught("--inject replica --steps 1", "parameters bit-identical in each group");
    expect_caught("--inject absent --steps 1 --vocab 3 --top-k 1",
                  "experts no token reached stay absent");
    expect_caught("--inject grad --steps 1 --world 1 --ep 1 --dtype f32",
                  "reduced gradients vs the FP64 reference");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_files),
        cmocka_unit_test(test_uneven_tokens),
        cmocka_unit_test(test_unreached_experts),
        cmocka_unit_test(test_planted_defects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
