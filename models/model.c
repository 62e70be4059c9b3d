/* The rank-local tiny-moe model: its parameters (one contiguous block per dtype, llm.c
 * style), their deterministic rank-dependent initialization, their registration in a seldp
 * model view, the FP32 working copies and gradient accumulators, and gradient export. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"

#include "tm_internal.h"

#define TM_ALIGN 64

/* ---- layout ------------------------------------------------------------------------- */

typedef struct layout {
    tm_model *m;
    size_t offset[SELDP_DTYPE_COUNT]; /* bytes used so far per dtype */
    size_t *param_offset;             /* per param: byte offset in its dtype's block */
    size_t cap;                       /* entries of m->params and param_offset */
    size_t work_floats;
} layout;

static seldp_status add_param(layout *lay, const char *path, seldp_dtype dtype, int ndim,
                              const int64_t *shape, tm_role role, int l, int e)
{
    tm_model *m = lay->m;
    size_t i = m->n_params;
    if (i == lay->cap)
        return tm__fail(SELDP_ERR_INTERNAL, "rank %d: more than %zu parameters at %s", m->rank,
                        lay->cap, path);
    tm_param_info *p = &m->params[i];
    char *copy = malloc(strlen(path) + 1);
    if (!copy)
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory for path %s", m->rank, path);
    strcpy(copy, path);
    p->path = copy;
    p->tensor = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, NULL, ndim, shape);
    p->frozen = (role == TM_ROLE_EXPERT_BASE || role == TM_ROLE_SHARED_BUFFER);
    p->role = role;
    p->layer = l;
    p->expert = e;
    p->alias = false;
    size_t bytes = seldp_tensor_nbytes(&p->tensor);
    lay->param_offset[i] = lay->offset[dtype];
    lay->offset[dtype] += (bytes + TM_ALIGN - 1) / TM_ALIGN * TM_ALIGN;
    m->n_params++;
    return SELDP_OK;
}

static size_t numel_of(const tm_model *m, int i)
{
    return seldp_tensor_numel(&m->params[i].tensor);
}

/* One expert linear [out, in] named `prefix` (layers.{l}.experts.{e}.w1 or .w2). */
static seldp_status add_linear(layout *lay, tm_linear *lin, const char *prefix, int out, int in,
                               int l, int e)
{
    seldp_status st = SELDP_OK;
    tm_model *m = lay->m;
    const tm_config *cfg = &m->cfg;
    char path[128];
    lin->out = out;
    lin->in = in;
    lin->dense = lin->qweight = lin->absmax = lin->scales = lin->qzeros = -1;
    lin->lora_a = lin->lora_b = -1;
    if (cfg->quant == TM_QUANT_NONE) {
        snprintf(path, sizeof path, "%s.weight", prefix);
        lin->dense = (int)m->n_params;
        TM_CHECK(add_param(lay, path, cfg->dtype, 2, (int64_t[]){out, in}, TM_ROLE_EXPERT, l, e));
        return SELDP_OK;
    }
    int64_t n = (int64_t)out * in;
    if (cfg->quant == TM_QUANT_NF4) {
        snprintf(path, sizeof path, "%s.qweight", prefix);
        lin->qweight = (int)m->n_params;
        TM_CHECK(add_param(lay, path, SELDP_U8, 1, (int64_t[]){n / 2}, TM_ROLE_EXPERT_BASE, l, e));
        snprintf(path, sizeof path, "%s.absmax", prefix);
        lin->absmax = (int)m->n_params;
        TM_CHECK(add_param(lay, path, SELDP_F32, 1, (int64_t[]){n / TM_NF4_BLOCK},
                           TM_ROLE_EXPERT_BASE, l, e));
    } else {
        int groups = in / TM_AWQ_GROUP;
        snprintf(path, sizeof path, "%s.qweight", prefix);
        lin->qweight = (int)m->n_params;
        TM_CHECK(add_param(lay, path, SELDP_I32, 2, (int64_t[]){out, in / 8}, TM_ROLE_EXPERT_BASE,
                           l, e));
        snprintf(path, sizeof path, "%s.scales", prefix);
        lin->scales = (int)m->n_params;
        TM_CHECK(add_param(lay, path, SELDP_F16, 2, (int64_t[]){out, groups}, TM_ROLE_EXPERT_BASE,
                           l, e));
        snprintf(path, sizeof path, "%s.qzeros", prefix);
        lin->qzeros = (int)m->n_params;
        TM_CHECK(add_param(lay, path, SELDP_I32, 2, (int64_t[]){out, (groups + 7) / 8},
                           TM_ROLE_EXPERT_BASE, l, e));
    }
    int r = cfg->lora_rank;
    snprintf(path, sizeof path, "%s.lora_a.weight", prefix);
    lin->lora_a = (int)m->n_params;
    TM_CHECK(add_param(lay, path, cfg->dtype, 2, (int64_t[]){r, in}, TM_ROLE_ADAPTER, l, e));
    snprintf(path, sizeof path, "%s.lora_b.weight", prefix);
    lin->lora_b = (int)m->n_params;
    TM_CHECK(add_param(lay, path, cfg->dtype, 2, (int64_t[]){out, r}, TM_ROLE_ADAPTER, l, e));
    /* The effective weight of a quantized expert lives in the work block. */
    lay->work_floats += (size_t)n;
    return SELDP_OK;
fail:
    return st;
}

static seldp_status build_layout(layout *lay)
{
    seldp_status st = SELDP_OK;
    tm_model *m = lay->m;
    const tm_config *cfg = &m->cfg;
    const int V = cfg->vocab, D = cfg->d_model, F = cfg->d_ff, E = cfg->experts;
    char path[128];

    const tm_part *part = &m->part;
    m->embed = m->final_norm = -1;
    for (int l = 0; l < cfg->layers; l++)
        m->norm[l] = m->router[l] = m->shared_w1[l] = m->shared_w2[l] = -1;
    if (part->embed) {
        m->embed = (int)m->n_params;
        TM_CHECK(add_param(lay, "embed.weight", cfg->dtype, 2, (int64_t[]){V, D}, TM_ROLE_SHARED,
                           -1, -1));
    } else if (part->head) {
        /* the last stage's copy of the tied embedding (pipeline parallelism) */
        m->embed = (int)m->n_params;
        TM_CHECK(add_param(lay, "lm_head.weight", cfg->dtype, 2, (int64_t[]){V, D}, TM_ROLE_SHARED,
                           -1, -1));
    }
    if (part->embed && part->head) {
        /* The tied head: a second occurrence of embed's storage, allocated nothing. */
        if (m->n_params == lay->cap)
            TM_FAIL(SELDP_ERR_INTERNAL, "rank %d: more than %zu parameters", m->rank, lay->cap);
        tm_param_info *head = &m->params[m->n_params];
        char *head_path = malloc(sizeof "lm_head.weight");
        if (!head_path)
            TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", m->rank);
        strcpy(head_path, "lm_head.weight");
        *head = m->params[m->embed];
        head->path = head_path;
        head->alias = true;
        lay->param_offset[m->n_params] = lay->param_offset[m->embed];
        m->n_params++;
    }

    for (int l = part->first_layer; l < part->end_layer; l++) {
        snprintf(path, sizeof path, "layers.%d.norm.weight", l);
        m->norm[l] = (int)m->n_params;
        TM_CHECK(add_param(lay, path, cfg->dtype, 1, (int64_t[]){D}, TM_ROLE_SHARED, l, -1));
        snprintf(path, sizeof path, "layers.%d.router.weight", l);
        m->router[l] = (int)m->n_params;
        TM_CHECK(add_param(lay, path, cfg->dtype, 2, (int64_t[]){E, D}, TM_ROLE_SHARED, l, -1));
        m->shared_w1[l] = m->shared_w2[l] = -1;
        if (cfg->d_ff_shared > 0) {
            const int Fs = cfg->d_ff_shared;
            snprintf(path, sizeof path, "layers.%d.shared_expert.w1.weight", l);
            m->shared_w1[l] = (int)m->n_params;
            TM_CHECK(
                add_param(lay, path, cfg->dtype, 2, (int64_t[]){Fs, D}, TM_ROLE_SHARED, l, -1));
            snprintf(path, sizeof path, "layers.%d.shared_expert.w2.weight", l);
            m->shared_w2[l] = (int)m->n_params;
            TM_CHECK(
                add_param(lay, path, cfg->dtype, 2, (int64_t[]){D, Fs}, TM_ROLE_SHARED, l, -1));
        }
        for (int e = 0; e < E; e++) {
            tm_expert_slot *slot = &m->experts[(size_t)l * (size_t)E + (size_t)e];
            slot->held = m->owns[e];
            if (!slot->held)
                continue;
            snprintf(path, sizeof path, "layers.%d.experts.%d.w1", l, e);
            TM_CHECK(add_linear(lay, &slot->w1, path, F, D, l, e));
            snprintf(path, sizeof path, "layers.%d.experts.%d.w2", l, e);
            TM_CHECK(add_linear(lay, &slot->w2, path, D, F, l, e));
        }
    }
    if (part->head) {
        m->final_norm = (int)m->n_params;
        TM_CHECK(add_param(lay, "final_norm.weight", cfg->dtype, 1, (int64_t[]){D}, TM_ROLE_SHARED,
                           -1, -1));
    }
    m->codebook = -1;
    if (cfg->quant == TM_QUANT_NF4) {
        m->codebook = (int)m->n_params;
        TM_CHECK(add_param(lay, "nf4.codebook", SELDP_F32, 1, (int64_t[]){16},
                           TM_ROLE_SHARED_BUFFER, -1, -1));
    }
    return SELDP_OK;
fail:
    return st;
}

/* ---- initialization ------------------------------------------------------------------ */

/* A stream keyed by (seed, rank, path): the values of a parameter do not depend on which
 * other parameters (experts) the rank holds. */
static uint64_t stream_for(const tm_config *cfg, int rank, const char *path)
{
    uint64_t s = cfg->seed;
    uint64_t r = (uint64_t)(int64_t)rank ^ 0x5851f42d4c957f2dull;
    uint64_t key = tm_splitmix64(&s) ^ (tm_splitmix64(&r) * 3u) ^ tm_hash_path(path);
    return tm_splitmix64(&key);
}

/* Uniform in [-a, a) as a double, from the top 53 bits. */
static double uniform(uint64_t *state, double a)
{
    double u = (double)(tm_splitmix64(state) >> 11) * 0x1.0p-53;
    return (2.0 * u - 1.0) * a;
}

void tm__store_value(void *data, seldp_dtype dtype, size_t i, float v)
{
    if (dtype == SELDP_F32)
        ((float *)data)[i] = v;
    else if (dtype == SELDP_F16)
        ((uint16_t *)data)[i] = seldp_f32_to_f16(v);
    else
        ((uint16_t *)data)[i] = seldp_f32_to_bf16(v);
}

static void fill_uniform(const tm_model *m, int i, double center, double a)
{
    const tm_param_info *p = &m->params[i];
    uint64_t state = stream_for(&m->cfg, m->rank, p->path);
    size_t n = seldp_tensor_numel(&p->tensor);
    for (size_t k = 0; k < n; k++)
        tm__store_value(p->tensor.data, p->tensor.dtype, k, (float)(center + uniform(&state, a)));
}

static seldp_status init_linear(tm_model *m, const tm_linear *lin, const char *prefix)
{
    seldp_status st = SELDP_OK;
    float *dense = NULL;
    double a = sqrt(3.0 / lin->in);
    if (lin->dense >= 0) {
        fill_uniform(m, lin->dense, 0.0, a);
        return SELDP_OK;
    }
    /* Quantize a dense random weight drawn as the dense variant's would be, so that the
     * bases of two ranks differ before initialize broadcasts them. */
    char path[128];
    snprintf(path, sizeof path, "%s.weight", prefix);
    size_t n = (size_t)lin->out * (size_t)lin->in;
    dense = malloc(n * sizeof *dense);
    if (!dense)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory quantizing %s", m->rank, path);
    uint64_t state = stream_for(&m->cfg, m->rank, path);
    for (size_t k = 0; k < n; k++)
        dense[k] = (float)uniform(&state, a);
    if (m->cfg.quant == TM_QUANT_NF4) {
        TM_CHECK(tm_nf4_quantize(dense, n, m->params[lin->qweight].tensor.data,
                                 m->params[lin->absmax].tensor.data));
    } else {
        TM_CHECK(tm_awq_quantize(dense, lin->out, lin->in, m->params[lin->qweight].tensor.data,
                                 m->params[lin->scales].tensor.data,
                                 m->params[lin->qzeros].tensor.data));
    }
    fill_uniform(m, lin->lora_a, 0.0, a);
    /* B is non-zero (unlike LoRA's usual zero init) so that A's gradient is not trivially 0. */
    fill_uniform(m, lin->lora_b, 0.0, 0.5 / sqrt((double)m->cfg.lora_rank));
fail:
    free(dense);
    return st;
}

static seldp_status init_values(tm_model *m)
{
    seldp_status st = SELDP_OK;
    const tm_config *cfg = &m->cfg;
    const int E = cfg->experts;
    char prefix[96];
    if (m->embed >= 0)
        fill_uniform(m, m->embed, 0.0, 0.5);
    for (int l = m->part.first_layer; l < m->part.end_layer; l++) {
        fill_uniform(m, m->norm[l], 1.0, 0.2);
        fill_uniform(m, m->router[l], 0.0, sqrt(3.0 / cfg->d_model));
        if (m->shared_w1[l] >= 0) {
            fill_uniform(m, m->shared_w1[l], 0.0, sqrt(3.0 / cfg->d_model));
            fill_uniform(m, m->shared_w2[l], 0.0, sqrt(3.0 / cfg->d_ff_shared));
        }
        for (int e = 0; e < E; e++) {
            const tm_expert_slot *slot = &m->experts[(size_t)l * (size_t)E + (size_t)e];
            if (!slot->held)
                continue;
            snprintf(prefix, sizeof prefix, "layers.%d.experts.%d.w1", l, e);
            TM_CHECK(init_linear(m, &slot->w1, prefix));
            snprintf(prefix, sizeof prefix, "layers.%d.experts.%d.w2", l, e);
            TM_CHECK(init_linear(m, &slot->w2, prefix));
        }
    }
    if (m->final_norm >= 0)
        fill_uniform(m, m->final_norm, 1.0, 0.2);
    if (m->codebook >= 0)
        memcpy(m->params[m->codebook].tensor.data, tm_nf4_codebook, sizeof tm_nf4_codebook);
    return SELDP_OK;
fail:
    return st;
}

/* ---- creation ------------------------------------------------------------------------ */

static bool trainable(const tm_param_info *p)
{
    return !p->frozen;
}

static seldp_status register_view(tm_model *m, tm_param_id_fn id_fn, void *id_user)
{
    seldp_status st = SELDP_OK;
    TM_CHECK_LIB(seldp_model_create(m->rank, &m->view), "rank %d: creating the model view",
                 m->rank);
    for (size_t i = 0; i < m->n_params; i++) {
        tm_param_info *p = &m->params[i];
        p->id = p->alias ? m->params[m->embed].id : id_fn(p->path, m->rank, id_user);
        TM_CHECK_LIB(seldp_model_add(m->view, p->path, p->id, &p->tensor, p->frozen, p),
                     "rank %d: registering %s", m->rank, p->path);
    }
    return SELDP_OK;
fail:
    return st;
}

seldp_status tm_model_create(const tm_config *cfg, int rank, const int *experts, int n_experts,
                             tm_param_id_fn id_fn, void *id_user, tm_model **out)
{
    tm_part whole = {0, cfg ? cfg->layers : 0, true, true};
    return tm_model_create_part(cfg, &whole, rank, experts, n_experts, id_fn, id_user, out);
}

seldp_status tm_model_create_part(const tm_config *cfg, const tm_part *part, int rank,
                                  const int *experts, int n_experts, tm_param_id_fn id_fn,
                                  void *id_user, tm_model **out)
{
    seldp_status st = SELDP_OK;
    tm_model *m = NULL;
    layout lay = {0};
    if (!out || !part)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tm_model_create: %s is NULL", rank,
                        out ? "part" : "out");
    *out = NULL;
    TM_CHECK(tm_config_check(cfg));
    if (part->first_layer < 0 || part->end_layer > cfg->layers ||
        part->first_layer > part->end_layer ||
        (part->first_layer == part->end_layer && !part->embed && !part->head))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_model_create_part: layers [%d, %d) (embed %d, head %d), "
                        "expected a non-empty part of layers [0, %d)",
                        rank, part->first_layer, part->end_layer, part->embed, part->head,
                        cfg->layers);
    if (n_experts < 0 || (n_experts > 0 && !experts))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_model_create: %d experts with a NULL list", rank, n_experts);
    const int L = cfg->layers, E = cfg->experts;
    m = calloc(1, sizeof *m);
    if (!m)
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory creating tiny-moe", rank);
    m->cfg = *cfg;
    m->part = *part;
    m->tp = (tm_tp){1, 0, NULL, NULL, NULL};
    m->rank = rank;
    m->router_scale = 1.0;
    m->owns = calloc((size_t)E, sizeof *m->owns);
    m->norm = calloc((size_t)L, sizeof *m->norm);
    m->router = calloc((size_t)L, sizeof *m->router);
    m->shared_w1 = calloc((size_t)L, sizeof *m->shared_w1);
    m->shared_w2 = calloc((size_t)L, sizeof *m->shared_w2);
    m->experts = calloc((size_t)L * (size_t)E, sizeof *m->experts);
    m->seen = calloc((size_t)L * (size_t)E, sizeof *m->seen);
    m->cache = calloc((size_t)L, sizeof *m->cache);
    /* the parameters this rank holds: per layer a norm, a router, a shared expert's two, and
     * per held expert at most 10 pieces (quantized bases, scales and adapters) */
    size_t max_params = 6 + (size_t)L * (4 + (size_t)(n_experts < E ? n_experts : E) * 10);
    m->params = calloc(max_params, sizeof *m->params);
    lay.param_offset = calloc(max_params, sizeof *lay.param_offset);
    lay.cap = max_params;
    lay.m = m;
    if (!m->owns || !m->norm || !m->router || !m->shared_w1 || !m->shared_w2 || !m->experts ||
        !m->seen || !m->cache || !m->params || !lay.param_offset)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory creating tiny-moe", rank);
    for (int i = 0; i < n_experts; i++) {
        int e = experts[i];
        if (e < 0 || e >= E || m->owns[e])
            TM_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                    "rank %d: tm_model_create: expert list entry %d is %d, expected distinct "
                    "ids in [0, %d)",
                    rank, i, e, E);
        m->owns[e] = true;
    }
    TM_CHECK(build_layout(&lay));

    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        if (lay.offset[d] == 0)
            continue;
        m->storage[d] = aligned_alloc(TM_ALIGN, lay.offset[d]);
        if (!m->storage[d])
            TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory for %zu bytes of %s parameters", rank,
                    lay.offset[d], seldp_dtype_name((seldp_dtype)d));
        memset(m->storage[d], 0, lay.offset[d]);
    }
    /* FP32 working copies and gradients of trainable parameters; alias shares embed's. */
    m->work = calloc(m->n_params, sizeof *m->work);
    m->grad = calloc(m->n_params, sizeof *m->grad);
    if (!m->work || !m->grad)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory creating tiny-moe", rank);
    for (size_t i = 0; i < m->n_params; i++) {
        tm_param_info *p = &m->params[i];
        p->tensor.data = (char *)m->storage[p->tensor.dtype] + lay.param_offset[i];
        if (trainable(p) && !p->alias) {
            lay.work_floats += numel_of(m, (int)i);
            m->grad_floats += numel_of(m, (int)i);
        }
    }
    m->work_block = calloc(lay.work_floats ? lay.work_floats : 1, sizeof(float));
    m->grad_block = calloc(m->grad_floats ? m->grad_floats : 1, sizeof(float));
    if (!m->work_block || !m->grad_block)
        TM_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory creating tiny-moe", rank);
    size_t work_at = 0, grad_at = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        tm_param_info *p = &m->params[i];
        if (!trainable(p))
            continue;
        if (p->alias) {
            m->work[i] = m->work[m->embed];
            m->grad[i] = m->grad[m->embed];
            continue;
        }
        m->work[i] = m->work_block + work_at;
        m->grad[i] = m->grad_block + grad_at;
        work_at += numel_of(m, (int)i);
        grad_at += numel_of(m, (int)i);
    }
    for (size_t le = 0; le < (size_t)L * (size_t)E; le++) {
        tm_expert_slot *slot = &m->experts[le];
        if (!slot->held)
            continue;
        tm_linear *lins[2] = {&slot->w1, &slot->w2};
        for (int k = 0; k < 2; k++) {
            if (lins[k]->dense >= 0) {
                lins[k]->eff = m->work[lins[k]->dense];
            } else {
                lins[k]->eff = m->work_block + work_at;
                work_at += (size_t)lins[k]->out * (size_t)lins[k]->in;
            }
        }
    }
    TM_CHECK(init_values(m));
    TM_CHECK(register_view(m, id_fn ? id_fn : tm_default_param_id, id_user));
    free(lay.param_offset);
    tm_begin_step(m);
    *out = m;
    return SELDP_OK;
fail:
    free(lay.param_offset);
    tm_model_destroy(m);
    return st;
}

void tm_model_destroy(tm_model *m)
{
    if (!m)
        return;
    seldp_model_destroy(m->view);
    tm__free_cache_sets(m);
    if (m->params) {
        for (size_t i = 0; i < m->n_params; i++)
            free((char *)m->params[i].path);
    }
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++)
        free(m->storage[d]);
    free(m->params);
    free(m->work);
    free(m->grad);
    free(m->work_block);
    free(m->grad_block);
    free(m->owns);
    free(m->norm);
    free(m->router);
    free(m->shared_w1);
    free(m->shared_w2);
    free(m->experts);
    free(m->seen);
    free(m);
}

/* ---- per-step state ------------------------------------------------------------------ */

void tm__to_f32(seldp_dtype dtype, const void *src, float *dst, size_t n)
{
    if (dtype == SELDP_F32)
        memcpy(dst, src, n * sizeof(float));
    else
        seldp_half_to_f32(dtype, src, dst, n);
}

static void effective_weight(const tm_model *m, const tm_linear *lin)
{
    if (lin->dense >= 0)
        return; /* eff is the dense work copy */
    const size_t n = (size_t)lin->out * (size_t)lin->in;
    const tm_param_info *qw = &m->params[lin->qweight];
    if (m->cfg.quant == TM_QUANT_NF4) {
        tm_nf4_dequantize(qw->tensor.data, m->params[lin->absmax].tensor.data,
                          m->params[m->codebook].tensor.data, n, lin->eff);
    } else {
        tm_awq_dequantize(qw->tensor.data, m->params[lin->scales].tensor.data,
                          m->params[lin->qzeros].tensor.data, lin->out, lin->in, lin->eff);
    }
    /* eff (out,in) += (alpha/r) * B (out,r) A (r,in) */
    const int r = m->cfg.lora_rank;
    tm__sgemm(CblasNoTrans, CblasNoTrans, lin->out, lin->in, r, (float)(m->cfg.lora_alpha / r),
              m->work[lin->lora_b], r, m->work[lin->lora_a], lin->in, 1.0f, lin->eff, lin->in);
}

static void begin(tm_model *m, bool zero_grads);

void tm_begin_step(tm_model *m)
{
    begin(m, true);
}

void tm_begin_micro_batch(tm_model *m)
{
    begin(m, false);
}

seldp_status tm_model_set_router_scale(tm_model *m, double scale)
{
    if (!(scale >= 0.0) || !isfinite(scale))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_model_set_router_scale: %g, expected a finite factor >= 0",
                        m->rank, scale);
    m->router_scale = scale;
    return SELDP_OK;
}

static void begin(tm_model *m, bool zero_grads)
{
    for (size_t i = 0; i < m->n_params; i++) {
        const tm_param_info *p = &m->params[i];
        if (m->work[i] && !p->alias)
            tm__to_f32(p->tensor.dtype, p->tensor.data, m->work[i], numel_of(m, (int)i));
    }
    const size_t LE = (size_t)m->cfg.layers * (size_t)m->cfg.experts;
    for (size_t le = 0; le < LE; le++) {
        if (!m->experts[le].held)
            continue;
        effective_weight(m, &m->experts[le].w1);
        effective_weight(m, &m->experts[le].w2);
    }
    if (zero_grads) {
        memset(m->grad_block, 0, (m->grad_floats ? m->grad_floats : 1) * sizeof(float));
        memset(m->seen, 0, LE * sizeof *m->seen);
    }
    m->embedded = false;
    m->T = 0;
    for (int l = 0; l < m->cfg.layers; l++) {
        m->cache[l].routed = m->cache[l].combined = m->cache[l].combined_back = false;
    }
}
