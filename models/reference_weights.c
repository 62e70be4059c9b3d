/* The FP64 reference's weights: every trainable tensor read from a seldp model view by path
 * and upcast here, quantized bases decoded from their bits here (never through the FP32
 * model's dequantization), and the effective expert weights W or base + (alpha/r) B A. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"

#include "reference_weights.h"
#include "tm_error.h"

void *tm__ref_calloc(tm_reference *ref, size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size);
    if (!p)
        return NULL;
    pthread_mutex_lock(&ref->alloc_lock);
    if (ref->n_allocs == ref->cap_allocs) {
        size_t cap = ref->cap_allocs ? 2 * ref->cap_allocs : 64;
        void **grown = realloc(ref->allocs, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&ref->alloc_lock);
            free(p);
            return NULL;
        }
        ref->allocs = grown;
        ref->cap_allocs = cap;
    }
    ref->allocs[ref->n_allocs++] = p;
    pthread_mutex_unlock(&ref->alloc_lock);
    return p;
}

void tm__ref_free(tm_reference *ref, void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&ref->alloc_lock);
    /* the buffers that grow are among the latest */
    for (size_t i = ref->n_allocs; i-- > 0;) {
        if (ref->allocs[i] == p) {
            ref->allocs[i] = ref->allocs[--ref->n_allocs];
            free(p);
            break;
        }
    }
    pthread_mutex_unlock(&ref->alloc_lock);
}

/* ---- reading stored weights ---------------------------------------------------------- */

double tm__ref_stored_float(const seldp_tensor *t, size_t i)
{
    switch (t->dtype) {
    case SELDP_F32:
        return ((const float *)t->data)[i];
    case SELDP_F64:
        return ((const double *)t->data)[i];
    case SELDP_F16:
        return seldp_f16_to_f32(((const uint16_t *)t->data)[i]);
    case SELDP_BF16:
        return seldp_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default:
        return NAN;
    }
}

/* The stored tensor at `path` with the given shape; dtype `want`, or any float type when
 * want is SELDP_F64. */
static seldp_status find_stored(const seldp_model *weights, const char *path, seldp_dtype want,
                                int ndim, const int64_t *shape, const seldp_tensor **out)
{
    const seldp_param *p = seldp_model_find_path(weights, path);
    if (!p)
        return tm__fail(SELDP_ERR_NOT_FOUND, "reference: %s is missing from the weights", path);
    const seldp_tensor *t = &p->tensor;
    if (t->device.kind != SELDP_DEVICE_HOST)
        return tm__fail(SELDP_ERR_DEVICE, "reference: %s is not in host memory", path);
    if (want == SELDP_F64 ? !seldp_dtype_is_float(t->dtype) : t->dtype != want)
        return tm__fail(SELDP_ERR_DTYPE, "reference: %s is %s, expected %s", path,
                        seldp_dtype_name(t->dtype),
                        want == SELDP_F64 ? "a float type" : seldp_dtype_name(want));
    bool same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        char got[64];
        return tm__fail(SELDP_ERR_SHAPE, "reference: %s has shape %s, expected %d dims", path,
                        seldp_shape_str(t, got, sizeof got), ndim);
    }
    *out = t;
    return SELDP_OK;
}

static seldp_status add_entry(tm_reference *ref, const seldp_model *weights, const char *path,
                              int ndim, const int64_t *shape, int l, int e, ref_entry **out)
{
    const seldp_tensor *t;
    seldp_status st = find_stored(weights, path, SELDP_F64, ndim, shape, &t);
    if (st != SELDP_OK)
        return st;
    if (ref->n_entries == ref->cap_entries)
        return tm__fail(SELDP_ERR_INTERNAL, "reference: entry table full at %s", path);
    ref_entry *en = &ref->entries[ref->n_entries];
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    snprintf(en->path, sizeof en->path, "%s", path);
    en->n = n;
    en->layer = l;
    en->expert = e;
    en->w = tm__ref_calloc(ref, n, sizeof(double));
    en->g = tm__ref_calloc(ref, n, sizeof(double));
    en->m = tm__ref_calloc(ref, n, sizeof(double));
    if (!en->w || !en->g || !en->m)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory for %s", path);
    for (size_t i = 0; i < n; i++)
        en->w[i] = tm__ref_stored_float(t, i);
    ref->n_entries++;
    *out = en;
    return SELDP_OK;
}

/* Decode an NF4 base: element i is the high nibble of byte i/2 when i is even, the low
 * nibble when odd; value = codebook[code] * absmax[i / 64]. */
static seldp_status decode_nf4(const seldp_model *weights, const char *prefix, int out, int in,
                               const double *codebook, double *w)
{
    char path[REF_PATH_MAX];
    const seldp_tensor *q, *amax;
    const int64_t n = (int64_t)out * in;
    seldp_status st;
    snprintf(path, sizeof path, "%s.qweight", prefix);
    if ((st = find_stored(weights, path, SELDP_U8, 1, (int64_t[]){n / 2}, &q)) != SELDP_OK)
        return st;
    snprintf(path, sizeof path, "%s.absmax", prefix);
    if ((st = find_stored(weights, path, SELDP_F32, 1, (int64_t[]){n / 64}, &amax)) != SELDP_OK)
        return st;
    const uint8_t *bytes = q->data;
    for (int64_t i = 0; i < n; i++) {
        unsigned code = (i & 1) ? (bytes[i >> 1] & 0x0fu) : (unsigned)(bytes[i >> 1] >> 4);
        w[i] = codebook[code] * (double)((const float *)amax->data)[i / 64];
    }
    return SELDP_OK;
}

static unsigned nibble(const int32_t *words, size_t word, unsigned pos)
{
    uint32_t bits;
    memcpy(&bits, &words[word], sizeof bits);
    return (bits >> (4u * pos)) & 0x0fu;
}

/* Decode an AWQ-style base: W[o,i] = (q - z) * s with q in word i/8 of row o at bits
 * 4(i%8), z of group i/32 in word (i/32)/8 of row o of qzeros at bits 4((i/32)%8). */
static seldp_status decode_awq(const seldp_model *weights, const char *prefix, int out, int in,
                               double *w)
{
    char path[REF_PATH_MAX];
    const seldp_tensor *q, *s, *z;
    const int groups = in / 32, zwords = (groups + 7) / 8;
    seldp_status st;
    snprintf(path, sizeof path, "%s.qweight", prefix);
    if ((st = find_stored(weights, path, SELDP_I32, 2, (int64_t[]){out, in / 8}, &q)) != SELDP_OK)
        return st;
    snprintf(path, sizeof path, "%s.scales", prefix);
    if ((st = find_stored(weights, path, SELDP_F16, 2, (int64_t[]){out, groups}, &s)) != SELDP_OK)
        return st;
    snprintf(path, sizeof path, "%s.qzeros", prefix);
    if ((st = find_stored(weights, path, SELDP_I32, 2, (int64_t[]){out, zwords}, &z)) != SELDP_OK)
        return st;
    for (int o = 0; o < out; o++) {
        for (int i = 0; i < in; i++) {
            const int g = i / 32;
            unsigned qv =
                nibble(q->data, (size_t)o * (size_t)(in / 8) + (size_t)(i / 8), (unsigned)(i % 8));
            unsigned zv =
                nibble(z->data, (size_t)o * (size_t)zwords + (size_t)(g / 8), (unsigned)(g % 8));
            double sv = seldp_f16_to_f32(((const uint16_t *)s->data)[(size_t)o * groups + g]);
            w[(size_t)o * (size_t)in + (size_t)i] = ((double)qv - (double)zv) * sv;
        }
    }
    return SELDP_OK;
}

static uint64_t path_hash(const char *path)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (; *path; path++)
        h = (h ^ (unsigned char)*path) * 1099511628211ull;
    return h;
}

/* The path index of tm__ref_find: the checks look up every tensor of every rank. */
static seldp_status build_index(tm_reference *ref)
{
    size_t n = 16;
    while (n < 2 * ref->n_entries)
        n *= 2;
    ref->slots = tm__ref_calloc(ref, n, sizeof *ref->slots);
    if (!ref->slots)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory");
    ref->n_slots = n;
    for (size_t i = 0; i < ref->n_entries; i++) {
        size_t at = (size_t)path_hash(ref->entries[i].path) & (n - 1);
        while (ref->slots[at])
            at = (at + 1) & (n - 1);
        ref->slots[at] = i + 1;
    }
    return SELDP_OK;
}

ref_entry *tm__ref_find(const tm_reference *ref, const char *path)
{
    const char *want = strcmp(path, "lm_head.weight") == 0 ? "embed.weight" : path;
    if (!ref->n_slots)
        return NULL;
    for (size_t at = (size_t)path_hash(want) & (ref->n_slots - 1); ref->slots[at];
         at = (at + 1) & (ref->n_slots - 1)) {
        ref_entry *en = &ref->entries[ref->slots[at] - 1];
        if (strcmp(en->path, want) == 0)
            return en;
    }
    return NULL;
}

seldp_status tm__ref_load_weights(tm_reference *ref, const seldp_model *weights,
                                  const tm_ref_perturb *perturb, ref_params *p)
{
    seldp_status st = SELDP_OK;
    const tm_config *cfg = &ref->cfg;
    const int V = cfg->vocab, D = cfg->d_model, F = cfg->d_ff, E = cfg->experts;
    const int L = cfg->layers, Fs = cfg->d_ff_shared;
    const bool quant = cfg->quant != TM_QUANT_NONE;
    const double lscale = quant ? cfg->lora_alpha / cfg->lora_rank : 0.0;
    char path[REF_PATH_MAX];
    ref_entry **norm = tm__ref_calloc(ref, (size_t)L, sizeof *norm);
    ref_entry **router = tm__ref_calloc(ref, (size_t)L, sizeof *router);
    ref_entry **sw1 = tm__ref_calloc(ref, (size_t)L, sizeof *sw1);
    ref_entry **sw2 = tm__ref_calloc(ref, (size_t)L, sizeof *sw2);
    ref_linear *lin = tm__ref_calloc(ref, (size_t)L * (size_t)E * 2, sizeof *lin);
    if (!norm || !router || !sw1 || !sw2 || !lin)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");
    *p = (ref_params){.norm = norm, .router = router, .sw1 = sw1, .sw2 = sw2, .lin = lin};
    TM_CHECK(add_entry(ref, weights, "embed.weight", 2, (int64_t[]){V, D}, -1, -1, &p->emb));
    {
        /* lm_head.weight must be the same storage as embed.weight (the tie). */
        const seldp_param *a = seldp_model_find_path(weights, "embed.weight");
        const seldp_param *b = seldp_model_find_path(weights, "lm_head.weight");
        if (!b || b->id != a->id || b->tensor.data != a->tensor.data)
            TM_FAIL(SELDP_ERR_ALIAS,
                    "reference: lm_head.weight must be registered as a tied alias of "
                    "embed.weight");
    }
    double codebook[16];
    if (cfg->quant == TM_QUANT_NF4) {
        const seldp_tensor *cb;
        TM_CHECK(find_stored(weights, "nf4.codebook", SELDP_F32, 1, (int64_t[]){16}, &cb));
        for (int i = 0; i < 16; i++)
            codebook[i] = ((const float *)cb->data)[i];
    }
    for (int l = 0; l < L; l++) {
        snprintf(path, sizeof path, "layers.%d.norm.weight", l);
        TM_CHECK(add_entry(ref, weights, path, 1, (int64_t[]){D}, l, -1, &norm[l]));
        snprintf(path, sizeof path, "layers.%d.router.weight", l);
        TM_CHECK(add_entry(ref, weights, path, 2, (int64_t[]){E, D}, l, -1, &router[l]));
        if (Fs > 0) {
            snprintf(path, sizeof path, "layers.%d.shared_expert.w1.weight", l);
            TM_CHECK(add_entry(ref, weights, path, 2, (int64_t[]){Fs, D}, l, -1, &sw1[l]));
            snprintf(path, sizeof path, "layers.%d.shared_expert.w2.weight", l);
            TM_CHECK(add_entry(ref, weights, path, 2, (int64_t[]){D, Fs}, l, -1, &sw2[l]));
        }
        for (int e = 0; e < E; e++) {
            for (int k = 0; k < 2; k++) {
                ref_linear *li = &lin[((size_t)l * (size_t)E + (size_t)e) * 2 + (size_t)k];
                char prefix[64];
                li->out = k == 0 ? F : D;
                li->in = k == 0 ? D : F;
                snprintf(prefix, sizeof prefix, "layers.%d.experts.%d.w%d", l, e, k + 1);
                if (!quant) {
                    snprintf(path, sizeof path, "%s.weight", prefix);
                    TM_CHECK(add_entry(ref, weights, path, 2, (int64_t[]){li->out, li->in}, l, e,
                                       &li->dense));
                    continue;
                }
                li->base = tm__ref_calloc(ref, (size_t)li->out * (size_t)li->in, sizeof(double));
                if (!li->base)
                    TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory for %s", prefix);
                if (cfg->quant == TM_QUANT_NF4)
                    TM_CHECK(decode_nf4(weights, prefix, li->out, li->in, codebook, li->base));
                else
                    TM_CHECK(decode_awq(weights, prefix, li->out, li->in, li->base));
                snprintf(path, sizeof path, "%s.lora_a.weight", prefix);
                TM_CHECK(add_entry(ref, weights, path, 2, (int64_t[]){cfg->lora_rank, li->in}, l, e,
                                   &li->lora_a));
                snprintf(path, sizeof path, "%s.lora_b.weight", prefix);
                TM_CHECK(add_entry(ref, weights, path, 2, (int64_t[]){li->out, cfg->lora_rank}, l,
                                   e, &li->lora_b));
            }
        }
    }
    TM_CHECK(add_entry(ref, weights, "final_norm.weight", 1, (int64_t[]){D}, -1, -1, &p->fnorm));

    TM_CHECK(build_index(ref));
    if (perturb) {
        ref_entry *hit = tm__ref_find(ref, perturb->path);
        if (!hit || perturb->index >= hit->n)
            TM_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                    "reference: cannot perturb element %zu of %s (not a trainable parameter "
                    "of that size)",
                    perturb->index, perturb->path);
        hit->w[perturb->index] += perturb->delta;
    }
    /* Effective expert weights: W, or base + (alpha/r) B A. */
    for (size_t i = 0; i < (size_t)L * (size_t)E * 2; i++) {
        ref_linear *li = &lin[i];
        if (!quant) {
            li->w = li->dense->w;
            continue;
        }
        li->w = tm__ref_calloc(ref, (size_t)li->out * (size_t)li->in, sizeof(double));
        if (!li->w)
            TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");
        memcpy(li->w, li->base, (size_t)li->out * (size_t)li->in * sizeof(double));
        tm__dgemm(CblasNoTrans, CblasNoTrans, li->out, li->in, cfg->lora_rank, lscale,
                  li->lora_b->w, cfg->lora_rank, li->lora_a->w, li->in, 1.0, li->w, li->in);
    }
fail:
    return st;
}
