/* A rank's setup before the first gate and its tokens of each step (rank_setup.c); the
 * storage and checksums of its tensors are rank_tensors.h. */
#ifndef HX_RANK_SETUP_H
#define HX_RANK_SETUP_H

#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

typedef struct hx_rank hx_rank;

/* Rank rk's setup before the first gate (rank_setup.c): its groups, model and sessions. */
seldp_status hx_rank_setup(hx_rank *rk);
/* Rank rk's tokens and targets of `step` (rank_setup.c). */
seldp_status hx_draw_tokens(hx_rank *rk, int step);

#endif
