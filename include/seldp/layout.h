/** @file
 * Layouts of the parallel grid as the frameworks build them: for a world and the sizes
 * (tp, pp, cp, ep, etp), every group of every kind (tensor, pipeline, context, dense
 * data × context, expert-parallel, expert-data, expert-tensor, embedding), which EP
 * position owns which experts, and each group's broadcast root, rank for rank as
 * Megatron-Core, Megatron-Core 0.9, DeepSpeed or torchtitan construct them.
 *
 * A layout is pure data: building one communicates nothing. A rank gets the colour and
 * key of each group kind from seldp_layout_split_args and builds the communicator with
 * seldp_comm_split:
 *
 *     int color, key;
 *     seldp_layout_split_args(layout, SELDP_GROUP_EXPERT_DP, my_rank, &color, &key);
 *     seldp_comm_split(world, color, key, &expert_dp);   // NULL where color is NO_GROUP
 *
 * Conventions, the same for every framework: ranks are world ranks; a group lists its
 * ranks ascending (the group rank torch.distributed.new_group gives them); the groups of
 * a kind are ordered by their lowest rank, and that index is the split colour. */
#ifndef SELDP_LAYOUT_H
#define SELDP_LAYOUT_H

#include <stddef.h>

#include "seldp/export.h"
#include "seldp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The framework whose group construction a layout reproduces. */
typedef enum seldp_framework {
    SELDP_FRAMEWORK_NONE = -1,        /**< none: groups given explicitly, any that are valid */
    SELDP_FRAMEWORK_MEGATRON = 0,     /**< Megatron-Core: separate expert grid (etp, ep, edp, pp) */
    SELDP_FRAMEWORK_MEGATRON_0_9 = 1, /**< Megatron-Core 0.9: EP carved out of data parallelism */
    SELDP_FRAMEWORK_DEEPSPEED = 2,    /**< DeepSpeed-MoE groups (deepspeed/utils/groups.py) */
    SELDP_FRAMEWORK_TORCHTITAN = 3    /**< torchtitan's dense and sparse device meshes */
} seldp_framework;

/** Number of frameworks. */
#define SELDP_FRAMEWORKS 4

/** The kinds of group a layout holds. */
typedef enum seldp_group_kind {
    SELDP_GROUP_TP = 0,        /**< tensor parallel */
    SELDP_GROUP_PP = 1,        /**< pipeline parallel: one rank per stage */
    SELDP_GROUP_CP = 2,        /**< context parallel */
    SELDP_GROUP_DP = 3,        /**< the dense reduce group: data × context of one stage, TP rank */
    SELDP_GROUP_EP = 4,        /**< expert parallel: the all-to-all group */
    SELDP_GROUP_EXPERT_DP = 5, /**< expert data parallel: the replicas of one expert shard */
    SELDP_GROUP_EXPERT_TP = 6, /**< expert tensor parallel: the shards of one expert */
    SELDP_GROUP_EMBEDDING = 7  /**< first and last stage: the tied embedding */
} seldp_group_kind;

/** Number of group kinds. */
#define SELDP_GROUP_KINDS 8

/** What to build. Grows at the end. */
typedef struct seldp_layout_config {
    size_t struct_size; /**< sizeof(seldp_layout_config) as the caller's header declared it: set by
                           SELDP_LAYOUT_CONFIG_INIT, which every config must start from (the struct
                           grows at the end) */
    seldp_framework framework; /**< whose group construction to reproduce */
    int world;                 /**< ranks; tp * pp * cp must divide it (dp is the quotient) */
    int tp;                    /**< tensor parallel size */
    int pp;                    /**< pipeline stages */
    int cp;                    /**< context parallel size */
    int ep;                    /**< expert parallel size */
    int etp;     /**< expert tensor parallel size; 0: the framework's default (Megatron: tp,
                      Megatron 0.9: tp, DeepSpeed: 1, torchtitan: 1) */
    int experts; /**< routed experts, for ownership; 0: no ownership */
    /** Megatron: its order string (default "tp-cp-ep-dp-pp"); DeepSpeed: "ep-dp" (default,
     * expert before data) or "dp-ep" (use_data_before_expert_parallel_); torchtitan: NULL.
     * Copied. */
    const char *order;
} seldp_layout_config;

/** Initializer of seldp_layout_config: Megatron-Core, one rank, every size 1. */
#define SELDP_LAYOUT_CONFIG_INIT                                                                   \
    {                                                                                              \
        sizeof(seldp_layout_config), SELDP_FRAMEWORK_MEGATRON, 1, 1, 1, 1, 1, 0, 0, NULL           \
    }

/** A built layout (opaque, immutable, safe to share between threads). */
typedef struct seldp_layout seldp_layout;

/** Build the layout of `cfg`. On success *out is the caller's to destroy. A combination
 * the framework rejects fails with SELDP_ERR_INVALID_ARGUMENT and the framework's reason,
 * naming the sizes; *out is then untouched. */
SELDP_API seldp_status seldp_layout_create(const seldp_layout_config *cfg, seldp_layout **out);

/** Explicit groups of every kind (seldp_layout_create_from_groups). Grows at the end. */
typedef struct seldp_layout_groups {
    size_t struct_size; /**< sizeof(seldp_layout_groups) as the caller's header declared it: set
                           by SELDP_LAYOUT_GROUPS_INIT, which every value must start from */
    seldp_framework framework; /**< whose groups these are, as a label the layout's config
                                    carries (not compared with the preset); NONE by default */
    const char *order;         /**< the framework's order string, a label as well (copied); NULL */
    int world;                 /**< ranks */
    int tp;                    /**< tensor parallel size */
    int pp;                    /**< pipeline stages */
    int cp;                    /**< context parallel size; tp * pp * cp must divide world */
    int ep;                    /**< expert parallel size */
    int etp;                   /**< expert tensor parallel size; etp * ep * pp must divide world */
    int experts;               /**< routed experts (a multiple of ep), for ownership; 0: none */
    /** Per kind k: count[k] groups of size[k] ranks in groups[k]. The sizes must be tp, pp,
     * cp, world / (tp * pp), ep, world / (etp * ep * pp), etp and, for the embedding, 2 (1
     * where pp is 1). */
    int count[SELDP_GROUP_KINDS];
    int size[SELDP_GROUP_KINDS]; /**< the ranks of each group of a kind (see count) */
    /** The groups of each kind, flat: count[k] * size[k] ranks, groups and ranks in any
     * order (not copied: read during the call); groups[SELDP_GROUP_EMBEDDING] NULL: the first
     * and last rank of each pipeline group. */
    const int *groups[SELDP_GROUP_KINDS];
} seldp_layout_groups;

/** Initializer of seldp_layout_groups: no framework, one rank, every size 1, no groups. */
#define SELDP_LAYOUT_GROUPS_INIT                                                                   \
    {                                                                                              \
        sizeof(seldp_layout_groups), SELDP_FRAMEWORK_NONE, NULL, 1, 1, 1, 1, 1, 1, 0, {0}, {0},    \
        {                                                                                          \
            NULL                                                                                   \
        }                                                                                          \
    }

/** Build a layout from explicit groups, e.g. a framework's printed groups or a grid no preset
 * builds. Every kind but the embedding must partition the world, and the groups must fit
 * together as the frameworks' do: a TP group lies inside one stage; a dense (dp) group is the
 * ranks of one stage and TP position; a CP group lies inside one dense group, and the TP
 * groups of its ranks, in CP order, are the same for every rank of them (a data shard is a
 * block of tp x cp ranks); a pipeline group's ranks share their TP and CP positions; an EP
 * group and an expert-TP group lie inside one stage, the first at one expert-TP position, the
 * second at one EP position; an expert-data group is the ranks of one stage, EP position and
 * expert-TP position; the embedding groups are the ends of the pipeline groups. A stage is
 * the position in the pipeline group (its ranks ascending); EP position j owns experts
 * j * experts / ep onwards; roots are group rank 0, as for the presets. Anything else fails
 * with SELDP_ERR_INVALID_ARGUMENT and one line naming the kind, the group or rank, and what
 * was expected; *out is then untouched. On success *out is the caller's to destroy. */
SELDP_API seldp_status seldp_layout_create_from_groups(const seldp_layout_groups *groups,
                                                       seldp_layout **out);

/** Free a layout. NULL is a no-op. */
SELDP_API void seldp_layout_destroy(seldp_layout *layout);

/** The configuration with every default resolved (etp, order). The order string is owned
 * by the layout. */
SELDP_API seldp_layout_config seldp_layout_get_config(const seldp_layout *layout);

/** The data-parallel size of the dense grid: world / (tp * pp * cp). */
SELDP_API int seldp_layout_dp(const seldp_layout *layout);

/** Number of groups of `kind`. */
SELDP_API int seldp_layout_group_count(const seldp_layout *layout, seldp_group_kind kind);

/** Group `index` of `kind`: returns its size and points *ranks at its ranks (ascending,
 * owned by the layout); 0 and *ranks = NULL for an index out of range. */
SELDP_API int seldp_layout_group(const seldp_layout *layout, seldp_group_kind kind, int index,
                                 const int **ranks);

/** Index of the group of `kind` that world rank `rank` belongs to, or -1 (a rank of a
 * middle pipeline stage has no embedding group; a rank outside the world none at all). */
SELDP_API int seldp_layout_group_of(const seldp_layout *layout, seldp_group_kind kind, int rank);

/** Position of `rank` inside its group of `kind` (its group rank), or -1. */
SELDP_API int seldp_layout_position(const seldp_layout *layout, seldp_group_kind kind, int rank);

/** The world rank group `index` of `kind` broadcasts from (its group rank 0, as
 * Megatron's and DeepSpeed's broadcasts use), or -1 for an index out of range. */
SELDP_API int seldp_layout_root(const seldp_layout *layout, seldp_group_kind kind, int index);

/** The colour and key that build `rank`'s group of `kind` with seldp_comm_split: colour
 * the group index (SELDP_COMM_NO_GROUP where the rank has none), key its position.
 * SELDP_ERR_INVALID_ARGUMENT for a rank outside the world or an unknown kind. */
SELDP_API seldp_status seldp_layout_split_args(const seldp_layout *layout, seldp_group_kind kind,
                                               int rank, int *color, int *key);

/** The routed experts `rank` owns: experts *first .. *first + count - 1, where count =
 * experts / ep and *first = (EP position) * count, as every framework assigns them (all
 * expert-TP shards of an expert share its owners' EP positions). Returns count; 0 when
 * the layout was built without experts. */
SELDP_API int seldp_layout_local_experts(const seldp_layout *layout, int rank, int *first);

/** Pipeline stage of `rank` (its position in its PP group). */
SELDP_API int seldp_layout_stage(const seldp_layout *layout, int rank);

/** "megatron", "megatron-0.9", "deepspeed", "torchtitan" or "none"; "invalid" otherwise. */
SELDP_API const char *seldp_framework_name(seldp_framework framework);

/** Parse a framework name (as seldp_framework_name writes it). SELDP_ERR_INVALID_ARGUMENT,
 * naming the accepted names, for anything else. */
SELDP_API seldp_status seldp_framework_parse(const char *name, seldp_framework *out);

/** "tp", "pp", "cp", "dp", "ep", "expert_dp", "expert_tp" or "embedding" (the keys of the
 * harness's report); "invalid" otherwise. */
SELDP_API const char *seldp_group_kind_name(seldp_group_kind kind);

#ifdef __cplusplus
}
#endif
#endif
