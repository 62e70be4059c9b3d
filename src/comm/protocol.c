/* The collective protocol every transport shares: headers, agreement, the messages of a
 * timeout or an abort, and the clocks of the waits (see protocol.h). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include "comm/protocol.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

const seldp__call_header *seldp__proto_header(const seldp__proto_view *v, int r)
{
    return (const seldp__call_header *)((const char *)v->headers + (size_t)r * v->stride);
}

seldp_status seldp__proto_alltoallv_mismatch(int rank, int sender, size_t sends, int receiver,
                                             size_t expects)
{
    return seldp__fail(SELDP_ERR_DISAGREE,
                       "rank %d: alltoallv: rank %d sends %zu bytes to rank %d, which expects %zu",
                       rank, sender, sends, receiver, expects);
}

/* The arguments of rank r's call that must match rank 0's (and, for an alltoallv, every
 * receiver's expectations). */
static seldp_status arguments_agree(const seldp__proto_view *v, int r)
{
    const seldp__call_header *s0 = seldp__proto_header(v, 0), *o = seldp__proto_header(v, r);
    int me = v->rank;
    switch ((seldp__comm_op)o->op) {
    case OP_BROADCAST:
        if (o->root != s0->root || o->bytes != s0->bytes)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: broadcast: rank 0 passed root %d and %zu bytes but rank "
                               "%d root %d and %zu bytes",
                               me, (int)s0->root, (size_t)s0->bytes, r, (int)o->root,
                               (size_t)o->bytes);
        break;
    case OP_ALLREDUCE:
        if (o->count != s0->count || o->dtype != s0->dtype)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: allreduce: rank 0 passed %zu elements of %s but rank %d "
                               "%zu of %s",
                               me, (size_t)s0->count, seldp_dtype_name((seldp_dtype)s0->dtype), r,
                               (size_t)o->count, seldp_dtype_name((seldp_dtype)o->dtype));
        break;
    case OP_ALLGATHER:
        if (o->bytes != s0->bytes)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: allgather: rank 0 passed %zu bytes but rank %d %zu", me,
                               (size_t)s0->bytes, r, (size_t)o->bytes);
        break;
    case OP_REDUCE_FUSED:
        if (o->count != s0->count || o->n_segs != s0->n_segs ||
            o->bucket_elems != s0->bucket_elems || o->scale != s0->scale)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: reduction: rank 0 passed %zu tensors of %zu elements "
                               "(buckets of %zu, scale %g) but rank %d %zu of %zu (buckets of "
                               "%zu, scale %g)",
                               me, (size_t)s0->n_segs, (size_t)s0->count, (size_t)s0->bucket_elems,
                               s0->scale, r, (size_t)o->n_segs, (size_t)o->count,
                               (size_t)o->bucket_elems, o->scale);
        if (v->segs) {
            const seldp__reduce_seg *a = v->segs(v->ctx, 0), *b = v->segs(v->ctx, r);
            for (size_t j = 0; j < (size_t)o->n_segs; j++)
                if (a[j].count != b[j].count || a[j].out_dtype != b[j].out_dtype)
                    return seldp__fail(SELDP_ERR_DISAGREE,
                                       "rank %d: reduction: tensor %zu is %zu elements of %s on "
                                       "rank 0 but %zu of %s on rank %d",
                                       me, j, a[j].count, seldp_dtype_name(a[j].out_dtype),
                                       b[j].count, seldp_dtype_name(b[j].out_dtype), r);
        }
        break;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER_COUNTS:
        if (o->count != s0->count || o->dtype != s0->dtype || o->counts != s0->counts)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: %s: rank 0 passed %zu elements of %s (counts %016llx) "
                               "but rank %d %zu of %s (counts %016llx); every rank must pass the "
                               "same per-rank counts",
                               me, seldp__comm_op_name((int)o->op), (size_t)s0->count,
                               seldp_dtype_name((seldp_dtype)s0->dtype),
                               (unsigned long long)s0->counts, r, (size_t)o->count,
                               seldp_dtype_name((seldp_dtype)o->dtype),
                               (unsigned long long)o->counts);
        break;
    case OP_SCATTER_FUSED:
    case OP_GATHER_FUSED:
        if (o->count != s0->count || o->n_segs != s0->n_segs || o->dtype != s0->dtype ||
            o->scale != s0->scale)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: %s: rank 0 passed %zu tensors of %zu elements (%s, scale "
                               "%g) but rank %d %zu of %zu (%s, scale %g)",
                               me, seldp__comm_op_name((int)o->op), (size_t)s0->n_segs,
                               (size_t)s0->count, seldp_dtype_name((seldp_dtype)s0->dtype),
                               s0->scale, r, (size_t)o->n_segs, (size_t)o->count,
                               seldp_dtype_name((seldp_dtype)o->dtype), o->scale);
        if (v->shard_segs) {
            const seldp__shard_seg *a = v->shard_segs(v->ctx, 0), *b = v->shard_segs(v->ctx, r);
            bool gather = o->op == OP_GATHER_FUSED;
            for (size_t j = 0; j < (size_t)o->n_segs; j++)
                if (a[j].count != b[j].count || a[j].offset != b[j].offset ||
                    (gather && a[j].out_dtype != b[j].out_dtype))
                    return seldp__fail(SELDP_ERR_DISAGREE,
                                       "rank %d: %s: tensor %zu is %zu elements at %zu on rank 0 "
                                       "but %zu at %zu on rank %d",
                                       me, seldp__comm_op_name((int)o->op), j, a[j].count,
                                       a[j].offset, b[j].count, b[j].offset, r);
        }
        break;
    case OP_ALLTOALLV:
        if (v->send_bytes && v->recv_bytes) {
            const size_t *sends = v->send_bytes(v->ctx, r);
            for (int p = 0; p < v->size; p++) {
                size_t expects = v->recv_bytes(v->ctx, p)[r];
                if (sends[p] != expects)
                    return seldp__proto_alltoallv_mismatch(me, r, sends[p], p, expects);
            }
        }
        break;
    default:
        break;
    }
    return SELDP_OK;
}

seldp_status seldp__proto_agree(const seldp__proto_view *v)
{
    const seldp__call_header *mine = seldp__proto_header(v, v->rank);
    const char *name = seldp__comm_op_name((int)mine->op);
    for (int r = 0; r < v->size; r++) {
        const seldp__call_header *o = seldp__proto_header(v, r);
        if (o->op != mine->op)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: %s: rank %d called %s at the same point, expected every "
                               "rank to call %s",
                               v->rank, name, r, seldp__comm_op_name((int)o->op), name);
    }
    for (int r = 0; r < v->size; r++) {
        const seldp__call_header *o = seldp__proto_header(v, r);
        if (o->seq && mine->seq && o->seq != mine->seq)
            return seldp__fail(SELDP_ERR_DISAGREE,
                               "rank %d: %s: rank %d is at its collective %lld on this "
                               "communicator but this rank at its collective %lld",
                               v->rank, name, r, (long long)o->seq, (long long)mine->seq);
    }
    for (int r = 0; r < v->size; r++) {
        seldp_status staged = (seldp_status)seldp__proto_header(v, r)->staged;
        if (staged != SELDP_OK)
            return seldp__fail(staged, "rank %d: %s: rank %d could not stage its buffers (%s)",
                               v->rank, name, r, seldp_status_name(staged));
    }
    for (int r = 0; r < v->size; r++) {
        seldp_status st = arguments_agree(v, r);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}

int64_t seldp__proto_counts_digest(const size_t *counts, int n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (int r = 0; r < n; r++) {
        uint64_t v = (uint64_t)counts[r];
        for (int b = 0; b < 8; b++)
            h = (h ^ ((v >> (8 * b)) & 0xffu)) * 0x100000001b3u;
    }
    return (int64_t)(h >> 1); /* non-negative, so that it prints alike everywhere */
}

int seldp__proto_missing_ranks(int size, int self, const int *world_ranks, bool split,
                               bool world_numbering, bool (*missing)(const void *ctx, int r),
                               const void *ctx, char *buf, size_t bufsize)
{
    int n = 0;
    size_t used = strlen(buf);
    for (int r = 0; r < size; r++) {
        if (r == self || !missing(ctx, r))
            continue;
        int wr = world_ranks ? world_ranks[r] : r;
        if (used < bufsize) {
            int len;
            if (world_numbering || !split)
                len = snprintf(buf + used, bufsize - used, "%s%d", n ? ", " : "",
                               world_numbering ? wr : r);
            else
                len = snprintf(buf + used, bufsize - used, "%s%d (world rank %d)", n ? ", " : "", r,
                               wr);
            used += len > 0 ? (size_t)len : 0;
        }
        n++;
    }
    return n;
}

seldp_status seldp__proto_not_arrived(const seldp__proto_timeout *t, char *reason,
                                      size_t reason_size)
{
    const char *ranks = t->missing > 1 ? "ranks" : "rank";
    const char *name = seldp__comm_op_name(t->op);
    snprintf(reason, reason_size, "rank %d timed out after %g s in %s waiting for %s %s",
             t->world_rank, t->timeout_s, name, ranks, t->world_who);
    return seldp__fail(SELDP_ERR_TIMEOUT,
                       "rank %d: %s timed out after %g s: %s %s had not arrived (%d of %d ranks "
                       "missing)",
                       t->rank, name, t->timeout_s, ranks, t->who, t->missing, t->size);
}

seldp_status seldp__proto_stalled_inside(const seldp__proto_timeout *t, bool waited, char *reason,
                                         size_t reason_size)
{
    const char *name = seldp__comm_op_name(t->op);
    char world_who[300], who[300];
    if (t->missing > 0) {
        snprintf(world_who, sizeof world_who, "%s %s", t->missing > 1 ? "ranks" : "rank",
                 t->world_who);
        snprintf(who, sizeof who, "%s %s", t->missing > 1 ? "ranks" : "rank", t->who);
    } else {
        snprintf(world_who, sizeof world_who, "a rank");
        snprintf(who, sizeof who, "a rank");
    }
    snprintf(reason, reason_size,
             "rank %d timed out after %g s in %s: %s stalled inside it (every rank had arrived)",
             t->world_rank, t->timeout_s, name, world_who);
    if (waited)
        return seldp__fail(SELDP_ERR_TIMEOUT,
                           "rank %d: %s timed out after %g s: %s stalled inside it (every rank "
                           "of the %d had arrived; this rank waited for %s to stop touching its "
                           "buffers)",
                           t->rank, name, t->timeout_s, who, t->size,
                           t->missing > 1 ? "them" : "it");
    return seldp__fail(SELDP_ERR_TIMEOUT,
                       "rank %d: %s timed out after %g s: %s stalled inside it (every rank of "
                       "the %d had arrived)",
                       t->rank, name, t->timeout_s, who, t->size);
}

seldp_status seldp__proto_silent_inside(const seldp__proto_timeout *t, char *reason,
                                        size_t reason_size)
{
    const char *name = seldp__comm_op_name(t->op);
    const char *ranks = t->missing > 1 ? "ranks" : "rank";
    snprintf(reason, reason_size,
             "rank %d timed out after %g s in %s: %s %s did not answer from inside it (every "
             "rank had arrived)",
             t->world_rank, t->timeout_s, name, ranks, t->world_who);
    return seldp__fail(SELDP_ERR_TIMEOUT,
                       "rank %d: %s timed out after %g s: %s %s did not answer from inside it "
                       "(stalled inside it, or done with %s part and busy elsewhere; every rank "
                       "of the %d had arrived)",
                       t->rank, name, t->timeout_s, ranks, t->who, t->missing > 1 ? "their" : "its",
                       t->size);
}

seldp_status seldp__proto_aborted(int rank, seldp__comm_op op, seldp_status status,
                                  const char *reason)
{
    return seldp__fail(status, "rank %d: %s aborted: %s", rank, seldp__comm_op_name(op), reason);
}

/* ---- clocks, deadlines, waiting ----------------------------------------------------- */

double seldp__proto_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct timespec seldp__proto_deadline_after(double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    /* Clamp so that a huge timeout cannot overflow time_t. */
    if (!(seconds < 1e9))
        seconds = 1e9;
    if (!(seconds > 0))
        seconds = 0;
    time_t whole = (time_t)seconds;
    ts.tv_sec += whole;
    ts.tv_nsec += (long)((seconds - (double)whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

bool seldp__proto_past(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline->tv_sec ||
           (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

void seldp__proto_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

bool seldp__proto_spin_until(bool (*done)(void *arg), void *arg, long spin_ns)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        for (int i = 0; i < 16; i++) {
            if (done(arg))
                return true;
            seldp__proto_cpu_relax();
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > spin_ns)
            return false;
    }
}

bool seldp__proto_yield_until(bool (*done)(void *arg), void *arg, long yield_ns)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (done(arg))
            return true;
        sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > yield_ns)
            return done(arg);
    }
}

void seldp__proto_backoff_wait(seldp__proto_backoff *b)
{
    if (b->polls++ < 64)
        return;
    struct timespec ts = {0, (long)(b->nap_s * 1e9)};
    nanosleep(&ts, NULL);
    if (b->nap_s < 1e-3)
        b->nap_s *= 2;
}
