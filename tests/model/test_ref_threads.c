/* The FP64 reference on a pool of threads (tm_reference_set_threads): its loss, every gradient
 * and every magnitude are the same bits on 1, 2, 3 and 5 threads, for dense and quantized
 * experts, with the shared expert, the router losses in both scopes and the capacity, over
 * several data shards and more tokens than one router block. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_util.h"

enum { SHARDS = 3, PER_SHARD = 700 };

static tm_reference *reference(const tm_config *cfg, tm_model *m, int threads)
{
    static int32_t tokens[SHARDS][PER_SHARD], targets[SHARDS][PER_SHARD];
    const int32_t *tok[SHARDS], *tgt[SHARDS];
    size_t counts[SHARDS];
    for (int r = 0; r < SHARDS; r++) {
        counts[r] = PER_SHARD - 50 * (size_t)r; /* uneven shards */
        draw_tokens(100 + (uint64_t)r, counts[r], cfg->vocab, tokens[r], targets[r]);
        tok[r] = tokens[r];
        tgt[r] = targets[r];
    }
    tm_reference_set_threads(threads);
    assert_int_equal(tm_reference_threads(), threads);
    tm_reference *ref = NULL;
    assert_int_equal(
        tm_reference_compute(cfg, tm_model_view(m), tok, tgt, counts, SHARDS, NULL, &ref),
        SELDP_OK);
    tm_reference_set_threads(0);
    return ref;
}

static void assert_same_bits(const tm_model *m, const tm_reference *a, const tm_reference *b,
                             int threads)
{
    double la = tm_reference_loss(a), lb = tm_reference_loss(b);
    double ma = tm_reference_loss_magnitude(a), mb = tm_reference_loss_magnitude(b);
    if (memcmp(&la, &lb, sizeof la) || memcmp(&ma, &mb, sizeof ma))
        fail_msg("%d threads: loss %.17g (magnitude %.17g) against %.17g (%.17g) on one", threads,
                 lb, mb, la, ma);
    int compared = 0;
    for (size_t i = 0; i < tm_param_count(m); i++) {
        const tm_param_info *p = tm_param_at(m, i);
        size_t na = 0, nb = 0;
        const double *ga = tm_reference_grad(a, p->path, &na);
        const double *gb = tm_reference_grad(b, p->path, &nb);
        if (!ga)
            continue;
        assert_non_null(gb);
        assert_int_equal(na, nb);
        const double *xa = tm_reference_magnitude(a, p->path, &na);
        const double *xb = tm_reference_magnitude(b, p->path, &nb);
        if (memcmp(ga, gb, na * sizeof *ga) || memcmp(xa, xb, na * sizeof *xa))
            fail_msg("%d threads: %s differs from one thread's", threads, p->path);
        compared++;
    }
    assert_true(compared > 10);
}

static void check_config(const tm_config *cfg)
{
    tm_model *m = model_all_experts(cfg, 0);
    assert_non_null(m);
    tm_reference *one = reference(cfg, m, 1);
    static const int counts[] = {2, 3, 5};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        tm_reference *many = reference(cfg, m, counts[i]);
        assert_same_bits(m, one, many, counts[i]);
        tm_reference_destroy(many);
    }
    tm_reference_destroy(one);
    tm_model_destroy(m);
}

static tm_config many_experts(tm_quant quant)
{
    tm_config cfg = small_config(quant, SELDP_F32);
    cfg.experts = 16;
    cfg.top_k = 4;
    return cfg;
}

static void test_dense_experts(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NONE);
    check_config(&cfg);
}

static void test_router_losses_and_capacity(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NONE);
    cfg.d_ff_shared = 16;
    cfg.aux_loss_coeff = 0.01;
    cfg.z_loss_coeff = 0.001;
    cfg.capacity_factor = 1.25;
    check_config(&cfg);
    cfg.aux_loss_scope = TM_AUX_LOCAL;
    check_config(&cfg);
}

static void test_quantized_experts(void **state)
{
    (void)state;
    tm_config cfg = many_experts(TM_QUANT_NF4);
    check_config(&cfg);
}

static void test_thread_count(void **state)
{
    (void)state;
    tm_reference_set_threads(0);
    assert_true(tm_reference_threads() >= 1 && tm_reference_threads() <= 64);
    tm_reference_set_threads(1000);
    assert_int_equal(tm_reference_threads(), 64);
    tm_reference_set_threads(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_experts),
        cmocka_unit_test(test_router_losses_and_capacity),
        cmocka_unit_test(test_quantized_experts),
        cmocka_unit_test(test_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
