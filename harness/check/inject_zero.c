/* --inject tied-zero (inject.h): Megatron-LM #844. With the distributed optimizer and a
 * pipeline, Megatron reduce-scattered every stage's gradient buffer over its data-parallel
 * group first and all-reduced the tied embedding over the embedding group (the first and the
 * last stage of one data-parallel rank) afterwards. The reduce-scatter leaves the reduced sum
 * only in each rank's own part of its stage's buffer and the rank's local gradient everywhere
 * else, and the word embedding lies in different parts on the two stages (first in stage 0's
 * buffer, last in the last stage's), so the cross-stage sum adds a stage's full sum to the
 * other stage's unreduced local gradient.
 *
 * Planted in the sharded reduction of the embedding set, as the framework ordered it: every
 * member's exported gradient reaches every member (an allgather over the set's communicator,
 * standing in for the stage's reduce-scatter and the embedding group's all-reduce), and each
 * member's range takes b(s, d) + b(s', d) instead of the sum over every member, where b(s, d)
 * is what data-parallel rank d of stage s holds after its stage's reduce-scatter: the stage's
 * sum on the d-th of D equal parts of the embedding (stage 0) or the (D-1-d)-th (the last
 * stage), its own gradient elsewhere. With one data-parallel rank per stage b is the local
 * gradient and the result is right, which is why the bug needs D >= 2. */
#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "set_rank.h"
#include "grid.h"
#include "inject.h"
#include "util.h"
#include "run.h"
#include "rank.h"
#include "checks.h"

/* Whether data-parallel rank d of a stage owns element e of an n-element embedding after its
 * stage's reduce-scatter over D ranks. */
static bool owns(bool first_stage, int d, int D, size_t e, size_t n)
{
    int part = (int)((e * (size_t)D) / n);
    return first_stage ? part == d : part == D - 1 - d;
}

seldp_status hx_inject_zero_emb(hx_rank *rk, const hx_rank_set *rs, seldp_shard_map *map,
                                int group_rank, float *range)
{
    if (rk->run->opts.inject != HX_FAULT_TIED_ZERO || rs->set->kind != HX_SET_EMB)
        return SELDP_OK;
    const hx_run *run = rk->run;
    const hx_set *s = rs->set;
    seldp_status st = SELDP_OK;
    float *mine = NULL, *all = NULL;
    int *stage = hx_calloc((size_t)s->size, sizeof *stage);
    int *dp = hx_calloc((size_t)s->size, sizeof *dp);
    if (!stage || !dp)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    /* the embedding this rank exported: the set covers the one tied parameter */
    const seldp_tensor *g = NULL;
    for (size_t i = 0; i < rk->n_params && !g; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && hx_rank_set_of(rk, p) == rs)
            g = seldp_grads_get(rk->grads, p->id);
    }
    if (!g)
        HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: --inject tied-zero: no exported gradient in %s",
                rk->rank, s->label);
    size_t n = seldp_tensor_numel(g);
    mine = hx_calloc(n, sizeof *mine);
    all = hx_calloc(n * (size_t)s->size, sizeof *all);
    if (!mine || !all)
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    hx_tensor_to_f32(g, mine);
    HX_CHECK_LIB(seldp_comm_allgather(rs->comm, mine, all, n * sizeof *mine, SELDP_HOST_DEVICE),
                 "rank %d: --inject tied-zero: the embedding's gradients over %s", rk->rank,
                 s->label);
    /* each member's stage and its data-parallel rank within the stage (set order) */
    int D = 0;
    for (int q = 0; q < s->size; q++) {
        const hx_rank *m = &run->ranks[s->ranks[q]];
        stage[q] = m->grid ? m->grid->stage : 0;
        for (int k = 0; k < q; k++)
            dp[q] += stage[k] == stage[q];
        D += stage[q] == 0;
    }
    int me = group_rank, partner = -1;
    for (int q = 0; q < s->size; q++)
        if (stage[q] != stage[me] && dp[q] == dp[me])
            partner = q;
    if (partner < 0 || D < 2)
        HX_FAIL(SELDP_ERR_INTERNAL,
                "rank %d: --inject tied-zero: %s holds no other stage's copy of data-parallel "
                "rank %d (or one rank per stage)",
                rk->rank, s->label, dp[me]);
    size_t n_pieces = seldp_shard_map_pieces(map, group_rank);
    for (size_t k = 0; k < n_pieces; k++) {
        seldp_shard_piece pc;
        HX_CHECK_LIB(seldp_shard_map_piece(map, group_rank, k, &pc),
                     "rank %d: piece %zu of its range of %s", rk->rank, k, s->label);
        if (pc.param_elements != n)
            HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: --inject tied-zero: %s is %zu elements, not %zu",
                    rk->rank, pc.path, pc.param_elements, n);
        for (size_t j = 0; j < pc.count; j++) {
            size_t e = pc.param_offset + j;
            float v = 0.0f;
            for (int side = 0; side < 2; side++) {
                int q = side ? partner : me;
                /* b(stage, d): the stage's sum where d owns e, d's own gradient elsewhere */
                if (owns(stage[q] == 0, dp[q], D, e, n)) {
                    float sum = 0.0f;
                    for (int u = 0; u < s->size; u++)
                        if (stage[u] == stage[q])
                            sum += all[(size_t)u * n + e];
                    v += sum;
                } else {
                    v += all[(size_t)q * n + e];
                }
            }
            range[pc.range_offset + j] = v;
        }
    }
fail:
    free(stage);
    free(dp);
    free(mine);
    free(all);
    return st;
}
