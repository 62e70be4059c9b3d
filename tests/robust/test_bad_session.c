/* The bad-input matrix of sessions (docs/library.md): initialize and the four reductions fed
 * null, zero-length, out-of-range, inconsistent and non-finite input, one row per case.
 *
 * Every row runs on its own host world. Each rank starts from the contract tests' standard
 * layout (tests/contract), the row spoils the input of one rank (or of every rank), and the
 * main thread then checks, for every rank: the documented status; for a collective error the
 * same message on every rank, naming the offending rank, the path and what was expected;
 * the caller's model and gradient container byte-identical when the call failed (snapshots
 * taken before it); the call back well before the transport's timeout (no hang); and the
 * group still in step afterwards (a barrier). Rows that succeed check their results.
 *
 * Non-finite gradients: without seldp_session_config.check_finite they are not detected and
 * propagate (NaN stays NaN, Inf stays Inf, Inf - Inf gives NaN) into every rank's result;
 * with it, the reduction fails with SELDP_ERR_NONFINITE naming the first non-finite path of
 * the lowest failing rank. Inactive ranks' and unselected gradients are never inspected. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "contract.h"

#define WORLD_TIMEOUT_S 20.0
/* A row that takes this long has waited on something: no call here should. */
#define ROW_LIMIT_S 5.0
#define ALL         (-1) /* every rank's input is spoiled */
#define NONE        (-2) /* no rank's input is spoiled */

typedef enum call {
    INIT,
    INIT_BUFFERS,
    REDUCE,
    REDUCE_FP32,
    SUM,
    SUM_FP32,
} call;

static const char *const call_names[] = {
    "initialize", "initialize_with_buffers", "reduce", "reduce_fp32", "sum", "sum_fp32"};

/* Ids of the parameters registered beside the standard layout on every rank. */
enum {
    ID_QWEIGHT = 60, /* aaa.qweight: U8 [16], an integer buffer (not frozen) */
    ID_TABLE = 62,   /* aaa.table: F64 [4] */
    ID_HEAD_A = 70,  /* head.a: F32 [4] */
    ID_HEAD_B = 71,  /* head.b: F32 [4], tied to head.a on a spoiled rank (ALIAS rows) */
    ID_EMPTY = 80,   /* empty.weight: F32 [0], no storage, selected by zero-length rows */
    ID_UNSELECTED = 999
};

/* A change to one standard parameter as the spoiled rank registers it. */
typedef struct std_change {
    const char *path; /* the STD path changed on the spoiled rank, or NULL */
    seldp_dtype dtype;
    int64_t dim0;
    int frozen; /* -1: as STD */
    bool cuda;
} std_change;

/* Everything one rank passes. Built with the defaults, then spoiled by the row. */
typedef struct plan {
    int rank, size;
    bool bad; /* this rank's input is the row's spoiled one */
    test_model m;
    /* initialize */
    call init_call;
    bool null_comm, null_out, null_model, null_ids;
    int root;
    seldp_param_id ids[STD_N + 4];
    size_t n_ids;
    seldp_session_config cfg;
    const std_change *change; /* applied to the spoiled rank's model, or NULL */
    bool tie_heads;           /* head.b registered as an alias of head.a */
    bool untie_head;          /* lm_head.weight registered with its own id and storage */
    bool empty_param;         /* empty.weight registered (and selected) */
    int empty_ndim;           /* its shape: [0] or [0, 4] */
    bool no_snapshot;         /* gradients not snapshotted (verify must not use `before`) */
    /* the reduction */
    call reduce_call;
    bool null_session, null_grads;
    uint64_t weight; /* the local weight; for sum, nonzero means active */
    int policy;
    test_grads g;
} plan;

typedef struct row row;

/* Spoil (or adjust) one rank's plan; p->bad says whether it is the row's spoiled rank. */
typedef void (*apply_fn)(plan *p);

/* Extra checks of a row that succeeds, on the rank thread: true when the results are right,
 * else false with why set. `s` is the session; `before` the gradients before the call. */
typedef bool (*verify_fn)(plan *p, seldp_session *s, uint64_t global_weight,
                          const grads_snapshot *before, char *why, size_t size);

struct row {
    const char *name;
    int ranks;      /* group size */
    call call;      /* what every rank calls */
    call bad_call;  /* what the spoiled rank calls instead (== call: the same) */
    int bad;        /* the spoiled rank, ALL or NONE */
    apply_fn apply; /* NULL: the defaults */
    seldp_status expected;
    const char *needles[3]; /* in every rank's message (NULL: none) */
    bool same_message;      /* the message is identical on every rank */
    verify_fn verify;       /* rows that succeed: NULL or a check of the results */
};

/* What a rank saw. */
typedef struct rank_out {
    seldp_status st;
    char msg[1024];
    bool intact;
    char why[512];
    double elapsed;
    bool in_step; /* the barrier after the call succeeded */
} rank_out;

typedef struct row_run {
    const row *row;
    rank_out out[MAX_RANKS];
} row_run;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool is_reduction(call c)
{
    return c >= REDUCE;
}

/* --- building a rank's input ----------------------------------------------------- */

static seldp_status build_model(plan *p)
{
    const std_change *change = p->change;
    seldp_status st = ct_init(&p->m, p->rank);
    for (size_t k = 0; st == SELDP_OK && k < STD_N; k++) {
        seldp_dtype dtype = STD[k].dtype;
        int64_t shape[2] = {STD[k].shape[0], STD[k].shape[1]};
        bool frozen = STD[k].frozen;
        seldp_device device = SELDP_HOST_DEVICE;
        if (change && change->path && p->bad && strcmp(change->path, STD[k].path) == 0) {
            if (change->dtype != SELDP_DTYPE_COUNT)
                dtype = change->dtype;
            if (change->dim0 > 0)
                shape[0] = change->dim0;
            if (change->frozen >= 0)
                frozen = change->frozen;
            if (change->cuda)
                device = (seldp_device){SELDP_DEVICE_CUDA, 0};
        }
        st = ct_add_on(&p->m, device, STD[k].path, std_id(p->rank, k), dtype, frozen,
                       std_seed(p->rank, k), STD[k].ndim, shape);
    }
    if (st != SELDP_OK)
        return st;
    if (p->untie_head)
        st = ct_add(&p->m, "lm_head.weight", 50, SELDP_F32, false, 3, 2, SHAPE(8, 4));
    else
        st = ct_tie(&p->m, "lm_head.weight", "embed.weight");
    if (st == SELDP_OK)
        st = ct_add(&p->m, "aaa.qweight", ID_QWEIGHT, SELDP_U8, false, 4, 1, SHAPE(16));
    if (st == SELDP_OK)
        st = ct_add(&p->m, "aaa.table", ID_TABLE, SELDP_F64, false, 6, 1, SHAPE(4));
    if (st == SELDP_OK)
        st = ct_add(&p->m, "head.a", ID_HEAD_A, SELDP_F32, false, 8, 1, SHAPE(4));
    if (st == SELDP_OK && p->tie_heads)
        st = ct_tie(&p->m, "head.b", "head.a");
    else if (st == SELDP_OK)
        st = ct_add(&p->m, "head.b", ID_HEAD_B, SELDP_F32, false, 9, 1, SHAPE(4));
    if (st == SELDP_OK && p->empty_param) {
        /* zero elements: no storage at all */
        seldp_tensor t =
            seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, NULL, p->empty_ndim, SHAPE(0, 4));
        st = seldp_model_add(p->m.model, "empty.weight", ID_EMPTY, &t, false, NULL);
    }
    return st;
}

/* The trainable standard gradients in their parameter's dtype (borrowed on even ranks,
 * owned on odd ones) and one unselected gradient. */
static seldp_status build_grads(plan *p)
{
    static const size_t trainable[] = {0, 1, 3, 4};
    seldp_status st = tg_init(&p->g);
    for (size_t j = 0; st == SELDP_OK && j < 4; j++)
        st = std_put_grad(&p->g, p->rank, trainable[j], STD[trainable[j]].dtype, p->rank % 2, NULL);
    if (st == SELDP_OK)
        st = tg_put(&p->g, ID_UNSELECTED, SELDP_F32, true, 11, 1, SHAPE(5), NULL);
    return st;
}

static void plan_defaults(plan *p, const row *r, int rank)
{
    memset(p, 0, sizeof *p);
    p->rank = rank;
    p->size = r->ranks;
    p->bad = r->bad == ALL || r->bad == rank;
    p->init_call = INIT;
    p->cfg = (seldp_session_config)SELDP_SESSION_CONFIG_INIT;
    p->cfg.bucket_bytes = 64; /* several buckets per call */
    std_selection(rank, p->ids);
    p->n_ids = STD_N;
    p->reduce_call = is_reduction(r->call) ? r->call : REDUCE;
    p->weight = 2 + (uint64_t)rank;
    p->policy = SELDP_MISSING_ERROR;
    p->empty_ndim = 1;
}

/* Replace the gradient of `id` by one of another dtype, shape or device. */
static seldp_status regrad(plan *p, seldp_param_id id, seldp_dtype dtype, int ndim,
                           const int64_t *shape, bool cuda)
{
    seldp_grads_remove(p->g.grads, id);
    if (cuda) {
        static float bytes[MAX_RANKS][8]; /* never read: rejected by the descriptor */
        seldp_tensor t = seldp_tensor_view(SELDP_F32, (seldp_device){SELDP_DEVICE_CUDA, 0},
                                           bytes[p->rank], ndim, shape);
        return seldp_grads_put(p->g.grads, id, &t, SELDP_BORROWED);
    }
    return tg_put(&p->g, id, dtype, false, 77 + (uint64_t)p->rank, ndim, shape, NULL);
}

/* Element i of the gradient of STD[k], as a double. */
static double grad_at(plan *p, size_t k, size_t i)
{
    const seldp_tensor *t = seldp_grads_get(p->g.grads, std_id(p->rank, k));
    return t ? ct_get(t->dtype, t->data, i) : NAN;
}

static void set_grad(plan *p, size_t k, size_t i, double value)
{
    const seldp_tensor *t = seldp_grads_get(p->g.grads, std_id(p->rank, k));
    if (t)
        ct_set(t->dtype, t->data, i, value);
}

/* --- the rows' spoilers ------------------------------------------------------------ */

static void null_comm(plan *p)
{
    p->null_comm = true;
}
static void null_out(plan *p)
{
    p->null_out = true;
}
static void null_model(plan *p)
{
    p->null_model = p->bad;
}
static void null_ids(plan *p)
{
    p->null_ids = p->bad;
}
static void empty_selection(plan *p)
{
    p->n_ids = 0;
    p->null_ids = true;
}
static void root_outside(plan *p)
{
    p->root = p->size;
}
static void root_negative(plan *p)
{
    p->root = -1;
}
static void root_differs(plan *p)
{
    p->root = p->bad ? p->size - 1 : 0;
}
static void duplicate_id(plan *p)
{
    if (p->bad)
        p->ids[3] = p->ids[1];
}
static void absent_id(plan *p)
{
    if (p->bad)
        p->ids[2] = 9999;
}
static void select_qweight(plan *p)
{
    if (p->bad || p->init_call == INIT_BUFFERS)
        p->ids[p->n_ids++] = ID_QWEIGHT;
}
static void select_table(plan *p)
{
    if (p->bad)
        p->ids[p->n_ids++] = ID_TABLE;
}
static void select_heads(plan *p)
{
    p->tie_heads = p->bad;
    p->ids[p->n_ids++] = ID_HEAD_A;
    if (!p->bad)
        p->ids[p->n_ids++] = ID_HEAD_B;
}
static void untie_lm_head(plan *p)
{
    p->untie_head = p->bad;
    if (p->bad)
        p->ids[p->n_ids++] = 50;
}
static void extra_path(plan *p)
{
    if (p->bad)
        p->ids[p->n_ids++] = ID_HEAD_A;
}
static void bucket_zero(plan *p)
{
    p->cfg.bucket_bytes = 0;
}
static void bucket_differs(plan *p)
{
    if (p->bad)
        p->cfg.bucket_bytes = 128;
}
static void select_empty(plan *p)
{
    p->empty_param = true;
    p->ids[p->n_ids++] = ID_EMPTY;
}
static void select_empty_shape_differs(plan *p)
{
    select_empty(p);
    p->empty_ndim = p->bad ? 2 : 1;
}

static const std_change dtype_change = {"layers.0.norm.weight", SELDP_F16, 0, -1, false};
static const std_change shape_change = {"final_norm.weight", SELDP_DTYPE_COUNT, 5, -1, false};
static const std_change frozen_change = {"frozen.scale", SELDP_DTYPE_COUNT, 0, 0, false};
static const std_change device_change = {"final_norm.weight", SELDP_DTYPE_COUNT, 0, -1, true};

static void nothing(plan *p)
{
    (void)p;
}
static void dtype_differs(plan *p)
{
    p->change = &dtype_change;
}
static void shape_differs(plan *p)
{
    p->change = &shape_change;
}
static void frozen_differs(plan *p)
{
    p->change = &frozen_change;
}
static void on_another_device(plan *p)
{
    p->change = &device_change;
}

/* reductions: the session is initialized with what these set, then reduces these gradients */
static void null_session(plan *p)
{
    p->null_session = true;
}
static void null_grads(plan *p)
{
    p->null_grads = p->bad;
}
static void policy_invalid(plan *p)
{
    p->policy = 7;
}
static void policy_differs(plan *p)
{
    if (p->bad)
        p->policy = SELDP_MISSING_ZERO;
}
static void missing_grad(plan *p)
{
    if (p->bad)
        seldp_grads_remove(p->g.grads, std_id(p->rank, 1));
}
static void frozen_grad(plan *p)
{
    if (p->bad)
        tg_put(&p->g, std_id(p->rank, 2), SELDP_F32, false, 5, 1, SHAPE(3), NULL);
}
static void wrong_dtype(plan *p)
{
    if (p->bad)
        regrad(p, std_id(p->rank, 3), SELDP_F32, 1, SHAPE(4), false);
}
static void wrong_shape(plan *p)
{
    if (p->bad)
        regrad(p, std_id(p->rank, 1), SELDP_F32, 1, SHAPE(5), false);
}
static void wrong_device(plan *p)
{
    if (p->bad)
        regrad(p, std_id(p->rank, 1), SELDP_F32, 1, SHAPE(4), true);
}
static void buffer_grad(plan *p)
{
    p->init_call = INIT_BUFFERS;
    p->ids[p->n_ids++] = ID_QWEIGHT;
    if (p->bad)
        tg_put(&p->g, ID_QWEIGHT, SELDP_U8, false, 5, 1, SHAPE(16), NULL);
}
static void weight_overflow(plan *p)
{
    p->weight = p->bad ? UINT64_MAX : 1;
}
static void weight_at_max(plan *p)
{
    /* the ranks' weights add up to exactly UINT64_MAX */
    p->weight = p->rank == 0 ? UINT64_MAX - (uint64_t)(p->size - 1) : 1;
}
static void weight_zero_everywhere(plan *p)
{
    p->weight = 0;
}
static void nan_grad(plan *p)
{
    if (p->bad)
        set_grad(p, 1, 2, NAN);
}
static void inf_grad(plan *p)
{
    if (p->bad)
        set_grad(p, 1, 2, INFINITY);
}
static void opposite_infs(plan *p)
{
    if (p->rank == 0 || p->rank == 1)
        set_grad(p, 1, 2, p->rank == 0 ? INFINITY : -INFINITY);
}
static void nan_checked(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad)
        set_grad(p, 4, 5, NAN); /* layers.0.router.weight, F16 */
}
static void inf_checked(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad)
        set_grad(p, 3, 1, -INFINITY); /* layers.0.norm.weight, BF16 */
}
static void nan_checked_two_paths(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad) {
        set_grad(p, 4, 0, NAN);
        set_grad(p, 1, 3, INFINITY); /* final_norm.weight comes first in path order */
    }
}
static void nan_checked_two_ranks(plan *p)
{
    p->cfg.check_finite = true;
    if (p->rank >= 1)
        set_grad(p, p->rank == 1 ? 4 : 0, 0, NAN);
}
static void nan_checked_inactive(plan *p)
{
    p->cfg.check_finite = true;
    if (p->bad) {
        p->weight = 0;
        set_grad(p, 0, 0, NAN);
    }
}
static void nan_checked_unselected(plan *p)
{
    const seldp_tensor *t = seldp_grads_get(p->g.grads, ID_UNSELECTED);
    p->cfg.check_finite = true;
    if (p->bad && t)
        ((float *)t->data)[1] = NAN;
}
static void nan_checked_all_inactive(plan *p)
{
    nan_checked(p);
    p->weight = 0;
}
static void reduce_empty_selection(plan *p)
{
    empty_selection(p);
}
static void grad_of_empty_param(plan *p)
{
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, NULL, 1, SHAPE(0));
    select_empty(p);
    seldp_grads_put(p->g.grads, ID_EMPTY, &t, SELDP_BORROWED);
    /* the contract tests' snapshot copies every entry's bytes, NULL ones too */
    p->no_snapshot = true;
}

/* --- checks of rows that succeed ---------------------------------------------------- */

static bool nothing_selected(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                             char *why, size_t size)
{
    (void)before;
    size_t n = 99;
    (void)w;
    seldp_session_selected(s, &n);
    if (s && n != 0) {
        snprintf(why, size, "%zu ids selected, expected none", n);
        return false;
    }
    return ct_unchanged(&p->m, why, size);
}

/* After initialize, every selected parameter holds the root's values. */
static bool holds_root(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                       char *why, size_t size)
{
    (void)before;
    (void)s;
    (void)w;
    for (size_t k = 0; k < STD_N; k++)
        if (!std_holds_root(&p->m, k, p->root, why, size))
            return false;
    return true;
}

/* Element (k, i) of every rank's result is `want` (NaN: any NaN). */
static bool result_is(plan *p, size_t k, size_t i, double want, char *why, size_t size)
{
    double got = grad_at(p, k, i);
    bool ok = isnan(want) ? isnan(got) : got == want;
    if (!ok)
        snprintf(why, size, "'%s'[%zu] is %g, expected %g", STD[k].path, i, got, want);
    for (size_t j = 0; ok && j < std_numel(k); j++) {
        if (j != i && !isfinite(grad_at(p, k, j))) {
            snprintf(why, size, "'%s'[%zu] is %g: the non-finite value spread", STD[k].path, j,
                     grad_at(p, k, j));
            ok = false;
        }
    }
    return ok;
}

static bool nan_propagated(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                           char *why, size_t size)
{
    (void)before;
    (void)s;
    (void)w;
    return result_is(p, 1, 2, NAN, why, size);
}

static bool inf_propagated(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                           char *why, size_t size)
{
    (void)before;
    (void)s;
    (void)w;
    return result_is(p, 1, 2, INFINITY, why, size);
}

/* Every reduced gradient finite, and the unselected one untouched. */
static bool all_finite(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                       char *why, size_t size)
{
    static const size_t trainable[] = {0, 1, 3, 4};
    const seldp_tensor *u = seldp_grads_get(p->g.grads, ID_UNSELECTED);
    (void)s;
    (void)w;
    for (size_t j = 0; j < 4; j++) {
        size_t k = trainable[j];
        for (size_t i = 0; i < std_numel(k); i++) {
            if (!isfinite(grad_at(p, k, i))) {
                snprintf(why, size, "'%s'[%zu] is %g", STD[k].path, i, grad_at(p, k, i));
                return false;
            }
        }
    }
    if (!u || !gs_entry_same(before, p->g.grads, ID_UNSELECTED)) {
        snprintf(why, size, "the unselected gradient changed");
        return false;
    }
    return true;
}

/* The zero-element gradient is still there, and the others are finite. */
static bool empty_kept(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                       char *why, size_t size)
{
    static const size_t trainable[] = {0, 1, 3, 4};
    const seldp_tensor *t = seldp_grads_get(p->g.grads, ID_EMPTY);
    (void)s;
    (void)w;
    (void)before;
    if (!t || seldp_tensor_numel(t) != 0) {
        snprintf(why, size, "the zero-element gradient is gone");
        return false;
    }
    for (size_t j = 0; j < 4; j++) {
        for (size_t i = 0; i < std_numel(trainable[j]); i++) {
            if (!isfinite(grad_at(p, trainable[j], i))) {
                snprintf(why, size, "'%s'[%zu] is not finite", STD[trainable[j]].path, i);
                return false;
            }
        }
    }
    return true;
}

static bool weight_is_max(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                          char *why, size_t size)
{
    (void)s;
    if (w != UINT64_MAX) {
        snprintf(why, size, "global weight %llu, expected UINT64_MAX", (unsigned long long)w);
        return false;
    }
    return all_finite(p, s, w, before, why, size);
}

/* Only the unselected gradient is left (zero global weight, or no active rank). */
static bool only_unselected(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                            char *why, size_t size)
{
    (void)before;
    (void)s;
    if (w != 0 || seldp_grads_count(p->g.grads) != 1 ||
        !seldp_grads_get(p->g.grads, ID_UNSELECTED)) {
        snprintf(why, size,
                 "global weight %llu and %zu gradients, expected 0 and the unselected "
                 "one only",
                 (unsigned long long)w, seldp_grads_count(p->g.grads));
        return false;
    }
    return true;
}

/* Nothing selected: every gradient as it was; every rank counted active. */
static bool untouched(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before,
                      char *why, size_t size)
{
    (void)s;
    if (w != (uint64_t)p->size) {
        snprintf(why, size, "global weight %llu, expected %d active ranks", (unsigned long long)w,
                 p->size);
        return false;
    }
    return gs_same(before, p->g.grads, why, size);
}

/* A group of one: the mean is the rank's own gradient divided by its weight. */
static bool own_mean(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before, char *why,
                     size_t size)
{
    double ref[64];
    bool include[1] = {true};
    (void)s;
    (void)before;
    if (w != p->weight) {
        snprintf(why, size, "global weight %llu, expected %llu", (unsigned long long)w,
                 (unsigned long long)p->weight);
        return false;
    }
    std_reference(1, SELDP_F32, 1, include, (double)w, ref);
    const seldp_tensor *t = seldp_grads_get(p->g.grads, std_id(0, 1));
    return t && close_to(SELDP_F32, t->data, ref, std_numel(1), 1e-6, why, size);
}

/* --- the matrix ------------------------------------------------------------------------ */

#define ROW(name, ranks, call, bad, apply, expected, n1, n2, n3)                                   \
    {                                                                                              \
        name, ranks, call, call, bad, apply, expected, {n1, n2, n3}, true, NULL                    \
    }
#define ROW_OK(name, ranks, call, bad, apply, verify)                                              \
    {                                                                                              \
        name, ranks, call, call, bad, apply, SELDP_OK, {NULL, NULL, NULL}, true, verify            \
    }

static const row MATRIX[] = {
    /* name                                       ranks call  bad   apply             expected
       needles */
    /* --- initialize: arguments ---------------------------------------------------------------- */
    ROW("initialize: comm NULL", 3, INIT, ALL, null_comm, SELDP_ERR_INVALID_ARGUMENT,
        "seldp_session_initialize", "comm and out must not be NULL", NULL),
    ROW("initialize: out NULL", 3, INIT, ALL, null_out, SELDP_ERR_INVALID_ARGUMENT,
        "seldp_session_initialize", "comm and out must not be NULL", NULL),
    ROW("initialize: model NULL on one rank", 3, INIT, 2, null_model, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 2 (world rank 2)", "model and ids must not be NULL", NULL),
    ROW("initialize: ids NULL with a count", 3, INIT, 1, null_ids, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 1 (world rank 1)", "model and ids must not be NULL", NULL),
    ROW_OK("initialize: zero-length selection (ids NULL)", 3, INIT, ALL, empty_selection,
           nothing_selected),
    ROW("initialize: root = group size", 3, INIT, ALL, root_outside, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0", "root 3 is outside the group of 3 ranks", NULL),
    ROW("initialize: root -1", 3, INIT, ALL, root_negative, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0", "root -1 is outside the group", NULL),
    ROW("initialize: root differs on one rank", 3, INIT, 1, root_differs, SELDP_ERR_DISAGREE,
        "group rank 1 (world rank 1) passed 2", "disagree on the root", NULL),
    ROW_OK("initialize: group of one", 1, INIT, NONE, nothing, holds_root),
    ROW("initialize: group of one, root 1", 1, INIT, ALL, root_outside, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0 (world rank 0)", "root 1 is outside the group of 1 ranks", NULL),
    ROW("initialize: id selected twice", 3, INIT, 2, duplicate_id, SELDP_ERR_DUPLICATE,
        "group rank 2", "is selected twice", NULL),
    ROW("initialize: id absent from the model", 3, INIT, 1, absent_id, SELDP_ERR_NOT_FOUND,
        "group rank 1", "ParamId 9999 is not registered", NULL),
    ROW("initialize: integer buffer selected", 3, INIT, 2, select_qweight, SELDP_ERR_DTYPE,
        "group rank 2", "'aaa.qweight'", "selects F32, F16 and BF16"),
    ROW("initialize: f64 selected", 3, INIT, 0, select_table, SELDP_ERR_DTYPE, "group rank 0",
        "'aaa.table' is f64", "F32, F16 and BF16"),
    ROW("initialize: parameter on another device", 3, INIT, 1, on_another_device, SELDP_ERR_DEVICE,
        "group rank 1", "'final_norm.weight' is on cuda:0", "computes on host"),
    ROW("initialize: dtype differs on one rank", 3, INIT, 2, dtype_differs, SELDP_ERR_SCHEMA,
        "group rank 2", "'layers.0.norm.weight'",
        "dtype f16, root (group rank 0, world rank 0) has dtype bf16"),
    ROW("initialize: shape differs on one rank", 3, INIT, 1, shape_differs, SELDP_ERR_SCHEMA,
        "group rank 1", "'final_norm.weight'",
        "shape [5], root (group rank 0, world rank 0) has shape [4]"),
    ROW("initialize: frozen flag differs on one rank", 3, INIT, 2, frozen_differs, SELDP_ERR_SCHEMA,
        "group rank 2", "'frozen.scale'",
        "it trainable, root (group rank 0, world rank 0) has it frozen"),
    ROW("initialize: alias untied on one rank", 3, INIT, 2, untie_lm_head, SELDP_ERR_SCHEMA,
        "at 'embed.weight': group rank 2", "{'embed.weight', 'lm_head.weight'}",
        "alias set {'embed.weight'} (untied: its own ParamId)"),
    ROW("initialize: alias tied on one rank only", 3, INIT, 1, select_heads, SELDP_ERR_SCHEMA,
        "at 'head.a': group rank 1", "has alias set {'head.a', 'head.b'}, root",
        "has alias set {'head.a'} (untied"),
    ROW("initialize: extra path on one rank", 3, INIT, 2, extra_path, SELDP_ERR_SCHEMA,
        "group rank 2", "'head.a'", "selected on group rank 2 (world rank 2) but not on root"),
    ROW("initialize: bucket_bytes 0", 3, INIT, ALL, bucket_zero, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 0", "cfg.bucket_bytes must be positive", NULL),
    ROW("initialize: bucket_bytes differs on one rank", 3, INIT, 1, bucket_differs,
        SELDP_ERR_DISAGREE, "group rank 1 (world rank 1) passed 128", "cfg.bucket_bytes", NULL),
    {"initialize: one rank calls initialize_with_buffers",
     3,
     INIT,
     INIT_BUFFERS,
     2,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 2 (world rank 2) called seldp_session_initialize_with_buffers",
      "ranks called different functions", NULL},
     true,
     NULL},
    ROW_OK("initialize: zero-element parameter selected", 3, INIT, ALL, select_empty, holds_root),
    ROW("initialize: zero-length shape differs", 3, INIT, 2, select_empty_shape_differs,
        SELDP_ERR_SCHEMA, "group rank 2", "'empty.weight'",
        "shape [0, 4], root (group rank 0, world rank 0) has shape [0]"),
    /* --- reductions: arguments and agreement ----------------------------------------------- */
    ROW("reduce: session NULL", 3, REDUCE, ALL, null_session, SELDP_ERR_INVALID_ARGUMENT,
        "seldp_session_reduce", "session must not be NULL", NULL),
    ROW("sum: grads NULL on one rank", 3, SUM, 1, null_grads, SELDP_ERR_INVALID_ARGUMENT,
        "group rank 1 (world rank 1)", "seldp_session_sum: grads must not be NULL", NULL),
    ROW("reduce_fp32: missing policy 7", 3, REDUCE_FP32, ALL, policy_invalid,
        SELDP_ERR_INVALID_ARGUMENT, "group rank 0", "missing-gradient policy 7 is invalid", NULL),
    ROW("reduce: policy differs on one rank", 3, REDUCE, 2, policy_differs, SELDP_ERR_DISAGREE,
        "group rank 2 (world rank 2) called seldp_session_reduce with policy zero",
        "disagree on the reduction", NULL),
    {"reduce: one rank calls sum",
     3,
     REDUCE,
     SUM,
     2,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 2 (world rank 2) called seldp_session_sum", "disagree on the reduction", NULL},
     true,
     NULL},
    {"reduce: one rank calls reduce_fp32",
     3,
     REDUCE,
     REDUCE_FP32,
     1,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 1 (world rank 1) called seldp_session_reduce_fp32", "disagree on the reduction",
      NULL},
     true,
     NULL},
    {"sum: one rank calls sum_fp32",
     3,
     SUM,
     SUM_FP32,
     0,
     nothing,
     SELDP_ERR_DISAGREE,
     {"group rank 0 (world rank 0) called seldp_session_sum_fp32",
      "group rank 1 (world rank 1) called seldp_session_sum", NULL},
     true,
     NULL},
    /* the calls' agreement records differ in size: the transport itself refuses */
    {"initialize: one rank calls reduce instead",
     3,
     INIT,
     REDUCE,
     1,
     nothing,
     SELDP_ERR_DISAGREE,
     {"the agreement of the call failed: ", "rank 1", NULL},
     false,
     NULL},
    /* --- reductions: gradients ------------------------------------------------------------ */
    ROW("reduce: gradient missing on one rank", 3, REDUCE, 2, missing_grad,
        SELDP_ERR_MISSING_GRADIENT, "no gradient on active group rank 2 (world rank 2)",
        "'final_norm.weight'", "missing-gradient policy error"),
    ROW("sum: gradient of a frozen parameter", 3, SUM, 1, frozen_grad, SELDP_ERR_FROZEN,
        "group rank 1", "'frozen.scale' is frozen", "but a gradient was supplied"),
    ROW("reduce: gradient dtype differs", 3, REDUCE, 2, wrong_dtype, SELDP_ERR_DTYPE,
        "group rank 2", "'layers.0.norm.weight'", "gradient dtype f32, expected bf16"),
    ROW("sum_fp32: gradient shape differs", 3, SUM_FP32, 0, wrong_shape, SELDP_ERR_SHAPE,
        "group rank 0", "'final_norm.weight'",
        "gradient shape [5] differs from the parameter's [4]"),
    ROW("reduce: gradient on another device", 3, REDUCE, 1, wrong_device, SELDP_ERR_DEVICE,
        "group rank 1", "'final_norm.weight'",
        "gradient on cuda:0, but the session computes on host"),
    ROW("sum: gradient of an integer buffer", 3, SUM, 2, buffer_grad, SELDP_ERR_DTYPE,
        "group rank 2", "'aaa.qweight'", "never reduced"),
    /* --- reductions: weights ----------------------------------------------------------------- */
    ROW("reduce: u64 weight overflow", 3, REDUCE, 1, weight_overflow, SELDP_ERR_OVERFLOW,
        "group rank 1 (world rank 1) adds 18446744073709551615", "overflows 64 bits", NULL),
    ROW_OK("reduce_fp32: weights summing to UINT64_MAX", 3, REDUCE_FP32, NONE, weight_at_max,
           weight_is_max),
    ROW_OK("reduce: zero global weight", 3, REDUCE, ALL, weight_zero_everywhere, only_unselected),
    ROW_OK("sum_fp32: no active rank", 3, SUM_FP32, ALL, weight_zero_everywhere, only_unselected),
    ROW_OK("reduce: group of one", 1, REDUCE, NONE, nothing, own_mean),
    ROW_OK("sum: zero-length selection", 3, SUM, ALL, reduce_empty_selection, untouched),
    ROW_OK("reduce: zero-element gradient, data NULL", 3, REDUCE, ALL, grad_of_empty_param,
           empty_kept),
    /* --- reductions: non-finite gradients ---------------------------------------------------- */
    ROW_OK("reduce: NaN propagates (check_finite off)", 3, REDUCE, 1, nan_grad, nan_propagated),
    ROW_OK("sum: +Inf propagates (check_finite off)", 3, SUM, 2, inf_grad, inf_propagated),
    ROW_OK("sum_fp32: +Inf and -Inf give NaN (check_finite off)", 3, SUM_FP32, NONE, opposite_infs,
           nan_propagated),
    ROW("reduce: NaN detected (check_finite)", 3, REDUCE, 2, nan_checked, SELDP_ERR_NONFINITE,
        "group rank 2 (world rank 2)",
        "'layers.0.router.weight': the gradient of group rank 2 (world rank 2) is not finite at "
        "element 5 of 8",
        NULL),
    ROW("reduce_fp32: -Inf detected (check_finite)", 3, REDUCE_FP32, 0, inf_checked,
        SELDP_ERR_NONFINITE, "group rank 0 (world rank 0)",
        "'layers.0.norm.weight': the gradient of group rank 0 (world rank 0) is not finite at "
        "element 1 of 4",
        NULL),
    ROW("sum: first non-finite path named (check_finite)", 3, SUM, 1, nan_checked_two_paths,
        SELDP_ERR_NONFINITE, "group rank 1 (world rank 1)",
        "'final_norm.weight': the gradient of group rank 1 (world rank 1) is not finite at element "
        "3 "
        "of 4",
        NULL),
    /* path order before rank order: rank 2's 'embed.weight' before rank 1's router */
    ROW("sum_fp32: first non-finite path named, then its lowest rank (check_finite)", 3, SUM_FP32,
        NONE, nan_checked_two_ranks, SELDP_ERR_NONFINITE, "group rank 2 (world rank 2)",
        "'embed.weight': the gradient of group rank 2 (world rank 2) is not finite at element 0 "
        "of 32",
        NULL),
    ROW("reduce: group of one, NaN detected (check_finite)", 1, REDUCE, 0, nan_checked,
        SELDP_ERR_NONFINITE, "group rank 0 (world rank 0)", "'layers.0.router.weight'",
        "not finite"),
    ROW_OK("reduce: NaN of an inactive rank ignored (check_finite)", 3, REDUCE, 1,
           nan_checked_inactive, all_finite),
    ROW_OK("reduce: NaN of an unselected gradient ignored (check_finite)", 3, REDUCE, 2,
           nan_checked_unselected, all_finite),
    ROW_OK("sum: NaN with no active rank ignored (check_finite)", 3, SUM, ALL,
           nan_checked_all_inactive, only_unselected),
};

#define N_ROWS (sizeof MATRIX / sizeof MATRIX[0])

/* --- running a row ------------------------------------------------------------------------ */

static seldp_status initialize(plan *p, seldp_comm *comm, call c, seldp_session **s)
{
    seldp_comm *cm = p->null_comm ? NULL : comm;
    seldp_model *model = p->null_model ? NULL : p->m.model;
    const seldp_param_id *ids = p->null_ids ? NULL : p->ids;
    seldp_session **out = p->null_out ? NULL : s;
    if (c == INIT_BUFFERS)
        return seldp_session_initialize_with_buffers(cm, model, p->root, ids, p->n_ids, &p->cfg,
                                                     out);
    return seldp_session_initialize(cm, model, p->root, ids, p->n_ids, &p->cfg, out);
}

static seldp_status reduction(plan *p, seldp_session *s, call c, uint64_t *w)
{
    seldp_session *sn = p->null_session ? NULL : s;
    seldp_grads *g = p->null_grads ? NULL : p->g.grads;
    seldp_missing_policy pol = (seldp_missing_policy)p->policy;
    switch (c) {
    case REDUCE:
        return seldp_session_reduce(sn, g, p->weight, pol, w);
    case REDUCE_FP32:
        return seldp_session_reduce_fp32(sn, g, p->weight, pol, w);
    case SUM:
        return seldp_session_sum(sn, g, p->weight != 0, pol, w);
    case SUM_FP32:
        return seldp_session_sum_fp32(sn, g, p->weight != 0, pol, w);
    default:
        return SELDP_ERR_INTERNAL;
    }
}

static int rank_row(tr_rank_ctx *ctx)
{
    row_run *run = ctx->arg;
    const row *r = run->row;
    rank_out *o = &run->out[ctx->rank];
    plan p;
    seldp_session *s = NULL, *first = NULL;
    grads_snapshot before;
    call mine;
    uint64_t w = 12345;
    seldp_status st;
    double t0;
    bool reduction_row = is_reduction(r->call) || is_reduction(r->bad_call);

    plan_defaults(&p, r, ctx->rank);
    mine = p.bad && r->bad != ALL ? r->bad_call : r->call;
    RANK_CHECK_OK(ctx, build_grads(&p));
    r->apply(&p);
    RANK_CHECK_OK(ctx, build_model(&p));
    /* a reduction row reduces over a session initialized cleanly by every rank */
    if (reduction_row)
        RANK_CHECK_OK(ctx, initialize(&p, ctx->world, p.init_call, &first));

    ct_snapshot(&p.m);
    memset(&before, 0, sizeof before);
    if (!p.no_snapshot)
        gs_take(&before, p.g.grads);
    t0 = now_s();
    if (is_reduction(mine))
        st = reduction(&p, first, mine, &w);
    else
        st = initialize(&p, ctx->world, mine, &s);
    o->elapsed = now_s() - t0;
    o->st = st;
    snprintf(o->msg, sizeof o->msg, "%s", seldp_last_error());

    o->intact = true;
    if (st != SELDP_OK) {
        o->intact = ct_unchanged(&p.m, o->why, sizeof o->why) &&
                    gs_same(&before, p.g.grads, o->why, sizeof o->why);
        if (o->intact && s) {
            o->intact = false;
            snprintf(o->why, sizeof o->why, "*out is not NULL after a failure");
        }
    } else if (r->verify) {
        o->intact =
            r->verify(&p, is_reduction(mine) ? first : s, w, &before, o->why, sizeof o->why);
    } else if (is_reduction(mine)) {
        o->intact = ct_unchanged(&p.m, o->why, sizeof o->why);
    }
    /* still in step: the group's next collective works */
    o->in_step = seldp_comm_barrier(ctx->world) == SELDP_OK;

    gs_free(&before);
    seldp_session_destroy(s);
    seldp_session_destroy(first);
    tg_free(&p.g);
    ct_free(&p.m);
    return 0;
}

static void check_row(const row_run *run)
{
    const row *r = run->row;
    for (int k = 0; k < r->ranks; k++) {
        const rank_out *o = &run->out[k];
        if (o->st != r->expected)
            fail_msg("%s: rank %d returned %s, expected %s (message: %s)", r->name, k,
                     seldp_status_name(o->st), seldp_status_name(r->expected), o->msg);
        if (r->expected != SELDP_OK && r->same_message && strcmp(o->msg, run->out[0].msg) != 0)
            fail_msg("%s: rank %d's message differs from rank 0's:\n  %s\n  %s", r->name, k, o->msg,
                     run->out[0].msg);
        for (int n = 0; n < 3 && r->expected != SELDP_OK; n++)
            if (r->needles[n] && !strstr(o->msg, r->needles[n]))
                fail_msg("%s: rank %d's message lacks \"%s\": %s", r->name, k, r->needles[n],
                         o->msg);
        if (!o->intact)
            fail_msg("%s: rank %d: %s", r->name, k, o->why);
        if (o->elapsed > ROW_LIMIT_S)
            fail_msg("%s: rank %d took %.2f s", r->name, k, o->elapsed);
        if (!o->in_step)
            fail_msg("%s: rank %d: the barrier after the call failed", r->name, k);
    }
}

static void bad_input_matrix(void **state)
{
    (void)state;
    int by_status[SELDP_ERR_INTERNAL + 1] = {0};
    for (size_t i = 0; i < N_ROWS; i++) {
        row_run run;
        char why[1200];
        memset(&run, 0, sizeof run);
        run.row = &MATRIX[i];
        if (tr_run_ranks_status(MATRIX[i].ranks, WORLD_TIMEOUT_S, rank_row, &run, why, sizeof why))
            fail_msg("%s: %s", MATRIX[i].name, why);
        check_row(&run);
        by_status[MATRIX[i].expected]++;
        if (getenv("SELDP_TEST_VERBOSE"))
            printf("  %-58s %-27s %s\n", MATRIX[i].name, seldp_status_name(run.out[0].st),
                   run.out[0].msg);
    }
    printf("  %zu rows:", N_ROWS);
    for (int s = 0; s <= SELDP_ERR_INTERNAL; s++)
        if (by_status[s])
            printf(" %s %d", seldp_status_name((seldp_status)s), by_status[s]);
    printf("\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_input_matrix),
    };
    (void)call_names;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
