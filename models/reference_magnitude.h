/* The error-scale pass of the FP64 reference (reference_magnitude.c: the rules and the
 * forward; reference_magnitude_silu.c: the SiLU rule; reference_magnitude_router.c: the
 * router; reference_magnitude_back.c: the backward), for those files and their tests only. */
#ifndef TM_REFERENCE_MAGNITUDE_H
#define TM_REFERENCE_MAGNITUDE_H

#include <stdbool.h>
#include <stddef.h>

#include <cblas.h>

#include "reference_impl.h"

/* A scratch arena for the products' absolute and squared copies: slots 0 to 2 belong to
 * tm__mag_var_gemm, 3 to 6 to its callers. */
typedef struct arena {
    tm_reference *ref;
    double *buf[7];
    size_t cap[7];
    int workers; /* the pass's own arena: its products' copies are filled on the workers */
} arena;

/* A sum over tokens accumulated term by term (a norm's or the router's weight gradient): the
 * magnitudes of its terms and its value, for its own rounding at the end (tm__mag_close_sum). */
typedef struct token_sum {
    double *abs, *value; /* (n) */
} token_sum;

/* One lane's buffers (ref_pool.h): the variances of the rows of the expert it computes, the
 * arrays of a router block, its own arena, and a router block's part of the loss's variance
 * until the block's commit. */
typedef struct mag_rows {
    arena ar;
    double *VX, *VA, *VS, *VY, *VSL; /* (n,D) (n,F) (n,F) (n,D) (n,F) silu' */
    double *VdHr, *VP, *VdA, *VdYE, *VdX, *VdW;
    double *SM, *SLM; /* (n,F) the backward's silu and slope as tm__mag_silu_var finds them */
    double *LG, *VLG, *PR, *VPR; /* (block,E) logits, probabilities and their variances */
    double *TB;                  /* (block,3D) a block's terms of a norm's token sums */
    double loss_var;
    size_t cap; /* the rows' buffers' (tm__mag_lanes_room) */
} mag_rows;

typedef struct pass {
    tm_reference *ref;
    const ref_params *p;
    ref_work *w;
    arena ar;
    int D, F, E, K, L, V, Fs;
    size_t N;
    double **VW; /* (L,E,2) the variance of each expert's effective weight; NULL entries exact */
    /* forward */
    double *VH, *VU, *VR; /* (L+1,N,D) (L,N,D) (L+1,N): the last of VR is the final norm's */
    double *VG;           /* (L,N,K) gates */
    double *VSA;          /* (L,N,Fs) */
    double *VZ, *VLOG;    /* (N,D) (N,V) */
    double *VDLR;         /* (L,N,E) router-loss logit gradients, or NULL */
    double *AH;           /* (N,D) |terms| of one layer's residual sum */
    mag_rows *mr;         /* (w->lanes) */
    double *F_AUX;        /* (shards,E) the load-balancing loss's expert fractions */
    /* backward */
    double *dH, *VdH, *dU, *VdU;     /* (N,D) */
    double *dgate, *Vdgate;          /* (N,K) */
    double *VDZ;                     /* (N,K) the selected logits' gradients' (w->DZ) */
    double *VdSS, *VdSA, *SL, *VSLs; /* (N,Fs) shared expert */
    double loss_var;
} pass;

/* Room in every lane, the reference's buffers and the pass's, for the rows of layer l's
 * busiest expert; false when out of memory. */
bool tm__mag_lanes_room(pass *s, int l);

/* The own-rounding factor of a sum of n terms of one sign, squared: (sqrt(n) / 3)^2, 1 at
 * least. */
double tm__mag_same_sign(size_t n);
/* Slot i of the arena with room for n doubles (owned by the reference), or NULL. */
double *tm__mag_room(arena *a, int i, size_t n);
void tm__mag_fill_abs(double *dst, const double *src, size_t n);
void tm__mag_fill_sq(double *dst, const double *src, size_t n);
/* The variance of C = op(A) op(B) (reference_magnitude.c says how); _of with C (m,n) already
 * computed by the caller (NULL: computed here). */
bool tm__mag_var_gemm_of(arena *a, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                         const double *A, const double *VA, size_t ar, size_t ac, const double *B,
                         const double *VB, size_t br, size_t bc, const double *C, double beta,
                         double *VC);
bool tm__mag_var_gemm(arena *a, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                      const double *A, const double *VA, size_t ar, size_t ac, const double *B,
                      const double *VB, size_t br, size_t bc, double beta, double *VC);
/* The elementwise rules: SiLU with its derivative (reference_magnitude_silu.c), a softmax,
 * the RMS norm's backward. tm__mag_silu_var runs the widest build this CPU has;
 * tm__mag_silu_var_on a given one (TM_MAG_SILU_*, for the tests: every build gives the same
 * bits), tm__mag_silu_widest says which. */
enum { TM_MAG_SILU_BASE, TM_MAG_SILU_AVX2, TM_MAG_SILU_AVX512 };
void tm__mag_silu_var(const double *a, const double *va, size_t n, double *y, double *vy,
                      double *sl, double *vsl);
void tm__mag_silu_var_on(int build, const double *a, const double *va, size_t n, double *y,
                         double *vy, double *sl, double *vsl);
int tm__mag_silu_widest(void);
void tm__mag_softmax_var(const double *p, const double *vz, int n, double *vp);
/* An RMS norm's backward over the N tokens with variances (x, vx its input, g its weight, r,
 * vr the tokens' 1/rms): s->dH, s->VdH += the input's gradient from s->dU, s->VdU; the
 * weight's gradient's variance into vdg, its token sum's rounding included. */
bool tm__mag_norm_backward(pass *s, const double *x, const double *vx, const double *g,
                           const double *r, const double *vr, double *vdg);
/* A token sum: its own rounding into v at the end; two arena slots as a zeroed one. */
void tm__mag_close_sum(double *v, token_sum ts, size_t n, size_t terms);
bool tm__mag_token_sum_of(arena *a, int slot, size_t n, token_sum *ts);

/* The router (reference_magnitude_router.c): layer l's logits in blocks, the gates' and the
 * router losses' variances; backward, the gates' softmax into the router's rows and dU. */
bool tm__mag_router_layer_var(pass *s, int l);
bool tm__mag_router_backward_var(pass *s, int l);

/* The backward (reference_magnitude_back.c), the gradient's (reference.c's pieces) and the
 * pass's together: the head's, then one layer's. */
bool tm__mag_head_backward_var(pass *s);
bool tm__mag_layer_backward_var(pass *s, int l);

#endif
