/* The magnitudes of the FP64 reference's gradients: the backward run again with every term
 * replaced by its absolute value — weights by |W|, activations by |x|, the upstream gradient
 * by its own magnitude, every subtraction turned into an addition (docs/tolerances.md).
 *
 * A gradient element is a sum, over tokens, experts and paths, of products of weights,
 * activations and upstream gradients. Where those terms cancel — as training converges the
 * head's p - onehot(y) shrinks while p and 1 do not, and the tokens' contributions to a
 * weight gradient cancel one another — the value shrinks but the FP32 model's rounding error
 * does not: it stays proportional to what was summed. The checks bound an error by the unit
 * roundoff times this magnitude times a constant: as sharp as a relative bound where nothing
 * cancels (the magnitude is then the value's absolute value) and never crying wolf where
 * everything does.
 *
 * The pass follows reference.c's backward line by line and reuses its work buffers; it runs
 * after it, when they are free again. */
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "reference_impl.h"
#include "reference_router.h"
#include "tm_error.h"

/* ---- absolute weights -------------------------------------------------------------------- */

/* |src| into a new array owned by ref. */
static double *abs_copy(tm_reference *ref, const double *src, size_t n)
{
    double *a = tm__ref_calloc(ref, n, sizeof *a);
    if (a)
        for (size_t i = 0; i < n; i++)
            a[i] = fabs(src[i]);
    return a;
}

/* The weights' magnitudes. An expert's effective weight is the sum base + c B A for the
 * quantized variants: its magnitude is |base| + c |B| |A|. */
typedef struct mag_weights {
    double *emb, *fnorm;
    double **norm, **router, **sw1, **sw2; /* (L) */
    double **lin;                          /* (L,E,2) */
    double **lora_a, **lora_b;             /* (L,E,2), quantized variants */
} mag_weights;

#define MAG_NOMEM() tm__fail(SELDP_ERR_NOMEM, "reference: out of memory for the magnitudes")

static seldp_status abs_weights(tm_reference *ref, const ref_params *p, mag_weights *m)
{
    const tm_config *c = &ref->cfg;
    const size_t L = (size_t)c->layers, E = (size_t)c->experts, LE2 = L * E * 2;
    m->norm = tm__ref_calloc(ref, L, sizeof *m->norm);
    m->router = tm__ref_calloc(ref, L, sizeof *m->router);
    m->sw1 = tm__ref_calloc(ref, L, sizeof *m->sw1);
    m->sw2 = tm__ref_calloc(ref, L, sizeof *m->sw2);
    m->lin = tm__ref_calloc(ref, LE2, sizeof *m->lin);
    m->lora_a = tm__ref_calloc(ref, LE2, sizeof *m->lora_a);
    m->lora_b = tm__ref_calloc(ref, LE2, sizeof *m->lora_b);
    m->emb = abs_copy(ref, p->emb->w, p->emb->n);
    m->fnorm = abs_copy(ref, p->fnorm->w, p->fnorm->n);
    if (!m->norm || !m->router || !m->sw1 || !m->sw2 || !m->lin || !m->lora_a || !m->lora_b ||
        !m->emb || !m->fnorm)
        return MAG_NOMEM();
    for (size_t l = 0; l < L; l++) {
        m->norm[l] = abs_copy(ref, p->norm[l]->w, p->norm[l]->n);
        m->router[l] = abs_copy(ref, p->router[l]->w, p->router[l]->n);
        if (!m->norm[l] || !m->router[l])
            return MAG_NOMEM();
        if (c->d_ff_shared > 0) {
            m->sw1[l] = abs_copy(ref, p->sw1[l]->w, p->sw1[l]->n);
            m->sw2[l] = abs_copy(ref, p->sw2[l]->w, p->sw2[l]->n);
            if (!m->sw1[l] || !m->sw2[l])
                return MAG_NOMEM();
        }
    }
    for (size_t i = 0; i < LE2; i++) {
        const ref_linear *li = &p->lin[i];
        const size_t n = (size_t)li->out * (size_t)li->in;
        if (c->quant == TM_QUANT_NONE) {
            if (!(m->lin[i] = abs_copy(ref, li->w, n)))
                return MAG_NOMEM();
            continue;
        }
        const int r = c->lora_rank;
        m->lin[i] = abs_copy(ref, li->base, n);
        m->lora_a[i] = abs_copy(ref, li->lora_a->w, li->lora_a->n);
        m->lora_b[i] = abs_copy(ref, li->lora_b->w, li->lora_b->n);
        if (!m->lin[i] || !m->lora_a[i] || !m->lora_b[i])
            return MAG_NOMEM();
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, li->out, li->in, r,
                    c->lora_alpha / r, m->lora_b[i], r, m->lora_a[i], li->in, 1.0, m->lin[i],
                    li->in);
    }
    return SELDP_OK;
}

/* The magnitude of rms_row_back: dx_j = dy_j g_j r - (sum_i dy_i g_i x_i) r^3 x_j / D and
 * dg_j = dy_j x_j r with every term taken absolutely; mdy the magnitudes of dy. */
static void rms_row_back_mag(const double *x, const double *ag, double r, int D, const double *mdy,
                             double *mdx, double *mdg)
{
    double s = 0.0;
    for (int i = 0; i < D; i++)
        s += mdy[i] * ag[i] * fabs(x[i]);
    for (int j = 0; j < D; j++) {
        mdx[j] += mdy[j] * ag[j] * r + s * r * r * r * fabs(x[j]) / D;
        mdg[j] += mdy[j] * fabs(x[j]) * r;
    }
}

/* ---- backward ---------------------------------------------------------------------------- */

/* The magnitude of dW's contribution to an expert linear's trainable tensors. */
static void add_linear_mag(const tm_config *c, const ref_linear *li, const mag_weights *m, size_t i,
                           const double *mdW)
{
    if (c->quant == TM_QUANT_NONE) {
        const size_t nw = (size_t)li->out * (size_t)li->in;
        for (size_t k = 0; k < nw; k++)
            li->dense->m[k] += mdW[k];
        return;
    }
    const int r = c->lora_rank;
    const double lscale = c->lora_alpha / c->lora_rank;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, li->out, r, li->in, lscale, mdW, li->in,
                m->lora_a[i], li->in, 1.0, li->lora_b->m, r);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, li->in, li->out, lscale, m->lora_b[i],
                r, mdW, li->in, 1.0, li->lora_a->m, li->in);
}

/* expert_backward with magnitudes: the gates' (into w->dgate), the weights' and the rows'
 * part of mdU. A, S and silu'(A) are recomputed from X as the backward does. */
static void expert_backward_mag(tm_reference *ref, const ref_params *p, const mag_weights *m,
                                ref_work *w, int l, int e)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, F = c->d_ff, E = c->experts, K = c->top_k;
    const double *gate = w->GATE + (size_t)l * w->N * (size_t)K;
    const size_t i1 = ((size_t)l * E + e) * 2, i2 = i1 + 1;
    const size_t *rows;
    const size_t n = tm__ref_gather_rows(ref, w, l, e, &rows);
    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++)
        memcpy(w->dHr + i * D, w->mdH + (rows[i] / K) * D, (size_t)D * sizeof(double));
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, F, D, 1.0, w->X, D, p->lin[i1].w,
                D, 0.0, w->A, F);
    for (size_t i = 0; i < n * (size_t)F; i++) {
        w->S[i] = fabs(tm__ref_silu_slope(w->A[i], &w->dA[i]));
        w->dA[i] = fabs(w->dA[i]);
    }
    for (size_t i = 0; i < n * (size_t)D; i++)
        w->X[i] = fabs(w->X[i]);
    /* P = dH W2 (n,F); dgate = P . S; dA = gate P silu'(A); dY = gate dH */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, F, D, 1.0, w->dHr, D, m->lin[i2],
                F, 0.0, w->P, F);
    for (size_t i = 0; i < n; i++) {
        const double g = gate[rows[i]];
        double d = 0.0;
        for (int f = 0; f < F; f++) {
            d += w->P[i * F + f] * w->S[i * F + f];
            w->dA[i * F + f] *= g * w->P[i * F + f];
        }
        w->dgate[rows[i]] = d;
        for (int j = 0; j < D; j++)
            w->dYE[i * D + j] = g * w->dHr[i * D + j];
    }
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, F, (int)n, 1.0, w->dYE, D, w->S, F, 0.0,
                w->dW, F);
    add_linear_mag(c, &p->lin[i2], m, i2, w->dW);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, D, (int)n, 1.0, w->dA, F, w->X, D, 0.0,
                w->dW, D);
    add_linear_mag(c, &p->lin[i1], m, i1, w->dW);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, D, F, 1.0, w->dA, F, m->lin[i1],
                D, 0.0, w->dX, D);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < D; j++)
            w->mdU[(rows[i] / K) * D + j] += w->dX[i * D + j];
}

/* backward_layer with magnitudes: w->mdH holds the magnitude of the layer output's gradient
 * on entry and of its input's on exit. */
static void layer_backward_mag(tm_reference *ref, const ref_params *p, const mag_weights *m,
                               ref_work *w, int l)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, E = c->experts, K = c->top_k, Fs = c->d_ff_shared;
    const size_t N = w->N, ND = N * (size_t)D, NK = N * (size_t)K;
    const double *Hin = w->H + (size_t)l * ND, *u = w->U + (size_t)l * ND;
    const int *sel = w->SEL + (size_t)l * NK;
    const double *gate = w->GATE + (size_t)l * NK;
    double *mdU = w->mdU, *mdH = w->mdH;
    double *au = w->dZ; /* |u| (N,D): dZ is free since the head's backward */
    for (size_t i = 0; i < ND; i++)
        au[i] = fabs(u[i]);
    memset(mdU, 0, ND * sizeof(double));
    if (Fs > 0) {
        const size_t NF = N * (size_t)Fs;
        const double *sa = w->SA + (size_t)l * NF;
        for (size_t i = 0; i < NF; i++) {
            w->SS[i] = fabs(tm__ref_silu_slope(sa[i], &w->dSS[i]));
            w->dSS[i] = fabs(w->dSS[i]);
        }
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, Fs, (int)N, 1.0, mdH, D, w->SS, Fs,
                    1.0, p->sw2[l]->m, Fs);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, Fs, D, 1.0, mdH, D,
                    m->sw2[l], Fs, 0.0, w->dSA, Fs);
        for (size_t i = 0; i < NF; i++)
            w->dSA[i] *= w->dSS[i];
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Fs, D, (int)N, 1.0, w->dSA, Fs, au, D,
                    1.0, p->sw1[l]->m, D);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, Fs, 1.0, w->dSA, Fs,
                    m->sw1[l], D, 0.0, mdU, D);
    }
    memset(w->dgate, 0, NK * sizeof(double));
    for (int e = 0; e < E; e++)
        expert_backward_mag(ref, p, m, w, l, e);
    /* the gates' softmax: dz_k = gate_k (dgate_k - sum_j gate_j dgate_j), terms absolutely */
    double *rm = p->router[l]->m;
    const double *arw = m->router[l];
    for (size_t t = 0; t < N; t++) {
        double mean = 0.0;
        for (int k = 0; k < K; k++)
            mean += gate[t * K + k] * w->dgate[t * K + k];
        for (int k = 0; k < K; k++) {
            const double dz = gate[t * K + k] * (w->dgate[t * K + k] + mean);
            const size_t e = (size_t)sel[t * K + k];
            for (int j = 0; j < D; j++) {
                rm[e * D + j] += dz * au[t * D + j];
                mdU[t * D + j] += dz * arw[e * D + j];
            }
        }
    }
    if (w->MDLR) {
        const double *mdlr = w->MDLR + (size_t)l * N * E;
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, E, D, (int)N, 1.0, mdlr, E, au, D, 1.0,
                    rm, D);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, E, 1.0, mdlr, E, arw, D,
                    1.0, mdU, D);
    }
    /* the residual passes mdH through; the norm adds its part */
    for (size_t t = 0; t < N; t++)
        rms_row_back_mag(Hin + t * D, m->norm[l], w->R[(size_t)l * N + t], D, mdU + t * D,
                         mdH + t * D, p->norm[l]->m);
}

seldp_status tm__ref_magnitudes(tm_reference *ref, const ref_params *p, ref_work *w)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, V = c->vocab, L = c->layers;
    const size_t N = w->N, ND = N * (size_t)D;
    mag_weights m;
    seldp_status st = abs_weights(ref, p, &m);
    if (st != SELDP_OK)
        return st;
    /* the head: LOG holds (p - onehot(y)) / N; its terms are p / N and onehot(y) / N */
    for (size_t t = 0; t < N; t++) {
        double *row = w->LOG + t * V;
        for (int v = 0; v < V; v++)
            row[v] = fabs(row[v]);
        row[w->tgt[t]] += 2.0 / (double)N; /* |p_y - 1| / N becomes (p_y + 1) / N */
    }
    double *aZ = w->dH; /* |Z| (N,D); dH is free until it takes the magnitudes' role */
    for (size_t i = 0; i < ND; i++)
        aZ[i] = fabs(w->Z[i]);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, (int)N, 1.0, w->LOG, V, aZ, D, 1.0,
                p->emb->m, D);
    double *mdZ = w->dU;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, D, V, 1.0, w->LOG, V, m.emb, D,
                0.0, mdZ, D);
    const double *Hf = w->H + (size_t)L * ND;
    memset(w->mdH, 0, ND * sizeof(double));
    for (size_t t = 0; t < N; t++)
        rms_row_back_mag(Hf + t * D, m.fnorm, w->RF[t], D, mdZ + t * D, w->mdH + t * D,
                         p->fnorm->m);
    for (int l = L - 1; l >= 0; l--)
        layer_backward_mag(ref, p, &m, w, l);
    for (size_t t = 0; t < N; t++)
        for (int i = 0; i < D; i++)
            p->emb->m[(size_t)w->tok[t] * D + i] += w->mdH[t * D + i];
    return SELDP_OK;
}
