/* Contract of sessions over split groups (docs/README.md; docs/library.md, Communicators and
 * transports): an expert's data group made by seldp_comm_split, used in the same step as a session
 * over the whole world; roots and ranks are group ranks; a failure in one group leaves the other
 * groups alone. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

#define WORLD 4
#define STEPS 3

typedef struct groups_arg {
    int color[WORLD];  /* the expert each rank owns: its data group */
    bool break_schema; /* the last rank's expert shape differs from its group's */
    seldp_status expert_st[WORLD];
} groups_arg;

/* World ranks of color c in key (= world rank) order; returns their count. */
static int members(const groups_arg *a, int c, int *out)
{
    int n = 0;
    for (int r = 0; r < WORLD; r++)
        if (a->color[r] == c)
            out[n++] = r;
    return n;
}

static uint64_t expert_seed(int rank, int j)
{
    return 7000u + 100u * (uint64_t)rank + (uint64_t)j;
}

static uint64_t expert_grad_seed(int rank, int step, int j)
{
    return 8000u + 100u * (uint64_t)rank + 10u * (uint64_t)step + (uint64_t)j;
}

static uint64_t tokens(int rank, int step)
{
    return (uint64_t)(rank + 1) * 3u + (uint64_t)step;
}

static int rank_groups(tr_rank_ctx *ctx)
{
    groups_arg *a = ctx->arg;
    int e = a->color[ctx->rank], group[WORLD], n_group = members(a, e, group);
    int expert_root = n_group - 1; /* a group rank, not a world rank */
    seldp_comm *sub = NULL;
    seldp_session *shared = NULL, *expert = NULL;
    test_model m;
    seldp_param_id shared_ids[STD_N], expert_ids[2];
    seldp_dtype expert_dtype[2] = {SELDP_F32, SELDP_BF16};
    int64_t expert_shape[2][2] = {{e + 2, 3}, {3, e + 2}};
    char path[2][64];
    bool all[MAX_RANKS] = {true, true, true, true};
    bool in_group[MAX_RANKS] = {false};
    double ref[64];
    char why[256];

    for (int i = 0; i < n_group; i++)
        in_group[group[i]] = true;
    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, e, ctx->rank, &sub));
    RANK_CHECK(ctx, seldp_comm_size(sub) == n_group, "group of %d ranks", seldp_comm_size(sub));

    /* the shared layout plus this rank's expert, with rank-dependent ids */
    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    if (a->break_schema && ctx->rank == WORLD - 1)
        expert_shape[0][0] += 1;
    for (int j = 0; j < 2; j++) {
        snprintf(path[j], sizeof path[j], "layers.1.experts.%d.w%d.weight", e, j + 1);
        expert_ids[j] = 300 + 10 * (seldp_param_id)ctx->rank + (seldp_param_id)j;
        RANK_CHECK_OK(ctx, ct_add(&m, path[j], expert_ids[j], expert_dtype[j], false,
                                  expert_seed(ctx->rank, j), 2, expert_shape[j]));
    }
    ct_snapshot(&m);

    /* both sessions, world first, then the expert's data group */
    std_selection(ctx->rank, shared_ids);
    RANK_CHECK_OK(
        ctx, seldp_session_initialize(ctx->world, m.model, 0, shared_ids, STD_N, NULL, &shared));
    a->expert_st[ctx->rank] =
        seldp_session_initialize(sub, m.model, expert_root, expert_ids, 2, NULL, &expert);
    if (a->break_schema) {
        /* only the broken group fails, and its parameters are untouched */
        if (a->expert_st[ctx->rank] != SELDP_OK) {
            ct_param *p = ct_find(&m, path[0]);
            RANK_CHECK(ctx,
                       memcmp(p->snapshot, p->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0,
                       "a failed initialize wrote '%s'", path[0]);
        }
        RANK_CHECK(ctx, a->expert_st[ctx->rank] != SELDP_OK || expert != NULL, "no session");
    } else {
        RANK_CHECK(ctx, a->expert_st[ctx->rank] == SELDP_OK, "expert initialize: %s",
                   seldp_last_error());
        RANK_CHECK(ctx,
                   seldp_session_rank(expert) == seldp_comm_rank(sub) &&
                       seldp_session_size(expert) == n_group,
                   "expert session reports rank %d of %d", seldp_session_rank(expert),
                   seldp_session_size(expert));
        /* the expert group's root is group rank expert_root = world rank group[expert_root] */
        for (int j = 0; j < 2; j++) {
            ct_param *p = ct_find(&m, path[j]);
            size_t numel = seldp_tensor_numel(&p->tensor);
            unsigned char want[256];
            ct_fill(expert_dtype[j], want, numel, expert_seed(group[expert_root], j));
            RANK_CHECK(ctx, memcmp(want, p->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0,
                       "'%s' does not hold its group root's values", path[j]);
        }
    }
    for (size_t k = 0; k < STD_N; k++)
        RANK_CHECK(ctx, std_holds_root(&m, k, 0, why, sizeof why), "%s", why);

    for (int step = 0; step < STEPS; step++) {
        test_grads g;
        uint64_t w_shared = 0, w_expert = 0, w_world = 0;
        void *data[2];
        RANK_CHECK_OK(ctx, tg_init(&g));
        for (size_t k = 0; k < STD_N; k++)
            if (!STD[k].frozen)
                RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, k, STD[k].dtype, false, NULL));
        for (int j = 0; j < 2; j++)
            RANK_CHECK_OK(ctx, tg_put(&g, expert_ids[j], expert_dtype[j], j == 1,
                                      expert_grad_seed(ctx->rank, step, j), 2, expert_shape[j],
                                      &data[j]));
        /* one container, two sessions: each passes the other's gradients through */
        RANK_CHECK_OK(ctx, seldp_session_reduce(shared, g.grads, tokens(ctx->rank, step),
                                                SELDP_MISSING_ERROR, &w_shared));
        for (int r = 0; r < WORLD; r++)
            w_world += tokens(r, step);
        RANK_CHECK(ctx, w_shared == w_world, "shared global weight %llu",
                   (unsigned long long)w_shared);
        std_reference(1, SELDP_F32, WORLD, all, (double)w_world, ref);
        RANK_CHECK(ctx,
                   close_to(SELDP_F32, seldp_grads_get(g.grads, std_id(ctx->rank, 1))->data, ref, 4,
                            2e-6, why, sizeof why),
                   "step %d shared final_norm.weight: %s", step, why);
        if (expert) {
            RANK_CHECK_OK(ctx,
                          seldp_session_sum(expert, g.grads, true, SELDP_MISSING_ERROR, &w_expert));
            RANK_CHECK(ctx, w_expert == (uint64_t)n_group, "expert global weight %llu",
                       (unsigned long long)w_expert);
            for (int j = 0; j < 2; j++) {
                const seldp_tensor *t = seldp_grads_get(g.grads, expert_ids[j]);
                size_t numel = seldp_tensor_numel(t);
                float tmp[64];
                double eref[64] = {0};
                for (int r = 0; r < WORLD; r++) {
                    if (!in_group[r])
                        continue;
                    ct_fill(expert_dtype[j], tmp, numel, expert_grad_seed(r, step, j));
                    for (size_t i = 0; i < numel; i++)
                        eref[i] += ct_get(expert_dtype[j], tmp, i);
                }
                RANK_CHECK(ctx, t->data == data[j], "'%s' not reduced in place", path[j]);
                RANK_CHECK(ctx, close_to(t->dtype, t->data, eref, numel, 2e-6, why, sizeof why),
                           "step %d '%s': %s", step, path[j], why);
                RANK_CHECK(ctx, same_everywhere(sub, t->data, seldp_tensor_nbytes(t)),
                           "'%s' differs within its group", path[j]);
            }
        }
        /* the shared results are bit-identical over the world */
        RANK_CHECK(ctx,
                   same_everywhere(ctx->world, seldp_grads_get(g.grads, std_id(ctx->rank, 0))->data,
                                   32 * sizeof(float)),
                   "shared embed gradient differs between replicas");
        tg_free(&g);
    }
    seldp_session_destroy(expert);
    seldp_session_destroy(shared);
    seldp_comm_destroy(sub);
    ct_free(&m);
    return 0;
}

static void expert_group_beside_world_session(void **state)
{
    (void)state;
    static const int layouts[][WORLD] = {
        {0, 1, 0, 1}, /* ep-dp: expert data groups strided */
        {0, 0, 1, 1}, /* dp-ep: consecutive */
        {0, 0, 0, 1}, /* uneven: a hot expert on three ranks, a cold one on one */
        {2, 2, 2, 2}, /* one expert replicated everywhere */
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        groups_arg a;
        memset(&a, 0, sizeof a);
        memcpy(a.color, layouts[i], sizeof a.color);
        tr_run_ranks(WORLD, TEST_TIMEOUT_S, rank_groups, &a);
    }
}

static void failure_stays_inside_its_group(void **state)
{
    (void)state;
    groups_arg a;
    memset(&a, 0, sizeof a);
    memcpy(a.color, (int[WORLD]){0, 1, 0, 1}, sizeof a.color);
    a.break_schema = true;
    tr_run_ranks(WORLD, TEST_TIMEOUT_S, rank_groups, &a);
    assert_int_equal(a.expert_st[0], SELDP_OK);
    assert_int_equal(a.expert_st[2], SELDP_OK);
    assert_int_equal(a.expert_st[1], SELDP_ERR_SCHEMA);
    assert_int_equal(a.expert_st[3], SELDP_ERR_SCHEMA);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(expert_group_beside_world_session),
        cmocka_unit_test(failure_stays_inside_its_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
