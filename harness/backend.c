/* Transport selection for the harness (see backend.h). */
#include "backend.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "seldp/host.h"
#include "seldp/version.h"

#include "util.h"

struct hx_backend {
    hx_backend_kind kind; /* resolved: never AUTO */
    int world;
    seldp_host_world *host;
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

/* Why `kind` cannot run here, or NULL when it can. */
static const char *unavailable(hx_backend_kind kind)
{
    switch (kind) {
    case HX_BACKEND_HOST:
        return NULL;
    case HX_BACKEND_NCCL:
        if (!seldp_has_feature("nccl"))
            return "--backend nccl: not available: this build has no NCCL transport "
                   "(configure with -DSELDP_WITH_NCCL=ON on a machine with CUDA and NCCL)";
        return "--backend nccl: not available yet: the harness runs its model on the CPU; use "
               "--backend host";
    case HX_BACKEND_MPI:
        if (!seldp_has_feature("mpi"))
            return "--backend mpi: not available: this build has no MPI transport "
                   "(configure with -DSELDP_WITH_MPI=ON)";
        return "--backend mpi: not available yet: the harness drives simulated ranks in one "
               "process; use --backend host";
    default:
        return "unknown backend";
    }
}

seldp_status hx_backend_open(hx_backend_kind kind, int world, double timeout_s, hx_backend **out)
{
    /* auto: the host-staged transport runs any number of simulated ranks anywhere */
    hx_backend_kind resolved = kind == HX_BACKEND_AUTO ? HX_BACKEND_HOST : kind;
    const char *why = unavailable(resolved);
    if (why)
        return hx_fail(SELDP_ERR_UNSUPPORTED, "%s", why);
    hx_backend *b = hx_calloc(1, sizeof *b);
    if (!b)
        return SELDP_ERR_NOMEM;
    b->kind = resolved;
    b->world = world;
    seldp_comm_config cfg = SELDP_COMM_CONFIG_INIT;
    cfg.timeout_s = timeout_s;
    seldp_status st = seldp_host_world_create(world, &cfg, &b->host);
    if (st != SELDP_OK) {
        free(b);
        return hx_fail_lib(st, "creating a host world of %d ranks", world);
    }
    *out = b;
    return SELDP_OK;
}

const char *hx_backend_transport(const hx_backend *b)
{
    return hx_backend_name(b->kind);
}

const char *hx_backend_device_name(const hx_backend *b, int rank)
{
    (void)b;
    (void)rank;
    return "host";
}

seldp_status hx_backend_join(hx_backend *b, int rank, seldp_comm **comm)
{
    seldp_status st = seldp_host_comm_init(b->host, rank, SELDP_HOST_DEVICE, comm);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: joining the host world", rank);
    return SELDP_OK;
}

void hx_backend_close(hx_backend *b)
{
    if (!b)
        return;
    seldp_host_world_destroy(b->host);
    free(b);
}
