/* The GEMM gate (models/blas_gate.h): many rank threads calling the model's GEMMs at once get
 * the same bits as one thread calling them in turn, and no more than the gate's width of
 * calls is ever inside OpenBLAS at the same time. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "blas_gate.h"

enum { THREADS = 96, CALLS = 40, M = 24, N = 20, K = 16 };

typedef struct {
    int id;
    pthread_barrier_t *start;
    float out[M * N];
    double dout[M * N];
} worker;

static void fill(int id, float *a, float *b, double *da, double *db)
{
    for (int i = 0; i < M * K; i++) {
        a[i] = (float)((i * 7 + id * 13) % 17) / 8.0f - 1.0f;
        da[i] = a[i];
    }
    for (int i = 0; i < K * N; i++) {
        b[i] = (float)((i * 5 + id * 3) % 11) / 4.0f - 1.25f;
        db[i] = b[i];
    }
}

static void gemms(int id, float *out, double *dout)
{
    float a[M * K], b[K * N];
    double da[M * K], db[K * N];
    fill(id, a, b, da, db);
    memset(out, 0, sizeof(float) * M * N);
    memset(dout, 0, sizeof(double) * M * N);
    for (int c = 0; c < CALLS; c++) {
        /* accumulate: every call's result depends on the one before */
        tm__sgemm(CblasNoTrans, CblasNoTrans, M, N, K, 0.5f, a, K, b, N, 1.0f, out, N);
        tm__dgemm(CblasNoTrans, CblasNoTrans, M, N, K, 0.5, da, K, db, N, 1.0, dout, N);
    }
}

static void *run(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(w->start);
    gemms(w->id, w->out, w->dout);
    return NULL;
}

static void test_width_is_bounded(void **state)
{
    (void)state;
    int width = tm__blas_gate_width();
    assert_true(width >= 4 && width <= 32);
}

static void test_many_threads_same_bits(void **state)
{
    (void)state;
    static worker w[THREADS];
    pthread_t th[THREADS];
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, THREADS), 0);
    for (int i = 0; i < THREADS; i++) {
        w[i].id = i;
        w[i].start = &start;
        assert_int_equal(pthread_create(&th[i], NULL, run, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&start);
    assert_true(tm__blas_gate_peak() >= 1);
    assert_true(tm__blas_gate_peak() <= tm__blas_gate_width());
    for (int i = 0; i < THREADS; i++) {
        float out[M * N];
        double dout[M * N];
        gemms(i, out, dout);
        assert_memory_equal(out, w[i].out, sizeof out);
        assert_memory_equal(dout, w[i].dout, sizeof dout);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_width_is_bounded),
        cmocka_unit_test(test_many_threads_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
