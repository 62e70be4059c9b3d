/* The split forward/backward driven as the harness drives it: three rank models with
 * expert parallelism (expert 0 replicated on two ranks, the others on one), rows moved
 * between ranks by hand where the harness runs its all-to-all. The sum over ranks of each
 * parameter's exported gradient (scaled by 1 / global token count) must match the FP64
 * reference of the global mean loss within 1e-5, and replicas must start different and be
 * made equal only by copying (the stand-in for initialize's broadcast). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "seldp/grads.h"
#include "model_util.h"

#define R     3
#define T_MAX 32

/* Expert ownership: expert 0 on ranks 0 and 2. */
static const int owned[R][2] = {{0, 1}, {2, -1}, {3, 0}};
static const int n_owned[R] = {2, 1, 2};

/* Which replica serves the rows that rank `src` routes to expert e. */
static int owner_for(int src, int e)
{
    switch (e) {
    case 0:
        return src == 0 ? 0 : 2;
    case 1:
        return 0;
    case 2:
        return 1;
    default:
        return 2;
    }
}

typedef struct world {
    tm_config cfg;
    tm_model *m[R];
    size_t T[R];
    int32_t tokens[R][T_MAX], targets[R][T_MAX];
    float h[R][T_MAX * 32], dh[R][T_MAX * 32];
    float y[R][T_MAX * 2 * 32], dy[R][T_MAX * 2 * 32];
    tm_route route[R];
    float xe[R * T_MAX * 2 * 32], ye[R * T_MAX * 2 * 32], de[R * T_MAX * 2 * 32];
} world;

/* Pack into `out` the rows that every source rank routes to expert e served by owner o:
 * the routed input rows (buf NULL: route.x per token) or rows of a per-slot buffer. */
static size_t pack(world *w, int o, int e, const float (*buf)[T_MAX * 2 * 32], float *out)
{
    const int D = w->cfg.d_model, K = w->cfg.top_k;
    size_t n = 0;
    for (int r = 0; r < R; r++) {
        if (owner_for(r, e) != o)
            continue;
        for (size_t s = 0; s < w->T[r] * (size_t)K; s++) {
            if (w->route[r].expert[s] != e)
                continue;
            const float *src = buf ? buf[r] + s * (size_t)D : w->route[r].x + (s / K) * (size_t)D;
            memcpy(out + n * (size_t)D, src, (size_t)D * sizeof(float));
            n++;
        }
    }
    return n;
}

static void unpack(world *w, int o, int e, const float *in, float (*buf)[T_MAX * 2 * 32])
{
    const int D = w->cfg.d_model, K = w->cfg.top_k;
    size_t n = 0;
    for (int r = 0; r < R; r++) {
        if (owner_for(r, e) != o)
            continue;
        for (size_t s = 0; s < w->T[r] * (size_t)K; s++) {
            if (w->route[r].expert[s] != e)
                continue;
            memcpy(buf[r] + s * (size_t)D, in + n * (size_t)D, (size_t)D * sizeof(float));
            n++;
        }
    }
}

static void dispatch_experts(world *w, int l, bool backward)
{
    for (int r = 0; r < R; r++)
        assert_int_equal(tm_route_get(w->m[r], l, &w->route[r]), SELDP_OK);
    for (int o = 0; o < R; o++) {
        for (int i = 0; i < n_owned[o]; i++) {
            const int e = owned[o][i];
            size_t n = pack(w, o, e, NULL, w->xe);
            if (!backward) {
                assert_int_equal(tm_expert_forward(w->m[o], l, e, w->xe, n, w->ye), SELDP_OK);
                unpack(w, o, e, w->ye, w->y);
            } else {
                assert_int_equal(pack(w, o, e, (const float(*)[T_MAX * 2 * 32]) w->dy, w->de), n);
                assert_int_equal(tm_expert_backward(w->m[o], l, e, w->xe, w->de, n, w->ye),
                                 SELDP_OK);
                unpack(w, o, e, w->ye, w->y); /* y now holds dx per slot */
            }
        }
    }
}

static void run_step(world *w)
{
    const int L = w->cfg.layers;
    for (int r = 0; r < R; r++) {
        tm_begin_step(w->m[r]);
        assert_int_equal(tm_embed_forward(w->m[r], w->tokens[r], w->T[r], w->h[r]), SELDP_OK);
    }
    for (int l = 0; l < L; l++) {
        for (int r = 0; r < R; r++)
            assert_int_equal(tm_route_forward(w->m[r], l, w->h[r], &w->route[r]), SELDP_OK);
        dispatch_experts(w, l, false);
        for (int r = 0; r < R; r++)
            assert_int_equal(tm_combine_forward(w->m[r], l, w->y[r], w->h[r]), SELDP_OK);
    }
    for (int r = 0; r < R; r++) {
        double loss;
        assert_int_equal(tm_head_forward_backward(w->m[r], w->h[r], w->targets[r], &loss, w->dh[r]),
                         SELDP_OK);
    }
    for (int l = L - 1; l >= 0; l--) {
        for (int r = 0; r < R; r++)
            assert_int_equal(tm_combine_backward(w->m[r], l, w->dh[r], w->dy[r]), SELDP_OK);
        dispatch_experts(w, l, true);
        for (int r = 0; r < R; r++)
            assert_int_equal(tm_route_backward(w->m[r], l, w->y[r], w->dh[r]), SELDP_OK);
    }
    for (int r = 0; r < R; r++)
        assert_int_equal(tm_embed_backward(w->m[r], w->dh[r]), SELDP_OK);
}

static bool same_bytes(const tm_model *a, const tm_model *b, const char *path)
{
    const tm_param_info *p = tm_param_find(a, path), *q = tm_param_find(b, path);
    return p && q && memcmp(p->tensor.data, q->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0;
}

static void check_expert_parallel(tm_quant quant, seldp_dtype dtype)
{
    static world w;
    memset(&w, 0, sizeof w);
    w.cfg = small_config(quant, dtype);
    assert_int_equal(w.cfg.d_model, 32); /* the buffers of `world` are sized for it */
    assert_int_equal(w.cfg.top_k, 2);
    printf(" quant %s dtype %s\n", tm_quant_name(quant), tm_dtype_name(dtype));
    const size_t T[R] = {9, 14, 5};
    for (int r = 0; r < R; r++) {
        assert_int_equal(tm_model_create(&w.cfg, r, owned[r], n_owned[r], NULL, NULL, &w.m[r]),
                         SELDP_OK);
        w.T[r] = T[r];
        draw_tokens(1000 + (uint64_t)r, T[r], w.cfg.vocab, w.tokens[r], w.targets[r]);
    }
    /* Replicas differ before "initialize" ... */
    assert_false(same_bytes(w.m[0], w.m[1], "layers.0.router.weight"));
    assert_false(same_bytes(w.m[0], w.m[2], "embed.weight"));
    const char *probe =
        quant == TM_QUANT_NONE ? "layers.1.experts.0.w2.weight" : "layers.1.experts.0.w2.qweight";
    assert_false(same_bytes(w.m[0], w.m[2], probe));
    /* ... and are made equal by the broadcasts' stand-in: shared group from rank 0, expert
     * 0's data group {0, 2} from rank 0. */
    for (int r = 1; r < R; r++)
        assert_int_equal(tm_model_copy_params(w.m[r], w.m[0], TM_ROLES_SHARED_GROUP, -1), SELDP_OK);
    assert_int_equal(tm_model_copy_params(w.m[2], w.m[0], TM_ROLES_EXPERT_GROUP, 0), SELDP_OK);
    assert_true(same_bytes(w.m[0], w.m[2], probe));
    assert_true(same_bytes(w.m[0], w.m[1], "layers.0.router.weight"));
    /* Expert 3 of rank 2 was not touched by the copy of expert 0. */
    tm_model *fresh = NULL;
    const int e3 = 3;
    assert_int_equal(tm_model_create(&w.cfg, 2, &e3, 1, NULL, NULL, &fresh), SELDP_OK);
    assert_true(same_bytes(fresh, w.m[2],
                           quant == TM_QUANT_NONE ? "layers.0.experts.3.w1.weight"
                                                  : "layers.0.experts.3.w1.lora_a.weight"));
    tm_model_destroy(fresh);

    /* The global model of the reference: shared from rank 0, each expert from an owner. */
    tm_model *global = model_all_experts(&w.cfg, 77);
    assert_non_null(global);
    assert_int_equal(tm_model_copy_params(global, w.m[0], TM_ROLES_SHARED_GROUP, -1), SELDP_OK);
    for (int o = 0; o < R; o++)
        for (int i = 0; i < n_owned[o]; i++)
            assert_int_equal(
                tm_model_copy_params(global, w.m[o], TM_ROLES_EXPERT_GROUP, owned[o][i]), SELDP_OK);

    run_step(&w);

    const int32_t *tok[R], *tgt[R];
    size_t N = 0;
    for (int r = 0; r < R; r++) {
        tok[r] = w.tokens[r];
        tgt[r] = w.targets[r];
        N += w.T[r];
    }
    tm_reference *ref = NULL;
    assert_int_equal(
        tm_reference_compute(&w.cfg, tm_model_view(global), tok, tgt, w.T, R, NULL, &ref),
        SELDP_OK);
    seldp_grads *g[R];
    for (int r = 0; r < R; r++) {
        assert_int_equal(seldp_grads_create(&g[r]), SELDP_OK);
        /* Shared gradients as `reduce` input (loss sums), expert ones normalized for `sum`. */
        assert_int_equal(tm_export_grads(w.m[r], TM_ROLE_SHARED, 1.0, true, g[r]), SELDP_OK);
        assert_int_equal(
            tm_export_grads(w.m[r], TM_ROLES_EXPERT_GROUP, 1.0 / (double)N, true, g[r]), SELDP_OK);
    }
    size_t compared = 0;
    for (size_t i = 0; i < tm_param_count(global); i++) {
        const tm_param_info *p = tm_param_at(global, i);
        size_t n = 0;
        const double *want = tm_reference_grad(ref, p->path, &n);
        if (!want)
            continue;
        double *sum = calloc(n, sizeof *sum);
        assert_non_null(sum);
        int holders = 0;
        for (int r = 0; r < R; r++) {
            const tm_param_info *q = tm_param_find(w.m[r], p->path);
            if (!q)
                continue;
            const seldp_tensor *t = seldp_grads_get(g[r], q->id);
            if (!t)
                continue;
            holders++;
            const double scale = p->role == TM_ROLE_SHARED ? 1.0 / (double)N : 1.0;
            for (size_t k = 0; k < n; k++)
                sum[k] += scale * ((const float *)t->data)[k];
        }
        assert_true(holders > 0);
        if (p->expert == 0)
            printf("  %s: gradient on %d replica(s)\n", p->path, holders);
        double num = 0.0, den = 0.0;
        for (size_t k = 0; k < n; k++) {
            num += (sum[k] - want[k]) * (sum[k] - want[k]);
            den += want[k] * want[k];
        }
        double rel = sqrt(num / den);
        if (rel > 1e-5)
            printf("  %-36s rel %.3e\n", p->path, rel);
        assert_true(rel <= 1e-5);
        compared++;
        free(sum);
    }
    printf("  %zu tensors within 1e-5 of the reference\n", compared);
    assert_true(compared > 10);
    for (int r = 0; r < R; r++) {
        seldp_grads_destroy(g[r]);
        tm_model_destroy(w.m[r]);
    }
    tm_reference_destroy(ref);
    tm_model_destroy(global);
}

static void test_dense_f32(void **state)
{
    (void)state;
    check_expert_parallel(TM_QUANT_NONE, SELDP_F32);
}

static void test_nf4_bf16(void **state)
{
    (void)state;
    check_expert_parallel(TM_QUANT_NF4, SELDP_BF16);
}

static void test_awq_f32(void **state)
{
    (void)state;
    check_expert_parallel(TM_QUANT_AWQ, SELDP_F32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_f32),
        cmocka_unit_test(test_nf4_bf16),
        cmocka_unit_test(test_awq_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
