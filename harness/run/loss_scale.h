/* Loss scaling for F16 (docs/harness.md, Loss scaling): --loss-scale dynamic|X.
 *
 * The loss is scaled by S before the half gradients are made: every exported gradient carries S
 * (so a half gradient over 65504 overflows to inf, as in an F16 backward, and a small one stays
 * above the subnormals). After the reductions every rank looks for a non-finite value in its
 * reduced gradients (under --zero 1 in its ranges) and the world agrees on one found_inf (an
 * allreduce over every rank, every group's gradients together): on an overflow every rank skips the
 * update; otherwise the update unscales its gradients by 1/S (before --clip-grad's clipping, which
 * clips at S times the norm). Dynamic scaling starts at S = --loss-scale-init (1024), halves S on
 * an overflow (not below 1) and doubles it after --loss-scale-window steps without one; a fixed X
 * never changes. The main thread unscales the reduced gradients it checks, leaves out of the checks
 * the tensors an overflow made non-finite, and the post-step check requires the skip on every rank.
 * --inject-overflow STEP plants an inf in one exported gradient of the last rank in that step. */
#ifndef HX_LOSS_SCALE_H
#define HX_LOSS_SCALE_H

#include <stdbool.h>

#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* --loss-scale against the ranks' devices (a usage error, one line): host ranks. Against the
 * dtype, the steps and --inject-overflow: options_check.c. */
seldp_status hx_loss_scale_check(const hx_run *run);

/* Every rank's initial scale (1 without --loss-scale): with --loss-scale and `saved` (the
 * state a --resume checkpoint holds, NULL: none) the saved scale and its count of good
 * steps `good`. */
void hx_loss_scale_init(hx_run *run, const double *saved, int64_t good);

/* The factor every exported gradient of rank rk carries this step: S. */
double hx_loss_scale_factor(const hx_rank *rk);

/* --inject-overflow: after the export of occurrence i into `grads` on the last rank in the
 * planted step, the first element of the gradient of the first reached expert's first
 * parameter in the model's order (whatever the order of the exports) becomes inf. */
void hx_loss_scale_plant(hx_rank *rk, size_t i, seldp_grads *grads);

/* Collective over the world, before the update: whether any rank's reduced gradients hold a
 * non-finite value, one decision for every rank and every group (rk->found_inf). */
seldp_status hx_loss_scale_found_inf(hx_rank *rk);

/* The same from what rank rk found itself (mine[0]: a non-finite dense gradient, mine[1]: an
 * expert one), e.g. in its ranges under --zero 1: agreed over the world in one allreduce.
 * Without --loss-scale no collective, and no overflow. */
seldp_status hx_loss_scale_agree(hx_rank *rk, const int64_t mine[2]);

/* Whether the update of parameter p skips this step (the world's found_inf). */
bool hx_loss_scale_skips(const hx_rank *rk, const tm_param_info *p);

/* After the update: the scale's backoff or growth. */
void hx_loss_scale_update(hx_rank *rk);

/* The main thread, before the step's checks: the scale the step used (run->loss_scale) and
 * whether the world overflowed (run->overflow) from every rank's reduced gradients; prints the
 * skip. */
void hx_loss_scale_step(hx_run *run, int step);

#endif
