/* cuBLAS, loaded when the first GPU rank is created rather than linked into every run.
 *
 * A host-only run never touches cuBLAS, yet linking it gives each rank thread cuBLAS's and
 * cuBLASLt's static thread-local storage (about 106 KB a thread: 217 MB at world 2048). The
 * few entry points tiny-moe calls are looked up in the library named by TMC_CUBLAS_SONAME
 * (the toolkit's major version) on first use, once per process. */
#ifndef TMC_CUBLAS_H
#define TMC_CUBLAS_H

#include <cublas_v2.h>

#include "seldp/status.h"

typedef struct tmc_cublas {
    cublasStatus_t (*create)(cublasHandle_t *handle);
    cublasStatus_t (*destroy)(cublasHandle_t handle);
    cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream);
    cublasStatus_t (*set_math_mode)(cublasHandle_t handle, cublasMath_t mode);
    cublasStatus_t (*sgemm)(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const float *alpha, const float *A, int lda,
                            const float *B, int ldb, const float *beta, float *C, int ldc);
    const char *(*status_string)(cublasStatus_t status);
} tmc_cublas;

/* The loaded table (the first call loads it; thread-safe). NULL when cuBLAS cannot be loaded
 * or lacks an entry point; then *why (when not NULL) says which library and what failed. */
const tmc_cublas *tmc_cublas_api(const char **why);

#endif
