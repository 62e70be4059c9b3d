/* The interface every transport fills in: a table of function pointers.
 *
 * src/comm/comm.c implements the public seldp_comm_* calls: it validates the
 * arguments, counts the call in the stats and dispatches to the transport's table.
 * A transport (host.c, nccl.c, mpi.c) allocates a seldp_comm, sets `ops` and its
 * own `impl`, and never sees invalid arguments. */
#ifndef SELDP_COMM_IMPL_H
#define SELDP_COMM_IMPL_H

#include "seldp/comm.h"

typedef struct seldp_comm_ops {
    const char *name; /* "host", "nccl", "mpi" */
    seldp_status (*barrier)(seldp_comm *comm);
    seldp_status (*broadcast)(seldp_comm *comm, void *buf, size_t bytes, int root,
                              seldp_device mem);
    seldp_status (*allreduce)(seldp_comm *comm, const void *send, void *recv, size_t count,
                              seldp_dtype dtype, seldp_device mem);
    seldp_status (*allgather)(seldp_comm *comm, const void *send, void *recv, size_t bytes,
                              seldp_device mem);
    seldp_status (*allgatherv)(seldp_comm *comm, const void *send, size_t send_bytes,
                               void **recv, size_t *recv_bytes);
    /* counts and displacements in bytes */
    seldp_status (*alltoallv)(seldp_comm *comm, const void *send, const size_t *send_bytes,
                              const size_t *send_displs, void *recv, const size_t *recv_bytes,
                              const size_t *recv_displs, seldp_device mem);
    seldp_status (*split)(seldp_comm *comm, int color, int key, seldp_comm **out);
    void (*abort)(seldp_comm *comm);
    void (*destroy)(seldp_comm *comm);
} seldp_comm_ops;

struct seldp_comm {
    const seldp_comm_ops *ops;
    int rank;       /* within the group */
    int size;       /* of the group */
    int world_rank; /* within the world the group was split from */
    seldp_device device;
    seldp_comm_stats stats;
    void *impl; /* the transport's state */
};

/* Allocate a communicator with the common fields set; the transport fills impl.
 * Returns NULL when out of memory. Freed by seldp__comm_free. */
seldp_comm *seldp__comm_new(const seldp_comm_ops *ops, int rank, int size, int world_rank,
                            seldp_device device, void *impl);
void seldp__comm_free(seldp_comm *comm);

#endif
