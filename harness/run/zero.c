/* --zero 1: the distributed optimizer over the library's sharded calls (zero.h). */
#define _POSIX_C_SOURCE 200809L

#include "set_rank.h"
#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inject.h"
#include "loss_scale.h"
#include "optimizer.h"
#include "run.h"
#include "rank.h"
#include "reduce.h"

seldp_status hx_zero_check(const hx_run *run)
{
    const hx_options *o = &run->opts;
    if (!o->zero)
        return SELDP_OK;
    const char *why = NULL;
    if (hx_backend_multiprocess(run->backend))
        why = "one rank per process: the checks assemble each set's reduced gradient from every "
              "member's range, which needs the ranks as threads of one process";
    for (int r = 0; !why && r < o->world; r++)
        if (hx_backend_device(run->backend, r).kind == SELDP_DEVICE_CUDA)
            why = "a rank on a GPU: the update of the ranges runs on the host";
    if (why)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--zero 1 cannot run here: %s", why);
    return SELDP_OK;
}

void hx_zero_destroy(hx_zero *z)
{
    if (!z)
        return;
    for (int i = 0; i < z->n; i++) {
        seldp_shard_map_destroy(z->sets[i].map);
        free(z->sets[i].range);
        free(z->sets[i].present);
        free(z->sets[i].out);
    }
    free(z->sets);
    free(z);
}

/* Rank rk's maps and ranges, made at its first reduction. */
static seldp_status ensure(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    if (rk->zero)
        return SELDP_OK;
    hx_zero *z = hx_calloc(1, sizeof *z);
    if (!z)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    rk->zero = z;
    z->sets = hx_calloc((size_t)rk->n_sets + 1, sizeof *z->sets);
    if (!z->sets)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    z->n = rk->n_sets;
    for (int i = 0; i < rk->n_sets; i++) {
        hx_zero_set *zs = &z->sets[i];
        const hx_set *s = rk->sets[i].set;
        HX_CHECK_LIB(seldp_shard_map_create(rk->sets[i].session, &zs->map),
                     "rank %d: the shard map of %s", rk->rank, s->label);
        for (int k = 0; k < s->size; k++)
            if (s->ranks[k] == rk->rank)
                zs->group_rank = k;
        HX_CHECK_LIB(seldp_shard_map_range(zs->map, zs->group_rank, &zs->begin, &zs->count),
                     "rank %d: its range of %s", rk->rank, s->label);
        zs->n_pieces = seldp_shard_map_pieces(zs->map, zs->group_rank);
        zs->range = hx_calloc(zs->count + 1, sizeof *zs->range);
        zs->out = hx_calloc(zs->count + 1, sizeof *zs->out);
        zs->present = hx_calloc(zs->n_pieces + 1, sizeof *zs->present);
        if (!zs->range || !zs->out || !zs->present)
            HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    }
fail:
    return st;
}

/* The parts of the norm: every set's range. */
static seldp_norm_range *norm_ranges(hx_rank *rk)
{
    seldp_norm_range *r = hx_calloc((size_t)rk->n_sets + 1, sizeof *r);
    for (int i = 0; r && i < rk->n_sets; i++) {
        hx_zero_set *zs = &rk->zero->sets[i];
        r[i] = (seldp_norm_range){rk->sets[i].session, zs->map, zs->range, zs->count, zs->present};
    }
    return r;
}

seldp_status hx_zero_start(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    HX_CHECK(ensure(rk));
    for (int i = 0; i < rk->n_sets; i++) {
        hx_rank_set *rs = &rk->sets[i];
        hx_zero_set *zs = &rk->zero->sets[i];
        uint64_t w = hx_set_weight_of(rk, rs->set);
        st = rs->set->sums ? seldp_shard_reduce_scatter_sum_start(rs->session, zs->map, rk->grads,
                                                                  w > 0, rk->run->opts.policy,
                                                                  zs->range, zs->count, zs->present)
                           : seldp_shard_reduce_scatter_start(rs->session, zs->map, rk->grads, w,
                                                              rk->run->opts.policy, zs->range,
                                                              zs->count, zs->present);
        if (st != SELDP_OK)
            HX_FAIL_LIB(st, "rank %d: starting the overlapped reduce-scatter over %s", rk->rank,
                        rs->set->label);
    }
fail:
    return st;
}

seldp_status hx_zero_reduce(hx_rank *rk, double t0)
{
    seldp_status st = SELDP_OK;
    seldp_norm_range *ranges = NULL;
    HX_CHECK(ensure(rk));
    if (!rk->run->opts.overlap) { /* overlapped: started by hx_zero_start, finished */
        HX_CHECK(hx_reset_grads(rk));
        for (size_t i = 0; i < rk->n_params; i++)
            HX_CHECK(hx_export_grad(rk, i, rk->grads));
    }
    for (int i = 0; i < rk->n_sets && !rk->run->opts.overlap; i++) {
        hx_rank_set *rs = &rk->sets[i];
        hx_zero_set *zs = &rk->zero->sets[i];
        uint64_t w = hx_set_weight_of(rk, rs->set);
        /* reduce-scatter the set's gradients into this rank's range (FP32) */
        st = rs->set->sums
                 ? seldp_shard_reduce_scatter_sum(rs->session, zs->map, rk->grads, w > 0,
                                                  rk->run->opts.policy, zs->range, zs->count,
                                                  zs->present, &rs->global_weight)
                 : seldp_shard_reduce_scatter(rs->session, zs->map, rk->grads, w,
                                              rk->run->opts.policy, zs->range, zs->count,
                                              zs->present, &rs->global_weight);
        if (st != SELDP_OK)
            HX_FAIL_LIB(st, "rank %d: reduce-scatter over %s", rk->rank, rs->set->label);
    }
    for (int i = 0; i < rk->n_sets; i++) {
        hx_zero_set *zs = &rk->zero->sets[i];
        HX_CHECK(hx_inject_zero_emb(rk, &rk->sets[i], zs->map, zs->group_rank, zs->range));
    }
    /* the exported inputs are captured; the main thread assembles the results here */
    HX_CHECK(hx_reset_grads(rk));
    if (rk->run->opts.clip_grad > 0) {
        seldp_grad_norm_result res;
        ranges = norm_ranges(rk);
        if (!ranges)
            HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        HX_CHECK_LIB(seldp_grad_norm_ranges(rk->world, NULL, 0, ranges, (size_t)rk->n_sets, &res),
                     "rank %d: the global gradient norm over its ranges", rk->rank);
        rk->grad_norm = res.norm / hx_loss_scale_factor(rk); /* of the loss, not S times it */
    }
fail:
    free(ranges);
    rk->t_reduce = hx_now() - t0;
    return st;
}

/* The occurrence of a piece on rank rk (a tied parameter's smallest path). */
static long occurrence(const hx_rank *rk, const seldp_shard_piece *pc)
{
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && p->id == pc->id)
            return (long)i;
    }
    return -1;
}

/* Set s's whole reduced gradient on member m from every member's range. */
static seldp_status assemble_member(hx_run *run, const hx_set *s, hx_rank *m, int mi)
{
    seldp_status st = SELDP_OK;
    const hx_zero_set *mine = &m->zero->sets[mi];
    float **full = hx_calloc(m->n_params, sizeof *full);
    bool *absent = hx_calloc(m->n_params, sizeof *absent);
    if (!full || !absent)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    for (int q = 0; q < s->size; q++) {
        const hx_rank *owner = &run->ranks[s->ranks[q]];
        const hx_zero_set *zq = NULL;
        for (int k = 0; k < owner->n_sets; k++)
            if (owner->sets[k].set == s)
                zq = &owner->zero->sets[k];
        if (!zq)
            HX_FAIL(SELDP_ERR_INTERNAL, "rank %d holds no range of %s", owner->rank, s->label);
        for (size_t k = 0; k < zq->n_pieces; k++) {
            seldp_shard_piece pc;
            HX_CHECK_LIB(seldp_shard_map_piece(mine->map, q, k, &pc), "piece %zu of %s", k,
                         s->label);
            long i = occurrence(m, &pc);
            if (i < 0)
                HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: no parameter %s", m->rank, pc.path);
            if (!zq->present[k]) {
                absent[i] = true;
                continue;
            }
            if (!full[i])
                full[i] = hx_calloc(pc.param_elements, sizeof **full);
            if (!full[i])
                HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
            memcpy(full[i] + pc.param_offset, zq->range + pc.range_offset,
                   pc.count * sizeof **full);
        }
    }
    for (size_t i = 0; i < m->n_params; i++) {
        if (!full[i] || absent[i])
            continue;
        const tm_param_info *p = tm_param_at(m->model, i);
        seldp_tensor t = p->tensor;
        t.dtype = SELDP_F32;
        t.device = SELDP_HOST_DEVICE;
        t.data = full[i];
        HX_CHECK_LIB(seldp_grads_put(m->grads, p->id, &t, SELDP_OWNED),
                     "rank %d: the assembled gradient of %s", m->rank, p->path);
        full[i] = NULL;
    }
fail:
    for (size_t i = 0; full && i < m->n_params; i++)
        free(full[i]);
    free(full);
    free(absent);
    return st;
}

seldp_status hx_zero_assemble(hx_run *run)
{
    if (!run->opts.zero)
        return SELDP_OK;
    for (int r = 0; r < run->opts.world; r++) {
        hx_rank *m = &run->ranks[r];
        seldp_grads_destroy(m->grads);
        m->grads = NULL;
        seldp_status st = seldp_grads_create(&m->grads);
        if (st != SELDP_OK)
            return hx_fail_lib(st, "rank %d: gradient container", m->rank);
        for (int i = 0; i < m->n_sets; i++) {
            st = assemble_member(run, m->sets[i].set, m, i);
            if (st != SELDP_OK)
                return st;
        }
    }
    return SELDP_OK;
}

void hx_zero_owned(const hx_rank *rk, size_t i, size_t *lo, size_t *hi)
{
    *lo = *hi = 0;
    if (!rk->zero) {
        *hi = seldp_tensor_numel(&tm_param_at(rk->model, i)->tensor);
        return;
    }
    for (int s = 0; s < rk->zero->n; s++) {
        const hx_zero_set *zs = &rk->zero->sets[s];
        for (size_t k = 0; k < zs->n_pieces; k++) {
            seldp_shard_piece pc;
            if (seldp_shard_map_piece(zs->map, zs->group_rank, k, &pc) == SELDP_OK &&
                occurrence(rk, &pc) == (long)i) {
                *lo = pc.param_offset;
                *hi = pc.param_offset + pc.count;
                return;
            }
        }
    }
}

/* The current FP32 values of a piece the update does not touch (absent, or a skipped step). */
static void current_values(const hx_rank *rk, size_t i, const seldp_shard_piece *pc, float *out)
{
    const tm_param_info *p = tm_param_at(rk->model, i);
    size_t n = seldp_tensor_numel(&p->tensor);
    float *w = hx_calloc(n, sizeof *w);
    if (!w)
        return;
    hx_opt_weights(rk, i, w);
    memcpy(out, w + pc->param_offset, pc->count * sizeof *out);
    free(w);
}

/* What rank rk's ranges hold of non-finite values: [0] in dense pieces, [1] in expert ones. */
static seldp_status ranges_non_finite(hx_rank *rk, int64_t found[2])
{
    seldp_status st = SELDP_OK;
    found[0] = found[1] = 0;
    for (int s = 0; s < rk->n_sets; s++) {
        const hx_zero_set *zs = &rk->zero->sets[s];
        for (size_t k = 0; k < zs->n_pieces; k++) {
            seldp_shard_piece pc;
            if (!zs->present[k])
                continue;
            HX_CHECK_LIB(seldp_shard_map_piece(zs->map, zs->group_rank, k, &pc),
                         "rank %d: piece %zu of its range", rk->rank, k);
            long i = occurrence(rk, &pc);
            int c = i >= 0 && tm_param_at(rk->model, (size_t)i)->expert >= 0;
            for (size_t j = 0; j < pc.count && !found[c]; j++)
                found[c] = !isfinite(zs->range[pc.range_offset + j]);
        }
    }
fail:
    return st;
}

seldp_status hx_zero_update(hx_rank *rk)
{
    seldp_status st = hx_opt_ensure(rk);
    if (st != SELDP_OK)
        return st;
    seldp_norm_range *ranges = NULL;
    float *g = NULL;
    bool skip = false;
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        rk->opt->p[i].has_grad = rk->opt->p[i].updated = rk->opt->p[i].snap = false;
        /* the all-gather writes parameters this rank does not update: keep them for the dump */
        if (!p->alias && !p->frozen && (p->role & TM_ROLES_TRAINABLE))
            HX_CHECK(hx_opt_snapshot(rk, i));
    }
    /* --loss-scale: one found_inf over the world, from every rank's ranges (loss_scale.h) */
    int64_t found[2];
    HX_CHECK(ranges_non_finite(rk, found));
    HX_CHECK(hx_loss_scale_agree(rk, found));
    double S = hx_loss_scale_factor(rk);
    if (rk->run->opts.clip_grad > 0 && !rk->found_inf) {
        seldp_grad_norm_result res;
        ranges = norm_ranges(rk);
        if (!ranges)
            HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
        /* under --loss-scale the ranges are S times the loss's gradient: clip at S times */
        HX_CHECK_LIB(seldp_clip_grad_norm_ranges(rk->world, NULL, 0, ranges, (size_t)rk->n_sets,
                                                 rk->run->opts.clip_grad * S, &res),
                     "rank %d: --clip-grad %g over its ranges", rk->rank, rk->run->opts.clip_grad);
        skip = res.found_inf;
    }
    rk->opt->skipped = skip || rk->found_inf;
    rk->opt->loss_scale = S;
    bool any = false;
    for (int s = 0; s < rk->n_sets; s++) {
        hx_zero_set *zs = &rk->zero->sets[s];
        for (size_t k = 0; k < zs->n_pieces; k++) {
            seldp_shard_piece pc;
            HX_CHECK_LIB(seldp_shard_map_piece(zs->map, zs->group_rank, k, &pc),
                         "rank %d: piece %zu of its range", rk->rank, k);
            long i = occurrence(rk, &pc);
            if (i < 0)
                HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: no parameter %s", rk->rank, pc.path);
            float *out = zs->out + pc.range_offset;
            if (!zs->present[k]) {
                current_values(rk, (size_t)i, &pc, out);
                continue;
            }
            const tm_param_info *p = tm_param_at(rk->model, (size_t)i);
            bool skip_p = skip || hx_loss_scale_skips(rk, p);
            /* --loss-scale: the gradient of the loss, not of S times it */
            const float *gp = zs->range + pc.range_offset;
            if (S != 1.0) {
                free(g);
                g = hx_calloc(pc.count, sizeof *g);
                if (!g)
                    HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
                for (size_t j = 0; j < pc.count; j++)
                    g[j] = (float)(gp[j] * (1.0 / S));
                gp = g;
            }
            HX_CHECK(
                hx_opt_update_elements(rk, (size_t)i, pc.param_offset, pc.count, gp, skip_p, out));
            if (skip_p)
                current_values(rk, (size_t)i, &pc, out);
            any = any || !skip_p;
        }
    }
    /* every rank skips alike (the world's decisions): nothing to gather */
    int64_t moved[1] = {any}, anywhere[1] = {0};
    if (rk->run->opts.inject == HX_FAULT_FOUND_INF_LOCAL) /* one kind may step alone */
        HX_CHECK_LIB(
            seldp_comm_allreduce(rk->world, moved, anywhere, 1, SELDP_I64, SELDP_HOST_DEVICE),
            "rank %d: whether any rank updated", rk->rank);
    else
        anywhere[0] = !skip && !rk->found_inf;
    for (int s = 0; anywhere[0] && s < rk->n_sets; s++) {
        hx_zero_set *zs = &rk->zero->sets[s];
        HX_CHECK_LIB(seldp_shard_allgather_params(rk->sets[s].session, zs->map, zs->out, SELDP_F32,
                                                  zs->count),
                     "rank %d: all-gather of the updated ranges over %s", rk->rank,
                     rk->sets[s].set->label);
    }
    hx_loss_scale_update(rk); /* backoff or growth of a dynamic scale */
fail:
    free(g);
    free(ranges);
    return st;
}

/* Occurrence of a logical path on rank rk (-1: none). */
static long occurrence_of_path(const hx_rank *rk, const char *path)
{
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && strcmp(p->path, path) == 0)
            return (long)i;
    }
    return -1;
}

static void copy_piece(float *to, const float *from, const seldp_shard_piece *pc)
{
    if (to && from)
        memcpy(to + pc->param_offset, from + pc->param_offset, pc->count * sizeof *to);
}

seldp_status hx_zero_consolidate(hx_run *run, bool records)
{
    if (!run->opts.zero)
        return SELDP_OK;
    for (int r = 0; r < run->opts.world; r++) {
        hx_rank *owner = &run->ranks[r];
        for (int s = 0; owner->zero && s < owner->zero->n; s++) {
            const hx_zero_set *zs = &owner->zero->sets[s];
            const hx_set *set = owner->sets[s].set;
            for (size_t k = 0; k < zs->n_pieces; k++) {
                seldp_shard_piece pc;
                if (seldp_shard_map_piece(zs->map, zs->group_rank, k, &pc) != SELDP_OK)
                    return hx_fail(SELDP_ERR_INTERNAL, "rank %d: piece %zu", owner->rank, k);
                long i = occurrence(owner, &pc);
                float *m0 = NULL, *v0 = NULL;
                bool moments = i >= 0 && hx_opt_moments(owner, (size_t)i, &m0, &v0);
                const hx_opt_param *rec = i >= 0 && owner->opt ? &owner->opt->p[i] : NULL;
                for (int q = 0; i >= 0 && q < set->size; q++) {
                    hx_rank *peer = &run->ranks[set->ranks[q]];
                    long j = occurrence_of_path(peer, pc.path);
                    if (peer == owner || j < 0)
                        continue;
                    if (records) { /* what the step's update began from, for the dump */
                        hx_opt_param *to = peer->opt ? &peer->opt->p[j] : NULL;
                        if (!rec || !rec->has_grad || !to || !to->w0)
                            continue;
                        copy_piece(to->w0, rec->w0, &pc);
                        copy_piece(to->m0, rec->m0, &pc);
                        copy_piece(to->v0, rec->v0, &pc);
                        to->steps0 = rec->steps0;
                        continue;
                    }
                    copy_piece(peer->master ? peer->master[j] : NULL,
                               owner->master ? owner->master[i] : NULL, &pc);
                    float *m1 = NULL, *v1 = NULL;
                    if (moments && hx_opt_moments(peer, (size_t)j, &m1, &v1)) {
                        copy_piece(m1, m0, &pc);
                        copy_piece(v1, v0, &pc);
                    }
                    if (owner->opt && peer->opt)
                        peer->opt->p[j].steps = owner->opt->p[i].steps;
                }
            }
        }
    }
    return SELDP_OK;
}

void hx_zero_dump_json(const hx_rank *rk, hx_buf *b)
{
    hx_buf_puts(b, "[");
    for (int s = 0; rk->zero && s < rk->zero->n; s++) {
        const hx_zero_set *zs = &rk->zero->sets[s];
        hx_buf_printf(b,
                      "%s{\"set\": \"%s\", \"group_rank\": %d, \"begin\": %zu, \"count\": %zu, "
                      "\"pieces\": [",
                      s ? ", " : "", rk->sets[s].set->label, zs->group_rank, zs->begin, zs->count);
        for (size_t k = 0; k < zs->n_pieces; k++) {
            seldp_shard_piece pc;
            if (seldp_shard_map_piece(zs->map, zs->group_rank, k, &pc) != SELDP_OK)
                continue;
            hx_buf_printf(b,
                          "%s{\"path\": \"%s\", \"param_offset\": %zu, \"count\": %zu, "
                          "\"range_offset\": %zu}",
                          k ? ", " : "", pc.path, pc.param_offset, pc.count, pc.range_offset);
        }
        hx_buf_puts(b, "]}");
    }
    hx_buf_puts(b, "]");
}
