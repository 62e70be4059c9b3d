/* Token dispatch inside an expert-parallel group, and one rank's forward and backward.
 *
 * Per layer, every slot (token t, choice k) goes to an owner of its expert inside the rank's
 * EP group: the row counts, the expert ids and the rows travel by seldp_comm_alltoallv, the
 * owner runs its experts on the rows it received and sends the outputs back the same way.
 * The backward sends the gate-weighted output gradients along the same plan and brings the
 * input gradients back. A replicated expert's rows are spread over its owners in the group.
 * A slot the capacity dropped (expert -1) goes nowhere: it is not sent and not counted.
 *
 * The same code drives a rank on the CPU and one on a GPU: activations live where the rank
 * computes and every model call, allocation and row copy goes through its model's
 * tm_compute_ops (models/compute.h: the CPU's or the CUDA mirror's); counts, expert ids and the
 * routing stay on the host. */
#define _POSIX_C_SOURCE 200809L

#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "overlap.h"
#include "pipeline.h"
#include "router.h"
#include "dispatch.h"
#include "shares.h"
#include "rank.h"
#include "run.h"

/* Where expert e's rows go inside this rank's EP group this step: its owners there
 * (ascending, as group ranks of the EP communicator), of which the first `active` serve. */
typedef struct hx_expert_route {
    int *owners; /* group ranks */
    int n;
    int active;
} expert_route;

static seldp_status plan_routes(hx_rank *rk, expert_route *routes)
{
    const hx_layout *l = rk->run->layout;
    int g = l->ep_of[rk->rank];
    const hx_group *ep = &l->ep[g];
    uint64_t ng = hx_ep_tokens(rk, g);
    int *world_ranks = hx_calloc((size_t)ep->size, sizeof *world_ranks);
    if (!world_ranks)
        return SELDP_ERR_NOMEM;
    for (int e = 0; e < l->experts; e++) {
        expert_route *r = &routes[e];
        r->owners = hx_calloc((size_t)ep->size, sizeof *r->owners);
        if (!r->owners) {
            free(world_ranks);
            return SELDP_ERR_NOMEM;
        }
        r->n = hx_layout_owners_in(l, e, g, world_ranks);
        for (int i = 0; i < r->n; i++)
            r->owners[i] = hx_group_rank(ep, world_ranks[i]);
        r->active = (uint64_t)r->n < ng ? r->n : (int)ng;
    }
    free(world_ranks);
    return SELDP_OK;
}

/* One layer's exchange plan: where each of the T*K slots goes, and what arrives here. */
typedef struct hx_layer_plan {
    int64_t *pos;      /* [T*K] row of slot i in the send buffer; -1 when dropped */
    int64_t *kept;     /* [n_kept] the slots that are sent, ascending */
    int64_t *kept_pos; /* [n_kept] their rows in the send buffer */
    size_t n_kept;
    size_t *send_rows;   /* [P] */
    size_t *send_displs; /* [P] */
    size_t *recv_rows;   /* [P] */
    size_t *recv_displs; /* [P] */
    size_t n_recv;
    int32_t *recv_expert; /* [n_recv] */
    float *recv_x;        /* [n_recv * D] where the rank computes, kept for the backward */
} layer_plan;

/* Rows of d_model floats where the rank computes (tm_compute_ops.copy_rows). */
static seldp_status copy_rows(hx_rank *rk, float *dst, const int64_t *dst_rows, const float *src,
                              const int64_t *src_rows, size_t n)
{
    seldp_status st = rk->ops->copy_rows(rk->compute, dst, dst_rows, src, src_rows, n,
                                         rk->run->opts.model.d_model);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: copying %zu rows on cuda:%d", rk->rank, n,
                           rk->device.ordinal);
    return SELDP_OK;
}

static void plan_free(hx_rank *rk, layer_plan *p)
{
    free(p->pos);
    free(p->kept);
    free(p->kept_pos);
    free(p->send_rows);
    free(p->send_displs);
    free(p->recv_rows);
    free(p->recv_displs);
    free(p->recv_expert);
    rk->ops->release(rk->compute, p->recv_x);
    *p = (layer_plan){0};
}

/* alltoallv over the EP group with counts given in rows of `width` elements. */
static seldp_status exchange(hx_rank *rk, const void *send, const size_t *send_rows,
                             const size_t *send_displs, void *recv, const size_t *recv_rows,
                             const size_t *recv_displs, size_t width, seldp_dtype dtype,
                             seldp_device mem, const char *what, int layer)
{
    seldp_status st = SELDP_OK;
    int P = seldp_comm_size(rk->comms.ep);
    size_t *c = hx_calloc(4 * (size_t)P, sizeof *c);
    if (!c)
        return SELDP_ERR_NOMEM;
    for (int p = 0; p < P; p++) {
        c[p] = send_rows[p] * width;
        c[P + p] = send_displs[p] * width;
        c[2 * P + p] = recv_rows[p] * width;
        c[3 * P + p] = recv_displs[p] * width;
    }
    double t0 = hx_now();
    st = seldp_comm_alltoallv(rk->comms.ep, send, c, c + P, recv, c + 2 * P, c + 3 * P, dtype, mem);
    rk->t_dispatch += hx_now() - t0;
    if (st != SELDP_OK)
        st = hx_fail_lib(st, "rank %d: layer %d: alltoallv of %s in expert-parallel group e%d",
                         rk->rank, layer, what, rk->run->layout->ep_of[rk->rank]);
    free(c);
    return st;
}

static void prefix(const size_t *counts, size_t *displs, int n)
{
    size_t acc = 0;
    for (int i = 0; i < n; i++) {
        displs[i] = acc;
        acc += counts[i];
    }
}

/* Decide each slot's owner, exchange the counts and the expert ids. */
static seldp_status plan_layer(hx_rank *rk, int l, const tm_route *route,
                               const expert_route *routes, int64_t *local_routed, layer_plan *p)
{
    seldp_status st = SELDP_OK;
    int P = seldp_comm_size(rk->comms.ep);
    int E = rk->run->layout->experts;
    size_t slots = route->T * (size_t)route->K;
    int *dest = hx_calloc(slots, sizeof *dest);
    int32_t *send_ids = hx_calloc(slots, sizeof *send_ids);
    size_t *fill = hx_calloc((size_t)P, sizeof *fill);
    size_t *ones = hx_calloc((size_t)P, sizeof *ones);
    size_t *index = hx_calloc((size_t)P, sizeof *index);
    uint64_t *send_n = hx_calloc((size_t)P, sizeof *send_n);
    uint64_t *recv_n = hx_calloc((size_t)P, sizeof *recv_n);
    p->pos = hx_calloc(slots, sizeof *p->pos);
    p->kept = hx_calloc(slots, sizeof *p->kept);
    p->kept_pos = hx_calloc(slots, sizeof *p->kept_pos);
    p->send_rows = hx_calloc((size_t)P, sizeof(size_t));
    p->send_displs = hx_calloc((size_t)P, sizeof(size_t));
    p->recv_rows = hx_calloc((size_t)P, sizeof(size_t));
    p->recv_displs = hx_calloc((size_t)P, sizeof(size_t));
    if (!dest || !send_ids || !fill || !ones || !index || !send_n || !recv_n || !p->pos ||
        !p->kept || !p->kept_pos || !p->send_rows || !p->send_displs || !p->recv_rows ||
        !p->recv_displs)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    for (size_t i = 0; i < slots; i++) {
        int e = route->expert[i];
        if (e == -1) { /* dropped by the capacity */
            dest[i] = -1;
            continue;
        }
        if (e < 0 || e >= E)
            HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: layer %d routed a token to expert %d", rk->rank,
                    l, e);
        const expert_route *r = &routes[e];
        /* spread a replicated expert's rows over its owners in this EP group */
        dest[i] = r->owners[((size_t)rk->rank + i) % (size_t)r->active];
        p->send_rows[dest[i]]++;
        local_routed[(size_t)l * (size_t)E + (size_t)e]++;
    }
    prefix(p->send_rows, p->send_displs, P);
    for (size_t i = 0; i < slots; i++) {
        if (dest[i] < 0) {
            p->pos[i] = -1;
            continue;
        }
        p->pos[i] = (int64_t)(p->send_displs[dest[i]] + fill[dest[i]]++);
        send_ids[p->pos[i]] = route->expert[i];
        p->kept[p->n_kept] = (int64_t)i;
        p->kept_pos[p->n_kept++] = p->pos[i];
    }
    /* every peer learns how many rows it gets from this rank: one count to each */
    for (int q = 0; q < P; q++) {
        ones[q] = 1;
        index[q] = (size_t)q;
        send_n[q] = p->send_rows[q];
    }
    double t0 = hx_now();
    st = seldp_comm_alltoallv(rk->comms.ep, send_n, ones, index, recv_n, ones, index, SELDP_U64,
                              SELDP_HOST_DEVICE);
    rk->t_dispatch += hx_now() - t0;
    if (st != SELDP_OK)
        HX_FAIL_LIB(st, "rank %d: layer %d: alltoallv of row counts", rk->rank, l);
    for (int q = 0; q < P; q++)
        p->recv_rows[q] = (size_t)recv_n[q];
    prefix(p->recv_rows, p->recv_displs, P);
    p->n_recv = P ? p->recv_displs[P - 1] + p->recv_rows[P - 1] : 0;
    p->recv_expert = hx_calloc(p->n_recv, sizeof *p->recv_expert);
    if (!p->recv_expert)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    HX_CHECK(exchange(rk, send_ids, p->send_rows, p->send_displs, p->recv_expert, p->recv_rows,
                      p->recv_displs, 1, SELDP_I32, SELDP_HOST_DEVICE, "expert ids", l));
fail:
    free(dest);
    free(send_ids);
    free(fill);
    free(ones);
    free(index);
    free(send_n);
    free(recv_n);
    return st;
}

/* Run this rank's experts on n rows (ids, x; dy in the backward). Forward: out = y.
 * Backward (dy != NULL): out = dx, and the experts' gradients accumulate. */
static seldp_status compute_rows(hx_rank *rk, int l, size_t n, const int32_t *ids, const float *x,
                                 const float *dy, float *out)
{
    seldp_status st = SELDP_OK;
    const tm_compute_ops *ops = rk->ops;
    size_t D = (size_t)rk->run->opts.model.d_model;
    int E = rk->run->layout->experts;
    int64_t *rows = hx_calloc(n, sizeof *rows);
    size_t *per = hx_calloc((size_t)E + 1, sizeof *per);
    float *xe = NULL, *ge = NULL, *oe = NULL;
    if (!rows || !per)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    size_t most = 0;
    for (size_t j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= E || !tm_model_owns(rk->model, ids[j]))
            HX_FAIL(SELDP_ERR_INTERNAL,
                    "rank %d: layer %d: received a row for expert %d, "
                    "which it does not own",
                    rk->rank, l, (int)ids[j]);
        if (++per[ids[j]] > most)
            most = per[ids[j]];
    }
    /* one expert's rows at a time: sized by the busiest, not by every row received (at world
     * 2048 every rank is here at once) */
    xe = ops->alloc(rk->compute, most * D);
    ge = ops->alloc(rk->compute, most * D);
    oe = ops->alloc(rk->compute, most * D);
    if (!xe || !ge || !oe)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    /* the rows by expert, each expert's in the order received (a counting sort): per[e]
     * becomes where expert e's rows begin, per[e + 1] where they end */
    for (size_t e = (size_t)E, at = n; e-- > 0;) {
        at -= per[e];
        per[e + 1] = at;
    }
    for (size_t j = 0; j < n; j++)
        rows[per[ids[j] + 1]++] = (int64_t)j;
    per[0] = 0;
    for (int e = 0; e < E; e++) {
        const int64_t *mine = rows + per[e];
        size_t m = per[e + 1] - per[e];
        if (m == 0)
            continue;
        HX_CHECK(copy_rows(rk, xe, NULL, x, mine, m));
        if (dy) {
            HX_CHECK(copy_rows(rk, ge, NULL, dy, mine, m));
            HX_CHECK_LIB(ops->expert_backward(rk->compute, l, e, xe, ge, m, oe),
                         "rank %d: layer %d: backward of expert %d", rk->rank, l, e);
        } else {
            HX_CHECK_LIB(ops->expert_forward(rk->compute, l, e, xe, m, oe),
                         "rank %d: layer %d: forward of expert %d", rk->rank, l, e);
        }
        HX_CHECK(copy_rows(rk, out, mine, oe, NULL, m));
    }
fail:
    free(rows);
    free(per);
    ops->release(rk->compute, xe);
    ops->release(rk->compute, ge);
    ops->release(rk->compute, oe);
    return st;
}

/* allgatherv of `bytes` per rank over comm; *all (malloc'd) and where this rank's begin. */
static seldp_status gather_blob(hx_rank *rk, seldp_comm *comm, const void *mine, size_t bytes,
                                void **all, size_t *total, size_t *offset, const char *what, int l)
{
    int P = seldp_comm_size(comm), me = seldp_comm_rank(comm);
    size_t *lens = hx_calloc((size_t)P, sizeof *lens);
    if (!lens)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    double t0 = hx_now();
    seldp_status st = seldp_comm_allgatherv(comm, mine, bytes, all, lens);
    rk->t_dispatch += hx_now() - t0;
    if (st != SELDP_OK) {
        free(lens);
        return hx_fail_lib(st, "rank %d: layer %d: allgatherv of %s over its expert-TP group",
                           rk->rank, l, what);
    }
    *total = *offset = 0;
    for (int q = 0; q < P; q++) {
        if (q < me)
            *offset += lens[q];
        *total += lens[q];
    }
    free(lens);
    return SELDP_OK;
}

/* Run this rank's experts on the rows it received. With expert tensor parallelism the rows
 * of every ETP shard of this owner are gathered over the expert-TP group (each shard computes
 * its part of every row) and the partial outputs summed over it: this rank keeps its rows. */
static seldp_status run_experts(hx_rank *rk, int l, const layer_plan *p, const float *dy,
                                float *out)
{
    seldp_status st = SELDP_OK;
    seldp_comm *etp = rk->grid ? rk->grid->etp : NULL;
    if (!etp || seldp_comm_size(etp) == 1)
        return compute_rows(rk, l, p->n_recv, p->recv_expert, p->recv_x, dy, out);
    size_t D = (size_t)rk->run->opts.model.d_model, row = D * sizeof(float);
    void *ids = NULL, *x = NULL, *g = NULL;
    float *res = NULL;
    size_t total = 0, at = 0, x_total = 0, x_at = 0;
    HX_CHECK(gather_blob(rk, etp, p->recv_expert, p->n_recv * sizeof(int32_t), &ids, &total, &at,
                         "expert ids", l));
    size_t n = total / sizeof(int32_t), mine = at / sizeof(int32_t);
    HX_CHECK(gather_blob(rk, etp, p->recv_x, p->n_recv * row, &x, &x_total, &x_at, "rows", l));
    if (dy)
        HX_CHECK(
            gather_blob(rk, etp, dy, p->n_recv * row, &g, &x_total, &x_at, "gradient rows", l));
    res = hx_calloc(n * D + 1, sizeof *res);
    if (!res)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    HX_CHECK(compute_rows(rk, l, n, ids, x, g, res));
    double t0 = hx_now();
    st = seldp_comm_allreduce(etp, res, res, n * D, SELDP_F32, SELDP_HOST_DEVICE);
    rk->t_dispatch += hx_now() - t0;
    if (st != SELDP_OK)
        HX_FAIL_LIB(st,
                    "rank %d: layer %d: allreduce of partial expert %s over its expert-TP "
                    "group",
                    rk->rank, l, dy ? "input gradients" : "outputs");
    memcpy(out, res + mine * D, p->n_recv * row);
fail:
    free(ids);
    free(x);
    free(g);
    free(res);
    return st;
}

/* Send one (T,K,D) tensor's slot rows to their owners, run the experts there, and bring the
 * results back into the (T,K,D) tensor `back`. Forward: rows = the slots' inputs; backward:
 * rows = dy. */
static seldp_status round_trip(hx_rank *rk, int l, layer_plan *p, const float *slot_rows,
                               size_t slots, bool backward, float *back)
{
    seldp_status st = SELDP_OK;
    const tm_compute_ops *ops = rk->ops;
    size_t D = (size_t)rk->run->opts.model.d_model;
    /* the results come back into the send buffer (free once the rows are sent): at world
     * 2048 every rank is inside a round trip at once, so each buffer here is ~130 MB of peak */
    float *send = ops->alloc(rk->compute, slots * D);
    float *recv = ops->alloc(rk->compute, p->n_recv * D);
    /* backward: the input gradients over the gradient rows (run_experts reads an expert's rows
     * before it writes them, and no other expert's) */
    float *result = backward ? recv : ops->alloc(rk->compute, p->n_recv * D);
    float *returned = send;
    if (!send || !recv || !result)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    HX_CHECK(copy_rows(rk, send, p->kept_pos, slot_rows, p->kept, p->n_kept));
    HX_CHECK(exchange(rk, send, p->send_rows, p->send_displs, recv, p->recv_rows, p->recv_displs, D,
                      SELDP_F32, rk->device, backward ? "gradient rows" : "token rows", l));
    if (!backward) {
        ops->release(rk->compute, p->recv_x);
        p->recv_x = recv;
        recv = NULL;
        HX_CHECK(run_experts(rk, l, p, NULL, result));
    } else {
        HX_CHECK(run_experts(rk, l, p, recv, result));
        recv = NULL; /* it is `result` now */
        /* the layer's backward was the last reader of its rows */
        ops->release(rk->compute, p->recv_x);
        p->recv_x = NULL;
    }
    HX_CHECK(exchange(rk, result, p->recv_rows, p->recv_displs, returned, p->send_rows,
                      p->send_displs, D, SELDP_F32, rk->device,
                      backward ? "input gradients" : "expert outputs", l));
    HX_CHECK(copy_rows(rk, back, p->kept, returned, p->kept_pos, p->n_kept));
fail:
    ops->release(rk->compute, send);
    if (recv != result)
        ops->release(rk->compute, recv);
    ops->release(rk->compute, result);
    return st;
}

/* ---- one micro-batch's pass through the rank's stage (pipeline.h) -------------------------- */

static tm_part part_of(const hx_rank *rk)
{
    return rk->grid ? rk->grid->part : (tm_part){0, rk->run->opts.model.layers, true, true};
}

void hx_pass_free(hx_rank *rk, hx_pass *p)
{
    if (!p)
        return;
    const tm_compute_ops *ops = rk->ops;
    int L = rk->run->opts.model.layers, E = rk->run->layout->experts;
    for (int l = 0; p->plans && l < L; l++)
        plan_free(rk, &p->plans[l]);
    for (int e = 0; p->routes && e < E; e++)
        free(p->routes[e].owners);
    free(p->plans);
    free(p->routes);
    free(p->token_of_slot);
    ops->release(rk->compute, p->h);
    ops->release(rk->compute, p->dh);
    ops->release(rk->compute, p->slot_in);
    ops->release(rk->compute, p->slot_out);
    free(p->choices);
    free(p->local_routed);
    free(p);
}

seldp_status hx_pass_create(hx_rank *rk, hx_pass **out)
{
    const tm_compute_ops *ops = rk->ops;
    const tm_config *cfg = &rk->run->opts.model;
    size_t L = (size_t)cfg->layers, E = (size_t)rk->run->layout->experts;
    size_t T = rk->T, D = (size_t)cfg->d_model, slots = T * (size_t)cfg->top_k;
    hx_pass *p = hx_calloc(1, sizeof *p);
    *out = NULL;
    if (!p)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    p->T = T;
    p->plans = hx_calloc(L, sizeof *p->plans);
    p->routes = hx_calloc(E, sizeof *p->routes);
    p->token_of_slot = hx_calloc(slots, sizeof *p->token_of_slot);
    p->h = ops->alloc(rk->compute, T * D);
    p->dh = ops->alloc(rk->compute, T * D);
    p->slot_in = ops->alloc(rk->compute, slots * D);
    p->slot_out = ops->alloc(rk->compute, slots * D);
    p->choices = hx_calloc(L * slots + 1, sizeof *p->choices);
    p->local_routed = hx_calloc(L * E + 1, sizeof *p->local_routed);
    if (!p->plans || !p->routes || !p->token_of_slot || !p->h || !p->dh || !p->slot_in ||
        !p->slot_out || !p->choices || !p->local_routed) {
        hx_pass_free(rk, p);
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    }
    for (size_t i = 0; i < slots; i++)
        p->token_of_slot[i] = (int64_t)(i / (size_t)cfg->top_k);
    seldp_status st = plan_routes(rk, p->routes);
    if (st != SELDP_OK) {
        hx_pass_free(rk, p);
        return hx_fail(st, "rank %d: out of memory", rk->rank);
    }
    *out = p;
    return SELDP_OK;
}

seldp_status hx_pass_embed(hx_rank *rk, hx_pass *p)
{
    seldp_status st = SELDP_OK;
    const tm_compute_ops *ops = rk->ops;
    /* a later micro-batch keeps the gradients the earlier ones accumulated (microbatch.h) */
    HX_CHECK_LIB(rk->micro > 0 ? ops->begin_micro(rk->compute) : ops->begin_step(rk->compute),
                 "rank %d: starting the step", rk->rank);
    /* on a later stage this only sizes the caches: h comes from the previous stage */
    HX_CHECK_LIB(ops->embed_forward(rk->compute, rk->tokens, p->T, p->h), "rank %d: embedding",
                 rk->rank);
fail:
    return st;
}

seldp_status hx_pass_layers(hx_rank *rk, hx_pass *p)
{
    seldp_status st = SELDP_OK;
    const tm_compute_ops *ops = rk->ops;
    tm_part part = part_of(rk);
    size_t slots = p->T * (size_t)rk->run->opts.model.top_k;
    for (int l = part.first_layer; l < part.end_layer; l++) {
        tm_route route;
        HX_CHECK_LIB(ops->route_forward(rk->compute, l, p->h, &route), "rank %d: layer %d: router",
                     rk->rank, l);
        memcpy(p->choices + (size_t)l * slots, route.choice ? route.choice : route.expert,
               slots * sizeof *p->choices);
        HX_CHECK(hx_router_balance(rk, l));
        HX_CHECK(hx_router_shard(rk, l));
        HX_CHECK(plan_layer(rk, l, &route, p->routes, p->local_routed, &p->plans[l]));
        HX_CHECK(copy_rows(rk, p->slot_in, NULL, route.x, p->token_of_slot, slots));
        HX_CHECK(round_trip(rk, l, &p->plans[l], p->slot_in, slots, false, p->slot_out));
        HX_CHECK_LIB(ops->combine_forward(rk->compute, l, p->slot_out, p->h),
                     "rank %d: layer %d: combine", rk->rank, l);
    }
fail:
    return st;
}

seldp_status hx_pass_head(hx_rank *rk, hx_pass *p)
{
    seldp_status st = SELDP_OK;
    tm_part part = part_of(rk);
    bool overlap = rk->overlap_live; /* overlap.h: reductions in flight */
    p->loss_sum = 0;
    if (part.head)
        HX_CHECK_LIB(rk->ops->head(rk->compute, p->h, rk->targets, &p->loss_sum, p->dh),
                     "rank %d: head", rk->rank);
    if (overlap && part.head)
        HX_CHECK(hx_overlap_ready(rk, HX_READY_HEAD));
    p->loss_sum += hx_router_loss_sum(rk);
fail:
    return st;
}

seldp_status hx_pass_backward(hx_rank *rk, hx_pass *p)
{
    seldp_status st = SELDP_OK;
    const tm_compute_ops *ops = rk->ops;
    tm_part part = part_of(rk);
    size_t slots = p->T * (size_t)rk->run->opts.model.top_k;
    for (int l = part.end_layer - 1; l >= part.first_layer; l--) {
        HX_CHECK_LIB(ops->combine_backward(rk->compute, l, p->dh, p->slot_in),
                     "rank %d: layer %d: combine backward", rk->rank, l);
        HX_CHECK(round_trip(rk, l, &p->plans[l], p->slot_in, slots, true, p->slot_out));
        HX_CHECK_LIB(ops->route_backward(rk->compute, l, p->slot_out, p->dh),
                     "rank %d: layer %d: router backward", rk->rank, l);
        if (rk->overlap_live)
            HX_CHECK(hx_overlap_ready(rk, l));
    }
fail:
    return st;
}

seldp_status hx_pass_embed_backward(hx_rank *rk, hx_pass *p)
{
    seldp_status st = SELDP_OK;
    HX_CHECK_LIB(rk->ops->embed_backward(rk->compute, p->dh), "rank %d: embedding backward",
                 rk->rank);
    if (rk->overlap_live)
        HX_CHECK(hx_overlap_ready(rk, HX_READY_REST));
fail:
    return st;
}

/* One micro-batch: its forward through the stage, the activations passed on, the world's tokens
 * per expert, the head, the gradients received, the backward and the gradients passed back. */
seldp_status hx_rank_compute(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    const tm_config *cfg = &rk->run->opts.model;
    size_t LE = (size_t)cfg->layers * (size_t)rk->run->layout->experts;
    hx_pass *p = NULL;
    rk->overlap_live = rk->run->opts.overlap;
    HX_CHECK(hx_pass_create(rk, &p));
    HX_CHECK(hx_pass_embed(rk, p));
    HX_CHECK(hx_pipe_recv_act(rk, p));
    HX_CHECK(hx_pass_layers(rk, p));
    HX_CHECK(hx_pipe_send_act(rk, p));
    free(rk->choices);
    rk->choices = p->choices; /* the rank's now */
    p->choices = NULL;
    /* tokens per expert over the world: tells every owner which experts were reached (known
     * after the forward, where every rank has made its forward transfers) */
    HX_CHECK_LIB(seldp_comm_allreduce(rk->world, p->local_routed, rk->routed, LE, SELDP_I64,
                                      SELDP_HOST_DEVICE),
                 "rank %d: allreduce of tokens per expert", rk->rank);
    if (rk->run->opts.overlap)
        HX_CHECK(hx_overlap_begin(rk));
    HX_CHECK(hx_pass_head(rk, p));
    rk->loss_sum = p->loss_sum;
    HX_CHECK(hx_pipe_recv_grad(rk, p));
    HX_CHECK(hx_pass_backward(rk, p));
    HX_CHECK(hx_pipe_send_grad(rk, p));
    HX_CHECK(hx_pass_embed_backward(rk, p));
fail:
    hx_pass_free(rk, p);
    return st;
}
