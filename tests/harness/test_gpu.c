/* seldp-harness on GPUs (label gpu; skipped without one): NCCL with a GPU per rank, what
 * --backend auto picks, and the host-staged transport with more ranks than GPUs, each rank
 * computing on its GPU; every run passes every check (docs/harness.md, Checks) against the FP64
 * reference, and the layout table shows each rank's device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "seldp/version.h"

#include "cli.h"
#include "gpu.h"
#include "harness_test.h"

static int gpus;

/* Run, expect a pass over `transport` with the gradient check tested, and rank r's device
 * in the layout table. */
static void expect_pass(const char *transport, const char *args, int rank, const char *device)
{
    const char *dir = hx_test_dir("gpu");
    hx_test_run run;
    hx_test_harness(&run, "%s --steps 2 --tokens 32 --timeout 60 --out %s", args, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s\nexit %d\n%s%s", args, run.status, run.err, run.out);
    char row[64];
    snprintf(row, sizeof row, "\n  %4d  %-7s ", rank, device); /* hx_layout_print's columns */
    if (!strstr(run.out, row))
        fail_msg("seldp-harness %s: the layout table has no row '%s':\n%s", args, row + 1, run.out);
    hx_json *report = hx_test_report(dir);
    const hx_json *options = hx_json_get(report, "options");
    assert_non_null(options);
    const hx_json *used = hx_json_get(options, "transport");
    assert_non_null(used);
    assert_string_equal(used->string, transport);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    hx_json_free(report);
}

static void test_nccl_rank_per_gpu(void **state)
{
    (void)state;
    if (!seldp_has_feature("nccl"))
        skip();
    int W = gpus < 8 ? gpus : 8;
    char args[256], device[32];
    snprintf(device, sizeof device, "cuda:%d", W - 1);
    snprintf(args, sizeof args, "--backend nccl --world %d --ep %d --experts 8 --dtype bf16", W, W);
    expect_pass("nccl", args, W - 1, device);
    snprintf(args, sizeof args,
             "--backend nccl --world %d --ep %d --experts 8 --dtype f32 --quant nf4 "
             "--expert-reduce mean --fp32-master",
             W, W);
    expect_pass("nccl", args, W - 1, device);
    snprintf(args, sizeof args, "--backend auto --world %d --ep 1 --dtype f16 --quant awq", W);
    expect_pass("nccl", args, W - 1, device);
}

/* More ranks than GPUs: host-staged, rank r on cuda:(r % GPUs). */
static void test_host_staged_on_gpus(void **state)
{
    (void)state;
    char device[32];
    snprintf(device, sizeof device, "cuda:%d", 7 % gpus);
    expect_pass("host", "--backend host --world 8 --ep 4 --dtype bf16", 7, device);
    expect_pass("host", "--backend host --world 8 --ep 2 --order dp-ep --quant nf4 --policy zero",
                7, device);
    if (gpus < 9) {
        snprintf(device, sizeof device, "cuda:%d", 8 % gpus);
        expect_pass("host", "--backend auto --world 9 --ep 3 --experts 9 --dtype f32", 8, device);
    }
}

int main(void)
{
    gpus = hx_gpu_count();
    if (gpus == 0) {
        fprintf(stderr, "no GPU: the harness's GPU runs are skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_rank_per_gpu),
        cmocka_unit_test(test_host_staged_on_gpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
