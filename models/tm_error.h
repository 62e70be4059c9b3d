/* tiny-moe's error channel for its own files (the CPU model, the reference and the CUDA
 * model): the calling thread's last message, read with tm_last_error. */
#ifndef TM_ERROR_H
#define TM_ERROR_H

#include "tinymoe.h"

/* Record a printf-style message as the calling thread's last tiny-moe error (tm_last_error)
 * and return `status`. Messages name the rank, the path and what was expected. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
seldp_status
tm__fail(seldp_status status, const char *fmt, ...);

/* tm__fail for a failed seldp call: "<context>: <status name>: <seldp_last_error()>". */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
seldp_status
tm__fail_lib(seldp_status status, const char *fmt, ...);

/* Evaluate a tm call (which reported its own message); on failure store its status in `st`
 * and jump to `fail`. */
#define TM_CHECK(call)                                                                             \
    do {                                                                                           \
        seldp_status tm_check_status_ = (call);                                                    \
        if (tm_check_status_ != SELDP_OK) {                                                        \
            st = tm_check_status_;                                                                 \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Evaluate a seldp call; on failure carry its message over (tm__fail_lib with the context
 * given after the call) and jump to `fail`. */
#define TM_CHECK_LIB(call, ...)                                                                    \
    do {                                                                                           \
        seldp_status tm_check_status_ = (call);                                                    \
        if (tm_check_status_ != SELDP_OK) {                                                        \
            st = tm__fail_lib(tm_check_status_, __VA_ARGS__);                                      \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Jump to `fail` with `st` set to the result of tm__fail(...). */
#define TM_FAIL(...)                                                                               \
    do {                                                                                           \
        st = tm__fail(__VA_ARGS__);                                                                \
        goto fail;                                                                                 \
    } while (0)

#endif
