/* The NCCL transport against a scripted CUDA runtime (seldp__cuda_replace), no GPU needed.
 * Joining: a rank whose stream cannot be created marks the world aborted, so a rank joining
 * after it returns SELDP_ERR_ABORTED at once instead of waiting out the timeout in NCCL's
 * bootstrap; and every stream created is destroyed. The fused reduction's buffers
 * (seldp__nccl_reduce_prepare): kept by the communicator across calls and buckets and grown
 * only when a call needs more, nothing allocated per bucket or per call once they fit; its
 * segments sorted into GPU and host ones, and refused on another GPU or split across
 * sides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/nccl/nccl_impl.h"
#include "device.h"
#include "seldp/nccl.h"
#include "seldp/seldp.h"

static struct {
    int creates, destroys, fail_creates;
    char streams[4];
} fake;

static cudaError_t f_get_device(int *ordinal)
{
    *ordinal = 0;
    return cudaSuccess;
}

static cudaError_t f_set_device(int ordinal)
{
    (void)ordinal;
    return cudaSuccess;
}

static cudaError_t f_count(int *n)
{
    *n = 1;
    return cudaSuccess;
}

static cudaError_t f_stream_create(cudaStream_t *s, unsigned flags)
{
    assert_int_equal(flags, cudaStreamNonBlocking);
    if (fake.creates++ < fake.fail_creates)
        return cudaErrorMemoryAllocation;
    *s = (cudaStream_t)(void *)&fake.streams[fake.creates % 4];
    return cudaSuccess;
}

static cudaError_t f_stream_destroy(cudaStream_t s)
{
    (void)s;
    fake.destroys++;
    return cudaSuccess;
}

static cudaError_t f_last_error(void)
{
    return cudaSuccess;
}

static const seldp__cuda_api fake_api = {
    .get_device = f_get_device,
    .set_device = f_set_device,
    .get_device_count = f_count,
    .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy,
    .get_last_error = f_last_error,
};

static double now_s(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_failed_stream_aborts_the_world(void **state)
{
    (void)state;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 20;
    seldp_nccl_world *world = NULL;
    if (seldp_nccl_world_create(2, &cfg, &world) != SELDP_OK) {
        print_message("skipped: NCCL cannot draw a unique id here: %s\n", seldp_last_error());
        skip();
    }
    memset(&fake, 0, sizeof fake);
    fake.fail_creates = 1;
    const seldp__cuda_api *prev = seldp__cuda_replace(&fake_api);

    seldp_comm *c0 = NULL, *c1 = NULL;
    assert_int_equal(seldp_nccl_comm_init(world, 0, &c0), SELDP_ERR_TRANSPORT);
    assert_null(c0);
    assert_non_null(strstr(seldp_last_error(), "cudaStreamCreate on cuda:0"));

    double t0 = now_s();
    seldp_status st = seldp_nccl_comm_init(world, 1, &c1);
    double took = now_s() - t0;
    seldp__cuda_replace(prev);
    if (st != SELDP_ERR_ABORTED)
        fail_msg("rank 1 joined a world rank 0 had failed to join: %s (%s), expected "
                 "SELDP_ERR_ABORTED",
                 seldp_status_name(st), seldp_last_error());
    assert_null(c1);
    if (took > 5.0)
        fail_msg("rank 1 took %.1f s to see the abort", took);
    assert_int_equal(fake.creates, 2);
    assert_int_equal(fake.destroys, 1); /* rank 1's stream; rank 0 never had one */
    seldp_nccl_world_destroy(world);
}

/* ---- the fused reduction's buffers ---- */

static struct {
    int mallocs, frees, host_mallocs, host_frees;
    size_t malloc_bytes;        /* of the last malloc */
    char gpu0[4096], gpu1[256]; /* "device memory" of cuda:0 and cuda:1 */
    char block[64], pinned[64]; /* what malloc and malloc_host hand out */
} rt;

static cudaError_t r_malloc(void **p, size_t bytes)
{
    rt.mallocs++;
    rt.malloc_bytes = bytes;
    *p = rt.block;
    return cudaSuccess;
}

static cudaError_t r_free(void *p)
{
    (void)p;
    rt.frees++;
    return cudaSuccess;
}

static cudaError_t r_malloc_host(void **p, size_t bytes)
{
    (void)bytes;
    rt.host_mallocs++;
    *p = rt.pinned;
    return cudaSuccess;
}

static cudaError_t r_free_host(void *p)
{
    (void)p;
    rt.host_frees++;
    return cudaSuccess;
}

static cudaError_t r_memset(void *p, int v, size_t bytes, cudaStream_t s)
{
    (void)p;
    (void)v;
    (void)bytes;
    (void)s;
    return cudaSuccess;
}

static cudaError_t r_sync(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static bool inside(const void *p, const char *block, size_t bytes)
{
    return (const char *)p >= block && (const char *)p < block + bytes;
}

static cudaError_t r_attributes(struct cudaPointerAttributes *attr, const void *p)
{
    memset(attr, 0, sizeof *attr);
    attr->type = cudaMemoryTypeUnregistered;
    if (inside(p, rt.gpu0, sizeof rt.gpu0) || inside(p, rt.gpu1, sizeof rt.gpu1)) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = inside(p, rt.gpu1, sizeof rt.gpu1) ? 1 : 0;
    } else if (p == (const void *)rt.pinned) {
        attr->type = cudaMemoryTypeHost;
    }
    return cudaSuccess;
}

static const seldp__cuda_api reduce_api = {
    .get_device = f_get_device,
    .set_device = f_set_device,
    .get_device_count = f_count,
    .malloc = r_malloc,
    .free = r_free,
    .memset_async = r_memset,
    .stream_synchronize = r_sync,
    .malloc_host = r_malloc_host,
    .free_host = r_free_host,
    .pointer_attributes = r_attributes,
    .get_last_error = f_last_error,
};

static int reduce_setup(void **state)
{
    (void)state;
    memset(&rt, 0, sizeof rt);
    seldp__cuda_replace(&reduce_api);
    return 0;
}

static int reduce_teardown(void **state)
{
    (void)state;
    seldp__cuda_replace(NULL);
    return 0;
}

static void test_reduce_buffers_reused_across_calls_and_buckets(void **state)
{
    (void)state;
    nccl_comm c;
    memset(&c, 0, sizeof c);
    c.ordinal = 0;
    c.size = 2;
    /* three tensors on cuda:0: F32 and BF16 contributions, one rank without a gradient */
    seldp__reduce_seg segs[3] = {
        {rt.gpu0, SELDP_F32, rt.gpu0, SELDP_F32, 100},
        {rt.gpu0 + 1024, SELDP_BF16, rt.gpu0 + 1024, SELDP_BF16, 300},
        {NULL, SELDP_F32, rt.gpu0 + 2048, SELDP_F16, 50},
    };
    seldp__reduce_fused_args args = {segs, 3, 0, 1.0 / 2037.0, NULL, NULL};
    seldp__nccl_reduce_plan plan;
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_OK);
    assert_int_equal(plan.elems, 450);
    assert_int_equal(plan.device_segs, 3);
    assert_int_equal(plan.host_segs, 0);
    assert_true(c.reduce.sum.bytes >= 450 * sizeof(float));
    assert_true(c.reduce.desc.bytes >= 2 * plan.desc_bytes); /* the pack's and the unpack's */
    int mallocs = rt.mallocs, host_mallocs = rt.host_mallocs;
    assert_int_equal(mallocs, 2);      /* the sum and the device descriptions */
    assert_int_equal(host_mallocs, 1); /* the pinned descriptions */

    /* more calls, with buckets of every size: nothing allocated or freed */
    static const size_t buckets[] = {0, 1, 7, 64, 449, 450, 1 << 20};
    for (size_t k = 0; k < sizeof buckets / sizeof buckets[0]; k++) {
        args.bucket_elems = buckets[k];
        assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_OK);
    }
    assert_int_equal(rt.mallocs, mallocs);
    assert_int_equal(rt.host_mallocs, host_mallocs);
    assert_int_equal(rt.frees + rt.host_frees, 0);

    /* a bigger call grows the sum buffer once (the descriptions still fit) */
    segs[0].count = 2000; /* 2,350 elements: past the 4 KiB the first call rounded up to */
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_OK);
    assert_int_equal(rt.mallocs, mallocs + 1);
    assert_int_equal(rt.frees, 1);
    assert_true(rt.malloc_bytes >= 2350 * sizeof(float));
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_OK);
    assert_int_equal(rt.mallocs, mallocs + 1);

    /* teardown frees what was kept */
    seldp__nccl_reduce_release(&c.reduce, NULL);
    assert_int_equal(rt.frees, rt.mallocs);
    assert_int_equal(rt.host_frees, rt.host_mallocs);
    assert_null(c.reduce.sum.ptr);
}

static void test_reduce_segments_sorted_and_checked(void **state)
{
    (void)state;
    nccl_comm c;
    memset(&c, 0, sizeof c);
    c.ordinal = 0;
    c.size = 2;
    float host_in[8], host_out[8];
    seldp__reduce_seg segs[2] = {
        {host_in, SELDP_F32, host_out, SELDP_F32, 8},
        {rt.gpu0, SELDP_F32, rt.gpu0, SELDP_BF16, 16},
    };
    seldp__reduce_fused_args args = {segs, 2, 4, 1.0, NULL, NULL};
    seldp__nccl_reduce_plan plan;
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_OK);
    assert_int_equal(plan.host_segs, 1);
    assert_int_equal(plan.device_segs, 1);
    assert_false(c.reduce.side[0]);
    assert_true(c.reduce.side[1]);
    assert_true(c.reduce.host.bytes >= 24 * sizeof(float)); /* pinned staging of the call */
    int host_mallocs = rt.host_mallocs;
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_OK);
    assert_int_equal(rt.host_mallocs, host_mallocs);

    /* a tensor on another GPU */
    segs[1].in = segs[1].out = rt.gpu1;
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_ERR_DEVICE);
    assert_non_null(strstr(seldp_last_error(), "tensor 1 is on cuda:1"));
    /* a contribution on the GPU for a result on the host */
    segs[1].in = rt.gpu0;
    segs[1].out = host_out;
    assert_int_equal(seldp__nccl_reduce_prepare(&c, &args, &plan), SELDP_ERR_DEVICE);
    assert_non_null(strstr(seldp_last_error(), "tensor 1 has its contribution on the GPU"));
    seldp__nccl_reduce_release(&c.reduce, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_stream_aborts_the_world),
        cmocka_unit_test_setup_teardown(test_reduce_buffers_reused_across_calls_and_buckets,
                                        reduce_setup, reduce_teardown),
        cmocka_unit_test_setup_teardown(test_reduce_segments_sorted_and_checked, reduce_setup,
                                        reduce_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
