/* The model's top-K (tm_route_forward): the k-th choice is the expert of the k-th largest
 * probability, and among equal probabilities the lower index first. Router rows are scaled
 * copies of row 0 by powers of two, so a token's logits are exact multiples of one logit and
 * equal rows tie exactly; the expected choice is that order computed here. Both of the model's
 * ways of marking the experts taken run: a bitmap up to 4096 experts, the slots before it
 * beyond. tm__top_k itself (one pass keeping the K best, the scan where a NaN is present or K
 * exceeds 64) is held to the definition on random rows full of ties, zeros and NaN. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model_util.h"
#include "tm_internal.h"

enum { N_TOKENS = 24 };

/* Expert e's router row, in multiples of row 0: 2 for every 7th expert and the last, 1/2 for
 * every 5th, 1 elsewhere (a multiple of 7 and 5 takes 2). */
static float row_scale(int e, int E)
{
    if (e % 7 == 3 || e == E - 1)
        return 2.0f;
    if (e % 5 == 1)
        return 0.5f;
    return 1.0f;
}

/* The expected top-K of a token whose logit through row 0 has sign `sign`: the larger scale
 * times the sign first, then the lower index. */
static void expected_top_k(int E, int K, int sign, int *sel)
{
    int n = 0;
    const float order[3] = {2.0f, 1.0f, 0.5f};
    for (int i = 0; i < 3 && n < K; i++) {
        float want = sign > 0 ? order[i] : order[2 - i];
        for (int e = 0; e < E && n < K; e++)
            if (row_scale(e, E) == want)
                sel[n++] = e;
    }
}

static void check_top_k(int E, int K)
{
    tm_config cfg = small_config(TM_QUANT_NONE, SELDP_F32);
    cfg.experts = E;
    cfg.top_k = K;
    cfg.d_model = 8;
    cfg.d_ff = 8;
    cfg.layers = 1;
    cfg.vocab = 32;
    int *ids = malloc((size_t)E * sizeof *ids);
    assert_non_null(ids);
    for (int e = 0; e < E; e++)
        ids[e] = e;
    tm_model *m = NULL;
    assert_int_equal(tm_model_create(&cfg, 0, ids, E, NULL, NULL, &m), SELDP_OK);
    free(ids);
    const tm_param_info *p = tm_param_find(m, "layers.0.router.weight");
    assert_non_null(p);
    float *w = p->tensor.data;
    const int D = cfg.d_model;
    for (int e = 1; e < E; e++)
        for (int i = 0; i < D; i++)
            w[(size_t)e * D + i] = row_scale(e, E) * w[i];
    for (int i = 0; i < D; i++)
        w[i] *= row_scale(0, E);

    int32_t tokens[N_TOKENS], targets[N_TOKENS];
    draw_tokens(5, N_TOKENS, cfg.vocab, tokens, targets);
    float *h = calloc((size_t)N_TOKENS * D, sizeof *h);
    assert_non_null(h);
    tm_begin_step(m);
    assert_int_equal(tm_embed_forward(m, tokens, N_TOKENS, h), SELDP_OK);
    tm_route route;
    assert_int_equal(tm_route_forward(m, 0, h, &route), SELDP_OK);
    assert_int_equal(route.K, K);

    int want[16], seen_sign[2] = {0, 0};
    for (int t = 0; t < N_TOKENS; t++) {
        /* the sign of the token's logit through the unscaled row 0 */
        double z = 0.0;
        for (int i = 0; i < D; i++)
            z += (double)route.x[(size_t)t * D + i] * (double)w[i] / row_scale(0, E);
        if (fabs(z) < 1e-4)
            continue; /* near zero every logit is nearly equal: no order to expect */
        int sign = z > 0 ? 1 : -1;
        seen_sign[sign > 0]++;
        expected_top_k(E, K, sign, want);
        for (int k = 0; k < K; k++) {
            if (route.choice[(size_t)t * K + k] != want[k])
                fail_msg("experts %d, top-%d: token %d (logit sign %+d): choice %d is expert %d, "
                         "expected %d",
                         E, K, t, sign, k, route.choice[(size_t)t * K + k], want[k]);
        }
        /* gates: the selected probabilities renormalized, so larger first */
        for (int k = 1; k < K; k++)
            assert_true(route.gate[(size_t)t * K + k] <= route.gate[(size_t)t * K + k - 1]);
    }
    /* the tokens reach both orders of the scales */
    assert_true(seen_sign[0] > 0 && seen_sign[1] > 0);
    free(h);
    tm_model_destroy(m);
}

static void ties_with_the_bitmap(void **state)
{
    (void)state;
    check_top_k(64, 8);
    check_top_k(4096, 8);
}

static void ties_beyond_the_bitmap(void **state)
{
    (void)state;
    check_top_k(4097, 8);
    check_top_k(4200, 16);
}

static void every_expert_chosen(void **state)
{
    (void)state;
    check_top_k(9, 9);
}

/* The definition: slot k takes the first expert not yet taken whose probability no later
 * untaken one exceeds (strict >, scanning from the first untaken). */
static void defined_top_k(const float *p, int E, int K, int *sel)
{
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++)
                taken = taken || sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        sel[k] = best;
    }
}

static void against_the_definition(void **state)
{
    (void)state;
    static const int shapes[][2] = {{1, 1},    {4, 2},    {8, 8},     {64, 8},  {256, 8},
                                    {256, 64}, {200, 65}, {300, 100}, {5000, 8}};
    uint64_t seed = 99;
    int *got = malloc(5000 * sizeof *got), *want = malloc(5000 * sizeof *want);
    float *p = malloc(5000 * sizeof *p);
    assert_true(got && want && p);
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int E = shapes[c][0], K = shapes[c][1];
        for (int trial = 0; trial < 40; trial++) {
            /* few distinct values (ties), zeros, and in some rows a NaN or two */
            for (int e = 0; e < E; e++) {
                seed = seed * 6364136223846793005u + 1442695040888963407u;
                unsigned r = (unsigned)(seed >> 33);
                p[e] = trial % 3 == 0 ? (float)(r % 5) * 0.125f : (float)(r % 1000) / 997.0f;
                if (r % 7 == 0)
                    p[e] = 0.0f;
            }
            if (trial % 4 == 1)
                p[(trial * 7) % E] = NAN;
            if (trial % 8 == 5)
                p[E - 1] = NAN;
            if (trial % 8 == 3)
                p[0] = NAN;
            tm__top_k(p, E, K, got);
            defined_top_k(p, E, K, want);
            for (int k = 0; k < K; k++)
                if (got[k] != want[k])
                    fail_msg("experts %d, top-%d, row %d: choice %d is expert %d, expected %d", E,
                             K, trial, k, got[k], want[k]);
        }
    }
    free(got);
    free(want);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ties_with_the_bitmap),
        cmocka_unit_test(ties_beyond_the_bitmap),
        cmocka_unit_test(every_expert_chosen),
        cmocka_unit_test(against_the_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
