/* Config structs that grow at the end: every public config starts with its struct_size,
 * which the library reads to tell an older caller's struct (newer fields keep their
 * defaults) and a newer caller's (an unknown tail must be zero) from one that was never
 * started from its SELDP_*_CONFIG_INIT. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "seldp/seldp.h"

static void test_initializers_carry_their_size(void **state)
{
    (void)state;
    seldp_comm_config comm = SELDP_COMM_CONFIG_INIT;
    seldp_session_config session = SELDP_SESSION_CONFIG_INIT;
    seldp_layout_config layout = SELDP_LAYOUT_CONFIG_INIT;
    assert_int_equal(comm.struct_size, sizeof comm);
    assert_int_equal(session.struct_size, sizeof session);
    assert_int_equal(layout.struct_size, sizeof layout);
}

static void test_a_struct_not_started_from_its_initializer_is_refused(void **state)
{
    (void)state;
    seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
    cfg.struct_size = 0;
    seldp_layout *l = NULL;
    assert_int_equal(seldp_layout_create(&cfg, &l), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(l);
    assert_non_null(strstr(seldp_last_error(), "seldp_layout_create"));
    assert_non_null(strstr(seldp_last_error(), "struct_size is 0"));
    assert_non_null(strstr(seldp_last_error(), "SELDP_LAYOUT_CONFIG_INIT"));

    seldp_comm_config comm = SELDP_COMM_CONFIG_INIT;
    comm.struct_size = 0;
    seldp_host_world *w = NULL;
    assert_int_equal(seldp_host_world_create(2, &comm, &w), SELDP_ERR_INVALID_ARGUMENT);
    assert_null(w);
    assert_non_null(strstr(seldp_last_error(), "SELDP_COMM_CONFIG_INIT"));
}

/* A caller built against a header whose struct ended before `experts`: the fields it knew
 * are read, the later ones keep the library's defaults whatever its memory holds there. */
static void test_an_older_struct_keeps_the_defaults_of_newer_fields(void **state)
{
    (void)state;
    seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
    cfg.world = 8;
    cfg.ep = 2;
    cfg.experts = 16;           /* past the older struct's end: not read */
    cfg.order = "not-an-order"; /* likewise; read, it would be refused */
    cfg.struct_size = offsetof(seldp_layout_config, experts);
    seldp_layout *l = NULL;
    assert_int_equal(seldp_layout_create(&cfg, &l), SELDP_OK);
    seldp_layout_config got = seldp_layout_get_config(l);
    assert_int_equal(got.struct_size, sizeof got);
    assert_int_equal(got.world, 8);
    assert_int_equal(got.ep, 2);
    assert_int_equal(got.experts, 0);
    seldp_layout_destroy(l);
}

/* A caller built against a newer header passes a larger struct: its unknown tail must be
 * zero (the defaults of settings this library does not have), else it is refused. */
static void test_a_newer_struct_needs_a_zero_tail(void **state)
{
    (void)state;
    size_t big = sizeof(seldp_comm_config) + 16;
    unsigned char *bytes = calloc(1, big);
    assert_non_null(bytes);
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = 5.0;
    memcpy(bytes, &cfg, sizeof cfg);
    memcpy(bytes, &big, sizeof big);
    seldp_host_world *w = NULL;
    assert_int_equal(seldp_host_world_create(2, (const seldp_comm_config *)bytes, &w), SELDP_OK);
    seldp_host_world_destroy(w);

    bytes[sizeof cfg + 9] = 1;
    w = NULL;
    assert_int_equal(seldp_host_world_create(2, (const seldp_comm_config *)bytes, &w),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(w);
    assert_non_null(strstr(seldp_last_error(), "newer seldp header"));
    free(bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_initializers_carry_their_size),
        cmocka_unit_test(test_a_struct_not_started_from_its_initializer_is_refused),
        cmocka_unit_test(test_an_older_struct_keeps_the_defaults_of_newer_fields),
        cmocka_unit_test(test_a_newer_struct_needs_a_zero_tail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
