/* seldp-bench: options, timing rule, patterns and output shared by seldp-bench and
 * seldp-bench-mpi (see bench.h). */
#define _GNU_SOURCE /* getopt_long */

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static const char *const op_names[] = {[BENCH_ALLREDUCE] = "allreduce",
                                       [BENCH_BROADCAST] = "broadcast",
                                       [BENCH_REDUCE] = "reduce",
                                       [BENCH_OVERLAP] = "overlap",
                                       [BENCH_REDUCE_SCATTER] = "reduce_scatter",
                                       [BENCH_ALLGATHER] = "allgather"};

const char *bench_op_name(bench_op op)
{
    return op_names[op];
}

bool bench_parse_size(const char *text, size_t *out)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || !(v >= 0))
        return false;
    double scale = 1;
    switch (*end) {
    case 'k':
    case 'K':
        scale = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        scale = 1024.0 * 1024.0;
        end++;
        break;
    case 'g':
    case 'G':
        scale = 1024.0 * 1024.0 * 1024.0;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0' || v * scale > 1e15)
        return false;
    *out = (size_t)(v * scale);
    return true;
}

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
        if (!bench_parse_size(item, &a) || a == 0)
            return false;
        b = a;
        if (dash && (!bench_parse_size(dash + 1, &b) || b < a))
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

int bench_parse(int argc, char **argv, bench_opts *o, bool mpi)
{
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
    static const struct option longs[] = {
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'},
        {"op", required_argument, NULL, 'o'},
        {"ranks", required_argument, NULL, OPT_RANKS},
        {"repeat", required_argument, NULL, 'r'},
        {"dtype", required_argument, NULL, 'd'},
        {"bucket", required_argument, NULL, OPT_BUCKET},
        {"tensors", required_argument, NULL, OPT_TENSORS},
        {"compare", required_argument, NULL, OPT_COMPARE},
        {"mpirun", required_argument, NULL, OPT_MPIRUN},
        {"no-bound", no_argument, NULL, OPT_NO_BOUND},
        {"python", required_argument, NULL, OPT_PYTHON},
        {"gloo-script", required_argument, NULL, OPT_GLOO_SCRIPT},
        {"staged-commit", no_argument, NULL, OPT_STAGED_COMMIT},
        {"gpu", no_argument, NULL, OPT_GPU},
        {"json", no_argument, NULL, OPT_JSON},
        {"out", required_argument, NULL, OPT_OUT},
        {"compute-us", required_argument, NULL, OPT_COMPUTE_US},
        {"compute-ratio", required_argument, NULL, OPT_COMPUTE_RATIO},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *prog = mpi ? "seldp-bench-mpi" : "seldp-bench";
    bool sizes_given = false, buckets_given = false;
    int c;

    memset(o, 0, sizeof *o);
    o->min_bytes = (size_t)1 << 20;
    o->max_bytes = (size_t)64 << 20;
    o->factor = 2;
    o->iters = 10;
    o->warmup = 2;
    o->op = BENCH_ALLREDUCE;
    o->ranks[0] = 2;
    o->n_ranks = 1;
    o->buckets[0] = (size_t)25 << 20;
    o->n_buckets = 1;
    o->tensors = 10000;
    o->bound = true;
    o->mpirun = "mpirun";
    o->python = NULL; /* python3, then /usr/bin/python3 (compare.c) */
    o->compute_us = 1000;
    o->repeat = 1;
    strcpy(o->dtype, "");

    optind = 1;
    while ((c = getopt_long(argc, argv, "b:e:f:n:w:o:r:d:h", longs, NULL)) != -1) {
        bool mpi_ok = c == 'b' || c == 'e' || c == 'f' || c == 'n' || c == 'w' || c == 'o' ||
                      c == 'h' || c == OPT_JSON;
        if (mpi && !mpi_ok)
            c = '?';
        switch (c) {
        case 'b':
        case 'e':
            if (!bench_parse_size(optarg, c == 'b' ? &o->min_bytes : &o->max_bytes)) {
                fprintf(stderr, "%s: -%c %s: expected a size such as 8, 64K or 256M\n", prog, c,
                        optarg);
                return 2;
            }
            sizes_given = true;
            break;
        case 'f':
            o->factor = strtod(optarg, NULL);
            if (!(o->factor > 1)) {
                fprintf(stderr, "%s: -f %s: expected a factor > 1\n", prog, optarg);
                return 2;
            }
            break;
        case 'n':
        case 'w': {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || v < (c == 'n' ? 1 : 0) || v > 1000000) {
                fprintf(stderr, "%s: -%c %s: expected a count (%s)\n", prog, c, optarg,
                        c == 'n' ? ">= 1" : ">= 0");
                return 2;
            }
            *(c == 'n' ? &o->iters : &o->warmup) = (int)v;
            break;
        }
        case 'o':
            if (strcmp(optarg, "allreduce") == 0)
                o->op = BENCH_ALLREDUCE;
            else if (strcmp(optarg, "broadcast") == 0)
                o->op = BENCH_BROADCAST;
            else if (strcmp(optarg, "reduce_scatter") == 0)
                o->op = BENCH_REDUCE_SCATTER;
            else if (strcmp(optarg, "allgather") == 0)
                o->op = BENCH_ALLGATHER;
            else if (strcmp(optarg, "reduce") == 0 && !mpi)
                o->op = BENCH_REDUCE;
            else if (strcmp(optarg, "overlap") == 0 && !mpi)
                o->op = BENCH_OVERLAP;
            else {
                fprintf(stderr,
                        "%s: --op %s: expected allreduce, broadcast, reduce_scatter, allgather%s\n",
                        prog, optarg, mpi ? "" : ", reduce or overlap");
                return 2;
            }
            break;
        case 'r': {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || v < 1 || v > 1000) {
                fprintf(stderr,
                        "%s: -r %s: expected a repeat count from 1 to 1000 (the ranks are "
                        "--ranks)\n",
                        prog, optarg);
                return 2;
            }
            o->repeat = (int)v;
            break;
        }
        case OPT_RANKS:
            o->ranks_given = true;
            if (!parse_ranks(optarg, o->ranks, &o->n_ranks)) {
                fprintf(stderr, "%s: --ranks %s: expected 2, 2,4 or 1-16 (1 to 1024 ranks)\n", prog,
                        optarg);
                return 2;
            }
            break;
        case 'd':
            if (strlen(optarg) >= sizeof o->dtype) {
                fprintf(stderr, "%s: --dtype %s: unknown\n", prog, optarg);
                return 2;
            }
            strcpy(o->dtype, optarg);
            break;
        case OPT_BUCKET:
            if (!parse_buckets(optarg, o->buckets, &o->n_buckets)) {
                fprintf(stderr, "%s: --bucket %s: expected sizes such as 25M, 1M,4M or 1M-256M\n",
                        prog, optarg);
                return 2;
            }
            buckets_given = true;
            break;
        case OPT_TENSORS: {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || v < 1 || v > 10000000) {
                fprintf(stderr, "%s: --tensors %s: expected 1 to 10000000\n", prog, optarg);
                return 2;
            }
            o->tensors = (int)v;
            break;
        }
        case OPT_COMPARE:
            if (!parse_compare(optarg, o)) {
                fprintf(stderr, "%s: --compare %s: expected mpi, gloo, mpi,gloo or all\n", prog,
                        optarg);
                return 2;
            }
            break;
        case OPT_PYTHON:
            o->python = optarg;
            break;
        case OPT_GLOO_SCRIPT:
            o->gloo_script = optarg;
            break;
        case OPT_STAGED_COMMIT:
            o->staged_commit = true;
            break;
        case OPT_MPIRUN:
            o->mpirun = optarg;
            break;
        case OPT_NO_BOUND:
            o->bound = false;
            break;
        case OPT_GPU:
            o->gpu = true;
            break;
        case OPT_JSON:
            o->json = true;
            break;
        case OPT_OUT:
            o->out = optarg;
            break;
        case OPT_COMPUTE_US: {
            char *end = NULL;
            o->compute_us = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(o->compute_us >= 0) || o->compute_us > 1e7) {
                fprintf(stderr, "%s: --compute-us %s: expected 0 to 10000000\n", prog, optarg);
                return 2;
            }
            break;
        }
        case OPT_COMPUTE_RATIO: {
            char *at = optarg, *end = NULL;
            o->n_ratios = 0;
            for (;;) {
                double r = strtod(at, &end);
                if (end == at || !(r > 0) || r > 1000 || o->n_ratios == BENCH_MAX_LIST ||
                    (*end != ',' && *end != '\0')) {
                    fprintf(stderr,
                            "%s: --compute-ratio %s: expected up to %d ratios above 0 and up to "
                            "1000, separated by commas\n",
                            prog, optarg, BENCH_MAX_LIST);
                    return 2;
                }
                o->ratios[o->n_ratios++] = r;
                if (*end == '\0')
                    break;
                at = end + 1;
            }
            break;
        }
        case 'h':
            bench_usage(stdout, mpi);
            return 1;
        default:
            fprintf(stderr, "%s: unknown option (see %s --help)\n", prog, prog);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", prog, argv[optind], prog);
        return 2;
    }
    if (o->op == BENCH_REDUCE && !sizes_given)
        o->min_bytes = o->max_bytes = (size_t)512 << 20;
    if (o->op == BENCH_OVERLAP && !sizes_given)
        o->min_bytes = o->max_bytes = (size_t)16 << 20;
    if (o->op == BENCH_OVERLAP && !buckets_given)
        o->buckets[0] = (size_t)1 << 20;
    if (o->dtype[0] == '\0')
        strcpy(o->dtype, o->op == BENCH_REDUCE ? "mixed" : "f32");
    if (o->op == BENCH_REDUCE ? strcmp(o->dtype, "mixed") && strcmp(o->dtype, "f32") &&
                                    strcmp(o->dtype, "bf16") && strcmp(o->dtype, "f16")
                              : strcmp(o->dtype, "f32") != 0) {
        fprintf(stderr, "%s: --dtype %s: expected %s\n", prog, o->dtype,
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

size_t bench_next_size(size_t bytes, double factor)
{
    double next = (double)bytes * factor;
    return next > (double)bytes + 1 ? (size_t)next : bytes + 1;
}

int bench_batch(size_t bytes)
{
    size_t k = ((size_t)1 << 20) / (bytes ? bytes : 1);
    return k < 1 ? 1 : k > 1000 ? 1000 : (int)k;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *samples, int n)
{
    qsort(samples, (size_t)n, sizeof *samples, cmp_double);
    return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

float bench_pattern(int rank, size_t i)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(rank + 1) * 40503u;
    h ^= h >> 15;
    return (float)((int)(h & 127u) - 64);
}

void bench_fill(float *x, size_t n, int rank, size_t first)
{
    for (size_t i = 0; i < n; i++)
        x[i] = bench_pattern(rank, first + i);
}

bench_row bench_row_make(const char *op, const char *impl, int ranks, size_t bytes)
{
    bench_row row;
    memset(&row, 0, sizeof row);
    snprintf(row.op, sizeof row.op, "%s", op);
    snprintf(row.impl, sizeof row.impl, "%s", impl);
    row.ranks = ranks;
    row.bytes = bytes;
    row.bound_fraction = NAN;
    row.raw_time_us = NAN;
    row.memcpy_GBps = row.stream_GBps = row.bound_GBps = NAN;
    row.peak_rss = row.rss_extra_per_rank = row.rss_budget_per_rank = -1;
    row.repeats = 1;
    row.time_min_us = row.time_max_us = row.bound_min = row.bound_max = row.over_max = NAN;
    /* the rows of seldp's communicators, in the debug mode of the collectives */
    const char *debug = getenv("SELDP_DEBUG_COLLECTIVES");
    if (strncmp(impl, "seldp", 5) == 0 && debug && *debug && strcmp(debug, "0") != 0)
        snprintf(row.note, sizeof row.note, "debug");
    return row;
}

bool bench_is_copy(const char *impl)
{
    return strcmp(impl, "memcpy") == 0 || strcmp(impl, "stream") == 0;
}

size_t bench_count(bench_op op, size_t bytes, int ranks)
{
    size_t count = bytes / 4;
    if (op == BENCH_REDUCE_SCATTER || op == BENCH_ALLGATHER)
        count = count / (size_t)ranks * (size_t)ranks;
    return count;
}

/* A reduce-scatter's or an all-gather's row: each rank holds a 1/n block of the size. */
static bool is_sharded(const char *op)
{
    return strcmp(op, "reduce_scatter") == 0 || strcmp(op, "allgather") == 0;
}

double bench_bound_bytes(const char *op, int ranks, size_t bytes)
{
    double n = ranks, N = (double)bytes;
    if (strcmp(op, "broadcast") == 0)
        return n * N;
    if (is_sharded(op))
        return (n + 1.0) * N;
    return 2.0 * n * N;
}

void bench_row_finish(bench_row *row, double copy_GBps)
{
    double n = row->ranks, seconds = row->time_us * 1e-6;
    bool broadcast = strcmp(row->op, "broadcast") == 0;
    row->algbw = seconds > 0 ? (double)row->bytes / seconds / 1e9 : 0;
    if (bench_is_copy(row->impl)) {
        row->busbw = seconds > 0 ? 2.0 * n * (double)row->bytes / seconds / 1e9 : 0;
        return;
    }
    row->busbw = broadcast             ? row->algbw
                 : is_sharded(row->op) ? row->algbw * (n - 1) / n
                                       : row->algbw * 2.0 * (n - 1) / n;
    if (copy_GBps > 0 && seconds > 0) {
        double moved = bench_bound_bytes(row->op, row->ranks, row->bytes);
        row->bound_fraction = moved / (copy_GBps * 1e9) / seconds;
        row->bound_GBps = copy_GBps;
    }
}

void bench_row_finish_bound(bench_row *row, double memcpy_GBps, double stream_GBps)
{
    row->memcpy_GBps = memcpy_GBps > 0 ? memcpy_GBps : NAN;
    row->stream_GBps = stream_GBps > 0 ? stream_GBps : NAN;
    double best = memcpy_GBps > 0 ? memcpy_GBps : 0;
    if (stream_GBps > best)
        best = stream_GBps;
    bench_row_finish(row, best);
}

const char *bench_size_str(size_t bytes, char *buf, size_t size)
{
    if (bytes >= (size_t)1 << 30)
        snprintf(buf, size, "%.1f GiB", (double)bytes / (double)((size_t)1 << 30));
    else if (bytes >= (size_t)1 << 20)
        snprintf(buf, size, "%.1f MiB", (double)bytes / (double)((size_t)1 << 20));
    else if (bytes >= 1024)
        snprintf(buf, size, "%.1f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, size, "%zu B", bytes);
    return buf;
}

void bench_print_header(FILE *f, const char *title)
{
    fprintf(f, "# %s\n", title);
    fprintf(f, "# %-9s %5s %11s %-11s %11s %11s %11s %7s %8s %7s  %s\n", "op", "ranks", "size",
            "impl", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "bound%", "B(GB/s)", "#wrong",
            "note");
}

void bench_print_row(FILE *f, const bench_row *r)
{
    char size[32], bound[16], B[16] = "-", note[256] = "";
    bench_size_str(r->bytes, size, sizeof size);
    if (isnan(r->bound_fraction))
        snprintf(bound, sizeof bound, "%s", "-");
    else
        snprintf(bound, sizeof bound, "%.1f", 100.0 * r->bound_fraction);
    if (!isnan(r->bound_GBps))
        snprintf(B, sizeof B, "%.2f", r->bound_GBps);
    size_t used = 0;
    if (r->note[0])
        used += (size_t)snprintf(note + used, sizeof note - used, "%s ", r->note);
    if (r->bucket_bytes && used < sizeof note)
        used += (size_t)snprintf(note + used, sizeof note - used, "bucket %zu MiB ",
                                 r->bucket_bytes >> 20);
    if (!isnan(r->raw_time_us) && used < sizeof note)
        used += (size_t)snprintf(note + used, sizeof note - used, "%.2fx raw ",
                                 r->time_us / r->raw_time_us);
    if (r->repeats > 1 && used < sizeof note) {
        used += (size_t)snprintf(note + used, sizeof note - used,
                                 "median of %d, spread %.1f%% (%.1f-%.1f us", r->repeats,
                                 100.0 * bench_spread(r), r->time_min_us, r->time_max_us);
        if (!isnan(r->bound_min) && used < sizeof note)
            used += (size_t)snprintf(note + used, sizeof note - used, ", bound %.1f-%.1f%%",
                                     100.0 * r->bound_min, 100.0 * r->bound_max);
        if (used < sizeof note)
            used += (size_t)snprintf(note + used, sizeof note - used, ") ");
    }
    if (r->rss_extra_per_rank >= 0 && used < sizeof note)
        snprintf(note + used, sizeof note - used, "+%.1f MiB/rank (budget %.1f)",
                 (double)r->rss_extra_per_rank / 1048576.0,
                 (double)r->rss_budget_per_rank / 1048576.0);
    fprintf(f, "  %-9s %5d %11s %-11s %11.1f %11.2f %11.2f %7s %8s %7lld  %s\n", r->op, r->ranks,
            size, r->impl, r->time_us, r->algbw, r->busbw, bound, B, r->wrong, note);
}

double bench_spread(const bench_row *r)
{
    if (r->repeats <= 1 || !(r->time_us > 0))
        return 0;
    return (r->time_max_us - r->time_min_us) / r->time_us;
}

static void json_number(FILE *f, const char *key, double v)
{
    if (isnan(v) || isinf(v))
        fprintf(f, ",\"%s\":null", key);
    else
        fprintf(f, ",\"%s\":%.6g", key, v);
}

void bench_print_json(FILE *f, const bench_row *r)
{
    fprintf(f, "{\"op\":\"%s\",\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%zu", r->op, r->impl,
            r->ranks, r->bytes);
    json_number(f, "time_us", r->time_us);
    json_number(f, "algbw_GBps", r->algbw);
    json_number(f, "busbw_GBps", r->busbw);
    json_number(f, "bound_fraction", r->bound_fraction);
    fprintf(f, ",\"wrong\":%lld", r->wrong);
    if (!isnan(r->bound_GBps)) {
        json_number(f, "bound_GBps", r->bound_GBps);
        json_number(f, "memcpy_GBps", r->memcpy_GBps);
        json_number(f, "stream_GBps", r->stream_GBps);
    }
    if (r->dtype[0])
        fprintf(f, ",\"dtype\":\"%s\"", r->dtype);
    if (r->bucket_bytes)
        fprintf(f, ",\"bucket_bytes\":%zu", r->bucket_bytes);
    if (r->tensors)
        fprintf(f, ",\"tensors\":%d", r->tensors);
    if (!isnan(r->raw_time_us))
        json_number(f, "raw_time_us", r->raw_time_us);
    if (r->peak_rss >= 0)
        fprintf(f, ",\"peak_rss\":%lld", r->peak_rss);
    if (r->rss_extra_per_rank >= 0)
        fprintf(f, ",\"rss_extra_per_rank\":%lld,\"rss_budget_per_rank\":%lld",
                r->rss_extra_per_rank, r->rss_budget_per_rank);
    if (r->note[0])
        fprintf(f, ",\"note\":\"%s\"", r->note);
    if (!isnan(r->over_max))
        json_number(f, "over_max", r->over_max);
    if (r->repeats > 1) {
        fprintf(f, ",\"repeats\":%d", r->repeats);
        json_number(f, "time_min_us", r->time_min_us);
        json_number(f, "time_max_us", r->time_max_us);
        json_number(f, "spread", bench_spread(r));
        if (!isnan(r->bound_min)) {
            json_number(f, "bound_fraction_min", r->bound_min);
            json_number(f, "bound_fraction_max", r->bound_max);
        }
    }
    fputs("}\n", f);
}

void bench_print_csv_header(FILE *f)
{
    fputs("op,impl,ranks,bytes,time_us,algbw_GBps,busbw_GBps,bound_fraction,wrong,dtype,"
          "bucket_bytes,tensors,raw_time_us,peak_rss,rss_extra_per_rank,rss_budget_per_rank,"
          "note,bound_GBps,memcpy_GBps,stream_GBps,repeats,time_min_us,time_max_us,spread,"
          "bound_fraction_min,bound_fraction_max,over_max\n",
          f);
}

static void csv_number(FILE *f, double v)
{
    if (!isnan(v))
        fprintf(f, "%.6g", v);
    fputc(',', f);
}

static void csv_count(FILE *f, long long v)
{
    if (v >= 0)
        fprintf(f, "%lld", v);
    fputc(',', f);
}

void bench_print_csv(FILE *f, const bench_row *r)
{
    fprintf(f, "%s,%s,%d,%zu,", r->op, r->impl, r->ranks, r->bytes);
    csv_number(f, r->time_us);
    csv_number(f, r->algbw);
    csv_number(f, r->busbw);
    csv_number(f, r->bound_fraction);
    fprintf(f, "%lld,%s,", r->wrong, r->dtype);
    csv_count(f, r->bucket_bytes ? (long long)r->bucket_bytes : -1);
    csv_count(f, r->tensors ? r->tensors : -1);
    csv_number(f, r->raw_time_us);
    csv_count(f, r->peak_rss);
    csv_count(f, r->rss_extra_per_rank);
    csv_count(f, r->rss_budget_per_rank);
    for (const char *c = r->note; *c; c++) /* a note never splits the row's columns */
        fputc(*c == ',' ? ';' : *c, f);
    fputc(',', f);
    csv_number(f, r->bound_GBps);
    csv_number(f, r->memcpy_GBps);
    csv_number(f, r->stream_GBps);
    fprintf(f, "%d,", r->repeats);
    bool repeated = r->repeats > 1;
    csv_number(f, repeated ? r->time_min_us : r->time_us);
    csv_number(f, repeated ? r->time_max_us : r->time_us);
    csv_number(f, repeated ? bench_spread(r) : 0.0);
    csv_number(f, repeated ? r->bound_min : r->bound_fraction);
    csv_number(f, repeated ? r->bound_max : r->bound_fraction);
    if (!isnan(r->over_max))
        fprintf(f, "%.6g", r->over_max);
    fputc('\n', f);
}
