/* The FP32 single-rank step (tm_step_local) against the FP64 reference: every exported
 * gradient, divided by the token count (the step returns derivatives of the loss SUM, the
 * reference of the MEAN), within 1e-5 relative per tensor in FP32; within the fixed
 * per-dtype limits (2e-3 F16, 1e-2 BF16) when exported in the F16 or BF16 storage dtype. Every
 * quant variant and storage dtype. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "seldp/grads.h"
#include "model_util.h"

#define T_TOKENS 40

static void check_step(tm_quant quant, seldp_dtype dtype)
{
    tm_config cfg = small_config(quant, dtype);
    cfg.vocab = 48;
    cfg.layers = 3;
    printf(" quant %s dtype %s\n", tm_quant_name(quant), tm_dtype_name(dtype));
    tm_model *m = model_all_experts(&cfg, 1);
    assert_non_null(m);
    int32_t tokens[T_TOKENS], targets[T_TOKENS];
    draw_tokens(42, T_TOKENS, cfg.vocab, tokens, targets);

    double loss_sum = 0.0;
    assert_int_equal(tm_step_local(m, tokens, targets, T_TOKENS, &loss_sum), SELDP_OK);

    /* The same tokens split over two "ranks" for the reference: the global mean is the
     * same as over the concatenation. */
    const int32_t *tok[2] = {tokens, tokens + 15};
    const int32_t *tgt[2] = {targets, targets + 15};
    const size_t counts[2] = {15, T_TOKENS - 15};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute(&cfg, tm_model_view(m), tok, tgt, counts, 2, NULL, &ref),
                     SELDP_OK);
    const double loss_ref = tm_reference_loss(ref);
    printf("  loss sum/T %.9f  reference %.9f\n", loss_sum / T_TOKENS, loss_ref);
    assert_true(fabs(loss_sum / T_TOKENS - loss_ref) <= 1e-6 * fabs(loss_ref));

    seldp_grads *fp32 = NULL, *native = NULL;
    assert_int_equal(seldp_grads_create(&fp32), SELDP_OK);
    assert_int_equal(seldp_grads_create(&native), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0 / T_TOKENS, true, fp32), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0 / T_TOKENS, false, native), SELDP_OK);
    const double native_tol = dtype == SELDP_F32 ? 1e-5 : (dtype == SELDP_F16 ? 2e-3 : 1e-2);

    size_t expected = 0;
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        size_t n = 0;
        const double *g = tm_reference_grad(ref, p->path, &n);
        if (p->frozen) {
            assert_null(g);
            assert_null(seldp_grads_get(fp32, p->id));
            continue;
        }
        if (!p->alias && (p->expert < 0 || tm_reference_routed(ref, p->layer, p->expert) > 0))
            expected++;
        const seldp_tensor *a = seldp_grads_get(fp32, p->id);
        const seldp_tensor *b = seldp_grads_get(native, p->id);
        if (!g) {
            assert_null(a);
            continue;
        }
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(a->dtype, SELDP_F32);
        assert_int_equal(b->dtype, dtype);
        assert_true(seldp_tensor_numel(a) == n && a->ndim == p->tensor.ndim);
        rel_err_f32(p->path, a->data, 1.0, g, n);
        double e32 = tm_rel_error(a, 1.0, g, n);
        double enat = tm_rel_error(b, 1.0, g, n);
        assert_true(e32 >= 0.0 && e32 <= 1e-5);
        assert_true(enat >= 0.0 && enat <= native_tol);
        /* The accumulator is the loss-sum gradient: scale 1/T turns it into the mean's. */
        assert_true(tm_rel_error(&(seldp_tensor){SELDP_F32,
                                                 1,
                                                 {(int64_t)n},
                                                 SELDP_HOST_DEVICE,
                                                 (void *)tm_param_grad(m, p->path)},
                                 1.0 / T_TOKENS, g, n) <= 1e-5);
    }
    /* One entry per trainable parameter reached (the tie gives one). */
    assert_int_equal(seldp_grads_count(fp32), expected);
    assert_int_equal(seldp_grads_count(native), expected);
    seldp_grads_destroy(fp32);
    seldp_grads_destroy(native);
    tm_reference_destroy(ref);
    tm_model_destroy(m);
}

static void test_none_f32(void **state)
{
    (void)state;
    check_step(TM_QUANT_NONE, SELDP_F32);
}

static void test_none_bf16(void **state)
{
    (void)state;
    check_step(TM_QUANT_NONE, SELDP_BF16);
}

static void test_none_f16(void **state)
{
    (void)state;
    check_step(TM_QUANT_NONE, SELDP_F16);
}

static void test_nf4_f32(void **state)
{
    (void)state;
    check_step(TM_QUANT_NF4, SELDP_F32);
}

static void test_nf4_bf16(void **state)
{
    (void)state;
    check_step(TM_QUANT_NF4, SELDP_BF16);
}

static void test_awq_f32(void **state)
{
    (void)state;
    check_step(TM_QUANT_AWQ, SELDP_F32);
}

static void test_awq_f16(void **state)
{
    (void)state;
    check_step(TM_QUANT_AWQ, SELDP_F16);
}

/* Two steps on one model give the same gradients: tm_begin_step zeroes the accumulators. */
static void test_steps_do_not_accumulate(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    int32_t tokens[8], targets[8];
    draw_tokens(5, 8, cfg.vocab, tokens, targets);
    double l1, l2;
    assert_int_equal(tm_step_local(m, tokens, targets, 8, &l1), SELDP_OK);
    float first[32];
    memcpy(first, tm_param_grad(m, "final_norm.weight"), sizeof first);
    assert_int_equal(tm_step_local(m, tokens, targets, 8, &l2), SELDP_OK);
    assert_true(l1 == l2);
    assert_memory_equal(first, tm_param_grad(m, "final_norm.weight"), sizeof first);
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_f32), cmocka_unit_test(test_none_bf16),
        cmocka_unit_test(test_none_f16), cmocka_unit_test(test_nf4_f32),
        cmocka_unit_test(test_nf4_bf16), cmocka_unit_test(test_awq_f32),
        cmocka_unit_test(test_awq_f16),  cmocka_unit_test(test_steps_do_not_accumulate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
