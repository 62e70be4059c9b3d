/* Rank functions shared by the GPU world tests: the communicator contract with device and
 * host buffers, and a session over device tensors. No cmocka calls here (rank threads). */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_checks.h"

#define COUNT 1025

/* ---- buffers on the host or the rank's device ------------------------------------------ */

/* A copy of `bytes` host bytes in memory of kind `mem` (NULL when out of memory). */
static void *mem_dup(seldp_device mem, const void *host, size_t bytes)
{
    void *p = gpu_buf_alloc(mem, bytes);
    if (p && gpu_upload(mem, p, host, bytes) != SELDP_OK) {
        gpu_buf_free(mem, p);
        return NULL;
    }
    return p;
}

static seldp_status mem_read(seldp_device mem, void *host, const void *p, size_t bytes)
{
    return gpu_download(mem, host, p, bytes);
}

static uint64_t fnv1a(const void *data, size_t bytes, uint64_t h)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Every rank of the world passes the same hash (an allgather over host memory). */
static int same_on_every_rank(tr_rank_ctx *ctx, seldp_comm *comm, uint64_t mine, const char *what)
{
    int n = seldp_comm_size(comm);
    uint64_t all[64];
    RANK_CHECK(ctx, n <= 64, "group of %d ranks is too large for this check", n);
    RANK_CHECK_OK(ctx, seldp_comm_allgather(comm, &mine, all, sizeof mine, SELDP_HOST_DEVICE));
    for (int q = 0; q < n; q++)
        RANK_CHECK(ctx, all[q] == mine,
                   "%s differs between ranks: group rank %d has %016" PRIx64
                   ", rank %d %016" PRIx64,
                   what, q, all[q], seldp_comm_rank(comm), mine);
    return 0;
}

/* ---- collectives ------------------------------------------------------------------------ */

static int check_broadcast(tr_rank_ctx *ctx, seldp_device mem)
{
    int r = ctx->rank, n = ctx->size;
    for (int root = 0; root < n; root++) {
        size_t bytes = 1000 + 13 * (size_t)root;
        unsigned char *want = malloc(bytes), *got = malloc(bytes);
        RANK_CHECK(ctx, want && got, "out of memory");
        tr_fill_bytes(want, bytes, 100 + (uint64_t)root);
        tr_fill_bytes(got, bytes, r == root ? 100 + (uint64_t)root : 900 + (uint64_t)r);
        void *buf = mem_dup(mem, got, bytes);
        RANK_CHECK(ctx, buf, "out of memory for %zu bytes", bytes);
        RANK_CHECK_OK(ctx, seldp_comm_broadcast(ctx->world, buf, bytes, SELDP_U8, root, mem));
        RANK_CHECK_OK(ctx, mem_read(mem, got, buf, bytes));
        size_t d = tr_first_diff(got, want, bytes);
        RANK_CHECK(ctx, d == bytes, "broadcast from root %d (mem %s): byte %zu differs", root,
                   mem.kind == SELDP_DEVICE_HOST ? "host" : "cuda", d);
        gpu_buf_free(mem, buf);
        free(want);
        free(got);
    }
    return 0;
}

/* Element i of rank q's allreduce input, chosen so that every sum is exact. */
static void elem(seldp_dtype dtype, int q, size_t i, void *out)
{
    uint64_t h = tr_hash(40 + (uint64_t)q, i);
    switch (dtype) {
    case SELDP_F32:
        *(float *)out = (float)((int)(h % 128) - 64) / 8.0f;
        break;
    case SELDP_F64:
        *(double *)out = (double)(int64_t)(h % (1u << 20)) - (double)(1u << 19);
        break;
    case SELDP_I64:
        *(int64_t *)out = (int64_t)(h % (1ull << 40)) - (int64_t)(1ull << 39);
        break;
    default:
        *(uint64_t *)out = h;
        break; /* U64 sums wrap, as they do everywhere */
    }
}

static int check_allreduce(tr_rank_ctx *ctx, seldp_device mem)
{
    const seldp_dtype dtypes[] = {SELDP_F32, SELDP_F64, SELDP_I64, SELDP_U64};
    for (size_t k = 0; k < 4; k++) {
        seldp_dtype dt = dtypes[k];
        size_t es = seldp_dtype_size(dt), bytes = COUNT * es;
        unsigned char *in = malloc(bytes), *want = calloc(COUNT, es), *got = malloc(bytes);
        RANK_CHECK(ctx, in && want && got, "out of memory");
        for (size_t i = 0; i < COUNT; i++) {
            elem(dt, ctx->rank, i, in + i * es);
            for (int q = 0; q < ctx->size; q++) {
                unsigned char v[8];
                elem(dt, q, i, v);
                void *w = want + i * es;
                switch (dt) {
                case SELDP_F32:
                    *(float *)w += *(float *)v;
                    break;
                case SELDP_F64:
                    *(double *)w += *(double *)v;
                    break;
                case SELDP_I64:
                    *(int64_t *)w += *(int64_t *)v;
                    break;
                default:
                    *(uint64_t *)w += *(uint64_t *)v;
                    break;
                }
            }
        }
        for (int in_place = 0; in_place < 2; in_place++) {
            void *send = mem_dup(mem, in, bytes);
            void *recv = in_place ? send : gpu_buf_alloc(mem, bytes);
            RANK_CHECK(ctx, send && recv, "out of memory");
            RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, send, recv, COUNT, dt, mem));
            RANK_CHECK_OK(ctx, mem_read(mem, got, recv, bytes));
            size_t d = tr_first_diff(got, want, bytes);
            RANK_CHECK(ctx, d == bytes, "allreduce %s (%s, mem %s): element %zu differs",
                       seldp_dtype_name(dt), in_place ? "in place" : "out of place",
                       mem.kind == SELDP_DEVICE_HOST ? "host" : "cuda", d / es);
            if (!in_place) {
                RANK_CHECK_OK(ctx, mem_read(mem, got, send, bytes));
                RANK_CHECK(ctx, memcmp(got, in, bytes) == 0,
                           "allreduce out of place changed the send buffer");
                gpu_buf_free(mem, recv);
            }
            gpu_buf_free(mem, send);
        }
        free(in);
        free(want);
        free(got);
    }
    return 0;
}

static int check_allgather(tr_rank_ctx *ctx, seldp_device mem)
{
    const size_t bytes = 333;
    size_t total = bytes * (size_t)ctx->size;
    unsigned char *mine = malloc(bytes), *got = malloc(total), *want = malloc(bytes);
    RANK_CHECK(ctx, mine && got && want, "out of memory");
    tr_fill_bytes(mine, bytes, 200 + (uint64_t)ctx->rank);
    void *send = mem_dup(mem, mine, bytes);
    void *recv = gpu_buf_alloc(mem, total);
    RANK_CHECK(ctx, send && recv, "out of memory");
    RANK_CHECK_OK(ctx, seldp_comm_allgather(ctx->world, send, recv, bytes, mem));
    RANK_CHECK_OK(ctx, mem_read(mem, got, recv, total));
    for (int q = 0; q < ctx->size; q++) {
        tr_fill_bytes(want, bytes, 200 + (uint64_t)q);
        RANK_CHECK(ctx, memcmp(got + (size_t)q * bytes, want, bytes) == 0,
                   "allgather (mem %s): the piece of rank %d differs",
                   mem.kind == SELDP_DEVICE_HOST ? "host" : "cuda", q);
    }
    gpu_buf_free(mem, send);
    gpu_buf_free(mem, recv);
    free(mine);
    free(got);
    free(want);
    return 0;
}

static int check_allgatherv(tr_rank_ctx *ctx)
{
    int n = ctx->size;
    size_t mine_bytes = 37 * (size_t)ctx->rank; /* rank 0 sends nothing */
    unsigned char *mine = malloc(mine_bytes + 1), *want = malloc(37 * (size_t)n + 1);
    size_t *lengths = calloc((size_t)n, sizeof *lengths);
    void *all = NULL;
    RANK_CHECK(ctx, mine && want && lengths, "out of memory");
    tr_fill_bytes(mine, mine_bytes, 300 + (uint64_t)ctx->rank);
    RANK_CHECK_OK(ctx, seldp_comm_allgatherv(ctx->world, mine, mine_bytes, &all, lengths));
    size_t at = 0;
    for (int q = 0; q < n; q++) {
        RANK_CHECK(ctx, lengths[q] == 37 * (size_t)q,
                   "allgatherv: rank %d's length is %zu, not %zu", q, lengths[q], 37 * (size_t)q);
        tr_fill_bytes(want, lengths[q], 300 + (uint64_t)q);
        RANK_CHECK(ctx, memcmp((unsigned char *)all + at, want, lengths[q]) == 0,
                   "allgatherv: rank %d's blob differs", q);
        at += lengths[q];
    }
    free(all);
    free(mine);
    free(want);
    free(lengths);
    return 0;
}

/* Pieces of (r + 2p) % 4 * 3 floats from r to p, one unused float between pieces on both
 * sides: the gaps must keep their sentinel. */
static int check_alltoallv(tr_rank_ctx *ctx, seldp_device mem)
{
    int n = ctx->size, r = ctx->rank;
    size_t sc[64], sd[64], rc[64], rd[64], send_n = 0, recv_n = 0;
    RANK_CHECK(ctx, n <= 64, "too many ranks");
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)((r + 2 * p) % 4) * 3;
        rc[p] = (size_t)((p + 2 * r) % 4) * 3;
        sd[p] = send_n;
        rd[p] = recv_n;
        send_n += sc[p] + 1;
        recv_n += rc[p] + 1;
    }
    float *send = malloc(send_n * sizeof *send), *got = malloc(recv_n * sizeof *got);
    RANK_CHECK(ctx, send && got, "out of memory");
    for (size_t i = 0; i < send_n; i++)
        send[i] = -2.0f;
    for (size_t i = 0; i < recv_n; i++)
        got[i] = -1.0f;
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < sc[p]; k++)
            send[sd[p] + k] = (float)(r * 1000 + p * 100 + (int)k);
    void *dsend = mem_dup(mem, send, send_n * sizeof *send);
    void *drecv = mem_dup(mem, got, recv_n * sizeof *got);
    RANK_CHECK(ctx, dsend && drecv, "out of memory");
    RANK_CHECK_OK(ctx,
                  seldp_comm_alltoallv(ctx->world, dsend, sc, sd, drecv, rc, rd, SELDP_F32, mem));
    RANK_CHECK_OK(ctx, mem_read(mem, got, drecv, recv_n * sizeof *got));
    for (int p = 0; p < n; p++) {
        for (size_t k = 0; k < rc[p]; k++)
            RANK_CHECK(ctx, got[rd[p] + k] == (float)(p * 1000 + r * 100 + (int)k),
                       "alltoallv (mem %s): element %zu from rank %d is %g",
                       mem.kind == SELDP_DEVICE_HOST ? "host" : "cuda", k, p,
                       (double)got[rd[p] + k]);
        RANK_CHECK(ctx, got[rd[p] + rc[p]] == -1.0f,
                   "alltoallv (mem %s) wrote into the gap after rank %d's piece",
                   mem.kind == SELDP_DEVICE_HOST ? "host" : "cuda", p);
    }
    gpu_buf_free(mem, dsend);
    gpu_buf_free(mem, drecv);
    free(send);
    free(got);
    return 0;
}

static int check_splits(tr_rank_ctx *ctx)
{
    int r = ctx->rank, n = ctx->size;
    seldp_device dev = seldp_comm_device(ctx->world);
    seldp_comm *sub = NULL, *nest = NULL, *most = NULL;

    /* by parity, keys reversing the order */
    int color = r % 2, size = 0, rank = 0;
    double want = 0;
    for (int q = 0; q < n; q++) {
        if (q % 2 != color)
            continue;
        size++;
        rank += q > r;
        want += q;
    }
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, color, n - r, &sub));
    RANK_CHECK(ctx, sub != NULL, "split by parity gave no communicator");
    RANK_CHECK(ctx, seldp_comm_size(sub) == size && seldp_comm_rank(sub) == rank,
               "split by parity: rank %d of %d, expected %d of %d", seldp_comm_rank(sub),
               seldp_comm_size(sub), rank, size);
    RANK_CHECK(ctx, seldp_comm_world_rank(sub) == r, "split: world rank %d, expected %d",
               seldp_comm_world_rank(sub), r);
    RANK_CHECK(ctx, strcmp(seldp_comm_transport(sub), seldp_comm_transport(ctx->world)) == 0,
               "split changed the transport");
    double v = r, *dv = mem_dup(dev, &v, sizeof v);
    RANK_CHECK(ctx, dv, "out of memory");
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(sub, dv, dv, 1, SELDP_F64, dev));
    RANK_CHECK_OK(ctx, mem_read(dev, &v, dv, sizeof v));
    RANK_CHECK(ctx, v == want, "allreduce over the parity group gave %g, expected %g", v, want);

    /* a split of the split: one group in the same order */
    RANK_CHECK_OK(ctx, seldp_comm_split(sub, 7, seldp_comm_rank(sub), &nest));
    RANK_CHECK(ctx, nest && seldp_comm_size(nest) == size && seldp_comm_rank(nest) == rank,
               "nested split: expected rank %d of %d", rank, size);
    v = 1.0;
    RANK_CHECK_OK(ctx, gpu_upload(dev, dv, &v, sizeof v));
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(nest, dv, dv, 1, SELDP_F64, dev));
    RANK_CHECK_OK(ctx, mem_read(dev, &v, dv, sizeof v));
    RANK_CHECK(ctx, v == size, "allreduce over the nested group gave %g, expected %d", v, size);
    seldp_comm_destroy(nest);
    seldp_comm_destroy(sub);

    /* the last rank joins no group */
    bool outside = r == n - 1;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, outside ? SELDP_COMM_NO_GROUP : 0, r, &most));
    if (outside) {
        RANK_CHECK(ctx, most == NULL, "a rank with SELDP_COMM_NO_GROUP got a communicator");
    } else {
        RANK_CHECK(ctx, most && seldp_comm_size(most) == n - 1 && seldp_comm_rank(most) == r,
                   "split without the last rank: expected rank %d of %d", r, n - 1);
        RANK_CHECK_OK(ctx, seldp_comm_barrier(most));
        seldp_comm_destroy(most);
    }
    gpu_buf_free(dev, dv);
    return 0;
}

/* An inexact sum (floats in [-1, 1)): whatever order the transport uses, every rank must
 * receive the same bits. */
static int check_replicas_identical(tr_rank_ctx *ctx)
{
    const size_t n = 4097;
    seldp_device dev = seldp_comm_device(ctx->world);
    float *x = malloc(n * sizeof *x);
    RANK_CHECK(ctx, x, "out of memory");
    tr_fill_f32(x, n, 500 + (uint64_t)ctx->rank);
    float *dx = mem_dup(dev, x, n * sizeof *x);
    RANK_CHECK(ctx, dx, "out of memory");
    RANK_CHECK_OK(ctx, seldp_comm_allreduce(ctx->world, dx, dx, n, SELDP_F32, dev));
    RANK_CHECK_OK(ctx, mem_read(dev, x, dx, n * sizeof *x));
    if (same_on_every_rank(ctx, ctx->world, fnv1a(x, n * sizeof *x, 0xcbf29ce484222325ull),
                           "allreduce result"))
        return 1;
    gpu_buf_free(dev, dx);
    free(x);
    return 0;
}

int gpu_check_collectives(tr_rank_ctx *ctx)
{
    seldp_device mems[2] = {seldp_comm_device(ctx->world), SELDP_HOST_DEVICE};
    for (int m = 0; m < 2; m++) {
        if (check_broadcast(ctx, mems[m]) || check_allreduce(ctx, mems[m]) ||
            check_allgather(ctx, mems[m]) || check_alltoallv(ctx, mems[m]))
            return 1;
        RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    }
    if (check_allgatherv(ctx) || check_splits(ctx) || check_replicas_identical(ctx))
        return 1;
    RANK_CHECK_OK(ctx, seldp_comm_barrier(ctx->world));
    return 0;
}

/* ---- a session over device tensors -------------------------------------------------------- */

#define N_SEL 3

static const char *const sel_paths[N_SEL] = {"layers.0.a.weight", "layers.0.b.weight",
                                             "layers.0.c.weight"};
static const seldp_dtype sel_dtypes[N_SEL] = {SELDP_F32, SELDP_F16, SELDP_BF16};
static const int sel_ndim[N_SEL] = {1, 2, 1};
static const int64_t sel_shapes[N_SEL][2] = {{64, 0}, {3, 5}, {33, 0}};

static size_t sel_numel(int i)
{
    return (size_t)(sel_shapes[i][0] * (sel_ndim[i] == 2 ? sel_shapes[i][1] : 1));
}

/* n values of `dtype` (stored) from F32 values: rounded to nearest even for halves. */
static void store(seldp_dtype dtype, const float *f, size_t n, void *out)
{
    if (dtype == SELDP_F32)
        memcpy(out, f, n * sizeof *f);
    else
        seldp_f32_to_half(dtype, f, out, n);
}

static double load(seldp_dtype dtype, const void *p, size_t i)
{
    if (dtype == SELDP_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == SELDP_BF16 ? seldp_bf16_to_f32(h) : seldp_f16_to_f32(h);
}

/* The stored bytes of selected parameter i of rank q before initialize. */
static void param_bytes(int i, int q, void *out)
{
    float f[64];
    tr_fill_f32(f, sel_numel(i), 10 * (uint64_t)q + (uint64_t)i);
    store(sel_dtypes[i], f, sel_numel(i), out);
}

/* Gradient i of rank q for call `call`: multiples of 1/8 in [-8, 8), so that every sum of
 * up to 8 ranks is exact in F32 and exactly representable in F16 and BF16. */
static void grad_values(int call, int i, int q, float *out)
{
    tr_fill_f32_exact(out, sel_numel(i), 70 + 10 * (uint64_t)call + 3 * (uint64_t)q + (uint64_t)i);
}

/* A device tensor holding host bytes; the caller frees it with seldp_tensor_free. */
static seldp_status device_tensor(seldp_device dev, seldp_dtype dtype, int ndim,
                                  const int64_t *shape, const void *host, seldp_tensor *out)
{
    *out = seldp_tensor_view(dtype, dev, NULL, ndim, shape);
    seldp_status st = seldp_tensor_alloc(out);
    if (st != SELDP_OK)
        return st;
    seldp_tensor src = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, (void *)host, ndim, shape);
    return seldp_tensor_copy(out, &src);
}

/* The stream contract of seldp/nccl.h, as a caller meets it: a tensor written by a copy on
 * the caller's own non-blocking stream, synchronized before it is handed to seldp ... */
static seldp_status own_stream_tensor(seldp_device dev, seldp_dtype dtype, int ndim,
                                      const int64_t *shape, const void *host, seldp_tensor *out)
{
    if (dev.kind == SELDP_DEVICE_HOST)
        return device_tensor(dev, dtype, ndim, shape, host, out);
    *out = seldp_tensor_view(dtype, dev, NULL, ndim, shape);
    seldp_status st = seldp_tensor_alloc(out);
    if (st != SELDP_OK)
        return st;
    cudaStream_t mine = NULL;
    cudaError_t err = cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(out->data, host, seldp_tensor_nbytes(out), cudaMemcpyHostToDevice,
                              mine);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(mine); /* what the contract asks of the caller */
    if (mine)
        cudaStreamDestroy(mine);
    return err == cudaSuccess ? SELDP_OK : SELDP_ERR_TRANSPORT;
}

/* ... and a result seldp wrote, read on another non-blocking stream with no wait for seldp:
 * complete when the call returned. */
static seldp_status own_stream_download(seldp_device dev, void *host, const void *d, size_t bytes)
{
    if (dev.kind == SELDP_DEVICE_HOST) {
        memcpy(host, d, bytes);
        return SELDP_OK;
    }
    cudaStream_t mine = NULL;
    cudaError_t err = cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(host, d, bytes, cudaMemcpyDeviceToHost, mine);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(mine);
    if (mine)
        cudaStreamDestroy(mine);
    return err == cudaSuccess ? SELDP_OK : SELDP_ERR_TRANSPORT;
}

static seldp_param_id sel_id(int i, int r)
{
    return 0x1000 + 17 * (seldp_param_id)i + (seldp_param_id)r;
}

typedef struct session_state {
    seldp_device dev;
    seldp_model *model;
    seldp_session *session;
    seldp_tensor params[N_SEL];
    seldp_tensor priv; /* an unselected parameter whose shape differs by rank */
    unsigned char priv_host[64];
} session_state;

static int session_setup(tr_rank_ctx *ctx, session_state *s)
{
    int r = ctx->rank, n = ctx->size;
    unsigned char bytes[64 * 4];
    s->dev = seldp_comm_device(ctx->world);
    RANK_CHECK_OK(ctx, seldp_model_create(r, &s->model));
    for (int i = 0; i < N_SEL; i++) {
        param_bytes(i, r, bytes);
        RANK_CHECK_OK(ctx, device_tensor(s->dev, sel_dtypes[i], sel_ndim[i], sel_shapes[i], bytes,
                                         &s->params[i]));
        RANK_CHECK_OK(
            ctx, seldp_model_add(s->model, sel_paths[i], sel_id(i, r), &s->params[i], false, NULL));
    }
    char path[64];
    snprintf(path, sizeof path, "private.rank%d.weight", r);
    int64_t priv_shape[1] = {r + 2};
    tr_fill_bytes(s->priv_host, (size_t)(r + 2) * 4, 600 + (uint64_t)r);
    RANK_CHECK_OK(ctx, device_tensor(s->dev, SELDP_F32, 1, priv_shape, s->priv_host, &s->priv));
    RANK_CHECK_OK(
        ctx, seldp_model_add(s->model, path, 0x9000 + (seldp_param_id)r, &s->priv, false, NULL));

    seldp_param_id ids[N_SEL];
    for (int i = 0; i < N_SEL; i++)
        ids[i] = sel_id(i, r);
    /* 64-byte buckets: initialize broadcasts each dtype in several buckets (the next
     * broadcast must not overwrite a bucket still being copied out), and the reductions
     * allreduce several buckets too */
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    cfg.bucket_bytes = 64;
    RANK_CHECK_OK(
        ctx, seldp_session_initialize(ctx->world, s->model, n - 1, ids, N_SEL, &cfg, &s->session));
    for (int i = 0; i < N_SEL; i++) {
        unsigned char want[64 * 4], got[64 * 4];
        size_t nb = seldp_tensor_nbytes(&s->params[i]);
        param_bytes(i, n - 1, want);
        RANK_CHECK_OK(ctx, gpu_download(s->dev, got, s->params[i].data, nb));
        RANK_CHECK(ctx, memcmp(got, want, nb) == 0,
                   "after initialize, '%s' is not the root's (rank %d) value", sel_paths[i], n - 1);
    }
    return 0;
}

/* The unselected parameter and its gradient kept their bytes. */
static int check_private(tr_rank_ctx *ctx, session_state *s, seldp_grads *grads,
                         const seldp_tensor *priv_grad, const unsigned char *priv_grad_host)
{
    unsigned char got[64];
    size_t nb = seldp_tensor_nbytes(&s->priv);
    RANK_CHECK_OK(ctx, gpu_download(s->dev, got, s->priv.data, nb));
    RANK_CHECK(ctx, memcmp(got, s->priv_host, nb) == 0, "an unselected parameter changed");
    const seldp_tensor *g = seldp_grads_get(grads, 0x9000 + (seldp_param_id)ctx->rank);
    RANK_CHECK(ctx, g && g->data == priv_grad->data && g->dtype == SELDP_F32,
               "the unselected gradient was replaced");
    RANK_CHECK_OK(ctx, gpu_download(s->dev, got, g->data, nb));
    RANK_CHECK(ctx, memcmp(got, priv_grad_host, nb) == 0, "the unselected gradient changed");
    return 0;
}

/* Rank r's token count: r + 3, so that a world of one GPU still divides by a weight that is
 * not 1 (and not a power of two), and the scale of the mean is exercised. */
static uint64_t mean_weight(int r)
{
    return (uint64_t)r + 3;
}

/* Mean of gradients in the parameter dtype, policy error. */
static int session_reduce_mean(tr_rank_ctx *ctx, session_state *s)
{
    int r = ctx->rank, n = ctx->size;
    seldp_grads *grads = NULL;
    seldp_tensor g[N_SEL], priv_grad;
    unsigned char host[64 * 4], priv_host[64];
    float f[64];
    RANK_CHECK_OK(ctx, seldp_grads_create(&grads));
    for (int i = 0; i < N_SEL; i++) {
        grad_values(0, i, r, f);
        store(sel_dtypes[i], f, sel_numel(i), host);
        RANK_CHECK_OK(
            ctx, own_stream_tensor(s->dev, sel_dtypes[i], sel_ndim[i], sel_shapes[i], host, &g[i]));
        RANK_CHECK_OK(ctx, seldp_grads_put(grads, sel_id(i, r), &g[i], SELDP_BORROWED));
    }
    int64_t priv_shape[1] = {r + 2};
    tr_fill_bytes(priv_host, (size_t)(r + 2) * 4, 700 + (uint64_t)r);
    RANK_CHECK_OK(ctx, device_tensor(s->dev, SELDP_F32, 1, priv_shape, priv_host, &priv_grad));
    RANK_CHECK_OK(ctx,
                  seldp_grads_put(grads, 0x9000 + (seldp_param_id)r, &priv_grad, SELDP_BORROWED));

    uint64_t global = 0, want_global = 0;
    for (int q = 0; q < n; q++)
        want_global += mean_weight(q);
    RANK_CHECK_OK(
        ctx, seldp_session_reduce(s->session, grads, mean_weight(r), SELDP_MISSING_ERROR, &global));
    RANK_CHECK(ctx, global == want_global, "global weight %" PRIu64 ", expected %" PRIu64, global,
               want_global);

    uint64_t hash = 0xcbf29ce484222325ull;
    for (int i = 0; i < N_SEL; i++) {
        const seldp_tensor *t = seldp_grads_get(grads, sel_id(i, r));
        RANK_CHECK(ctx, t && t->data == g[i].data && t->dtype == sel_dtypes[i],
                   "'%s': the mean was not written in place in the caller's tensor", sel_paths[i]);
        size_t nb = seldp_tensor_nbytes(t), numel = sel_numel(i);
        RANK_CHECK_OK(ctx, own_stream_download(s->dev, host, t->data, nb));
        hash = fnv1a(host, nb, hash);
        double rel = sel_dtypes[i] == SELDP_F32   ? 0x1p-23
                     : sel_dtypes[i] == SELDP_F16 ? 0x1p-10
                                                  : 0x1p-7;
        for (size_t k = 0; k < numel; k++) {
            double sum = 0;
            for (int q = 0; q < n; q++) {
                grad_values(0, i, q, f);
                sum += f[k];
            }
            double want = sum / (double)want_global, got = load(sel_dtypes[i], host, k);
            RANK_CHECK(ctx, fabs(got - want) <= rel * fabs(want) + 0x1p-24,
                       "'%s'[%zu] = %.9g, expected %.9g (sum %g / weight %" PRIu64 ")",
                       sel_paths[i], k, got, want, sum, want_global);
        }
    }
    if (same_on_every_rank(ctx, ctx->world, hash, "the reduced gradients") ||
        check_private(ctx, s, grads, &priv_grad, priv_host))
        return 1;
    seldp_grads_destroy(grads);
    for (int i = 0; i < N_SEL; i++)
        seldp_tensor_free(&g[i]);
    seldp_tensor_free(&priv_grad);
    return 0;
}

/* sum_fp32 of F32 gradients, policy zero: rank 0 has no gradient for the F16 parameter and
 * receives an owned F32 result on its device. */
static int session_sum_fp32(tr_rank_ctx *ctx, session_state *s)
{
    int r = ctx->rank, n = ctx->size;
    seldp_grads *grads = NULL;
    seldp_tensor g[N_SEL] = {{0}};
    float f[64], got[64];
    RANK_CHECK_OK(ctx, seldp_grads_create(&grads));
    for (int i = 0; i < N_SEL; i++) {
        if (i == 1 && r == 0)
            continue;
        grad_values(1, i, r, f);
        RANK_CHECK_OK(ctx, device_tensor(s->dev, SELDP_F32, sel_ndim[i], sel_shapes[i], f, &g[i]));
        RANK_CHECK_OK(ctx, seldp_grads_put(grads, sel_id(i, r), &g[i], SELDP_BORROWED));
    }
    uint64_t active = 0;
    RANK_CHECK_OK(ctx,
                  seldp_session_sum_fp32(s->session, grads, true, SELDP_MISSING_ZERO, &active));
    RANK_CHECK(ctx, active == (uint64_t)n, "%" PRIu64 " active ranks, expected %d", active, n);

    uint64_t hash = 0xcbf29ce484222325ull;
    for (int i = 0; i < N_SEL; i++) {
        const seldp_tensor *t = seldp_grads_get(grads, sel_id(i, r));
        if (i == 1 && n == 1) {
            RANK_CHECK(ctx, t == NULL, "'%s' had no gradient anywhere but is present",
                       sel_paths[i]);
            continue;
        }
        RANK_CHECK(ctx, t && t->dtype == SELDP_F32 && seldp_tensor_numel(t) == sel_numel(i),
                   "'%s': no F32 result", sel_paths[i]);
        RANK_CHECK(ctx, t->device.kind == s->dev.kind && t->device.ordinal == s->dev.ordinal,
                   "'%s': result on another device", sel_paths[i]);
        if (i == 1 && r == 0)
            RANK_CHECK(ctx, seldp_grads_ownership(grads, sel_id(i, r)) == SELDP_OWNED,
                       "'%s': the result for a rank without a gradient is not owned", sel_paths[i]);
        RANK_CHECK_OK(ctx, gpu_download(s->dev, got, t->data, sel_numel(i) * sizeof(float)));
        hash = fnv1a(got, sel_numel(i) * sizeof(float), hash);
        for (size_t k = 0; k < sel_numel(i); k++) {
            float want = 0;
            for (int q = 0; q < n; q++) {
                if (i == 1 && q == 0)
                    continue;
                grad_values(1, i, q, f);
                want += f[k];
            }
            RANK_CHECK(ctx, got[k] == want, "'%s'[%zu] = %g, expected the exact sum %g",
                       sel_paths[i], k, (double)got[k], (double)want);
        }
    }
    if (same_on_every_rank(ctx, ctx->world, hash, "the summed gradients"))
        return 1;
    seldp_grads_destroy(grads);
    for (int i = 0; i < N_SEL; i++)
        seldp_tensor_free(&g[i]);
    return 0;
}

int gpu_check_session(tr_rank_ctx *ctx)
{
    session_state s;
    memset(&s, 0, sizeof s);
    if (session_setup(ctx, &s) || session_reduce_mean(ctx, &s) || session_sum_fp32(ctx, &s))
        return 1;
    seldp_session_destroy(s.session);
    seldp_model_destroy(s.model);
    for (int i = 0; i < N_SEL; i++)
        seldp_tensor_free(&s.params[i]);
    seldp_tensor_free(&s.priv);
    return 0;
}
