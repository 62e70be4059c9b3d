/** @file
 * Library version and the transports compiled in. */
#ifndef SELDP_VERSION_H
#define SELDP_VERSION_H

#include "seldp/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** "MAJOR.MINOR.PATCH (transports: host nccl mpi; cuda)" for the library actually loaded. */
SELDP_API const char *seldp_version(void);

/** Non-zero when the transport ("host", "nccl", "mpi") or "cuda" was compiled in. */
SELDP_API int seldp_has_feature(const char *name);

#ifdef __cplusplus
}
#endif
#endif
