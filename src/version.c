/* The library's version and the transports it was compiled with, as the build recorded them.
 * The answer describes the shared object actually loaded, which may differ from the headers a
 * program was compiled against. */
#include <string.h>

#include "seldp/version.h"

#ifndef SELDP_VERSION_STRING
#error "SELDP_VERSION_STRING must be defined by the build (the project version)"
#endif

#if defined(SELDP_HAVE_NCCL)
#define VERSION_NCCL " nccl"
#else
#define VERSION_NCCL ""
#endif
#if defined(SELDP_HAVE_MPI)
#define VERSION_MPI " mpi"
#else
#define VERSION_MPI ""
#endif
#if defined(SELDP_HAVE_CUDA)
#define VERSION_CUDA "; cuda"
#else
#define VERSION_CUDA ""
#endif

const char *seldp_version(void)
{
    return SELDP_VERSION_STRING " (transports: host" VERSION_NCCL VERSION_MPI VERSION_CUDA ")";
}

int seldp_has_feature(const char *name)
{
    if (name == NULL)
        return 0;
    if (strcmp(name, "host") == 0)
        return 1;
#if defined(SELDP_HAVE_NCCL)
    if (strcmp(name, "nccl") == 0)
        return 1;
#endif
#if defined(SELDP_HAVE_MPI)
    if (strcmp(name, "mpi") == 0)
        return 1;
#endif
#if defined(SELDP_HAVE_CUDA)
    if (strcmp(name, "cuda") == 0)
        return 1;
#endif
    return 0;
}
