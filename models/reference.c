/* The FP64 reference of tiny-moe: the global mean loss over every token of every rank and
 * its gradient for every trainable parameter, on one thread with cblas_dgemm.
 *
 * It shares no math with the FP32 path on purpose: weights are read from a seldp model
 * view by path and upcast here, quantized bases are decoded from their bits here, the
 * top-K is chosen by ranking rather than by repeated maximum, and the renormalized gates
 * are differentiated as a softmax over the selected logits rather than through p / sum(p).
 * A bug in either implementation therefore shows up as a mismatch between the two. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "reference_router.h"
#include "tm_internal.h"

#define REF_PATH_MAX 96

typedef struct ref_entry {
    char path[REF_PATH_MAX];
    double *w; /* weight (FP64) */
    double *g; /* gradient of the mean loss; NULL for frozen */
    size_t n;
    int layer, expert; /* expert -1 for shared */
} ref_entry;

/* One expert linear [out, in] in FP64. */
typedef struct ref_linear {
    int out, in;
    double *w;                  /* effective weight (out,in) */
    ref_entry *dense;           /* quant none */
    ref_entry *lora_a, *lora_b; /* quantized variants */
    double *base;               /* dequantized base (out,in) */
} ref_linear;

struct tm_reference {
    tm_config cfg;
    double loss;
    size_t N;
    size_t *routed; /* (L,E) */
    size_t ties_followed;
    ref_entry *entries;
    size_t n_entries, cap_entries;
    void **allocs;
    size_t n_allocs, cap_allocs;
};

static void *ref_calloc(tm_reference *ref, size_t count, size_t size)
{
    if (ref->n_allocs == ref->cap_allocs) {
        size_t cap = ref->cap_allocs ? 2 * ref->cap_allocs : 64;
        void **grown = realloc(ref->allocs, cap * sizeof *grown);
        if (!grown)
            return NULL;
        ref->allocs = grown;
        ref->cap_allocs = cap;
    }
    void *p = calloc(count ? count : 1, size);
    if (p)
        ref->allocs[ref->n_allocs++] = p;
    return p;
}

void tm_reference_destroy(tm_reference *ref)
{
    if (!ref)
        return;
    for (size_t i = 0; i < ref->n_allocs; i++)
        free(ref->allocs[i]);
    free(ref->allocs);
    free(ref->entries);
    free(ref->routed);
    free(ref);
}

/* ---- reading stored weights ---------------------------------------------------------- */

static double stored_float(const seldp_tensor *t, size_t i)
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
    en->w = ref_calloc(ref, n, sizeof(double));
    en->g = ref_calloc(ref, n, sizeof(double));
    if (!en->w || !en->g)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory for %s", path);
    for (size_t i = 0; i < n; i++)
        en->w[i] = stored_float(t, i);
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

/* ---- math ---------------------------------------------------------------------------- */

static double silu_d(double a)
{
    return a / (1.0 + exp(-a));
}

static double dsilu_d(double a)
{
    double s = 1.0 / (1.0 + exp(-a));
    return s + a * s * (1.0 - s);
}

/* y = x * r * g with r = 1 / sqrt(mean(x^2) + eps); returns r. */
static double rms_row(const double *x, const double *g, int D, double eps, double *y)
{
    double ms = 0.0;
    for (int i = 0; i < D; i++)
        ms += x[i] * x[i];
    double r = 1.0 / sqrt(ms / D + eps);
    for (int i = 0; i < D; i++)
        y[i] = x[i] * r * g[i];
    return r;
}

/* Vector-Jacobian product of rms_row: dx += J^T dy, dg += dy * x * r. */
static void rms_row_back(const double *x, const double *g, double r, int D, const double *dy,
                         double *dx, double *dg)
{
    double s = 0.0;
    for (int i = 0; i < D; i++)
        s += dy[i] * g[i] * x[i];
    for (int j = 0; j < D; j++) {
        dx[j] += dy[j] * g[j] * r - s * r * r * r * x[j] / D;
        dg[j] += dy[j] * x[j] * r;
    }
}

/* ---- the computation ----------------------------------------------------------------- */

seldp_status tm_reference_compute(const tm_config *cfg, const seldp_model *weights,
                                  const int32_t *const *tokens, const int32_t *const *targets,
                                  const size_t *counts, int n_ranks, const tm_ref_perturb *perturb,
                                  tm_reference **out)
{
    return tm_reference_compute_routed(cfg, weights, tokens, targets, counts, n_ranks, perturb,
                                       NULL, out);
}

seldp_status tm_reference_compute_routed(const tm_config *cfg, const seldp_model *weights,
                                         const int32_t *const *tokens,
                                         const int32_t *const *targets, const size_t *counts,
                                         int n_ranks, const tm_ref_perturb *perturb,
                                         const int *const *choices, tm_reference **out)
{
    seldp_status st = SELDP_OK;
    tm_reference *ref = NULL;
    char path[REF_PATH_MAX];
    if (!out || !weights || n_ranks < 0 || (n_ranks > 0 && (!tokens || !targets || !counts)))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "reference: NULL argument");
    *out = NULL;
    TM_CHECK(tm_config_check(cfg));
    const int V = cfg->vocab, D = cfg->d_model, F = cfg->d_ff, E = cfg->experts;
    const int K = cfg->top_k, L = cfg->layers;
    const bool quant = cfg->quant != TM_QUANT_NONE;
    const double lscale = quant ? cfg->lora_alpha / cfg->lora_rank : 0.0;

    ref = calloc(1, sizeof *ref);
    if (!ref)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory");
    ref->cfg = *cfg;
    ref->routed = calloc((size_t)L * (size_t)E, sizeof *ref->routed);
    ref->cap_entries = 4 + (size_t)L * (4 + 4 * (size_t)E);
    ref->entries = calloc(ref->cap_entries, sizeof *ref->entries);
    if (!ref->routed || !ref->entries)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");

    /* All tokens of all ranks, in rank order; rank r's are data shard r. */
    size_t N = 0;
    size_t *shard_begin = ref_calloc(ref, (size_t)n_ranks + 1, sizeof *shard_begin);
    if (!shard_begin)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");
    for (int r = 0; r < n_ranks; r++) {
        shard_begin[r] = N;
        N += counts[r];
    }
    shard_begin[n_ranks] = N;
    if (N == 0)
        TM_FAIL(SELDP_ERR_INVALID_ARGUMENT, "reference: no token on any of %d ranks", n_ranks);
    ref->N = N;
    int *tok = ref_calloc(ref, N, sizeof *tok), *tgt = ref_calloc(ref, N, sizeof *tgt);
    if (!tok || !tgt)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory for %zu tokens", N);
    for (int r = 0, at = 0; r < n_ranks; r++) {
        for (size_t t = 0; t < counts[r]; t++, at++) {
            tok[at] = tokens[r][t];
            tgt[at] = targets[r][t];
            if (tok[at] < 0 || tok[at] >= V || tgt[at] < 0 || tgt[at] >= V)
                TM_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                        "reference: rank %d token %zu is %d with target %d, expected ids in "
                        "[0, %d)",
                        r, t, tok[at], tgt[at], V);
        }
    }

    /* Weights, upcast. */
    const int Fs = cfg->d_ff_shared;
    ref_entry *emb = NULL, *fnorm = NULL, **norm = NULL, **router = NULL;
    ref_entry **sw1 = NULL, **sw2 = NULL; /* (L) the shared expert, when Fs > 0 */
    ref_linear *lin;                      /* (L,E,2): w1 then w2 */
    norm = ref_calloc(ref, (size_t)L, sizeof *norm);
    router = ref_calloc(ref, (size_t)L, sizeof *router);
    sw1 = ref_calloc(ref, (size_t)L, sizeof *sw1);
    sw2 = ref_calloc(ref, (size_t)L, sizeof *sw2);
    lin = ref_calloc(ref, (size_t)L * (size_t)E * 2, sizeof *lin);
    if (!norm || !router || !sw1 || !sw2 || !lin)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");
    TM_CHECK(add_entry(ref, weights, "embed.weight", 2, (int64_t[]){V, D}, -1, -1, &emb));
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
                li->base = ref_calloc(ref, (size_t)li->out * (size_t)li->in, sizeof(double));
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
    TM_CHECK(add_entry(ref, weights, "final_norm.weight", 1, (int64_t[]){D}, -1, -1, &fnorm));

    if (perturb) {
        const char *want =
            strcmp(perturb->path, "lm_head.weight") == 0 ? "embed.weight" : perturb->path;
        ref_entry *hit = NULL;
        for (size_t i = 0; i < ref->n_entries && !hit; i++)
            hit = strcmp(ref->entries[i].path, want) == 0 ? &ref->entries[i] : NULL;
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
        li->w = ref_calloc(ref, (size_t)li->out * (size_t)li->in, sizeof(double));
        if (!li->w)
            TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");
        memcpy(li->w, li->base, (size_t)li->out * (size_t)li->in * sizeof(double));
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, li->out, li->in, cfg->lora_rank,
                    lscale, li->lora_b->w, cfg->lora_rank, li->lora_a->w, li->in, 1.0, li->w,
                    li->in);
    }

    /* Activations. */
    double router_loss = 0.0;
    const size_t ND = N * (size_t)D;
    double *H = ref_calloc(ref, (size_t)(L + 1) * ND, sizeof(double)); /* layer inputs + out */
    double *U = ref_calloc(ref, (size_t)L * ND, sizeof(double));
    double *R = ref_calloc(ref, (size_t)L * N, sizeof(double));
    double *LG = ref_calloc(ref, (size_t)L * N * (size_t)E, sizeof(double)); /* router logits */
    int *SEL = ref_calloc(ref, (size_t)L * N * (size_t)K, sizeof(int));
    double *GATE = ref_calloc(ref, (size_t)L * N * (size_t)K, sizeof(double));
    double *Y = ref_calloc(ref, (size_t)L * N * (size_t)K * (size_t)D, sizeof(double));
    size_t *rows = ref_calloc(ref, N * (size_t)K, sizeof *rows);
    double *X = ref_calloc(ref, N * (size_t)K * (size_t)D, sizeof(double));
    double *A = ref_calloc(ref, N * (size_t)K * (size_t)F, sizeof(double));
    double *S = ref_calloc(ref, N * (size_t)K * (size_t)F, sizeof(double));
    double *YE = ref_calloc(ref, N * (size_t)K * (size_t)D, sizeof(double));
    unsigned char *KEPT = ref_calloc(ref, (size_t)L * N * (size_t)K, 1);
    double *DLR = ref_calloc(ref, (size_t)L * N * (size_t)E, sizeof(double)); /* router losses */
    double *RW = ref_calloc(ref, N * (size_t)E + 2 * (size_t)E, sizeof(double));
    const size_t NF = N * (size_t)(Fs > 0 ? Fs : 0);
    double *SA = ref_calloc(ref, (size_t)L * NF, sizeof(double)); /* shared expert pre-act */
    double *SS = ref_calloc(ref, NF, sizeof(double)), *dSA = ref_calloc(ref, NF, sizeof(double));
    if (!H || !U || !R || !LG || !SEL || !GATE || !Y || !rows || !X || !A || !S || !YE || !KEPT ||
        !DLR || !RW || !SA || !SS || !dSA)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory for %zu tokens", N);

    for (size_t t = 0; t < N; t++)
        memcpy(H + t * D, emb->w + (size_t)tok[t] * D, (size_t)D * sizeof(double));
    for (int l = 0; l < L; l++) {
        const double *Hin = H + (size_t)l * ND;
        double *Hout = H + (size_t)(l + 1) * ND;
        double *u = U + (size_t)l * ND, *lg = LG + (size_t)l * N * E;
        int *sel = SEL + (size_t)l * N * K;
        double *gate = GATE + (size_t)l * N * K, *y = Y + (size_t)l * N * K * D;
        for (size_t t = 0; t < N; t++)
            R[(size_t)l * N + t] = rms_row(Hin + t * D, norm[l]->w, D, cfg->eps, u + t * D);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, E, D, 1.0, u, D, router[l]->w,
                    D, 0.0, lg, E);
        for (size_t t = 0, r = 0; t < N; t++) {
            const double *z = lg + t * E;
            while (t >= shard_begin[r + 1])
                r++;
            /* Expert e takes slot rank(e) = #{j : z_j > z_e, or z_j == z_e and j < e}
             * (softmax is monotone, so ranking logits ranks probabilities). */
            for (int e = 0; e < E; e++) {
                int rank = 0;
                for (int j = 0; j < E; j++)
                    rank += (z[j] > z[e]) || (z[j] == z[e] && j < e);
                if (rank < K)
                    sel[t * K + rank] = e;
            }
            if (choices && choices[r] &&
                tm__ref_follow_tie(z, E, K,
                                   choices[r] + ((size_t)l * counts[r] + (t - shard_begin[r])) * K,
                                   sel + t * K))
                ref->ties_followed++;
            /* Renormalized top-K gates = softmax over the selected logits. */
            double mx = z[sel[t * K]], den = 0.0;
            for (int k = 0; k < K; k++)
                den += exp(z[sel[t * K + k]] - mx);
            for (int k = 0; k < K; k++)
                gate[t * K + k] = exp(z[sel[t * K + k]] - mx) / den;
        }
        unsigned char *kept = KEPT + (size_t)l * N * K;
        tm__ref_capacity(cfg, sel, shard_begin, n_ranks, kept);
        router_loss +=
            tm__ref_router_losses(cfg, lg, sel, shard_begin, n_ranks, RW, DLR + (size_t)l * N * E);
        for (int e = 0; e < E; e++) {
            const ref_linear *w1 = &lin[((size_t)l * E + e) * 2], *w2 = w1 + 1;
            size_t n = 0;
            for (size_t s = 0; s < N * (size_t)K; s++) {
                if (sel[s] != e || !kept[s])
                    continue;
                rows[n] = s;
                memcpy(X + n * D, u + (s / K) * D, (size_t)D * sizeof(double));
                n++;
            }
            ref->routed[(size_t)l * E + e] = n;
            if (n == 0)
                continue;
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, F, D, 1.0, X, D, w1->w, D,
                        0.0, A, F);
            for (size_t i = 0; i < n * (size_t)F; i++)
                S[i] = silu_d(A[i]);
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, D, F, 1.0, S, F, w2->w, F,
                        0.0, YE, D);
            for (size_t i = 0; i < n; i++)
                memcpy(y + rows[i] * D, YE + i * D, (size_t)D * sizeof(double));
        }
        for (size_t t = 0; t < N; t++) {
            for (int i = 0; i < D; i++) {
                double acc = Hin[t * D + i];
                for (int k = 0; k < K; k++)
                    acc += kept[t * K + k] ? gate[t * K + k] * y[(t * K + k) * D + i] : 0.0;
                Hout[t * D + i] = acc;
            }
        }
        if (Fs > 0) {
            /* the shared expert: Hout += silu(u W1s^T) W2s^T, ungated */
            double *sa = SA + (size_t)l * NF;
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, Fs, D, 1.0, u, D,
                        sw1[l]->w, D, 0.0, sa, Fs);
            for (size_t i = 0; i < NF; i++)
                SS[i] = silu_d(sa[i]);
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, D, Fs, 1.0, SS, Fs,
                        sw2[l]->w, Fs, 1.0, Hout, D);
        }
    }

    /* Head and loss (mean over N). */
    const double *Hf = H + (size_t)L * ND;
    double *Z = ref_calloc(ref, ND, sizeof(double)), *RF = ref_calloc(ref, N, sizeof(double));
    double *LOG = ref_calloc(ref, N * (size_t)V, sizeof(double));
    double *dZ = ref_calloc(ref, ND, sizeof(double)), *dH = ref_calloc(ref, ND, sizeof(double));
    double *dU = ref_calloc(ref, ND, sizeof(double));
    double *dLG = ref_calloc(ref, N * (size_t)E, sizeof(double));
    double *dYE = ref_calloc(ref, N * (size_t)K * (size_t)D, sizeof(double));
    double *dA = ref_calloc(ref, N * (size_t)K * (size_t)F, sizeof(double));
    double *dX = ref_calloc(ref, N * (size_t)K * (size_t)D, sizeof(double));
    double *dW = ref_calloc(ref, (size_t)D * (size_t)F, sizeof(double));
    double *dgate = ref_calloc(ref, N * (size_t)K, sizeof(double));
    if (!Z || !RF || !LOG || !dZ || !dH || !dU || !dLG || !dYE || !dA || !dX || !dW || !dgate)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory for %zu tokens", N);
    for (size_t t = 0; t < N; t++)
        RF[t] = rms_row(Hf + t * D, fnorm->w, D, cfg->eps, Z + t * D);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, V, D, 1.0, Z, D, emb->w, D, 0.0,
                LOG, V);
    double loss = 0.0;
    for (size_t t = 0; t < N; t++) {
        double *row = LOG + t * V;
        double mx = row[0];
        for (int v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        double se = 0.0;
        for (int v = 0; v < V; v++)
            se += exp(row[v] - mx);
        const double lse = mx + log(se);
        loss += lse - row[tgt[t]];
        for (int v = 0; v < V; v++)
            row[v] = exp(row[v] - lse) / (double)N;
        row[tgt[t]] -= 1.0 / (double)N;
    }
    ref->loss = loss / (double)N + router_loss;

    /* Backward. */
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, (int)N, 1.0, LOG, V, Z, D, 1.0,
                emb->g, D);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, V, 1.0, LOG, V, emb->w, D,
                0.0, dZ, D);
    for (size_t t = 0; t < N; t++)
        rms_row_back(Hf + t * D, fnorm->w, RF[t], D, dZ + t * D, dH + t * D, fnorm->g);
    for (int l = L - 1; l >= 0; l--) {
        const double *Hin = H + (size_t)l * ND;
        const double *u = U + (size_t)l * ND;
        const int *sel = SEL + (size_t)l * N * K;
        const double *gate = GATE + (size_t)l * N * K, *y = Y + (size_t)l * N * K * D;
        const unsigned char *kept = KEPT + (size_t)l * N * K;
        /* dH is the gradient of this layer's output; the residual passes it through. */
        memset(dU, 0, ND * sizeof(double));
        if (Fs > 0) {
            const double *sa = SA + (size_t)l * NF;
            for (size_t i = 0; i < NF; i++)
                SS[i] = silu_d(sa[i]);
            /* W2s: dW (D,Fs) += dH^T S; dS = dH W2s; W1s: dW (Fs,D) += dA^T u; dU = dA W1s */
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, Fs, (int)N, 1.0, dH, D, SS, Fs,
                        1.0, sw2[l]->g, Fs);
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, Fs, D, 1.0, dH, D,
                        sw2[l]->w, Fs, 0.0, dSA, Fs);
            for (size_t i = 0; i < NF; i++)
                dSA[i] *= dsilu_d(sa[i]);
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Fs, D, (int)N, 1.0, dSA, Fs, u, D,
                        1.0, sw1[l]->g, D);
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, Fs, 1.0, dSA, Fs,
                        sw1[l]->w, D, 0.0, dU, D);
        }
        for (size_t s = 0; s < N * (size_t)K; s++) {
            double d = 0.0;
            for (int i = 0; i < D; i++)
                d += dH[(s / K) * D + i] * y[s * D + i];
            dgate[s] = kept[s] ? d : 0.0; /* a dropped slot adds nothing */
        }
        for (int e = 0; e < E; e++) {
            ref_linear *w1 = &lin[((size_t)l * E + e) * 2], *w2 = w1 + 1;
            size_t n = 0;
            for (size_t s = 0; s < N * (size_t)K; s++) {
                if (sel[s] != e || !kept[s])
                    continue;
                rows[n] = s;
                memcpy(X + n * D, u + (s / K) * D, (size_t)D * sizeof(double));
                for (int i = 0; i < D; i++)
                    dYE[n * D + i] = gate[s] * dH[(s / K) * D + i];
                n++;
            }
            if (n == 0)
                continue;
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, F, D, 1.0, X, D, w1->w, D,
                        0.0, A, F);
            for (size_t i = 0; i < n * (size_t)F; i++)
                S[i] = silu_d(A[i]);
            /* w2: dW (D,F) = dY^T S; dS = dY w2 */
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, F, (int)n, 1.0, dYE, D, S, F,
                        0.0, dW, F);
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, F, D, 1.0, dYE, D, w2->w,
                        F, 0.0, dA, F);
            ref_linear *pair[2] = {w2, w1};
            for (int k = 0; k < 2; k++) {
                ref_linear *li = pair[k];
                if (k == 1) {
                    for (size_t i = 0; i < n * (size_t)F; i++)
                        dA[i] *= dsilu_d(A[i]);
                    /* w1: dW (F,D) = dA^T X */
                    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, D, (int)n, 1.0, dA, F,
                                X, D, 0.0, dW, D);
                }
                const size_t nw = (size_t)li->out * (size_t)li->in;
                if (!quant) {
                    for (size_t i = 0; i < nw; i++)
                        li->dense->g[i] += dW[i];
                    continue;
                }
                /* W = base + c B A: dB = c dW A^T, dA = c B^T dW */
                const int r = cfg->lora_rank;
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, li->out, r, li->in, lscale, dW,
                            li->in, li->lora_a->w, li->in, 1.0, li->lora_b->g, r);
                cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, li->in, li->out, lscale,
                            li->lora_b->w, r, dW, li->in, 1.0, li->lora_a->g, li->in);
            }
            /* dX (n,D) = dA w1 */
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, D, F, 1.0, dA, F, w1->w,
                        D, 0.0, dX, D);
            for (size_t i = 0; i < n; i++)
                for (int j = 0; j < D; j++)
                    dU[(rows[i] / K) * D + j] += dX[i * D + j];
        }
        /* Gates are a softmax over the selected logits; the others get no gradient from them,
         * only from the router losses. */
        memcpy(dLG, DLR + (size_t)l * N * E, N * (size_t)E * sizeof(double));
        for (size_t t = 0; t < N; t++) {
            double mean = 0.0;
            for (int k = 0; k < K; k++)
                mean += gate[t * K + k] * dgate[t * K + k];
            for (int k = 0; k < K; k++)
                dLG[t * E + sel[t * K + k]] += gate[t * K + k] * (dgate[t * K + k] - mean);
        }
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, D, (int)N, 1.0, dLG, E, u, D, 1.0,
                    router[l]->g, D);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, E, 1.0, dLG, E,
                    router[l]->w, D, 1.0, dU, D);
        for (size_t t = 0; t < N; t++)
            rms_row_back(Hin + t * D, norm[l]->w, R[(size_t)l * N + t], D, dU + t * D, dH + t * D,
                         norm[l]->g);
    }
    for (size_t t = 0; t < N; t++)
        for (int i = 0; i < D; i++)
            emb->g[(size_t)tok[t] * D + i] += dH[t * D + i];

    *out = ref;
    return SELDP_OK;
fail:
    tm_reference_destroy(ref);
    return st;
}

/* ---- queries ------------------------------------------------------------------------- */

double tm_reference_loss(const tm_reference *ref)
{
    return ref->loss;
}

size_t tm_reference_tokens(const tm_reference *ref)
{
    return ref->N;
}

size_t tm_reference_ties_followed(const tm_reference *ref)
{
    return ref->ties_followed;
}

size_t tm_reference_routed(const tm_reference *ref, int l, int e)
{
    if (l < 0 || l >= ref->cfg.layers || e < 0 || e >= ref->cfg.experts)
        return 0;
    return ref->routed[(size_t)l * (size_t)ref->cfg.experts + (size_t)e];
}

const double *tm_reference_grad(const tm_reference *ref, const char *path, size_t *numel)
{
    if (!ref || !path)
        return NULL;
    const char *want = strcmp(path, "lm_head.weight") == 0 ? "embed.weight" : path;
    for (size_t i = 0; i < ref->n_entries; i++) {
        const ref_entry *en = &ref->entries[i];
        if (strcmp(en->path, want) != 0)
            continue;
        if (en->expert >= 0 && tm_reference_routed(ref, en->layer, en->expert) == 0)
            return NULL;
        if (numel)
            *numel = en->n;
        return en->g;
    }
    return NULL;
}

double tm_rel_error(const seldp_tensor *g, double scale, const double *ref, size_t n)
{
    if (!g || !seldp_dtype_is_float(g->dtype) || seldp_tensor_numel(g) != n ||
        g->device.kind != SELDP_DEVICE_HOST)
        return -1.0;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = scale * stored_float(g, i) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
