/* The main thread's checks between the ranks' phases (docs/harness.md, Checks): replicas
 * after initialize, then after each step every reduced gradient against the FP64 reference
 * (verdict.c), bit-identical replicas and experts no token reached. Every outcome is counted
 * in run->checks; none stops the run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sets.h"
#include "set_rank.h"
#include "step_checks.h"

#include "checks.h"
#include "grid.h"
#include "rank.h"
#include "run.h"
#include "verdict.h"

static void merge_local(hx_check_result *into, hx_check_result *from)
{
    into->tested += from->tested;
    if (from->failed && into->failed == 0)
        memcpy(into->first_failure, from->first_failure, sizeof into->first_failure);
    into->failed += from->failed;
    *from = (hx_check_result){0};
}

/* The index of rk's occurrence at `path`, or of the one with the same logical path (the tied
 * embedding is embed.weight on the first stage and lm_head.weight on the last), or -1. */
static long param_index(const hx_rank *rk, const char *path)
{
    for (size_t i = 0; i < rk->n_params; i++)
        if (strcmp(tm_param_at(rk->model, i)->path, path) == 0)
            return (long)i;
    const char *want = hx_grid_logical_path(path);
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (!p->alias && strcmp(hx_grid_logical_path(p->path), want) == 0)
            return (long)i;
    }
    return -1;
}

void hx_check_init(hx_run *run)
{
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *set = &run->sets.sets[i];
        const hx_rank *root = &run->ranks[set->root];
        for (int k = 0; k < set->size; k++) {
            const hx_rank *rk = &run->ranks[set->ranks[k]];
            bool differed = false, compared = false;
            for (size_t j = 0; j < rk->n_params; j++) {
                const tm_param_info *p = tm_param_at(rk->model, j);
                if (!hx_set_covers(run, set, rk->rank, p))
                    continue;
                long at = param_index(root, p->path);
                size_t bytes = seldp_tensor_nbytes(&p->tensor);
                if (at < 0 ||
                    seldp_tensor_nbytes(&tm_param_at(root->model, (size_t)at)->tensor) != bytes) {
                    hx_check_record(run, HX_CHECK_INIT_REPLICAS, true, 0,
                                    "%s: rank %d holds %s, root rank %d does not", set->label,
                                    rk->rank, p->path, root->rank);
                    continue;
                }
                const void *want = root->pre_init[at];
                compared = true;
                differed = differed || memcmp(rk->pre_init[j], want, bytes) != 0;
                bool equal = memcmp(p->tensor.data, want, bytes) == 0;
                hx_check_record(run, HX_CHECK_INIT_REPLICAS, !equal, 0,
                                "%s: rank %d's %s differs from root rank %d's value after "
                                "initialize",
                                set->label, rk->rank, p->path, root->rank);
            }
            if (rk == root || !compared) /* an empty set (its kind's parameters elsewhere) */
                continue;
            if (run->resume)
                hx_check_record(run, HX_CHECK_LOADED_REPLICAS, differed, 0,
                                "%s: rank %d loaded values that differ from root rank %d's",
                                set->label, rk->rank, root->rank);
            else
                hx_check_record(run, HX_CHECK_DIFFER_BEFORE_INIT, !differed, 0,
                                "%s: rank %d held the same values as root rank %d before "
                                "initialize, so the broadcast is not tested",
                                set->label, rk->rank, root->rank);
        }
    }
    for (int r = 0; r < run->opts.world; r++)
        merge_local(&run->checks[HX_CHECK_INIT_UNTOUCHED], &run->ranks[r].init_untouched);
}

/* Bit-identical parameters (everything selected) and gradients (trainable) over each set:
 * every member's equal to its root's. */
static void check_replicas(hx_run *run, int step)
{
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *set = &run->sets.sets[i];
        const hx_rank *root = &run->ranks[set->root];
        for (int k = 0; k < set->size; k++) {
            const hx_rank *rk = &run->ranks[set->ranks[k]];
            if (rk == root)
                continue;
            for (size_t j = 0; j < rk->n_params; j++) {
                const tm_param_info *p = tm_param_at(rk->model, j);
                if (!hx_set_covers(run, set, rk->rank, p))
                    continue;
                long at = param_index(root, p->path);
                const tm_param_info *q = at >= 0 ? tm_param_at(root->model, (size_t)at) : NULL;
                bool same =
                    q && seldp_tensor_nbytes(&q->tensor) == seldp_tensor_nbytes(&p->tensor) &&
                    memcmp(q->tensor.data, p->tensor.data, seldp_tensor_nbytes(&p->tensor)) == 0;
                hx_check_record(run, HX_CHECK_PARAM_REPLICAS, !same, 0,
                                "step %d: %s: rank %d's %s differs from root rank %d's", step + 1,
                                set->label, rk->rank, p->path, root->rank);
                if (!q || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
                    continue;
                const seldp_tensor *a = seldp_grads_get(rk->grads, p->id);
                const seldp_tensor *b = seldp_grads_get(root->grads, q->id);
                bool equal = (!a && !b) || (a && b && seldp_tensor_same_layout(a, b) &&
                                            memcmp(a->data, b->data, seldp_tensor_nbytes(a)) == 0);
                hx_check_record(run, HX_CHECK_GRAD_REPLICAS, !equal, 0,
                                "step %d: %s: rank %d's reduced gradient of %s %s root rank %d's",
                                step + 1, set->label, rk->rank, p->path,
                                (!a) != (!b) ? "is present where it is absent on" : "differs from",
                                root->rank);
            }
        }
    }
}

seldp_status hx_check_step(hx_run *run, int step, const tm_reference *ref)
{
    hx_step_record *rec = &run->steps[step];
    int64_t failed_before = hx_run_failures(run);
    int L = run->opts.model.layers, E = run->layout->experts;
    const hx_rank *r0 = &run->ranks[0];

    hx_verdict_loss(run, step, ref);
    for (int l = 0; l < L; l++) {
        for (int e = 0; e < E; e++) {
            int64_t got = r0->routed[l * E + e];
            size_t want = tm_reference_routed(ref, l, e);
            hx_check_record(run, HX_CHECK_ROUTING, (size_t)got != want, 0,
                            "step %d: layer %d sent %lld rows to expert %d, the FP64 reference "
                            "%zu (a routing difference larger than a near tie)",
                            step + 1, l, (long long)got, e, want);
            run->expert_tokens[l * E + e] += got;
            rec->absent += want == 0;
        }
    }
    hx_verdict_gradients(run, step, ref);
    check_replicas(run, step);
    for (int r = 0; r < run->opts.world; r++)
        merge_local(&run->checks[HX_CHECK_REDUCE_UNTOUCHED], &run->ranks[r].reduce_untouched);

    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *set = &run->sets.sets[i];
        const hx_rank_set *rs = hx_rank_membership(&run->ranks[set->ranks[0]], set);
        run->set_weights[i] = rs ? rs->global_weight : 0;
    }
    rec->failures = hx_run_failures(run) - failed_before;
    return SELDP_OK;
}

/* ---- helpers of the run's checks: tensors in F32, group membership and labels ---------- */
