/* The host transport's staging of device buffers (seldp__host_stage, src/comm/host/host.c)
 * against a scripted CUDA runtime (seldp__cuda_replace) whose "device" memory is host
 * memory: the collectives give the right results on cuda:0 buffers, and each communicator
 * stages through one grow-only pinned buffer, allocated when a collective needs more than
 * it has and freed with the communicator, never once per call. Runs without a GPU. */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier_t */

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "device.h"
#include "seldp/seldp.h"

static atomic_int mallocs_host, frees_host;

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

static cudaError_t f_memcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)kind;
    (void)s;
    memcpy(dst, src, bytes);
    return cudaSuccess;
}

static cudaError_t f_sync(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

static cudaError_t f_malloc_host(void **p, size_t bytes)
{
    atomic_fetch_add(&mallocs_host, 1);
    *p = malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static cudaError_t f_free_host(void *p)
{
    atomic_fetch_add(&frees_host, 1);
    free(p);
    return cudaSuccess;
}

static cudaError_t f_attributes(struct cudaPointerAttributes *attr, const void *p)
{
    (void)p;
    memset(attr, 0, sizeof *attr);
    attr->type = cudaMemoryTypeHost; /* every pinned free goes to f_free_host */
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
    .memcpy_async = f_memcpy,
    .stream_synchronize = f_sync,
    .malloc_host = f_malloc_host,
    .free_host = f_free_host,
    .pointer_attributes = f_attributes,
    .get_last_error = f_last_error,
};

#define RANKS 2
#define COUNT 4096 /* above the transport's eager size: the two-phase path */

static const seldp_device dev0 = {SELDP_DEVICE_CUDA, 0};

typedef struct rank_run {
    seldp_host_world *world;
    int rank;
    pthread_barrier_t *step;   /* every rank past a step before the main thread counts */
    int mallocs_after_repeats; /* seen by rank 0 after the same-size allreduces */
    int mallocs_after_smaller;
    int mallocs_after_larger;
    char error[256];
} rank_run;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(r->error, sizeof r->error, __VA_ARGS__);                                      \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void *rank_main(void *arg)
{
    rank_run *r = arg;
    seldp_comm *comm = NULL;
    float *buf = malloc(4 * COUNT * sizeof *buf), *all = malloc(RANKS * COUNT * sizeof *all);
    CHECK(buf && all, "rank %d: out of memory", r->rank);
    CHECK(seldp_host_comm_init(r->world, r->rank, dev0, &comm) == SELDP_OK, "rank %d: init: %s",
          r->rank, seldp_last_error());

    /* Ten allreduces of one size: one staging allocation. */
    for (int k = 0; k < 10; k++) {
        for (int i = 0; i < COUNT; i++)
            buf[i] = (float)(r->rank + 1) * (float)(i + k);
        CHECK(seldp_comm_allreduce(comm, buf, buf, COUNT, SELDP_F32, dev0) == SELDP_OK,
              "rank %d: allreduce %d: %s", r->rank, k, seldp_last_error());
        for (int i = 0; i < COUNT; i++)
            CHECK(buf[i] == 3.0f * (float)(i + k), "rank %d: allreduce %d: element %d is %g",
                  r->rank, k, i, (double)buf[i]);
    }
    pthread_barrier_wait(r->step);
    r->mallocs_after_repeats = atomic_load(&mallocs_host);
    pthread_barrier_wait(r->step);

    /* Smaller collectives of every kind fit in it. */
    for (int i = 0; i < COUNT; i++)
        buf[i] = r->rank == 1 ? (float)i : -1.0f;
    CHECK(seldp_comm_broadcast(comm, buf, COUNT, SELDP_F32, 1, dev0) == SELDP_OK,
          "rank %d: broadcast: %s", r->rank, seldp_last_error());
    for (int i = 0; i < COUNT; i++)
        CHECK(buf[i] == (float)i, "rank %d: broadcast: element %d is %g", r->rank, i,
              (double)buf[i]);
    for (int i = 0; i < COUNT / 4; i++)
        buf[i] = (float)(r->rank * COUNT + i);
    CHECK(seldp_comm_allgather(comm, buf, all, COUNT / 4 * sizeof *buf, dev0) == SELDP_OK,
          "rank %d: allgather: %s", r->rank, seldp_last_error());
    for (int q = 0; q < RANKS; q++)
        for (int i = 0; i < COUNT / 4; i++)
            CHECK(all[q * COUNT / 4 + i] == (float)(q * COUNT + i),
                  "rank %d: allgather: rank %d's element %d is %g", r->rank, q, i,
                  (double)all[q * COUNT / 4 + i]);
    /* alltoallv: rank q's piece for p is 100 + q elements at displacement p * 512 */
    size_t sc[RANKS], sd[RANKS], rc[RANKS], rd[RANKS];
    for (int p = 0; p < RANKS; p++) {
        sc[p] = 100 + (size_t)r->rank;
        sd[p] = (size_t)p * 512;
        rc[p] = 100 + (size_t)p;
        rd[p] = (size_t)p * 512 + 7;
        for (size_t i = 0; i < sc[p]; i++)
            buf[sd[p] + i] = (float)(r->rank * 1000 + p * 100) + (float)i;
    }
    for (int i = 0; i < COUNT; i++)
        all[i] = -5.0f;
    CHECK(seldp_comm_alltoallv(comm, buf, sc, sd, all, rc, rd, SELDP_F32, dev0) == SELDP_OK,
          "rank %d: alltoallv: %s", r->rank, seldp_last_error());
    for (int q = 0; q < RANKS; q++) {
        for (size_t i = 0; i < rc[q]; i++)
            CHECK(all[rd[q] + i] == (float)(q * 1000 + r->rank * 100) + (float)i,
                  "rank %d: alltoallv: element %zu from rank %d is %g", r->rank, i, q,
                  (double)all[rd[q] + i]);
        CHECK(all[rd[q] - 1] == -5.0f, "rank %d: alltoallv wrote before rank %d's piece", r->rank,
              q);
    }
    pthread_barrier_wait(r->step);
    r->mallocs_after_smaller = atomic_load(&mallocs_host);
    pthread_barrier_wait(r->step);

    /* A larger one grows it, once. */
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 4 * COUNT; i++)
            buf[i] = (float)(r->rank + 1);
        CHECK(seldp_comm_allreduce(comm, buf, buf, 4 * COUNT, SELDP_F32, dev0) == SELDP_OK,
              "rank %d: large allreduce: %s", r->rank, seldp_last_error());
        CHECK(buf[4 * COUNT - 1] == 3.0f, "rank %d: large allreduce: last element %g", r->rank,
              (double)buf[4 * COUNT - 1]);
    }
    pthread_barrier_wait(r->step);
    r->mallocs_after_larger = atomic_load(&mallocs_host);
out:
    seldp_comm_destroy(comm);
    free(buf);
    free(all);
    return NULL;
}

static void test_one_grow_only_buffer_per_communicator(void **state)
{
    (void)state;
    seldp_host_world *world = NULL;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 60.0;
    assert_int_equal(seldp_host_world_create(RANKS, &cfg, &world), SELDP_OK);
    seldp__cuda_replace(&fake_api);
    pthread_barrier_t step;
    pthread_barrier_init(&step, NULL, RANKS);
    rank_run runs[RANKS];
    pthread_t threads[RANKS];
    memset(runs, 0, sizeof runs);
    for (int r = 0; r < RANKS; r++) {
        runs[r] = (rank_run){.world = world, .rank = r, .step = &step};
        assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &runs[r]), 0);
    }
    for (int r = 0; r < RANKS; r++)
        pthread_join(threads[r], NULL);
    seldp__cuda_replace(NULL);
    pthread_barrier_destroy(&step);
    seldp_host_world_destroy(world);
    for (int r = 0; r < RANKS; r++)
        if (runs[r].error[0])
            fail_msg("%s", runs[r].error);
    /* one allocation per rank for the first size, none for smaller ones, one more each for
     * the larger size, and every allocation freed (the grown-out ones at the growth) */
    assert_int_equal(runs[0].mallocs_after_repeats, RANKS);
    assert_int_equal(runs[0].mallocs_after_smaller, RANKS);
    assert_int_equal(runs[0].mallocs_after_larger, 2 * RANKS);
    assert_int_equal(atomic_load(&frees_host), atomic_load(&mallocs_host));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_grow_only_buffer_per_communicator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
