/* Pipeline-parallel schedules, the links between adjacent stages and their transfers
 * (pipeline.h, docs/harness.md, Micro-batches: Pipelines). */
#define _POSIX_C_SOURCE 200809L

#include "pipeline.h"

#include "grid.h"
#include "run.h"
#include "rank.h"

/* ---- the schedules ------------------------------------------------------------------------ */

typedef struct plan_buf {
    hx_pipe_action *out;
    size_t n;
    bool first, last; /* the stage has no previous / no next stage */
} plan_buf;

static void add(plan_buf *b, hx_pipe_op op, int m, int g)
{
    switch (op) {
    case HX_PIPE_RECV_ACT:
    case HX_PIPE_SEND_GRAD:
        if (b->first)
            return;
        break;
    case HX_PIPE_SEND_ACT:
    case HX_PIPE_RECV_GRAD:
        if (b->last)
            return;
        break;
    case HX_PIPE_RECV_ACT_SEND_GRAD: /* stage 0 neither receives nor sends on this side */
        if (b->first)
            return;
        break;
    case HX_PIPE_SEND_ACT_RECV_GRAD:
        if (b->last)
            return;
        break;
    default:
        break;
    }
    b->out[b->n++] = (hx_pipe_action){op, m, g};
}

size_t hx_pipe_plan(hx_pipe_schedule schedule, int stage, int P, int M, hx_pipe_action *out)
{
    plan_buf b = {out, 0, stage == 0, stage == P - 1};
    switch (schedule) {
    case HX_PIPE_SEQUENTIAL:
        for (int m = 0; m < M; m++) {
            add(&b, HX_PIPE_RECV_ACT, m, -1);
            add(&b, HX_PIPE_FORWARD, m, -1);
            add(&b, HX_PIPE_SEND_ACT, m, -1);
            add(&b, HX_PIPE_RECV_GRAD, m, -1);
            add(&b, HX_PIPE_BACKWARD, m, -1);
            add(&b, HX_PIPE_SEND_GRAD, m, -1);
        }
        break;
    case HX_PIPE_AFAB:
        for (int m = 0; m < M; m++) {
            add(&b, HX_PIPE_RECV_ACT, m, -1);
            add(&b, HX_PIPE_FORWARD, m, -1);
            add(&b, HX_PIPE_SEND_ACT, m, -1);
        }
        for (int m = 0; m < M; m++) {
            add(&b, HX_PIPE_RECV_GRAD, m, -1);
            add(&b, HX_PIPE_BACKWARD, m, -1);
            add(&b, HX_PIPE_SEND_GRAD, m, -1);
        }
        break;
    default: {
        /* Megatron-LM's forward_backward_pipelining_without_interleaving: P - stage - 1
         * warmup forwards (at most M), then one forward and one backward at a time, then the
         * cooldown backwards */
        int warmup = P - stage - 1 < M ? P - stage - 1 : M, steady = M - warmup;
        for (int i = 0; i < warmup; i++) {
            add(&b, HX_PIPE_RECV_ACT, i, -1);
            add(&b, HX_PIPE_FORWARD, i, -1);
            add(&b, HX_PIPE_SEND_ACT, i, -1);
        }
        if (steady > 0)
            add(&b, HX_PIPE_RECV_ACT, warmup, -1);
        for (int i = 0; i < steady; i++) {
            add(&b, HX_PIPE_FORWARD, warmup + i, -1);
            add(&b, HX_PIPE_SEND_ACT_RECV_GRAD, warmup + i, i);
            add(&b, HX_PIPE_BACKWARD, i, -1);
            if (i == steady - 1)
                add(&b, HX_PIPE_SEND_GRAD, i, -1);
            else
                add(&b, HX_PIPE_RECV_ACT_SEND_GRAD, warmup + i + 1, i);
        }
        for (int i = steady; i < M; i++) {
            add(&b, HX_PIPE_RECV_GRAD, i, -1);
            add(&b, HX_PIPE_BACKWARD, i, -1);
            add(&b, HX_PIPE_SEND_GRAD, i, -1);
        }
    }
    }
    return b.n;
}

int hx_pipe_in_flight(hx_pipe_schedule schedule, int P, int M)
{
    switch (schedule) {
    case HX_PIPE_SEQUENTIAL:
        return 1;
    case HX_PIPE_AFAB:
        return M;
    default:
        return P < M ? P : M;
    }
}

int hx_pipe_stages(const hx_run *run)
{
    if (!run->layout || !run->layout->grid)
        return 1;
    int pp = seldp_layout_get_config(run->layout->grid).pp;
    return pp > 1 ? pp : 1;
}

seldp_status hx_pipe_check(const hx_run *run)
{
    const hx_options *o = &run->opts;
    if (o->pipeline_schedule != HX_PIPE_DEFAULT && hx_pipe_stages(run) == 1)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--pipeline-schedule %s: needs pipeline stages (--pp > 1); this layout "
                       "has one stage",
                       hx_pipe_schedule_name(o->pipeline_schedule));
    return SELDP_OK;
}

/* ---- the links ---------------------------------------------------------------------------- */

seldp_status hx_pipe_links_setup(hx_rank *rk)
{
    hx_grid_rank *gr = rk->grid;
    int P = seldp_comm_size(gr->pp), s = gr->stage;
    seldp_comm *pairs[2] = {NULL, NULL};
    /* pairs (0,1), (2,3), ... then (1,2), (3,4), ...: a stage alone in a split joins none */
    for (int k = 0; k < 2; k++) {
        int color = (s + k) / 2, low = 2 * color - k;
        bool alone = low < 0 || low + 1 >= P;
        seldp_status st =
            seldp_comm_split(gr->pp, alone ? SELDP_COMM_NO_GROUP : color, s, &pairs[k]);
        if (st != SELDP_OK) {
            seldp_comm_destroy(pairs[0]);
            return hx_fail_lib(st, "rank %d: stage %d: splitting its pipeline group into links",
                               rk->rank, s);
        }
    }
    /* the even split holds (s, s+1) for an even stage, the odd one for an odd stage */
    gr->next = pairs[s % 2];
    gr->prev = pairs[1 - s % 2];
    if ((gr->next != NULL) != (s + 1 < P) || (gr->prev != NULL) != (s > 0)) {
        hx_pipe_links_cleanup(rk);
        return hx_fail(SELDP_ERR_INTERNAL, "rank %d: stage %d of %d: links built wrong", rk->rank,
                       s, P);
    }
    return SELDP_OK;
}

void hx_pipe_links_cleanup(hx_rank *rk)
{
    if (!rk->grid)
        return;
    seldp_comm_destroy(rk->grid->prev);
    seldp_comm_destroy(rk->grid->next);
    rk->grid->prev = rk->grid->next = NULL;
}

/* ---- the transfers ------------------------------------------------------------------------ */

/* One broadcast on a link from its rank `root` (0: the lower stage). */
static seldp_status link_broadcast(hx_rank *rk, seldp_comm *link, float *buf, size_t floats,
                                   int root, const char *what)
{
    int stage = rk->grid->stage, me = seldp_comm_rank(link);
    int peer = me == 0 ? stage + 1 : stage - 1;
    double t0 = hx_now();
    seldp_status st = seldp_comm_broadcast(link, buf, floats, SELDP_F32, root, SELDP_HOST_DEVICE);
    rk->t_dispatch += hx_now() - t0;
    if (st != SELDP_OK)
        return hx_fail_lib(st,
                           "rank %d: stage %d: broadcast of %s from stage %d on its link to "
                           "stage %d",
                           rk->rank, stage, what, root == me ? stage : peer, peer);
    return SELDP_OK;
}

static size_t floats_of(const hx_rank *rk, const hx_pass *p)
{
    return p->T * (size_t)rk->run->opts.model.d_model;
}

static seldp_comm *link_prev(const hx_rank *rk)
{
    return rk->grid ? rk->grid->prev : NULL;
}

static seldp_comm *link_next(const hx_rank *rk)
{
    return rk->grid ? rk->grid->next : NULL;
}

seldp_status hx_pipe_recv_act(hx_rank *rk, hx_pass *a)
{
    seldp_comm *l = link_prev(rk);
    return l ? link_broadcast(rk, l, a->h, floats_of(rk, a), 0, "activations") : SELDP_OK;
}

seldp_status hx_pipe_send_act(hx_rank *rk, hx_pass *a)
{
    seldp_comm *l = link_next(rk);
    return l ? link_broadcast(rk, l, a->h, floats_of(rk, a), 0, "activations") : SELDP_OK;
}

seldp_status hx_pipe_recv_grad(hx_rank *rk, hx_pass *g)
{
    seldp_comm *l = link_next(rk);
    return l ? link_broadcast(rk, l, g->dh, floats_of(rk, g), 1, "gradients") : SELDP_OK;
}

seldp_status hx_pipe_send_grad(hx_rank *rk, hx_pass *g)
{
    seldp_comm *l = link_prev(rk);
    return l ? link_broadcast(rk, l, g->dh, floats_of(rk, g), 1, "gradients") : SELDP_OK;
}

seldp_status hx_pipe_send_act_recv_grad(hx_rank *rk, hx_pass *a, hx_pass *g)
{
    seldp_status st = hx_pipe_send_act(rk, a);
    return st == SELDP_OK ? hx_pipe_recv_grad(rk, g) : st;
}

seldp_status hx_pipe_recv_act_send_grad(hx_rank *rk, hx_pass *a, hx_pass *g)
{
    seldp_status st = hx_pipe_recv_act(rk, a);
    return st == SELDP_OK ? hx_pipe_send_grad(rk, g) : st;
}
