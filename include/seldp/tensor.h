/** @file
 * Tensors: a dtype, a shape, a device and a data pointer.
 *
 * A seldp_tensor is a plain descriptor. seldp never takes ownership of a tensor
 * the caller describes; it owns only what it allocates itself (seldp_tensor_alloc,
 * or results it places in a gradient container marked as owned). */
#ifndef SELDP_TENSOR_H
#define SELDP_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/export.h"
#include "seldp/dtype.h"
#include "seldp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most dimensions a tensor may have. */
#define SELDP_MAX_DIMS 8

/** Where a tensor's bytes live. */
typedef enum seldp_device_kind {
    SELDP_DEVICE_HOST = 0, /**< host memory (pageable or pinned) */
    SELDP_DEVICE_CUDA = 1  /**< memory of one CUDA device */
} seldp_device_kind;

/** A device: the host, or one CUDA device by ordinal. */
typedef struct seldp_device {
    seldp_device_kind kind; /**< host or CUDA */
    int ordinal;            /**< CUDA device ordinal; 0 for the host */
} seldp_device;

/** The host device, as a value of type seldp_device. */
#ifdef __cplusplus
#define SELDP_HOST_DEVICE (seldp_device{SELDP_DEVICE_HOST, 0})
#else
#define SELDP_HOST_DEVICE ((seldp_device){SELDP_DEVICE_HOST, 0})
#endif

/** Descriptor of a dense, contiguous, row-major tensor. ndim 0 is a scalar. */
typedef struct seldp_tensor {
    seldp_dtype dtype;             /**< element type */
    int ndim;                      /**< number of dimensions, 0..SELDP_MAX_DIMS */
    int64_t shape[SELDP_MAX_DIMS]; /**< extents; entries past ndim are ignored */
    seldp_device device;           /**< where the bytes live */
    void *data;                    /**< the first element; not owned by the descriptor */
} seldp_tensor;

/** A descriptor over caller memory (nothing is allocated or copied). */
SELDP_API seldp_tensor seldp_tensor_view(seldp_dtype dtype, seldp_device device, void *data,
                                         int ndim, const int64_t *shape);

/** Number of elements (1 for a scalar). */
SELDP_API size_t seldp_tensor_numel(const seldp_tensor *t);

/** Number of bytes: numel * element size. */
SELDP_API size_t seldp_tensor_nbytes(const seldp_tensor *t);

/** True when dtype, ndim and every extent are equal (devices and data may differ). */
SELDP_API bool seldp_tensor_same_layout(const seldp_tensor *a, const seldp_tensor *b);

/** Check that dtype, ndim (0..8) and extents (>= 0) are valid and the byte size fits in
 * size_t. data may be NULL only for zero elements. Returns SELDP_ERR_INVALID_ARGUMENT
 * (message names `what`) otherwise. */
SELDP_API seldp_status seldp_tensor_check(const seldp_tensor *t, const char *what);

/** Allocate zeroed storage for t (dtype, ndim, shape, device already set) on t->device.
 * The caller owns t->data and releases it with seldp_tensor_free. CUDA devices need a
 * build with CUDA (SELDP_ERR_UNSUPPORTED otherwise). */
SELDP_API seldp_status seldp_tensor_alloc(seldp_tensor *t);

/** Release storage obtained from seldp_tensor_alloc and set t->data to NULL. */
SELDP_API void seldp_tensor_free(seldp_tensor *t);

/** Copy src's bytes into dst (same layout required; host or CUDA on either side). */
SELDP_API seldp_status seldp_tensor_copy(seldp_tensor *dst, const seldp_tensor *src);

/** Format the shape as "[4, 16]" into buf (always NUL-terminated). Returns buf. */
SELDP_API const char *seldp_shape_str(const seldp_tensor *t, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
