/* The backward of the FP64 reference's error-scale pass (reference_magnitude.h): the
 * gradients' variances, term by term as reference.c's backward computes them, from the
 * activations' variances the forward pass left. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"
#include "ref_pool.h"

#include "reference_magnitude.h"

/* ---- backward ---------------------------------------------------------------------------- */

/* Distribute an expert linear's dW (values x->dW) and its variance m->VdW into its trainable
 * tensors' variances: the dense weight, or LoRA's B and A (dB = c dW A^T, dA = c B^T dW).
 * The errors of dW's elements are not independent (a row of the input gradient errs for
 * every column it reaches), so the contraction carries them coherently, |dW's error| |A|^T
 * and |B|^T |dW's error|, not in quadrature: a run at d_ff 512 whose adapters had aligned
 * with the gradient exceeded the quadrature's bound (1.9 of it). */
static bool add_linear_var(const pass *s, const ref_rows *x, mag_rows *m, const ref_linear *li)
{
    const tm_config *c = &s->ref->cfg;
    const size_t nw = (size_t)li->out * (size_t)li->in;
    if (c->quant == TM_QUANT_NONE) {
        for (size_t k = 0; k < nw; k++)
            li->dense->m[k] += m->VdW[k];
        return true;
    }
    const int r = c->lora_rank, out = li->out, in = li->in;
    const double c2 = (c->lora_alpha / r) * (c->lora_alpha / r);
    double *vb = tm__mag_room(&m->ar, 3, li->lora_b->n),
           *va = tm__mag_room(&m->ar, 4, li->lora_a->n);
    double *sd = tm__mag_room(&m->ar, 5, nw);
    double *aw = tm__mag_room(&m->ar, 6, (size_t)r * (size_t)(out > in ? out : in));
    if (!vb || !va || !sd || !aw)
        return false;
    for (size_t k = 0; k < nw; k++)
        sd[k] = sqrt(m->VdW[k]);
    /* dB (out,r): its own rounding, then sd |A|^T squared */
    if (!tm__mag_var_gemm(&m->ar, CblasNoTrans, CblasTrans, out, r, in, x->dW, NULL, (size_t)out,
                          (size_t)in, li->lora_a->w, NULL, (size_t)r, (size_t)in, 0.0, vb))
        return false;
    tm__mag_fill_abs(aw, li->lora_a->w, li->lora_a->n);
    double *e = tm__mag_room(&m->ar, 2,
                             (size_t)out * (size_t)r > li->lora_a->n ? (size_t)out * (size_t)r
                                                                     : li->lora_a->n);
    if (!e)
        return false;
    tm__dgemm(CblasNoTrans, CblasTrans, out, r, in, 1.0, sd, in, aw, in, 0.0, e, r);
    for (size_t k = 0; k < li->lora_b->n; k++)
        li->lora_b->m[k] += c2 * (vb[k] + e[k] * e[k]);
    /* dA (r,in): its own rounding, then |B|^T sd squared */
    if (!tm__mag_var_gemm(&m->ar, CblasTrans, CblasNoTrans, r, in, out, li->lora_b->w, NULL,
                          (size_t)out, (size_t)r, x->dW, NULL, (size_t)out, (size_t)in, 0.0, va))
        return false;
    tm__mag_fill_abs(aw, li->lora_b->w, li->lora_b->n);
    e = tm__mag_room(&m->ar, 2, li->lora_a->n);
    if (!e)
        return false;
    tm__dgemm(CblasTrans, CblasNoTrans, r, in, out, 1.0, aw, r, sd, in, 0.0, e, in);
    for (size_t k = 0; k < li->lora_a->n; k++)
        li->lora_a->m[k] += c2 * (va[k] + e[k] * e[k]);
    return true;
}

/* A layer's experts on the pass's workers (ref_pool.h). */
typedef struct layer_loop {
    pass *s;
    int l;
} layer_loop;

/* Expert e of layer l backward, its gradients (reference.c's pieces, into the lane's ref_rows)
 * and their variances (into its mag_rows) from the same rows and products: the gates' values
 * and variances (dgate, Vdgate), the weights' gradients and variances, and (in the lane's
 * buffers, until the commit) the rows' part of dU and VdU. The variances' rules take the SiLU
 * and its slope from tm__mag_silu_var (SM, SLM) and every other value from the gradient's
 * computation. */
static bool expert_backward_var(void *ctx, int lane, int e)
{
    layer_loop *lp = ctx;
    pass *s = lp->s;
    const int l = lp->l;
    const ref_work *w = s->w;
    const tm_config *c = &s->ref->cfg;
    ref_rows *x = &w->rows[lane];
    mag_rows *m = &s->mr[lane];
    const int D = s->D, F = s->F, E = s->E, K = s->K;
    const size_t N = s->N, ND = N * (size_t)D;
    const double *gate = w->GATE + (size_t)l * N * (size_t)K, *VG = s->VG + (size_t)l * N * K;
    const size_t i1 = ((size_t)l * E + e) * 2;
    const ref_linear *w1 = &s->p->lin[i1], *w2 = w1 + 1;
    const size_t n = tm__ref_expert_backward_rows(s->ref, s->p, w, l, e, x);
    const size_t *rows = x->slots;
    if (n == 0)
        return true;
    const double *VU = s->VU + (size_t)l * ND;
    for (size_t i = 0; i < n; i++) {
        memcpy(m->VdHr + i * D, s->VdH + (rows[i] / K) * D, (size_t)D * sizeof(double));
        memcpy(m->VX + i * D, VU + (rows[i] / K) * D, (size_t)D * sizeof(double));
    }
    if (!tm__mag_var_gemm_of(&m->ar, CblasNoTrans, CblasTrans, (int)n, F, D, x->X, m->VX, n,
                             (size_t)D, w1->w, s->VW[i1], (size_t)F, (size_t)D, x->A, 0.0, m->VA))
        return false;
    tm__mag_silu_var(x->A, m->VA, n * (size_t)F, m->SM, m->VS, m->SLM, m->VSL);
    /* P = dH W2 (n,F) */
    if (!tm__mag_var_gemm_of(&m->ar, CblasNoTrans, CblasNoTrans, (int)n, F, D, x->dHr, m->VdHr, n,
                             (size_t)D, w2->w, s->VW[i1 + 1], (size_t)D, (size_t)F, x->P, 0.0,
                             m->VP))
        return false;
    for (size_t i = 0; i < n; i++) {
        const size_t slot = rows[i];
        const double g = gate[slot], vg = VG[slot];
        double vd = 0.0, ad = 0.0;
        for (int f = 0; f < F; f++) {
            const size_t k = i * F + f;
            const double P = x->P[k], S = m->SM[k], sl = m->SLM[k];
            ad += fabs(P * S);
            vd += S * S * m->VP[k] + P * P * m->VS[k];
            const double da = g * P * sl;
            m->VdA[k] = P * P * sl * sl * vg + g * g * sl * sl * m->VP[k] +
                        g * g * P * P * m->VSL[k] + 2.0 * da * da;
        }
        s->dgate[slot] = w->dgate[slot];
        s->Vdgate[slot] = vd + ad * ad;
        for (int j = 0; j < D; j++) {
            const double dh = x->dHr[i * D + j], dy = x->dYE[i * D + j];
            m->VdYE[i * D + j] = dh * dh * vg + g * g * m->VdHr[i * D + j] + dy * dy;
        }
    }
    /* w2: dW (D,F) = dY^T S; w1: dW (F,D) = dA^T X; dX = dA W1 */
    tm__ref_expert_backward_w2(c, w2, x);
    if (!tm__mag_var_gemm_of(&m->ar, CblasTrans, CblasNoTrans, D, F, (int)n, x->dYE, m->VdYE, n,
                             (size_t)D, x->S, m->VS, n, (size_t)F, x->dW, 0.0, m->VdW) ||
        !add_linear_var(s, x, m, w2))
        return false;
    tm__ref_expert_backward_w1(c, w1, x);
    if (!tm__mag_var_gemm_of(&m->ar, CblasTrans, CblasNoTrans, F, D, (int)n, x->dA, m->VdA, n,
                             (size_t)F, x->X, m->VX, n, (size_t)D, x->dW, 0.0, m->VdW) ||
        !add_linear_var(s, x, m, w1))
        return false;
    tm__ref_expert_backward_input(c, w1, x);
    return tm__mag_var_gemm_of(&m->ar, CblasNoTrans, CblasNoTrans, (int)n, D, F, x->dA, m->VdA, n,
                               (size_t)F, w1->w, s->VW[i1], (size_t)F, (size_t)D, x->dX, 0.0,
                               m->VdX);
}

/* The expert's rows' part of dU (the gradient's and the pass's) and VdU, in expert order. */
static void expert_backward_var_commit(void *ctx, int lane, int e)
{
    (void)e;
    layer_loop *lp = ctx;
    pass *s = lp->s;
    const int D = s->D, K = s->K;
    const ref_rows *x = &s->w->rows[lane];
    const mag_rows *m = &s->mr[lane];
    for (size_t i = 0; i < x->n; i++) {
        const size_t t = x->slots[i] / K;
        for (int j = 0; j < D; j++) {
            s->w->dU[t * D + j] += x->dX[i * D + j];
            s->dU[t * D + j] += x->dX[i * D + j];
            s->VdU[t * D + j] += m->VdX[i * D + j];
        }
    }
}

/* Layer l's backward, the gradient's (w->dH, reference.c's pieces) and the pass's (s->dH,
 * s->VdH): they hold the layer output's gradient on entry and its input's on exit. */
bool tm__mag_layer_backward_var(pass *s, int l)
{
    ref_work *w = s->w;
    tm__ref_backward_layer_begin(s->ref, s->p, w, l);
    const int D = s->D, E = s->E, K = s->K, Fs = s->Fs;
    const size_t N = s->N, ND = N * (size_t)D, NK = N * (size_t)K;
    const double *Hin = w->H + (size_t)l * ND, *VHin = s->VH + (size_t)l * ND;
    const double *u = w->U + (size_t)l * ND, *VU = s->VU + (size_t)l * ND;
    memset(s->dU, 0, ND * sizeof(double));
    memset(s->VdU, 0, ND * sizeof(double));
    if (Fs > 0) {
        const size_t NF = N * (size_t)Fs;
        const double *sa = w->SA + (size_t)l * NF, *vsa = s->VSA + (size_t)l * NF;
        const ref_entry *w1 = s->p->sw1[l], *w2 = s->p->sw2[l];
        tm__mag_silu_var(sa, vsa, NF, w->SS, s->VdSS, s->SL, s->VSLs);
        /* W2s: dW (D,Fs) += dH^T S; dS = dH W2s; dA = dS silu'; W1s: dW += dA^T u; dU = dA W1s */
        if (!tm__mag_var_gemm(&s->ar, CblasTrans, CblasNoTrans, D, Fs, (int)N, s->dH, s->VdH, N,
                              (size_t)D, w->SS, s->VdSS, N, (size_t)Fs, 1.0, w2->m))
            return false;
        tm__dgemm(CblasNoTrans, CblasNoTrans, (int)N, Fs, D, 1.0, s->dH, D, w2->w, Fs, 0.0, w->dSA,
                  Fs);
        if (!tm__mag_var_gemm(&s->ar, CblasNoTrans, CblasNoTrans, (int)N, Fs, D, s->dH, s->VdH, N,
                              (size_t)D, w2->w, NULL, (size_t)D, (size_t)Fs, 0.0, s->VdSA))
            return false;
        for (size_t i = 0; i < NF; i++) {
            const double ds = w->dSA[i], da = ds * s->SL[i];
            s->VdSA[i] = s->SL[i] * s->SL[i] * s->VdSA[i] + ds * ds * s->VSLs[i] + da * da;
            w->dSA[i] = da;
        }
        if (!tm__mag_var_gemm(&s->ar, CblasTrans, CblasNoTrans, Fs, D, (int)N, w->dSA, s->VdSA, N,
                              (size_t)Fs, u, VU, N, (size_t)D, 1.0, w1->m))
            return false;
        tm__dgemm(CblasNoTrans, CblasNoTrans, (int)N, D, Fs, 1.0, w->dSA, Fs, w1->w, D, 0.0, s->dU,
                  D);
        if (!tm__mag_var_gemm(&s->ar, CblasNoTrans, CblasNoTrans, (int)N, D, Fs, w->dSA, s->VdSA, N,
                              (size_t)Fs, w1->w, NULL, (size_t)Fs, (size_t)D, 0.0, s->VdU))
            return false;
    }
    memset(s->dgate, 0, NK * sizeof(double));
    memset(s->Vdgate, 0, NK * sizeof(double));
    layer_loop lp = {s, l};
    if (!tm__mag_lanes_room(s, l) ||
        !tm__ref_ordered_for(E, w->workers, expert_backward_var, expert_backward_var_commit, &lp))
        return false;
    /* the gradient's router, router losses and norm; then the pass's (they reuse w->DZ) */
    tm__ref_backward_layer_end(s->ref, s->p, w, l);
    /* the gates' softmax into the router's rows and dU (reference_magnitude_router.c) */
    if (!tm__mag_router_backward_var(s, l))
        return false;
    const double *rw = s->p->router[l]->w;
    double *rv = s->p->router[l]->m;
    /* the router losses reach every logit */
    if (w->DLR) {
        const double *dlr = w->DLR + (size_t)l * N * E, *vdlr = s->VDLR + (size_t)l * N * E;
        if (!tm__mag_var_gemm(&s->ar, CblasTrans, CblasNoTrans, E, D, (int)N, dlr, vdlr, N,
                              (size_t)E, u, VU, N, (size_t)D, 1.0, rv))
            return false;
        tm__dgemm(CblasNoTrans, CblasNoTrans, (int)N, D, E, 1.0, dlr, E, rw, D, 1.0, s->dU, D);
        double *v = tm__mag_room(&s->ar, 3, ND);
        if (!v || !tm__mag_var_gemm(&s->ar, CblasNoTrans, CblasNoTrans, (int)N, D, E, dlr, vdlr, N,
                                    (size_t)E, rw, NULL, (size_t)E, (size_t)D, 0.0, v))
            return false;
        for (size_t i = 0; i < ND; i++)
            s->VdU[i] += v[i];
    }
    /* the residual passes dH through; the norm adds its part */
    return tm__mag_norm_backward(s, Hin, VHin, s->p->norm[l]->w, w->R + (size_t)l * N,
                                 s->VR + (size_t)l * N, s->p->norm[l]->m);
}

/* The head's backward with variances: the embedding's (tied head) part and dZ into dU, then
 * the final norm's into dH. LOG holds (p - onehot(y)) / N. */
typedef struct head_back {
    pass *s;
    double *VLOGd; /* (N,V) the variance of (p - onehot(y)) / N */
} head_back;

/* A block of tokens' VLOGd, and their rows of dU = LOG W_emb and of its variance. */
static bool head_back_block(void *ctx, int lane, size_t t0, size_t t1)
{
    const head_back *hb = ctx;
    pass *s = hb->s;
    mag_rows *m = &s->mr[lane];
    const ref_work *w = s->w;
    const int D = s->D, V = s->V;
    const size_t N = s->N, n = t1 - t0;
    double *VLOGd = hb->VLOGd, *p = tm__mag_room(&m->ar, 4, (size_t)V);
    if (!p)
        return false;
    for (size_t t = t0; t < t1; t++) {
        const double *row = w->LOG + t * V;
        for (int v = 0; v < V; v++)
            p[v] = (double)N * row[v] + (v == w->tgt[t]);
        tm__mag_softmax_var(p, s->VLOG + t * V, V, VLOGd + t * V);
        for (int v = 0; v < V; v++) {
            const double onehot = v == w->tgt[t], a = p[v] + onehot;
            VLOGd[t * V + v] = (VLOGd[t * V + v] + a * a) / ((double)N * N);
        }
    }
    tm__dgemm(CblasNoTrans, CblasNoTrans, (int)n, D, V, 1.0, w->LOG + t0 * V, V, s->p->emb->w, D,
              0.0, s->dU + t0 * D, D);
    return tm__mag_var_gemm(&m->ar, CblasNoTrans, CblasNoTrans, (int)n, D, V, w->LOG + t0 * V,
                            VLOGd + t0 * V, n, (size_t)V, s->p->emb->w, NULL, (size_t)V, (size_t)D,
                            0.0, s->VdU + t0 * D);
}

bool tm__mag_head_backward_var(pass *s)
{
    ref_work *w = s->w;
    const int D = s->D, V = s->V, L = s->L;
    const size_t N = s->N, ND = N * (size_t)D, NV = N * (size_t)V;
    head_back hb = {s, tm__mag_room(&s->ar, 3, NV)};
    if (!hb.VLOGd ||
        !tm__ref_blocks_for(N, TM_REF_TOKEN_BLOCK, w->workers, head_back_block, NULL, &hb))
        return false;
    /* VLOGd is arena slot 3; tm__mag_var_gemm uses slots 0 to 2 */
    if (!tm__mag_var_gemm(&s->ar, CblasTrans, CblasNoTrans, V, D, (int)N, w->LOG, hb.VLOGd, N,
                          (size_t)V, w->Z, s->VZ, N, (size_t)D, 1.0, s->p->emb->m))
        return false;
    const double *Hf = w->H + (size_t)L * ND, *VHf = s->VH + (size_t)L * ND;
    memset(s->dH, 0, ND * sizeof(double));
    memset(s->VdH, 0, ND * sizeof(double));
    return tm__mag_norm_backward(s, Hf, VHf, s->p->fnorm->w, w->RF, s->VR + (size_t)L * N,
                                 s->p->fnorm->m);
}
