/* The environment table (env.h, docs/environment.md). */
#define _POSIX_C_SOURCE 200809L

#include "env.h"

#include <stdlib.h>
#include <string.h>

static const char *const reduce_paths[] = {"fused", "bucketed", "auto", NULL};
static const char *const simd_caps[] = {"128", "256", NULL};
static const char *const bench_copies[] = {"sse2", "avx2", NULL};

const seldp__env_var seldp__env_vars[SELDP__ENV_COUNT] = {
    [SELDP__ENV_REDUCE_PATH] = {.name = "SELDP_REDUCE_PATH",
                                .kind = SELDP__ENV_CHOICE,
                                .choices = reduce_paths,
                                .read_by = "src/session.c"},
    [SELDP__ENV_DEBUG_COLLECTIVES] = {.name = "SELDP_DEBUG_COLLECTIVES",
                                      .kind = SELDP__ENV_FLAG,
                                      .flag_default = false,
                                      .read_by = "src/comm/comm.c"},
    [SELDP__ENV_MPI_MAX_MESSAGE] = {.name = "SELDP_MPI_MAX_MESSAGE",
                                    .kind = SELDP__ENV_NUMBER,
                                    .min = 1,
                                    .max = 1ull << 30,
                                    .read_by = "src/comm/mpi/mpi.c"},
    [SELDP__ENV_HOST_SIMD] = {.name = "SELDP_HOST_SIMD",
                              .kind = SELDP__ENV_CHOICE,
                              .choices = simd_caps,
                              .read_by = "src/simd/host_sum.c"},
    [SELDP__ENV_BENCH_COPY] = {.name = "SELDP_BENCH_COPY",
                               .kind = SELDP__ENV_CHOICE,
                               .choices = bench_copies,
                               .read_by = "harness/bench/copy.c"},
    [SELDP__ENV_BENCH_PIN] = {.name = "SELDP_BENCH_PIN",
                              .kind = SELDP__ENV_FLAG,
                              .flag_default = true,
                              .read_by = "harness/bench/team.c"},
    [SELDP__ENV_OPENBLAS_CORETYPE] = {.name = "OPENBLAS_CORETYPE",
                                      .kind = SELDP__ENV_PRESENT,
                                      .read_by = "models/startup/blas_core.c"},
    [SELDP__ENV_LD_PRELOAD] = {.name = "LD_PRELOAD",
                               .kind = SELDP__ENV_PRESENT,
                               .read_by = "models/startup/blas_core.c"},
    [SELDP__ENV_OMPI_COMM_WORLD_SIZE] = {.name = "OMPI_COMM_WORLD_SIZE",
                                         .kind = SELDP__ENV_PRESENT,
                                         .read_by = "harness/core/backend.c"},
    [SELDP__ENV_PMIX_RANK] = {.name = "PMIX_RANK",
                              .kind = SELDP__ENV_PRESENT,
                              .read_by = "harness/core/backend.c"},
    [SELDP__ENV_PMI_SIZE] = {.name = "PMI_SIZE",
                             .kind = SELDP__ENV_PRESENT,
                             .read_by = "harness/core/backend.c"},
};

const char *seldp__env_text(seldp__env_id id)
{
    if ((unsigned)id >= SELDP__ENV_COUNT)
        return NULL;
    const char *v = getenv(seldp__env_vars[id].name);
    return v && *v ? v : NULL;
}

int seldp__env_choice(seldp__env_id id)
{
    const char *v = seldp__env_text(id);
    if (!v)
        return -1;
    const char *const *names = seldp__env_vars[id].choices;
    for (int i = 0; names && names[i]; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    return -2;
}

bool seldp__env_flag(seldp__env_id id)
{
    const char *v = seldp__env_text(id);
    if (!v)
        return (unsigned)id < SELDP__ENV_COUNT && seldp__env_vars[id].flag_default;
    return strcmp(v, "0") != 0;
}

bool seldp__env_number(seldp__env_id id, unsigned long long *out)
{
    const char *v = seldp__env_text(id);
    if (!v || *v < '0' || *v > '9')
        return false; /* strtoull would take a sign or spaces */
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    const seldp__env_var *row = &seldp__env_vars[id];
    if (*end || n < row->min || n > row->max)
        return false;
    *out = n;
    return true;
}

bool seldp__env_present(seldp__env_id id)
{
    return seldp__env_text(id) != NULL;
}
