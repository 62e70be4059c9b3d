/* A rank's setup before the first gate, its tokens of each step, and the storage and
 * checksums of its tensors where it computes (rank_setup.c). */
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

/* Checksum of a tensor's bytes on the host or a GPU (read through a host copy). */
seldp_status hx_tensor_checksum(const hx_rank *rk, const seldp_tensor *t, uint64_t *sum);
/* The storage of parameter p where the rank computes (the device mirror's on a GPU). */
const seldp_tensor *hx_param_storage(const hx_rank *rk, const tm_param_info *p);

#endif
