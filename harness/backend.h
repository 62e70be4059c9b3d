/* The one place where the harness chooses and starts a transport.
 *
 * The harness runs one pthread per rank in one process. A backend gives it a world: created
 * once by the main thread (hx_backend_open), joined by every rank thread
 * (hx_backend_join), which also says which device the rank computes on. Today only the
 * host-staged transport runs simulated ranks; `nccl` and `mpi` are accepted on the command
 * line and refused here with a clear message until the harness drives them. A new
 * transport plugs in by filling in the three functions below for its kind. */
#ifndef HX_BACKEND_H
#define HX_BACKEND_H

#include <stdbool.h>

#include "seldp/comm.h"
#include "seldp/status.h"

typedef enum hx_backend_kind {
    HX_BACKEND_AUTO = 0,
    HX_BACKEND_HOST = 1,
    HX_BACKEND_NCCL = 2,
    HX_BACKEND_MPI = 3
} hx_backend_kind;

/* "auto", "host", "nccl", "mpi". */
const char *hx_backend_name(hx_backend_kind kind);

/* Parse a backend name; false when unknown. */
bool hx_backend_parse(const char *name, hx_backend_kind *out);

typedef struct hx_backend hx_backend;

/* Resolve `kind` (auto picks what can run `world` ranks here) and create the world.
 * SELDP_ERR_UNSUPPORTED with a one-line reason when the backend cannot run in this build or
 * on this machine. */
seldp_status hx_backend_open(hx_backend_kind kind, int world, double timeout_s, hx_backend **out);

/* The transport actually used ("host"...). */
const char *hx_backend_transport(const hx_backend *backend);

/* Device name of rank r ("host", "cuda:0"), for the layout table. */
const char *hx_backend_device_name(const hx_backend *backend, int rank);

/* Collective over the world, from rank r's thread: join it. *comm is the rank's world
 * communicator, the caller's to destroy before hx_backend_close. */
seldp_status hx_backend_join(hx_backend *backend, int rank, seldp_comm **comm);

/* Release the world after every rank's communicators are destroyed. NULL is a no-op. */
void hx_backend_close(hx_backend *backend);

#endif
