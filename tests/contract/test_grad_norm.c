/* Contract of seldp_grad_norm and seldp_clip_grad_norm (docs/library.md, Global gradient norm): the
 * L2 norm of the logical gradient over several sessions, every replica set counted once and every
 * shard once, the same bits on every rank of the parent; clipping by min(1, max_norm / (norm +
 * 1e-6)); a non-finite norm reported everywhere with nothing clipped; the lists of sessions
 * agreeing across ranks; errors the same on every rank with nothing changed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

#define N_SESSIONS 5
#define NONE       (-1)

typedef struct param_spec {
    const char *path;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[2];
} param_spec;

/* One session of the layout: which world ranks (of a world of 4) are its group. */
typedef struct session_spec {
    unsigned members; /* bit r: world rank r */
    seldp_norm_kind kind;
    size_t n_params;
    param_spec params[2];
} session_spec;

/* The shared weights over every rank; experts replicated over groups of 3 and of 1; a
 * tensor sharded over two ranks under one path; an empty selection. */
static const session_spec LAYOUT[N_SESSIONS] = {
    {0xf,
     SELDP_NORM_REPLICATED,
     2,
     {{"shared.b", SELDP_BF16, 1, {5, 0}}, {"shared.w", SELDP_F32, 2, {3, 4}}}},
    {0x7, SELDP_NORM_REPLICATED, 1, {{"experts.0.w", SELDP_F16, 2, {4, 2}}}},
    {0x8, SELDP_NORM_REPLICATED, 1, {{"experts.1.w", SELDP_F32, 1, {6, 0}}}},
    {0x6, SELDP_NORM_SHARDED, 1, {{"tp.w", SELDP_F32, 2, {2, 3}}}},
    {0x9, SELDP_NORM_REPLICATED, 0, {{0}}},
};

/* A gradient of nobody's selection, which the calls must leave alone. */
static const param_spec LOCAL = {"local.only", SELDP_F32, 1, {3, 0}};

typedef struct scenario {
    int n;         /* world size, 1..4: the layout restricted to ranks < n */
    bool clip;     /* seldp_clip_grad_norm, else seldp_grad_norm */
    double factor; /* max_norm = factor * the reference norm */
    /* deviations, NONE when absent */
    int bad_value_rank; /* puts `bad_value` into element 1 of every gradient of that rank */
    float bad_value;
    int omit_rank; /* leaves session `omit_session` out of its list */
    int omit_session;
    int kind_rank;          /* lists the sharded session as replicated */
    int other_call_rank;    /* calls the other function */
    int max_norm_rank;      /* passes twice the max_norm */
    int bad_shape_rank;     /* its gradient of shared.w has shape [4, 3] */
    int twice_rank;         /* lists its first session twice */
    bool frozen;            /* shared.b is frozen, yet has gradients */
    bool empty;             /* every rank lists no session (odd ranks pass parts NULL) */
    bool fp32;              /* gradients in F32 for every parameter (the FP32 reductions) */
    bool overlap;           /* a second session over the world selects shared.w too */
    seldp_status expect;    /* SELDP_OK, or the error every rank must return */
    const char *needles[2]; /* in the error message */
    outcome out;
} scenario;

static scenario base(int n)
{
    scenario s = {.n = n,
                  .bad_value_rank = NONE,
                  .omit_rank = NONE,
                  .kind_rank = NONE,
                  .other_call_rank = NONE,
                  .max_norm_rank = NONE,
                  .bad_shape_rank = NONE,
                  .twice_rank = NONE,
                  .expect = SELDP_OK};
    return s;
}

static bool is_member(const session_spec *s, int rank, int n)
{
    return rank < n && (s->members >> rank & 1u);
}

/* Group rank of `rank` in session s: members are ordered by world rank. */
static int group_rank(const session_spec *s, int rank)
{
    int g = 0;
    for (int r = 0; r < rank; r++)
        g += (int)(s->members >> r & 1u);
    return g;
}

static int group_size(const session_spec *s, int n)
{
    int size = 0;
    for (int r = 0; r < n; r++)
        size += (int)(s->members >> r & 1u);
    return size;
}

/* Seed of the gradient of parameter p of session i held by group rank g: replicas hold
 * the same values, shards their own. */
static uint64_t grad_seed(size_t i, size_t p, int g)
{
    uint64_t seed = 100 + 10 * i + p;
    return LAYOUT[i].kind == SELDP_NORM_SHARDED ? seed + 1000 * (uint64_t)(g + 1) : seed;
}

/* The dtype of the gradients of p in scenario sc. */
static seldp_dtype grad_dtype(const scenario *sc, const param_spec *p)
{
    return sc->fp32 ? SELDP_F32 : p->dtype;
}

static size_t numel(const param_spec *p)
{
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++)
        n *= (size_t)p->shape[d];
    return n;
}

/* The norm computed by hand in double: each replicated tensor once, each shard once. */
static double reference_norm(const scenario *sc)
{
    double sum = 0.0;
    unsigned char buf[256];
    if (sc->empty)
        return 0.0;
    for (size_t i = 0; i < N_SESSIONS; i++) {
        const session_spec *s = &LAYOUT[i];
        int size = group_size(s, sc->n);
        if (size == 0)
            continue;
        for (size_t p = 0; p < s->n_params; p++) {
            const param_spec *ps = &s->params[p];
            int copies = s->kind == SELDP_NORM_SHARDED ? size : 1;
            for (int g = 0; g < copies; g++) {
                ct_fill(grad_dtype(sc, ps), buf, numel(ps), grad_seed(i, p, g));
                for (size_t e = 0; e < numel(ps); e++) {
                    double x = ct_get(grad_dtype(sc, ps), buf, e);
                    sum += x * x;
                }
            }
        }
    }
    return sqrt(sum);
}

typedef struct rank_state {
    test_model m;
    test_grads g;
    seldp_comm *comms[N_SESSIONS];
    seldp_session *sessions[N_SESSIONS];
    seldp_session *overlap; /* sc->overlap: over the world, selecting shared.w */
    seldp_norm_part parts[N_SESSIONS + 2];
    size_t n_parts;
} rank_state;

/* Build the rank's model, its sessions (one split of the world each) and its gradients. */
static int setup(tr_rank_ctx *ctx, const scenario *sc, rank_state *st)
{
    seldp_param_id next = 1;
    memset(st, 0, sizeof *st);
    RANK_CHECK_OK(ctx, ct_init(&st->m, ctx->rank));
    RANK_CHECK_OK(ctx, tg_init(&st->g));
    for (size_t i = 0; i < N_SESSIONS; i++) {
        const session_spec *s = &LAYOUT[i];
        bool member = is_member(s, ctx->rank, sc->n);
        seldp_param_id ids[2];
        RANK_CHECK_OK(ctx, seldp_comm_split(ctx->world, member ? 0 : SELDP_COMM_NO_GROUP, ctx->rank,
                                            &st->comms[i]));
        if (!member)
            continue;
        for (size_t p = 0; p < s->n_params; p++) {
            const param_spec *ps = &s->params[p];
            bool frozen = sc->frozen && strcmp(ps->path, "shared.b") == 0;
            int64_t shape[2] = {ps->shape[0], ps->shape[1]};
            ids[p] = next++;
            RANK_CHECK_OK(ctx, ct_add(&st->m, ps->path, ids[p], ps->dtype, frozen, 7 + p, ps->ndim,
                                      ps->shape));
            if (ctx->rank == sc->bad_shape_rank && strcmp(ps->path, "shared.w") == 0) {
                shape[0] = ps->shape[1];
                shape[1] = ps->shape[0];
            }
            RANK_CHECK_OK(ctx,
                          tg_put(&st->g, ids[p], grad_dtype(sc, ps), p % 2 == 1,
                                 grad_seed(i, p, group_rank(s, ctx->rank)), ps->ndim, shape, NULL));
        }
    }
    RANK_CHECK_OK(ctx,
                  ct_add(&st->m, LOCAL.path, next, LOCAL.dtype, false, 3, LOCAL.ndim, LOCAL.shape));
    RANK_CHECK_OK(ctx, tg_put(&st->g, next, LOCAL.dtype, false, 5, LOCAL.ndim, LOCAL.shape, NULL));
    for (size_t i = 0; i < N_SESSIONS; i++) {
        const session_spec *s = &LAYOUT[i];
        seldp_param_id ids[2];
        if (!st->comms[i])
            continue;
        for (size_t p = 0; p < s->n_params; p++)
            ids[p] = seldp_model_find_path(st->m.model, s->params[p].path)->id;
        RANK_CHECK_OK(ctx, seldp_session_initialize(st->comms[i], st->m.model, 0, ids, s->n_params,
                                                    NULL, &st->sessions[i]));
        if (sc->empty || (ctx->rank == sc->omit_rank && (int)i == sc->omit_session))
            continue;
        st->parts[st->n_parts++] = (seldp_norm_part){
            st->sessions[i], st->g.grads,
            ctx->rank == sc->kind_rank && s->kind == SELDP_NORM_SHARDED ? SELDP_NORM_REPLICATED
                                                                        : s->kind};
    }
    if (sc->overlap) {
        seldp_param_id id = seldp_model_find_path(st->m.model, "shared.w")->id;
        RANK_CHECK_OK(
            ctx, seldp_session_initialize(ctx->world, st->m.model, 0, &id, 1, NULL, &st->overlap));
        st->parts[st->n_parts++] =
            (seldp_norm_part){st->overlap, st->g.grads, SELDP_NORM_REPLICATED};
    }
    if (ctx->rank == sc->twice_rank && st->n_parts > 0)
        st->parts[st->n_parts++] = st->parts[0];
    if (ctx->rank == sc->bad_value_rank)
        for (size_t k = 0; k < seldp_grads_count(st->g.grads); k++) {
            seldp_param_id id;
            const seldp_tensor *t;
            seldp_grads_at(st->g.grads, k, &id, &t);
            if (seldp_tensor_numel(t) > 1)
                ct_set(t->dtype, t->data, 1, sc->bad_value);
        }
    return 0;
}

static void teardown(rank_state *st)
{
    seldp_session_destroy(st->overlap);
    for (size_t i = 0; i < N_SESSIONS; i++) {
        seldp_session_destroy(st->sessions[i]);
        seldp_comm_destroy(st->comms[i]);
    }
    tg_free(&st->g);
    ct_free(&st->m);
}

/* Every selected gradient holds its original values times coef (as the library rounds
 * them: F32 products, halves rounded to nearest even); the local gradient is untouched. */
static int check_scaled(tr_rank_ctx *ctx, const scenario *sc, rank_state *st, double coef)
{
    unsigned char want[256];
    for (size_t i = 0; i < N_SESSIONS; i++) {
        const session_spec *s = &LAYOUT[i];
        if (!st->sessions[i])
            continue;
        for (size_t p = 0; p < s->n_params; p++) {
            const param_spec *ps = &s->params[p];
            const seldp_tensor *t =
                seldp_grads_get(st->g.grads, seldp_model_find_path(st->m.model, ps->path)->id);
            RANK_CHECK(ctx, t, "'%s' lost its gradient", ps->path);
            seldp_dtype dtype = grad_dtype(sc, ps);
            ct_fill(dtype, want, numel(ps), grad_seed(i, p, group_rank(s, ctx->rank)));
            for (size_t e = 0; e < numel(ps); e++)
                ct_set(dtype, want, e,
                       (double)(float)((double)(float)ct_get(dtype, want, e) * coef));
            RANK_CHECK(ctx, memcmp(t->data, want, seldp_tensor_nbytes(t)) == 0,
                       "'%s' is not its gradient scaled by %.17g (first difference at byte %zu)",
                       ps->path, coef, tr_first_diff(t->data, want, seldp_tensor_nbytes(t)));
        }
    }
    {
        const seldp_tensor *t =
            seldp_grads_get(st->g.grads, seldp_model_find_path(st->m.model, LOCAL.path)->id);
        ct_fill(LOCAL.dtype, want, numel(&LOCAL), 5);
        RANK_CHECK(ctx, t && memcmp(t->data, want, seldp_tensor_nbytes(t)) == 0,
                   "the unselected gradient '%s' changed", LOCAL.path);
    }
    return 0;
}

static int rank_norm(tr_rank_ctx *ctx)
{
    scenario *sc = ctx->arg;
    rank_state st;
    grads_snapshot before;
    seldp_grad_norm_result res = {-1.0, true, true, -1.0};
    double ref, max_norm;
    bool clip;
    seldp_status got;
    char why[256] = "";

    if (setup(ctx, sc, &st))
        return 1;
    ref = reference_norm(sc);
    max_norm = sc->factor * ref * (ctx->rank == sc->max_norm_rank ? 2.0 : 1.0);
    clip = sc->clip != (ctx->rank == sc->other_call_rank);
    gs_take(&before, st.g.grads);
    {
        const seldp_norm_part *parts = sc->empty && ctx->rank % 2 ? NULL : st.parts;
        if (sc->empty)
            max_norm = 1.0;
        got = clip ? seldp_clip_grad_norm(ctx->world, parts, st.n_parts, max_norm, &res)
                   : seldp_grad_norm(ctx->world, parts, st.n_parts, &res);
    }
    if (sc->expect != SELDP_OK) {
        outcome_record(&sc->out, ctx->rank, got);
        sc->out.unchanged[ctx->rank] = gs_same(&before, st.g.grads, why, sizeof why);
        snprintf(sc->out.why[ctx->rank], sizeof sc->out.why[ctx->rank], "%s", why);
        RANK_CHECK(ctx, res.norm == -1.0, "*out was written on error");
    } else {
        RANK_CHECK(ctx, got == SELDP_OK, "returned %s: %s", seldp_status_name(got),
                   seldp_last_error());
        /* field by field: the struct's padding bytes are not part of the result */
        const double fields[4] = {res.norm, (double)res.found_inf, (double)res.clipped,
                                  res.clip_coef};
        RANK_CHECK(ctx, same_everywhere(ctx->world, fields, sizeof fields),
                   "the result is not bit-identical on every rank");
        if (sc->bad_value_rank != NONE && !isfinite(sc->bad_value)) {
            RANK_CHECK(ctx, res.found_inf && !isfinite(res.norm) && !res.clipped,
                       "a non-finite gradient gave norm %g, found_inf %d, clipped %d", res.norm,
                       res.found_inf, res.clipped);
            RANK_CHECK(ctx, gs_same(&before, st.g.grads, why, sizeof why),
                       "gradients changed under a non-finite norm: %s", why);
        } else {
            RANK_CHECK(ctx, !res.found_inf && fabs(res.norm - ref) <= 1e-12 * fmax(ref, 1e-300),
                       "norm %.17g, expected %.17g (computed by hand)", res.norm, ref);
            if (clip && max_norm / (ref + 1e-6) < 1.0) {
                double coef = max_norm / (res.norm + 1e-6);
                RANK_CHECK(ctx, res.clipped && res.clip_coef == coef,
                           "clipped %d by %.17g, not %.17g", res.clipped, res.clip_coef, coef);
                if (check_scaled(ctx, sc, &st, coef))
                    return 1;
                /* the clipped gradient's norm is max_norm, up to the roundings */
                RANK_CHECK_OK(ctx, seldp_grad_norm(ctx->world, st.parts, st.n_parts, &res));
                RANK_CHECK(ctx, fabs(res.norm - max_norm) <= 1e-2 * max_norm,
                           "after clipping to %g the norm is %g", max_norm, res.norm);
            } else {
                RANK_CHECK(ctx, !res.clipped && res.clip_coef == 1.0,
                           "clipped %d by %g with nothing to clip", res.clipped, res.clip_coef);
                RANK_CHECK(ctx, gs_same(&before, st.g.grads, why, sizeof why),
                           "gradients changed without clipping: %s", why);
            }
        }
    }
    gs_free(&before);
    teardown(&st);
    return 0;
}

static void run(scenario *sc)
{
    memset(&sc->out, 0, sizeof sc->out);
    tr_run_ranks(sc->n, TEST_TIMEOUT_S, rank_norm, sc);
    if (sc->expect != SELDP_OK)
        expect_same_failure(&sc->out, sc->n, sc->expect, sc->needles[0], sc->needles[1]);
}

static void norm_counts_each_replica_set_and_shard_once(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        scenario sc = base(n);
        run(&sc);
    }
}

static void norm_of_nothing_is_zero(void **state)
{
    (void)state;
    /* empty lists on every rank: a norm of 0, and clipping by 1 / 1e-6 does nothing */
    for (int n = 1; n <= 3; n++) {
        scenario sc = base(n);
        sc.empty = true;
        run(&sc);
        sc.clip = true;
        run(&sc);
    }
}

static void clip_scales_every_selected_gradient(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        scenario sc = base(n);
        sc.clip = true;
        sc.factor = 0.25;
        run(&sc);
    }
}

static void fp32_gradients_of_half_parameters_count_and_clip(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n += 2) {
        scenario sc = base(n);
        sc.fp32 = true;
        run(&sc);
        sc.clip = true;
        sc.factor = 0.25;
        run(&sc);
    }
}

static void clip_above_the_norm_changes_nothing(void **state)
{
    (void)state;
    scenario sc = base(4);
    sc.clip = true;
    sc.factor = 1.5;
    run(&sc);
}

static void nonfinite_norm_is_found_everywhere_and_clips_nothing(void **state)
{
    (void)state;
    const float values[] = {NAN, INFINITY, -INFINITY};
    for (size_t v = 0; v < 3; v++) {
        /* world rank 3 alone counts experts.1.w (a group of one) */
        scenario sc = base(4);
        sc.clip = true;
        sc.factor = 0.25;
        sc.bad_value_rank = 3;
        sc.bad_value = values[v];
        run(&sc);
        /* world rank 0 counts the shared weights: every rank sees it */
        sc.bad_value_rank = 0;
        run(&sc);
    }
}

static void lists_of_sessions_must_agree(void **state)
{
    (void)state;
    scenario sc = base(4);
    /* world rank 2, a member of experts.0's group, leaves it out */
    sc.omit_rank = 2;
    sc.omit_session = 1;
    sc.expect = SELDP_ERR_DISAGREE;
    sc.needles[0] = "experts.0.w";
    sc.needles[1] = "list";
    run(&sc);

    sc = base(4);
    sc.kind_rank = 2;
    sc.expect = SELDP_ERR_DISAGREE;
    sc.needles[0] = "tp.w";
    sc.needles[1] = "sharded";
    run(&sc);

    sc = base(3);
    sc.clip = true;
    sc.factor = 0.5;
    sc.other_call_rank = 1;
    sc.expect = SELDP_ERR_DISAGREE;
    sc.needles[0] = "seldp_grad_norm";
    sc.needles[1] = "seldp_clip_grad_norm";
    run(&sc);

    sc = base(2);
    sc.clip = true;
    sc.factor = 0.5;
    sc.max_norm_rank = 1;
    sc.expect = SELDP_ERR_DISAGREE;
    sc.needles[0] = "max_norm";
    run(&sc);
}

static void bad_input_fails_on_every_rank_and_changes_nothing(void **state)
{
    (void)state;
    scenario sc = base(4);
    sc.clip = true;
    sc.factor = 0.25;
    sc.bad_shape_rank = 2;
    sc.expect = SELDP_ERR_SHAPE;
    sc.needles[0] = "world rank 2";
    sc.needles[1] = "shared.w";
    run(&sc);

    sc = base(3);
    sc.twice_rank = 1;
    sc.expect = SELDP_ERR_INVALID_ARGUMENT;
    sc.needles[0] = "world rank 1";
    sc.needles[1] = "same session";
    run(&sc);

    sc = base(4);
    sc.overlap = true;
    sc.expect = SELDP_ERR_DUPLICATE;
    sc.needles[0] = "'shared.w' is selected by parts 0 and";
    run(&sc);

    sc = base(3);
    sc.frozen = true;
    sc.expect = SELDP_ERR_FROZEN;
    sc.needles[0] = "shared.b";
    run(&sc);

    sc = base(2);
    sc.clip = true;
    sc.factor = -1.0;
    sc.expect = SELDP_ERR_INVALID_ARGUMENT;
    sc.needles[0] = "max_norm";
    run(&sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(norm_counts_each_replica_set_and_shard_once),
        cmocka_unit_test(norm_of_nothing_is_zero),
        cmocka_unit_test(clip_scales_every_selected_gradient),
        cmocka_unit_test(fp32_gradients_of_half_parameters_count_and_clip),
        cmocka_unit_test(clip_above_the_norm_changes_nothing),
        cmocka_unit_test(nonfinite_norm_is_found_everywhere_and_clips_nothing),
        cmocka_unit_test(lists_of_sessions_must_agree),
        cmocka_unit_test(bad_input_fails_on_every_rank_and_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
