/* A rank's forward and backward, experts served by their owners over alltoallv (dispatch.c). */
#ifndef HX_DISPATCH_H
#define HX_DISPATCH_H

#include <stdint.h>

#include "seldp/status.h"

typedef struct hx_rank hx_rank;

/* Forward and backward of rank rk's tokens this step, experts served by their owners over
 * alltoallv (dispatch.c); afterwards rk->routed holds the world's tokens per expert. */
seldp_status hx_rank_compute(hx_rank *rk);

#endif
