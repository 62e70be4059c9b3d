/* The runner of the sessions' bad-input matrices (bad_session_common.h): a rank's input
 * built from the standard layout and spoiled by the row, the call, and the main thread's
 * checks of what every rank saw; and the helpers and spoilers the matrices share. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "bad_session_common.h"

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

#define WORLD_TIMEOUT_S 20.0
/* A row that takes this long has waited on something: no call here should. */
#define ROW_LIMIT_S 5.0

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

/* Element i of the gradient of STD[k], as a double. */
double grad_at(plan *p, size_t k, size_t i)
{
    const seldp_tensor *t = seldp_grads_get(p->g.grads, std_id(p->rank, k));
    return t ? ct_get(t->dtype, t->data, i) : NAN;
}

/* --- spoilers and checks more than one matrix uses ---------------------------------- */

void empty_selection(plan *p)
{
    p->n_ids = 0;
    p->null_ids = true;
}

void select_empty(plan *p)
{
    p->empty_param = true;
    p->ids[p->n_ids++] = ID_EMPTY;
}

void nothing(plan *p)
{
    (void)p;
}

/* Every reduced gradient finite, and the unselected one untouched. */
bool all_finite(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before, char *why,
                size_t size)
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

/* Only the unselected gradient is left (zero global weight, or no active rank). */
bool only_unselected(plan *p, seldp_session *s, uint64_t w, const grads_snapshot *before, char *why,
                     size_t size)
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

/* Run every row on its own world; the main thread checks what each rank saw (check_row). */
void bs_run_matrix(const row *matrix, size_t n_rows)
{
    int by_status[SELDP_ERR_INTERNAL + 1] = {0};
    for (size_t i = 0; i < n_rows; i++) {
        row_run run;
        char why[1200];
        memset(&run, 0, sizeof run);
        run.row = &matrix[i];
        if (tr_run_ranks_status(matrix[i].ranks, WORLD_TIMEOUT_S, rank_row, &run, why, sizeof why))
            fail_msg("%s: %s", matrix[i].name, why);
        check_row(&run);
        by_status[matrix[i].expected]++;
        if (getenv("SELDP_TEST_VERBOSE"))
            printf("  %-58s %-27s %s\n", matrix[i].name, seldp_status_name(run.out[0].st),
                   run.out[0].msg);
    }
    printf("  %zu rows:", n_rows);
    for (int s = 0; s <= SELDP_ERR_INTERNAL; s++)
        if (by_status[s])
            printf(" %s %d", seldp_status_name((seldp_status)s), by_status[s]);
    printf("\n");
}
