/* A rank's tensors where it computes (rank_tensors.c). */
#ifndef HX_RANK_TENSORS_H
#define HX_RANK_TENSORS_H

#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

typedef struct hx_rank hx_rank;

/* Checksum of a tensor's bytes on the host or a GPU (read through a host copy). */
seldp_status hx_tensor_checksum(const hx_rank *rk, const seldp_tensor *t, uint64_t *sum);
/* The storage of parameter p where the rank computes (the device mirror's on a GPU). */
const seldp_tensor *hx_param_storage(const hx_rank *rk, const tm_param_info *p);

#endif
