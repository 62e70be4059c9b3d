/* NCCL bootstrapped over MPI (seldp_mpi_nccl_comm_init), one process per rank: invalid
 * arguments are refused on every build; a build without NCCL returns SELDP_ERR_UNSUPPORTED
 * on every rank, and one with NCCL but too few GPUs fails on every rank without hanging;
 * with a GPU per process, the world is an NCCL world of every process whose collectives
 * and splits move device buffers. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

#ifdef SELDP_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "seldp/nccl.h"
#endif

#define TIMEOUT_S 10.0

/* This process's rank among the processes of its node, and their number. */
static void node_rank(int *local, int *local_size)
{
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mt_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, local);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
}

/* True when every process of every node has a GPU of its own (the same answer everywhere). */
static bool gpu_per_process(void)
{
    int local = 0, local_size = 1, mine = 0, all = 0;
    node_rank(&local, &local_size);
#ifdef SELDP_HAVE_NCCL
    mine = seldp_nccl_device_count() >= local_size;
#endif
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all != 0;
}

static void test_arguments(void **state)
{
    (void)state;
    seldp_comm *comm = (seldp_comm *)&comm;
    assert_int_equal(seldp_mpi_nccl_comm_init(MPI_COMM_WORLD, NULL, NULL),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_mpi_nccl_comm_init(MPI_COMM_NULL, NULL, &comm),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(comm);
}

/* Without NCCL, or with fewer GPUs than processes on a node: every rank returns an error,
 * within the timeout, and no communicator. */
static void test_refused_everywhere(void **state)
{
    (void)state;
    if (gpu_per_process())
        skip();
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = TIMEOUT_S;
    seldp_comm *comm = (seldp_comm *)&comm;
    double t0 = mt_now();
    seldp_status st = seldp_mpi_nccl_comm_init(MPI_COMM_WORLD, &cfg, &comm);
    double waited = mt_now() - t0;
    assert_null(comm);
    assert_true(waited < TIMEOUT_S + 5.0);
    seldp_comm *world = mt_world(TIMEOUT_S);
    if (seldp_has_feature("nccl")) {
        int64_t ok = st == SELDP_OK, any_ok = 0;
        if (st == SELDP_OK)
            print_error("rank %d: joined an NCCL world without a GPU of its own\n", mt_rank);
        assert_int_equal(seldp_comm_allreduce(world, &ok, &any_ok, 1, SELDP_I64, SELDP_HOST_DEVICE),
                         SELDP_OK);
        assert_int_equal(any_ok, 0);
    } else {
        mt_expect_everywhere(world, st, SELDP_ERR_UNSUPPORTED, "no NCCL transport");
    }
    seldp_comm_destroy(world);
}

#ifdef SELDP_HAVE_NCCL
static void assert_ok(seldp_status st)
{
    if (st != SELDP_OK)
        fail_msg("rank %d: %s: %s", mt_rank, seldp_status_name(st), seldp_last_error());
}

/* Copy n floats between the host and a tensor on this rank's GPU. */
static float *device_floats(seldp_device dev, const float *host, size_t n)
{
    int64_t shape[1] = {(int64_t)n};
    seldp_tensor d = seldp_tensor_view(SELDP_F32, dev, NULL, 1, shape);
    assert_ok(seldp_tensor_alloc(&d));
    seldp_tensor h = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, (void *)host, 1, shape);
    assert_ok(seldp_tensor_copy(&d, &h));
    return d.data;
}

static void download(seldp_device dev, float *host, const float *data, size_t n)
{
    int64_t shape[1] = {(int64_t)n};
    seldp_tensor d = seldp_tensor_view(SELDP_F32, dev, (void *)data, 1, shape);
    seldp_tensor h = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, host, 1, shape);
    assert_ok(seldp_tensor_copy(&h, &d));
}

static void release(seldp_device dev, float *data)
{
    int64_t shape[1] = {1};
    seldp_tensor d = seldp_tensor_view(SELDP_F32, dev, data, 1, shape);
    seldp_tensor_free(&d);
}
#endif

/* One GPU per process: an NCCL world of every process, with device-buffer collectives. */
static void test_collectives_on_gpus(void **state)
{
    (void)state;
    if (!gpu_per_process())
        skip();
#ifdef SELDP_HAVE_NCCL
    enum { N = 1000 };
    int local = 0, local_size = 1;
    node_rank(&local, &local_size);
    assert_int_equal(cudaSetDevice(local), cudaSuccess);
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = TIMEOUT_S;
    seldp_comm *world = NULL;
    assert_ok(seldp_mpi_nccl_comm_init(MPI_COMM_WORLD, &cfg, &world));
    assert_string_equal(seldp_comm_transport(world), "nccl");
    assert_int_equal(seldp_comm_rank(world), mt_rank);
    assert_int_equal(seldp_comm_size(world), mt_size);
    seldp_device dev = seldp_comm_device(world);
    assert_int_equal(dev.kind, SELDP_DEVICE_CUDA);
    assert_int_equal(dev.ordinal, local);

    static float host[N], back[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)(mt_rank + 1) + (float)i * 0.5f;
    float *buf = device_floats(dev, host, N);
    assert_ok(seldp_comm_allreduce(world, buf, buf, N, SELDP_F32, dev));
    download(dev, back, buf, N);
    float ranks_sum = (float)(mt_size * (mt_size + 1) / 2);
    for (int i = 0; i < N; i++)
        assert_float_equal(back[i], ranks_sum + (float)mt_size * (float)i * 0.5f, 0.0f);

    /* broadcast from the last rank */
    for (int i = 0; i < N; i++)
        host[i] = mt_rank == mt_size - 1 ? (float)(3 * i) : -1.0f;
    release(dev, buf);
    buf = device_floats(dev, host, N);
    assert_ok(seldp_comm_broadcast(world, buf, N, SELDP_F32, mt_size - 1, dev));
    download(dev, back, buf, N);
    for (int i = 0; i < N; i++)
        assert_float_equal(back[i], (float)(3 * i), 0.0f);

    /* a split into even and odd ranks reduces within its half only */
    seldp_comm *half = NULL;
    assert_ok(seldp_comm_split(world, mt_rank % 2, mt_rank, &half));
    float one = 1.0f, count = 0.0f;
    float *d_one = device_floats(dev, &one, 1);
    assert_ok(seldp_comm_allreduce(half, d_one, d_one, 1, SELDP_F32, dev));
    download(dev, &count, d_one, 1);
    assert_float_equal(count, (float)seldp_comm_size(half), 0.0f);
    assert_int_equal(seldp_comm_size(half), (mt_size - mt_rank % 2 + 1) / 2);
    release(dev, d_one);
    release(dev, buf);
    seldp_comm_destroy(half);
    seldp_comm_destroy(world);
#endif
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_arguments),
        MT_TEST(test_refused_everywhere),
        MT_TEST(test_collectives_on_gpus),
    };
    return mt_main(argc, argv, "mpi_nccl", tests, sizeof tests / sizeof tests[0]);
}
