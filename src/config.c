/* Config structs that grow at the end (see seldp__config_read in internal.h). */
#include <stdint.h>
#include <string.h>

#include "internal.h"

seldp_status seldp__config_read(void *out, size_t known, const void *cfg, const char *call,
                                const char *type, const char *init)
{
    if (!cfg) {
        memcpy(out, &known, sizeof known);
        return SELDP_OK;
    }
    size_t given;
    memcpy(&given, cfg, sizeof given);
    /* the smallest struct any header declared: the size field and one setting */
    if (given <= sizeof(size_t))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: %s.struct_size is %zu, expected sizeof(%s) (%zu in this "
                           "library): start the struct from %s",
                           call, type, given, type, known, init);
    const unsigned char *tail = (const unsigned char *)cfg + known;
    for (size_t i = 0; given > known && i < given - known; i++)
        if (tail[i] != 0)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: %s of %zu bytes sets byte %zu, past the %zu bytes this "
                               "library knows: a setting from a newer seldp header that this "
                               "library cannot honour",
                               call, type, given, known + i, known);
    memcpy(out, cfg, given < known ? given : known);
    memcpy(out, &known, sizeof known);
    return SELDP_OK;
}
