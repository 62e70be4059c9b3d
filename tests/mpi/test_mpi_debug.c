/* The debug mode of the collectives (SELDP_DEBUG_COLLECTIVES) on the MPI transport: a
 * planted mismatch that the transport's own headers cannot see (two broadcasts of the same
 * bytes in different dtypes) passes without the mode and is SELDP_ERR_DISAGREE on every
 * rank with it, naming both calls; agreeing calls run as usual. */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

#define TIMEOUT_S 20.0

/* The last rank broadcasts 16 F64 where the others broadcast 32 F32 (128 bytes each). */
static seldp_status planted_broadcast(seldp_comm *comm, unsigned char buf[128])
{
    if (mt_rank == mt_size - 1)
        return seldp_comm_broadcast(comm, buf, 16, SELDP_F64, 0, SELDP_HOST_DEVICE);
    return seldp_comm_broadcast(comm, buf, 32, SELDP_F32, 0, SELDP_HOST_DEVICE);
}

static void test_mismatch_passes_without_the_mode(void **state)
{
    (void)state;
    setenv("SELDP_DEBUG_COLLECTIVES", "0", 1);
    seldp_comm *world = mt_world(TIMEOUT_S);
    unsigned char buf[128] = {0};
    seldp_status st = planted_broadcast(world, buf);
    /* the bytes agree, so the transport cannot tell */
    mt_expect_everywhere(world, st, SELDP_OK, "");
    seldp_comm_destroy(world);
}

static void test_mismatch_caught_with_the_mode(void **state)
{
    (void)state;
    setenv("SELDP_DEBUG_COLLECTIVES", "1", 1);
    seldp_comm *world = mt_world(TIMEOUT_S);
    unsigned char buf[128], before[128];
    for (int i = 0; i < 128; i++)
        buf[i] = (unsigned char)(mt_rank * 31 + i);
    memcpy(before, buf, sizeof buf);
    seldp_status ok = seldp_comm_barrier(world);
    seldp_status st = planted_broadcast(world, buf);
    char other[96];
    snprintf(other, sizeof other, "rank %d made call #2 broadcast(count 16, f64, root 0)",
             mt_size - 1);
    bool named =
        strstr(seldp_last_error(), "rank 0 made call #2 broadcast(count 32, f32, root 0)") &&
        strstr(seldp_last_error(), other);
    bool unchanged = memcmp(buf, before, sizeof buf) == 0;
    mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE,
                         "collective mismatch (SELDP_DEBUG_COLLECTIVES)");
    setenv("SELDP_DEBUG_COLLECTIVES", "0", 1);
    seldp_comm_destroy(world);
    assert_int_equal(ok, SELDP_OK);
    assert_true(named);
    assert_true(unchanged);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_mismatch_passes_without_the_mode),
        MT_TEST(test_mismatch_caught_with_the_mode),
    };
    return mt_main(argc, argv, "mpi_debug", tests, sizeof tests / sizeof *tests);
}
