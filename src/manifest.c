/* Schema manifests: build one from a rank's selection, encode it for an all-gather,
 * decode the other ranks' blobs defensively, and compare them with the root's.
 *
 * Encoding (all integers little-endian):
 *   "SDPM" | u32 version | u32 count | count entries of
 *   u32 path_len | path bytes (no NUL) | u8 dtype | u8 ndim | u8 flags (bit 0: frozen) |
 *   u8 device kind | u32 alias | ndim x i64 extents */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "manifest.h"

#define MANIFEST_MAGIC        "SDPM"
#define MANIFEST_VERSION      1u
#define MANIFEST_HEADER_BYTES 12u
/* path_len, at least one path byte, four u8 fields, alias */
#define MANIFEST_MIN_ENTRY_BYTES 13u
#define MANIFEST_FLAG_FROZEN     1u

static int compare_ids(const void *a, const void *b)
{
    seldp_param_id x = *(const seldp_param_id *)a, y = *(const seldp_param_id *)b;
    return (x > y) - (x < y);
}

seldp_status seldp__manifest_build(const seldp_model *model, const seldp_param_id *sorted_ids,
                                   size_t n_ids, seldp__manifest *out)
{
    seldp_status st = SELDP_OK;
    size_t n_params = seldp_model_count(model);
    seldp__manifest m = {0, NULL, NULL};
    /* first_index[k]: manifest index of the smallest path of sorted_ids[k] */
    uint32_t *first_index = NULL;

    if (n_params > UINT32_MAX)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "a model of %zu paths is too large for a manifest",
                   n_params);
    m.entries = calloc(n_params ? n_params : 1, sizeof *m.entries);
    first_index = malloc((n_ids ? n_ids : 1) * sizeof *first_index);
    if (!m.entries || !first_index)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory building a schema manifest of %zu paths",
                   n_params);
    for (size_t k = 0; k < n_ids; k++)
        first_index[k] = UINT32_MAX;

    for (size_t i = 0; i < n_params; i++) {
        const seldp_param *p = seldp_model_at(model, i);
        const seldp_param_id *hit =
            bsearch(&p->id, sorted_ids, n_ids, sizeof *sorted_ids, compare_ids);
        if (!hit)
            continue;
        size_t k = (size_t)(hit - sorted_ids);
        seldp__manifest_entry *e = &m.entries[m.count];
        if (first_index[k] == UINT32_MAX)
            first_index[k] = (uint32_t)m.count;
        e->path = p->path;
        e->dtype = p->tensor.dtype;
        e->ndim = p->tensor.ndim;
        memcpy(e->shape, p->tensor.shape, sizeof e->shape);
        e->alias = first_index[k];
        e->frozen = p->frozen;
        e->device_kind = p->tensor.device.kind;
        m.count++;
    }
    free(first_index);
    *out = m;
    return SELDP_OK;
fail:
    free(first_index);
    free(m.entries);
    return st;
}

/* --- encoding ------------------------------------------------------------- */

static unsigned char *put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

static unsigned char *put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

seldp_status seldp__manifest_encode(const seldp__manifest *manifest, void **blob, size_t *bytes)
{
    seldp_status st = SELDP_OK;
    size_t total = MANIFEST_HEADER_BYTES;
    unsigned char *buf = NULL, *p;

    if (manifest->count > UINT32_MAX)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "a manifest of %zu paths is too large to encode",
                   manifest->count);
    for (size_t i = 0; i < manifest->count; i++) {
        const seldp__manifest_entry *e = &manifest->entries[i];
        size_t len = strlen(e->path);
        if (len > UINT32_MAX)
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "path of %zu bytes is too long to encode", len);
        total += MANIFEST_MIN_ENTRY_BYTES - 1 + len + 8 * (size_t)e->ndim;
    }
    buf = malloc(total);
    if (!buf)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory encoding a schema manifest of %zu bytes", total);
    p = buf;
    memcpy(p, MANIFEST_MAGIC, 4);
    p = put_u32(p + 4, MANIFEST_VERSION);
    p = put_u32(p, (uint32_t)manifest->count);
    for (size_t i = 0; i < manifest->count; i++) {
        const seldp__manifest_entry *e = &manifest->entries[i];
        size_t len = strlen(e->path);
        p = put_u32(p, (uint32_t)len);
        memcpy(p, e->path, len);
        p += len;
        *p++ = (unsigned char)e->dtype;
        *p++ = (unsigned char)e->ndim;
        *p++ = (unsigned char)(e->frozen ? MANIFEST_FLAG_FROZEN : 0u);
        *p++ = (unsigned char)e->device_kind;
        p = put_u32(p, e->alias);
        for (int d = 0; d < e->ndim; d++)
            p = put_u64(p, (uint64_t)e->shape[d]);
    }
    *blob = buf;
    *bytes = total;
    return SELDP_OK;
fail:
    return st;
}

/* --- decoding ------------------------------------------------------------- */

/* A cursor over the blob: every read checks the bytes left first. */
typedef struct reader {
    const unsigned char *p;
    size_t left;
} reader;

static bool get_bytes(reader *r, void *dst, size_t n)
{
    if (r->left < n)
        return false;
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
    return true;
}

static bool get_u8(reader *r, unsigned *v)
{
    unsigned char c;
    if (!get_bytes(r, &c, 1))
        return false;
    *v = c;
    return true;
}

static bool get_u32(reader *r, uint32_t *v)
{
    unsigned char b[4];
    if (!get_bytes(r, b, 4))
        return false;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return true;
}

static bool get_u64(reader *r, uint64_t *v)
{
    unsigned char b[8];
    if (!get_bytes(r, b, 8))
        return false;
    *v = 0;
    for (int i = 7; i >= 0; i--)
        *v = *v << 8 | b[i];
    return true;
}

/* Decode entry `i`, its path copied to *arena (advanced past the NUL). */
static seldp_status decode_entry(reader *r, seldp__manifest *m, size_t i, char **arena)
{
    seldp_status st = SELDP_OK;
    seldp__manifest_entry *e = &m->entries[i];
    uint32_t len = 0, alias = 0;
    unsigned dtype = 0, ndim = 0, flags = 0, kind = 0;
    size_t bytes;

    if (!get_u32(r, &len) || len == 0 || len > r->left)
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry %zu: path length %u is invalid", i,
                   (unsigned)len);
    if (memchr(r->p, '\0', len))
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry %zu: path contains a NUL byte", i);
    get_bytes(r, *arena, len);
    (*arena)[len] = '\0';
    e->path = *arena;
    *arena += (size_t)len + 1;
    if (i > 0 && strcmp(m->entries[i - 1].path, e->path) >= 0)
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry %zu: path '%s' is not after '%s'", i, e->path,
                   m->entries[i - 1].path);

    if (!get_u8(r, &dtype) || !get_u8(r, &ndim) || !get_u8(r, &flags) || !get_u8(r, &kind) ||
        !get_u32(r, &alias))
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry %zu ('%s') is truncated", i, e->path);
    if (!seldp_dtype_valid((seldp_dtype)dtype))
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': dtype %u is invalid", e->path, dtype);
    if (ndim > SELDP_MAX_DIMS)
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': %u dimensions (at most %d)", e->path,
                   ndim, SELDP_MAX_DIMS);
    if (flags & ~MANIFEST_FLAG_FROZEN)
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': unknown flags 0x%x", e->path, flags);
    if (kind != SELDP_DEVICE_HOST && kind != SELDP_DEVICE_CUDA)
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': device kind %u is invalid", e->path,
                   kind);
    /* An alias names an earlier (smaller) path that is its own group's first path. */
    if (alias > i || (alias < i && m->entries[alias].alias != alias))
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': alias index %u is invalid", e->path,
                   (unsigned)alias);
    e->dtype = (seldp_dtype)dtype;
    e->ndim = (int)ndim;
    e->frozen = flags & MANIFEST_FLAG_FROZEN;
    e->device_kind = (seldp_device_kind)kind;
    e->alias = alias;

    bytes = seldp_dtype_size(e->dtype);
    for (unsigned d = 0; d < ndim; d++) {
        uint64_t extent = 0;
        if (!get_u64(r, &extent))
            SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': shape is truncated", e->path);
        if (extent > (uint64_t)INT64_MAX)
            SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': extent %d is negative", e->path,
                       (int)d);
        if (extent != 0 && bytes > SIZE_MAX / extent)
            SELDP_FAIL(SELDP_ERR_PARSE, "manifest entry '%s': byte size overflows", e->path);
        bytes *= (size_t)extent;
        e->shape[d] = (int64_t)extent;
    }
    return SELDP_OK;
fail:
    return st;
}

seldp_status seldp__manifest_decode(const void *blob, size_t bytes, seldp__manifest *out)
{
    seldp_status st = SELDP_OK;
    reader r = {blob, bytes};
    seldp__manifest m = {0, NULL, NULL};
    char magic[4];
    uint32_t version = 0, count = 0;
    char *arena;

    if (!blob && bytes)
        SELDP_FAIL(SELDP_ERR_PARSE, "manifest blob is NULL");
    if (!get_bytes(&r, magic, 4) || memcmp(magic, MANIFEST_MAGIC, 4) != 0)
        SELDP_FAIL(SELDP_ERR_PARSE, "not a schema manifest (bad magic, %zu bytes)", bytes);
    if (!get_u32(&r, &version) || version != MANIFEST_VERSION)
        SELDP_FAIL(SELDP_ERR_PARSE, "schema manifest version %u (expected %u)", (unsigned)version,
                   MANIFEST_VERSION);
    if (!get_u32(&r, &count) || count > r.left / MANIFEST_MIN_ENTRY_BYTES)
        SELDP_FAIL(SELDP_ERR_PARSE, "schema manifest claims %u entries in %zu bytes",
                   (unsigned)count, bytes);

    m.count = count;
    m.entries = calloc(count ? count : 1, sizeof *m.entries);
    /* the paths and one NUL each fit in the blob's remaining bytes plus count */
    m.strings = malloc(r.left + count + 1);
    if (!m.entries || !m.strings)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory decoding a schema manifest of %zu bytes", bytes);
    arena = m.strings;
    for (size_t i = 0; i < count; i++)
        SELDP_CHECK(decode_entry(&r, &m, i, &arena));
    if (r.left != 0)
        SELDP_FAIL(SELDP_ERR_PARSE, "schema manifest has %zu trailing bytes", r.left);
    *out = m;
    return SELDP_OK;
fail:
    seldp__manifest_free(&m);
    return st;
}

void seldp__manifest_free(seldp__manifest *manifest)
{
    if (!manifest)
        return;
    free(manifest->entries);
    free(manifest->strings);
    manifest->entries = NULL;
    manifest->strings = NULL;
    manifest->count = 0;
}

/* --- comparison ----------------------------------------------------------- */

/* What differs between two entries of the same path; checked in this order. */
typedef enum entry_diff {
    DIFF_NONE = 0,
    DIFF_DTYPE,
    DIFF_SHAPE,
    DIFF_ALIAS,
    DIFF_FROZEN,
    DIFF_DEVICE
} entry_diff;

/* The next entry at or after index i tied with alias head `head`, or m->count. */
static size_t next_tied(const seldp__manifest *m, size_t i, uint32_t head)
{
    while (i < m->count && m->entries[i].alias != head)
        i++;
    return i;
}

/* Whether the paths tied to a in ma (its alias set, a included) are those tied to b in mb.
 * Alias groups are compared by their paths, not by index, so that a difference earlier in
 * the list does not shift every later index. Linear in the manifests' length. */
static bool same_alias_set(const seldp__manifest *ma, const seldp__manifest_entry *a,
                           const seldp__manifest *mb, const seldp__manifest_entry *b)
{
    size_t i = next_tied(ma, a->alias, a->alias), j = next_tied(mb, b->alias, b->alias);
    while (i < ma->count && j < mb->count) {
        if (strcmp(ma->entries[i].path, mb->entries[j].path) != 0)
            return false;
        i = next_tied(ma, i + 1, a->alias);
        j = next_tied(mb, j + 1, b->alias);
    }
    return i == ma->count && j == mb->count;
}

/* What differs between two entries of one path, the alias set aside. */
static entry_diff diff_except_alias(const seldp__manifest_entry *a, const seldp__manifest_entry *b)
{
    if (a->dtype != b->dtype)
        return DIFF_DTYPE;
    if (a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) != 0)
        return DIFF_SHAPE;
    if (a->frozen != b->frozen)
        return DIFF_FROZEN;
    if (a->device_kind != b->device_kind)
        return DIFF_DEVICE;
    return DIFF_NONE;
}

static entry_diff diff_entries(const seldp__manifest *ma, const seldp__manifest_entry *a,
                               const seldp__manifest *mb, const seldp__manifest_entry *b)
{
    entry_diff d = diff_except_alias(a, b);
    if (d == DIFF_DTYPE || d == DIFF_SHAPE)
        return d;
    if (!same_alias_set(ma, a, mb, b))
        return DIFF_ALIAS;
    return d;
}

static const seldp__manifest_entry *find_entry(const seldp__manifest *m, const char *path)
{
    size_t lo = 0, hi = m->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->entries[mid].path, path);
        if (c == 0)
            return &m->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The earlier of two paths (NULL: none). */
static const char *earlier(const char *x, const char *y)
{
    if (!x)
        return y;
    if (!y)
        return x;
    return strcmp(x, y) <= 0 ? x : y;
}

/* The first path (in path order) where `m` differs from `root`, or NULL. A path tied to
 * A on one side and to B on the other changes the alias sets of A and of B, and the
 * smaller of the two is the first path whose alias set differs on its account: so one
 * pass over the paths, comparing only the paths they are tied to, finds the first. */
static const char *first_difference(const seldp__manifest *root, const seldp__manifest *m)
{
    size_t i = 0, j = 0;
    const char *first = NULL;
    while (i < root->count || j < m->count) {
        const seldp__manifest_entry *a = i < root->count ? &root->entries[i] : NULL;
        const seldp__manifest_entry *b = j < m->count ? &m->entries[j] : NULL;
        int c = !a ? 1 : !b ? -1 : strcmp(a->path, b->path);
        if (c < 0) {
            first = earlier(first, a->path);
            i++;
            continue;
        }
        if (c > 0) {
            first = earlier(first, b->path);
            j++;
            continue;
        }
        const char *ta = root->entries[a->alias].path, *tb = m->entries[b->alias].path;
        if (strcmp(ta, tb) != 0)
            first = earlier(first, earlier(ta, tb));
        if (diff_except_alias(a, b) != DIFF_NONE)
            first = earlier(first, a->path);
        i++;
        j++;
    }
    return first;
}

static void describe(const seldp__manifest *m, const seldp__manifest_entry *e, entry_diff what,
                     char *buf, size_t size)
{
    seldp_tensor t;
    switch (what) {
    case DIFF_DTYPE:
        snprintf(buf, size, "dtype %s", seldp_dtype_name(e->dtype));
        break;
    case DIFF_SHAPE:
        memset(&t, 0, sizeof t);
        t.dtype = e->dtype;
        t.ndim = e->ndim;
        memcpy(t.shape, e->shape, sizeof t.shape);
        snprintf(buf, size, "shape ");
        seldp_shape_str(&t, buf + strlen(buf), size - strlen(buf));
        break;
    case DIFF_ALIAS: {
        /* the alias set, in path order: {'a', 'c'} */
        size_t used = (size_t)snprintf(buf, size, "alias set {");
        size_t count = 0;
        for (size_t i = next_tied(m, e->alias, e->alias); i < m->count && used < size;
             i = next_tied(m, i + 1, e->alias), count++) {
            if (used + strlen(m->entries[i].path) + 8 >= size) {
                used += (size_t)snprintf(buf + used, size - used, ", ...");
                break;
            }
            used += (size_t)snprintf(buf + used, size - used, "%s'%s'", count ? ", " : "",
                                     m->entries[i].path);
        }
        if (used < size)
            snprintf(buf + used, size - used, "}%s",
                     count == 1 ? " (untied: its own ParamId)" : "");
        break;
    }
    case DIFF_FROZEN:
        snprintf(buf, size, "it %s", e->frozen ? "frozen" : "trainable");
        break;
    case DIFF_DEVICE:
        snprintf(buf, size, "it on a %s device",
                 e->device_kind == SELDP_DEVICE_CUDA ? "cuda" : "host");
        break;
    case DIFF_NONE:
        buf[0] = '\0';
        break;
    }
}

seldp_status seldp__manifest_compare(const seldp__manifest *manifests, int n, int root,
                                     const int *world_ranks)
{
    const seldp__manifest *rm = &manifests[root];
    const char *first = NULL;
    const seldp__manifest_entry *re, *xe = NULL;
    char ranks[256] = "", mine[320] = "", theirs[320] = "";
    int culprit = -1;
    entry_diff what = DIFF_NONE;
    size_t used = 0;

    for (int r = 0; r < n; r++) {
        const char *d = r == root ? NULL : first_difference(rm, &manifests[r]);
        if (d && (!first || strcmp(d, first) < 0))
            first = d;
    }
    if (!first)
        return SELDP_OK;

    /* the root's entry at the first differing path, and the ranks that differ there */
    re = find_entry(rm, first);
    for (int r = 0; r < n; r++) {
        const seldp__manifest_entry *e;
        entry_diff d;
        if (r == root)
            continue;
        e = find_entry(&manifests[r], first);
        if (!e && !re)
            continue;
        d = e && re ? diff_entries(rm, re, &manifests[r], e) : DIFF_NONE;
        if (e && re && d == DIFF_NONE)
            continue;
        if (culprit < 0) {
            culprit = r;
            xe = e;
            what = d;
        }
        if (used < sizeof ranks - 16)
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? "," : "", r);
    }

    if (!re)
        return seldp__fail(SELDP_ERR_SCHEMA,
                           "schema differs at '%s': selected on group rank %d (world rank %d) but "
                           "not on root (group rank %d, world rank %d); group ranks differing "
                           "from root here: %s",
                           first, culprit, world_ranks[culprit], root, world_ranks[root], ranks);
    if (!xe)
        return seldp__fail(SELDP_ERR_SCHEMA,
                           "schema differs at '%s': selected on root (group rank %d, world rank "
                           "%d) but not on group rank %d (world rank %d); group ranks differing "
                           "from root here: %s",
                           first, root, world_ranks[root], culprit, world_ranks[culprit], ranks);
    describe(&manifests[culprit], xe, what, mine, sizeof mine);
    describe(rm, re, what, theirs, sizeof theirs);
    return seldp__fail(SELDP_ERR_SCHEMA,
                       "schema differs at '%s': group rank %d (world rank %d) has %s, root (group "
                       "rank %d, world rank %d) has %s; group ranks differing from root here: %s",
                       first, culprit, world_ranks[culprit], mine, root, world_ranks[root], theirs,
                       ranks);
}
