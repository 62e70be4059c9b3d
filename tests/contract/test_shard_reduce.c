/* Contract of the reduce-scatter of a sharded session (seldp/shard.h): each rank's range
 * equals, bit for bit, the same elements of seldp_session_reduce_fp32 (weighted mean) or
 * seldp_session_sum_fp32 (sum) of the same gradients, on every world of 1 to 8 ranks; the
 * results are the FP32 sums of the (half) inputs; absent parameters are reported absent and
 * not written; the gradient container is only read; unselected gradients pass untouched.
 * Registered on both host reduce paths (the fused one-pass reduce-scatter, and, as
 * contract_shard_reduce_bucketed, the staged bucketed one of MPI and NCCL), with
 * cfg.staged_commit, and with small buckets. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shard_fixture.h"

/* A poison the call must overwrite in every present piece and keep in every absent one. */
#define POISON 0x7fc0dead

typedef struct scenario {
    const char *name;
    bool sum; /* reduce_scatter_sum / sum_fp32 */
    seldp_missing_policy policy;
    uint64_t w[MAX_RANKS];   /* weights (sum: active when non-zero) */
    bool lacks_c[MAX_RANKS]; /* ranks without a gradient of c.norm */
    bool nobody_h;           /* no rank has a gradient of h.expert */
    bool f32_inputs;         /* gradients in F32 rather than the parameter dtype */
} scenario;

static seldp_status all_reduce(const scenario *sc, seldp_session *s, seldp_grads *g, int rank,
                               uint64_t *w)
{
    return sc->sum ? seldp_session_sum_fp32(s, g, sc->w[rank] > 0, sc->policy, w)
                   : seldp_session_reduce_fp32(s, g, sc->w[rank], sc->policy, w);
}

static seldp_status scatter(const scenario *sc, seldp_session *s, const seldp_shard_map *map,
                            seldp_grads *g, int rank, float *range, size_t n, bool *present,
                            uint64_t *w)
{
    return sc->sum ? seldp_shard_reduce_scatter_sum(s, map, g, sc->w[rank] > 0, sc->policy, range,
                                                    n, present, w)
                   : seldp_shard_reduce_scatter(s, map, g, sc->w[rank], sc->policy, range, n,
                                                present, w);
}

static int put(tr_rank_ctx *ctx, const scenario *sc, test_grads *g)
{
    bool has[SF_N];
    for (size_t k = 0; k < SF_N; k++)
        has[k] = !(k == 2 && sc->lacks_c[ctx->rank]) && !(k == 6 && sc->nobody_h);
    RANK_CHECK_OK(ctx, tg_init(g));
    RANK_CHECK_OK(ctx, sf_put_grads(g, ctx->rank, 1, has, sc->f32_inputs));
    return 0;
}

/* The FP64 sum over the contributing ranks of their gradients of SF[k] (as stored), over
 * `divisor`, at element i. */
static double reference(const scenario *sc, int n, size_t k, size_t i, double divisor)
{
    double sum = 0;
    size_t numel = sf_numel(k);
    void *tmp = malloc(numel * 4 + 4);
    for (int r = 0; tmp && r < n; r++) {
        if (sc->w[r] == 0 || (k == 2 && sc->lacks_c[r]))
            continue;
        ct_fill(sc->f32_inputs ? SELDP_F32 : SF[k].dtype, tmp, numel, sf_grad_seed(r, k, 1));
        sum += ct_get(sc->f32_inputs ? SELDP_F32 : SF[k].dtype, tmp, i);
    }
    free(tmp);
    return sum / divisor;
}

static size_t index_of(const char *path)
{
    for (size_t k = 0; k < SF_N; k++)
        if (strcmp(SF[k].path, path) == 0)
            return k;
    return SF_N;
}

static int rank_scatter(tr_rank_ctx *ctx)
{
    const scenario *sc = ctx->arg;
    seldp_session_config cfg = sf_config();
    test_model m;
    test_grads a, b;
    grads_snapshot before, before_a;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    uint64_t wa = 0, wb = 0, expect_w = 0;
    size_t begin, count;
    char why[256];

    for (int r = 0; r < ctx->size; r++)
        expect_w += sc->sum ? (sc->w[r] > 0) : sc->w[r];
    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, SF_N, &cfg, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    RANK_CHECK_OK(ctx, seldp_shard_map_range(map, ctx->rank, &begin, &count));
    size_t n_pieces = seldp_shard_map_pieces(map, ctx->rank);
    float *range = malloc((count + 1) * sizeof *range);
    bool *present = malloc((n_pieces + 1) * sizeof *present);
    RANK_CHECK(ctx, range && present, "out of memory");
    for (size_t i = 0; i < count; i++)
        memcpy(&range[i], &(uint32_t){POISON}, sizeof(float));
    memset(present, 0xee, n_pieces + 1);
    if (put(ctx, sc, &a) || put(ctx, sc, &b))
        return 1;
    gs_take(&before, b.grads);
    gs_take(&before_a, a.grads);

    seldp_comm_stats st0 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, scatter(sc, s, map, b.grads, ctx->rank, range, count, present, &wb));
    seldp_comm_stats st1 = seldp_comm_get_stats(ctx->world);
    /* the path the session took: one fused pass, or reduce-scatters of the staging buffer */
    bool moved = expect_w > 0, fused = seldp_session_reduce_path(s) == SELDP_REDUCE_PATH_FUSED;
    RANK_CHECK(ctx,
               st1.reductions - st0.reductions == (uint64_t)(fused && moved) &&
                   (st1.reduce_scatters > st0.reduce_scatters) == (!fused && moved) &&
                   st1.allreduces == st0.allreduces,
               "the reduce-scatter on the %s path made %llu fused reductions, %llu "
               "reduce-scatters and %llu allreduces",
               fused ? "fused" : "bucketed", (unsigned long long)(st1.reductions - st0.reductions),
               (unsigned long long)(st1.reduce_scatters - st0.reduce_scatters),
               (unsigned long long)(st1.allreduces - st0.allreduces));
    RANK_CHECK(ctx, gs_same(&before, b.grads, why, sizeof why),
               "the reduce-scatter changed the gradient container: %s", why);
    RANK_CHECK_OK(ctx, all_reduce(sc, s, a.grads, ctx->rank, &wa));
    RANK_CHECK(ctx, wa == expect_w && wb == expect_w,
               "global weights %llu (all-reduce) and %llu (reduce-scatter), expected %llu",
               (unsigned long long)wa, (unsigned long long)wb, (unsigned long long)expect_w);

    for (size_t i = 0; i < n_pieces; i++) {
        seldp_shard_piece p;
        RANK_CHECK_OK(ctx, seldp_shard_map_piece(map, ctx->rank, i, &p));
        const seldp_tensor *t = seldp_grads_get(a.grads, p.id);
        const float *got = range + p.range_offset;
        RANK_CHECK(ctx, present[i] == (t != NULL),
                   "'%s': present %d in the range, but the all-reduce %s it", p.path,
                   (int)present[i], t ? "has" : "has not");
        if (!t) {
            for (size_t j = 0; j < p.count; j++)
                RANK_CHECK(ctx, memcmp(&got[j], &(uint32_t){POISON}, 4) == 0,
                           "'%s' is absent, but element %zu of its piece was written", p.path,
                           p.param_offset + j);
            continue;
        }
        RANK_CHECK(ctx, t->dtype == SELDP_F32, "the all-reduce's '%s' is %s", p.path,
                   seldp_dtype_name(t->dtype));
        const float *want = (const float *)t->data + p.param_offset;
        size_t at = tr_first_diff(got, want, p.count * sizeof(float));
        RANK_CHECK(ctx, at == p.count * sizeof(float),
                   "'%s' element %zu: %.9g in the range, %.9g in the all-reduce's result", p.path,
                   p.param_offset + at / 4, (double)got[at / 4], (double)want[at / 4]);
        /* and the values are the FP32 sums of the inputs, not merely equal to each other */
        size_t k = index_of(p.path);
        double divisor = sc->sum ? 1.0 : (double)expect_w;
        for (size_t j = 0; j < p.count; j += 7) {
            double ref = reference(sc, ctx->size, k, p.param_offset + j, divisor);
            RANK_CHECK(ctx, fabs(got[j] - ref) <= 1e-5 * (fabs(ref) + 1.0),
                       "'%s' element %zu: %.9g, the FP64 reference %.9g", p.path,
                       p.param_offset + j, (double)got[j], ref);
        }
    }
    RANK_CHECK(ctx, gs_entry_same(&before_a, a.grads, SF_UNSELECTED_ID),
               "the all-reduce changed the unselected gradient");
    gs_free(&before);
    gs_free(&before_a);
    tg_free(&a);
    tg_free(&b);
    free(range);
    free(present);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static scenario base(const char *name, bool sum)
{
    scenario sc;
    memset(&sc, 0, sizeof sc);
    sc.name = name;
    sc.sum = sum;
    sc.policy = SELDP_MISSING_ERROR;
    for (int r = 0; r < MAX_RANKS; r++)
        sc.w[r] = 3 + 5 * (uint64_t)r;
    return sc;
}

static void run_worlds(scenario *sc)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_scatter, sc);
}

static void test_mean(void **state)
{
    (void)state;
    scenario sc = base("mean", false);
    run_worlds(&sc);
}

static void test_sum_with_inactive_ranks(void **state)
{
    (void)state;
    scenario sc = base("sum", true);
    sc.w[1] = sc.w[4] = 0;
    run_worlds(&sc);
}

static void test_mean_with_zero_weights(void **state)
{
    (void)state;
    scenario sc = base("mean, zero weights", false);
    sc.w[0] = sc.w[3] = 0;
    run_worlds(&sc);
}

/* F32 gradients of half parameters (what an FP32 accumulation gives). */
static void test_f32_inputs(void **state)
{
    (void)state;
    scenario sc = base("f32 inputs", false);
    sc.f32_inputs = true;
    run_worlds(&sc);
}

/* Policy zero: the odd ranks lack c.norm, which the even ones contribute; no rank has
 * h.expert, which stays absent in every range. */
static void test_missing_zero(void **state)
{
    (void)state;
    scenario sc = base("missing, policy zero", false);
    sc.policy = SELDP_MISSING_ZERO;
    sc.nobody_h = true;
    for (int r = 1; r < MAX_RANKS; r += 2)
        sc.lacks_c[r] = true;
    run_worlds(&sc);
    sc.sum = true;
    run_worlds(&sc);
}

/* Policy error: a parameter no active rank has is absent, not an error. */
static void test_absent_under_error(void **state)
{
    (void)state;
    scenario sc = base("absent, policy error", true);
    sc.nobody_h = true;
    run_worlds(&sc);
}

/* No active rank: every piece absent, nothing written, the global weight 0. */
static void test_no_active_rank(void **state)
{
    (void)state;
    scenario sc = base("no active rank", false);
    memset(sc.w, 0, sizeof sc.w);
    run_worlds(&sc);
    sc.sum = true;
    run_worlds(&sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mean),
        cmocka_unit_test(test_sum_with_inactive_ranks),
        cmocka_unit_test(test_mean_with_zero_weights),
        cmocka_unit_test(test_f32_inputs),
        cmocka_unit_test(test_missing_zero),
        cmocka_unit_test(test_absent_under_error),
        cmocka_unit_test(test_no_active_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
