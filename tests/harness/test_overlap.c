/* --overlap: the reductions started before the backward, each layer's gradients marked ready
 * as its backward produces them, finished after it. Every layout's dump (parameters after a
 * step of SGD on the reduced gradients, the reduced gradients, the manifest's global weights)
 * must be bit-identical to the blocking run's; where overlap cannot hold, a one-line usage
 * error. Small buckets (--bucket-bytes) so that a session's reduction runs in several buckets,
 * each as soon as its layers are marked. */
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

#define COMMON "--steps 2 --tokens 16 --quiet --out none --timeout 60"

static void run_dump(const char *args, const char *extra, const char *dir)
{
    hx_test_run run;
    hx_test_harness(&run, "%s %s %s --dump %s", COMMON, args, extra, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s %s\nexit %d\n%s%s", args, extra, run.status, run.err, run.out);
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

/* Every tensor of rank r's two dumps, found by name: same dtype, shape and bytes. Returns the
 * number of gradients compared. */
static int compare_rank(const char *args, const char *blocking, const char *overlapped, int r)
{
    hx_st_file *a = read_rank(blocking, r), *b = read_rank(overlapped, r);
    int grads = 0;
    if (hx_st_count(a) != hx_st_count(b))
        fail_msg("%s: rank %d: %zu tensors blocking, %zu overlapped", args, r, hx_st_count(a),
                 hx_st_count(b));
    for (size_t i = 0; i < hx_st_count(a); i++) {
        const hx_st_tensor *x = hx_st_at(a, i);
        const hx_st_tensor *y = hx_st_find(b, x->name);
        if (!y)
            fail_msg("%s: rank %d: %s missing in the overlapped run's dump", args, r, x->name);
        if (x->dtype != y->dtype || x->nbytes != y->nbytes ||
            memcmp(x->data, y->data, x->nbytes) != 0)
            fail_msg("%s: rank %d: %s differs between the blocking and the overlapped run", args, r,
                     x->name);
        grads += strncmp(x->name, "grad/", 5) == 0;
    }
    hx_st_file_free(a);
    hx_st_file_free(b);
    return grads;
}

static void compare_manifests(const char *args, const char *blocking, const char *overlapped)
{
    char path[1300];
    char *x = NULL, *y = NULL;
    snprintf(path, sizeof path, "%s/manifest.json", blocking);
    assert_int_equal(hx_read_file(path, &x, NULL), SELDP_OK);
    snprintf(path, sizeof path, "%s/manifest.json", overlapped);
    assert_int_equal(hx_read_file(path, &y, NULL), SELDP_OK);
    if (strcmp(x, y) != 0)
        fail_msg("%s: the manifests differ:\n%s\n---\n%s", args, x, y);
    free(x);
    free(y);
}

/* The run of `args` blocking and overlapped, both with the same buckets: bit-identical. */
static void same_bits(const char *args, int world, const char *buckets)
{
    char blocking[1200], overlapped[1200], extra[128];
    snprintf(blocking, sizeof blocking, "%s", hx_test_dir("blocking"));
    snprintf(extra, sizeof extra, "%s", buckets);
    run_dump(args, extra, blocking);
    snprintf(overlapped, sizeof overlapped, "%s", hx_test_dir("overlapped"));
    snprintf(extra, sizeof extra, "%s --overlap", buckets);
    run_dump(args, extra, overlapped);
    for (int r = 0; r < world; r++)
        if (compare_rank(args, blocking, overlapped, r) == 0)
            fail_msg("%s: rank %d dumped no gradient", args, r);
    compare_manifests(args, blocking, overlapped);
}

#define SMALL_BUCKETS "--bucket-bytes 2048"

static void expert_parallel_sizes_and_flows(void **state)
{
    (void)state;
    same_bits("--world 2 --ep 1", 2, SMALL_BUCKETS);
    same_bits("--world 4 --ep 2", 4, SMALL_BUCKETS);
    same_bits("--world 4 --ep 4 --expert-reduce mean", 4, SMALL_BUCKETS);
    same_bits("--world 4 --ep 2 --expert-reduce mean --policy zero", 4, SMALL_BUCKETS);
    /* one bucket per session (the library's default size): reduced at the last mark */
    same_bits("--world 4 --ep 2", 4, "");
}

static void sharded_layouts(void **state)
{
    (void)state;
    same_bits("--world 4 --tp 2 --ep 2 --experts 4", 4, SMALL_BUCKETS);
    /* the tied embedding's two copies in the embedding group, divided before export */
    same_bits("--world 4 --pp 2 --ep 2 --experts 4 --expert-reduce mean", 4, SMALL_BUCKETS);
    /* the replicated adapters of ETP-split experts */
    same_bits("--world 4 --etp 2 --ep 1 --experts 4 --quant nf4 --d-ff 128 --expert-reduce mean", 4,
              SMALL_BUCKETS);
}

static void dtypes_quantization_and_features(void **state)
{
    (void)state;
    same_bits("--world 4 --ep 2 --dtype bf16 --quant nf4", 4, SMALL_BUCKETS);
    same_bits("--world 4 --ep 2 --dtype f32 --fp32-master", 4, SMALL_BUCKETS);
    same_bits("--world 4 --ep 2 --shared-expert-ff 32 --aux-loss-coeff 0.01 --z-loss-coeff 0.001 "
              "--capacity-factor 1.0 --clip-grad 0.05",
              4, SMALL_BUCKETS);
}

/* Micro-batches: the reductions start in the last micro-batch's forward and each layer's
 * gradients go out as its last backward leaves them final; the same bits as blocking. */
static void micro_batches(void **state)
{
    (void)state;
    same_bits("--world 4 --ep 2 --micro-batches 4", 4, SMALL_BUCKETS);
    same_bits("--world 4 --ep 4 --micro-batches 3 --expert-reduce mean --aux-loss-coeff 0.01 "
              "--optimizer adamw --lr 0.01 --dtype f32",
              4, SMALL_BUCKETS);
    same_bits("--world 4 --tp 2 --ep 2 --experts 4 --micro-batches 2 --shared-expert-ff 32 "
              "--capacity-factor 1.5",
              4, SMALL_BUCKETS);
    same_bits("--world 4 --cp 2 --ep 2 --micro-batches 2 --dtype f16 --loss-scale dynamic "
              "--inject-overflow 2 --clip-grad 0.5",
              4, "");
}

/* --zero 1: each set's overlapped reduce-scatter into the ranks' ranges (seldp/shard.h) */
static void distributed_optimizer(void **state)
{
    (void)state;
    same_bits("--world 8 --ep 4 --zero 1", 8, SMALL_BUCKETS);
    same_bits("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --zero 1 --optimizer adamw "
              "--lr 0.01 --clip-grad 0.5",
              8, SMALL_BUCKETS);
    same_bits("--world 4 --ep 2 --zero 1 --micro-batches 2 --dtype f16 --loss-scale dynamic "
              "--inject-overflow 2",
              4, "");
}

static void expect_usage_error(const char *args, const char *needle)
{
    hx_test_usage_error(needle, "%s", args);
}

static void refused_where_it_cannot_hold(void **state)
{
    (void)state;
    expect_usage_error("--overlap --backend mpi --steps 1", "--overlap: not with one rank per MPI");
    expect_usage_error("--overlap --backend nccl --steps 1", "--overlap: not with --backend nccl");
    expect_usage_error("--bucket-bytes -1 --steps 1", "--bucket-bytes");
    expect_usage_error("--world 4 --pp 2 --ep 2 --micro-batches 2 --overlap --steps 1",
                       "--micro-batches 2 with --overlap: needs one pipeline stage");
    /* without --overlap the same backends are not refused for it */
    hx_test_run run;
    hx_test_harness(&run, "--backend nccl --steps 1 --quiet --out none");
    assert_null(strstr(run.err, "--overlap"));
}

static void documented_in_help(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--help");
    assert_int_equal(run.status, HX_EXIT_PASS);
    assert_non_null(strstr(run.out, "--overlap"));
    assert_non_null(strstr(run.out, "--bucket-bytes N"));
}

/* report.json says whether the reductions were overlapped, and with which buckets; the finishes
 * are checked as the blocking reductions are (gradients outside a selection left alone). */
static void recorded_in_the_report(void **state)
{
    (void)state;
    const char *flags[2] = {"", "--overlap --bucket-bytes 4096"};
    int64_t untouched[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s", hx_test_dir(k ? "report-overlapped" : "report-blocking"));
        hx_test_run run;
        hx_test_harness(&run, "--world 2 --ep 1 --steps 1 --tokens 8 --quiet --out %s %s", dir,
                        flags[k]);
        assert_int_equal(run.status, HX_EXIT_PASS);
        hx_json *report = hx_test_report(dir);
        const hx_json *options = hx_json_get(report, "options");
        assert_non_null(options);
        const hx_json *overlap = hx_json_get(options, "overlap");
        assert_non_null(overlap);
        assert_int_equal(overlap->type, HX_JSON_BOOL);
        assert_int_equal(overlap->boolean, k == 1);
        assert_int_equal(hx_test_int(options, "bucket_bytes"), k ? 4096 : 0);
        int64_t failed = -1;
        hx_test_check(report, "reductions touch only their selected gradients", &untouched[k],
                      &failed);
        assert_int_equal(failed, 0);
        hx_json_free(report);
    }
    assert_true(untouched[0] > 0);
    assert_int_equal(untouched[1], untouched[0]);
}

/* A rank that fails while the others' reductions are in flight stops every rank. */
static void failing_rank_stops_the_world(void **state)
{
    (void)state;
    hx_test_run run;
    hx_test_harness(&run, "--overlap --world 4 --ep 2 --inject fail --steps 2 --timeout 20 "
                          "--out none --quiet");
    assert_int_equal(run.status, HX_EXIT_FAIL);
    assert_non_null(strstr(run.err, "rank 3: --inject fail"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(expert_parallel_sizes_and_flows),
        cmocka_unit_test(sharded_layouts),
        cmocka_unit_test(dtypes_quantization_and_features),
        cmocka_unit_test(micro_batches),
        cmocka_unit_test(distributed_optimizer),
        cmocka_unit_test(refused_where_it_cannot_hold),
        cmocka_unit_test(documented_in_help),
        cmocka_unit_test(recorded_in_the_report),
        cmocka_unit_test(failing_rank_stops_the_world),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
