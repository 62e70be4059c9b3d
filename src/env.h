/* Every environment variable seldp's C code reads, in one table (docs/environment.md): the
 * library's knobs, the programs' and the launchers' variables that say a process runs under
 * mpirun. Nothing else in src/, harness/ or models/ calls getenv (unit_env_table checks).
 * Each variable is read through the reader of its kind; an unset and an empty variable are
 * the same: the default. */
#ifndef SELDP_ENV_H
#define SELDP_ENV_H

#include <stdbool.h>

typedef enum seldp__env_id {
    /* the library */
    SELDP__ENV_REDUCE_PATH,       /* session.c: fused, bucketed or auto */
    SELDP__ENV_DEBUG_COLLECTIVES, /* comm.c: the collectives' call agreement */
    SELDP__ENV_MPI_MAX_MESSAGE,   /* comm/mpi/mpi.c: the bound on one MPI message */
    SELDP__ENV_HOST_SIMD,         /* simd/host_sum.c: a cap on the host kernels' width */
    /* the programs */
    SELDP__ENV_BENCH_COPY, /* harness/bench/copy.c: the streaming copy of the bound */
    SELDP__ENV_BENCH_PIN,  /* harness/bench/team.c: rank threads pinned to cores */
    /* OpenBLAS's and valgrind's (models/startup/blas_core.c: OpenBLAS's kernels) */
    SELDP__ENV_OPENBLAS_CORETYPE,
    SELDP__ENV_LD_PRELOAD,
    /* the launchers (harness/core/backend.c: one rank per process under mpirun) */
    SELDP__ENV_OMPI_COMM_WORLD_SIZE,
    SELDP__ENV_PMIX_RANK,
    SELDP__ENV_PMI_SIZE,
    SELDP__ENV_COUNT
} seldp__env_id;

typedef enum seldp__env_kind {
    SELDP__ENV_CHOICE,  /* one of the row's names; another value is the reader's to refuse */
    SELDP__ENV_FLAG,    /* "0" off, any other value on; unset: the row's default */
    SELDP__ENV_NUMBER,  /* a decimal count in [min, max]; another value is ignored */
    SELDP__ENV_PRESENT, /* set by someone else: only whether it is */
} seldp__env_kind;

typedef struct seldp__env_var {
    const char *name;
    seldp__env_kind kind;
    const char *const *choices;  /* CHOICE: the names, NULL-terminated */
    bool flag_default;           /* FLAG: unset */
    unsigned long long min, max; /* NUMBER */
    const char *read_by;         /* the file that reads it */
} seldp__env_var;

/* The table, indexed by seldp__env_id. */
extern const seldp__env_var seldp__env_vars[SELDP__ENV_COUNT];

/* The value, or NULL when unset or empty. */
const char *seldp__env_text(seldp__env_id id);

/* CHOICE: the index of the value in the row's names; -1 unset or empty; -2 another value
 * (seldp__env_text shows it). */
int seldp__env_choice(seldp__env_id id);

/* FLAG: on or off. */
bool seldp__env_flag(seldp__env_id id);

/* NUMBER: true with the value in *out when it is a decimal count in the row's range; false
 * when unset, empty or anything else (*out untouched). */
bool seldp__env_number(seldp__env_id id, unsigned long long *out);

/* PRESENT: set and not empty. */
bool seldp__env_present(seldp__env_id id);

#endif
