/* The harness side of tiny-moe's routing extensions (docs/model.md: the shared expert; Routing
 * extensions: router losses and capacity): which runs can honour them, the global load-balancing
 * statistics combined over the data shards in the forward, and each rank's share of the router
 * losses. In this harness every rank is one data shard. */
#ifndef HX_ROUTER_H
#define HX_ROUTER_H

#include <stdbool.h>

#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* True when the model config enables any routing extension. */
bool hx_router_enabled(const tm_config *cfg);

/* Refuse what the run cannot honour: a routing extension on a rank that computes on a GPU
 * (the CUDA model has none of them). SELDP_ERR_UNSUPPORTED with a one-line reason naming the
 * option and the rank; a usage error of hx_run_create. */
seldp_status hx_router_check(const hx_run *run);

/* The same for one rank computing on `device` (named `name` in the message). */
seldp_status hx_router_check_device(const tm_config *cfg, int rank, seldp_device device,
                                    const char *name);

/* After rank rk routed layer l: with the load-balancing loss in global scope, the assignment
 * counts and token counts of every data shard summed over the shared group (an allreduce, so
 * every member calls it for every layer) and handed to the model. A no-op otherwise. */
seldp_status hx_router_balance(hx_rank *rk, int l);

/* When a data shard spans several ranks (rk->shard_comm): layer l's capacity over the shard
 * (tm_route_set_shard, the shard's earlier ranks' assignments counted first) and, with the
 * local scope, the load-balancing statistics of the shard. Collective over the shard. */
seldp_status hx_router_shard(hx_rank *rk, int l);

/* Rank rk's share of this step's router losses in the loss-sum convention (0 when off). */
double hx_router_loss_sum(const hx_rank *rk);

/* One line for the run header ("" when every extension is off). */
void hx_router_describe(const tm_config *cfg, char *buf, size_t size);

#endif
