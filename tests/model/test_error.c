/* tiny-moe's own error channel (tm_last_error): a failing tm_ call leaves a message naming
 * the rank, the path and the expectation there, and clears the library's; a failing seldp
 * call inside a tm_ call is quoted with its status and message; tm_clear_error forgets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>

#include "seldp/grads.h"
#include "model_util.h"

static void test_model_failure(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 5);
    assert_non_null(m);
    tm_clear_error();
    assert_string_equal(tm_last_error(), "");
    /* leave a library message behind: the model's failure must replace it */
    seldp_grads *g = NULL;
    assert_int_equal(seldp_grads_create(&g), SELDP_OK);
    assert_int_equal(seldp_grads_put(g, 1, NULL, SELDP_OWNED), SELDP_ERR_INVALID_ARGUMENT);
    assert_true(seldp_last_error()[0] != '\0');
    int32_t tokens[2] = {1, 99};
    float h[2 * 32];
    tm_begin_step(m);
    assert_int_equal(tm_embed_forward(m, tokens, 2, h), SELDP_ERR_INVALID_ARGUMENT);
    assert_string_equal(tm_last_error(), "rank 5: token 1 is 99, expected an id in [0, 16)");
    assert_string_equal(seldp_last_error(), "");
    tm_clear_error();
    assert_string_equal(tm_last_error(), "");
    seldp_grads_destroy(g);
    tm_model_destroy(m);
}

/* A seldp failure inside a tm_ call: exporting the same gradients twice into one container
 * collides on the ids (SELDP_ERR_DUPLICATE), and the model's message quotes the library's. */
static void test_library_failure_quoted(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 3);
    assert_non_null(m);
    int32_t tokens[4], targets[4];
    draw_tokens(9, 4, cfg.vocab, tokens, targets);
    assert_int_equal(tm_step_local(m, tokens, targets, 4, NULL), SELDP_OK);
    seldp_grads *g = NULL;
    assert_int_equal(seldp_grads_create(&g), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLE_SHARED, 1.0, true, g), SELDP_OK);
    size_t before = seldp_grads_count(g);
    assert_int_equal(tm_export_grads(m, TM_ROLE_SHARED, 1.0, true, g), SELDP_ERR_DUPLICATE);
    const char *msg = tm_last_error();
    printf("  %s\n", msg);
    assert_non_null(strstr(msg, "rank 3: exporting the gradient of embed.weight"));
    assert_true(strlen(msg) > strlen("rank 3: exporting the gradient of embed.weight (id 1): "));
    assert_int_equal(seldp_grads_count(g), before); /* nothing changed */
    seldp_grads_destroy(g);
    tm_model_destroy(m);
}

/* The channel is per thread: a failure on one thread leaves another's message alone. */
static void *fail_on_thread(void *arg)
{
    (void)arg;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.top_k = 9;
    (void)tm_config_check(&cfg);
    return NULL;
}

static void test_per_thread(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.d_ff_shared = -2;
    assert_int_equal(tm_config_check(&cfg), SELDP_ERR_INVALID_ARGUMENT);
    char mine[256];
    snprintf(mine, sizeof mine, "%s", tm_last_error());
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fail_on_thread, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_string_equal(tm_last_error(), mine);
    assert_non_null(strstr(mine, "d_ff_shared = -2"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_failure),
        cmocka_unit_test(test_library_failure_quoted),
        cmocka_unit_test(test_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
