/* Sessions over the MPI transport, one process per rank: initialize broadcasts the root's
 * parameters, a reduce with uneven weights gives every rank the same weighted mean (bit
 * for bit the host transport's), and validation or gradient errors return the same
 * status on every rank and leave the caller's model and gradients unchanged. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_test.h"
#include "ranks.h"

#define TIMEOUT_S 10.0
#define N_SEL     3

/* ---- one rank's model and gradients ------------------------------------------------ */

typedef struct rank_model {
    seldp_model *model;
    float a[12];     /* shared.a.weight [4, 3] */
    float b[6];      /* shared.b.bias [5], or [6] when the rank disagrees */
    uint16_t c[6];   /* shared.c.norm [6] BF16 */
    double table[8]; /* local.table [rank + 1], never selected */
    seldp_param_id ids[N_SEL];
    seldp_grads *grads;
    float ga[12], gb[6];
    uint16_t gc[6];
    double gtable[8];
} rank_model;

#define RESULT_BYTES (sizeof(float) * 12 + sizeof(float) * 5 + sizeof(uint16_t) * 6)

static void fill_bf16(uint16_t *x, size_t n, uint64_t seed)
{
    float tmp[16];
    tr_fill_f32(tmp, n, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = seldp_f32_to_bf16(tmp[i]);
}

/* The model of `rank`: ParamIds differ between ranks (matching is by path); values are
 * rank-dependent. With `disagree`, rank 1 registers shared.b.bias with 6 elements. */
static seldp_status model_build(rank_model *m, int rank, int n, bool disagree)
{
    memset(m, 0, sizeof *m);
    seldp_status st = seldp_model_create(rank, &m->model);
    if (st != SELDP_OK)
        return st;
    tr_fill_f32(m->a, 12, 100u + (uint64_t)rank);
    tr_fill_f32(m->b, 6, 200u + (uint64_t)rank);
    fill_bf16(m->c, 6, 300u + (uint64_t)rank);
    tr_fill_bytes(m->table, sizeof(double) * ((size_t)rank + 1), 400u + (uint64_t)rank);
    m->ids[0] = 10u + (uint64_t)rank;
    m->ids[1] = 20u + (uint64_t)(n - rank);
    m->ids[2] = 30u;
    int64_t sa[2] = {4, 3}, sb[1] = {disagree && rank == 1 ? 6 : 5}, sc[1] = {6};
    int64_t st_[1] = {rank + 1};
    seldp_tensor ta = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, m->a, 2, sa);
    seldp_tensor tb = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, m->b, 1, sb);
    seldp_tensor tc = seldp_tensor_view(SELDP_BF16, SELDP_HOST_DEVICE, m->c, 1, sc);
    seldp_tensor tt = seldp_tensor_view(SELDP_F64, SELDP_HOST_DEVICE, m->table, 1, st_);
    if ((st = seldp_model_add(m->model, "shared.b.bias", m->ids[1], &tb, false, NULL)) ||
        (st = seldp_model_add(m->model, "local.table", 40, &tt, false, NULL)) ||
        (st = seldp_model_add(m->model, "shared.c.norm", m->ids[2], &tc, false, NULL)) ||
        (st = seldp_model_add(m->model, "shared.a.weight", m->ids[0], &ta, false, NULL)))
        return st;
    return SELDP_OK;
}

/* Borrowed gradients of every selected parameter (except shared.a.weight when `skip_a`)
 * and of the unselected local.table. */
static seldp_status grads_build(rank_model *m, int rank, bool skip_a)
{
    seldp_status st = seldp_grads_create(&m->grads);
    if (st != SELDP_OK)
        return st;
    tr_fill_f32(m->ga, 12, 1000u + (uint64_t)rank);
    tr_fill_f32(m->gb, 5, 2000u + (uint64_t)rank);
    fill_bf16(m->gc, 6, 3000u + (uint64_t)rank);
    tr_fill_bytes(m->gtable, sizeof(double) * ((size_t)rank + 1), 4000u + (uint64_t)rank);
    int64_t sa[2] = {4, 3}, sb[1] = {5}, sc[1] = {6}, st_[1] = {rank + 1};
    seldp_tensor ta = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, m->ga, 2, sa);
    seldp_tensor tb = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, m->gb, 1, sb);
    seldp_tensor tc = seldp_tensor_view(SELDP_BF16, SELDP_HOST_DEVICE, m->gc, 1, sc);
    seldp_tensor tt = seldp_tensor_view(SELDP_F64, SELDP_HOST_DEVICE, m->gtable, 1, st_);
    if ((!skip_a && (st = seldp_grads_put(m->grads, m->ids[0], &ta, SELDP_BORROWED))) ||
        (st = seldp_grads_put(m->grads, m->ids[1], &tb, SELDP_BORROWED)) ||
        (st = seldp_grads_put(m->grads, m->ids[2], &tc, SELDP_BORROWED)) ||
        (st = seldp_grads_put(m->grads, 40, &tt, SELDP_BORROWED)))
        return st;
    return SELDP_OK;
}

static void model_free(rank_model *m)
{
    seldp_grads_destroy(m->grads);
    seldp_model_destroy(m->model);
}

static uint64_t weight_of(int rank)
{
    return 3u * (uint64_t)rank + 1u; /* uneven: 1, 4, 7, 10 */
}

/* Initialize from the last rank, then reduce; the reduced selected gradients are copied
 * into result (RESULT_BYTES). Returns the first failing status. */
static seldp_status init_and_reduce(seldp_comm *comm, rank_model *m, unsigned char *result,
                                    uint64_t *global_weight)
{
    int rank = seldp_comm_rank(comm), n = seldp_comm_size(comm);
    seldp_session *session = NULL;
    seldp_status st =
        seldp_session_initialize(comm, m->model, n - 1, m->ids, N_SEL, NULL, &session);
    if (st == SELDP_OK)
        st = grads_build(m, rank, false);
    if (st == SELDP_OK)
        st = seldp_session_reduce(session, m->grads, weight_of(rank), SELDP_MISSING_ERROR,
                                  global_weight);
    if (st == SELDP_OK) {
        const seldp_tensor *a = seldp_grads_get(m->grads, m->ids[0]);
        const seldp_tensor *b = seldp_grads_get(m->grads, m->ids[1]);
        const seldp_tensor *c = seldp_grads_get(m->grads, m->ids[2]);
        if (!a || !b || !c)
            st = SELDP_ERR_NOT_FOUND;
        else {
            memcpy(result, a->data, 48);
            memcpy(result + 48, b->data, 20);
            memcpy(result + 68, c->data, 12);
        }
    }
    seldp_session_destroy(session);
    return st;
}

/* ---- the same layout on the host transport ------------------------------------------ */

typedef struct host_run {
    unsigned char result[RESULT_BYTES]; /* host rank 0's */
} host_run;

static int host_rank(tr_rank_ctx *ctx)
{
    host_run *run = ctx->arg;
    rank_model m;
    unsigned char result[RESULT_BYTES];
    uint64_t global = 0;
    RANK_CHECK_OK(ctx, model_build(&m, ctx->rank, ctx->size, false));
    RANK_CHECK_OK(ctx, init_and_reduce(ctx->world, &m, result, &global));
    if (ctx->rank == 0)
        memcpy(run->result, result, RESULT_BYTES);
    model_free(&m);
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void assert_ok(seldp_status st)
{
    if (st != SELDP_OK)
        fail_msg("rank %d: %s: %s", mt_rank, seldp_status_name(st), seldp_last_error());
}

static void test_initialize_and_reduce_with_uneven_weights(void **state)
{
    (void)state;
    int n = mt_size, root = n - 1;
    seldp_comm *world = mt_world(TIMEOUT_S);
    rank_model m;
    unsigned char result[RESULT_BYTES];
    uint64_t global = 0;
    assert_ok(model_build(&m, mt_rank, n, false));
    double table[8];
    memcpy(table, m.table, sizeof table);
    assert_ok(init_and_reduce(world, &m, result, &global));

    /* Initialize wrote the root's values; the unselected table is untouched. */
    rank_model want;
    assert_ok(model_build(&want, root, n, false));
    assert_memory_equal(m.a, want.a, sizeof(float) * 12);
    assert_memory_equal(m.b, want.b, sizeof(float) * 5);
    assert_memory_equal(m.c, want.c, sizeof m.c);
    assert_memory_equal(m.table, table, sizeof table);
    model_free(&want);

    /* The weighted mean sum_r g_r / sum_r w_r. */
    uint64_t total = 0;
    for (int r = 0; r < n; r++)
        total += weight_of(r);
    assert_int_equal(global, total);
    double ea[12] = {0}, eb[5] = {0}, ec[6] = {0};
    for (int r = 0; r < n; r++) {
        float ga[12], gb[5], gc32[6];
        uint16_t gc[6];
        tr_fill_f32(ga, 12, 1000u + (uint64_t)r);
        tr_fill_f32(gb, 5, 2000u + (uint64_t)r);
        fill_bf16(gc, 6, 3000u + (uint64_t)r);
        seldp_half_to_f32(SELDP_BF16, gc, gc32, 6);
        for (int i = 0; i < 12; i++)
            ea[i] += ga[i];
        for (int i = 0; i < 5; i++)
            eb[i] += gb[i];
        for (int i = 0; i < 6; i++)
            ec[i] += gc32[i];
    }
    const float *ra = (const float *)result, *rb = (const float *)(result + 48);
    float rc[6];
    seldp_half_to_f32(SELDP_BF16, (const uint16_t *)(result + 68), rc, 6);
    for (int i = 0; i < 12; i++)
        assert_true(fabs(ra[i] - ea[i] / (double)total) <= 1e-6 * (fabs(ea[i]) + 1.0));
    for (int i = 0; i < 5; i++)
        assert_true(fabs(rb[i] - eb[i] / (double)total) <= 1e-6 * (fabs(eb[i]) + 1.0));
    for (int i = 0; i < 6; i++)
        assert_true(fabs(rc[i] - ec[i] / (double)total) <= 1e-2 * (fabs(ec[i] / total) + 1e-3));
    /* The unselected gradient passed through untouched. */
    assert_ptr_equal(seldp_grads_get(m.grads, 40)->data, m.gtable);
    double gtable[8];
    tr_fill_bytes(gtable, sizeof(double) * ((size_t)mt_rank + 1), 4000u + (uint64_t)mt_rank);
    assert_memory_equal(m.gtable, gtable, sizeof(double) * ((size_t)mt_rank + 1));

    /* Replicas are bit-identical, and equal to the same layout on the host transport. */
    assert_true(mt_same_everywhere(world, result, RESULT_BYTES));
    host_run run;
    tr_run_ranks(n, TIMEOUT_S, host_rank, &run);
    assert_memory_equal(result, run.result, RESULT_BYTES);

    model_free(&m);
    seldp_comm_destroy(world);
}

static void test_validation_failure_on_every_rank(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    rank_model m, before;
    assert_ok(model_build(&m, mt_rank, mt_size, true));
    memcpy(&before, &m, sizeof m);
    seldp_session *session = NULL;
    seldp_status st = seldp_session_initialize(world, m.model, 0, m.ids, N_SEL, NULL, &session);
    mt_expect_everywhere(world, st, SELDP_ERR_SCHEMA, "shared.b.bias");
    assert_null(session);
    assert_memory_equal(m.a, before.a, sizeof m.a);
    assert_memory_equal(m.b, before.b, sizeof m.b);
    assert_memory_equal(m.c, before.c, sizeof m.c);
    model_free(&m);
    seldp_comm_destroy(world);
}

static void test_missing_gradient_on_every_rank(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    rank_model m;
    assert_ok(model_build(&m, mt_rank, mt_size, false));
    seldp_session *session = NULL;
    assert_ok(seldp_session_initialize(world, m.model, 0, m.ids, N_SEL, NULL, &session));
    assert_ok(grads_build(&m, mt_rank, mt_rank == 0));
    float ga[12], gb[6];
    memcpy(ga, m.ga, sizeof ga);
    memcpy(gb, m.gb, sizeof gb);
    size_t count = seldp_grads_count(m.grads);
    seldp_status st =
        seldp_session_reduce(session, m.grads, weight_of(mt_rank), SELDP_MISSING_ERROR, NULL);
    mt_expect_everywhere(world, st, SELDP_ERR_MISSING_GRADIENT, "shared.a.weight");
    assert_int_equal(seldp_grads_count(m.grads), count);
    assert_memory_equal(m.ga, ga, sizeof ga);
    assert_memory_equal(m.gb, gb, sizeof gb);
    /* The session and the world still work. */
    assert_ok(seldp_comm_barrier(world));
    seldp_session_destroy(session);
    model_free(&m);
    seldp_comm_destroy(world);
}

/* The last rank comes to seldp_session_sum after the others' timeout: every rank returns
 * SELDP_ERR_TIMEOUT with a message that names the user's call, the rank that had not
 * arrived, and no internal collective of the session. */
static void test_a_late_rank_is_named_in_the_call(void **state)
{
    (void)state;
    const double timeout = 0.5;
    int last = mt_size - 1;
    seldp_comm *world = mt_world(timeout);
    rank_model m;
    seldp_session *session = NULL;
    char message[1024] = "", late[32];
    snprintf(late, sizeof late, "rank %d", last);
    seldp_status built = model_build(&m, mt_rank, mt_size, false);
    seldp_status init = built;
    if (built == SELDP_OK)
        init = seldp_session_initialize(world, m.model, 0, m.ids, N_SEL, NULL, &session);
    if (init == SELDP_OK)
        init = grads_build(&m, mt_rank, false);
    if (mt_rank == last) {
        struct timespec ts = {1, 500 * 1000 * 1000}; /* past the timeout and the census */
        nanosleep(&ts, NULL);
    }
    seldp_status st = init != SELDP_OK
                          ? init
                          : seldp_session_sum(session, m.grads, true, SELDP_MISSING_ERROR, NULL);
    snprintf(message, sizeof message, "%s", seldp_last_error());
    seldp_session_destroy(session);
    seldp_comm_destroy(world);
    if (built == SELDP_OK)
        model_free(&m);

    assert_int_equal(init, SELDP_OK);
    if (st != SELDP_ERR_TIMEOUT)
        fail_msg("rank %d: returned %s: %s", mt_rank, seldp_status_name(st), message);
    if (strncmp(message, "seldp_session_sum: ", 19) != 0)
        fail_msg("rank %d: the message does not start with the public call: %s", mt_rank, message);
    if (strstr(message, "allgather") || strstr(message, "allreduce"))
        fail_msg("rank %d: the message names an internal collective: %s", mt_rank, message);
    if (mt_rank != last && !strstr(message, late))
        fail_msg("rank %d: the message does not name %s: %s", mt_rank, late, message);
    if (mt_rank == last && !strstr(message, "aborted"))
        fail_msg("rank %d: the late rank's message does not say the world was aborted: %s", mt_rank,
                 message);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_initialize_and_reduce_with_uneven_weights),
        MT_TEST(test_validation_failure_on_every_rank),
        MT_TEST(test_missing_gradient_on_every_rank),
        MT_TEST(test_a_late_rank_is_named_in_the_call),
    };
    return mt_main(argc, argv, "mpi_session", tests, sizeof tests / sizeof *tests);
}
