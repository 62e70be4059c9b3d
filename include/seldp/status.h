/** @file
 * Status codes and the per-thread error message of the last failing call.
 *
 * Every seldp function that can fail returns a seldp_status. When it is not
 * SELDP_OK, seldp_last_error() on the same thread holds a message that names the
 * rank, the parameter path (where one is involved) and what was expected. */
#ifndef SELDP_STATUS_H
#define SELDP_STATUS_H

#include "seldp/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Result of every fallible seldp call. */
typedef enum seldp_status {
    SELDP_OK = 0,               /**< success */
    SELDP_ERR_INVALID_ARGUMENT, /**< null pointer, bad count, root outside the group... */
    SELDP_ERR_NOMEM,            /**< an allocation failed */
    SELDP_ERR_NOT_FOUND,        /**< a selected id or path is absent from the model */
    SELDP_ERR_DUPLICATE,        /**< duplicate path, or duplicate id in a selection */
    SELDP_ERR_DTYPE,            /**< dtype not supported by the call, or not as expected */
    SELDP_ERR_SHAPE,            /**< shape not as expected */
    SELDP_ERR_DEVICE,           /**< tensor not on the session's device */
    SELDP_ERR_ALIAS,            /**< tied aliases that do not name the same storage */
    SELDP_ERR_SCHEMA,           /**< ranks disagree on paths, dtypes, shapes or aliases */
    SELDP_ERR_DISAGREE,         /**< ranks called a different method or policy */
    SELDP_ERR_MISSING_GRADIENT, /**< policy error: an active rank lacks a gradient */
    SELDP_ERR_FROZEN,           /**< a gradient was supplied for a frozen parameter */
    SELDP_ERR_NONFINITE,        /**< a NaN or Inf gradient was detected (when asked to) */
    SELDP_ERR_OVERFLOW,         /**< a weight sum overflowed 64 bits */
    SELDP_ERR_ABORTED,          /**< a rank of the communicator aborted */
    SELDP_ERR_TIMEOUT,          /**< a rank did not arrive before the timeout */
    SELDP_ERR_TRANSPORT,        /**< CUDA, NCCL or MPI reported an error */
    SELDP_ERR_UNSUPPORTED,      /**< not compiled in, or not supported by this transport */
    SELDP_ERR_PARSE,            /**< malformed input file or blob */
    SELDP_ERR_IO,               /**< a file could not be read or written */
    SELDP_ERR_INTERNAL,         /**< a broken invariant: a bug in seldp */
    SELDP_ERR_GRADS_UNDEFINED,  /**< a reduction failed after results were being written in
                                     place: the selected gradients (or the reduce-scatter's
                                     range, seldp/shard.h) are undefined */
    SELDP_ERR_PARAMS_UNDEFINED  /**< an all-gather into the parameters failed after it began
                                     writing them in place: the selected trainable parameters
                                     are undefined (seldp/shard.h) */
} seldp_status;

/** Stable upper-case name of a status, e.g. "SELDP_ERR_TIMEOUT". Never NULL. */
SELDP_API const char *seldp_status_name(seldp_status status);

/** Message of the last failing seldp call on the calling thread ("" if none).
 * The string is owned by seldp and valid until the next failing call on this thread. */
SELDP_API const char *seldp_last_error(void);

/** Forget the calling thread's last error message. */
SELDP_API void seldp_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
