/* Contract of the shard map (seldp/shard.h): the selected trainable parameters in path
 * order, one index space cut into one range per group rank at SELDP_SHARD_ALIGN, pieces
 * that tile each range and each parameter exactly once, the same on every rank, on every
 * world of 1 to 8 ranks (no group size divides the layout's 2199 elements); tied parameters
 * once, frozen parameters, buffers and unselected parameters never; empty selections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shard_fixture.h"

/* The index of SF's entry of `path`, or SF_N. */
static size_t sf_index(const char *path)
{
    for (size_t k = 0; k < SF_N; k++)
        if (strcmp(SF[k].path, path) == 0)
            return k;
    return SF_N;
}

/* 64-bit FNV-1a, to fold the map into one value per rank. */
static uint64_t fold(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3u;
    return h;
}

/* Every range and piece of the map checked against the layout; *digest folds what must be
 * the same on every rank (not the ParamIds, which differ). */
static int check_map(tr_rank_ctx *ctx, const seldp_shard_map *map, uint64_t *digest)
{
    int W = ctx->size;
    size_t E = SF_ELEMENTS, share = (E + (size_t)W - 1) / (size_t)W;
    size_t S = (share + SELDP_SHARD_ALIGN - 1) / SELDP_SHARD_ALIGN * SELDP_SHARD_ALIGN;
    size_t covered[SF_N] = {0}, ranges_of[SF_N] = {0}, expect = 0;
    uint64_t h = 0xcbf29ce484222325u;

    RANK_CHECK(ctx, seldp_shard_map_elements(map) == E, "%zu elements, expected %zu",
               seldp_shard_map_elements(map), E);
    RANK_CHECK(ctx, seldp_shard_map_size(map) == W, "%d ranges, expected %d",
               seldp_shard_map_size(map), W);
    for (int r = 0; r < W; r++) {
        size_t begin = 1, count = 1, want = E - (expect < E ? expect : E);
        want = want < S ? want : S;
        RANK_CHECK_OK(ctx, seldp_shard_map_range(map, r, &begin, &count));
        RANK_CHECK(ctx, begin == (expect < E ? expect : E) && count == want,
                   "rank %d's range is [%zu, +%zu), expected [%zu, +%zu) (S = %zu)", r, begin,
                   count, expect, want, S);
        RANK_CHECK(ctx, begin % SELDP_SHARD_ALIGN == 0 || begin == E,
                   "rank %d's range starts at %zu, not a multiple of %d", r, begin,
                   SELDP_SHARD_ALIGN);
        expect = begin + count;
        h = fold(h, &begin, sizeof begin);
        h = fold(h, &count, sizeof count);
        size_t at = 0, n = seldp_shard_map_pieces(map, r), last = SF_N;
        RANK_CHECK(ctx, count > 0 || n == 0, "the empty range of rank %d has %zu pieces", r, n);
        for (size_t i = 0; i < n; i++) {
            seldp_shard_piece p;
            RANK_CHECK_OK(ctx, seldp_shard_map_piece(map, r, i, &p));
            size_t k = sf_index(p.path);
            RANK_CHECK(ctx, k < SF_N && SF[k].trainable,
                       "rank %d's piece %zu is '%s', not a trainable selected parameter", r, i,
                       p.path);
            RANK_CHECK(ctx, last == SF_N || k > last,
                       "rank %d's piece %zu ('%s') is out of path order", r, i, p.path);
            RANK_CHECK(ctx,
                       p.id == sf_id(ctx->rank, k) && p.dtype == SF[k].dtype &&
                           p.param_elements == sf_numel(k),
                       "rank %d's piece %zu ('%s'): id %llu, %s, %zu elements; expected id %llu, "
                       "%s, %zu",
                       r, i, p.path, (unsigned long long)p.id, seldp_dtype_name(p.dtype),
                       p.param_elements, (unsigned long long)sf_id(ctx->rank, k),
                       seldp_dtype_name(SF[k].dtype), sf_numel(k));
            RANK_CHECK(ctx,
                       p.count > 0 && p.range_offset == at &&
                           p.param_offset + p.count <= p.param_elements &&
                           sf_offset(k) + p.param_offset == begin + at,
                       "rank %d's piece %zu ('%s', +%zu of %zu at %zu in the range) does not "
                       "continue the range at %zu",
                       r, i, p.path, p.param_offset, p.count, p.range_offset, at);
            RANK_CHECK(ctx, p.param_offset == covered[k],
                       "'%s' is covered up to %zu, but rank %d's piece starts at %zu", p.path,
                       covered[k], r, p.param_offset);
            covered[k] += p.count;
            ranges_of[k]++;
            at += p.count;
            last = k;
            h = fold(h, p.path, strlen(p.path));
            h = fold(h, &p.param_offset, sizeof p.param_offset);
            h = fold(h, &p.count, sizeof p.count);
            h = fold(h, &p.range_offset, sizeof p.range_offset);
        }
        RANK_CHECK(ctx, at == count, "rank %d's pieces cover %zu of its %zu elements", r, at,
                   count);
    }
    RANK_CHECK(ctx, expect == E, "the ranges end at %zu, expected %zu", expect, E);
    for (size_t k = 0; k < SF_N; k++)
        RANK_CHECK(ctx, covered[k] == (SF[k].trainable ? sf_numel(k) : 0),
                   "'%s': %zu of %zu elements in the map", SF[k].path, covered[k], sf_numel(k));
    /* the layout's 900-element b.weight spans two ranges on every world but 1 and 2 */
    if (W >= 3)
        RANK_CHECK(ctx, ranges_of[1] >= 2, "'b.weight' lies in %zu range(s) at world %d",
                   ranges_of[1], W);
    *digest = h;
    return 0;
}

static int rank_map(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_session *s = NULL;
    seldp_shard_map *map = NULL;
    seldp_shard_piece p;
    uint64_t digest = 0;

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, SF_N, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    if (check_map(ctx, map, &digest))
        return 1;
    RANK_CHECK(ctx, same_everywhere(ctx->world, &digest, sizeof digest),
               "the map differs between ranks");
    /* queries outside the map */
    RANK_CHECK(ctx, seldp_shard_map_range(map, ctx->size, NULL, NULL) == SELDP_ERR_INVALID_ARGUMENT,
               "a range past the group was answered");
    RANK_CHECK(ctx, seldp_shard_map_range(map, -1, NULL, NULL) == SELDP_ERR_INVALID_ARGUMENT,
               "range -1 was answered");
    RANK_CHECK(ctx, strstr(seldp_last_error(), "outside the map's group"),
               "the message does not say why: %s", seldp_last_error());
    RANK_CHECK(ctx,
               seldp_shard_map_piece(map, 0, seldp_shard_map_pieces(map, 0), &p) ==
                   SELDP_ERR_INVALID_ARGUMENT,
               "a piece past the range was answered");
    RANK_CHECK(ctx,
               seldp_shard_map_pieces(map, ctx->size) == 0 && seldp_shard_map_pieces(NULL, 0) == 0,
               "pieces outside the map");
    RANK_CHECK(ctx, seldp_shard_map_range(NULL, 0, NULL, NULL) == SELDP_ERR_INVALID_ARGUMENT,
               "a NULL map was answered");
    RANK_CHECK(ctx, seldp_shard_map_elements(NULL) == 0 && seldp_shard_map_size(NULL) == 0,
               "a NULL map has elements");
    /* pure: a second map of the same session is the same map */
    seldp_shard_map *again = NULL;
    uint64_t digest2 = 0;
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &again));
    if (check_map(ctx, again, &digest2))
        return 1;
    RANK_CHECK(ctx, digest2 == digest, "a second map of the session differs");
    seldp_shard_map_destroy(again);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void test_every_world(void **state)
{
    (void)state;
    for (int n = 1; n <= MAX_RANKS; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_map, NULL);
}

/* No trainable element: an empty selection, and one of a frozen parameter and a buffer. */
static int rank_empty(tr_rank_ctx *ctx)
{
    test_model m;
    seldp_session *s = NULL, *t = NULL;
    seldp_shard_map *map = NULL, *tmap = NULL;

    RANK_CHECK_OK(ctx, sf_session(ctx->world, &m, 0, NULL, &s));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(s, &map));
    seldp_param_id ids[2] = {sf_id(ctx->rank, 3), sf_id(ctx->rank, 7)}; /* d.frozen, q.codes */
    RANK_CHECK_OK(ctx,
                  seldp_session_initialize_with_buffers(ctx->world, m.model, 0, ids, 2, NULL, &t));
    RANK_CHECK_OK(ctx, seldp_shard_map_create(t, &tmap));
    const seldp_shard_map *maps[2] = {map, tmap};
    for (int j = 0; j < 2; j++) {
        RANK_CHECK(ctx, seldp_shard_map_elements(maps[j]) == 0, "map %d has elements", j);
        for (int r = 0; r < ctx->size; r++) {
            size_t begin = 1, count = 1;
            RANK_CHECK_OK(ctx, seldp_shard_map_range(maps[j], r, &begin, &count));
            RANK_CHECK(ctx, begin == 0 && count == 0 && seldp_shard_map_pieces(maps[j], r) == 0,
                       "map %d: rank %d's range is [%zu, +%zu)", j, r, begin, count);
        }
    }
    seldp_shard_map *none = map;
    RANK_CHECK(ctx,
               seldp_shard_map_create(NULL, &none) == SELDP_ERR_INVALID_ARGUMENT && none == NULL,
               "a map of no session");
    seldp_shard_map_destroy(tmap);
    seldp_session_destroy(t);
    seldp_shard_map_destroy(map);
    seldp_session_destroy(s);
    ct_free(&m);
    return 0;
}

static void test_empty_selections(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        tr_run_ranks(n, TEST_TIMEOUT_S, rank_empty, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_world),
        cmocka_unit_test(test_empty_selections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
