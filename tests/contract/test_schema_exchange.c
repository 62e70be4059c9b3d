/* The schema exchange of seldp_session_initialize (docs/library.md, Initialize: validation is
 * collective): the outcome all-gather carries each rank's encoded schema length and two
 * digests of it, and the schemas themselves are all-gathered only when some rank's bytes
 * differ from the root's. Either way the verdict is the same on every rank, the session's
 * fingerprint is the FNV-1a digest of the root's manifest, and a schema that differs on one
 * rank is named. The session and manifest internals are read from src/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"
#include "manifest.h"
#include "session_impl.h"

typedef struct exchange_arg {
    int root;
    int odd_rank; /* the rank whose schema differs (-1: none) */
    bool reorder; /* odd ranks register their parameters in the opposite order */
    outcome o;
} exchange_arg;

static int cmp_ids(const void *a, const void *b)
{
    seldp_param_id x = *(const seldp_param_id *)a, y = *(const seldp_param_id *)b;
    return (x > y) - (x < y);
}

/* FNV-1a 64 of the manifest of `ids` in `model`, as initialize encodes it. */
static bool manifest_digest(const seldp_model *model, const seldp_param_id *ids, size_t n,
                            uint64_t *digest)
{
    seldp_param_id sorted[8];
    seldp__manifest m = {0, NULL, NULL};
    void *blob = NULL;
    size_t bytes = 0;
    memcpy(sorted, ids, n * sizeof *ids);
    qsort(sorted, n, sizeof *sorted, cmp_ids);
    if (seldp__manifest_build(model, sorted, n, &m) != SELDP_OK ||
        seldp__manifest_encode(&m, &blob, &bytes) != SELDP_OK) {
        seldp__manifest_free(&m);
        return false;
    }
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ ((const unsigned char *)blob)[i]) * 0x100000001b3u;
    *digest = h;
    free(blob);
    seldp__manifest_free(&m);
    return true;
}

/* Three selected parameters, the same on every rank except the odd rank's `w` (F16 there). */
static seldp_status build(test_model *m, int rank, const exchange_arg *a, seldp_param_id *ids)
{
    static const char *const paths[3] = {"a.bias", "b.weight", "w"};
    seldp_status st = ct_init(m, rank);
    for (int k = 0; k < 3 && st == SELDP_OK; k++) {
        int i = a->reorder && rank % 2 ? 2 - k : k;
        seldp_dtype dt = i == 2 && rank == a->odd_rank ? SELDP_F16 : SELDP_F32;
        ids[i] = (seldp_param_id)(10 + i);
        st = ct_add(m, paths[i], ids[i], dt, false, 7 + (uint64_t)rank, 2, SHAPE(2, 3));
    }
    return st;
}

static int rank_exchange(tr_rank_ctx *ctx)
{
    exchange_arg *a = ctx->arg;
    test_model m;
    seldp_param_id ids[3];
    seldp_session *s = NULL;
    RANK_CHECK_OK(ctx, build(&m, ctx->rank, a, ids));
    ct_snapshot(&m);
    seldp_comm_stats before = seldp_comm_get_stats(ctx->world);
    seldp_status st = seldp_session_initialize(ctx->world, m.model, a->root, ids, 3, NULL, &s);
    seldp_comm_stats after = seldp_comm_get_stats(ctx->world);
    outcome_record(&a->o, ctx->rank, st);
    a->o.unchanged[ctx->rank] = ct_unchanged(&m, a->o.why[ctx->rank], sizeof a->o.why[0]);
    uint64_t gathers = after.allgathers - before.allgathers;
    if (a->odd_rank >= 0) {
        /* the records differ: the schemas are exchanged and compared, and nothing is
           broadcast */
        RANK_CHECK(ctx, gathers == 2, "%llu all-gathers, expected 2 (records, then schemas)",
                   (unsigned long long)gathers);
        RANK_CHECK(ctx, after.broadcasts == before.broadcasts, "a failed initialize broadcast");
        ct_free(&m);
        return 0;
    }
    RANK_CHECK_OK(ctx, st);
    RANK_CHECK(ctx, gathers == 1, "%llu all-gathers, expected 1 (identical schemas: the records)",
               (unsigned long long)gathers);
    /* the fingerprint: the root's manifest digest, the same on every rank */
    uint64_t mine = 0;
    RANK_CHECK(ctx, manifest_digest(m.model, ids, 3, &mine), "cannot build the manifest");
    RANK_CHECK(ctx, s->digest == mine, "fingerprint %016llx, the manifest's digest is %016llx",
               (unsigned long long)s->digest, (unsigned long long)mine);
    RANK_CHECK(ctx, same_everywhere(ctx->world, &s->digest, sizeof s->digest),
               "the fingerprint differs between ranks");
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

/* Identical schemas: one all-gather, and the fingerprint the full exchange would give. Odd
 * ranks registering their parameters in another order make the same manifest (it is in path
 * order), so the exchange is skipped for them too. */
static void identical_schemas_exchange_records_only(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        for (int root = 0; root < n; root++)
            for (int reorder = 0; reorder < 2; reorder++) {
                exchange_arg a = {.root = root, .odd_rank = -1, .reorder = reorder != 0};
                tr_run_ranks(n, TEST_TIMEOUT_S, rank_exchange, &a);
            }
}

/* One rank's schema differs: the manifests are exchanged and every rank names it, whichever
 * rank is the root (the differing rank itself included). */
static void a_differing_schema_is_exchanged_and_named(void **state)
{
    (void)state;
    for (int n = 2; n <= 4; n++)
        for (int root = 0; root < n; root++)
            for (int odd = 0; odd < n; odd++) {
                if (odd == root)
                    continue;
                exchange_arg a = {.root = root, .odd_rank = odd};
                tr_run_ranks(n, TEST_TIMEOUT_S, rank_exchange, &a);
                char who[64];
                snprintf(who, sizeof who, "group rank %d (world rank %d) has dtype f16", odd, odd);
                expect_same_failure(&a.o, n, SELDP_ERR_SCHEMA, "schema differs at 'w'", who);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(identical_schemas_exchange_records_only),
        cmocka_unit_test(a_differing_schema_is_exchanged_and_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
