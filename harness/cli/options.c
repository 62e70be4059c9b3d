/* seldp-harness command line: the defaults and the parse (the option table's rows through
 * opt_table.c's loop), the imports under the command line, then hx_options_check. */
#define _POSIX_C_SOURCE 200809L

#include "options.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "seldp/version.h"

#include "import.h"
#include "options_impl.h"

void hx_options_default(hx_options *o)
{
    *o = (hx_options){0};
    /* what no option sets (the model's norm epsilon) comes from the model's and the grid's own
     * initializers; every option's default from its row */
    o->model = (tm_config)TM_CONFIG_INIT;
    o->grid = (hx_grid)HX_GRID_INIT;
    hx_opt_defaults(&hx_options_table, o);
}

const char *hx_flow_name(hx_flow flow)
{
    return flow == HX_FLOW_MEAN ? "mean" : "sum";
}

const char *hx_policy_name(seldp_missing_policy policy)
{
    return policy == SELDP_MISSING_ZERO ? "zero" : "error";
}

const char *hx_order_name(hx_order order)
{
    return order == HX_ORDER_DP_EP ? "dp-ep" : "ep-dp";
}

const char *hx_roots_name(hx_roots roots)
{
    return hx_layout_roots_word(roots);
}

int hx_options_spread(const hx_options *o)
{
    return o->token_spread >= 0 ? o->token_spread : o->tokens / 4;
}

/* One getopt pass over argv into *o through the option table; given[row] marks each row
 * named. */
static hx_parse_result parse_pass(int argc, char **argv, hx_options *o, FILE *out, FILE *err,
                                  bool *given)
{
    const hx_opt_row *action = NULL;
    switch (hx_opt_parse(&hx_options_table, argc, argv, o, given, &action, err)) {
    case HX_OPT_OK:
        return HX_PARSE_RUN;
    case HX_OPT_DONE:
        if (action->opt.val == OPT_HELP)
            hx_options_usage(out);
        else
            fprintf(out, "seldp-harness %s\n", seldp_version());
        return HX_PARSE_EXIT;
    default:
        return HX_PARSE_ERROR;
    }
}

/* The imports' settings into *o (the options before the command line), one at a time so that a
 * refusal names the config key it came from; then the command line on top. */
/* The text of an imported value, kept for the life of the process. An option's string
 * field points at its argument (argv's, which outlives the options); an import's values live
 * in its settings, freed when the import is, so the value an option keeps is a copy. Each
 * distinct text is kept once. NULL when out of memory. */
static char *kept_text(const char *text)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static struct kept {
        struct kept *next;
        char text[];
    } *kept = NULL;
    pthread_mutex_lock(&lock);
    struct kept *k = kept;
    while (k && strcmp(k->text, text) != 0)
        k = k->next;
    if (!k) {
        size_t len = strlen(text) + 1;
        k = malloc(sizeof *k + len);
        if (k) {
            memcpy(k->text, text, len);
            k->next = kept;
            kept = k;
        }
    }
    pthread_mutex_unlock(&lock);
    return k ? k->text : NULL;
}

static hx_parse_result apply_imports(int argc, char **argv, hx_options *o, const hx_options *start,
                                     const bool *given, FILE *out, FILE *err)
{
    hx_parse_result r = HX_PARSE_RUN;
    hx_import imp = {0};
    const char *sources[HX_IMPORT_KINDS] = {o->from_megatron, o->from_torchtitan,
                                            o->from_deepspeed};
    if (hx_import_read(sources, o, given, &imp) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        hx_import_free(&imp);
        return HX_PARSE_ERROR;
    }
    hx_options t = *start;
    bool scratch[HX_OPTIONS_MAX] = {0};
    for (size_t i = 0; i < imp.n && r == HX_PARSE_RUN; i++) {
        const hx_import_setting *s = &imp.settings[i];
        if (!hx_import_applies(&imp, s))
            continue;
        char *value = kept_text(s->value);
        if (!value) {
            fprintf(err, "seldp-harness: out of memory\n");
            r = HX_PARSE_ERROR;
            break;
        }
        char *words[4] = {argv[0], (char *)s->arg, value, NULL};
        int n = s->value[0] ? 3 : 2;
        words[n] = NULL;
        char *text = NULL;
        size_t len = 0;
        FILE *msg = open_memstream(&text, &len);
        if (!msg) {
            fprintf(err, "seldp-harness: out of memory\n");
            r = HX_PARSE_ERROR;
            break;
        }
        r = parse_pass(n, words, &t, msg, msg, scratch);
        fclose(msg);
        if (r != HX_PARSE_RUN) {
            const char *m = text ? text : "";
            if (strncmp(m, "seldp-harness: ", 15) == 0)
                m += 15;
            fprintf(err, "seldp-harness: --from-%s %s: %.*s\n", hx_import_name(s->from), s->source,
                    (int)strcspn(m, "\n"), m);
            r = HX_PARSE_ERROR;
        }
        free(text);
    }
    if (r == HX_PARSE_RUN)
        r = parse_pass(argc, argv, &t, out, err, scratch);
    if (r == HX_PARSE_RUN) {
        *o = t;
        if (!o->quiet)
            hx_import_print(&imp, o->print_json ? err : out);
    }
    hx_import_free(&imp);
    return r;
}

hx_parse_result hx_options_parse(int argc, char **argv, hx_options *o, FILE *out, FILE *err)
{
    const hx_options start = *o;
    bool given[HX_OPTIONS_MAX] = {0};
    hx_parse_result r = parse_pass(argc, argv, o, out, err, given);
    if (r != HX_PARSE_RUN)
        return r;
    if (o->from_megatron || o->from_torchtitan || o->from_deepspeed) {
        r = apply_imports(argc, argv, o, &start, given, out, err);
        if (r != HX_PARSE_RUN)
            return r;
    }
    return hx_options_check(o, given, err) ? HX_PARSE_RUN : HX_PARSE_ERROR;
}
