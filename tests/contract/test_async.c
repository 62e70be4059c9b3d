/* Contract of the overlapped reductions (seldp_session_*_start, seldp_session_mark_ready,
 * seldp_session_finish; include/seldp/session.h): the results are bit-identical to the
 * blocking call of the same inputs on the same session, for the mean and the sum, their FP32
 * variants, F32/BF16/F16 gradients, several bucket sizes and any order of marks; the
 * missing-gradient policy and the finiteness check decide as the blocking call does; and a
 * different session, a different method or a rank that does not start is an error on every
 * rank with the container unchanged. Runs on both reduce paths (ctest registers it again with
 * SELDP_REDUCE_PATH=bucketed): the blocking call it is compared with takes either; and under
 * cfg.overlap_in_place (SELDP_TEST_OVERLAP_IN_PLACE=all, or =odd for the odd ranks only,
 * or =default: the default config, which overlaps in place), where the fused path writes
 * results into the gradients bucket by bucket and every failure must put them back: the same
 * results, the same failures, nothing changed by a failure; and with cfg.staged_commit
 * (=staged_commit), which stages the overlapped reductions whatever cfg.overlap_in_place
 * says: nothing written in place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"
#include "session_async.h"

/* A model of NP parameters in path order, dtypes F32, BF16, F16 in turn, of sizes that
 * straddle every bucket size tested; the last one is frozen. ParamIds differ per rank. */
#define NP     12
#define FROZEN (NP - 1)
static const int64_t NUMEL[NP] = {1, 7, 33, 130, 5, 257, 64, 3, 91, 400, 16, 2};
static const seldp_dtype DTYPE[3] = {SELDP_F32, SELDP_BF16, SELDP_F16};
#define UNSELECTED 4242

enum method { MEAN, MEAN_FP32, SUM, SUM_FP32, N_METHODS };
enum order { FORWARD, REVERSE, RANDOM, AT_FINISH, HALF_THEN_FINISH, N_ORDERS };
static const char *const ORDER_NAME[N_ORDERS] = {"forward", "reverse", "random", "at finish",
                                                 "half, then finish"};

static seldp_param_id param_id(int rank, size_t i)
{
    return 100 + (seldp_param_id)((i + (size_t)rank * 5) % NP);
}

static seldp_dtype param_dtype(size_t i)
{
    return DTYPE[i % 3];
}

static uint64_t grad_seed(int rank, size_t i)
{
    return 9000 + (uint64_t)rank * 131 + i;
}

typedef struct async_arg {
    int method;
    int order;
    size_t bucket_bytes;
    bool check_finite;
    seldp_missing_policy policy;
    bool lacks[MAX_RANKS][NP]; /* rank r has no gradient of parameter i */
    uint64_t w[MAX_RANKS];     /* weights (sums: active when non-zero) */
    bool f32_inputs;           /* FP32 variants: half parameters get F32 gradients on odd ranks */
    int nonfinite_rank;        /* -1, or the rank whose gradient of parameter 5 holds a NaN */
    /* failure scenarios */
    int scenario;
    outcome o;
} async_arg;

/* SELDP_TEST_OVERLAP_IN_PLACE: unset, cfg.overlap_in_place = false (the staged commit);
 * all or odd, true on every rank or on the odd ranks; default, the config as
 * SELDP_SESSION_CONFIG_INIT leaves it (in place); staged_commit, the default with
 * cfg.staged_commit, which stages the overlapped reductions too. */
static const char *overlap_mode(void)
{
    const char *mode = getenv("SELDP_TEST_OVERLAP_IN_PLACE");
    return mode ? mode : "";
}

/* Whether this rank's overlapped reductions write in place on the fused path. */
static bool in_place_on(int rank)
{
    const char *mode = overlap_mode();
    return strcmp(mode, "all") == 0 || strcmp(mode, "default") == 0 ||
           (strcmp(mode, "odd") == 0 && rank % 2 == 1);
}

/* This rank's config of the mode. */
static void set_overlap_mode(int rank, seldp_session_config *cfg)
{
    const char *mode = overlap_mode();
    if (strcmp(mode, "staged_commit") == 0)
        cfg->staged_commit = true;
    else if (strcmp(mode, "default") != 0)
        cfg->overlap_in_place = in_place_on(rank);
}

/* The model and a session over every parameter (or the first `n_selected`). */
static int build(tr_rank_ctx *ctx, const async_arg *a, test_model *m, size_t n_selected,
                 seldp_session **s)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    seldp_param_id ids[NP];
    char path[64];

    cfg.bucket_bytes = a->bucket_bytes;
    cfg.check_finite = a->check_finite;
    set_overlap_mode(ctx->rank, &cfg);
    RANK_CHECK_OK(ctx, ct_init(m, ctx->rank));
    /* registered in a rank-dependent order: collective order is path order */
    for (size_t j = 0; j < NP; j++) {
        size_t i = (j + (size_t)ctx->rank * 7) % NP;
        snprintf(path, sizeof path, "layers.%02zu.weight", i);
        RANK_CHECK_OK(ctx, ct_add(m, path, param_id(ctx->rank, i), param_dtype(i), i == FROZEN,
                                  77 + i, 1, SHAPE(NUMEL[i])));
    }
    for (size_t i = 0; i < n_selected; i++)
        ids[i] = param_id(ctx->rank, (i * 5 + (size_t)ctx->rank) % n_selected);
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m->model, 0, ids, n_selected, &cfg, s));
    return 0;
}

/* This rank's gradients: every trainable parameter it does not lack, and one unselected. */
static int put_grads(tr_rank_ctx *ctx, const async_arg *a, test_grads *g)
{
    bool fp32 = a->method == MEAN_FP32 || a->method == SUM_FP32;
    void *data;
    RANK_CHECK_OK(ctx, tg_init(g));
    for (size_t i = 0; i < NP; i++) {
        seldp_dtype dt = param_dtype(i);
        if (i == FROZEN || a->lacks[ctx->rank][i])
            continue;
        if (fp32 && a->f32_inputs && ctx->rank % 2 == 1)
            dt = SELDP_F32;
        RANK_CHECK_OK(ctx, tg_put(g, param_id(ctx->rank, i), dt, i % 2 == 0,
                                  grad_seed(ctx->rank, i), 1, SHAPE(NUMEL[i]), &data));
        if (i == 5 && ctx->rank == a->nonfinite_rank)
            ct_set(dt, data, 3, 0.0 / 0.0);
    }
    RANK_CHECK_OK(ctx, tg_put(g, UNSELECTED, SELDP_F32, false, 3, 1, SHAPE(2), NULL));
    return 0;
}

static seldp_status blocking(const async_arg *a, seldp_session *s, seldp_grads *g, int rank,
                             uint64_t *total)
{
    switch (a->method) {
    case MEAN:
        return seldp_session_reduce(s, g, a->w[rank], a->policy, total);
    case MEAN_FP32:
        return seldp_session_reduce_fp32(s, g, a->w[rank], a->policy, total);
    case SUM:
        return seldp_session_sum(s, g, a->w[rank] > 0, a->policy, total);
    default:
        return seldp_session_sum_fp32(s, g, a->w[rank] > 0, a->policy, total);
    }
}

static seldp_status start(int method, const async_arg *a, seldp_session *s, seldp_grads *g,
                          int rank)
{
    switch (method) {
    case MEAN:
        return seldp_session_reduce_start(s, g, a->w[rank], a->policy);
    case MEAN_FP32:
        return seldp_session_reduce_fp32_start(s, g, a->w[rank], a->policy);
    case SUM:
        return seldp_session_sum_start(s, g, a->w[rank] > 0, a->policy);
    default:
        return seldp_session_sum_fp32_start(s, g, a->w[rank] > 0, a->policy);
    }
}

/* Start, mark in the argument's order (the random one differs from rank to rank), finish. */
static seldp_status overlapped(tr_rank_ctx *ctx, const async_arg *a, seldp_session *s,
                               seldp_grads *g, uint64_t *total)
{
    size_t order[NP], n_marks = NP;
    seldp_status st = start(a->method, a, s, g, ctx->rank);
    if (st != SELDP_OK)
        return st;
    for (size_t j = 0; j < NP; j++)
        order[j] = a->order == REVERSE ? NP - 1 - j : j;
    if (a->order == RANDOM)
        for (size_t j = NP - 1; j > 0; j--) {
            size_t k = tr_hash((uint64_t)ctx->rank * 7 + a->bucket_bytes, j) % (j + 1);
            size_t t = order[j];
            order[j] = order[k];
            order[k] = t;
        }
    if (a->order == AT_FINISH)
        n_marks = 0;
    if (a->order == HALF_THEN_FINISH)
        n_marks = NP / 2;
    /* A mark that fails (a bad gradient, an id another session selects) is reported by
     * finish on every rank; marking the frozen parameter without a gradient is allowed. */
    for (size_t j = 0; j < n_marks; j++)
        (void)seldp_session_mark_ready(s, param_id(ctx->rank, order[j]));
    return seldp_session_finish(s, total);
}

/* The same inputs through the blocking call (container A) and the overlapped one (B): the
 * same status, global weight, entries, dtypes, ownership and bytes. */
static int rank_same_as_blocking(tr_rank_ctx *ctx)
{
    const async_arg *a = ctx->arg;
    test_model m;
    test_grads ga, gb;
    grads_snapshot before;
    seldp_session *s = NULL;
    uint64_t wa = 0, wb = 0;
    seldp_status sa, sb;
    bool reduced_any = false;

    if (build(ctx, a, &m, NP, &s) || put_grads(ctx, a, &ga) || put_grads(ctx, a, &gb))
        return 1;
    gs_take(&before, gb.grads);
    sa = blocking(a, s, ga.grads, ctx->rank, &wa);
    RANK_CHECK(ctx, sa == SELDP_OK, "blocking call: %s: %s", seldp_status_name(sa),
               seldp_last_error());
    RANK_CHECK(ctx, !seldp_session_in_flight(s), "in flight before the start");
    sb = overlapped(ctx, a, s, gb.grads, &wb);
    RANK_CHECK(ctx, sb == SELDP_OK, "overlapped call (marks %s, %zu-byte buckets): %s: %s",
               ORDER_NAME[a->order], a->bucket_bytes, seldp_status_name(sb), seldp_last_error());
    RANK_CHECK(ctx, !seldp_session_in_flight(s), "still in flight after finish");
    RANK_CHECK(ctx, wa == wb, "global weight %llu, the blocking call's %llu",
               (unsigned long long)wb, (unsigned long long)wa);
    RANK_CHECK(ctx, seldp_grads_count(ga.grads) == seldp_grads_count(gb.grads),
               "%zu entries, the blocking call left %zu", seldp_grads_count(gb.grads),
               seldp_grads_count(ga.grads));
    for (size_t i = 0; i < NP; i++) {
        seldp_param_id id = param_id(ctx->rank, i);
        const seldp_tensor *ta = seldp_grads_get(ga.grads, id), *tb = seldp_grads_get(gb.grads, id);
        RANK_CHECK(ctx, (ta == NULL) == (tb == NULL), "parameter %zu: present %d, blocking %d", i,
                   tb != NULL, ta != NULL);
        if (!ta)
            continue;
        RANK_CHECK(ctx, ta->dtype == tb->dtype, "parameter %zu: dtype %s, blocking %s", i,
                   seldp_dtype_name(tb->dtype), seldp_dtype_name(ta->dtype));
        RANK_CHECK(ctx, seldp_grads_ownership(ga.grads, id) == seldp_grads_ownership(gb.grads, id),
                   "parameter %zu: ownership differs from the blocking call's", i);
        size_t bytes = seldp_tensor_nbytes(ta), at = tr_first_diff(ta->data, tb->data, bytes);
        RANK_CHECK(ctx, at == bytes,
                   "parameter %zu (%s, %zu-byte buckets, marks %s): byte %zu of %zu differs from "
                   "the blocking call's",
                   i, seldp_dtype_name(ta->dtype), a->bucket_bytes, ORDER_NAME[a->order], at,
                   bytes);
        for (size_t j = 0; j < before.n; j++)
            if (before.id[j] == id && ctx->size > 1 &&
                memcmp(before.bytes[j], tb->data, seldp_tensor_nbytes(&before.t[j])) != 0)
                reduced_any = true;
    }
    RANK_CHECK(ctx, reduced_any || wa == 0, "no result differs from this rank's own gradients");
    /* under cfg.overlap_in_place on the fused path, the results went into the gradients */
    size_t in_place = seldp__session_async_in_place_segments(s);
    bool fused = seldp_session_reduce_path(s) == SELDP_REDUCE_PATH_FUSED;
    RANK_CHECK(ctx, in_place_on(ctx->rank) && fused && wa > 0 ? in_place > 0 : in_place == 0,
               "%zu segments written in place (cfg.overlap_in_place %d, %s path, weight %llu)",
               in_place, in_place_on(ctx->rank), fused ? "fused" : "bucketed",
               (unsigned long long)wa);
    RANK_CHECK(ctx, gs_entry_same(&before, gb.grads, UNSELECTED),
               "the unselected gradient changed");
    gs_free(&before);
    tg_free(&ga);
    tg_free(&gb);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static async_arg make(int method, int order, size_t bucket_bytes)
{
    async_arg a;
    memset(&a, 0, sizeof a);
    a.method = method;
    a.order = order;
    a.bucket_bytes = bucket_bytes;
    a.policy = SELDP_MISSING_ERROR;
    a.nonfinite_rank = -1;
    for (int r = 0; r < MAX_RANKS; r++)
        a.w[r] = 3 * (uint64_t)r + 1;
    return a;
}

static void bit_identical_to_blocking(void **state)
{
    /* 4 bytes: one element per bucket; 100: parameters straddle buckets; the default: one */
    static const size_t BUCKETS[] = {4, 100, 1024, (size_t)25 << 20};
    (void)state;
    for (int n = 2; n <= 4; n++)
        for (int method = 0; method < N_METHODS; method++)
            for (size_t b = 0; b < sizeof BUCKETS / sizeof BUCKETS[0]; b++)
                for (int order = 0; order < N_ORDERS; order++) {
                    async_arg a = make(method, order, BUCKETS[b]);
                    a.f32_inputs = (order + (int)b) % 2 == 1;
                    tr_run_ranks(n, TEST_TIMEOUT_S, rank_same_as_blocking, &a);
                }
}

static void inactive_ranks_and_missing_gradients(void **state)
{
    (void)state;
    for (int method = 0; method < N_METHODS; method++) {
        /* policy zero: ranks lack different gradients, one lacks every gradient of
         * parameter 2, and parameter 4 is absent on every rank (stays absent) */
        async_arg a = make(method, RANDOM, 100);
        a.policy = SELDP_MISSING_ZERO;
        for (int r = 0; r < 3; r++) {
            a.lacks[r][4] = true;
            a.lacks[r][(size_t)r + 6] = true;
        }
        a.lacks[1][2] = true;
        tr_run_ranks(3, TEST_TIMEOUT_S, rank_same_as_blocking, &a);
        /* policy error: only an inactive rank lacks a gradient */
        a = make(method, REVERSE, 64);
        a.w[2] = 0;
        a.lacks[2][3] = true;
        tr_run_ranks(3, TEST_TIMEOUT_S, rank_same_as_blocking, &a);
        /* nobody active: every selected gradient is absent */
        a = make(method, FORWARD, 64);
        for (int r = 0; r < 3; r++)
            a.w[r] = 0;
        tr_run_ranks(3, TEST_TIMEOUT_S, rank_same_as_blocking, &a);
    }
}

/* --- failures: the same status and message on every rank, nothing written -------------- */

enum scenario {
    MISSING,        /* policy error, the last rank lacks parameter 3 */
    NONFINITE,      /* check_finite, rank 1's parameter 5 has a NaN */
    OTHER_SESSION,  /* rank 0 reduces a session of every parameter, the others one of half */
    OTHER_METHOD,   /* rank 0 starts a sum, the others a mean */
    BLOCKING_PEER,  /* the last rank calls the blocking seldp_session_reduce */
    NOT_STARTED,    /* the last rank never starts; it calls finish */
    MARKED_TWICE,   /* rank 1 marks parameter 0 twice */
    WRONG_DTYPE,    /* rank 1 marks parameter 1 with an F32 gradient (expects bf16) */
    FROZEN_GRADIENT /* rank 0 supplies a gradient for the frozen parameter */
};

static int rank_fails(tr_rank_ctx *ctx)
{
    async_arg *a = ctx->arg;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL, *half = NULL;
    bool last = ctx->rank == ctx->size - 1;
    seldp_status st;

    if (build(ctx, a, &m, NP, &s))
        return 1;
    if (a->scenario == OTHER_SESSION) {
        RANK_CHECK_OK(ctx, seldp_session_initialize(
                               ctx->world, m.model, 0,
                               (seldp_param_id[]){param_id(ctx->rank, 0), param_id(ctx->rank, 1)},
                               2, NULL, &half));
    }
    if (put_grads(ctx, a, &g))
        return 1;
    if (a->scenario == WRONG_DTYPE && ctx->rank == 1) {
        seldp_grads_remove(g.grads, param_id(1, 1));
        RANK_CHECK_OK(ctx,
                      tg_put(&g, param_id(1, 1), SELDP_F32, false, 5, 1, SHAPE(NUMEL[1]), NULL));
    }
    if (a->scenario == FROZEN_GRADIENT && ctx->rank == 0)
        RANK_CHECK_OK(ctx, tg_put(&g, param_id(0, FROZEN), SELDP_F32, false, 5, 1,
                                  SHAPE(NUMEL[FROZEN]), NULL));
    gs_take(&before, g.grads);
    switch (a->scenario) {
    case OTHER_SESSION:
        st = overlapped(ctx, a, ctx->rank == 0 ? s : half, g.grads, NULL);
        break;
    case OTHER_METHOD:
        st = start(ctx->rank == 0 ? SUM : MEAN, a, s, g.grads, ctx->rank);
        if (st == SELDP_OK)
            st = seldp_session_finish(s, NULL);
        break;
    case BLOCKING_PEER:
    case NOT_STARTED:
        if (!last)
            st = overlapped(ctx, a, s, g.grads, NULL);
        else if (a->scenario == BLOCKING_PEER)
            st = seldp_session_reduce(s, g.grads, a->w[ctx->rank], a->policy, NULL);
        else
            st = seldp_session_finish(s, NULL);
        break;
    case MARKED_TWICE:
        st = start(MEAN, a, s, g.grads, ctx->rank);
        if (st == SELDP_OK) {
            seldp_status first = seldp_session_mark_ready(s, param_id(ctx->rank, 0));
            seldp_status again =
                ctx->rank == 1 ? seldp_session_mark_ready(s, param_id(ctx->rank, 0)) : SELDP_OK;
            RANK_CHECK(ctx, first == SELDP_OK, "the first mark failed: %s", seldp_last_error());
            RANK_CHECK(ctx, again == SELDP_OK || again == SELDP_ERR_INVALID_ARGUMENT,
                       "the second mark returned %s", seldp_status_name(again));
            RANK_CHECK(ctx, ctx->rank != 1 || again != SELDP_OK, "a second mark was accepted");
            st = seldp_session_finish(s, NULL);
        }
        break;
    default:
        st = overlapped(ctx, a, s, g.grads, NULL);
        break;
    }
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = gs_same(&before, g.grads, a->o.why[ctx->rank], sizeof a->o.why[0]);
    RANK_CHECK(ctx, !seldp_session_in_flight(s) && !seldp_session_in_flight(half),
               "a session is still in flight after its finish");
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(half);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static async_arg failing(int scenario)
{
    async_arg a = make(MEAN, REVERSE, 100);
    a.scenario = scenario;
    return a;
}

static void policy_and_finiteness_as_blocking(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        async_arg a = failing(MISSING);
        char who[64];
        a.lacks[n - 1][3] = true;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        snprintf(who, sizeof who, "no gradient on active group rank %d", n - 1);
        expect_same_failure(&a.o, n, SELDP_ERR_MISSING_GRADIENT, "'layers.03.weight'", who);

        a = failing(NONFINITE);
        a.check_finite = true;
        a.nonfinite_rank = 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_NONFINITE, "'layers.05.weight'",
                            "group rank 1 (world rank 1) is not finite at element 3");
    }
}

static void mismatches_fail_on_every_rank(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        async_arg a = failing(OTHER_SESSION);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_DISAGREE, "ranks reduce different sessions",
                            "seldp_session_reduce_start on the session of 'layers.00.weight' (2 "
                            "parameters");

        a = failing(OTHER_METHOD);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_DISAGREE, "called seldp_session_sum_start",
                            "called seldp_session_reduce_start");

        a = failing(BLOCKING_PEER);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_DISAGREE, "called seldp_session_reduce_start",
                            "called seldp_session_reduce with");

        a = failing(MARKED_TWICE);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_INVALID_ARGUMENT, "group rank 1 (world rank 1)",
                            "'layers.00.weight' was marked ready twice");

        a = failing(WRONG_DTYPE);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_DTYPE, "seldp_session_mark_ready",
                            "'layers.01.weight': gradient dtype f32, expected bf16");

        a = failing(FROZEN_GRADIENT);
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_fails, &a);
        expect_same_failure(&a.o, n, SELDP_ERR_FROZEN, "group rank 0 (world rank 0)",
                            "'layers.11.weight' is frozen");
    }
}

/* --- two sessions of two communicators in flight at once ----------------------------- */

/* Bytes of every entry of `b` equal to those of the same id in `a`. */
static bool same_entries(const seldp_grads *a, const seldp_grads *b, char *why, size_t size)
{
    for (size_t i = 0; i < seldp_grads_count(a); i++) {
        seldp_param_id id;
        const seldp_tensor *ta, *tb;
        seldp_grads_at(a, i, &id, &ta);
        tb = seldp_grads_get(b, id);
        if (!tb || tb->dtype != ta->dtype ||
            tr_first_diff(ta->data, tb->data, seldp_tensor_nbytes(ta)) != seldp_tensor_nbytes(ta)) {
            snprintf(why, size, "the gradient of ParamId %llu differs", (unsigned long long)id);
            return false;
        }
    }
    return true;
}

/* The world's session of the standard layout and a session of final_norm.weight over each
 * half of the world (even and odd ranks), both overlapped at once, as a model with a shared
 * group and expert groups does: each result equals its blocking call's. */
static int rank_two_sessions_at_once(tr_rank_ctx *ctx)
{
    static const size_t TRAINABLE[] = {0, 1, 3, 4};
    int r = ctx->rank;
    test_model m;
    test_grads ga, ga2, gb, gb2;
    seldp_comm *half = NULL;
    seldp_session *sw = NULL, *sh = NULL;
    seldp_param_id norm = std_id(r, 1);
    uint64_t w = 0, w2 = 0;

    RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, r % 2, r, &half));
    RANK_CHECK_OK(ctx, std_session(ctx->world, &m, NULL, &sw));
    RANK_CHECK_OK(ctx, seldp_session_initialize(half, m.model, 0, &norm, 1, NULL, &sh));
    RANK_CHECK_OK(ctx, tg_init(&ga));
    RANK_CHECK_OK(ctx, tg_init(&ga2));
    RANK_CHECK_OK(ctx, tg_init(&gb));
    RANK_CHECK_OK(ctx, tg_init(&gb2));
    for (size_t j = 0; j < 4; j++) {
        size_t k = TRAINABLE[j];
        RANK_CHECK_OK(ctx, std_put_grad(&ga, r, k, STD[k].dtype, false, NULL));
        RANK_CHECK_OK(ctx, std_put_grad(&ga2, r, k, STD[k].dtype, false, NULL));
    }
    RANK_CHECK_OK(ctx, std_put_grad(&gb, r, 1, SELDP_F32, false, NULL));
    RANK_CHECK_OK(ctx, std_put_grad(&gb2, r, 1, SELDP_F32, false, NULL));
    RANK_CHECK_OK(ctx,
                  seldp_session_reduce(sw, ga2.grads, (uint64_t)r + 2, SELDP_MISSING_ERROR, &w2));
    RANK_CHECK_OK(ctx, seldp_session_sum(sh, gb2.grads, true, SELDP_MISSING_ERROR, NULL));

    RANK_CHECK_OK(ctx,
                  seldp_session_reduce_start(sw, ga.grads, (uint64_t)r + 2, SELDP_MISSING_ERROR));
    RANK_CHECK_OK(ctx, seldp_session_sum_start(sh, gb.grads, true, SELDP_MISSING_ERROR));
    RANK_CHECK_OK(ctx, seldp_session_mark_ready(sw, std_id(r, 4)));
    RANK_CHECK_OK(ctx, seldp_session_mark_ready(sh, norm));
    RANK_CHECK_OK(ctx, seldp_session_mark_ready(sw, std_id(r, 3)));
    RANK_CHECK_OK(ctx, seldp_session_finish(sh, NULL));
    RANK_CHECK_OK(ctx, seldp_session_finish(sw, &w));
    RANK_CHECK(ctx, w == w2, "global weight %llu, blocking %llu", (unsigned long long)w,
               (unsigned long long)w2);
    RANK_CHECK(ctx, same_entries(ga2.grads, ga.grads, ctx->why, sizeof ctx->why), "world: %s",
               ctx->why);
    RANK_CHECK(ctx, same_entries(gb2.grads, gb.grads, ctx->why, sizeof ctx->why), "half: %s",
               ctx->why);
    tg_free(&ga);
    tg_free(&ga2);
    tg_free(&gb);
    tg_free(&gb2);
    seldp_session_destroy(sh);
    seldp_session_destroy(sw);
    ct_free(&m);
    seldp_comm_destroy(half);
    return 0;
}

static void two_communicators_in_flight(void **state)
{
    (void)state;
    tr_run_ranks(4, TEST_TIMEOUT_S, rank_two_sessions_at_once, NULL);
}

/* Sessions with nothing to reduce (an empty selection, a frozen parameter only): the
 * overlapped call agrees, returns the global weight and leaves every gradient as it was. */
static int rank_nothing_to_reduce(tr_rank_ctx *ctx)
{
    int r = ctx->rank;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *empty = NULL, *frozen = NULL;
    seldp_param_id frozen_id = std_id(r, 2); /* frozen.scale */
    uint64_t w = 0;

    RANK_CHECK_OK(ctx, ct_init(&m, r));
    RANK_CHECK_OK(ctx, std_model(&m, r));
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, NULL, 0, NULL, &empty));
    RANK_CHECK_OK(ctx,
                  seldp_session_initialize(ctx->world, m.model, 0, &frozen_id, 1, NULL, &frozen));
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, std_put_grad(&g, r, 0, SELDP_F32, false, NULL));
    gs_take(&before, g.grads);
    RANK_CHECK_OK(ctx,
                  seldp_session_reduce_start(empty, g.grads, (uint64_t)r + 1, SELDP_MISSING_ERROR));
    RANK_CHECK_OK(ctx, seldp_session_finish(empty, &w));
    RANK_CHECK(ctx, w == (uint64_t)(ctx->size * (ctx->size + 1) / 2), "global weight %llu",
               (unsigned long long)w);
    RANK_CHECK_OK(ctx, seldp_session_sum_start(frozen, g.grads, true, SELDP_MISSING_ZERO));
    RANK_CHECK_OK(ctx, seldp_session_mark_ready(frozen, frozen_id));
    RANK_CHECK_OK(ctx, seldp_session_finish(frozen, &w));
    RANK_CHECK(ctx, w == (uint64_t)ctx->size, "active ranks %llu", (unsigned long long)w);
    RANK_CHECK(ctx, gs_same(&before, g.grads, ctx->why, sizeof ctx->why), "%s", ctx->why);
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(frozen);
    seldp_session_destroy(empty);
    ct_free(&m);
    return 0;
}

static void nothing_to_reduce(void **state)
{
    (void)state;
    for (int n = 2; n <= 3; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_nothing_to_reduce, NULL);
}

/* A rank that never starts: it learns so from its own finish, the others time out. */
static void a_rank_that_does_not_start(void **state)
{
    (void)state;
    for (int n = 2; n <= 3; n++) {
        async_arg a = failing(NOT_STARTED);
        tr_run_ranks(n, 0.5, rank_fails, &a);
        for (int r = 0; r < n - 1; r++) {
            if (a.o.st[r] != SELDP_ERR_TIMEOUT && a.o.st[r] != SELDP_ERR_ABORTED)
                fail_msg("rank %d returned %s: %s", r, seldp_status_name(a.o.st[r]), a.o.msg[r]);
            assert_true(a.o.unchanged[r]);
        }
        assert_int_equal(a.o.st[n - 1], SELDP_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(a.o.msg[n - 1], "no overlapped reduction is in flight"));
        assert_true(a.o.unchanged[n - 1]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bit_identical_to_blocking),
        cmocka_unit_test(inactive_ranks_and_missing_gradients),
        cmocka_unit_test(policy_and_finiteness_as_blocking),
        cmocka_unit_test(mismatches_fail_on_every_rank),
        cmocka_unit_test(a_rank_that_does_not_start),
        cmocka_unit_test(two_communicators_in_flight),
        cmocka_unit_test(nothing_to_reduce),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
