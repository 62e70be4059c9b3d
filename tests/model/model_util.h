/* Helpers shared by the tiny-moe tests: small configs, token draws, a global model built
 * from several ranks' replicas, and tensor comparisons that print the worst offender. */
#ifndef MODEL_UTIL_H
#define MODEL_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tinymoe.h"

/* A config small enough for finite differences, valid for every quant variant. */
static inline tm_config small_config(tm_quant quant, seldp_dtype dtype)
{
    tm_config cfg = TM_CONFIG_INIT;
    cfg.vocab = 16;
    cfg.d_model = 32;
    cfg.d_ff = 32;
    cfg.experts = 4;
    cfg.top_k = 2;
    cfg.layers = 2;
    cfg.dtype = dtype;
    cfg.quant = quant;
    cfg.lora_rank = 4;
    cfg.lora_alpha = 8.0;
    cfg.seed = 7;
    return cfg;
}

/* Deterministic tokens/targets in [0, V). */
static inline void draw_tokens(uint64_t seed, size_t n, int V, int32_t *tokens, int32_t *targets)
{
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(tm_splitmix64(&seed) % (uint64_t)V);
        targets[i] = (int32_t)(tm_splitmix64(&seed) % (uint64_t)V);
    }
}

/* Create a model holding every expert. */
static inline tm_model *model_all_experts(const tm_config *cfg, int rank)
{
    int ids[64];
    for (int e = 0; e < cfg->experts; e++)
        ids[e] = e;
    tm_model *m = NULL;
    if (tm_model_create(cfg, rank, ids, cfg->experts, NULL, NULL, &m) != SELDP_OK) {
        fprintf(stderr, "tm_model_create: %s\n", tm_last_error());
        return NULL;
    }
    return m;
}

/* ||scale * got - want|| / ||want|| for an F32 array; prints the worst element. */
static inline double rel_err_f32(const char *what, const float *got, double scale,
                                 const double *want, size_t n)
{
    double num = 0.0, den = 0.0, worst = -1.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = scale * (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
        if (fabs(d) > worst) {
            worst = fabs(d);
            at = i;
        }
    }
    double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (n)
        printf("  %-36s rel %.3e  worst [%zu] got %.9g want %.9g\n", what, rel, at,
               scale * (double)got[at], want[at]);
    return rel;
}

#endif
