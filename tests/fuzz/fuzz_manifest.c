/* libFuzzer target: the schema-manifest decoder (src/manifest.c) on arbitrary bytes, as a
 * faulty or hostile rank could send them in initialize's all-gather.
 *
 * Properties: decoding never reads outside the blob, never crashes and leaks nothing; a blob
 * that decodes re-encodes to exactly the same bytes (the format has one encoding per
 * manifest); and the decoded manifest compares equal to itself and can be compared with a
 * well-formed one in either role (root or not) without trouble. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "manifest.h"

/* A small well-formed manifest: a tied pair, a frozen parameter, a CUDA one. */
static const seldp__manifest_entry reference_entries[] = {
    {"embed.weight", SELDP_F32, 2, {8, 4}, 0, false, SELDP_DEVICE_HOST},
    {"frozen.scale", SELDP_BF16, 1, {3}, 1, true, SELDP_DEVICE_HOST},
    {"layers.0.w", SELDP_F16, 0, {0}, 2, false, SELDP_DEVICE_CUDA},
    {"lm_head.weight", SELDP_F32, 2, {8, 4}, 0, false, SELDP_DEVICE_HOST},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    seldp__manifest decoded = {0, NULL, NULL};
    seldp_status st = seldp__manifest_decode(data, size, &decoded);
    if (st != SELDP_OK) {
        /* a failure leaves nothing to free */
        if ((st != SELDP_ERR_PARSE && st != SELDP_ERR_NOMEM) || decoded.entries || decoded.strings)
            abort();
        return 0;
    }

    void *blob = NULL;
    size_t bytes = 0;
    if (seldp__manifest_encode(&decoded, &blob, &bytes) != SELDP_OK)
        abort();
    if (bytes != size || memcmp(blob, data, size) != 0)
        abort(); /* decode and encode disagree on the format */
    free(blob);

    seldp__manifest reference = {sizeof reference_entries / sizeof reference_entries[0],
                                 (seldp__manifest_entry *)reference_entries, NULL};
    seldp__manifest pair[2] = {decoded, decoded};
    const int world_ranks[2] = {4, 7};
    if (seldp__manifest_compare(pair, 2, 0, world_ranks) != SELDP_OK)
        abort(); /* a manifest differs from itself */
    pair[1] = reference;
    seldp_status a = seldp__manifest_compare(pair, 2, 0, world_ranks);
    seldp_status b = seldp__manifest_compare(pair, 2, 1, world_ranks);
    if (a != b || (a != SELDP_OK && a != SELDP_ERR_SCHEMA))
        abort(); /* equality is symmetric */
    seldp__manifest_free(&decoded);
    return 0;
}
