/* seldp-bench: timing rule, patterns and output shared by seldp-bench and seldp-bench-mpi
 * (see bench.h; their options are help.c's). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "env.h"

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
    if (strncmp(impl, "seldp", 5) == 0 && seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES))
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
