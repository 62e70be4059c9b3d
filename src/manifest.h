/* Schema manifests: a compact, self-describing summary of a rank's selection.
 *
 * A session's ranks agree on a schema by all-gathering their manifests and
 * comparing each one with the root's: the selected paths in lexicographic order,
 * and per path its dtype, shape, alias group, frozen flag and device kind. The
 * encoding is a little-endian byte blob; the decoder trusts nothing in it. */
#ifndef SELDP_MANIFEST_H
#define SELDP_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/model.h"
#include "seldp/status.h"
#include "seldp/tensor.h"

/* One selected path. */
typedef struct seldp__manifest_entry {
    const char *path;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[SELDP_MAX_DIMS];
    uint32_t alias; /* index of the smallest path tied to the same ParamId (itself if none) */
    bool frozen;
    seldp_device_kind device_kind;
} seldp__manifest_entry;

/* Entries sorted by path (strcmp), paths unique. */
typedef struct seldp__manifest {
    size_t count;
    seldp__manifest_entry *entries;
    char *strings; /* path storage owned by a decoded manifest; NULL for a built one */
} seldp__manifest;

/* Build the manifest of every path of `model` whose id is among `sorted_ids` (ascending,
 * unique). The entries point at the model's path strings, so the model must outlive the
 * manifest. SELDP_ERR_NOMEM on allocation failure. */
seldp_status seldp__manifest_build(const seldp_model *model, const seldp_param_id *sorted_ids,
                                   size_t n_ids, seldp__manifest *out);

/* Encode into one malloc'd blob (*blob, the caller frees it with free()). */
seldp_status seldp__manifest_encode(const seldp__manifest *manifest, void **blob, size_t *bytes);

/* Decode a blob of `bytes` bytes. Every length, count, enum value and index is
 * bounds-checked: a truncated, corrupted or hostile blob gives SELDP_ERR_PARSE (and
 * nothing to free), never a read outside the blob. SELDP_ERR_NOMEM on allocation failure. */
seldp_status seldp__manifest_decode(const void *blob, size_t bytes, seldp__manifest *out);

/* Release what build or decode allocated; the struct is left empty. */
void seldp__manifest_free(seldp__manifest *manifest);

/* Compare the manifests of a group's `n` ranks (manifests[r] is group rank r's) with the
 * root's. SELDP_OK when all are equal; else SELDP_ERR_SCHEMA with a message naming the
 * first path (lexicographically) where some rank differs, what differs, and every group
 * rank that differs there (with its world rank from world_ranks). */
seldp_status seldp__manifest_compare(const seldp__manifest *manifests, int n, int root,
                                     const int *world_ranks);

#endif
