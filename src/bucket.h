/* Buckets: coalescing many tensors into few collectives.
 *
 * The tensors of one dtype class are seen as one byte stream, in the order they were
 * added, cut into buckets of at most `capacity` bytes (a multiple of the element
 * size). A stream of b bytes therefore costs ceil(b / capacity) collectives however
 * many tensors it holds; a tensor larger than a bucket spans several. Packing and
 * unpacking copy between the tensors and one bucket buffer on the stream's device. */
#ifndef SELDP_BUCKET_H
#define SELDP_BUCKET_H

#include <stddef.h>

#include "seldp/status.h"
#include "seldp/tensor.h"

typedef struct seldp__bucket_stream {
    seldp_device device;
    size_t capacity; /* bytes per bucket, > 0 */
    size_t n_segs;
    void **data;     /* n_segs tensor pointers */
    size_t *offsets; /* n_segs + 1 prefix sums of the segments' bytes; offsets[n_segs] = total */
} seldp__bucket_stream;

/* Bytes per bucket for elements of `elem_size` bytes: bucket_bytes rounded down to a
 * whole element, at least one element. */
size_t seldp__bucket_capacity(size_t bucket_bytes, size_t elem_size);

/* Number of buckets covering `total` bytes: ceil(total / capacity). */
size_t seldp__bucket_count(size_t total, size_t capacity);

/* The byte range [*offset, *offset + *bytes) of bucket `index` of a `total`-byte stream. */
void seldp__bucket_span(size_t total, size_t capacity, size_t index, size_t *offset, size_t *bytes);

/* An empty stream of at most `max_segs` segments on `device`. SELDP_ERR_NOMEM on failure. */
seldp_status seldp__bucket_stream_init(seldp__bucket_stream *s, seldp_device device,
                                       size_t capacity, size_t max_segs);

/* Append a tensor's bytes (borrowed; must outlive the stream). The caller keeps n_segs
 * within the max_segs given at init. */
void seldp__bucket_stream_add(seldp__bucket_stream *s, void *data, size_t bytes);

/* Total bytes of the stream. */
size_t seldp__bucket_stream_bytes(const seldp__bucket_stream *s);

/* Copy bucket `index` of the stream into `bucket` (capacity bytes on the stream's device);
 * *bytes receives its length. */
seldp_status seldp__bucket_pack(const seldp__bucket_stream *s, size_t index, void *bucket,
                                size_t *bytes);

/* Copy bucket `index` from `bucket` back into the stream's tensors. */
seldp_status seldp__bucket_unpack(const seldp__bucket_stream *s, size_t index, const void *bucket);

/* Release the stream's bookkeeping (never the tensors). */
void seldp__bucket_stream_free(seldp__bucket_stream *s);

#endif
