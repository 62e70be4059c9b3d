/* Helpers shared by the contract tests (see contract.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"

void ct_fill(seldp_dtype dtype, void *data, size_t n, uint64_t seed)
{
    if (seldp_dtype_is_float(dtype)) {
        float *tmp = malloc((n ? n : 1) * sizeof *tmp);
        if (!tmp)
            return;
        tr_fill_f32(tmp, n, seed);
        for (size_t i = 0; i < n; i++)
            ct_set(dtype, data, i, tmp[i]);
        free(tmp);
        return;
    }
    tr_fill_bytes(data, n * seldp_dtype_size(dtype), seed);
    if (dtype == SELDP_BOOL)
        for (size_t i = 0; i < n; i++)
            ((unsigned char *)data)[i] &= 1u;
}

double ct_get(seldp_dtype dtype, const void *data, size_t i)
{
    switch (dtype) {
    case SELDP_F32:
        return ((const float *)data)[i];
    case SELDP_F64:
        return ((const double *)data)[i];
    case SELDP_F16:
        return seldp_f16_to_f32(((const uint16_t *)data)[i]);
    case SELDP_BF16:
        return seldp_bf16_to_f32(((const uint16_t *)data)[i]);
    default:
        return 0.0;
    }
}

void ct_set(seldp_dtype dtype, void *data, size_t i, double value)
{
    switch (dtype) {
    case SELDP_F32:
        ((float *)data)[i] = (float)value;
        break;
    case SELDP_F64:
        ((double *)data)[i] = value;
        break;
    case SELDP_F16:
        ((uint16_t *)data)[i] = seldp_f32_to_f16((float)value);
        break;
    case SELDP_BF16:
        ((uint16_t *)data)[i] = seldp_f32_to_bf16((float)value);
        break;
    default:
        break;
    }
}

seldp_status ct_init(test_model *m, int rank)
{
    memset(m, 0, sizeof *m);
    return seldp_model_create(rank, &m->model);
}

seldp_status ct_add(test_model *m, const char *path, seldp_param_id id, seldp_dtype dtype,
                    bool frozen, uint64_t seed, int ndim, const int64_t *shape)
{
    return ct_add_on(m, SELDP_HOST_DEVICE, path, id, dtype, frozen, seed, ndim, shape);
}

seldp_status ct_add_on(test_model *m, seldp_device device, const char *path, seldp_param_id id,
                       seldp_dtype dtype, bool frozen, uint64_t seed, int ndim,
                       const int64_t *shape)
{
    ct_param *p = &m->p[m->n];
    seldp_status st;
    if (m->n == CT_MAX)
        return SELDP_ERR_NOMEM;
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s", path);
    p->id = id;
    p->frozen = frozen;
    p->tensor = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, NULL, ndim, shape);
    p->tensor.data = calloc(1, seldp_tensor_nbytes(&p->tensor) + 1);
    if (!p->tensor.data)
        return SELDP_ERR_NOMEM;
    p->owns = true;
    ct_fill(dtype, p->tensor.data, seldp_tensor_numel(&p->tensor), seed);
    p->tensor.device = device;
    st = seldp_model_add(m->model, path, id, &p->tensor, frozen, NULL);
    if (st != SELDP_OK) {
        free(p->tensor.data);
        return st;
    }
    m->n++;
    return SELDP_OK;
}

seldp_status ct_tie(test_model *m, const char *path, const char *existing)
{
    ct_param *e = ct_find(m, existing), *p = &m->p[m->n];
    seldp_status st;
    if (!e || m->n == CT_MAX)
        return SELDP_ERR_NOT_FOUND;
    *p = *e;
    p->owns = false;
    p->snapshot = NULL;
    snprintf(p->path, sizeof p->path, "%s", path);
    st = seldp_model_add(m->model, path, e->id, &e->tensor, e->frozen, NULL);
    if (st != SELDP_OK)
        return st;
    m->n++;
    return SELDP_OK;
}

ct_param *ct_find(test_model *m, const char *path)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->p[i].path, path) == 0)
            return &m->p[i];
    return NULL;
}

void ct_snapshot(test_model *m)
{
    for (size_t i = 0; i < m->n; i++) {
        size_t bytes = seldp_tensor_nbytes(&m->p[i].tensor);
        free(m->p[i].snapshot);
        m->p[i].snapshot = malloc(bytes + 1);
        if (m->p[i].snapshot)
            memcpy(m->p[i].snapshot, m->p[i].tensor.data, bytes);
    }
}

bool ct_unchanged(const test_model *m, char *why, size_t size)
{
    for (size_t i = 0; i < m->n; i++) {
        const ct_param *p = &m->p[i];
        size_t bytes = seldp_tensor_nbytes(&p->tensor), at;
        if (!p->snapshot) {
            snprintf(why, size, "'%s' has no snapshot", p->path);
            return false;
        }
        at = tr_first_diff(p->snapshot, p->tensor.data, bytes);
        if (at < bytes) {
            snprintf(why, size, "'%s' changed at byte %zu of %zu", p->path, at, bytes);
            return false;
        }
    }
    return true;
}

void ct_free(test_model *m)
{
    seldp_model_destroy(m->model);
    for (size_t i = 0; i < m->n; i++) {
        if (m->p[i].owns)
            free(m->p[i].tensor.data);
        free(m->p[i].snapshot);
    }
    memset(m, 0, sizeof *m);
}

seldp_status tg_init(test_grads *g)
{
    memset(g, 0, sizeof *g);
    return seldp_grads_create(&g->grads);
}

seldp_status tg_put(test_grads *g, seldp_param_id id, seldp_dtype dtype, bool owned, uint64_t seed,
                    int ndim, const int64_t *shape, void **data)
{
    seldp_tensor t = seldp_tensor_view(dtype, SELDP_HOST_DEVICE, NULL, ndim, shape);
    seldp_status st;
    if (g->n == CT_MAX)
        return SELDP_ERR_NOMEM;
    if (owned) {
        if ((st = seldp_tensor_alloc(&t)) != SELDP_OK)
            return st;
    } else {
        t.data = calloc(1, seldp_tensor_nbytes(&t) + 1);
        if (!t.data)
            return SELDP_ERR_NOMEM;
    }
    ct_fill(dtype, t.data, seldp_tensor_numel(&t), seed);
    st = seldp_grads_put(g->grads, id, &t, owned ? SELDP_OWNED : SELDP_BORROWED);
    if (st != SELDP_OK) {
        if (owned)
            seldp_tensor_free(&t);
        else
            free(t.data);
        return st;
    }
    if (!owned)
        g->storage[g->n++] = t.data;
    if (data)
        *data = t.data;
    return SELDP_OK;
}

void tg_free(test_grads *g)
{
    seldp_grads_destroy(g->grads);
    for (size_t i = 0; i < g->n; i++)
        free(g->storage[i]);
    memset(g, 0, sizeof *g);
}

bool same_everywhere(seldp_comm *comm, const void *data, size_t bytes)
{
    int n = seldp_comm_size(comm);
    size_t lengths[MAX_RANKS], offset = 0;
    char *all = NULL;
    bool same = true;
    if (n > MAX_RANKS ||
        seldp_comm_allgatherv(comm, data, bytes, (void **)&all, lengths) != SELDP_OK)
        return false;
    for (int r = 0; r < n; r++) {
        if (lengths[r] != bytes || memcmp(all + offset, data, bytes) != 0)
            same = false;
        offset += lengths[r];
    }
    free(all);
    return same;
}

void outcome_record(outcome *o, int rank, seldp_status st)
{
    o->st[rank] = st;
    snprintf(o->msg[rank], sizeof o->msg[rank], "%s", seldp_last_error());
}

void expect_same_failure(const outcome *o, int n, seldp_status expected, const char *needle1,
                         const char *needle2)
{
    if (getenv("SELDP_TEST_VERBOSE"))
        printf("    %d ranks, %s: %s\n", n, seldp_status_name(o->st[0]), o->msg[0]);
    for (int r = 0; r < n; r++) {
        if (o->st[r] != expected)
            fail_msg("rank %d of %d returned %s, expected %s (message: %s)", r, n,
                     seldp_status_name(o->st[r]), seldp_status_name(expected), o->msg[r]);
        if (strcmp(o->msg[r], o->msg[0]) != 0)
            fail_msg("rank %d's message differs from rank 0's:\n  %s\n  %s", r, o->msg[r],
                     o->msg[0]);
        if (needle1 && !strstr(o->msg[r], needle1))
            fail_msg("rank %d's message lacks \"%s\": %s", r, needle1, o->msg[r]);
        if (needle2 && !strstr(o->msg[r], needle2))
            fail_msg("rank %d's message lacks \"%s\": %s", r, needle2, o->msg[r]);
        if (!o->unchanged[r])
            fail_msg("rank %d's inputs changed: %s", r, o->why[r]);
    }
}

uint64_t stats_moves(seldp_comm_stats s)
{
    return s.allreduces + s.reductions;
}

void gs_take(grads_snapshot *s, const seldp_grads *grads)
{
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < seldp_grads_count(grads) && s->n < CT_MAX; i++) {
        const seldp_tensor *t;
        size_t bytes;
        seldp_grads_at(grads, i, &s->id[s->n], &t);
        s->t[s->n] = *t;
        s->own[s->n] = seldp_grads_ownership(grads, s->id[s->n]);
        bytes = seldp_tensor_nbytes(t);
        s->bytes[s->n] = malloc(bytes + 1);
        if (s->bytes[s->n] && bytes > 0)
            memcpy(s->bytes[s->n], t->data, bytes);
        s->n++;
    }
}

static bool entry_same(const grads_snapshot *s, size_t i, const seldp_grads *grads, char *why,
                       size_t size)
{
    const seldp_tensor *t = seldp_grads_get(grads, s->id[i]);
    if (!t) {
        snprintf(why, size, "gradient of id %llu is gone", (unsigned long long)s->id[i]);
        return false;
    }
    if (memcmp(t, &s->t[i], sizeof *t) != 0) {
        snprintf(why, size, "descriptor of id %llu changed", (unsigned long long)s->id[i]);
        return false;
    }
    if (seldp_grads_ownership(grads, s->id[i]) != s->own[i]) {
        snprintf(why, size, "ownership of id %llu changed", (unsigned long long)s->id[i]);
        return false;
    }
    if (!s->bytes[i] || memcmp(s->bytes[i], t->data, seldp_tensor_nbytes(t)) != 0) {
        snprintf(why, size, "values of id %llu changed", (unsigned long long)s->id[i]);
        return false;
    }
    return true;
}

bool gs_same(const grads_snapshot *s, const seldp_grads *grads, char *why, size_t size)
{
    if (seldp_grads_count(grads) != s->n) {
        snprintf(why, size, "%zu gradients, expected %zu", seldp_grads_count(grads), s->n);
        return false;
    }
    for (size_t i = 0; i < s->n; i++)
        if (!entry_same(s, i, grads, why, size))
            return false;
    return true;
}

bool gs_entry_same(const grads_snapshot *s, const seldp_grads *grads, seldp_param_id id)
{
    char why[128];
    for (size_t i = 0; i < s->n; i++)
        if (s->id[i] == id)
            return entry_same(s, i, grads, why, sizeof why);
    return false;
}

void gs_free(grads_snapshot *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->bytes[i]);
    memset(s, 0, sizeof *s);
}

/* Distance between adjacent representable values of `dtype` near |x|. */
static double ulp_of(seldp_dtype dtype, double x)
{
    int e = 0;
    int mantissa = dtype == SELDP_F16 ? 10 : dtype == SELDP_BF16 ? 7 : 23;
    int min_exp = dtype == SELDP_F16 ? -14 : -126;
    frexp(fabs(x), &e);
    e -= 1; /* x = m * 2^e with 1 <= m < 2 */
    if (x == 0.0 || e < min_exp)
        e = min_exp;
    return ldexp(1.0, e - mantissa);
}

bool close_to(seldp_dtype dtype, const void *data, const double *ref, size_t n, double tol_rel,
              char *why, size_t size)
{
    for (size_t i = 0; i < n; i++) {
        double got = ct_get(dtype, data, i), err = fabs(got - ref[i]);
        double tol = tol_rel * fmax(fabs(ref[i]), 1.0);
        if (seldp_dtype_is_half(dtype))
            tol += 0.5 * ulp_of(dtype, ref[i]);
        if (!(err <= tol)) {
            snprintf(why, size, "element %zu of %zu: %.9g, expected %.9g (error %.3g > %.3g)", i, n,
                     got, ref[i], err, tol);
            return false;
        }
    }
    return true;
}

/* --- the standard layout --------------------------------------------------- */

const std_spec STD[STD_N] = {
    {"embed.weight", SELDP_F32, 2, {8, 4}, false},
    {"final_norm.weight", SELDP_F32, 1, {4, 0}, false},
    {"frozen.scale", SELDP_F32, 1, {3, 0}, true},
    {"layers.0.norm.weight", SELDP_BF16, 1, {4, 0}, false},
    {"layers.0.router.weight", SELDP_F16, 2, {2, 4}, false},
};

seldp_param_id std_id(int rank, size_t k)
{
    return 1 + (k + (size_t)rank) % STD_N;
}

uint64_t std_seed(int rank, size_t k)
{
    return 1000u * (uint64_t)(rank + 1) + k;
}

seldp_status std_model(test_model *m, int rank)
{
    static const seldp_dtype expert_dtypes[4] = {SELDP_F32, SELDP_BF16, SELDP_U8, SELDP_I32};
    char path[64];
    seldp_status st;
    for (size_t i = 0; i < STD_N; i++) {
        size_t k = rank % 2 ? STD_N - 1 - i : i;
        st = ct_add(m, STD[k].path, std_id(rank, k), STD[k].dtype, STD[k].frozen, std_seed(rank, k),
                    STD[k].ndim, STD[k].shape);
        if (st != SELDP_OK)
            return st;
    }
    if ((st = ct_tie(m, "lm_head.weight", "embed.weight")) != SELDP_OK)
        return st;
    snprintf(path, sizeof path, "layers.0.experts.%d.w1.weight", rank);
    st = ct_add(m, path, 200 + (seldp_param_id)rank, expert_dtypes[rank % 4], false,
                77 + (uint64_t)rank, 2, SHAPE(rank + 1, 3));
    if (st == SELDP_OK && rank % 2)
        st = ct_add(m, "aux.table", 300, SELDP_F64, false, 99, 1, SHAPE(5));
    if (st == SELDP_OK)
        st = ct_add(m, "layers.0.norm.bias", 400 + (seldp_param_id)rank, SELDP_F32, false,
                    500 + (uint64_t)rank, 1, SHAPE(4));
    return st;
}

void std_selection(int rank, seldp_param_id *ids)
{
    for (size_t i = 0; i < STD_N; i++)
        ids[i] = std_id(rank, rank % 3 ? i : STD_N - 1 - i);
}

bool std_holds_root(test_model *m, size_t k, int root, char *why, size_t size)
{
    ct_param *p = ct_find(m, STD[k].path);
    size_t bytes, at;
    unsigned char *want;
    if (!p) {
        snprintf(why, size, "'%s' is not registered", STD[k].path);
        return false;
    }
    bytes = seldp_tensor_nbytes(&p->tensor);
    want = calloc(1, bytes + 1);
    if (!want) {
        snprintf(why, size, "out of memory");
        return false;
    }
    ct_fill(p->tensor.dtype, want, seldp_tensor_numel(&p->tensor), std_seed(root, k));
    at = tr_first_diff(want, p->tensor.data, bytes);
    free(want);
    if (at < bytes) {
        snprintf(why, size, "'%s' differs from root %d's values at byte %zu", STD[k].path, root,
                 at);
        return false;
    }
    return true;
}

size_t std_numel(size_t k)
{
    size_t n = 1;
    for (int d = 0; d < STD[k].ndim; d++)
        n *= (size_t)STD[k].shape[d];
    return n;
}

uint64_t std_grad_seed(int rank, size_t k)
{
    return 50000u + 100u * (uint64_t)rank + k;
}

seldp_status std_put_grad(test_grads *g, int rank, size_t k, seldp_dtype dtype, bool owned,
                          void **data)
{
    return tg_put(g, std_id(rank, k), dtype, owned, std_grad_seed(rank, k), STD[k].ndim,
                  STD[k].shape, data);
}

void std_reference(size_t k, seldp_dtype dtype, int n, const bool *include, double divisor,
                   double *ref)
{
    size_t numel = std_numel(k);
    void *tmp = malloc(numel * 8 + 8);
    for (size_t i = 0; i < numel; i++)
        ref[i] = 0.0;
    if (!tmp)
        return;
    for (int r = 0; r < n; r++) {
        if (!include[r])
            continue;
        ct_fill(dtype, tmp, numel, std_grad_seed(r, k));
        for (size_t i = 0; i < numel; i++)
            ref[i] += ct_get(dtype, tmp, i);
    }
    for (size_t i = 0; i < numel; i++)
        ref[i] /= divisor;
    free(tmp);
}

seldp_status std_session(seldp_comm *comm, test_model *m, const seldp_session_config *cfg,
                         seldp_session **s)
{
    seldp_param_id ids[STD_N];
    int rank = seldp_comm_rank(comm);
    seldp_status st = ct_init(m, rank);
    if (st == SELDP_OK)
        st = std_model(m, rank);
    if (st != SELDP_OK)
        return st;
    std_selection(rank, ids);
    return seldp_session_initialize(comm, m->model, 0, ids, STD_N, cfg, s);
}
