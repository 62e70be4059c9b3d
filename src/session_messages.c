/* The texts of the session's errors: a rank's message saved across the collectives that
 * follow it, the lowest failing rank's message shared with every rank, the call and stage a
 * transport error is told under, and the names of ranks and devices in messages. Shared by
 * initialize (session.c), the reductions (session_reduce.c, session_agree.c), the overlapped
 * ones (session_async*.c), the sharded ones (session_shard.c) and gradnorm.c. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "internal.h"
#include "session_messages.h"

void seldp__session_save_message(const seldp_comm *comm, seldp_status local, char *message)
{
    message[0] = '\0';
    if (local != SELDP_OK)
        snprintf(message, SESSION_MESSAGE_MAX, "group rank %d (world rank %d): %s",
                 seldp_comm_rank(comm), seldp_comm_world_rank(comm), seldp_last_error());
}

seldp_status seldp__session_share_error(seldp_comm *comm, int failing, seldp_status status,
                                        const char *message)
{
    seldp_status st = SELDP_OK;
    int n = seldp_comm_size(comm);
    size_t *lengths = calloc((size_t)n, sizeof *lengths);
    char *all = NULL;
    size_t offset = 0;

    if (!lengths)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory exchanging error messages");
    SELDP_CHECK(seldp_comm_allgatherv(comm, message, strlen(message) + 1, (void **)&all, lengths));
    for (int r = 0; r < failing; r++)
        offset += lengths[r];
    if (lengths[failing] == 0 || all[offset + lengths[failing] - 1] != '\0')
        SELDP_FAIL(SELDP_ERR_INTERNAL, "group rank %d sent a malformed error message", failing);
    seldp__set_error(all + offset);
    st = status;
fail:
    free(all);
    free(lengths);
    return st;
}

/* The length of the name of a transport collective ("allgatherv", "broadcast"...) that
 * starts `s` as a whole word, or 0. */
static size_t internal_call_at(const char *s)
{
    size_t best = 0;
    for (int op = OP_BARRIER; op < OP_COUNT; op++) {
        const char *name = seldp__comm_op_name(op);
        size_t len = strlen(name);
        if (strncmp(s, name, len) == 0 && !isalnum((unsigned char)s[len]) && s[len] != '_' &&
            len > best)
            best = len;
    }
    return best;
}

/* A transport's message about one of the session's internal collectives, told without the
 * collective, which the user never called: "rank 1: allgatherv timed out after 2 s: rank 3
 * had not arrived" becomes "rank 1 timed out after 2 s: rank 3 had not arrived", "rank 1:
 * allgather aborted: rank 2 timed out after 2 s in allgather waiting for rank 3" becomes
 * "rank 1: the world was aborted: rank 2 timed out after 2 s waiting for rank 3", and "rank
 * 0 called allgather at the same point, expected every rank to call allgatherv" becomes
 * "rank 0 made another collective call at the same point". */
static void without_internal_calls(const char *in, char *out, size_t size)
{
    static const char expected[] = ", expected every rank to call ";
    size_t o = 0, len;
    const char *p = in;
    while (*p && o + 1 < size) {
        const char *digits = p + 5, *q = digits;
        if (strncmp(p, "rank ", 5) == 0 && (p == in || !isalnum((unsigned char)p[-1]))) {
            while (isdigit((unsigned char)*q))
                q++;
        }
        if (q > digits && q[0] == ':' && q[1] == ' ' && (len = internal_call_at(q + 2))) {
            const char *after = q + 2 + len;
            const char *instead = "";
            if (strncmp(after, " aborted: ", 10) == 0) {
                instead = ": the world was aborted: ";
                after += 10;
            } else if (after[0] == ':') {
                instead = ":";
                after++;
            }
            o += (size_t)snprintf(out + o, size - o, "%.*s%s", (int)(q - p), p, instead);
            p = after;
            continue;
        }
        if (strncmp(p, " in ", 4) == 0 && (len = internal_call_at(p + 4))) {
            p += 4 + len;
            continue;
        }
        if (strncmp(p, "called ", 7) == 0 && (len = internal_call_at(p + 7)) &&
            strncmp(p + 7 + len, " at the same point", 18) == 0) {
            o += (size_t)snprintf(out + o, size - o, "made another collective call");
            p += 7 + len;
            continue;
        }
        if (strncmp(p, expected, sizeof expected - 1) == 0 &&
            (len = internal_call_at(p + sizeof expected - 1))) {
            p += sizeof expected - 1 + len;
            continue;
        }
        out[o++] = *p++;
    }
    out[o < size ? o : size - 1] = '\0';
}

seldp_status seldp__session_name_call(seldp_status st, const char *call, const char *stage)
{
    char told[SESSION_MESSAGE_MAX], message[2 * SESSION_MESSAGE_MAX];
    if (st == SELDP_OK || strstr(seldp_last_error(), "seldp_session_") ||
        strstr(seldp_last_error(), "seldp_shard_"))
        return st;
    without_internal_calls(seldp_last_error(), told, sizeof told);
    snprintf(message, sizeof message, "%s: %s%s%s", call, stage ? stage : "",
             stage ? " of the call failed: " : "", told);
    seldp__set_error(message);
    return st;
}

void seldp__session_rank_list(const int *ranks, size_t n, const int *world_ranks, char *buf,
                              size_t size)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "group rank%s ", n > 1 ? "s" : "");
    for (size_t i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%d", i ? "," : "", ranks[i]);
    if (used < size)
        used += (size_t)snprintf(buf + used, size - used, " (world rank%s ", n > 1 ? "s" : "");
    for (size_t i = 0; i < n && used < size; i++)
        used +=
            (size_t)snprintf(buf + used, size - used, "%s%d", i ? "," : "", world_ranks[ranks[i]]);
    if (used < size)
        snprintf(buf + used, size - used, ")");
}

const char *seldp__session_device_name(seldp_device d, char *buf, size_t size)
{
    if (d.kind == SELDP_DEVICE_HOST)
        snprintf(buf, size, "host");
    else
        snprintf(buf, size, "cuda:%d", d.ordinal);
    return buf;
}
