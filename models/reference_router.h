/* The FP64 reference's routing extensions (reference_router.c), for reference.c only: the
 * FP32 model's files never include this, so the two stay independent. */
#ifndef TM_REFERENCE_ROUTER_H
#define TM_REFERENCE_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "tinymoe.h"

/* Capacity dropping of one layer: sel (N,K) the top-K of every token, the tokens of shard r
 * being [shard_begin[r], shard_begin[r+1]); kept (N,K) out: 1 where expert sel[s] keeps the
 * assignment (every slot without a capacity factor), 0 where it is dropped. taken (E) is
 * work. */
void tm__ref_capacity(const tm_config *cfg, const int *sel, const size_t *shard_begin, int n_shards,
                      double *taken, unsigned char *kept);

/* The router losses of one layer over N = shard_begin[n_shards] tokens: returns their value in
 * the global objective and writes their gradient with respect to the logits (N,E) into
 * dlogits (N,E). sel (N,K) as routed (before dropping). work holds N*E + 2*E doubles. */
double tm__ref_router_losses(const tm_config *cfg, const double *logits, const int *sel,
                             const size_t *shard_begin, int n_shards, double *work,
                             double *dlogits);

/* Relative logit gap under which the reference's FP64 top-K and the FP32 model's may
 * disagree for rounding alone: a gap below REF_TIE_TOL * (1 + max_e |z_e|). */
#define REF_TIE_TOL 1e-4

/* A near tie of one token (z (E) its FP64 router logits, sel (K) the reference's top-K): when
 * `choice` (K), the experts the FP32 model chose, is a different set that is still a top-K
 * within REF_TIE_TOL (each chosen logit at least the largest unchosen one minus the
 * tolerance, or whose FP32 probabilities, which the model ranks, are equal within it: far
 * below the largest logit they underflow and tie), sel becomes that set in decreasing logit
 * order and true is returned; otherwise
 * sel is kept (a real routing difference stays visible to the checks). */
bool tm__ref_follow_tie(const double *z, int E, int K, const int *choice, int *sel);

#endif
