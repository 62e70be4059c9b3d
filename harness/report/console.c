/* The run's console output: the header with the layout table, the line after initialize
 * and the progress line of each step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bugs.h"
#include "set_rank.h"
#include "sets.h"
#include "grid.h"
#include "inject.h"
#include "overlap.h"
#include "pipeline.h"
#include "router.h"
#include "checks.h"
#include "console.h"
#include "run.h"
#include "rank.h"

/* "[0,4]*" for the ranks of a group (the star where r is its root). */
static void ranks_cell(const int *ranks, int n, int r, int root, char *buf, size_t size)
{
    hx_group grp = {n, (int *)ranks, -1};
    hx_group_str(&grp, buf, size > 1 ? size - 1 : size);
    if (root == r)
        strcat(buf, "*");
}

static void group_cell(const seldp_layout *g, seldp_group_kind kind, int r, int root, char *buf,
                       size_t size)
{
    const int *ranks = NULL;
    int n = seldp_layout_group(g, kind, seldp_layout_group_of(g, kind, r), &ranks);
    ranks_cell(ranks, n, r, root, buf, size);
}

/* Megatron's dp group of rank r without context parallelism: the members of its dense (dp-cp)
 * group at its own CP position. */
static void pure_dp_cell(const seldp_layout *g, int r, char *buf, size_t size)
{
    const int *dense = NULL;
    int n =
        seldp_layout_group(g, SELDP_GROUP_DP, seldp_layout_group_of(g, SELDP_GROUP_DP, r), &dense);
    int mine = seldp_layout_position(g, SELDP_GROUP_CP, r), k = 0;
    int ranks[4096];
    for (int i = 0; i < n && k < 4096; i++)
        if (seldp_layout_position(g, SELDP_GROUP_CP, dense[i]) == mine)
            ranks[k++] = dense[i];
    ranks_cell(ranks, k, r, -1, buf, size);
}

enum { COL_DP, COL_DENSE, COL_EP, COL_EDP, COL_EXPERTS, COLS };

/* The layout table of a sharded run: per rank its stage, TP, CP and ETP ranks, its dense
 * reduce group (with Megatron's dp beside dp-cp when cp > 1), EP group, expert-data group and
 * owned experts; columns as wide as their widest cell. */
static void print_grid_table(const hx_run *run, const char *const *devices, FILE *out)
{
    const hx_layout *l = run->layout;
    const seldp_layout *g = l->grid;
    const int W = l->world;
    seldp_layout_config c = seldp_layout_get_config(g);
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    char(*cells)[COLS][256] = hx_calloc((size_t)W, sizeof *cells);
    if (!owned || !cells) {
        free(owned);
        free(cells);
        return;
    }
    const hx_set *any_dense = hx_set_member(run, 0, HX_SET_DENSE);
    const hx_set *any_edp = hx_set_member(run, 0, HX_SET_EXPERT);
    const char *headers[COLS] = {"dp", any_dense ? any_dense->name : "dense", "EP group",
                                 any_edp ? any_edp->name : "expert-data", "experts"};
    int width[COLS];
    for (int k = 0; k < COLS; k++)
        width[k] = (int)strlen(headers[k]);
    for (int r = 0; r < W; r++) {
        const hx_set *ds = hx_set_member(run, r, HX_SET_DENSE);
        const hx_set *es = hx_set_member(run, r, HX_SET_EXPERT);
        pure_dp_cell(g, r, cells[r][COL_DP], sizeof cells[r][COL_DP]);
        group_cell(g, SELDP_GROUP_DP, r, ds ? ds->root : -1, cells[r][COL_DENSE],
                   sizeof cells[r][COL_DENSE]);
        group_cell(g, SELDP_GROUP_EP, r, -1, cells[r][COL_EP], sizeof cells[r][COL_EP]);
        group_cell(g, SELDP_GROUP_EXPERT_DP, r, es ? es->root : -1, cells[r][COL_EDP],
                   sizeof cells[r][COL_EDP]);
        char *ex = cells[r][COL_EXPERTS];
        snprintf(ex, sizeof cells[r][COL_EXPERTS], "-");
        int n = hx_layout_owned(l, r, owned);
        for (int i = 0, at = 0; i < n && at < 240; i++)
            at += snprintf(ex + at, sizeof cells[r][COL_EXPERTS] - (size_t)at, "%s%d", i ? "," : "",
                           owned[i]);
        for (int k = 0; k < COLS; k++)
            width[k] = (int)strlen(cells[r][k]) > width[k] ? (int)strlen(cells[r][k]) : width[k];
    }
    bool cp = c.cp > 1;
    fprintf(out, "layout: %s; %d %s groups, %d EP groups, %d %s groups, * marks a root\n", l->name,
            seldp_layout_group_count(g, SELDP_GROUP_DP), headers[COL_DENSE],
            seldp_layout_group_count(g, SELDP_GROUP_EP),
            seldp_layout_group_count(g, SELDP_GROUP_EXPERT_DP), headers[COL_EDP]);
    fprintf(out, "  %4s  %-7s  %5s  %2s  %2s  %3s", "rank", "device", "stage", "tp", "cp", "etp");
    for (int k = cp ? 0 : 1; k < COLS; k++)
        fprintf(out, "  %-*s", width[k], headers[k]);
    fputc('\n', out);
    for (int r = 0; r < W; r++) {
        fprintf(out, "  %4d  %-7s  %5d  %2d  %2d  %3d", r,
                devices && devices[r] ? devices[r] : "host", seldp_layout_stage(g, r),
                seldp_layout_position(g, SELDP_GROUP_TP, r),
                seldp_layout_position(g, SELDP_GROUP_CP, r),
                seldp_layout_position(g, SELDP_GROUP_EXPERT_TP, r));
        for (int k = cp ? 0 : 1; k < COLS; k++)
            fprintf(out, "  %-*s", width[k], cells[r][k]);
        fputc('\n', out);
    }
    free(owned);
    free(cells);
}

void hx_print_header(const hx_run *run, FILE *out)
{
    const hx_options *o = &run->opts;
    const tm_config *m = &o->model;
    if (hx_backend_hybrid(run->backend))
        fprintf(out,
                "seldp-harness %s: %d ranks, %d MPI processes x %d rank threads (p<process>: in "
                "the layout), %s transport\n",
                seldp_version(), o->world, o->world / hx_backend_local_count(run->backend),
                hx_backend_local_count(run->backend), hx_backend_transport(run->backend));
    else if (hx_backend_multiprocess(run->backend))
        fprintf(out, "seldp-harness %s: %d ranks, one per MPI process, %s transport\n",
                seldp_version(), o->world, hx_backend_transport(run->backend));
    else
        fprintf(out, "seldp-harness %s: %d simulated ranks, %s transport\n", seldp_version(),
                o->world, hx_backend_transport(run->backend));
    fprintf(out, "  model   tiny-moe V=%d D=%d F=%d E=%d K=%d L=%d, %s parameters, ", m->vocab,
            m->d_model, m->d_ff, m->experts, m->top_k, m->layers, tm_dtype_name(m->dtype));
    if (m->quant == TM_QUANT_NONE)
        fprintf(out, "dense experts\n");
    else
        fprintf(out, "%s expert bases + LoRA r=%d alpha=%g\n", tm_quant_name(m->quant),
                m->lora_rank, m->lora_alpha);
    fprintf(out,
            "  reduce  shared: reduce by tokens; experts: %s; policy %s; %s results\n"
            "  checks  bounds from the reference's error magnitudes: u_c %.2g, u_r %.2g, %.0f "
            "standard deviations (docs/tolerances.md)\n",
            o->flow == HX_FLOW_SUM ? "sum of grads / global tokens" : "reduce by EP-group tokens",
            hx_policy_name(o->policy), seldp_dtype_name(run->grad_dtype), run->tol.u_c,
            run->tol.u_r, run->tol.c);
    if (o->overlap)
        fprintf(out,
                "  overlap reductions started before the backward, each layer's gradients marked "
                "ready after its backward; buckets of %zu bytes%s\n",
                hx_session_config(run).bucket_bytes,
                o->bucket_bytes ? "" : " (the library's default)");
    char routing[256];
    hx_router_describe(m, routing, sizeof routing);
    if (routing[0])
        fprintf(out, "  routing %s\n", routing);
    fprintf(out, "  steps   %d, %d +- %d tokens per rank, %s lr %g%s, seed %llu\n", o->steps,
            o->tokens, hx_options_spread(o), o->optimizer == HX_OPT_ADAMW ? "AdamW" : "SGD", o->lr,
            o->fp32_master || o->optimizer == HX_OPT_ADAMW ? " on FP32 master weights" : "",
            (unsigned long long)m->seed);
    if (o->optimizer == HX_OPT_ADAMW)
        fprintf(out, "  adamw   beta1 %g, beta2 %g, eps %g, weight decay %g\n", o->adam_beta1,
                o->adam_beta2, o->adam_eps, o->weight_decay);
    if (o->micro_batches > 1)
        fprintf(out, "  micro   %d micro-batches per step, accumulated, reduced once%s%s\n",
                o->micro_batches, hx_pipe_stages(run) > 1 ? "; pipeline schedule " : "",
                hx_pipe_stages(run) > 1 ? hx_pipe_schedule_name(hx_pipe_schedule_of(o)) : "");
    if (o->global_batch > 0)
        fprintf(out,
                "  batch   --global-batch %d: one token stream and logical initial weights, "
                "independent of the layout\n",
                o->global_batch);
    if (run->resume)
        fprintf(out, "  resume  from %s at step %d\n", o->resume_dir, run->first_step);
    if (o->save_dir)
        fprintf(out, "  save    into %s after step %d%s\n", o->save_dir, o->steps,
                o->save_every ? " and every --save-every steps" : "");
    if (o->inject == HX_FAULT_FAIL)
        fprintf(out, "  inject  fail: rank %d fails in step 1; every rank must stop\n",
                o->world - 1);
    else if (hx_inject_is_framework_bug(o->inject))
        fprintf(out, "  inject  %s: %s; the checks must fail\n", hx_fault_name(o->inject),
                hx_inject_describe(o->inject));
    else if (o->inject != HX_FAULT_NONE)
        fprintf(out, "  inject  %s: a planted defect on rank %d; the checks must fail\n",
                hx_fault_name(o->inject), o->world - 1);
    const char **devices = hx_calloc((size_t)o->world, sizeof *devices);
    if (devices)
        for (int r = 0; r < o->world; r++)
            devices[r] = hx_backend_device_name(run->backend, r);
    if (hx_grid_sharded(run))
        print_grid_table(run, devices, out);
    else
        hx_layout_print(run->layout, devices, out);
    free(devices);
}

void hx_print_init(const hx_run *run)
{
    if (!run->out)
        return;
    const hx_check_result *c = &run->checks[HX_CHECK_INIT_REPLICAS];
    fprintf(run->out,
            "initialize: %lld replicated tensors checked against their roots, %lld differ  %s\n",
            (long long)c->tested, (long long)c->failed, c->failed ? "FAIL" : "ok");
    fflush(run->out);
}

void hx_print_progress(const hx_run *run, int step, double t_step)
{
    const hx_step_record *rec = &run->steps[step];
    if (!run->out)
        return;
    char ties[128] = "";
    if (rec->ties_followed)
        snprintf(ties, sizeof ties, "  %zu near tie%s routed as the ranks did", rec->ties_followed,
                 rec->ties_followed == 1 ? "" : "s");
    if (run->opts.model.capacity_factor > 0) {
        size_t at = strlen(ties);
        snprintf(ties + at, sizeof ties - at, "  %zu assignment%s dropped", rec->dropped,
                 rec->dropped == 1 ? "" : "s");
    }
    char split[160];
    hx_split_describe(&rec->split, split, sizeof split);
    fprintf(run->out,
            "step %d/%d  loss %.6f (ref %.6f)  %zu tokens  error/bound %.2f (%s: %s @ rank %d)  "
            "worst rel %.2e%s  %s  %.1f ms (%s)\n",
            step + 1, run->opts.steps, rec->loss, rec->ref_loss, rec->tokens, rec->ratio,
            rec->ratio_check ? rec->ratio_check : "-", rec->ratio_path[0] ? rec->ratio_path : "-",
            rec->ratio_rank, rec->worst, ties,
            rec->diverged   ? "diverged, not checked"
            : rec->failures ? "FAIL"
                            : "ok",
            1e3 * t_step, split);
    fflush(run->out);
}
