/* Contract of seldp_session_initialize (docs/library.md: Model view, Initialize): what a successful
 * initialize broadcasts, what it leaves alone, how it orders and coalesces its broadcasts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

typedef struct init_arg {
    int root;
    size_t bucket_bytes; /* 0: the default configuration */
} init_arg;

static seldp_session_config config_of(const init_arg *a)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    if (a->bucket_bytes)
        cfg.bucket_bytes = a->bucket_bytes;
    return cfg;
}

/* Every rank: selected parameters take root's values (bit-identical on every rank),
 * frozen ones included, and each unselected one keeps its own bytes. */
static int rank_broadcast(tr_rank_ctx *ctx)
{
    const init_arg *a = ctx->arg;
    seldp_session_config cfg = config_of(a);
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[STD_N];
    char why[256];

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    ct_snapshot(&m);
    std_selection(ctx->rank, ids);
    RANK_CHECK_OK(ctx,
                  seldp_session_initialize(ctx->world, m.model, a->root, ids, STD_N, &cfg, &s));
    for (size_t k = 0; k < STD_N; k++) {
        ct_param *p = ct_find(&m, STD[k].path);
        RANK_CHECK(ctx, std_holds_root(&m, k, a->root, why, sizeof why), "%s", why);
        RANK_CHECK(ctx,
                   same_everywhere(ctx->world, p->tensor.data, seldp_tensor_nbytes(&p->tensor)),
                   "'%s' is not bit-identical on every rank", p->path);
    }
    /* the tied alias names the same storage, so it reads root's values too */
    RANK_CHECK(
        ctx, ct_find(&m, "lm_head.weight")->tensor.data == ct_find(&m, "embed.weight")->tensor.data,
        "tied alias lost its storage");
    for (size_t i = 0; i < m.n; i++) {
        ct_param *p = &m.p[i];
        bool selected = false;
        for (size_t k = 0; k < STD_N; k++)
            selected |= strcmp(p->path, STD[k].path) == 0 || strcmp(p->path, "lm_head.weight") == 0;
        if (!selected)
            RANK_CHECK(ctx,
                       memcmp(p->snapshot, p->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0,
                       "unselected '%s' changed", p->path);
    }
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void selected_parameters_take_root_values(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        for (int root = 0; root < n; root++) {
            init_arg a = {root, 0};
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_broadcast, &a);
        }
    }
}

static void small_buckets_still_broadcast_every_byte(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        init_arg a = {n - 1, 12}; /* smaller than most tensors: many buckets per tensor */
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_broadcast, &a);
    }
}

/* Collective order is the order of paths, not of ids: on rank r the id of path k is
 * (k + r) mod 5 + 1, so rank 0's id of one path is rank 1's id of another. Covered by
 * rank_broadcast; this one checks the ids really differ and the session keeps them. */
static int rank_ids_differ(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[STD_N];
    const seldp_param_id *kept;
    size_t n_kept = 0;
    char why[256];

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    RANK_CHECK(
        ctx,
        !same_everywhere(ctx->world, &ct_find(&m, "embed.weight")->id, sizeof(seldp_param_id)) ||
            ctx->size == 1,
        "the test needs ids that differ between ranks");
    std_selection(ctx->rank, ids);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, ids, STD_N, NULL, &s));
    for (size_t k = 0; k < STD_N; k++)
        RANK_CHECK(ctx, std_holds_root(&m, k, 0, why, sizeof why), "%s", why);
    kept = seldp_session_selected(s, &n_kept);
    RANK_CHECK(ctx, n_kept == STD_N && memcmp(kept, ids, sizeof ids) == 0,
               "seldp_session_selected does not return the ids as given");
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void param_ids_may_differ_between_ranks(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_ids_differ, NULL);
}

/* The counts through the communicator: ceil(bytes / bucket) broadcasts per dtype, a tied
 * group counted once, and one all-gather (the records) before them. */
static int rank_bucket_counts(tr_rank_ctx *ctx)
{
    const init_arg *a = ctx->arg;
    seldp_session_config cfg = config_of(a);
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[STD_N];
    seldp_comm_stats before, after;
    /* F32: embed 128 bytes (once, though tied) + final_norm 16 + frozen.scale 12;
     * BF16: norm 8; F16: router 16 */
    size_t f32 = 128 + 16 + 12, bf16 = 8, f16 = 16, b = cfg.bucket_bytes;
    size_t b32 = b / 4 * 4, b16 = b / 2 * 2;
    uint64_t expected = (f32 + b32 - 1) / b32 + (bf16 + b16 - 1) / b16 + (f16 + b16 - 1) / b16;

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    std_selection(ctx->rank, ids);
    before = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx,
                  seldp_session_initialize(ctx->world, m.model, a->root, ids, STD_N, &cfg, &s));
    after = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, after.broadcasts - before.broadcasts == expected,
               "bucket %zu: %llu broadcasts, expected %llu", b,
               (unsigned long long)(after.broadcasts - before.broadcasts),
               (unsigned long long)expected);
    /* the ranks' schemas are identical (the manifest is in path order): their records say so,
       and the schemas themselves are not exchanged (test_schema_exchange.c) */
    RANK_CHECK(ctx, after.allgathers - before.allgathers == 1, "%llu all-gathers, expected 1",
               (unsigned long long)(after.allgathers - before.allgathers));
    RANK_CHECK(ctx, after.allreduces == before.allreduces && after.barriers == before.barriers,
               "initialize made allreduces or barriers");
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void broadcasts_are_coalesced_per_dtype(void **state)
{
    (void)state;
    static const size_t buckets[] = {0 /* default: one per dtype */, 16, 64, 100, 156, 1 << 20};
    for (int n = 1; n <= 4; n++) {
        for (size_t i = 0; i < sizeof buckets / sizeof buckets[0]; i++) {
            init_arg a = {n / 2, buckets[i] ? buckets[i] : (size_t)25 << 20};
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_bucket_counts, &a);
        }
    }
}

/* n tensors of b bytes in all make ceil(b / bucket) broadcasts, not n. */
static int rank_many_tensors(tr_rank_ctx *ctx)
{
    enum { N_TENSORS = 40, ELEMS = 10 };
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[N_TENSORS];
    seldp_comm_stats before, after;
    char path[32];

    cfg.bucket_bytes = 256;
    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    for (int i = 0; i < N_TENSORS; i++) {
        snprintf(path, sizeof path, "t.%02d", i);
        ids[i] = (seldp_param_id)i + 1;
        RANK_CHECK_OK(ctx, ct_add(&m, path, ids[i], SELDP_F32, false,
                                  (uint64_t)ctx->rank * 100 + (uint64_t)i, 1, SHAPE(ELEMS)));
    }
    before = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, ids, N_TENSORS, &cfg, &s));
    after = seldp_comm_get_stats(ctx->world);
    /* 40 tensors * 40 bytes = 1600 bytes in buckets of 256: 7 broadcasts */
    RANK_CHECK(ctx, after.broadcasts - before.broadcasts == 7, "%llu broadcasts, expected 7",
               (unsigned long long)(after.broadcasts - before.broadcasts));
    for (int i = 0; i < N_TENSORS; i++) {
        float want[ELEMS];
        ct_fill(SELDP_F32, want, ELEMS, (uint64_t)i);
        RANK_CHECK(ctx, memcmp(want, m.p[i].tensor.data, sizeof want) == 0,
                   "'%s' is not root's after bucketed broadcast", m.p[i].path);
    }
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void many_tensors_make_few_broadcasts(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_many_tensors, NULL);
}

/* An empty selection is valid: no broadcast, nothing written, and reductions pass every
 * gradient through. */
static int rank_empty(tr_rank_ctx *ctx)
{
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    seldp_comm_stats before, after;
    size_t n_sel = 99;
    uint64_t w = 0;
    void *data = NULL;
    char why[256];

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    ct_snapshot(&m);
    before = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, NULL, 0, NULL, &s));
    after = seldp_comm_get_stats(ctx->world);
    RANK_CHECK(ctx, after.broadcasts == before.broadcasts, "empty selection broadcast");
    RANK_CHECK(ctx, ct_unchanged(&m, why, sizeof why), "%s", why);
    seldp_session_selected(s, &n_sel);
    RANK_CHECK(ctx, n_sel == 0, "empty selection reports %zu ids", n_sel);
    RANK_CHECK(ctx, seldp_session_rank(s) == ctx->rank && seldp_session_size(s) == ctx->size,
               "session rank/size wrong");

    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx,
                  tg_put(&g, std_id(ctx->rank, 0), SELDP_F32, false, 5, 2, SHAPE(8, 4), &data));
    RANK_CHECK_OK(ctx, seldp_session_reduce(s, g.grads, 3, SELDP_MISSING_ERROR, &w));
    RANK_CHECK(ctx, w == 3u * (uint64_t)ctx->size, "global weight %llu", (unsigned long long)w);
    RANK_CHECK(ctx,
               seldp_grads_count(g.grads) == 1 &&
                   seldp_grads_get(g.grads, std_id(ctx->rank, 0))->data == data,
               "an unselected gradient did not pass through");
    {
        float want[32];
        ct_fill(SELDP_F32, want, 32, 5);
        RANK_CHECK(ctx, memcmp(want, data, sizeof want) == 0, "unselected gradient changed");
    }
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void empty_selection_is_valid(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_empty, NULL);
}

/* Every parameter selected is plain DDP: every tensor becomes root's. */
static int rank_full_model(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[8];
    size_t n_ids = 0;
    const int root = ctx->size - 1;

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    for (size_t k = 0; k < STD_N; k++)
        RANK_CHECK_OK(ctx,
                      ct_add(&m, STD[k].path, std_id(ctx->rank, k), STD[k].dtype, STD[k].frozen,
                             std_seed(ctx->rank, k), STD[k].ndim, STD[k].shape));
    RANK_CHECK_OK(ctx, ct_tie(&m, "lm_head.weight", "embed.weight"));
    for (size_t i = 0; i < seldp_model_count(m.model); i++) {
        const seldp_param *p = seldp_model_at(m.model, i);
        if (seldp_model_find_id(m.model, p->id) == p)
            ids[n_ids++] = p->id;
    }
    RANK_CHECK(ctx, n_ids == STD_N, "%zu distinct ids", n_ids);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, root, ids, n_ids, NULL, &s));
    for (size_t i = 0; i < m.n; i++)
        RANK_CHECK(
            ctx,
            same_everywhere(ctx->world, m.p[i].tensor.data, seldp_tensor_nbytes(&m.p[i].tensor)),
            "'%s' differs between replicas", m.p[i].path);
    for (size_t k = 0; k < STD_N; k++) {
        char why[256];
        RANK_CHECK(ctx, std_holds_root(&m, k, root, why, sizeof why), "%s", why);
    }
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void full_model_session_is_ddp(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_full_model, NULL);
}

/* The session copies the ids: the caller may reuse its array. */
static int rank_ids_copied(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_session *s = NULL;
    seldp_param_id ids[STD_N], given[STD_N];
    const seldp_param_id *kept;
    size_t n = 0;

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    std_selection(ctx->rank, ids);
    memcpy(given, ids, sizeof ids);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, ids, STD_N, NULL, &s));
    memset(ids, 0xff, sizeof ids);
    kept = seldp_session_selected(s, &n);
    RANK_CHECK(ctx, n == STD_N && memcmp(kept, given, sizeof given) == 0,
               "selected ids changed with the caller's array");
    RANK_CHECK(ctx, seldp_session_rank(s) == ctx->rank, "rank %d", seldp_session_rank(s));
    RANK_CHECK(ctx, seldp_session_size(s) == ctx->size, "size %d", seldp_session_size(s));
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void session_copies_ids_and_reports_group(void **state)
{
    (void)state;
    for (int n = 1; n <= 3; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_ids_copied, NULL);
    seldp_session_destroy(NULL);
}

/* --- the reduce path ------------------------------------------------------ */

typedef struct path_arg {
    seldp_reduce_path asked[MAX_RANKS]; /* per rank */
    seldp_reduce_path expected;         /* what the group must agree on */
    outcome o;                          /* with an invalid request */
} path_arg;

/* The group takes the fused path only when every rank may; either way the reduction is
 * exact (small integers) and the path is reported alike on every rank. */
static int rank_path(tr_rank_ctx *ctx)
{
    path_arg *a = ctx->arg;
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data;
    seldp_comm_stats s0, s1;

    cfg.reduce_path = a->asked[ctx->rank];
    seldp_status st = std_session(ctx->world, &m, &cfg, &s);
    if (a->expected == SELDP_REDUCE_PATH_AUTO) { /* the request is invalid */
        outcome_record(&a->o, ctx->rank, st);
        a->o.unchanged[ctx->rank] = s == NULL;
        snprintf(a->o.why[ctx->rank], sizeof a->o.why[0], "a session was returned");
        ct_free(&m);
        return 0;
    }
    RANK_CHECK(ctx, st == SELDP_OK, "initialize returned %s: %s", seldp_status_name(st),
               seldp_last_error());
    RANK_CHECK(ctx, seldp_session_reduce_path(s) == a->expected, "path %d, expected %d",
               (int)seldp_session_reduce_path(s), (int)a->expected);
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, 1, SELDP_F32, false, &data));
    for (int i = 0; i < 4; i++)
        ((float *)data)[i] = (float)(ctx->rank + i);
    s0 = seldp_comm_get_stats(ctx->world);
    RANK_CHECK_OK(ctx, seldp_session_sum(s, g.grads, true, SELDP_MISSING_ZERO, NULL));
    s1 = seldp_comm_get_stats(ctx->world);
    bool fused = a->expected == SELDP_REDUCE_PATH_FUSED;
    RANK_CHECK(ctx,
               s1.reductions - s0.reductions == (fused ? 1u : 0u) &&
                   (s1.allreduces - s0.allreduces > 0) == !fused,
               "%llu fused reductions and %llu allreduces on the %s path",
               (unsigned long long)(s1.reductions - s0.reductions),
               (unsigned long long)(s1.allreduces - s0.allreduces), fused ? "fused" : "bucketed");
    for (int i = 0; i < 4; i++) {
        float want = (float)(ctx->size * (ctx->size - 1) / 2 + ctx->size * i);
        RANK_CHECK(ctx, ((float *)data)[i] == want, "element %d: %g, expected %g", i,
                   ((float *)data)[i], want);
    }
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void reduce_path_agreed_by_the_group(void **state)
{
    (void)state;
    const char *env = getenv("SELDP_REDUCE_PATH");
    bool env_bucketed = env && strcmp(env, "bucketed") == 0;
    for (int n = 1; n <= 3; n++) {
        path_arg a;
        memset(&a, 0, sizeof a);
        /* AUTO: the environment decides, else the host transport's fused reduction */
        a.expected = env_bucketed ? SELDP_REDUCE_PATH_BUCKETED : SELDP_REDUCE_PATH_FUSED;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_path, &a);
        for (int r = 0; r < n; r++)
            a.asked[r] = SELDP_REDUCE_PATH_BUCKETED;
        a.expected = SELDP_REDUCE_PATH_BUCKETED;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_path, &a);
        /* one rank asking for the bucketed path takes the group with it */
        for (int r = 0; r < n; r++)
            a.asked[r] = r == n - 1 ? SELDP_REDUCE_PATH_BUCKETED : SELDP_REDUCE_PATH_FUSED;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_path, &a);
        if (!env_bucketed) {
            for (int r = 0; r < n; r++)
                a.asked[r] = SELDP_REDUCE_PATH_FUSED;
            a.expected = SELDP_REDUCE_PATH_FUSED;
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_path, &a);
        }
        /* an invalid request on one rank fails everywhere */
        memset(&a, 0, sizeof a);
        a.asked[n - 1] = (seldp_reduce_path)7;
        a.expected = SELDP_REDUCE_PATH_AUTO;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_path, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_INVALID_ARGUMENT, "cfg.reduce_path 7 is invalid",
                            "seldp_session_initialize");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(selected_parameters_take_root_values),
        cmocka_unit_test(small_buckets_still_broadcast_every_byte),
        cmocka_unit_test(param_ids_may_differ_between_ranks),
        cmocka_unit_test(broadcasts_are_coalesced_per_dtype),
        cmocka_unit_test(many_tensors_make_few_broadcasts),
        cmocka_unit_test(empty_selection_is_valid),
        cmocka_unit_test(full_model_session_is_ddp),
        cmocka_unit_test(session_copies_ids_and_reports_group),
        cmocka_unit_test(reduce_path_agreed_by_the_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
