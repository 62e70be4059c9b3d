/* Overlapped reductions (seldp_session_*_start ... seldp_session_finish) over the MPI
 * transport, one process per rank, MPI initialized with MPI_THREAD_SERIALIZED (the progress
 * thread calls MPI): results bit-identical to the blocking call's for the mean and the sum
 * over several bucket sizes and mark orders, and the missing-gradient policy and a blocking
 * peer failing on every rank with the gradients unchanged. */
#define _POSIX_C_SOURCE 200809L

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"
#include "ranks.h"

#define TIMEOUT_S 20.0
#define NP        6
static const int64_t NUMEL[NP] = {1, 7, 33, 130, 5, 257};
static const seldp_dtype DTYPE[3] = {SELDP_F32, SELDP_BF16, SELDP_F16};

/* One rank's model and two identical gradient containers (blocking, overlapped). */
typedef struct async_model {
    seldp_model *model;
    void *param[NP], *grad[2][NP];
    seldp_param_id ids[NP];
    seldp_grads *grads[2];
} async_model;

static seldp_param_id id_of(int rank, size_t i)
{
    return 50 + (seldp_param_id)((i + (size_t)rank * 4) % NP);
}

static void fill(seldp_dtype dt, void *x, size_t n, uint64_t seed)
{
    float *tmp = malloc(n * sizeof *tmp);
    assert_non_null(tmp);
    tr_fill_f32(tmp, n, seed);
    for (size_t i = 0; i < n; i++) {
        if (dt == SELDP_F32)
            ((float *)x)[i] = tmp[i];
        else if (dt == SELDP_BF16)
            ((uint16_t *)x)[i] = seldp_f32_to_bf16(tmp[i]);
        else
            ((uint16_t *)x)[i] = seldp_f32_to_f16(tmp[i]);
    }
    free(tmp);
}

/* Parameters registered in a rank-dependent order; gradients of every parameter but
 * `lacking` (NP: none) in both containers. */
static void model_build(async_model *m, size_t lacking)
{
    char path[32];
    memset(m, 0, sizeof *m);
    assert_int_equal(seldp_model_create(mt_rank, &m->model), SELDP_OK);
    assert_int_equal(seldp_grads_create(&m->grads[0]), SELDP_OK);
    assert_int_equal(seldp_grads_create(&m->grads[1]), SELDP_OK);
    for (size_t j = 0; j < NP; j++) {
        size_t i = (j + (size_t)mt_rank) % NP;
        seldp_dtype dt = DTYPE[i % 3];
        int64_t shape[1] = {NUMEL[i]};
        size_t bytes = (size_t)NUMEL[i] * seldp_dtype_size(dt);
        m->param[i] = malloc(bytes);
        assert_non_null(m->param[i]);
        fill(dt, m->param[i], (size_t)NUMEL[i], 10 + i);
        seldp_tensor p = seldp_tensor_view(dt, SELDP_HOST_DEVICE, m->param[i], 1, shape);
        snprintf(path, sizeof path, "layers.%02zu.weight", i);
        m->ids[j] = id_of(mt_rank, i);
        assert_int_equal(seldp_model_add(m->model, path, id_of(mt_rank, i), &p, false, NULL),
                         SELDP_OK);
        for (int c = 0; c < 2; c++) {
            m->grad[c][i] = malloc(bytes);
            assert_non_null(m->grad[c][i]);
            fill(dt, m->grad[c][i], (size_t)NUMEL[i], 1000 + 17 * (uint64_t)mt_rank + i);
            seldp_tensor g = seldp_tensor_view(dt, SELDP_HOST_DEVICE, m->grad[c][i], 1, shape);
            if (i != lacking)
                assert_int_equal(
                    seldp_grads_put(m->grads[c], id_of(mt_rank, i), &g, SELDP_BORROWED), SELDP_OK);
        }
    }
}

static void model_free(async_model *m)
{
    for (int c = 0; c < 2; c++)
        seldp_grads_destroy(m->grads[c]);
    seldp_model_destroy(m->model);
    for (size_t i = 0; i < NP; i++) {
        free(m->param[i]);
        free(m->grad[0][i]);
        free(m->grad[1][i]);
    }
}

/* start, marks (reverse path order, or rank-dependent), finish */
static seldp_status overlapped(seldp_session *s, seldp_grads *g, bool sum, bool shuffled,
                               uint64_t *total)
{
    uint64_t w = 2 * (uint64_t)mt_rank + 1;
    seldp_status st = sum ? seldp_session_sum_start(s, g, true, SELDP_MISSING_ERROR)
                          : seldp_session_reduce_start(s, g, w, SELDP_MISSING_ERROR);
    if (st != SELDP_OK)
        return st;
    for (size_t j = 0; j < NP; j++) {
        size_t i = shuffled ? (j * 5 + (size_t)mt_rank) % NP : NP - 1 - j;
        (void)seldp_session_mark_ready(s, id_of(mt_rank, i));
    }
    return seldp_session_finish(s, total);
}

static void test_bit_identical_to_blocking(void **state)
{
    static const size_t BUCKETS[] = {4, 100, (size_t)25 << 20};
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    for (size_t b = 0; b < sizeof BUCKETS / sizeof BUCKETS[0]; b++) {
        for (int sum = 0; sum <= 1; sum++) {
            async_model m;
            seldp_session *s = NULL;
            seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
            uint64_t wa = 0, wb = 0;
            cfg.bucket_bytes = BUCKETS[b];
            model_build(&m, NP);
            assert_int_equal(seldp_session_initialize(world, m.model, 0, m.ids, NP, &cfg, &s),
                             SELDP_OK);
            seldp_status sa = sum ? seldp_session_sum(s, m.grads[0], true, SELDP_MISSING_ERROR, &wa)
                                  : seldp_session_reduce(s, m.grads[0], 2 * (uint64_t)mt_rank + 1,
                                                         SELDP_MISSING_ERROR, &wa);
            mt_expect_everywhere(world, sa, SELDP_OK, "");
            seldp_status sb = overlapped(s, m.grads[1], sum, b % 2 == 1, &wb);
            mt_expect_everywhere(world, sb, SELDP_OK, "");
            assert_true(wa == wb);
            for (size_t i = 0; i < NP; i++) {
                size_t bytes = (size_t)NUMEL[i] * seldp_dtype_size(DTYPE[i % 3]);
                if (tr_first_diff(m.grad[0][i], m.grad[1][i], bytes) != bytes)
                    fail_msg("rank %d, %zu-byte buckets, %s: parameter %zu differs from the "
                             "blocking call's",
                             mt_rank, BUCKETS[b], sum ? "sum" : "mean", i);
            }
            assert_true(mt_same_everywhere(world, m.grad[1][3], (size_t)NUMEL[3] * sizeof(float)));
            seldp_session_destroy(s);
            model_free(&m);
        }
    }
    seldp_comm_destroy(world);
}

static void test_failures_on_every_rank(void **state)
{
    (void)state;
    seldp_comm *world = mt_world(TIMEOUT_S);
    for (int blocking_peer = 0; blocking_peer <= 1; blocking_peer++) {
        async_model m;
        seldp_session *s = NULL;
        unsigned char *before[NP];
        /* the last rank lacks parameter 3 (policy error), or calls the blocking reduce */
        model_build(&m, !blocking_peer && mt_rank == mt_size - 1 ? 3 : NP);
        assert_int_equal(seldp_session_initialize(world, m.model, 0, m.ids, NP, NULL, &s),
                         SELDP_OK);
        for (size_t i = 0; i < NP; i++) {
            size_t bytes = (size_t)NUMEL[i] * seldp_dtype_size(DTYPE[i % 3]);
            before[i] = malloc(bytes);
            assert_non_null(before[i]);
            memcpy(before[i], m.grad[1][i], bytes);
        }
        size_t count = seldp_grads_count(m.grads[1]);
        seldp_status st = blocking_peer && mt_rank == mt_size - 1
                              ? seldp_session_reduce(s, m.grads[1], 1, SELDP_MISSING_ERROR, NULL)
                              : overlapped(s, m.grads[1], false, false, NULL);
        if (blocking_peer)
            mt_expect_everywhere(world, st, SELDP_ERR_DISAGREE, "seldp_session_reduce_start");
        else
            mt_expect_everywhere(world, st, SELDP_ERR_MISSING_GRADIENT, "'layers.03.weight'");
        assert_int_equal(seldp_grads_count(m.grads[1]), count);
        for (size_t i = 0; i < NP; i++) {
            size_t bytes = (size_t)NUMEL[i] * seldp_dtype_size(DTYPE[i % 3]);
            assert_memory_equal(before[i], m.grad[1][i], bytes);
            free(before[i]);
        }
        seldp_session_destroy(s);
        model_free(&m);
    }
    seldp_comm_destroy(world);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MT_TEST(test_bit_identical_to_blocking),
        MT_TEST(test_failures_on_every_rank),
    };
    int provided = 0;
    /* the progress thread calls MPI while the main thread computes: SERIALIZED at least */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (mt_size < 2 || provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "mpi_async: needs mpirun with 2 processes or more and "
                        "MPI_THREAD_SERIALIZED; skipped\n");
        MPI_Finalize();
        return 77;
    }
    int failed = cmocka_run_group_tests_name("mpi_async", tests, NULL, NULL);
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
