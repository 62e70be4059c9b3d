/* The FP64 reference's internals shared by reference.c (the forward and the backward) and
 * reference_magnitude.c (the magnitudes the checks' error bounds are made of), for those
 * files only: the FP32 model's files never include this. */
#ifndef TM_REFERENCE_IMPL_H
#define TM_REFERENCE_IMPL_H

#include <math.h>
#include <stddef.h>

#include "reference_weights.h"

/* The step's activations (kept from the forward for the backward) and work buffers. Expert
 * buffers hold one expert's rows at a time; the router-loss arrays exist only when the
 * config enables a router loss. */
typedef struct ref_work {
    size_t N;
    const size_t *shard_begin; /* (n_shards + 1) */
    int n_shards;
    const int *tok, *tgt;           /* (N) */
    double *H;                      /* (L+1,N,D) layer inputs, then the last layer's output */
    double *U, *R;                  /* (L,N,D) normed inputs, (L,N) their 1/rms */
    int *SEL;                       /* (L,N,K) top-K, slots in decreasing logit */
    double *GATE;                   /* (L,N,K) */
    unsigned char *KEPT;            /* (L,N,K) 0 where the capacity dropped the slot */
    size_t *FIRST;                  /* (L,E+1) */
    size_t *ORDER;                  /* (L,N*K) kept slots grouped by expert (group_by_expert) */
    double *DLR;                    /* (L,N,E) router-loss logit gradients, or NULL */
    double *RW;                     /* (N*E + 2E) router-loss work, or NULL */
    double *SA;                     /* (L,N,Fs) shared expert pre-activations */
    double *LG;                     /* (N,E) a layer's logits with router losses, else NULL */
    double *DZ;                     /* (N,K) the selected logits' gradients from the gates */
    size_t *AFIRST, *AORDER;        /* (E+1) (N*K) every selected slot by expert, or NULL */
    size_t *next;                   /* (E) */
    double *taken;                  /* (E) */
    struct ref_rows *rows;          /* (lanes) each lane's buffers for one expert */
    int workers, lanes;             /* ref_pool.h */
    bool out_of_memory;             /* a lane's buffers could not grow (tm__ref_lanes_room) */
    double *dgate, *SS, *dSS, *dSA; /* (N,K) (N,Fs) x3 */
    double *Z, *RF, *LOG, *dZ, *dH, *dU; /* head: (N,D) (N) (N,V); (N,D) x3 */
} ref_work;

/* One lane's buffers for the rows of the expert it is computing, and which rows they are
 * until its commit. They hold `cap` rows: the most any expert of the layers so far was sent
 * (tm__ref_lanes_room), a few thousand where the tokens are a hundred thousand. */
typedef struct ref_rows {
    double *X, *A, *S, *YE, *dYE, *dA, *dX; /* (n,D) (n,F) (n,F) (n,D) (n,D) (n,F) (n,D) */
    double *dHr, *P, *dW;                   /* (n,D) rows of dH, (n,F) dH W2, (D*F) */
    const size_t *slots;                    /* (n) the rows' slots (token * K + k) */
    size_t n, cap;
    /* a block of tokens' (reference_tokens.c): its logits without router losses, its terms
     * of a sum over tokens, until its commit */
    double *LG, *T; /* (block,E) or NULL, (block,D) */
    size_t count;
    double big;
} ref_rows;

/* The logistic sigmoid of a, as every silu of the reference computes it. */
static inline double tm__ref_sigmoid(double a)
{
    return 1.0 / (1.0 + exp(-a));
}

/* silu(a) and its slope from s = tm__ref_sigmoid(a) */
static inline double tm__ref_silu_of(double a, double s, double *slope)
{
    *slope = s + a * s * (1.0 - s);
    return a * s;
}

/* silu(a), and its derivative into *slope, from one exponential */
static inline double tm__ref_silu_slope(double a, double *slope)
{
    return tm__ref_silu_of(a, tm__ref_sigmoid(a), slope);
}

/* The rows layer l sends its busiest expert. */
size_t tm__ref_layer_most_rows(const tm_reference *ref, const ref_work *w, int l);

/* Room in every lane for the rows of layer l's busiest expert: the lanes' buffers grow (never
 * shrink) before the layer's expert loop. false (and w->out_of_memory) when they cannot. */
bool tm__ref_lanes_room(tm_reference *ref, ref_work *w, int l);

/* Rows of expert e in layer l: copies the normed inputs of its slots into X, returns n;
 * *rows points at their slots (token * K + k). */
size_t tm__ref_gather_rows(const tm_reference *ref, const ref_work *w, int l, int e, double *X,
                           const size_t **rows);

/* The token loops (reference_tokens.c), in blocks of TM_REF_TOKEN_BLOCK on the workers, the
 * same bits for any number of them. The embedding rows of the tokens into H: */
void tm__ref_embed(tm_reference *ref, const ref_params *p, ref_work *w);
/* layer l's norm (U, R) and its output's residual (H of l + 1 = H of l) */
void tm__ref_norm_forward(tm_reference *ref, const ref_params *p, ref_work *w, int l);
/* layer l's logits, top-K (following the model's choices at near ties) and gates */
void tm__ref_route(tm_reference *ref, const ref_params *p, ref_work *w, int l,
                   const int *const *choices, const size_t *counts);
/* the final norm, the head and the mean token loss (returned); leaves LOG = (p - onehot) / N
 * and dZ, and adds the head's part of the embedding gradient */
double tm__ref_head(tm_reference *ref, const ref_params *p, ref_work *w);
/* the norms' sums of squares D (1/r^2 - eps) of n rows into ref->largest */
void tm__ref_note_norms(tm_reference *ref, const double *r, size_t n, int D);
/* an RMS norm's backward over the N tokens: dx += J^T dy, dg += sum over tokens of dy x r */
void tm__ref_norm_backward(ref_work *w, int D, const double *x, const double *g, const double *r,
                           const double *dy, double *dx, double *dg);
/* layer l's router gradient from the gates (w->dgate): into its weight's gradient, and dU */
void tm__ref_router_backward(tm_reference *ref, const ref_params *p, ref_work *w, int l);
/* The kept slots sel, kept (N*K) grouped by expert in slot order (a counting sort; kept NULL:
 * every slot): expert e's are order[first[e] .. first[e + 1]). next (E) is work. */
void tm__ref_group_by_expert(const int *sel, const unsigned char *kept, size_t NK, int E,
                             size_t *first, size_t *order, size_t *next);
/* every slot layer l selected (dropped or not) grouped by expert in slot order */
void tm__ref_selected_by_expert(const tm_config *c, ref_work *w, int l, const size_t **first,
                                const size_t **order);

/* The backward of the gradients, in the pieces the error-scale pass interleaves with its own
 * (tm__ref_magnitudes): the final norm's (dZ into dH); per layer from the last, what comes
 * before its experts (dU, the shared expert, dgate cleared), each expert's rows and weights,
 * and what comes after (the router, the router losses, the norm: dH becomes the layer input's
 * gradient); at last the embedding rows. */
void tm__ref_backward_head(tm_reference *ref, const ref_params *p, ref_work *w);
void tm__ref_backward_layer_begin(tm_reference *ref, const ref_params *p, ref_work *w, int l);
/* Expert e of layer l: gathers its rows (X, and dHr from dH) into the lane's buffers, A, S and
 * P = dH W2, the gates' gradients of its slots (w->dgate), dA = gate P silu'(A) and dYE =
 * gate dH; returns the rows' count n. */
size_t tm__ref_expert_backward_rows(const tm_reference *ref, const ref_params *p, const ref_work *w,
                                    int l, int e, ref_rows *x);
/* then its w2's gradient (x->dW, added to the trainable tensors), w1's, and dX = dA W1 */
void tm__ref_expert_backward_w2(const tm_config *c, const ref_linear *w2, ref_rows *x);
void tm__ref_expert_backward_w1(const tm_config *c, const ref_linear *w1, ref_rows *x);
void tm__ref_expert_backward_input(const tm_config *c, const ref_linear *w1, ref_rows *x);
void tm__ref_backward_layer_end(tm_reference *ref, const ref_params *p, ref_work *w, int l);
void tm__ref_backward_embed(const ref_params *p, const ref_work *w, int D);

/* After the forward: the backward (the gradients into ref_entry.g) and the magnitude of every
 * gradient element (ref_entry.m) and of the loss (ref->loss_magnitude), from the activations
 * the forward kept in w. The magnitude of a
 * quantity is the standard deviation of the FP32 model's rounding error of it, in units of the
 * FP32 unit roundoff, propagated through the forward and the backward (each sum's own rounding
 * and its inputs' errors in quadrature; reference_magnitude.c): where terms cancel it stays
 * large while the value shrinks, and the FP32 error scales with it, not with the value
 * (docs/tolerances.md). */
seldp_status tm__ref_magnitudes(tm_reference *ref, const ref_params *p, ref_work *w);

#endif
