/* The layout the sharded-state tests share (tests/contract/test_shard_*.c, and the robust
 * program of the sharded calls): a rank-local model whose selection has parameters of every
 * float dtype and of sizes that no group size of 1 to 8 divides, a parameter spanning ranges,
 * a zero-element parameter, a tied alias, a frozen parameter and an integer buffer (selected,
 * never sharded), beside an unselected parameter whose shape depends on the rank; ParamIds
 * and registration order differ between ranks. */
#ifndef SELDP_SHARD_FIXTURE_H
#define SELDP_SHARD_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "contract.h"

typedef struct sf_spec {
    const char *path;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[2];
    bool frozen;
    bool trainable; /* in the shard map: selected, a float, not frozen */
} sf_spec;

/* Selected, in path order; "z.head" is tied to "b.weight" besides, and "u.local" (F32 of
 * rank + 3 elements) is not selected. */
#define SF_N 8
extern const sf_spec SF[SF_N];

/* Elements of the shard map's index space: the trainable parameters' (2199). */
#define SF_ELEMENTS 2199

/* ParamId of SF[k] on `rank` (a rank-dependent permutation), and of "u.local". */
seldp_param_id sf_id(int rank, size_t k);
#define SF_UNSELECTED_ID 777

size_t sf_numel(size_t k);

/* SF[k]'s first element in the index space (trainable k only). */
size_t sf_offset(size_t k);

/* Build the layout for `rank` (registered in a rank-dependent order) with values of `seed`. */
seldp_status sf_model(test_model *m, int rank, uint64_t seed);

/* Build the layout for the caller's rank and initialize a session selecting all of SF (with
 * buffers) from root 0; `n_select` < SF_N selects only the first ones (0: an empty
 * selection). */
seldp_status sf_session(seldp_comm *comm, test_model *m, size_t n_select,
                        const seldp_session_config *cfg, seldp_session **s);

/* Seed of `rank`'s gradient of SF[k] at `step`. */
uint64_t sf_grad_seed(int rank, size_t k, uint64_t step);

/* Put `rank`'s gradients of every trainable SF[k] whose has[k] is true (has NULL: all) at
 * `step` into g, F32 where f32 is true (else the parameter's dtype), and a gradient of the
 * unselected parameter. */
seldp_status sf_put_grads(test_grads *g, int rank, uint64_t step, const bool *has, bool f32);

/* The session config the environment asks for: SELDP_TEST_STAGED_COMMIT=1 sets
 * cfg.staged_commit; SELDP_TEST_BUCKET_BYTES sets cfg.bucket_bytes (small buckets cut the
 * map into many reduce-scatters). */
seldp_session_config sf_config(void);

#endif
