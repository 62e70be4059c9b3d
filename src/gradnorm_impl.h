/* What the two files of the global gradient norm share (gradnorm.c: the agreement, the
 * decision and the scaling; gradnorm_prepare.c: a rank's checks and its sum of squares). */
#ifndef SELDP_GRADNORM_IMPL_H
#define SELDP_GRADNORM_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/gradnorm.h"

/* One call of seldp_grad_norm and its kin, as this rank made it. */
typedef struct norm_call {
    seldp_comm *parent;
    const seldp_norm_part *parts;
    size_t n_parts;
    const seldp_norm_range *ranges;
    size_t n_ranges;
    bool with_ranges; /* called as seldp_grad_norm_ranges or seldp_clip_grad_norm_ranges */
    bool clip;
    double max_norm;
    double sum_squares; /* what this rank counts */
    float **scratch;    /* per part: F32 room on its device for scaling half gradients */
} norm_call;

/* The public call c is: seldp_grad_norm, seldp_clip_grad_norm or their _ranges variants. */
const char *seldp__norm_call_name(const norm_call *c);

/* The session of listed entry i: a part (i < n_parts), or a range after them. */
const seldp_session *seldp__norm_listed_session(const norm_call *c, size_t i);

/* This rank's checks of every listed part and range, and its sum of squares into
 * c->sum_squares (and F32 scratch for clipping half gradients). A failure is this rank's
 * status for the agreement, with the error recorded; nothing is reduced yet. */
seldp_status seldp__norm_prepare(norm_call *c, const seldp_grad_norm_result *out);

#endif
