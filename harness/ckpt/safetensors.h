/* The safetensors format: a writer for --dump and a strict reader for tests and tools.
 *
 * Layout of a file: an 8-byte little-endian header length N, N bytes of JSON header
 * (padded with spaces to a multiple of 8), then the tensor bytes. The header maps each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to
 * the data section) and may hold "__metadata__", an object of string values.
 * The reader checks what the reference implementation checks: known dtypes, byte sizes
 * that match the shapes, and offsets that tile the data section without gaps or overlap. */
#ifndef HX_SAFETENSORS_H
#define HX_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "seldp/dtype.h"
#include "seldp/status.h"
#include "seldp/tensor.h"

/* Safetensors' name of a dtype ("F32", "BF16", "I32", "BOOL"...); NULL outside the enum. */
const char *hx_st_dtype_name(seldp_dtype dtype);

/* ---- writer ---------------------------------------------------------------------------- */

typedef struct hx_st_writer hx_st_writer;

/* Create an empty writer. */
seldp_status hx_st_writer_create(hx_st_writer **out);

/* Free a writer (never the tensors' bytes). NULL is a no-op. */
void hx_st_writer_destroy(hx_st_writer *w);

/* Add a tensor. `name` is copied; `data` (host memory, numel * dtype size bytes) is borrowed
 * until hx_st_write returns. SELDP_ERR_DUPLICATE for a name already added or "__metadata__". */
seldp_status hx_st_add(hx_st_writer *w, const char *name, seldp_dtype dtype, int ndim,
                       const int64_t *shape, const void *data);

/* Add a __metadata__ entry (both strings copied). SELDP_ERR_DUPLICATE for a key already set. */
seldp_status hx_st_add_metadata(hx_st_writer *w, const char *key, const char *value);

/* Write the file: tensors in name order, contiguous. SELDP_ERR_IO naming the path. */
seldp_status hx_st_write(const hx_st_writer *w, const char *path);

/* ---- reader ---------------------------------------------------------------------------- */

/* One tensor of a file read with hx_st_read; `data` points into the file's buffer. */
typedef struct hx_st_tensor {
    const char *name;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[SELDP_MAX_DIMS];
    const void *data;
    size_t nbytes;
} hx_st_tensor;

typedef struct hx_st_file hx_st_file;

/* Read and validate a whole file. SELDP_ERR_IO when it cannot be read, SELDP_ERR_PARSE
 * (naming the path and the tensor) when it is malformed. Free with hx_st_file_free. */
seldp_status hx_st_read(const char *path, hx_st_file **out);

/* As hx_st_read over `len` bytes in memory (copied); `what` names the source in errors. */
seldp_status hx_st_parse(const void *bytes, size_t len, const char *what, hx_st_file **out);

void hx_st_file_free(hx_st_file *file);

/* Number of tensors, and the i-th in name order. */
size_t hx_st_count(const hx_st_file *file);
const hx_st_tensor *hx_st_at(const hx_st_file *file, size_t i);

/* The tensor called `name`, or NULL. */
const hx_st_tensor *hx_st_find(const hx_st_file *file, const char *name);

/* The __metadata__ value of `key`, or NULL. */
const char *hx_st_metadata(const hx_st_file *file, const char *key);

#endif
