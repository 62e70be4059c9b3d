/* Model view: a rank's parameter occurrences, kept sorted by path.
 *
 * Collective order is the strcmp order of full paths, so the view keeps its
 * occurrences in that order (binary search for lookups by path) and a second index
 * sorted by (id, path) for lookups by id and for tied aliases. Each occurrence is
 * its own allocation so that pointers handed out stay valid while the view grows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "internal.h"
#include "seldp/model.h"

struct seldp_model {
    int rank;
    size_t count;
    size_t capacity;
    seldp_param **by_path; /* strcmp order of path */
    seldp_param **by_id;   /* ascending id, ties in strcmp order of path */
};

static const char *rank_label(int rank, char *buf, size_t size)
{
    if (rank < 0)
        snprintf(buf, size, "rank ?");
    else
        snprintf(buf, size, "rank %d", rank);
    return buf;
}

seldp_status seldp_model_create(int rank, seldp_model **out)
{
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "model_create: out is NULL");
    seldp_model *m = calloc(1, sizeof *m);
    if (!m)
        return seldp__fail(SELDP_ERR_NOMEM, "rank %d: out of memory creating a model view", rank);
    m->rank = rank;
    *out = m;
    return SELDP_OK;
}

void seldp_model_destroy(seldp_model *model)
{
    if (!model)
        return;
    for (size_t i = 0; i < model->count; i++) {
        free((char *)model->by_path[i]->path);
        free(model->by_path[i]);
    }
    free(model->by_path);
    free(model->by_id);
    free(model);
}

/* First index in by_path whose path is >= `path`. */
static size_t path_lower_bound(const seldp_model *m, const char *path)
{
    size_t lo = 0, hi = m->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(m->by_path[mid]->path, path) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int id_path_cmp(seldp_param_id id_a, const char *path_a, const seldp_param *b)
{
    if (id_a != b->id)
        return id_a < b->id ? -1 : 1;
    return strcmp(path_a, b->path);
}

/* First index in by_id whose (id, path) is >= (id, path); path NULL means the smallest. */
static size_t id_lower_bound(const seldp_model *m, seldp_param_id id, const char *path)
{
    size_t lo = 0, hi = m->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const seldp_param *p = m->by_id[mid];
        int c = path ? id_path_cmp(id, path, p) : (p->id < id ? 1 : -1);
        if (c > 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static seldp_status grow(seldp_model *m)
{
    if (m->count < m->capacity)
        return SELDP_OK;
    size_t cap = m->capacity ? m->capacity * 2 : 16;
    seldp_param **a = realloc(m->by_path, cap * sizeof *a);
    if (!a)
        return SELDP_ERR_NOMEM;
    m->by_path = a;
    seldp_param **b = realloc(m->by_id, cap * sizeof *b);
    if (!b)
        return SELDP_ERR_NOMEM; /* by_path grew but holds the same entries: still consistent */
    m->by_id = b;
    m->capacity = cap;
    return SELDP_OK;
}

/* Why `t` cannot be a tied alias of `first`, or NULL when it can. */
static const char *alias_mismatch(const seldp_param *first, const seldp_tensor *t, bool frozen)
{
    if (first->tensor.dtype != t->dtype)
        return "dtype";
    if (!seldp_tensor_same_layout(&first->tensor, t))
        return "shape";
    if (!seldp__device_equal(first->tensor.device, t->device))
        return "device";
    if (first->tensor.data != t->data)
        return "storage (data pointer)";
    if (first->frozen != frozen)
        return "frozen flag";
    return NULL;
}

seldp_status seldp_model_add(seldp_model *model, const char *path, seldp_param_id id,
                             const seldp_tensor *tensor, bool frozen, void *tag)
{
    seldp_status st = SELDP_OK;
    seldp_param *p = NULL;
    char *copy = NULL;
    char who[32];
    if (!model)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "model_add: model is NULL");
    rank_label(model->rank, who, sizeof who);
    if (!path || !path[0])
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: model_add: empty parameter path (id %llu)", who,
                   (unsigned long long)id);
    if (!tensor)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: parameter '%s': tensor is NULL", who, path);
    {
        char what[512];
        snprintf(what, sizeof what, "%s: parameter '%s'", who, path);
        SELDP_CHECK(seldp_tensor_check(tensor, what));
    }

    size_t at = path_lower_bound(model, path);
    if (at < model->count && strcmp(model->by_path[at]->path, path) == 0)
        SELDP_FAIL(SELDP_ERR_DUPLICATE,
                   "%s: parameter '%s' is already registered (id %llu), paths must be unique", who,
                   path, (unsigned long long)model->by_path[at]->id);

    size_t first = id_lower_bound(model, id, NULL);
    if (first < model->count && model->by_id[first]->id == id) {
        const seldp_param *f = model->by_id[first];
        const char *why = alias_mismatch(f, tensor, frozen);
        if (why) {
            char a[96], b[96];
            SELDP_FAIL(SELDP_ERR_ALIAS,
                       "%s: parameter '%s' ties id %llu to '%s' but its %s differs (%s %s vs "
                       "%s %s), expected the same storage, dtype, shape, device and frozen flag",
                       who, path, (unsigned long long)id, f->path, why,
                       seldp_dtype_name(tensor->dtype), seldp_shape_str(tensor, a, sizeof a),
                       seldp_dtype_name(f->tensor.dtype), seldp_shape_str(&f->tensor, b, sizeof b));
        }
    }

    if (grow(model) != SELDP_OK)
        SELDP_FAIL(SELDP_ERR_NOMEM, "%s: out of memory registering '%s'", who, path);
    size_t len = strlen(path) + 1;
    p = calloc(1, sizeof *p);
    copy = malloc(len);
    if (!p || !copy)
        SELDP_FAIL(SELDP_ERR_NOMEM, "%s: out of memory registering '%s'", who, path);
    memcpy(copy, path, len);
    p->path = copy;
    p->id = id;
    p->tensor = *tensor;
    p->frozen = frozen;
    p->tag = tag;

    /* Nothing can fail from here on. */
    size_t at_id = id_lower_bound(model, id, path);
    memmove(model->by_path + at + 1, model->by_path + at,
            (model->count - at) * sizeof *model->by_path);
    model->by_path[at] = p;
    memmove(model->by_id + at_id + 1, model->by_id + at_id,
            (model->count - at_id) * sizeof *model->by_id);
    model->by_id[at_id] = p;
    model->count++;
    return SELDP_OK;

fail:
    free(copy);
    free(p);
    return st;
}

int seldp_model_rank(const seldp_model *model)
{
    return model ? model->rank : -1;
}

size_t seldp_model_count(const seldp_model *model)
{
    return model ? model->count : 0;
}

const seldp_param *seldp_model_at(const seldp_model *model, size_t i)
{
    if (!model || i >= model->count)
        return NULL;
    return model->by_path[i];
}

const seldp_param *seldp_model_find_path(const seldp_model *model, const char *path)
{
    if (!model || !path)
        return NULL;
    size_t at = path_lower_bound(model, path);
    if (at < model->count && strcmp(model->by_path[at]->path, path) == 0)
        return model->by_path[at];
    return NULL;
}

const seldp_param *seldp_model_find_id(const seldp_model *model, seldp_param_id id)
{
    if (!model)
        return NULL;
    size_t at = id_lower_bound(model, id, NULL);
    if (at < model->count && model->by_id[at]->id == id)
        return model->by_id[at];
    return NULL;
}

size_t seldp_model_aliases(const seldp_model *model, seldp_param_id id, const seldp_param **out,
                           size_t max)
{
    if (!model)
        return 0;
    size_t at = id_lower_bound(model, id, NULL);
    size_t n = 0;
    while (at + n < model->count && model->by_id[at + n]->id == id) {
        if (out && n < max)
            out[n] = model->by_id[at + n];
        n++;
    }
    return n;
}
