/* The router's error scales (reference_magnitude.h): in blocks of TM_REF_TOKEN_BLOCK tokens,
 * its logits, the gates and the router losses' logit gradients forward; backward, the gates'
 * softmax into the router's rows and the tokens' dU. */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"
#include "ref_pool.h"

#include "reference_magnitude.h"

/* The router's logits, probabilities and their variances (m's LG, VLG, PR, VPR: n rows) of
 * layer l's tokens [t0, t0 + n). */
static bool router_var(const pass *s, mag_rows *m, int l, size_t t0, size_t n)
{
    const int D = s->D, E = s->E;
    const size_t ND = s->N * (size_t)D;
    const double *u = s->w->U + (size_t)l * ND + t0 * D, *vu = s->VU + (size_t)l * ND + t0 * D;
    const double *rw = s->p->router[l]->w;
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, E, D, 1.0, u, D, rw, D, 0.0, m->LG, E);
    if (!tm__mag_var_gemm_of(&m->ar, CblasNoTrans, CblasTrans, (int)n, E, D, u, vu, n, (size_t)D,
                             rw, NULL, (size_t)E, (size_t)D, m->LG, 0.0, m->VLG))
        return false;
    for (size_t t = 0; t < n; t++) {
        const double *z = m->LG + t * E;
        double mx = z[0], se = 0.0;
        for (int e = 1; e < E; e++)
            mx = fmax(mx, z[e]);
        double *pr = m->PR + t * E;
        for (int e = 0; e < E; e++) {
            pr[e] = exp(z[e] - mx);
            se += pr[e];
        }
        for (int e = 0; e < E; e++)
            pr[e] /= se;
        tm__mag_softmax_var(m->PR + t * E, m->VLG + t * E, E, m->VPR + t * E);
    }
    return true;
}

/* The load-balancing loss's expert fractions f (E per data shard, one shard for the global
 * scope) of layer l, into s->F_AUX: f_e = (assignments to e) / (tokens K). */
static void aux_fractions(pass *s, int l, int shards, bool global)
{
    const int E = s->E, K = s->K;
    const size_t N = s->N;
    const int *sel = s->w->SEL + (size_t)l * N * (size_t)K;
    memset(s->F_AUX, 0, (size_t)shards * (size_t)E * sizeof *s->F_AUX);
    for (int r = 0; r < shards; r++) {
        size_t first = global ? 0 : s->w->shard_begin[r];
        size_t end = global ? N : s->w->shard_begin[r + 1];
        double *f = s->F_AUX + (size_t)r * E;
        for (size_t t = first; t < end; t++)
            for (int k = 0; k < K; k++)
                f[sel[t * K + k]] += 1.0 / ((double)(end - first) * K);
    }
}

/* The router losses' logit gradients' variances of layer l's tokens [t0, t0 + n) (the
 * gradients reference_router.c computes: aux (alpha E / N_s) p_j (f_j - sum_e f_e p_e), z
 * (2 beta / N) lse p_j), and their loss's variance into m->loss_var. m's LG, VLG, PR and VPR
 * hold the block's rows (router_var), F_AUX the fractions (aux_fractions). */
static void router_loss_var(const pass *s, mag_rows *m, int l, size_t t0, size_t n)
{
    const tm_config *c = &s->ref->cfg;
    const int E = s->E;
    const size_t N = s->N;
    double *vd = s->VDLR + (size_t)l * N * (size_t)E;
    for (size_t i = 0; i < n && c->z_loss_coeff > 0.0; i++) {
        const size_t t = t0 + i;
        const double *p = m->PR + i * E, *vp = m->VPR + i * E, *vz = m->VLG + i * E;
        const double *z = m->LG + i * E;
        double mx = z[0], se = 0.0, vlse = 0.0;
        for (int e = 1; e < E; e++)
            mx = fmax(mx, z[e]);
        for (int e = 0; e < E; e++) {
            se += exp(z[e] - mx);
            vlse += p[e] * p[e] * vz[e];
        }
        const double lse = mx + log(se), b = 2.0 * c->z_loss_coeff / (double)N;
        vlse += tm__mag_same_sign((size_t)E) * lse * lse;
        for (int e = 0; e < E; e++)
            vd[t * E + e] +=
                b * b * (p[e] * p[e] * vlse + lse * lse * vp[e] + lse * lse * p[e] * p[e]);
        m->loss_var += c->z_loss_coeff * c->z_loss_coeff * 4.0 * lse * lse * vlse / ((double)N * N);
    }
    if (c->aux_loss_coeff <= 0.0)
        return;
    const bool global = c->aux_loss_scope == TM_AUX_GLOBAL;
    const double a = c->aux_loss_coeff * E / (double)N;
    int shard = 0; /* the data shard of token t0, then of t */
    while (!global && t0 >= s->w->shard_begin[shard + 1])
        shard++;
    for (size_t i = 0; i < n; i++) {
        const size_t t = t0 + i;
        while (!global && t >= s->w->shard_begin[shard + 1])
            shard++;
        const double *f = s->F_AUX + (size_t)(global ? 0 : shard) * E;
        const double *p = m->PR + i * E, *vp = m->VPR + i * E;
        double fp = 0.0, vfp = 0.0;
        for (int e = 0; e < E; e++) {
            fp += f[e] * p[e];
            vfp += f[e] * f[e] * vp[e];
        }
        for (int j = 0; j < E; j++) {
            double d = f[j] - fp;
            vd[t * E + j] +=
                a * a *
                (d * d * vp[j] + p[j] * p[j] * vfp + p[j] * p[j] * (f[j] + fp) * (f[j] + fp));
        }
        m->loss_var += a * a * vfp;
    }
}

/* The gates' variances of the block's tokens [t0, t0 + n): a softmax over the K selected
 * logits (m->VLG holds the block's rows). The FP32 model takes them from its probabilities
 * over all E experts, which underflow far below the largest logit: each gate also errs by up
 * to E times two roundings at half FP32's smallest subnormal (the exponential's and the
 * division's), whatever its value, a floor that matters only to gates near 1e-38 and below
 * (an expert a near tie in underflow sent a token to; reference_router.c). */
static void gates_var(const pass *s, const mag_rows *m, int l, size_t t0, size_t n)
{
    const int E = s->E, K = s->K;
    const size_t NK = s->N * (size_t)K;
    const int *sel = s->w->SEL + (size_t)l * NK;
    const double *gate = s->w->GATE + (size_t)l * NK;
    double *VG = s->VG + (size_t)l * NK;
    const double floor = 3.0 * E * 0x1p-126; /* 3 E 2^-150 in units of u = 2^-24 */
    for (size_t i = 0; i < n; i++) {
        const size_t t = t0 + i;
        double pz = 0.0;
        for (int k = 0; k < K; k++)
            pz += gate[t * K + k] * gate[t * K + k] * m->VLG[i * E + sel[t * K + k]];
        for (int k = 0; k < K; k++) {
            double g = gate[t * K + k];
            VG[t * K + k] =
                g * g * (m->VLG[i * E + sel[t * K + k]] + pz + tm__mag_same_sign(K) + 2.0) +
                floor * floor;
        }
    }
}

/* A layer's router blocks on the pass's workers (ref_pool.h). */
typedef struct layer_loop {
    pass *s;
    int l;
} layer_loop;

static bool router_block_var(void *ctx, int lane, size_t t0, size_t t1)
{
    layer_loop *lp = ctx;
    const pass *s = lp->s;
    mag_rows *m = &s->mr[lane];
    const size_t n = t1 - t0;
    m->loss_var = 0.0;
    if (!router_var(s, m, lp->l, t0, n))
        return false;
    gates_var(s, m, lp->l, t0, n);
    if (s->VDLR)
        router_loss_var(s, m, lp->l, t0, n);
    return true;
}

/* The block's part of the loss's variance, in block order. */
static void router_block_commit(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)t0, (void)t1;
    layer_loop *lp = ctx;
    lp->s->loss_var += lp->s->mr[lane].loss_var;
}

/* Layer l's router in blocks of tokens: the gates' variances and the router losses'. */
bool tm__mag_router_layer_var(pass *s, int l)
{
    const tm_config *c = &s->ref->cfg;
    const bool global = c->aux_loss_scope == TM_AUX_GLOBAL;
    const int shards = global ? 1 : s->w->n_shards;
    if (s->VDLR) {
        memset(s->VDLR + (size_t)l * s->N * (size_t)s->E, 0, s->N * (size_t)s->E * sizeof(double));
        if (c->aux_loss_coeff > 0.0)
            aux_fractions(s, l, shards, global);
    }
    layer_loop lp = {s, l};
    return tm__ref_blocks_for(s->N, TM_REF_TOKEN_BLOCK, s->w->workers, router_block_var,
                              router_block_commit, &lp);
}

/* ---- backward ---------------------------------------------------------------------------- */

/* The gates' softmax: a token's K selected logits get dz_k = gate_k (dgate_k - sum_j gate_j
 * dgate_j) with its variance (into w->DZ and s->VDZ), and its rows of dU and VdU the router's
 * rows of those experts. */
static bool router_back_block(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)lane;
    const layer_loop *lp = ctx;
    pass *s = lp->s;
    const int D = s->D, K = s->K, l = lp->l;
    const size_t NK = s->N * (size_t)K;
    const int *sel = s->w->SEL + (size_t)l * NK;
    const double *gate = s->w->GATE + (size_t)l * NK, *VG = s->VG + (size_t)l * NK;
    const double *rw = s->p->router[l]->w;
    for (size_t t = t0; t < t1; t++) {
        double mean = 0.0, vmean = 0.0, amean = 0.0;
        for (int k = 0; k < K; k++) {
            const size_t q = t * K + k;
            mean += gate[q] * s->dgate[q];
            amean += fabs(gate[q] * s->dgate[q]);
            vmean += s->dgate[q] * s->dgate[q] * VG[q] + gate[q] * gate[q] * s->Vdgate[q];
        }
        vmean += amean * amean;
        for (int k = 0; k < K; k++) {
            const size_t q = t * K + k, e = (size_t)sel[q];
            const double d = s->dgate[q] - mean, dz = gate[q] * d;
            const double ad = gate[q] * (fabs(s->dgate[q]) + fabs(mean));
            const double vdz = d * d * VG[q] + gate[q] * gate[q] * (s->Vdgate[q] + vmean) + ad * ad;
            s->w->DZ[q] = dz;
            s->VDZ[q] = vdz;
            for (int j = 0; j < D; j++) {
                s->dU[t * D + j] += dz * rw[e * D + j];
                s->VdU[t * D + j] += rw[e * D + j] * rw[e * D + j] * vdz;
            }
        }
    }
    return true;
}

typedef struct router_rows {
    layer_loop lp;
    const size_t *first, *order; /* every selected slot, grouped by expert (slot order) */
    token_sum rts;
} router_rows;

/* Router row e's variance and its token sum's terms, over the tokens that selected e in token
 * order. */
static bool router_row_back_var(void *ctx, int lane, int e)
{
    (void)lane;
    const router_rows *rr = ctx;
    const pass *s = rr->lp.s;
    const int D = s->D, K = s->K, l = rr->lp.l;
    const size_t ND = s->N * (size_t)D, eD = (size_t)e * D;
    const double *u = s->w->U + (size_t)l * ND, *VU = s->VU + (size_t)l * ND;
    double *rv = s->p->router[l]->m + eD, *ra = rr->rts.abs + eD, *rval = rr->rts.value + eD;
    for (size_t i = rr->first[e]; i < rr->first[e + 1]; i++) {
        const size_t q = rr->order[i], t = q / (size_t)K;
        const double dz = s->w->DZ[q], vdz = s->VDZ[q];
        for (int j = 0; j < D; j++) {
            const double x = u[t * D + j];
            rv[j] += dz * dz * VU[t * D + j] + x * x * vdz;
            ra[j] += fabs(dz * x);
            rval[j] += dz * x;
        }
    }
    return true;
}

bool tm__mag_router_backward_var(pass *s, int l)
{
    router_rows rr = {.lp = {s, l}};
    if (!tm__mag_token_sum_of(&s->ar, 3, (size_t)s->E * (size_t)s->D, &rr.rts))
        return false;
    tm__ref_blocks_for(s->N, TM_REF_TOKEN_BLOCK, s->w->workers, router_back_block, NULL, &rr.lp);
    tm__ref_selected_by_expert(&s->ref->cfg, s->w, l, &rr.first, &rr.order);
    tm__ref_ordered_for(s->E, s->w->workers, router_row_back_var, NULL, &rr);
    tm__mag_close_sum(s->p->router[l]->m, rr.rts, (size_t)s->E * (size_t)s->D, s->N);
    return true;
}
