/* Internal helpers shared by the library's files: error reporting and checks.
 * Nothing here is public; non-static names carry the seldp__ prefix. */
#ifndef SELDP_INTERNAL_H
#define SELDP_INTERNAL_H

#include <stddef.h>

#include "seldp/status.h"

/* Record a printf-style message as the calling thread's last error and return
 * `status`. Messages name the rank, the path and what was expected. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
seldp_status
seldp__fail(seldp_status status, const char *fmt, ...);

/* Set the calling thread's last error to `message` verbatim (used to make every rank
 * report the message of the rank that failed first). */
void seldp__set_error(const char *message);

/* Evaluate a seldp call; on failure store its status in `st` and jump to `fail`. */
#define SELDP_CHECK(call)                                                                          \
    do {                                                                                           \
        seldp_status check_status_ = (call);                                                       \
        if (check_status_ != SELDP_OK) {                                                           \
            st = check_status_;                                                                    \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Jump to `fail` with `st` set to the result of seldp__fail(...). */
#define SELDP_FAIL(...)                                                                            \
    do {                                                                                           \
        st = seldp__fail(__VA_ARGS__);                                                             \
        goto fail;                                                                                 \
    } while (0)

#endif
