/* seldp-bugs: the known framework bugs of the harness (harness/check/bugs.c), as the documents show
 * them. `seldp-bugs` prints docs/harness.md's --inject table, `seldp-bugs --catalog` the
 * catalog of results/bugs/README.md, `seldp-bugs --names` one name per line, `seldp-bugs
 * --demo NAME` the command line a bug shows on, `--pending NAME` the option it waits for
 * (exit 1 when none) and `seldp-bugs --json` every row as JSON. Exit 2 for an unknown
 * argument. */
#include <stdio.h>
#include <string.h>

#include "bugs.h"

static const hx_bug *find(const char *name)
{
    for (int i = 0; i < hx_bug_count(); i++)
        if (strcmp(hx_bug_at(i)->name, name) == 0)
            return hx_bug_at(i);
    return NULL;
}

int main(int argc, char **argv)
{
    hx_buf b = {0};
    if (argc == 1) {
        hx_bugs_markdown(&b);
    } else if (argc == 2 && strcmp(argv[1], "--catalog") == 0) {
        hx_bugs_catalog(&b);
    } else if (argc == 2 && strcmp(argv[1], "--json") == 0) {
        hx_buf_puts(&b, "[");
        for (int i = 0; i < hx_bug_count(); i++) {
            const hx_bug *bug = hx_bug_at(i);
            const char *keys[] = {"name", "mistake", "citation", "needs", "signature", "demo"};
            const char *values[] = {bug->name,  bug->mistake,   bug->citation,
                                    bug->needs, bug->signature, bug->demo};
            hx_buf_puts(&b, i ? ",\n {" : "\n {");
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
                hx_buf_printf(&b, "\"%s\": ", keys[k]);
                hx_buf_json_string(&b, values[k]);
                hx_buf_puts(&b, ", ");
            }
            hx_buf_puts(&b, "\"pending\": ");
            if (bug->pending)
                hx_buf_json_string(&b, bug->pending);
            else
                hx_buf_puts(&b, "null");
            hx_buf_puts(&b, "}");
        }
        hx_buf_puts(&b, "\n]\n");
    } else if (argc == 2 && strcmp(argv[1], "--names") == 0) {
        for (int i = 0; i < hx_bug_count(); i++)
            hx_buf_printf(&b, "%s\n", hx_bug_at(i)->name);
    } else if (argc == 3 && find(argv[2]) &&
               (strcmp(argv[1], "--demo") == 0 || strcmp(argv[1], "--pending") == 0 ||
                strcmp(argv[1], "--field") == 0)) {
        const hx_bug *bug = find(argv[2]);
        if (strcmp(argv[1], "--pending") == 0) {
            if (!bug->pending)
                return 1;
            printf("%s\n", bug->pending);
            return 0;
        }
        printf("%s\n", bug->demo);
        return 0;
    } else {
        fprintf(stderr, "seldp-bugs: expected no argument, --catalog, --names, --json, --demo NAME "
                        "or --pending NAME (NAME a known bug)\n");
        return 2;
    }
    if (!hx_buf_ok(&b))
        return 1;
    fputs(hx_buf_str(&b), stdout);
    hx_buf_free(&b);
    return 0;
}
