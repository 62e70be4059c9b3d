/* A rank's part of the global gradient norm before the ranks agree (gradnorm_impl.h): every
 * listed session's gradients checked as its reductions check them, the sharded ranges checked
 * against the session's map, overlapping selections refused, and this rank's sum of squares
 * counted in FP64. The agreement, the decision and the scaling are gradnorm.c. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "seldp/gradnorm.h"
#include "session_impl.h"
#include "shard_impl.h"
#include "gradnorm_impl.h"

/* Check the gradient of parameter g of part i (as the reductions check theirs). */
static seldp_status check_gradient(const norm_call *c, size_t i, const session_param *g,
                                   const seldp_tensor *t)
{
    seldp_status st = SELDP_OK;
    const seldp_session *s = c->parts[i].session;
    char have[64], want[64];

    if (g->frozen)
        SELDP_FAIL(SELDP_ERR_FROZEN, "%s: part %zu: '%s' is frozen but has a gradient",
                   seldp__norm_call_name(c), i, g->path);
    if (g->slot == SESSION_NO_SLOT)
        SELDP_FAIL(SELDP_ERR_DTYPE,
                   "%s: part %zu: '%s' is an integer or bool buffer (%s) but has a gradient",
                   seldp__norm_call_name(c), i, g->path, seldp_dtype_name(g->tensor.dtype));
    if (t->dtype != g->tensor.dtype && t->dtype != SELDP_F32)
        SELDP_FAIL(SELDP_ERR_DTYPE, "%s: part %zu: '%s': gradient dtype %s, expected %s or f32",
                   seldp__norm_call_name(c), i, g->path, seldp_dtype_name(t->dtype),
                   seldp_dtype_name(g->tensor.dtype));
    if (t->ndim != g->tensor.ndim ||
        memcmp(t->shape, g->tensor.shape, (size_t)t->ndim * sizeof t->shape[0]) != 0)
        SELDP_FAIL(SELDP_ERR_SHAPE,
                   "%s: part %zu: '%s': gradient shape %s differs from the parameter's %s",
                   seldp__norm_call_name(c), i, g->path, seldp_shape_str(t, have, sizeof have),
                   seldp_shape_str(&g->tensor, want, sizeof want));
    if (!seldp__device_equal(t->device, s->device))
        SELDP_FAIL(SELDP_ERR_DEVICE, "%s: part %zu: '%s': gradient on %s, but the session is on %s",
                   seldp__norm_call_name(c), i, g->path,
                   seldp__session_device_name(t->device, have, sizeof have),
                   seldp__session_device_name(s->device, want, sizeof want));
    SELDP_CHECK(seldp__device_check_aligned(t, g->path));
fail:
    return st;
}

/* Add the squares of t's elements, in FP64 and in element order, to *acc. */
static seldp_status add_squares(const seldp_tensor *t, double *acc)
{
    seldp_status st = SELDP_OK;
    size_t n = seldp_tensor_numel(t);
    const float *x = t->data;
    float *converted = NULL;
    void *raw = NULL;

    if (t->device.kind != SELDP_DEVICE_HOST || t->dtype != SELDP_F32) {
        const void *src = t->data;
        if (!(converted = malloc(n ? n * sizeof *converted : 1)))
            SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory reading a gradient of %zu elements", n);
        if (t->device.kind != SELDP_DEVICE_HOST) {
            size_t bytes = seldp_tensor_nbytes(t);
            if (!(raw = malloc(bytes ? bytes : 1)))
                SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory reading a gradient of %zu bytes", bytes);
            SELDP_CHECK(seldp__device_copy(raw, SELDP_HOST_DEVICE, t->data, t->device, bytes));
            src = raw;
        }
        SELDP_CHECK(seldp__convert(SELDP_HOST_DEVICE, converted, SELDP_F32, src, t->dtype, n));
        x = converted;
    }
    for (size_t i = 0; i < n; i++)
        *acc += (double)x[i] * (double)x[i];
fail:
    free(raw);
    free(converted);
    return st;
}

/* Add the squares of the present pieces of range i, in FP64 and in element order. */
static seldp_status add_range_squares(const norm_call *c, size_t i, double *acc)
{
    seldp_status st = SELDP_OK;
    const seldp_norm_range *g = &c->ranges[i];
    const seldp_session *s = g->session;
    const seldp_shard_map *map = g->map;
    int me = seldp_comm_rank(s->comm);
    const float *x = g->range;
    float *copy = NULL;

    if (s->device.kind != SELDP_DEVICE_HOST && g->count) {
        if (!(copy = malloc(g->count * sizeof *copy)))
            SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory reading a range of %zu elements", g->count);
        SELDP_CHECK(seldp__device_copy(copy, SELDP_HOST_DEVICE, g->range, s->device,
                                       g->count * sizeof *copy));
        x = copy;
    }
    for (size_t p = 0; p < map->pieces[me]; p++) {
        seldp_shard_piece piece;
        if (g->present && !g->present[p])
            continue;
        SELDP_CHECK(seldp_shard_map_piece(map, me, p, &piece));
        for (size_t e = 0; e < piece.count; e++) {
            double v = x[piece.range_offset + e];
            *acc += v * v;
        }
    }
fail:
    free(copy);
    return st;
}

/* Range i's arguments alone. */
static seldp_status check_range(const norm_call *c, size_t i)
{
    const seldp_norm_range *g = &c->ranges[i];
    const char *name = seldp__norm_call_name(c);
    char what[64];

    if (!g->session)
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: range %zu has a NULL session", name, i);
    snprintf(what, sizeof what, "%s: range %zu", name, i);
    seldp_status st = seldp__shard_check(g->map, g->session, g->range, g->count, what);
    if (st != SELDP_OK)
        return st;
    for (size_t j = 0; j < c->n_parts + i; j++)
        if (seldp__norm_listed_session(c, j) == g->session)
            return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                               "%s: range %zu lists the session of %s %zu again; its gradients "
                               "would count twice",
                               name, i, j < c->n_parts ? "part" : "range",
                               j < c->n_parts ? j : j - c->n_parts);
    if (seldp_comm_size(g->session->comm) > seldp_comm_size(c->parent))
        return seldp__fail(SELDP_ERR_INVALID_ARGUMENT,
                           "%s: range %zu: the session's group has %d ranks, more than the %d of "
                           "the parent communicator",
                           name, i, seldp_comm_size(g->session->comm), seldp_comm_size(c->parent));
    return SELDP_OK;
}

/* Part i's arguments alone. */
static seldp_status check_part(const norm_call *c, size_t i)
{
    seldp_status st = SELDP_OK;
    const seldp_norm_part *p = &c->parts[i];
    const seldp_session *s = p->session;
    const char *name = seldp__norm_call_name(c);

    if (!s || !p->grads)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: part %zu has a NULL %s", name, i,
                   s ? "grads" : "session");
    if (p->kind != SELDP_NORM_REPLICATED && p->kind != SELDP_NORM_SHARDED)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "%s: part %zu: kind %d is neither SELDP_NORM_REPLICATED nor "
                   "SELDP_NORM_SHARDED",
                   name, i, (int)p->kind);
    for (size_t j = 0; j < i; j++)
        if (c->parts[j].session == s)
            SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: parts %zu and %zu list the same session; its gradients would count "
                       "twice",
                       name, j, i);
    if (seldp_comm_size(s->comm) > seldp_comm_size(c->parent))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                   "%s: part %zu: the session's group has %d ranks, more than the %d of the "
                   "parent communicator, which must hold every member of every listed group",
                   name, i, seldp_comm_size(s->comm), seldp_comm_size(c->parent));
fail:
    return st;
}

/* One selected parameter of one part, for finding a parameter two parts select. */
typedef struct selected_param {
    const seldp_model *model;
    seldp_param_id id;
    size_t part;
    const char *path;
} selected_param;

static int compare_selected(const void *a, const void *b)
{
    const selected_param *x = a, *y = b;
    if (x->model != y->model)
        return (uintptr_t)x->model < (uintptr_t)y->model ? -1 : 1;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->part < y->part ? -1 : x->part > y->part;
}

/* No parameter of a model is selected by two parts: its gradient would count (and be
 * clipped) twice. */
static seldp_status check_overlap(const norm_call *c)
{
    seldp_status st = SELDP_OK;
    size_t total = 0, n = 0;
    selected_param *all;

    for (size_t i = 0; i < c->n_parts + c->n_ranges; i++)
        total += seldp__norm_listed_session(c, i)->n_params;
    if (!(all = malloc((total ? total : 1) * sizeof *all)))
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory checking %zu selected parameters",
                           total);
    for (size_t i = 0; i < c->n_parts + c->n_ranges; i++) {
        const seldp_session *s = seldp__norm_listed_session(c, i);
        for (size_t k = 0; k < s->n_params; k++)
            all[n++] = (selected_param){s->model, s->params[k].id, i, s->params[k].path};
    }
    qsort(all, n, sizeof *all, compare_selected);
    for (size_t k = 1; k < n; k++)
        if (all[k].model == all[k - 1].model && all[k].id == all[k - 1].id) {
            size_t x = all[k - 1].part, y = all[k].part, np = c->n_parts;
            if (y < np) /* both parts */
                SELDP_FAIL(SELDP_ERR_DUPLICATE,
                           "%s: '%s' is selected by parts %zu and %zu; its gradient would count "
                           "twice",
                           seldp__norm_call_name(c), all[k - 1].path, x, y);
            SELDP_FAIL(SELDP_ERR_DUPLICATE,
                       "%s: '%s' is selected by %s %zu and range %zu; its gradient would count "
                       "twice",
                       seldp__norm_call_name(c), all[k - 1].path, x < np ? "part" : "range",
                       x < np ? x : x - np, y - np);
        }
fail:
    free(all);
    return st;
}

/* Part i's gradients: checked, what this rank counts of them added, and the room its
 * clipping will need allocated. */
static seldp_status prepare_part(norm_call *c, size_t i)
{
    seldp_status st = SELDP_OK;
    const seldp_norm_part *p = &c->parts[i];
    const seldp_session *s = p->session;
    size_t half_elems = 0;
    bool counts = p->kind == SELDP_NORM_SHARDED || seldp_comm_rank(s->comm) == 0;

    for (size_t k = 0; k < s->n_params; k++) {
        const session_param *g = &s->params[k];
        const seldp_tensor *t = seldp_grads_get(p->grads, g->id);
        if (!t)
            continue;
        SELDP_CHECK(check_gradient(c, i, g, t));
        if (counts)
            SELDP_CHECK(add_squares(t, &c->sum_squares));
        if (t->dtype != SELDP_F32 && seldp_tensor_numel(t) > half_elems)
            half_elems = seldp_tensor_numel(t);
    }
    if (c->clip && half_elems)
        SELDP_CHECK(
            seldp__device_alloc(s->device, half_elems * sizeof(float), (void **)&c->scratch[i]));
fail:
    return st;
}

seldp_status seldp__norm_prepare(norm_call *c, const seldp_grad_norm_result *out)
{
    seldp_status st = SELDP_OK;
    const char *name = seldp__norm_call_name(c);

    if (!out)
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: out must not be NULL", name);
    if (c->clip && !(isfinite(c->max_norm) && c->max_norm > 0))
        SELDP_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: max_norm %g must be finite and > 0", name,
                   c->max_norm);
    for (size_t i = 0; i < c->n_parts; i++)
        SELDP_CHECK(check_part(c, i));
    for (size_t i = 0; i < c->n_ranges; i++)
        SELDP_CHECK(check_range(c, i));
    SELDP_CHECK(check_overlap(c));
    for (size_t i = 0; i < c->n_parts; i++)
        SELDP_CHECK(prepare_part(c, i));
    for (size_t i = 0; i < c->n_ranges; i++)
        SELDP_CHECK(add_range_squares(c, i, &c->sum_squares));
fail:
    return st;
}
