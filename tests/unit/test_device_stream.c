/* src/device.c against a scripted CUDA runtime (seldp__cuda_replace): every device copy
 * and memset is issued on the per-thread stream and waited for before the call returns
 * (the stream contract of device.h), the caller's current device is restored, a failed
 * zeroing of a new allocation frees it, and the grow-only buffers (seldp__device_reserve,
 * seldp__pinned_reserve) allocate only when a request does not fit. A buffer with a retire
 * list frees nothing when it grows (what it gives up is freed with the list), a device
 * allocation is freed on its own device, staging host memory is page-locked only for a CUDA
 * device (a host communicator makes no CUDA call), a misaligned device tensor is refused by
 * name, and an error deliberately ignored is also cleared from the last error. Runs without
 * a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "seldp/seldp.h"

enum op { OP_SET, OP_MALLOC, OP_FREE, OP_MEMSET, OP_MEMCPY, OP_SYNC, OP_MALLOC_HOST, OP_FREE_HOST };

typedef struct call {
    enum op op;
    cudaStream_t stream;
    int ordinal;
    void *ptr;
    size_t bytes; /* OP_MALLOC, OP_MALLOC_HOST */
} call;

static struct {
    call log[128];
    int n;
    int current;         /* the device the fake runtime has current */
    cudaError_t fail_on; /* error returned by the op in `failing` */
    enum op failing;
    bool fail;
    char heap[256];
    char pinned[256];            /* what malloc_host hands out */
    int last_error_reads, calls; /* every runtime call, for "none at all" */
} fake;

static void record(enum op op, cudaStream_t stream, void *ptr)
{
    fake.calls++;
    if (fake.n < 128)
        fake.log[fake.n++] = (call){op, stream, fake.current, ptr, 0};
}

static cudaError_t result(enum op op)
{
    return fake.fail && fake.failing == op ? fake.fail_on : cudaSuccess;
}

static cudaError_t f_get_device(int *ordinal)
{
    fake.calls++;
    *ordinal = fake.current;
    return cudaSuccess;
}

static cudaError_t f_set_device(int ordinal)
{
    record(OP_SET, NULL, NULL);
    fake.current = ordinal;
    fake.log[fake.n - 1].ordinal = ordinal;
    return cudaSuccess;
}

static cudaError_t f_count(int *n)
{
    fake.calls++;
    *n = 2;
    return cudaSuccess;
}

static cudaError_t f_malloc(void **p, size_t bytes)
{
    record(OP_MALLOC, NULL, fake.heap);
    fake.log[fake.n - 1].bytes = bytes;
    cudaError_t err = result(OP_MALLOC);
    *p = err == cudaSuccess ? fake.heap : NULL;
    return err;
}

static cudaError_t f_free(void *p)
{
    record(OP_FREE, NULL, p);
    return cudaSuccess;
}

static cudaError_t f_memset(void *p, int v, size_t bytes, cudaStream_t s)
{
    (void)v;
    (void)bytes;
    record(OP_MEMSET, s, p);
    return result(OP_MEMSET);
}

static cudaError_t f_memcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)src;
    (void)bytes;
    assert_int_equal(kind, cudaMemcpyDefault);
    record(OP_MEMCPY, s, dst);
    return result(OP_MEMCPY);
}

static cudaError_t f_sync(cudaStream_t s)
{
    record(OP_SYNC, s, NULL);
    return result(OP_SYNC);
}

static cudaError_t f_malloc_host(void **p, size_t bytes)
{
    record(OP_MALLOC_HOST, NULL, fake.pinned);
    fake.log[fake.n - 1].bytes = bytes;
    cudaError_t err = result(OP_MALLOC_HOST);
    *p = err == cudaSuccess ? fake.pinned : NULL;
    return err;
}

static cudaError_t f_free_host(void *p)
{
    record(OP_FREE_HOST, NULL, p);
    return cudaSuccess;
}

static cudaError_t f_attributes(struct cudaPointerAttributes *attr, const void *p)
{
    fake.calls++;
    memset(attr, 0, sizeof *attr);
    attr->type = p == (const void *)fake.pinned ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}

static cudaError_t f_last_error(void)
{
    fake.last_error_reads++;
    return cudaSuccess;
}

static const seldp__cuda_api fake_api = {
    .get_device = f_get_device,
    .set_device = f_set_device,
    .get_device_count = f_count,
    .malloc = f_malloc,
    .free = f_free,
    .memset_async = f_memset,
    .memcpy_async = f_memcpy,
    .stream_synchronize = f_sync,
    .malloc_host = f_malloc_host,
    .free_host = f_free_host,
    .pointer_attributes = f_attributes,
    .get_last_error = f_last_error,
};

static int setup(void **state)
{
    (void)state;
    memset(&fake, 0, sizeof fake);
    fake.current = 1; /* the caller works on cuda:1; the buffers are on cuda:0 */
    seldp__cuda_replace(&fake_api);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    seldp__cuda_replace(NULL);
    return 0;
}

static const seldp_device dev0 = {SELDP_DEVICE_CUDA, 0};

/* The log, less the device switches, must be exactly `want` (ops on cuda:0), the work on
 * the per-thread stream, and the caller's cuda:1 current again at the end. */
static void expect(const enum op *want, int n_want)
{
    int k = 0;
    for (int i = 0; i < fake.n; i++) {
        const call *c = &fake.log[i];
        if (c->op == OP_SET)
            continue;
        if (k >= n_want)
            fail_msg("unexpected call %d (op %d) after the expected ones", i, (int)c->op);
        if (c->op != want[k])
            fail_msg("call %d: op %d, expected op %d", k, (int)c->op, (int)want[k]);
        if (c->ordinal != 0)
            fail_msg("call %d ran on cuda:%d, expected cuda:0", k, c->ordinal);
        if ((c->op == OP_MEMSET || c->op == OP_MEMCPY || c->op == OP_SYNC) &&
            c->stream != cudaStreamPerThread)
            fail_msg("call %d (op %d) not on the per-thread stream", k, (int)c->op);
        k++;
    }
    if (k != n_want)
        fail_msg("%d calls, expected %d", k, n_want);
    assert_int_equal(fake.current, 1);
}

static void test_copy_waits_for_its_stream(void **state)
{
    (void)state;
    char host[16] = "payload";
    assert_int_equal(seldp__device_copy(fake.heap, dev0, host, SELDP_HOST_DEVICE, sizeof host),
                     SELDP_OK);
    const enum op h2d[] = {OP_MEMCPY, OP_SYNC};
    expect(h2d, 2);

    fake.n = 0; /* device to device: asynchronous to the host unless waited for */
    assert_int_equal(seldp__device_copy(fake.heap + 64, dev0, fake.heap, dev0, 16), SELDP_OK);
    expect(h2d, 2);
}

static void test_zero_waits_for_its_stream(void **state)
{
    (void)state;
    assert_int_equal(seldp__device_zero(dev0, fake.heap, 32), SELDP_OK);
    const enum op want[] = {OP_MEMSET, OP_SYNC};
    expect(want, 2);
}

static void test_alloc_zeroes_before_returning(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(seldp__device_alloc(dev0, 64, &p), SELDP_OK);
    assert_ptr_equal(p, fake.heap);
    const enum op want[] = {OP_MALLOC, OP_MEMSET, OP_SYNC};
    expect(want, 3);
}

static void test_alloc_frees_when_zeroing_fails(void **state)
{
    (void)state;
    void *p = (void *)&p;
    fake.fail = true;
    fake.failing = OP_MEMSET;
    fake.fail_on = cudaErrorInvalidValue;
    assert_int_equal(seldp__device_alloc(dev0, 64, &p), SELDP_ERR_TRANSPORT);
    assert_null(p);
    assert_non_null(strstr(seldp_last_error(), "cuda:0"));
    const enum op want[] = {OP_MALLOC, OP_MEMSET, OP_FREE};
    expect(want, 3);
    assert_ptr_equal(fake.log[fake.n - 2].ptr, fake.heap); /* the block it got is released */
}

static void test_alloc_failure_allocates_nothing(void **state)
{
    (void)state;
    void *p = NULL;
    fake.fail = true;
    fake.failing = OP_MALLOC;
    fake.fail_on = cudaErrorMemoryAllocation;
    assert_int_equal(seldp__device_alloc(dev0, 64, &p), SELDP_ERR_TRANSPORT);
    assert_null(p);
    const enum op want[] = {OP_MALLOC};
    expect(want, 1);
}

static void test_failed_wait_is_an_error(void **state)
{
    (void)state;
    char host[8] = {0};
    fake.fail = true;
    fake.failing = OP_SYNC;
    fake.fail_on = cudaErrorIllegalAddress;
    assert_int_equal(seldp__device_copy(host, SELDP_HOST_DEVICE, fake.heap, dev0, sizeof host),
                     SELDP_ERR_TRANSPORT);
    assert_non_null(strstr(seldp_last_error(), "cudaMemcpyAsync on cuda:0"));
    assert_int_equal(fake.current, 1);
}

/* Calls of `op` in the log. */
static int count(enum op op)
{
    int n = 0;
    for (int i = 0; i < fake.n; i++)
        n += fake.log[i].op == op;
    return n;
}

/* The last call of `op` in the log. */
static const call *last(enum op op)
{
    for (int i = fake.n - 1; i >= 0; i--)
        if (fake.log[i].op == op)
            return &fake.log[i];
    fail_msg("no call of op %d", (int)op);
    return NULL;
}

/* Requests that fit (the same size, smaller ones) allocate nothing; a larger one frees the
 * old block and allocates once, at least a quarter more than before; release frees it. */
static void test_device_buffer_grows_only(void **state)
{
    (void)state;
    seldp__device_buffer b = {0};
    assert_int_equal(seldp__device_reserve(&b, dev0, 1000), SELDP_OK);
    assert_ptr_equal(b.ptr, fake.heap);
    assert_true(b.bytes >= 1000);
    assert_int_equal(count(OP_MALLOC), 1);
    size_t first = b.bytes;
    for (int call_no = 0; call_no < 8; call_no++)
        assert_int_equal(seldp__device_reserve(&b, dev0, call_no % 2 ? 10 : first), SELDP_OK);
    assert_int_equal(count(OP_MALLOC), 1);
    assert_int_equal(count(OP_FREE), 0);

    assert_int_equal(seldp__device_reserve(&b, dev0, first + 1), SELDP_OK);
    assert_int_equal(count(OP_MALLOC), 2);
    assert_int_equal(count(OP_FREE), 1);
    assert_true(b.bytes >= first + first / 4);
    assert_int_equal(last(OP_MALLOC)->bytes, b.bytes);

    /* another device: replaced there */
    seldp_device dev1 = {SELDP_DEVICE_CUDA, 1};
    assert_int_equal(seldp__device_reserve(&b, dev1, 16), SELDP_OK);
    assert_int_equal(count(OP_MALLOC), 3);
    assert_int_equal(b.device.ordinal, 1);

    seldp__device_release(&b);
    assert_null(b.ptr);
    assert_int_equal(b.bytes, 0);
    assert_int_equal(count(OP_FREE), 3);
}

static void test_device_buffer_failure_holds_nothing(void **state)
{
    (void)state;
    seldp__device_buffer b = {0};
    assert_int_equal(seldp__device_reserve(&b, dev0, 64), SELDP_OK);
    fake.fail = true;
    fake.failing = OP_MALLOC;
    fake.fail_on = cudaErrorMemoryAllocation;
    assert_int_equal(seldp__device_reserve(&b, dev0, 1 << 20), SELDP_ERR_TRANSPORT);
    assert_null(b.ptr);
    assert_int_equal(b.bytes, 0);
    fake.fail = false;
    assert_int_equal(seldp__device_reserve(&b, dev0, 64), SELDP_OK); /* and it recovers */
    assert_non_null(b.ptr);
    seldp__device_release(&b);
}

static void test_pinned_buffer_grows_only(void **state)
{
    (void)state;
    seldp__pinned_buffer b = {0};
    assert_int_equal(seldp__pinned_reserve(&b, dev0, 100), SELDP_OK);
    assert_ptr_equal(b.ptr, fake.pinned);
    for (int call_no = 0; call_no < 8; call_no++)
        assert_int_equal(seldp__pinned_reserve(&b, dev0, (size_t)50 + 50 * (call_no % 2)),
                         SELDP_OK);
    assert_int_equal(count(OP_MALLOC_HOST), 1);
    assert_int_equal(count(OP_FREE_HOST), 0);
    assert_int_equal(seldp__pinned_reserve(&b, dev0, b.bytes + 1), SELDP_OK);
    assert_int_equal(count(OP_MALLOC_HOST), 2);
    assert_int_equal(count(OP_FREE_HOST), 1);
    seldp__pinned_release(&b);
    assert_int_equal(count(OP_FREE_HOST), 2);
    assert_null(b.ptr);
}

/* A buffer with a retire list: growing allocates the new block without freeing the old one
 * (the old ones wait in the list, at most what the buffer holds), and freeing the list frees
 * each on its device; the same for pinned staging. */
static void test_retiring_buffer_frees_nothing_until_the_list(void **state)
{
    (void)state;
    seldp__retired kept = {0};
    seldp__device_buffer b = {.retire = &kept};
    seldp__pinned_buffer p = {.retire = &kept};
    size_t want = 1000;
    for (int k = 0; k < 5; k++, want *= 5) {
        assert_int_equal(seldp__device_reserve(&b, dev0, want), SELDP_OK);
        assert_int_equal(seldp__pinned_reserve(&p, dev0, want), SELDP_OK);
    }
    assert_int_equal(count(OP_MALLOC), 5);
    assert_int_equal(count(OP_MALLOC_HOST), 5);
    assert_int_equal(count(OP_FREE) + count(OP_FREE_HOST), 0);
    assert_int_equal(kept.blocks, 8);
    assert_true(kept.bytes <= b.bytes + p.bytes); /* each growth at least doubles */

    /* a buffer handed over keeps nothing and frees nothing */
    seldp__retired other = {0};
    seldp__device_retire(&b, &other);
    assert_null(b.ptr);
    seldp__retired_move(&kept, &other);
    assert_int_equal(other.blocks, 0);
    assert_int_equal(kept.blocks, 9);
    assert_int_equal(count(OP_FREE), 0);

    fake.n = 0;
    seldp__retired_free(&kept);
    assert_int_equal(count(OP_FREE), 5);
    assert_int_equal(count(OP_FREE_HOST), 4);
    for (int i = 0; i < fake.n; i++)
        if (fake.log[i].op == OP_FREE)
            assert_int_equal(fake.log[i].ordinal, 0);
    assert_int_equal(fake.current, 1);
    assert_null(kept.head);
    seldp__pinned_release(&p);
    assert_int_equal(count(OP_FREE_HOST), 5);
}

/* cudaFree runs with the allocation's device current, and the caller's is restored. */
static void test_free_on_its_own_device(void **state)
{
    (void)state;
    seldp__device_free(dev0, fake.heap);
    assert_int_equal(count(OP_FREE), 1);
    assert_int_equal(last(OP_FREE)->ordinal, 0);
    assert_int_equal(fake.current, 1);
    seldp__device_free(dev0, NULL); /* nothing, not even a device switch */
    assert_int_equal(fake.n, 3);    /* set cuda:0, free, set cuda:1 */
}

/* Staging for a host communicator is malloc, with no CUDA call at all (none to create a
 * context on GPU 0 of every process), and is freed without asking the runtime. */
static void test_pinned_only_for_a_cuda_device(void **state)
{
    (void)state;
    void *p = NULL;
    fake.calls = 0;
    assert_int_equal(seldp__pinned_alloc(SELDP_HOST_DEVICE, 64, &p), SELDP_OK);
    assert_non_null(p);
    assert_true(p != (void *)fake.pinned);
    seldp__pinned_buffer b = {0};
    assert_int_equal(seldp__pinned_reserve(&b, SELDP_HOST_DEVICE, 100), SELDP_OK);
    assert_true(b.ptr != (void *)fake.pinned);
    assert_int_equal(fake.calls, 0);
    seldp__pinned_free(p);
    seldp__pinned_release(&b);
    assert_int_equal(count(OP_FREE_HOST), 0);

    assert_int_equal(seldp__pinned_alloc(dev0, 64, &p), SELDP_OK);
    assert_ptr_equal(p, fake.pinned);
    seldp__pinned_free(p);
    assert_int_equal(count(OP_FREE_HOST), 1);
}

/* An error dropped on purpose is cleared from the thread's last error; success asks
 * nothing. */
static void test_ignored_error_is_cleared(void **state)
{
    (void)state;
    seldp__cuda_ignore(cudaSuccess);
    assert_int_equal(fake.last_error_reads, 0);
    seldp__cuda_ignore(cudaErrorInvalidDevice);
    assert_int_equal(fake.last_error_reads, 1);
    /* restoring the caller's device after a copy goes through it */
    fake.fail = true;
    fake.failing = OP_SYNC;
    fake.fail_on = cudaErrorLaunchFailure;
    char host[8];
    assert_int_equal(seldp__device_copy(host, SELDP_HOST_DEVICE, fake.heap, dev0, sizeof host),
                     SELDP_ERR_TRANSPORT);
    assert_true(fake.last_error_reads >= 2);
}

/* Device tensors must sit on a multiple of their element size; the error names the path. */
static void test_misaligned_device_tensor_refused(void **state)
{
    (void)state;
    int64_t shape[1] = {4};
    char *base = (char *)(((uintptr_t)fake.heap + 15) & ~(uintptr_t)15);
    seldp_tensor t = seldp_tensor_view(SELDP_F32, dev0, base + 2, 1, shape);
    assert_int_equal(seldp__device_check_aligned(&t, "layers.0.w"), SELDP_ERR_INVALID_ARGUMENT);
    if (!strstr(seldp_last_error(), "'layers.0.w'") ||
        !strstr(seldp_last_error(), "not aligned to its element size (4 bytes)"))
        fail_msg("message '%s' does not name the path and the alignment", seldp_last_error());
    t.data = base + 4;
    assert_int_equal(seldp__device_check_aligned(&t, "layers.0.w"), SELDP_OK);
    t.dtype = SELDP_BF16;
    t.data = base + 2;
    assert_int_equal(seldp__device_check_aligned(&t, "x"), SELDP_OK);
    t.data = base + 1;
    assert_int_equal(seldp__device_check_aligned(&t, "x"), SELDP_ERR_INVALID_ARGUMENT);
    t.dtype = SELDP_U8;
    assert_int_equal(seldp__device_check_aligned(&t, "x"), SELDP_OK);
    /* host tensors are the host's business */
    t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, base + 2, 1, shape);
    assert_int_equal(seldp__device_check_aligned(&t, "x"), SELDP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_copy_waits_for_its_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero_waits_for_its_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_zeroes_before_returning, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_frees_when_zeroing_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alloc_failure_allocates_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_wait_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_buffer_grows_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_buffer_failure_holds_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_buffer_grows_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retiring_buffer_frees_nothing_until_the_list, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_free_on_its_own_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_only_for_a_cuda_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ignored_error_is_cleared, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misaligned_device_tensor_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
