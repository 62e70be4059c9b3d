/* Sessions called out of step (docs/library.md, Agreement): two or more sessions of one
 * communicator reduced in a different order on different ranks, a call one rank missed, a
 * different session at the same point. Each is SELDP_ERR_DISAGREE on every rank with one
 * message that names the public call, both sessions (by their first paths) and the call
 * counts, and the gradients stay as they were; calls that agree still give the exact sum.
 * And a transport error inside a session call names that call. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

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

#define N_SESSIONS 3
#define MAX_CALLS  8

/* The sessions of every test: the paths each selects (in path order), F32 tensors. */
static const struct {
    const char *paths[2];
    size_t n;
} SESSIONS[N_SESSIONS] = {{{"a"}, 1}, {{"b"}, 1}, {{"c", "d"}, 2}};
static const char *const PATHS[] = {"a", "b", "c", "d"};
static const int64_t EXTENT[] = {4, 8, 4, 3};
#define N_PATHS 4

/* One trial: the session each rank reduces at each call, and what every rank saw. */
typedef struct trial {
    int n, calls;
    int seq[MAX_RANKS][MAX_CALLS];
    seldp_status st[MAX_CALLS][MAX_RANKS];
    char msg[MAX_CALLS][MAX_RANKS][1024];
    bool right[MAX_CALLS][MAX_RANKS]; /* the documented state of the gradients */
    char why[MAX_CALLS][MAX_RANKS][256];
} trial;

static size_t path_index(const char *path)
{
    for (size_t p = 0; p < N_PATHS; p++)
        if (strcmp(PATHS[p], path) == 0)
            return p;
    return 0;
}

/* Rank r's gradient element e at call i: small integers, so every sum is exact. */
static float grad_value(int rank, size_t e, int call)
{
    return (float)((rank + 1) * (int)(e + 1) + 100 * call);
}

/* Which call of its session a rank's i-th call is, from 1. */
static int call_count(const trial *t, int rank, int i)
{
    int count = 1;
    for (int j = 0; j < i; j++)
        count += t->seq[rank][j] == t->seq[rank][i];
    return count;
}

static int rank_trial(tr_rank_ctx *ctx)
{
    trial *t = ctx->arg;
    int me = ctx->rank;
    test_model m;
    seldp_session *s[N_SESSIONS] = {NULL};

    RANK_CHECK_OK(ctx, ct_init(&m, me));
    /* ParamIds differ between ranks; the paths do not */
    for (size_t p = 0; p < N_PATHS; p++)
        RANK_CHECK_OK(ctx, ct_add(&m, PATHS[p], 10 + (p + (size_t)me) % N_PATHS, SELDP_F32, false,
                                  p, 1, SHAPE(EXTENT[p])));
    for (int k = 0; k < N_SESSIONS; k++) {
        seldp_param_id ids[2];
        for (size_t j = 0; j < SESSIONS[k].n; j++)
            ids[j] = ct_find(&m, SESSIONS[k].paths[j])->id;
        RANK_CHECK_OK(
            ctx, seldp_session_initialize(ctx->world, m.model, 0, ids, SESSIONS[k].n, NULL, &s[k]));
    }
    for (int i = 0; i < t->calls; i++) {
        int k = t->seq[me][i];
        test_grads g;
        grads_snapshot before;
        void *data[2];
        RANK_CHECK_OK(ctx, tg_init(&g));
        for (size_t j = 0; j < SESSIONS[k].n; j++) {
            size_t p = path_index(SESSIONS[k].paths[j]);
            RANK_CHECK_OK(ctx, tg_put(&g, ct_find(&m, PATHS[p])->id, SELDP_F32, j % 2, 0, 1,
                                      SHAPE(EXTENT[p]), &data[j]));
            for (int64_t e = 0; e < EXTENT[p]; e++)
                ((float *)data[j])[e] = grad_value(me, (size_t)e, i);
        }
        gs_take(&before, g.grads);
        seldp_status st = seldp_session_sum(s[k], g.grads, true, SELDP_MISSING_ERROR, NULL);
        t->st[i][me] = st;
        snprintf(t->msg[i][me], sizeof t->msg[i][me], "%s", st ? seldp_last_error() : "");
        if (st != SELDP_OK) {
            t->right[i][me] = gs_same(&before, g.grads, t->why[i][me], sizeof t->why[i][me]);
        } else {
            t->right[i][me] = true;
            for (size_t j = 0; j < SESSIONS[k].n && t->right[i][me]; j++) {
                size_t p = path_index(SESSIONS[k].paths[j]);
                const float *x = seldp_grads_get(g.grads, ct_find(&m, PATHS[p])->id)->data;
                for (int64_t e = 0; e < EXTENT[p]; e++) {
                    double want = 0;
                    for (int r = 0; r < t->n; r++)
                        want += grad_value(r, (size_t)e, i);
                    if (x[e] != (float)want) {
                        snprintf(t->why[i][me], sizeof t->why[i][me],
                                 "'%s'[%lld] = %g, expected %g", PATHS[p], (long long)e, x[e],
                                 want);
                        t->right[i][me] = false;
                        break;
                    }
                }
            }
        }
        gs_free(&before);
        tg_free(&g);
    }
    for (int k = 0; k < N_SESSIONS; k++)
        seldp_session_destroy(s[k]);
    ct_free(&m);
    return 0;
}

static void require(const char *msg, const char *needle, const trial *t, int i)
{
    if (!strstr(msg, needle))
        fail_msg("%d ranks, call %d: the message lacks \"%s\": %s", t->n, i, needle, msg);
}

/* Check every call of a run trial against what the calls' agreement implies. */
static void check_trial(const trial *t)
{
    for (int i = 0; i < t->calls; i++) {
        int k0 = t->seq[0][i], c0 = call_count(t, 0, i), other = -1;
        for (int r = 1; r < t->n && other < 0; r++)
            if (t->seq[r][i] != k0 || call_count(t, r, i) != c0)
                other = r;
        for (int r = 0; r < t->n; r++) {
            seldp_status want = other < 0 ? SELDP_OK : SELDP_ERR_DISAGREE;
            if (t->st[i][r] != want)
                fail_msg("%d ranks, call %d: rank %d returned %s, expected %s: %s", t->n, i, r,
                         seldp_status_name(t->st[i][r]), seldp_status_name(want), t->msg[i][r]);
            if (!t->right[i][r])
                fail_msg("%d ranks, call %d, rank %d: gradients not as documented: %s", t->n, i, r,
                         t->why[i][r]);
            if (strcmp(t->msg[i][r], t->msg[i][0]) != 0)
                fail_msg("%d ranks, call %d: rank %d's message differs from rank 0's:\n  %s\n  %s",
                         t->n, i, r, t->msg[i][r], t->msg[i][0]);
        }
        if (other < 0)
            continue;
        const char *msg = t->msg[i][0];
        char needle[160];
        int k1 = t->seq[other][i], c1 = call_count(t, other, i);
        require(msg, "seldp_session_sum", t, i);
        snprintf(needle, sizeof needle, "group rank %d (world rank %d)", other, other);
        require(msg, needle, t, i);
        snprintf(needle, sizeof needle, "'%s'", SESSIONS[k0].paths[0]);
        require(msg, needle, t, i);
        if (k1 != k0) {
            require(msg, "ranks reduce different sessions", t, i);
            snprintf(needle, sizeof needle, "'%s'", SESSIONS[k1].paths[0]);
            require(msg, needle, t, i);
            snprintf(needle, sizeof needle, "(its call %d), group rank %d", c0, other);
            require(msg, needle, t, i);
            snprintf(needle, sizeof needle, "(its call %d);", c1);
            require(msg, needle, t, i);
        } else {
            require(msg, "out of step", t, i);
            snprintf(needle, sizeof needle, "as the session's call %d", c0);
            require(msg, needle, t, i);
            snprintf(needle, sizeof needle, "as its call %d;", c1);
            require(msg, needle, t, i);
        }
    }
}

/* The scenario as first reported: four ranks, sessions of "a" and "b", ranks 0-1 reduce a
 * then b, ranks 2-3 b then a. Both calls fail on every rank; then, in step, both give 10. */
static void two_sessions_in_opposite_orders(void **state)
{
    (void)state;
    trial *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->n = 4;
    t->calls = 4;
    for (int r = 0; r < 4; r++) {
        t->seq[r][0] = r < 2 ? 0 : 1;
        t->seq[r][1] = r < 2 ? 1 : 0;
        t->seq[r][2] = 0;
        t->seq[r][3] = 1;
    }
    tr_run_ranks(4, TEST_TIMEOUT_S, rank_trial, t);
    check_trial(t);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(t->st[0][r], SELDP_ERR_DISAGREE);
        assert_int_equal(t->st[1][r], SELDP_ERR_DISAGREE);
        assert_int_equal(t->st[2][r], SELDP_OK);
        assert_int_equal(t->st[3][r], SELDP_OK);
    }
    require(t->msg[0][0], "called seldp_session_sum on the session of 'a' (1 parameter", t, 0);
    require(t->msg[0][0],
            "group rank 2 (world rank 2) called seldp_session_sum on the session "
            "of 'b' (1 parameter",
            t, 0);
    free(t);
}

/* A rank that missed a call is out of step with the others on that session. */
static void missed_call_is_named_by_its_counts(void **state)
{
    (void)state;
    trial *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->n = 3;
    t->calls = 3;
    /* rank 2 did "b" where the others did "a", then "a" where they did "a" again */
    int seqs[3][3] = {{0, 0, 1}, {0, 0, 1}, {1, 0, 0}};
    for (int r = 0; r < 3; r++)
        memcpy(t->seq[r], seqs[r], sizeof seqs[r]);
    tr_run_ranks(3, TEST_TIMEOUT_S, rank_trial, t);
    check_trial(t);
    /* the second call: all on "a", rank 2 at its first call of it, the others at their second */
    assert_int_equal(t->st[1][0], SELDP_ERR_DISAGREE);
    require(t->msg[1][0], "out of step on the session of 'a' (1 parameter, schema ", t, 1);
    require(t->msg[1][0],
            "group rank 0 (world rank 0) called seldp_session_sum as the session's "
            "call 2, group rank 2 (world rank 2) called seldp_session_sum as its "
            "call 1; a rank missed or added a call",
            t, 1);
    free(t);
}

static uint64_t next(uint64_t *rng)
{
    *rng = *rng * 6364136223846793005u + 1442695040888963407u;
    return *rng >> 33;
}

/* Random orders on 2 to 8 ranks: every rank makes the same number of calls; in most
 * trials some ranks permute theirs, swap two, or put another session in one place. */
static void random_orders(void **state)
{
    (void)state;
    const char *seed_env = getenv("SELDP_TEST_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    trial *t = calloc(1, sizeof *t);
    assert_non_null(t);
    printf("    seed %llu (SELDP_TEST_SEED repeats it)\n", (unsigned long long)seed);
    uint64_t rng = seed;
    for (int n = 2; n <= MAX_RANKS; n++) {
        for (int rep = 0; rep < 6; rep++) {
            memset(t, 0, sizeof *t);
            t->n = n;
            t->calls = 3 + (int)(next(&rng) % (MAX_CALLS - 2));
            for (int i = 0; i < t->calls; i++)
                t->seq[0][i] = (int)(next(&rng) % N_SESSIONS);
            for (int r = 1; r < n; r++)
                memcpy(t->seq[r], t->seq[0], sizeof t->seq[0]);
            int kind = rep % 4; /* 0: in step */
            int odd = 1 + (int)(next(&rng) % (uint64_t)(n - 1));
            for (int r = odd; kind && r < n; r += 1 + (int)(next(&rng) % 3)) {
                int i = (int)(next(&rng) % (uint64_t)t->calls);
                int j = (int)(next(&rng) % (uint64_t)t->calls), tmp;
                if (kind == 1) /* a permutation: shuffle */
                    for (int x = t->calls - 1; x > 0; x--) {
                        int y = (int)(next(&rng) % (uint64_t)(x + 1));
                        tmp = t->seq[r][x];
                        t->seq[r][x] = t->seq[r][y];
                        t->seq[r][y] = tmp;
                    }
                else if (kind == 2) { /* two calls swapped */
                    tmp = t->seq[r][i];
                    t->seq[r][i] = t->seq[r][j];
                    t->seq[r][j] = tmp;
                } else /* another session in one place: a missed call and an extra one */
                    t->seq[r][i] =
                        (t->seq[r][i] + 1 + (int)(next(&rng) % (N_SESSIONS - 1))) % N_SESSIONS;
            }
            tr_run_ranks(n, TEST_TIMEOUT_S, rank_trial, t);
            check_trial(t);
        }
    }
    free(t);
}

/* --- a transport error names the public call ------------------------------ */

/* What each rank of transport_error_names_the_call got. */
typedef struct absent_trial {
    int absent; /* the rank that never arrives */
    bool norm;  /* the others call seldp_grad_norm instead of seldp_session_sum_fp32 */
    seldp_status got[3];
    char message[3][1024];
} absent_trial;

static int rank_absent(tr_rank_ctx *ctx)
{
    absent_trial *t = ctx->arg;
    test_model m;
    test_grads g;
    seldp_session *s = NULL;
    void *data;
    seldp_param_id id;

    RANK_CHECK_OK(ctx, ct_init(&m, ctx->rank));
    RANK_CHECK_OK(ctx, ct_add(&m, "a", 1, SELDP_F32, false, 1, 1, SHAPE(4)));
    id = 1;
    RANK_CHECK_OK(ctx, seldp_session_initialize(ctx->world, m.model, 0, &id, 1, NULL, &s));
    RANK_CHECK_OK(ctx, tg_init(&g));
    RANK_CHECK_OK(ctx, tg_put(&g, 1, SELDP_F32, false, 2, 1, SHAPE(4), &data));
    if (ctx->rank != t->absent) {
        seldp_grad_norm_result norm;
        t->got[ctx->rank] =
            t->norm ? seldp_grad_norm(ctx->world, NULL, 0, &norm)
                    : seldp_session_sum_fp32(s, g.grads, true, SELDP_MISSING_ZERO, NULL);
        snprintf(t->message[ctx->rank], sizeof t->message[ctx->rank], "%s", seldp_last_error());
    } else {
        /* never arrives: sleeps past the others' timeout, then leaves */
        struct timespec ts = {0, 600 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    tg_free(&g);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

/* The agreement of a session's reduction and of the gradient norm is an allgatherv inside
 * the transport: when a rank never arrives, every other rank's message names the public
 * call and its stage, says what went wrong and who never arrived, and never names the
 * internal collective. */
static void transport_error_names_the_call(void **state)
{
    (void)state;
    for (int k = 0; k < 4; k++) {
        int n = 2 + k % 2;
        absent_trial t = {.absent = n - 1, .norm = k >= 2};
        const char *prefix = t.norm ? "seldp_grad_norm: the agreement of the call failed: "
                                    : "seldp_session_sum_fp32: the agreement of the call failed: ";
        char absent[32];
        snprintf(absent, sizeof absent, "rank %d", t.absent);
        tr_run_ranks(n, 0.2, rank_absent, &t);
        for (int r = 0; r < n - 1; r++) {
            const char *msg = t.message[r];
            if (t.got[r] != SELDP_ERR_TIMEOUT && t.got[r] != SELDP_ERR_ABORTED)
                fail_msg("%d ranks: rank %d returned %s: %s", n, r, seldp_status_name(t.got[r]),
                         msg);
            if (strncmp(msg, prefix, strlen(prefix)))
                fail_msg("%d ranks: rank %d: the message does not start with the public call "
                         "and its stage: %s",
                         n, r, msg);
            if (!strstr(msg, "timed out after 0.2 s") || !strstr(msg, absent))
                fail_msg("%d ranks: rank %d: the message does not say that %s timed out: %s", n, r,
                         absent, msg);
            if (strstr(msg, "allgather") || strstr(msg, "broadcast") || strstr(msg, "allreduce"))
                fail_msg("%d ranks: rank %d: the message names an internal collective: %s", n, r,
                         msg);
            if (t.got[r] == SELDP_ERR_TIMEOUT && !strstr(msg, "had not arrived") &&
                !strstr(msg, "the world was aborted"))
                fail_msg("%d ranks: rank %d: the message does not say who had not arrived: %s", n,
                         r, msg);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_sessions_in_opposite_orders),
        cmocka_unit_test(missed_call_is_named_by_its_counts),
        cmocka_unit_test(random_orders),
        cmocka_unit_test(transport_error_names_the_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
