/* seldp-bench's own parts (not seldp-bench-mpi's): rank threads, the host-staged rows, the
 * session reduce rows, the MPI comparison and the GPU rows. */
#ifndef SELDP_BENCH_DRIVER_H
#define SELDP_BENCH_DRIVER_H

#include <stdbool.h>
#include <stddef.h>

#include "bench.h"
#include "seldp/seldp.h"

/* ---- rank threads (team.c) ---- */

typedef struct bench_team bench_team;

typedef struct bench_rank {
    bench_team *team;
    struct hx_runner_rank *runner; /* the thread running it (harness/runner.h) */
    int rank, size;
    seldp_comm *comm; /* this rank on the team's host world */
    void *arg;        /* shared by every rank */
} bench_rank;

typedef int (*bench_rank_fn)(bench_rank *r);

/* How a rank gets its communicator: from the team's host world, or another transport. */
typedef seldp_status (*bench_join_fn)(bench_rank *r, seldp_host_world *host, seldp_comm **comm);

/* Run fn on `size` threads, each joined to one host world of `size` ranks on the host
 * (join NULL) or as join says. Returns 0 when every rank returned 0; else prints the first
 * failure to stderr and returns 1. */
int bench_team_run(int size, bench_rank_fn fn, void *arg);
int bench_team_run_join(int size, bench_join_fn join, bench_rank_fn fn, void *arg);

/* Wait for every rank of the team; false when a rank failed (bench_team_fail), in which
 * case the caller returns at once. Spins, yielding when ranks outnumber the cores. */
bool bench_team_barrier(bench_rank *r);

/* Record this rank's failure (printf-style), abort the world so that no rank waits for
 * it, and return 1 for the rank function to return. */
int bench_team_fail(bench_rank *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Time `k` calls of op on every rank per sample, `warmup` untimed first: samples[s] is the
 * time per call of sample s on rank 0 between barriers. op returns 0 or a failure. Returns
 * 0, or 1 after a failure. */
typedef int (*bench_op_fn)(bench_rank *r, void *ctx);
int bench_team_time(bench_rank *r, bench_op_fn op, void *ctx, int warmup, int iters, int k,
                    double *samples);

/* ---- rows (host.c, reduce.c, compare.c, gpu.c) ---- */

/* A growable list of rows. */
typedef struct bench_rows {
    bench_row *at;
    int n, cap;
} bench_rows;

bench_row *bench_rows_add(bench_rows *rows, const bench_row *row);
void bench_rows_free(bench_rows *rows);

/* Allreduce or broadcast on P simulated ranks over every size of o: a memcpy and a stream
 * row (unless --no-bound) and a seldp-host row per size. Returns 0, or 1 after a failure. */
int bench_host_rows(const bench_opts *o, int P, bench_rows *rows);

/* The session reduce of a realistic selection on P simulated ranks, for every size of o and
 * every bucket: reduce rows, the raw allreduce of the same bytes and the memcpy bound. */
int bench_reduce_rows(const bench_opts *o, int P, bench_rows *rows);

/* A backward overlapped with its reduction on P simulated ranks (overlap.c): compute alone,
 * communication alone, both in series and overlapped, for every size and bucket of o. */
int bench_overlap_rows(const bench_opts *o, int P, bench_rows *rows);

/* The notes of the overlap rows [from, n): each overlap and in_place row's time over
 * max(compute, the fastest communication of the same bytes and bucket: the comm and
 * comm_staged rows of every ratio), in its note and in over_max. Rows in the order
 * bench_overlap_rows adds them (six per ratio and bucket, compute first). Called on each
 * repetition's rows, then on the merged ones, whose over_max (the median of the
 * repetitions') it keeps. */
void bench_overlap_notes(bench_rows *rows, int from);

/* -r N (repeat.c): merge N repetitions of the same rows into `out`, row by row: the median
 * time with the fastest and slowest, the median bound fraction with its range (each against
 * its own repetition's B). Returns 0, or 1 (printed) when the repetitions' rows differ. */
int bench_repeat_merge(const bench_rows *reps, int n, bench_rows *out);

/* Run seldp-bench-mpi under mpirun with P processes over the sizes of o; its rows are
 * appended with bound fractions from the copy rows already in `rows`. */
int bench_mpi_rows(const bench_opts *o, const char *self_dir, int P, bench_rows *rows);

/* Run the gloo program (torch.distributed, P processes) over the sizes of o and append its
 * rows likewise. When python cannot import torch with gloo, print why to stderr, add no
 * row and return 0 (with *skipped set): torch is never required. */
int bench_gloo_rows(const bench_opts *o, const char *self_dir, int P, bench_rows *rows,
                    bool *skipped);

/* The GPU rows, or a "no GPU" line. Returns 0 unless a measurement failed. */
int bench_gpu_rows(const bench_opts *o, bench_rows *rows);

/* ---- the reduce's selection (reduce.c), shared with the GPU rows ---- */

/* Tensors of mixed sizes laid out in one arena per rank, each 64-byte aligned. */
typedef struct bench_selection {
    int n;
    size_t *count;      /* elements */
    seldp_dtype *dtype; /* F32, BF16 or F16 */
    size_t *offset;     /* bytes into the arena */
    size_t *first;      /* pattern index of element 0 */
    size_t bytes;       /* gradient bytes per rank */
    size_t arena;       /* arena bytes, with alignment */
    size_t half_elems;
} bench_selection;

/* n tensors of `bytes` in total (dtype "mixed", "f32", "bf16" or "f16"). */
bool bench_selection_make(bench_selection *s, int n, size_t bytes, const char *dtype);
void bench_selection_free(bench_selection *s);

/* Rank r's gradients (small integers) into a host arena of s->arena bytes. */
void bench_selection_fill(const bench_selection *s, void *arena, int rank);

/* Rank r's weight (a token count) and, in *total, the global weight of P ranks. */
uint64_t bench_weight(int rank, int P, uint64_t *total);

/* Elements of tensors first, first + step, ... that differ in any of the host arenas from
 * the weighted mean of P ranks' gradients. */
long long bench_selection_wrong(const bench_selection *s, const void *const *arenas, int n_arenas,
                                int P, int first, int step);

/* The copy bandwidth (GB/s) of the `impl` row (memcpy or stream) for P ranks and `bytes`,
 * or 0. */
double bench_rows_copy_bw(const bench_rows *rows, const char *impl, int P, size_t bytes);

/* bench_row_finish_bound with the memcpy and stream rows of the row's ranks and size. */
void bench_row_finish_rows(bench_row *row, const bench_rows *rows);

/* Add the copy row `impl` (memcpy or stream) of op, P ranks and `bytes` with the median of
 * n samples (seconds); returns its copy bandwidth (GB/s). */
double bench_copy_row(bench_rows *rows, const char *op, const char *impl, int P, size_t bytes,
                      double *samples, int n);

#endif
