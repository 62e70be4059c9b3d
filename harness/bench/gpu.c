/* seldp-bench --gpu: the GPU rows, one rank per GPU.
 *   nccl        raw ncclAllReduce (F32 SUM) over every GPU from one thread (a group call);
 *   seldp-nccl  seldp_comm_allreduce on the NCCL transport, one thread per GPU, and a
 *               seldp_session_reduce of the realistic selection (device tensors), whose
 *               busbw is set against the raw ncclAllReduce of the same bytes;
 *   seldp-host  seldp_comm_allreduce on the host-staged transport with device buffers.
 * Results are copied back and validated like the host rows. Without a GPU (or without CUDA
 * and NCCL in the build) it prints one "no GPU" line and skips. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

#ifndef SELDP_BENCH_GPU

int bench_gpu_rows(const bench_opts *o, bench_rows *rows)
{
    (void)o;
    (void)rows;
    printf("# no GPU rows: this seldp-bench was built without CUDA and NCCL (configure with "
           "-DSELDP_WITH_CUDA=ON -DSELDP_WITH_NCCL=ON); skipped\n");
    return 0;
}

#else

#include <cuda_runtime.h>
#include <nccl.h>

#include "seldp/nccl.h"

typedef struct gpu_ctx {
    const bench_opts *o;
    int gpus;
    seldp_nccl_world *world; /* NCCL rows */
    const char *impl;        /* seldp-nccl or seldp-host */
    const bench_selection *sel;
    double *samples;
    atomic_llong wrong;
    bench_rows *rows;
} gpu_ctx;

static seldp_device device_of(const bench_rank *r, const gpu_ctx *c)
{
    return (seldp_device){SELDP_DEVICE_CUDA, r->rank % c->gpus};
}

static seldp_status join_nccl(bench_rank *r, seldp_host_world *host, seldp_comm **comm)
{
    (void)host;
    gpu_ctx *c = r->arg;
    if (cudaSetDevice(r->rank) != cudaSuccess)
        return SELDP_ERR_TRANSPORT;
    return seldp_nccl_comm_init(c->world, r->rank, comm);
}

static seldp_status join_host_on_device(bench_rank *r, seldp_host_world *host, seldp_comm **comm)
{
    gpu_ctx *c = r->arg;
    if (cudaSetDevice(r->rank % c->gpus) != cudaSuccess)
        return SELDP_ERR_TRANSPORT;
    return seldp_host_comm_init(host, r->rank, device_of(r, c), comm);
}

/* Elements of `out` (count, copied from the device) that differ from the sum of P ranks'
 * patterns. */
static long long allreduce_wrong(const float *out, size_t count, int P)
{
    long long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        int sum = 0;
        for (int q = 0; q < P; q++)
            sum += (int)bench_pattern(q, i);
        float expect = (float)sum;
        wrong += memcmp(&out[i], &expect, sizeof expect) != 0;
    }
    return wrong;
}

typedef struct dev_args {
    float *send, *recv;
    size_t count;
    seldp_device mem;
} dev_args;

static int run_seldp_allreduce(bench_rank *r, void *arg)
{
    dev_args *a = arg;
    if (seldp_comm_allreduce(r->comm, a->send, a->recv, a->count, SELDP_F32, a->mem) != SELDP_OK)
        return bench_team_fail(r, "allreduce: %s", seldp_last_error());
    return 0;
}

/* seldp_comm_allreduce with device buffers over every size. */
static int gpu_allreduce_rank(bench_rank *r)
{
    gpu_ctx *c = r->arg;
    const bench_opts *o = c->o;
    size_t max_count = o->max_bytes / 4;
    float *host = malloc(max_count * sizeof(float));
    dev_args a = {NULL, NULL, 0, device_of(r, c)};
    int failed = 0;
    if (!host || cudaMalloc((void **)&a.send, max_count * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&a.recv, max_count * sizeof(float)) != cudaSuccess) {
        failed = bench_team_fail(r, "out of memory for 2 x %zu bytes on cuda:%d", o->max_bytes,
                                 a.mem.ordinal);
        goto out;
    }
    bench_fill(host, max_count, r->rank, 0);
    /* The transports' streams are non-blocking: nothing orders them after the legacy
     * stream's copies and memsets but a synchronization. */
    if (cudaMemcpy(a.send, host, max_count * sizeof(float), cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
        failed = bench_team_fail(r, "cudaMemcpy failed");
        goto out;
    }
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;
         bytes = bench_next_size(bytes, o->factor)) {
        a.count = bytes / 4;
        if (cudaMemset(a.recv, 0xff, a.count * sizeof(float)) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            failed = bench_team_fail(r, "cudaMemset failed");
            goto out;
        }
        atomic_store(&c->wrong, 0);
        if (!bench_team_barrier(r) ||
            bench_team_time(r, run_seldp_allreduce, &a, o->warmup, o->iters,
                            bench_batch(a.count * sizeof(float)), c->samples))
            goto out;
        if (cudaMemcpy(host, a.recv, a.count * sizeof(float), cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
            failed = bench_team_fail(r, "cudaMemcpy failed");
            goto out;
        }
        atomic_fetch_add(&c->wrong, allreduce_wrong(host, a.count, r->size));
        bench_fill(host, a.count, r->rank, 0); /* back to this rank's pattern */
        if (!bench_team_barrier(r))
            goto out;
        if (r->rank == 0) {
            bench_row row = bench_row_make("allreduce", c->impl, r->size, a.count * sizeof(float));
            row.time_us = 1e6 * bench_median(c->samples, o->iters);
            row.wrong = atomic_load(&c->wrong);
            snprintf(row.dtype, sizeof row.dtype, "f32");
            snprintf(row.note, sizeof row.note, "device buffers");
            bench_row_finish(&row, 0);
            bench_rows_add(c->rows, &row);
        }
    }
out:
    bench_team_barrier(r);
    cudaFree(a.send);
    cudaFree(a.recv);
    free(host);
    return failed;
}

/* seldp_session_reduce of the selection, device tensors, on the NCCL transport. */
static int gpu_reduce_rank(bench_rank *r)
{
    gpu_ctx *c = r->arg;
    const bench_opts *o = c->o;
    const bench_selection *s = c->sel;
    seldp_device dev = device_of(r, c);
    char *pristine = NULL, *grads = NULL, *host = malloc(s->arena);
    seldp_param_id *ids = calloc((size_t)s->n, sizeof *ids);
    seldp_model *model = NULL;
    seldp_grads *container = NULL;
    seldp_session *session = NULL;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    uint64_t W = 0, weight = bench_weight(r->rank, r->size, &W), got = 0;
    int failed = 0;

    if (!host || !ids || cudaMalloc((void **)&pristine, s->arena) != cudaSuccess ||
        cudaMalloc((void **)&grads, s->arena) != cudaSuccess) {
        failed = bench_team_fail(r, "out of memory for the selection on cuda:%d", dev.ordinal);
        goto out;
    }
    if (seldp_model_create(r->rank, &model) != SELDP_OK ||
        seldp_grads_create(&container) != SELDP_OK) {
        failed = bench_team_fail(r, "model or gradient container: %s", seldp_last_error());
        goto out;
    }
    for (int t = 0; t < s->n; t++) {
        char path[64];
        int64_t shape[1] = {(int64_t)s->count[t]};
        seldp_tensor p = seldp_tensor_view(s->dtype[t], dev, pristine + s->offset[t], 1, shape);
        seldp_tensor g = seldp_tensor_view(s->dtype[t], dev, grads + s->offset[t], 1, shape);
        snprintf(path, sizeof path, "layers.%03d.p%06d.weight", t / 100, t);
        ids[t] = (seldp_param_id)t + 1;
        if (seldp_model_add(model, path, ids[t], &p, false, NULL) != SELDP_OK ||
            seldp_grads_put(container, ids[t], &g, SELDP_BORROWED) != SELDP_OK) {
            failed = bench_team_fail(r, "'%s': %s", path, seldp_last_error());
            goto out;
        }
    }
    cfg.bucket_bytes = o->buckets[0];
    if (seldp_session_initialize(r->comm, model, 0, ids, (size_t)s->n, &cfg, &session) !=
        SELDP_OK) {
        failed = bench_team_fail(r, "seldp_session_initialize: %s", seldp_last_error());
        goto out;
    }
    bench_selection_fill(s, host, r->rank);
    if (cudaMemcpy(pristine, host, s->arena, cudaMemcpyHostToDevice) != cudaSuccess) {
        failed = bench_team_fail(r, "cudaMemcpy failed");
        goto out;
    }
    atomic_store(&c->wrong, 0);
    for (int it = 0; it < o->warmup + o->iters; it++) {
        if (cudaMemcpy(grads, pristine, s->arena, cudaMemcpyDeviceToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            failed = bench_team_fail(r, "cudaMemcpy failed");
            goto out;
        }
        if (!bench_team_barrier(r))
            goto out;
        double t0 = bench_now();
        if (seldp_session_reduce(session, container, weight, SELDP_MISSING_ERROR, &got) !=
            SELDP_OK) {
            failed = bench_team_fail(r, "seldp_session_reduce: %s", seldp_last_error());
            goto out;
        }
        if (!bench_team_barrier(r))
            goto out;
        if (r->rank == 0 && it >= o->warmup)
            c->samples[it - o->warmup] = bench_now() - t0;
    }
    if (cudaMemcpy(host, grads, s->arena, cudaMemcpyDeviceToHost) != cudaSuccess) {
        failed = bench_team_fail(r, "cudaMemcpy failed");
        goto out;
    }
    const void *arenas[1] = {host};
    atomic_fetch_add(&c->wrong, bench_selection_wrong(s, arenas, 1, r->size, 0, 1));
    if (!bench_team_barrier(r))
        goto out;
    if (r->rank == 0) {
        bench_row row = bench_row_make("reduce", "seldp-nccl", r->size, s->bytes);
        row.time_us = 1e6 * bench_median(c->samples, o->iters);
        row.wrong = atomic_load(&c->wrong) + (got != W);
        snprintf(row.dtype, sizeof row.dtype, "%s", o->dtype);
        row.bucket_bytes = cfg.bucket_bytes;
        row.tensors = s->n;
        bench_row_finish(&row, 0);
        /* beside the raw ncclAllReduce of the nearest size (the selection's bytes may differ
         * from the size asked for by a few elements) */
        const bench_row *raw = NULL;
        for (int i = 0; i < c->rows->n; i++) {
            const bench_row *x = &c->rows->at[i];
            double d = fabs((double)x->bytes - (double)s->bytes);
            if (strcmp(x->impl, "nccl") == 0 &&
                (!raw || d < fabs((double)raw->bytes - (double)s->bytes)))
                raw = x;
        }
        if (raw && raw->bytes == s->bytes)
            row.raw_time_us = raw->time_us;
        if (raw && raw->busbw > 0)
            snprintf(row.note, sizeof row.note, "%.0f%% of raw NCCL busbw",
                     100.0 * row.busbw / raw->busbw);
        bench_rows_add(c->rows, &row);
    }
out:
    bench_team_barrier(r);
    seldp_session_destroy(session);
    seldp_grads_destroy(container);
    seldp_model_destroy(model);
    cudaFree(pristine);
    cudaFree(grads);
    free(host);
    free(ids);
    return failed;
}

/* Raw ncclAllReduce over P GPUs from this thread, every size. */
static int raw_nccl_rows(const bench_opts *o, int P, bench_rows *rows)
{
    ncclComm_t comms[64];
    cudaStream_t streams[64];
    float *send[64] = {0}, *recv[64] = {0};
    int devs[64];
    size_t max_count = o->max_bytes / 4;
    float *host = malloc(max_count * sizeof(float));
    double *samples = calloc((size_t)o->iters, sizeof *samples);
    int failed = 0;

    for (int d = 0; d < P; d++)
        devs[d] = d;
    if (!host || !samples || ncclCommInitAll(comms, P, devs) != ncclSuccess) {
        fprintf(stderr, "seldp-bench --gpu: ncclCommInitAll over %d GPUs failed\n", P);
        free(host);
        free(samples);
        return 1;
    }
    for (int d = 0; d < P && !failed; d++) {
        bench_fill(host, max_count, d, 0);
        failed = cudaSetDevice(d) != cudaSuccess || cudaStreamCreate(&streams[d]) != cudaSuccess ||
                 cudaMalloc((void **)&send[d], max_count * sizeof(float)) != cudaSuccess ||
                 cudaMalloc((void **)&recv[d], max_count * sizeof(float)) != cudaSuccess ||
                 cudaMemcpy(send[d], host, max_count * sizeof(float), cudaMemcpyHostToDevice) !=
                     cudaSuccess;
    }
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && !failed;
         bytes = bench_next_size(bytes, o->factor)) {
        size_t count = bytes / 4;
        int k = bench_batch(count * sizeof(float));
        for (int d = 0; d < P; d++) {
            cudaSetDevice(d);
            cudaMemset(recv[d], 0xff, count * sizeof(float));
        }
        for (int s = -o->warmup; s < o->iters && !failed; s++) {
            double t0 = bench_now();
            for (int i = 0; i < (s < 0 ? 1 : k); i++) {
                ncclGroupStart();
                for (int d = 0; d < P; d++)
                    ncclAllReduce(send[d], recv[d], count, ncclFloat, ncclSum, comms[d],
                                  streams[d]);
                failed |= ncclGroupEnd() != ncclSuccess;
            }
            for (int d = 0; d < P; d++) {
                cudaSetDevice(d);
                failed |= cudaStreamSynchronize(streams[d]) != cudaSuccess;
            }
            if (s >= 0)
                samples[s] = (bench_now() - t0) / k;
        }
        long long wrong = 0;
        for (int d = 0; d < P && !failed; d++) {
            cudaSetDevice(d);
            failed = cudaMemcpy(host, recv[d], count * sizeof(float), cudaMemcpyDeviceToHost) !=
                     cudaSuccess;
            wrong += allreduce_wrong(host, count, P);
        }
        bench_row row = bench_row_make("allreduce", "nccl", P, count * sizeof(float));
        row.time_us = 1e6 * bench_median(samples, o->iters);
        row.wrong = wrong;
        snprintf(row.dtype, sizeof row.dtype, "f32");
        snprintf(row.note, sizeof row.note, "raw ncclAllReduce");
        bench_row_finish(&row, 0);
        bench_rows_add(rows, &row);
    }
    if (failed)
        fprintf(stderr, "seldp-bench --gpu: a CUDA or NCCL call failed in the raw rows\n");
    for (int d = 0; d < P; d++) {
        cudaSetDevice(d);
        cudaFree(send[d]);
        cudaFree(recv[d]);
        cudaStreamDestroy(streams[d]);
        ncclCommDestroy(comms[d]);
    }
    free(host);
    free(samples);
    return failed;
}

/* One measurement group on a world of its own: a world's ranks join it once, and an NCCL
 * unique id names one communicator, so every group draws a fresh world. */
static int run_on_nccl_world(int P, int (*body)(bench_rank *), gpu_ctx *c)
{
    if (seldp_nccl_world_create(P, NULL, &c->world) != SELDP_OK) {
        fprintf(stderr, "seldp-bench --gpu: NCCL world of %d ranks: %s\n", P, seldp_last_error());
        return 1;
    }
    int failed = bench_team_run_join(P, join_nccl, body, c);
    seldp_nccl_world_destroy(c->world);
    c->world = NULL;
    return failed;
}

int bench_gpu_rows(const bench_opts *o, bench_rows *rows)
{
    int gpus = seldp_nccl_device_count();
    if (gpus <= 0) {
        printf("# no GPU: CUDA sees no device, so the GPU rows (raw NCCL, seldp on NCCL, "
               "host-staged with device buffers) are skipped\n");
        return 0;
    }
    /* one rank per GPU: every GPU, or the first --ranks value if smaller */
    int P = gpus < 64 ? gpus : 64;
    if (o->ranks_given && o->ranks[0] < P)
        P = o->ranks[0];
    gpu_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.gpus = gpus;
    c.rows = rows;
    atomic_init(&c.wrong, 0);
    c.samples = calloc((size_t)o->iters, sizeof *c.samples);
    if (!c.samples)
        return 1;
    printf("# %d GPU(s), %d rank(s), one per GPU\n", gpus, P);
    int failed = raw_nccl_rows(o, P, rows);
    c.impl = "seldp-nccl";
    if (!failed)
        failed = run_on_nccl_world(P, gpu_allreduce_rank, &c);
    for (size_t bytes = o->min_bytes; !failed && bytes <= o->max_bytes;
         bytes = bench_next_size(bytes, o->factor)) {
        bench_selection s;
        int tensors = o->tensors;
        while (tensors > 1 && bytes < (size_t)tensors * 64)
            tensors /= 2;
        if (!bench_selection_make(&s, tensors, bytes, o->dtype))
            break;
        c.sel = &s;
        failed = run_on_nccl_world(P, gpu_reduce_rank, &c);
        bench_selection_free(&s);
    }
    if (!failed) {
        c.impl = "seldp-host";
        failed = bench_team_run_join(P, join_host_on_device, gpu_allreduce_rank, &c);
    }
    free(c.samples);
    return failed;
}

#endif
