/* The FP64 reference's weights and its result (reference_weights.c): every trainable tensor's
 * entry by path (its upcast weight, its gradient and the magnitude of each gradient element),
 * the effective expert weights, and struct tm_reference itself. For the reference's files only:
 * the FP32 model's files never include this, so the two stay independent. */
#ifndef TM_REFERENCE_WEIGHTS_H
#define TM_REFERENCE_WEIGHTS_H

#include <pthread.h>
#include <stddef.h>

#include "tinymoe.h"

#define REF_PATH_MAX 96

typedef struct ref_entry {
    char path[REF_PATH_MAX];
    double *w; /* weight (FP64) */
    double *g; /* gradient of the mean loss; NULL for frozen */
    double *m; /* the magnitude of every element of g (reference_impl.h) */
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

/* Every trainable tensor of the model, upcast; arrays are owned by the reference. */
typedef struct ref_params {
    ref_entry *emb, *fnorm;
    ref_entry **norm, **router; /* (L) */
    ref_entry **sw1, **sw2;     /* (L) the shared expert, when d_ff_shared > 0 */
    ref_linear *lin;            /* (L,E,2): w1 then w2 */
} ref_params;

struct tm_reference {
    tm_config cfg;
    double loss;
    double loss_magnitude; /* the magnitude of the loss (reference_impl.h) */
    size_t N;
    size_t *routed; /* (L,E) */
    size_t ties_followed;
    size_t dropped; /* assignments the capacity dropped */
    double largest; /* the largest of the FP32 model's norm sums of squares and logits */
    ref_entry *entries;
    size_t n_entries, cap_entries;
    size_t *slots; /* (n_slots, a power of two) open-addressing index by path: entry + 1 */
    size_t n_slots;
    void **allocs;
    size_t n_allocs, cap_allocs;
    pthread_mutex_t alloc_lock; /* the reference's workers grow their arenas concurrently */
};

/* calloc of count * size bytes (one byte at least) that ref frees in tm_reference_destroy;
 * NULL when out of memory. Safe to call from the reference's workers. */
void *tm__ref_calloc(tm_reference *ref, size_t count, size_t size);

/* Frees p, one of ref's tm__ref_calloc buffers, before tm_reference_destroy (NULL: nothing).
 * Safe to call from the reference's workers. */
void tm__ref_free(tm_reference *ref, void *p);

/* The entry of `path` (lm_head.weight: the tied embed.weight), or NULL. */
ref_entry *tm__ref_find(const tm_reference *ref, const char *path);

/* Element i of a float tensor as a double (NAN for a non-float dtype). */
double tm__ref_stored_float(const seldp_tensor *t, size_t i);

/* Read every trainable tensor of ref->cfg's model from `weights` by path into ref's entries
 * (upcast, quantized bases decoded), apply `perturb` (NULL: none) and form the effective
 * expert weights into *p. Fails with a message naming the path on a missing tensor, a wrong
 * dtype or shape, or an embedding and head that are not tied. */
seldp_status tm__ref_load_weights(tm_reference *ref, const seldp_model *weights,
                                  const tm_ref_perturb *perturb, ref_params *p);

#endif
