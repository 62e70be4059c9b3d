/* Rank threads: one thread per rank, a barrier between them, the first failure with its
 * message, an abort of the world when a rank fails, and a join of every thread. Shared by the
 * test helpers (tests/common/ranks.c, tests/gpu/gpu_ranks.c) and seldp-bench (bench/team.c);
 * library target seldp_runner, which links no seldp library: the program brings its own.
 *
 * A rank that fails calls hx_runner_fail (or returns non-zero from its function): the first
 * failure, in time, keeps its message; the rank's communicator, once it has set r->comm, is
 * aborted so that the other ranks return from their collectives at once (SELDP_ERR_ABORTED)
 * instead of at their timeout, and every barrier after it returns false. */
#ifndef HX_RUNNER_H
#define HX_RUNNER_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/comm.h"

typedef struct hx_runner hx_runner;

/* One rank thread's view. */
typedef struct hx_runner_rank {
    hx_runner *runner;
    int rank;
    int size;
    void *arg;        /* as given to hx_runner_run, shared by every rank */
    seldp_comm *comm; /* the rank's communicator while it has one (NULL it before destroying
                         the communicator): a failure aborts it */
} hx_runner_rank;

/* One rank's work: 0, or non-zero after (or instead of) hx_runner_fail. */
typedef int (*hx_runner_fn)(hx_runner_rank *r);

/* How the ranks went. */
typedef struct hx_runner_report {
    int failed;     /* ranks that failed or could not start */
    int first;      /* the rank that failed first; -1 when none */
    char why[1024]; /* its message ("" when none) */
} hx_runner_report;

/* Run fn on `size` threads and join every one that started; `report` (may be NULL) says
 * how they went. Returns the number of failed ranks. When a thread cannot be created, no
 * further rank starts and the started ones see the failure at their next barrier. */
int hx_runner_run(int size, hx_runner_fn fn, void *arg, hx_runner_report *report);

/* Record rank r's failure (printf-style; kept when it is the first), abort r->comm when set,
 * release the barriers, and return 1 for the rank function to return. */
int hx_runner_fail(hx_runner_rank *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Wait for every rank; false when a rank has failed, in which case the caller returns at
 * once. Spins a little, then yields: ranks may outnumber the cores. */
bool hx_runner_barrier(hx_runner_rank *r);

/* True when some rank has failed. */
bool hx_runner_failed(const hx_runner_rank *r);

#endif
