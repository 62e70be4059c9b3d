/* tiny-moe on one CUDA device: device storage and view, FP32 working copies, the step's
 * activations and the gradients (the forward/backward pieces are in tmc_step.c). Every public
 * function synchronizes the model's stream before it returns. */
#include "cuda/tmc_internal.h"

seldp_status tmc__use_device(const tmc_model *m)
{
    seldp_status st = SELDP_OK;
    int cur = -1;
    CUDA_TRY(cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != m->ordinal)
        CUDA_TRY(cudaSetDevice(m->ordinal), "cudaSetDevice");
fail:
    return st;
}

seldp_status tmc__finish(const tmc_model *m, const char *what)
{
    seldp_status st = SELDP_OK;
    CUDA_TRY(cudaStreamSynchronize(m->stream), what);
fail:
    return st;
}

seldp_status tmc__device_alloc(const tmc_model *m, size_t bytes, void **out)
{
    seldp_status st = SELDP_OK;
    *out = NULL;
    cudaError_t err = cudaMalloc(out, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d (cuda:%d): cudaMalloc of %zu bytes failed: %s", m->rank,
                m->ordinal, bytes, cudaGetErrorString(err));
    }
fail:
    return st;
}

/* At least `bytes` of scratch. Called before any work of the call is queued, while the
 * stream is idle, so freeing the old block is safe. */
seldp_status tmc__scratch(tmc_model *m, size_t bytes, void **out)
{
    seldp_status st = SELDP_OK;
    if (bytes > m->scratch_bytes) {
        cudaFree(m->scratch);
        m->scratch = NULL;
        m->scratch_bytes = 0;
        TM_CHECK(tmc__device_alloc(m, bytes, &m->scratch));
        m->scratch_bytes = bytes;
    }
    *out = m->scratch;
fail:
    return st;
}

/* cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, ...) on cuBLAS: a row-major matrix is the
 * column-major transpose, so C^T = op(B)^T op(A)^T swaps the operands. */
seldp_status tmc__gemm(const tmc_model *m, bool ta, bool tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C,
                       int ldc)
{
    seldp_status st = SELDP_OK;
    if (M == 0 || N == 0)
        return SELDP_OK;
    BLAS_TRY(m->cublas->sgemm(m->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda,
                              &beta, C, ldc),
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
        TM_FAIL(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tmc_model_create: %s is incomplete", m->rank,
                prefix);
    TM_CHECK(tmc__device_alloc(m, (size_t)out * (size_t)in * sizeof(float), (void **)&lin->eff));
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
        TM_CHECK(tmc__device_alloc(m, bytes, (void **)&m->work[i]));
        TM_CHECK(tmc__device_alloc(m, bytes, (void **)&m->grad[i]));
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
    TM_CHECK(tmc__use_device(m));
    CUDA_TRY(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const char *why = NULL;
    m->cublas = tmc_cublas_api(&why);
    if (!m->cublas)
        TM_FAIL(SELDP_ERR_TRANSPORT, "rank %d (cuda:%d): %s", m->rank, m->ordinal, why);
    BLAS_TRY(m->cublas->create(&m->blas), "cublasCreate");
    BLAS_TRY(m->cublas->set_stream(m->blas, m->stream), "cublasSetStream");
    /* Plain FP32 products: TF32 would miss the 1e-5 agreement with the FP64 reference. */
    BLAS_TRY(m->cublas->set_math_mode(m->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

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
    tmc__use_device(m);
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
        m->cublas->destroy(m->blas);
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
    TM_CHECK(tmc__use_device(m));
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

seldp_status tmc__effective_weight(tmc_model *m, const tmc_linear *lin)
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
    TM_CHECK(tmc__gemm(m, false, false, lin->out, lin->in, r, (float)(m->cfg.lora_alpha / r),
                       m->work[lin->lora_b], r, m->work[lin->lora_a], lin->in, 1.0f, lin->eff,
                       lin->in));
fail:
    return st;
}

seldp_status tmc_begin_step(tmc_model *m)
{
    seldp_status st = SELDP_OK;
    TM_CHECK(tmc__use_device(m));
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
        TM_CHECK(tmc__effective_weight(m, &m->experts[k].w1));
        TM_CHECK(tmc__effective_weight(m, &m->experts[k].w2));
    }
    TM_CHECK(tmc__finish(m, "tmc_begin_step"));
    memset(m->seen, 0, LE * sizeof *m->seen);
    m->embedded = false;
    m->T = 0;
    for (int l = 0; l < m->cfg.layers; l++)
        m->layers[l].routed = m->layers[l].combined = m->layers[l].combined_back = false;
fail:
    return st;
}

seldp_status tmc__ensure_layers(tmc_model *m, size_t T)
{
    seldp_status st = SELDP_OK;
    if (T <= m->T_capacity && m->tokens)
        return SELDP_OK;
    free_layers(m);
    const size_t cap = T ? T : 1, D = (size_t)m->cfg.d_model, E = (size_t)m->cfg.experts;
    const size_t K = (size_t)m->cfg.top_k, f = sizeof(float);
    TM_CHECK(tmc__device_alloc(m, cap * sizeof(int32_t), (void **)&m->tokens));
    m->host_tokens = malloc(cap * sizeof *m->host_tokens);
    if (!m->host_tokens)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu tokens", m->rank, T);
    for (int l = 0; l < m->cfg.layers; l++) {
        tmc_layer *c = &m->layers[l];
        TM_CHECK(tmc__device_alloc(m, cap * D * f, (void **)&c->h_in));
        TM_CHECK(tmc__device_alloc(m, cap * f, (void **)&c->rstd));
        TM_CHECK(tmc__device_alloc(m, cap * D * f, (void **)&c->u));
        TM_CHECK(tmc__device_alloc(m, cap * E * f, (void **)&c->probs));
        TM_CHECK(tmc__device_alloc(m, cap * K * f, (void **)&c->gate));
        TM_CHECK(tmc__device_alloc(m, cap * K * D * f, (void **)&c->y));
        TM_CHECK(tmc__device_alloc(m, cap * K * f, (void **)&c->dgate));
        TM_CHECK(tmc__device_alloc(m, cap * K * sizeof(int), (void **)&c->expert));
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

seldp_status tmc__check_layer(const tmc_model *m, int l, const char *fn)
{
    if (l < 0 || l >= m->cfg.layers)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: layer %d outside [0, %d)",
                        m->rank, fn, l, m->cfg.layers);
    if (!m->embedded)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: %s: layer %d called before tmc_embed_forward", m->rank, fn, l);
    return SELDP_OK;
}

const tmc_expert *tmc__held_expert(const tmc_model *m, int l, int e, const char *fn,
                                   seldp_status *st)
{
    *st = SELDP_OK;
    if (l < 0 || l >= m->cfg.layers) {
        *st = tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s: layer %d outside [0, %d)", m->rank,
                       fn, l, m->cfg.layers);
        return NULL;
    }
    const tmc_expert *x = e >= 0 && e < m->cfg.experts
                              ? &m->experts[(size_t)l * (size_t)m->cfg.experts + (size_t)e]
                              : NULL;
    if (!x || !x->held) {
        *st = tm__fail(SELDP_ERR_NOT_FOUND,
                       "rank %d: %s: layers.%d.experts.%d is not held by this rank", m->rank, fn, l,
                       e);
        return NULL;
    }
    return x;
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

/* Occurrence i's gradient into out (*put: whether it had one to put). */
static seldp_status export_one(const tmc_model *m, size_t i, double scale, bool fp32,
                               seldp_grads *out, bool *put)
{
    seldp_status st = SELDP_OK;
    const tm_param_info *p = m->info[i];
    *put = false;
    if (!m->grad[i] || m->alias[i])
        return SELDP_OK;
    if (p->expert >= 0 && !tmc_expert_seen(m, p->layer, p->expert))
        return SELDP_OK;
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
    *put = true;
fail:
    return st;
}

seldp_status tmc_export_grad(const tmc_model *m, size_t index, double scale, bool fp32,
                             seldp_grads *out)
{
    bool put = false;
    if (!m || !out)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tmc_export_grad: NULL argument");
    if (index >= m->n)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tmc_export_grad: occurrence %zu of %zu is out of range", index, m->n);
    seldp_status st = tmc__use_device(m);
    if (st != SELDP_OK)
        return st;
    return export_one(m, index, scale, fp32, out, &put);
}

seldp_status tmc_export_grads(const tmc_model *m, unsigned roles, double scale, bool fp32,
                              seldp_grads *out)
{
    seldp_status st = SELDP_OK;
    seldp_param_id *put = NULL;
    size_t n_put = 0;
    if (!m || !out)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tmc_export_grads: NULL argument");
    TM_CHECK(tmc__use_device(m));
    put = malloc((m->n ? m->n : 1) * sizeof *put);
    if (!put)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory exporting gradients", m->rank);
    for (size_t i = 0; i < m->n; i++) {
        bool added = false;
        if (!(m->info[i]->role & roles))
            continue;
        TM_CHECK(export_one(m, i, scale, fp32, out, &added));
        if (added)
            put[n_put++] = m->info[i]->id;
    }
    free(put);
    return SELDP_OK;
fail:
    for (size_t k = 0; k < n_put; k++)
        seldp_grads_remove(out, put[k]);
    free(put);
    return st;
}
