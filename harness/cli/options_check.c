/* hx_options_rules: every rule between seldp-harness's options that no single row can state,
 * in one place (docs/harness.md, Running). hx_options_parse checks them after the command line
 * and the imports under it, every run of a sweep does (its options parsed on top of the
 * command line's), and hx_run_create does again before it resolves anything, so no path into
 * a run skips one.
 *
 * What is not here reads more than the options, and is checked where that is known:
 * - the transport and the process: --ranks-per-process outside mpirun and --overlap with MPI
 *   processes (run_create.c, overlap.c: the environment says whether this is mpirun), AdamW's
 *   --save and --zero 1 with one rank per process (optimizer.c, zero.c);
 * - the devices: GPU ranks and micro-batches, --zero 1, --loss-scale, --overlap and the
 *   routing options (microbatch.c, zero.c, loss_scale.c, overlap.c, router.c);
 * - the layout, which a layout file may give: --pipeline-schedule and --overlap with
 *   micro-batches against the pipeline stages (pipeline.c, microbatch.c), the sizes of the
 *   model against the grid (grid_check.c), what a planted bug needs of the groups (inject.c;
 *   a sweep lets some of its runs miss that);
 * - the model's own fields (tm_config_check), the checkpoint under --resume (run_create.c,
 *   resume.c) and a sweep file's runs together (sweep.c). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "backend.h"
#include "bugs.h"
#include "options.h"
#include "options_impl.h"

/* What --print-layout and --compare-groups read: the layout and what decides its roots and
 * replica sets (--quant: a quantized expert's adapters under expert TP), and the imports. */
static const int layout_reads[] = {OPT_WORLD,
                                   OPT_EP,
                                   OPT_ORDER,
                                   OPT_FRAMEWORK,
                                   OPT_TP,
                                   OPT_PP,
                                   OPT_CP,
                                   OPT_ETP,
                                   OPT_LAYOUT_FILE,
                                   OPT_ROOTS,
                                   OPT_EXPERTS,
                                   OPT_QUANT,
                                   OPT_PRINT_LAYOUT,
                                   OPT_JSON,
                                   OPT_COMPARE_GROUPS,
                                   OPT_FROM_MEGATRON,
                                   OPT_FROM_TORCHTITAN,
                                   OPT_FROM_DEEPSPEED};

static bool reads_layout(int val)
{
    for (size_t k = 0; k < sizeof layout_reads / sizeof layout_reads[0]; k++)
        if (val == layout_reads[k])
            return true;
    return false;
}

/* The planted faults that act on the all-reduce path alone (why), or NULL: those planted in
 * the export's scale and weights, in the model or before the reduction act under --zero 1 as
 * well (docs/harness.md, The distributed optimizer). */
static const char *zero_refuses(hx_fault f)
{
    switch (f) {
    case HX_FAULT_GRAD:
    case HX_FAULT_ABSENT:
    case HX_FAULT_REPLICA:
        return "--inject grad, absent and replica act on all-reduced gradients and replicas";
    case HX_FAULT_TIED_TWICE:
        return "--inject tied-twice: the tied embedding's second sum runs on all-reduced "
               "gradients (under --zero 1 the embedding group's late sum is --inject tied-zero)";
    case HX_FAULT_HALF_ACCUM:
    case HX_FAULT_ROUTER_TP:
        return "--inject half-accum and router-tp replace the all-reduce (the reduce-scatter "
               "accumulates in FP32 over every member)";
    case HX_FAULT_NORM_PER_GROUP:
        return "--inject norm-per-group: the planted norm is the all-reduce path's (the "
               "sharded norm sums every range once)";
    default:
        return NULL;
    }
}

/* The commands that exit without training: what they print, and what they would ignore. */
static seldp_status layout_commands(const hx_options *o, const bool *given)
{
    if (o->print_json && !o->print_layout)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--json: needs --print-layout (a run's layout is report.json's "
                       "\"layout\")");
    if (!given || !(o->print_layout || o->compare_groups))
        return SELDP_OK;
    const char *cmd = o->print_layout ? "--print-layout" : "--compare-groups";
    for (size_t i = 0; i < hx_option_docs_n; i++)
        if (given[i] && !reads_layout(hx_option_docs[i].opt.val))
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s prints the layout and exits without training: it would ignore "
                           "--%s (drop it, or run without %s)",
                           cmd, hx_option_docs[i].opt.name, cmd);
    return SELDP_OK;
}

/* The layout, the world and the transport. */
static seldp_status layout_rules(const hx_options *o)
{
    if (o->layout_file && o->grid_given)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--layout-file and --framework/--tp/--pp/--cp/--etp exclude each other: "
                       "the layout file lists the groups");
    if (o->layout_file && (o->ep_given || o->order_given))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--%s and --layout-file exclude each other: the layout file lists the "
                       "expert-parallel groups",
                       o->ep_given ? "ep" : "order");
    if (o->ranks_per_process && o->backend != HX_BACKEND_AUTO && o->backend != HX_BACKEND_MPI)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--ranks-per-process %d: with --backend %s, expected auto or mpi (the "
                       "hybrid transport runs host-staged inside a process, MPI between "
                       "processes)",
                       o->ranks_per_process, hx_backend_name(o->backend));
    if (o->overlap && o->backend == HX_BACKEND_NCCL)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--overlap: not with --backend nccl: ranks on a GPU export their "
                       "gradients after the whole backward");
    return SELDP_OK;
}

/* The tokens of a step and its micro-batches. */
static seldp_status batch_rules(const hx_options *o)
{
    if (o->global_batch > 0 && o->tokens_given)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--global-batch %d and --tokens/--token-spread exclude each other: the "
                       "global batch is split over the ranks",
                       o->global_batch);
    if (hx_options_spread(o) > o->tokens)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--token-spread %d: must not exceed --tokens %d",
                       hx_options_spread(o), o->tokens);
    int M = o->micro_batches;
    if (M > 1 && o->global_batch > 0 && o->global_batch % M != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--micro-batches %d: must divide --global-batch %d (every micro-batch "
                       "takes N/M tokens of the step's stream)",
                       M, o->global_batch);
    return SELDP_OK;
}

/* The optimizer, the distributed optimizer and loss scaling. */
static seldp_status update_rules(const hx_options *o)
{
    if (o->optimizer != HX_OPT_ADAMW && o->adam_given)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--adam-beta1/--adam-beta2/--adam-eps/--weight-decay: need --optimizer "
                       "adamw (the run trains with %s)",
                       hx_optimizer_name(o->optimizer));
    if (o->optimizer == HX_OPT_ADAMW && !(o->lr * o->weight_decay < 1.0))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--weight-decay %g with --lr %g: lr * weight decay must be below 1 (the "
                       "decay multiplies every weight by 1 - lr wd)",
                       o->weight_decay, o->lr);
    if (o->zero && zero_refuses(o->inject))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--zero 1 cannot run here: %s",
                       zero_refuses(o->inject));
    if (o->inject_overflow > 0 && !o->loss_scale_given)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--inject-overflow %d: needs --loss-scale dynamic|X (an overflow without "
                       "loss scaling has no skip to check)",
                       o->inject_overflow);
    if (o->loss_scale_given && o->model.dtype != SELDP_F16)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--loss-scale %s: needs --dtype f16 (bf16 and f32 have the range of FP32)",
                       o->loss_scale > 0 ? "X" : "dynamic");
    if (o->loss_scale_given && o->inject_overflow > o->steps)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--inject-overflow %d: beyond the run's %d steps (1-based)",
                       o->inject_overflow, o->steps);
    return SELDP_OK;
}

/* A planted bug the options alone refuse (what it needs of the layout: inject.c). */
static seldp_status inject_rules(const hx_options *o)
{
    seldp_status st = hx_bug_refuse_options(o);
    if (st != SELDP_OK)
        return st;
    if (o->inject == HX_FAULT_LOCAL_AUX &&
        (!(o->model.aux_loss_coeff > 0.0) || o->model.aux_loss_scope != TM_AUX_GLOBAL))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--inject local-aux: expected --aux-loss-coeff > 0 with "
                       "--aux-loss-scope global (the bug normalizes the global load-balancing "
                       "statistics locally; this run has %s)",
                       o->model.aux_loss_coeff > 0.0 ? "--aux-loss-scope local"
                                                     : "no load-balancing loss");
    return SELDP_OK;
}

/* The outputs: a sweep's own reports, dumps, checkpoints. */
static seldp_status output_rules(const hx_options *o)
{
    if (o->sweep) {
        const char *excluded = o->dump_dir     ? "--dump"
                               : o->save_dir   ? "--save"
                               : o->resume_dir ? "--resume"
                               : o->summary    ? "--summary"
                                               : NULL;
        if (excluded)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--sweep and %s exclude each other: a sweep writes its own reports",
                           excluded);
        if (!o->out_dir || !o->out_dir[0])
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--sweep needs --out DIR for sweep.md and sweep.json");
    }
    if (o->dump_dir && o->steps == 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--dump %s: needs at least one step (--steps 0)",
                       o->dump_dir);
    if (o->save_every > 0 && !o->save_dir)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--save-every %d: needs --save DIR",
                       o->save_every);
    return SELDP_OK;
}

seldp_status hx_options_rules(const hx_options *o, const bool *given)
{
    seldp_status st = layout_commands(o, given);
    if (st == SELDP_OK)
        st = layout_rules(o);
    if (st == SELDP_OK)
        st = batch_rules(o);
    if (st == SELDP_OK)
        st = update_rules(o);
    if (st == SELDP_OK)
        st = inject_rules(o);
    if (st == SELDP_OK)
        st = output_rules(o);
    return st;
}

bool hx_options_check(const hx_options *o, const bool *given, FILE *err)
{
    if (hx_options_rules(o, given) == SELDP_OK)
        return true;
    fprintf(err, "seldp-harness: %s\n", hx_last_error());
    return false;
}
