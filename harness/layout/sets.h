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
#ifndef HX_SETS_H
#define HX_SETS_H

#include <stdbool.h>
#include <stdint.h>

#include "seldp/session.h"
#include "tinymoe.h"

struct hx_run;
struct hx_rank;

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

/* Build run->sets from run->layout and the options (--roots decides every root the layout
 * does not name; the framework's own rule without it). A failure is a usage error, one line. */
seldp_status hx_sets_build(struct hx_run *run);
void hx_sets_free(hx_sets *s);

/* The kind's word: "shared", "expert-data", "dense", ... */
const char *hx_set_kind_name(hx_set_kind kind);

/* True when set s reduces (and initializes) parameter p as rank r holds it. */
bool hx_set_covers(const struct hx_run *run, const hx_set *s, int r, const tm_param_info *p);

/* The set that reduces p on rank r (at most one does), or NULL for a parameter no set
 * selects (frozen quantized bases are selected: they are broadcast, never reduced). */
const hx_set *hx_set_of(const struct hx_run *run, int r, const tm_param_info *p);

/* The first set of `kind` world rank r belongs to, or NULL. */
const hx_set *hx_set_member(const struct hx_run *run, int r, hx_set_kind kind);

/* The group rank of world rank r in s, or -1. */
int hx_set_position(const hx_set *s, int r);

/* True when rank r writes p into a checkpoint: the root of p's set, for the first shard of a
 * sharded tensor (the writer gathers the others); the tied embedding's set writes one copy. */
bool hx_set_writes(const struct hx_run *run, int r, const tm_param_info *p);

/* ---- a rank's memberships ---------------------------------------------------------------- */

/* One set as a member holds it. */
typedef struct hx_rank_set {
    const hx_set *set;
    seldp_comm *comm;
    seldp_session *session;
    uint64_t global_weight; /* what the step's reduction returned */
} hx_rank_set;

/* The rank's memberships in reduction order into rk->sets (rk->n_sets), without
 * communicators (a mirror of another process's rank), and with them: collective over the
 * world, every rank splits every round. On failure what was made stays for
 * hx_rank_sets_cleanup. */
seldp_status hx_rank_sets_list(struct hx_rank *rk);
seldp_status hx_rank_sets_split(struct hx_rank *rk);
/* Initialize every set of the rank from its root, with the check that nothing outside its
 * selection moved (collective over each set). */
seldp_status hx_rank_sets_init(struct hx_rank *rk);
void hx_rank_sets_cleanup(struct hx_rank *rk);

/* rk's membership of set s, or NULL. */
const hx_rank_set *hx_rank_membership(const struct hx_rank *rk, const hx_set *s);

/* The membership of rk that reduces p, or NULL. */
hx_rank_set *hx_rank_set_of(struct hx_rank *rk, const tm_param_info *p);

/* The weight rk reduces set s with this step (a planted bug's included), and the scale its
 * gradients of s are exported with: 1 / the global token count for a set that sums, else 1
 * (times a planted bug's factor). */
uint64_t hx_set_weight_of(const struct hx_rank *rk, const hx_set *s);
double hx_set_export_scale(const struct hx_rank *rk, const hx_set *s);

#endif
