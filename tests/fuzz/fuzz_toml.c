/* libFuzzer target: the strict TOML reader (harness/import/toml.c) and the torchtitan import on top
 * of it (harness/import/import_torchtitan.c) on arbitrary bytes.
 *
 * Properties: never a crash, a leak or a read outside the input (a copy of exactly its length,
 * no NUL after it); a tree that reads has objects whose keys are distinct and arrays and
 * objects whose counts match; the import keeps fuzz_import.h's properties. */
#include <stdint.h>

#include "fuzz_import.h"
#include "toml.h"

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

static void check_tree(const hx_json *v, int depth)
{
    if (depth > 200)
        abort();
    if (v->type == HX_JSON_OBJECT) {
        for (size_t i = 0; i < v->count; i++) {
            if (!v->keys || !v->keys[i])
                abort();
            for (size_t j = 0; j < i; j++)
                if (strcmp(v->keys[i], v->keys[j]) == 0)
                    abort(); /* TOML defines a key once */
        }
    }
    if (v->type == HX_JSON_STRING && !v->string)
        abort();
    if ((v->type == HX_JSON_ARRAY || v->type == HX_JSON_OBJECT) && v->count && !v->items)
        abort();
    for (size_t i = 0; i < v->count; i++)
        check_tree(&v->items[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    hx_json *root = NULL;
    seldp_status st = hx_toml_parse(text, size, "fuzz.toml", &root);
    fuzz_check_refusal(st);
    if (st != SELDP_OK) {
        if (root)
            abort();
        free(text);
        return 0;
    }
    check_tree(root, 0);
    hx_json_free(root);
    hx_options o;
    fuzz_cmdline(&o);
    bool given[HX_OPTIONS_MAX] = {0};
    hx_import imp = {0};
    imp.cmdline = &o;
    imp.given = given;
    st = hx_import_torchtitan(text, size, "fuzz.toml", &imp);
    if (st == SELDP_OK) {
        hx_import_sizes sizes = hx_import_resolve(&imp);
        st = hx_import_torchtitan_finish(&imp, &sizes);
    }
    fuzz_check_refusal(st);
    fuzz_check_import(&imp, st == SELDP_OK ? sink : NULL);
    hx_import_free(&imp);
    free(text);
    return 0;
}
