/* Group layouts of an MoE run: who replicates the shared parameters, which ranks form each
 * expert-parallel group, which ranks own each expert, and the roots that initialize them.
 *
 * A layout is pure data, built either from (world, ep, order) or from a JSON layout file,
 * then validated; hx_layout_split turns it into communicators, every one split from the
 * world. Ranks are world ranks everywhere in this struct.
 *
 *   ep-dp (DeepSpeed's and Megatron-Core's default with TP = 1): expert-parallel groups are
 *   consecutive ranks, expert-data groups strided. World 8, ep 4:
 *       EP groups   [0,1,2,3] [4,5,6,7]      expert-data groups [0,4] [1,5] [2,6] [3,7]
 *   dp-ep (the transpose):
 *       EP groups   [0,2,4,6] [1,3,5,7]      expert-data groups [0,1] [2,3] [4,5] [6,7]
 *   In both, the rank at position j of its EP group owns experts j*E/ep .. (j+1)*E/ep - 1.
 *
 * The layout file (strict JSON; ranks are world ranks):
 *   { "description": "optional text",
 *     "world": 4,                           optional: implied by ep_groups
 *     "shared_root": 0,                     optional: --roots decides
 *     "ep_groups": [[0, 1], [2, 3]],        a partition of the world
 *     "experts": [                          one entry per expert, in expert order
 *       {"owners": [0, 2], "root": 2},      root optional: --roots decides
 *       {"owners": [0, 1, 2, 3]},           a hot expert, replicated twice per EP group
 *       ...],
 *     "framework": "megatron", "order": "tp-cp-ep-dp-pp",   optional, as report.json writes
 *     "tp": 1, "pp": 1, "cp": 1, "ep": 4, "etp": 1,          them
 *     "groups": {"tp": [[0], ...], ...},                      optional, not read where tp, pp,
 *                                                             cp and etp are 1: the groups
 *                                                             follow from ep_groups, experts
 *     "roots": "last" }                     optional: the rule (first, last, spread; null: the
 *                                           framework's) for the roots no member names
 * Every expert needs an owner inside every EP group (a token is only served inside its
 * EP group); an expert's owners form its expert-data group.
 *
 * With tp, pp, cp or etp above 1, or a framework named beside "groups" (a framework's layout
 * as --print-layout --json writes it), the file describes the full grid: "groups" lists every kind
 * (tp, pp, cp, dp, ep, expert_dp, expert_tp; embedding optional), built and checked by
 * seldp_layout_create_from_groups into layout->grid; "ep" (optional) must be the EP groups'
 * size, "ep_groups" (optional) must repeat groups.ep, "world" defaults to the ranks of
 * groups.tp; "experts" holds one entry per expert whose owners, if given, must be the ranks
 * of its EP position (no uneven or redundant owners there), and "root" chooses its root;
 * "framework" (a name, "none" or null) and "order" are labels the layout carries. */
#ifndef HX_LAYOUT_H
#define HX_LAYOUT_H

#include <stdbool.h>
#include <stdio.h>

#include "seldp/comm.h"
#include "seldp/layout.h"
#include "seldp/status.h"

#include "util.h"

typedef enum hx_order {
    HX_ORDER_EP_DP = 0, /* EP groups consecutive, expert-data groups strided */
    HX_ORDER_DP_EP = 1  /* EP groups strided, expert-data groups consecutive */
} hx_order;

/* How roots are chosen where the layout does not name them. */
typedef enum hx_roots {
    HX_ROOTS_FIRST = 0, /* the group's first rank (DeepSpeed, Megatron-Core) */
    HX_ROOTS_LAST = 1,  /* the group's last rank */
    HX_ROOTS_SPREAD = 2 /* group rank (group index mod size): roots on different ranks */
} hx_roots;

/* A set of world ranks in group-rank order (ascending), with an optional root. */
typedef struct hx_group {
    int size;
    int *ranks;
    int root; /* a world rank of the group; -1 where no root is used (EP groups) */
} hx_group;

typedef struct hx_layout {
    int world;
    int experts;
    char *name;        /* "ep-dp, world 8, ep 4", or the layout file's base name */
    char *description; /* the generated name again, or the file's "description" ("" if none) */
    hx_group shared;   /* the whole world */
    int n_ep;
    hx_group *ep;     /* [n_ep] expert-parallel groups, a partition of the world */
    int *ep_of;       /* [world] EP group of each rank */
    hx_group *owners; /* [experts] the owners of each expert and the root it is initialized
                         from: its expert-data group */
    /* Derived: experts with the same owners and root share one expert-data group (one
     * communicator, one session), as the experts of one DeepSpeed slot do. */
    int n_data;
    hx_group *data; /* [n_data] */
    int *data_of;   /* [experts] data group of each expert */
    /* The framework's whole grid (every group kind, sizes) the layout was generated from;
     * NULL for a layout file. */
    seldp_layout *grid;
    /* The rule for the roots the groups do not list (a grid's dense, sequence-parallel,
     * embedding and expert-data replica sets): named by a layout file's "roots" or by --roots
     * (hx_layout_roots_merge); otherwise each framework's own, group rank 0. */
    hx_roots roots;
    bool roots_named;
} hx_layout;

/* A framework preset (docs/harness.md, Framework presets): --framework, --order, --tp, --pp, --cp,
 * --etp. */
typedef struct hx_grid {
    seldp_framework framework;
    bool framework_given; /* --framework on the command line */
    const char *order;    /* NULL: the framework's default; "ep-dp", "dp-ep" or a Megatron order */
    int tp, pp, cp;
    int etp; /* 0: the framework's default */
} hx_grid;

#define HX_GRID_INIT                                                                               \
    {                                                                                              \
        SELDP_FRAMEWORK_MEGATRON, false, NULL, 1, 1, 1, 0                                          \
    }

/* The framework's layout of `grid` over `world` ranks with expert-parallel size `ep` and
 * `experts` experts, any sizes (the library's seldp_layout_create). A combination the
 * framework rejects fails with SELDP_ERR_INVALID_ARGUMENT and its reason, one line. */
seldp_status hx_grid_build(const hx_grid *grid, int world, int ep, int experts, seldp_layout **out);

/* As hx_layout_generate, the groups coming from the framework preset `grid` (any sizes the
 * framework accepts; the run checks what the sharded tiny-moe needs of them, grid.h). */
seldp_status hx_layout_generate_grid(int world, int ep, int experts, const hx_grid *grid,
                                     hx_roots roots, hx_layout **out);

/* Build the layout of `world` ranks with expert-parallel size `ep` and `experts` experts
 * (Megatron-Core's groups for the order "ep-dp" or "dp-ep", through the library's layout
 * module). SELDP_ERR_INVALID_ARGUMENT, naming the option, unless ep >= 1 divides world and
 * experts. */
seldp_status hx_layout_generate(int world, int ep, int experts, hx_order order, hx_roots roots,
                                hx_layout **out);

/* Parse and validate a layout file. `world` and `experts` are the values required by the
 * caller, or 0 to take them from the file. Errors (SELDP_ERR_PARSE, _INVALID_ARGUMENT,
 * _IO) are one line naming the file, the line:column and what is wrong. */
seldp_status hx_layout_load(const char *path, int world, int experts, hx_roots roots,
                            hx_layout **out);

/* As hx_layout_load from text in memory; `what` names it in messages. */
seldp_status hx_layout_parse(const char *text, size_t len, const char *what, int world, int experts,
                             hx_roots roots, hx_layout **out);

/* Check a layout's invariants: the EP groups partition the world, every expert has an owner
 * in every EP group, owners are distinct ranks of the world, every root is in its group.
 * Also computes the derived data groups. `what` prefixes the messages. */
seldp_status hx_layout_validate(hx_layout *layout, const char *what);

void hx_layout_destroy(hx_layout *layout);

/* The owners of expert e inside EP group g, ascending; returns their count (may be 0). */
int hx_layout_owners_in(const hx_layout *layout, int e, int g, int *out);

/* True when world rank r owns expert e. */
bool hx_layout_owns(const hx_layout *layout, int r, int e);

/* The experts rank r owns, ascending; returns their count. `out` holds layout->experts. */
int hx_layout_owned(const hx_layout *layout, int r, int *out);

/* The layout as a layout file (JSON), so that `--layout-file` reproduces it, with the sizes
 * and every group kind (docs/formats.md, Reports: groups.tp, pp, cp, dp, ep, expert_dp, expert_tp,
 * embedding, each a list of sorted rank lists). */
void hx_layout_json(const hx_layout *layout, hx_buf *buf);

/* Settle the roots rule of a layout and the command line's --roots (`roots`, `given`): a
 * layout file that names one sets it when --roots is absent (and *roots, *given follow it); a
 * --roots that differs from the file's is refused (SELDP_ERR_INVALID_ARGUMENT, one line);
 * --roots given names the layout's rule. Call once after building or loading the layout. */
seldp_status hx_layout_roots_merge(hx_layout *layout, hx_roots *roots, bool *given);

/* "first", "last" or "spread". */
const char *hx_layout_roots_word(hx_roots roots);

/* The per-rank table: rank, device, shared group, EP group, expert-data groups (root marked
 * with *), owned experts; the columns as wide as their widest cell. device_names[r] may be
 * NULL for "host". */
void hx_layout_print(const hx_layout *layout, const char *const *device_names, FILE *out);

/* Format a group's ranks as "[0,4]" or "[0-7]" for a consecutive run. */
void hx_group_str(const hx_group *group, char *buf, size_t size);

/* The communicators of one rank that the layout makes for computing (its replica sets' are
 * sets.h's). */
typedef struct hx_rank_comms {
    seldp_comm *ep; /* its expert-parallel group */
} hx_rank_comms;

/* Collective over `world` (every rank calls it, in the same order): split the EP groups from
 * the world, group ranks in the order of hx_group.ranks. */
seldp_status hx_layout_split(const hx_layout *layout, seldp_comm *world, hx_rank_comms *out);

/* Destroy the communicators of hx_layout_split (not the world). */
void hx_rank_comms_destroy(hx_rank_comms *comms);

/* The group rank of world rank r in `group`, or -1. */
int hx_group_rank(const hx_group *group, int r);

#endif
