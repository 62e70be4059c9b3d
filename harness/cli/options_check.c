/* hx_options_check: every rule between seldp-harness's options that no single row can state,
 * in one place. hx_options_parse calls it after the command line and the imports under it,
 * and so does every run of a sweep (its options parsed on top of the command line's). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

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

bool hx_options_check(const hx_options *o, const bool *given, FILE *err)
{
    if (o->print_json && !o->print_layout) {
        fprintf(err, "seldp-harness: --json: needs --print-layout (a run's layout is report.json's "
                     "\"layout\")\n");
        return false;
    }
    if (given && (o->print_layout || o->compare_groups)) {
        for (size_t i = 0; i < hx_option_docs_n; i++) {
            bool reads = false;
            for (size_t k = 0; k < sizeof layout_reads / sizeof layout_reads[0]; k++)
                reads = reads || hx_option_docs[i].opt.val == layout_reads[k];
            if (given[i] && !reads) {
                fprintf(err,
                        "seldp-harness: %s prints the layout and exits without training: it "
                        "would ignore --%s (drop it, or run without %s)\n",
                        o->print_layout ? "--print-layout" : "--compare-groups",
                        hx_option_docs[i].opt.name,
                        o->print_layout ? "--print-layout" : "--compare-groups");
                return false;
            }
        }
    }
    if (o->layout_file && o->grid_given) {
        fprintf(err,
                "seldp-harness: --layout-file and --framework/--tp/--pp/--cp/--etp exclude each "
                "other: the layout file lists the groups\n");
        return false;
    }
    if (hx_bug_refuse_options(o, err))
        return false;
    if (o->inject == HX_FAULT_LOCAL_AUX &&
        (!(o->model.aux_loss_coeff > 0.0) || o->model.aux_loss_scope != TM_AUX_GLOBAL)) {
        fprintf(err,
                "seldp-harness: --inject local-aux: expected --aux-loss-coeff > 0 with "
                "--aux-loss-scope global (the bug normalizes the global load-balancing "
                "statistics locally; this run has %s)\n",
                o->model.aux_loss_coeff > 0.0 ? "--aux-loss-scope local"
                                              : "no load-balancing loss");
        return false;
    }
    return true;
}
