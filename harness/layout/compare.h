/* The groups a framework's run built, as a JSON file, against a layout (--compare-groups).
 *
 *   { "format": "seldp-groups",          optional; when present exactly this
 *     "framework": "megatron",           optional label, any string
 *     "world": 8,                        optional; when present, the number of ranks entries
 *     "ranks": [                         one entry per rank, every rank 0..world-1 once
 *       {"rank": 0, "tp": [0, 1], "pp": [0, 4], "cp": [0], "dp": [0, 2], "ep": [0, 2],
 *        "expert_dp": [0, 4], "expert_tp": [0, 1], "embedding": [0, 4], "experts": [0, 1]},
 *       ...] }
 *
 * The group kinds are report.json's (layout.groups): dp is the dense reduce group, data x
 * context parallel of one stage and TP rank (Megatron's get_data_parallel_group(
 * with_context_parallel=True)). Each rank lists the ranks of its own group of a kind, in any
 * order; a kind it leaves out is not compared; null says the rank has no group of that kind
 * (Megatron's middle pipeline stages have no embedding group). "experts" (optional) lists the
 * routed experts the rank holds. docs/harness-interop.md has a Python snippet that writes the
 * file from Megatron-Core's parallel_state and from a torchtitan device mesh. */
#ifndef HX_COMPARE_H
#define HX_COMPARE_H

#include <stdbool.h>
#include <stddef.h>

#include "seldp/status.h"

#include "layout.h"

/* The kinds compared, in this order for each rank (after them, "experts"). */
#define HX_COMPARE_KINDS 8

/* One rank's groups as the file gives them. */
typedef struct hx_rank_groups {
    bool listed[HX_COMPARE_KINDS + 1]; /* the kind is in the entry ([HX_COMPARE_KINDS]: experts) */
    int size[HX_COMPARE_KINDS + 1];    /* -1: null, no group */
    int *ranks[HX_COMPARE_KINDS + 1];  /* sorted ascending */
} hx_rank_groups;

typedef struct hx_groups_file {
    int world;
    char framework[32];
    hx_rank_groups *ranks; /* [world], by rank */
} hx_groups_file;

/* Parse a groups file (`len` bytes; `what` names it in messages). On failure
 * SELDP_ERR_PARSE or _INVALID_ARGUMENT with one line naming the file, line:column and the
 * member; *out is NULL. Free with hx_groups_file_free. */
seldp_status hx_groups_file_parse(const char *text, size_t len, const char *what,
                                  hx_groups_file **out);
void hx_groups_file_free(hx_groups_file *f);

/* Compare layout l with f rank by rank (ranks ascending, kinds in the order of report.json's
 * layout.groups, then experts). Returns true when every listed group equals the layout's; else
 * false with the first difference in msg: the rank, the kind, both groups. */
bool hx_groups_compare(const hx_layout *l, const hx_groups_file *f, char *msg, size_t size);

/* The key of kind k in the file: "tp" ... "embedding", "experts". */
const char *hx_compare_kind_name(int k);

#endif
