/* The FP64 reference of tiny-moe: the global objective (the mean token loss over every token
 * of every rank, plus the enabled router losses) and its gradient for every trainable
 * parameter, on one thread with cblas_dgemm.
 *
 * It shares no math with the FP32 path on purpose: weights are read from a seldp model
 * view by path and upcast here, quantized bases are decoded from their bits here
 * (reference_weights.c), the top-K is chosen by ranking rather than by repeated maximum, and
 * the renormalized gates are differentiated as a softmax over the selected logits rather
 * than through p / sum(p). A bug in either implementation therefore shows up as a mismatch
 * between the two.
 *
 * The work is what the routing asks for: each expert's matrices multiply only the rows
 * routed to it (slots grouped by expert once per layer), and the router's gradient from the
 * gates touches only the selected logits; the dense (N,E) logit gradients exist only when
 * a router loss is on. After the forward, reference_magnitude.c computes the error scale of
 * every gradient element and of the loss from the activations kept here, and drives the
 * backward of this file's pieces beside its own: an expert's rows are gathered and multiplied
 * once for the gradient and its error scale. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "blas_gate.h"
#include "ref_pool.h"

#include "reference_impl.h"
#include "reference_router.h"
#include "tm_error.h"

void tm_reference_destroy(tm_reference *ref)
{
    if (!ref)
        return;
    for (size_t i = 0; i < ref->n_allocs; i++)
        free(ref->allocs[i]);
    free(ref->allocs);
    free(ref->entries);
    free(ref->routed);
    pthread_mutex_destroy(&ref->alloc_lock);
    free(ref);
}

/* ---- math ---------------------------------------------------------------------------- */

static double silu_d(double a)
{
    return a / (1.0 + exp(-a));
}

/* ---- the computation ----------------------------------------------------------------- */

static seldp_status work_alloc(tm_reference *ref, ref_work *w)
{
    const tm_config *c = &ref->cfg;
    const size_t N = w->N, D = (size_t)c->d_model, F = (size_t)c->d_ff, E = (size_t)c->experts;
    const size_t K = (size_t)c->top_k, L = (size_t)c->layers, V = (size_t)c->vocab;
    const size_t NF = N * (size_t)c->d_ff_shared, NK = N * K;
    const bool losses = c->aux_loss_coeff > 0.0 || c->z_loss_coeff > 0.0;
    tm_reference *r = ref;
    w->H = tm__ref_calloc(r, (L + 1) * N * D, sizeof(double));
    w->U = tm__ref_calloc(r, L * N * D, sizeof(double));
    w->R = tm__ref_calloc(r, L * N, sizeof(double));
    w->SEL = tm__ref_calloc(r, L * NK, sizeof(int));
    w->GATE = tm__ref_calloc(r, L * NK, sizeof(double));
    w->KEPT = tm__ref_calloc(r, L * NK, 1);
    w->FIRST = tm__ref_calloc(r, L * (E + 1), sizeof(size_t));
    w->ORDER = tm__ref_calloc(r, L * NK, sizeof(size_t));
    w->DLR = losses ? tm__ref_calloc(r, L * N * E, sizeof(double)) : NULL;
    w->RW = losses ? tm__ref_calloc(r, N * E + 2 * E, sizeof(double)) : NULL;
    w->SA = tm__ref_calloc(r, L * NF, sizeof(double));
    /* without router losses each lane takes a block of logits at a time: (N, E) of them
     * would be a quarter of the reference's memory at world 2048 */
    w->LG = losses ? tm__ref_calloc(r, N * E, sizeof(double)) : NULL;
    w->DZ = tm__ref_calloc(r, NK, sizeof(double));
    if (c->capacity_factor > 0.0) {
        w->AFIRST = tm__ref_calloc(r, E + 1, sizeof(size_t));
        w->AORDER = tm__ref_calloc(r, NK, sizeof(size_t));
    }
    const size_t RB = N < TM_REF_TOKEN_BLOCK ? N : TM_REF_TOKEN_BLOCK;
    w->next = tm__ref_calloc(r, E, sizeof(size_t));
    w->taken = tm__ref_calloc(r, E, sizeof(double));
    w->workers = tm__ref_workers();
    w->lanes = tm__ref_lanes(w->workers);
    w->rows = tm__ref_calloc(r, (size_t)w->lanes, sizeof *w->rows);
    for (int i = 0; w->rows && i < w->lanes; i++) {
        ref_rows *x = &w->rows[i];
        /* the rows' buffers come with the first layer's routing (tm__ref_lanes_room) */
        x->dW = tm__ref_calloc(r, D * F, sizeof(double));
        x->LG = losses ? NULL : tm__ref_calloc(r, RB * E, sizeof(double));
        x->T = tm__ref_calloc(r, RB * D, sizeof(double));
        if (!x->dW || (!losses && !x->LG) || !x->T)
            return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory for %zu tokens", N);
    }
    w->dgate = tm__ref_calloc(r, NK, sizeof(double));
    w->SS = tm__ref_calloc(r, NF, sizeof(double));
    w->dSA = tm__ref_calloc(r, NF, sizeof(double));
    w->dSS = tm__ref_calloc(r, NF, sizeof(double));
    w->Z = tm__ref_calloc(r, N * D, sizeof(double));
    w->RF = tm__ref_calloc(r, N, sizeof(double));
    w->LOG = tm__ref_calloc(r, N * V, sizeof(double));
    w->dZ = tm__ref_calloc(r, N * D, sizeof(double));
    w->dH = tm__ref_calloc(r, N * D, sizeof(double));
    w->dU = tm__ref_calloc(r, N * D, sizeof(double));
    if (!w->H || !w->U || !w->R || !w->SEL || !w->GATE || !w->KEPT || !w->FIRST || !w->ORDER ||
        (losses && (!w->DLR || !w->RW || !w->LG)) || !w->SA || !w->DZ ||
        (c->capacity_factor > 0.0 && (!w->AFIRST || !w->AORDER)) || !w->next || !w->taken ||
        !w->rows || !w->dgate || !w->SS || !w->dSA || !w->dSS || !w->Z || !w->RF || !w->LOG ||
        !w->dZ || !w->dH || !w->dU)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory for %zu tokens", N);
    return SELDP_OK;
}

size_t tm__ref_layer_most_rows(const tm_reference *ref, const ref_work *w, int l)
{
    const int E = ref->cfg.experts;
    const size_t *first = w->FIRST + (size_t)l * ((size_t)E + 1);
    size_t most = 0;
    for (int e = 0; e < E; e++)
        if (first[e + 1] - first[e] > most)
            most = first[e + 1] - first[e];
    return most;
}

bool tm__ref_lanes_room(tm_reference *ref, ref_work *w, int l)
{
    const size_t most = tm__ref_layer_most_rows(ref, w, l);
    const size_t D = (size_t)ref->cfg.d_model, F = (size_t)ref->cfg.d_ff;
    for (int i = 0; i < w->lanes; i++) {
        ref_rows *x = &w->rows[i];
        if (x->cap >= most)
            continue;
        /* an eighth more: the next layer's busiest expert is seldom much busier */
        const size_t cap = most + most / 8 + 1;
        double **nd[] = {&x->X, &x->YE, &x->dYE, &x->dX, &x->dHr};
        double **nf[] = {&x->A, &x->S, &x->dA, &x->P};
        for (size_t k = 0; k < sizeof nd / sizeof nd[0]; k++) {
            tm__ref_free(ref, *nd[k]);
            if (!(*nd[k] = tm__ref_calloc(ref, cap * D, sizeof(double))))
                goto nomem;
        }
        for (size_t k = 0; k < sizeof nf / sizeof nf[0]; k++) {
            tm__ref_free(ref, *nf[k]);
            if (!(*nf[k] = tm__ref_calloc(ref, cap * F, sizeof(double))))
                goto nomem;
        }
        x->cap = cap;
    }
    return true;
nomem:
    w->out_of_memory = true;
    return false;
}

/* Rows of expert e in layer l: copies the normed inputs of its slots into X, returns n. */
size_t tm__ref_gather_rows(const tm_reference *ref, const ref_work *w, int l, int e, double *X,
                           const size_t **rows)
{
    const int D = ref->cfg.d_model, K = ref->cfg.top_k, E = ref->cfg.experts;
    const size_t *first = w->FIRST + (size_t)l * ((size_t)E + 1);
    const double *u = w->U + (size_t)l * w->N * (size_t)D;
    const size_t n = first[e + 1] - first[e];
    *rows = w->ORDER + (size_t)l * w->N * (size_t)K + first[e];
    for (size_t i = 0; i < n; i++)
        memcpy(X + i * D, u + ((*rows)[i] / K) * D, (size_t)D * sizeof(double));
    return n;
}

/* One expert's forward over its n gathered rows: A = X W1^T, S = silu(A), YE = S W2^T. */
static void expert_forward(const tm_config *c, const ref_linear *w1, const ref_linear *w2, size_t n,
                           ref_rows *w)
{
    const int D = c->d_model, F = c->d_ff;
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, F, D, 1.0, w->X, D, w1->w, D, 0.0, w->A, F);
    for (size_t i = 0; i < n * (size_t)F; i++)
        w->S[i] = silu_d(w->A[i]);
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, D, F, 1.0, w->S, F, w2->w, F, 0.0, w->YE, D);
}

/* A layer's experts on the reference's workers (ref_pool.h). */
typedef struct expert_loop {
    tm_reference *ref;
    const ref_params *p;
    ref_work *w;
    int l;
} expert_loop;

static bool expert_forward_rows(void *ctx, int lane, int e)
{
    expert_loop *lp = ctx;
    const tm_config *c = &lp->ref->cfg;
    ref_rows *x = &lp->w->rows[lane];
    const ref_linear *w1 = &lp->p->lin[((size_t)lp->l * c->experts + e) * 2], *w2 = w1 + 1;
    x->n = tm__ref_gather_rows(lp->ref, lp->w, lp->l, e, x->X, &x->slots);
    lp->ref->routed[(size_t)lp->l * c->experts + e] = x->n;
    if (x->n > 0)
        expert_forward(c, w1, w2, x->n, x);
    return true;
}

/* The expert's gated output into the rows it serves, in expert order. */
static void expert_forward_commit(void *ctx, int lane, int e)
{
    (void)e;
    expert_loop *lp = ctx;
    const int D = lp->ref->cfg.d_model, K = lp->ref->cfg.top_k;
    const ref_rows *x = &lp->w->rows[lane];
    const double *gate = lp->w->GATE + (size_t)lp->l * lp->w->N * (size_t)K;
    double *Hout = lp->w->H + (size_t)(lp->l + 1) * lp->w->N * (size_t)D;
    for (size_t i = 0; i < x->n; i++) {
        double *h = Hout + (x->slots[i] / K) * D;
        for (int j = 0; j < D; j++)
            h[j] += gate[x->slots[i]] * x->YE[i * D + j];
    }
}

/* Layer l forward: norm, router logits, top-K (following the model at near ties), gates,
 * capacity, router losses, experts and the shared expert. Returns the router losses. */
static double forward_layer(tm_reference *ref, const ref_params *p, ref_work *w, int l,
                            const int *const *choices, const size_t *counts)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, E = c->experts, K = c->top_k, Fs = c->d_ff_shared;
    const size_t N = w->N, ND = N * (size_t)D, NK = N * (size_t)K;
    double *Hout = w->H + (size_t)(l + 1) * ND;
    const double *u = w->U + (size_t)l * ND;
    int *sel = w->SEL + (size_t)l * NK;
    unsigned char *kept = w->KEPT + (size_t)l * NK;
    double router_loss = 0.0;
    tm__ref_norm_forward(ref, p, w, l); /* the residual into Hout too */
    tm__ref_note_norms(ref, w->R + (size_t)l * N, N, D);
    tm__ref_route(ref, p, w, l, choices, counts);
    tm__ref_capacity(c, sel, w->shard_begin, w->n_shards, w->taken, kept);
    for (size_t s = 0; s < NK; s++)
        ref->dropped += !kept[s];
    if (w->DLR)
        router_loss = tm__ref_router_losses(c, w->LG, sel, w->shard_begin, w->n_shards, w->RW,
                                            w->DLR + (size_t)l * N * E);
    size_t *first = w->FIRST + (size_t)l * ((size_t)E + 1);
    tm__ref_group_by_expert(sel, kept, NK, E, first, w->ORDER + (size_t)l * NK, w->next);
    /* each expert adds its gated output to the rows it serves */
    expert_loop lp = {ref, p, w, l};
    if (tm__ref_lanes_room(ref, w, l))
        tm__ref_ordered_for(E, w->workers, expert_forward_rows, expert_forward_commit, &lp);
    if (Fs > 0) {
        /* the shared expert: Hout += silu(u W1s^T) W2s^T, ungated */
        const size_t NF = N * (size_t)Fs;
        double *sa = w->SA + (size_t)l * NF;
        tm__dgemm(CblasNoTrans, CblasTrans, (int)N, Fs, D, 1.0, u, D, p->sw1[l]->w, D, 0.0, sa, Fs);
        for (size_t i = 0; i < NF; i++)
            w->SS[i] = silu_d(sa[i]);
        tm__dgemm(CblasNoTrans, CblasTrans, (int)N, D, Fs, 1.0, w->SS, Fs, p->sw2[l]->w, Fs, 1.0,
                  Hout, D);
    }
    return router_loss;
}

/* Add the gradient dW (out,in) of an expert linear's effective weight to its trainable
 * tensors: the dense weight, or LoRA's B and A for W = base + c B A (dB = c dW A^T,
 * dA = c B^T dW). */
static void add_linear_grad(const tm_config *c, const ref_linear *li, const double *dW)
{
    if (c->quant == TM_QUANT_NONE) {
        const size_t nw = (size_t)li->out * (size_t)li->in;
        for (size_t i = 0; i < nw; i++)
            li->dense->g[i] += dW[i];
        return;
    }
    const int r = c->lora_rank;
    const double lscale = c->lora_alpha / c->lora_rank;
    tm__dgemm(CblasNoTrans, CblasTrans, li->out, r, li->in, lscale, dW, li->in, li->lora_a->w,
              li->in, 1.0, li->lora_b->g, r);
    tm__dgemm(CblasTrans, CblasNoTrans, r, li->in, li->out, lscale, li->lora_b->w, r, dW, li->in,
              1.0, li->lora_a->g, li->in);
}

/* Expert e of layer l backward up to its weights: A and S are recomputed from X; the output
 * y = S W2^T is not: with P = dH W2 (n,F), the gate's gradient dH . y is P . S and dS is
 * gate * P. */
size_t tm__ref_expert_backward_rows(const tm_reference *ref, const ref_params *p,
                                    const ref_work *wk, int l, int e, ref_rows *w)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, F = c->d_ff, E = c->experts, K = c->top_k;
    const double *gate = wk->GATE + (size_t)l * wk->N * (size_t)K;
    const ref_linear *w1 = &p->lin[((size_t)l * E + e) * 2], *w2 = w1 + 1;
    const size_t n = tm__ref_gather_rows(ref, wk, l, e, w->X, &w->slots);
    const size_t *rows = w->slots;
    w->n = n;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        memcpy(w->dHr + i * D, wk->dH + (rows[i] / K) * D, (size_t)D * sizeof(double));
    tm__dgemm(CblasNoTrans, CblasTrans, (int)n, F, D, 1.0, w->X, D, w1->w, D, 0.0, w->A, F);
    for (size_t i = 0; i < n * (size_t)F; i++)
        w->S[i] = tm__ref_silu_slope(w->A[i], &w->dA[i]); /* dA holds silu'(A) for now */
    tm__dgemm(CblasNoTrans, CblasNoTrans, (int)n, F, D, 1.0, w->dHr, D, w2->w, F, 0.0, w->P, F);
    for (size_t i = 0; i < n; i++) {
        const double g = gate[rows[i]];
        double d = 0.0;
        for (int f = 0; f < F; f++) {
            d += w->P[i * F + f] * w->S[i * F + f];
            w->dA[i * F + f] *= g * w->P[i * F + f];
        }
        wk->dgate[rows[i]] = d;
        for (int j = 0; j < D; j++)
            w->dYE[i * D + j] = g * w->dHr[i * D + j];
    }
    return n;
}

void tm__ref_expert_backward_w2(const tm_config *c, const ref_linear *w2, ref_rows *w)
{
    const int D = c->d_model, F = c->d_ff;
    /* dW (D,F) = dY^T S */
    tm__dgemm(CblasTrans, CblasNoTrans, D, F, (int)w->n, 1.0, w->dYE, D, w->S, F, 0.0, w->dW, F);
    add_linear_grad(c, w2, w->dW);
}

void tm__ref_expert_backward_w1(const tm_config *c, const ref_linear *w1, ref_rows *w)
{
    const int D = c->d_model, F = c->d_ff;
    /* dW (F,D) = dA^T X */
    tm__dgemm(CblasTrans, CblasNoTrans, F, D, (int)w->n, 1.0, w->dA, F, w->X, D, 0.0, w->dW, D);
    add_linear_grad(c, w1, w->dW);
}

void tm__ref_expert_backward_input(const tm_config *c, const ref_linear *w1, ref_rows *w)
{
    const int D = c->d_model, F = c->d_ff;
    /* dX (n,D) = dA W1 */
    tm__dgemm(CblasNoTrans, CblasNoTrans, (int)w->n, D, F, 1.0, w->dA, F, w1->w, D, 0.0, w->dX, D);
}

void tm__ref_backward_head(tm_reference *ref, const ref_params *p, ref_work *w)
{
    const tm_config *c = &ref->cfg;
    const double *Hf = w->H + (size_t)c->layers * w->N * (size_t)c->d_model;
    tm__ref_norm_backward(w, c->d_model, Hf, p->fnorm->w, w->RF, w->dZ, w->dH, p->fnorm->g);
}

void tm__ref_backward_layer_begin(tm_reference *ref, const ref_params *p, ref_work *w, int l)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, K = c->top_k, Fs = c->d_ff_shared;
    const size_t N = w->N, ND = N * (size_t)D, NK = N * (size_t)K;
    const double *u = w->U + (size_t)l * ND;
    double *dU = w->dU, *dH = w->dH;
    /* dH is the gradient of this layer's output; the residual passes it through. */
    memset(dU, 0, ND * sizeof(double));
    if (Fs > 0) {
        const size_t NF = N * (size_t)Fs;
        const double *sa = w->SA + (size_t)l * NF;
        for (size_t i = 0; i < NF; i++)
            w->SS[i] = tm__ref_silu_slope(sa[i], &w->dSS[i]);
        /* W2s: dW (D,Fs) += dH^T S; dS = dH W2s; W1s: dW (Fs,D) += dA^T u; dU = dA W1s */
        tm__dgemm(CblasTrans, CblasNoTrans, D, Fs, (int)N, 1.0, dH, D, w->SS, Fs, 1.0, p->sw2[l]->g,
                  Fs);
        tm__dgemm(CblasNoTrans, CblasNoTrans, (int)N, Fs, D, 1.0, dH, D, p->sw2[l]->w, Fs, 0.0,
                  w->dSA, Fs);
        for (size_t i = 0; i < NF; i++)
            w->dSA[i] *= w->dSS[i];
        tm__dgemm(CblasTrans, CblasNoTrans, Fs, D, (int)N, 1.0, w->dSA, Fs, u, D, 1.0, p->sw1[l]->g,
                  D);
        tm__dgemm(CblasNoTrans, CblasNoTrans, (int)N, D, Fs, 1.0, w->dSA, Fs, p->sw1[l]->w, D, 0.0,
                  dU, D);
    }
    memset(w->dgate, 0, NK * sizeof(double)); /* a dropped slot adds nothing */
}

void tm__ref_backward_layer_end(tm_reference *ref, const ref_params *p, ref_work *w, int l)
{
    const tm_config *c = &ref->cfg;
    const int D = c->d_model, E = c->experts;
    const size_t N = w->N, ND = N * (size_t)D;
    const double *Hin = w->H + (size_t)l * ND, *u = w->U + (size_t)l * ND;
    /* Gates are a softmax over the selected logits: only the K selected logits of a token get
     * a gradient from them, added to the router's rows of those experts. */
    tm__ref_router_backward(ref, p, w, l);
    double *rg = p->router[l]->g;
    const double *rw = p->router[l]->w;
    /* the router losses reach every logit */
    if (w->DLR) {
        const double *dlr = w->DLR + (size_t)l * N * E;
        tm__dgemm(CblasTrans, CblasNoTrans, E, D, (int)N, 1.0, dlr, E, u, D, 1.0, rg, D);
        tm__dgemm(CblasNoTrans, CblasNoTrans, (int)N, D, E, 1.0, dlr, E, rw, D, 1.0, w->dU, D);
    }
    tm__ref_norm_backward(w, D, Hin, p->norm[l]->w, w->R + (size_t)l * N, w->dU, w->dH,
                          p->norm[l]->g);
}

void tm__ref_backward_embed(const ref_params *p, const ref_work *w, int D)
{
    for (size_t t = 0; t < w->N; t++)
        for (int i = 0; i < D; i++)
            p->emb->g[(size_t)w->tok[t] * D + i] += w->dH[t * D + i];
}

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
    if (!out || !weights || n_ranks < 0 || (n_ranks > 0 && (!tokens || !targets || !counts)))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "reference: NULL argument");
    *out = NULL;
    TM_CHECK(tm_config_check(cfg));
    const int V = cfg->vocab, E = cfg->experts, L = cfg->layers;

    ref = calloc(1, sizeof *ref);
    if (!ref)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory");
    pthread_mutex_init(&ref->alloc_lock, NULL);
    ref->cfg = *cfg;
    ref->routed = calloc((size_t)L * (size_t)E, sizeof *ref->routed);
    ref->cap_entries = 4 + (size_t)L * (4 + 4 * (size_t)E);
    ref->entries = calloc(ref->cap_entries, sizeof *ref->entries);
    if (!ref->routed || !ref->entries)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory");

    /* All tokens of all ranks, in rank order; rank r's are data shard r. */
    size_t N = 0;
    size_t *shard_begin = tm__ref_calloc(ref, (size_t)n_ranks + 1, sizeof *shard_begin);
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
    int *tok = tm__ref_calloc(ref, N, sizeof *tok), *tgt = tm__ref_calloc(ref, N, sizeof *tgt);
    if (!tok || !tgt)
        TM_FAIL(SELDP_ERR_NOMEM, "reference: out of memory for %zu tokens", N);
    for (size_t r = 0, at = 0; r < (size_t)n_ranks; r++) {
        for (size_t t = 0; t < counts[r]; t++, at++) {
            tok[at] = tokens[r][t];
            tgt[at] = targets[r][t];
            if (tok[at] < 0 || tok[at] >= V || tgt[at] < 0 || tgt[at] >= V)
                TM_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                        "reference: rank %zu token %zu is %d with target %d, expected ids in "
                        "[0, %d)",
                        r, t, tok[at], tgt[at], V);
        }
    }

    ref_params p;
    TM_CHECK(tm__ref_load_weights(ref, weights, perturb, &p));
    ref_work w = {.N = N, .shard_begin = shard_begin, .n_shards = n_ranks, .tok = tok, .tgt = tgt};
    TM_CHECK(work_alloc(ref, &w));

    double router_loss = 0.0;
    tm__ref_embed(ref, &p, &w);
    for (int l = 0; l < L; l++)
        router_loss += forward_layer(ref, &p, &w, l, choices, counts);
    ref->loss = tm__ref_head(ref, &p, &w) + router_loss;

    /* The backward, of the gradients and of their error scales together
     * (reference_magnitude.c): each expert's rows are gathered and multiplied once for both. */
    TM_CHECK(tm__ref_magnitudes(ref, &p, &w));

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

double tm_reference_largest(const tm_reference *ref)
{
    return ref->largest;
}

size_t tm_reference_dropped(const tm_reference *ref)
{
    return ref->dropped;
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
    const ref_entry *en = tm__ref_find(ref, path);
    if (!en || (en->expert >= 0 && tm_reference_routed(ref, en->layer, en->expert) == 0))
        return NULL;
    if (numel)
        *numel = en->n;
    return en->g;
}

const double *tm_reference_magnitude(const tm_reference *ref, const char *path, size_t *numel)
{
    if (!tm_reference_grad(ref, path, numel))
        return NULL;
    return tm__ref_find(ref, path)->m;
}

double tm_reference_loss_magnitude(const tm_reference *ref)
{
    return ref->loss_magnitude;
}

double tm_rel_error(const seldp_tensor *g, double scale, const double *ref, size_t n)
{
    if (!g || !seldp_dtype_is_float(g->dtype) || seldp_tensor_numel(g) != n ||
        g->device.kind != SELDP_DEVICE_HOST)
        return -1.0;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = scale * tm__ref_stored_float(g, i) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
