/* The callbacks of seldp-harness's option rows whose value no kind of opt_table.h describes:
 * names owned by other modules (dtypes, quantizations, backends, faults, frameworks), the
 * order (two words or a Megatron order), --out's "none", --loss-scale's "dynamic", and the
 * values report.json shows resolved (the order, the token spread, the schedule). */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bugs.h"
#include "options.h"
#include "options_impl.h"

static hx_options *opts(void *base)
{
    return base;
}

static const hx_options *copts(const void *base)
{
    return base;
}

/* A Megatron order string: tp, cp, ep, dp and pp joined by '-', each at most once (Megatron's
 * RankGenerator appends the ones left out with size 1, and refuses a missing one whose size is
 * above 1; the library does the same). */
static bool is_megatron_order(const char *order)
{
    static const char *const tokens[] = {"tp", "cp", "ep", "dp", "pp"};
    size_t len = strlen(order);
    if (len < 2 || len > 14 || (len + 1) % 3 != 0)
        return false;
    unsigned seen = 0;
    for (size_t i = 0; 3 * i < len; i++) {
        if (3 * i + 2 < len && order[3 * i + 2] != '-')
            return false;
        int id = -1;
        for (int t = 0; t < 5; t++)
            if (strncasecmp(order + 3 * i, tokens[t], 2) == 0)
                id = t;
        if (id < 0 || seen & (1u << id))
            return false;
        seen |= 1u << id;
    }
    return true;
}

bool hx_opt_order_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    hx_options *o = opts(base);
    o->grid.order = arg;
    if (strcasecmp(arg, "ep-dp") == 0) {
        o->order = HX_ORDER_EP_DP;
        o->grid.order = "ep-dp";
        return true;
    }
    if (strcasecmp(arg, "dp-ep") == 0) {
        o->order = HX_ORDER_DP_EP;
        o->grid.order = "dp-ep";
        return true;
    }
    return is_megatron_order(arg);
}

void hx_opt_order_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    const hx_options *o = copts(base);
    snprintf(buf, size, "%s", o->grid.order ? o->grid.order : hx_order_name(o->order));
}

/* Each framework's order when --order is absent, as the library resolves it. */
void hx_opt_order_show(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    (void)base;
    static const seldp_framework frameworks[] = {
        SELDP_FRAMEWORK_MEGATRON, SELDP_FRAMEWORK_MEGATRON_0_9, SELDP_FRAMEWORK_DEEPSPEED,
        SELDP_FRAMEWORK_TORCHTITAN};
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof frameworks / sizeof frameworks[0] && at < size; i++) {
        seldp_layout_config cfg = SELDP_LAYOUT_CONFIG_INIT;
        cfg.framework = frameworks[i];
        seldp_layout *l = NULL;
        const char *order = "?";
        if (seldp_layout_create(&cfg, &l) == SELDP_OK) {
            const char *o = seldp_layout_get_config(l).order;
            order = o ? o : "none (its mesh pp, dp_shard, cp, tp)";
        }
        /* \x01: spaces the wrapping keeps */
        at += (size_t)snprintf(buf + at, size - at, "%s%s\x01%s", i ? ", " : "",
                               seldp_framework_name(frameworks[i]), order);
        seldp_layout_destroy(l);
    }
}

bool hx_opt_framework_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    return seldp_framework_parse(arg, &opts(base)->grid.framework) == SELDP_OK;
}

void hx_opt_framework_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", seldp_framework_name(copts(base)->grid.framework));
}

bool hx_opt_dtype_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    return tm_dtype_parse(arg, &opts(base)->model.dtype);
}

void hx_opt_dtype_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", tm_dtype_name(copts(base)->model.dtype));
}

bool hx_opt_quant_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    return tm_quant_parse(arg, &opts(base)->model.quant);
}

void hx_opt_quant_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", tm_quant_name(copts(base)->model.quant));
}

bool hx_opt_aux_scope_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    return tm_aux_scope_parse(arg, &opts(base)->model.aux_loss_scope);
}

void hx_opt_aux_scope_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", tm_aux_scope_name(copts(base)->model.aux_loss_scope));
}

bool hx_opt_backend_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    return hx_backend_parse(arg, &opts(base)->backend);
}

void hx_opt_backend_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", hx_backend_name(copts(base)->backend));
}

bool hx_opt_inject_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    for (int f = 0; f < HX_FAULT_COUNT; f++) {
        if (strcasecmp(arg, hx_fault_name((hx_fault)f)) == 0) {
            opts(base)->inject = (hx_fault)f;
            return true;
        }
    }
    return false;
}

void hx_opt_inject_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", hx_fault_name(copts(base)->inject));
}

/* --out none: no report files, as --out "" */
bool hx_opt_out_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    opts(base)->out_dir = strcmp(arg, "none") == 0 ? "" : arg;
    return true;
}

/* dynamic (0) or a scale > 0 */
bool hx_opt_loss_scale_parse(const hx_opt_row *row, const char *arg, void *base)
{
    (void)row;
    hx_options *o = opts(base);
    o->loss_scale = 0.0;
    if (strcmp(arg, "dynamic") == 0)
        return true;
    char *end = NULL;
    double v = strtod(arg, &end);
    if (end == arg || *end != '\0' || !isfinite(v) || !(v > 0.0) || v > 1e30)
        return false;
    o->loss_scale = v;
    return true;
}

/* report.json shows the spread the run uses (-1 resolved) */
void hx_opt_spread_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%d", hx_options_spread(copts(base)));
}

void hx_opt_spread_show(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    (void)base;
    hx_options d;
    hx_options_default(&d);
    snprintf(buf, size, "%d", hx_options_spread(&d));
}

void hx_opt_schedule_value(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    snprintf(buf, size, "%s", hx_pipe_schedule_name(hx_pipe_schedule_of(copts(base))));
}

void hx_opt_threads_show(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)row;
    (void)base;
    snprintf(buf, size, "0 (%d here)", tm_reference_threads());
}

/* The default of a named value: the row's own value text of the defaults. */
void hx_opt_name_show(const hx_opt_row *row, const void *base, char *buf, size_t size)
{
    (void)base;
    hx_options d;
    hx_options_default(&d);
    row->value(row, &d, buf, size);
}
