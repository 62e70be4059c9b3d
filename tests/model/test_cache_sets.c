/* tiny-moe's cache sets (tm_model_use_caches, docs/model.md, Micro-batches): micro-batches in
 * flight, each forward's activations kept in its own set until its backward.
 *   - two micro-batches of different sizes, both forwards first (sets 0 and 1, each with its
 *     router losses' factor) and then both backwards, leave the gradient accumulators bit for
 *     bit as one micro-batch after the other does, with router losses, capacity and a shared
 *     expert on, in f32 and bf16;
 *   - tm_begin_micro_batch resets only the set in use: the other set's backward still runs;
 *   - a set outside 0..4095 is refused; tm_model_cache_set names the set in use. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"

/* One micro-batch's buffers: its tokens, h (T,D), dh (T,D) and the slots' (T,K,D). */
typedef struct micro {
    size_t T;
    int32_t tokens[16], targets[16];
    float *h, *dh, *y, *work;
    double scale, loss;
} micro;

static void micro_init(micro *mb, const tm_config *cfg, size_t T, uint64_t seed, double scale)
{
    const size_t D = (size_t)cfg->d_model, TKD = T * (size_t)cfg->top_k * D;
    mb->T = T;
    mb->scale = scale;
    mb->loss = 0;
    draw_tokens(seed, T, cfg->vocab, mb->tokens, mb->targets);
    mb->h = calloc(T * D, sizeof(float));
    mb->dh = calloc(T * D, sizeof(float));
    mb->y = calloc(TKD, sizeof(float));
    mb->work = calloc(3 * TKD, sizeof(float));
    assert_true(mb->h && mb->dh && mb->y && mb->work);
}

static void micro_free(micro *mb)
{
    free(mb->h);
    free(mb->dh);
    free(mb->y);
    free(mb->work);
}

/* Expert e's rows of a route (per_slot: src holds (T,K,D) slot rows; else (T,D) token rows). */
static size_t gather(const tm_route *r, int e, const float *src, bool per_slot, int D, float *dst)
{
    size_t n = 0;
    for (size_t s = 0; s < r->T * (size_t)r->K; s++) {
        if (r->expert[s] != e)
            continue;
        size_t row = per_slot ? s : s / (size_t)r->K;
        memcpy(dst + n++ * (size_t)D, src + row * (size_t)D, (size_t)D * sizeof(float));
    }
    return n;
}

static void scatter(const tm_route *r, int e, const float *src, int D, float *dst)
{
    size_t n = 0;
    for (size_t s = 0; s < r->T * (size_t)r->K; s++)
        if (r->expert[s] == e)
            memcpy(dst + s * (size_t)D, src + n++ * (size_t)D, (size_t)D * sizeof(float));
}

/* The forward through every layer (the head is the backward's: a tied embedding's head and
 * embedding gradients then add in the same order under both schedules). */
static void forward(tm_model *m, const tm_config *cfg, micro *mb, bool first)
{
    const int D = cfg->d_model, E = cfg->experts;
    const size_t TKD = mb->T * (size_t)cfg->top_k * (size_t)D;
    float *xe = mb->work, *ye = xe + TKD;
    if (first)
        tm_begin_step(m);
    else
        tm_begin_micro_batch(m);
    assert_int_equal(tm_model_set_router_scale(m, mb->scale), SELDP_OK);
    assert_int_equal(tm_embed_forward(m, mb->tokens, mb->T, mb->h), SELDP_OK);
    for (int l = 0; l < cfg->layers; l++) {
        tm_route route;
        assert_int_equal(tm_route_forward(m, l, mb->h, &route), SELDP_OK);
        for (int e = 0; e < E; e++) {
            size_t n = gather(&route, e, route.x, false, D, xe);
            assert_int_equal(tm_expert_forward(m, l, e, xe, n, ye), SELDP_OK);
            scatter(&route, e, ye, D, mb->y);
        }
        assert_int_equal(tm_combine_forward(m, l, mb->y, mb->h), SELDP_OK);
    }
}

static void backward(tm_model *m, const tm_config *cfg, micro *mb)
{
    const int D = cfg->d_model, E = cfg->experts;
    const size_t TKD = mb->T * (size_t)cfg->top_k * (size_t)D;
    float *xe = mb->work, *ye = xe + TKD, *de = ye + TKD;
    float *dy = calloc(TKD, sizeof *dy);
    assert_non_null(dy);
    assert_int_equal(tm_head_forward_backward(m, mb->h, mb->targets, &mb->loss, mb->dh), SELDP_OK);
    mb->loss += tm_router_loss_sum(m);
    for (int l = cfg->layers - 1; l >= 0; l--) {
        tm_route route;
        assert_int_equal(tm_route_get(m, l, &route), SELDP_OK);
        assert_int_equal(tm_combine_backward(m, l, mb->dh, dy), SELDP_OK);
        for (int e = 0; e < E; e++) {
            size_t n = gather(&route, e, route.x, false, D, xe);
            gather(&route, e, dy, true, D, de);
            assert_int_equal(tm_expert_backward(m, l, e, xe, de, n, ye), SELDP_OK);
            scatter(&route, e, ye, D, mb->y);
        }
        assert_int_equal(tm_route_backward(m, l, mb->y, mb->dh), SELDP_OK);
    }
    assert_int_equal(tm_embed_backward(m, mb->dh), SELDP_OK);
    free(dy);
}

static tm_config config_of(seldp_dtype dtype)
{
    tm_config cfg = small_config(TM_QUANT_NONE, dtype);
    cfg.aux_loss_coeff = 0.05;
    cfg.z_loss_coeff = 0.01;
    cfg.capacity_factor = 1.0;
    cfg.d_ff_shared = 16;
    return cfg;
}

static void in_flight_equals_one_after_another(seldp_dtype dtype)
{
    tm_config cfg = config_of(dtype);
    tm_model *seq = model_all_experts(&cfg, 0), *fly = model_all_experts(&cfg, 0);
    assert_non_null(seq);
    assert_non_null(fly);
    micro a[2], b[2];
    micro_init(&a[0], &cfg, 5, 11, 1.5);
    micro_init(&a[1], &cfg, 9, 12, 0.75);
    micro_init(&b[0], &cfg, 5, 11, 1.5);
    micro_init(&b[1], &cfg, 9, 12, 0.75);

    /* one after another, one set */
    for (int k = 0; k < 2; k++) {
        forward(seq, &cfg, &a[k], k == 0);
        backward(seq, &cfg, &a[k]);
    }
    /* both forwards, then both backwards, each in its set */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(tm_model_use_caches(fly, k), SELDP_OK);
        assert_int_equal(tm_model_cache_set(fly), k);
        forward(fly, &cfg, &b[k], k == 0);
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(tm_model_use_caches(fly, k), SELDP_OK);
        backward(fly, &cfg, &b[k]);
    }
    for (int k = 0; k < 2; k++)
        assert_true(a[k].loss == b[k].loss);
    int compared = 0;
    for (size_t i = 0; i < tm_param_count(seq); i++) {
        const tm_param_info *p = tm_param_at(seq, i);
        const float *gs = tm_param_grad(seq, p->path), *gf = tm_param_grad(fly, p->path);
        if (!gs)
            continue;
        assert_non_null(gf);
        size_t n = seldp_tensor_numel(&p->tensor);
        if (memcmp(gs, gf, n * sizeof *gs) != 0)
            fail_msg("%s: %s's gradient differs between the two orders", seldp_dtype_name(dtype),
                     p->path);
        compared++;
    }
    assert_true(compared > 4);
    for (int k = 0; k < 2; k++) {
        micro_free(&a[k]);
        micro_free(&b[k]);
    }
    tm_model_destroy(seq);
    tm_model_destroy(fly);
}

static void in_flight_f32(void **state)
{
    (void)state;
    in_flight_equals_one_after_another(SELDP_F32);
}

static void in_flight_bf16(void **state)
{
    (void)state;
    in_flight_equals_one_after_another(SELDP_BF16);
}

static void bad_sets(void **state)
{
    (void)state;
    tm_config cfg = config_of(SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    assert_int_equal(tm_model_cache_set(m), 0);
    assert_int_equal(tm_model_use_caches(m, -1), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "expected 0..4095"));
    assert_int_equal(tm_model_use_caches(m, 4096), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(tm_model_use_caches(m, 3), SELDP_OK); /* sets 1 and 2 exist, empty */
    assert_int_equal(tm_model_cache_set(m), 3);
    /* a set that never ran a forward has nothing to go backward from */
    float dh[32 * 16] = {0};
    assert_int_equal(tm_embed_backward(m, dh), SELDP_ERR_INVALID_ARGUMENT);
    tm_model_destroy(m); /* frees every set, the one in use included */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(in_flight_f32),
        cmocka_unit_test(in_flight_bf16),
        cmocka_unit_test(bad_sets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
