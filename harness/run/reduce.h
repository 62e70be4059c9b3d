/* A rank's reductions of a step (reduce.c): one session's reduce with its checks, the export of
 * gradients with their sets' scales, the zeros a rank owes under the error policy, and
 * --inject's defects after the reductions. */
#ifndef HX_REDUCE_H
#define HX_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

typedef struct hx_rank hx_rank;

typedef enum hx_reduce_kind { HX_REDUCE_MEAN, HX_REDUCE_SUM } hx_reduce_kind;
/* One reduction of `grads` by session s (`label` names its group in messages), with the
 * check that gradients outside its selection come back as they were and that no parameter
 * moved (reduce.c). */
seldp_status hx_reduce_session(hx_rank *rk, seldp_session *s, const char *label,
                               hx_reduce_kind kind, uint64_t weight, seldp_grads *grads,
                               uint64_t *global_weight);
/* The finish of session s's overlapped reduction (started by overlap.c), with the checks of
 * hx_reduce_session; `params_before` is the parameters' checksum when it started. */
seldp_status hx_finish_session(hx_rank *rk, seldp_session *s, const char *label,
                               hx_reduce_kind kind, seldp_grads *grads, uint64_t params_before,
                               uint64_t *global_weight);
/* One checksum over every parameter's bytes where rank rk computes. */
seldp_status hx_params_checksum(const hx_rank *rk, uint64_t *sum);
/* Under the error policy: whether rank rk owes its set a zero gradient of p (an expert
 * parameter that rows reached elsewhere but not here), and putting it into grads when absent. */
bool hx_zero_owed(const hx_rank *rk, const tm_param_info *p);
seldp_status hx_zero_grad(hx_rank *rk, const tm_param_info *p, seldp_grads *grads);
/* Export the gradient of occurrence i (tm_param_at) into grads with the scale of its set, and
 * under the error policy the zeros it owes; nothing for a parameter no set reduces. */
seldp_status hx_export_grad(hx_rank *rk, size_t i, seldp_grads *grads);
/* Empty gradient containers of the step (rk->grads, and rk->device_grads on a GPU). */
seldp_status hx_reset_grads(hx_rank *rk);

seldp_status hx_plant_fault(hx_rank *rk);

#endif
