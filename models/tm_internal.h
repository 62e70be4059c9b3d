/* tiny-moe internals shared by the FP32 model's files (not by the reference, which is
 * written independently so that it can catch their bugs). */
#ifndef TM_INTERNAL_H
#define TM_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tinymoe.h"
#include "tm_error.h"

/* One linear map of an expert ([out, in]): where its stored pieces are, and its effective
 * FP32 weight for forward and backward. Indices are into tm_model.params (-1: absent). */
typedef struct tm_linear {
    int out, in;
    int dense;                           /* quant none: the trainable weight */
    int qweight, absmax, scales, qzeros; /* quantized base pieces */
    int lora_a, lora_b;
    float *eff; /* (out,in): the dense work copy, or dequant(base) + (alpha/r) B A */
} tm_linear;

typedef struct tm_expert_slot {
    bool held;
    tm_linear w1; /* [F, D] */
    tm_linear w2; /* [D, F] */
} tm_expert_slot;

/* Activations of one layer for the current step. */
typedef struct tm_layer_cache {
    float *h_in;     /* (T,D) layer input */
    float *rstd;     /* (T) */
    float *u;        /* (T,D) rmsnorm(h) * g */
    float *probs;    /* (T,E) router softmax */
    int *choice;     /* (T,K) the top-K experts, slots in decreasing p */
    int *expert;     /* (T,K) where each slot goes: choice, or -1 when the capacity dropped it */
    float *gate;     /* (T,K) */
    float *y;        /* (T,K,D) expert outputs per slot */
    float *dgate;    /* (T,K) */
    float *lse;      /* (T) logsumexp of the router logits (z-loss) */
    float *s_pre;    /* (T,Fs) shared expert u W1s^T; NULL without one */
    float *s_du;     /* (T,D) the shared expert's input gradient; NULL without one */
    int64_t *counts; /* (E) assignments per expert as routed, this rank */
    int64_t *fill;   /* (E) capacity dropping's running count */
    int64_t *bal_counts; /* (E) the load-balancing loss's counts (tm_route_set_balance) */
    uint64_t bal_tokens; /* ... and their token count */
    float *tp_u;         /* (S,D) the shared expert's input gathered over TP */
    float *tp_pre;       /* (S,Fs/tp) its pre-activation */
    bool routed, combined, combined_back;
} tm_layer_cache;

/* A set of activation caches not in use (caches.c, tm_model_use_caches): the model's fields of
 * the same names while another set is the model's. */
typedef struct tm_cache_set {
    size_t T, T_capacity;
    int32_t *tokens;
    tm_layer_cache *cache;
    bool embedded;
    size_t *tp_counts;
    int tp_counts_n;
    size_t S, S_offset;
    int32_t *tp_tokens;
    double router_scale;
} tm_cache_set;

struct tm_model {
    tm_config cfg;
    tm_part part; /* what of the logical model this one holds */
    int rank;
    bool *owns; /* (E) */

    /* Storage: one contiguous block per dtype; every tensor points into one of them. */
    void *storage[SELDP_DTYPE_COUNT];

    tm_param_info *params; /* creation order */
    float **work;          /* per param: F32 copy of a trainable parameter, else NULL */
    float **grad;          /* per param: F32 gradient accumulator, NULL when frozen */
    size_t n_params;
    float *work_block; /* F32 copies and effective expert weights */
    float *grad_block; /* F32 accumulators */
    size_t grad_floats;

    int embed, final_norm, codebook; /* param indices (codebook -1 unless nf4) */
    int *norm, *router;              /* (L) */
    int *shared_w1, *shared_w2;      /* (L) the shared expert's weights; -1 without one */
    tm_expert_slot *experts;         /* (L,E) */
    bool *seen;                      /* (L,E) */
    double router_scale;             /* the router losses' factor (tm_model_set_router_scale) */

    seldp_model *view;

    /* Tensor parallelism (tensor_parallel.c): the TP ranks' token counts of this step, their
     * sum S and where this rank's tokens begin among them; the gathered token ids (S). */
    tm_tp tp;
    size_t *tp_counts;
    int tp_counts_n; /* entries of tp_counts */
    size_t S, S_offset;
    int32_t *tp_tokens;

    /* The scale of the router losses' gradient (tm_set_router_loss_grad_scale); unset: 1. */
    bool router_grad_scaled;
    double aux_grad_scale, z_grad_scale;

    /* Step caches. */
    size_t T, T_capacity;
    int32_t *tokens;       /* (T) */
    tm_layer_cache *cache; /* (L) */
    bool embedded;

    /* The cache sets of micro-batches in flight (caches.c): the set in use is in the fields
     * above (the step caches, the TP state, router_scale); sets[k] holds set k otherwise. */
    tm_cache_set *sets;
    int n_sets, active_set;
};

/* Size the step's activation caches for T tokens (caches.c). */
seldp_status tm__ensure_caches(tm_model *m, size_t T);

/* Free every cache set, the one in use included (caches.c; tm_model_destroy). */
void tm__free_cache_sets(tm_model *m);

/* Element i of a tensor of `dtype` (F32, F16, BF16) set to v, rounded to nearest even. */
void tm__store_value(void *data, seldp_dtype dtype, size_t i, float v);

/* Capacity dropping of one routed layer (router.c): c->expert from c->choice. */
void tm__capacity_drop(const tm_model *m, tm_layer_cache *c);

/* The router's top-K (forward.c): the K largest of p (E) into sel, largest first, among equal
 * probabilities the lower index first; with a NaN in p, the k-th is the first expert of the
 * largest probability not yet taken by strict > (a NaN only where it comes first). */
void tm__top_k(const float *p, int E, int K, int *sel);

/* Add the load-balancing and z-loss gradients of token t's router logits into dl (E), which
 * holds dL/dp (E) on entry and leaves as dL/dlogits (router.c). */
void tm__router_loss_backward(const tm_model *m, const tm_layer_cache *c, size_t t, float *dl);

/* The shared expert of layer l (shared_expert.c): forward adds its output to h (T,D) and
 * caches its pre-activation; backward takes dh (T,D), accumulates its weight gradients and
 * keeps its input gradient in c->s_du. NOMEM on allocation failure. */
seldp_status tm__shared_forward(tm_model *m, int l, float *h);
seldp_status tm__shared_backward(tm_model *m, int l, const float *dh);

/* RMSNorm: out (T,D) = inp * rstd * weight, rstd (T) out; and its backward, dinp (T,D) +=,
 * dweight (D) += (forward.c). */
void tm__rmsnorm_forward(const float *inp, const float *weight, size_t T, int D, double eps,
                         float *out, float *rstd);
void tm__rmsnorm_backward(const float *dout, const float *inp, const float *weight,
                          const float *rstd, size_t T, int D, float *dinp, float *dweight);

/* Tensor parallelism (tensor_parallel.c). tm__tp_begin learns the TP ranks' token counts of
 * the step (every stage calls it, through tm_embed_forward); the embedding and the head of a
 * tensor-parallel model; the shared expert's column- and row-parallel forward and backward. */
seldp_status tm__tp_begin(tm_model *m);
seldp_status tm__tp_embed_forward(tm_model *m, const int32_t *tokens, float *h);
seldp_status tm__tp_embed_backward(tm_model *m, const float *dh);
seldp_status tm__tp_head(tm_model *m, const float *h, const int32_t *targets, double *loss_sum,
                         float *dh);
seldp_status tm__tp_shared_forward(tm_model *m, int l, float *h);
seldp_status tm__tp_shared_backward(tm_model *m, int l, const float *dh);
/* The logical vocabulary: V times the TP size. */
int tm__vocab(const tm_model *m);

/* Upcast n stored elements of a float dtype to F32. */
void tm__to_f32(seldp_dtype dtype, const void *src, float *dst, size_t n);

/* Derivative helpers shared by forward and backward. */
static inline float tm__sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

#endif
