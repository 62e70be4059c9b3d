/* Reports of a run: the check table on stdout, report.json and report.md in --out. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bugs.h"
#include "sets.h"
#include "grid.h"
#include "checks.h"
#include "report.h"
#include "run.h"
#include "rank.h"

void hx_config_json(const tm_config *cfg, hx_buf *buf)
{
    char small[512];
    size_t n = tm_config_json(cfg, small, sizeof small);
    if (n < sizeof small) {
        hx_buf_puts(buf, small);
        return;
    }
    char *big = malloc(n + 1);
    if (!big) {
        buf->failed = true;
        return;
    }
    tm_config_json(cfg, big, n + 1);
    hx_buf_puts(buf, big);
    free(big);
}

static const char *check_result_word(const hx_check_result *c)
{
    if (c->failed)
        return "FAIL";
    return c->tested ? "ok" : "n/a";
}

/* A metric check's worst error-to-bound ratio, the relative bound where it was measured and
 * its largest resolution, as text ("-" where there is none). */
static void metric_cells(const hx_check_result *c, char *worst, char *bound, char *res, size_t size)
{
    snprintf(worst, size, "-");
    snprintf(bound, size, "-");
    snprintf(res, size, "-");
    if (!c->metric || !c->tested)
        return;
    snprintf(worst, size, "%.3g", c->worst);
    if (isfinite(c->bound))
        snprintf(bound, size, "%.2e", c->bound);
    if (c->resolution > 0)
        snprintf(res, size, "%.2e", c->resolution);
}

void hx_report_print_checks(const hx_run *run, FILE *out)
{
    int w = 0;
    for (int i = 0; i < HX_CHECK_COUNT; i++) {
        int n = (int)strlen(hx_check_name((hx_check_id)i));
        w = n > w ? n : w;
    }
    fprintf(out,
            "checks (worst: the largest error / bound, 1 or less passes; bound: relative, where "
            "it was measured; resolution: the smallest relative scale error it would catch)\n"
            "  %-*s %8s %7s %10s %10s %10s  %s\n",
            w, "check", "tested", "failed", "worst", "bound", "resolution", "result");
    for (int i = 0; i < HX_CHECK_COUNT; i++) {
        const hx_check_result *c = &run->checks[i];
        char worst[32], bound[32], res[32];
        metric_cells(c, worst, bound, res, sizeof worst);
        fprintf(out, "  %-*s %8lld %7lld %10s %10s %10s  %s\n", w, hx_check_name((hx_check_id)i),
                (long long)c->tested, (long long)c->failed, worst, bound, res,
                check_result_word(c));
    }
    for (int i = 0; i < HX_CHECK_COUNT; i++)
        if (run->checks[i].failed)
            fprintf(out, "  first failure of \"%s\": %s\n", hx_check_name((hx_check_id)i),
                    run->checks[i].first_failure);
}

/* ---- report.json ------------------------------------------------------------------------- */

/* The experts a set reduces: "[0, 1]" (JSON) or "0, 1" (Markdown; "-" for none). */
static void set_experts(const hx_run *run, const hx_set *set, bool json, hx_buf *b)
{
    bool first = true;
    hx_buf_puts(b, json ? "[" : "");
    for (int e = 0; e < run->layout->experts; e++) {
        bool held = set->kind == HX_SET_DATA ? run->layout->data_of[e] == set->data
                    : set->kind == HX_SET_EXPERT || set->kind == HX_SET_EXPERT_TP
                        ? hx_layout_owns(run->layout, set->ranks[0], e)
                        : false;
        if (!held)
            continue;
        hx_buf_printf(b, "%s%d", first ? "" : ", ", e);
        first = false;
    }
    hx_buf_puts(b, json ? "]" : first ? "-" : "");
}

static void json_ranks(const hx_set *set, hx_buf *b)
{
    hx_buf_puts(b, "[");
    for (int i = 0; i < set->size; i++)
        hx_buf_printf(b, "%s%d", i ? ", " : "", set->ranks[i]);
    hx_buf_puts(b, "]");
}

/* A set's id in report.json: "shared" and "d{n}" for an unsharded run (its expert-data
 * groups), "{kind}{n}" by kind for a sharded one. */
static void set_id(const hx_run *run, const hx_set *set, char *buf, size_t size)
{
    int n = 0;
    for (int i = 0; i < set->index; i++)
        n += run->sets.sets[i].kind == set->kind;
    if (set->kind == HX_SET_SHARED)
        snprintf(buf, size, "shared");
    else if (set->kind == HX_SET_DATA)
        snprintf(buf, size, "d%d", set->data);
    else
        snprintf(buf, size, "%s%d", hx_set_kind_name(set->kind), n);
}

static void json_error_stat(const hx_error_stat *s, hx_buf *b)
{
    hx_buf_printf(b, "\"tensors\": %lld, \"worst\": ", (long long)s->tensors);
    if (s->tensors) {
        hx_buf_json_number(b, s->worst);
        hx_buf_puts(b, ", \"worst_path\": ");
        hx_buf_json_string(b, s->worst_path);
        hx_buf_printf(b, ", \"worst_rank\": %d, \"worst_step\": %d", s->worst_rank,
                      s->worst_step + 1);
        hx_buf_puts(b, ", \"error_to_bound\": ");
        hx_buf_json_number(b, s->ratio);
        hx_buf_puts(b, ", \"resolution\": ");
        hx_buf_json_number(b, s->resolution);
        hx_buf_puts(b, ", \"ranks_gradients_error_to_bound\": ");
        hx_buf_json_number(b, s->model_ratio);
        hx_buf_puts(b, ", \"ranks_gradients_resolution\": ");
        hx_buf_json_number(b, s->model_resolution);
    } else {
        hx_buf_puts(b, "null");
    }
}

/* report.json's "options" hold the transport the backend resolved to, after the backend */
static void options_after(const char *key, hx_buf *b, const void *ctx)
{
    const hx_run *run = ctx;
    if (strcmp(key, "backend") == 0)
        hx_buf_printf(b, ", \"transport\": \"%s\"", hx_backend_transport(run->backend));
}

static void report_json(const hx_run *run, hx_buf *b)
{
    const hx_options *o = &run->opts;
    hx_buf_printf(b, "{\n  \"program\": \"seldp-harness\",\n  \"version\": ");
    hx_buf_json_string(b, seldp_version());
    hx_buf_printf(b, ",\n  \"passed\": %s,\n  \"error\": ", hx_run_passed(run) ? "true" : "false");
    if (run->status != SELDP_OK)
        hx_buf_json_string(b, run->error);
    else
        hx_buf_puts(b, "null");
    hx_buf_puts(b, ",\n  \"options\": ");
    hx_options_json(o, b, options_after, run);
    hx_buf_puts(b, ",\n  \"config\": ");
    hx_config_json(&o->model, b);
    hx_buf_puts(b, ",\n  \"layout\": ");
    hx_layout_json(run->layout, b);
    hx_buf_printf(b, ",\n  \"gradient_dtype\": \"%s\",\n  \"tolerance\": ",
                  seldp_dtype_name(run->grad_dtype));
    hx_buf_json_number(b, run->tolerance);

    hx_buf_puts(b, ",\n  \"checks\": [");
    for (int i = 0; i < HX_CHECK_COUNT; i++) {
        const hx_check_result *c = &run->checks[i];
        hx_buf_printf(b, "%s\n    {\"name\": ", i ? "," : "");
        hx_buf_json_string(b, hx_check_name((hx_check_id)i));
        hx_buf_printf(b, ", \"tested\": %lld, \"failed\": %lld, \"result\": \"%s\"",
                      (long long)c->tested, (long long)c->failed, check_result_word(c));
        if (c->metric) {
            hx_buf_puts(b, ", \"worst\": ");
            hx_buf_json_number(b, c->tested ? c->worst : NAN);
            hx_buf_puts(b, ", \"limit\": ");
            hx_buf_json_number(b, c->limit);
            hx_buf_puts(b, ", \"bound\": ");
            hx_buf_json_number(b, c->tested ? c->bound : NAN);
            hx_buf_puts(b, ", \"resolution\": ");
            hx_buf_json_number(b, c->tested ? c->resolution : NAN);
        }
        if (c->failed) {
            hx_buf_puts(b, ", \"first_failure\": ");
            hx_buf_json_string(b, c->first_failure);
        }
        hx_buf_puts(b, "}");
    }
    /* the likely cause of the first failed gradient check (inject.c), null when none */
    hx_buf_printf(
        b, "\n  ],\n  \"inject\": \"%s\",\n  \"diagnosis\": ", hx_fault_name(run->opts.inject));
    if (run->diagnosis[0])
        hx_buf_json_string(b, run->diagnosis);
    else
        hx_buf_puts(b, "null");
    /* the first step that left the dtypes' range (diverge.h), null when none */
    hx_buf_puts(b, ",\n  \"diverged\": ");
    if (run->diverged_step) {
        hx_buf_printf(b, "{\"step\": %d, \"why\": ", run->diverged_step);
        hx_buf_json_string(b, run->diverged_why);
        hx_buf_puts(b, "}");
    } else {
        hx_buf_puts(b, "null");
    }
    hx_buf_puts(b, ",\n  \"tensor_classes\": [");
    bool first = true;
    for (int c = 0; c < HX_CLASS_COUNT; c++) {
        if (!run->classes[c].tensors)
            continue;
        hx_buf_printf(b, "%s\n    {\"class\": \"%s\", ", first ? "" : ",",
                      hx_class_name((hx_tensor_class)c));
        json_error_stat(&run->classes[c], b);
        hx_buf_puts(b, "}");
        first = false;
    }
    hx_buf_puts(b, "\n  ],\n  \"groups\": [");
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *set = &run->sets.sets[i];
        char id[48];
        set_id(run, set, id, sizeof id);
        hx_buf_printf(b,
                      "%s\n    {\"group\": \"%s\", \"kind\": \"%s\", \"name\": \"%s\", "
                      "\"method\": \"%s\", \"ranks\": ",
                      i ? "," : "", id, hx_set_kind_name(set->kind), set->name,
                      set->sums ? "sum" : "reduce");
        json_ranks(set, b);
        hx_buf_printf(b, ", \"root\": %d, \"experts\": ", set->root);
        set_experts(run, set, true, b);
        hx_buf_printf(b, ", \"global_weight\": %llu, ", (unsigned long long)run->set_weights[i]);
        json_error_stat(&run->set_errors[i], b);
        hx_buf_puts(b, "}");
    }
    hx_buf_puts(b, "\n  ],\n  \"steps\": [");
    for (int s = run->first_step; s < run->steps_done; s++) { /* a resumed run: its own steps */
        const hx_step_record *r = &run->steps[s];
        hx_buf_printf(b, "%s\n    {\"step\": %d, \"tokens\": %zu, \"loss\": ",
                      s > run->first_step ? "," : "", s + 1, r->tokens);
        hx_buf_json_number(b, r->loss);
        hx_buf_puts(b, ", \"reference_loss\": ");
        hx_buf_json_number(b, r->ref_loss);
        hx_buf_puts(b, ", \"worst\": ");
        hx_buf_json_number(b, r->worst);
        hx_buf_puts(b, ", \"worst_path\": ");
        hx_buf_json_string(b, r->worst_path);
        hx_buf_printf(b,
                      ", \"worst_rank\": %d, \"failures\": %lld, \"absent_experts\": %d, "
                      "\"near_ties_followed\": %zu, \"dropped_assignments\": %zu, "
                      "\"diverged\": %s, \"error_to_bound\": ",
                      r->worst_rank, (long long)r->failures, r->absent, r->ties_followed,
                      r->dropped, r->diverged ? "true" : "false");
        hx_buf_json_number(b, r->ratio);
        hx_buf_puts(b, ", \"error_to_bound_check\": ");
        hx_buf_json_string(b, r->ratio_check ? r->ratio_check : "");
        hx_buf_puts(b, ", \"error_to_bound_path\": ");
        hx_buf_json_string(b, r->ratio_path);
        hx_buf_puts(b, ", \"loss_bound\": ");
        hx_buf_json_number(b, r->loss_bound);
        hx_buf_puts(b, ", \"time_s\": {\"step\": ");
        hx_buf_json_number(b, r->t_step);
        hx_buf_puts(b, ", \"compute\": ");
        hx_buf_json_number(b, r->t_compute);
        hx_buf_puts(b, ", \"dispatch\": ");
        hx_buf_json_number(b, r->t_dispatch);
        hx_buf_puts(b, ", \"reduce\": ");
        hx_buf_json_number(b, r->t_reduce);
        hx_buf_puts(b, ", \"reference\": ");
        hx_buf_json_number(b, r->t_reference);
        hx_buf_puts(b, ", \"check\": ");
        hx_buf_json_number(b, r->t_check);
        hx_split_json(&r->split, b);
        hx_buf_puts(b, "}}");
    }
    hx_buf_puts(b, "\n  ],\n  \"expert_tokens\": [");
    int L = o->model.layers, E = run->layout->experts;
    for (int l = 0; l < L; l++) {
        hx_buf_puts(b, l ? ", [" : "[");
        for (int e = 0; e < E; e++)
            hx_buf_printf(b, "%s%lld", e ? ", " : "", (long long)run->expert_tokens[l * E + e]);
        hx_buf_puts(b, "]");
    }
    hx_buf_printf(b, "],\n  \"blas_core\": \"%s\"", tm_blas_core());
    hx_buf_puts(b, ",\n  \"time_s\": {\"setup\": ");
    hx_buf_json_number(b, run->t_setup);
    hx_buf_puts(b, ", \"initialize_check\": ");
    hx_buf_json_number(b, run->t_init);
    hx_buf_puts(b, ", \"total\": ");
    hx_buf_json_number(b, run->t_total);
    hx_buf_puts(b, "}\n}\n");
}

/* ---- report.md --------------------------------------------------------------------------- */

static void md_error_row(hx_buf *b, const char *name, const hx_error_stat *s)
{
    if (!s->tensors) {
        hx_buf_printf(b, "| %s | 0 | - | - | - | - | - | - |\n", name);
        return;
    }
    hx_buf_printf(b,
                  "| %s | %lld | %.2e | %.3g%s | %.2e | %.3g | %.2e | `%s` (rank %d, step %d) |\n",
                  name, (long long)s->tensors, s->worst, s->ratio,
                  s->ratio <= 1.0 ? "" : " **FAIL**", s->resolution, s->model_ratio,
                  s->model_resolution, s->worst_path, s->worst_rank, s->worst_step + 1);
}

static void report_md(const hx_run *run, hx_buf *b)
{
    const hx_options *o = &run->opts;
    const tm_config *m = &o->model;
    hx_buf_printf(b, "# seldp-harness report\n\n**Result: %s**",
                  hx_run_passed(run) ? "PASS" : "FAIL");
    if (run->status != SELDP_OK)
        hx_buf_printf(b, " (the run stopped: %s)", run->error);
    if (run->diverged_step)
        hx_buf_printf(b, "\n\nThe run diverged at step %d (%s): steps %d to %d were not checked.",
                      run->diverged_step, run->diverged_why, run->diverged_step, run->steps_done);
    hx_buf_printf(b, "\n\n| setting | value |\n|---|---|\n");
    hx_buf_printf(b, "| world | %d ranks, transport %s |\n", o->world,
                  hx_backend_transport(run->backend));
    hx_buf_printf(
        b, "| layout | %s%s%s |\n", run->layout->name,
        strcmp(run->layout->name, run->layout->description) && run->layout->description[0] ? ": "
                                                                                           : "",
        strcmp(run->layout->name, run->layout->description) ? run->layout->description : "");
    hx_buf_printf(b, "| model | tiny-moe V=%d D=%d F=%d E=%d K=%d L=%d, dtype %s, quant %s",
                  m->vocab, m->d_model, m->d_ff, m->experts, m->top_k, m->layers,
                  tm_dtype_name(m->dtype), tm_quant_name(m->quant));
    if (m->quant != TM_QUANT_NONE)
        hx_buf_printf(b, ", LoRA r=%d alpha=%g", m->lora_rank, m->lora_alpha);
    hx_buf_printf(b, ", RMSNorm eps %g", m->eps);
    hx_buf_printf(b, " |\n| shared expert | %s", m->d_ff_shared > 0 ? "" : "none");
    if (m->d_ff_shared > 0)
        hx_buf_printf(b, "d_ff %d in every layer, ungated", m->d_ff_shared);
    hx_buf_printf(b, " |\n| router | top-%d; load-balancing loss ", m->top_k);
    if (m->aux_loss_coeff > 0.0)
        hx_buf_printf(b, "alpha %g, %s scope", m->aux_loss_coeff,
                      tm_aux_scope_name(m->aux_loss_scope));
    else
        hx_buf_puts(b, "off");
    if (m->z_loss_coeff > 0.0)
        hx_buf_printf(b, "; z-loss beta %g", m->z_loss_coeff);
    else
        hx_buf_puts(b, "; z-loss off");
    if (m->capacity_factor > 0.0)
        hx_buf_printf(b, "; capacity factor %g (assignments past it dropped)", m->capacity_factor);
    else
        hx_buf_puts(b, "; no capacity limit");
    hx_buf_printf(b, " |\n| reductions | shared: reduce; experts: %s%s; policy %s%s |\n",
                  o->flow == HX_FLOW_SUM ? "sum (normalized by the global token count)"
                                         : "reduce (weighted by the EP group's tokens)",
                  o->fp32_master ? "; FP32 gradients and master weights" : "",
                  hx_policy_name(o->policy),
                  o->overlap ? "; overlapped with the backward (--overlap)" : "");
    if (o->global_batch > 0)
        hx_buf_printf(b, "| steps | %d (ran %d), global batch %d tokens, SGD lr %g, seed %llu |\n",
                      o->steps, run->steps_done, o->global_batch, o->lr,
                      (unsigned long long)m->seed);
    else
        hx_buf_printf(b,
                      "| steps | %d (ran %d), %d +- %d tokens per rank, SGD lr %g, seed %llu |\n",
                      o->steps, run->steps_done, o->tokens, hx_options_spread(o), o->lr,
                      (unsigned long long)m->seed);
    if (o->clip_grad > 0)
        hx_buf_printf(b, "| clipping | global gradient norm clipped to %g |\n", o->clip_grad);
    hx_buf_printf(b,
                  "| tolerance | %s results; bounds of %.0f standard deviations of the FP32 "
                  "model's error (u_c %.2g), with the %s roundings (u_r %.2g) where they apply: "
                  "docs/tolerances.md |\n",
                  seldp_dtype_name(run->grad_dtype), run->tol.c, run->tol.u_c,
                  seldp_dtype_name(run->grad_dtype), run->tol.u_r);
    if (o->inject != HX_FAULT_NONE)
        hx_buf_printf(b, "| inject | %s |\n", hx_fault_name(o->inject));
    hx_buf_puts(b, "\n");

    bool sharded = hx_grid_sharded(run); /* its reduce groups are the grid's (grid.h) */
    if (sharded)
        hx_grid_layout_md(run, b);
    else
        hx_buf_puts(b, "## Layout\n\n| rank | stage | TP rank | CP rank | shared | EP group | "
                       "expert-data groups | experts |\n|---|---|---|---|---|---|---|---|\n");
    const hx_layout *l = run->layout;
    char text[256];
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    for (int r = 0; owned && !sharded && r < l->world; r++) {
        hx_group_str(&l->shared, text, sizeof text);
        hx_buf_printf(b, "| %d | %d | %d | %d | %s%s | ", r,
                      l->grid ? seldp_layout_stage(l->grid, r) : 0,
                      l->grid ? seldp_layout_position(l->grid, SELDP_GROUP_TP, r) : 0,
                      l->grid ? seldp_layout_position(l->grid, SELDP_GROUP_CP, r) : 0, text,
                      l->shared.root == r ? " (root)" : "");
        hx_group_str(&l->ep[l->ep_of[r]], text, sizeof text);
        hx_buf_printf(b, "e%d %s | ", l->ep_of[r], text);
        bool any = false;
        for (int d = 0; d < l->n_data; d++) {
            if (hx_group_rank(&l->data[d], r) < 0)
                continue;
            hx_group_str(&l->data[d], text, sizeof text);
            hx_buf_printf(b, "%sd%d %s%s", any ? ", " : "", d, text,
                          l->data[d].root == r ? " (root)" : "");
            any = true;
        }
        hx_buf_puts(b, any ? " | " : "- | ");
        int n = hx_layout_owned(l, r, owned);
        for (int i = 0; i < n; i++)
            hx_buf_printf(b, "%s%d", i ? ", " : "", owned[i]);
        hx_buf_puts(b, n ? " |\n" : "- |\n");
    }
    free(owned);

    hx_buf_puts(b, "\n## Checks\n\nworst: the largest error / bound (1 or less passes); bound: the "
                   "relative bound where it was measured; resolution: the smallest relative scale "
                   "error the check would catch (docs/tolerances.md).\n\n| check | tested | "
                   "failed | worst | bound | resolution | result |\n"
                   "|---|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < HX_CHECK_COUNT; i++) {
        const hx_check_result *c = &run->checks[i];
        char worst[32], bound[32], res[32];
        metric_cells(c, worst, bound, res, sizeof worst);
        hx_buf_printf(b, "| %s | %lld | %lld | %s | %s | %s | %s |\n",
                      hx_check_name((hx_check_id)i), (long long)c->tested, (long long)c->failed,
                      worst, bound, res, check_result_word(c));
    }
    for (int i = 0; i < HX_CHECK_COUNT; i++)
        if (run->checks[i].failed)
            hx_buf_printf(b, "\nFirst failure of *%s*: %s\n", hx_check_name((hx_check_id)i),
                          run->checks[i].first_failure);
    if (run->diagnosis[0])
        hx_buf_printf(b, "\n**Diagnosis** (inject %s): %s\n", hx_fault_name(run->opts.inject),
                      run->diagnosis);

    hx_buf_puts(b, "\n## Gradient error by tensor class\n\nThe relative error ‖g − ref‖/‖ref‖ "
                   "of every reduced gradient on every rank (information), the worst error / "
                   "bound and resolution of the reduced gradients' check and of the ranks' FP32 "
                   "gradients' check.\n\n| class | tensors | worst rel. error | reduced: error / "
                   "bound | resolution | ranks' FP32: error / bound | resolution | where |\n"
                   "|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (int c = 0; c < HX_CLASS_COUNT; c++)
        if (run->classes[c].tensors)
            md_error_row(b, hx_class_name((hx_tensor_class)c), &run->classes[c]);

    hx_buf_puts(b, "\n## Gradient error by group\n\nThe replica sets the run reduced over, by "
                   "the framework's names.\n\n| group | kind | ranks | root | experts | method | "
                   "global weight | tensors | worst | where |\n"
                   "|---|---|---|---:|---|---|---:|---:|---:|---|\n");
    for (int i = 0; i < run->sets.n; i++) {
        const hx_set *set = &run->sets.sets[i];
        const hx_error_stat *s = &run->set_errors[i];
        hx_group grp = {set->size, set->ranks, set->root};
        hx_buf experts = {0};
        hx_group_str(&grp, text, sizeof text);
        set_experts(run, set, false, &experts);
        hx_buf_printf(b, "| %s | %s | %s | %d | %s | %s | %llu | %lld | ", set->name,
                      hx_set_kind_name(set->kind), text, set->root, hx_buf_str(&experts),
                      set->sums ? "sum" : "reduce", (unsigned long long)run->set_weights[i],
                      (long long)s->tensors);
        hx_buf_free(&experts);
        if (s->tensors)
            hx_buf_printf(b, "%.2e | `%s` (rank %d) |\n", s->worst, s->worst_path, s->worst_rank);
        else
            hx_buf_puts(b, "- | - |\n");
    }

    hx_buf_puts(
        b, "\n## Steps\n\n| step | tokens | loss | reference loss | error / bound | worst rel. "
           "error | failures | absent experts | dropped | step ms | compute ms | dispatch ms "
           "| reduce ms | reference ms |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int s = run->first_step; s < run->steps_done; s++) {
        const hx_step_record *r = &run->steps[s];
        hx_buf_printf(b,
                      "| %d | %zu | %.6f | %.6f | %.2f | %.2e | %lld | %d | %zu | %.1f | %.1f | "
                      "%.1f | %.1f | %.1f |\n",
                      s + 1, r->tokens, r->loss, r->ref_loss, r->ratio, r->worst,
                      (long long)r->failures, r->absent, r->dropped, 1e3 * r->t_step,
                      1e3 * r->t_compute, 1e3 * r->t_dispatch, 1e3 * r->t_reduce,
                      1e3 * r->t_reference);
    }

    int L = m->layers, E = l->experts;
    hx_buf_puts(b, "\n## Tokens routed to each expert (all steps)\n\n| layer |");
    for (int e = 0; e < E; e++)
        hx_buf_printf(b, " e%d |", e);
    hx_buf_puts(b, "\n|---:|");
    for (int e = 0; e < E; e++)
        hx_buf_puts(b, "---:|");
    hx_buf_puts(b, "\n");
    for (int li = 0; li < L; li++) {
        hx_buf_printf(b, "| %d |", li);
        for (int e = 0; e < E; e++)
            hx_buf_printf(b, " %lld |", (long long)run->expert_tokens[li * E + e]);
        hx_buf_puts(b, "\n");
    }
    hx_buf_printf(b, "\nTotal time %.2f s (setup and initialize %.2f s; OpenBLAS kernels %s).\n",
                  run->t_total, run->t_setup, tm_blas_core());
}

seldp_status hx_report_write(const hx_run *run, const char *dir)
{
    seldp_status st = SELDP_OK;
    hx_buf json = {0}, md = {0};
    char path[4096];
    HX_CHECK(hx_mkdir_p(dir));
    report_json(run, &json);
    report_md(run, &md);
    if (!hx_buf_ok(&json) || !hx_buf_ok(&md))
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory writing the report");
    snprintf(path, sizeof path, "%s/report.json", dir);
    HX_CHECK(hx_write_file(path, json.data, json.len));
    snprintf(path, sizeof path, "%s/report.md", dir);
    HX_CHECK(hx_write_file(path, md.data, md.len));
fail:
    hx_buf_free(&json);
    hx_buf_free(&md);
    return st;
}

/* ---- the summary table ------------------------------------------------------------------- */

seldp_status hx_report_append_summary(const hx_run *run, const char *name, const char *path)
{
    const hx_options *o = &run->opts;
    const tm_config *m = &o->model;
    hx_buf row = {0};
    FILE *f = fopen(path, "a");
    if (!f)
        return hx_fail(SELDP_ERR_IO, "--summary %s: cannot open for appending", path);
    if (ftell(f) == 0)
        hx_buf_puts(&row, "| run | ranks | layout | dtype | experts | expert reduce | policy | "
                          "steps | loss first → last | worst rel. error | limit | checks | "
                          "failed | result | time s |\n"
                          "|---|---:|---|---|---|---|---|---:|---|---:|---:|---:|---:|---|---:|\n");
    int64_t tested = 0;
    for (int i = 0; i < HX_CHECK_COUNT; i++)
        tested += run->checks[i].tested;
    const hx_check_result *grad = &run->checks[HX_CHECK_GRAD_ERROR];
    hx_buf_printf(&row, "| %s | %d | %s | %s%s | ", name, o->world, run->layout->name,
                  tm_dtype_name(m->dtype), o->fp32_master ? " (fp32 master)" : "");
    if (m->quant == TM_QUANT_NONE)
        hx_buf_printf(&row, "E=%d K=%d dense", m->experts, m->top_k);
    else
        hx_buf_printf(&row, "E=%d K=%d %s+LoRA", m->experts, m->top_k, tm_quant_name(m->quant));
    hx_buf_printf(&row, " | %s | %s | %d | ", hx_flow_name(o->flow), hx_policy_name(o->policy),
                  run->steps_done);
    if (run->steps_done > run->first_step)
        hx_buf_printf(&row, "%.4f → %.4f", run->steps[run->first_step].loss,
                      run->steps[run->steps_done - 1].loss);
    else
        hx_buf_puts(&row, "-");
    hx_buf_printf(&row, " | %.2e | %.0e | %lld | %lld | %s | %.2f |\n", grad->worst, grad->limit,
                  (long long)tested, (long long)hx_run_failures(run),
                  hx_run_passed(run) ? "pass" : "**FAIL**", run->t_total);
    bool ok = hx_buf_ok(&row) && fwrite(row.data, 1, row.len, f) == row.len;
    ok = fclose(f) == 0 && ok;
    hx_buf_free(&row);
    if (!ok)
        return hx_fail(SELDP_ERR_IO, "--summary %s: write failed", path);
    return SELDP_OK;
}
