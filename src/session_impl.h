/* The session's state and the helpers shared by initialize (session.c) and the
 * reductions (session_reduce.c); the texts of its errors are in session_messages.h.
 * Internal: nothing here is public. */
#ifndef SELDP_SESSION_IMPL_H
#define SELDP_SESSION_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/session.h"
#include "session_messages.h"

/* slot of a parameter that is never reduced (frozen, or an integer/bool buffer) */
#define SESSION_NO_SLOT ((size_t)-1)

/* One selected ParamId: all the paths it is tied at, communicated once. */
typedef struct session_param {
    seldp_param_id id;
    const char *path;    /* its smallest path (the model's string) */
    seldp_tensor tensor; /* the parameter's storage */
    bool frozen;
    size_t slot; /* index among the reducible parameters, or SESSION_NO_SLOT */
} session_param;

struct seldp_session {
    seldp_comm *comm;
    seldp_model *model;
    seldp_device device; /* the communicator's: buckets and staging live there */
    seldp_session_config cfg;
    seldp_param_id *ids; /* as given, for seldp_session_selected */
    size_t n_ids;
    session_param *params; /* in path order of their smallest paths */
    size_t n_params;
    size_t *slot_param; /* reducible (trainable F32/F16/BF16) ones: slot -> parameter index */
    size_t n_slots;
    size_t slot_elems; /* elements of all reducible parameters: the staging buffer's capacity */
    float *staging;    /* F32 on `device`, allocated by the first reduction */
    bool fused;        /* the group agreed on the fused reduce path at initialize */
    /* The fingerprint every reduction agrees on: a digest of the selection's schema (the
     * same on every rank once initialize has compared the manifests) and the number of
     * reductions this session has entered, failed ones included. */
    uint64_t digest;
    uint64_t reductions;
    /* The overlapped reductions' state and progress thread (session_async.c), created by
     * the first seldp_session_*_start; NULL before. */
    struct session_async *async;
};

/* Whether this rank takes part in the fused reduce path, for a session on `comm` whose
 * tensors are on `mem` (its device): it asked for it in cfg (or left it to the transport
 * and the environment's SELDP_REDUCE_PATH) and the transport has a fused reduction over
 * that memory (seldp__comm_fused_memory). SELDP_ERR_INVALID_ARGUMENT, naming the transport,
 * the memory and what the reduction needs, when the fused path was asked for and cannot
 * be taken, or when the request is invalid. Local; initialize then takes the fused path
 * only when every rank of the group can. */
seldp_status seldp__session_choose_fused(const seldp_comm *comm, seldp_device mem,
                                         const seldp_session_config *cfg, bool *fused);

/* SELDP_ERR_INVALID_ARGUMENT, with a message naming `call`, when an overlapped reduction is
 * in flight on this session, or on another session of its communicator in this process:
 * its progress thread owns the communicator until seldp_session_finish. Else SELDP_OK. */
seldp_status seldp__session_busy(const seldp_session *s, const char *call);

/* Cancel an overlapped reduction in flight (waiting for the collective in progress, at most
 * the transport's timeout), stop the progress thread and free the session's async state. */
void seldp__session_async_free(seldp_session *s);

/* Two independent 64-bit digests of n bytes (session.c): FNV-1a, and 8-byte words through
 * xxHash64's round and avalanche. The schema exchange and the reductions' briefs use both. */
uint64_t seldp__digest_fnv(const unsigned char *p, size_t n);
uint64_t seldp__digest_mix(const unsigned char *p, size_t n);

#endif
