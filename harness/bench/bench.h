/* seldp-bench: what the benchmark (seldp-bench) and its MPI comparison program
 * (seldp-bench-mpi) share: options, the timing rule, input patterns and the rows they print
 * (a terminal table, JSON lines, CSV).
 *
 * Conventions are those of nccl-tests: sizes are bytes per rank (a reduce-scatter's input,
 * an all-gather's output); algbw = bytes / time; busbw = algbw * 2(n-1)/n for an allreduce
 * (and a reduce), algbw * (n-1)/n for a reduce-scatter and an all-gather, algbw for a
 * broadcast.
 * On the host, bound_fraction = (the time the memory-bandwidth bound allows) / (the time
 * measured). The bound is B, the machine's best copy bandwidth, measured in the same run
 * (docs/benchmarks.md, The bound): every rank copies its own buffer of the same size at once, once
 * with non-temporal (streaming) stores and once with memcpy, and B is the better of the two (both
 * are reported: the `stream` and `memcpy` rows). */
#ifndef SELDP_BENCH_H
#define SELDP_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum bench_op {
    BENCH_ALLREDUCE,
    BENCH_BROADCAST,
    BENCH_REDUCE,
    BENCH_OVERLAP,
    BENCH_REDUCE_SCATTER, /* seldp_comm_reduce_scatter, equal blocks (MPI_Reduce_scatter_block) */
    BENCH_ALLGATHER       /* seldp_comm_allgather_counts, equal blocks (MPI_Allgather) */
} bench_op;

#define BENCH_MAX_LIST 64

typedef struct bench_opts {
    size_t min_bytes, max_bytes; /* -b, -e */
    double factor;               /* -f */
    int iters, warmup;           /* -n: timed samples per size; -w: untimed iterations */
    bench_op op;
    int ranks[BENCH_MAX_LIST]; /* --ranks, in order */
    int n_ranks;
    bool ranks_given;               /* --ranks was passed (--gpu: else one rank per GPU) */
    size_t buckets[BENCH_MAX_LIST]; /* --bucket, in order */
    int n_buckets;
    char dtype[8];           /* --dtype: f32 (allreduce), mixed/f32/bf16/f16 (reduce) */
    int tensors;             /* --tensors: the reduce's selection */
    bool compare_mpi;        /* --compare mpi */
    bool compare_gloo;       /* --compare gloo */
    bool json;               /* --json: JSON lines instead of the table */
    bool gpu;                /* --gpu: the GPU rows only */
    bool bound;              /* the copy rows and bound fractions (--no-bound turns them off) */
    bool staged_commit;      /* --staged-commit: the reduce's sessions set cfg.staged_commit */
    const char *out;         /* --out PREFIX: also PREFIX.jsonl and PREFIX.csv */
    const char *mpirun;      /* --mpirun: the launcher for --compare mpi */
    const char *python;      /* --python: the interpreter for --compare gloo (NULL: try
                                python3, then /usr/bin/python3) */
    const char *gloo_script; /* --gloo-script (NULL: seldp-bench-gloo.py beside the binary) */
    double compute_us;       /* --compute-us: overlap, the backward of one layer */
    double ratios[BENCH_MAX_LIST]; /* --compute-ratio: overlap, backward time over the
                                      communication's, each its own rows (0: --compute-us) */
    int n_ratios;
    int repeat;         /* -r, --repeat: the whole measurement this many times, each row the median
                           of the repetitions with their spread (repeat.c); 1: once */
    bool sizes_given;   /* -b or -e passed (else --op reduce and overlap have their own) */
    bool buckets_given; /* --bucket passed (else --op overlap has its own) */
} bench_opts;

/* One measurement: a line of the table, a JSON object, a CSV row. */
typedef struct bench_row {
    char op[16];   /* allreduce, broadcast, reduce, reduce_scatter, allgather */
    char impl[16]; /* seldp-host, seldp-nccl, nccl, mpi, gloo, memcpy, stream */
    int ranks;
    size_t bytes;          /* per rank */
    double time_us;        /* median of the samples, per operation */
    double algbw, busbw;   /* GB/s; for a copy row busbw is its aggregate copy bandwidth */
    double bound_fraction; /* NAN when there is no bound */
    /* the copy bandwidths of the same ranks and size (GB/s, NAN: not measured) and B, the
     * better of the two, which bound_fraction is against */
    double memcpy_GBps, stream_GBps, bound_GBps;
    long long wrong; /* elements that differ from the expected result */
    /* optional, shown when set */
    char dtype[8];
    size_t bucket_bytes;
    int tensors;
    double raw_time_us;            /* reduce: one raw allreduce of the same bytes (NAN: none) */
    long long peak_rss;            /* reduce: bytes (-1: none) */
    long long rss_extra_per_rank;  /* reduce: peak minus the RSS before the reductions, per rank */
    long long rss_budget_per_rank; /* reduce: one bucket plus FP32 staging of the half inputs */
    char note[48];
    /* -r N: the repetitions the row is the median of (1: a single run), the fastest and
     * slowest of their times and the range of their bound fractions (NAN: none) */
    int repeats;
    double time_min_us, time_max_us;
    double bound_min, bound_max;
    /* overlap and in_place rows: time over max(compute, the fastest communication of the same
     * bytes and bucket), NAN elsewhere */
    double over_max;
} bench_row;

/* Parse argv into opts through the option table of help.c (harness/core/opt_table.h's rows
 * and loop). Returns 0 to run, 1 when --help was printed, 2 on an error (printed to stderr).
 * `mpi` selects the options of seldp-bench-mpi. */
int bench_parse(int argc, char **argv, bench_opts *opts, bool mpi);

/* The --help text of seldp-bench, or of seldp-bench-mpi (`mpi`), into f (help.c). */
void bench_usage(FILE *f, bool mpi);

/* The next size after `bytes`: bytes * factor, at least bytes + 1. */
size_t bench_next_size(size_t bytes, double factor);

/* Iterations in one timed sample: one for 1 MiB and more, so that a sample of a small
 * message lasts about as long as one of a megabyte (at most 1000). */
int bench_batch(size_t bytes);

/* The median of n samples (sorts them). */
double bench_median(double *samples, int n);

/* Seconds on CLOCK_MONOTONIC. */
double bench_now(void);

/* Element i of rank r's allreduce input: a small integer, so that every sum of up to 64
 * ranks is exact in F32 whatever the order. */
float bench_pattern(int rank, size_t i);

/* Fill n floats with rank r's pattern, starting at element `first`. */
void bench_fill(float *x, size_t n, int rank, size_t first);

/* Elements per rank of op at `bytes` per rank over `ranks` ranks: bytes / 4, and for a
 * reduce-scatter or an all-gather rounded down to a multiple of the ranks (equal blocks). */
size_t bench_count(bench_op op, size_t bytes, int ranks);

/* The bytes op moves at least, as docs/benchmarks.md counts them, for `bytes` per rank on `ranks`
 * ranks: 2*n*N (allreduce, reduce), n*N (broadcast), (n+1)*N (reduce-scatter, all-gather); the
 * row's op by name. */
double bench_bound_bytes(const char *op, int ranks, size_t bytes);

/* algbw and busbw from bytes and time_us; bound_fraction from the copy bandwidth
 * `copy_GBps` of the same ranks and size (<= 0: none). */
void bench_row_finish(bench_row *row, double copy_GBps);

/* bench_row_finish against B = the better of memcpy_GBps and stream_GBps (<= 0 or NAN: not
 * measured), both kept in the row. */
void bench_row_finish_bound(bench_row *row, double memcpy_GBps, double stream_GBps);

/* True for the rows of a copy (memcpy, stream): their busbw is a copy bandwidth. */
bool bench_is_copy(const char *impl);

/* ---- the streaming copy (copy.c) ---- */

typedef enum bench_copy_kind {
    BENCH_COPY_NONE,
    BENCH_COPY_SSE2,
    BENCH_COPY_AVX2,
    BENCH_COPY_AVX512
} bench_copy_kind;

/* The non-temporal copy this CPU runs (seldp__stream_copy): AVX-512 or AVX2 when it has
 * them, else SSE2 (x86-64 always has it); NONE elsewhere (the copy is then memcpy).
 * SELDP_BENCH_COPY=sse2 or avx2 asks for a narrower one. */
bench_copy_kind bench_stream_kind(void);
const char *bench_stream_name(void);

/* Copy `bytes` from src to dst (not overlapping) with non-temporal stores, fenced: the
 * stores are visible to every thread when it returns. Any alignment and size. */
void bench_stream_copy(void *dst, const void *src, size_t bytes);

/* A row with its identity filled and the rest empty. */
bench_row bench_row_make(const char *op, const char *impl, int ranks, size_t bytes);

/* A repeated row's spread: (slowest - fastest) / median of its repetitions' times; 0 for a
 * single run. */
double bench_spread(const bench_row *r);

/* Output. */
void bench_print_header(FILE *f, const char *title);
void bench_print_row(FILE *f, const bench_row *row);
void bench_print_json(FILE *f, const bench_row *row);
void bench_print_csv_header(FILE *f);
void bench_print_csv(FILE *f, const bench_row *row);

/* "16.0 MiB" */
const char *bench_size_str(size_t bytes, char *buf, size_t size);

const char *bench_op_name(bench_op op);

#endif
