/* The GEMM gate (blas_gate.h). */
#define _POSIX_C_SOURCE 200809L

#include "blas_gate.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <unistd.h>

static pthread_once_t gate_once = PTHREAD_ONCE_INIT;
static sem_t gate;
static int gate_width;
static atomic_int in_flight;
static atomic_int in_flight_peak;

static void gate_init(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long width = cores > 0 ? 2 * cores : 4;
    gate_width = (int)(width < 4 ? 4 : width > 32 ? 32 : width);
    if (sem_init(&gate, 0, (unsigned)gate_width) != 0)
        gate_width = 0; /* no gate: calls go straight through */
}

int tm__blas_gate_width(void)
{
    pthread_once(&gate_once, gate_init);
    return gate_width;
}

static void enter(void)
{
    if (tm__blas_gate_width() == 0)
        return;
    while (sem_wait(&gate) != 0 && errno == EINTR)
        ;
    int now = atomic_fetch_add(&in_flight, 1) + 1;
    int peak = atomic_load(&in_flight_peak);
    while (now > peak && !atomic_compare_exchange_weak(&in_flight_peak, &peak, now))
        ;
}

int tm__blas_gate_peak(void)
{
    return atomic_load(&in_flight_peak);
}

static void leave(void)
{
    if (gate_width > 0) {
        atomic_fetch_sub(&in_flight, 1);
        sem_post(&gate);
    }
}

void tm__sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    enter();
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    leave();
}

void tm__dgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double *A, int lda, const double *B, int ldb, double beta, double *C, int ldc)
{
    enter();
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    leave();
}
