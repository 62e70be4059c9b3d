/* The FP64 reference's error scales (tm_reference_magnitude, docs/tolerances.md): the FP32
 * model's gradient of every tensor lies within 6 u ||m|| of the reference's, for every variant
 * and for weights trained towards cancellation (a confident model, whose p - onehot(y) has
 * shrunk); the magnitudes are deterministic, positive where a gradient is, and grow where terms
 * cancel; the loss's likewise. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "seldp/grads.h"
#include "model_util.h"

#define T_TOKENS 48
#define SIGMAS   6.0

static const double U = 5.9604644775390625e-08; /* 2^-24 */

/* One step's gradients against the reference: the largest ratio ||g - ref|| / (u ||m||). */
static double step_ratio(tm_model *m, const tm_config *cfg, const int32_t *tokens,
                         const int32_t *targets, double *cancel, double *loss_ratio)
{
    double loss_sum = 0.0;
    assert_int_equal(tm_step_local(m, tokens, targets, T_TOKENS, &loss_sum), SELDP_OK);
    const int32_t *tok[1] = {tokens};
    const int32_t *tgt[1] = {targets};
    const size_t counts[1] = {T_TOKENS};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute(cfg, tm_model_view(m), tok, tgt, counts, 1, NULL, &ref),
                     SELDP_OK);
    *loss_ratio = fabs(loss_sum / T_TOKENS - tm_reference_loss(ref)) /
                  (U * tm_reference_loss_magnitude(ref) + U * fabs(tm_reference_loss(ref)));
    seldp_grads *g32 = NULL;
    assert_int_equal(seldp_grads_create(&g32), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0 / T_TOKENS, true, g32), SELDP_OK);
    double worst = 0.0;
    *cancel = 0.0;
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        size_t n = 0, nm = 0;
        const double *want = tm_reference_grad(ref, p->path, &n);
        const double *mag = tm_reference_magnitude(ref, p->path, &nm);
        const seldp_tensor *got = seldp_grads_get(g32, p->id);
        if (!want) {
            assert_null(mag);
            continue;
        }
        assert_non_null(mag);
        assert_true(nm == n);
        if (p->alias || !got)
            continue;
        const float *g = got->data;
        double d2 = 0, m2 = 0, w2 = 0;
        for (size_t k = 0; k < n; k++) {
            assert_true(mag[k] >= 0.0 && isfinite(mag[k]));
            d2 += ((double)g[k] - want[k]) * ((double)g[k] - want[k]);
            m2 += mag[k] * mag[k];
            w2 += want[k] * want[k];
        }
        assert_true(m2 > 0.0);
        double ratio = sqrt(d2) / (U * sqrt(m2));
        if (ratio > worst)
            worst = ratio;
        if (w2 > 0 && sqrt(m2 / w2) > *cancel)
            *cancel = sqrt(m2 / w2);
    }
    seldp_grads_destroy(g32);
    tm_reference_destroy(ref);
    return worst;
}

/* SGD on the FP32 gradients, in place. */
static void sgd(tm_model *m, double lr)
{
    seldp_grads *g = NULL;
    assert_int_equal(seldp_grads_create(&g), SELDP_OK);
    assert_int_equal(tm_export_grads(m, TM_ROLES_ALL, 1.0 / T_TOKENS, true, g), SELDP_OK);
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        const seldp_tensor *t = seldp_grads_get(g, p->id);
        if (p->alias || p->frozen || !t || p->tensor.dtype != SELDP_F32)
            continue;
        float *w = p->tensor.data;
        const float *d = t->data;
        for (size_t k = 0; k < seldp_tensor_numel(&p->tensor); k++)
            w[k] -= (float)lr * d[k];
    }
    seldp_grads_destroy(g);
}

static void within_bounds(tm_config cfg, int steps, double lr)
{
    tm_model *m = model_all_experts(&cfg, 1);
    assert_non_null(m);
    int32_t tokens[T_TOKENS], targets[T_TOKENS];
    double first_cancel = 0, last_cancel = 0, worst = 0, loss_worst = 0;
    for (int s = 0; s < steps; s++) {
        /* one batch, learnt: targets the next token, so the model grows confident */
        draw_tokens(11, T_TOKENS, cfg.vocab, tokens, targets);
        for (int t = 0; t < T_TOKENS; t++)
            targets[t] = (tokens[t] + 1) % cfg.vocab;
        double cancel = 0, loss_ratio = 0;
        double ratio = step_ratio(m, &cfg, tokens, targets, &cancel, &loss_ratio);
        worst = fmax(worst, ratio);
        loss_worst = fmax(loss_worst, loss_ratio);
        if (s == 0)
            first_cancel = cancel;
        last_cancel = cancel;
        sgd(m, lr);
    }
    printf("  d_model %d quant %s aux %g: worst ratio %.3f (bound %.0f), loss %.3f, ||m||/||g|| "
           "%.1f at step 1, %.1f at step %d\n",
           cfg.d_model, tm_quant_name(cfg.quant), cfg.aux_loss_coeff, worst, SIGMAS, loss_worst,
           first_cancel, last_cancel, steps);
    assert_true(worst <= SIGMAS);
    assert_true(loss_worst <= SIGMAS);
    /* training towards confidence makes the terms cancel: the magnitudes follow */
    if (steps > 1)
        assert_true(last_cancel > first_cancel);
    tm_model_destroy(m);
}

static void dense_trained(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.vocab = 24;
    within_bounds(cfg, 60, 1.0);
}

static void wide_pre_activations(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.d_model = 256;
    cfg.d_ff = 256;
    within_bounds(cfg, 1, 0.0);
}

static void router_losses_and_capacity(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.aux_loss_coeff = 0.05;
    cfg.z_loss_coeff = 0.01;
    cfg.capacity_factor = 1.0;
    cfg.d_ff_shared = 32;
    within_bounds(cfg, 20, 0.5);
}

static void quantized(void **state)
{
    (void)state;
    within_bounds(small_config(TM_QUANT_NF4, SELDP_F32), 10, 0.5);
    within_bounds(small_config(TM_QUANT_AWQ, SELDP_F32), 10, 0.5);
}

/* The same inputs give the same magnitudes, bit for bit. */
static void deterministic(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 1);
    int32_t tokens[T_TOKENS], targets[T_TOKENS];
    draw_tokens(5, T_TOKENS, cfg.vocab, tokens, targets);
    const int32_t *tok[1] = {tokens};
    const int32_t *tgt[1] = {targets};
    const size_t counts[1] = {T_TOKENS};
    tm_reference *a = NULL, *b = NULL;
    assert_int_equal(tm_reference_compute(&cfg, tm_model_view(m), tok, tgt, counts, 1, NULL, &a),
                     SELDP_OK);
    assert_int_equal(tm_reference_compute(&cfg, tm_model_view(m), tok, tgt, counts, 1, NULL, &b),
                     SELDP_OK);
    size_t n = 0;
    const double *ma = tm_reference_magnitude(a, "layers.0.router.weight", &n);
    const double *mb = tm_reference_magnitude(b, "layers.0.router.weight", NULL);
    assert_non_null(ma);
    assert_memory_equal(ma, mb, n * sizeof *ma);
    assert_true(tm_reference_loss_magnitude(a) == tm_reference_loss_magnitude(b));
    assert_true(tm_reference_loss_magnitude(a) > 0);
    assert_null(tm_reference_magnitude(a, "no.such.weight", NULL));
    tm_reference_destroy(a);
    tm_reference_destroy(b);
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_trained),
        cmocka_unit_test(wide_pre_activations),
        cmocka_unit_test(router_losses_and_capacity),
        cmocka_unit_test(quantized),
        cmocka_unit_test(deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
