/* The reductions' inputs in FP64 (capture.h). */
#include "capture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

seldp_status hx_capture_create(hx_run *run)
{
    run->capture = hx_calloc((size_t)(run->sets.n ? run->sets.n : 1), sizeof *run->capture);
    if (!run->capture)
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < run->sets.n; i++)
        pthread_mutex_init(&run->capture[i].lock, NULL);
    return SELDP_OK;
}

static void entry_free(hx_capture_entry *e)
{
    free(e->in_sum);
    free(e->in_abs);
    free(e->local_sum);
    free(e->lo);
}

void hx_capture_destroy(hx_run *run)
{
    if (!run->capture)
        return;
    for (int i = 0; i < run->sets.n; i++) {
        hx_capture *c = &run->capture[i];
        for (int k = 0; k < c->n; k++)
            entry_free(&c->entries[k]);
        free(c->entries);
        pthread_mutex_destroy(&c->lock);
    }
    free(run->capture);
    run->capture = NULL;
}

void hx_capture_reset(hx_run *run)
{
    for (int i = 0; run->capture && i < run->sets.n; i++) {
        hx_capture *c = &run->capture[i];
        for (int k = 0; k < c->n; k++) {
            hx_capture_entry *e = &c->entries[k];
            memset(e->in_sum, 0, e->n * sizeof *e->in_sum);
            memset(e->in_abs, 0, e->n * sizeof *e->in_abs);
            memset(e->local_sum, 0, e->n * sizeof *e->local_sum);
            memset(e->lo, 0, 3 * e->n * sizeof *e->lo);
            e->inputs = 0;
            e->bound = 0;
        }
    }
}

/* The entry of `path` in c, made (zeroed) if new; NULL when out of memory. Under c->lock. */
static hx_capture_entry *entry_of(hx_capture *c, const char *path, size_t n)
{
    for (int k = 0; k < c->n; k++)
        if (strcmp(c->entries[k].path, path) == 0)
            return &c->entries[k];
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        hx_capture_entry *grown = realloc(c->entries, (size_t)cap * sizeof *grown);
        if (!grown)
            return NULL;
        c->entries = grown;
        c->cap = cap;
    }
    hx_capture_entry *e = &c->entries[c->n];
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    e->n = n;
    e->in_sum = hx_calloc(n ? n : 1, sizeof *e->in_sum);
    e->in_abs = hx_calloc(n ? n : 1, sizeof *e->in_abs);
    e->local_sum = hx_calloc(n ? n : 1, sizeof *e->local_sum);
    e->lo = hx_calloc(3 * (n ? n : 1), sizeof *e->lo);
    if (!e->in_sum || !e->in_abs || !e->local_sum || !e->lo) {
        entry_free(e);
        return NULL;
    }
    c->n++;
    return e;
}

/* Element i of a host float tensor as a double. */
static double element(const seldp_tensor *t, size_t i)
{
    switch (t->dtype) {
    case SELDP_F32:
        return ((const float *)t->data)[i];
    case SELDP_F16:
        return seldp_f16_to_f32(((const uint16_t *)t->data)[i]);
    case SELDP_BF16:
        return seldp_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default:
        return NAN;
    }
}

/* sum += v with the rounding error kept in *lo (Knuth's two-sum): sum + lo is the exact sum
 * to about 2^-106 of its terms, so the settled result is the same whatever the order. */
static inline void add_exactly(double *sum, double *lo, double v)
{
    double s = *sum + v, b = s - *sum;
    *lo += (*sum - (s - b)) + (v - b);
    *sum = s;
}

void hx_capture_settle(hx_capture_entry *e)
{
    double *sums[3] = {e->in_sum, e->in_abs, e->local_sum};
    for (int a = 0; a < 3; a++) {
        double *lo = e->lo + (size_t)a * e->n;
        for (size_t i = 0; i < e->n; i++) {
            sums[a][i] += lo[i];
            lo[i] = 0.0;
        }
    }
}

seldp_status hx_capture_add(hx_run *run, const hx_set *s, const char *path,
                            const seldp_tensor *input, const float *local)
{
    hx_capture *c = &run->capture[s->index];
    size_t n = seldp_tensor_numel(input);
    seldp_status st = SELDP_OK;
    pthread_mutex_lock(&c->lock);
    hx_capture_entry *e = entry_of(c, path, n);
    if (!e) {
        st = hx_fail(SELDP_ERR_NOMEM, "out of memory capturing the inputs of %s", s->label);
    } else if (e->n != n) {
        st = hx_fail(SELDP_ERR_INTERNAL, "%s: members passed %s with %zu and %zu elements",
                     s->label, path, e->n, n);
    } else {
        e->inputs++;
        double *lo_in = e->lo, *lo_abs = e->lo + n, *lo_local = e->lo + 2 * n;
        for (size_t i = 0; i < n; i++) {
            double v = element(input, i);
            add_exactly(&e->in_sum[i], &lo_in[i], v);
            add_exactly(&e->in_abs[i], &lo_abs[i], fabs(v));
            if (local)
                add_exactly(&e->local_sum[i], &lo_local[i], local[i]);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

seldp_status hx_capture_merge(hx_run *run, const hx_set *s, const hx_capture_entry *from)
{
    hx_capture *c = &run->capture[s->index];
    seldp_status st = SELDP_OK;
    pthread_mutex_lock(&c->lock);
    hx_capture_entry *e = entry_of(c, from->path, from->n);
    if (!e || e->n != from->n) {
        st = hx_fail(SELDP_ERR_INTERNAL, "%s: merging the inputs of %s", s->label, from->path);
    } else {
        e->inputs += from->inputs;
        double *lo_in = e->lo, *lo_abs = e->lo + e->n, *lo_local = e->lo + 2 * e->n;
        for (size_t i = 0; i < e->n; i++) {
            add_exactly(&e->in_sum[i], &lo_in[i], from->in_sum[i]);
            add_exactly(&e->in_abs[i], &lo_abs[i], from->in_abs[i]);
            add_exactly(&e->local_sum[i], &lo_local[i], from->local_sum[i]);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

hx_capture_entry *hx_capture_find(const hx_run *run, const hx_set *s, const char *path)
{
    const hx_capture *c = &run->capture[s->index];
    for (int k = 0; k < c->n; k++) {
        if (strcmp(c->entries[k].path, path) == 0 && c->entries[k].inputs > 0) {
            hx_capture_settle(&c->entries[k]);
            return &c->entries[k];
        }
    }
    return NULL;
}
