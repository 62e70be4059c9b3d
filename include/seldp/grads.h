/** @file
 * Gradient container: a map ParamId -> gradient tensor.
 *
 * Each entry is either borrowed (the caller owns the bytes; the container only
 * refers to them) or owned (allocated by seldp with seldp_tensor_alloc and freed
 * by the container). Reductions rewrite a container in place: see session.h. */
#ifndef SELDP_GRADS_H
#define SELDP_GRADS_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/export.h"
#include "seldp/model.h"
#include "seldp/status.h"
#include "seldp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A gradient container: ParamId -> gradient tensor, borrowed or owned (opaque). */
typedef struct seldp_grads seldp_grads;

/** Ownership of an entry's bytes. */
typedef enum seldp_ownership {
    SELDP_BORROWED = 0, /**< the caller owns the bytes and must keep them alive */
    SELDP_OWNED = 1     /**< the container frees them with seldp_tensor_free */
} seldp_ownership;

/** Create an empty container. */
SELDP_API seldp_status seldp_grads_create(seldp_grads **out);

/** Free the container and the bytes of its owned entries. NULL is a no-op. */
SELDP_API void seldp_grads_destroy(seldp_grads *grads);

/** Insert the gradient of `id`. SELDP_ERR_DUPLICATE when `id` is present (nothing
 * changes); SELDP_ERR_INVALID_ARGUMENT for an invalid tensor. With SELDP_OWNED the
 * container takes ownership only on success. */
SELDP_API seldp_status seldp_grads_put(seldp_grads *grads, seldp_param_id id,
                                       const seldp_tensor *tensor, seldp_ownership ownership);

/** Make room for `n` more entries, so that the next `n` puts cannot fail for want of
 * memory (as std::vector::reserve). On failure (SELDP_ERR_NOMEM) nothing changes. */
SELDP_API seldp_status seldp_grads_reserve(seldp_grads *grads, size_t n);

/** The gradient of `id`, or NULL. The pointer is valid until the container changes. */
SELDP_API const seldp_tensor *seldp_grads_get(const seldp_grads *grads, seldp_param_id id);

/** Ownership of the entry of `id` (SELDP_BORROWED when absent). */
SELDP_API seldp_ownership seldp_grads_ownership(const seldp_grads *grads, seldp_param_id id);

/** Remove the entry of `id` without freeing anything; the caller receives the tensor and
 * its ownership (and must free an owned one). Returns false when absent. */
SELDP_API bool seldp_grads_take(seldp_grads *grads, seldp_param_id id, seldp_tensor *tensor,
                                seldp_ownership *ownership);

/** Remove the entry of `id`, freeing it if owned. Returns false when absent. */
SELDP_API bool seldp_grads_remove(seldp_grads *grads, seldp_param_id id);

/** Number of entries. */
SELDP_API size_t seldp_grads_count(const seldp_grads *grads);

/** The i-th entry in ascending id order; false when out of range. */
SELDP_API bool seldp_grads_at(const seldp_grads *grads, size_t i, seldp_param_id *id,
                              const seldp_tensor **tensor);

/** Move every entry of `grads` into two new containers: those whose id is among `ids`
 * into *selected, the rest into *untouched. Ownership moves with each entry and `grads`
 * is left empty. On failure (SELDP_ERR_NOMEM) `grads` is unchanged and nothing is
 * created. */
SELDP_API seldp_status seldp_grads_partition(seldp_grads *grads, const seldp_param_id *ids,
                                             size_t n_ids, seldp_grads **selected,
                                             seldp_grads **untouched);

/** Move every entry of `from` into `into`. If any id is in both, SELDP_ERR_DUPLICATE names
 * it and neither container changes. On success `from` is left empty. */
SELDP_API seldp_status seldp_grads_merge(seldp_grads *into, seldp_grads *from);

#ifdef __cplusplus
}
#endif
#endif
