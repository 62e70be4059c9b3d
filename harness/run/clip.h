/* --clip-grad: the global gradient norm (docs/library.md, Global gradient norm) in a training step.
 *
 * After the reductions every rank asks the library for the norm of the logical gradient over
 * its sessions (the shared group and its expert-data groups, each replica set counted once);
 * the main thread checks it against the norm of the FP64 reference's gradients; before the
 * update every rank clips by it, so that the SGD step uses the clipped gradients. */
#ifndef HX_CLIP_H
#define HX_CLIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* Collective over the world, after the reductions: seldp_grad_norm of `grads` (the
 * container the sessions reduced) into rk->grad_norm. */
seldp_status hx_clip_norm(hx_rank *rk, seldp_grads *grads);

/* Main thread, after the reference: the ranks' norm against the reference's (relative error
 * within the run's tolerance), and the same bits on every rank this process holds. */
void hx_clip_check(hx_run *run, int step, const tm_reference *ref);

/* Collective over the world, before the update: seldp_clip_grad_norm to opts.clip_grad over
 * the gradients the sessions reduced; on a GPU the host copies the update reads are
 * refreshed from the clipped device gradients. *skip: the norm is not finite, so every rank
 * skips this update (the found-inf of loss scaling) and nothing was clipped. */
seldp_status hx_clip_apply(hx_rank *rk, bool *skip);

#endif
