/* The one place where the harness chooses and starts a transport, and where ranks run.
 *
 * Ranks run either as threads of this process (the host-staged and NCCL transports: one
 * world created by the main thread, joined by every rank thread) or one per MPI process
 * (mpirun: the MPI transport, or NCCL bootstrapped over MPI), in which case this process
 * holds one rank and rank 0's process does the checks and writes the reports.
 *
 * Transports and devices (docs/library.md, Communicators and transports; docs/harness.md):
 *   host  host-staged, every rank in this process; rank r on cuda:(r % GPUs) when this
 *         process sees GPUs, else on the host.
 *   nccl  one GPU per rank: rank r on cuda:r in this process; under mpirun, one process
 *         per rank on cuda:(rank within its node % GPUs it sees) -- cuda:0 when the
 *         launcher gives each process its own CUDA_VISIBLE_DEVICES, as SLURM does -- the
 *         NCCL id broadcast over MPI; two ranks on one GPU are refused by NCCL itself.
 *   mpi   one process per rank (mpirun); on cuda:(rank within its node % GPUs it sees)
 *         when it sees GPUs, else on the host.
 *   auto  under mpirun: nccl when the processes of every node use pairwise different GPUs
 *         (compared by PCI bus id), else mpi. Otherwise nccl when every rank has a GPU of
 *         its own, else host.
 *   hybrid  --ranks-per-process N under mpirun: every process hosts N rank threads of one
 *         world (seldp/hybrid.h: host-staged inside a process, MPI between processes),
 *         ranks p*N .. p*N+N-1 in process p, on the host; MPI at MPI_THREAD_MULTIPLE.
 * mpirun is recognized by the variables it sets (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE).
 * When the harness initializes MPI itself it asks for MPI_THREAD_FUNNELED and sets
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD; hx_backend_finalize ends it. */
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

/* True when this process was started by mpirun. */
bool hx_backend_under_mpirun(void);

/* True when `kind` runs one rank per MPI process: mpi, or auto and nccl under mpirun. */
bool hx_backend_uses_processes(hx_backend_kind kind);

/* For a launch with one rank per process: start MPI unless this process already has, and
 * return the number of processes and this process's rank. SELDP_ERR_UNSUPPORTED with a
 * one-line reason in a build without MPI. */
seldp_status hx_backend_processes(int *count, int *rank);

/* --ranks-per-process N (0: off), before hx_backend_processes and hx_backend_open: under
 * mpirun the world is processes x N rank threads on the hybrid transport. */
void hx_backend_request_hybrid(int ranks_per_process);

/* End MPI when the harness started it (and nothing else has ended it). The program calls
 * this last; a no-op otherwise. */
void hx_backend_finalize(void);

typedef struct hx_backend hx_backend;

/* Resolve `kind` and prepare a world of `world` ranks: create the in-process world, or,
 * with one rank per process, agree on the transport and learn every rank's device (a
 * collective over MPI_COMM_WORLD, whose size must be `world`). SELDP_ERR_UNSUPPORTED with a
 * one-line reason when the backend cannot run in this build or on this machine. */
seldp_status hx_backend_open(hx_backend_kind kind, int world, double timeout_s, hx_backend **out);

/* The transport actually used: "host", "nccl", "mpi" or "hybrid". */
const char *hx_backend_transport(const hx_backend *backend);

/* True for --ranks-per-process under mpirun (several rank threads in each process). */
bool hx_backend_hybrid(const hx_backend *backend);

/* The ranks this process runs: local_count of them from local_first (every rank in-process;
 * one with one rank per process). */
int hx_backend_local_first(const hx_backend *backend);
int hx_backend_local_count(const hx_backend *backend);

/* The MPI process that runs rank r (0 in-process), for the layout table. */
int hx_backend_process_of(const hx_backend *backend, int rank);

/* True when ranks run in several MPI processes (one each, or N with the hybrid transport). */
bool hx_backend_multiprocess(const hx_backend *backend);

/* The rank this process holds in a multi-process world; -1 when every rank runs here. */
int hx_backend_process_rank(const hx_backend *backend);

/* True when rank r runs in this process. */
bool hx_backend_is_local(const hx_backend *backend, int rank);

/* The device rank r computes on. */
seldp_device hx_backend_device(const hx_backend *backend, int rank);

/* Device name of rank r ("host", "cuda:0"), for the layout table. */
const char *hx_backend_device_name(const hx_backend *backend, int rank);

/* Collective over the world, from the thread of local rank r (its CUDA device selected):
 * join it. *comm is the rank's world communicator, the caller's to destroy before
 * hx_backend_close. */
seldp_status hx_backend_join(hx_backend *backend, int rank, seldp_comm **comm);

/* Release the world after every rank's communicators are destroyed. NULL is a no-op. */
void hx_backend_close(hx_backend *backend);

#endif
