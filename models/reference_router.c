/* The FP64 reference's routing extensions (docs/model.md, Routing extensions), written
 * straight from its formulas and apart from the FP32 path's router.c: the capacity decides
 * per expert which of a data shard's assignments it keeps; the load-balancing loss is
 * alpha * E * sum_e f_e P_e over the scope's token set(s), the z-loss
 * beta * mean_t logsumexp(z_t)^2, both differentiated here with respect to the router
 * logits. */
#include <math.h>
#include <string.h>

#include "reference_router.h"

void tm__ref_capacity(const tm_config *cfg, const int *sel, const size_t *shard_begin, int n_shards,
                      double *taken, unsigned char *kept)
{
    const int E = cfg->experts, K = cfg->top_k;
    if (cfg->capacity_factor <= 0.0) {
        memset(kept, 1, shard_begin[n_shards] * (size_t)K);
        return;
    }
    for (int r = 0; r < n_shards; r++) {
        const size_t first = shard_begin[r] * (size_t)K, end = shard_begin[r + 1] * (size_t)K;
        const double T_r = (double)(shard_begin[r + 1] - shard_begin[r]);
        /* C = ceil(cf * T_r * K / E), the product taken left to right in double; each expert
         * keeps its first C assignments of the shard in slot order */
        const double cap = ceil(cfg->capacity_factor * T_r * (double)K / (double)E);
        memset(taken, 0, (size_t)E * sizeof *taken);
        for (size_t s = first; s < end; s++) {
            kept[s] = taken[sel[s]] < cap;
            taken[sel[s]] += 1.0;
        }
    }
}

/* alpha * E * sum_e f_e P_e over tokens [a, b) of N, and its logit gradient (scaled by
 * weight = the set's share of the objective, (b - a) / N for a local shard, 1 for global). */
static double balance_loss(const tm_config *cfg, const double *probs, const int *sel, size_t a,
                           size_t b, size_t N, double *f, double *P, double *dlogits)
{
    const int E = cfg->experts, K = cfg->top_k;
    const double T = (double)(b - a), alpha = cfg->aux_loss_coeff;
    if (b == a)
        return 0.0;
    memset(f, 0, (size_t)E * sizeof *f);
    memset(P, 0, (size_t)E * sizeof *P);
    for (size_t t = a; t < b; t++) {
        for (int k = 0; k < K; k++)
            f[sel[t * K + k]] += 1.0 / (T * K);
        for (int e = 0; e < E; e++)
            P[e] += probs[t * E + e] / T;
    }
    double loss = 0.0;
    for (int e = 0; e < E; e++)
        loss += alpha * E * f[e] * P[e];
    /* d/dz_tj of (T/N) * alpha E sum_e f_e P_e = (alpha E / N) p_tj (f_j - sum_e f_e p_te) */
    for (size_t t = a; t < b; t++) {
        const double *p = probs + t * E;
        double fp = 0.0;
        for (int e = 0; e < E; e++)
            fp += f[e] * p[e];
        for (int j = 0; j < E; j++)
            dlogits[t * E + j] += alpha * E / (double)N * p[j] * (f[j] - fp);
    }
    return T / (double)N * loss;
}

double tm__ref_router_losses(const tm_config *cfg, const double *logits, const int *sel,
                             const size_t *shard_begin, int n_shards, double *work, double *dlogits)
{
    const int E = cfg->experts;
    const size_t N = shard_begin[n_shards];
    double *probs = work, *f = work + N * E, *P = f + E;
    double loss = 0.0;
    memset(dlogits, 0, N * (size_t)E * sizeof *dlogits);
    for (size_t t = 0; t < N; t++) {
        const double *z = logits + t * E;
        double mx = z[0];
        for (int e = 1; e < E; e++)
            mx = fmax(mx, z[e]);
        double se = 0.0;
        for (int e = 0; e < E; e++)
            se += exp(z[e] - mx);
        const double lse = mx + log(se);
        for (int e = 0; e < E; e++)
            probs[t * E + e] = exp(z[e] - lse);
        if (cfg->z_loss_coeff > 0.0) {
            loss += cfg->z_loss_coeff * lse * lse / (double)N;
            for (int e = 0; e < E; e++)
                dlogits[t * E + e] += 2.0 * cfg->z_loss_coeff * lse * probs[t * E + e] / (double)N;
        }
    }
    if (cfg->aux_loss_coeff > 0.0) {
        if (cfg->aux_loss_scope == TM_AUX_GLOBAL) {
            loss += balance_loss(cfg, probs, sel, 0, N, N, f, P, dlogits);
        } else {
            for (int r = 0; r < n_shards; r++)
                loss += balance_loss(cfg, probs, sel, shard_begin[r], shard_begin[r + 1], N, f, P,
                                     dlogits);
        }
    }
    return loss;
}

static bool has_expert(const int *set, int K, int e)
{
    for (int k = 0; k < K; k++)
        if (set[k] == e)
            return true;
    return false;
}

/* The FP32 model ranks the probabilities softmax(z) in FP32, not the logits: far below the
 * largest logit (about 87 at FP32's smallest normal, 104 at its smallest subnormal) they
 * underflow, to subnormals of a few bits or to 0, and experts whose logits differ by whole
 * units tie there. True when the lowest chosen and the highest unchosen logit have FP32
 * probabilities within REF_TIE_TOL of each other (relative), or one subnormal step apart. */
static bool fp32_probability_tie(const double *z, int E, double lowest_in, double highest_out)
{
    double mx = -INFINITY, se = 0.0;
    for (int e = 0; e < E; e++)
        mx = fmax(mx, z[e]);
    for (int e = 0; e < E; e++)
        se += exp(z[e] - mx);
    const float p_in = (float)(exp(lowest_in - mx) / se);
    const float p_out = (float)(exp(highest_out - mx) / se);
    const double subnormal = ldexp(1.0, -149);
    return (double)p_in >= (double)p_out * (1.0 - REF_TIE_TOL) - subnormal;
}

bool tm__ref_follow_tie(const double *z, int E, int K, const int *choice, int *sel)
{
    bool same = true;
    double scale = 0.0, lowest_in = INFINITY, highest_out = -INFINITY;
    for (int k = 0; k < K; k++)
        if (choice[k] < 0 || choice[k] >= E || has_expert(choice, k, choice[k]))
            return false;
    for (int k = 0; k < K; k++)
        same = same && has_expert(choice, K, sel[k]);
    if (same)
        return false;
    for (int e = 0; e < E; e++) {
        scale = fmax(scale, fabs(z[e]));
        if (has_expert(choice, K, e))
            lowest_in = fmin(lowest_in, z[e]);
        else
            highest_out = fmax(highest_out, z[e]);
    }
    if (lowest_in < highest_out - REF_TIE_TOL * (1.0 + scale) &&
        !fp32_probability_tie(z, E, lowest_in, highest_out))
        return false;
    /* the chosen set in decreasing logit order, ties by index */
    for (int k = 0, e = 0; e < E; e++) {
        if (!has_expert(choice, K, e))
            continue;
        int at = k++;
        while (at > 0 && z[sel[at - 1]] < z[e]) {
            sel[at] = sel[at - 1];
            at--;
        }
        sel[at] = e;
    }
    return true;
}
