/* The layout of the sharded-state tests (see shard_fixture.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_fixture.h"

const sf_spec SF[SF_N] = {
    {"a.bias", SELDP_F32, 1, {37, 0}, false, true},
    {"b.weight", SELDP_BF16, 2, {300, 3}, false, true},
    {"c.norm", SELDP_F16, 1, {5, 0}, false, true},
    {"d.frozen", SELDP_F32, 1, {64, 0}, true, false},
    {"e.weight", SELDP_F32, 1, {257, 0}, false, true},
    {"f.empty", SELDP_F32, 1, {0, 0}, false, true},
    {"h.expert", SELDP_F32, 2, {10, 100}, false, true},
    {"q.codes", SELDP_I32, 1, {16, 0}, false, false},
};

seldp_param_id sf_id(int rank, size_t k)
{
    return 10 + (k * 3 + (size_t)rank * 5) % SF_N;
}

size_t sf_numel(size_t k)
{
    size_t n = 1;
    for (int d = 0; d < SF[k].ndim; d++)
        n *= (size_t)SF[k].shape[d];
    return n;
}

size_t sf_offset(size_t k)
{
    size_t at = 0;
    for (size_t j = 0; j < k; j++)
        if (SF[j].trainable)
            at += sf_numel(j);
    return at;
}

seldp_status sf_model(test_model *m, int rank, uint64_t seed)
{
    seldp_status st = ct_init(m, rank);
    for (size_t i = 0; st == SELDP_OK && i < SF_N; i++) {
        size_t k = rank % 2 ? SF_N - 1 - i : i;
        st = ct_add(m, SF[k].path, sf_id(rank, k), SF[k].dtype, SF[k].frozen,
                    seed + 100u * (uint64_t)rank + k, SF[k].ndim, SF[k].shape);
    }
    if (st == SELDP_OK)
        st = ct_tie(m, "z.head", "b.weight");
    if (st == SELDP_OK)
        st = ct_add(m, "u.local", SF_UNSELECTED_ID, SELDP_F32, false, 31 + (uint64_t)rank, 1,
                    SHAPE(rank + 3));
    return st;
}

seldp_status sf_session(seldp_comm *comm, test_model *m, size_t n_select,
                        const seldp_session_config *cfg, seldp_session **s)
{
    int rank = seldp_comm_rank(comm);
    seldp_param_id ids[SF_N];
    seldp_status st = sf_model(m, rank, 5000);
    if (st != SELDP_OK)
        return st;
    for (size_t i = 0; i < n_select; i++)
        ids[i] = sf_id(rank, rank % 3 ? i : n_select - 1 - i);
    return seldp_session_initialize_with_buffers(comm, m->model, 0, ids, n_select, cfg, s);
}

uint64_t sf_grad_seed(int rank, size_t k, uint64_t step)
{
    return 90000u + 1000u * step + 10u * (uint64_t)rank + k;
}

seldp_status sf_put_grads(test_grads *g, int rank, uint64_t step, const bool *has, bool f32)
{
    seldp_status st = SELDP_OK;
    for (size_t k = 0; st == SELDP_OK && k < SF_N; k++) {
        if (!SF[k].trainable || (has && !has[k]))
            continue;
        st = tg_put(g, sf_id(rank, k), f32 ? SELDP_F32 : SF[k].dtype, (rank + (int)k) % 2 == 0,
                    sf_grad_seed(rank, k, step), SF[k].ndim, SF[k].shape, NULL);
    }
    if (st == SELDP_OK)
        st = tg_put(g, SF_UNSELECTED_ID, SELDP_F32, false, 4242, 1, SHAPE(rank + 3), NULL);
    return st;
}

seldp_session_config sf_config(void)
{
    seldp_session_config cfg = SELDP_SESSION_CONFIG_INIT;
    const char *staged = getenv("SELDP_TEST_STAGED_COMMIT");
    const char *bucket = getenv("SELDP_TEST_BUCKET_BYTES");
    cfg.staged_commit = staged && strcmp(staged, "1") == 0;
    if (bucket && atol(bucket) > 0)
        cfg.bucket_bytes = (size_t)atol(bucket);
    return cfg;
}
