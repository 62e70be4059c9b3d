/* One rank per MPI process (gather.c): rank 0's mirrors of the other processes' ranks. */
#ifndef HX_GATHER_H
#define HX_GATHER_H

#include <stdint.h>

#include "seldp/status.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* Ranks in several processes (gather.c), each collective over the world, called by every
 * rank `rk` this process runs, from its thread: rank 0 receives the parameters (before and
 * after initialize) of the ranks of the other processes, then after each step their
 * tokens, parameters, reduced gradients and rank-local results, into mirrors in
 * run->ranks. */
seldp_status hx_gather_init(hx_run *run, hx_rank *rk);
seldp_status hx_gather_step(hx_run *run, hx_rank *rk);
/* The same for the inputs each process passed to its reductions (capture.h), merged on
 * rank 0. */
seldp_status hx_gather_capture(hx_run *run, hx_rank *rk);
/* The post-step check's result of every rank (rk->update_check) on rank 0. */
seldp_status hx_gather_update(hx_run *run, hx_rank *rk);

/* Collective over the world: every process says how its part of a phase went (`mine`,
 * with hx_last_error when it failed); rank 0 also its failed checks (`failures`), which
 * every process stores in run->root_failures. Returns SELDP_OK when every process
 * succeeded, else the status of the lowest failing rank with its message. */
seldp_status hx_gather_verdict(hx_run *run, hx_rank *rk, seldp_status mine, int64_t failures);

#endif
