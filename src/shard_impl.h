/* The shard map's layout, shared by the map's queries (shard_map.c), the sharded
 * collectives (session_shard.c) and the norm over ranges (gradnorm.c). Internal. */
#ifndef SELDP_SHARD_IMPL_H
#define SELDP_SHARD_IMPL_H

#include <stddef.h>

#include "seldp/shard.h"
#include "session_impl.h"
#include "session_reduce.h"

struct seldp_shard_map {
    const seldp_session *session;
    int size;           /* ranges: the group's size */
    size_t elements;    /* E: the elements of every slot */
    size_t range_elems; /* S: ceil(E / W) rounded up to SELDP_SHARD_ALIGN */
    size_t *offset;     /* per slot of the session (+1): its first element in the index space */
    size_t *nonempty;   /* the slots with elements, in index order */
    size_t n_nonempty;
    size_t *first;  /* per rank: its first piece, an index into nonempty */
    size_t *pieces; /* per rank: its pieces (a slot spanning ranges is a piece of each) */
};

/* Group rank r's range [*begin, *end) (r inside the group). */
void seldp__shard_range(const seldp_shard_map *map, int r, size_t *begin, size_t *end);

/* The slot of piece i of group rank r's range (i below its piece count). */
static inline size_t seldp__shard_piece_slot(const seldp_shard_map *map, int r, size_t i)
{
    return map->nonempty[map->first[r] + i];
}

/* The commit of a reduce-scatter staged in the session's staging buffer (element i of the
 * index space at staging[i]): the present pieces of this rank's range [begin, ...) copied
 * into `range`, and one presence flag per piece into `present` (may be NULL). */
seldp_status seldp__shard_commit(const reduce_call *c, const seldp_shard_map *map, float *range,
                                 bool *present);

/* SELDP_ERR_INVALID_ARGUMENT, naming `call`, unless map is the map of session s and
 * range_count is this rank's count in it (range non-NULL when that is not 0). */
seldp_status seldp__shard_check(const seldp_shard_map *map, const seldp_session *s,
                                const void *range, size_t range_count, const char *call);

#endif
