/* The replica-set list's builders and lookups (sets.c): the list itself is
 * replica_sets.h. Only the two builders here know the run kind. */
#ifndef HX_SETS_H
#define HX_SETS_H

#include <stdbool.h>

#include "tinymoe.h"

#include "replica_sets.h"

struct hx_run;

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

/* ---- a rank's memberships (the rank's list is set_rank.h's) ---- */

struct hx_rank;

/* rk's membership of set s, or NULL. */
const hx_rank_set *hx_rank_membership(const struct hx_rank *rk, const hx_set *s);

/* The membership of rk that reduces p, or NULL. */
hx_rank_set *hx_rank_set_of(struct hx_rank *rk, const tm_param_info *p);

#endif
