/* seldp-bench: allreduce (F32 SUM), broadcast, reduce-scatter (F32 SUM) and all-gather on
 * the host-staged transport, beside the memory-bandwidth bound of the same ranks and size,
 * every result validated.
 *
 * Each rank owns buffers of the largest size: `src` holds its input pattern (the root's for a
 * broadcast; for an all-gather its block is the first size/P of it), `dst` receives (an
 * allreduce's or all-gather's output, a reduce-scatter's block, a non-root's broadcast
 * buffer), `copy` is the copies' destination. Per size: dst is poisoned with NaNs, then copy
 * samples (every rank copies src to copy at once, with non-temporal stores and with memcpy) and
 * collective samples are taken in turns, so that a load that comes and goes on a shared machine
 * weighs on all alike; then every rank checks a share of the elements of every rank's output
 * against the exact expected values (integer patterns, exact in F32). The bound B is the
 * better of the two copies (docs/benchmarks.md, The bound). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

typedef struct host_ctx {
    const bench_opts *o;
    float **src, **dst; /* per rank, published before the first barrier */
    double *copy_samples, *stream_samples, *op_samples; /* written by rank 0 */
    atomic_llong wrong;
    bench_rows *rows; /* rank 0 only */
} host_ctx;

typedef struct op_args {
    float *src, *dst;
    float *copy; /* the copies' destination, so that they never write a result */
    size_t count;
    bench_op op;
    const size_t *blocks; /* reduce-scatter, all-gather: count / P per rank */
} op_args;

static int run_memcpy(bench_rank *r, void *arg)
{
    (void)r;
    op_args *a = arg;
    memcpy(a->copy, a->src, a->count * sizeof(float));
    return 0;
}

static int run_stream(bench_rank *r, void *arg)
{
    (void)r;
    op_args *a = arg;
    bench_stream_copy(a->copy, a->src, a->count * sizeof(float));
    return 0;
}

static int run_collective(bench_rank *r, void *arg)
{
    op_args *a = arg;
    seldp_status st;
    if (a->op == BENCH_ALLREDUCE)
        st = seldp_comm_allreduce(r->comm, a->src, a->dst, a->count, SELDP_F32, SELDP_HOST_DEVICE);
    else if (a->op == BENCH_REDUCE_SCATTER)
        st = seldp_comm_reduce_scatter(r->comm, a->src, a->dst, a->blocks, SELDP_F32,
                                       SELDP_HOST_DEVICE);
    else if (a->op == BENCH_ALLGATHER)
        st = seldp_comm_allgather_counts(r->comm, a->src, a->dst, a->blocks, SELDP_F32,
                                         SELDP_HOST_DEVICE);
    else
        st = seldp_comm_broadcast(r->comm, r->rank == 0 ? a->src : a->dst, a->count, SELDP_F32, 0,
                                  SELDP_HOST_DEVICE);
    if (st != SELDP_OK)
        return bench_team_fail(r, "%s: %s", bench_op_name(a->op), seldp_last_error());
    return 0;
}

/* Elements of this rank's reduce-scatter block that differ from the sum of every rank's
 * pattern there. */
static long long count_wrong_block(const bench_rank *r, const host_ctx *c, size_t count)
{
    size_t block = count / (size_t)r->size, at = block * (size_t)r->rank;
    long long wrong = 0;
    for (size_t i = 0; i < block; i++) {
        int sum = 0;
        for (int q = 0; q < r->size; q++)
            sum += (int)bench_pattern(q, at + i);
        float expect = (float)sum;
        wrong += memcmp(&c->dst[r->rank][i], &expect, sizeof expect) != 0;
    }
    return wrong;
}

/* Elements of this rank's share of [0, count) that differ from the expected result on any
 * rank: the sum of every rank's pattern (allreduce), the root's pattern (broadcast), the
 * pattern of the block's owner from the start of its input (all-gather). */
static long long count_wrong(const bench_rank *r, const host_ctx *c, bench_op op, size_t count)
{
    if (op == BENCH_REDUCE_SCATTER)
        return count_wrong_block(r, c, count);
    size_t share = (count + (size_t)r->size - 1) / (size_t)r->size;
    size_t lo = share * (size_t)r->rank, hi = lo + share < count ? lo + share : count;
    long long wrong = 0;
    for (size_t i = lo; i < hi; i++) {
        float expect = 0;
        if (op == BENCH_ALLREDUCE) {
            int sum = 0;
            for (int q = 0; q < r->size; q++)
                sum += (int)bench_pattern(q, i);
            expect = (float)sum;
        } else if (op == BENCH_ALLGATHER) {
            size_t block = count / (size_t)r->size;
            expect = bench_pattern((int)(i / block), i % block);
        } else {
            expect = bench_pattern(0, i);
        }
        for (int q = 0; q < r->size; q++) {
            const float *out = op == BENCH_BROADCAST && q == 0 ? c->src[0] : c->dst[q];
            /* bits, so that a NaN left by the poison counts as wrong */
            if (memcmp(&out[i], &expect, sizeof expect) != 0)
                wrong++;
        }
    }
    return wrong;
}

static int host_rank(bench_rank *r)
{
    host_ctx *c = r->arg;
    const bench_opts *o = c->o;
    size_t max_count = (o->max_bytes + 3) / 4;
    size_t alloc = (max_count * sizeof(float) + 63) / 64 * 64;
    float *src = aligned_alloc(64, alloc), *dst = aligned_alloc(64, alloc);
    float *copy = o->bound ? aligned_alloc(64, alloc) : NULL;
    size_t *blocks = calloc((size_t)r->size, sizeof *blocks);
    int failed = 0;

    if (!src || !dst || !blocks || (o->bound && !copy)) {
        failed = bench_team_fail(r, "out of memory for 3 x %zu bytes", alloc);
        goto out;
    }
    bench_fill(src, max_count, r->rank, 0);
    memset(dst, 0, alloc);
    if (copy)
        memset(copy, 0, alloc);
    c->src[r->rank] = src;
    c->dst[r->rank] = dst;
    if (!bench_team_barrier(r))
        goto out;

    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;
         bytes = bench_next_size(bytes, o->factor)) {
        op_args a = {src, dst, copy, bench_count(o->op, bytes, r->size), o->op, blocks};
        size_t size = a.count * sizeof(float);
        if (!size)
            continue; /* fewer elements than ranks: no row, on every rank alike */
        for (int q = 0; q < r->size; q++)
            blocks[q] = a.count / (size_t)r->size;
        int k = bench_batch(size);
        memset(dst, 0xff, size); /* NaN: a result never written is wrong */
        atomic_store(&c->wrong, 0);
        if (!bench_team_barrier(r))
            goto out;
        /* the copies and the collective in turns, so that all see the same machine */
        for (int i = 0; i < o->warmup; i++)
            if ((o->bound && (run_memcpy(r, &a) || run_stream(r, &a))) || run_collective(r, &a))
                goto out;
        for (int sample = 0; sample < o->iters; sample++) {
            if (o->bound && bench_team_time(r, run_memcpy, &a, 0, 1, k, &c->copy_samples[sample]))
                goto out;
            if (o->bound && bench_team_time(r, run_stream, &a, 0, 1, k, &c->stream_samples[sample]))
                goto out;
            if (bench_team_time(r, run_collective, &a, 0, 1, k, &c->op_samples[sample]))
                goto out;
        }
        atomic_fetch_add(&c->wrong, count_wrong(r, c, o->op, a.count));
        if (!bench_team_barrier(r))
            goto out;
        if (r->rank == 0) {
            const char *op = bench_op_name(o->op);
            double memcpy_bw = 0, stream_bw = 0;
            if (o->bound) {
                memcpy_bw =
                    bench_copy_row(c->rows, op, "memcpy", r->size, size, c->copy_samples, o->iters);
                stream_bw = bench_copy_row(c->rows, op, "stream", r->size, size, c->stream_samples,
                                           o->iters);
            }
            bench_row s = bench_row_make(op, "seldp-host", r->size, size);
            s.time_us = 1e6 * bench_median(c->op_samples, o->iters);
            s.wrong = atomic_load(&c->wrong);
            snprintf(s.dtype, sizeof s.dtype, "f32");
            bench_row_finish_bound(&s, memcpy_bw, stream_bw);
            bench_rows_add(c->rows, &s);
        }
        if (!bench_team_barrier(r))
            goto out;
    }
out:
    /* every rank is done reading the others' buffers, or the team failed */
    bench_team_barrier(r);
    free(src);
    free(dst);
    free(copy);
    free(blocks);
    return failed;
}

int bench_host_rows(const bench_opts *o, int P, bench_rows *rows)
{
    host_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.rows = rows;
    atomic_init(&c.wrong, 0);
    c.src = calloc((size_t)P, sizeof *c.src);
    c.dst = calloc((size_t)P, sizeof *c.dst);
    c.copy_samples = calloc((size_t)o->iters, sizeof *c.copy_samples);
    c.stream_samples = calloc((size_t)o->iters, sizeof *c.stream_samples);
    c.op_samples = calloc((size_t)o->iters, sizeof *c.op_samples);
    int failed = 1;
    if (c.src && c.dst && c.copy_samples && c.stream_samples && c.op_samples)
        failed = bench_team_run(P, host_rank, &c);
    else
        fprintf(stderr, "seldp-bench: out of memory\n");
    free(c.src);
    free(c.dst);
    free(c.copy_samples);
    free(c.stream_samples);
    free(c.op_samples);
    return failed;
}

bench_row *bench_rows_add(bench_rows *rows, const bench_row *row)
{
    if (rows->n == rows->cap) {
        int cap = rows->cap ? 2 * rows->cap : 64;
        bench_row *at = realloc(rows->at, (size_t)cap * sizeof *at);
        if (!at)
            return NULL;
        rows->at = at;
        rows->cap = cap;
    }
    rows->at[rows->n] = *row;
    return &rows->at[rows->n++];
}

void bench_rows_free(bench_rows *rows)
{
    free(rows->at);
    rows->at = NULL;
    rows->n = rows->cap = 0;
}

double bench_rows_copy_bw(const bench_rows *rows, const char *impl, int P, size_t bytes)
{
    for (int i = rows->n - 1; i >= 0; i--) {
        const bench_row *m = &rows->at[i];
        if (strcmp(m->impl, impl) == 0 && m->ranks == P && m->bytes == bytes)
            return m->busbw;
    }
    return 0;
}

void bench_row_finish_rows(bench_row *row, const bench_rows *rows)
{
    bench_row_finish_bound(row, bench_rows_copy_bw(rows, "memcpy", row->ranks, row->bytes),
                           bench_rows_copy_bw(rows, "stream", row->ranks, row->bytes));
}

double bench_copy_row(bench_rows *rows, const char *op, const char *impl, int P, size_t bytes,
                      double *samples, int n)
{
    bench_row m = bench_row_make(op, impl, P, bytes);
    m.time_us = 1e6 * bench_median(samples, n);
    bench_row_finish(&m, 0);
    bench_rows_add(rows, &m);
    return m.busbw;
}
