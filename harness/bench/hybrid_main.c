/* seldp-bench-hybrid: seldp_comm_allreduce (F32 SUM) at one world size on three layouts, so
 * that the hybrid transport's rows stand beside those of pure MPI and pure threads:
 *   mpirun -np P seldp-bench-hybrid --mode hybrid --threads N   P processes x N threads
 *   mpirun -np W seldp-bench-hybrid --mode mpi                  W processes, one rank each
 *   seldp-bench-hybrid --mode threads --threads W               W threads of one process
 * Options: -b MIN -e MAX (bytes per rank), -f FACTOR, -n SAMPLES, -w WARMUP, --json. Rank 0
 * prints one row per size (bench.h), validated against the exact sum of bench_pattern. The
 * bound of each level goes in the row: bound_fraction against B, the copy bandwidth of the
 * process's ranks copying their buffers at once (the level inside a process), and the note
 * the bytes one process sends to the others per call (the level between processes: N x the
 * buffer for the hybrid transport, which sums in the threads' order, docs/library.md).
 * Exit status: 0, 1 when a result was wrong, 2 on a usage or setup error. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "opt_table.h"
#include "seldp/host.h"
#include "seldp/hybrid.h"
#include "seldp/mpi.h"

typedef enum { MODE_HYBRID, MODE_MPI, MODE_THREADS } mode;

typedef struct shared {
    mode m;
    int threads, procs, proc, world;
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup;
    bool json;
    seldp_hybrid_world *hybrid;
    seldp_host_world *host;
    pthread_barrier_t copy_barrier;
    double *copy_s; /* [threads] */
    long long wrong;
    pthread_mutex_t lock;
    int failed;
} shared;

typedef struct rank_arg {
    shared *s;
    int local, rank;
} rank_arg;

static const char *impl_of(mode m)
{
    return m == MODE_HYBRID ? "seldp-hybrid" : m == MODE_MPI ? "seldp-mpi" : "seldp-host";
}

/* B of this process's ranks: each copies its buffer at once with memcpy (the best of 3). */
static double copy_GBps(shared *s, int local, float *a, float *b, size_t n)
{
    double best = INFINITY;
    for (int k = 0; k < 3; k++) {
        pthread_barrier_wait(&s->copy_barrier);
        double t0 = bench_now();
        memcpy(b, a, n * sizeof *a);
        s->copy_s[local] = bench_now() - t0;
        pthread_barrier_wait(&s->copy_barrier);
        double worst = 0;
        for (int i = 0; i < s->threads; i++)
            worst = fmax(worst, s->copy_s[i]);
        best = fmin(best, worst);
    }
    return (double)s->threads * (double)(n * sizeof *a) / best / 1e9;
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    shared *s = a->s;
    seldp_comm *c = NULL;
    seldp_status st;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 600;
    if (s->m == MODE_HYBRID)
        st = seldp_hybrid_comm_init(s->hybrid, a->local, SELDP_HOST_DEVICE, &c);
    else if (s->m == MODE_MPI)
        st = seldp_mpi_comm_init(MPI_COMM_WORLD, SELDP_HOST_DEVICE, &cfg, &c);
    else
        st = seldp_host_comm_init(s->host, a->local, SELDP_HOST_DEVICE, &c);
    if (st != SELDP_OK) {
        fprintf(stderr, "seldp-bench-hybrid: rank %d: %s\n", a->rank, seldp_last_error());
        pthread_mutex_lock(&s->lock);
        s->failed = 1;
        pthread_mutex_unlock(&s->lock);
        return NULL;
    }
    size_t max_count = s->max_bytes / sizeof(float);
    float *send = malloc(max_count * sizeof *send + 1),
          *recv = malloc(max_count * sizeof *recv + 1);
    double *samples = calloc((size_t)s->iters, sizeof *samples);
    if (!send || !recv || !samples) {
        fprintf(stderr, "seldp-bench-hybrid: rank %d: out of memory\n", a->rank);
        exit(2);
    }
    bench_fill(send, max_count, a->rank, 0);
    memset(recv, 0, max_count * sizeof *recv); /* B is not a page-fault rate */
    for (size_t bytes = s->min_bytes; bytes <= s->max_bytes;
         bytes = bench_next_size(bytes, s->factor)) {
        size_t n = bytes / sizeof(float);
        if (!n)
            continue;
        /* every process measures at once: the world's B is the sum, about procs x this one */
        double B = copy_GBps(s, a->local, send, recv, n) * s->procs;
        int k = bench_batch(n * sizeof(float));
        for (int i = 0; i < s->warmup && st == SELDP_OK; i++)
            st = seldp_comm_allreduce(c, send, recv, n, SELDP_F32, SELDP_HOST_DEVICE);
        for (int it = 0; it < s->iters && st == SELDP_OK; it++) {
            st = seldp_comm_barrier(c);
            double t0 = bench_now();
            for (int i = 0; i < k && st == SELDP_OK; i++)
                st = seldp_comm_allreduce(c, send, recv, n, SELDP_F32, SELDP_HOST_DEVICE);
            if (st == SELDP_OK)
                st = seldp_comm_barrier(c);
            samples[it] = (bench_now() - t0) / k;
        }
        if (st != SELDP_OK) {
            fprintf(stderr, "seldp-bench-hybrid: rank %d: %s\n", a->rank, seldp_last_error());
            exit(2);
        }
        long long wrong = 0;
        for (size_t i = 0; i < n; i++) {
            int sum = 0;
            for (int q = 0; q < s->world; q++)
                sum += (int)bench_pattern(q, i);
            wrong += recv[i] != (float)sum;
        }
        long long total = 0;
        st = seldp_comm_allreduce(c, &wrong, &total, 1, SELDP_I64, SELDP_HOST_DEVICE);
        if (a->rank == 0) {
            bench_row row = bench_row_make("allreduce", impl_of(s->m), s->world, n * sizeof(float));
            row.time_us = 1e6 * bench_median(samples, s->iters);
            row.wrong = total;
            snprintf(row.dtype, sizeof row.dtype, "f32");
            bench_row_finish(&row, B);
            int N = s->m == MODE_HYBRID ? s->threads : 1;
            double out = s->procs > 1 ? (double)N * (double)(n * sizeof(float)) *
                                            (double)(s->procs - 1) / s->procs
                                      : 0;
            snprintf(row.note, sizeof row.note, "%dx%d, sends %.0f MiB/process", s->procs,
                     s->m == MODE_MPI ? 1 : s->threads, out / (1 << 20));
            if (s->json)
                bench_print_json(stdout, &row);
            else
                bench_print_row(stdout, &row);
            fflush(stdout);
            s->wrong += total;
        }
    }
    free(send);
    free(recv);
    free(samples);
    seldp_comm_destroy(c);
    return NULL;
}

static int usage(void)
{
    fprintf(stderr, "seldp-bench-hybrid: --mode hybrid|mpi|threads [--threads N] [-b MIN] "
                    "[-e MAX] [-f FACTOR] [-n SAMPLES] [-w WARMUP] [--json]\n");
    return 2;
}

int main(int argc, char **argv)
{
    shared s = {.m = MODE_HYBRID,
                .threads = 1,
                .min_bytes = 1 << 20,
                .max_bytes = 64 << 20,
                .factor = 4,
                .iters = 5,
                .warmup = 1};
    bool mode_given = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--json")) {
            s.json = true;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(o, "--mode")) {
            mode_given = true;
            if (!strcmp(v, "hybrid"))
                s.m = MODE_HYBRID;
            else if (!strcmp(v, "mpi"))
                s.m = MODE_MPI;
            else if (!strcmp(v, "threads"))
                s.m = MODE_THREADS;
            else
                return usage();
        } else if (!strcmp(o, "--threads")) {
            s.threads = atoi(v);
        } else if (!strcmp(o, "-b") || !strcmp(o, "-e")) {
            if (!hx_opt_parse_size(v, !strcmp(o, "-b") ? &s.min_bytes : &s.max_bytes))
                return usage();
        } else if (!strcmp(o, "-f")) {
            s.factor = atof(v);
        } else if (!strcmp(o, "-n")) {
            s.iters = atoi(v);
        } else if (!strcmp(o, "-w")) {
            s.warmup = atoi(v);
        } else {
            return usage();
        }
    }
    if (!mode_given || s.threads < 1 || s.iters < 1 || s.warmup < 0 || !(s.factor > 1) ||
        s.min_bytes > s.max_bytes)
        return usage();
    if (s.m == MODE_MPI)
        s.threads = 1;
    int provided = 0;
    MPI_Init_thread(&argc, &argv, s.m == MODE_HYBRID ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                    &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_size(MPI_COMM_WORLD, &s.procs);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.proc);
    if (s.m == MODE_THREADS && s.procs != 1) {
        fprintf(stderr, "seldp-bench-hybrid: --mode threads runs in one process\n");
        MPI_Finalize();
        return 2;
    }
    s.world = s.procs * s.threads;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 600;
    seldp_status st = SELDP_OK;
    if (s.m == MODE_HYBRID)
        st = seldp_hybrid_world_create(MPI_COMM_WORLD, s.threads, &cfg, &s.hybrid);
    else if (s.m == MODE_THREADS)
        st = seldp_host_world_create(s.threads, &cfg, &s.host);
    if (st != SELDP_OK) {
        fprintf(stderr, "seldp-bench-hybrid: %s\n", seldp_last_error());
        MPI_Finalize();
        return 2;
    }
    if (s.proc == 0 && !s.json) {
        char title[128];
        snprintf(title, sizeof title, "seldp-bench-hybrid: seldp_comm_allreduce F32, %s, %d x %d",
                 impl_of(s.m), s.procs, s.threads);
        bench_print_header(stdout, title);
    }
    pthread_mutex_init(&s.lock, NULL);
    pthread_barrier_init(&s.copy_barrier, NULL, (unsigned)s.threads);
    s.copy_s = calloc((size_t)s.threads, sizeof *s.copy_s);
    pthread_t *t = calloc((size_t)s.threads, sizeof *t);
    rank_arg *ra = calloc((size_t)s.threads, sizeof *ra);
    for (int i = 0; i < s.threads; i++) {
        ra[i] = (rank_arg){&s, i, s.proc * s.threads + i};
        pthread_create(&t[i], NULL, rank_main, &ra[i]);
    }
    for (int i = 0; i < s.threads; i++)
        pthread_join(t[i], NULL);
    seldp_hybrid_world_destroy(s.hybrid);
    seldp_host_world_destroy(s.host);
    free(t);
    free(ra);
    free(s.copy_s);
    MPI_Finalize();
    return s.failed ? 2 : s.wrong ? 1 : 0;
}
