/* seldp-bench and seldp-bench-mpi: their option tables (rows of harness/core/opt_table.h, the
 * machinery seldp-harness's options use), the parse through it, the rules between options,
 * and the --help texts (bench.h). */
#define _POSIX_C_SOURCE 200809L /* strtok_r */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "opt_table.h"

/* "2", "2,4", "1-16" (every value) into out; false when malformed or too long. */
static bool parse_ranks(const char *text, int *out, int *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 1 || a > 1024)
            return false;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p || b < a || b > 1024)
                return false;
        }
        for (long v = a; v <= b; v++) {
            if (*n == BENCH_MAX_LIST)
                return false;
            out[(*n)++] = (int)v;
        }
        if (*end == ',')
            end++;
        else if (*end != '\0')
            return false;
        p = end;
    }
    return *n > 0;
}

/* "25M", "1M,4M", "1M-256M" (doubling) into out. */
static bool parse_buckets(const char *text, size_t *out, int *n)
{
    char buf[256];
    *n = 0;
    if (strlen(text) >= sizeof buf)
        return false;
    strcpy(buf, text);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *dash = strchr(item, '-');
        size_t a = 0, b = 0;
        if (dash)
            *dash = '\0';
        if (!hx_opt_parse_size(item, &a) || a == 0)
            return false;
        b = a;
        if (dash && (!hx_opt_parse_size(dash + 1, &b) || b < a))
            return false;
        for (size_t v = a; v <= b; v *= 2) {
            if (*n == BENCH_MAX_LIST)
                return false;
            out[(*n)++] = v;
        }
    }
    return *n > 0;
}

/* "mpi", "gloo", "mpi,gloo", "all" into o->compare_mpi and o->compare_gloo. */
static bool parse_compare(const char *text, bench_opts *o)
{
    char buf[64];
    if (strlen(text) >= sizeof buf)
        return false;
    strcpy(buf, text);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        if (strcmp(item, "mpi") == 0)
            o->compare_mpi = true;
        else if (strcmp(item, "gloo") == 0)
            o->compare_gloo = true;
        else if (strcmp(item, "all") == 0)
            o->compare_mpi = o->compare_gloo = true;
        else
            return false;
    }
    return o->compare_mpi || o->compare_gloo;
}

static bool ranks_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    bench_opts *o = base;
    return parse_ranks(arg, o->ranks, &o->n_ranks);
}

static bool buckets_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    bench_opts *o = base;
    return parse_buckets(arg, o->buckets, &o->n_buckets);
}

static bool compare_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    return parse_compare(arg, base);
}

static bool ratios_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    bench_opts *o = base;
    const char *at = arg;
    char *end = NULL;
    o->n_ratios = 0;
    for (;;) {
        double r = strtod(at, &end);
        if (end == at || !(r > 0) || r > 1000 || o->n_ratios == BENCH_MAX_LIST ||
            (*end != ',' && *end != '\0'))
            return false;
        o->ratios[o->n_ratios++] = r;
        if (*end == '\0')
            return true;
        at = end + 1;
    }
}

/* the dtype's word, checked against the op after the parse (bench_check) */
static bool dtype_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    bench_opts *o = base;
    if (strlen(arg) >= sizeof o->dtype)
        return false;
    strcpy(o->dtype, arg);
    return true;
}

static void show_text(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)base;
    snprintf(buf, size, "%s", row->def_string);
}

#define F(field)    HX_OPT_FIELD(bench_opts, field)
#define MARK(field) HX_OPT_MARK(bench_opts, field)

enum {
    OPT_BUCKET = 256,
    OPT_TENSORS,
    OPT_COMPARE,
    OPT_MPIRUN,
    OPT_NO_BOUND,
    OPT_PYTHON,
    OPT_GLOO_SCRIPT,
    OPT_STAGED_COMMIT,
    OPT_GPU,
    OPT_JSON,
    OPT_OUT,
    OPT_COMPUTE_US,
    OPT_COMPUTE_RATIO,
    OPT_RANKS
};

static const hx_opt_name op_names[] = {{"allreduce", BENCH_ALLREDUCE},
                                       {"broadcast", BENCH_BROADCAST},
                                       {"reduce_scatter", BENCH_REDUCE_SCATTER},
                                       {"allgather", BENCH_ALLGATHER},
                                       {"reduce", BENCH_REDUCE},
                                       {"overlap", BENCH_OVERLAP},
                                       {NULL, 0}};
/* seldp-bench-mpi's: the first four */
static const hx_opt_name mpi_op_names[] = {{"allreduce", BENCH_ALLREDUCE},
                                           {"broadcast", BENCH_BROADCAST},
                                           {"reduce_scatter", BENCH_REDUCE_SCATTER},
                                           {"allgather", BENCH_ALLGATHER},
                                           {NULL, 0}};

/* seldp-bench's options; `mpi` marks the ones seldp-bench-mpi has too. */
static const struct bench_row_def {
    hx_opt_row row;
    bool mpi;
} bench_rows[] = {
    {{.opt = {"minbytes", required_argument, NULL, 'b'},
      .kind = HX_OPT_SIZE,
      F(min_bytes),
      .def = 1 << 20,
      .metavar = "SIZE",
      .help = "smallest size per rank (reduce: 512M; overlap: 16M)",
      .mark = {MARK(sizes_given)}},
     true},
    {{.opt = {"maxbytes", required_argument, NULL, 'e'},
      .kind = HX_OPT_SIZE,
      F(max_bytes),
      .def = 64 << 20,
      .metavar = "SIZE",
      .help = "largest size per rank (reduce: 512M; overlap: 16M)",
      .mark = {MARK(sizes_given)}},
     true},
    {{.opt = {"stepfactor", required_argument, NULL, 'f'},
      .kind = HX_OPT_DOUBLE,
      F(factor),
      .dmin = 1.0,
      .dmax = 1e6,
      .open_min = true,
      .def_double = 2.0,
      .metavar = "F",
      .help = "size factor from one row to the next",
      .expect = "a factor > 1"},
     true},
    {{.opt = {"iters", required_argument, NULL, 'n'},
      .kind = HX_OPT_INT,
      F(iters),
      .min = 1,
      .max = 1000000,
      .def = 10,
      .metavar = "N",
      .help = "timed samples per size, reported as their median",
      .expect = "a count (>= 1)"},
     true},
    {{.opt = {"warmup", required_argument, NULL, 'w'},
      .kind = HX_OPT_INT,
      F(warmup),
      .min = 0,
      .max = 1000000,
      .def = 2,
      .metavar = "N",
      .help = "untimed iterations before the samples",
      .expect = "a count (>= 0)"},
     true},
    {{.opt = {"op", required_argument, NULL, 'o'},
      .kind = HX_OPT_ENUM,
      F(op),
      .names = op_names,
      .def = BENCH_ALLREDUCE,
      .metavar = "OP",
      .help = "allreduce | broadcast | reduce_scatter | allgather | reduce | overlap. "
              "reduce_scatter: seldp_comm_reduce_scatter of SIZE bytes per rank, each rank "
              "receiving its SIZE/P; allgather: seldp_comm_allgather_counts of SIZE/P per rank "
              "into SIZE (--compare mpi: MPI_Reduce_scatter_block, MPI_Allgather). reduce: "
              "seldp_session_reduce of a selection of --tensors tensors totalling SIZE bytes per "
              "rank, beside one raw F32 allreduce of the same bytes; peak RSS reported. overlap: "
              "a backward of SIZE/bucket layers, each --compute-us of sleep before its gradient "
              "is marked ready, overlapped with seldp_session_reduce_start/finish, beside "
              "compute alone, communication alone and both in series (default 16M, 1M "
              "buckets); the default session (in place) and a staged one "
              "(cfg.overlap_in_place = false: the comm_staged and staged rows); overlapped rows "
              "are timed against max(compute, the fastest communication of the same bytes)"},
     true},
    {{.opt = {"compute-us", required_argument, NULL, OPT_COMPUTE_US},
      .kind = HX_OPT_DOUBLE,
      F(compute_us),
      .dmin = 0.0,
      .dmax = 1e7,
      .def_double = 1000.0,
      .metavar = "US",
      .help = "overlap: the backward of one layer",
      .expect = "0 to 10000000"},
     false},
    {{.opt = {"compute-ratio", required_argument, NULL, OPT_COMPUTE_RATIO},
      .kind = HX_OPT_CUSTOM,
      .parse = ratios_parse,
      .metavar = "LIST",
      .help = "overlap, instead of --compute-us: the whole backward R times the communication "
              "alone (measured first: the median of 3 runs of the default session), for each R "
              "in the list (0.5,1,2)",
      .def_string = "none: --compute-us",
      .show = show_text,
      .expect = "up to 64 ratios above 0 and up to 1000, separated by commas"},
     false},
    {{.opt = {"ranks", required_argument, NULL, OPT_RANKS},
      .kind = HX_OPT_CUSTOM,
      .store = HX_OPT_CUSTOM,
      .parse = ranks_parse,
      .def_string = "2",
      .metavar = "LIST",
      .help = "simulated ranks: 2, or 2,4, or 1-16 (long only: -r is --repeat)",
      .expect = "2, 2,4 or 1-16 (1 to 1024 ranks)",
      .mark = {MARK(ranks_given)}},
     false},
    {{.opt = {"repeat", required_argument, NULL, 'r'},
      .kind = HX_OPT_INT,
      F(repeat),
      .min = 1,
      .max = 1000,
      .def = 1,
      .metavar = "N",
      .help = "the whole measurement N times (1 to 1000): each row is the median of the N "
              "repetitions' times, its bound fraction the median of theirs (each against its "
              "own B), with the spread (slowest - fastest) / median, the fastest and slowest "
              "time and the range of the fractions (table note; JSON repeats, time_min_us, "
              "time_max_us, spread, bound_fraction_min, bound_fraction_max; CSV the same)",
      .expect = "a repeat count from 1 to 1000 (the ranks are --ranks)"},
     false},
    {{.opt = {"dtype", required_argument, NULL, 'd'},
      .kind = HX_OPT_CUSTOM,
      .parse = dtype_parse,
      .def_string = "f32; reduce: mixed",
      .show = show_text,
      .metavar = "DTYPE",
      .help = "allreduce: f32; reduce: mixed | f32 | bf16 | f16 (mixed: half the tensors BF16, "
              "half F32)",
      .expect = "mixed, f32, bf16 or f16"},
     false},
    {{.opt = {"bucket", required_argument, NULL, OPT_BUCKET},
      .kind = HX_OPT_CUSTOM,
      .store = HX_OPT_CUSTOM,
      .parse = buckets_parse,
      .def_string = "25M",
      .metavar = "LIST",
      .help = "reduce: session bucket sizes, e.g. 25M or 1M-256M (doubling); a list sweeps, each "
              "with a bucketed raw allreduce beside it (overlap: 1M)",
      .expect = "sizes such as 25M, 1M,4M or 1M-256M",
      .mark = {MARK(buckets_given)}},
     false},
    {{.opt = {"tensors", required_argument, NULL, OPT_TENSORS},
      .kind = HX_OPT_INT,
      F(tensors),
      .min = 1,
      .max = 10000000,
      .def = 10000,
      .metavar = "N",
      .help = "reduce: tensors in the selection",
      .expect = "1 to 10000000"},
     false},
    {{.opt = {"compare", required_argument, NULL, OPT_COMPARE},
      .kind = HX_OPT_CUSTOM,
      .parse = compare_parse,
      .metavar = "LIST",
      .help = "mpi, gloo or mpi,gloo (all): beside seldp, in the same run, mpi: seldp-bench-mpi "
              "under mpirun (--oversubscribe; as root --allow-run-as-root); gloo: "
              "torch.distributed's gloo backend (seldp-bench-gloo.py, P processes), skipped with "
              "a note when python3 cannot import torch; same ranks, sizes and timing rule",
      .expect = "mpi, gloo, mpi,gloo or all"},
     false},
    {{.opt = {"mpirun", required_argument, NULL, OPT_MPIRUN},
      .kind = HX_OPT_STRING,
      F(mpirun),
      .def_string = "mpirun",
      .metavar = "PATH",
      .help = "the MPI launcher"},
     false},
    {{.opt = {"python", required_argument, NULL, OPT_PYTHON},
      .kind = HX_OPT_STRING,
      F(python),
      .metavar = "PATH",
      .help = "the interpreter for --compare gloo (none: python3, then /usr/bin/python3, the "
              "first that imports torch with gloo)"},
     false},
    {{.opt = {"gloo-script", required_argument, NULL, OPT_GLOO_SCRIPT},
      .kind = HX_OPT_STRING,
      F(gloo_script),
      .metavar = "PATH",
      .help = "the gloo program (none: seldp-bench-gloo.py beside this executable)"},
     false},
    {{.opt = {"staged-commit", no_argument, NULL, OPT_STAGED_COMMIT},
      .kind = HX_OPT_FLAG,
      F(staged_commit),
      .help = "reduce: the sessions set cfg.staged_commit (the rows say \"staged\"): run with "
              "and without to measure what it costs"},
     false},
    {{.opt = {"no-bound", no_argument, NULL, OPT_NO_BOUND},
      .kind = HX_OPT_FLAG,
      F(bound),
      .def = 1,
      .help = "no copy rows and no bound fractions"},
     false},
    {{.opt = {"gpu", no_argument, NULL, OPT_GPU},
      .kind = HX_OPT_FLAG,
      F(gpu),
      .help = "the GPU rows: NCCL (raw ncclAllReduce, seldp's allreduce and reduce) and "
              "host-staged with device buffers; says so and skips when there is no GPU"},
     false},
    {{.opt = {"json", no_argument, NULL, OPT_JSON},
      .kind = HX_OPT_FLAG,
      F(json),
      .help = "one JSON object per line instead of the table"},
     true},
    {{.opt = {"out", required_argument, NULL, OPT_OUT},
      .kind = HX_OPT_STRING,
      F(out),
      .metavar = "PREFIX",
      .help = "also write PREFIX.jsonl and PREFIX.csv"},
     false},
    {{.opt = {"help", no_argument, NULL, 'h'}, .kind = HX_OPT_ACTION, .help = "this text"}, true},
};
#define N_BENCH_ROWS (sizeof bench_rows / sizeof bench_rows[0])

/* The table of seldp-bench, or of seldp-bench-mpi (its rows, --op with the MPI ops only). */
static hx_opt_table bench_table(bool mpi, hx_opt_row *rows)
{
    size_t n = 0;
    for (size_t i = 0; i < N_BENCH_ROWS; i++) {
        if (mpi && !bench_rows[i].mpi)
            continue;
        rows[n] = bench_rows[i].row;
        if (mpi && rows[n].opt.val == 'o')
            rows[n].names = mpi_op_names;
        n++;
    }
    return (hx_opt_table){rows, n, mpi ? "seldp-bench-mpi" : "seldp-bench", NULL, 0};
}

/* The rules between options and the defaults that depend on --op. */
static int bench_check(bench_opts *o, const char *prog)
{
    if (o->op == BENCH_REDUCE && !o->sizes_given)
        o->min_bytes = o->max_bytes = (size_t)512 << 20;
    if (o->op == BENCH_OVERLAP && !o->sizes_given)
        o->min_bytes = o->max_bytes = (size_t)16 << 20;
    if (o->op == BENCH_OVERLAP && !o->buckets_given)
        o->buckets[0] = (size_t)1 << 20;
    if (o->dtype[0] == '\0')
        strcpy(o->dtype, o->op == BENCH_REDUCE ? "mixed" : "f32");
    if (o->op == BENCH_REDUCE ? strcmp(o->dtype, "mixed") && strcmp(o->dtype, "f32") &&
                                    strcmp(o->dtype, "bf16") && strcmp(o->dtype, "f16")
                              : strcmp(o->dtype, "f32") != 0) {
        fprintf(stderr, "%s: --dtype '%s': expected %s\n", prog, o->dtype,
                o->op == BENCH_REDUCE ? "mixed, f32, bf16 or f16" : "f32 (F32 SUM)");
        return 2;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "%s: -b is larger than -e\n", prog);
        return 2;
    }
    if (o->min_bytes < 4)
        o->min_bytes = 4;
    return 0;
}

int bench_parse(int argc, char **argv, bench_opts *o, bool mpi)
{
    hx_opt_row rows[N_BENCH_ROWS];
    hx_opt_table t = bench_table(mpi, rows);
    memset(o, 0, sizeof *o);
    hx_opt_defaults(&t, o);
    const hx_opt_row *action = NULL;
    switch (hx_opt_parse(&t, argc, argv, o, NULL, &action, stderr)) {
    case HX_OPT_DONE:
        bench_usage(stdout, mpi);
        return 1;
    case HX_OPT_BAD:
        return 2;
    default:
        return bench_check(o, t.prog);
    }
}

void bench_usage(FILE *f, bool mpi)
{
    hx_opt_row rows[N_BENCH_ROWS];
    hx_opt_table t = bench_table(mpi, rows);
    if (mpi)
        fputs("usage: mpirun -np P seldp-bench-mpi [options]\n"
              "Open MPI's MPI_Allreduce (F32 SUM), MPI_Bcast, MPI_Reduce_scatter_block (F32 SUM)\n"
              "or MPI_Allgather over P processes, timed and\n"
              "validated like seldp-bench (which launches it with --compare mpi).\n\n",
              f);
    else
        fputs("usage: seldp-bench [options]\n"
              "Times seldp's host-staged collectives (one thread per simulated rank) with "
              "nccl-tests\n"
              "conventions, validates every result, and sets them against the memory-bandwidth "
              "bound\n"
              "B, the machine's best copy bandwidth measured in the same run: every rank copies "
              "its own\n"
              "buffer of the same size at once, with non-temporal stores (the `stream` rows) and "
              "with\n"
              "memcpy (the `memcpy` rows: it reads each destination line before writing it, so "
              "it\n"
              "understates B), counted as bytes read + written per second; B = the better of the "
              "two.\n\n",
              f);
    for (size_t i = 0; i < t.n; i++) {
        hx_opt_row r = t.rows[i];
        if (mpi && r.opt.val == 'o') /* the MPI ops' help only */
            r.help = "allreduce | broadcast | reduce_scatter | allgather";
        hx_opt_print_row(&r, f, true, r.kind != HX_OPT_ACTION);
    }
    if (mpi)
        return;
    fputc('\n', f);
    fputs(
        "SIZE takes K, M and G (powers of 1024). A sample is one operation from 1 MiB up and a\n"
        "batch of up to 1000 below (1 MiB / size); time is the median sample per operation.\n"
        "Columns: size, time, algbw = size / time, busbw (allreduce and reduce: algbw * 2(n-1)/n;\n"
        "reduce_scatter and allgather: algbw * (n-1)/n; broadcast: algbw; copy rows: their copy\n"
        "bandwidth 2*n*size / time), bound % = bound time / time where the bound time is\n"
        "2*n*size / B for an allreduce, n*size / B for a broadcast and (n+1)*size / B for a\n"
        "reduce_scatter (every input read once, every rank's size/n written once) and an\n"
        "allgather (every size/n block read once, written into n outputs), B(GB/s) = the B it\n"
        "is against, #wrong = elements that differ from the expected result on any rank. Sizes\n"
        "of reduce_scatter and allgather rows are rounded down to whole elements of every rank.\n"
        "JSON keys: op, impl (seldp-host, seldp-nccl, nccl, mpi,\n"
        "gloo, memcpy, stream), ranks, bytes, time_us, algbw_GBps, busbw_GBps, bound_fraction,\n"
        "wrong, bound_GBps, memcpy_GBps and stream_GBps (rows with a bound), and for reduce rows\n"
        "dtype, bucket_bytes, tensors, raw_time_us, peak_rss, rss_extra_per_rank,\n"
        "rss_budget_per_rank.\n"
        "The rank threads are pinned one per core when they fit; SELDP_BENCH_PIN=0 leaves them\n"
        "to the scheduler (a machine shared with other work: a pinned rank cannot leave a core\n"
        "another process holds).\n"
        "With SELDP_DEBUG_COLLECTIVES=1 in the environment every seldp collective first agrees\n"
        "on its fingerprint (the debug mode of seldp/comm.h), and the seldp rows say \"debug\":\n"
        "run twice, with and without, to measure what the mode costs.\n",
        f);
}
