/* The FP64 reference's loops over tokens (reference_impl.h): the norms, the router's logits,
 * top-K and gates, the head and its loss, the norms' and the router's backward, in blocks of
 * TM_REF_TOKEN_BLOCK tokens on the reference's workers (ref_pool.h). What a token computes is
 * its own; a sum over tokens (a norm's weight gradient, the loss) is taken by the blocks'
 * commits, in block order and within a block in token order, and a router row's gradient by
 * one worker over its expert's tokens in token order: every sum sees its terms in the order a
 * single loop over the tokens would, so the results are the same bits as that loop's, for any
 * number of workers. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"
#include "ref_pool.h"

#include "reference_impl.h"
#include "reference_router.h"

/* ---- math ---------------------------------------------------------------------------- */

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

/* Vector-Jacobian product of rms_row: dx += J^T dy; dg's terms dy * x * r into tg (D). */
static void rms_row_back(const double *x, const double *g, double r, int D, const double *dy,
                         double *dx, double *tg)
{
    double s = 0.0;
    for (int i = 0; i < D; i++)
        s += dy[i] * g[i] * x[i];
    for (int j = 0; j < D; j++) {
        dx[j] += dy[j] * g[j] * r - s * r * r * r * x[j] / D;
        tg[j] = dy[j] * x[j] * r;
    }
}

/* The top-K of one token's logits z (E) into sel (K): expert e takes slot rank(e) =
 * #{j : z_j > z_e, or z_j == z_e and j < e} when that is below K (softmax is monotone, so
 * ranking logits ranks probabilities). The experts come in index order, so e ranks after
 * every kept expert whose logit is not below its own: one insertion per expert that enters. */
static void top_k_ranked(const double *z, int E, int K, int *sel)
{
    int held = 0;
    for (int e = 0; e < E; e++) {
        int at = held;
        while (at > 0 && z[sel[at - 1]] < z[e])
            at--;
        if (at >= K)
            continue;
        for (int i = held < K ? held : K - 1; i > at; i--)
            sel[i] = sel[i - 1];
        sel[at] = e;
        held += held < K;
    }
}

void tm__ref_group_by_expert(const int *sel, const unsigned char *kept, size_t NK, int E,
                             size_t *first, size_t *order, size_t *next)
{
    memset(first, 0, ((size_t)E + 1) * sizeof *first);
    for (size_t s = 0; s < NK; s++)
        first[sel[s] + 1] += kept ? kept[s] : 1;
    for (int e = 0; e < E; e++)
        first[e + 1] += first[e];
    memcpy(next, first, (size_t)E * sizeof *next);
    for (size_t s = 0; s < NK; s++)
        if (!kept || kept[s])
            order[next[sel[s]]++] = s;
}

void tm__ref_selected_by_expert(const tm_config *c, ref_work *w, int l, const size_t **first,
                                const size_t **order)
{
    const size_t E = (size_t)c->experts, NK = w->N * (size_t)c->top_k;
    if (c->capacity_factor <= 0.0) { /* nothing dropped: the kept slots are all of them */
        *first = w->FIRST + (size_t)l * (E + 1);
        *order = w->ORDER + (size_t)l * NK;
        return;
    }
    tm__ref_group_by_expert(w->SEL + (size_t)l * NK, NULL, NK, c->experts, w->AFIRST, w->AORDER,
                            w->next);
    *first = w->AFIRST;
    *order = w->AORDER;
}

/* ---- the forward --------------------------------------------------------------------- */

typedef struct tok_loop {
    tm_reference *ref;
    const ref_params *p;
    ref_work *w;
    int l;
    const int *const *choices;
    const size_t *counts;
    double sum; /* the commits' sum */
} tok_loop;

static bool embed_block(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)lane;
    const tok_loop *lp = ctx;
    const size_t D = (size_t)lp->ref->cfg.d_model;
    for (size_t t = t0; t < t1; t++)
        memcpy(lp->w->H + t * D, lp->p->emb->w + (size_t)lp->w->tok[t] * D, D * sizeof(double));
    return true;
}

void tm__ref_embed(tm_reference *ref, const ref_params *p, ref_work *w)
{
    tok_loop lp = {.ref = ref, .p = p, .w = w};
    tm__ref_blocks_for(w->N, TM_REF_TOKEN_BLOCK, w->workers, embed_block, NULL, &lp);
}

/* layer l's normed inputs U and their 1/rms R, and its output's residual (a copy of its
 * input) */
static bool norm_block(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)lane;
    const tok_loop *lp = ctx;
    const tm_config *c = &lp->ref->cfg;
    const int D = c->d_model, l = lp->l;
    const size_t N = lp->w->N, ND = N * (size_t)D;
    const double *Hin = lp->w->H + (size_t)l * ND;
    double *Hout = lp->w->H + (size_t)(l + 1) * ND, *u = lp->w->U + (size_t)l * ND;
    for (size_t t = t0; t < t1; t++)
        lp->w->R[(size_t)l * N + t] = rms_row(Hin + t * D, lp->p->norm[l]->w, D, c->eps, u + t * D);
    memcpy(Hout + t0 * D, Hin + t0 * D, (t1 - t0) * (size_t)D * sizeof(double));
    return true;
}

void tm__ref_norm_forward(tm_reference *ref, const ref_params *p, ref_work *w, int l)
{
    tok_loop lp = {.ref = ref, .p = p, .w = w, .l = l};
    tm__ref_blocks_for(w->N, TM_REF_TOKEN_BLOCK, w->workers, norm_block, NULL, &lp);
}

/* the data shard of token t: the first r with t < shard_begin[r + 1] */
static size_t shard_of(const ref_work *w, size_t t)
{
    size_t lo = 0, hi = (size_t)w->n_shards - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t < w->shard_begin[mid + 1])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* A block's logits (its own product, or its rows of w->LG where the router losses keep them
 * all), top-K (following the model at near ties) and gates. */
static bool route_block(void *ctx, int lane, size_t t0, size_t t1)
{
    const tok_loop *lp = ctx;
    const tm_config *c = &lp->ref->cfg;
    ref_work *w = lp->w;
    ref_rows *x = &w->rows[lane];
    const int D = c->d_model, E = c->experts, K = c->top_k, l = lp->l;
    const size_t N = w->N, NK = N * (size_t)K;
    int *sel = w->SEL + (size_t)l * NK;
    double *gate = w->GATE + (size_t)l * NK;
    const double *lg = w->LG + t0 * E;
    if (!w->DLR) {
        const double *u = w->U + (size_t)l * N * (size_t)D;
        tm__dgemm(CblasNoTrans, CblasTrans, (int)(t1 - t0), E, D, 1.0, u + t0 * D, D,
                  lp->p->router[l]->w, D, 0.0, x->LG, E);
        lg = x->LG;
    }
    x->count = 0;
    for (size_t t = t0, r = shard_of(w, t0); t < t1; t++) {
        const double *z = lg + (t - t0) * E;
        while (t >= w->shard_begin[r + 1])
            r++;
        top_k_ranked(z, E, K, sel + t * K);
        if (lp->choices && lp->choices[r] &&
            tm__ref_follow_tie(
                z, E, K, lp->choices[r] + ((size_t)l * lp->counts[r] + (t - w->shard_begin[r])) * K,
                sel + t * K))
            x->count++;
        /* Renormalized top-K gates = softmax over the selected logits. */
        double mx = z[sel[t * K]], den = 0.0;
        for (int k = 0; k < K; k++)
            den += exp(z[sel[t * K + k]] - mx);
        for (int k = 0; k < K; k++)
            gate[t * K + k] = exp(z[sel[t * K + k]] - mx) / den;
    }
    return true;
}

static void route_commit(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)t0, (void)t1;
    tok_loop *lp = ctx;
    lp->ref->ties_followed += lp->w->rows[lane].count;
}

void tm__ref_route(tm_reference *ref, const ref_params *p, ref_work *w, int l,
                   const int *const *choices, const size_t *counts)
{
    const tm_config *c = &ref->cfg;
    if (w->DLR) /* the router losses take every logit: one product */
        tm__dgemm(CblasNoTrans, CblasTrans, (int)w->N, c->experts, c->d_model, 1.0,
                  w->U + (size_t)l * w->N * (size_t)c->d_model, c->d_model, p->router[l]->w,
                  c->d_model, 0.0, w->LG, c->experts);
    tok_loop lp = {.ref = ref, .p = p, .w = w, .l = l, .choices = choices, .counts = counts};
    tm__ref_blocks_for(w->N, TM_REF_TOKEN_BLOCK, w->workers, route_block, route_commit, &lp);
}

/* The final norm, the block's logits, their token losses (into the lane's T) and
 * (p - onehot(y)) / N in their place, and the block's rows of dZ. */
static bool head_block(void *ctx, int lane, size_t t0, size_t t1)
{
    const tok_loop *lp = ctx;
    const tm_config *c = &lp->ref->cfg;
    const ref_params *p = lp->p;
    ref_work *w = lp->w;
    ref_rows *x = &w->rows[lane];
    const int D = c->d_model, V = c->vocab;
    const size_t N = w->N, n = t1 - t0;
    const double *Hf = w->H + (size_t)c->layers * N * (size_t)D;
    for (size_t t = t0; t < t1; t++)
        w->RF[t] = rms_row(Hf + t * D, p->fnorm->w, D, c->eps, w->Z + t * D);
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, V, D, 1.0, w->Z + t0 * D, D, p->emb->w, D, 0.0,
              w->LOG + t0 * V, V);
    x->big = 0.0;
    for (size_t t = t0; t < t1; t++) {
        double *row = w->LOG + t * V;
        double mx = row[0];
        for (int v = 1; v < V; v++)
            mx = row[v] > mx ? row[v] : mx;
        double se = 0.0;
        for (int v = 0; v < V; v++)
            se += exp(row[v] - mx);
        const double lse = mx + log(se);
        x->T[t - t0] = lse - row[w->tgt[t]];
        x->big = fmax(x->big, fmax(fabs(mx), fabs(lse)));
        for (int v = 0; v < V; v++)
            row[v] = exp(row[v] - lse) / (double)N;
        row[w->tgt[t]] -= 1.0 / (double)N;
    }
    tm__dgemm(CblasNoTrans, CblasNoTrans, (int)n, D, V, 1.0, w->LOG + t0 * V, V, p->emb->w, D, 0.0,
              w->dZ + t0 * D, D);
    return true;
}

/* the block's token losses into the loss, in token order */
static void head_commit(void *ctx, int lane, size_t t0, size_t t1)
{
    tok_loop *lp = ctx;
    const ref_rows *x = &lp->w->rows[lane];
    for (size_t t = t0; t < t1; t++)
        lp->sum += x->T[t - t0];
    lp->ref->largest = fmax(lp->ref->largest, x->big);
}

double tm__ref_head(tm_reference *ref, const ref_params *p, ref_work *w)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, V = c->vocab;
    tok_loop lp = {.ref = ref, .p = p, .w = w};
    tm__ref_blocks_for(w->N, TM_REF_TOKEN_BLOCK, w->workers, head_block, head_commit, &lp);
    tm__ref_note_norms(ref, w->RF, w->N, D);
    tm__dgemm(CblasTrans, CblasNoTrans, V, D, (int)w->N, 1.0, w->LOG, V, w->Z, D, 1.0, p->emb->g,
              D);
    return lp.sum / (double)w->N;
}

void tm__ref_note_norms(tm_reference *ref, const double *r, size_t n, int D)
{
    for (size_t t = 0; t < n; t++)
        ref->largest = fmax(ref->largest, (double)D / (r[t] * r[t]));
}

/* ---- the backward -------------------------------------------------------------------- */

typedef struct norm_back {
    ref_work *w;
    const double *x, *g, *r, *dy; /* (N,D) (D) (N) (N,D) */
    double *dx, *dg;              /* (N,D) (D) */
    int D;
} norm_back;

static bool norm_back_block(void *ctx, int lane, size_t t0, size_t t1)
{
    const norm_back *nb = ctx;
    const size_t D = (size_t)nb->D;
    double *tg = nb->w->rows[lane].T;
    for (size_t t = t0; t < t1; t++)
        rms_row_back(nb->x + t * D, nb->g, nb->r[t], nb->D, nb->dy + t * D, nb->dx + t * D,
                     tg + (t - t0) * D);
    return true;
}

/* the block's terms of the norm's weight gradient, in token order */
static void norm_back_commit(void *ctx, int lane, size_t t0, size_t t1)
{
    const norm_back *nb = ctx;
    const size_t D = (size_t)nb->D;
    const double *tg = nb->w->rows[lane].T;
    for (size_t i = 0; i < t1 - t0; i++)
        for (size_t j = 0; j < D; j++)
            nb->dg[j] += tg[i * D + j];
}

void tm__ref_norm_backward(ref_work *w, int D, const double *x, const double *g, const double *r,
                           const double *dy, double *dx, double *dg)
{
    norm_back nb = {w, x, g, r, dy, dx, dg, D};
    tm__ref_blocks_for(w->N, TM_REF_TOKEN_BLOCK, w->workers, norm_back_block, norm_back_commit,
                       &nb);
}

/* The gates are a softmax over the selected logits: a token's K selected logits get
 * dz_k = gate_k (dgate_k - sum_j gate_j dgate_j) (into w->DZ), and its rows of dU the
 * router's rows of those experts, dz_k times. */
static bool router_back_block(void *ctx, int lane, size_t t0, size_t t1)
{
    (void)lane;
    const tok_loop *lp = ctx;
    const tm_config *c = &lp->ref->cfg;
    ref_work *w = lp->w;
    const int D = c->d_model, K = c->top_k, l = lp->l;
    const size_t NK = w->N * (size_t)K;
    const int *sel = w->SEL + (size_t)l * NK;
    const double *gate = w->GATE + (size_t)l * NK, *rw = lp->p->router[l]->w;
    for (size_t t = t0; t < t1; t++) {
        double mean = 0.0;
        for (int k = 0; k < K; k++)
            mean += gate[t * K + k] * w->dgate[t * K + k];
        for (int k = 0; k < K; k++) {
            const double dz = gate[t * K + k] * (w->dgate[t * K + k] - mean);
            const size_t e = (size_t)sel[t * K + k];
            w->DZ[t * K + k] = dz;
            for (int j = 0; j < D; j++)
                w->dU[t * D + j] += dz * rw[e * D + j];
        }
    }
    return true;
}

typedef struct router_rows {
    tok_loop lp;
    const size_t *first, *order; /* every selected slot, grouped by expert (slot order) */
} router_rows;

/* Router row e's gradient: dz u over the tokens that selected e, in token order. */
static bool router_row_back(void *ctx, int lane, int e)
{
    (void)lane;
    const router_rows *rr = ctx;
    const tm_config *c = &rr->lp.ref->cfg;
    const ref_work *w = rr->lp.w;
    const int D = c->d_model, K = c->top_k, l = rr->lp.l;
    const double *u = w->U + (size_t)l * w->N * (size_t)D;
    double *rg = rr->lp.p->router[l]->g + (size_t)e * D;
    for (size_t i = rr->first[e]; i < rr->first[e + 1]; i++) {
        const size_t s = rr->order[i], t = s / (size_t)K;
        const double dz = w->DZ[s];
        for (int j = 0; j < D; j++)
            rg[j] += dz * u[t * D + j];
    }
    return true;
}

void tm__ref_router_backward(tm_reference *ref, const ref_params *p, ref_work *w, int l)
{
    router_rows rr = {.lp = {.ref = ref, .p = p, .w = w, .l = l}};
    tm__ref_blocks_for(w->N, TM_REF_TOKEN_BLOCK, w->workers, router_back_block, NULL, &rr.lp);
    tm__ref_selected_by_expert(&ref->cfg, w, l, &rr.first, &rr.order);
    tm__ref_ordered_for(ref->cfg.experts, w->workers, router_row_back, NULL, &rr);
}
