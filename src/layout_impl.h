/* The layout module's inside, shared by src/layout.c (the data, its queries) and
 * src/layout_frameworks.c (how each framework fills it in). */
#ifndef SELDP_LAYOUT_IMPL_H
#define SELDP_LAYOUT_IMPL_H

#include <stdbool.h>

#include "seldp/layout.h"

/* The groups of one kind: `count` groups of `size` ranks each, every group ascending,
 * the groups ordered by their lowest rank. */
typedef struct layout_kind {
    int count;
    int size;
    int *ranks;    /* [count * size] */
    int *group_of; /* [world] group index, -1 where none */
    int *pos_of;   /* [world] position in that group, -1 where none */
} layout_kind;

struct seldp_layout {
    seldp_layout_config cfg; /* defaults resolved; cfg.order points at `order` */
    char *order;
    int dp;
    char what[192]; /* "megatron (world 16, tp 2, pp 2, cp 1, ep 2, etp 2)", for messages */
    layout_kind kinds[SELDP_GROUP_KINDS];
};

/* Set the groups of `kind` from `count` groups of `size` ranks in any order (copied,
 * then sorted). Every rank may be in one group at most, and in exactly one for every kind
 * but the embedding's: a violation is SELDP_ERR_INTERNAL (a bug in a framework's rule). */
seldp_status seldp__layout_set(seldp_layout *layout, seldp_group_kind kind, int count, int size,
                               const int *ranks);

/* Megatron-Core's generate_masked_orthogonal_rank_groups: the world is a grid of
 * `n` dimensions of sizes[0..n-1], the first varying fastest; each group holds the ranks
 * that agree on every dimension where mask is false. Sets the groups of `kind`. */
seldp_status seldp__layout_masked(seldp_layout *layout, seldp_group_kind kind, int n,
                                  const int *sizes, const bool *mask);

/* Each rank its own group (a parallelism of size 1). */
seldp_status seldp__layout_singletons(seldp_layout *layout, seldp_group_kind kind);

/* The embedding groups from the pipeline groups: the first and last stage of each (the one
 * rank where pp is 1). Needs SELDP_GROUP_PP set. */
seldp_status seldp__layout_embedding(seldp_layout *layout);

/* Fill in every group of layout->cfg (sizes checked >= 1, etp possibly 0, order possibly
 * NULL) as its framework does, resolving the defaults into layout->cfg; or fail with the
 * framework's reason (SELDP_ERR_INVALID_ARGUMENT, prefixed with layout->what). */
seldp_status seldp__layout_build(seldp_layout *layout);

#endif
