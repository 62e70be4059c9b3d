/* An expert that no token reaches produces no gradient at all: no exported entry (dense or
 * adapters), a zero accumulator, and no reference gradient; a rank with no token still
 * exports its shared gradients (zeros) and no expert entry. Calls on experts a rank does
 * not hold fail. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "seldp/grads.h"
#include "model_util.h"

static void check_unreached(tm_quant quant)
{
    tm_config cfg = small_config(quant, SELDP_F32);
    cfg.experts = 8;
    cfg.top_k = 1;
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    int32_t tokens[2], targets[2];
    draw_tokens(3, 2, cfg.vocab, tokens, targets);
    assert_int_equal(tm_step_local(m, tokens, targets, 2, NULL), SELDP_OK);

    const int32_t *tok[1] = {tokens}, *tgt[1] = {targets};
    const size_t counts[1] = {2};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute(&cfg, tm_model_view(m), tok, tgt, counts, 1, NULL, &ref),
                     SELDP_OK);
    seldp_grads *g = NULL;
    assert_int_equal(seldp_grads_create(&g), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0, false, g), SELDP_OK);

    int unreached = 0;
    for (int l = 0; l < cfg.layers; l++) {
        size_t routed = 0;
        for (int e = 0; e < cfg.experts; e++) {
            const bool seen = tm_expert_seen(m, l, e);
            assert_int_equal(seen, tm_reference_routed(ref, l, e) > 0);
            routed += tm_reference_routed(ref, l, e);
            unreached += !seen;
        }
        assert_int_equal(routed, 2); /* two tokens, one slot each */
    }
    assert_true(unreached >= 2 * (cfg.experts - 2));
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        if (p->frozen) {
            assert_null(seldp_grads_get(g, p->id));
            continue;
        }
        if (p->expert < 0) {
            assert_non_null(seldp_grads_get(g, p->id));
            continue;
        }
        const bool seen = tm_expert_seen(m, p->layer, p->expert);
        assert_int_equal(seldp_grads_get(g, p->id) != NULL, seen);
        assert_int_equal(tm_reference_grad(ref, p->path, NULL) != NULL, seen);
        if (!seen) {
            const float *acc = tm_param_grad(m, p->path);
            for (size_t k = 0; k < seldp_tensor_numel(&p->tensor); k++)
                assert_true(acc[k] == 0.0f);
        }
    }
    seldp_grads_destroy(g);
    tm_reference_destroy(ref);
    tm_model_destroy(m);
}

static void test_dense(void **state)
{
    (void)state;
    check_unreached(TM_QUANT_NONE);
}

static void test_nf4_adapters(void **state)
{
    (void)state;
    check_unreached(TM_QUANT_NF4);
}

static void test_awq_adapters(void **state)
{
    (void)state;
    check_unreached(TM_QUANT_AWQ);
}

/* A rank that drew no token: shared entries (zero), no expert entry, zero loss. */
static void test_rank_without_tokens(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 1);
    assert_non_null(m);
    double loss = -1.0;
    assert_int_equal(tm_step_local(m, NULL, NULL, 0, &loss), SELDP_OK);
    assert_true(loss == 0.0);
    seldp_grads *g = NULL;
    assert_int_equal(seldp_grads_create(&g), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0, true, g), SELDP_OK);
    assert_int_equal(seldp_grads_count(g), 1 + 2 * cfg.layers + 1);
    const seldp_tensor *t = seldp_grads_get(g, tm_param_find(m, "final_norm.weight")->id);
    assert_non_null(t);
    for (int i = 0; i < cfg.d_model; i++)
        assert_true(((const float *)t->data)[i] == 0.0f);
    /* Exporting again into the same container is refused and leaves it as it was. */
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0, true, g), SELDP_ERR_DUPLICATE);
    assert_int_equal(seldp_grads_count(g), 1 + 2 * cfg.layers + 1);
    seldp_grads_destroy(g);
    tm_model_destroy(m);
}

/* Rows for an expert the rank does not hold are refused; an empty batch marks nothing. */
static void test_expert_not_held(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    const int held = 2;
    tm_model *m = NULL;
    assert_int_equal(tm_model_create(&cfg, 0, &held, 1, NULL, NULL, &m), SELDP_OK);
    tm_begin_step(m);
    float x[32] = {0}, y[32];
    assert_int_equal(tm_expert_forward(m, 0, 1, x, 1, y), SELDP_ERR_NOT_FOUND);
    assert_int_equal(tm_expert_backward(m, 0, 1, x, x, 1, y), SELDP_ERR_NOT_FOUND);
    assert_int_equal(tm_expert_forward(m, 5, 2, x, 1, y), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(tm_expert_backward(m, 0, 2, x, x, 0, NULL), SELDP_OK);
    assert_false(tm_expert_seen(m, 0, 2));
    assert_int_equal(tm_step_local(m, NULL, NULL, 0, NULL), SELDP_ERR_INVALID_ARGUMENT);
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),           cmocka_unit_test(test_nf4_adapters),
        cmocka_unit_test(test_awq_adapters),    cmocka_unit_test(test_rank_without_tokens),
        cmocka_unit_test(test_expert_not_held),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
