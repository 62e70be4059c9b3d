/* The texts of the session's errors (session_messages.c): saving a rank's message across
 * collectives, sharing the lowest failing rank's, naming the call, the ranks and the
 * device. Internal: nothing here is public. */
#ifndef SELDP_SESSION_MESSAGES_H
#define SELDP_SESSION_MESSAGES_H

#include <stddef.h>

#include "seldp/session.h"

/* Size of the buffers that carry one rank's error message between ranks. */
#define SESSION_MESSAGE_MAX 1024

/* Prefix the calling thread's last error with the caller's group and world rank and copy
 * it into message[SESSION_MESSAGE_MAX] (empty when local is SELDP_OK), so that it survives
 * the collectives that follow. */
void seldp__session_save_message(const seldp_comm *comm, seldp_status local, char *message);

/* Collective, on the error path only: every rank receives group rank `failing`'s message
 * (each rank passes its own, "" when it did not fail), makes it its last error and
 * returns `status`. A transport error of the exchange is returned instead. */
seldp_status seldp__session_share_error(seldp_comm *comm, int failing, seldp_status status,
                                        const char *message);

/* Name n group ranks and their world ranks into buf: "group rank 1 (world rank 5)" or
 * "group ranks 1,3 (world ranks 5,7)". */
void seldp__session_rank_list(const int *ranks, size_t n, const int *world_ranks, char *buf,
                              size_t size);

/* Make the calling thread's last error start with `call` and the stage of the call a
 * transport error came from ("seldp_session_sum: the agreement of the call failed: ...";
 * `stage` may be NULL) unless it names a public session or shard call already. The transport's
 * message follows without the name of the internal collective it was about ("rank 1 timed
 * out after 2 s: rank 3 had not arrived ..."). Returns st. */
seldp_status seldp__session_name_call(seldp_status st, const char *call, const char *stage);

/* "host" or "cuda:N" into buf; returns buf. */
const char *seldp__session_device_name(seldp_device device, char *buf, size_t size);

#endif
