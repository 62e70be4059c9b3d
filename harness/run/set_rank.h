/* A rank's memberships of the replica sets (set_rank.c): the communicators split round by
 * round, the sessions initialized from their roots, the weight and the export scale of each
 * set's reduction. */
#ifndef HX_SET_RANK_H
#define HX_SET_RANK_H

#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "replica_sets.h"

struct hx_rank;

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

/* The weight rk reduces set s with this step (a planted bug's included), and the scale its
 * gradients of s are exported with: 1 / the global token count for a set that sums, else 1
 * (times a planted bug's factor). */
uint64_t hx_set_weight_of(const struct hx_rank *rk, const hx_set *s);
double hx_set_export_scale(const struct hx_rank *rk, const hx_set *s);

struct hx_run;
/* The sessions' settings of the run (--bucket-bytes). */
seldp_session_config hx_session_config(const struct hx_run *run);

#endif
