/* Buckets: a dtype class's tensors as one byte stream cut into bounded buckets, so
 * that a session makes ceil(bytes / bucket) collectives instead of one per tensor. */
#include <stdbool.h>
#include <stdlib.h>

#include "bucket.h"
#include "device.h"
#include "internal.h"

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

/* Copy bucket `index` between the stream's tensors and `bucket`, in either direction. */
static seldp_status bucket_copy(const seldp__bucket_stream *s, size_t index, void *bucket,
                                bool to_bucket, size_t *out_bytes)
{
    seldp_status st = SELDP_OK;
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
        char *slot = (char *)bucket + done;
        if (to_bucket)
            SELDP_CHECK(seldp__device_copy(slot, s->device, tensor, s->device, n));
        else
            SELDP_CHECK(seldp__device_copy(tensor, s->device, slot, s->device, n));
        done += n;
    }
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
