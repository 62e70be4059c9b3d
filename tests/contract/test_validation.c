/* Contract of initialize's collective validation (docs/library.md, Initialize): every listed
 * defect, on any one rank, makes every rank of the group return the same status and the same
 * message, naming the first offending path and the ranks; nobody blocks; no parameter is written;
 * and the communicator stays usable for the next collective. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

typedef enum defect {
    DUPLICATE_ID,     /* an id selected twice */
    ABSENT_ID,        /* a selected id the local model lacks */
    WRONG_DEVICE,     /* a selected parameter on another device */
    INT_SELECTED,     /* an integer buffer selected by plain initialize */
    BOOL_SELECTED,    /* a bool buffer selected by plain initialize */
    F64_SELECTED,     /* an f64 parameter selected */
    F64_WITH_BUFFERS, /* an f64 parameter selected by initialize_with_buffers */
    EXTRA_PATH,       /* one rank selects a path the root does not */
    MISSING_PATH,     /* one rank does not select a path the root does */
    DTYPE_DIFFERS,    /* same path, another dtype */
    SHAPE_DIFFERS,    /* same path, another shape */
    ALIAS_DIFFERS,    /* lm_head.weight untied on one rank */
    FROZEN_DIFFERS,   /* frozen flag differs */
    ROOT_OUTSIDE,     /* every rank passes root = size */
    ROOT_NEGATIVE,    /* every rank passes root = -1 */
    ROOT_DIFFERS,     /* one rank passes another root */
    CALL_DIFFERS,     /* one rank calls initialize_with_buffers */
    BUCKET_DIFFERS,   /* one rank passes another bucket size */
    FINITE_DIFFERS,   /* one rank asks for the finiteness check */
    STAGED_DIFFERS,   /* one rank asks for staged commits */
    BUCKET_ZERO,      /* every rank passes bucket_bytes 0 */
    NULL_MODEL,       /* one rank passes no model */
    TWO_FAILURES,     /* the lower failing rank's status and message win */
    TWO_PATHS_DIFFER, /* the lexicographically first differing path is named */
    ALL_RANKS_DIFFER  /* every rank that differs is listed */
} defect;

typedef struct vcase {
    defect defect;
    int bad; /* the rank with the defect */
    outcome o;
} vcase;

/* Build the rank's model and selection with the case's defect applied. */
static seldp_status build(const vcase *c, int rank, int size, test_model *m, seldp_param_id *ids,
                          size_t *n_ids, int *root, bool *with_buffers, seldp_session_config *cfg,
                          bool *no_model)
{
    bool bad = rank == c->bad;
    seldp_status st;
    *root = 0;
    *with_buffers = false;
    *no_model = false;
    *cfg = (seldp_session_config)SELDP_SESSION_CONFIG_INIT;
    if ((st = ct_init(m, rank)) != SELDP_OK)
        return st;
    for (size_t k = 0; k < STD_N; k++) {
        seldp_dtype dtype = STD[k].dtype;
        seldp_device device = SELDP_HOST_DEVICE;
        int64_t shape[2] = {STD[k].shape[0], STD[k].shape[1]};
        bool frozen = STD[k].frozen;
        const char *path = STD[k].path;
        if (bad && c->defect == DTYPE_DIFFERS && strcmp(path, "layers.0.norm.weight") == 0)
            dtype = SELDP_F16;
        if (bad && (c->defect == SHAPE_DIFFERS || c->defect == ALL_RANKS_DIFFER) &&
            strcmp(path, "final_norm.weight") == 0)
            shape[0] = 5;
        if (rank != 0 && c->defect == ALL_RANKS_DIFFER && strcmp(path, "final_norm.weight") == 0)
            shape[0] = 5;
        if (bad && c->defect == TWO_PATHS_DIFFER && strcmp(path, "final_norm.weight") == 0)
            dtype = SELDP_BF16;
        if (rank != 0 && c->defect == TWO_PATHS_DIFFER &&
            strcmp(path, "layers.0.router.weight") == 0)
            shape[1] = 3;
        if (bad && c->defect == FROZEN_DIFFERS && strcmp(path, "frozen.scale") == 0)
            frozen = false;
        if (bad && c->defect == WRONG_DEVICE && strcmp(path, "final_norm.weight") == 0)
            device = (seldp_device){SELDP_DEVICE_CUDA, 0};
        if ((st = ct_add_on(m, device, path, std_id(rank, k), dtype, frozen, std_seed(rank, k),
                            STD[k].ndim, shape)) != SELDP_OK)
            return st;
    }
    if (bad && c->defect == ALIAS_DIFFERS)
        st = ct_add(m, "lm_head.weight", 50, SELDP_F32, false, 3, 2, SHAPE(8, 4));
    else
        st = ct_tie(m, "lm_head.weight", "embed.weight");
    if (st != SELDP_OK)
        return st;
    if ((st = ct_add(m, "aaa.qweight", 60, SELDP_U8, true, 4, 1, SHAPE(16))) != SELDP_OK ||
        (st = ct_add(m, "aaa.mask", 61, SELDP_BOOL, true, 5, 1, SHAPE(16))) != SELDP_OK ||
        (st = ct_add(m, "aaa.table", 62, SELDP_F64, false, 6, 1, SHAPE(4))) != SELDP_OK ||
        (st = ct_add(m, "layers.0.extra", 63, SELDP_F32, false, 7, 1, SHAPE(4))) != SELDP_OK)
        return st;

    std_selection(rank, ids);
    *n_ids = STD_N;
    if (!bad && !(c->defect == TWO_FAILURES && rank == c->bad - 1))
        goto common;
    switch (c->defect) {
    case DUPLICATE_ID:
        ids[3] = ids[1];
        break;
    case ABSENT_ID:
        ids[2] = 9999;
        break;
    case INT_SELECTED:
        ids[(*n_ids)++] = 60;
        break;
    case BOOL_SELECTED:
        ids[(*n_ids)++] = 61;
        break;
    case F64_SELECTED:
    case F64_WITH_BUFFERS:
        ids[(*n_ids)++] = 62;
        break;
    case EXTRA_PATH:
        ids[(*n_ids)++] = 63;
        break;
    case MISSING_PATH:
        for (size_t i = 0; i < STD_N; i++)
            if (ids[i] == std_id(rank, 1)) /* final_norm.weight */
                ids[i] = ids[--*n_ids];
        break;
    case ALIAS_DIFFERS:
        ids[(*n_ids)++] = 50;
        break;
    case ROOT_DIFFERS:
        *root = 1;
        break;
    case CALL_DIFFERS:
        *with_buffers = true;
        break;
    case BUCKET_DIFFERS:
        cfg->bucket_bytes = 64;
        break;
    case FINITE_DIFFERS:
        cfg->check_finite = true;
        break;
    case STAGED_DIFFERS:
        cfg->staged_commit = true;
        break;
    case NULL_MODEL:
        *no_model = true;
        break;
    case TWO_FAILURES:
        if (bad)
            ids[2] = 9999;
        else
            ids[3] = ids[1];
        break;
    default:
        break;
    }
common:
    if (c->defect == ROOT_OUTSIDE)
        *root = size;
    if (c->defect == ROOT_NEGATIVE)
        *root = -1;
    if (c->defect == BUCKET_ZERO)
        cfg->bucket_bytes = 0;
    if (c->defect == F64_WITH_BUFFERS)
        *with_buffers = true;
    return SELDP_OK;
}

static int rank_validation(tr_rank_ctx *ctx)
{
    vcase *c = ctx->arg;
    test_model m, fresh;
    seldp_param_id ids[STD_N + 2];
    size_t n_ids = 0;
    int root;
    bool with_buffers, no_model;
    seldp_session_config cfg;
    seldp_session *s = (seldp_session *)&s; /* must come back NULL */
    seldp_status st;
    char why[256];

    RANK_CHECK_OK(ctx, build(c, ctx->rank, ctx->size, &m, ids, &n_ids, &root, &with_buffers, &cfg,
                             &no_model));
    ct_snapshot(&m);
    if (with_buffers)
        st = seldp_session_initialize_with_buffers(ctx->world, no_model ? NULL : m.model, root, ids,
                                                   n_ids, &cfg, &s);
    else
        st = seldp_session_initialize(ctx->world, no_model ? NULL : m.model, root, ids, n_ids, &cfg,
                                      &s);
    outcome_record(&c->o, ctx->rank, st);
    c->o.unchanged[ctx->rank] = ct_unchanged(&m, c->o.why[ctx->rank], sizeof c->o.why[0]);
    if (s != NULL) {
        c->o.unchanged[ctx->rank] = false;
        snprintf(c->o.why[ctx->rank], sizeof c->o.why[0], "*out is not NULL after a failure");
        if (st == SELDP_OK)
            seldp_session_destroy(s);
    }
    ct_free(&m);

    /* The group is still in step: a correct initialize right after succeeds everywhere. */
    RANK_CHECK_OK(ctx, ct_init(&fresh, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&fresh, ctx->rank));
    std_selection(ctx->rank, ids);
    s = NULL;
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, fresh.model, 0, ids, STD_N, NULL, &s));
    RANK_CHECK(ctx, std_holds_root(&fresh, 0, 0, why, sizeof why), "%s", why);
    seldp_session_destroy(s);
    ct_free(&fresh);
    return 0;
}

/* Run `defect` on n = 2..4 ranks with the defect on rank bad(n) and check the outcome. */
static void run_defect(defect d, seldp_status expected, const char *needle1, bool name_bad_rank)
{
    for (int n = 2; n <= 4; n++) {
        vcase c;
        char rank_needle[64];
        memset(&c, 0, sizeof c);
        c.defect = d;
        c.bad = n - 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_validation, &c);
        snprintf(rank_needle, sizeof rank_needle, "group rank %d", c.bad);
        expect_same_failure(&c.o, n, expected, needle1, name_bad_rank ? rank_needle : NULL);
    }
}

static void duplicate_id(void **state)
{
    (void)state;
    run_defect(DUPLICATE_ID, SELDP_ERR_DUPLICATE, "selected twice", true);
}

static void absent_id(void **state)
{
    (void)state;
    run_defect(ABSENT_ID, SELDP_ERR_NOT_FOUND, "9999", true);
}

static void parameter_on_another_device(void **state)
{
    (void)state;
    run_defect(WRONG_DEVICE, SELDP_ERR_DEVICE, "final_norm.weight", true);
}

static void integer_buffer_rejected_by_initialize(void **state)
{
    (void)state;
    run_defect(INT_SELECTED, SELDP_ERR_DTYPE, "aaa.qweight", true);
}

static void bool_buffer_rejected_by_initialize(void **state)
{
    (void)state;
    run_defect(BOOL_SELECTED, SELDP_ERR_DTYPE, "aaa.mask", true);
}

static void f64_rejected(void **state)
{
    (void)state;
    run_defect(F64_SELECTED, SELDP_ERR_DTYPE, "'aaa.table' is f64", true);
    run_defect(F64_WITH_BUFFERS, SELDP_ERR_DTYPE, "'aaa.table' is f64", true);
}

static void extra_path(void **state)
{
    (void)state;
    run_defect(EXTRA_PATH, SELDP_ERR_SCHEMA, "'layers.0.extra'", true);
}

static void missing_path(void **state)
{
    (void)state;
    run_defect(MISSING_PATH, SELDP_ERR_SCHEMA, "'final_norm.weight'", true);
}

static void dtype_differs(void **state)
{
    (void)state;
    run_defect(DTYPE_DIFFERS, SELDP_ERR_SCHEMA, "dtype f16", true);
}

static void shape_differs(void **state)
{
    (void)state;
    run_defect(SHAPE_DIFFERS, SELDP_ERR_SCHEMA, "shape [5]", true);
}

static void alias_topology_differs(void **state)
{
    (void)state;
    /* the first path whose alias set differs is the tied group's first path */
    run_defect(ALIAS_DIFFERS, SELDP_ERR_SCHEMA, "at 'embed.weight': group rank", true);
    run_defect(ALIAS_DIFFERS, SELDP_ERR_SCHEMA,
               "has alias set {'embed.weight'} (untied: its own ParamId), root (group rank 0, "
               "world rank 0) has alias set {'embed.weight', 'lm_head.weight'}",
               true);
}

static void frozen_flag_differs(void **state)
{
    (void)state;
    run_defect(FROZEN_DIFFERS, SELDP_ERR_SCHEMA, "'frozen.scale'", true);
}

static void root_outside_group(void **state)
{
    (void)state;
    run_defect(ROOT_OUTSIDE, SELDP_ERR_INVALID_ARGUMENT, "outside the group", false);
    run_defect(ROOT_NEGATIVE, SELDP_ERR_INVALID_ARGUMENT, "root -1", false);
}

static void root_differs(void **state)
{
    (void)state;
    run_defect(ROOT_DIFFERS, SELDP_ERR_DISAGREE, "root", true);
}

static void initialize_and_with_buffers_mixed(void **state)
{
    (void)state;
    run_defect(CALL_DIFFERS, SELDP_ERR_DISAGREE, "seldp_session_initialize_with_buffers", true);
}

static void bucket_size_differs(void **state)
{
    (void)state;
    run_defect(BUCKET_DIFFERS, SELDP_ERR_DISAGREE, "bucket_bytes", true);
    /* settings that change the outcome must agree too */
    run_defect(FINITE_DIFFERS, SELDP_ERR_DISAGREE,
               "seldp_session_initialize: ranks disagree on cfg.check_finite", true);
    run_defect(STAGED_DIFFERS, SELDP_ERR_DISAGREE, "cfg.staged_commit", true);
    run_defect(BUCKET_ZERO, SELDP_ERR_INVALID_ARGUMENT, "bucket_bytes", false);
}

static void null_model_on_one_rank(void **state)
{
    (void)state;
    run_defect(NULL_MODEL, SELDP_ERR_INVALID_ARGUMENT, "model", true);
}

static void lowest_failing_rank_wins(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++) {
        vcase c;
        char needle[64];
        memset(&c, 0, sizeof c);
        c.defect = TWO_FAILURES;
        c.bad = n - 1;
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_validation, &c);
        snprintf(needle, sizeof needle, "group rank %d", n - 2);
        expect_same_failure(&c.o, n, SELDP_ERR_DUPLICATE, needle, "selected twice");
    }
}

static void first_differing_path_is_named(void **state)
{
    (void)state;
    /* the last rank differs at final_norm.weight (dtype) and layers.0.router.weight
     * (shape), the other non-root ranks at the router only */
    run_defect(TWO_PATHS_DIFFER, SELDP_ERR_SCHEMA, "at 'final_norm.weight'", true);
}

static void every_differing_rank_is_listed(void **state)
{
    (void)state;
    vcase c;
    memset(&c, 0, sizeof c);
    c.defect = ALL_RANKS_DIFFER;
    c.bad = 3;
    tr_run_ranks(4, TEST_TIMEOUT_S, rank_validation, &c);
    expect_same_failure(&c.o, 4, SELDP_ERR_SCHEMA, "differing from root here: 1,2,3",
                        "'final_norm.weight'");
}

static void null_arguments_fail_locally(void **state)
{
    (void)state;
    seldp_session *s = NULL;
    assert_int_equal(seldp_session_initialize(NULL, NULL, 0, NULL, 0, NULL, &s),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_int_equal(seldp_session_reduce(NULL, NULL, 1, SELDP_MISSING_ERROR, NULL),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_session_size(NULL), 0);
}

/* A rank that never arrives: the others' initialize ends with the transport's timeout
 * instead of hanging, and writes nothing. Likewise for a reduction. */
typedef struct absent_arg {
    bool in_reduce;
    seldp_status st[MAX_RANKS];
    bool unchanged[MAX_RANKS];
    char why[MAX_RANKS][256];
} absent_arg;

static int rank_absent(tr_rank_ctx *ctx)
{
    absent_arg *a = ctx->arg;
    bool absent = ctx->rank == ctx->size - 1;
    test_model m;
    test_grads g;
    grads_snapshot before;
    seldp_session *s = NULL;
    seldp_param_id ids[STD_N];

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, std_model(&m, ctx->rank));
    std_selection(ctx->rank, ids);
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, std_put_grad(&g, ctx->rank, 0, SELDP_F32, false, NULL));
    if (a->in_reduce)
        RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, ids, STD_N, NULL, &s));
    ct_snapshot(&m);
    gs_take(&before, g.grads);
    if (!absent) {
        if (a->in_reduce)
            a->st[ctx->rank] = seldp_session_reduce(s, g.grads, 1, SELDP_MISSING_ZERO, NULL);
        else
            a->st[ctx->rank] =
                seldp_session_initialize(ctx->world, m.model, 0, ids, STD_N, NULL, &s);
        a->unchanged[ctx->rank] = ct_unchanged(&m, a->why[ctx->rank], sizeof a->why[0]) &&
                                  gs_same(&before, g.grads, a->why[ctx->rank], sizeof a->why[0]);
    }
    gs_free(&before);
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void absent_rank_times_out_without_writes(void **state)
{
    (void)state;
    for (int in_reduce = 0; in_reduce <= 1; in_reduce++) {
        for (int n = 2; n <= 3; n++) {
            absent_arg a;
            memset(&a, 0, sizeof a);
            a.in_reduce = in_reduce;
            tr_run_ranks(n, 0.5, rank_absent, &a);
            for (int r = 0; r < n - 1; r++) {
                if (a.st[r] != SELDP_ERR_TIMEOUT && a.st[r] != SELDP_ERR_ABORTED)
                    fail_msg("rank %d returned %s, expected a timeout", r,
                             seldp_status_name(a.st[r]));
                if (!a.unchanged[r])
                    fail_msg("rank %d: %s", r, a.why[r]);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(duplicate_id),
        cmocka_unit_test(absent_id),
        cmocka_unit_test(parameter_on_another_device),
        cmocka_unit_test(integer_buffer_rejected_by_initialize),
        cmocka_unit_test(bool_buffer_rejected_by_initialize),
        cmocka_unit_test(f64_rejected),
        cmocka_unit_test(extra_path),
        cmocka_unit_test(missing_path),
        cmocka_unit_test(dtype_differs),
        cmocka_unit_test(shape_differs),
        cmocka_unit_test(alias_topology_differs),
        cmocka_unit_test(frozen_flag_differs),
        cmocka_unit_test(root_outside_group),
        cmocka_unit_test(root_differs),
        cmocka_unit_test(initialize_and_with_buffers_mixed),
        cmocka_unit_test(bucket_size_differs),
        cmocka_unit_test(null_model_on_one_rank),
        cmocka_unit_test(lowest_failing_rank_wins),
        cmocka_unit_test(first_differing_path_is_named),
        cmocka_unit_test(every_differing_rank_is_listed),
        cmocka_unit_test(null_arguments_fail_locally),
        cmocka_unit_test(absent_rank_times_out_without_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
