/* The FP64 reference of a step of M micro-batches (docs/model.md, Micro-batches): the mean
 * token loss over every token of every micro-batch, plus each micro-batch's router losses
 * weighted 1/M, and its gradient.
 *
 * Each micro-batch is an independent reference computation over its own data shards (its
 * capacity, its load-balancing statistics): micro-batch m's objective is its N_m tokens'
 * mean loss plus its router losses. The step's objective weights the token part by N_m / N
 * and the router part by 1/M; since the router losses are linear in their coefficients, the
 * reference of micro-batch m runs with the coefficients scaled by c_m = N / (M N_m), and the
 * step's values are the N_m / N weighted sums of the micro-batches'. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference_weights.h"
#include "tm_error.h"

/* Fold micro-batch result `r` with weight w into the step's `acc` (acc's arrays already hold
 * the weighted sums of the earlier micro-batches; its magnitudes their standard deviations).
 * The FP32 model adds micro-batch m's loss-sum gradients into the accumulators its earlier
 * micro-batches left: one more rounding of the running sum per element, in quadrature. */
static seldp_status fold(tm_reference *acc, const tm_reference *r, double w, bool first)
{
    for (size_t i = 0; i < acc->n_entries; i++) {
        ref_entry *a = &acc->entries[i];
        if (!a->g)
            continue;
        const ref_entry *b = first ? a : tm__ref_find(r, a->path);
        if (!b || !b->g || b->n != a->n)
            return tm__fail(SELDP_ERR_INTERNAL,
                            "reference: micro-batch results differ in the tensor %s", a->path);
        for (size_t j = 0; j < a->n; j++) {
            double g = w * b->g[j], m = w * b->m[j];
            if (first) {
                a->g[j] = g;
                a->m[j] = fabs(m);
                continue;
            }
            double sum = a->g[j] + g;
            a->m[j] = sqrt(a->m[j] * a->m[j] + m * m + sum * sum);
            a->g[j] = sum;
        }
    }
    const size_t LE = (size_t)acc->cfg.layers * (size_t)acc->cfg.experts;
    if (first) {
        acc->loss = w * r->loss;
        acc->loss_magnitude = fabs(w * r->loss_magnitude);
        return SELDP_OK;
    }
    for (size_t le = 0; le < LE; le++)
        acc->routed[le] += r->routed[le];
    acc->loss += w * r->loss;
    acc->loss_magnitude = hypot(acc->loss_magnitude, w * r->loss_magnitude);
    acc->N += r->N;
    acc->ties_followed += r->ties_followed;
    acc->dropped += r->dropped;
    return SELDP_OK;
}

seldp_status tm_reference_compute_micro(const tm_config *cfg, const seldp_model *weights,
                                        const tm_micro_batch *micro, int M, tm_reference **out)
{
    seldp_status st = SELDP_OK;
    tm_reference *acc = NULL, *r = NULL;
    if (!out || !cfg || !weights || !micro || M < 1)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "reference: NULL argument or M < 1");
    *out = NULL;
    if (M == 1)
        return tm_reference_compute_routed(cfg, weights, micro[0].tokens, micro[0].targets,
                                           micro[0].counts, micro[0].n_shards, NULL,
                                           micro[0].choices, out);
    size_t N = 0;
    size_t *Nm = calloc((size_t)M, sizeof *Nm);
    if (!Nm)
        return tm__fail(SELDP_ERR_NOMEM, "reference: out of memory");
    for (int m = 0; m < M; m++) {
        for (int s = 0; s < micro[m].n_shards; s++)
            Nm[m] += micro[m].counts[s];
        if (Nm[m] == 0)
            TM_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                    "reference: micro-batch %d of %d has no token on any data shard", m + 1, M);
        N += Nm[m];
    }
    for (int m = 0; m < M; m++) {
        tm_config c = *cfg;
        double scale = (double)N / ((double)M * (double)Nm[m]);
        c.aux_loss_coeff *= scale;
        c.z_loss_coeff *= scale;
        TM_CHECK(tm_reference_compute_routed(&c, weights, micro[m].tokens, micro[m].targets,
                                             micro[m].counts, micro[m].n_shards, NULL,
                                             micro[m].choices, &r));
        double w = (double)Nm[m] / (double)N;
        if (m == 0) {
            acc = r;
            r = NULL;
            acc->cfg = *cfg;
            TM_CHECK(fold(acc, acc, w, true));
        } else {
            TM_CHECK(fold(acc, r, w, false));
            tm_reference_destroy(r);
            r = NULL;
        }
    }
    *out = acc;
    acc = NULL;
fail:
    tm_reference_destroy(acc);
    tm_reference_destroy(r);
    free(Nm);
    return st;
}
