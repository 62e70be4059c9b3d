/* seldp-bench on tiny sizes: it runs, every JSON line is a well-formed row with the keys of
 * docs/benchmarks.md (Output), every result validates (wrong == 0), the row count matches the sizes
 * and ranks asked for, every bound fraction is against B = the better of the memcpy and stream rows
 * of its size, and --out, --compare mpi, --compare gloo (against a stub program printing
 * known rows, and without torch), --staged-commit, --gpu, --help and bad options behave.
 * Nothing here is timed. Usage: bench_smoke PATH/TO/seldp-bench */
#define _GNU_SOURCE /* popen */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "json.h"
#include "util.h"

static const char *bench;

enum { IMPLS = 8, KEPT = 64 };

/* What a bound fraction is checked against: a row's identity and figures. */
typedef struct kept_row {
    char op[16], impl[16], note[32];
    long long ranks, bytes;
    double time_us, busbw, bound_fraction, bound_GBps;
    bool has_bound;
    int repeats; /* 0: a single run */
} kept_row;

typedef struct run_result {
    int status;          /* exit status, or -1 */
    int rows;            /* JSON rows */
    int by_impl[IMPLS];  /* memcpy, seldp-host, mpi, seldp-nccl, nccl, stream, gloo, other */
    kept_row kept[KEPT]; /* the first rows */
    char text[16384];    /* the non-JSON output, truncated */
} run_result;

static int impl_index(const char *impl)
{
    static const char *const names[] = {"memcpy", "seldp-host", "mpi", "seldp-nccl",
                                        "nccl",   "stream",     "gloo"};
    for (int i = 0; i < IMPLS - 1; i++)
        if (strcmp(impl, names[i]) == 0)
            return i;
    return IMPLS - 1;
}

static const hx_json *member(const hx_json *row, const char *key, hx_json_type type,
                             const char *line)
{
    const hx_json *v = hx_json_get(row, key);
    if (!v || v->type != type)
        fail_msg("row without a %s '%s': %s", hx_json_type_name(type), key, line);
    return v;
}

/* A row of -r N (docs/benchmarks.md, Repeat mode): the median time between the fastest and the
 * slowest repetition, the spread their difference over the median, the median bound fraction
 * within the repetitions' range. */
static void check_repeated(const hx_json *row, const char *line, double time_us,
                           const hx_json *bound)
{
    const hx_json *repeats = member(row, "repeats", HX_JSON_NUMBER, line);
    double lo = member(row, "time_min_us", HX_JSON_NUMBER, line)->number;
    double hi = member(row, "time_max_us", HX_JSON_NUMBER, line)->number;
    double spread = member(row, "spread", HX_JSON_NUMBER, line)->number;
    if (!repeats->is_integer || repeats->integer < 2)
        fail_msg("repeats must be an integer >= 2 where it is given: %s", line);
    if (!(lo <= time_us * (1 + 1e-5) && time_us <= hi * (1 + 1e-5) && lo > 0))
        fail_msg("the median time is not between the fastest and the slowest: %s", line);
    if (fabs(spread - (hi - lo) / time_us) > 1e-4 * (1 + spread))
        fail_msg("spread is not (slowest - fastest) / median: %s", line);
    if (bound->type == HX_JSON_NUMBER) {
        double flo = member(row, "bound_fraction_min", HX_JSON_NUMBER, line)->number;
        double fhi = member(row, "bound_fraction_max", HX_JSON_NUMBER, line)->number;
        double f = bound->number;
        if (!(flo <= f * (1 + 1e-5) && f <= fhi * (1 + 1e-5)))
            fail_msg("the median bound fraction is not within its range: %s", line);
    }
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
    if (strcmp(op, "allreduce") && strcmp(op, "broadcast") && strcmp(op, "reduce") &&
        strcmp(op, "overlap"))
        fail_msg("unknown op: %s", line);
    if (strcmp(op, "overlap") == 0 &&
        (strcmp(impl, "overlap") == 0 || strcmp(impl, "staged") == 0) &&
        !(member(row, "over_max", HX_JSON_NUMBER, line)->number > 0))
        fail_msg("an overlapped row without its time over max(compute, comm): %s", line);
    if (!ranks->is_integer || ranks->integer < 1 || !bytes->is_integer || bytes->integer < 1)
        fail_msg("ranks and bytes must be positive integers: %s", line);
    if (!(time_us > 0) || !(algbw >= 0) || !(busbw >= 0))
        fail_msg("time must be positive and bandwidths non-negative: %s", line);
    if (!bound || (bound->type != HX_JSON_NULL && bound->type != HX_JSON_NUMBER))
        fail_msg("bound_fraction must be a number or null: %s", line);
    bool copy = strcmp(impl, "memcpy") == 0 || strcmp(impl, "stream") == 0;
    if (copy && bound->type != HX_JSON_NULL)
        fail_msg("a copy row has no bound fraction: %s", line);
    const hx_json *B = hx_json_get(row, "bound_GBps");
    const hx_json *repeats = hx_json_get(row, "repeats");
    if (repeats)
        check_repeated(row, line, time_us, bound);
    if (bound->type == HX_JSON_NUMBER && !repeats) {
        /* B and the two copies it is the better of */
        double b = member(row, "bound_GBps", HX_JSON_NUMBER, line)->number;
        const hx_json *m = hx_json_get(row, "memcpy_GBps"), *st = hx_json_get(row, "stream_GBps");
        double best = 0;
        if (m && m->type == HX_JSON_NUMBER)
            best = m->number;
        if (st && st->type == HX_JSON_NUMBER && st->number > best)
            best = st->number;
        if (!(b > 0) || fabs(b - best) > 1e-5 * best)
            fail_msg("bound_GBps is not the better of memcpy_GBps and stream_GBps: %s", line);
    }
    if (res->rows < KEPT) {
        kept_row *k = &res->kept[res->rows];
        const hx_json *note = hx_json_get(row, "note");
        snprintf(k->op, sizeof k->op, "%s", op);
        snprintf(k->impl, sizeof k->impl, "%s", impl);
        snprintf(k->note, sizeof k->note, "%s",
                 note && note->type == HX_JSON_STRING ? note->string : "");
        k->ranks = ranks->integer;
        k->bytes = bytes->integer;
        k->time_us = time_us;
        k->busbw = busbw;
        k->has_bound = bound->type == HX_JSON_NUMBER;
        k->bound_fraction = k->has_bound ? bound->number : 0;
        k->bound_GBps = k->has_bound ? B->number : 0;
        k->repeats = repeats && repeats->is_integer ? (int)repeats->integer : 0;
    }
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

/* The kept row of `impl` with the op, ranks and size of k, or NULL. */
static const kept_row *find_kept(const run_result *r, const kept_row *k, const char *impl)
{
    for (int i = 0; i < r->rows && i < KEPT; i++) {
        const kept_row *m = &r->kept[i];
        if (strcmp(m->impl, impl) == 0 && strcmp(m->op, k->op) == 0 && m->ranks == k->ranks &&
            m->bytes == k->bytes)
            return m;
    }
    return NULL;
}

/* Every bounded row's B is the better of the memcpy and stream rows of its op, ranks and
 * size, and its fraction is the bytes it must move over B, over its time (docs/benchmarks.md, The
 * bound). */
static void check_bounds(const run_result *r, const char *impl)
{
    int checked = 0;
    for (int i = 0; i < r->rows && i < KEPT; i++) {
        const kept_row *k = &r->kept[i];
        if (strcmp(k->impl, impl) != 0)
            continue;
        const kept_row *m = find_kept(r, k, "memcpy"), *s = find_kept(r, k, "stream");
        if (!m || !s || !k->has_bound)
            fail_msg("%s row of %lld bytes on %lld ranks without both copy rows and a bound", impl,
                     k->bytes, k->ranks);
        double best = m->busbw > s->busbw ? m->busbw : s->busbw;
        if (fabs(k->bound_GBps - best) > 1e-4 * best)
            fail_msg("%s row of %lld bytes: B %g, but memcpy %g and stream %g", impl, k->bytes,
                     k->bound_GBps, m->busbw, s->busbw);
        double moved =
            (strcmp(k->op, "broadcast") == 0 ? 1.0 : 2.0) * (double)k->ranks * (double)k->bytes;
        double expect = moved / (best * 1e9) / (k->time_us * 1e-6);
        if (fabs(k->bound_fraction - expect) > 1e-3 * expect)
            fail_msg("%s row of %lld bytes: bound fraction %g, expected %g", impl, k->bytes,
                     k->bound_fraction, expect);
        checked++;
    }
    if (checked == 0)
        fail_msg("no %s row to check", impl);
}

static void allreduce_rows_validate(void **state)
{
    (void)state;
    /* sizes 8, 256 and 8192 bytes on 1, 2 and 3 ranks: a memcpy, a stream and a seldp row
     * each */
    run_result *r = run("-b 8 -e 8K -f 32 -n 2 -w 1 --ranks 1-3 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 27);
    assert_int_equal(r->by_impl[0], 9);
    assert_int_equal(r->by_impl[5], 9);
    assert_int_equal(r->by_impl[1], 9);
    check_bounds(r, "seldp-host");
    /* sizes where the streaming path runs (past its 256-byte memcpy cut), and a broadcast */
    r = run("-o broadcast -b 64K -e 1M -f 4 -n 2 -w 1 --ranks 2 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[5], 3);
    check_bounds(r, "seldp-host");
}

static void broadcast_rows_validate(void **state)
{
    (void)state;
    run_result *r = run("-o broadcast -b 1K -e 1M -f 32 -n 2 -w 1 --ranks 2,4 --json --no-bound");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 6);
    assert_int_equal(r->by_impl[0] + r->by_impl[5], 0);
    assert_int_equal(r->by_impl[1], 6);
}

static void reduce_rows_validate(void **state)
{
    (void)state;
    /* memcpy, stream, raw allreduce, two bucketed raw allreduces and two reduce rows */
    run_result *r =
        run("-o reduce -b 256K -e 256K --tensors 100 -n 2 -w 1 --ranks 2 --bucket 16K,64K "
            "--json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 7);
    assert_int_equal(r->by_impl[0], 1);
    assert_int_equal(r->by_impl[5], 1);
    assert_int_equal(r->by_impl[1], 5);
    r = run("-o reduce -b 128K -e 128K --tensors 40 -n 1 -w 0 --ranks 3 -d f16 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 4);
    for (int i = 0; i < r->rows; i++)
        if (strstr(r->kept[i].note, "staged"))
            fail_msg("a reduce row says staged without --staged-commit");
    /* with cfg.staged_commit: the reduce row says so, and still validates */
    r = run("-o reduce -b 128K -e 128K --tensors 40 -n 1 -w 0 --ranks 2 --staged-commit --json");
    assert_int_equal(r->status, 0);
    int staged = 0;
    for (int i = 0; i < r->rows; i++)
        staged += strcmp(r->kept[i].op, "reduce") == 0 &&
                  strcmp(r->kept[i].impl, "seldp-host") == 0 &&
                  strstr(r->kept[i].note, "staged") != NULL;
    assert_int_equal(staged, 1);
}

static void out_writes_jsonl_and_csv(void **state)
{
    (void)state;
    char dir[] = "/tmp/seldp-bench-test-XXXXXX", args[512], path[600], line[4096];
    if (!mkdtemp(dir))
        fail_msg("mkdtemp failed");
    snprintf(args, sizeof args, "-b 1K -e 4K -f 4 -n 1 -w 0 --ranks 2 --out %s/rows", dir);
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
    assert_int_equal(counts[0], 6);     /* memcpy, stream and seldp at 1K and 4K */
    assert_int_equal(counts[1], 6 + 1); /* and the header */
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
    run_result *r = run("-b 8 -e 4K -f 16 -n 2 -w 1 --ranks 2 --compare mpi --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[2], 3);
    assert_int_equal(r->by_impl[1], 3);
    check_bounds(r, "mpi");
    r = run("-o broadcast -b 64K -e 64K -n 2 -w 1 --ranks 3 --compare mpi --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[2], 1);
}

/* A stand-in for the gloo program: prints the rows seldp-bench must read (and torch-like
 * noise it must skip), or says torch is missing. */
static void write_stub(const char *path, const char *body)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fail_msg("cannot write %s", path);
    fputs(body, f);
    fclose(f);
}

static void compare_gloo_reads_the_program_rows(void **state)
{
    (void)state;
    char dir[] = "/tmp/seldp-bench-gloo-XXXXXX", stub[600], args[1024];
    if (!mkdtemp(dir))
        fail_msg("mkdtemp failed");
    snprintf(stub, sizeof stub, "%s/stub.sh", dir);
    /* known times: 1000 us at 4 KiB and 2000 us at 16 KiB, 2 ranks; the arguments it was
     * given are echoed as a note line, which seldp-bench must skip */
    write_stub(stub, "echo \"args: $*\"\n"
                     "echo '{\"op\":\"allreduce\",\"impl\":\"gloo\",\"ranks\":2,"
                     "\"bytes\":4096,\"time_us\":1000,\"wrong\":0}'\n"
                     "echo '{\"op\":\"allreduce\",\"impl\":\"gloo\",\"ranks\":2,"
                     "\"bytes\":16384,\"time_us\":2000,\"wrong\":0}'\n");
    snprintf(
        args, sizeof args,
        "-b 4K -e 16K -f 4 -n 2 -w 0 --ranks 2 --compare gloo --python /bin/sh --gloo-script %s "
        "--json",
        stub);
    run_result *r = run(args);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[6], 2);
    int seen = 0;
    for (int i = 0; i < r->rows && i < KEPT; i++) {
        const kept_row *k = &r->kept[i];
        if (strcmp(k->impl, "gloo") != 0)
            continue;
        double want_us = k->bytes == 4096 ? 1000 : 2000;
        assert_true(k->bytes == 4096 || k->bytes == 16384);
        assert_true(fabs(k->time_us - want_us) < 1e-9);
        /* busbw of an allreduce on 2 ranks: algbw * 2(n-1)/n = bytes / time */
        assert_true(fabs(k->busbw - (double)k->bytes / (want_us * 1e-6) / 1e9) < 1e-9);
        assert_true(k->has_bound); /* against the copy rows of the same run */
        seen++;
    }
    assert_int_equal(seen, 2);
    check_bounds(r, "gloo");

    /* the table's comparison has a gloo column with those figures */
    snprintf(
        args, sizeof args,
        "-b 4K -e 16K -f 4 -n 2 -w 0 --ranks 2 --compare gloo --python /bin/sh --gloo-script %s",
        stub);
    r = run(args);
    assert_int_equal(r->status, 0);
    const char *table = strstr(r->text, "beside Open MPI and gloo");
    assert_non_null(table);
    /* the 16 KiB line: size, seldp, mpi, x mpi, gloo (16 KiB in 2000 us: 0.01 GB/s) */
    const char *line = strstr(table, "16.0 KiB");
    assert_non_null(line);
    char seldp[32], mpi[32], x_mpi[32], gloo[32];
    assert_int_equal(sscanf(line, "16.0 KiB %31s %31s %31s %31s", seldp, mpi, x_mpi, gloo), 4);
    assert_string_equal(mpi, "-");
    assert_string_equal(gloo, "0.01");

    /* malformed rows are an error, not a silent gap */
    write_stub(stub, "echo '{\"op\":\"allreduce\",\"impl\":\"gloo\",\"ranks\":3,"
                     "\"bytes\":4096,\"time_us\":1000,\"wrong\":0}'\n");
    snprintf(args, sizeof args,
             "-b 4K -e 4K -n 1 -w 0 --ranks 2 --compare gloo --python /bin/sh --gloo-script %s "
             "--json 2>/dev/null",
             stub);
    assert_int_equal(run(args)->status, 1);

    /* a program that says torch is missing (exit 77): no gloo rows, a note, success */
    write_stub(stub, "echo 'python3 cannot import torch'\nexit 77\n");
    snprintf(args, sizeof args,
             "-b 4K -e 4K -n 1 -w 0 --ranks 2 --compare gloo --python /bin/sh --gloo-script %s",
             stub);
    r = run(args);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[6], 0);
    assert_non_null(strstr(r->text, "no gloo column"));
    assert_non_null(strstr(r->text, "cannot import torch"));
    remove(stub);
    rmdir(dir);
}

/* Without --python, a python3 first on PATH that cannot import torch (pyenv's, a virtual
 * environment's) is not the end: the system's /usr/bin/python3, where Debian's
 * python3-torch installs, is tried next and its rows are read. */
static void compare_gloo_falls_back_to_the_system_python(void **state)
{
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0)
        skip();
    char dir[] = "/tmp/seldp-bench-python-XXXXXX", path[600], script[600], args[2048];
    if (!mkdtemp(dir))
        fail_msg("mkdtemp failed");
    /* the python3 first on PATH: says it has no torch */
    snprintf(path, sizeof path, "%s/python3", dir);
    write_stub(path, "#!/bin/sh\necho 'ModuleNotFoundError: No module named torch'\nexit 77\n");
    assert_int_equal(chmod(path, 0755), 0);
    /* the gloo program, as /usr/bin/python3 runs it: one row per size */
    snprintf(script, sizeof script, "%s/gloo.py", dir);
    write_stub(script, "import json\n"
                       "for b in (4096, 16384):\n"
                       "    print(json.dumps({'op': 'allreduce', 'impl': 'gloo', 'ranks': 2,\n"
                       "                      'bytes': b, 'time_us': 1000.0, 'wrong': 0}))\n");
    /* run() puts the binary first: env, which puts the stub's directory first on PATH */
    const char *saved = bench;
    bench = "env";
    snprintf(args, sizeof args,
             "PATH='%s':\"$PATH\" '%s' -b 4K -e 16K -f 4 -n 1 -w 0 --ranks 2 --compare gloo "
             "--gloo-script %s --json",
             dir, saved, script);
    run_result *r = run(args);
    bench = saved;
    assert_int_equal(r->status, 0);
    assert_int_equal(r->by_impl[6], 2);
    remove(path);
    remove(script);
    rmdir(dir);
}

/* The real program beside the binary: rows when torch with gloo is importable, else the
 * skip note; either way the run succeeds. */
static void compare_gloo_real_program_or_a_note(void **state)
{
    (void)state;
    if (system("command -v python3 > /dev/null 2>&1") != 0)
        skip();
    run_result *r = run("-b 4K -e 16K -f 4 -n 2 -w 1 --ranks 2 --compare gloo --json 2>&1");
    assert_int_equal(r->status, 0);
    if (r->by_impl[6] == 0 && !strstr(r->text, "no gloo column"))
        fail_msg("--compare gloo printed neither gloo rows nor a note: %s", r->text);
}

static void gpu_rows_or_a_no_gpu_line(void **state)
{
    (void)state;
    run_result *r = run("--gpu -b 1M -e 1M -n 1 -w 0");
    assert_int_equal(r->status, 0);
    if (r->rows == 0 && !strstr(r->text, "no GPU"))
        fail_msg("--gpu printed neither rows nor a 'no GPU' line: %s", r->text);
}

/* -r N: every row the median of N repetitions, with their spread, in the JSON lines, the CSV
 * and the table; the same rows as one run. */
static void repeat_mode_prints_medians_and_spread(void **state)
{
    (void)state;
    run_result *r = run("-b 64K -e 256K -f 4 -n 2 -w 1 --ranks 2 -r 3 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 6); /* memcpy, stream and seldp at 64K and 256K */
    for (int i = 0; i < r->rows; i++)
        if (r->kept[i].repeats != 3)
            fail_msg("row %d (%s) is not the median of 3 repetitions", i, r->kept[i].impl);
    /* the overlap rows: against the fastest communication, every repetition merged */
    r = run("-o overlap -b 256K -e 256K --bucket 64K --compute-ratio 1 -n 2 -w 1 -r 2 --json");
    assert_int_equal(r->status, 0);
    assert_int_equal(r->rows, 6);
    /* the table: the note of every row */
    r = run("-b 64K -e 64K -n 2 -w 1 --ranks 2 -r 3");
    assert_int_equal(r->status, 0);
    const char *at = r->text;
    int notes = 0;
    while ((at = strstr(at, "median of 3, spread ")) != NULL) {
        notes++;
        at++;
    }
    assert_int_equal(notes, 3);
    assert_non_null(strstr(r->text, "repetition 3 of 3"));
    /* each repetition's line: what else took the CPUs (the hypervisor's steal where
     * /proc/stat has it, this process's preemptions) */
    const char *rep = strstr(r->text, "repetition 1 of 3 done, load average ");
    assert_non_null(rep);
    const char *eol = strchr(rep, '\n'), *pre = strstr(rep, " preemptions");
    assert_true(eol && pre && pre < eol);
    /* the CSV: repeats and the spread columns */
    char dir[] = "/tmp/seldp-bench-repeat-XXXXXX", args[512], path[600], line[4096];
    if (!mkdtemp(dir))
        fail_msg("mkdtemp failed");
    snprintf(args, sizeof args, "-b 64K -e 64K -n 1 -w 0 --ranks 2 -r 2 --out %s/rows", dir);
    assert_int_equal(run(args)->status, 0);
    snprintf(path, sizeof path, "%s/rows.csv", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, ",repeats,time_min_us,time_max_us,spread,"));
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        /* column 21: repeats */
        const char *c = line;
        for (int k = 0; k < 20 && c; k++)
            c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL;
        assert_non_null(c);
        assert_int_equal(atoi(c), 2);
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, 3);
    remove(path);
    snprintf(path, sizeof path, "%s/rows.jsonl", dir);
    remove(path);
    rmdir(dir);
}

/* A bad repeat count: exit 2, one line on stderr naming it, nothing on stdout. */
static void repeat_mode_rejects_bad_counts(void **state)
{
    (void)state;
    static const char *const bad[] = {"0", "-1", "x", "2,4", "1-3", "1001", "3.5", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[4096], out[4096] = "";
        snprintf(cmd, sizeof cmd, "'%s' -b 1K -e 1K -r '%s' 2>&1 >/dev/null", bench, bad[i]);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        int status = pclose(p);
        assert_true(WIFEXITED(status));
        if (WEXITSTATUS(status) != 2)
            fail_msg("-r '%s': exit %d, expected 2", bad[i], WEXITSTATUS(status));
        if (!strstr(out, "-r") || !strstr(out, "repeat count") || strchr(out, '\n') != out + n - 1)
            fail_msg("-r '%s': expected one line naming the repeat count, got '%s'", bad[i], out);
        /* and nothing on stdout */
        snprintf(cmd, sizeof cmd, "'%s' -b 1K -e 1K -r '%s' 2>/dev/null", bench, bad[i]);
        p = popen(cmd, "r");
        assert_non_null(p);
        n = fread(out, 1, sizeof out - 1, p);
        pclose(p);
        assert_int_equal(n, 0);
    }
    /* --ranks is long only: the old -r LIST is a repeat count now, and says so */
    assert_int_equal(run("--ranks 2,4 -r 1 -b 1K -e 1K -n 1 -w 0 --json")->status, 0);
}

static void help_and_bad_options(void **state)
{
    (void)state;
    run_result *r = run("--help");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->text, "--compare LIST"));
    assert_non_null(strstr(r->text, "gloo"));
    assert_non_null(strstr(r->text, "non-temporal"));
    assert_non_null(strstr(r->text, "--gpu"));
    assert_non_null(strstr(r->text, "-r, --repeat N"));
    assert_int_equal(run("--op gather 2>/dev/null")->status, 2);
    assert_int_equal(run("-b 1M -e 1K 2>/dev/null")->status, 2);
    assert_int_equal(run("--ranks 0 2>/dev/null")->status, 2);
    assert_int_equal(run("--compare nccl 2>/dev/null")->status, 2);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/seldp-bench\n", argv[0]);
        return 2;
    }
    bench = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allreduce_rows_validate),
        cmocka_unit_test(broadcast_rows_validate),
        cmocka_unit_test(reduce_rows_validate),
        cmocka_unit_test(out_writes_jsonl_and_csv),
        cmocka_unit_test(compare_mpi_rows_validate),
        cmocka_unit_test(compare_gloo_reads_the_program_rows),
        cmocka_unit_test(compare_gloo_falls_back_to_the_system_python),
        cmocka_unit_test(compare_gloo_real_program_or_a_note),
        cmocka_unit_test(gpu_rows_or_a_no_gpu_line),
        cmocka_unit_test(repeat_mode_prints_medians_and_spread),
        cmocka_unit_test(repeat_mode_rejects_bad_counts),
        cmocka_unit_test(help_and_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
