/* Gradient container: entries kept sorted by ParamId in one array.
 *
 * Partition and merge move entries (with their ownership) between containers;
 * they allocate everything they need before moving anything, so a failure leaves
 * every container as it was. */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "seldp/grads.h"

typedef struct grad_entry {
    seldp_param_id id;
    seldp_tensor tensor;
    seldp_ownership ownership;
} grad_entry;

struct seldp_grads {
    grad_entry *entries; /* ascending id */
    size_t count;
    size_t capacity;
};

seldp_status seldp_grads_create(seldp_grads **out)
{
    if (!out)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "grads_create: out is NULL");
    seldp_grads *g = calloc(1, sizeof *g);
    if (!g)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory creating a gradient container");
    *out = g;
    return SELDP_OK;
}

static void entry_release(grad_entry *e)
{
    if (e->ownership == SELDP_OWNED)
        seldp_tensor_free(&e->tensor);
}

void seldp_grads_destroy(seldp_grads *grads)
{
    if (!grads)
        return;
    for (size_t i = 0; i < grads->count; i++)
        entry_release(&grads->entries[i]);
    free(grads->entries);
    free(grads);
}

/* First index whose id is >= `id`. */
static size_t lower_bound(const seldp_grads *g, seldp_param_id id)
{
    size_t lo = 0, hi = g->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->entries[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static grad_entry *find(const seldp_grads *g, seldp_param_id id)
{
    size_t at = lower_bound(g, id);
    return at < g->count && g->entries[at].id == id ? &g->entries[at] : NULL;
}

seldp_status seldp_grads_reserve(seldp_grads *grads, size_t n)
{
    if (!grads)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "grads_reserve: container is NULL");
    if (n <= grads->capacity - grads->count)
        return SELDP_OK;
    if (n > SIZE_MAX / sizeof(grad_entry) - grads->count)
        return seldp__fail(SELDP_ERR_NOMEM, "grads_reserve: %zu more entries overflow", n);
    grad_entry *e = realloc(grads->entries, (grads->count + n) * sizeof *e);
    if (!e)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory reserving %zu more gradients", n);
    grads->entries = e;
    grads->capacity = grads->count + n;
    return SELDP_OK;
}

seldp_status seldp_grads_put(seldp_grads *grads, seldp_param_id id, const seldp_tensor *tensor,
                             seldp_ownership ownership)
{
    if (!grads)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "grads_put: container is NULL");
    if (ownership != SELDP_BORROWED && ownership != SELDP_OWNED)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "gradient of id %llu: invalid ownership %d",
                           (unsigned long long)id, (int)ownership);
    char what[64];
    snprintf(what, sizeof what, "gradient of id %llu", (unsigned long long)id);
    seldp_status st = seldp_tensor_check(tensor, what);
    if (st != SELDP_OK)
        return st;
    size_t at = lower_bound(grads, id);
    if (at < grads->count && grads->entries[at].id == id)
        return seldp__fail(SELDP_ERR_DUPLICATE,
                           "gradient of id %llu is already in the container, expected one per id",
                           (unsigned long long)id);
    if (grads->count == grads->capacity) {
        size_t cap = grads->capacity ? grads->capacity * 2 : 16;
        grad_entry *e = realloc(grads->entries, cap * sizeof *e);
        if (!e)
            return seldp__fail(SELDP_ERR_NOMEM, "out of memory adding the gradient of id %llu",
                               (unsigned long long)id);
        grads->entries = e;
        grads->capacity = cap;
    }
    memmove(grads->entries + at + 1, grads->entries + at,
            (grads->count - at) * sizeof *grads->entries);
    grads->entries[at] = (grad_entry){id, *tensor, ownership};
    grads->count++;
    return SELDP_OK;
}

const seldp_tensor *seldp_grads_get(const seldp_grads *grads, seldp_param_id id)
{
    if (!grads)
        return NULL;
    grad_entry *e = find(grads, id);
    return e ? &e->tensor : NULL;
}

seldp_ownership seldp_grads_ownership(const seldp_grads *grads, seldp_param_id id)
{
    if (!grads)
        return SELDP_BORROWED;
    grad_entry *e = find(grads, id);
    return e ? e->ownership : SELDP_BORROWED;
}

bool seldp_grads_take(seldp_grads *grads, seldp_param_id id, seldp_tensor *tensor,
                      seldp_ownership *ownership)
{
    if (!grads)
        return false;
    size_t at = lower_bound(grads, id);
    if (at >= grads->count || grads->entries[at].id != id)
        return false;
    if (tensor)
        *tensor = grads->entries[at].tensor;
    if (ownership)
        *ownership = grads->entries[at].ownership;
    memmove(grads->entries + at, grads->entries + at + 1,
            (grads->count - at - 1) * sizeof *grads->entries);
    grads->count--;
    return true;
}

bool seldp_grads_remove(seldp_grads *grads, seldp_param_id id)
{
    seldp_tensor t;
    seldp_ownership own;
    if (!seldp_grads_take(grads, id, &t, &own))
        return false;
    if (own == SELDP_OWNED)
        seldp_tensor_free(&t);
    return true;
}

size_t seldp_grads_count(const seldp_grads *grads)
{
    return grads ? grads->count : 0;
}

bool seldp_grads_at(const seldp_grads *grads, size_t i, seldp_param_id *id,
                    const seldp_tensor **tensor)
{
    if (!grads || i >= grads->count)
        return false;
    if (id)
        *id = grads->entries[i].id;
    if (tensor)
        *tensor = &grads->entries[i].tensor;
    return true;
}

static int id_cmp(const void *a, const void *b)
{
    seldp_param_id x = *(const seldp_param_id *)a, y = *(const seldp_param_id *)b;
    return (x > y) - (x < y);
}

static bool sorted_contains(const seldp_param_id *ids, size_t n, seldp_param_id id)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && ids[lo] == id;
}

/* A container with room for `n` entries. */
static seldp_grads *grads_with_capacity(size_t n)
{
    seldp_grads *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    if (n) {
        g->entries = malloc(n * sizeof *g->entries);
        if (!g->entries) {
            free(g);
            return NULL;
        }
        g->capacity = n;
    }
    return g;
}

seldp_status seldp_grads_partition(seldp_grads *grads, const seldp_param_id *ids, size_t n_ids,
                                   seldp_grads **selected, seldp_grads **untouched)
{
    seldp_status st = SELDP_OK;
    seldp_param_id *sorted = NULL;
    seldp_grads *sel = NULL, *rest = NULL;
    if (!grads || !selected || !untouched || (n_ids && !ids))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "grads_partition: NULL argument");
    if (n_ids) {
        sorted = malloc(n_ids * sizeof *sorted);
        if (!sorted)
            SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory partitioning %zu gradients", grads->count);
        memcpy(sorted, ids, n_ids * sizeof *sorted);
        qsort(sorted, n_ids, sizeof *sorted, id_cmp);
    }
    size_t n_sel = 0;
    for (size_t i = 0; i < grads->count; i++)
        n_sel += sorted_contains(sorted, n_ids, grads->entries[i].id);
    sel = grads_with_capacity(n_sel);
    rest = grads_with_capacity(grads->count - n_sel);
    if (!sel || !rest)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory partitioning %zu gradients", grads->count);

    /* Entries arrive in ascending id order, so both outputs stay sorted. */
    for (size_t i = 0; i < grads->count; i++) {
        seldp_grads *to = sorted_contains(sorted, n_ids, grads->entries[i].id) ? sel : rest;
        to->entries[to->count++] = grads->entries[i];
    }
    grads->count = 0;
    free(sorted);
    *selected = sel;
    *untouched = rest;
    return SELDP_OK;

fail:
    free(sorted);
    seldp_grads_destroy(sel);
    seldp_grads_destroy(rest);
    return st;
}

seldp_status seldp_grads_merge(seldp_grads *into, seldp_grads *from)
{
    if (!into || !from)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "grads_merge: NULL container");
    if (into == from)
        return from->count ? seldp__fail(SELDP_ERR_DUPLICATE,
                                         "grads_merge: a container cannot merge into itself "
                                         "(every id would be duplicated)")
                           : SELDP_OK;
    if (from->count == 0)
        return SELDP_OK;
    for (size_t i = 0, j = 0; i < into->count && j < from->count;) {
        seldp_param_id a = into->entries[i].id, b = from->entries[j].id;
        if (a == b)
            return seldp__fail(SELDP_ERR_DUPLICATE,
                               "grads_merge: gradient of id %llu is in both containers, expected "
                               "disjoint ids",
                               (unsigned long long)a);
        if (a < b)
            i++;
        else
            j++;
    }
    size_t n = into->count + from->count;
    grad_entry *merged = malloc(n * sizeof *merged);
    if (!merged)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory merging %zu gradients", n);
    size_t i = 0, j = 0, k = 0;
    while (i < into->count || j < from->count) {
        if (j >= from->count || (i < into->count && into->entries[i].id < from->entries[j].id))
            merged[k++] = into->entries[i++];
        else
            merged[k++] = from->entries[j++];
    }
    free(into->entries);
    into->entries = merged;
    into->count = into->capacity = n;
    from->count = 0;
    return SELDP_OK;
}
