/* tiny-moe on one CUDA device, internals shared by its two files: tinymoe_cuda.c (device
 * plumbing, creation, per-step state, gradients) and tmc_step.c (the forward/backward pieces). */
#ifndef TMC_INTERNAL_H
#define TMC_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/tinymoe_cuda.h"
#include "cuda/tmc_cublas.h"
#include "cuda/tmc_kernels.h"
#include "tm_error.h"

typedef struct tmc_linear {
    int out, in;
    int dense, qweight, absmax, scales, qzeros, lora_a, lora_b; /* occurrence indices or -1 */
    float *eff; /* (out,in): the dense working copy, or an own buffer for quantized bases */
} tmc_linear;

typedef struct tmc_expert {
    bool held;
    tmc_linear w1; /* [F, D] */
    tmc_linear w2; /* [D, F] */
} tmc_expert;

/* Activations of one layer for the current step (device, plus host copies of the route). */
typedef struct tmc_layer {
    float *h_in, *rstd, *u, *probs, *gate, *y, *dgate;
    int *expert;
    int *host_expert;
    float *host_gate;
    bool routed, combined, combined_back;
} tmc_layer;

struct tmc_model {
    const tm_model *host;
    tm_config cfg;
    int rank, ordinal;
    cudaStream_t stream;
    const tmc_cublas *cublas; /* loaded on first use */
    cublasHandle_t blas;

    size_t n; /* occurrences, in the host model's order */
    const tm_param_info **info;
    seldp_tensor *dev; /* device storage; a tied alias shares its first occurrence's */
    bool *alias;
    float **work, **grad; /* FP32 working copy and accumulator of trainable occurrences */
    seldp_model *view;

    int embed, final_norm, codebook;
    int *norm, *router;  /* (L) */
    tmc_expert *experts; /* (L,E) */
    bool *seen;          /* (L,E) */

    size_t T, T_capacity;
    int32_t *tokens, *host_tokens;
    tmc_layer *layers; /* (L) */
    bool embedded;

    void *scratch; /* grown on demand; only used inside one call */
    size_t scratch_bytes;
    int64_t *rows; /* index arrays of tmc_copy_rows */
    size_t rows_capacity;
};

/* ---- errors and device plumbing ---------------------------------------------------------- */

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t cuda_err_ = (call);                                                            \
        if (cuda_err_ != cudaSuccess)                                                              \
            TM_FAIL(SELDP_ERR_TRANSPORT, "rank %d (cuda:%d): %s failed: %s", m->rank, m->ordinal,  \
                    what, cudaGetErrorString(cuda_err_));                                          \
    } while (0)

#define BLAS_TRY(call, what)                                                                       \
    do {                                                                                           \
        cublasStatus_t blas_st_ = (call);                                                          \
        if (blas_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
            TM_FAIL(SELDP_ERR_TRANSPORT, "rank %d (cuda:%d): %s failed: %s", m->rank, m->ordinal,  \
                    what, m->cublas->status_string(blas_st_));                                     \
    } while (0)

seldp_status tmc__use_device(const tmc_model *m);

seldp_status tmc__finish(const tmc_model *m, const char *what);

seldp_status tmc__device_alloc(const tmc_model *m, size_t bytes, void **out);

seldp_status tmc__scratch(tmc_model *m, size_t bytes, void **out);

seldp_status tmc__gemm(const tmc_model *m, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc);

seldp_status tmc__check_layer(const tmc_model *m, int l, const char *fn);

const tmc_expert *tmc__held_expert(const tmc_model *m, int l, int e, const char *fn,
                                   seldp_status *st);

seldp_status tmc__effective_weight(tmc_model *m, const tmc_linear *lin);

seldp_status tmc__ensure_layers(tmc_model *m, size_t T);

#endif
