/* seldp-bench --op overlap: a training step's backward overlapped with its reduction
 * (seldp_session_reduce_start ... seldp_session_finish), on the host-staged transport.
 *
 * The model: SIZE bytes of F32 per rank in layers of one bucket each (--bucket), so that
 * a layer's gradient fills one bucket. A step's backward runs the layers last to first;
 * each layer's "compute" is a sleep of --compute-us before its gradient is marked ready
 * (a sleep, not a loop: it leaves the cores to the progress threads as a GPU's backward
 * does). Four rows per size and bucket, each the median of the samples on rank 0 between
 * barriers:
 *   compute  the backward alone: the layers' sleeps, no reduction;
 *   comm     the overlapped reduction of the default session alone: start, every mark at
 *            once, finish (in place: each bucket's results written into the gradients as it
 *            completes, after a copy of them is kept, and nothing left to copy at finish);
 *   serial   the backward, then the blocking seldp_session_reduce: compute + comm;
 *   overlap  start, the backward marking each layer as it ends, finish;
 *   comm_staged, staged  comm and overlap with cfg.overlap_in_place = false (a second
 *            session): every result staged until finish's final agreement, then copied
 *            into the gradients.
 * The overlap rows' notes (and over_max) give their time over max(compute, the fastest
 * communication of the same bytes and bucket: the least of every comm and comm_staged row
 * of every ratio), the time a perfect overlap would take (1.00), and over compute + comm
 * (their own mode's), the time of no overlap at all. (The serial row
 * is what a blocking reduce after backward costs: on the host-staged transport its fused
 * path writes in place without staging, so its comm part is cheaper than the overlapped
 * reduction's, which always stages in F32 and commits after a final agreement, as
 * cfg.staged_commit does.) #wrong counts the elements, on every rank,
 * where the overlapped reduction's result differs from the blocking call's on the same
 * inputs (checked once per size, before the timing). */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver.h"

enum { ROW_COMPUTE, ROW_COMM, ROW_SERIAL, ROW_OVERLAP, ROW_COMM_STAGED, ROW_STAGED, N_ROWS };
static const char *const ROW_IMPL[N_ROWS] = {"compute", "comm",        "serial",
                                             "overlap", "comm_staged", "staged"};

typedef struct overlap_ctx {
    const bench_opts *o;
    double ratio;      /* --compute-ratio: backward over communication time; 0: --compute-us */
    double compute_us; /* the backward of one layer: --compute-us or from the ratio */
    size_t bytes, bucket;
    int layers;
    bench_rows *rows;
    double *samples[N_ROWS];
    atomic_llong wrong;
} overlap_ctx;

/* One rank's model, gradients and session. */
typedef struct overlap_rank {
    overlap_ctx *c;
    seldp_session *session;
    seldp_session *staged; /* cfg.overlap_in_place = false */
    seldp_grads *grads;
    seldp_param_id *ids; /* by layer */
    uint64_t weight;
    int mode;      /* the row being timed */
    bool checking; /* the results are being checked: no compute */
} overlap_rank;

/* The backward of layer `done` (counted from 0) of a backward that started at `t0`: a sleep
 * until t0 + (done + 1) * us on the monotonic clock, so that the overshoot of each wake-up
 * (tens of microseconds) is taken out of the next layer's instead of adding up. */
static void compute(double t0, int done, double us)
{
    double until = t0 + (done + 1) * us * 1e-6;
    struct timespec ts = {(time_t)until, (long)((until - floor(until)) * 1e9)};
    if (us > 0)
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
}

/* One step in the mode of the row being timed. */
static int step(bench_rank *r, void *arg)
{
    overlap_rank *k = arg;
    const overlap_ctx *c = k->c;
    double us = c->compute_us;
    seldp_status st = SELDP_OK;

    double t0 = bench_now();
    if (k->mode == ROW_COMPUTE || k->mode == ROW_SERIAL) {
        for (int l = c->layers - 1; l >= 0; l--)
            compute(t0, c->layers - 1 - l, us);
        if (k->mode == ROW_SERIAL)
            st = seldp_session_reduce(k->session, k->grads, k->weight, SELDP_MISSING_ERROR, NULL);
        return st == SELDP_OK ? 0
                              : bench_team_fail(r, "seldp_session_reduce: %s", seldp_last_error());
    }
    bool staged = k->mode == ROW_STAGED || k->mode == ROW_COMM_STAGED;
    bool sleeps = (k->mode == ROW_OVERLAP || k->mode == ROW_STAGED) && !k->checking;
    seldp_session *s = staged ? k->staged : k->session;
    st = seldp_session_reduce_start(s, k->grads, k->weight, SELDP_MISSING_ERROR);
    for (int l = c->layers - 1; l >= 0 && st == SELDP_OK; l--) {
        if (sleeps)
            compute(t0, c->layers - 1 - l, us);
        st = seldp_session_mark_ready(s, k->ids[l]);
    }
    if (st == SELDP_OK)
        st = seldp_session_finish(s, NULL);
    else if (seldp_session_in_flight(s))
        (void)seldp_session_finish(s, NULL);
    return st == SELDP_OK ? 0 : bench_team_fail(r, "overlapped reduction: %s", seldp_last_error());
}

/* Elements where the overlapped result (mode ROW_COMM: the default session; ROW_STAGED:
 * the staged one) differs from the blocking one, same inputs. */
static int check(bench_rank *r, overlap_rank *k, int mode, float *grads, float *copy,
                 seldp_grads *blocking, size_t count)
{
    long long wrong = 0;
    bench_fill(grads, count, r->rank, 0);
    memcpy(copy, grads, count * sizeof(float));
    if (seldp_session_reduce(k->session, blocking, k->weight, SELDP_MISSING_ERROR, NULL) !=
        SELDP_OK)
        return bench_team_fail(r, "seldp_session_reduce: %s", seldp_last_error());
    k->mode = mode;
    k->checking = true;
    int failed = step(r, k);
    k->checking = false;
    if (failed)
        return 1;
    for (size_t i = 0; i < count; i++)
        wrong += memcmp(&grads[i], &copy[i], sizeof(float)) != 0;
    atomic_fetch_add(&k->c->wrong, wrong);
    return 0;
}

static int overlap_rank_main(bench_rank *r)
{
    overlap_ctx *c = r->arg;
    const bench_opts *o = c->o;
    size_t count = c->bytes / sizeof(float), per = c->bucket / sizeof(float);
    float *params = calloc(count, sizeof(float)), *grads = calloc(count, sizeof(float));
    float *copy = calloc(count, sizeof(float));
    seldp_model *model = NULL;
    seldp_grads *blocking = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    overlap_rank k = {.c = c};
    uint64_t W = 0;
    int failed = 0;

    k.ids = calloc((size_t)c->layers, sizeof *k.ids);
    k.weight = bench_weight(r->rank, r->size, &W);
    if (!params || !grads || !copy || !k.ids) {
        failed = bench_team_fail(r, "out of memory for 3 x %zu bytes", c->bytes);
        goto out;
    }
    if (seldp_model_create(r->rank, &model) != SELDP_OK ||
        seldp_grads_create(&k.grads) != SELDP_OK || seldp_grads_create(&blocking) != SELDP_OK) {
        failed = bench_team_fail(r, "model or gradient container: %s", seldp_last_error());
        goto out;
    }
    for (int l = 0; l < c->layers; l++) {
        char path[64];
        size_t first = (size_t)l * per, n = first + per < count ? per : count - first;
        int64_t shape[1] = {(int64_t)n};
        seldp_tensor p = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, params + first, 1, shape);
        seldp_tensor g = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, grads + first, 1, shape);
        seldp_tensor b = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, copy + first, 1, shape);
        snprintf(path, sizeof path, "layers.%05d.weight", l);
        k.ids[l] = (seldp_param_id)l + 1;
        if (seldp_model_add(model, path, k.ids[l], &p, false, NULL) != SELDP_OK ||
            seldp_grads_put(k.grads, k.ids[l], &g, SELDP_BORROWED) != SELDP_OK ||
            seldp_grads_put(blocking, k.ids[l], &b, SELDP_BORROWED) != SELDP_OK) {
            failed = bench_team_fail(r, "'%s': %s", path, seldp_last_error());
            goto out;
        }
    }
    cfg.bucket_bytes = c->bucket;
    if (seldp_session_initialize(r->comm, model, 0, k.ids, (size_t)c->layers, &cfg, &k.session) !=
        SELDP_OK) {
        failed = bench_team_fail(r, "seldp_session_initialize: %s", seldp_last_error());
        goto out;
    }
    cfg.overlap_in_place = false;
    if (seldp_session_initialize(r->comm, model, 0, k.ids, (size_t)c->layers, &cfg, &k.staged) !=
        SELDP_OK) {
        failed = bench_team_fail(r, "seldp_session_initialize: %s", seldp_last_error());
        goto out;
    }
    if ((failed = check(r, &k, ROW_COMM, grads, copy, blocking, count)) != 0 ||
        (failed = check(r, &k, ROW_STAGED, grads, copy, blocking, count)) != 0)
        goto out;
    /* --compute-ratio: the communication alone timed first, the backward made `ratio` times it */
    if (c->ratio > 0) {
        double t[3];
        for (int it = 0; it < 3; it++) {
            k.mode = ROW_COMM;
            if (!bench_team_barrier(r))
                goto out;
            t[it] = bench_now();
            if ((failed = step(r, &k)) != 0 || !bench_team_barrier(r))
                goto out;
            t[it] = bench_now() - t[it];
        }
        if (r->rank == 0)
            c->compute_us = c->ratio * 1e6 * bench_median(t, 3) / c->layers;
        if (!bench_team_barrier(r))
            goto out;
    }
    /* the modes in turns, sample by sample, so that a drifting load hits them alike */
    for (int it = 0; it < o->warmup + o->iters && !failed; it++) {
        for (int mode = 0; mode < N_ROWS && !failed; mode++) {
            double t;
            k.mode = mode;
            if (!bench_team_barrier(r))
                goto out;
            t = bench_now();
            if ((failed = step(r, &k)) != 0 || !bench_team_barrier(r))
                goto out;
            if (r->rank == 0 && it >= o->warmup)
                c->samples[mode][it - o->warmup] = bench_now() - t;
        }
    }
out:
    bench_team_barrier(r); /* nobody destroys a session another rank still reduces through */
    seldp_session_destroy(k.session);
    seldp_session_destroy(k.staged);
    seldp_grads_destroy(blocking);
    seldp_grads_destroy(k.grads);
    seldp_model_destroy(model);
    free(k.ids);
    free(params);
    free(grads);
    free(copy);
    return failed;
}

static void add_rows(overlap_ctx *c, int P)
{
    double t[N_ROWS];
    for (int m = 0; m < N_ROWS; m++) {
        bench_row row = bench_row_make("overlap", ROW_IMPL[m], P, c->bytes);
        t[m] = 1e6 * bench_median(c->samples[m], c->o->iters);
        row.time_us = t[m];
        row.bucket_bytes = c->bucket;
        row.tensors = c->layers;
        snprintf(row.dtype, sizeof row.dtype, "f32");
        if (m == ROW_COMPUTE && c->ratio > 0)
            snprintf(row.note, sizeof row.note, "%d layers x %.0f us (%.2f x comm)", c->layers,
                     c->compute_us, c->ratio);
        else if (m == ROW_COMPUTE)
            snprintf(row.note, sizeof row.note, "%d layers x %.0f us", c->layers, c->compute_us);
        if (m == ROW_OVERLAP || m == ROW_STAGED)
            row.wrong = atomic_load(&c->wrong); /* notes: bench_overlap_notes */
        bench_row_finish(&row, 0);
        bench_rows_add(c->rows, &row);
    }
}

static bool is_impl(const bench_row *r, int m)
{
    return strcmp(r->op, "overlap") == 0 && strcmp(r->impl, ROW_IMPL[m]) == 0;
}

void bench_overlap_notes(bench_rows *rows, int from)
{
    for (int i = from; i + N_ROWS <= rows->n; i++) {
        bench_row *g = &rows->at[i];
        if (!is_impl(g, ROW_COMPUTE))
            continue;
        bool whole = true;
        for (int m = 0; m < N_ROWS; m++)
            whole = whole && is_impl(&g[m], m) && g[m].bytes == g->bytes &&
                    g[m].bucket_bytes == g->bucket_bytes;
        if (!whole)
            continue;
        /* the fastest communication of these bytes and bucket, over every ratio's rows */
        double fastest = INFINITY;
        for (int j = from; j < rows->n; j++) {
            const bench_row *x = &rows->at[j];
            if ((is_impl(x, ROW_COMM) || is_impl(x, ROW_COMM_STAGED)) && x->bytes == g->bytes &&
                x->bucket_bytes == g->bucket_bytes)
                fastest = fmin(fastest, x->time_us);
        }
        const int modes[2] = {ROW_OVERLAP, ROW_STAGED};
        for (int k = 0; k < 2; k++) {
            bench_row *o = &g[modes[k]];
            double own = g[modes[k] == ROW_OVERLAP ? ROW_COMM : ROW_COMM_STAGED].time_us;
            /* merged repetitions keep the median of each repetition's own figure */
            if (!(o->repeats > 1 && !isnan(o->over_max)))
                o->over_max = o->time_us / fmax(g[ROW_COMPUTE].time_us, fastest);
            snprintf(o->note, sizeof o->note, "%.2f x max(compute; best comm); %.2f x sum",
                     o->over_max, o->time_us / (g[ROW_COMPUTE].time_us + own));
        }
        i += N_ROWS - 1;
    }
}

int bench_overlap_rows(const bench_opts *o, int P, bench_rows *rows)
{
    int failed = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && !failed;
         bytes = bench_next_size(bytes, o->factor)) {
        for (int b = 0; b < o->n_buckets * (o->n_ratios ? o->n_ratios : 1) && !failed; b++) {
            overlap_ctx c;
            memset(&c, 0, sizeof c);
            c.o = o;
            c.ratio = o->n_ratios ? o->ratios[b % o->n_ratios] : 0.0;
            c.compute_us = o->compute_us;
            c.bytes = bytes / sizeof(float) * sizeof(float);
            c.bucket =
                o->buckets[b / (o->n_ratios ? o->n_ratios : 1)] / sizeof(float) * sizeof(float);
            if (c.bucket == 0 || c.bytes == 0) {
                fprintf(stderr, "seldp-bench: --op overlap: sizes below one F32 element\n");
                return 1;
            }
            c.layers = (int)((c.bytes + c.bucket - 1) / c.bucket);
            c.rows = rows;
            atomic_init(&c.wrong, 0);
            for (int m = 0; m < N_ROWS; m++)
                if (!(c.samples[m] = calloc((size_t)o->iters, sizeof(double))))
                    failed = 1;
            if (!failed)
                failed = bench_team_run(P, overlap_rank_main, &c);
            if (!failed)
                add_rows(&c, P);
            for (int m = 0; m < N_ROWS; m++)
                free(c.samples[m]);
        }
    }
    return failed;
}
