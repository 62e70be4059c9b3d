/* The replica sets of a run: one list, built once, of every group of ranks that replicates a
 * part of the model, with what each reduces, how and from which root.
 *
 * Every step iterates it: initialize, the blocking and the overlapped reductions, the global
 * gradient norm, the planted framework bugs, the checkpoint writers, the replica checks, the
 * labels of the console and the reports. Only the two builders (sets.c) know the run kind:
 *
 *   unsharded (a layout or a layout file)   shared  every shared parameter over the dense
 *                                                   reduce group (the world: dp x cp)
 *                                           data    the experts of one expert-data group
 *   sharded (tp, pp or etp > 1)             dense   the dense reduce group (dp x cp of one
 *                                                   stage and TP rank): the vocabulary-parallel
 *                                                   embedding (pp = 1), the shared expert; at
 *                                                   tp = 1 the norms and routers too
 *                                           sp      tp > 1: the sequence-parallel norms, routers
 *                                                   and final norm over the stage (dp x cp x tp)
 *                                           emb     pp > 1: the tied embedding's two copies
 *                                                   (first and last stage) of one TP rank
 *                                           expert  each owned expert's ETP shard over its
 *                                                   expert-data group
 *                                           expert-tp  etp > 1 with quantized experts: the
 *                                                   adapters every ETP shard holds whole, over
 *                                                   the expert-data groups of its ETP ranks
 * A set that sums takes gradients already divided by the global token count (its members'
 * contributions are parts of one global objective); the others take a weighted mean of
 * loss-sum gradients, the weight counting the tokens behind them. */
#ifndef HX_REPLICA_SETS_H
#define HX_REPLICA_SETS_H

#include <stdbool.h>
#include <stdint.h>

#include "seldp/session.h"

typedef enum hx_set_kind {
    HX_SET_SHARED = 0,
    HX_SET_DATA = 1,
    HX_SET_DENSE = 2,
    HX_SET_SP = 3,
    HX_SET_EMB = 4,
    HX_SET_EXPERT = 5,
    HX_SET_EXPERT_TP = 6,
    HX_SET_KINDS
} hx_set_kind;

/* How a rank weighs its gradients in a set's reduction. */
typedef enum hx_set_weight {
    HX_WEIGHT_TOKENS,      /* its own tokens */
    HX_WEIGHT_TP_TOKENS,   /* the tokens of its TP group (their shards' gradients together) */
    HX_WEIGHT_DATA_SHARE,  /* the tokens of its EP group it serves in this expert-data group */
    HX_WEIGHT_EXPERT_ROWS, /* the rows its expert shards serve (its expert-TP peers' EP groups) */
    HX_WEIGHT_ACTIVE       /* 1 (a sum: the weight only says the rank takes part) */
} hx_set_weight;

typedef struct hx_set {
    int index; /* in hx_sets.sets */
    hx_set_kind kind;
    int round;  /* the split round that builds its communicator */
    int data;   /* HX_SET_DATA: its expert-data group (hx_layout.data); else -1 */
    int size;   /* members */
    int *ranks; /* [size] world ranks in group-rank order */
    int root;   /* the world rank it is initialized from, and its checkpoint writer */
    bool sums;  /* sum, else a weighted mean */
    hx_set_weight weight;
    char name[24];  /* the framework's name of the group: dp, dp-cp, expert-dp, embedding, ... */
    char label[64]; /* "dp-cp [0,2,4,6]": the name and its ranks, for messages and tables */
} hx_set;

typedef struct hx_sets {
    int n;
    hx_set *sets; /* [n] in reduction order: the order every member initializes and reduces */
    int n_rounds;
    int *member; /* [n_rounds * world]: the set world rank r belongs to in round k, or -1 */
} hx_sets;

/* One set as a member holds it (set_rank.h). */
typedef struct hx_rank_set {
    const hx_set *set;
    seldp_comm *comm;
    seldp_session *session;
    uint64_t global_weight; /* what the step's reduction returned */
} hx_rank_set;

#endif
