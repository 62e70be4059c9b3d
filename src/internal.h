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

/* Read a caller's config struct into *out, which holds the defaults. Every public config
 * struct starts with `size_t struct_size`, the size of the struct as the caller's header
 * declared it (its SELDP_*_CONFIG_INIT sets it), so the struct can grow at the end without
 * breaking programs built against an older header: the fields the caller knew are copied,
 * newer fields keep their defaults; a caller built against a newer header may pass a larger
 * struct whose unknown tail is all zero. cfg NULL: the defaults. `known` is sizeof *out.
 * Errors (SELDP_ERR_INVALID_ARGUMENT, naming `call`, `type` and `init`): a struct_size below
 * the first field's end (a struct not started from `init`), or non-zero bytes past what this
 * library knows. On return out->struct_size is `known`. */
seldp_status seldp__config_read(void *out, size_t known, const void *cfg, const char *call,
                                const char *type, const char *init);

#endif
