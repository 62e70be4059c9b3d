/* tiny-moe on one CUDA device: device storage and view, FP32 working copies, the step's
 * activations, and the forward/backward pieces of models/forward.c with each cblas_sgemm
 * replaced by the same row-major product on cuBLAS and each loop by a kernel of
 * tmc_kernels.cu. Every public function synchronizes the model's stream before it returns. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tm_error.h"
#include "cuda/tinymoe_cuda.h"
#include "cuda/tmc_kernels.h"

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
            TM_FAIL(SELDP_ERR_TRANSPORT, "rank %d (cuda:%d): %s failed: %s", m->rank,           \
                       m->ordinal, what, cudaGetErrorString(cuda_err_));                           \
    } while (0)

#define BLAS_TRY(call, what)                                                                       \
    do {                                                                                           \
        cublasStatus_t blas_st_ = (call);                                                          \
        if (blas_st_ != CUBLAS_STATUS_SUCCESS)                                                     \
            TM_FAIL(SELDP_ERR_TRANSPORT, "rank %d (cuda:%d): %s failed: %s", m->rank,           \
                       m->ordinal, what, cublasGetStatusString(blas_st_));                         \
    } while (0)

static seldp_status use_device(const tmc_model *m)
{
    seldp_status st = SELDP_OK;
    int cur = -1;
    CUDA_TRY(cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != m->ordinal)
        CUDA_TRY(cudaSetDevice(m->ordinal), "cudaSetDevice");
fail:
    return st;
}

static seldp_status finish(const tmc_model *m, const char *what)
{
    seldp_status st = SELDP_OK;
    CUDA_TRY(cudaStreamSynchronize(m->stream), what);
fail:
    return st;
}

static seldp_status device_alloc(const tmc_model *m, size_t bytes, void **out)
{
    seldp_status st = SELDP_OK;
    *out = NULL;
    cudaError_t err = cudaMalloc(out, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d (cuda:%d): cudaMalloc of %zu bytes failed: %s",
                   m->rank, m->ordinal, bytes, cudaGetErrorString(err));
    }
fail:
    return st;
}

/* At least `bytes` of scratch. Called before any work of the call is queued, while the
 * stream is idle, so freeing the old block is safe. */
static seldp_status scratch(tmc_model *m, size_t bytes, void **out)
{
    seldp_status st = SELDP_OK;
    if (bytes > m->scratch_bytes) {
        cudaFree(m->scratch);
        m->scratch = NULL;
        m->scratch_bytes = 0;
        TM_CHECK(device_alloc(m, bytes, &m->scratch));
        m->scratch_bytes = bytes;
    }
    *out = m->scratch;
fail:
    return st;
}

/* cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, ...) on cuBLAS: a row-major matrix is the
 * column-major transpose, so C^T = op(B)^T op(A)^T swaps the operands. */
static seldp_status gemm(const tmc_model *m, bool ta, bool tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc)
{
    seldp_status st = SELDP_OK;
    if (M == 0 || N == 0)
        return SELDP_OK;
    BLAS_TRY(cublasSgemm(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                         M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
             "cublasSgemm");
fail:
    return st;
}

/* ---- creation ------------------------------------------------------------------------ */

static int find(const tmc_model *m, const char *path)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->info[i]->path, path) == 0)
            return (int)i;
    return -1;
}

static int findf(const tmc_model *m, const char *fmt, const char *prefix)
{
    char path[160];
    snprintf(path, sizeof path, fmt, prefix);
    return find(m, path);
}

static seldp_status linear_init(tmc_model *m, tmc_linear *lin, const char *prefix, int out, int in)
{
    seldp_status st = SELDP_OK;
    lin->out = out;
    lin->in = in;
    lin->dense = findf(m, "%s.weight", prefix);
    lin->qweight = findf(m, "%s.qweight", prefix);
    lin->absmax = findf(m, "%s.absmax", prefix);
    lin->scales = findf(m, "%s.scales", prefix);
    lin->qzeros = findf(m, "%s.qzeros", prefix);
    lin->lora_a = findf(m, "%s.lora_a.weight", prefix);
    lin->lora_b = findf(m, "%s.lora_b.weight", prefix);
    if (lin->dense >= 0) {
        lin->eff = m->work[lin->dense];
        return SELDP_OK;
    }
    bool nf4 = m->cfg.quant == TM_QUANT_NF4;
    if (lin->qweight < 0 || lin->lora_a < 0 || lin->lora_b < 0 ||
        (nf4 ? (lin->absmax < 0 || m->codebook < 0) : (lin->scales < 0 || lin->qzeros < 0)))
        TM_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tmc_model_create: %s is incomplete",
                   m->rank, prefix);
    TM_CHECK(device_alloc(m, (size_t)out * (size_t)in * sizeof(float), (void **)&lin->eff));
fail:
    return st;
}

/* Device storage, working copy and accumulator of occurrence i. */
static seldp_status param_init(tmc_model *m, size_t i)
{
    seldp_status st = SELDP_OK;
    const tm_param_info *p = m->info[i];
    if (p->alias) {
        /* the tied path shares storage, working copy and gradient with its first path */
        for (size_t j = 0; j < i; j++) {
            if (m->info[j]->id == p->id && !m->alias[j]) {
                m->alias[i] = true;
                m->dev[i] = m->dev[j];
                m->work[i] = m->work[j];
                m->grad[i] = m->grad[j];
                return SELDP_OK;
            }
        }
        TM_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tmc_model_create: %s ties an unknown id",
                   m->rank, p->path);
    }
    m->dev[i] = p->tensor;
    m->dev[i].device = (seldp_device){SELDP_DEVICE_CUDA, m->ordinal};
    m->dev[i].data = NULL;
    TM_CHECK(seldp_tensor_alloc(&m->dev[i]));
    TM_CHECK(seldp_tensor_copy(&m->dev[i], &p->tensor));
    if (!p->frozen && (p->role & TM_ROLES_TRAINABLE)) {
        size_t bytes = seldp_tensor_numel(&p->tensor) * sizeof(float);
        TM_CHECK(device_alloc(m, bytes, (void **)&m->work[i]));
        TM_CHECK(device_alloc(m, bytes, (void **)&m->grad[i]));
    }
fail:
    return st;
}

seldp_status tmc_model_create(const tm_model *host, int ordinal, tmc_model **out)
{
    seldp_status st = SELDP_OK;
    tmc_model *m = NULL;
    if (!out)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tmc_model_create: out is NULL");
    *out = NULL;
    if (!host || ordinal < 0)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tmc_model_create: %s",
                           host ? "negative device ordinal" : "host is NULL");
    m = calloc(1, sizeof *m);
    if (!m)
        return tm__fail(SELDP_ERR_NOMEM, "tmc_model_create: out of memory");
    m->host = host;
    m->cfg = *tm_model_config(host);
    m->rank = tm_model_rank(host);
    m->ordinal = ordinal;
    m->codebook = -1;
    const int L = m->cfg.layers, E = m->cfg.experts;
    TM_CHECK(use_device(m));
    CUDA_TRY(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    BLAS_TRY(cublasCreate(&m->blas), "cublasCreate");
    BLAS_TRY(cublasSetStream(m->blas, m->stream), "cublasSetStream");
    /* Plain FP32 products: TF32 would miss the 1e-5 agreement with the FP64 reference. */
    BLAS_TRY(cublasSetMathMode(m->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

    m->n = tm_param_count(host);
    m->info = calloc(m->n ? m->n : 1, sizeof *m->info);
    m->dev = calloc(m->n ? m->n : 1, sizeof *m->dev);
    m->alias = calloc(m->n ? m->n : 1, sizeof *m->alias);
    m->work = calloc(m->n ? m->n : 1, sizeof *m->work);
    m->grad = calloc(m->n ? m->n : 1, sizeof *m->grad);
    m->norm = calloc((size_t)L, sizeof *m->norm);
    m->router = calloc((size_t)L, sizeof *m->router);
    m->experts = calloc((size_t)L * (size_t)E, sizeof *m->experts);
    m->seen = calloc((size_t)L * (size_t)E, sizeof *m->seen);
    m->layers = calloc((size_t)L, sizeof *m->layers);
    if (!m->info || !m->dev || !m->alias || !m->work || !m->grad || !m->norm || !m->router ||
        !m->experts || !m->seen || !m->layers)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: tmc_model_create: out of memory", m->rank);
    for (size_t i = 0; i < m->n; i++)
        m->info[i] = tm_param_at(host, i);
    for (size_t i = 0; i < m->n; i++)
        TM_CHECK(param_init(m, i));

    TM_CHECK(seldp_model_create(m->rank, &m->view));
    for (size_t i = 0; i < m->n; i++)
        TM_CHECK(seldp_model_add(m->view, m->info[i]->path, m->info[i]->id, &m->dev[i],
                                    m->info[i]->frozen, (void *)m->info[i]));

    m->embed = find(m, "embed.weight");
    m->final_norm = find(m, "final_norm.weight");
    m->codebook = find(m, "nf4.codebook");
    if (m->embed < 0 || m->final_norm < 0)
        TM_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tmc_model_create: no embed or final_norm",
                   m->rank);
    for (int l = 0; l < L; l++) {
        char path[160];
        snprintf(path, sizeof path, "layers.%d.norm.weight", l);
        m->norm[l] = find(m, path);
        snprintf(path, sizeof path, "layers.%d.router.weight", l);
        m->router[l] = find(m, path);
        if (m->norm[l] < 0 || m->router[l] < 0)
            TM_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tmc_model_create: layer %d incomplete",
                       m->rank, l);
        for (int e = 0; e < E; e++) {
            tmc_expert *x = &m->experts[(size_t)l * (size_t)E + (size_t)e];
            if (!tm_model_owns(host, e))
                continue;
            x->held = true;
            snprintf(path, sizeof path, "layers.%d.experts.%d.w1", l, e);
            TM_CHECK(linear_init(m, &x->w1, path, m->cfg.d_ff, m->cfg.d_model));
            snprintf(path, sizeof path, "layers.%d.experts.%d.w2", l, e);
            TM_CHECK(linear_init(m, &x->w2, path, m->cfg.d_model, m->cfg.d_ff));
        }
    }
    TM_CHECK(tmc_begin_step(m));
    *out = m;
    return SELDP_OK;
fail:
    tmc_model_destroy(m);
    return st;
}

static void free_layers(tmc_model *m)
{
    for (int l = 0; l < m->cfg.layers; l++) {
        tmc_layer *c = &m->layers[l];
        cudaFree(c->h_in);
        cudaFree(c->rstd);
        cudaFree(c->u);
        cudaFree(c->probs);
        cudaFree(c->gate);
        cudaFree(c->y);
        cudaFree(c->dgate);
        cudaFree(c->expert);
        free(c->host_expert);
        free(c->host_gate);
        memset(c, 0, sizeof *c);
    }
    cudaFree(m->tokens);
    free(m->host_tokens);
    m->tokens = m->host_tokens = NULL;
    m->T_capacity = 0;
}

void tmc_model_destroy(tmc_model *m)
{
    if (!m)
        return;
    use_device(m);
    if (m->stream)
        cudaStreamSynchronize(m->stream);
    seldp_model_destroy(m->view);
    if (m->layers)
        free_layers(m);
    if (m->experts) {
        for (size_t k = 0; k < (size_t)m->cfg.layers * (size_t)m->cfg.experts; k++) {
            tmc_expert *x = &m->experts[k];
            if (x->held && x->w1.dense < 0)
                cudaFree(x->w1.eff);
            if (x->held && x->w2.dense < 0)
                cudaFree(x->w2.eff);
        }
    }
    /* after a partial creation any of these arrays may be missing */
    for (size_t i = 0; i < m->n; i++) {
        if (m->alias && m->alias[i])
            continue;
        if (m->dev)
            seldp_tensor_free(&m->dev[i]);
        if (m->work)
            cudaFree(m->work[i]);
        if (m->grad)
            cudaFree(m->grad[i]);
    }
    cudaFree(m->scratch);
    cudaFree(m->rows);
    if (m->blas)
        cublasDestroy(m->blas);
    if (m->stream)
        cudaStreamDestroy(m->stream);
    free(m->info);
    free(m->dev);
    free(m->alias);
    free(m->work);
    free(m->grad);
    free(m->norm);
    free(m->router);
    free(m->experts);
    free(m->seen);
    free(m->layers);
    free(m);
}

seldp_model *tmc_model_view(tmc_model *m)
{
    return m ? m->view : NULL;
}

int tmc_model_device(const tmc_model *m)
{
    return m ? m->ordinal : -1;
}

const seldp_tensor *tmc_param_tensor(const tmc_model *m, const char *path)
{
    int i = m && path ? find(m, path) : -1;
    return i >= 0 ? &m->dev[i] : NULL;
}

seldp_status tmc_download_params(const tmc_model *m, tm_model *host)
{
    seldp_status st = SELDP_OK;
    if (!m || host != m->host)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "tmc_download_params: the host model is not the one mirrored");
    TM_CHECK(use_device(m));
    for (size_t i = 0; i < m->n; i++) {
        if (m->alias[i])
            continue;
        seldp_tensor dst = m->info[i]->tensor;
        TM_CHECK(seldp_tensor_copy(&dst, &m->dev[i]));
    }
fail:
    return st;
}

/* ---- per-step state ---------------------------------------------------------------------- */

static seldp_status effective_weight(tmc_model *m, const tmc_linear *lin)
{
    seldp_status st = SELDP_OK;
    if (lin->dense >= 0)
        return SELDP_OK;
    const size_t n = (size_t)lin->out * (size_t)lin->in;
    if (m->cfg.quant == TM_QUANT_NF4)
        CUDA_TRY(tmc_k_nf4_dequant(m->stream, m->dev[lin->qweight].data, m->dev[lin->absmax].data,
                                   m->dev[m->codebook].data, n, lin->eff),
                 "nf4 dequantize");
    else
        CUDA_TRY(tmc_k_awq_dequant(m->stream, m->dev[lin->qweight].data, m->dev[lin->scales].data,
                                   m->dev[lin->qzeros].data, lin->out, lin->in, lin->eff),
                 "awq dequantize");
    // eff (out,in) += (alpha/r) * B (out,r) . A (r,in)
    const int r = m->cfg.lora_rank;
    TM_CHECK(gemm(m, false, false, lin->out, lin->in, r, (float)(m->cfg.lora_alpha / r),
                     m->work[lin->lora_b], r, m->work[lin->lora_a], lin->in, 1.0f, lin->eff,
                     lin->in));
fail:
    return st;
}

seldp_status tmc_begin_step(tmc_model *m)
{
    seldp_status st = SELDP_OK;
    TM_CHECK(use_device(m));
    for (size_t i = 0; i < m->n; i++) {
        if (m->alias[i] || !m->work[i])
            continue;
        size_t n = seldp_tensor_numel(&m->dev[i]);
        CUDA_TRY(tmc_k_to_f32(m->stream, m->dev[i].dtype, m->dev[i].data, m->work[i], n), "upcast");
        CUDA_TRY(cudaMemsetAsync(m->grad[i], 0, n * sizeof(float), m->stream), "cudaMemset");
    }
    const size_t LE = (size_t)m->cfg.layers * (size_t)m->cfg.experts;
    for (size_t k = 0; k < LE; k++) {
        if (!m->experts[k].held)
            continue;
        TM_CHECK(effective_weight(m, &m->experts[k].w1));
        TM_CHECK(effective_weight(m, &m->experts[k].w2));
    }
    TM_CHECK(finish(m, "tmc_begin_step"));
    memset(m->seen, 0, LE * sizeof *m->seen);
    m->embedded = false;
    m->T = 0;
    for (int l = 0; l < m->cfg.layers; l++)
        m->layers[l].routed = m->layers[l].combined = m->layers[l].combined_back = false;
fail:
    return st;
}

static seldp_status ensure_layers(tmc_model *m, size_t T)
{
    seldp_status st = SELDP_OK;
    if (T <= m->T_capacity && m->tokens)
        return SELDP_OK;
    free_layers(m);
    const size_t cap = T ? T : 1, D = (size_t)m->cfg.d_model, E = (size_t)m->cfg.experts;
    const size_t K = (size_t)m->cfg.top_k, f = sizeof(float);
    TM_CHECK(device_alloc(m, cap * sizeof(int32_t), (void **)&m->tokens));
    m->host_tokens = malloc(cap * sizeof *m->host_tokens);
    if (!m->host_tokens)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu tokens", m->rank, T);
    for (int l = 0; l < m->cfg.layers; l++) {
        tmc_layer *c = &m->layers[l];
        TM_CHECK(device_alloc(m, cap * D * f, (void **)&c->h_in));
        TM_CHECK(device_alloc(m, cap * f, (void **)&c->rstd));
        TM_CHECK(device_alloc(m, cap * D * f, (void **)&c->u));
        TM_CHECK(device_alloc(m, cap * E * f, (void **)&c->probs));
        TM_CHECK(device_alloc(m, cap * K * f, (void **)&c->gate));
        TM_CHECK(device_alloc(m, cap * K * D * f, (void **)&c->y));
        TM_CHECK(device_alloc(m, cap * K * f, (void **)&c->dgate));
        TM_CHECK(device_alloc(m, cap * K * sizeof(int), (void **)&c->expert));
        c->host_expert = malloc(cap * K * sizeof(int));
        c->host_gate = malloc(cap * K * f);
        if (!c->host_expert || !c->host_gate)
            TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu tokens", m->rank, T);
    }
    m->T_capacity = cap;
    return SELDP_OK;
fail:
    free_layers(m);
    return st;
}

static seldp_status check_layer(const tmc_model *m, int l, const char *fn)
{
    if (l < 0 || l >= m->cfg.layers)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: layer %d outside [0, %d)",
                           m->rank, fn, l, m->cfg.layers);
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: %s: layer %d called before tmc_embed_forward", m->rank, fn, l);
    return SELDP_OK;
}

static const tmc_expert *held_expert(const tmc_model *m, int l, int e, const char *fn,
                                     seldp_status *st)
{
    *st = SELDP_OK;
    if (l < 0 || l >= m->cfg.layers) {
        *st = tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: layer %d outside [0, %d)",
                          m->rank, fn, l, m->cfg.layers);
        return NULL;
    }
    const tmc_expert *x = e >= 0 && e < m->cfg.experts
                              ? &m->experts[(size_t)l * (size_t)m->cfg.experts + (size_t)e]
                              : NULL;
    if (!x || !x->held) {
        *st = tm__fail(SELDP_ERR_NOT_FOUND,
                          "rank %d: %s: layers.%d.experts.%d is not held by this rank", m->rank, fn,
                          l, e);
        return NULL;
    }
    return x;
}

/* ---- the step ---------------------------------------------------------------------------- */

seldp_status tmc_embed_forward(tmc_model *m, const int32_t *tokens, size_t T, float *h)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model;
    for (size_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= m->cfg.vocab)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: token %zu is %d, expected an id in [0, %d)", m->rank, t,
                               (int)tokens[t], m->cfg.vocab);
    TM_CHECK(use_device(m));
    TM_CHECK(ensure_layers(m, T));
    m->T = T;
    m->embedded = true;
    for (int l = 0; l < m->cfg.layers; l++)
        m->layers[l].routed = m->layers[l].combined = m->layers[l].combined_back = false;
    if (T == 0)
        return SELDP_OK;
    memcpy(m->host_tokens, tokens, T * sizeof *tokens);
    CUDA_TRY(cudaMemcpyAsync(m->tokens, m->host_tokens, T * sizeof *tokens, cudaMemcpyHostToDevice,
                             m->stream),
             "token upload");
    CUDA_TRY(tmc_k_embed_forward(m->stream, m->work[m->embed], m->tokens, T, D, h), "embed");
    TM_CHECK(finish(m, "tmc_embed_forward"));
fail:
    return st;
}

seldp_status tmc_embed_backward(tmc_model *m, const float *dh)
{
    seldp_status st = SELDP_OK;
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: tmc_embed_backward before tmc_embed_forward", m->rank);
    TM_CHECK(use_device(m));
    CUDA_TRY(tmc_k_embed_backward(m->stream, dh, m->tokens, m->T, m->cfg.vocab, m->cfg.d_model,
                                  m->grad[m->embed]),
             "embed backward");
    TM_CHECK(finish(m, "tmc_embed_backward"));
fail:
    return st;
}

static void fill_route(const tmc_model *m, int l, tmc_route *route)
{
    const tmc_layer *c = &m->layers[l];
    route->T = m->T;
    route->K = m->cfg.top_k;
    route->expert = c->host_expert;
    route->gate = c->host_gate;
    route->x = c->u;
}

seldp_status tmc_route_forward(tmc_model *m, int l, const float *h, tmc_route *route)
{
    seldp_status st = check_layer(m, l, "tmc_route_forward");
    if (st != SELDP_OK)
        return st;
    const size_t T = m->T;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k;
    tmc_layer *c = &m->layers[l];
    TM_CHECK(use_device(m));
    if (T) {
        CUDA_TRY(cudaMemcpyAsync(c->h_in, h, T * (size_t)D * sizeof(float),
                                 cudaMemcpyDeviceToDevice, m->stream),
                 "layer input copy");
        CUDA_TRY(tmc_k_rmsnorm_forward(m->stream, c->h_in, m->work[m->norm[l]], T, D,
                                       (float)m->cfg.eps, c->u, c->rstd),
                 "rmsnorm");
        // u (T,D) . W_r^T (D,E) -> probs (T,E)
        TM_CHECK(gemm(m, false, true, (int)T, E, D, 1.0f, c->u, D, m->work[m->router[l]], D,
                         0.0f, c->probs, E));
        CUDA_TRY(tmc_k_route(m->stream, c->probs, T, E, K, c->expert, c->gate), "route");
        CUDA_TRY(cudaMemcpyAsync(c->host_expert, c->expert, T * (size_t)K * sizeof(int),
                                 cudaMemcpyDeviceToHost, m->stream),
                 "route download");
        CUDA_TRY(cudaMemcpyAsync(c->host_gate, c->gate, T * (size_t)K * sizeof(float),
                                 cudaMemcpyDeviceToHost, m->stream),
                 "route download");
        TM_CHECK(finish(m, "tmc_route_forward"));
    }
    c->routed = true;
    c->combined = c->combined_back = false;
    fill_route(m, l, route);
fail:
    return st;
}

seldp_status tmc_route_get(const tmc_model *m, int l, tmc_route *route)
{
    if (l < 0 || l >= m->cfg.layers || !m->embedded || !m->layers[l].routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: tmc_route_get: layer %d was not routed in this step", m->rank,
                           l);
    fill_route(m, l, route);
    return SELDP_OK;
}

seldp_status tmc_route_backward(tmc_model *m, int l, const float *dx, float *dh)
{
    seldp_status st = check_layer(m, l, "tmc_route_backward");
    if (st != SELDP_OK)
        return st;
    tmc_layer *c = &m->layers[l];
    if (!c->combined_back)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: tmc_route_backward: layer %d before tmc_combine_backward",
                           m->rank, l);
    const size_t T = m->T;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k;
    if (T == 0)
        return SELDP_OK;
    float *dlogits = NULL;
    TM_CHECK(use_device(m));
    TM_CHECK(scratch(m, T * (size_t)(E + D) * sizeof(float), (void **)&dlogits));
    float *du = dlogits + T * (size_t)E;
    CUDA_TRY(
        tmc_k_route_backward(m->stream, c->probs, c->expert, c->gate, c->dgate, T, E, K, dlogits),
        "router backward");
    // dW_r (E,D) += dlogits^T (E,T) . u (T,D)
    TM_CHECK(gemm(m, true, false, E, D, (int)T, 1.0f, dlogits, E, c->u, D, 1.0f,
                     m->grad[m->router[l]], D));
    // du (T,D) = dlogits (T,E) . W_r (E,D) + sum_k dx[t,k]
    TM_CHECK(gemm(m, false, false, (int)T, D, E, 1.0f, dlogits, E, m->work[m->router[l]], D,
                     0.0f, du, D));
    CUDA_TRY(tmc_k_add_slots(m->stream, dx, T, K, D, du), "slot gradients");
    CUDA_TRY(tmc_k_rmsnorm_backward(m->stream, du, c->h_in, m->work[m->norm[l]], c->rstd, T, D, dh,
                                    m->grad[m->norm[l]]),
             "rmsnorm backward");
    TM_CHECK(finish(m, "tmc_route_backward"));
fail:
    return st;
}

seldp_status tmc_combine_forward(tmc_model *m, int l, const float *y, float *h)
{
    seldp_status st = check_layer(m, l, "tmc_combine_forward");
    if (st != SELDP_OK)
        return st;
    tmc_layer *c = &m->layers[l];
    if (!c->routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: tmc_combine_forward: layer %d before tmc_route_forward",
                           m->rank, l);
    const size_t T = m->T;
    const int D = m->cfg.d_model, K = m->cfg.top_k;
    TM_CHECK(use_device(m));
    if (T) {
        CUDA_TRY(cudaMemcpyAsync(c->y, y, T * (size_t)K * (size_t)D * sizeof(float),
                                 cudaMemcpyDeviceToDevice, m->stream),
                 "expert output copy");
        CUDA_TRY(tmc_k_combine_forward(m->stream, c->h_in, c->gate, c->y, T, K, D, h), "combine");
        TM_CHECK(finish(m, "tmc_combine_forward"));
    }
    c->combined = true;
fail:
    return st;
}

seldp_status tmc_combine_backward(tmc_model *m, int l, const float *dh, float *dy)
{
    seldp_status st = check_layer(m, l, "tmc_combine_backward");
    if (st != SELDP_OK)
        return st;
    tmc_layer *c = &m->layers[l];
    if (!c->combined)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: tmc_combine_backward: layer %d before tmc_combine_forward",
                           m->rank, l);
    TM_CHECK(use_device(m));
    if (m->T) {
        CUDA_TRY(tmc_k_combine_backward(m->stream, dh, c->gate, c->y, m->T, m->cfg.top_k,
                                        m->cfg.d_model, dy, c->dgate),
                 "combine backward");
        TM_CHECK(finish(m, "tmc_combine_backward"));
    }
    c->combined_back = true;
fail:
    return st;
}

// x (n,D), w1 (F,D), w2 (D,F); pre (n,F), act (n,F), y (n,D) (y may be NULL)
static seldp_status expert_ffn(tmc_model *m, const tmc_expert *s, const float *x, size_t n,
                               float *pre, float *act, float *y)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model, F = m->cfg.d_ff;
    TM_CHECK(gemm(m, false, true, (int)n, F, D, 1.0f, x, D, s->w1.eff, D, 0.0f, pre, F));
    CUDA_TRY(tmc_k_silu_forward(m->stream, pre, act, n * (size_t)F), "silu");
    if (y)
        TM_CHECK(gemm(m, false, true, (int)n, D, F, 1.0f, act, F, s->w2.eff, F, 0.0f, y, D));
fail:
    return st;
}

seldp_status tmc_expert_forward(tmc_model *m, int l, int e, const float *x, size_t n, float *y)
{
    seldp_status st;
    const tmc_expert *s = held_expert(m, l, e, "tmc_expert_forward", &st);
    float *pre = NULL;
    if (!s)
        return st;
    if (n == 0)
        return SELDP_OK;
    const size_t nF = n * (size_t)m->cfg.d_ff;
    TM_CHECK(use_device(m));
    TM_CHECK(scratch(m, 2 * nF * sizeof(float), (void **)&pre));
    TM_CHECK(expert_ffn(m, s, x, n, pre, pre + nF, y));
    TM_CHECK(finish(m, "tmc_expert_forward"));
fail:
    return st;
}

/* LoRA: W_eff = W + c B A, so dB += c dW A^T and dA += c B^T dW. dW (out,in). */
static seldp_status lora_backward(tmc_model *m, const tmc_linear *lin, const float *dW)
{
    seldp_status st = SELDP_OK;
    const int r = m->cfg.lora_rank;
    const float c = (float)(m->cfg.lora_alpha / r);
    // dB (out,r) += c dW (out,in) . A^T (in,r)
    TM_CHECK(gemm(m, false, true, lin->out, r, lin->in, c, dW, lin->in, m->work[lin->lora_a],
                     lin->in, 1.0f, m->grad[lin->lora_b], r));
    // dA (r,in) += c B^T (r,out) . dW (out,in)
    TM_CHECK(gemm(m, true, false, r, lin->in, lin->out, c, m->work[lin->lora_b], r, dW, lin->in,
                     1.0f, m->grad[lin->lora_a], lin->in));
fail:
    return st;
}

seldp_status tmc_expert_backward(tmc_model *m, int l, int e, const float *x, const float *dy,
                                 size_t n, float *dx)
{
    seldp_status st;
    const tmc_expert *s = held_expert(m, l, e, "tmc_expert_backward", &st);
    float *buf = NULL;
    if (!s)
        return st;
    if (n == 0)
        return SELDP_OK;
    const int D = m->cfg.d_model, F = m->cfg.d_ff;
    const bool dense = s->w1.dense >= 0;
    const size_t nF = n * (size_t)F;
    TM_CHECK(use_device(m));
    TM_CHECK(
        scratch(m, (3 * nF + (dense ? 0 : (size_t)D * (size_t)F)) * sizeof(float), (void **)&buf));
    float *pre = buf, *act = buf + nF, *dact = buf + 2 * nF;
    float *dW = dense ? NULL : buf + 3 * nF; /* (D,F) or (F,D): both D*F floats */
    TM_CHECK(expert_ffn(m, s, x, n, pre, act, NULL));
    // dact (n,F) = dy (n,D) . w2 (D,F)
    TM_CHECK(gemm(m, false, false, (int)n, F, D, 1.0f, dy, D, s->w2.eff, F, 0.0f, dact, F));
    // dw2 (D,F) = dy^T (D,n) . act (n,F)
    TM_CHECK(gemm(m, true, false, D, F, (int)n, 1.0f, dy, D, act, F, dense ? 1.0f : 0.0f,
                     dense ? m->grad[s->w2.dense] : dW, F));
    if (!dense)
        TM_CHECK(lora_backward(m, &s->w2, dW));
    CUDA_TRY(tmc_k_silu_backward(m->stream, pre, dact, nF), "silu backward");
    // dw1 (F,D) = dpre^T (F,n) . x (n,D)
    TM_CHECK(gemm(m, true, false, F, D, (int)n, 1.0f, dact, F, x, D, dense ? 1.0f : 0.0f,
                     dense ? m->grad[s->w1.dense] : dW, D));
    if (!dense)
        TM_CHECK(lora_backward(m, &s->w1, dW));
    // dx (n,D) = dpre (n,F) . w1 (F,D)
    if (dx)
        TM_CHECK(gemm(m, false, false, (int)n, D, F, 1.0f, dact, F, s->w1.eff, D, 0.0f, dx, D));
    TM_CHECK(finish(m, "tmc_expert_backward"));
    m->seen[(size_t)l * (size_t)m->cfg.experts + (size_t)e] = true;
fail:
    return st;
}

seldp_status tmc_head_forward_backward(tmc_model *m, const float *h, const int32_t *targets,
                                       double *loss_sum, float *dh)
{
    seldp_status st = SELDP_OK;
    float *host_loss = NULL;
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "rank %d: tmc_head_forward_backward before tmc_embed_forward", m->rank);
    const size_t T = m->T;
    const int D = m->cfg.d_model, V = m->cfg.vocab;
    for (size_t t = 0; t < T; t++)
        if (targets[t] < 0 || targets[t] >= V)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: target %zu is %d, expected an id in [0, %d)", m->rank, t,
                               (int)targets[t], V);
    double loss = 0.0;
    if (T == 0)
        goto done;
    TM_CHECK(use_device(m));
    const size_t TD = T * (size_t)D;
    float *buf = NULL;
    TM_CHECK(scratch(m, (2 * TD + 2 * T + T * (size_t)V) * sizeof(float) + T * sizeof(int32_t),
                        (void **)&buf));
    float *z = buf, *dz = buf + TD, *rstd = buf + 2 * TD, *tok_loss = rstd + T;
    float *logits = tok_loss + T;
    int32_t *dtargets = (int32_t *)(logits + T * (size_t)V);
    const float *gf = m->work[m->final_norm], *emb = m->work[m->embed];
    host_loss = malloc(T * sizeof *host_loss);
    if (!host_loss)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu token losses", m->rank, T);
    CUDA_TRY(
        cudaMemcpyAsync(dtargets, targets, T * sizeof *targets, cudaMemcpyHostToDevice, m->stream),
        "target upload");
    CUDA_TRY(tmc_k_rmsnorm_forward(m->stream, h, gf, T, D, (float)m->cfg.eps, z, rstd),
             "final rmsnorm");
    // logits (T,V) = z (T,D) . embed^T (D,V)
    TM_CHECK(gemm(m, false, true, (int)T, V, D, 1.0f, z, D, emb, D, 0.0f, logits, V));
    CUDA_TRY(tmc_k_cross_entropy(m->stream, logits, dtargets, T, V, tok_loss), "cross-entropy");
    // dz (T,D) = dlogits (T,V) . embed (V,D)
    TM_CHECK(gemm(m, false, false, (int)T, D, V, 1.0f, logits, V, emb, D, 0.0f, dz, D));
    // d embed (V,D) += dlogits^T (V,T) . z (T,D)   (the tied lm_head)
    TM_CHECK(
        gemm(m, true, false, V, D, (int)T, 1.0f, logits, V, z, D, 1.0f, m->grad[m->embed], D));
    CUDA_TRY(cudaMemsetAsync(dh, 0, TD * sizeof *dh, m->stream), "cudaMemset");
    CUDA_TRY(tmc_k_rmsnorm_backward(m->stream, dz, h, gf, rstd, T, D, dh, m->grad[m->final_norm]),
             "final rmsnorm backward");
    CUDA_TRY(cudaMemcpyAsync(host_loss, tok_loss, T * sizeof *host_loss, cudaMemcpyDeviceToHost,
                             m->stream),
             "loss download");
    TM_CHECK(finish(m, "tmc_head_forward_backward"));
    for (size_t t = 0; t < T; t++)
        loss += (double)host_loss[t];
done:
    if (loss_sum)
        *loss_sum = loss;
fail:
    free(host_loss);
    return st;
}

seldp_status tmc_copy_rows(tmc_model *m, float *dst, const int64_t *dst_rows, const float *src,
                           const int64_t *src_rows, size_t n, int D)
{
    seldp_status st = SELDP_OK;
    if (n == 0)
        return SELDP_OK;
    TM_CHECK(use_device(m));
    if (2 * n > m->rows_capacity) {
        cudaFree(m->rows);
        m->rows = NULL;
        m->rows_capacity = 0;
        TM_CHECK(device_alloc(m, 2 * n * sizeof(int64_t), (void **)&m->rows));
        m->rows_capacity = 2 * n;
    }
    int64_t *d_dst = NULL, *d_src = NULL;
    if (dst_rows) {
        d_dst = m->rows;
        CUDA_TRY(cudaMemcpyAsync(d_dst, dst_rows, n * sizeof *dst_rows, cudaMemcpyHostToDevice,
                                 m->stream),
                 "row index upload");
    }
    if (src_rows) {
        d_src = m->rows + n;
        CUDA_TRY(cudaMemcpyAsync(d_src, src_rows, n * sizeof *src_rows, cudaMemcpyHostToDevice,
                                 m->stream),
                 "row index upload");
    }
    CUDA_TRY(tmc_k_copy_rows(m->stream, dst, d_dst, src, d_src, n, D), "row copy");
    TM_CHECK(finish(m, "tmc_copy_rows"));
fail:
    return st;
}

/* Host indices of the slots (per_slot) or tokens routed to expert e; returns the count. */
static size_t routed_rows(const tmc_route *r, int e, bool per_slot, int64_t *rows)
{
    size_t n = 0;
    for (size_t slot = 0; slot < r->T * (size_t)r->K; slot++)
        if (r->expert[slot] == e)
            rows[n++] = (int64_t)(per_slot ? slot : slot / (size_t)r->K);
    return n;
}

seldp_status tmc_step_local(tmc_model *m, const int32_t *tokens, const int32_t *targets, size_t T,
                            double *loss_sum)
{
    seldp_status st = SELDP_OK;
    const int D = m->cfg.d_model, E = m->cfg.experts, K = m->cfg.top_k, L = m->cfg.layers;
    float *buf = NULL;
    int64_t *tok_rows = NULL, *slot_rows = NULL;
    for (int e = 0; e < E; e++)
        if (!m->experts[e].held)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: tmc_step_local needs every expert; expert %d is not held",
                               m->rank, e);
    const size_t TD = T * (size_t)D, TKD = T * (size_t)K * (size_t)D;
    TM_CHECK(use_device(m));
    TM_CHECK(device_alloc(m, (2 * TD + 5 * TKD + 1) * sizeof(float), (void **)&buf));
    tok_rows = malloc((T * (size_t)K + 1) * sizeof *tok_rows);
    slot_rows = malloc((T * (size_t)K + 1) * sizeof *slot_rows);
    if (!tok_rows || !slot_rows)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for a step of %zu tokens", m->rank, T);
    float *h = buf, *dh = buf + TD, *y = buf + 2 * TD, *dy = y + TKD;
    float *xe = dy + TKD, *ye = xe + TKD, *de = ye + TKD; /* packed rows of one expert */

    TM_CHECK(tmc_begin_step(m));
    TM_CHECK(tmc_embed_forward(m, tokens, T, h));
    for (int l = 0; l < L; l++) {
        tmc_route route;
        TM_CHECK(tmc_route_forward(m, l, h, &route));
        for (int e = 0; e < E; e++) {
            size_t n = routed_rows(&route, e, false, tok_rows);
            routed_rows(&route, e, true, slot_rows);
            TM_CHECK(tmc_copy_rows(m, xe, NULL, route.x, tok_rows, n, D));
            TM_CHECK(tmc_expert_forward(m, l, e, xe, n, ye));
            TM_CHECK(tmc_copy_rows(m, y, slot_rows, ye, NULL, n, D));
        }
        TM_CHECK(tmc_combine_forward(m, l, y, h));
    }
    TM_CHECK(tmc_head_forward_backward(m, h, targets, loss_sum, dh));
    for (int l = L - 1; l >= 0; l--) {
        tmc_route route;
        TM_CHECK(tmc_route_get(m, l, &route));
        TM_CHECK(tmc_combine_backward(m, l, dh, dy));
        for (int e = 0; e < E; e++) {
            size_t n = routed_rows(&route, e, false, tok_rows);
            routed_rows(&route, e, true, slot_rows);
            TM_CHECK(tmc_copy_rows(m, xe, NULL, route.x, tok_rows, n, D));
            TM_CHECK(tmc_copy_rows(m, de, NULL, dy, slot_rows, n, D));
            TM_CHECK(tmc_expert_backward(m, l, e, xe, de, n, ye));
            TM_CHECK(tmc_copy_rows(m, y, slot_rows, ye, NULL, n, D)); /* y: dx per slot */
        }
        TM_CHECK(tmc_route_backward(m, l, y, dh));
    }
    TM_CHECK(tmc_embed_backward(m, dh));
fail:
    cudaFree(buf);
    free(tok_rows);
    free(slot_rows);
    return st;
}

bool tmc_expert_seen(const tmc_model *m, int l, int e)
{
    if (!m || l < 0 || l >= m->cfg.layers || e < 0 || e >= m->cfg.experts)
        return false;
    return m->seen[(size_t)l * (size_t)m->cfg.experts + (size_t)e];
}

const float *tmc_param_grad(const tmc_model *m, const char *path)
{
    int i = m && path ? find(m, path) : -1;
    return i >= 0 ? m->grad[i] : NULL;
}

seldp_status tmc_export_grads(const tmc_model *m, unsigned roles, double scale, bool fp32,
                              seldp_grads *out)
{
    seldp_status st = SELDP_OK;
    seldp_param_id *put = NULL;
    size_t n_put = 0;
    if (!m || !out)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tmc_export_grads: NULL argument");
    TM_CHECK(use_device(m));
    put = malloc((m->n ? m->n : 1) * sizeof *put);
    if (!put)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory exporting gradients", m->rank);
    for (size_t i = 0; i < m->n; i++) {
        const tm_param_info *p = m->info[i];
        if (!m->grad[i] || m->alias[i] || !(p->role & roles))
            continue;
        if (p->expert >= 0 && !tmc_expert_seen(m, p->layer, p->expert))
            continue;
        seldp_tensor t = m->dev[i];
        t.dtype = fp32 ? SELDP_F32 : m->dev[i].dtype;
        t.data = NULL;
        TM_CHECK(seldp_tensor_alloc(&t));
        cudaError_t err =
            tmc_k_export(m->stream, m->grad[i], seldp_tensor_numel(&t), scale, t.dtype, t.data);
        if (err == cudaSuccess)
            err = cudaStreamSynchronize(m->stream);
        if (err == cudaSuccess)
            st = seldp_grads_put(out, p->id, &t, SELDP_OWNED);
        if (err != cudaSuccess || st != SELDP_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s",
                     err != cudaSuccess ? cudaGetErrorString(err) : seldp_last_error());
            seldp_tensor_free(&t);
            TM_FAIL(err != cudaSuccess ? SELDP_ERR_TRANSPORT : st,
                       "rank %d: exporting the gradient of %s (id %llu): %s", m->rank, p->path,
                       (unsigned long long)p->id, why);
        }
        put[n_put++] = p->id;
    }
    free(put);
    return SELDP_OK;
fail:
    for (size_t k = 0; k < n_put; k++)
        seldp_grads_remove(out, put[k]);
    free(put);
    return st;
}
