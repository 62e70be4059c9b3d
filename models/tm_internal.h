/* tiny-moe internals shared by the FP32 model's files (not by the reference, which is
 * written independently so that it can catch their bugs). */
#ifndef TM_INTERNAL_H
#define TM_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tinymoe.h"
#include "../src/internal.h"

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
    float *h_in;  /* (T,D) layer input */
    float *rstd;  /* (T) */
    float *u;     /* (T,D) rmsnorm(h) * g */
    float *probs; /* (T,E) router softmax */
    int *expert;  /* (T,K) */
    float *gate;  /* (T,K) */
    float *y;     /* (T,K,D) expert outputs per slot */
    float *dgate; /* (T,K) */
    bool routed, combined, combined_back;
} tm_layer_cache;

struct tm_model {
    tm_config cfg;
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
    tm_expert_slot *experts;         /* (L,E) */
    bool *seen;                      /* (L,E) */

    seldp_model *view;

    /* Step caches. */
    size_t T, T_capacity;
    int32_t *tokens;       /* (T) */
    tm_layer_cache *cache; /* (L) */
    bool embedded;
};

/* Size the step's activation caches for T tokens. */
seldp_status tm__ensure_caches(tm_model *m, size_t T);

/* Upcast n stored elements of a float dtype to F32. */
void tm__to_f32(seldp_dtype dtype, const void *src, float *dst, size_t n);

/* Derivative helpers shared by forward and backward. */
static inline float tm__sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

#endif
