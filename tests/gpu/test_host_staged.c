/* The host-staged transport with device tensors: 8 simulated ranks that all compute on one
 * GPU (more ranks than GPUs), running the collective contract with device and host buffers
 * and a session over device parameters. Exits 77 without a GPU; `--host` runs the same
 * checks with host memory to validate them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gpu_checks.h"

#define RANKS     8
#define TIMEOUT_S 60.0

static gpu_world_kind kind = GPU_WORLD_HOST_STAGED;

static void test_collectives_8_ranks_on_one_gpu(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, RANKS, 1, TIMEOUT_S, gpu_check_collectives, NULL);
}

static void test_session_8_ranks_on_one_gpu(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, RANKS, 1, TIMEOUT_S, gpu_check_session, NULL);
}

/* Odd rank counts and a world of one exercise the uneven and trivial paths. */
static void test_session_3_and_1_ranks(void **state)
{
    (void)state;
    gpu_run_ranks_or_fail(kind, 3, 1, TIMEOUT_S, gpu_check_session, NULL);
    gpu_run_ranks_or_fail(kind, 1, 1, TIMEOUT_S, gpu_check_collectives, NULL);
}

int main(int argc, char **argv)
{
    if (gpu_host_mode(argc, argv))
        kind = GPU_WORLD_HOST_ON_HOST;
    else
        gpu_require();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_8_ranks_on_one_gpu),
        cmocka_unit_test(test_session_8_ranks_on_one_gpu),
        cmocka_unit_test(test_session_3_and_1_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
