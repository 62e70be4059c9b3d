/* The NCCL transport's joining against a scripted CUDA runtime (seldp__cuda_replace), no
 * GPU needed: a rank whose stream cannot be created marks the world aborted, so a rank
 * joining after it returns SELDP_ERR_ABORTED at once instead of waiting out the timeout in
 * NCCL's bootstrap; and every stream created is destroyed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_stream_aborts_the_world),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
