/* tiny-moe's routing extensions (docs/model.md: the shared expert, Routing extensions): the FP32
 * split step against the FP64 reference with each option on its own and all together, on one data
 * shard (tm_step_local) and on three (the global load-balancing statistics summed over the shards
 * and handed back with tm_route_set_balance, as the harness does); capacity dropping pinned
 * by a hand-computed case; the config's validation and JSON keys. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "seldp/grads.h"
#include "model_util.h"

#define SHARDS 3
#define T_MAX  40
#define D_MAX  32
#define K_MAX  2

typedef struct routing_opts {
    const char *name;
    int d_ff_shared;
    double aux;
    tm_aux_scope scope;
    double z;
    double cf;
} routing_opts;

static tm_config routing_config(const routing_opts *o, seldp_dtype dtype)
{
    tm_config cfg = small_config(TM_QUANT_NONE, dtype);
    cfg.vocab = 48;
    cfg.layers = 2;
    cfg.d_ff_shared = o->d_ff_shared;
    cfg.aux_loss_coeff = o->aux;
    cfg.aux_loss_scope = o->scope;
    cfg.z_loss_coeff = o->z;
    cfg.capacity_factor = o->cf;
    return cfg;
}

/* ---- a step over several data shards, experts run locally ------------------------------- */

typedef struct shard {
    tm_model *m;
    size_t T;
    int32_t tokens[T_MAX], targets[T_MAX];
    float h[T_MAX * D_MAX], dh[T_MAX * D_MAX];
    float y[T_MAX * K_MAX * D_MAX], dy[T_MAX * K_MAX * D_MAX];
    float xe[T_MAX * K_MAX * D_MAX], ye[T_MAX * K_MAX * D_MAX], de[T_MAX * K_MAX * D_MAX];
} shard;

/* Rows of the slots routed to e: per token from route.x, or per slot from buf. */
static size_t gather(const tm_route *r, int e, const float *buf, int D, float *out)
{
    size_t n = 0;
    for (size_t s = 0; s < r->T * (size_t)r->K; s++) {
        if (r->expert[s] != e)
            continue;
        const float *src = buf ? buf + s * (size_t)D : r->x + (s / (size_t)r->K) * (size_t)D;
        memcpy(out + n * (size_t)D, src, (size_t)D * sizeof(float));
        n++;
    }
    return n;
}

static void scatter(const tm_route *r, int e, const float *in, int D, float *buf)
{
    size_t n = 0;
    for (size_t s = 0; s < r->T * (size_t)r->K; s++) {
        if (r->expert[s] != e)
            continue;
        memcpy(buf + s * (size_t)D, in + n * (size_t)D, (size_t)D * sizeof(float));
        n++;
    }
}

/* Forward and backward of every shard; returns the sum of the shards' loss sums. */
static double run_shards(shard *sh, int S)
{
    const tm_config *cfg = tm_model_config(sh[0].m);
    const int D = cfg->d_model, E = cfg->experts, L = cfg->layers;
    double loss = 0.0;
    uint64_t N = 0;
    for (int s = 0; s < S; s++) {
        N += sh[s].T;
        tm_begin_step(sh[s].m);
        assert_int_equal(tm_embed_forward(sh[s].m, sh[s].tokens, sh[s].T, sh[s].h), SELDP_OK);
    }
    for (int l = 0; l < L; l++) {
        tm_route route[SHARDS];
        int64_t total[16] = {0}, mine[16];
        for (int s = 0; s < S; s++) {
            assert_int_equal(tm_route_forward(sh[s].m, l, sh[s].h, &route[s]), SELDP_OK);
            assert_int_equal(tm_route_counts(sh[s].m, l, mine), SELDP_OK);
            for (int e = 0; e < E; e++)
                total[e] += mine[e];
        }
        for (int s = 0; s < S && cfg->aux_loss_scope == TM_AUX_GLOBAL; s++)
            assert_int_equal(tm_route_set_balance(sh[s].m, l, total, N), SELDP_OK);
        for (int s = 0; s < S; s++) {
            for (int e = 0; e < E; e++) {
                size_t n = gather(&route[s], e, NULL, D, sh[s].xe);
                assert_int_equal(tm_expert_forward(sh[s].m, l, e, sh[s].xe, n, sh[s].ye), SELDP_OK);
                scatter(&route[s], e, sh[s].ye, D, sh[s].y);
            }
            assert_int_equal(tm_combine_forward(sh[s].m, l, sh[s].y, sh[s].h), SELDP_OK);
        }
    }
    for (int s = 0; s < S; s++) {
        double part = 0.0;
        assert_int_equal(tm_head_forward_backward(sh[s].m, sh[s].h, sh[s].targets, &part, sh[s].dh),
                         SELDP_OK);
        loss += part + tm_router_loss_sum(sh[s].m);
        for (int l = L - 1; l >= 0; l--) {
            tm_route route;
            assert_int_equal(tm_route_get(sh[s].m, l, &route), SELDP_OK);
            assert_int_equal(tm_combine_backward(sh[s].m, l, sh[s].dh, sh[s].dy), SELDP_OK);
            for (int e = 0; e < E; e++) {
                size_t n = gather(&route, e, NULL, D, sh[s].xe);
                gather(&route, e, sh[s].dy, D, sh[s].de);
                assert_int_equal(tm_expert_backward(sh[s].m, l, e, sh[s].xe, sh[s].de, n, sh[s].ye),
                                 SELDP_OK);
                scatter(&route, e, sh[s].ye, D, sh[s].y);
            }
            assert_int_equal(tm_route_backward(sh[s].m, l, sh[s].y, sh[s].dh), SELDP_OK);
        }
        assert_int_equal(tm_embed_backward(sh[s].m, sh[s].dh), SELDP_OK);
    }
    return loss;
}

/* Assignments the capacity dropped over every layer, per the reference. */
static size_t dropped(const tm_reference *ref, const tm_config *cfg)
{
    size_t kept = 0;
    for (int l = 0; l < cfg->layers; l++)
        for (int e = 0; e < cfg->experts; e++)
            kept += tm_reference_routed(ref, l, e);
    return tm_reference_tokens(ref) * (size_t)cfg->top_k * (size_t)cfg->layers - kept;
}

/* S shards of the same weights against the reference: the summed loss and every gradient
 * (the sum over shards of the loss-sum gradients, over N). Returns the drop count. */
static size_t check_against_reference(const routing_opts *o, seldp_dtype dtype, int S,
                                      const size_t *counts)
{
    tm_config cfg = routing_config(o, dtype);
    printf(" %s (%d shards, %s)\n", o->name, S, tm_dtype_name(dtype));
    shard *sh = calloc((size_t)S, sizeof *sh);
    assert_non_null(sh);
    const int32_t *tok[SHARDS], *tgt[SHARDS];
    size_t N = 0;
    for (int s = 0; s < S; s++) {
        sh[s].m = model_all_experts(&cfg, s);
        assert_non_null(sh[s].m);
        if (s > 0)
            assert_int_equal(tm_model_copy_params(sh[s].m, sh[0].m, TM_ROLES_ALL, -1), SELDP_OK);
        sh[s].T = counts[s];
        draw_tokens(300 + (uint64_t)s, counts[s], cfg.vocab, sh[s].tokens, sh[s].targets);
        tok[s] = sh[s].tokens;
        tgt[s] = sh[s].targets;
        N += counts[s];
    }
    double loss = run_shards(sh, S) / (double)N;
    tm_reference *ref = NULL;
    assert_int_equal(
        tm_reference_compute(&cfg, tm_model_view(sh[0].m), tok, tgt, counts, S, NULL, &ref),
        SELDP_OK);
    printf("  loss %.9f  reference %.9f\n", loss, tm_reference_loss(ref));
    assert_true(fabs(loss - tm_reference_loss(ref)) <= 1e-6 * fabs(tm_reference_loss(ref)));
    int compared = 0;
    for (size_t i = 0; i < tm_param_count(sh[0].m); i++) {
        const tm_param_info *p = tm_param_at(sh[0].m, i);
        size_t n = 0;
        const double *want = tm_reference_grad(ref, p->path, &n);
        if (p->alias || p->frozen)
            continue;
        if (!want) {
            /* an expert that lost every token: no shard may have touched it */
            assert_true(p->expert >= 0);
            for (int s = 0; s < S; s++)
                assert_false(tm_expert_seen(sh[s].m, p->layer, p->expert));
            continue;
        }
        double *sum = calloc(n, sizeof *sum);
        assert_non_null(sum);
        for (int s = 0; s < S; s++) {
            const float *g = tm_param_grad(sh[s].m, p->path);
            for (size_t k = 0; k < n; k++)
                sum[k] += (double)g[k];
        }
        float *mean = calloc(n, sizeof *mean);
        assert_non_null(mean);
        for (size_t k = 0; k < n; k++)
            mean[k] = (float)(sum[k] / (double)N);
        double err = rel_err_f32(p->path, mean, 1.0, want, n);
        assert_true(err <= 1e-5);
        compared++;
        free(sum);
        free(mean);
    }
    assert_true(compared > 0);
    size_t drops = dropped(ref, &cfg);
    printf("  %zu assignments dropped\n", drops);
    tm_reference_destroy(ref);
    for (int s = 0; s < S; s++)
        tm_model_destroy(sh[s].m);
    free(sh);
    return drops;
}

static const size_t one_shard[1] = {T_MAX};
static const size_t three_shards[SHARDS] = {13, 7, 20};

static void test_shared_expert(void **state)
{
    (void)state;
    routing_opts o = {"shared expert", 24, 0, TM_AUX_GLOBAL, 0, 0};
    check_against_reference(&o, SELDP_F32, 1, one_shard);
    check_against_reference(&o, SELDP_F32, SHARDS, three_shards);
    /* the shared expert's weights are shared parameters of layer l */
    tm_config cfg = routing_config(&o, SELDP_F32);
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    const tm_param_info *w1 = tm_param_find(m, "layers.1.shared_expert.w1.weight");
    const tm_param_info *w2 = tm_param_find(m, "layers.1.shared_expert.w2.weight");
    assert_non_null(w1);
    assert_non_null(w2);
    assert_int_equal(w1->role, TM_ROLE_SHARED);
    assert_int_equal(w1->layer, 1);
    assert_int_equal(w1->expert, -1);
    assert_int_equal(w1->tensor.shape[0], 24);
    assert_int_equal(w1->tensor.shape[1], cfg.d_model);
    assert_int_equal(w2->tensor.shape[0], cfg.d_model);
    assert_int_equal(w2->tensor.shape[1], 24);
    tm_model_destroy(m);
}

static void test_aux_loss_global(void **state)
{
    (void)state;
    routing_opts o = {"aux loss, global scope", 0, 0.05, TM_AUX_GLOBAL, 0, 0};
    check_against_reference(&o, SELDP_F32, 1, one_shard);
    check_against_reference(&o, SELDP_F32, SHARDS, three_shards);
}

static void test_aux_loss_local(void **state)
{
    (void)state;
    routing_opts o = {"aux loss, local scope", 0, 0.05, TM_AUX_LOCAL, 0, 0};
    check_against_reference(&o, SELDP_F32, 1, one_shard);
    check_against_reference(&o, SELDP_F32, SHARDS, three_shards);
}

/* The two scopes are different objectives on several shards (and the same on one). */
static void test_scopes_differ(void **state)
{
    (void)state;
    double loss[2][2];
    for (int scope = 0; scope < 2; scope++) {
        routing_opts o = {"scope", 0, 0.5, (tm_aux_scope)scope, 0, 0};
        tm_config cfg = routing_config(&o, SELDP_F32);
        tm_model *m = model_all_experts(&cfg, 0);
        assert_non_null(m);
        int32_t tok[T_MAX], tgt[T_MAX];
        draw_tokens(300, T_MAX, cfg.vocab, tok, tgt);
        for (int split = 0; split < 2; split++) {
            const int32_t *ts[2] = {tok, tok + 9}, *gs[2] = {tgt, tgt + 9};
            const size_t c1[1] = {T_MAX}, c2[2] = {9, T_MAX - 9};
            tm_reference *ref = NULL;
            assert_int_equal(tm_reference_compute(&cfg, tm_model_view(m), ts, gs, split ? c2 : c1,
                                                  split ? 2 : 1, NULL, &ref),
                             SELDP_OK);
            loss[scope][split] = tm_reference_loss(ref);
            tm_reference_destroy(ref);
        }
        tm_model_destroy(m);
    }
    printf("  global %.12f / %.12f  local %.12f / %.12f\n", loss[0][0], loss[0][1], loss[1][0],
           loss[1][1]);
    assert_true(fabs(loss[0][0] - loss[0][1]) <= 1e-12); /* global: the split does not matter */
    assert_true(fabs(loss[1][0] - loss[0][0]) <= 1e-12);
    assert_true(fabs(loss[1][1] - loss[0][1]) > 1e-6);
}

static void test_z_loss(void **state)
{
    (void)state;
    routing_opts o = {"z-loss", 0, 0, TM_AUX_GLOBAL, 0.01, 0};
    check_against_reference(&o, SELDP_F32, 1, one_shard);
    check_against_reference(&o, SELDP_F32, SHARDS, three_shards);
}

static void test_capacity(void **state)
{
    (void)state;
    routing_opts o = {"capacity 0.75", 0, 0, TM_AUX_GLOBAL, 0, 0.75};
    assert_true(check_against_reference(&o, SELDP_F32, 1, one_shard) > 0);
    assert_true(check_against_reference(&o, SELDP_F32, SHARDS, three_shards) > 0);
    /* a generous capacity drops nothing */
    routing_opts wide = {"capacity 4", 0, 0, TM_AUX_GLOBAL, 0, 4.0};
    assert_int_equal(check_against_reference(&wide, SELDP_F32, SHARDS, three_shards), 0);
}

static void test_everything(void **state)
{
    (void)state;
    routing_opts o = {
        "all: shared expert, aux global, z, capacity", 16, 0.02, TM_AUX_GLOBAL, 0.001, 1.0};
    assert_true(check_against_reference(&o, SELDP_F32, SHARDS, three_shards) > 0);
    routing_opts local = {"all, aux local", 16, 0.02, TM_AUX_LOCAL, 0.001, 1.0};
    assert_true(check_against_reference(&local, SELDP_F32, SHARDS, three_shards) > 0);
    /* half-precision storage: the reference reads the stored values, the FP32 step computes
     * on their upcast, so the accumulators still agree to FP32 accuracy */
    assert_true(check_against_reference(&o, SELDP_BF16, SHARDS, three_shards) > 0);
    assert_true(check_against_reference(&local, SELDP_F16, SHARDS, three_shards) > 0);
}

/* ---- capacity pinned by hand ------------------------------------------------------------- */

/* Norm weight 0 in layer 0 makes u = 0, every logit 0 and every p = 1/E: with K = 2 every
 * token picks experts 0 and 1 (ties: lower index) with gates 1/2. E = 4, T = 6, cf = 1.25:
 * C = ceil(1.25 * 6 * 2 / 4) = ceil(3.75) = 4, so experts 0 and 1 keep tokens 0..3 and drop
 * tokens 4 and 5, which keep their residual; the counts (before dropping) are 6, 6, 0, 0. */
static void test_capacity_by_hand(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.capacity_factor = 1.25;
    tm_model *m = model_all_experts(&cfg, 0);
    assert_non_null(m);
    const tm_param_info *norm = tm_param_find(m, "layers.0.norm.weight");
    memset(norm->tensor.data, 0, seldp_tensor_nbytes(&norm->tensor));
    tm_begin_step(m);
    const int D = cfg.d_model;
    int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
    float h[6 * 32], h_in[6 * 32], y[6 * 2 * 32];
    assert_int_equal(tm_embed_forward(m, tokens, 6, h), SELDP_OK);
    memcpy(h_in, h, sizeof h);
    tm_route route;
    assert_int_equal(tm_route_forward(m, 0, h, &route), SELDP_OK);
    const int want[12] = {0, 1, 0, 1, 0, 1, 0, 1, -1, -1, -1, -1};
    for (int s = 0; s < 12; s++) {
        assert_int_equal(route.expert[s], want[s]);
        assert_true(route.gate[s] == 0.5f); /* normalized before dropping, not after */
    }
    int64_t counts[4];
    assert_int_equal(tm_route_counts(m, 0, counts), SELDP_OK);
    assert_int_equal(counts[0], 6);
    assert_int_equal(counts[1], 6);
    assert_int_equal(counts[2], 0);
    assert_int_equal(counts[3], 0);
    /* combine: kept slots add gate * y, dropped ones nothing (their rows are never read) */
    for (int s = 0; s < 12; s++)
        for (int i = 0; i < D; i++)
            y[s * D + i] = route.expert[s] < 0 ? NAN : (float)(s + 1) * 0.25f;
    assert_int_equal(tm_combine_forward(m, 0, y, h), SELDP_OK);
    for (int t = 0; t < 6; t++) {
        for (int i = 0; i < D; i++) {
            float want_h = h_in[t * D + i]; /* summed in slot order, as the model does */
            if (t < 4) {
                want_h += 0.5f * ((float)(2 * t + 1) * 0.25f);
                want_h += 0.5f * ((float)(2 * t + 2) * 0.25f);
            }
            assert_true(h[t * D + i] == want_h);
        }
    }
    /* backward: dropped slots get a zero row and gate gradient */
    float dh[6 * 32], dy[6 * 2 * 32];
    for (int i = 0; i < 6 * D; i++)
        dh[i] = 1.0f;
    assert_int_equal(tm_combine_backward(m, 0, dh, dy), SELDP_OK);
    for (int s = 0; s < 12; s++)
        for (int i = 0; i < D; i++)
            assert_true(dy[s * D + i] == (route.expert[s] < 0 ? 0.0f : 0.5f));

    /* the reference drops the same assignments */
    int32_t targets[6] = {0, 0, 0, 0, 0, 0};
    const int32_t *tk[1] = {tokens}, *tg[1] = {targets};
    const size_t n[1] = {6};
    tm_reference *ref = NULL;
    assert_int_equal(tm_reference_compute(&cfg, tm_model_view(m), tk, tg, n, 1, NULL, &ref),
                     SELDP_OK);
    assert_int_equal(tm_reference_routed(ref, 0, 0), 4);
    assert_int_equal(tm_reference_routed(ref, 0, 1), 4);
    assert_int_equal(tm_reference_routed(ref, 0, 2), 0);
    assert_int_equal(tm_reference_routed(ref, 0, 3), 0);
    assert_null(tm_reference_grad(ref, "layers.0.experts.2.w1.weight", NULL));
    tm_reference_destroy(ref);
    tm_model_destroy(m);
}

/* One data shard's tokens spread over two ranks (as TP x CP ranks hold it): with
 * tm_route_set_shard the two ranks drop exactly the assignments that one rank holding the
 * whole shard drops. */
static void test_shard_over_ranks(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.capacity_factor = 0.75;
    enum { T = 30, A = 11 };
    const int K = cfg.top_k, E = cfg.experts;
    tm_model *whole = model_all_experts(&cfg, 0), *part[2];
    assert_non_null(whole);
    int32_t tokens[T], targets[T];
    draw_tokens(77, T, cfg.vocab, tokens, targets);
    static float h[T * 32], hp[2][T * 32];
    tm_begin_step(whole);
    assert_int_equal(tm_embed_forward(whole, tokens, T, h), SELDP_OK);
    tm_route route, rp[2];
    assert_int_equal(tm_route_forward(whole, 0, h, &route), SELDP_OK);
    const size_t n[2] = {A, T - A};
    int64_t before[2][8] = {{0}}, counts[8];
    size_t dropped_whole = 0, dropped_parts = 0;
    for (int r = 0; r < 2; r++) {
        part[r] = model_all_experts(&cfg, 1 + r);
        assert_non_null(part[r]);
        assert_int_equal(tm_model_copy_params(part[r], whole, TM_ROLES_ALL, -1), SELDP_OK);
        tm_begin_step(part[r]);
        assert_int_equal(tm_embed_forward(part[r], tokens + (r ? A : 0), n[r], hp[r]), SELDP_OK);
        assert_int_equal(tm_route_forward(part[r], 0, hp[r], &rp[r]), SELDP_OK);
    }
    assert_int_equal(tm_route_counts(part[0], 0, counts), SELDP_OK);
    for (int e = 0; e < E; e++)
        before[1][e] = counts[e];
    for (int r = 0; r < 2; r++)
        assert_int_equal(tm_route_set_shard(part[r], 0, T, before[r]), SELDP_OK);
    for (size_t s = 0; s < (size_t)T * (size_t)K; s++) {
        const int r = s < (size_t)A * (size_t)K ? 0 : 1;
        const size_t at = r ? s - (size_t)A * (size_t)K : s;
        assert_int_equal(rp[r].expert[at], route.expert[s]);
        dropped_whole += route.expert[s] < 0;
        dropped_parts += rp[r].expert[at] < 0;
    }
    printf("  %zu of %d assignments dropped, the same on the split shard\n", dropped_whole, T * K);
    assert_true(dropped_whole > 0);
    assert_int_equal(dropped_parts, dropped_whole);
    /* without the shard's view each rank would drop by its own capacity */
    int64_t too_many[8];
    for (int e = 0; e < E; e++)
        too_many[e] = T;
    assert_int_equal(tm_route_set_shard(part[1], 0, T, too_many), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "rank 2"));
    assert_int_equal(tm_route_set_shard(part[1], 0, A, before[1]), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(tm_route_set_shard(part[1], 0, T, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(tm_route_set_shard(part[1], 1, T, before[1]), SELDP_ERR_INVALID_ARGUMENT);
    /* the rejected calls left the shard's drops in place */
    for (size_t s = 0; s < n[1] * (size_t)K; s++)
        assert_int_equal(rp[1].expert[s], route.expert[(size_t)A * (size_t)K + s]);
    for (int r = 0; r < 2; r++)
        tm_model_destroy(part[r]);
    tm_model_destroy(whole);
}

/* ---- config and balance input ------------------------------------------------------------ */

static void test_config(void **state)
{
    (void)state;
    tm_config cfg = TM_CONFIG_INIT;
    assert_int_equal(cfg.d_ff_shared, 0);
    assert_true(cfg.aux_loss_coeff == 0.0 && cfg.z_loss_coeff == 0.0);
    assert_true(cfg.capacity_factor == 0.0);
    assert_int_equal(cfg.aux_loss_scope, TM_AUX_GLOBAL); /* the default (docs/model.md) */
    tm_config c = cfg;
    c.d_ff_shared = -1;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "d_ff_shared"));
    c = cfg;
    c.aux_loss_coeff = -0.1;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "aux_loss_coeff"));
    c = cfg;
    c.z_loss_coeff = NAN;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "z_loss_coeff"));
    c = cfg;
    c.capacity_factor = INFINITY;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "capacity_factor"));
    c = cfg;
    c.aux_loss_scope = (tm_aux_scope)7;
    assert_int_equal(tm_config_check(&c), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "aux_loss_scope"));

    tm_aux_scope scope = TM_AUX_GLOBAL;
    assert_true(tm_aux_scope_parse("LOCAL", &scope) && scope == TM_AUX_LOCAL);
    assert_false(tm_aux_scope_parse("both", &scope));
    assert_int_equal(scope, TM_AUX_LOCAL);
    assert_string_equal(tm_aux_scope_name(TM_AUX_GLOBAL), "global");

    c = cfg;
    c.d_ff_shared = 48;
    c.aux_loss_coeff = 0.01;
    c.aux_loss_scope = TM_AUX_LOCAL;
    c.z_loss_coeff = 0.001;
    c.capacity_factor = 1.25;
    char buf[1024];
    tm_config_json(&c, buf, sizeof buf);
    assert_non_null(strstr(buf, "\"seed\":1234,\"d_ff_shared\":48,\"aux_loss_coeff\":0.01,"
                                "\"aux_loss_scope\":\"local\",\"z_loss_coeff\":0.001,"
                                "\"capacity_factor\":1.25}"));
}

static void test_set_balance_rejects(void **state)
{
    (void)state;
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.aux_loss_coeff = 0.1;
    tm_model *m = model_all_experts(&cfg, 2);
    assert_non_null(m);
    int64_t counts[4] = {3, 3, 1, 1};
    /* before the layer is routed */
    assert_int_equal(tm_route_set_balance(m, 0, counts, 4), SELDP_ERR_INVALID_ARGUMENT);
    int32_t tokens[4] = {1, 2, 3, 4};
    float h[4 * 32];
    tm_begin_step(m);
    assert_int_equal(tm_embed_forward(m, tokens, 4, h), SELDP_OK);
    tm_route route;
    assert_int_equal(tm_route_forward(m, 0, h, &route), SELDP_OK);
    assert_int_equal(tm_route_set_balance(m, 0, counts, 0), SELDP_ERR_INVALID_ARGUMENT);
    counts[2] = 5; /* more assignments than tokens */
    assert_int_equal(tm_route_set_balance(m, 0, counts, 4), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tm_last_error(), "rank 2"));
    assert_non_null(strstr(tm_last_error(), "expert 2"));
    /* a rejected call changes nothing: the loss share is still the local one */
    double before = tm_router_loss_sum(m);
    counts[2] = -1;
    assert_int_equal(tm_route_set_balance(m, 0, counts, 4), SELDP_ERR_INVALID_ARGUMENT);
    assert_true(tm_router_loss_sum(m) == before);
    int64_t local[4], other[4] = {4, 0, 0, 4};
    assert_int_equal(tm_route_counts(m, 0, local), SELDP_OK);
    assert_int_equal(local[0] + local[1] + local[2] + local[3], 8);
    assert_memory_not_equal(local, other, sizeof local);
    assert_int_equal(tm_route_set_balance(m, 0, other, 4), SELDP_OK);
    assert_true(tm_router_loss_sum(m) != before);
    tm_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_capacity_by_hand),
        cmocka_unit_test(test_set_balance_rejects),
        cmocka_unit_test(test_shard_over_ranks),
        cmocka_unit_test(test_shared_expert),
        cmocka_unit_test(test_aux_loss_global),
        cmocka_unit_test(test_aux_loss_local),
        cmocka_unit_test(test_scopes_differ),
        cmocka_unit_test(test_z_loss),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_everything),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
