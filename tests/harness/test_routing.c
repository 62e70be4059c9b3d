/* seldp-harness with tiny-moe's routing extensions (docs/model.md: the shared expert; Routing
 * extensions: router losses and capacity): runs on several layouts (ep-dp, dp-ep, a layout file;
 * worlds 4 and 8; both expert flows; both load-balancing scopes) pass every check against the FP64
 * reference, the shared expert's gradients are checked as a class of their own, the capacity drops
 * assignments, the report's config carries the new keys, and bad values are refused with a
 * one-line error and exit status 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "router.h"
#include "run.h"

#define ROUTING "--shared-expert-ff 16 --aux-loss-coeff 0.02 --z-loss-coeff 0.001"

/* Tokens every expert processed over the run (report.json's expert_tokens, summed). */
static int64_t processed(const hx_json *report)
{
    const hx_json *layers = hx_json_get(report, "expert_tokens");
    assert_non_null(layers);
    int64_t sum = 0;
    for (size_t l = 0; l < layers->count; l++)
        for (size_t e = 0; e < layers->items[l].count; e++)
            sum += layers->items[l].items[e].integer;
    return sum;
}

static const hx_json *class_entry(const hx_json *report, const char *name)
{
    const hx_json *classes = hx_json_get(report, "tensor_classes");
    assert_non_null(classes);
    for (size_t i = 0; i < classes->count; i++) {
        const hx_json *c = hx_json_get(&classes->items[i], "class");
        if (c && strcmp(c->string, name) == 0)
            return &classes->items[i];
    }
    return NULL;
}

/* Run and expect a pass with the gradients checked; returns the parsed report. */
static hx_json *expect_pass(const char *args)
{
    const char *dir = hx_test_dir("routing");
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 2 --tokens 48 --quiet --backend host --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_test_check(report, "loss equals the FP64 reference", &tested, &failed);
    assert_int_equal(tested, 2);
    assert_int_equal(failed, 0);
    hx_test_check(report, "tokens per expert equal the reference's", &tested, &failed);
    assert_int_equal(failed, 0);
    return report;
}

static void test_layouts(void **state)
{
    (void)state;
    static const char *const layouts[] = {
        "--world 4 --ep 2 --order ep-dp --dtype f32 --expert-reduce sum",
        "--world 4 --ep 4 --order dp-ep --dtype f32 --expert-reduce mean",
        "--world 8 --ep 4 --order ep-dp --dtype f32 --expert-reduce mean",
        "--world 8 --ep 2 --order dp-ep --dtype f32 --expert-reduce sum",
        "--world 8 --ep 8 --order ep-dp --dtype bf16 --expert-reduce sum",
        "--world 8 --ep 4 --order dp-ep --dtype f32 --quant nf4 --expert-reduce mean",
    };
    static const char *const extras[] = {
        "--aux-loss-scope global --capacity-factor 0.75",
        "--aux-loss-scope local --capacity-factor 1.0",
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        for (size_t j = 0; j < sizeof extras / sizeof extras[0]; j++) {
            char args[512];
            snprintf(args, sizeof args, "%s %s %s", layouts[i], ROUTING, extras[j]);
            printf("  %s\n", args);
            hx_json *report = expect_pass(args);
            const hx_json *shared = class_entry(report, "shared_expert");
            assert_non_null(shared);
            assert_true(hx_test_int(shared, "tensors") > 0);
            hx_json_free(report);
        }
    }
}

/* Uneven and redundant expert ownership from layout files. */
static void test_layout_files(void **state)
{
    (void)state;
    static const char *const files[] = {"hot-expert.json", "uneven.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        for (int flow = 0; flow < 2; flow++) {
            char args[1024];
            snprintf(args, sizeof args,
                     "--layout-file %s --dtype f32 --expert-reduce %s " ROUTING
                     " --capacity-factor 0.8",
                     hx_test_layout(files[i]), flow ? "mean" : "sum");
            printf("  %s\n", args);
            hx_json_free(expect_pass(args));
        }
    }
}

/* The capacity drops assignments: fewer rows reach the experts than without it, with the
 * same seed (same tokens, same initial weights). */
static void test_capacity_drops(void **state)
{
    (void)state;
    const char *base = "--world 4 --ep 2 --dtype f32";
    char args[256];
    hx_json *report = expect_pass(base);
    int64_t all = processed(report);
    hx_json_free(report);
    snprintf(args, sizeof args, "%s --capacity-factor 0.5", base);
    report = expect_pass(args);
    int64_t kept = processed(report);
    const hx_json *config = hx_json_get(report, "config");
    assert_non_null(config);
    const hx_json *cf = hx_json_get(config, "capacity_factor");
    assert_non_null(cf);
    assert_true(cf->number == 0.5);
    hx_json_free(report);
    printf("  assignments processed: %lld without capacity, %lld with factor 0.5\n", (long long)all,
           (long long)kept);
    assert_true(kept > 0);
    assert_true(kept < all);
}

/* The report's config holds every routing key (docs/harness.md, Framework presets). */
static void test_report_config(void **state)
{
    (void)state;
    hx_json *report = expect_pass("--world 4 --ep 2 --dtype f32 --shared-expert-ff 24 "
                                  "--aux-loss-coeff 0.01 --aux-loss-scope local "
                                  "--z-loss-coeff 0.002 --capacity-factor 1.5");
    const hx_json *config = hx_json_get(report, "config");
    assert_non_null(config);
    assert_int_equal(hx_test_int(config, "d_ff_shared"), 24);
    assert_true(hx_json_get(config, "aux_loss_coeff")->number == 0.01);
    assert_string_equal(hx_json_get(config, "aux_loss_scope")->string, "local");
    assert_true(hx_json_get(config, "z_loss_coeff")->number == 0.002);
    assert_true(hx_json_get(config, "capacity_factor")->number == 1.5);
    hx_json_free(report);
}

static void expect_usage(const char *args, const char *message)
{
    hx_test_run run;
    hx_test_harness(&run, "%s --out none", args);
    if (run.status != HX_EXIT_USAGE || !strstr(run.err, message))
        fail_msg("seldp-harness %s: exit %d, wanted 2 and '%s'\n%s", args, run.status, message,
                 run.err);
    /* one line */
    const char *nl = strchr(run.err, '\n');
    assert_true(nl && nl[1] == '\0');
}

static void test_bad_values(void **state)
{
    (void)state;
    expect_usage("--capacity-factor -1", "--capacity-factor '-1': expected a number >= 0");
    expect_usage("--aux-loss-coeff nan", "--aux-loss-coeff 'nan': expected a number >= 0");
    expect_usage("--z-loss-coeff x", "--z-loss-coeff 'x': expected a number >= 0");
    expect_usage("--aux-loss-scope both", "--aux-loss-scope 'both': expected global or local");
    expect_usage("--shared-expert-ff -4", "--shared-expert-ff '-4': expected an integer in 0..");
}

/* A rank on a GPU cannot honour the routing options (the CUDA model has none of them): each
 * option is refused, naming itself, the rank and its device; the host and the default
 * options pass. */
static void test_gpu_refused(void **state)
{
    (void)state;
    const seldp_device gpu = {SELDP_DEVICE_CUDA, 1};
    tm_config cfg = TM_CONFIG_INIT;
    assert_int_equal(hx_router_check_device(&cfg, 3, gpu, "cuda:1"), SELDP_OK);
    static const char *const options[] = {"--shared-expert-ff", "--aux-loss-coeff",
                                          "--z-loss-coeff", "--capacity-factor"};
    for (int i = 0; i < 4; i++) {
        tm_config c = cfg;
        c.d_ff_shared = i == 0 ? 8 : 0;
        c.aux_loss_coeff = i == 1 ? 0.1 : 0.0;
        c.z_loss_coeff = i == 2 ? 0.1 : 0.0;
        c.capacity_factor = i == 3 ? 1.0 : 0.0;
        assert_int_equal(hx_router_check_device(&c, 3, SELDP_HOST_DEVICE, "host"), SELDP_OK);
        assert_int_equal(hx_router_check_device(&c, 3, gpu, "cuda:1"), SELDP_ERR_UNSUPPORTED);
        const char *msg = hx_last_error();
        assert_true(strncmp(msg, options[i], strlen(options[i])) == 0);
        assert_non_null(strstr(msg, "rank 3 computes on cuda:1"));
        assert_null(strchr(msg, '\n'));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_refused),   cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_report_config), cmocka_unit_test(test_capacity_drops),
        cmocka_unit_test(test_layout_files),  cmocka_unit_test(test_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
