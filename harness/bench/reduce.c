/* seldp-bench --op reduce: seldp_session_reduce of a realistic selection on the host-staged
 * transport, beside one raw F32 allreduce of the same bytes and the memory-bandwidth bound.
 *
 * The selection: --tensors tensors of mixed sizes (many small vectors, mid-size matrices, a
 * few large ones) scaled to SIZE bytes per rank, half of them BF16 and half F32 for --dtype
 * mixed. Every rank keeps its gradients in one arena (each tensor 64-byte aligned) and a
 * pristine copy it restores before each reduction (untimed), since a reduction overwrites
 * its inputs. The pristine arena also holds the parameters the session initializes: a
 * reduction never reads or writes parameters, and it saves a buffer per rank.
 *
 * Weights are token counts (1000 + 37 r): W is not a power of two, so the 1/W scale rounds as
 * it does in training. Gradients are small integers, so every sum is exact in F32 whatever
 * the order, and the expected result is exactly (float)((double)S * (1/W)) rounded to the
 * tensor's dtype.
 *
 * Timing: the load of a shared machine drifts, so the bound's copies (a streaming copy of
 * the gradients into the reduced arena and the memcpy that restores it, timed over the same
 * bytes; B is the better), the raw allreduce and the reduction are sampled in turns and
 * each reported as its median. --staged-commit sets cfg.staged_commit on the sessions (the
 * rows say "staged"), SELDP_DEBUG_COLLECTIVES=1 turns on the collectives' debug mode (the
 * rows say "debug"): a run with and one without measure what each costs. Extra
 * memory: VmHWM is reset (/proc/self/clear_refs) before the first reduction and read after
 * the last; the budget per rank is one bucket plus FP32 staging for the half inputs. */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

void bench_selection_free(bench_selection *s)
{
    free(s->count);
    free(s->dtype);
    free(s->offset);
    free(s->first);
    memset(s, 0, sizeof *s);
}

/* n tensors of about `bytes` in total: 40% vectors (256 to 4K elements), 50% matrices (16K
 * to 256K), 10% large (1M to 4M), scaled to the total. */
bool bench_selection_make(bench_selection *s, int n, size_t bytes, const char *dtype)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->count = calloc((size_t)n, sizeof *s->count);
    s->dtype = calloc((size_t)n, sizeof *s->dtype);
    s->offset = calloc((size_t)n, sizeof *s->offset);
    s->first = calloc((size_t)n, sizeof *s->first);
    double *weight = calloc((size_t)n, sizeof *weight);
    if (!s->count || !s->dtype || !s->offset || !s->first || !weight) {
        free(weight);
        bench_selection_free(s);
        return false;
    }
    double sum = 0;
    for (int t = 0; t < n; t++) {
        uint32_t h = mix((uint32_t)t * 2u + 1u);
        uint32_t c = h % 100u, f = mix(h) % 1024u;
        double lo = c < 40 ? 256 : c < 90 ? 16384 : 1048576;
        s->dtype[t] = strcmp(dtype, "f32") == 0     ? SELDP_F32
                      : strcmp(dtype, "bf16") == 0  ? SELDP_BF16
                      : strcmp(dtype, "f16") == 0   ? SELDP_F16
                      : (mix(h ^ 0x9e3779b9u) & 1u) ? SELDP_BF16
                                                    : SELDP_F32;
        weight[t] = lo * (1.0 + 15.0 * f / 1024.0) * (double)seldp_dtype_size(s->dtype[t]);
        sum += weight[t];
    }
    /* counts in multiples of 16 elements, the last tensor absorbing the rounding */
    size_t total = 0;
    for (int t = 0; t < n; t++) {
        size_t esize = seldp_dtype_size(s->dtype[t]);
        size_t c = (size_t)((double)bytes * weight[t] / sum / (double)esize) / 16 * 16;
        s->count[t] = c ? c : 16;
        total += s->count[t] * esize;
    }
    size_t last_esize = seldp_dtype_size(s->dtype[n - 1]);
    if (total < bytes)
        s->count[n - 1] += (bytes - total) / last_esize;
    else if (total - bytes < (s->count[n - 1] - 1) * last_esize)
        s->count[n - 1] -= (total - bytes + last_esize - 1) / last_esize;
    size_t at = 0, first = 0;
    s->bytes = 0;
    for (int t = 0; t < n; t++) {
        size_t nbytes = s->count[t] * seldp_dtype_size(s->dtype[t]);
        s->offset[t] = at;
        s->first[t] = first;
        at += (nbytes + 63) / 64 * 64;
        first += s->count[t];
        s->bytes += nbytes;
        if (s->dtype[t] != SELDP_F32)
            s->half_elems += s->count[t];
    }
    s->arena = at;
    free(weight);
    return true;
}

uint64_t bench_weight(int rank, int P, uint64_t *total)
{
    *total = 0;
    for (int r = 0; r < P; r++)
        *total += 1000 + 37 * (uint64_t)r;
    return 1000 + 37 * (uint64_t)rank;
}

void bench_selection_fill(const bench_selection *s, void *arena_bytes, int rank)
{
    char *arena = arena_bytes;
    for (int t = 0; t < s->n; t++) {
        char *data = arena + s->offset[t];
        for (size_t i = 0; i < s->count[t]; i++) {
            float v = bench_pattern(rank, s->first[t] + i);
            if (s->dtype[t] == SELDP_F32)
                ((float *)data)[i] = v;
            else if (s->dtype[t] == SELDP_BF16)
                ((uint16_t *)data)[i] = seldp_f32_to_bf16(v);
            else
                ((uint16_t *)data)[i] = seldp_f32_to_f16(v);
        }
    }
}

static long long read_status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    size_t len = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, len) == 0)
            kb = strtoll(line + len, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

/* Reset the peak RSS to the current one; false when the kernel refuses. */
static bool reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

typedef struct reduce_ctx {
    const bench_opts *o;
    const bench_selection *sel;
    char **grads; /* per rank: the arena reduced in place */
    float **raw_send, **raw_recv;
    double *samples, *raw_samples, *copy_samples, *stream_samples; /* rank 0 */
    atomic_llong wrong, raw_wrong;
    long long rss_before_kb;
    bool rss_reset;
    bench_rows *rows;
} reduce_ctx;

typedef struct raw_args {
    float *send, *recv;
    size_t count, bucket_count; /* 0: one allreduce */
} raw_args;

static int run_raw(bench_rank *r, void *arg)
{
    raw_args *a = arg;
    size_t step = a->bucket_count ? a->bucket_count : a->count;
    for (size_t at = 0; at < a->count; at += step) {
        size_t n = a->count - at < step ? a->count - at : step;
        if (seldp_comm_allreduce(r->comm, a->send + at, a->recv + at, n, SELDP_F32,
                                 SELDP_HOST_DEVICE) != SELDP_OK)
            return bench_team_fail(r, "allreduce: %s", seldp_last_error());
    }
    return 0;
}

/* Wrong elements of this rank's share of the raw allreduce's output, on every rank. */
static long long raw_wrong(const bench_rank *r, const reduce_ctx *c, size_t count)
{
    size_t share = (count + (size_t)r->size - 1) / (size_t)r->size;
    size_t lo = share * (size_t)r->rank, hi = lo + share < count ? lo + share : count;
    long long wrong = 0;
    for (size_t i = lo; i < hi; i++) {
        int sum = 0;
        for (int q = 0; q < r->size; q++)
            sum += (int)bench_pattern(q, i);
        float expect = (float)sum;
        for (int q = 0; q < r->size; q++)
            wrong += memcmp(&c->raw_recv[q][i], &expect, sizeof expect) != 0;
    }
    return wrong;
}

/* Wrong elements of this rank's share of the tensors, on every rank. */
long long bench_selection_wrong(const bench_selection *s, const void *const *arenas, int n_arenas,
                                int P, int first, int step)
{
    uint64_t W = 0;
    bench_weight(0, P, &W);
    double scale = 1.0 / (double)W;
    long long wrong = 0;
    for (int t = first; t < s->n; t += step) {
        size_t esize = seldp_dtype_size(s->dtype[t]);
        for (size_t i = 0; i < s->count[t]; i++) {
            int sum = 0;
            for (int q = 0; q < P; q++)
                sum += (int)bench_pattern(q, s->first[t] + i);
            float mean = (float)((double)(float)sum * scale);
            uint32_t expect = 0, got = 0;
            if (s->dtype[t] == SELDP_F32)
                memcpy(&expect, &mean, sizeof mean);
            else
                expect =
                    s->dtype[t] == SELDP_BF16 ? seldp_f32_to_bf16(mean) : seldp_f32_to_f16(mean);
            for (int a = 0; a < n_arenas; a++) {
                memcpy(&got, (const char *)arenas[a] + s->offset[t] + i * esize, esize);
                wrong += got != expect;
            }
        }
    }
    return wrong;
}

/* One session over the selection with this bucket size: its reduce samples, validated,
 * and the peak RSS around them. */
static int reduce_with_bucket(bench_rank *r, reduce_ctx *c, seldp_model *model,
                              const seldp_param_id *ids, char *pristine, char *grads,
                              seldp_grads *container, size_t bucket, raw_args *raw, bool first)
{
    const bench_opts *o = c->o;
    const bench_selection *s = c->sel;
    seldp_session *session = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    uint64_t W = 0, weight = bench_weight(r->rank, r->size, &W), got_weight = 0;
    int failed = 0;

    cfg.bucket_bytes = bucket;
    cfg.staged_commit = o->staged_commit;
    if (seldp_session_initialize(r->comm, model, 0, ids, (size_t)s->n, &cfg, &session) != SELDP_OK)
        return bench_team_fail(r, "seldp_session_initialize: %s", seldp_last_error());
    bench_selection_fill(s, pristine, r->rank);
    atomic_store(&c->wrong, 0);
    atomic_store(&c->raw_wrong, 0);
    if (!bench_team_barrier(r))
        goto out;
    if (r->rank == 0) {
        c->rss_reset = reset_peak_rss();
        c->rss_before_kb = read_status_kb("VmRSS:");
    }
    if (raw)
        memset(raw->recv, 0xff, raw->count * sizeof(float));
    for (int it = 0; it < o->warmup + o->iters; it++) {
        if (first && o->bound) {
            /* the bound: a streaming copy and the memcpy restore of the gradients, timed
             * over the same bytes (the restore below writes the whole arena again) */
            if (!bench_team_barrier(r))
                goto out;
            double t0 = bench_now();
            bench_stream_copy(grads, pristine, s->bytes);
            if (!bench_team_barrier(r))
                goto out;
            if (r->rank == 0 && it >= o->warmup)
                c->stream_samples[it - o->warmup] = bench_now() - t0;
            t0 = bench_now();
            memcpy(grads, pristine, s->bytes);
            if (!bench_team_barrier(r))
                goto out;
            if (r->rank == 0 && it >= o->warmup)
                c->copy_samples[it - o->warmup] = bench_now() - t0;
        }
        if (raw) {
            if (!bench_team_barrier(r))
                goto out;
            double t0 = bench_now();
            if (run_raw(r, raw))
                goto out;
            if (!bench_team_barrier(r))
                goto out;
            if (r->rank == 0 && it >= o->warmup)
                c->raw_samples[it - o->warmup] = bench_now() - t0;
        }
        memcpy(grads, pristine, s->arena); /* all of it: the gaps, and after a bucketed run */
        if (!bench_team_barrier(r))
            goto out;
        double t0 = bench_now();
        if (seldp_session_reduce(session, container, weight, SELDP_MISSING_ERROR, &got_weight) !=
            SELDP_OK) {
            failed = bench_team_fail(r, "seldp_session_reduce: %s", seldp_last_error());
            goto out;
        }
        if (!bench_team_barrier(r))
            goto out;
        if (r->rank == 0 && it >= o->warmup)
            c->samples[it - o->warmup] = bench_now() - t0;
    }
    if (got_weight != W) {
        failed = bench_team_fail(r, "global weight %" PRIu64 ", expected %" PRIu64, got_weight, W);
        goto out;
    }
    atomic_fetch_add(&c->wrong, bench_selection_wrong(s, (const void *const *)c->grads, r->size,
                                                      r->size, r->rank, r->size));
    if (raw)
        atomic_fetch_add(&c->raw_wrong, raw_wrong(r, c, raw->count));
    if (!bench_team_barrier(r))
        goto out;
    if (r->rank == 0 && first && o->bound) {
        bench_copy_row(c->rows, "reduce", "memcpy", r->size, s->bytes, c->copy_samples, o->iters);
        bench_copy_row(c->rows, "reduce", "stream", r->size, s->bytes, c->stream_samples, o->iters);
    }
    if (r->rank == 0 && first) {
        bench_row row = bench_row_make("allreduce", "seldp-host", r->size, s->bytes);
        row.time_us = 1e6 * bench_median(c->raw_samples, o->iters);
        row.wrong = atomic_load(&c->raw_wrong);
        snprintf(row.dtype, sizeof row.dtype, "f32");
        snprintf(row.note, sizeof row.note, "raw: same bytes");
        bench_row_finish_rows(&row, c->rows);
        bench_rows_add(c->rows, &row);
    }
    if (r->rank == 0) {
        long long peak_kb = read_status_kb("VmHWM:");
        bench_row row = bench_row_make("reduce", "seldp-host", r->size, s->bytes);
        row.time_us = 1e6 * bench_median(c->samples, o->iters);
        row.wrong = atomic_load(&c->wrong);
        snprintf(row.dtype, sizeof row.dtype, "%s", o->dtype);
        row.bucket_bytes = bucket;
        row.tensors = s->n;
        if (o->staged_commit)
            snprintf(row.note + strlen(row.note), sizeof row.note - strlen(row.note), "%sstaged",
                     row.note[0] ? " " : "");
        /* the raw allreduce sampled in turns with this reduction */
        row.raw_time_us = 1e6 * bench_median(c->raw_samples, o->iters);
        if (c->rss_reset && peak_kb >= 0 && c->rss_before_kb >= 0) {
            long long extra = (peak_kb - c->rss_before_kb) * 1024;
            row.peak_rss = peak_kb * 1024;
            row.rss_extra_per_rank = (extra > 0 ? extra : 0) / r->size;
            row.rss_budget_per_rank = (long long)(bucket + s->half_elems * sizeof(float));
        }
        bench_row_finish_rows(&row, c->rows);
        bench_rows_add(c->rows, &row);
    }
out:
    bench_team_barrier(r); /* nobody destroys a session another rank still reduces through */
    seldp_session_destroy(session);
    return failed;
}

static int reduce_rank(bench_rank *r)
{
    reduce_ctx *c = r->arg;
    const bench_opts *o = c->o;
    const bench_selection *s = c->sel;
    size_t count = s->bytes / sizeof(float);
    size_t raw_alloc = (count * sizeof(float) + 63) / 64 * 64;
    char *pristine = aligned_alloc(64, s->arena), *grads = aligned_alloc(64, s->arena);
    float *send = aligned_alloc(64, raw_alloc), *recv = aligned_alloc(64, raw_alloc);
    seldp_param_id *ids = calloc((size_t)s->n, sizeof *ids);
    seldp_model *model = NULL;
    seldp_grads *container = NULL;
    int failed = 0;

    if (!pristine || !grads || !send || !recv || !ids) {
        failed = bench_team_fail(r, "out of memory for 4 x %zu bytes", s->arena);
        goto out;
    }
    memset(pristine, 0, s->arena);
    memset(grads, 0, s->arena);
    bench_fill(send, count, r->rank, 0);
    memset(recv, 0, raw_alloc);
    c->grads[r->rank] = grads;
    c->raw_send[r->rank] = send;
    c->raw_recv[r->rank] = recv;
    if (seldp_model_create(r->rank, &model) != SELDP_OK ||
        seldp_grads_create(&container) != SELDP_OK) {
        failed = bench_team_fail(r, "model or gradient container: %s", seldp_last_error());
        goto out;
    }
    for (int t = 0; t < s->n; t++) {
        char path[64];
        int64_t shape[1] = {(int64_t)s->count[t]};
        seldp_tensor p =
            seldp_tensor_view(s->dtype[t], SELDP_HOST_DEVICE, pristine + s->offset[t], 1, shape);
        seldp_tensor g =
            seldp_tensor_view(s->dtype[t], SELDP_HOST_DEVICE, grads + s->offset[t], 1, shape);
        snprintf(path, sizeof path, "layers.%03d.p%06d.weight", t / 100, t);
        ids[t] = (seldp_param_id)t + 1;
        if (seldp_model_add(model, path, ids[t], &p, false, NULL) != SELDP_OK ||
            seldp_grads_put(container, ids[t], &g, SELDP_BORROWED) != SELDP_OK) {
            failed = bench_team_fail(r, "'%s': %s", path, seldp_last_error());
            goto out;
        }
    }
    if (!bench_team_barrier(r))
        goto out;

    /* the reductions, each in turns with one raw allreduce of the same bytes (the first also
     * with the bound) */
    raw_args a = {send, recv, count, 0};
    for (int b = 0; b < o->n_buckets && !failed; b++)
        failed = reduce_with_bucket(r, c, model, ids, pristine, grads, container, o->buckets[b], &a,
                                    b == 0);
    /* for a bucket sweep, the same bytes in bucketed allreduces */
    for (int b = 0; b < (o->n_buckets > 1 ? o->n_buckets : 0) && !failed; b++) {
        a.bucket_count = o->buckets[b] / sizeof(float);
        memset(recv, 0xff, count * sizeof(float));
        atomic_store(&c->wrong, 0);
        if (!bench_team_barrier(r))
            goto out;
        if (bench_team_time(r, run_raw, &a, o->warmup, o->iters, 1, c->samples))
            goto out;
        atomic_fetch_add(&c->wrong, raw_wrong(r, c, count));
        if (!bench_team_barrier(r))
            goto out;
        if (r->rank == 0) {
            bench_row row = bench_row_make("allreduce", "seldp-host", r->size, s->bytes);
            row.time_us = 1e6 * bench_median(c->samples, o->iters);
            row.wrong = atomic_load(&c->wrong);
            snprintf(row.dtype, sizeof row.dtype, "f32");
            row.bucket_bytes = o->buckets[b];
            snprintf(row.note, sizeof row.note, "raw: bucketed");
            bench_row_finish_rows(&row, c->rows);
            bench_rows_add(c->rows, &row);
        }
    }
out:
    bench_team_barrier(r);
    seldp_grads_destroy(container);
    seldp_model_destroy(model);
    free(ids);
    free(pristine);
    free(grads);
    free(send);
    free(recv);
    return failed;
}

int bench_reduce_rows(const bench_opts *o, int P, bench_rows *rows)
{
    int failed = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && !failed;
         bytes = bench_next_size(bytes, o->factor)) {
        reduce_ctx c;
        bench_selection s;
        memset(&c, 0, sizeof c);
        if (bytes < (size_t)o->tensors * 64) {
            fprintf(stderr, "seldp-bench: --op reduce: %zu bytes is too small for %d tensors\n",
                    bytes, o->tensors);
            return 1;
        }
        if (!bench_selection_make(&s, o->tensors, bytes, o->dtype)) {
            fprintf(stderr, "seldp-bench: out of memory for the selection\n");
            return 1;
        }
        c.o = o;
        c.sel = &s;
        c.rows = rows;
        atomic_init(&c.wrong, 0);
        atomic_init(&c.raw_wrong, 0);
        c.grads = calloc((size_t)P, sizeof *c.grads);
        c.raw_send = calloc((size_t)P, sizeof *c.raw_send);
        c.raw_recv = calloc((size_t)P, sizeof *c.raw_recv);
        c.samples = calloc((size_t)o->iters, sizeof *c.samples);
        c.raw_samples = calloc((size_t)o->iters, sizeof *c.raw_samples);
        c.copy_samples = calloc((size_t)o->iters, sizeof *c.copy_samples);
        c.stream_samples = calloc((size_t)o->iters, sizeof *c.stream_samples);
        if (c.grads && c.raw_send && c.raw_recv && c.samples && c.raw_samples && c.copy_samples &&
            c.stream_samples)
            failed = bench_team_run(P, reduce_rank, &c);
        else
            failed = 1;
        free(c.grads);
        free(c.raw_send);
        free(c.raw_recv);
        free(c.samples);
        free(c.raw_samples);
        free(c.copy_samples);
        free(c.stream_samples);
        bench_selection_free(&s);
    }
    return failed;
}
