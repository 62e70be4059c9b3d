/* The NCCL transport's rules, without a GPU: the CUDA runtime is the scripted one of
 * fake_cuda.h ("device" memory is host memory) and NCCL itself is scripted too, by wrapping
 * every NCCL function the library calls at link time (tests/unit/CMakeLists.txt): a world of
 * one rank whose collectives copy send into recv, whose non-blocking calls stay in progress
 * for a poll or two, and which records every call. Checked here:
 * - a reduction cut into many buckets issues its allreduces in groups of at most
 *   SELDP_NCCL_GROUP_MAX, and no NCCL call is made while the last group is still in progress
 *   (the rule of non-blocking communicators);
 * - buffers that grow (the reduction's, the staging of host payloads) and a split's buffers
 *   are never freed while the world is live, only when the world communicator is destroyed;
 * - a session that has checked its tensors' device spares the runtime a pointer query per
 *   tensor; a transport-level call without that knowledge asks;
 * - joining waits for a bootstrap slower than a short timeout, and that timeout still bounds
 *   collectives;
 * - an allocation failure after joining marks the world aborted;
 * - an overlapped reduction is refused on NCCL (one thread drives a GPU's communicators);
 * - a device parameter or gradient not aligned to its element size is refused, by path. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <nccl.h>

#include "comm/comm_impl.h"
#include "comm/nccl/nccl_impl.h"
#include "device.h"
#include "fake_cuda.h"
#include "seldp/nccl.h"
#include "seldp/seldp.h"

static const seldp_device cuda0 = {SELDP_DEVICE_CUDA, 0};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the scripted NCCL: a world of one rank ------------------------------------------ */

static struct {
    char handles[4];   /* what ncclComm_t points at: the world's, then splits' */
    int pending;       /* polls of ncclCommGetAsyncError before the last call completes */
    double busy_until; /* ncclCommInitRankConfig in progress until then */
    bool hang;         /* collectives never complete */
    int group_depth, group_ops, max_group_ops, groups;
    int ops_outside_group, while_in_progress, allreduces;
    int destroys, aborts;
    bool fail_comm_alloc; /* the next calloc of a seldp_comm fails */
} nc;

static void nccl_call(void)
{
    if (nc.pending > 0)
        nc.while_in_progress++;
}

/* A collective enqueued: inside a group it is counted there, outside it completes after a
 * poll of NCCL's state. */
static ncclResult_t enqueue(void)
{
    nccl_call();
    if (nc.group_depth == 0) {
        nc.ops_outside_group++;
        nc.pending = 1;
        return ncclInProgress;
    }
    nc.group_ops++;
    return ncclSuccess;
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

ncclResult_t __wrap_ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 7, sizeof *id);
    return ncclSuccess;
}

ncclResult_t __wrap_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t *config)
{
    (void)id;
    assert_int_equal(nranks, 1);
    assert_int_equal(rank, 0);
    assert_int_equal(config->blocking, 0);
    *comm = (ncclComm_t)(void *)&nc.handles[0];
    return ncclInProgress;
}

ncclResult_t __wrap_ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    (void)comm;
    if (now_s() < nc.busy_until || nc.hang) {
        *state = ncclInProgress;
        return ncclSuccess;
    }
    if (nc.pending > 0)
        nc.pending--;
    *state = nc.pending > 0 ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t __wrap_ncclCommAbort(ncclComm_t comm)
{
    (void)comm;
    nc.aborts++;
    nc.pending = 0;
    return ncclSuccess;
}

ncclResult_t __wrap_ncclCommFinalize(ncclComm_t comm)
{
    (void)comm;
    nccl_call();
    nc.pending = 1;
    return ncclInProgress;
}

ncclResult_t __wrap_ncclCommDestroy(ncclComm_t comm)
{
    (void)comm;
    nccl_call();
    nc.destroys++;
    return ncclSuccess;
}

ncclResult_t __wrap_ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config)
{
    (void)comm;
    (void)key;
    (void)config;
    nccl_call();
    *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : (ncclComm_t)(void *)&nc.handles[1];
    nc.pending = 1;
    return ncclInProgress;
}

ncclResult_t __wrap_ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    (void)comm;
    *rank = 0;
    return ncclSuccess;
}

ncclResult_t __wrap_ncclCommCount(const ncclComm_t comm, int *count)
{
    (void)comm;
    *count = 1;
    return ncclSuccess;
}

const char *__wrap_ncclGetErrorString(ncclResult_t r)
{
    (void)r;
    return "scripted NCCL error";
}

const char *__wrap_ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

ncclResult_t __wrap_ncclGroupStart(void)
{
    nccl_call();
    if (nc.group_depth++ == 0)
        nc.group_ops = 0;
    return ncclSuccess;
}

ncclResult_t __wrap_ncclGroupEnd(void)
{
    if (--nc.group_depth > 0)
        return ncclSuccess;
    nc.groups++;
    if (nc.group_ops > nc.max_group_ops)
        nc.max_group_ops = nc.group_ops;
    nc.pending = 2; /* in progress for a poll, then done */
    return ncclInProgress;
}

ncclResult_t __wrap_ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)op;
    (void)comm;
    (void)stream;
    nc.allreduces++;
    if (send != recv)
        memmove(recv, send, count * type_size(t));
    return enqueue();
}

ncclResult_t __wrap_ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t,
                                  int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)root;
    (void)comm;
    (void)stream;
    if (send != recv)
        memmove(recv, send, count * type_size(t));
    return enqueue();
}

ncclResult_t __wrap_ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t,
                                  ncclComm_t comm, cudaStream_t stream)
{
    (void)comm;
    (void)stream;
    if (send != recv)
        memmove(recv, send, count * type_size(t));
    return enqueue();
}

ncclResult_t __wrap_ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    (void)buf, (void)count, (void)t, (void)peer, (void)comm, (void)stream;
    fail_msg("a world of one rank sent to a peer");
    return ncclInternalError;
}

ncclResult_t __wrap_ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                             cudaStream_t stream)
{
    (void)buf, (void)count, (void)t, (void)peer, (void)comm, (void)stream;
    fail_msg("a world of one rank received from a peer");
    return ncclInternalError;
}

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
    if (nc.fail_comm_alloc && n == 1 && size == sizeof(seldp_comm)) {
        nc.fail_comm_alloc = false;
        return NULL;
    }
    return __real_calloc(n, size);
}

/* ---- the scripted CUDA runtime, counting what the transport allocates and asks ------------ */

static struct {
    int mallocs, frees, host_mallocs, host_frees, attributes;
    struct {
        char *p;
        size_t bytes;
    } live[256]; /* the "device" allocations, so that pointer queries can tell them */
} rt;

static seldp__cuda_api base, api;

static cudaError_t count_malloc(void **p, size_t bytes)
{
    rt.mallocs++;
    cudaError_t err = base.malloc(p, bytes);
    for (size_t i = 0; err == cudaSuccess && i < 256; i++)
        if (!rt.live[i].p) {
            rt.live[i].p = *p;
            rt.live[i].bytes = bytes;
            break;
        }
    return err;
}

static cudaError_t count_free(void *p)
{
    rt.frees++;
    for (size_t i = 0; i < 256; i++)
        if (rt.live[i].p == p)
            rt.live[i].p = NULL;
    return base.free(p);
}

static cudaError_t count_malloc_host(void **p, size_t bytes)
{
    rt.host_mallocs++;
    return base.malloc_host(p, bytes);
}

static cudaError_t count_free_host(void *p)
{
    rt.host_frees++;
    return base.free_host(p);
}

/* Device memory for what count_malloc handed out, host memory for the rest. */
static cudaError_t count_attributes(struct cudaPointerAttributes *attr, const void *p)
{
    rt.attributes++;
    cudaError_t err = base.pointer_attributes(attr, p);
    for (size_t i = 0; i < 256; i++)
        if (rt.live[i].p && (const char *)p >= rt.live[i].p &&
            (const char *)p < rt.live[i].p + rt.live[i].bytes) {
            attr->type = cudaMemoryTypeDevice;
            attr->device = 0;
        }
    return err;
}

static int setup(void **state)
{
    (void)state;
    memset(&nc, 0, sizeof nc);
    memset(&rt, 0, sizeof rt);
    base = fake_cuda_api();
    api = base;
    api.malloc = count_malloc;
    api.free = count_free;
    api.malloc_host = count_malloc_host;
    api.free_host = count_free_host;
    api.pointer_attributes = count_attributes;
    seldp__cuda_replace(&api);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    seldp__cuda_replace(NULL);
    return 0;
}

/* A world of one rank on the scripted NCCL, with `timeout_s`. */
static seldp_comm *join(double timeout_s)
{
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = timeout_s;
    seldp_nccl_world *world = NULL;
    seldp_comm *comm = NULL;
    assert_int_equal(seldp_nccl_world_create(1, &cfg, &world), SELDP_OK);
    seldp_status st = seldp_nccl_comm_init(world, 0, &comm);
    if (st != SELDP_OK)
        fail_msg("joining the scripted world: %s: %s", seldp_status_name(st), seldp_last_error());
    seldp_nccl_world_destroy(world);
    return comm;
}

/* n F32 elements of "device" memory; the caller frees them with seldp__device_free. */
static float *device_floats(size_t n)
{
    void *p = NULL;
    assert_int_equal(seldp__device_alloc(cuda0, n * sizeof(float), &p), SELDP_OK);
    return p;
}

/* ---- the tests ------------------------------------------------------------------------- */

/* 1,000 elements in buckets of 3: 334 allreduces, in groups of at most SELDP_NCCL_GROUP_MAX,
 * none issued before NCCL says the last group is no longer in progress. */
static void test_reduction_groups_are_bounded(void **state)
{
    (void)state;
    seldp_comm *comm = join(30.0);
    float *x = device_floats(1000);
    seldp__reduce_seg seg = {x, SELDP_F32, x, SELDP_F32, 1000};
    bool written = false;
    seldp__reduce_fused_args args = {&seg, 1, 3, 1.0, &written, &cuda0};
    int before = rt.attributes;
    assert_int_equal(seldp__comm_reduce_fused(comm, &args), SELDP_OK);
    assert_true(written);
    assert_int_equal(nc.allreduces, 334);
    assert_int_equal(nc.groups, (334 + SELDP_NCCL_GROUP_MAX - 1) / SELDP_NCCL_GROUP_MAX);
    assert_int_equal(nc.max_group_ops, SELDP_NCCL_GROUP_MAX);
    assert_int_equal(nc.ops_outside_group, 0);
    assert_int_equal(nc.while_in_progress, 0);
    /* told where the segment is: no pointer asked of the runtime */
    assert_int_equal(rt.attributes, before);

    /* one bucket: one group of one */
    nc.groups = nc.max_group_ops = 0;
    args.bucket_elems = 0;
    assert_int_equal(seldp__comm_reduce_fused(comm, &args), SELDP_OK);
    assert_int_equal(nc.groups, 1);
    assert_int_equal(nc.max_group_ops, 1);

    /* not told: each pointer is asked once, its contribution and its result */
    args.device = NULL;
    before = rt.attributes;
    assert_int_equal(seldp__comm_reduce_fused(comm, &args), SELDP_OK);
    assert_int_equal(rt.attributes - before, 2);
    assert_int_equal(nc.while_in_progress, 0);
    seldp__device_free(cuda0, x);
    seldp_comm_destroy(comm);
}

/* Reductions and host broadcasts of growing sizes: the reduction's buffers and the staging
 * grow, and nothing is freed until the world communicator is destroyed, which frees all. */
static void test_growth_frees_nothing_until_destroy(void **state)
{
    (void)state;
    seldp_comm *comm = join(30.0);
    int device_before = rt.mallocs, host_before = rt.host_mallocs;
    size_t n = 100;
    for (int k = 0; k < 4; k++, n *= 4) {
        float *x = device_floats(n);
        seldp__reduce_seg segs[2] = {{x, SELDP_F32, x, SELDP_BF16, n},
                                     {NULL, SELDP_F32, x, SELDP_F32, n / 2}};
        float *host = calloc(n, sizeof *host);
        assert_non_null(host);
        segs[1].out = host; /* a host segment: pinned staging */
        seldp__reduce_fused_args args = {segs, 2, 64, 0.5, NULL, NULL};
        assert_int_equal(seldp__comm_reduce_fused(comm, &args), SELDP_OK);
        assert_int_equal(seldp_comm_broadcast(comm, host, n, SELDP_F32, 0, SELDP_HOST_DEVICE),
                         SELDP_OK);
        seldp__device_free(cuda0, x);
        free(host);
    }
    int frees = rt.frees - 4; /* the test's own buffers */
    assert_true(rt.mallocs - device_before > 4 + 4);
    assert_true(rt.host_mallocs - host_before >= 2);
    if (frees != 0 || rt.host_frees != 0)
        fail_msg("%d device and %d pinned buffers freed while the world was live", frees,
                 rt.host_frees);
    seldp_comm_destroy(comm);
    assert_int_equal(rt.frees, rt.mallocs);
    assert_int_equal(rt.host_frees, rt.host_mallocs);
}

/* A split's buffers outlive its destroy: they go to the world communicator, which frees them
 * with its own. */
static void test_split_buffers_freed_with_the_world(void **state)
{
    (void)state;
    seldp_comm *world = join(30.0), *sub = NULL;
    assert_int_equal(seldp_comm_split(world, 0, 0, &sub), SELDP_OK);
    assert_non_null(sub);
    float *x = device_floats(5000);
    seldp__reduce_seg seg = {x, SELDP_F32, x, SELDP_F32, 5000};
    seldp__reduce_fused_args args = {&seg, 1, 0, 1.0, NULL, &cuda0};
    assert_int_equal(seldp__comm_reduce_fused(sub, &args), SELDP_OK);
    seldp__device_free(cuda0, x);
    int frees = rt.frees;
    seldp_comm_destroy(sub);
    assert_int_equal(rt.frees, frees);
    assert_int_equal(rt.host_frees, 0);
    assert_int_equal(nc.destroys, 0); /* the split's NCCL communicator waits for the world's */
    seldp_comm_destroy(world);
    assert_int_equal(nc.destroys, 2);
    assert_int_equal(rt.frees, rt.mallocs);
    assert_int_equal(rt.host_frees, rt.host_mallocs);
}

/* A bootstrap that takes longer than the configured timeout still joins (the join waits at
 * least SELDP_NCCL_JOIN_TIMEOUT_MIN_S); that timeout still bounds a collective. */
static void test_join_outlasts_a_short_timeout(void **state)
{
    (void)state;
    nc.busy_until = now_s() + 1.0;
    double t0 = now_s();
    seldp_comm *comm = join(0.2);
    assert_true(now_s() - t0 >= 1.0);
    nc.hang = true;
    t0 = now_s();
    seldp_status st = seldp_comm_barrier(comm);
    double took = now_s() - t0;
    assert_int_equal(st, SELDP_ERR_TIMEOUT);
    if (took > 5.0)
        fail_msg("a collective waited %.1f s with a 0.2 s timeout", took);
    assert_non_null(strstr(seldp_last_error(), "did not complete within 0.2 s"));
    nc.hang = false;
    seldp_comm_destroy(comm);
}

/* Out of memory after NCCL's init: the world is marked aborted, so that the other ranks'
 * next collective returns at once instead of waiting out the timeout for this one. */
static void test_allocation_failure_after_join_aborts(void **state)
{
    (void)state;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    seldp_nccl_world *world = NULL;
    seldp_comm *comm = NULL;
    assert_int_equal(seldp_nccl_world_create(1, &cfg, &world), SELDP_OK);
    nc.fail_comm_alloc = true;
    assert_int_equal(seldp_nccl_comm_init(world, 0, &comm), SELDP_ERR_NOMEM);
    assert_null(comm);
    assert_non_null(strstr(seldp_last_error(), "out of memory after joining the world"));
    assert_true(atomic_load(&world->aborted));
    assert_int_equal(nc.aborts, 1); /* its NCCL communicator too */
    seldp_nccl_world_destroy(world);
}

/* A session over one F32 parameter on the rank's "GPU". */
typedef struct one_param {
    seldp_comm *comm;
    seldp_model *model;
    seldp_tensor param;
    float *block; /* the parameter's allocation; param.data may sit inside it */
} one_param;

static seldp_status one_param_session(one_param *p, size_t offset_bytes, seldp_session **out)
{
    int64_t shape[1] = {16};
    p->comm = join(30.0);
    p->block = device_floats(20);
    p->param = seldp_tensor_view(SELDP_F32, cuda0, (char *)p->block + offset_bytes, 1, shape);
    assert_int_equal(seldp_model_create(0, &p->model), SELDP_OK);
    assert_int_equal(seldp_model_add(p->model, "layers.0.mlp.w", 42, &p->param, false, NULL),
                     SELDP_OK);
    seldp_param_id id = 42;
    return seldp_session_initialize(p->comm, p->model, 0, &id, 1, NULL, out);
}

static void one_param_free(one_param *p)
{
    seldp_model_destroy(p->model);
    seldp__device_free(cuda0, p->block);
    seldp_comm_destroy(p->comm);
}

/* On NCCL an overlapped reduction is refused at once (no progress thread may issue a GPU's
 * collectives beside the rank's own), naming the blocking call to use; the blocking call
 * works and, its tensors checked by the session, asks the runtime about no pointer. */
static void test_overlapped_reduction_refused(void **state)
{
    (void)state;
    one_param p;
    seldp_session *s = NULL;
    assert_int_equal(one_param_session(&p, 0, &s), SELDP_OK);
    assert_int_equal(seldp_session_reduce_path(s), SELDP_REDUCE_PATH_FUSED);
    seldp_grads *grads = NULL;
    assert_int_equal(seldp_grads_create(&grads), SELDP_OK);
    float *g = device_floats(16);
    int64_t shape[1] = {16};
    seldp_tensor gt = seldp_tensor_view(SELDP_F32, cuda0, g, 1, shape);
    assert_int_equal(seldp_grads_put(grads, 42, &gt, SELDP_BORROWED), SELDP_OK);

    assert_int_equal(seldp_session_reduce_start(s, grads, 3, SELDP_MISSING_ERROR),
                     SELDP_ERR_UNSUPPORTED);
    if (!strstr(seldp_last_error(), "not on the nccl transport") ||
        !strstr(seldp_last_error(), "seldp_session_reduce"))
        fail_msg("refusal '%s' does not say why and what to call", seldp_last_error());
    assert_int_equal(seldp_session_sum_start(s, grads, true, SELDP_MISSING_ERROR),
                     SELDP_ERR_UNSUPPORTED);

    int before = rt.attributes;
    uint64_t global = 0;
    assert_int_equal(seldp_session_reduce(s, grads, 3, SELDP_MISSING_ERROR, &global), SELDP_OK);
    assert_int_equal(global, 3);
    assert_int_equal(rt.attributes, before);
    assert_int_equal(nc.while_in_progress, 0);

    seldp_grads_destroy(grads);
    seldp__device_free(cuda0, g);
    seldp_session_destroy(s);
    one_param_free(&p);
}

/* A device parameter two bytes off its element size is refused at initialize, and a
 * misaligned device gradient at reduce, both naming the parameter's path. */
static void test_misaligned_device_tensors_refused(void **state)
{
    (void)state;
    one_param p;
    seldp_session *s = NULL;
    assert_int_equal(one_param_session(&p, 2, &s), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(s);
    if (!strstr(seldp_last_error(), "'layers.0.mlp.w'") ||
        !strstr(seldp_last_error(), "not aligned to its element size"))
        fail_msg("initialize's error '%s' does not name the path and the cause",
                 seldp_last_error());
    one_param_free(&p);

    assert_int_equal(one_param_session(&p, 0, &s), SELDP_OK);
    seldp_grads *grads = NULL;
    assert_int_equal(seldp_grads_create(&grads), SELDP_OK);
    float *g = device_floats(17);
    int64_t shape[1] = {16};
    seldp_tensor gt = seldp_tensor_view(SELDP_F32, cuda0, (char *)g + 1, 1, shape);
    assert_int_equal(seldp_grads_put(grads, 42, &gt, SELDP_BORROWED), SELDP_OK);
    assert_int_equal(seldp_session_sum(s, grads, true, SELDP_MISSING_ERROR, NULL),
                     SELDP_ERR_INVALID_ARGUMENT);
    if (!strstr(seldp_last_error(), "'layers.0.mlp.w'") ||
        !strstr(seldp_last_error(), "not aligned to its element size"))
        fail_msg("reduce's error '%s' does not name the path and the cause", seldp_last_error());
    seldp_grads_destroy(grads);
    seldp__device_free(cuda0, g);
    seldp_session_destroy(s);
    one_param_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reduction_groups_are_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_growth_frees_nothing_until_destroy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_buffers_freed_with_the_world, setup, teardown),
        cmocka_unit_test_setup_teardown(test_join_outlasts_a_short_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allocation_failure_after_join_aborts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlapped_reduction_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misaligned_device_tensors_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
