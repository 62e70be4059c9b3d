/* The model's GEMMs through one gate. OpenBLAS hands every call in flight a buffer from a fixed
 * table (about 50 entries, plus 512 more it adds with a warning, then it terminates the
 * process), so a world of thousands of rank threads on a few cores, each preempted inside
 * its own GEMM, can run out of them. The gate lets a bounded number of calls run at once (twice
 * the online cores, 4 to 32) and queues the rest: every rank still makes the same calls in the
 * same order, so results do not change, and the cores were never going to run more at once. */
#ifndef TM_BLAS_GATE_H
#define TM_BLAS_GATE_H

#include <cblas.h>

/* cblas_sgemm and cblas_dgemm, row-major, behind the gate. */
void tm__sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void tm__dgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double *A, int lda, const double *B, int ldb, double beta, double *C, int ldc);

/* How many GEMMs may run at once (for tests and the scale notes). */
int tm__blas_gate_width(void);

/* The most GEMMs seen inside the gate at once since the process started. */
int tm__blas_gate_peak(void);

#endif
