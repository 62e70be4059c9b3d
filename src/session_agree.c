/* The agreement of a reduction: each rank's record (status, method, FP32 flag, policy,
 * weight, the session's fingerprint, the first non-finite gradient and a presence bit per
 * reducible parameter), and the decision every rank computes from the same gathered records:
 * another session or call, disagreement, local failures, non-finite inputs, weight overflow,
 * presence, and gradients missing under the error policy. The ranks first all-gather a brief of
 * their records (agree_brief, below); the records follow in a second all-gatherv only when the
 * briefs differ or report a failure. The blocking reductions agree once; an overlapped one at its
 * start and again at its finish. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "session_reduce.h"

const char *seldp__reduce_method(uint64_t kind, uint64_t normalize, uint64_t fp32,
                                 uint64_t overlapped)
{
    if (overlapped == REDUCE_FINISH)
        return "seldp_session_finish";
    if (kind == REDUCE_KIND_GATHER)
        return "seldp_shard_allgather_params";
    if (kind == REDUCE_KIND_SCATTER) {
        if (overlapped == REDUCE_START)
            return normalize ? "seldp_shard_reduce_scatter_start"
                             : "seldp_shard_reduce_scatter_sum_start";
        return normalize ? "seldp_shard_reduce_scatter" : "seldp_shard_reduce_scatter_sum";
    }
    if (overlapped == REDUCE_START) {
        if (normalize)
            return fp32 ? "seldp_session_reduce_fp32_start" : "seldp_session_reduce_start";
        return fp32 ? "seldp_session_sum_fp32_start" : "seldp_session_sum_start";
    }
    if (normalize)
        return fp32 ? "seldp_session_reduce_fp32" : "seldp_session_reduce";
    return fp32 ? "seldp_session_sum_fp32" : "seldp_session_sum";
}

/* The public call a gathered record comes from. */
static const char *method_name(const reduce_record *rec)
{
    return seldp__reduce_method(rec->kind, rec->normalize, rec->fp32, rec->overlapped);
}

static const char *policy_name(uint64_t policy)
{
    switch (policy) {
    case SELDP_MISSING_ERROR:
        return "error";
    case SELDP_MISSING_ZERO:
        return "zero";
    default:
        return "invalid";
    }
}

static reduce_record *record_of(const reduce_call *c, int rank)
{
    return (reduce_record *)(c->records + c->record_offsets[rank]);
}

static bool record_has(const reduce_call *c, int rank, size_t slot)
{
    const unsigned char *bits = (const unsigned char *)(record_of(c, rank) + 1);
    return bits[slot / 8] >> (slot % 8) & 1u;
}

void seldp__reduce_fill_record(const reduce_call *c, seldp_status local, reduce_record *mine)
{
    const seldp_session *s = c->s;
    unsigned char *bits = (unsigned char *)(mine + 1);
    mine->status = (uint64_t)local;
    mine->world_rank = (uint64_t)seldp_comm_world_rank(s->comm);
    mine->normalize = c->normalize;
    mine->fp32 = c->fp32;
    mine->policy = (uint64_t)c->policy;
    mine->weight = c->weight;
    mine->overlapped = c->overlapped;
    mine->kind = c->kind;
    mine->range_dtype = (uint64_t)c->range_dtype;
    mine->digest = s->digest;
    mine->call = c->call;
    mine->n_params = s->n_params;
    mine->n_slots = s->n_slots;
    mine->nonfinite_slot = c->nonfinite_slot;
    mine->nonfinite_elem = c->nonfinite_elem;
    mine->nonfinite_count = c->nonfinite_count;
    if (s->n_params)
        snprintf(mine->first_path, sizeof mine->first_path, "%s", s->params[0].path);
    for (size_t k = 0; k < c->s->n_slots; k++)
        if (c->slots[k].has_grad)
            bits[k / 8] |= (unsigned char)(1u << (k % 8));
}

/* --- decide ---------------------------------------------------------------- */

/* "the session of 'path' (N parameters, schema 0x...)" into buf, from a gathered record. */
static const char *session_name(const reduce_record *rec, char *buf, size_t size)
{
    if (rec->n_params == 0)
        snprintf(buf, size, "the session of an empty selection (schema %016" PRIx64 ")",
                 rec->digest);
    else
        snprintf(buf, size,
                 "the session of '%.*s' (%" PRIu64 " parameter%s, schema %016" PRIx64 ")",
                 RECORD_PATH_MAX - 1, rec->first_path, rec->n_params, rec->n_params == 1 ? "" : "s",
                 rec->digest);
    return buf;
}

/* Every record is whole and its bitmap as long as its session's slots need; a malformed
 * one means a rank is not running this library's reduction. */
static seldp_status check_records(reduce_call *c, int n)
{
    size_t offset = 0;
    for (int r = 0; r < n; r++) {
        size_t len = c->record_lengths[r];
        const reduce_record *rec = (const reduce_record *)(c->records + offset);
        c->record_offsets[r] = offset;
        if (len < sizeof *rec || len % 8 != 0 || (len - sizeof *rec) * 8 < rec->n_slots)
            return seldp__fail(SELDP_ERR_INTERNAL,
                               "%s: group rank %d sent a malformed agreement record of %zu bytes",
                               seldp__reduce_call_name(c), r, len);
        offset += len;
    }
    return SELDP_OK;
}

/* Every rank must be in the same call of the same session, with the same method and
 * policy: else SELDP_ERR_DISAGREE naming the first rank that differs from group rank 0. */
static seldp_status agree_on_call(const reduce_call *c, int n)
{
    const reduce_record *a = record_of(c, 0);
    const int *world = c->world_ranks;
    char sa[RECORD_PATH_MAX + 96], sb[RECORD_PATH_MAX + 96];

    for (int r = 1; r < n; r++) {
        const reduce_record *b = record_of(c, r);
        if (b->digest != a->digest || b->n_params != a->n_params || b->n_slots != a->n_slots)
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks reduce different sessions: group rank 0 (world rank %d) called %s on %s "
                "(its call %" PRIu64 "), group rank %d (world rank %d) called %s on %s (its call "
                "%" PRIu64 "); every rank must reduce the same sessions in the same order",
                world[0], method_name(a), session_name(a, sa, sizeof sa), a->call, r, world[r],
                method_name(b), session_name(b, sb, sizeof sb), b->call);
        if (b->call != a->call)
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks are out of step on %s: group rank 0 (world rank %d) called %s as the "
                "session's call %" PRIu64 ", group rank %d (world rank %d) called %s as its call "
                "%" PRIu64 "; a rank missed or added a call",
                session_name(a, sa, sizeof sa), world[0], method_name(a), a->call, r, world[r],
                method_name(b), b->call);
        if (b->kind == REDUCE_KIND_GATHER && a->kind == REDUCE_KIND_GATHER &&
            b->range_dtype != a->range_dtype)
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks disagree on the all-gather: group rank 0 (world rank %d) called %s "
                "with %s ranges, group rank %d (world rank %d) with %s ranges",
                world[0], method_name(a), seldp_dtype_name((seldp_dtype)a->range_dtype), r,
                world[r], seldp_dtype_name((seldp_dtype)b->range_dtype));
        if (b->kind != a->kind || b->normalize != a->normalize || b->fp32 != a->fp32 ||
            b->policy != a->policy || b->overlapped != a->overlapped) {
            if (a->kind == REDUCE_KIND_GATHER || b->kind == REDUCE_KIND_GATHER)
                return seldp__fail(SELDP_ERR_DISAGREE,
                                   "ranks disagree on the call: group rank 0 (world rank %d) "
                                   "called %s, group rank %d (world rank %d) called %s",
                                   world[0], method_name(a), r, world[r], method_name(b));
            return seldp__fail(
                SELDP_ERR_DISAGREE,
                "ranks disagree on the reduction: group rank 0 (world rank %d) called %s "
                "with policy %s, group rank %d (world rank %d) called %s with policy %s",
                world[0], method_name(a), policy_name(a->policy), r, world[r], method_name(b),
                policy_name(b->policy));
        }
    }
    return SELDP_OK;
}

/* With cfg.check_finite: SELDP_ERR_NONFINITE naming the first non-finite input gradient
 * in path order, and of those the lowest group rank's. */
static seldp_status agree_finite(const reduce_call *c, int n)
{
    int worst = -1;
    for (int r = 0; r < n; r++) {
        uint64_t slot = record_of(c, r)->nonfinite_slot;
        if (slot != NO_NONFINITE && (worst < 0 || slot < record_of(c, worst)->nonfinite_slot))
            worst = r;
    }
    if (worst < 0)
        return SELDP_OK;
    const reduce_record *rec = record_of(c, worst);
    if (rec->nonfinite_slot >= c->s->n_slots)
        return seldp__fail(SELDP_ERR_INTERNAL,
                           "group rank %d named a non-finite slot %" PRIu64 " of %zu", worst,
                           rec->nonfinite_slot, c->s->n_slots);
    return seldp__fail(SELDP_ERR_NONFINITE,
                       "'%s': the gradient of group rank %d (world rank %d) is not finite at "
                       "element %" PRIu64 " of %" PRIu64
                       " (the first non-finite input in path order, then group rank)",
                       c->s->params[c->s->slot_param[rec->nonfinite_slot]].path, worst,
                       c->world_ranks[worst], rec->nonfinite_elem, rec->nonfinite_count);
}

/* The outcome of the agreement, computed by every rank from the same gathered records. */
static seldp_status reduce_decide(reduce_call *c, const char *message)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    int n = seldp_comm_size(s->comm), *lacking = NULL, *having = NULL;
    const reduce_record *first;

    SELDP_CHECK(check_records(c, n));
    first = record_of(c, 0);
    for (int r = 0; r < n; r++)
        c->world_ranks[r] = (int)record_of(c, r)->world_rank;
    SELDP_CHECK(agree_on_call(c, n));
    for (int r = 0; r < n; r++)
        if (record_of(c, r)->status != SELDP_OK)
            return seldp__session_share_error(s->comm, r, (seldp_status)record_of(c, r)->status,
                                              message);
    if (c->kind == REDUCE_KIND_GATHER)
        return SELDP_OK; /* an all-gather has no weights and no gradients */
    SELDP_CHECK(agree_finite(c, n));

    c->global_weight = 0;
    for (int r = 0; r < n; r++) {
        uint64_t w = record_of(c, r)->weight;
        if (c->global_weight > UINT64_MAX - w)
            SELDP_FAIL(SELDP_ERR_OVERFLOW,
                       "the global weight overflows 64 bits: group rank %d (world rank %d) adds "
                       "%" PRIu64 " to %" PRIu64 " from the ranks before it",
                       r, c->world_ranks[r], w, c->global_weight);
        c->global_weight += w;
    }

    lacking = malloc((size_t)n * sizeof *lacking);
    having = malloc((size_t)n * sizeof *having);
    if (!lacking || !having)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory checking gradient presence on %d ranks", n);
    for (size_t k = 0; k < s->n_slots; k++) {
        size_t n_lacking = 0, n_having = 0;
        for (int r = 0; r < n; r++) {
            if (record_of(c, r)->weight == 0)
                continue;
            if (record_has(c, r, k))
                having[n_having++] = r;
            else
                lacking[n_lacking++] = r;
        }
        c->slots[k].present = n_having > 0;
        if (n_having > 0 && n_lacking > 0 && first->policy == SELDP_MISSING_ERROR) {
            char who[256], others[256];
            seldp__session_rank_list(lacking, n_lacking, c->world_ranks, who, sizeof who);
            seldp__session_rank_list(having, n_having, c->world_ranks, others, sizeof others);
            SELDP_FAIL(SELDP_ERR_MISSING_GRADIENT,
                       "'%s' has no gradient on active %s, but has one on active %s (missing-"
                       "gradient policy error)",
                       s->params[s->slot_param[k]].path, who, others);
        }
    }
fail:
    free(having);
    free(lacking);
    return st;
}

/* --- the brief exchange ------------------------------------------------------------ */

/* A rank's brief: what may differ between the ranks of one agreeing call (its status, world
 * rank, weight and first non-finite slot), and two digests of the rest of its record (the
 * call, the session's fingerprint and the presence bitmap). When every brief has the root's
 * digests and no rank failed or saw a non-finite input, every rank's record is the root's but
 * for those fields, and the decision needs nothing else: the records themselves are not
 * exchanged. That is one all-gatherv of 48 bytes a rank, instead of the records (192 bytes and
 * the bitmap), which a group of 2,048 ranks would otherwise copy 2,048 times each. */
typedef struct agree_brief {
    uint64_t status, world_rank, weight, nonfinite_slot;
    uint64_t fnv, mix; /* of the record with the four fields above (and the non-finite element
                          and count) zeroed */
} agree_brief;

static seldp_status brief_of(const reduce_call *c, const void *mine, agree_brief *b)
{
    reduce_record *rest = malloc(c->record_bytes);
    if (!rest)
        return seldp__fail(SELDP_ERR_NOMEM, "%s: out of memory for the agreement",
                           seldp__reduce_call_name(c));
    memcpy(rest, mine, c->record_bytes);
    b->status = rest->status;
    b->world_rank = rest->world_rank;
    b->weight = rest->weight;
    b->nonfinite_slot = rest->nonfinite_slot;
    rest->status = rest->world_rank = rest->weight = rest->nonfinite_slot = 0;
    rest->nonfinite_elem = rest->nonfinite_count = 0;
    b->fnv = seldp__digest_fnv((const unsigned char *)rest, c->record_bytes);
    b->mix = seldp__digest_mix((const unsigned char *)rest, c->record_bytes);
    free(rest);
    return SELDP_OK;
}

/* Whether the briefs decide the call alone: every rank's digests are the root's, and no rank
 * failed or saw a non-finite input. Every rank answers the same from the same briefs. */
static bool briefs_agree(const agree_brief *b, int n)
{
    for (int r = 0; r < n; r++)
        if (b[r].status != SELDP_OK || b[r].nonfinite_slot != NO_NONFINITE ||
            b[r].fnv != b[0].fnv || b[r].mix != b[0].mix)
            return false;
    return true;
}

/* reduce_decide's outcome when the briefs agree: every record is this rank's but for the
 * fields in the briefs, so presence is this rank's bitmap wherever some rank is active, and
 * no rank lacks a gradient another has. */
static seldp_status brief_decide(reduce_call *c, const agree_brief *b, int n, const void *mine)
{
    for (int r = 0; r < n; r++)
        c->world_ranks[r] = (int)b[r].world_rank;
    if (c->kind == REDUCE_KIND_GATHER)
        return SELDP_OK;
    c->global_weight = 0;
    bool active = false;
    for (int r = 0; r < n; r++) {
        const uint64_t w = b[r].weight;
        if (c->global_weight > UINT64_MAX - w)
            return seldp__fail(SELDP_ERR_OVERFLOW,
                               "the global weight overflows 64 bits: group rank %d (world rank "
                               "%d) adds %" PRIu64 " to %" PRIu64 " from the ranks before it",
                               r, c->world_ranks[r], w, c->global_weight);
        c->global_weight += w;
        active = active || w != 0;
    }
    const unsigned char *bits = (const unsigned char *)((const reduce_record *)mine + 1);
    for (size_t k = 0; k < c->s->n_slots; k++)
        c->slots[k].present = active && (bits[k / 8] >> (k % 8) & 1u);
    return SELDP_OK;
}

/* One all-gatherv of the briefs; the records themselves only when the briefs do not decide
 * the call (then reduce_decide, as every rank has every record). Variable-length, so that
 * ranks in sessions of different sizes meet here and say so. */
seldp_status seldp__reduce_agree(reduce_call *c, const void *mine, const char *message,
                                 bool *gathered)
{
    if (gathered)
        *gathered = false;
    free(c->records);
    c->records = NULL;
    const int n = seldp_comm_size(c->s->comm);
    agree_brief brief, *briefs = NULL;
    seldp_status st = brief_of(c, mine, &brief);
    if (st != SELDP_OK)
        return st;
    st = seldp__session_name_call(seldp_comm_allgatherv(c->s->comm, &brief, sizeof brief,
                                                        (void **)&briefs, c->record_lengths),
                                  seldp__reduce_call_name(c), "the agreement");
    if (st != SELDP_OK)
        return st;
    for (int r = 0; r < n; r++)
        if (c->record_lengths[r] != sizeof brief) {
            free(briefs);
            return seldp__fail(SELDP_ERR_INTERNAL,
                               "%s: group rank %d sent a malformed agreement brief of %zu bytes "
                               "(expected %zu)",
                               seldp__reduce_call_name(c), r, c->record_lengths[r], sizeof brief);
        }
    if (briefs_agree(briefs, n)) {
        st = brief_decide(c, briefs, n, mine);
        free(briefs);
        if (gathered)
            *gathered = true;
        return st;
    }
    free(briefs);
    st = seldp__session_name_call(seldp_comm_allgatherv(c->s->comm, mine, c->record_bytes,
                                                        (void **)&c->records, c->record_lengths),
                                  seldp__reduce_call_name(c), "the agreement");
    if (st != SELDP_OK)
        return st;
    if (gathered)
        *gathered = true;
    return reduce_decide(c, message);
}
