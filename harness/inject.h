/* Planted framework bugs (--inject, docs/harness.md, Planted bugs and Sweeps): the reduction
 * mistakes real frameworks shipped, planted where a framework makes them (the scale of the exported
 * gradients, the weights of the reductions, a second reduction), and the diagnosis that names them
 * from the gradients and the FP64 reference. */
#ifndef HX_INJECT_H
#define HX_INJECT_H

#include <stdbool.h>

#include "run.h"

/* True for the faults that are framework bugs (ep-scale, rank-mean, world-div, tied-twice,
 * local-aux). */
bool hx_inject_is_framework_bug(hx_fault fault);

/* Whether --inject can show on the run's layout: a fault whose effect is nil there (ep-scale
 * at EP size 1, rank-mean with equal token counts, ...) is refused, SELDP_ERR_INVALID_ARGUMENT
 * with one line naming what it needs, never run to a pass. */
seldp_status hx_inject_check(const hx_run *run);

/* One line: what the planted bug does, for the run's header. */
const char *hx_inject_describe(hx_fault fault);

/* Where the bugs are planted: the factor rank rk applies, on top of its set's own scale, to
 * the gradients it exports for set s, and the weight it reduces s with in place of `weight`
 * (1 and `weight` without a planted bug). */
double hx_inject_scale(const hx_rank *rk, const hx_set *s);
uint64_t hx_inject_weight(const hx_rank *rk, const hx_set *s, uint64_t weight);

/* After the reductions (rk->grads on the host): --inject tied-twice reduces the tied
 * embedding's gradient a second time, summed over the shared group as an embedding group
 * does. Collective over the shared group; a no-op for the other faults. */
seldp_status hx_inject_after_reduce(hx_rank *rk);

#endif
