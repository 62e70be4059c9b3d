/* libFuzzer target: the sweep file (harness/sweep/sweep_entries.c: hx_sweep_file_parse) on
 * arbitrary bytes: the JSON list, each object's keys, and each value through the harness's own
 * option parser (harness/cli/options.c), as --sweep FILE reads it before anything runs.
 *
 * Properties: never a crash, a leak or a read outside the input; a refusal prints one line; a
 * file that reads has 1 to 256 runs, each a list of "--option" words with their values, that
 * the option parser takes. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep_entries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1), *msg = NULL;
    size_t msg_len = 0;
    if (!text)
        return 0;
    memcpy(text, data, size);
    hx_sweep s = {.name = "fuzz.json", .out_dir = ""};
    FILE *err = open_memstream(&msg, &msg_len);
    if (!err) {
        free(text);
        return 0;
    }
    bool ok = hx_sweep_file_parse(&s, text, size, err);
    fclose(err);
    free(text);
    if (!ok && (!msg || !msg[0] || strchr(msg, '\n') != msg + strlen(msg) - 1))
        abort(); /* one line */
    if (ok && (s.n < 1 || s.n > 256))
        abort();
    for (int i = 0; ok && i < s.n; i++) {
        hx_sweep_entry *e = &s.entries[i];
        char *argv[2 * 48 + 2];
        int argc = 0;
        argv[argc++] = "seldp-harness";
        for (int a = 0; a < e->n_args; a++)
            argv[argc++] = e->args[a];
        argv[argc] = NULL;
        if (e->n_args && strncmp(e->args[0], "--", 2) != 0)
            abort();
        hx_options o;
        char why[512];
        /* each value was parsed alone; together they may still conflict (a whole run's
         * checks are the sweep's next step): only that the parser returns */
        (void)hx_sweep_parse_options(argc, argv, &o, why, sizeof why);
    }
    for (int i = 0; s.entries && i < s.n; i++)
        for (int a = 0; a < s.entries[i].n_args; a++)
            free(s.entries[i].args[a]);
    free(s.entries);
    free(msg);
    return 0;
}
