/* seldp_version() and seldp_has_feature() report this build: the project version and exactly
 * the transports compiled in (the build passes what it configured as SELDP_EXPECT_*). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "seldp/version.h"

#if defined(SELDP_EXPECT_CUDA)
#define EXPECT_CUDA 1
#else
#define EXPECT_CUDA 0
#endif
#if defined(SELDP_EXPECT_NCCL)
#define EXPECT_NCCL 1
#else
#define EXPECT_NCCL 0
#endif
#if defined(SELDP_EXPECT_MPI)
#define EXPECT_MPI 1
#else
#define EXPECT_MPI 0
#endif

static void version_names_project_version_and_transports(void **state)
{
    (void)state;
    char expected[128];
    snprintf(expected, sizeof expected, "%s (transports: host%s%s%s)", SELDP_EXPECTED_VERSION,
             EXPECT_NCCL ? " nccl" : "", EXPECT_MPI ? " mpi" : "", EXPECT_CUDA ? "; cuda" : "");
    assert_non_null(seldp_version());
    assert_string_equal(seldp_version(), expected);
}

static void has_feature_matches_the_build(void **state)
{
    (void)state;
    assert_int_equal(seldp_has_feature("host"), 1);
    assert_int_equal(seldp_has_feature("nccl") != 0, EXPECT_NCCL);
    assert_int_equal(seldp_has_feature("mpi") != 0, EXPECT_MPI);
    assert_int_equal(seldp_has_feature("cuda") != 0, EXPECT_CUDA);
}

static void has_feature_rejects_unknown_names(void **state)
{
    (void)state;
    assert_int_equal(seldp_has_feature(NULL), 0);
    assert_int_equal(seldp_has_feature(""), 0);
    assert_int_equal(seldp_has_feature("HOST"), 0);
    assert_int_equal(seldp_has_feature("hostx"), 0);
    assert_int_equal(seldp_has_feature("gloo"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_names_project_version_and_transports),
        cmocka_unit_test(has_feature_matches_the_build),
        cmocka_unit_test(has_feature_rejects_unknown_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
