/* seldp-harness's options: one row each (opt_table.h) with its name, value kind and range,
 * field of hx_options, default, argument name, help line, --help section, the expectation its
 * errors state, report.json key and whether a sweep file may set it. Parsing, defaults,
 * --help, sweep keys and report.json's "options" all come from these rows; a new option is
 * one row here and the code that reads its field. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>

#include "bugs.h"
#include "options.h"
#include "options_impl.h"

#define F(field)    HX_OPT_FIELD(hx_options, field)
#define MARK(field) HX_OPT_MARK(hx_options, field)

static const hx_opt_name roots_names[] = {
    {"first", HX_ROOTS_FIRST}, {"last", HX_ROOTS_LAST}, {"spread", HX_ROOTS_SPREAD}, {NULL, 0}};
static const hx_opt_name flow_names[] = {{"sum", HX_FLOW_SUM}, {"mean", HX_FLOW_MEAN}, {NULL, 0}};
static const hx_opt_name policy_names[] = {
    {"error", SELDP_MISSING_ERROR}, {"zero", SELDP_MISSING_ZERO}, {NULL, 0}};
static const hx_opt_name optimizer_names[] = {
    {"sgd", HX_OPT_SGD}, {"adamw", HX_OPT_ADAMW}, {NULL, 0}};
static const hx_opt_name schedule_names[] = {
    {"1f1b", HX_PIPE_1F1B}, {"afab", HX_PIPE_AFAB}, {"sequential", HX_PIPE_SEQUENTIAL}, {NULL, 0}};

/* the defaults --help shows for rows whose default means "not given" */
static void show_etp(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    (void)r;
    (void)base;
    snprintf(buf, size, "%s", "the framework's: Megatron tp, DeepSpeed and torchtitan 1");
}

static void show_loss_scale(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    (void)r;
    (void)base;
    snprintf(buf, size, "%s", "none");
}

static void show_inject_overflow(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    (void)r;
    (void)base;
    snprintf(buf, size, "%s", "none");
}

static void show_ranks_per_process(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    (void)r;
    (void)base;
    snprintf(buf, size, "%s", "off: one rank per process");
}

static void show_pipeline_schedule(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    (void)r;
    (void)base;
    snprintf(buf, size, "%s", "1f1b");
}

static void show_global_batch(const hx_opt_row *r, const void *base, char *buf, size_t size)
{
    (void)r;
    (void)base;
    snprintf(buf, size, "%s", "none");
}

const hx_opt_row hx_option_docs[] = {
#include "options_rows_layout.inc"
#include "options_rows_training.inc"
#include "options_rows_output.inc"
};

const size_t hx_option_docs_n = sizeof hx_option_docs / sizeof hx_option_docs[0];
_Static_assert(sizeof hx_option_docs / sizeof hx_option_docs[0] <= HX_OPTIONS_MAX,
               "HX_OPTIONS_MAX is smaller than the option table");

static const char *const section_titles[HX_SEC_COUNT] = {
    "layout (the ranks and their groups)",
    "model (tiny-moe and its router)",
    "training (the step, its dtypes, the transport)",
    "experiments (sweeps, layouts printed or compared)",
    "output",
    "checkpoints",
    "self-tests (defects and planted framework bugs the checks must catch)",
    "program",
};

const hx_opt_table hx_options_table = {hx_option_docs,
                                       sizeof hx_option_docs / sizeof hx_option_docs[0],
                                       "seldp-harness", section_titles, HX_SEC_COUNT};
