/* model view: path order, lookups, tied aliases, duplicate paths, bad input, and that a
 * failing registration changes nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

static float storage[8][16];

static seldp_tensor vec(int which, int64_t n)
{
    return seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, storage[which], 1, &n);
}

static seldp_model *model_with(int rank)
{
    seldp_model *m = NULL;
    assert_int_equal(seldp_model_create(rank, &m), SELDP_OK);
    assert_non_null(m);
    return m;
}

/* Every path in strcmp order, and find_path finds each of them. */
static void assert_sorted(const seldp_model *m)
{
    for (size_t i = 0; i < seldp_model_count(m); i++) {
        const seldp_param *p = seldp_model_at(m, i);
        assert_non_null(p);
        if (i > 0 && strcmp(seldp_model_at(m, i - 1)->path, p->path) >= 0)
            fail_msg("paths out of order at %zu: '%s' then '%s'", i, seldp_model_at(m, i - 1)->path,
                     p->path);
        assert_ptr_equal(seldp_model_find_path(m, p->path), p);
    }
    assert_null(seldp_model_at(m, seldp_model_count(m)));
}

static void test_path_order_and_lookup(void **state)
{
    (void)state;
    seldp_model *m = model_with(2);
    const char *paths[] = {"layers.2.norm.weight",
                           "layers.10.norm.weight",
                           "embed.weight",
                           "layers.1.norm.weight",
                           "final_norm.weight",
                           "layers.1",
                           "Layers.1",
                           "layers.1.norm.weight.x"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        seldp_tensor t = vec((int)i, 4);
        assert_int_equal(seldp_model_add(m, paths[i], 100 + i, &t, i == 4, &storage[i]), SELDP_OK);
    }
    assert_int_equal(seldp_model_count(m), 8);
    assert_int_equal(seldp_model_rank(m), 2);
    const char *expected[] = {"Layers.1",
                              "embed.weight",
                              "final_norm.weight",
                              "layers.1",
                              "layers.1.norm.weight",
                              "layers.1.norm.weight.x",
                              "layers.10.norm.weight",
                              "layers.2.norm.weight"};
    for (size_t i = 0; i < 8; i++)
        assert_string_equal(seldp_model_at(m, i)->path, expected[i]);
    assert_sorted(m);

    const seldp_param *p = seldp_model_find_path(m, "final_norm.weight");
    assert_non_null(p);
    assert_int_equal(p->id, 104);
    assert_true(p->frozen);
    assert_ptr_equal(p->tag, &storage[4]);
    assert_ptr_equal(p->tensor.data, storage[4]);
    assert_int_equal(p->tensor.shape[0], 4);
    assert_ptr_equal(seldp_model_find_id(m, 104), p);
    assert_false(seldp_model_find_path(m, "embed.weight")->frozen);

    assert_null(seldp_model_find_path(m, "layers.3.norm.weight"));
    assert_null(seldp_model_find_path(m, "layers"));
    assert_null(seldp_model_find_path(m, ""));
    assert_null(seldp_model_find_path(m, NULL));
    assert_null(seldp_model_find_id(m, 99));
    assert_null(seldp_model_find_id(m, 108));
    assert_int_equal(seldp_model_aliases(m, 99, NULL, 0), 0);
    seldp_model_destroy(m);
}

static void test_paths_are_copied_and_pointers_stable(void **state)
{
    (void)state;
    seldp_model *m = model_with(0);
    char path[64] = "experts.0.w1.weight";
    seldp_tensor t = vec(0, 16);
    assert_int_equal(seldp_model_add(m, path, 7, &t, false, NULL), SELDP_OK);
    const seldp_param *first = seldp_model_find_path(m, "experts.0.w1.weight");
    strcpy(path, "changed");
    t.shape[0] = 3; /* the descriptor is copied too */
    assert_string_equal(first->path, "experts.0.w1.weight");
    assert_int_equal(first->tensor.shape[0], 16);
    /* Many more registrations, before and after it in path order. */
    for (int i = 0; i < 300; i++) {
        char p[64];
        snprintf(p, sizeof p, "%c.%d", i % 2 ? 'a' : 'z', i);
        seldp_tensor u = vec(1 + i % 7, 2);
        assert_int_equal(seldp_model_add(m, p, 1000 + (uint64_t)i, &u, false, NULL), SELDP_OK);
    }
    assert_ptr_equal(seldp_model_find_path(m, "experts.0.w1.weight"), first);
    assert_string_equal(first->path, "experts.0.w1.weight");
    assert_int_equal(first->id, 7);
    assert_int_equal(seldp_model_count(m), 301);
    assert_sorted(m);
    for (int i = 0; i < 300; i++) {
        const seldp_param *p = seldp_model_find_id(m, 1000 + (uint64_t)i);
        assert_non_null(p);
        char want[64];
        snprintf(want, sizeof want, "%c.%d", i % 2 ? 'a' : 'z', i);
        assert_string_equal(p->path, want);
    }
    seldp_model_destroy(m);
}

static void test_tied_aliases(void **state)
{
    (void)state;
    seldp_model *m = model_with(1);
    seldp_tensor embed = vec(0, 8);
    assert_int_equal(seldp_model_add(m, "lm_head.weight", 5, &embed, false, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(m, "embed.weight", 5, &embed, false, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(m, "z.tied", 5, &embed, false, NULL), SELDP_OK);
    seldp_tensor other = vec(1, 8);
    assert_int_equal(seldp_model_add(m, "final_norm.weight", 6, &other, false, NULL), SELDP_OK);

    /* find_id gives the smallest path; aliases come in path order. */
    assert_string_equal(seldp_model_find_id(m, 5)->path, "embed.weight");
    const seldp_param *out[4] = {NULL};
    assert_int_equal(seldp_model_aliases(m, 5, out, 4), 3);
    assert_string_equal(out[0]->path, "embed.weight");
    assert_string_equal(out[1]->path, "lm_head.weight");
    assert_string_equal(out[2]->path, "z.tied");
    assert_null(out[3]);
    const seldp_param *two[2] = {NULL};
    assert_int_equal(seldp_model_aliases(m, 5, two, 1), 3); /* count is the total */
    assert_string_equal(two[0]->path, "embed.weight");
    assert_null(two[1]);
    assert_int_equal(seldp_model_aliases(m, 6, NULL, 0), 1);
    seldp_model_destroy(m);
}

/* Registering `t` at a new path under id 5 (registered with storage[0], f32 [8], not
 * frozen) fails with SELDP_ERR_ALIAS naming the rank, both paths and what differs. */
static void expect_alias_error(seldp_tensor t, bool frozen, const char *what)
{
    seldp_model *m = model_with(3);
    seldp_tensor embed = vec(0, 8);
    assert_int_equal(seldp_model_add(m, "embed.weight", 5, &embed, false, NULL), SELDP_OK);
    seldp_clear_error();
    assert_int_equal(seldp_model_add(m, "lm_head.weight", 5, &t, frozen, NULL), SELDP_ERR_ALIAS);
    const char *msg = seldp_last_error();
    if (!strstr(msg, "rank 3") || !strstr(msg, "lm_head.weight") || !strstr(msg, "embed.weight") ||
        !strstr(msg, what))
        fail_msg("alias error '%s' should name rank 3, both paths and '%s'", msg, what);
    assert_int_equal(seldp_model_count(m), 1);
    assert_null(seldp_model_find_path(m, "lm_head.weight"));
    assert_int_equal(seldp_model_aliases(m, 5, NULL, 0), 1);
    seldp_model_destroy(m);
}

static void test_alias_mismatches(void **state)
{
    (void)state;
    expect_alias_error(vec(1, 8), false, "storage");
    expect_alias_error(vec(0, 4), false, "shape");
    seldp_tensor t = vec(0, 8);
    t.dtype = SELDP_I32;
    expect_alias_error(t, false, "dtype");
    t = vec(0, 8);
    t.ndim = 2;
    t.shape[0] = 2;
    t.shape[1] = 4;
    expect_alias_error(t, false, "shape");
    expect_alias_error(vec(0, 8), true, "frozen");
    t = vec(0, 8);
    t.device = (seldp_device){SELDP_DEVICE_CUDA, 0};
    expect_alias_error(t, false, "device");
}

static void test_duplicate_path(void **state)
{
    (void)state;
    seldp_model *m = model_with(4);
    seldp_tensor a = vec(0, 8), b = vec(1, 4);
    assert_int_equal(seldp_model_add(m, "router.weight", 1, &a, false, &storage[0]), SELDP_OK);
    /* Same id and storage, or a different id: a path is registered once either way. */
    assert_int_equal(seldp_model_add(m, "router.weight", 1, &a, false, NULL), SELDP_ERR_DUPLICATE);
    assert_int_equal(seldp_model_add(m, "router.weight", 2, &b, true, NULL), SELDP_ERR_DUPLICATE);
    const char *msg = seldp_last_error();
    if (!strstr(msg, "rank 4") || !strstr(msg, "router.weight"))
        fail_msg("duplicate error '%s' should name rank 4 and the path", msg);
    assert_int_equal(seldp_model_count(m), 1);
    const seldp_param *p = seldp_model_find_path(m, "router.weight");
    assert_int_equal(p->id, 1);
    assert_ptr_equal(p->tensor.data, storage[0]);
    assert_int_equal(p->tensor.shape[0], 8);
    assert_false(p->frozen);
    assert_ptr_equal(p->tag, &storage[0]);
    assert_null(seldp_model_find_id(m, 2));
    seldp_model_destroy(m);
}

static void test_bad_input(void **state)
{
    (void)state;
    seldp_model *m = model_with(-1);
    seldp_tensor good = vec(0, 8);
    assert_int_equal(seldp_model_add(m, "a", 1, &good, false, NULL), SELDP_OK);

    assert_int_equal(seldp_model_add(m, "", 2, &good, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_model_add(m, NULL, 2, &good, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_model_add(m, "b", 2, NULL, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(seldp_last_error(), "'b'"));
    seldp_tensor bad = good;
    bad.shape[0] = -1;
    assert_int_equal(seldp_model_add(m, "c", 3, &bad, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(seldp_last_error(), "'c'"));
    bad = good;
    bad.data = NULL;
    assert_int_equal(seldp_model_add(m, "d", 4, &bad, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    bad = good;
    bad.dtype = (seldp_dtype)-2;
    assert_int_equal(seldp_model_add(m, "e", 5, &bad, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_model_add(NULL, "f", 6, &good, false, NULL), SELDP_ERR_INVALID_ARGUMENT);
    /* An invalid tensor at a path that would be an alias is still an argument error. */
    assert_int_equal(seldp_model_add(m, "g", 1, &bad, false, NULL), SELDP_ERR_INVALID_ARGUMENT);

    assert_int_equal(seldp_model_count(m), 1);
    assert_string_equal(seldp_model_at(m, 0)->path, "a");
    assert_int_equal(seldp_model_rank(m), -1);
    assert_int_equal(seldp_model_create(0, NULL), SELDP_ERR_INVALID_ARGUMENT);

    /* NULL views are empty and harmless. */
    assert_int_equal(seldp_model_count(NULL), 0);
    assert_null(seldp_model_at(NULL, 0));
    assert_null(seldp_model_find_id(NULL, 1));
    seldp_model_destroy(NULL);
    seldp_model_destroy(m);
}

/* Random registration order, ids and aliases: the view always matches a simple model of
 * it, and every failing registration leaves it exactly as it was. */
static void test_random_against_reference(void **state)
{
    (void)state;
    enum { N = 400 };
    seldp_model *m = model_with(5);
    char paths[N][32];
    uint64_t ids[N];
    bool present[N] = {false};
    size_t count = 0;
    for (int step = 0; step < 2 * N; step++) {
        int i = (int)(tr_hash(11, (uint64_t)step) % N);
        snprintf(paths[i], sizeof paths[i], "p.%d.%d", i % 13, i);
        ids[i] = (uint64_t)(i % 50); /* ids shared by several paths: aliases */
        seldp_tensor t = vec((int)(ids[i] % 8), 3);
        t.shape[0] = 1 + (int64_t)(ids[i] % 16); /* same layout for the same id */
        seldp_status st = seldp_model_add(m, paths[i], ids[i], &t, false, NULL);
        if (present[i]) {
            assert_int_equal(st, SELDP_ERR_DUPLICATE);
        } else {
            assert_int_equal(st, SELDP_OK);
            present[i] = true;
            count++;
        }
        assert_int_equal(seldp_model_count(m), count);
    }
    assert_sorted(m);
    for (uint64_t id = 0; id < 50; id++) {
        size_t want = 0;
        const char *smallest = NULL;
        for (int i = 0; i < N; i++) {
            if (!present[i] || ids[i] != id)
                continue;
            want++;
            if (!smallest || strcmp(paths[i], smallest) < 0)
                smallest = paths[i];
        }
        assert_int_equal(seldp_model_aliases(m, id, NULL, 0), want);
        if (want)
            assert_string_equal(seldp_model_find_id(m, id)->path, smallest);
        else
            assert_null(seldp_model_find_id(m, id));
    }
    seldp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_order_and_lookup),
        cmocka_unit_test(test_paths_are_copied_and_pointers_stable),
        cmocka_unit_test(test_tied_aliases),
        cmocka_unit_test(test_alias_mismatches),
        cmocka_unit_test(test_duplicate_path),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_random_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
