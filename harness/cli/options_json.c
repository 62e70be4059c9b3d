/* report.json's "options" object, written by iterating the option table (the rows with a
 * `json` key, in table order), and read back through the same rows. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>

#include "json.h"
#include "options.h"
#include "options_impl.h"
#include "util.h"

/* The JSON type of a row's value: a flag is a boolean, a number kind a number, the rest a
 * string (null where a string option is unset). */
static bool is_number(const hx_opt_row *r)
{
    return r->kind == HX_OPT_INT || r->kind == HX_OPT_DOUBLE || r->kind == HX_OPT_SEED ||
           r->kind == HX_OPT_SIZE;
}

void hx_options_json(const hx_options *o, hx_buf *b,
                     void (*after)(const char *key, hx_buf *b, const void *ctx), const void *ctx)
{
    bool first = true;
    hx_buf_puts(b, "{");
    for (size_t i = 0; i < hx_option_docs_n; i++) {
        const hx_opt_row *r = &hx_option_docs[i];
        if (!r->json)
            continue;
        hx_buf_printf(b, "%s\"%s\": ", first ? "" : ", ", r->json);
        first = false;
        char text[512];
        hx_opt_value_text(r, o, text, sizeof text);
        if (r->kind == HX_OPT_FLAG) {
            hx_buf_puts(b, strcmp(text, "true") == 0 ? "true" : "false");
        } else if (r->kind == HX_OPT_DOUBLE) {
            double v;
            memcpy(&v, (const char *)o + r->offset, sizeof v);
            hx_buf_json_number(b, v);
        } else if (is_number(r)) {
            hx_buf_puts(b, text);
        } else if (!text[0] && (r->kind == HX_OPT_PATH || r->kind == HX_OPT_STRING)) {
            hx_buf_puts(b, "null");
        } else {
            hx_buf_json_string(b, text);
        }
        if (after)
            after(r->json, b, ctx);
    }
    hx_buf_puts(b, "}");
}

bool hx_options_from_json(const hx_json *obj, hx_options *o, char *msg, size_t size)
{
    for (size_t i = 0; i < hx_option_docs_n; i++) {
        const hx_opt_row *r = &hx_option_docs[i];
        const hx_json *v = r->json ? hx_json_get(obj, r->json) : NULL;
        if (!v || v->type == HX_JSON_NULL)
            continue;
        char text[512];
        if (v->type == HX_JSON_BOOL && r->kind == HX_OPT_FLAG) {
            if (!v->boolean)
                continue;
            text[0] = '\0';
        } else if (v->type == HX_JSON_STRING) {
            snprintf(text, sizeof text, "%s", v->string);
        } else if (v->type == HX_JSON_NUMBER && v->is_integer) {
            snprintf(text, sizeof text, "%lld", (long long)v->integer);
        } else if (v->type == HX_JSON_NUMBER) {
            snprintf(text, sizeof text, "%.17g", v->number);
        } else {
            snprintf(msg, size, "\"%s\": expected a %s, not %s", r->json,
                     r->kind == HX_OPT_FLAG ? "boolean" : "string or a number",
                     hx_json_type_name(v->type));
            return false;
        }
        /* strings stay the JSON document's (o borrows them as it borrows argv's); numbers and
         * flags are stored as values */
        const char *arg = v->type == HX_JSON_STRING ? v->string : text;
        bool ok = hx_opt_parse_value(r, arg, o, msg, size);
        if (!ok)
            return false;
    }
    return true;
}
