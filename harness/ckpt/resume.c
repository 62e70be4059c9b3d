/* The resume rules (resume.h): one table, and the comparison of each row it can check. */
#include "resume.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* What a row compares: the checkpoint's value and this run's, as text. */
typedef enum resume_field {
    F_NONE, /* may change: nothing to compare */
    F_DTYPE,
    F_VOCAB,
    F_D_MODEL,
    F_D_FF,
    F_EXPERTS,
    F_TOP_K,
    F_LAYERS,
    F_EPS,
    F_QUANT,
    F_LORA_RANK,
    F_LORA_ALPHA,
    F_SHARED_FF,
    F_SEED,
    F_FP32_MASTER,
    F_STREAM,
    F_GLOBAL_BATCH,
    F_LR,
    F_AUX,
    F_AUX_SCOPE,
    F_Z,
    F_CAPACITY
} resume_field;

typedef struct resume_row {
    hx_resume_setting setting;
    resume_field field;
    const char *key; /* the config's key, or the option's value name in messages */
} resume_row;

static const resume_row rows[] = {
    {{"the layout (--ep --order --framework --tp --pp --cp --etp --layout-file --roots)",
      HX_RESUME_MAY_CHANGE, "resharded: experts re-owned, TP shards re-split, stages re-cut"},
     F_NONE,
     NULL},
    {{"--world", HX_RESUME_MAY_CHANGE, "resharded over the new world"}, F_NONE, NULL},
    {{"--steps", HX_RESUME_MAY_CHANGE,
      "the total, resumed steps included: it must pass the checkpoint's step"},
     F_NONE,
     NULL},
    {{"--expert-reduce", HX_RESUME_MAY_CHANGE, "both flows give the same gradients"}, F_NONE, NULL},
    {{"--clip-grad", HX_RESUME_MAY_CHANGE, "a bound on each later step's update"}, F_NONE, NULL},
    {{"--backend --overlap --bucket-bytes --timeout", HX_RESUME_MAY_CHANGE,
      "how the reductions run, not what they compute"},
     F_NONE,
     NULL},
    {{"--pipeline-schedule", HX_RESUME_MAY_CHANGE,
      "every schedule accumulates the micro-batches in one order: the same bits"},
     F_NONE,
     NULL},
    {{"--dtype", HX_RESUME_REFUSED, "the parameters are stored in the checkpoint's dtype"},
     F_DTYPE,
     "dtype"},
    {{"--vocab", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"},
     F_VOCAB,
     "vocab"},
    {{"--d-model", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"},
     F_D_MODEL,
     "d_model"},
    {{"--d-ff", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"}, F_D_FF, "d_ff"},
    {{"--experts", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"},
     F_EXPERTS,
     "experts"},
    {{"--top-k", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"},
     F_TOP_K,
     "top_k"},
    {{"--layers", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"},
     F_LAYERS,
     "layers"},
    {{"(eps)", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"}, F_EPS, "eps"},
    {{"--quant", HX_RESUME_REFUSED, "the expert bases are stored quantized as saved"},
     F_QUANT,
     "quant"},
    {{"--lora-rank", HX_RESUME_REFUSED, "the adapters are stored at the saved rank"},
     F_LORA_RANK,
     "lora_rank"},
    {{"--lora-alpha", HX_RESUME_REFUSED, "the adapters' scale is the saved one"},
     F_LORA_ALPHA,
     "lora_alpha"},
    {{"--shared-expert-ff", HX_RESUME_REFUSED, "a resumed run trains the checkpoint's model"},
     F_SHARED_FF,
     "d_ff_shared"},
    {{"--seed", HX_RESUME_REFUSED,
      "the seed draws every rank's tokens; a resumed run continues the checkpoint's stream"},
     F_SEED,
     "seed"},
    {{"--fp32-master", HX_RESUME_REFUSED,
      "the FP32 master weights are part of the saved state, or absent from it"},
     F_FP32_MASTER,
     NULL},
    {{"the token stream (--global-batch or not)", HX_RESUME_REFUSED,
      "a resumed run continues the checkpoint's stream of tokens"},
     F_STREAM,
     NULL},
    {{"--global-batch", HX_RESUME_REFUSED,
      "the global stream continues with the checkpoint's tokens per step"},
     F_GLOBAL_BATCH,
     NULL},
    {{"--lr", HX_RESUME_RECORDED, "the steps from the checkpoint on take the new rate"},
     F_LR,
     NULL},
    {{"--aux-loss-coeff", HX_RESUME_RECORDED,
      "the objective from the checkpoint on is this run's (a new experiment, not a "
      "continuation)"},
     F_AUX,
     NULL},
    {{"--aux-loss-scope", HX_RESUME_RECORDED, "the objective from the checkpoint on is this run's"},
     F_AUX_SCOPE,
     NULL},
    {{"--z-loss-coeff", HX_RESUME_RECORDED, "the objective from the checkpoint on is this run's"},
     F_Z,
     NULL},
    {{"--capacity-factor", HX_RESUME_RECORDED,
      "the objective from the checkpoint on is this run's"},
     F_CAPACITY,
     NULL},
};
#define N_ROWS (sizeof rows / sizeof rows[0])

size_t hx_resume_setting_count(void)
{
    return N_ROWS;
}

const hx_resume_setting *hx_resume_setting_at(size_t i)
{
    return i < N_ROWS ? &rows[i].setting : NULL;
}

const char *hx_resume_rule_name(hx_resume_rule rule)
{
    return rule == HX_RESUME_REFUSED    ? "refused"
           : rule == HX_RESUME_RECORDED ? "recorded"
                                        : "may change";
}

static void number(double x, char *buf, size_t size)
{
    snprintf(buf, size, "%.17g", x);
    /* the shortest text that reads back the same */
    for (int digits = 1; digits < 17; digits++) {
        char b[64];
        snprintf(b, sizeof b, "%.*g", digits, x);
        if (strtod(b, NULL) == x) {
            snprintf(buf, size, "%s", b);
            return;
        }
    }
}

/* The checkpoint's value and this run's of row r as text; -1: not recorded, 0: the same,
 * 1: they differ. */
static int compare(const resume_row *r, const hx_ckpt *c, const hx_options *o, char *saved,
                   char *now, size_t size)
{
    const tm_config *a = &c->config, *b = &o->model;
    long x = 0, y = 0;
    double u = 0, v = 0;
    bool as_int = true;
    switch (r->field) {
    case F_NONE:
        return -1;
    case F_DTYPE:
        snprintf(saved, size, "%s", tm_dtype_name(a->dtype));
        snprintf(now, size, "%s", tm_dtype_name(b->dtype));
        return a->dtype != b->dtype;
    case F_QUANT:
        snprintf(saved, size, "%s", tm_quant_name(a->quant));
        snprintf(now, size, "%s", tm_quant_name(b->quant));
        return a->quant != b->quant;
    case F_AUX_SCOPE:
        if (!c->router_known || !(a->aux_loss_coeff > 0 && b->aux_loss_coeff > 0))
            return -1;
        snprintf(saved, size, "%s", tm_aux_scope_name(a->aux_loss_scope));
        snprintf(now, size, "%s", tm_aux_scope_name(b->aux_loss_scope));
        return a->aux_loss_scope != b->aux_loss_scope;
    case F_FP32_MASTER:
        snprintf(saved, size, "%s",
                 c->fp32_master ? "with --fp32-master" : "without --fp32-master");
        snprintf(now, size, "%s", o->fp32_master ? "with it" : "without it");
        return c->fp32_master != o->fp32_master;
    case F_STREAM:
        snprintf(saved, size, "%s", c->global_stream ? "global" : "per-rank");
        snprintf(now, size, "%s", o->global_batch > 0 ? "global" : "per-rank");
        return c->global_stream != (o->global_batch > 0);
    case F_VOCAB:
        x = a->vocab, y = b->vocab;
        break;
    case F_D_MODEL:
        x = a->d_model, y = b->d_model;
        break;
    case F_D_FF:
        x = a->d_ff, y = b->d_ff;
        break;
    case F_EXPERTS:
        x = a->experts, y = b->experts;
        break;
    case F_TOP_K:
        x = a->top_k, y = b->top_k;
        break;
    case F_LAYERS:
        x = a->layers, y = b->layers;
        break;
    case F_LORA_RANK:
        if (!a->quant && !b->quant)
            return -1;
        x = a->lora_rank, y = b->lora_rank;
        break;
    case F_SHARED_FF:
        if (!c->router_known)
            return -1;
        x = a->d_ff_shared, y = b->d_ff_shared;
        break;
    case F_SEED:
        snprintf(saved, size, "%llu", (unsigned long long)a->seed);
        snprintf(now, size, "%llu", (unsigned long long)b->seed);
        return a->seed != b->seed;
    case F_GLOBAL_BATCH:
        if (!c->training_known || !c->global_stream || o->global_batch <= 0)
            return -1;
        x = c->global_batch, y = o->global_batch;
        break;
    default:
        as_int = false;
        switch (r->field) {
        case F_EPS:
            u = a->eps, v = b->eps;
            break;
        case F_LORA_ALPHA:
            if (!a->quant && !b->quant)
                return -1;
            u = a->lora_alpha, v = b->lora_alpha;
            break;
        case F_LR:
            if (!c->training_known)
                return -1;
            u = c->lr, v = o->lr;
            break;
        case F_AUX:
            if (!c->router_known)
                return -1;
            u = a->aux_loss_coeff, v = b->aux_loss_coeff;
            break;
        case F_Z:
            if (!c->router_known)
                return -1;
            u = a->z_loss_coeff, v = b->z_loss_coeff;
            break;
        default: /* F_CAPACITY */
            if (!c->router_known)
                return -1;
            u = a->capacity_factor, v = b->capacity_factor;
            break;
        }
    }
    if (as_int) {
        snprintf(saved, size, "%ld", x);
        snprintf(now, size, "%ld", y);
        return x != y;
    }
    number(u, saved, size);
    number(v, now, size);
    return u != v;
}

/* The refusal of row r, one line. */
static seldp_status refuse(const resume_row *r, const char *index, const char *saved,
                           const char *now)
{
    const char *option = r->setting.name;
    switch (r->field) {
    case F_DTYPE:
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: dtype change: the checkpoint holds %s parameters, this run stores %s "
                       "(resume with --dtype %s)",
                       index, saved, now, saved);
    case F_FP32_MASTER:
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: the checkpoint was saved %s, this run is %s: %s", index, saved, now,
                       r->setting.reason);
    case F_STREAM:
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: the checkpoint's token stream is %s, this run's %s: resume %s "
                       "--global-batch",
                       index, saved, now, strcmp(saved, "global") == 0 ? "with" : "without");
    case F_GLOBAL_BATCH:
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: the checkpoint's global batch is %s tokens a step, this run's %s: %s "
                       "(resume with --global-batch %s)",
                       index, saved, now, r->setting.reason, saved);
    case F_EPS:
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: the checkpoint's model has eps %s, this run's %s: %s", index, saved,
                       now, r->setting.reason);
    default:
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: the checkpoint's model has %s %s, this run's %s: %s (resume with %s "
                       "%s)",
                       index, r->key, saved, now, r->setting.reason, option, saved);
    }
}

seldp_status hx_resume_check(hx_ckpt *c, const char *index, const hx_options *o)
{
    char saved[64], now[64];
    hx_buf notes = {0};
    for (size_t i = 0; i < N_ROWS; i++) {
        const resume_row *r = &rows[i];
        if (r->setting.rule == HX_RESUME_MAY_CHANGE)
            continue;
        if (compare(r, c, o, saved, now, sizeof saved) != 1)
            continue;
        if (r->setting.rule == HX_RESUME_REFUSED) {
            hx_buf_free(&notes);
            return refuse(r, index, saved, now);
        }
        hx_buf_printf(&notes, "%s %s: the checkpoint trained with %s; %s\n", r->setting.name, now,
                      saved, r->setting.reason);
    }
    free(c->notes);
    c->notes = NULL;
    if (notes.len) {
        if (!hx_buf_ok(&notes))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        c->notes = notes.data;
    }
    return SELDP_OK;
}

void hx_resume_print_rules(FILE *out)
{
    for (size_t i = 0; i < N_ROWS; i++)
        fprintf(out, "%-10s  %s: %s\n", hx_resume_rule_name(rows[i].setting.rule),
                rows[i].setting.name, rows[i].setting.reason);
}
