/* A rank of a sharded run (grid.h): the groups it computes with (TP, PP, ETP, its stage), its
 * model of shards and the TP group's communication for tiny-moe. Its replica sets are
 * sets.h's. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "overlap.h"
#include "pipeline.h"
#include "run.h"
#include "rank.h"

/* Split the world by the layout's colour and key of `kind` (NULL where the rank has none). */
static seldp_status split_kind(hx_rank *rk, seldp_group_kind kind, seldp_comm **out)
{
    int color, key;
    seldp_status st = seldp_layout_split_args(rk->run->layout->grid, kind, rk->rank, &color, &key);
    if (st == SELDP_OK)
        st = seldp_comm_split(rk->world, color, key, out);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: building its %s group", rk->rank,
                           seldp_group_kind_name(kind));
    return SELDP_OK;
}

static seldp_status split_by(hx_rank *rk, int color, const char *what, seldp_comm **out)
{
    seldp_status st = seldp_comm_split(rk->world, color, rk->rank, out);
    if (st != SELDP_OK)
        return hx_fail_lib(st, "rank %d: building its %s group", rk->rank, what);
    return SELDP_OK;
}

/* The TP group's communication for tiny-moe (tm_tp). */
static seldp_status tp_gather(void *user, const void *mine, size_t bytes, void *all)
{
    hx_rank *rk = user;
    int P = seldp_comm_size(rk->grid->tp);
    size_t *lens = hx_calloc((size_t)P, sizeof *lens);
    void *got = NULL;
    if (!lens)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    double t0 = hx_now();
    seldp_status st = seldp_comm_allgatherv(rk->grid->tp, mine, bytes, &got, lens);
    rk->t_dispatch += hx_now() - t0;
    if (st == SELDP_OK) {
        size_t total = 0;
        for (int r = 0; r < P; r++)
            total += lens[r];
        memcpy(all, got, total);
    }
    free(got);
    free(lens);
    return st;
}

static seldp_status tp_sum(void *user, void *buf, size_t count, seldp_dtype dtype)
{
    hx_rank *rk = user;
    double t0 = hx_now();
    seldp_status st = seldp_comm_allreduce(rk->grid->tp, buf, buf, count, dtype, SELDP_HOST_DEVICE);
    rk->t_dispatch += hx_now() - t0;
    return st;
}

seldp_status hx_grid_setup(hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    const seldp_layout *g = run->layout->grid;
    seldp_layout_config c = seldp_layout_get_config(g);
    int *owned = hx_calloc((size_t)run->layout->experts, sizeof *owned);
    hx_grid_rank *gr = hx_calloc(1, sizeof *gr);
    if (!owned || !gr) {
        free(owned);
        free(gr);
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    }
    rk->grid = gr;
    int n_owned = hx_layout_owned(run->layout, rk->rank, owned);
    gr->stage = seldp_layout_stage(g, rk->rank);
    gr->tp_rank = seldp_layout_position(g, SELDP_GROUP_TP, rk->rank);
    gr->etp_rank = seldp_layout_position(g, SELDP_GROUP_EXPERT_TP, rk->rank);
    gr->part = hx_grid_part(run, rk->rank);

    /* every rank splits in this order */
    HX_CHECK(split_kind(rk, SELDP_GROUP_TP, &gr->tp));
    HX_CHECK(split_kind(rk, SELDP_GROUP_PP, &gr->pp));
    HX_CHECK(split_kind(rk, SELDP_GROUP_EXPERT_TP, &gr->etp));
    HX_CHECK(split_by(rk, gr->stage, "stage", &gr->stage_comm));
    if (c.pp > 1)
        HX_CHECK(hx_pipe_links_setup(rk));

    tm_config shard_cfg = hx_grid_shard_config(run);
    HX_CHECK_LIB(tm_model_create_part(&shard_cfg, &gr->part, rk->rank, owned, n_owned, NULL, NULL,
                                      &rk->model),
                 "rank %d: creating its shards", rk->rank);
    tm_tp tp = {c.tp, gr->tp_rank, rk, tp_gather, tp_sum};
    HX_CHECK_LIB(tm_model_set_tp(rk->model, &tp), "rank %d: its tensor parallelism", rk->rank);
    if (c.pp > 1 && (gr->part.embed || gr->part.head)) {
        /* replicas are matched by path: both copies of the tied embedding as embed.weight */
        const tm_param_info *p =
            tm_param_find(rk->model, gr->part.embed ? "embed.weight" : "lm_head.weight");
        HX_CHECK_LIB(seldp_model_create(rk->rank, &gr->emb_view), "rank %d: embedding view",
                     rk->rank);
        HX_CHECK_LIB(
            seldp_model_add(gr->emb_view, "embed.weight", p->id, &p->tensor, false, (void *)p),
            "rank %d: registering the tied embedding", rk->rank);
    }
fail:
    free(owned);
    return st;
}

void hx_grid_cleanup(hx_rank *rk)
{
    hx_grid_rank *gr = rk->grid;
    if (!gr)
        return;
    hx_pipe_links_cleanup(rk);
    seldp_comm_destroy(gr->tp);
    seldp_comm_destroy(gr->pp);
    seldp_comm_destroy(gr->etp);
    seldp_comm_destroy(gr->stage_comm);
    gr->tp = gr->pp = gr->etp = gr->stage_comm = NULL;
    seldp_model_destroy(gr->emb_view);
    gr->emb_view = NULL;
}
