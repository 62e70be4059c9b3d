/* libFuzzer target: the safetensors reader (harness/safetensors.c) on arbitrary bytes.
 *
 * Properties: parsing never reads outside the input, never crashes and leaks nothing; a
 * file that parses has tensors whose byte sizes match their dtypes and shapes and tile the
 * data section exactly, each found again by its name, and every byte of every tensor
 * readable (ASan checks the reads). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hx_st_file *file = NULL;
    if (hx_st_parse(data, size, "fuzz.safetensors", &file) != SELDP_OK) {
        if (file)
            abort(); /* a failure returns nothing */
        return 0;
    }
    size_t total = 0;
    unsigned sum = 0;
    for (size_t i = 0; i < hx_st_count(file); i++) {
        const hx_st_tensor *t = hx_st_at(file, i);
        size_t bytes = seldp_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            bytes *= (size_t)t->shape[d];
        if (bytes != t->nbytes || hx_st_find(file, t->name) != t)
            abort();
        for (size_t b = 0; b < t->nbytes; b++)
            sum += ((const unsigned char *)t->data)[b];
        total += t->nbytes;
    }
    if (hx_st_at(file, hx_st_count(file)) != NULL)
        abort();
    /* the data section is exactly the tensors: header length + 8 + total == size */
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--)
        header = header << 8 | data[i];
    if (8 + header + total != size)
        abort();
    (void)hx_st_metadata(file, "config");
    (void)sum;
    hx_st_file_free(file);
    return 0;
}
