/* Transport selection for the harness, in-process and under mpirun (see backend.h). */
#define _POSIX_C_SOURCE 200809L

#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "seldp/host.h"
#include "seldp/version.h"

#ifdef SELDP_HAVE_MPI
#include <mpi.h>

#include "seldp/hybrid.h"
#include "seldp/mpi.h"
#endif
#ifdef SELDP_HAVE_NCCL
#include "seldp/nccl.h"
#endif

#include "gpu.h"
#include "env.h" /* src/: the environment table */
#include "util.h"

typedef struct device_name {
    char text[24];
} device_name;

struct hx_backend {
    hx_backend_kind kind; /* the transport: HOST, NCCL or MPI, never AUTO */
    bool processes;       /* one rank per MPI process */
    int world;
    int process_rank; /* -1 in-process */
    int first;        /* the first rank this process hosts (0 in-process) */
    int per_process;  /* ranks each process hosts: 1 (mpi, nccl), N (hybrid) */
    bool hybrid;      /* --ranks-per-process: the hybrid transport */
    double timeout_s;
    seldp_device *devices; /* [world] */
    device_name *names;    /* [world] */
    seldp_host_world *host;
#ifdef SELDP_HAVE_MPI
    seldp_hybrid_world *hybrid_world;
#endif
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world *nccl;
#endif
};

static const char *const backend_names[] = {"auto", "host", "nccl", "mpi"};

const char *hx_backend_name(hx_backend_kind kind)
{
    return (unsigned)kind < 4 ? backend_names[kind] : "invalid";
}

bool hx_backend_parse(const char *name, hx_backend_kind *out)
{
    for (int k = 0; k < 4; k++) {
        if (strcasecmp(name, backend_names[k]) == 0) {
            *out = (hx_backend_kind)k;
            return true;
        }
    }
    return false;
}

bool hx_backend_under_mpirun(void)
{
    /* Open MPI 4 and 5, PMIx launchers, and MPICH's Hydra or Slurm's PMI */
    return seldp__env_present(SELDP__ENV_OMPI_COMM_WORLD_SIZE) ||
           seldp__env_present(SELDP__ENV_PMIX_RANK) || seldp__env_present(SELDP__ENV_PMI_SIZE);
}

bool hx_backend_uses_processes(hx_backend_kind kind)
{
    /* without MPI in the build this still says yes under mpirun, so that the run is refused
     * instead of every process running the whole world */
    if (kind == HX_BACKEND_MPI)
        return true;
    return (kind == HX_BACKEND_AUTO || kind == HX_BACKEND_NCCL) && hx_backend_under_mpirun();
}

static seldp_device cuda_device(int ordinal)
{
    return (seldp_device){SELDP_DEVICE_CUDA, ordinal};
}

static void set_device(hx_backend *b, int rank, seldp_device device)
{
    b->devices[rank] = device;
    if (device.kind == SELDP_DEVICE_CUDA)
        snprintf(b->names[rank].text, sizeof b->names[rank].text, "cuda:%d", device.ordinal);
    else
        snprintf(b->names[rank].text, sizeof b->names[rank].text, "host");
}

/* ---- one rank per MPI process ------------------------------------------------------------ */

static int requested_per_process; /* hx_backend_request_hybrid */

void hx_backend_request_hybrid(int ranks_per_process)
{
    requested_per_process = ranks_per_process;
}

#ifdef SELDP_HAVE_MPI
static bool harness_started_mpi;

/* --ranks-per-process: every process hosts N rank threads of one hybrid world, on the host
 * (seldp/hybrid.h). */
static seldp_status open_hybrid(hx_backend *b, hx_backend_kind kind)
{
    int size = 0, rank = 0, N = requested_per_process;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (kind != HX_BACKEND_AUTO && kind != HX_BACKEND_MPI)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--ranks-per-process %d: with --backend %s, expected auto or mpi (the "
                       "hybrid transport runs host-staged inside a process, MPI between them)",
                       N, hx_backend_name(kind));
    if ((long)size * N != b->world)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--world %d: mpirun started %d processes of --ranks-per-process %d ranks "
                       "each, %ld ranks (leave --world out, or start %d processes)",
                       b->world, size, N, (long)size * N, b->world % N ? 0 : b->world / N);
    b->processes = true;
    b->hybrid = true;
    b->kind = HX_BACKEND_MPI;
    b->process_rank = rank;
    b->per_process = N;
    b->first = rank * N;
    for (int r = 0; r < b->world; r++) { /* the layout table shows each rank's process */
        set_device(b, r, SELDP_HOST_DEVICE);
        snprintf(b->names[r].text, sizeof b->names[r].text, "p%d:host", r / N);
    }
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = b->timeout_s;
    seldp_status st = seldp_hybrid_world_create(MPI_COMM_WORLD, N, &cfg, &b->hybrid_world);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "process %d: creating a hybrid world of %d processes x %d ranks",
                           rank, size, N);
    return SELDP_OK;
}

/* Poll one non-blocking MPI call against the timeout. */
static seldp_status mpi_wait(MPI_Request *req, double timeout_s, const char *what)
{
    double deadline = hx_now() + timeout_s;
    struct timespec nap = {0, 100000};
    for (;;) {
        int done = 0;
        int err = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(err, text, &len);
            return hx_fail(SELDP_ERR_TRANSPORT, "%s: MPI failed: %s", what, text);
        }
        if (done)
            return SELDP_OK;
        if (hx_now() > deadline)
            return hx_fail(SELDP_ERR_TIMEOUT, "%s: not every process arrived within %g s", what,
                           timeout_s);
        nanosleep(&nap, NULL);
    }
}

/* Agree on the transport and learn every rank's device. After a timeout MPI may still
 * write into the buffers: they are abandoned, not freed (the process ends soon after). */
static seldp_status open_processes(hx_backend *b, hx_backend_kind kind)
{
    seldp_status st = SELDP_OK;
    int size = 0, rank = 0, local = 0, local_size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    b->process_rank = rank;
    b->first = rank;
    b->per_process = 1;
    if (size != b->world)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--world %d: mpirun started %d processes, and each runs one rank (leave "
                       "--world out, or start %d)",
                       b->world, size, b->world);
    hx_gpu_id *node_ids = NULL;
    MPI_Request *req = hx_calloc(1, sizeof *req);
    int *flags = hx_calloc(2, sizeof *flags);
    device_name *mine = hx_calloc(1, sizeof *mine);
    if (!req || !flags || !mine)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rank);

    /* Every process has arrived once the barrier completes, so the blocking split below
     * only waits for processes already on their way into it. */
    if (MPI_Ibarrier(MPI_COMM_WORLD, req) != MPI_SUCCESS)
        HX_FAIL(SELDP_ERR_TRANSPORT, "rank %d: MPI_Ibarrier failed", rank);
    HX_CHECK(mpi_wait(req, b->timeout_s, "starting the ranks"));
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        HX_FAIL(SELDP_ERR_TRANSPORT, "rank %d: MPI_Comm_split_type failed", rank);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &local_size);

    /* Each process takes the GPU (local rank % visible GPUs): cuda:0 under launchers that
     * give every process its own CUDA_VISIBLE_DEVICES, the local_rank-th GPU when every
     * process sees them all. Whether those are different GPUs is learnt from their PCI bus
     * ids, compared across the node. */
    int gpus = hx_gpu_count();
    int ordinal = hx_gpu_for_local_rank(local, gpus);
    node_ids = hx_calloc((size_t)local_size + 1, sizeof *node_ids); /* theirs, then mine */
    if (!node_ids) {
        MPI_Comm_free(&node);
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rank);
    }
    hx_gpu_id *my_id = &node_ids[local_size];
    if (ordinal >= 0)
        *my_id = hx_gpu_identity(ordinal);
    int ids_err = MPI_Iallgather(my_id, (int)sizeof *my_id, MPI_BYTE, node_ids, (int)sizeof *my_id,
                                 MPI_BYTE, node, req);
    if (ids_err == MPI_SUCCESS)
        st = mpi_wait(req, b->timeout_s, "comparing the node's GPUs");
    MPI_Comm_free(&node);
    if (ids_err != MPI_SUCCESS)
        HX_FAIL(SELDP_ERR_TRANSPORT, "rank %d: MPI_Iallgather failed", rank);
    HX_CHECK(st);

    /* auto runs NCCL when every process of every node has a GPU of its own */
    flags[0] = seldp_has_feature("nccl") && hx_gpu_ids_distinct(node_ids, local_size);
    if (MPI_Iallreduce(flags, flags + 1, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, req) != MPI_SUCCESS)
        HX_FAIL(SELDP_ERR_TRANSPORT, "rank %d: MPI_Iallreduce failed", rank);
    HX_CHECK(mpi_wait(req, b->timeout_s, "agreeing on the transport"));
    bool every_gpu_own = flags[1] != 0;
    if (kind == HX_BACKEND_NCCL && !seldp_has_feature("nccl"))
        HX_FAIL(SELDP_ERR_UNSUPPORTED,
                "--backend nccl: not available: this build has no NCCL transport (configure with "
                "-DSELDP_WITH_NCCL=ON on a machine with CUDA and NCCL)");
    /* --backend nccl with shared GPUs is left to NCCL, whose communicator creation refuses
     * two ranks on one GPU with its own message */
    if (kind == HX_BACKEND_NCCL && ordinal < 0)
        HX_FAIL(SELDP_ERR_UNSUPPORTED,
                "--backend nccl: rank %d (process %d of its node) sees no GPU; use --backend mpi",
                rank, local);
    b->kind = kind == HX_BACKEND_AUTO ? (every_gpu_own ? HX_BACKEND_NCCL : HX_BACKEND_MPI) : kind;

    seldp_device device = ordinal >= 0 ? cuda_device(ordinal) : SELDP_HOST_DEVICE;
    set_device(b, rank, device);
    *mine = b->names[rank];
    if (MPI_Iallgather(mine, (int)sizeof *mine, MPI_BYTE, b->names, (int)sizeof *mine, MPI_BYTE,
                       MPI_COMM_WORLD, req) != MPI_SUCCESS)
        HX_FAIL(SELDP_ERR_TRANSPORT, "rank %d: MPI_Iallgather failed", rank);
    HX_CHECK(mpi_wait(req, b->timeout_s, "exchanging the ranks' devices"));
    for (int r = 0; r < size; r++) {
        int theirs = 0;
        b->devices[r] = sscanf(b->names[r].text, "cuda:%d", &theirs) == 1 ? cuda_device(theirs)
                                                                          : SELDP_HOST_DEVICE;
    }
fail:
    if (st == SELDP_ERR_TIMEOUT)
        return st;
    free(req);
    free(flags);
    free(mine);
    free(node_ids);
    return st;
}
#endif

seldp_status hx_backend_processes(int *count, int *rank)
{
#ifndef SELDP_HAVE_MPI
    (void)count;
    (void)rank;
    return hx_fail(SELDP_ERR_UNSUPPORTED,
                   "--backend mpi: not available: this build has no MPI transport, so it cannot "
                   "run one rank per process under mpirun (install libopenmpi-dev and configure "
                   "with -DSELDP_WITH_MPI=ON)");
#else
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
        return hx_fail(SELDP_ERR_UNSUPPORTED,
                       "--backend mpi: MPI was already finalized in this process");
    if (!initialized) {
        int provided = 0;
        /* the hybrid transport's leaders call MPI from their own threads */
        int level = requested_per_process > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
        if (MPI_Init_thread(NULL, NULL, level, &provided) != MPI_SUCCESS)
            return hx_fail(SELDP_ERR_TRANSPORT, "MPI_Init_thread failed");
        harness_started_mpi = true;
        /* Open MPI 4 aborts the job on an error of a non-blocking collective otherwise */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    MPI_Comm_size(MPI_COMM_WORLD, count);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    return SELDP_OK;
#endif
}

void hx_backend_finalize(void)
{
#ifdef SELDP_HAVE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (harness_started_mpi && !finalized)
        MPI_Finalize();
    harness_started_mpi = false;
#endif
}

/* ---- every rank in this process ---------------------------------------------------------- */

static seldp_status open_in_process(hx_backend *b, hx_backend_kind kind)
{
    int gpus = hx_gpu_count();
    bool nccl_fits = seldp_has_feature("nccl") && gpus >= b->world;
    if (kind == HX_BACKEND_NCCL && !seldp_has_feature("nccl"))
        return hx_fail(SELDP_ERR_UNSUPPORTED,
                       "--backend nccl: not available: this build has no NCCL transport "
                       "(configure with -DSELDP_WITH_NCCL=ON on a machine with CUDA and NCCL)");
    if (kind == HX_BACKEND_NCCL && !nccl_fits)
        return hx_fail(SELDP_ERR_UNSUPPORTED,
                       "--backend nccl: needs a GPU per rank: world %d, %d GPU(s) here; use "
                       "--backend host (host-staged, ranks share GPUs) or fewer ranks",
                       b->world, gpus);
    b->kind = kind == HX_BACKEND_AUTO ? (nccl_fits ? HX_BACKEND_NCCL : HX_BACKEND_HOST) : kind;
    for (int r = 0; r < b->world; r++)
        set_device(b, r, gpus > 0 ? cuda_device(r % gpus) : SELDP_HOST_DEVICE);

    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = b->timeout_s;
#ifdef SELDP_HAVE_NCCL
    if (b->kind == HX_BACKEND_NCCL) {
        seldp_status st = seldp_nccl_world_create(b->world, &cfg, &b->nccl);
        if (st != SELDP_OK)
            return hx_fail_lib(st, "creating an NCCL world of %d ranks", b->world);
        return SELDP_OK;
    }
#endif
    seldp_status st = seldp_host_world_create(b->world, &cfg, &b->host);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "creating a host world of %d ranks", b->world);
    return SELDP_OK;
}

seldp_status hx_backend_open(hx_backend_kind kind, int world, double timeout_s, hx_backend **out)
{
    seldp_status st = SELDP_OK;
    hx_backend *b = hx_calloc(1, sizeof *b);
    if (!b)
        return SELDP_ERR_NOMEM;
    b->world = world;
    b->process_rank = -1;
    b->timeout_s = timeout_s;
    b->devices = hx_calloc((size_t)world, sizeof *b->devices);
    b->names = hx_calloc((size_t)world, sizeof *b->names);
    if (!b->devices || !b->names)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    if (hx_backend_uses_processes(kind)) {
#ifdef SELDP_HAVE_MPI
        int count = 0, rank = 0;
        b->processes = true;
        HX_CHECK(hx_backend_processes(&count, &rank));
        st = requested_per_process > 0 ? open_hybrid(b, kind) : open_processes(b, kind);
        if (st == SELDP_ERR_TIMEOUT)
            return st; /* MPI may still write into b: abandoned */
        HX_CHECK(st);
#else
        int count = 0, rank = 0;
        HX_CHECK(hx_backend_processes(&count, &rank));
#endif
    } else {
        HX_CHECK(open_in_process(b, kind));
    }
    *out = b;
    return SELDP_OK;
fail:
    hx_backend_close(b);
    return st;
}

const char *hx_backend_transport(const hx_backend *b)
{
    return b->hybrid ? "hybrid" : hx_backend_name(b->kind);
}

bool hx_backend_hybrid(const hx_backend *b)
{
    return b->hybrid;
}

int hx_backend_local_first(const hx_backend *b)
{
    return b->processes ? b->first : 0;
}

int hx_backend_local_count(const hx_backend *b)
{
    return b->processes ? b->per_process : b->world;
}

int hx_backend_process_of(const hx_backend *b, int rank)
{
    return b->processes ? rank / b->per_process : 0;
}

bool hx_backend_multiprocess(const hx_backend *b)
{
    return b->processes;
}

int hx_backend_process_rank(const hx_backend *b)
{
    return b->processes ? b->process_rank : -1;
}

bool hx_backend_is_local(const hx_backend *b, int rank)
{
    return !b->processes || (rank >= b->first && rank < b->first + b->per_process);
}

seldp_device hx_backend_device(const hx_backend *b, int rank)
{
    return b->devices[rank];
}

const char *hx_backend_device_name(const hx_backend *b, int rank)
{
    return b->names[rank].text;
}

seldp_status hx_backend_join(hx_backend *b, int rank, seldp_comm **comm)
{
    seldp_status st = SELDP_OK;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = b->timeout_s;
    (void)cfg;
#ifdef SELDP_HAVE_MPI
    if (b->hybrid)
        st = seldp_hybrid_comm_init(b->hybrid_world, rank - b->first, b->devices[rank], comm);
    else if (b->processes)
        st = b->kind == HX_BACKEND_NCCL
                 ? seldp_mpi_nccl_comm_init(MPI_COMM_WORLD, &cfg, comm)
                 : seldp_mpi_comm_init(MPI_COMM_WORLD, b->devices[rank], &cfg, comm);
#endif
#ifdef SELDP_HAVE_NCCL
    if (!b->processes && b->kind == HX_BACKEND_NCCL)
        st = seldp_nccl_comm_init(b->nccl, rank, comm);
#endif
    if (!b->processes && b->kind == HX_BACKEND_HOST)
        st = seldp_host_comm_init(b->host, rank, b->devices[rank], comm);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: joining the %s world on %s", rank, hx_backend_transport(b),
                           b->names[rank].text);
    return SELDP_OK;
}

void hx_backend_close(hx_backend *b)
{
    if (!b)
        return;
    seldp_host_world_destroy(b->host);
#ifdef SELDP_HAVE_MPI
    seldp_hybrid_world_destroy(b->hybrid_world);
#endif
#ifdef SELDP_HAVE_NCCL
    seldp_nccl_world_destroy(b->nccl);
#endif
    free(b->devices);
    free(b->names);
    free(b);
}
