/* cuBLAS loaded on first use (tmc_cublas.h). */
#define _POSIX_C_SOURCE 200809L

#include "cuda/tmc_cublas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#ifndef TMC_CUBLAS_SONAME
#define TMC_CUBLAS_SONAME "libcublas.so"
#endif

static pthread_once_t loaded = PTHREAD_ONCE_INIT;
static tmc_cublas api;
static bool usable;
static char failure[512];

/* dlsym's object pointer as a function pointer (POSIX guarantees the conversion). */
#define LOOKUP(field, symbol)                                                                      \
    do {                                                                                           \
        void *sym_ = dlsym(lib, symbol);                                                           \
        if (!sym_) {                                                                               \
            snprintf(failure, sizeof failure, "%s has no %s", TMC_CUBLAS_SONAME, symbol);          \
            return;                                                                                \
        }                                                                                          \
        memcpy(&api.field, &sym_, sizeof sym_);                                                    \
    } while (0)

static void load(void)
{
    /* RTLD_LOCAL: its symbols stay out of the global namespace, as a linked library's would
     * not; it stays loaded for the life of the process (handles outlive any one model). */
    void *lib = dlopen(TMC_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(failure, sizeof failure, "cannot load %s: %s", TMC_CUBLAS_SONAME,
                 e ? e : "unknown error");
        return;
    }
    LOOKUP(create, "cublasCreate_v2");
    LOOKUP(destroy, "cublasDestroy_v2");
    LOOKUP(set_stream, "cublasSetStream_v2");
    LOOKUP(set_math_mode, "cublasSetMathMode");
    LOOKUP(sgemm, "cublasSgemm_v2");
    LOOKUP(status_string, "cublasGetStatusString");
    usable = true;
}

const tmc_cublas *tmc_cublas_api(const char **why)
{
    pthread_once(&loaded, load);
    if (why)
        *why = usable ? NULL : failure;
    return usable ? &api : NULL;
}
