/* seldp-bench -r N: the whole measurement N times, each row the median of its N repetitions
 * with their spread (driver.h, docs/benchmarks.md#repeat-mode).
 *
 * Every repetition is a complete run of the rows of one rank count (the copies, seldp and
 * any comparison), so it yields the same rows in the same order; row i of the merged list
 * takes, over the N repetitions of row i:
 *   time_us                the median (algbw and busbw follow from it);
 *   time_min_us/max_us     the fastest and the slowest;
 *   bound_fraction         the median of the repetitions' fractions, each against the B of
 *                          its own repetition (bound_fraction_min/max: their range), and
 *                          bound_GBps, memcpy_GBps, stream_GBps their medians;
 *   raw_time_us            the median; peak_rss and rss_extra_per_rank the largest;
 *   wrong                  the sum. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* The median of the finite values among v[0..n) (NAN when none); v is reordered. */
static double finite_median(double *v, int n)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(v[i]))
            v[m++] = v[i];
    return m ? bench_median(v, m) : NAN;
}

static bool same_row(const bench_row *a, const bench_row *b)
{
    return strcmp(a->op, b->op) == 0 && strcmp(a->impl, b->impl) == 0 && a->ranks == b->ranks &&
           a->bytes == b->bytes && a->bucket_bytes == b->bucket_bytes && a->tensors == b->tensors &&
           strcmp(a->dtype, b->dtype) == 0;
}

int bench_repeat_merge(const bench_rows *reps, int n, bench_rows *out)
{
    if (n < 1)
        return 1;
    double *v = calloc((size_t)n, sizeof *v);
    if (!v) {
        fprintf(stderr, "seldp-bench: out of memory merging %d repetitions\n", n);
        return 1;
    }
    int failed = 0;
    for (int k = 1; k < n && !failed; k++)
        if (reps[k].n != reps[0].n) {
            fprintf(stderr,
                    "seldp-bench: repetition %d gave %d rows, repetition 1 gave %d: expected the "
                    "same rows from every repetition\n",
                    k + 1, reps[k].n, reps[0].n);
            failed = 1;
        }
    for (int i = 0; i < reps[0].n && !failed; i++) {
        bench_row row = reps[0].at[i];
        for (int k = 1; k < n; k++)
            if (!same_row(&reps[k].at[i], &row)) {
                fprintf(stderr,
                        "seldp-bench: row %d of repetition %d is %s %s of %zu bytes, repetition 1 "
                        "had %s %s of %zu bytes: expected the same rows from every repetition\n",
                        i + 1, k + 1, reps[k].at[i].op, reps[k].at[i].impl, reps[k].at[i].bytes,
                        row.op, row.impl, row.bytes);
                failed = 1;
                break;
            }
        if (failed)
            break;
        double lo = INFINITY, hi = -INFINITY, flo = INFINITY, fhi = -INFINITY;
        long long wrong = 0;
        for (int k = 0; k < n; k++) {
            const bench_row *r = &reps[k].at[i];
            lo = fmin(lo, r->time_us);
            hi = fmax(hi, r->time_us);
            if (!isnan(r->bound_fraction)) {
                flo = fmin(flo, r->bound_fraction);
                fhi = fmax(fhi, r->bound_fraction);
            }
            wrong += r->wrong;
            if (r->peak_rss > row.peak_rss)
                row.peak_rss = r->peak_rss;
            if (r->rss_extra_per_rank > row.rss_extra_per_rank)
                row.rss_extra_per_rank = r->rss_extra_per_rank;
        }
#define MEDIAN_OF(field)                                                                           \
    do {                                                                                           \
        for (int k = 0; k < n; k++)                                                                \
            v[k] = reps[k].at[i].field;                                                            \
        row.field = finite_median(v, n);                                                           \
    } while (0)
        MEDIAN_OF(time_us);
        MEDIAN_OF(bound_fraction);
        MEDIAN_OF(bound_GBps);
        MEDIAN_OF(memcpy_GBps);
        MEDIAN_OF(stream_GBps);
        MEDIAN_OF(raw_time_us);
        MEDIAN_OF(over_max);
#undef MEDIAN_OF
        /* algbw and busbw of the median time, the fraction kept as the median of fractions */
        double fraction = row.bound_fraction, B = row.bound_GBps;
        bench_row_finish(&row, 0);
        row.bound_fraction = fraction;
        row.bound_GBps = B;
        row.wrong = wrong;
        row.repeats = n;
        row.time_min_us = lo;
        row.time_max_us = hi;
        row.bound_min = isinf(flo) ? NAN : flo;
        row.bound_max = isinf(fhi) ? NAN : fhi;
        if (!bench_rows_add(out, &row)) {
            fprintf(stderr, "seldp-bench: out of memory merging %d repetitions\n", n);
            failed = 1;
        }
    }
    free(v);
    return failed;
}
