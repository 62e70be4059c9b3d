/** @file
 * The host-staged transport: N in-process ranks, one pthread each.
 *
 * The main thread creates a world; each rank thread then joins it with
 * seldp_host_comm_init (collective over the world, like ncclCommInitRank). Ranks
 * share memory; device tensors are staged through pinned host memory. */
#ifndef SELDP_HOST_H
#define SELDP_HOST_H

#include "seldp/export.h"
#include "seldp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The shared state of an in-process world of host-staged ranks (opaque). */
typedef struct seldp_host_world seldp_host_world;

/** Create a world of `nranks` >= 1 ranks. cfg may be NULL for the defaults. */
SELDP_API seldp_status seldp_host_world_create(int nranks, const seldp_comm_config *cfg,
                                               seldp_host_world **out);

/** Join the world as `rank` computing on `device` (collective: every rank joins). The
 * returned communicator is the caller's to destroy. */
SELDP_API seldp_status seldp_host_comm_init(seldp_host_world *world, int rank, seldp_device device,
                                            seldp_comm **out);

/** Free the world once every rank's communicators are destroyed. NULL is a no-op. */
SELDP_API void seldp_host_world_destroy(seldp_host_world *world);

#ifdef __cplusplus
}
#endif
#endif
