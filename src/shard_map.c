/* The shard map of a session (seldp/shard.h): the selected trainable parameters, in the
 * session's slot order (path order), laid end to end into one index space and cut into one
 * range per group rank at SELDP_SHARD_ALIGN. Computed from the session alone (its slots
 * and its group size), which initialize made the same on every rank. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "shard_impl.h"

void seldp__shard_range(const seldp_shard_map *map, int r, size_t *begin, size_t *end)
{
    size_t S = map->range_elems, E = map->elements;
    size_t b = S && (size_t)r > (E - 1) / S ? E : (size_t)r * S;
    *begin = b < E ? b : E;
    *end = *begin + S < E && *begin < E ? *begin + S : E;
}

seldp_status seldp_shard_map_create(const seldp_session *s, seldp_shard_map **out)
{
    seldp_status st = SELDP_OK;
    seldp_shard_map *map = NULL;

    if (out)
        *out = NULL;
    if (!s || !out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "seldp_shard_map_create: session and out must not be NULL");
    if (!(map = calloc(1, sizeof *map)))
        return seldp__fail(SELDP_ERR_NOMEM, "seldp_shard_map_create: out of memory");
    map->session = s;
    map->size = seldp_comm_size(s->comm);
    map->offset = malloc((s->n_slots + 1) * sizeof *map->offset);
    map->nonempty = malloc((s->n_slots ? s->n_slots : 1) * sizeof *map->nonempty);
    map->first = calloc((size_t)map->size, sizeof *map->first);
    map->pieces = calloc((size_t)map->size, sizeof *map->pieces);
    if (!map->offset || !map->nonempty || !map->first || !map->pieces)
        SELDP_FAIL(SELDP_ERR_NOMEM,
                   "seldp_shard_map_create: out of memory for the map of %zu parameters over %d "
                   "ranks",
                   s->n_slots, map->size);
    size_t at = 0;
    for (size_t k = 0; k < s->n_slots; k++) {
        size_t n = seldp_tensor_numel(&s->params[s->slot_param[k]].tensor);
        map->offset[k] = at;
        if (n)
            map->nonempty[map->n_nonempty++] = k;
        at += n;
    }
    map->offset[s->n_slots] = at;
    map->elements = at;
    size_t share = (at + (size_t)map->size - 1) / (size_t)map->size;
    map->range_elems = (share + SELDP_SHARD_ALIGN - 1) / SELDP_SHARD_ALIGN * SELDP_SHARD_ALIGN;
    /* the pieces of each range: the non-empty slots that overlap it, in index order */
    size_t j = 0;
    for (int r = 0; r < map->size; r++) {
        size_t begin, end;
        seldp__shard_range(map, r, &begin, &end);
        while (j < map->n_nonempty &&
               map->offset[map->nonempty[j]] +
                       seldp_tensor_numel(&s->params[s->slot_param[map->nonempty[j]]].tensor) <=
                   begin)
            j++;
        map->first[r] = j;
        size_t k = j;
        while (begin < end && k < map->n_nonempty && map->offset[map->nonempty[k]] < end)
            k++;
        map->pieces[r] = k - j;
    }
    *out = map;
    return SELDP_OK;
fail:
    seldp_shard_map_destroy(map);
    return st;
}

void seldp_shard_map_destroy(seldp_shard_map *map)
{
    if (!map)
        return;
    free(map->offset);
    free(map->nonempty);
    free(map->first);
    free(map->pieces);
    free(map);
}

size_t seldp_shard_map_elements(const seldp_shard_map *map)
{
    return map ? map->elements : 0;
}

int seldp_shard_map_size(const seldp_shard_map *map)
{
    return map ? map->size : 0;
}

static seldp_status check_rank(const seldp_shard_map *map, int group_rank, const char *call)
{
    if (!map)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: map must not be NULL", call);
    if (group_rank < 0 || group_rank >= map->size)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: group rank %d is outside the map's group of %d ranks", call,
                           group_rank, map->size);
    return SELDP_OK;
}

seldp_status seldp_shard_map_range(const seldp_shard_map *map, int group_rank, size_t *begin,
                                   size_t *count)
{
    size_t b, e;
    seldp_status st = check_rank(map, group_rank, "seldp_shard_map_range");
    if (st != SELDP_OK)
        return st;
    seldp__shard_range(map, group_rank, &b, &e);
    if (begin)
        *begin = b;
    if (count)
        *count = e - b;
    return SELDP_OK;
}

size_t seldp_shard_map_pieces(const seldp_shard_map *map, int group_rank)
{
    if (!map || group_rank < 0 || group_rank >= map->size)
        return 0;
    return map->pieces[group_rank];
}

seldp_status seldp_shard_map_piece(const seldp_shard_map *map, int group_rank, size_t i,
                                   seldp_shard_piece *out)
{
    seldp_status st = check_rank(map, group_rank, "seldp_shard_map_piece");
    if (st != SELDP_OK)
        return st;
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "seldp_shard_map_piece: out is NULL");
    if (i >= map->pieces[group_rank])
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "seldp_shard_map_piece: piece %zu of group rank %d, which has %zu", i,
                           group_rank, map->pieces[group_rank]);
    const seldp_session *s = map->session;
    size_t k = seldp__shard_piece_slot(map, group_rank, i), begin, end;
    const session_param *g = &s->params[s->slot_param[k]];
    size_t off = map->offset[k], n = seldp_tensor_numel(&g->tensor);
    seldp__shard_range(map, group_rank, &begin, &end);
    size_t from = off > begin ? off : begin, to = off + n < end ? off + n : end;
    *out = (seldp_shard_piece){.id = g->id,
                               .path = g->path,
                               .dtype = g->tensor.dtype,
                               .param_elements = n,
                               .param_offset = from - off,
                               .count = to - from,
                               .range_offset = from - begin};
    return SELDP_OK;
}

seldp_status seldp__shard_check(const seldp_shard_map *map, const seldp_session *s,
                                const void *range, size_t range_count, const char *call)
{
    size_t begin, end;
    if (!map)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: map must not be NULL", call);
    if (map->session != s)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: the shard map is another session's (made by seldp_shard_map_create "
                           "for a session of %zu elements over %d ranks); pass the map of the "
                           "session called",
                           call, map->elements, map->size);
    seldp__shard_range(map, seldp_comm_rank(s->comm), &begin, &end);
    if (range_count != end - begin)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: the range has %zu elements, but group rank %d's range of the map "
                           "is [%zu, %zu), %zu elements",
                           call, range_count, seldp_comm_rank(s->comm), begin, end, end - begin);
    if (range_count && !range)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: range is NULL for %zu elements", call,
                           range_count);
    return SELDP_OK;
}
