/* The FP64 reference follows the FP32 model's routing at a near tie and only there: when
 * every router row is the same, any K experts are a top-K and the reference takes the set the
 * model reports; with distinct rows a set that no rounding explains is ignored. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"

enum { N_TOKENS = 12 };

/* Router rows of every layer made equal to row 0, so every logit of a token ties. */
static void tie_every_router(tm_model *m, const tm_config *cfg)
{
    char path[64];
    for (int l = 0; l < cfg->layers; l++) {
        snprintf(path, sizeof path, "layers.%d.router.weight", l);
        const tm_param_info *p = tm_param_find(m, path);
        assert_non_null(p);
        float *w = p->tensor.data;
        for (int e = 1; e < cfg->experts; e++)
            memcpy(w + (size_t)e * cfg->d_model, w, (size_t)cfg->d_model * sizeof *w);
    }
}

/* (L, N, K) choices: experts `first`, `first` + 1, ... of every token and layer. */
static void fill_choices(const tm_config *cfg, int first, int *choice)
{
    for (int l = 0; l < cfg->layers; l++)
        for (size_t t = 0; t < N_TOKENS; t++)
            for (int k = 0; k < cfg->top_k; k++)
                choice[((size_t)l * N_TOKENS + t) * cfg->top_k + k] = (first + k) % cfg->experts;
}

static tm_reference *reference(const tm_config *cfg, tm_model *m, const int *choice)
{
    int32_t tokens[N_TOKENS], targets[N_TOKENS];
    draw_tokens(11, N_TOKENS, cfg->vocab, tokens, targets);
    const int32_t *tok[1] = {tokens}, *tgt[1] = {targets};
    const size_t counts[1] = {N_TOKENS};
    const int *const choices[1] = {choice};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute_routed(cfg, tm_model_view(m), tok, tgt, counts, 1, NULL,
                                                 choice ? choices : NULL, &ref),
                     SELDP_OK);
    return ref;
}

static void test_exact_tie_follows_the_model(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    tie_every_router(m, &cfg);
    int choice[2 * N_TOKENS * 2];
    assert_int_equal(cfg.layers * cfg.top_k, 4);

    /* Without choices (or with its own), the reference breaks ties by the lower index. */
    tm_reference *own = reference(&cfg, m, NULL);
    fill_choices(&cfg, 0, choice);
    tm_reference *same = reference(&cfg, m, choice);
    for (int l = 0; l < cfg.layers; l++) {
        assert_int_equal(tm_reference_routed(own, l, 0), N_TOKENS);
        assert_int_equal(tm_reference_routed(own, l, 1), N_TOKENS);
        assert_int_equal(tm_reference_routed(own, l, 2), 0);
    }
    assert_int_equal(tm_reference_ties_followed(own), 0);
    assert_int_equal(tm_reference_ties_followed(same), 0);
    assert_true(tm_reference_loss(same) == tm_reference_loss(own));

    /* Experts 2 and 3 tie with 0 and 1: the reference routes as the model did. */
    fill_choices(&cfg, 2, choice);
    tm_reference *other = reference(&cfg, m, choice);
    assert_int_equal(tm_reference_ties_followed(other), (size_t)cfg.layers * N_TOKENS);
    for (int l = 0; l < cfg.layers; l++) {
        assert_int_equal(tm_reference_routed(other, l, 0), 0);
        assert_int_equal(tm_reference_routed(other, l, 2), N_TOKENS);
        assert_int_equal(tm_reference_routed(other, l, 3), N_TOKENS);
    }
    assert_non_null(tm_reference_grad(other, "layers.0.experts.2.w1.weight", NULL));
    assert_null(tm_reference_grad(other, "layers.0.experts.0.w1.weight", NULL));
    tm_reference_destroy(own);
    tm_reference_destroy(same);
    tm_reference_destroy(other);
    tm_model_destroy(m);
}

static void test_real_difference_is_kept(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    tm_reference *own = reference(&cfg, m, NULL);
    int choice[2 * N_TOKENS * 2];
    size_t kept = 0;
    for (int first = 0; first < cfg.experts; first++) {
        fill_choices(&cfg, first, choice);
        tm_reference *ref = reference(&cfg, m, choice);
        /* distinct random router rows: no token's logits come within the tolerance */
        assert_int_equal(tm_reference_ties_followed(ref), 0);
        for (int l = 0; l < cfg.layers; l++)
            for (int e = 0; e < cfg.experts; e++)
                kept += tm_reference_routed(ref, l, e) == tm_reference_routed(own, l, e);
        tm_reference_destroy(ref);
    }
    assert_int_equal(kept, (size_t)cfg.experts * cfg.layers * cfg.experts);
    /* a choice naming an expert twice or out of range is never followed */
    tie_every_router(m, &cfg);
    for (size_t i = 0; i < sizeof choice / sizeof choice[0]; i++)
        choice[i] = i % 2 ? 3 : (i % 4 ? 3 : 9);
    tm_reference *bad = reference(&cfg, m, choice);
    assert_int_equal(tm_reference_ties_followed(bad), 0);
    tm_reference_destroy(bad);
    tm_reference_destroy(own);
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_tie_follows_the_model),
        cmocka_unit_test(test_real_difference_is_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
