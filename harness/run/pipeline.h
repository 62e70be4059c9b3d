/* Pipeline-parallel schedules (docs/harness.md, Micro-batches: Pipelines): the order in which a
 * stage runs its micro-batches' forwards and backwards (--pipeline-schedule), the transfers
 * between adjacent stages on a communicator of each pair, and one micro-batch's pass through a
 * rank's stage, kept from its forward to its backward.
 *
 * Stage s of P exchanges with its neighbours only: activations go from s to s + 1 and
 * gradients from s + 1 to s, each a broadcast on the pair's own communicator (the lower stage
 * is its rank 0). Megatron's combined exchanges of the steady state (send the activations and
 * receive the gradients, or send the gradients and receive the next activations) are the two
 * broadcasts in one order on both sides of the pair: the activations first, then the
 * gradients, so that the two ranks' sequences on every link are the same for every schedule,
 * P and M (hx_pipe_plan; tests/harness/test_pipeline_schedule.c checks the sequences and that
 * no stage waits forever). Every schedule runs the backwards in micro-batch order 0..M-1, so
 * the gradients accumulate in the same order, bit for bit, under each. */
#ifndef HX_PIPELINE_H
#define HX_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "options.h"
#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* What a stage does next: a forward or a backward of micro-batch m, or a transfer on the link
 * to the previous stage (RECV_ACT, SEND_GRAD, RECV_ACT_SEND_GRAD) or to the next one
 * (SEND_ACT, RECV_GRAD, SEND_ACT_RECV_GRAD). The combined ones move the activations of
 * micro-batch m and the gradients of micro-batch g, in that order. */
typedef enum hx_pipe_op {
    HX_PIPE_FORWARD,
    HX_PIPE_BACKWARD,
    HX_PIPE_RECV_ACT,
    HX_PIPE_SEND_ACT,
    HX_PIPE_RECV_GRAD,
    HX_PIPE_SEND_GRAD,
    HX_PIPE_SEND_ACT_RECV_GRAD, /* Megatron's send_forward_recv_backward */
    HX_PIPE_RECV_ACT_SEND_GRAD  /* Megatron's send_backward_recv_forward */
} hx_pipe_op;

typedef struct hx_pipe_action {
    hx_pipe_op op;
    int m; /* the micro-batch of the forward, backward or activations */
    int g; /* the combined transfers: the micro-batch of the gradients */
} hx_pipe_action;

/* The most actions a stage's plan has for M micro-batches. */
#define HX_PIPE_ACTIONS_MAX(M) (6 * (size_t)(M) + 2)

/* Stage `stage` of P under `schedule` with M micro-batches: its actions in order into `out`
 * (HX_PIPE_ACTIONS_MAX(M) entries); returns their count. A transfer to a stage that does not
 * exist (before stage 0, after stage P - 1) is left out, a combined one reduced to its half. */
size_t hx_pipe_plan(hx_pipe_schedule schedule, int stage, int P, int M, hx_pipe_action *out);

/* The most micro-batches a stage of P holds at once under `schedule` (1F1B: min(M, P), AFAB:
 * M, sequential: 1): micro-batch m's caches are set m mod that. */
int hx_pipe_in_flight(hx_pipe_schedule schedule, int P, int M);

/* The run's pipeline stages (1 without pipeline parallelism). */
int hx_pipe_stages(const hx_run *run);

/* --pipeline-schedule against the layout (a usage error, one line): it needs pipeline stages
 * (--pp > 1). */
seldp_status hx_pipe_check(const hx_run *run);

/* A rank of a pipeline (grid_rank.c, pp > 1): the communicators of its two links, split from
 * its pipeline group (pairs (0,1), (2,3), ... then (1,2), (3,4), ...); every rank of the
 * group calls it. NULL links where the stage has no neighbour. */
seldp_status hx_pipe_links_setup(hx_rank *rk);
void hx_pipe_links_cleanup(hx_rank *rk);

/* One micro-batch's pass through rank rk's stage (dispatch.c): its activations (h: the stage's
 * input, received or embedded, then its output; dh: the gradient of its output, received or
 * from the head, then of its input), the expert exchange plans and routing its forward keeps
 * for its backward, its choices, tokens per expert and loss. Made for the rank's token view of
 * the micro-batch (rk->tokens, rk->T, rk->counts). */
typedef struct hx_pass {
    size_t T;
    float *h, *dh; /* (T,D) where the rank computes */
    float *slot_in, *slot_out;
    int64_t *token_of_slot;
    struct hx_layer_plan *plans;    /* (L) */
    struct hx_expert_route *routes; /* (E) */
    int *choices;                   /* (L,T,K) the router's choices before dropping */
    int64_t *local_routed;          /* (L,E) this rank's slots per expert */
    double loss_sum;                /* the head's loss sum and the router losses */
} hx_pass;

seldp_status hx_pass_create(hx_rank *rk, hx_pass **out);
void hx_pass_free(hx_rank *rk, hx_pass *p);
/* The forward: the step's or the next micro-batch's start (rk->micro == 0: tm_begin_step) and
 * the embedding (on a later stage it only sizes the caches), then the stage's layers, then on
 * the last stage the head (the loss and dh; with --overlap the head's gradients marked ready)
 * and the router losses. */
seldp_status hx_pass_embed(hx_rank *rk, hx_pass *p);
seldp_status hx_pass_layers(hx_rank *rk, hx_pass *p);
seldp_status hx_pass_head(hx_rank *rk, hx_pass *p);
/* The backward of the stage's layers (with --overlap each layer's gradients marked ready), then
 * the embedding's (stage 0; with --overlap the rest marked ready). */
seldp_status hx_pass_backward(hx_rank *rk, hx_pass *p);
seldp_status hx_pass_embed_backward(hx_rank *rk, hx_pass *p);

/* The transfers on rk's links (no-ops where the stage has no such neighbour): a's
 * activations, g's gradients. */
seldp_status hx_pipe_recv_act(hx_rank *rk, hx_pass *a);
seldp_status hx_pipe_send_act(hx_rank *rk, hx_pass *a);
seldp_status hx_pipe_recv_grad(hx_rank *rk, hx_pass *g);
seldp_status hx_pipe_send_grad(hx_rank *rk, hx_pass *g);
seldp_status hx_pipe_send_act_recv_grad(hx_rank *rk, hx_pass *a, hx_pass *g);
seldp_status hx_pipe_recv_act_send_grad(hx_rank *rk, hx_pass *a, hx_pass *g);

#endif
