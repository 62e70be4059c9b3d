/* tiny-moe's activation caches (tm_internal.h): the step's caches sized for T tokens and freed,
 * and the numbered cache sets of micro-batches in flight (tm_model_use_caches). A set holds
 * what a forward keeps for its backward: the token count, the token ids, every layer's cache,
 * the tensor-parallel token counts and gathered ids, and the router losses' factor. The set in
 * use lives in the model's own fields, which every forward and backward piece reads; switching
 * swaps those fields with the stored set's (pointers only, no copy). */
#include <stdlib.h>
#include <string.h>

#include "tm_internal.h"

/* The most cache sets a model keeps (micro-batches in flight). */
#define TM_CACHE_SETS_MAX 4096

static void free_caches(tm_model *m)
{
    for (int l = 0; l < m->cfg.layers; l++) {
        tm_layer_cache *c = &m->cache[l];
        free(c->h_in);
        free(c->rstd);
        free(c->u);
        free(c->probs);
        free(c->choice);
        free(c->expert);
        free(c->gate);
        free(c->y);
        free(c->dgate);
        free(c->lse);
        free(c->s_pre);
        free(c->s_du);
        free(c->counts);
        free(c->fill);
        free(c->bal_counts);
        free(c->tp_u);
        free(c->tp_pre);
        memset(c, 0, sizeof *c);
    }
    free(m->tokens);
    m->tokens = NULL;
    m->T_capacity = 0;
}

seldp_status tm__ensure_caches(tm_model *m, size_t T)
{
    if (T <= m->T_capacity && m->tokens)
        return SELDP_OK;
    free_caches(m);
    const size_t cap = T ? T : 1;
    const size_t D = (size_t)m->cfg.d_model, E = (size_t)m->cfg.experts;
    const size_t K = (size_t)m->cfg.top_k, Fs = (size_t)m->cfg.d_ff_shared;
    m->tokens = malloc(cap * sizeof *m->tokens);
    bool ok = m->tokens != NULL;
    for (int l = 0; l < m->cfg.layers && ok; l++) {
        tm_layer_cache *c = &m->cache[l];
        c->h_in = malloc(cap * D * sizeof(float));
        c->rstd = malloc(cap * sizeof(float));
        c->u = malloc(cap * D * sizeof(float));
        c->probs = malloc(cap * E * sizeof(float));
        c->choice = malloc(cap * K * sizeof(int));
        c->expert = malloc(cap * K * sizeof(int));
        c->gate = malloc(cap * K * sizeof(float));
        c->y = malloc(cap * K * D * sizeof(float));
        c->dgate = malloc(cap * K * sizeof(float));
        c->lse = malloc(cap * sizeof(float));
        c->counts = calloc(E, sizeof *c->counts);
        c->fill = calloc(E, sizeof *c->fill);
        c->bal_counts = calloc(E, sizeof *c->bal_counts);
        ok = c->h_in && c->rstd && c->u && c->probs && c->choice && c->expert && c->gate && c->y &&
             c->dgate && c->lse && c->counts && c->fill && c->bal_counts;
        if (ok && Fs) {
            c->s_pre = malloc(cap * Fs * sizeof(float));
            c->s_du = malloc(cap * D * sizeof(float));
            ok = c->s_pre && c->s_du;
        }
    }
    if (!ok) {
        free_caches(m);
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory for activations of %zu tokens",
                        m->rank, T);
    }
    m->T_capacity = cap;
    return SELDP_OK;
}

/* The model's fields of the set in use into *s, or *s into them. */
static void store_set(const tm_model *m, tm_cache_set *s)
{
    *s = (tm_cache_set){m->T,        m->T_capacity, m->tokens,      m->cache,
                        m->embedded, m->tp_counts,  m->tp_counts_n, m->S,
                        m->S_offset, m->tp_tokens,  m->router_scale};
}

static void load_set(tm_model *m, const tm_cache_set *s)
{
    m->T = s->T;
    m->T_capacity = s->T_capacity;
    m->tokens = s->tokens;
    m->cache = s->cache;
    m->embedded = s->embedded;
    m->tp_counts = s->tp_counts;
    m->tp_counts_n = s->tp_counts_n;
    m->S = s->S;
    m->S_offset = s->S_offset;
    m->tp_tokens = s->tp_tokens;
    m->router_scale = s->router_scale;
}

/* A new, empty set: no tokens yet, the TP counts sized for the model's TP group. */
static seldp_status new_set(tm_model *m, tm_cache_set *s)
{
    int n = m->tp.size > 1 ? m->tp.size : 1;
    *s = (tm_cache_set){0};
    s->cache = calloc((size_t)m->cfg.layers, sizeof *s->cache);
    s->tp_counts = calloc((size_t)n, sizeof *s->tp_counts);
    if (!s->cache || !s->tp_counts) {
        free(s->cache);
        free(s->tp_counts);
        *s = (tm_cache_set){0};
        return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory for a cache set", m->rank);
    }
    s->tp_counts_n = n;
    s->router_scale = 1.0;
    return SELDP_OK;
}

seldp_status tm_model_use_caches(tm_model *m, int set)
{
    if (!m || set < 0 || set >= TM_CACHE_SETS_MAX)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_model_use_caches: set %d, expected 0..%d", m ? m->rank : -1,
                        set, TM_CACHE_SETS_MAX - 1);
    if (set == m->active_set)
        return SELDP_OK;
    if (set >= m->n_sets) {
        int n = set + 1 > 2 * m->n_sets ? set + 1 : 2 * m->n_sets;
        tm_cache_set *sets = realloc(m->sets, (size_t)n * sizeof *sets);
        if (!sets)
            return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory for cache sets", m->rank);
        m->sets = sets;
        for (int k = m->n_sets; k < n; k++)
            sets[k] = (tm_cache_set){0};
        m->n_sets = n;
    }
    if (!m->sets[set].cache) {
        seldp_status st = new_set(m, &m->sets[set]);
        if (st != SELDP_OK)
            return st;
    }
    store_set(m, &m->sets[m->active_set]);
    load_set(m, &m->sets[set]);
    m->sets[set] = (tm_cache_set){0}; /* its storage is the model's now */
    m->active_set = set;
    /* a set made before tm_model_set_tp changed the TP size: counts of the new size */
    int n = m->tp.size > 1 ? m->tp.size : 1;
    if (m->tp_counts_n != n) {
        size_t *counts = calloc((size_t)n, sizeof *counts);
        if (!counts)
            return tm__fail(SELDP_ERR_NOMEM, "rank %d: out of memory", m->rank);
        free(m->tp_counts);
        m->tp_counts = counts;
        m->tp_counts_n = n;
    }
    return SELDP_OK;
}

int tm_model_cache_set(const tm_model *m)
{
    return m->active_set;
}

void tm_model_release_caches(tm_model *m)
{
    if (!m)
        return;
    if (m->cache)
        free_caches(m);
    for (int k = 0; k < m->n_sets; k++) {
        if (k == m->active_set || !m->sets[k].cache)
            continue;
        tm_cache_set live;
        store_set(m, &live);
        load_set(m, &m->sets[k]);
        free_caches(m);
        store_set(m, &m->sets[k]);
        load_set(m, &live);
    }
}

/* Free the caches, the layer caches and the TP state of the set in the model's fields. */
static void free_live(tm_model *m)
{
    if (m->cache)
        free_caches(m);
    free(m->cache);
    free(m->tp_counts);
    free(m->tp_tokens);
    m->cache = NULL;
    m->tp_counts = NULL;
    m->tp_tokens = NULL;
}

void tm__free_cache_sets(tm_model *m)
{
    free_live(m);
    for (int k = 0; k < m->n_sets; k++) {
        if (k == m->active_set || !m->sets[k].cache)
            continue;
        load_set(m, &m->sets[k]);
        free_live(m);
    }
    free(m->sets);
    m->sets = NULL;
    m->n_sets = 0;
}
