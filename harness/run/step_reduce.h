/* A rank's reduction phase of the step (step_reduce.c). */
#ifndef HX_STEP_REDUCE_H
#define HX_STEP_REDUCE_H

#include "seldp/status.h"

typedef struct hx_rank hx_rank;

/* The step's reductions of rank rk into rk->grads; --inject's defects after them. */
seldp_status hx_rank_reduce(hx_rank *rk);

#endif
