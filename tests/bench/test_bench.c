/* seldp-bench on tiny sizes: it runs, every JSON line is a well-formed row with the keys of
 * SPEC §6, every result validates (wrong == 0), the row count matches the sizes and ranks
 * asked for, and --out, --compare mpi, --gpu, --help and bad options behave. Nothing here
 * is timed. Usage: bench_smoke PATH/TO/seldp-bench */
#define _GNU_SOURCE /* popen */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "json.h"
#include "util.h"

static const char *bench;

typedef struct run_result {
    int status;       /* exit status, or -1 */
    int rows;         /* JSON rows */
    int by_impl[6];   /* memcpy, seldp-host, mpi, seldp-nccl, nccl, other */
    char text[16384]; /* the non-JSON output, truncated */
} run_result;

static int impl_index(const char *impl)
{
    static const char *const names[] = {"memcpy", "seldp-host", "mpi", "seldp-nccl", "nccl"};
    for (int i = 0; i < 5; i++)
        if (strcmp(impl, names[i]) == 0)
            return i;
    return 5;
}

static const hx_json *member(const hx_json *row, const char *key, hx_json_type type,
                             const char *line)
{
    const hx_json *v = hx_json_get(row, key);
    if (!v || v->type != type)
        fail_msg("row without a %s '%s': %s", hx_json_type_name(type), key, line);
    return v;
}

/* Check one JSON row; fails the test on anything wrong. */
static void check_row(const char *line, run_result *res)
{
    hx_json *row = NULL;
    if (hx_json_parse(line, strlen(line), "seldp-bench --json", &row) != SELDP_OK)
        fail_msg("not JSON: %s (%s)", line, hx_last_error());
    const char *op = member(row, "op", HX_JSON_STRING, line)->string;
    const char *impl = member(row, "impl", HX_JSON_STRING, line)->string;
    const hx_json *ranks = member(row, "ranks", HX_JSON_NUMBER, line);
    const hx_json *bytes = member(row, "bytes", HX_JSON_NUMBER, line);
    double time_us = member(row, "time_us", HX_JSON_NUMBER, line)->number;
    double algbw = member(row, "algbw_GBps", HX_JSON_NUMBER, line)->number;
    double busbw = member(row, "busbw_GBps", HX_JSON_NUMBER, line)->number;
    const hx_json *bound = hx_json_get(row, "bound_fraction");
    const hx_json *wrong = member(row, "wrong", HX_JSON_NUMBER, line);
    if (strcmp(op, "allreduce") && strcmp(op, "broadcast") && strcmp(op, "reduce"))
        fail_msg("unknown op: %s", line);
    if (!ranks->is_integer || ranks->integer < 1 || !bytes->is_integer || bytes->integer < 1)
        fail_msg("ranks and bytes must be positive integers: %s", line);
    if (!(time_us > 0) || !(algbw >= 0) || !(busbw >= 0))
        fail_msg("time must be positive and bandwidths non-negative: %s", line);
    if (!bound || (bound->type != HX_JSON_NULL && bound->type != HX_JSON_NUMBER))
        fail_msg("bound_fraction must be a number or null: %s", line);
    if (strcmp(impl, "memcpy") == 0 && bound->type != HX_JSON_NULL)
        fail_msg("a memcpy row has no bound fraction: %s", line);
    if (!wrong->is_integer || wrong->integer != 0)
        fail_msg("wrong results: %s", line);
    if (strcmp(op, "reduce") == 0 && strcmp(impl, "seldp-host") == 0) {
        member(row, "raw_time_us", HX_JSON_NUMBER, line);
        member(row, "bucket_bytes", HX_JSON_NUMBER, line);
        member(row, "tensors", HX_JSON_NUMBER, line);
        const hx_json *extra = hx_json_get(row, "rss_extra_per_rank");
        if (extra && (!extra->is_integer || extra->integer < 0))
            fail_msg("rss_extra_per_rank must be a byte count: %s", line);
    }
    res->rows++;
    res->by_impl[impl_index(impl)]++;
    hx_json_free(row);
}

/* Run seldp-bench with `args`; JSON rows are checked as they come. */
static run_result *run(const char *args)
{
    static run_result res;
    char cmd[4096], line[8192];
    memset(&res, 0, sizeof res);
    snprintf(cmd, sizeof cmd, "'%s' %s", bench, args);
    FILE *p = popen(cmd, "r");
    if (!p)
        fail_msg("cannot run %s", cmd);
    size_t used = 0;
    while (fgets(line, sizeof line, p)) {
        if (line[0] == '{') {
            check_row(line, &res);
        } else if (used < sizeof res.text - 1) {
            size_t n = strlen(line);
            if (n > sizeof res.text - 1 - used)
                n = sizeof res.text - 1 - used;
            memcpy(res.text + used, line, n);
            used += n;
            res.text[used] = '\0';
        }
    }
    int status = pclose(p);
    res.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return &res;
}

static void allreduce_rows_validate(void **state)
{
    (void)state;
    /* sizes 8, 256 and 8192 bytes on 1, 2 and 3 ranks: a memcpy and a seldp row each */
    run_result *r = run("-b 8 -e 8K -f 32 -n 2 -w 1 -r 1-3 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 18);
    assert_int_equal(r->by_impl[0], 9);
    assert_int_equal(r->by_impl[1], 9);
}

static void broadcast_rows_validate(void **state)
{
    (void)state;
    run_result *r = run("-o broadcast -b 1K -e 1M -f 32 -n 2 -w 1 -r 2,4 --json --no-bound");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 6);
    assert_int_equal(r->by_impl[1], 6);
}

static void reduce_rows_validate(void **state)
{
    (void)state;
    /* memcpy, raw allreduce, two bucketed raw allreduces and two reduce rows */
    run_result *r = run("-o reduce -b 256K -e 256K --tensors 100 -n 2 -w 1 -r 2 --bucket 16K,64K "
                        "--json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 6);
    assert_int_equal(r->by_impl[0], 1);
    assert_int_equal(r->by_impl[1], 5);
    r = run("-o reduce -b 128K -e 128K --tensors 40 -n 1 -w 0 -r 3 -d f16 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 3);
}

static void out_writes_jsonl_and_csv(void **state)
{
    (void)state;
    char dir[] = "/tmp/seldp-bench-test-XXXXXX", args[512], path[600], line[4096];
    if (!mkdtemp(dir))
        fail_msg("mkdtemp failed");
    snprintf(args, sizeof args, "-b 1K -e 4K -f 4 -n 1 -w 0 -r 2 --out %s/rows", dir);
    run_result *r = run(args);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->text, "seldp-host"));
    int counts[2] = {0, 0};
    const char *ext[2] = {"jsonl", "csv"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/rows.%s", dir, ext[k]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        while (fgets(line, sizeof line, f)) {
            if (k == 0) {
                run_result scratch;
                memset(&scratch, 0, sizeof scratch);
                check_row(line, &scratch);
            }
            counts[k]++;
        }
        fclose(f);
        remove(path);
    }
    rmdir(dir);
    assert_int_equal(counts[0], 4);     /* memcpy and seldp at 1K and 4K */
    assert_int_equal(counts[1], 4 + 1); /* and the header */
}

static void compare_mpi_rows_validate(void **state)
{
    (void)state;
    char mpi[4096];
    snprintf(mpi, sizeof mpi, "%s", bench);
    char *slash = strrchr(mpi, '/');
    snprintf(slash ? slash + 1 : mpi, sizeof mpi - (size_t)(slash ? slash + 1 - mpi : 0),
             "seldp-bench-mpi");
    if (access(mpi, X_OK) != 0 || system("command -v mpirun > /dev/null 2>&1") != 0)
        skip();
    run_result *r = run("-b 8 -e 4K -f 16 -n 2 -w 1 -r 2 --compare mpi --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[2], 3);
    assert_int_equal(r->by_impl[1], 3);
    r = run("-o broadcast -b 64K -e 64K -n 2 -w 1 -r 3 --compare mpi --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[2], 1);
}

static void gpu_rows_or_a_no_gpu_line(void **state)
{
    (void)state;
    run_result *r = run("--gpu -b 1M -e 1M -n 1 -w 0");
    assert_int_equal(r->status, 0);
    if (r->rows == 0 && !strstr(r->text, "no GPU"))
        fail_msg("--gpu printed neither rows nor a 'no GPU' line: %s", r->text);
}

static void help_and_bad_options(void **state)
{
    (void)state;
    run_result *r = run("--help");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->text, "--compare mpi"));
    assert_non_null(strstr(r->text, "--gpu"));
    assert_int_equal(run("--op gather 2>/dev/null")->status, 2);
    assert_int_equal(run("-b 1M -e 1K 2>/dev/null")->status, 2);
    assert_int_equal(run("--ranks 0 2>/dev/null")->status, 2);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/seldp-bench\n", argv[0]);
        return 2;
    }
    bench = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allreduce_rows_validate),   cmocka_unit_test(broadcast_rows_validate),
        cmocka_unit_test(reduce_rows_validate),      cmocka_unit_test(out_writes_jsonl_and_csv),
        cmocka_unit_test(compare_mpi_rows_validate), cmocka_unit_test(gpu_rows_or_a_no_gpu_line),
        cmocka_unit_test(help_and_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
