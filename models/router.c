/* tiny-moe's routing extensions on the CPU in FP32 (docs/model.md, Routing extensions):
 * expert capacity with token dropping, and the load-balancing (Switch/GShard) and z- (ST-MoE)
 * losses of the router.
 *
 * In the loss-sum convention of the model, a rank contributes N times its share of the
 * global objective, so the router losses enter as
 *   aux:  alpha * E * sum_e f_e * sum_{t here} p[t,e]      (f not differentiated)
 *   z:    beta * sum_{t here} logsumexp(z_t)^2
 * with f_e = counts_e / (tokens * K) over the token set of the scope: the whole global batch
 * (counts and tokens from the caller, tm_route_set_balance) or this data shard (its own). */
#include <math.h>
#include <string.h>

#include "tm_internal.h"

/* C = ceil(cf * T * K / E) for a data shard of T tokens, in double, left to right
 * (docs/model.md); no limit without a capacity factor. */
static double capacity_of(const tm_config *cfg, uint64_t T)
{
    const double cf = cfg->capacity_factor;
    return cf > 0.0 ? ceil(cf * (double)T * (double)cfg->top_k / (double)cfg->experts) : INFINITY;
}

/* c->expert from c->choice: expert e keeps its assignments while fewer than `capacity` of the
 * shard's came before (before[e] on earlier ranks of the shard, NULL: none). Slots are in
 * token order, a token's K slots together. */
static void drop(const tm_model *m, tm_layer_cache *c, double capacity, const int64_t *before)
{
    const size_t slots = m->T * (size_t)m->cfg.top_k;
    for (int e = 0; e < m->cfg.experts; e++)
        c->fill[e] = before ? before[e] : 0;
    for (size_t s = 0; s < slots; s++) {
        const int e = c->choice[s];
        c->expert[s] = (double)c->fill[e] < capacity ? e : -1;
        c->fill[e]++;
    }
}

void tm__capacity_drop(const tm_model *m, tm_layer_cache *c)
{
    const size_t slots = m->T * (size_t)m->cfg.top_k;
    const int E = m->cfg.experts;
    memset(c->counts, 0, (size_t)E * sizeof *c->counts);
    for (size_t s = 0; s < slots; s++)
        c->counts[c->choice[s]]++;
    drop(m, c, capacity_of(&m->cfg, m->T), NULL);
    memcpy(c->bal_counts, c->counts, (size_t)E * sizeof *c->counts);
    c->bal_tokens = m->T;
}

/* f_e of the layer's balance statistics, 0 when its token set is empty. */
static double balance_fraction(const tm_model *m, const tm_layer_cache *c, int e)
{
    if (c->bal_tokens == 0)
        return 0.0;
    return (double)c->bal_counts[e] / ((double)c->bal_tokens * (double)m->cfg.top_k);
}

void tm__router_loss_backward(const tm_model *m, const tm_layer_cache *c, size_t t, float *dl)
{
    const int E = m->cfg.experts;
    const float *p = c->probs + t * (size_t)E;
    double alpha = m->cfg.aux_loss_coeff, beta = m->cfg.z_loss_coeff;
    if (m->router_grad_scaled) {
        alpha *= m->aux_grad_scale;
        beta *= m->z_grad_scale;
    }
    if (alpha > 0.0) {
        for (int e = 0; e < E; e++)
            dl[e] += (float)(alpha * E * balance_fraction(m, c, e) * m->router_scale);
    }
    float pdp = 0.0f;
    for (int e = 0; e < E; e++)
        pdp += p[e] * dl[e];
    for (int e = 0; e < E; e++)
        dl[e] = p[e] * (dl[e] - pdp);
    /* d(lse^2)/dz_e = 2 lse p_e */
    if (beta > 0.0) {
        const float zc = (float)(2.0 * beta * m->router_scale) * c->lse[t];
        for (int e = 0; e < E; e++)
            dl[e] += zc * p[e];
    }
}

static seldp_status check_routed(const tm_model *m, int l, const char *fn)
{
    if (l < 0 || l >= m->cfg.layers || !m->embedded || !m->cache[l].routed)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: %s: layer %d was not routed in this step", m->rank, fn, l);
    return SELDP_OK;
}

seldp_status tm_route_counts(const tm_model *m, int l, int64_t *counts)
{
    seldp_status st = check_routed(m, l, "tm_route_counts");
    if (st != SELDP_OK)
        return st;
    memcpy(counts, m->cache[l].counts, (size_t)m->cfg.experts * sizeof *counts);
    return SELDP_OK;
}

seldp_status tm_route_set_shard(tm_model *m, int l, uint64_t shard_tokens, const int64_t *before)
{
    seldp_status st = check_routed(m, l, "tm_route_set_shard");
    if (st != SELDP_OK)
        return st;
    tm_layer_cache *c = &m->cache[l];
    if (c->combined)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "rank %d: tm_route_set_shard: layer %d was already combined; call it "
                        "before the dispatch",
                        m->rank, l);
    if (!before || shard_tokens < m->T)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tm_route_set_shard: layer %d: %s",
                        m->rank, l,
                        before ? "the shard has fewer tokens than this rank" : "before is NULL");
    for (int e = 0; e < m->cfg.experts; e++) {
        if (before[e] < 0 || (uint64_t)before[e] + (uint64_t)c->counts[e] > shard_tokens)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: tm_route_set_shard: layer %d: expert %d has %lld earlier "
                            "assignments and %lld here, expected at most one per token of the "
                            "shard's %llu",
                            m->rank, l, e, (long long)before[e], (long long)c->counts[e],
                            (unsigned long long)shard_tokens);
    }
    drop(m, c, capacity_of(&m->cfg, shard_tokens), before);
    return SELDP_OK;
}

seldp_status tm_route_set_balance(tm_model *m, int l, const int64_t *counts, uint64_t tokens)
{
    seldp_status st = check_routed(m, l, "tm_route_set_balance");
    if (st != SELDP_OK)
        return st;
    if (!counts || (tokens == 0 && m->T > 0))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: tm_route_set_balance: layer %d: %s",
                        m->rank, l,
                        counts ? "0 tokens while this rank routed some" : "counts is NULL");
    const int E = m->cfg.experts;
    for (int e = 0; e < E; e++) {
        if (counts[e] < 0 || (uint64_t)counts[e] > tokens)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "rank %d: tm_route_set_balance: layer %d: expert %d has %lld "
                            "assignments, expected 0..%llu (one per token at most)",
                            m->rank, l, e, (long long)counts[e], (unsigned long long)tokens);
    }
    tm_layer_cache *c = &m->cache[l];
    memcpy(c->bal_counts, counts, (size_t)E * sizeof *counts);
    c->bal_tokens = tokens;
    return SELDP_OK;
}

double tm_router_loss_sum(const tm_model *m)
{
    const int E = m->cfg.experts;
    const double alpha = m->cfg.aux_loss_coeff, beta = m->cfg.z_loss_coeff;
    double sum = 0.0;
    if (!m->embedded || (alpha == 0.0 && beta == 0.0))
        return 0.0;
    for (int l = 0; l < m->cfg.layers; l++) {
        const tm_layer_cache *c = &m->cache[l];
        if (!c->routed)
            continue;
        for (size_t t = 0; t < m->T; t++) {
            const float *p = c->probs + t * (size_t)E;
            for (int e = 0; e < E && alpha > 0.0; e++)
                sum += alpha * E * balance_fraction(m, c, e) * (double)p[e];
            sum += beta * (double)c->lse[t] * (double)c->lse[t];
        }
    }
    return sum * m->router_scale;
}

seldp_status tm_set_router_loss_grad_scale(tm_model *m, double aux, double z)
{
    if (!m || !isfinite(aux) || !isfinite(z) || aux < 0.0 || z < 0.0)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tm_set_router_loss_grad_scale: expected a model and finite scales >= 0");
    m->router_grad_scaled = true;
    m->aux_grad_scale = aux;
    m->z_grad_scale = z;
    return SELDP_OK;
}
