/* libFuzzer target: the safetensors reader (harness/ckpt/safetensors.c) and the checkpoint index
 * parser (harness/ckpt/checkpoint_index.c) on arbitrary bytes.
 *
 * Properties: parsing never reads outside the input, never crashes and leaks nothing; a
 * file that parses has tensors whose byte sizes match their dtypes and shapes and tile the
 * data section exactly, each found again by its name, and every byte of every tensor
 * readable (ASan checks the reads). A checkpoint shard's metadata (format, step, rank) reads
 * as strings. The same bytes as a checkpoint's index.json: refused with a message, or an
 * index whose every tensor lies in one of its files, inside that file's size, with a slice
 * inside its shape whose element count matches its bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "checkpoint_index.h"
#include "safetensors.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_index(const uint8_t *data, size_t size)
{
    hx_ckpt *c = NULL;
    if (hx_ckpt_parse((const char *)data, size, "fuzz/index.json", "fuzz", &c) != SELDP_OK) {
        if (c || hx_last_error()[0] == '\0')
            abort(); /* a failure returns nothing and says why */
        return;
    }
    if (c->step < 1 || c->n_files == 0 || c->n_tensors == 0)
        abort();
    for (size_t i = 0; i < c->n_tensors; i++) {
        const ckpt_tensor *t = &c->tensors[i];
        if (t->file < 0 || (size_t)t->file >= c->n_files ||
            t->offset + t->nbytes > c->files[t->file].bytes)
            abort();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->slice[d][0] < 0 || t->slice[d][0] > t->slice[d][1] ||
                t->slice[d][1] > t->shape[d])
                abort();
            numel *= (uint64_t)(t->slice[d][1] - t->slice[d][0]);
        }
        if (numel * seldp_dtype_size(t->dtype) != t->nbytes)
            abort();
    }
    hx_ckpt_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_index(data, size);
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
    /* a checkpoint shard's metadata */
    const char *format = hx_st_metadata(file, "format");
    if (format && strcmp(format, "seldp-checkpoint") == 0) {
        const char *step = hx_st_metadata(file, "step"), *rank = hx_st_metadata(file, "rank");
        sum += (unsigned)(step ? strlen(step) : 0) + (unsigned)(rank ? strlen(rank) : 0);
    }
    (void)sum;
    hx_st_file_free(file);
    return 0;
}
