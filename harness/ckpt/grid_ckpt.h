/* Checkpoints of a sharded run (grid_ckpt.c): whole logical tensors gathered from the shards
 * at a save, a rank's part of each read at a resume. */
#ifndef HX_GRID_CKPT_H
#define HX_GRID_CKPT_H

#include "checkpoint_index.h"
#include "grid.h"
#include "safetensors.h"

/* The logical tensor of which `shard` (split as s) is a part, in `dtype`, data untouched. */
seldp_tensor hx_grid_logical_view(const seldp_tensor *shard, hx_shard s, seldp_dtype dtype);

/* The buffers hx_st_writer reads until it writes. */
typedef struct hx_grid_ckpt_keep {
    void **buffers;
    size_t n;
    size_t written; /* tensors added to the writer */
} hx_grid_ckpt_keep;

/* Collective over rk's TP and expert-TP groups: gather every split tensor (and its FP32 master
 * weights) into its logical tensor, and add to `w` the ones this rank writes (hx_set_writes;
 * a tensor held whole is added as it is). Free `keep` with hx_grid_ckpt_keep_free after the
 * writer wrote. */
seldp_status hx_grid_ckpt_add(hx_rank *rk, hx_st_writer *w, hx_grid_ckpt_keep *keep);
void hx_grid_ckpt_keep_free(hx_grid_ckpt_keep *keep);

#endif
