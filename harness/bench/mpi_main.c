/* seldp-bench-mpi: Open MPI's MPI_Allreduce (F32 SUM), MPI_Bcast, MPI_Reduce_scatter_block
 * (F32 SUM) and MPI_Allgather, timed and validated with seldp-bench's rule (bench.h), for
 * seldp-bench --compare mpi. One process per rank:
 *   mpirun -np P seldp-bench-mpi -o allreduce -b 1M -e 64M --json
 * Rank 0 prints one row per size. Exit status: 0, 1 when a result was wrong, 2 on a usage or
 * allocation error. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct mpi_args {
    bench_op op;
    float *send, *recv;
    int count, rank;
} mpi_args;

static void run_once(const mpi_args *a, int size)
{
    int block = a->count / size;
    if (a->op == BENCH_ALLREDUCE)
        MPI_Allreduce(a->send, a->recv, a->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (a->op == BENCH_REDUCE_SCATTER)
        MPI_Reduce_scatter_block(a->send, a->recv, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (a->op == BENCH_ALLGATHER)
        MPI_Allgather(a->send, block, MPI_FLOAT, a->recv, block, MPI_FLOAT, MPI_COMM_WORLD);
    else
        MPI_Bcast(a->rank == 0 ? a->send : a->recv, a->count, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

/* Elements of this rank's result that differ from the expected ones. */
static long long count_wrong(const mpi_args *a, int size)
{
    long long wrong = 0;
    const float *out = a->op == BENCH_BROADCAST && a->rank == 0 ? a->send : a->recv;
    int block = a->count / size;
    int n = a->op == BENCH_REDUCE_SCATTER ? block : a->count;
    for (int i = 0; i < n; i++) {
        float expect;
        if (a->op == BENCH_ALLREDUCE || a->op == BENCH_REDUCE_SCATTER) {
            size_t at = (size_t)i + (a->op == BENCH_REDUCE_SCATTER ? (size_t)(block * a->rank) : 0);
            int sum = 0;
            for (int q = 0; q < size; q++)
                sum += (int)bench_pattern(q, at);
            expect = (float)sum;
        } else if (a->op == BENCH_ALLGATHER) {
            expect = bench_pattern(i / block, (size_t)(i % block));
        } else {
            expect = bench_pattern(0, (size_t)i);
        }
        wrong += memcmp(&out[i], &expect, sizeof expect) != 0;
    }
    return wrong;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rank = 0, size = 1, rc;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rc = bench_parse(argc, argv, &o, true);
    if (rc != 0) {
        MPI_Finalize();
        return rc == 1 ? 0 : 2;
    }
    size_t max_count = (o.max_bytes + 3) / 4;
    if (max_count > 0x7fffffff) {
        if (rank == 0)
            fprintf(stderr, "seldp-bench-mpi: -e %zu is beyond MPI's int count\n", o.max_bytes);
        MPI_Finalize();
        return 2;
    }
    float *send = malloc(max_count * sizeof(float)), *recv = malloc(max_count * sizeof(float));
    double *samples = calloc((size_t)o.iters, sizeof *samples);
    if (!send || !recv || !samples) {
        fprintf(stderr, "seldp-bench-mpi: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    bench_fill(send, max_count, rank, 0);
    memset(recv, 0, max_count * sizeof(float));
    if (rank == 0 && !o.json) {
        char title[128];
        static const char *const calls[] = {[BENCH_ALLREDUCE] = "MPI_Allreduce F32 SUM",
                                            [BENCH_BROADCAST] = "MPI_Bcast",
                                            [BENCH_REDUCE_SCATTER] =
                                                "MPI_Reduce_scatter_block F32 SUM",
                                            [BENCH_ALLGATHER] = "MPI_Allgather"};
        snprintf(title, sizeof title, "seldp-bench-mpi: Open MPI %s, %d processes", calls[o.op],
                 size);
        bench_print_header(stdout, title);
    }

    long long any_wrong = 0;
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;
         bytes = bench_next_size(bytes, o.factor)) {
        mpi_args a = {o.op, send, recv, (int)bench_count(o.op, bytes, size), rank};
        if (a.count == 0)
            continue; /* fewer elements than ranks: no row */
        int k = bench_batch((size_t)a.count * sizeof(float));
        memset(recv, 0xff, (size_t)a.count * sizeof(float));
        for (int i = 0; i < o.warmup; i++)
            run_once(&a, size);
        for (int s = 0; s < o.iters; s++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < k; i++)
                run_once(&a, size);
            MPI_Barrier(MPI_COMM_WORLD);
            samples[s] = (MPI_Wtime() - t0) / k;
        }
        long long wrong = count_wrong(&a, size), total = 0;
        MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        any_wrong += total;
        if (rank == 0) {
            bench_row row =
                bench_row_make(bench_op_name(o.op), "mpi", size, (size_t)a.count * sizeof(float));
            row.time_us = 1e6 * bench_median(samples, o.iters);
            row.wrong = total;
            snprintf(row.dtype, sizeof row.dtype, "f32");
            bench_row_finish(&row, 0);
            if (o.json)
                bench_print_json(stdout, &row);
            else
                bench_print_row(stdout, &row);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    free(samples);
    MPI_Finalize();
    return any_wrong ? 1 : 0;
}
