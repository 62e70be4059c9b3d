/* The error scale of the FP32 model's loss and gradients, computed by the FP64 reference
 * alongside its values (docs/tolerances.md): the forward and the backward run once more,
 * every quantity q carrying a variance V(q) in units of the FP32 unit roundoff squared.
 *
 * A rounded FP32 operation errs by a fraction of u of what it acted on, and errors from
 * thousands of roundings add like independent random terms. So, for q = sum_k a_k b_k:
 *   V(q) = (sum_k |a_k b_k|)^2                 its own rounding: a sum of terms of both signs
 *                                              errs by about u times the sum of their
 *                                              magnitudes, however much they cancel
 *          + sum_k b_k^2 V(a_k) + a_k^2 V(b_k) the errors its inputs carry, in quadrature
 * and for an elementwise f, V(f(x)) = f'(x)^2 V(x) + f(x)^2. A sum of terms of one sign (a
 * norm's sum of squares, a softmax's sum of exponentials) errs by about sqrt(n)/3 u of its
 * value: its own term is taken that much larger. The magnitude of a gradient element is
 * sqrt(V): where the terms that made it cancel (p - onehot(y) as training converges; tokens'
 * contributions to a weight gradient; a pre-activation's dot product) it stays large while the
 * value shrinks, and it grows with the depth of the computation only as the square root of the
 * roundings it adds up.
 *
 * The pass follows reference.c's forward and backward and recomputes the values it needs from
 * the activations the forward kept (the backward's own buffers were reused); it runs after
 * the backward, when those buffers are free again. Weights are exact (read as stored);
 * quantized experts' effective weights carry the rounding of base + c B A. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"
#include "ref_pool.h"

#include "reference_magnitude.h"
#include "tm_error.h"

#define MAG_NOMEM() tm__fail(SELDP_ERR_NOMEM, "reference: out of memory for the error scales")

/* The own-rounding factor of a sum of n terms of one sign, squared: (sqrt(n) / 3)^2, 1 at
 * least. */
double tm__mag_same_sign(size_t n)
{
    double k = (double)n / 9.0;
    return k > 1.0 ? k : 1.0;
}

/* ---- a scratch arena for the products' absolute and squared copies --------------------- */

double *tm__mag_room(arena *a, int i, size_t n)
{
    if (a->cap[i] < n) {
        /* the old buffer goes: the slots grow layer by layer, and kept they would be a sixth
         * of the reference's memory */
        tm__ref_free(a->ref, a->buf[i]);
        a->buf[i] = tm__ref_calloc(a->ref, n, sizeof(double));
        a->cap[i] = a->buf[i] ? n : 0;
    }
    return a->buf[i];
}

void tm__mag_fill_abs(double *dst, const double *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = fabs(src[i]);
}

void tm__mag_fill_sq(double *dst, const double *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] * src[i];
}

/* An elementwise copy, |x| or x^2, in fixed blocks on the arena's workers (bits do not
 * depend on the partition). */
typedef struct fill_job {
    double *dst;
    const double *src;
    bool square;
} fill_job;

#define FILL_BLOCK ((size_t)1 << 16)

static bool fill_block(void *ctx, int lane, size_t begin, size_t end)
{
    (void)lane;
    const fill_job *j = ctx;
    if (j->square)
        tm__mag_fill_sq(j->dst + begin, j->src + begin, end - begin);
    else
        tm__mag_fill_abs(j->dst + begin, j->src + begin, end - begin);
    return true;
}

static void fill(const arena *a, double *dst, const double *src, size_t n, bool square)
{
    fill_job j = {dst, src, square};
    if (a->workers > 1 && n > FILL_BLOCK)
        tm__ref_blocks_for(n, FILL_BLOCK, a->workers, fill_block, NULL, &j);
    else
        fill_block(&j, 0, 0, n);
}

/* The variance of C = op(A) op(B) (m,n; k the inner size; row-major as cblas_dgemm):
 * VC = beta VC + (|A| |B|)^2 + (k / 9) C^2 + VA B^2 + A^2 VB: the own rounding of a sum of k
 * terms of both signs and, where they share one sign, of a sum whose partial sums grow with
 * it. The drift term is taken on every product, not only on token sums: without it on the
 * feature sums, a correct bf16 run at d_model 256 (world 2, ep 2, lr 0.3) exceeded the bound
 * of its router and embedding gradients at step 4 (1.08 of it). VA or VB NULL: that factor is
 * exact. ar/ac are A's stored rows and columns (lda = ac), br/bc B's. Returns false when out of
 * memory. */
bool tm__mag_var_gemm(arena *a, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                      const double *A, const double *VA, size_t ar, size_t ac, const double *B,
                      const double *VB, size_t br, size_t bc, double beta, double *VC)
{
    return tm__mag_var_gemm_of(a, ta, tb, m, n, k, A, VA, ar, ac, B, VB, br, bc, NULL, beta, VC);
}

bool tm__mag_var_gemm_of(arena *a, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                         const double *A, const double *VA, size_t ar, size_t ac, const double *B,
                         const double *VB, size_t br, size_t bc, const double *C, double beta,
                         double *VC)
{
    const size_t na = ar * ac, nb = br * bc, nc = (size_t)m * (size_t)n;
    double *tA = tm__mag_room(a, 0, na), *tB = tm__mag_room(a, 1, nb), *tC = tm__mag_room(a, 2, nc);
    if (!tA || !tB || !tC)
        return false;
    const double drift = (double)k / 9.0;
    if (!C) {
        tm__dgemm(ta, tb, m, n, k, 1.0, A, (int)ac, B, (int)bc, 0.0, tC, n);
        C = tC;
    }
    /* beta 0 does not read VC: a fresh buffer's first touch is then a write (a read first
     * maps the zero page, and the write after it copies it and flushes the other cores'
     * TLBs, an interrupt to each at every page) */
    if (beta == 0.0) {
        for (size_t i = 0; i < nc; i++)
            VC[i] = drift * C[i] * C[i];
    } else {
        for (size_t i = 0; i < nc; i++)
            VC[i] = beta * VC[i] + drift * C[i] * C[i];
    }
    fill(a, tA, A, na, false);
    fill(a, tB, B, nb, false);
    tm__dgemm(ta, tb, m, n, k, 1.0, tA, (int)ac, tB, (int)bc, 0.0, tC, n);
    for (size_t i = 0; i < nc; i++)
        VC[i] += tC[i] * tC[i];
    if (VA) {
        fill(a, tB, B, nb, true);
        tm__dgemm(ta, tb, m, n, k, 1.0, VA, (int)ac, tB, (int)bc, 1.0, VC, n);
    }
    if (VB) {
        fill(a, tA, A, na, true);
        tm__dgemm(ta, tb, m, n, k, 1.0, tA, (int)ac, VB, (int)bc, 1.0, VC, n);
    }
    return true;
}

/* ---- the pass's state ---------------------------------------------------------------------- */

bool tm__mag_lanes_room(pass *s, int l)
{
    if (!tm__ref_lanes_room(s->ref, s->w, l))
        return false;
    const size_t most = tm__ref_layer_most_rows(s->ref, s->w, l);
    const size_t D = (size_t)s->D, F = (size_t)s->F;
    for (int i = 0; i < s->w->lanes; i++) {
        mag_rows *m = &s->mr[i];
        if (m->cap >= most)
            continue;
        const size_t cap = most + most / 8 + 1; /* as the reference's lanes */
        double **nd[] = {&m->VX, &m->VY, &m->VdHr, &m->VdYE, &m->VdX};
        double **nf[] = {&m->VA, &m->VS, &m->VSL, &m->VP, &m->VdA, &m->SM, &m->SLM};
        for (size_t k = 0; k < sizeof nd / sizeof nd[0]; k++) {
            tm__ref_free(s->ref, *nd[k]);
            if (!(*nd[k] = tm__ref_calloc(s->ref, cap * D, sizeof(double))))
                return false;
        }
        for (size_t k = 0; k < sizeof nf / sizeof nf[0]; k++) {
            tm__ref_free(s->ref, *nf[k]);
            if (!(*nf[k] = tm__ref_calloc(s->ref, cap * F, sizeof(double))))
                return false;
        }
        m->cap = cap;
    }
    return true;
}

static seldp_status pass_alloc(pass *s)
{
    tm_reference *ref = s->ref;
    const size_t N = s->N, D = (size_t)s->D, F = (size_t)s->F, E = (size_t)s->E;
    const size_t K = (size_t)s->K, L = (size_t)s->L, V = (size_t)s->V, Fs = (size_t)s->Fs;
    const size_t NK = N * K, LE2 = L * E * 2, RB = N < TM_REF_TOKEN_BLOCK ? N : TM_REF_TOKEN_BLOCK;
    const bool losses = s->w->DLR != NULL;
#define A(field, count) (s->field = tm__ref_calloc(ref, (count), sizeof(double)))
    if (!A(VH, (L + 1) * N * D) || !A(VU, L * N * D) || !A(VR, (L + 1) * N) || !A(VG, L * NK) ||
        !A(VSA, L * N * Fs) || !A(VZ, N * D) || !A(VLOG, N * V) || !A(AH, N * D) ||
        !A(F_AUX, (size_t)(s->w->n_shards > 1 ? s->w->n_shards : 1) * E) || !A(dH, N * D) ||
        !A(VdH, N * D) || !A(dU, N * D) || !A(VdU, N * D) || !A(dgate, NK) || !A(Vdgate, NK) ||
        !A(VDZ, NK) || !A(VdSS, N * Fs) || !A(VdSA, N * Fs) || !A(SL, N * Fs) || !A(VSLs, N * Fs) ||
        (losses && !A(VDLR, L * N * E)))
        return MAG_NOMEM();
#undef A
    /* each lane's; the rows' buffers come with each layer's expert loop (tm__mag_lanes_room) */
    s->mr = tm__ref_calloc(ref, (size_t)s->w->lanes, sizeof *s->mr);
    if (!s->mr)
        return MAG_NOMEM();
    for (int i = 0; i < s->w->lanes; i++) {
        mag_rows *m = &s->mr[i];
        m->ar.ref = ref;
#define A(field, count) (m->field = tm__ref_calloc(ref, (count), sizeof(double)))
        if (!A(VdW, D * F) || !A(LG, RB * E) || !A(VLG, RB * E) || !A(PR, RB * E) ||
            !A(VPR, RB * E) || !A(TB, RB * 3 * D))
            return MAG_NOMEM();
#undef A
    }
    s->VW = tm__ref_calloc(ref, LE2, sizeof *s->VW);
    if (!s->VW)
        return MAG_NOMEM();
    /* a quantized expert's W = base + c B A, formed in FP32: the rounding of its terms */
    const tm_config *c = &ref->cfg;
    for (size_t i = 0; c->quant != TM_QUANT_NONE && i < LE2; i++) {
        const ref_linear *li = &s->p->lin[i];
        const size_t n = (size_t)li->out * (size_t)li->in;
        const int r = c->lora_rank;
        double *aB = tm__ref_calloc(ref, li->lora_b->n, sizeof *aB);
        double *aA = tm__ref_calloc(ref, li->lora_a->n, sizeof *aA);
        s->VW[i] = tm__ref_calloc(ref, n, sizeof(double));
        if (!aB || !aA || !s->VW[i])
            return MAG_NOMEM();
        tm__mag_fill_abs(aB, li->lora_b->w, li->lora_b->n);
        tm__mag_fill_abs(aA, li->lora_a->w, li->lora_a->n);
        tm__mag_fill_abs(s->VW[i], li->base, n);
        tm__dgemm(CblasNoTrans, CblasNoTrans, li->out, li->in, r, c->lora_alpha / r, aB, r, aA,
                  li->in, 1.0, s->VW[i], li->in);
        for (size_t k = 0; k < n; k++)
            s->VW[i][k] *= s->VW[i][k];
    }
    return SELDP_OK;
}

/* ---- elementwise rules --------------------------------------------------------------------- */

/* One row of rms_row: x (D) with variances vx, r = 1/rms(x) as the forward found it, ag the
 * norm's weights; the output's variances into vu; returns r's variance. */
static double rms_row_var(const double *x, const double *vx, const double *g, double r, int D,
                          double *vu)
{
    double ss = 0.0, vss = 0.0;
    for (int i = 0; i < D; i++) {
        ss += x[i] * x[i];
        vss += 4.0 * x[i] * x[i] * vx[i];
    }
    vss += tm__mag_same_sign((size_t)D) * ss * ss;
    /* r = (ss / D + eps)^(-1/2): dr / dss = -r^3 / (2 D); a division and a square root */
    double vr = r * r * r * r * r * r / (4.0 * D * D) * vss + 2.0 * r * r;
    for (int i = 0; i < D; i++) {
        double u = x[i] * r * g[i];
        vu[i] = r * r * g[i] * g[i] * vx[i] + x[i] * x[i] * g[i] * g[i] * vr + 2.0 * u * u;
    }
    return vr;
}

/* rms_row_back with variances: dx_j += dy_j g_j r - c x_j, c = r^3 (sum_i dy_i g_i x_i) / D,
 * dg_j += dy_j x_j r (a token sum: its terms into ts). */
static void rms_back_var(const double *x, const double *vx, const double *g, double r, double vr,
                         int D, const double *dy, const double *vdy, double *dx, double *vdx,
                         double *terms)
{
    double dot = 0.0, vdot = 0.0, adot = 0.0;
    for (int i = 0; i < D; i++) {
        double t = dy[i] * g[i] * x[i];
        dot += t;
        adot += fabs(t);
        vdot += g[i] * g[i] * (x[i] * x[i] * vdy[i] + dy[i] * dy[i] * vx[i]);
    }
    vdot += adot * adot;
    const double c = r * r * r * dot / D;
    const double vc = r * r * r * r * r * r / ((double)D * D) * vdot +
                      9.0 * r * r * r * r * dot * dot / ((double)D * D) * vr + 3.0 * c * c;
    for (int j = 0; j < D; j++) {
        double a = r * dy[j] * g[j], b = c * x[j];
        dx[j] += a - b;
        vdx[j] += dy[j] * dy[j] * g[j] * g[j] * vr + r * r * g[j] * g[j] * vdy[j] +
                  x[j] * x[j] * vc + c * c * vx[j] + (fabs(a) + fabs(b)) * (fabs(a) + fabs(b));
        terms[j] = x[j] * x[j] * r * r * vdy[j] + dy[j] * dy[j] * r * r * vx[j] +
                   dy[j] * dy[j] * x[j] * x[j] * vr;
        terms[D + j] = fabs(dy[j] * x[j] * r);
        terms[2 * D + j] = dy[j] * x[j] * r;
    }
}

typedef struct norm_back {
    pass *s;
    const double *x, *vx, *g, *r, *vr; /* (N,D) (N,D) (D) (N) (N) */
    double *vdg;                       /* (D) */
    token_sum ts;
} norm_back;

static bool norm_back_block(void *ctx, int lane, size_t t0, size_t t1)
{
    const norm_back *nb = ctx;
    pass *s = nb->s;
    const size_t D = (size_t)s->D;
    double *terms = s->mr[lane].TB;
    for (size_t t = t0; t < t1; t++)
        rms_back_var(nb->x + t * D, nb->vx + t * D, nb->g, nb->r[t], nb->vr[t], s->D, s->dU + t * D,
                     s->VdU + t * D, s->dH + t * D, s->VdH + t * D, terms + (t - t0) * 3 * D);
    return true;
}

/* the block's terms of the weight's variance and of its token sum, in token order */
static void norm_back_commit(void *ctx, int lane, size_t t0, size_t t1)
{
    const norm_back *nb = ctx;
    const size_t D = (size_t)nb->s->D;
    const double *terms = nb->s->mr[lane].TB;
    for (size_t i = 0; i < t1 - t0; i++, terms += 3 * D)
        for (size_t j = 0; j < D; j++) {
            nb->vdg[j] += terms[j];
            nb->ts.abs[j] += terms[D + j];
            nb->ts.value[j] += terms[2 * D + j];
        }
}

bool tm__mag_norm_backward(pass *s, const double *x, const double *vx, const double *g,
                           const double *r, const double *vr, double *vdg)
{
    norm_back nb = {s, x, vx, g, r, vr, vdg, {NULL, NULL}};
    if (!tm__mag_token_sum_of(&s->ar, 4, (size_t)s->D, &nb.ts))
        return false;
    tm__ref_blocks_for(s->N, TM_REF_TOKEN_BLOCK, s->w->workers, norm_back_block, norm_back_commit,
                       &nb);
    tm__mag_close_sum(vdg, nb.ts, (size_t)s->D, s->N);
    return true;
}

/* Add the own rounding of a sum of `terms` terms (tm__mag_var_gemm's rule) into a weight's
 * variance. */
void tm__mag_close_sum(double *v, token_sum ts, size_t n, size_t terms)
{
    for (size_t i = 0; i < n; i++)
        v[i] += ts.abs[i] * ts.abs[i] + (double)terms / 9.0 * ts.value[i] * ts.value[i];
}

/* Two arena slots as a zeroed token_sum of n elements. */
bool tm__mag_token_sum_of(arena *a, int slot, size_t n, token_sum *ts)
{
    ts->abs = tm__mag_room(a, slot, 2 * n);
    if (!ts->abs)
        return false;
    ts->value = ts->abs + n;
    memset(ts->abs, 0, 2 * n * sizeof *ts->abs);
    return true;
}

/* The softmax rule: p_j = exp(z_j - lse) over n logits of variances vz, its sum of n
 * exponentials of one sign: V(p_j) = p_j^2 (vz_j + sum_i p_i^2 vz_i + sum's rounding) + 2 p_j^2
 * (the exponential and the division). */
void tm__mag_softmax_var(const double *p, const double *vz, int n, double *vp)
{
    double pz = 0.0;
    for (int i = 0; i < n; i++)
        pz += p[i] * p[i] * vz[i];
    for (int j = 0; j < n; j++)
        vp[j] = p[j] * p[j] * (vz[j] + pz + tm__mag_same_sign((size_t)n) + 2.0);
}

/* ---- forward ----------------------------------------------------------------------------- */

/* A layer's experts on the pass's workers (ref_pool.h). */
typedef struct layer_loop {
    pass *s;
    int l;
} layer_loop;

/* One expert's output's variances (m->VY) and values (the lane's YE) over its rows. */
static bool expert_forward_var(void *ctx, int lane, int e)
{
    layer_loop *lp = ctx;
    const pass *s = lp->s;
    const int l = lp->l, D = s->D, F = s->F, E = s->E, K = s->K;
    const ref_work *w = s->w;
    ref_rows *x = &w->rows[lane];
    mag_rows *m = &s->mr[lane];
    const double *VU = s->VU + (size_t)l * s->N * (size_t)D;
    const size_t i1 = ((size_t)l * E + e) * 2;
    const ref_linear *w1 = &s->p->lin[i1], *w2 = w1 + 1;
    const size_t n = tm__ref_gather_rows(s->ref, w, l, e, x->X, &x->slots);
    x->n = n;
    if (n == 0)
        return true;
    for (size_t i = 0; i < n; i++)
        memcpy(m->VX + i * D, VU + (x->slots[i] / K) * D, (size_t)D * sizeof(double));
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, F, D, 1.0, x->X, D, w1->w, D, 0.0, x->A, F);
    if (!tm__mag_var_gemm_of(&m->ar, CblasNoTrans, CblasTrans, (int)n, F, D, x->X, m->VX, n,
                             (size_t)D, w1->w, s->VW[i1], (size_t)F, (size_t)D, x->A, 0.0, m->VA))
        return false;
    tm__mag_silu_var(x->A, m->VA, n * (size_t)F, x->S, m->VS, x->dA, m->VSL);
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, D, F, 1.0, x->S, F, w2->w, F, 0.0, x->YE, D);
    return tm__mag_var_gemm_of(&m->ar, CblasNoTrans, CblasTrans, (int)n, D, F, x->S, m->VS, n,
                               (size_t)F, w2->w, s->VW[i1 + 1], (size_t)D, (size_t)F, x->YE, 0.0,
                               m->VY);
}

/* The expert's gated output into its rows' variances and the residual sum's magnitudes, in
 * expert order. */
static void expert_forward_var_commit(void *ctx, int lane, int e)
{
    (void)e;
    layer_loop *lp = ctx;
    const pass *s = lp->s;
    const int l = lp->l, D = s->D, K = s->K;
    const size_t N = s->N, NK = N * (size_t)K;
    const ref_rows *x = &s->w->rows[lane];
    const mag_rows *m = &s->mr[lane];
    const double *gate = s->w->GATE + (size_t)l * NK, *VG = s->VG + (size_t)l * NK;
    double *VHo = s->VH + (size_t)(l + 1) * N * (size_t)D;
    for (size_t i = 0; i < x->n; i++) {
        const size_t slot = x->slots[i];
        const double g = gate[slot], vg = VG[slot];
        double *vh = VHo + (slot / K) * D, *ah = s->AH + (slot / K) * D;
        for (int j = 0; j < D; j++) {
            double y = x->YE[i * D + j];
            vh[j] += g * g * m->VY[i * D + j] + y * y * vg + g * g * y * y;
            ah[j] += fabs(g * y);
        }
    }
}

/* A block of layer l's tokens: its norm's VR and VU, its output's residual VH and |H| (AH). */
static bool norm_var_block(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)lane;
    const layer_loop *lp = ctx;
    pass *s = lp->s;
    const int D = s->D, l = lp->l;
    const size_t N = s->N, ND = N * (size_t)D, n = (t1 - t0) * (size_t)D;
    const double *H = s->w->H + (size_t)l * ND, *VH = s->VH + (size_t)l * ND;
    double *VU = s->VU + (size_t)l * ND, *VHo = s->VH + (size_t)(l + 1) * ND;
    for (size_t t = t0; t < t1; t++)
        s->VR[(size_t)l * N + t] = rms_row_var(H + t * D, VH + t * D, s->p->norm[l]->w,
                                               s->w->R[(size_t)l * N + t], D, VU + t * D);
    memcpy(VHo + t0 * D, VH + t0 * D, n * sizeof(double));
    tm__mag_fill_abs(s->AH + t0 * D, H + t0 * D, n);
    return true;
}

/* the residual sum's own rounding into a block of layer l's output variances */
static bool residual_var_block(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)lane;
    const layer_loop *lp = ctx;
    pass *s = lp->s;
    const size_t D = (size_t)s->D;
    double *VHo = s->VH + (size_t)(lp->l + 1) * s->N * D;
    for (size_t i = t0 * D; i < t1 * D; i++)
        VHo[i] += s->AH[i] * s->AH[i];
    return true;
}

/* Layer l's activations' variances: VU, VR, VG, VSA, VH of its output, the router losses'. */
static bool layer_forward_var(pass *s, int l)
{
    const ref_work *w = s->w;
    const int D = s->D, E = s->E, Fs = s->Fs;
    const size_t N = s->N, ND = N * (size_t)D;
    const double *u = w->U + (size_t)l * ND;
    double *VU = s->VU + (size_t)l * ND, *VHo = s->VH + (size_t)(l + 1) * ND;
    layer_loop lp = {s, l};
    /* the norm; the residual and (below) each expert's gated output, AH the magnitudes the sum
     * rounds */
    tm__ref_blocks_for(N, TM_REF_TOKEN_BLOCK, w->workers, norm_var_block, NULL, &lp);
    if (!tm__mag_router_layer_var(s, l))
        return false;
    if (!tm__mag_lanes_room(s, l) ||
        !tm__ref_ordered_for(E, w->workers, expert_forward_var, expert_forward_var_commit, &lp))
        return false;
    if (Fs > 0) {
        const size_t NF = N * (size_t)Fs;
        const double *sa = w->SA + (size_t)l * NF;
        double *vsa = s->VSA + (size_t)l * NF;
        if (!tm__mag_var_gemm(&s->ar, CblasNoTrans, CblasTrans, (int)N, Fs, D, u, VU, N, (size_t)D,
                              s->p->sw1[l]->w, NULL, (size_t)Fs, (size_t)D, 0.0, vsa))
            return false;
        tm__mag_silu_var(sa, vsa, NF, w->SS, s->VdSS, s->SL, s->VSLs);
        if (!tm__mag_var_gemm(&s->ar, CblasNoTrans, CblasTrans, (int)N, D, Fs, w->SS, s->VdSS, N,
                              (size_t)Fs, s->p->sw2[l]->w, NULL, (size_t)D, (size_t)Fs, 1.0, VHo))
            return false;
        /* its output's magnitudes for the residual sum's rounding */
        double *aSS = tm__mag_room(&s->ar, 3, NF),
               *aW = tm__mag_room(&s->ar, 4, (size_t)D * (size_t)Fs);
        if (!aSS || !aW)
            return false;
        tm__mag_fill_abs(aSS, w->SS, NF);
        tm__mag_fill_abs(aW, s->p->sw2[l]->w, (size_t)D * (size_t)Fs);
        tm__dgemm(CblasNoTrans, CblasTrans, (int)N, D, Fs, 1.0, aSS, Fs, aW, Fs, 1.0, s->AH, D);
    }
    tm__ref_blocks_for(N, TM_REF_TOKEN_BLOCK, w->workers, residual_var_block, NULL, &lp);
    return true;
}

typedef struct head_loop {
    pass *s;
    double vloss; /* the commits' sum */
} head_loop;

/* A block of tokens' final norm (VR, VZ), logits' variances (VLOG) and token losses'
 * variances (into the lane's TB until the commit). */
static bool head_var_block(void *ctx, int lane, size_t t0, size_t t1)
{
    const head_loop *hl = ctx;
    pass *s = hl->s;
    mag_rows *m = &s->mr[lane];
    const ref_work *w = s->w;
    const int D = s->D, V = s->V, L = s->L;
    const size_t N = s->N, ND = N * (size_t)D, n = t1 - t0;
    const double *Hf = w->H + (size_t)L * ND, *VHf = s->VH + (size_t)L * ND;
    for (size_t t = t0; t < t1; t++)
        s->VR[(size_t)L * N + t] =
            rms_row_var(Hf + t * D, VHf + t * D, s->p->fnorm->w, w->RF[t], D, s->VZ + t * D);
    if (!tm__mag_var_gemm(&m->ar, CblasNoTrans, CblasTrans, (int)n, V, D, w->Z + t0 * D,
                          s->VZ + t0 * D, n, (size_t)D, s->p->emb->w, NULL, (size_t)V, (size_t)D,
                          0.0, s->VLOG + t0 * V))
        return false;
    /* a token's loss lse - z_y, lse = z_y - log p_y: V = V(lse) + V(z_y) + the difference's */
    for (size_t t = t0; t < t1; t++) {
        const double *row = w->LOG + t * V, *vz = s->VLOG + t * V;
        const int y = w->tgt[t];
        double vlse = 0.0, z_y = 0.0;
        for (int v = 0; v < V; v++) {
            double p = (double)N * row[v] + (v == y);
            vlse += p * p * vz[v];
        }
        for (int j = 0; j < D; j++)
            z_y += w->Z[t * D + j] * s->p->emb->w[(size_t)y * D + j];
        const double lse = z_y - log((double)N * row[y] + 1.0);
        vlse += tm__mag_same_sign((size_t)V) * lse * lse;
        m->TB[t - t0] = vlse + vz[y] + (fabs(lse) + fabs(z_y)) * (fabs(lse) + fabs(z_y));
    }
    return true;
}

/* the block's token losses' variances into the loss's, in token order */
static void head_var_commit(void *ctx, int lane, size_t t0, size_t t1)
{
    head_loop *hl = ctx;
    const double *terms = hl->s->mr[lane].TB;
    for (size_t i = 0; i < t1 - t0; i++)
        hl->vloss += terms[i];
}

/* The final norm and the head: VZ, the logits' VLOG, the loss's variance. */
static bool head_forward_var(pass *s)
{
    head_loop hl = {s, 0.0};
    if (!tm__ref_blocks_for(s->N, TM_REF_TOKEN_BLOCK, s->w->workers, head_var_block,
                            head_var_commit, &hl))
        return false;
    s->loss_var += hl.vloss / ((double)s->N * s->N);
    return true;
}

/* ---- the pass ---------------------------------------------------------------------------- */

static void to_magnitudes(tm_reference *ref)
{
    for (size_t i = 0; i < ref->n_entries; i++) {
        ref_entry *en = &ref->entries[i];
        for (size_t k = 0; en->m && k < en->n; k++)
            en->m[k] = sqrt(en->m[k]);
    }
}

seldp_status tm__ref_magnitudes(tm_reference *ref, const ref_params *p, ref_work *w)
{
    const tm_config *c = &ref->cfg;
    pass s = {.ref = ref,
              .p = p,
              .w = w,
              .ar = {.ref = ref, .workers = w->workers},
              .D = c->d_model,
              .F = c->d_ff,
              .E = c->experts,
              .K = c->top_k,
              .L = c->layers,
              .V = c->vocab,
              .Fs = c->d_ff_shared,
              .N = w->N};
    seldp_status st = pass_alloc(&s);
    if (st != SELDP_OK)
        return st;
    for (int l = 0; l < s.L; l++)
        if (!layer_forward_var(&s, l))
            return MAG_NOMEM();
    if (!head_forward_var(&s))
        return MAG_NOMEM();
    /* the backward: the gradient's pieces (reference.c) beside the pass's */
    tm__ref_backward_head(ref, p, w);
    tm__ref_free(ref, w->dZ); /* its last reader */
    w->dZ = NULL;
    if (!tm__mag_head_backward_var(&s))
        return MAG_NOMEM();
    for (int l = s.L - 1; l >= 0; l--)
        if (!tm__mag_layer_backward_var(&s, l))
            return MAG_NOMEM();
    /* the embedding rows gather the first layer's input gradient */
    const size_t D = (size_t)s.D;
    tm__ref_backward_embed(p, w, s.D);
    for (size_t t = 0; t < s.N; t++)
        for (size_t i = 0; i < D; i++)
            p->emb->m[(size_t)w->tok[t] * D + i] += s.VdH[t * D + i];
    /* the backward's token gradients have had their last reader */
    double **dead[] = {&w->dH, &w->dU, &w->dgate, &s.dH,    &s.VdH,
                       &s.dU,  &s.VdU, &s.dgate,  &s.Vdgate};
    for (size_t k = 0; k < sizeof dead / sizeof dead[0]; k++) {
        tm__ref_free(ref, *dead[k]);
        *dead[k] = NULL;
    }
    to_magnitudes(ref);
    ref->loss_magnitude = sqrt(s.loss_var);
    return SELDP_OK;
}
