/* What --resume lets a run change, in one table: each setting may change (the checkpoint is
 * resharded to the new layout and world), is refused (exit 2, one line naming the setting,
 * both values and the option to give), or is recorded (the run continues with the new value
 * and says so, one line).
 *
 *   may change  the layout (--ep --order --framework --tp --pp --cp --etp --layout-file
 *               --roots), --world, --steps (the total: it must pass the checkpoint's step),
 *               --expert-reduce, --clip-grad, the transport and its tuning
 *   refused     --dtype, the model's sizes and quantization (--vocab --d-model --d-ff --experts
 *               --top-k --layers --quant --lora-rank --lora-alpha --shared-expert-ff),
 *               --seed, --fp32-master, the token stream (--global-batch or not) and
 *               --global-batch N
 *   recorded    --lr, the router's objective (--aux-loss-coeff --aux-loss-scope
 *               --z-loss-coeff --capacity-factor)
 *
 * A checkpoint written before an index recorded a setting leaves that setting unchecked. */
#ifndef HX_RESUME_H
#define HX_RESUME_H

#include <stdio.h>

#include "seldp/status.h"

#include "checkpoint_index.h"
#include "options.h"

typedef enum hx_resume_rule {
    HX_RESUME_MAY_CHANGE = 0,
    HX_RESUME_REFUSED = 1,
    HX_RESUME_RECORDED = 2
} hx_resume_rule;

/* One row of the table. */
typedef struct hx_resume_setting {
    const char *name; /* the option(s), as --help spells them */
    hx_resume_rule rule;
    const char *reason; /* why, one line */
} hx_resume_setting;

/* The rows of the table, in order (NULL past the last). */
size_t hx_resume_setting_count(void);
const hx_resume_setting *hx_resume_setting_at(size_t i);

/* "may change", "refused", "recorded". */
const char *hx_resume_rule_name(hx_resume_rule rule);

/* Check the run's options against checkpoint c (`index` names its index.json in messages):
 * SELDP_ERR_INVALID_ARGUMENT with one line for the first refused change; the recorded changes
 * into c->notes, one line each ("--lr 0.1: the checkpoint trained with 0.5; ..."). */
seldp_status hx_resume_check(hx_ckpt *c, const char *index, const hx_options *opts);

/* The table, one line per setting: --help-like text for the docs and the tests. */
void hx_resume_print_rules(FILE *out);

#endif
