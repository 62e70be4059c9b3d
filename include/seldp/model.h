/** @file
 * Model view: a rank-local model described as parameter occurrences.
 *
 * The caller registers each occurrence (full path, ParamId, tensor, frozen flag,
 * opaque tag). seldp copies the path and the tensor descriptor but never the
 * tensor's bytes: the caller keeps owning them and they must outlive the view.
 * A ParamId registered at several paths is a tied alias; all its occurrences must
 * name the same storage, dtype, shape and frozen flag. */
#ifndef SELDP_MODEL_H
#define SELDP_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/export.h"
#include "seldp/status.h"
#include "seldp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Identifier of a parameter. May differ between ranks for the same path. */
typedef uint64_t seldp_param_id;

/** One registered occurrence. Owned by the model view; valid until it is destroyed. */
typedef struct seldp_param {
    const char *path;    /**< full path, e.g. "layers.0.experts.3.w1.weight" (a copy) */
    seldp_param_id id;   /**< the ParamId; shared by every path of a tied alias */
    seldp_tensor tensor; /**< the caller's tensor (a copy of the descriptor only) */
    bool frozen;         /**< never reduced; a gradient supplied for it is an error */
    void *tag;           /**< the caller's opaque value, returned as given */
} seldp_param;

/** A rank-local model view: the registered parameter occurrences (opaque). */
typedef struct seldp_model seldp_model;

/** Create an empty view. `rank` is used only to name the rank in error messages
 * (pass -1 when unknown). Returns SELDP_ERR_NOMEM on allocation failure. */
SELDP_API seldp_status seldp_model_create(int rank, seldp_model **out);

/** Free the view (never the caller's tensors). NULL is a no-op. */
SELDP_API void seldp_model_destroy(seldp_model *model);

/** Register one occurrence. Fails with SELDP_ERR_DUPLICATE for a path already registered,
 * SELDP_ERR_ALIAS when `id` is already registered with other storage, dtype, shape or
 * frozen flag, SELDP_ERR_INVALID_ARGUMENT for an empty path or an invalid tensor.
 * On failure the view is unchanged. */
SELDP_API seldp_status seldp_model_add(seldp_model *model, const char *path, seldp_param_id id,
                                       const seldp_tensor *tensor, bool frozen, void *tag);

/** The rank given at creation. */
SELDP_API int seldp_model_rank(const seldp_model *model);

/** Number of occurrences (paths). */
SELDP_API size_t seldp_model_count(const seldp_model *model);

/** The i-th occurrence in lexicographic (strcmp) order of paths; NULL when out of range. */
SELDP_API const seldp_param *seldp_model_at(const seldp_model *model, size_t i);

/** The occurrence registered at `path`, or NULL. */
SELDP_API const seldp_param *seldp_model_find_path(const seldp_model *model, const char *path);

/** The first occurrence (smallest path) of `id`, or NULL. */
SELDP_API const seldp_param *seldp_model_find_id(const seldp_model *model, seldp_param_id id);

/** Number of paths `id` is registered at (0 when absent); with out != NULL, writes up to
 * `max` of them, in path order. */
SELDP_API size_t seldp_model_aliases(const seldp_model *model, seldp_param_id id,
                                     const seldp_param **out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
