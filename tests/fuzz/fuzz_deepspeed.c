/* libFuzzer target: the DeepSpeed ds_config import (harness/import/import_deepspeed.c, on the
 * strict JSON reader harness/core/json.c) on arbitrary bytes.
 *
 * Properties (fuzz_import.h): never a crash, a leak or a read outside the input (a copy of
 * exactly its length); a refusal is one line; every setting is a harness option. */
#include <stdint.h>

#include "fuzz_import.h"

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
    char *text = malloc(size ? size : 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    hx_options o;
    fuzz_cmdline(&o);
    bool given[HX_OPTIONS_MAX] = {0};
    hx_import imp = {0};
    imp.cmdline = &o;
    imp.given = given;
    seldp_status st = hx_import_deepspeed(text, size, "fuzz.json", &imp);
    if (st == SELDP_OK) {
        hx_import_sizes sizes = hx_import_resolve(&imp);
        st = hx_import_deepspeed_finish(&imp, &sizes);
    }
    fuzz_check_refusal(st);
    fuzz_check_import(&imp, st == SELDP_OK ? sink : NULL);
    hx_import_free(&imp);
    free(text);
    return 0;
}
