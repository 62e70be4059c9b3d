/* seldp__cuda_convert_batch (src/cuda/cuda_kernels.cu) against a scripted CUDA runtime
 * (seldp__cuda_replace) whose "device" memory is host memory and whose kernel launches are
 * counted, not run; no GPU needed. The descriptions of a batch go into buffers kept per
 * device ordinal and grown only when a call needs more (src/cuda/cuda_scratch.c): a second
 * call of the same or a smaller size allocates nothing, on the device, in page-locked
 * memory or with libc (this program wraps malloc, calloc and realloc at link time, see
 * tests/unit/CMakeLists.txt); another GPU has its own; threads converting at once on one
 * GPU each hold their own buffers instead of waiting for each other, and once the pool
 * holds enough nothing more is allocated; a failed launch gives its buffers back; the
 * search for a non-finite value (seldp__cuda_find_nonfinite) keeps its result word in the
 * same pool; a buffer that grows keeps the smaller one until the pool is released, which
 * frees everything it allocated. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cuda/cuda_kernels.h"
#include "device.h"
#include "fake_cuda.h"
#include "kernels.h"
#include "seldp/seldp.h"

/* ---- libc allocations of the library while `counting` (-Wl,--wrap) ---- */

void *__real_malloc(size_t bytes);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t bytes);
void *__wrap_malloc(size_t bytes);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t bytes);

static atomic_int counting, libc_allocs;

void *__wrap_malloc(size_t bytes)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&libc_allocs, 1);
    return __real_malloc(bytes);
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&libc_allocs, 1);
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t bytes)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&libc_allocs, 1);
    return __real_realloc(p, bytes);
}

/* ---- the scripted runtime ---- */

#define ORDINALS 2

static struct {
    atomic_int mallocs[ORDINALS]; /* cudaMalloc, by the device current at the call */
    atomic_int frees, host_mallocs, host_frees, launches, syncs;
    atomic_int fail_launches; /* the next launches that fail */
    atomic_int other_kernel;  /* launches are not convert_batch's: record no arguments */
    atomic_size_t last_n, last_total;
    /* launches wait (up to 5 s) until `gather` of them are inside at once */
    atomic_int gather, inside, gathered;
} rt;

static _Thread_local int current;

static cudaError_t f_get_device(int *ordinal)
{
    *ordinal = current;
    return cudaSuccess;
}

static cudaError_t f_set_device(int ordinal)
{
    if (ordinal < 0 || ordinal >= ORDINALS)
        return cudaErrorInvalidDevice;
    current = ordinal;
    return cudaSuccess;
}

static cudaError_t f_count(int *n)
{
    *n = ORDINALS;
    return cudaSuccess;
}

static cudaError_t f_malloc(void **p, size_t bytes)
{
    atomic_fetch_add(&rt.mallocs[current], 1);
    *p = __real_malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static cudaError_t f_free(void *p)
{
    atomic_fetch_add(&rt.frees, 1);
    free(p);
    return cudaSuccess;
}

static cudaError_t f_sync(cudaStream_t s)
{
    (void)s;
    atomic_fetch_add(&rt.syncs, 1);
    return cudaSuccess;
}

static cudaError_t f_malloc_host(void **p, size_t bytes)
{
    atomic_fetch_add(&rt.host_mallocs, 1);
    *p = __real_malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static cudaError_t f_free_host(void *p)
{
    atomic_fetch_add(&rt.host_frees, 1);
    free(p);
    return cudaSuccess;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* The kernel's arguments are (descriptions, count, total elements, scale). */
static cudaError_t f_launch(const void *func, dim3 grid, dim3 block, void **args, size_t shared,
                            cudaStream_t s)
{
    (void)func;
    (void)grid;
    (void)block;
    (void)shared;
    (void)s;
    atomic_fetch_add(&rt.launches, 1);
    if (!atomic_load(&rt.other_kernel)) {
        atomic_store(&rt.last_n, *(const size_t *)args[1]);
        atomic_store(&rt.last_total, *(const size_t *)args[2]);
    }
    if (atomic_load(&rt.gather) > 0) {
        int want = atomic_load(&rt.gather);
        atomic_fetch_add(&rt.inside, 1);
        for (int ms = 0; ms < 5000 && atomic_load(&rt.inside) < want; ms++)
            sleep_ms(1);
        if (atomic_load(&rt.inside) >= want)
            atomic_fetch_add(&rt.gathered, 1);
    }
    if (atomic_load(&rt.fail_launches) > 0) {
        atomic_fetch_sub(&rt.fail_launches, 1);
        return cudaErrorLaunchFailure;
    }
    return cudaSuccess;
}

/* fake_cuda.h's runtime, with the calls this program counts, two devices and launches */
static seldp__cuda_api scripted_api(void)
{
    seldp__cuda_api api = fake_cuda_api();
    api.get_device = f_get_device;
    api.set_device = f_set_device;
    api.get_device_count = f_count;
    api.malloc = f_malloc;
    api.free = f_free;
    api.stream_synchronize = f_sync;
    api.malloc_host = f_malloc_host;
    api.free_host = f_free_host;
    api.launch_kernel = f_launch;
    return api;
}

static int device_mallocs(void)
{
    int n = 0;
    for (int d = 0; d < ORDINALS; d++)
        n += atomic_load(&rt.mallocs[d]);
    return n;
}

static int setup(void **state)
{
    (void)state;
    memset(&rt, 0, sizeof rt);
    current = 0;
    static seldp__cuda_api scripted;
    scripted = scripted_api();
    seldp__cuda_replace(&scripted);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    seldp__cuda_scratch_release(); /* with the runtime that allocated them */
    seldp__cuda_replace(NULL);
    return 0;
}

/* ---- batches: `n` segments over "device" arrays, every kind of segment ---- */

#define MAX_SEGS 1000
#define ELEMS    8

static float f32[MAX_SEGS][ELEMS], f32_out[MAX_SEGS][ELEMS];
static uint16_t halves[MAX_SEGS][ELEMS];

static size_t make_batch(seldp__convert_seg *segs, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        switch (i % 4) {
        case 0: /* F16 -> F32 */
            segs[i] = (seldp__convert_seg){f32_out[i], halves[i], SELDP_F32, SELDP_F16, ELEMS};
            break;
        case 1: /* F32 -> BF16 */
            segs[i] = (seldp__convert_seg){halves[i], f32[i], SELDP_BF16, SELDP_F32, ELEMS};
            break;
        case 2: /* zeros */
            segs[i] = (seldp__convert_seg){f32_out[i], NULL, SELDP_F32, SELDP_F32, ELEMS};
            break;
        default: /* a copy */
            segs[i] = (seldp__convert_seg){f32_out[i], f32[i], SELDP_F32, SELDP_F32, ELEMS};
            break;
        }
        total += ELEMS;
    }
    return total;
}

static seldp__convert_seg segs[MAX_SEGS];

static void convert(int ordinal, size_t n)
{
    size_t total = make_batch(segs, n);
    int launches = atomic_load(&rt.launches);
    seldp_status st = seldp__cuda_convert_batch(ordinal, segs, n);
    if (st != SELDP_OK)
        fail_msg("convert_batch of %zu segments on cuda:%d: %s (%s)", n, ordinal,
                 seldp_status_name(st), seldp_last_error());
    assert_int_equal(atomic_load(&rt.launches), launches + 1); /* one launch per call */
    assert_int_equal(atomic_load(&rt.last_n), n);
    assert_int_equal(atomic_load(&rt.last_total), total);
}

/* Calls of the same or a smaller size allocate nothing, of any kind. */
static void expect_no_allocation(int ordinal, size_t n)
{
    int dev = device_mallocs(), host = atomic_load(&rt.host_mallocs);
    int frees = atomic_load(&rt.frees) + atomic_load(&rt.host_frees);
    atomic_store(&libc_allocs, 0);
    atomic_store(&counting, 1);
    convert(ordinal, n);
    atomic_store(&counting, 0);
    if (device_mallocs() != dev || atomic_load(&rt.host_mallocs) != host ||
        atomic_load(&libc_allocs) != 0 ||
        atomic_load(&rt.frees) + atomic_load(&rt.host_frees) != frees)
        fail_msg("convert_batch of %zu segments on cuda:%d allocated %d device, %d page-locked "
                 "and %d libc blocks and freed %d, expected none",
                 n, ordinal, device_mallocs() - dev, atomic_load(&rt.host_mallocs) - host,
                 atomic_load(&libc_allocs),
                 atomic_load(&rt.frees) + atomic_load(&rt.host_frees) - frees);
}

static void test_second_call_allocates_nothing(void **state)
{
    (void)state;
    /* the first call allocates the descriptions: once on the device, once page-locked (and
     * the pool's record of them with libc, which shows that the wrapping counts) */
    atomic_store(&libc_allocs, 0);
    atomic_store(&counting, 1);
    convert(0, 100);
    atomic_store(&counting, 0);
    assert_true(atomic_load(&libc_allocs) >= 1);
    assert_int_equal(atomic_load(&rt.mallocs[0]), 1);
    assert_int_equal(atomic_load(&rt.host_mallocs), 1);

    /* the same size, smaller ones (more than the 64 a stack array would take, and fewer),
     * the same size again */
    expect_no_allocation(0, 100);
    expect_no_allocation(0, 65);
    expect_no_allocation(0, 3);
    expect_no_allocation(0, 100);

    /* a larger call grows each buffer once, then the larger size allocates nothing; the
     * smaller buffers are kept, not freed (freeing synchronizes the device while an NCCL
     * rank's peer may be inside a kernel waiting for it), until the pool is released */
    convert(0, MAX_SEGS);
    assert_int_equal(atomic_load(&rt.mallocs[0]), 2);
    assert_int_equal(atomic_load(&rt.host_mallocs), 2);
    assert_int_equal(atomic_load(&rt.frees), 0);
    assert_int_equal(atomic_load(&rt.host_frees), 0);
    expect_no_allocation(0, MAX_SEGS);
    expect_no_allocation(0, 100);

    /* another GPU gets its own, allocated on that GPU; cuda:0 still allocates nothing */
    convert(1, 10);
    assert_int_equal(atomic_load(&rt.mallocs[1]), 1);
    assert_int_equal(atomic_load(&rt.mallocs[0]), 2);
    expect_no_allocation(1, 10);
    expect_no_allocation(0, MAX_SEGS);
    assert_int_equal(current, 0); /* the caller's device, restored */

    /* everything allocated is freed by the pool */
    assert_int_equal(seldp__cuda_scratch_release(), 2);
    assert_int_equal(atomic_load(&rt.frees), device_mallocs());
    assert_int_equal(atomic_load(&rt.host_frees), atomic_load(&rt.host_mallocs));
}

/* A batch in which nothing moves launches nothing and takes nothing from the pool. */
static void test_nothing_to_move(void **state)
{
    (void)state;
    seldp__convert_seg idle[3] = {
        {f32_out[0], f32[0], SELDP_F32, SELDP_F32, 0},       /* empty */
        {f32[1], f32[1], SELDP_F32, SELDP_F32, ELEMS},       /* a copy onto itself */
        {halves[2], halves[2], SELDP_F16, SELDP_F16, ELEMS}, /* the same */
    };
    atomic_store(&libc_allocs, 0);
    atomic_store(&counting, 1);
    assert_int_equal(seldp__cuda_convert_batch(0, idle, 3), SELDP_OK);
    atomic_store(&counting, 0);
    assert_int_equal(atomic_load(&rt.launches), 0);
    assert_int_equal(device_mallocs() + atomic_load(&rt.host_mallocs), 0);
    assert_int_equal(atomic_load(&libc_allocs), 0);
    assert_int_equal(seldp__cuda_scratch_release(), 0);
}

/* A failed launch is reported, its buffers go back to the pool, and the next call reuses
 * them. */
static void test_failed_launch_gives_back(void **state)
{
    (void)state;
    make_batch(segs, 50);
    atomic_store(&rt.fail_launches, 1);
    assert_int_equal(seldp__cuda_convert_batch(0, segs, 50), SELDP_ERR_TRANSPORT);
    assert_non_null(strstr(seldp_last_error(), "cuda:0"));
    assert_true(atomic_load(&rt.syncs) >= 1); /* the copy up waited for before giving back */
    assert_int_equal(device_mallocs(), 1);
    expect_no_allocation(0, 50);
    assert_int_equal(seldp__cuda_scratch_release(), 1);
}

/* The search for a non-finite value keeps its result word in the same pool: its first call
 * on a GPU allocates once, later ones nothing, whatever the dtype. */
static void test_find_nonfinite_allocates_nothing_again(void **state)
{
    (void)state;
    static const seldp_dtype dtypes[] = {SELDP_F32, SELDP_F64, SELDP_F16, SELDP_BF16};
    size_t first = 0;
    atomic_store(&rt.other_kernel, 1);
    assert_int_equal(seldp__cuda_find_nonfinite(0, f32[0], SELDP_F32, ELEMS, &first), SELDP_OK);
    assert_int_equal(first, ELEMS); /* the scripted kernel finds nothing: n comes back */
    assert_int_equal(device_mallocs(), 1);
    assert_int_equal(atomic_load(&rt.host_mallocs), 1);
    atomic_store(&libc_allocs, 0);
    atomic_store(&counting, 1);
    for (int k = 0; k < 3; k++)
        for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
            assert_int_equal(seldp__cuda_find_nonfinite(0, f32[1], dtypes[d], ELEMS, &first),
                             SELDP_OK);
    atomic_store(&counting, 0);
    assert_int_equal(atomic_load(&rt.launches), 13);
    assert_int_equal(device_mallocs(), 1);
    assert_int_equal(atomic_load(&rt.host_mallocs), 1);
    assert_int_equal(atomic_load(&libc_allocs), 0);
    assert_int_equal(atomic_load(&rt.frees) + atomic_load(&rt.host_frees), 0);
    atomic_store(&rt.other_kernel, 0);
    /* a conversion after it finds the pool's scratch (grown if it needs more) */
    convert(0, 10);
    assert_int_equal(device_mallocs(), 1);
    assert_int_equal(seldp__cuda_scratch_release(), 1);
}

/* ---- threads converting at once ---- */

#define THREADS 3

typedef struct worker {
    int ordinal;
    size_t n;
    seldp_status st;
    char error[256];
} worker;

static seldp__convert_seg thread_segs[THREADS][MAX_SEGS];

static worker workers[THREADS];

static void *run_worker(void *arg)
{
    worker *w = arg;
    size_t k = (size_t)(w - workers);
    make_batch(thread_segs[k], w->n);
    current = w->ordinal == 0 ? 1 : 0; /* the call switches to its GPU and back */
    w->st = seldp__cuda_convert_batch(w->ordinal, thread_segs[k], w->n);
    if (w->st != SELDP_OK)
        snprintf(w->error, sizeof w->error, "%s", seldp_last_error());
    else if (current != (w->ordinal == 0 ? 1 : 0))
        snprintf(w->error, sizeof w->error, "the thread's device was not restored");
    return NULL;
}

/* All THREADS convert at once, each launch waiting until every thread is inside one. */
static void run_together(void)
{
    pthread_t threads[THREADS];
    atomic_store(&rt.inside, 0);
    atomic_store(&rt.gathered, 0);
    atomic_store(&rt.gather, THREADS);
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&threads[t], NULL, run_worker, &workers[t]), 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    atomic_store(&rt.gather, 0);
    for (int t = 0; t < THREADS; t++)
        if (workers[t].st != SELDP_OK || workers[t].error[0])
            fail_msg("thread %d on cuda:%d: %s", t, workers[t].ordinal, workers[t].error);
    if (atomic_load(&rt.gathered) != THREADS)
        fail_msg("only %d of %d conversions were in flight at once: threads wait for each "
                 "other's descriptions",
                 atomic_load(&rt.gathered), THREADS);
}

static void test_threads_hold_their_own(void **state)
{
    (void)state;
    /* two threads on cuda:0 and one on cuda:1, sizes that differ */
    workers[0] = (worker){.ordinal = 0, .n = 300};
    workers[1] = (worker){.ordinal = 0, .n = 40};
    workers[2] = (worker){.ordinal = 1, .n = 200};
    run_together();
    assert_int_equal(atomic_load(&rt.mallocs[0]), 2); /* one each while both were held */
    assert_int_equal(atomic_load(&rt.mallocs[1]), 1);
    assert_int_equal(atomic_load(&rt.host_mallocs), 3);

    /* again at once, the sizes swapped between the two cuda:0 threads: the pool holds enough,
     * each thread takes one that fits */
    workers[0].n = 40;
    workers[1].n = 300;
    int dev = device_mallocs(), host = atomic_load(&rt.host_mallocs);
    run_together();
    assert_int_equal(device_mallocs(), dev);
    assert_int_equal(atomic_load(&rt.host_mallocs), host);
    assert_int_equal(atomic_load(&rt.frees) + atomic_load(&rt.host_frees), 0);
    assert_int_equal(seldp__cuda_scratch_release(), 3);
    assert_int_equal(atomic_load(&rt.frees), device_mallocs());
    assert_int_equal(atomic_load(&rt.host_frees), atomic_load(&rt.host_mallocs));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_second_call_allocates_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_to_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_launch_gives_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_find_nonfinite_allocates_nothing_again, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_threads_hold_their_own, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
