/* The reduce path of a session whose tensors are on a GPU (seldp__session_choose_fused,
 * src/session.c, over seldp__comm_fused_memory, src/comm/comm.c), without a GPU: on the
 * NCCL transport, whose fused reduction works on the communicator's GPU, it takes the
 * fused path unless told otherwise; on the host-staged transport, whose fused reduction
 * reads host memory only, it takes the bucketed one, and an explicit request for the fused
 * path fails naming the transport, the memory and what the reduction needs. The NCCL
 * transport is looked at through its own table of operations (a GPU-less process cannot
 * join an NCCL world); the host-staged one through whole sessions over a scripted CUDA
 * runtime (fake_cuda.h) whose "device" memory is host memory. */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm_impl.h"
#include "device.h"
#include "fake_cuda.h"
#include "seldp/seldp.h"
#include "session_impl.h"
#ifdef SELDP_HAVE_NCCL
#include "comm/nccl/nccl_impl.h"
#endif

static const seldp_device host = {SELDP_DEVICE_HOST, 0};
static const seldp_device cuda0 = {SELDP_DEVICE_CUDA, 0};

static seldp_session_config config(seldp_reduce_path path)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    cfg.reduce_path = path;
    return cfg;
}

/* seldp__session_choose_fused's answer; `status` expected, `fused` expected when OK. */
static void expect_choice(const seldp_comm *comm, seldp_device mem, seldp_reduce_path path,
                          seldp_status status, bool fused)
{
    seldp_session_config cfg = config(path);
    bool got = !fused;
    seldp_status st = seldp__session_choose_fused(comm, mem, &cfg, &got);
    if (st != status)
        fail_msg("%s transport, memory kind %d ordinal %d, path %d: %s (%s), expected %s",
                 seldp_comm_transport(comm), (int)mem.kind, mem.ordinal, (int)path,
                 seldp_status_name(st), st ? seldp_last_error() : "", seldp_status_name(status));
    if (st == SELDP_OK && got != fused)
        fail_msg("%s transport, memory kind %d ordinal %d, path %d: fused %d, expected %d",
                 seldp_comm_transport(comm), (int)mem.kind, mem.ordinal, (int)path, got, fused);
    if (st != SELDP_OK)
        assert_false(got);
}

static void expect_error(const char *want)
{
    if (!strstr(seldp_last_error(), want))
        fail_msg("error '%s', expected it to contain '%s'", seldp_last_error(), want);
}

static int clear_env(void **state)
{
    (void)state;
    unsetenv("SELDP_REDUCE_PATH");
    return 0;
}

/* ---- the NCCL transport ---- */

static void test_nccl_gpu_session_takes_fused(void **state)
{
    (void)state;
#ifdef SELDP_HAVE_NCCL
    const seldp_device cuda1 = {SELDP_DEVICE_CUDA, 1};
    nccl_comm impl;
    memset(&impl, 0, sizeof impl);
    impl.ordinal = 0;
    impl.size = 2;
    seldp_comm *comm = seldp__comm_new(seldp__nccl_ops(), 0, 2, 0, cuda0, &impl);
    assert_non_null(comm);
    assert_non_null(comm->ops->reduce_fused);

    /* the session's tensors are on the communicator's GPU */
    assert_true(seldp__comm_fused_memory(comm, cuda0, NULL, 0));
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_AUTO, SELDP_OK, true);
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_FUSED, SELDP_OK, true);
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_BUCKETED, SELDP_OK, false);
    setenv("SELDP_REDUCE_PATH", "bucketed", 1);
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_AUTO, SELDP_OK, false);
    setenv("SELDP_REDUCE_PATH", "fused", 1);
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_AUTO, SELDP_OK, true);
    unsetenv("SELDP_REDUCE_PATH");

    /* host segments are staged by the same reduction; another GPU is not its memory */
    char needs[64];
    assert_true(seldp__comm_fused_memory(comm, host, needs, sizeof needs));
    assert_string_equal(needs, "cuda:0 or host memory");
    assert_false(seldp__comm_fused_memory(comm, cuda1, NULL, 0));
    expect_choice(comm, cuda1, SELDP_REDUCE_PATH_AUTO, SELDP_OK, false);
    expect_choice(comm, cuda1, SELDP_REDUCE_PATH_FUSED, SELDP_ERR_INVALID_ARGUMENT, false);
    expect_error("the nccl transport's fused reduction does not work on cuda:1 memory (it "
                 "needs cuda:0 or host memory)");

    /* a rank on another GPU: its own */
    impl.ordinal = 1;
    comm->device = cuda1;
    expect_choice(comm, cuda1, SELDP_REDUCE_PATH_AUTO, SELDP_OK, true);
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_AUTO, SELDP_OK, false);
    seldp__comm_free(comm);
#else
    skip();
#endif
}

/* A transport without a fused reduction (MPI's table has none). */
static void test_transport_without_fused(void **state)
{
    (void)state;
    static const seldp_comm_ops none = {.name = "mpi"};
    seldp_comm *comm = seldp__comm_new(&none, 0, 1, 0, host, NULL);
    assert_non_null(comm);
    char needs[64];
    assert_false(seldp__comm_fused_memory(comm, host, needs, sizeof needs));
    assert_string_equal(needs, "no fused reduction");
    expect_choice(comm, host, SELDP_REDUCE_PATH_AUTO, SELDP_OK, false);
    expect_choice(comm, cuda0, SELDP_REDUCE_PATH_FUSED, SELDP_ERR_INVALID_ARGUMENT, false);
    expect_error("the mpi transport has no fused reduction");
    seldp__comm_free(comm);
}

/* ---- the host-staged transport, through whole sessions ---- */

/* A one-rank session on the host-staged transport with its tensors on `device`: an empty
 * selection, so that nothing but the path's choice needs the device. Returns initialize's
 * status and, when it succeeded, the path the group agreed on. */
static seldp_status host_session(seldp_device device, seldp_reduce_path path,
                                 seldp_reduce_path *agreed)
{
    seldp_host_world *world = NULL;
    seldp_comm *comm = NULL;
    seldp_model *model = NULL;
    seldp_session *s = NULL;
    seldp_comm_config ccfg = SELDP_COMM_CONFIG_INIT;
    seldp_session_config cfg = config(path);
    ccfg.timeout_s = 30;
    *agreed = SELDP_REDUCE_PATH_AUTO;
    assert_int_equal(seldp_host_world_create(1, &ccfg, &world), SELDP_OK);
    assert_int_equal(seldp_host_comm_init(world, 0, device, &comm), SELDP_OK);
    assert_int_equal(seldp_model_create(0, &model), SELDP_OK);

    /* the host comm on a GPU also checks its device, as a session would */
    expect_choice(comm, device, SELDP_REDUCE_PATH_AUTO, SELDP_OK, device.kind == SELDP_DEVICE_HOST);
    seldp_status st = seldp_session_initialize(comm, model, 0, NULL, 0, &cfg, &s);
    if (st == SELDP_OK)
        *agreed = seldp_session_reduce_path(s);
    seldp_session_destroy(s);
    seldp_model_destroy(model);
    seldp_comm_destroy(comm);
    seldp_host_world_destroy(world);
    return st;
}

static void test_host_gpu_session_stays_bucketed(void **state)
{
    (void)state;
    seldp_reduce_path agreed;
    static seldp__cuda_api scripted;
    scripted = fake_cuda_api();
    const seldp__cuda_api *prev = seldp__cuda_replace(&scripted);

    /* GPU tensors: the host transport's fused reduction would read device pointers on the
     * host, so the session takes the bucketed path */
    assert_int_equal(host_session(cuda0, SELDP_REDUCE_PATH_AUTO, &agreed), SELDP_OK);
    assert_int_equal(agreed, SELDP_REDUCE_PATH_BUCKETED);
    assert_int_equal(host_session(cuda0, SELDP_REDUCE_PATH_BUCKETED, &agreed), SELDP_OK);
    assert_int_equal(agreed, SELDP_REDUCE_PATH_BUCKETED);
    seldp_status st = host_session(cuda0, SELDP_REDUCE_PATH_FUSED, &agreed);
    char error[1024];
    snprintf(error, sizeof error, "%s", seldp_last_error());
    seldp__cuda_replace(prev);
    if (st != SELDP_ERR_INVALID_ARGUMENT)
        fail_msg("the fused path on the host transport on cuda:0: %s (%s), expected "
                 "SELDP_ERR_INVALID_ARGUMENT",
                 seldp_status_name(st), error);
    if (!strstr(error, "the fused reduce path was asked for, but the host transport's fused "
                       "reduction does not work on cuda:0 memory (it needs host memory)"))
        fail_msg("error '%s' does not say why", error);

    /* host tensors: the fused path, so the check above is not a path never taken */
    assert_int_equal(host_session(host, SELDP_REDUCE_PATH_AUTO, &agreed), SELDP_OK);
    assert_int_equal(agreed, SELDP_REDUCE_PATH_FUSED);
    assert_int_equal(host_session(host, SELDP_REDUCE_PATH_FUSED, &agreed), SELDP_OK);
    assert_int_equal(agreed, SELDP_REDUCE_PATH_FUSED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_nccl_gpu_session_takes_fused, clear_env),
        cmocka_unit_test_setup(test_transport_without_fused, clear_env),
        cmocka_unit_test_setup(test_host_gpu_session_stays_bucketed, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
