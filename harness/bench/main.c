/* seldp-bench: the benchmark of docs/benchmarks.md. One driver over the rows of host.c (allreduce
 * and broadcast on simulated ranks), reduce.c (a session reduce of a realistic selection),
 * compare.c (Open MPI through seldp-bench-mpi, torch.distributed's gloo through
 * seldp-bench-gloo.py) and gpu.c (NCCL), printed as a table, JSON
 * lines and CSV. Exit status: 0; 1 when a measurement failed or a result was wrong; 2 on a
 * usage error. */
#define _GNU_SOURCE /* readlink */

#include <libgen.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "driver.h"

/* The directory of this executable, where seldp-bench-mpi lives too. */
static void self_dir(char *buf, size_t size)
{
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) {
        snprintf(buf, size, ".");
        return;
    }
    path[n] = '\0';
    snprintf(buf, size, "%s", dirname(path));
}

static double load_average(void)
{
    double load = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1)
            load = -1;
        fclose(f);
    }
    return load;
}

/* The machine's CPU time so far, in clock ticks (/proc/stat's first line): all of it, and the
 * part the hypervisor gave to other guests (steal). False where /proc/stat cannot be read. */
typedef struct cpu_ticks {
    long long total, steal;
} cpu_ticks;

static bool read_cpu_ticks(cpu_ticks *t)
{
    long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return false;
    int n = fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n < 8)
        return false;
    t->total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    t->steal = v[7];
    return true;
}

/* What else took the CPUs during a repetition: the hypervisor's steal as a share of the
 * machine's CPU time, and how often this process's threads were preempted (involuntary
 * context switches: another runnable thread, of this or another process, took the core). */
static void repetition_context(const cpu_ticks *t0, long long nivcsw0, char *buf, size_t size)
{
    cpu_ticks t1;
    struct rusage ru;
    long long nivcsw = getrusage(RUSAGE_SELF, &ru) == 0 ? (long long)ru.ru_nivcsw : -1;
    if (t0->total > 0 && read_cpu_ticks(&t1) && t1.total > t0->total)
        snprintf(buf, size, ", steal %.1f%% of the CPUs' time, %lld preemptions",
                 100.0 * (double)(t1.steal - t0->steal) / (double)(t1.total - t0->total),
                 nivcsw >= 0 && nivcsw0 >= 0 ? nivcsw - nivcsw0 : -1);
    else
        snprintf(buf, size, ", %lld preemptions",
                 nivcsw >= 0 && nivcsw0 >= 0 ? nivcsw - nivcsw0 : -1);
}

static int impl_order(const char *impl)
{
    static const char *const order[] = {"memcpy", "stream", "seldp-host", "seldp-nccl",
                                        "nccl",   "mpi",    "gloo"};
    const int n = (int)(sizeof order / sizeof order[0]);
    for (int i = 0; i < n; i++)
        if (strcmp(impl, order[i]) == 0)
            return i;
    return n;
}

/* Rows [from, n) by size, then implementation; stable, so a reduce's raw allreduce stays
 * before its reduce rows. */
static void sort_rows(bench_rows *rows, int from)
{
    for (int i = from + 1; i < rows->n; i++) {
        bench_row x = rows->at[i];
        int j = i;
        while (j > from && (rows->at[j - 1].bytes > x.bytes ||
                            (rows->at[j - 1].bytes == x.bytes &&
                             impl_order(rows->at[j - 1].impl) > impl_order(x.impl)))) {
            rows->at[j] = rows->at[j - 1];
            j--;
        }
        rows->at[j] = x;
    }
}

/* The row of `impl` with the op and size of s among rows [from, n), or NULL. */
static const bench_row *find_row(const bench_rows *rows, int from, const bench_row *s,
                                 const char *impl)
{
    for (int j = from; j < rows->n; j++) {
        const bench_row *m = &rows->at[j];
        if (strcmp(m->impl, impl) == 0 && m->bytes == s->bytes && strcmp(m->op, s->op) == 0)
            return m;
    }
    return NULL;
}

/* "12.34", or "-" for NAN */
static const char *cell(char *buf, size_t size, double v)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.2f", v);
    return buf;
}

/* seldp beside Open MPI and gloo, size by size, for the rows [from, n) of one rank count:
 * busbw of each and seldp's busbw over theirs. */
static void print_comparison(const bench_rows *rows, int from)
{
    bool header = false;
    for (int i = from; i < rows->n; i++) {
        const bench_row *s = &rows->at[i];
        if (strcmp(s->impl, "seldp-host") != 0)
            continue;
        const bench_row *m = find_row(rows, from, s, "mpi"), *g = find_row(rows, from, s, "gloo");
        if (!m && !g)
            continue;
        if (!header) {
            printf("# seldp-host beside Open MPI and gloo, %d ranks, %s (busbw GB/s; x = seldp's "
                   "busbw over theirs)\n",
                   s->ranks, s->op);
            printf("# %11s %11s %11s %7s %11s %7s %8s %8s\n", "size", "seldp", "mpi", "x mpi",
                   "gloo", "x gloo", "bound%", "B(GB/s)");
            header = true;
        }
        char size[32], c[6][32];
        printf("  %11s %11.2f %11s %7s %11s %7s %8s %8s\n",
               bench_size_str(s->bytes, size, sizeof size), s->busbw,
               cell(c[0], sizeof c[0], m ? m->busbw : NAN),
               cell(c[1], sizeof c[1], m && m->busbw > 0 ? s->busbw / m->busbw : NAN),
               cell(c[2], sizeof c[2], g ? g->busbw : NAN),
               cell(c[3], sizeof c[3], g && g->busbw > 0 ? s->busbw / g->busbw : NAN),
               cell(c[4], sizeof c[4], 100 * s->bound_fraction),
               cell(c[5], sizeof c[5], s->bound_GBps));
    }
}

/* One complete measurement of P ranks (or the GPU rows) into rows: seldp's rows and the
 * comparisons asked for. Returns 0, or 1 after a failure. */
static int measure(const bench_opts *o, const char *dir, int P, bench_rows *rows)
{
    int failed;
    if (o->gpu)
        return bench_gpu_rows(o, rows);
    if (o->op == BENCH_REDUCE)
        failed = bench_reduce_rows(o, P, rows);
    else if (o->op == BENCH_OVERLAP)
        failed = bench_overlap_rows(o, P, rows);
    else
        failed = bench_host_rows(o, P, rows);
    if (!failed && (o->compare_mpi || o->compare_gloo)) {
        bool skipped = false;
        if (o->op == BENCH_REDUCE || o->op == BENCH_OVERLAP)
            fprintf(stderr, "seldp-bench: --compare has no reduce; compare the raw "
                            "allreduce rows with --op allreduce\n");
        else if (o->compare_mpi)
            failed = bench_mpi_rows(o, dir, P, rows);
        if (o->compare_gloo && (o->op == BENCH_REDUCE_SCATTER || o->op == BENCH_ALLGATHER))
            fprintf(o->json ? stderr : stdout,
                    "# no gloo column: the gloo program times allreduce and broadcast only\n");
        else if (!failed && o->compare_gloo && o->op != BENCH_REDUCE && o->op != BENCH_OVERLAP)
            failed = bench_gloo_rows(o, dir, P, rows, &skipped);
    }
    return failed;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rc = bench_parse(argc, argv, &o, false);
    if (rc)
        return rc == 1 ? 0 : 2;
    char dir[4096];
    self_dir(dir, sizeof dir);
    FILE *jsonl = NULL, *csv = NULL;
    if (o.out) {
        char path[4096];
        snprintf(path, sizeof path, "%s.jsonl", o.out);
        jsonl = fopen(path, "w");
        snprintf(path, sizeof path, "%s.csv", o.out);
        csv = fopen(path, "w");
        if (!jsonl || !csv) {
            fprintf(stderr, "seldp-bench: cannot write %s.jsonl and %s.csv\n", o.out, o.out);
            return 2;
        }
        bench_print_csv_header(csv);
    }

    bench_rows rows = {0};
    int failed = 0;
    long long wrong = 0;
    double load = load_average();
    if (!o.json) {
        char title[768], repeat[160] = "";
        if (o.repeat > 1)
            snprintf(repeat, sizeof repeat,
                     "; each row the median of %d repetitions of the whole measurement "
                     "(spread = (slowest - fastest) / median)",
                     o.repeat);
        if (o.gpu)
            snprintf(title, sizeof title, "seldp-bench --gpu: %s", seldp_version());
        else
            snprintf(title, sizeof title,
                     "seldp-bench: %s %s, host-staged (a thread per rank, one per core when they "
                     "fit, as mpirun binds), %ld CPUs, load average "
                     "%.2f at start, %s; time = median of %d samples after %d warm-up%s; B = the "
                     "better of memcpy and a streaming copy (%s)",
                     bench_op_name(o.op), o.op == BENCH_REDUCE ? o.dtype : "f32 sum",
                     sysconf(_SC_NPROCESSORS_ONLN), load, seldp_version(), o.iters, o.warmup,
                     repeat, bench_stream_name());
        bench_print_header(stdout, title);
        fflush(stdout);
    }
    for (int p = 0; p < (o.gpu ? 1 : o.n_ranks) && !failed; p++) {
        int from = rows.n;
        /* -r N: N complete repetitions, each into its own list, then merged row by row */
        bench_rows *reps = o.repeat > 1 ? calloc((size_t)o.repeat, sizeof *reps) : NULL;
        if (o.repeat > 1 && !reps) {
            fprintf(stderr, "seldp-bench: out of memory for %d repetitions\n", o.repeat);
            failed = 1;
            break;
        }
        for (int k = 0; k < o.repeat && !failed; k++) {
            bench_rows *into = reps ? &reps[k] : &rows;
            int start = into->n;
            cpu_ticks t0 = {0};
            struct rusage ru0;
            long long nivcsw0 = getrusage(RUSAGE_SELF, &ru0) == 0 ? (long long)ru0.ru_nivcsw : -1;
            if (!read_cpu_ticks(&t0))
                t0.total = 0;
            failed = measure(&o, dir, o.gpu ? 0 : o.ranks[p], into);
            sort_rows(into, start);
            if (o.op == BENCH_OVERLAP && !o.gpu)
                bench_overlap_notes(into, start);
            if (reps && !o.json) {
                char context[160];
                repetition_context(&t0, nivcsw0, context, sizeof context);
                printf("# %d ranks: repetition %d of %d done, load average %.2f%s\n",
                       o.gpu ? 0 : o.ranks[p], k + 1, o.repeat, load_average(), context);
            }
            fflush(stdout);
        }
        if (reps) {
            if (!failed)
                failed = bench_repeat_merge(reps, o.repeat, &rows);
            for (int k = 0; k < o.repeat; k++)
                bench_rows_free(&reps[k]);
            free(reps);
        }
        if (o.op == BENCH_OVERLAP && !o.gpu)
            bench_overlap_notes(&rows, from);
        for (int i = from; i < rows.n; i++) {
            const bench_row *r = &rows.at[i];
            wrong += r->wrong;
            if (o.json)
                bench_print_json(stdout, r);
            else
                bench_print_row(stdout, r);
            if (jsonl)
                bench_print_json(jsonl, r);
            if (csv)
                bench_print_csv(csv, r);
        }
        if (!o.json && (o.compare_mpi || o.compare_gloo))
            print_comparison(&rows, from);
        fflush(stdout);
    }
    if (!o.json && !o.gpu)
        printf("# load average at end %.2f\n", load_average());
    if (wrong)
        fprintf(stderr, "seldp-bench: %lld wrong elements\n", wrong);
    if (jsonl)
        fclose(jsonl);
    if (csv)
        fclose(csv);
    bench_rows_free(&rows);
    return failed || wrong ? 1 : 0;
}
