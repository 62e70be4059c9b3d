/* libFuzzer target: the layout-file parser (harness/core/json.c, harness/layout/layout.c) on
 * arbitrary bytes. The first byte picks how roots are chosen; the rest is the file.
 *
 * Properties: parsing never reads outside the text (which has no terminating NUL), never
 * crashes and leaks nothing; a layout that loads satisfies its invariants (checked again by
 * hx_layout_validate), prints, and its own JSON loads back to the same layout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

static FILE *sink;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sink = fopen("/dev/null", "w");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    hx_roots roots = (hx_roots)(data[0] % 3);
    /* a copy of exactly the text's length, so that ASan sees a read past its end */
    size_t len = size - 1;
    char *text = malloc(len ? len : 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, len);
    hx_layout *layout = NULL;
    seldp_status st = hx_layout_parse(text, len, "fuzz.json", 0, 0, roots, &layout);
    free(text);
    if (st != SELDP_OK) {
        if (layout)
            abort();
        return 0;
    }
    if (hx_layout_validate(layout, "again") != SELDP_OK)
        abort();
    if (sink && layout->world <= 256)
        hx_layout_print(layout, NULL, sink);
    int *owners = calloc((size_t)layout->world, sizeof *owners);
    for (int e = 0; owners && e < layout->experts; e++)
        for (int g = 0; g < layout->n_ep; g++)
            if (hx_layout_owners_in(layout, e, g, owners) < 1)
                abort(); /* validated: every expert has an owner in every EP group */
    free(owners);

    hx_buf json = {0}, again = {0};
    hx_layout_json(layout, &json);
    hx_layout *copy = NULL;
    if (hx_layout_parse(hx_buf_str(&json), json.len, "copy.json", 0, 0, roots, &copy) != SELDP_OK)
        abort(); /* the layout's own JSON does not load */
    hx_layout_json(copy, &again);
    if (strcmp(hx_buf_str(&json), hx_buf_str(&again)) != 0)
        abort(); /* and does not reproduce it */
    hx_buf_free(&json);
    hx_buf_free(&again);
    hx_layout_destroy(copy);
    hx_layout_destroy(layout);
    return 0;
}
