/* The global gradient norm across sessions, and clipping by it
 * (docs/library.md, Global gradient norm).
 *
 * One all-gather over the parent carries everything: each rank's status, the call it
 * made, and for each session it lists a fingerprint of the session's selection, its group
 * rank and size, the kind and the rank's FP64 sum of squares of what it counts. Every rank
 * then decides from the same bytes: disagreement, local failures (whose message is shared),
 * lists that do not match (a member of a group that does not list the session), and the
 * total, summed in rank order so that every rank holds the same bits. Clipping happens
 * after that agreement and cannot fail on host memory, so an error changes nothing. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "seldp/gradnorm.h"
#include "session_impl.h"
#include "shard_impl.h"
#include "gradnorm_impl.h"

/* Room for a session's description in a record ("'embed.weight' and 3 more"). */
#define PART_LABEL 96

/* The kind a listed range sends: a sharded session listed by its reduce-scattered range,
 * told apart from the parts (seldp_norm_kind), so that a group whose members list one
 * session as a part on some ranks and as a range on others disagrees. */
#define NORM_RANGES 2

/* The fixed part of a rank's record; uint64 fields, so no padding. n_parts part records
 * follow it. */
typedef struct norm_header {
    uint64_t status;
    uint64_t world_rank;
    uint64_t clip;
    uint64_t max_norm; /* the bits of the double */
    uint64_t n_parts;
    uint64_t sum_squares; /* the bits of the double: what this rank counts */
} norm_header;

typedef struct norm_part_record {
    uint64_t digest; /* of the session's selection: paths, dtypes, shapes, frozen flags */
    uint64_t group_rank;
    uint64_t group_size;
    uint64_t kind;
    char label[PART_LABEL];
} norm_part_record;

/* One part record of the gathered lists, with the world rank that sent it. */
typedef struct listed_part {
    const norm_part_record *rec;
    int world_rank;
} listed_part;

static const char *call_name(bool clip)
{
    return clip ? "seldp_clip_grad_norm" : "seldp_grad_norm";
}

const char *seldp__norm_call_name(const norm_call *c)
{
    if (c->with_ranges)
        return c->clip ? "seldp_clip_grad_norm_ranges" : "seldp_grad_norm_ranges";
    return call_name(c->clip);
}

const seldp_session *seldp__norm_listed_session(const norm_call *c, size_t i)
{
    return i < c->n_parts ? c->parts[i].session : c->ranges[i - c->n_parts].session;
}

static const char *kind_name(uint64_t kind)
{
    return kind == NORM_RANGES          ? "sharded ranges"
           : kind == SELDP_NORM_SHARDED ? "sharded"
                                        : "replicated";
}

static uint64_t bits_of(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static double double_of(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* "seldp_grad_norm" or "seldp_clip_grad_norm (max_norm 1)", as a record says. */
static const char *call_str(const norm_header *h, char *buf, size_t size)
{
    if (h->clip)
        snprintf(buf, size, "%s (max_norm %.17g)", call_name(true), double_of(h->max_norm));
    else
        snprintf(buf, size, "%s", call_name(false));
    return buf;
}

static void session_label(const seldp_session *s, char *buf, size_t size)
{
    if (s->n_params == 0)
        snprintf(buf, size, "an empty selection");
    else if (s->n_params == 1)
        snprintf(buf, size, "'%.60s'", s->params[0].path);
    else
        snprintf(buf, size, "'%.50s' and %zu more", s->params[0].path, s->n_params - 1);
}

/* This rank's record: the header, then one record per part (zeros for a part this rank
 * could not read, when its status says so). */
static void fill_record(const norm_call *c, seldp_status local, unsigned char *blob)
{
    norm_header h = {(uint64_t)local,
                     (uint64_t)seldp_comm_world_rank(c->parent),
                     c->clip,
                     bits_of(c->max_norm),
                     c->n_parts + c->n_ranges,
                     bits_of(c->sum_squares)};
    memcpy(blob, &h, sizeof h);
    for (size_t i = 0; i < c->n_parts + c->n_ranges; i++) {
        norm_part_record r = {0};
        const seldp_session *s = seldp__norm_listed_session(c, i);
        if (s) {
            r.digest = s->digest;
            r.group_rank = (uint64_t)seldp_comm_rank(s->comm);
            r.group_size = (uint64_t)seldp_comm_size(s->comm);
            r.kind = i < c->n_parts ? (uint64_t)c->parts[i].kind : NORM_RANGES;
            session_label(s, r.label, sizeof r.label);
        }
        memcpy(blob + sizeof h + i * sizeof r, &r, sizeof r);
    }
}

/* --- decide ---------------------------------------------------------------- */

static int compare_listed(const void *a, const void *b)
{
    const norm_part_record *x = ((const listed_part *)a)->rec, *y = ((const listed_part *)b)->rec;
    if (x->digest != y->digest)
        return x->digest < y->digest ? -1 : 1;
    if (x->group_size != y->group_size)
        return x->group_size < y->group_size ? -1 : 1;
    if (x->group_rank != y->group_rank)
        return x->group_rank < y->group_rank ? -1 : 1;
    return ((const listed_part *)a)->world_rank - ((const listed_part *)b)->world_rank;
}

/* The parts [from, to) of `listed` name one session (one selection over groups of one
 * size): every group rank must be listed equally often, with one kind. */
static seldp_status check_session(const listed_part *listed, size_t from, size_t to, bool clip)
{
    seldp_status st = SELDP_OK;
    const norm_part_record *first = listed[from].rec;
    size_t size = (size_t)first->group_size, *count = calloc(size, sizeof *count);
    size_t lo = 0, hi = 0;

    if (!count)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory checking a group of %zu ranks", size);
    for (size_t i = from; i < to; i++) {
        if (listed[i].rec->kind != first->kind)
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "%s: ranks disagree on the session over %s (a group of %zu): world rank "
                       "%d lists it as %s, world rank %d as %s",
                       call_name(clip), first->label, size, listed[from].world_rank,
                       kind_name(first->kind), listed[i].world_rank,
                       kind_name(listed[i].rec->kind));
        count[listed[i].rec->group_rank]++;
    }
    for (size_t g = 0; g < size; g++) {
        if (count[g] < count[lo])
            lo = g;
        if (count[g] > count[hi])
            hi = g;
    }
    if (count[lo] != count[hi]) {
        int who = -1;
        for (size_t i = from; i < to && who < 0; i++)
            if (listed[i].rec->group_rank == hi)
                who = listed[i].world_rank;
        SELDP_FAIL(SELDP_ERR_DISAGREE,
                   "%s: the lists of sessions disagree: world rank %d lists the session over %s "
                   "as group rank %zu of %zu, but group rank %zu of such a session is listed %zu "
                   "time%s and group rank %zu %zu time%s; every rank of a listed session's group "
                   "must call with the parent communicator and list that session once",
                   call_name(clip), who, first->label, hi, size, lo, count[lo],
                   count[lo] == 1 ? "" : "s", hi, count[hi], count[hi] == 1 ? "" : "s");
    }
fail:
    free(count);
    return st;
}

/* Every listed session is listed by every member of its group, with one kind. */
static seldp_status check_lists(const unsigned char *all, const size_t *offsets, int n, bool clip)
{
    seldp_status st = SELDP_OK;
    size_t total = 0, from = 0;
    listed_part *listed;

    for (int r = 0; r < n; r++) {
        norm_header h;
        memcpy(&h, all + offsets[r], sizeof h);
        total += (size_t)h.n_parts;
    }
    if (!(listed = malloc((total ? total : 1) * sizeof *listed)))
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory checking %zu listed sessions", total);
    total = 0;
    for (int r = 0; r < n; r++) {
        norm_header h;
        memcpy(&h, all + offsets[r], sizeof h);
        for (uint64_t i = 0; i < h.n_parts; i++) {
            listed[total].rec = (const norm_part_record *)(all + offsets[r] + sizeof h +
                                                           i * sizeof(norm_part_record));
            listed[total++].world_rank = (int)h.world_rank;
        }
    }
    qsort(listed, total, sizeof *listed, compare_listed);
    for (size_t i = 1; i <= total; i++)
        if (i == total || listed[i].rec->digest != listed[from].rec->digest ||
            listed[i].rec->group_size != listed[from].rec->group_size) {
            SELDP_CHECK(check_session(listed, from, i, clip));
            from = i;
        }
fail:
    free(listed);
    return st;
}

/* The outcome, computed by every rank from the same gathered records: *sum_squares is the
 * ranks' counted sums added in rank order. */
static seldp_status norm_decide(const norm_call *c, const unsigned char *all, const size_t *lengths,
                                const char *message, double *sum_squares)
{
    seldp_status st = SELDP_OK;
    int n = seldp_comm_size(c->parent);
    size_t *offsets = calloc((size_t)n, sizeof *offsets), offset = 0;
    norm_header first, h;

    if (!offsets)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory deciding over %d ranks", n);
    for (int r = 0; r < n; r++) {
        offsets[r] = offset;
        if (lengths[r] < sizeof h)
            SELDP_FAIL(SELDP_ERR_INTERNAL, "parent rank %d sent a truncated norm record", r);
        memcpy(&h, all + offset, sizeof h);
        if (lengths[r] != sizeof h + (size_t)h.n_parts * sizeof(norm_part_record))
            SELDP_FAIL(SELDP_ERR_INTERNAL, "parent rank %d sent a malformed norm record", r);
        offset += lengths[r];
    }
    memcpy(&first, all, sizeof first);
    for (int r = 1; r < n; r++) {
        memcpy(&h, all + offsets[r], sizeof h);
        if (h.clip != first.clip || (first.clip && h.max_norm != first.max_norm)) {
            char mine[96], theirs[96];
            SELDP_FAIL(SELDP_ERR_DISAGREE,
                       "ranks disagree on the norm call: world rank %d called %s, world rank %d "
                       "called %s",
                       (int)first.world_rank, call_str(&first, mine, sizeof mine),
                       (int)h.world_rank, call_str(&h, theirs, sizeof theirs));
        }
    }
    for (int r = 0; r < n; r++) {
        memcpy(&h, all + offsets[r], sizeof h);
        if (h.status != SELDP_OK) {
            st = seldp__session_share_error(c->parent, r, (seldp_status)h.status, message);
            goto fail;
        }
    }
    SELDP_CHECK(check_lists(all, offsets, n, c->clip != 0));
    *sum_squares = 0.0;
    for (int r = 0; r < n; r++) {
        memcpy(&h, all + offsets[r], sizeof h);
        *sum_squares += double_of(h.sum_squares);
    }
fail:
    free(offsets);
    return st;
}

/* --- clip ------------------------------------------------------------------ */

/* Scale every selected gradient of every part by coef; halves go through F32 scratch. */
static seldp_status norm_scale(const norm_call *c, double coef)
{
    seldp_status st = SELDP_OK;
    for (size_t i = 0; i < c->n_parts; i++) {
        const seldp_session *s = c->parts[i].session;
        for (size_t k = 0; k < s->n_params; k++) {
            const seldp_tensor *t = seldp_grads_get(c->parts[i].grads, s->params[k].id);
            size_t n;
            if (!t)
                continue;
            n = seldp_tensor_numel(t);
            if (t->dtype == SELDP_F32) {
                SELDP_CHECK(seldp__scale_f32(t->device, t->data, n, coef));
            } else {
                float *tmp = c->scratch[i];
                SELDP_CHECK(seldp__convert(t->device, tmp, SELDP_F32, t->data, t->dtype, n));
                SELDP_CHECK(seldp__scale_f32(t->device, tmp, n, coef));
                SELDP_CHECK(seldp__convert(t->device, t->data, t->dtype, tmp, SELDP_F32, n));
            }
        }
    }
    for (size_t i = 0; i < c->n_ranges; i++) {
        const seldp_norm_range *g = &c->ranges[i];
        const seldp_session *s = g->session;
        int me = seldp_comm_rank(s->comm);
        for (size_t p = 0; p < g->map->pieces[me]; p++) {
            seldp_shard_piece piece;
            if (g->present && !g->present[p])
                continue;
            SELDP_CHECK(seldp_shard_map_piece(g->map, me, p, &piece));
            SELDP_CHECK(
                seldp__scale_f32(s->device, g->range + piece.range_offset, piece.count, coef));
        }
    }
fail:
    return st;
}

/* --- the call -------------------------------------------------------------- */

static seldp_status grad_norm(seldp_comm *parent, const seldp_norm_part *parts, size_t n_parts,
                              const seldp_norm_range *ranges, size_t n_ranges, bool with_ranges,
                              bool clip, double max_norm, seldp_grad_norm_result *out)
{
    seldp_status st = SELDP_OK, local;
    norm_call c = {parent,      parts, n_parts,  ranges, n_ranges,
                   with_ranges, clip,  max_norm, 0.0,    NULL};
    size_t blob_bytes, *lengths = NULL;
    unsigned char *mine = NULL, *all = NULL;
    char message[SESSION_MESSAGE_MAX];
    seldp_grad_norm_result result = {0.0, false, false, 1.0};
    double sum_squares = 0.0;

    if (!parent)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: parent must not be NULL",
                           seldp__norm_call_name(&c));
    /* with parts (ranges) NULL, no record can be read: the rank reports none */
    if (!parts)
        c.n_parts = 0;
    if (!ranges)
        c.n_ranges = 0;
    blob_bytes = sizeof(norm_header) + (c.n_parts + c.n_ranges) * sizeof(norm_part_record);
    /* Without these this rank cannot take part; the others' collective then ends with the
     * transport's timeout rather than hanging. */
    c.scratch = calloc(c.n_parts ? c.n_parts : 1, sizeof *c.scratch);
    lengths = calloc((size_t)seldp_comm_size(parent), sizeof *lengths);
    mine = calloc(1, blob_bytes);
    if (!c.scratch || !lengths || !mine)
        SELDP_FAIL(SELDP_ERR_NOMEM, "%s: out of memory for the agreement of %d ranks",
                   seldp__norm_call_name(&c), seldp_comm_size(parent));

    if (!parts && n_parts)
        local = seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: parts is NULL but n_parts is %zu",
                            seldp__norm_call_name(&c), n_parts);
    else if (!ranges && n_ranges)
        local = seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: ranges is NULL but n_ranges is %zu",
                            seldp__norm_call_name(&c), n_ranges);
    else
        local = seldp__norm_prepare(&c, out);
    seldp__session_save_message(parent, local, message);
    fill_record(&c, local, mine);
    SELDP_CHECK(seldp__session_name_call(
        seldp_comm_allgatherv(parent, mine, blob_bytes, (void **)&all, lengths),
        seldp__norm_call_name(&c), "the agreement"));
    SELDP_CHECK(norm_decide(&c, all, lengths, message, &sum_squares));

    result.norm = sqrt(sum_squares);
    result.found_inf = !isfinite(result.norm);
    if (clip && !result.found_inf) {
        double coef = max_norm / (result.norm + 1e-6);
        if (coef < 1.0) {
            SELDP_CHECK(norm_scale(&c, coef));
            result.clipped = true;
            result.clip_coef = coef;
        }
    }
    *out = result;
fail:
    for (size_t i = 0; c.scratch && i < c.n_parts; i++)
        if (c.scratch[i])
            seldp__device_free(parts[i].session->device, c.scratch[i]);
    free(c.scratch);
    free(all);
    free(mine);
    free(lengths);
    return st;
}

seldp_status seldp_grad_norm(seldp_comm *parent, const seldp_norm_part *parts, size_t n_parts,
                             seldp_grad_norm_result *out)
{
    return grad_norm(parent, parts, n_parts, NULL, 0, false, false, 0.0, out);
}

seldp_status seldp_clip_grad_norm(seldp_comm *parent, const seldp_norm_part *parts, size_t n_parts,
                                  double max_norm, seldp_grad_norm_result *out)
{
    return grad_norm(parent, parts, n_parts, NULL, 0, false, true, max_norm, out);
}

seldp_status seldp_grad_norm_ranges(seldp_comm *parent, const seldp_norm_part *parts,
                                    size_t n_parts, const seldp_norm_range *ranges, size_t n_ranges,
                                    seldp_grad_norm_result *out)
{
    return grad_norm(parent, parts, n_parts, ranges, n_ranges, true, false, 0.0, out);
}

seldp_status seldp_clip_grad_norm_ranges(seldp_comm *parent, const seldp_norm_part *parts,
                                         size_t n_parts, const seldp_norm_range *ranges,
                                         size_t n_ranges, double max_norm,
                                         seldp_grad_norm_result *out)
{
    return grad_norm(parent, parts, n_parts, ranges, n_ranges, true, true, max_norm, out);
}
