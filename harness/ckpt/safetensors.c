/* safetensors writer and strict reader (see safetensors.h). */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)

static const char *const st_names[SELDP_DTYPE_COUNT] = {
    [SELDP_F32] = "F32",  [SELDP_F64] = "F64", [SELDP_F16] = "F16", [SELDP_BF16] = "BF16",
    [SELDP_I8] = "I8",    [SELDP_U8] = "U8",   [SELDP_I16] = "I16", [SELDP_U16] = "U16",
    [SELDP_I32] = "I32",  [SELDP_U32] = "U32", [SELDP_I64] = "I64", [SELDP_U64] = "U64",
    [SELDP_BOOL] = "BOOL"};

const char *hx_st_dtype_name(seldp_dtype dtype)
{
    return seldp_dtype_valid(dtype) ? st_names[dtype] : NULL;
}

static bool st_dtype_parse(const char *name, seldp_dtype *out)
{
    for (int d = 0; d < SELDP_DTYPE_COUNT; d++) {
        if (strcmp(st_names[d], name) == 0) {
            *out = (seldp_dtype)d;
            return true;
        }
    }
    return false;
}

/* Element count of a shape, false on overflow. */
static bool shape_bytes(seldp_dtype dtype, int ndim, const int64_t *shape, size_t *bytes)
{
    size_t n = seldp_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return false;
        if (shape[i] != 0 && n > SIZE_MAX / (size_t)shape[i])
            return false;
        n *= (size_t)shape[i];
    }
    *bytes = n;
    return true;
}

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct st_entry {
    char *name;
    seldp_dtype dtype;
    int ndim;
    int64_t shape[SELDP_MAX_DIMS];
    const void *data;
    size_t nbytes;
} st_entry;

struct hx_st_writer {
    st_entry *entries;
    size_t count;
    size_t cap;
    char **meta_keys;
    char **meta_values;
    size_t meta_count;
    size_t meta_cap;
};

seldp_status hx_st_writer_create(hx_st_writer **out)
{
    *out = hx_calloc(1, sizeof **out);
    return *out ? SELDP_OK : SELDP_ERR_NOMEM;
}

void hx_st_writer_destroy(hx_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->count; i++)
        free(w->entries[i].name);
    for (size_t i = 0; i < w->meta_count; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->entries);
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

seldp_status hx_st_add(hx_st_writer *w, const char *name, seldp_dtype dtype, int ndim,
                       const int64_t *shape, const void *data)
{
    if (!seldp_dtype_valid(dtype) || ndim < 0 || ndim > SELDP_MAX_DIMS)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "safetensors: tensor '%s': bad dtype or rank",
                       name);
    if (strcmp(name, "__metadata__") == 0)
        return hx_fail(SELDP_ERR_DUPLICATE, "safetensors: '__metadata__' is reserved");
    for (size_t i = 0; i < w->count; i++)
        if (strcmp(w->entries[i].name, name) == 0)
            return hx_fail(SELDP_ERR_DUPLICATE, "safetensors: tensor '%s' added twice", name);
    st_entry e = {.dtype = dtype, .ndim = ndim, .data = data};
    if (ndim > 0)
        memcpy(e.shape, shape, (size_t)ndim * sizeof *shape);
    if (!shape_bytes(dtype, ndim, shape, &e.nbytes))
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "safetensors: tensor '%s': bad shape", name);
    if (w->count == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        st_entry *entries = realloc(w->entries, cap * sizeof *entries);
        if (!entries)
            return hx_fail(SELDP_ERR_NOMEM, "safetensors: out of memory");
        w->entries = entries;
        w->cap = cap;
    }
    e.name = hx_strdup(name);
    if (!e.name)
        return SELDP_ERR_NOMEM;
    w->entries[w->count++] = e;
    return SELDP_OK;
}

seldp_status hx_st_add_metadata(hx_st_writer *w, const char *key, const char *value)
{
    for (size_t i = 0; i < w->meta_count; i++)
        if (strcmp(w->meta_keys[i], key) == 0)
            return hx_fail(SELDP_ERR_DUPLICATE, "safetensors: metadata '%s' set twice", key);
    if (w->meta_count == w->meta_cap) {
        size_t cap = w->meta_cap ? 2 * w->meta_cap : 4;
        char **keys = realloc(w->meta_keys, cap * sizeof *keys);
        if (!keys)
            return hx_fail(SELDP_ERR_NOMEM, "safetensors: out of memory");
        w->meta_keys = keys;
        char **values = realloc(w->meta_values, cap * sizeof *values);
        if (!values)
            return hx_fail(SELDP_ERR_NOMEM, "safetensors: out of memory");
        w->meta_values = values;
        w->meta_cap = cap;
    }
    char *k = hx_strdup(key);
    char *v = hx_strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return SELDP_ERR_NOMEM;
    }
    w->meta_keys[w->meta_count] = k;
    w->meta_values[w->meta_count++] = v;
    return SELDP_OK;
}

/* Wider elements first, then by name: every tensor starts at a multiple of its element size. */
static int entry_order(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a;
    const st_entry *y = *(const st_entry *const *)b;
    size_t sx = seldp_dtype_size(x->dtype), sy = seldp_dtype_size(y->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

seldp_status hx_st_write(const hx_st_writer *w, const char *path)
{
    seldp_status st = SELDP_OK;
    hx_buf header = {0};
    FILE *f = NULL;
    const st_entry **order = hx_calloc(w->count, sizeof *order);
    if (!order)
        return SELDP_ERR_NOMEM;
    for (size_t i = 0; i < w->count; i++)
        order[i] = &w->entries[i];
    qsort(order, w->count, sizeof *order, entry_order);

    hx_buf_puts(&header, "{");
    bool first = true;
    if (w->meta_count) {
        hx_buf_puts(&header, "\"__metadata__\":{");
        for (size_t i = 0; i < w->meta_count; i++) {
            hx_buf_puts(&header, i ? "," : "");
            hx_buf_json_string(&header, w->meta_keys[i]);
            hx_buf_puts(&header, ":");
            hx_buf_json_string(&header, w->meta_values[i]);
        }
        hx_buf_puts(&header, "}");
        first = false;
    }
    size_t offset = 0;
    for (size_t i = 0; i < w->count; i++) {
        const st_entry *e = order[i];
        hx_buf_puts(&header, first ? "" : ",");
        first = false;
        hx_buf_json_string(&header, e->name);
        hx_buf_printf(&header, ":{\"dtype\":\"%s\",\"shape\":[", st_names[e->dtype]);
        for (int d = 0; d < e->ndim; d++)
            hx_buf_printf(&header, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        hx_buf_printf(&header, "],\"data_offsets\":[%zu,%zu]}", offset, offset + e->nbytes);
        offset += e->nbytes;
    }
    hx_buf_puts(&header, "}");
    while (header.len % 8 != 0)
        hx_buf_puts(&header, " ");
    if (!hx_buf_ok(&header))
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory building the header", path);

    f = fopen(path, "wb");
    if (!f)
        HX_FAIL(SELDP_ERR_IO, "%s: cannot create", path);
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; i++)
        len_bytes[i] = (unsigned char)((uint64_t)header.len >> (8 * i));
    bool ok =
        fwrite(len_bytes, 1, 8, f) == 8 && fwrite(header.data, 1, header.len, f) == header.len;
    for (size_t i = 0; ok && i < w->count; i++)
        ok = order[i]->nbytes == 0 ||
             fwrite(order[i]->data, 1, order[i]->nbytes, f) == order[i]->nbytes;
    ok = (fclose(f) == 0) && ok;
    f = NULL;
    if (!ok)
        HX_FAIL(SELDP_ERR_IO, "%s: write failed", path);
    hx_buf_free(&header);
    free(order);
    return SELDP_OK;
fail:
    if (f)
        fclose(f);
    hx_buf_free(&header);
    free(order);
    return st;
}

/* ---- reader ------------------------------------------------------------------------------ */

struct hx_st_file {
    unsigned char *data; /* the data section, in its own (aligned) allocation */
    hx_st_tensor *tensors;
    size_t count;
    char **meta_keys;
    char **meta_values;
    size_t meta_count;
};

void hx_st_file_free(hx_st_file *file)
{
    if (!file)
        return;
    for (size_t i = 0; i < file->count; i++)
        free((char *)file->tensors[i].name);
    for (size_t i = 0; i < file->meta_count; i++) {
        free(file->meta_keys[i]);
        free(file->meta_values[i]);
    }
    free(file->tensors);
    free(file->meta_keys);
    free(file->meta_values);
    free(file->data);
    free(file);
}

static int tensor_by_name(const void *a, const void *b)
{
    return strcmp(((const hx_st_tensor *)a)->name, ((const hx_st_tensor *)b)->name);
}

typedef struct span {
    uint64_t begin;
    uint64_t end;
    size_t index;
} span;

static int span_order(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static seldp_status read_metadata(const hx_json *meta, const char *what, hx_st_file *file)
{
    if (meta->type != HX_JSON_OBJECT)
        return hx_fail(SELDP_ERR_PARSE, "%s: __metadata__ is a %s, expected an object", what,
                       hx_json_type_name(meta->type));
    file->meta_keys = hx_calloc(meta->count, sizeof(char *));
    file->meta_values = hx_calloc(meta->count, sizeof(char *));
    if (!file->meta_keys || !file->meta_values)
        return SELDP_ERR_NOMEM;
    for (size_t i = 0; i < meta->count; i++) {
        if (meta->items[i].type != HX_JSON_STRING)
            return hx_fail(SELDP_ERR_PARSE, "%s: __metadata__ \"%s\" is a %s, expected a string",
                           what, meta->keys[i], hx_json_type_name(meta->items[i].type));
        file->meta_keys[i] = hx_strdup(meta->keys[i]);
        file->meta_values[i] = hx_strdup(meta->items[i].string);
        file->meta_count++;
        if (!file->meta_keys[i] || !file->meta_values[i])
            return SELDP_ERR_NOMEM;
    }
    return SELDP_OK;
}

static seldp_status read_tensor_info(const char *name, const hx_json *info, const char *what,
                                     hx_st_tensor *t, span *sp)
{
    if (info->type != HX_JSON_OBJECT)
        return hx_fail(SELDP_ERR_PARSE, "%s: tensor '%s': expected an object, found a %s", what,
                       name, hx_json_type_name(info->type));
    for (size_t i = 0; i < info->count; i++) {
        const char *k = info->keys[i];
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0)
            return hx_fail(SELDP_ERR_PARSE, "%s: tensor '%s': unknown member \"%s\"", what, name,
                           k);
    }
    const hx_json *dtype = hx_json_get(info, "dtype");
    const hx_json *shape = hx_json_get(info, "shape");
    const hx_json *offsets = hx_json_get(info, "data_offsets");
    if (!dtype || !shape || !offsets)
        return hx_fail(SELDP_ERR_PARSE, "%s: tensor '%s': needs dtype, shape and data_offsets",
                       what, name);
    if (dtype->type != HX_JSON_STRING || !st_dtype_parse(dtype->string, &t->dtype))
        return hx_fail(SELDP_ERR_PARSE, "%s: tensor '%s': unknown dtype %s", what, name,
                       dtype->type == HX_JSON_STRING ? dtype->string : "(not a string)");
    if (shape->type != HX_JSON_ARRAY || shape->count > SELDP_MAX_DIMS)
        return hx_fail(SELDP_ERR_PARSE,
                       "%s: tensor '%s': shape must be an array of at most %d "
                       "extents",
                       what, name, SELDP_MAX_DIMS);
    t->ndim = (int)shape->count;
    for (size_t d = 0; d < shape->count; d++) {
        const hx_json *x = &shape->items[d];
        if (x->type != HX_JSON_NUMBER || !x->is_integer || x->integer < 0)
            return hx_fail(SELDP_ERR_PARSE,
                           "%s: tensor '%s': shape[%zu] is not a non-negative "
                           "integer",
                           what, name, d);
        t->shape[d] = x->integer;
    }
    if (offsets->type != HX_JSON_ARRAY || offsets->count != 2)
        return hx_fail(SELDP_ERR_PARSE, "%s: tensor '%s': data_offsets must be [begin, end]", what,
                       name);
    for (int k = 0; k < 2; k++) {
        const hx_json *x = &offsets->items[k];
        if (x->type != HX_JSON_NUMBER || !x->is_integer || x->integer < 0)
            return hx_fail(SELDP_ERR_PARSE,
                           "%s: tensor '%s': data_offsets[%d] is not a "
                           "non-negative integer",
                           what, name, k);
    }
    sp->begin = (uint64_t)offsets->items[0].integer;
    sp->end = (uint64_t)offsets->items[1].integer;
    if (!shape_bytes(t->dtype, t->ndim, t->shape, &t->nbytes))
        return hx_fail(SELDP_ERR_PARSE, "%s: tensor '%s': shape overflows", what, name);
    if (sp->end < sp->begin || sp->end - sp->begin != t->nbytes)
        return hx_fail(SELDP_ERR_PARSE,
                       "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu "
                       "bytes but its %s shape needs %zu",
                       what, name, (unsigned long long)sp->begin, (unsigned long long)sp->end,
                       (unsigned long long)(sp->end >= sp->begin ? sp->end - sp->begin : 0),
                       st_names[t->dtype], t->nbytes);
    return SELDP_OK;
}

seldp_status hx_st_parse(const void *bytes, size_t len, const char *what, hx_st_file **out)
{
    seldp_status st = SELDP_OK;
    hx_json *header = NULL;
    span *spans = NULL;
    const unsigned char *b = bytes;
    hx_st_file *file = hx_calloc(1, sizeof *file);
    if (!file)
        return SELDP_ERR_NOMEM;
    if (len < 8)
        HX_FAIL(SELDP_ERR_PARSE, "%s: %zu bytes, too short for a safetensors file", what, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | b[i];
    if (n > ST_MAX_HEADER || n > len - 8)
        HX_FAIL(SELDP_ERR_PARSE, "%s: header length %llu exceeds the file (%zu bytes) or 100 MB",
                what, (unsigned long long)n, len);
    if (n == 0 || b[8] != '{')
        HX_FAIL(SELDP_ERR_PARSE, "%s: the header does not start with '{'", what);
    char header_what[512];
    snprintf(header_what, sizeof header_what, "%s: header", what);
    /* the padding is trailing spaces, which JSON whitespace rules accept */
    HX_CHECK(hx_json_parse((const char *)b + 8, (size_t)n, header_what, &header));
    if (header->type != HX_JSON_OBJECT)
        HX_FAIL(SELDP_ERR_PARSE, "%s: the header is not a JSON object", what);

    size_t data_len = len - 8 - (size_t)n;
    file->data = malloc(data_len ? data_len : 1);
    file->tensors = hx_calloc(header->count, sizeof *file->tensors);
    spans = hx_calloc(header->count, sizeof *spans);
    if (!file->data || !file->tensors || !spans)
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", what);
    memcpy(file->data, b + 8 + n, data_len);

    for (size_t i = 0; i < header->count; i++) {
        if (strcmp(header->keys[i], "__metadata__") == 0) {
            HX_CHECK(read_metadata(&header->items[i], what, file));
            continue;
        }
        hx_st_tensor *t = &file->tensors[file->count];
        t->name = hx_strdup(header->keys[i]);
        if (!t->name)
            HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory", what);
        spans[file->count].index = file->count;
        file->count++;
        HX_CHECK(read_tensor_info(t->name, &header->items[i], what, t, &spans[file->count - 1]));
    }
    qsort(spans, file->count, sizeof *spans, span_order);
    uint64_t expected = 0;
    for (size_t i = 0; i < file->count; i++) {
        const hx_st_tensor *t = &file->tensors[spans[i].index];
        if (spans[i].begin != expected)
            HX_FAIL(SELDP_ERR_PARSE,
                    "%s: tensor '%s' starts at byte %llu of the data, expected "
                    "%llu (tensors must tile the data without gaps or overlap)",
                    what, t->name, (unsigned long long)spans[i].begin,
                    (unsigned long long)expected);
        expected = spans[i].end;
    }
    if (expected != data_len)
        HX_FAIL(SELDP_ERR_PARSE,
                "%s: the tensors cover %llu bytes of data but the file holds "
                "%zu",
                what, (unsigned long long)expected, data_len);
    for (size_t i = 0; i < file->count; i++)
        file->tensors[spans[i].index].data = file->data + spans[i].begin;
    qsort(file->tensors, file->count, sizeof *file->tensors, tensor_by_name);
    free(spans);
    hx_json_free(header);
    *out = file;
    return SELDP_OK;
fail:
    free(spans);
    hx_json_free(header);
    hx_st_file_free(file);
    return st;
}

seldp_status hx_st_read(const char *path, hx_st_file **out)
{
    char *bytes = NULL;
    size_t len = 0;
    seldp_status st = hx_read_file(path, &bytes, &len);
    if (st != SELDP_OK)
        return st;
    st = hx_st_parse(bytes, len, path, out);
    free(bytes);
    return st;
}

size_t hx_st_count(const hx_st_file *file)
{
    return file->count;
}

const hx_st_tensor *hx_st_at(const hx_st_file *file, size_t i)
{
    return i < file->count ? &file->tensors[i] : NULL;
}

const hx_st_tensor *hx_st_find(const hx_st_file *file, const char *name)
{
    hx_st_tensor key = {.name = name};
    return bsearch(&key, file->tensors, file->count, sizeof key, tensor_by_name);
}

const char *hx_st_metadata(const hx_st_file *file, const char *key)
{
    for (size_t i = 0; i < file->meta_count; i++)
        if (strcmp(file->meta_keys[i], key) == 0)
            return file->meta_values[i];
    return NULL;
}
