/* Buckets: a dtype class's tensors as one byte stream cut into bounded buckets, so
 * that a session makes ceil(bytes / bucket) collectives instead of one per tensor. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "bucket.h"
#include "device.h"
#include "internal.h"
#include "kernels.h"

size_t seldp__bucket_capacity(size_t bucket_bytes, size_t elem_size)
{
    size_t elems = elem_size ? bucket_bytes / elem_size : 0;
    return (elems ? elems : 1) * elem_size;
}

size_t seldp__bucket_count(size_t total, size_t capacity)
{
    return total / capacity + (total % capacity != 0);
}

void seldp__bucket_span(size_t total, size_t capacity, size_t index, size_t *offset, size_t *bytes)
{
    size_t start = index * capacity;
    *offset = start;
    *bytes = start >= total ? 0 : (total - start < capacity ? total - start : capacity);
}

seldp_status seldp__bucket_stream_init(seldp__bucket_stream *s, seldp_device device,
                                       size_t capacity, size_t max_segs)
{
    s->device = device;
    s->capacity = capacity;
    s->n_segs = 0;
    s->data = malloc((max_segs ? max_segs : 1) * sizeof *s->data);
    s->offsets = malloc((max_segs + 1) * sizeof *s->offsets);
    if (!s->data || !s->offsets) {
        seldp__bucket_stream_free(s);
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory planning buckets for %zu tensors",
                           max_segs);
    }
    s->offsets[0] = 0;
    return SELDP_OK;
}

void seldp__bucket_stream_add(seldp__bucket_stream *s, void *data, size_t bytes)
{
    s->data[s->n_segs] = data;
    s->offsets[s->n_segs + 1] = s->offsets[s->n_segs] + bytes;
    s->n_segs++;
}

size_t seldp__bucket_stream_bytes(const seldp__bucket_stream *s)
{
    return s->offsets[s->n_segs];
}

/* Index of the segment holding stream byte `at` (< total): the last segment starting at or
 * before it, skipping empty ones. */
static size_t segment_at(const seldp__bucket_stream *s, size_t at)
{
    size_t lo = 0, hi = s->n_segs;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->offsets[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* A byte copy as a batch segment of the widest unsigned type that the addresses and the
 * length allow, so that the device copies words rather than bytes. */
static seldp__convert_seg copy_seg(void *dst, const void *src, size_t bytes)
{
    static const seldp_dtype widths[] = {SELDP_U64, SELDP_U32, SELDP_U16, SELDP_U8};
    uintptr_t bits = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes;
    seldp_dtype dtype = SELDP_U8;
    for (size_t w = 0; w < 4; w++) {
        size_t size = seldp_dtype_size(widths[w]);
        if (bits % size == 0) {
            dtype = widths[w];
            break;
        }
    }
    return (seldp__convert_seg){dst, src, dtype, dtype, bytes / seldp_dtype_size(dtype)};
}

/* Copy bucket `index` between the stream's tensors and `bucket`, in either direction: one
 * batched copy (one kernel launch and one wait on a GPU) per SELDP_CONVERT_BATCH_MAX
 * pieces, so a bucket of many small tensors costs one launch, not one per tensor. */
static seldp_status bucket_copy(const seldp__bucket_stream *s, size_t index, void *bucket,
                                bool to_bucket, size_t *out_bytes)
{
    seldp_status st = SELDP_OK;
    seldp__convert_seg batch[SELDP_CONVERT_BATCH_MAX];
    size_t n_batch = 0;
    size_t start, bytes, done = 0;
    seldp__bucket_span(seldp__bucket_stream_bytes(s), s->capacity, index, &start, &bytes);
    if (out_bytes)
        *out_bytes = bytes;
    if (bytes == 0)
        return SELDP_OK;
    for (size_t seg = segment_at(s, start); done < bytes; seg++) {
        size_t seg_start = s->offsets[seg], seg_end = s->offsets[seg + 1];
        size_t at = start + done;
        if (seg_end <= at)
            continue;
        size_t n = seg_end - at < bytes - done ? seg_end - at : bytes - done;
        char *tensor = (char *)s->data[seg] + (at - seg_start);
        char *part = (char *)bucket + done;
        batch[n_batch++] = to_bucket ? copy_seg(part, tensor, n) : copy_seg(tensor, part, n);
        if (n_batch == SELDP_CONVERT_BATCH_MAX) {
            SELDP_CHECK(seldp__convert_batch(s->device, batch, n_batch));
            n_batch = 0;
        }
        done += n;
    }
    SELDP_CHECK(seldp__convert_batch(s->device, batch, n_batch));
    return SELDP_OK;
fail:
    return st;
}

seldp_status seldp__bucket_pack(const seldp__bucket_stream *s, size_t index, void *bucket,
                                size_t *bytes)
{
    return bucket_copy(s, index, bucket, true, bytes);
}

seldp_status seldp__bucket_unpack(const seldp__bucket_stream *s, size_t index, const void *bucket)
{
    return bucket_copy(s, index, (void *)bucket, false, NULL);
}

void seldp__bucket_stream_free(seldp__bucket_stream *s)
{
    free(s->data);
    free(s->offsets);
    s->data = NULL;
    s->offsets = NULL;
    s->n_segs = 0;
}
