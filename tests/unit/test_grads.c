/* gradient container: sorted entries, ownership, partition by a selection, merge of
 * disjoint containers, and that failures change nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"
#include "seldp/seldp.h"

static float borrowed[16][4];

static seldp_tensor borrowed_tensor(int i)
{
    int64_t n = 4;
    return seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, borrowed[i], 1, &n);
}

/* An F32 [n] tensor allocated by seldp and filled with `value`. */
static seldp_tensor owned_tensor(int64_t n, float value)
{
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, NULL, 1, &n);
    assert_int_equal(seldp_tensor_alloc(&t), SELDP_OK);
    for (int64_t i = 0; i < n; i++)
        ((float *)t.data)[i] = value;
    return t;
}

static seldp_grads *new_grads(void)
{
    seldp_grads *g = NULL;
    assert_int_equal(seldp_grads_create(&g), SELDP_OK);
    assert_non_null(g);
    return g;
}

/* The container's ids, in order, are exactly `ids`. */
static void assert_ids(const seldp_grads *g, const seldp_param_id *ids, size_t n)
{
    assert_int_equal(seldp_grads_count(g), n);
    for (size_t i = 0; i < n; i++) {
        seldp_param_id id = 0;
        const seldp_tensor *t = NULL;
        assert_true(seldp_grads_at(g, i, &id, &t));
        if (id != ids[i])
            fail_msg("entry %zu has id %llu, expected %llu", i, (unsigned long long)id,
                     (unsigned long long)ids[i]);
        assert_ptr_equal(seldp_grads_get(g, id), t);
    }
    assert_false(seldp_grads_at(g, n, NULL, NULL));
}

static void test_put_get_order(void **state)
{
    (void)state;
    seldp_grads *g = new_grads();
    const seldp_param_id order[] = {42, 7, UINT64_MAX, 0, 19};
    for (int i = 0; i < 5; i++) {
        seldp_tensor t = borrowed_tensor(i);
        assert_int_equal(seldp_grads_put(g, order[i], &t, SELDP_BORROWED), SELDP_OK);
    }
    const seldp_param_id sorted[] = {0, 7, 19, 42, UINT64_MAX};
    assert_ids(g, sorted, 5);
    assert_ptr_equal(seldp_grads_get(g, 42)->data, borrowed[0]);
    assert_ptr_equal(seldp_grads_get(g, UINT64_MAX)->data, borrowed[2]);
    assert_null(seldp_grads_get(g, 8));
    assert_int_equal(seldp_grads_ownership(g, 7), SELDP_BORROWED);
    assert_int_equal(seldp_grads_ownership(g, 8), SELDP_BORROWED); /* absent */

    /* Duplicate id: nothing changes. */
    seldp_tensor other = borrowed_tensor(9);
    assert_int_equal(seldp_grads_put(g, 42, &other, SELDP_BORROWED), SELDP_ERR_DUPLICATE);
    assert_non_null(strstr(seldp_last_error(), "42"));
    assert_ptr_equal(seldp_grads_get(g, 42)->data, borrowed[0]);
    assert_int_equal(seldp_grads_count(g), 5);

    /* Invalid tensors and arguments are rejected. */
    seldp_tensor bad = borrowed_tensor(9);
    bad.shape[0] = -4;
    assert_int_equal(seldp_grads_put(g, 100, &bad, SELDP_BORROWED), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_grads_put(g, 100, NULL, SELDP_BORROWED), SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_grads_put(g, 100, &other, (seldp_ownership)7),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_int_equal(seldp_grads_put(NULL, 100, &other, SELDP_BORROWED),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(seldp_grads_get(g, 100));
    assert_ids(g, sorted, 5);
    seldp_grads_destroy(g); /* borrowed bytes are not freed (ASan would report it) */
    seldp_grads_destroy(NULL);
    assert_int_equal(seldp_grads_count(NULL), 0);
}

static void test_ownership_take_remove(void **state)
{
    (void)state;
    seldp_grads *g = new_grads();
    seldp_tensor own = owned_tensor(3, 1.5f);
    void *own_data = own.data;
    assert_int_equal(seldp_grads_put(g, 1, &own, SELDP_OWNED), SELDP_OK);
    seldp_tensor b = borrowed_tensor(0);
    assert_int_equal(seldp_grads_put(g, 2, &b, SELDP_BORROWED), SELDP_OK);
    seldp_tensor own2 = owned_tensor(2, 2.5f);
    assert_int_equal(seldp_grads_put(g, 3, &own2, SELDP_OWNED), SELDP_OK);
    /* A failing owned put leaves ownership with the caller. */
    seldp_tensor own3 = owned_tensor(2, 3.5f);
    assert_int_equal(seldp_grads_put(g, 3, &own3, SELDP_OWNED), SELDP_ERR_DUPLICATE);
    seldp_tensor_free(&own3);

    assert_int_equal(seldp_grads_ownership(g, 1), SELDP_OWNED);
    assert_int_equal(seldp_grads_ownership(g, 2), SELDP_BORROWED);

    seldp_tensor taken;
    seldp_ownership how = SELDP_BORROWED;
    assert_true(seldp_grads_take(g, 1, &taken, &how));
    assert_int_equal(how, SELDP_OWNED);
    assert_ptr_equal(taken.data, own_data);
    assert_true(((float *)taken.data)[2] == 1.5f);
    assert_null(seldp_grads_get(g, 1));
    assert_false(seldp_grads_take(g, 1, &taken, &how));
    seldp_tensor_free(&taken); /* ours now */

    assert_true(seldp_grads_remove(g, 3)); /* frees the owned bytes */
    assert_false(seldp_grads_remove(g, 3));
    assert_true(seldp_grads_remove(g, 2)); /* borrowed: bytes stay */
    borrowed[0][0] = 9.0f;
    assert_int_equal(seldp_grads_count(g), 0);

    seldp_tensor last = owned_tensor(8, 0.0f);
    assert_int_equal(seldp_grads_put(g, 77, &last, SELDP_OWNED), SELDP_OK);
    seldp_grads_destroy(g); /* frees the owned entry */
}

static void test_partition(void **state)
{
    (void)state;
    seldp_grads *g = new_grads();
    for (int i = 0; i < 8; i++) {
        seldp_tensor t = i % 2 ? owned_tensor(1 + i, (float)i) : borrowed_tensor(i);
        assert_int_equal(
            seldp_grads_put(g, (seldp_param_id)(10 * i), &t, i % 2 ? SELDP_OWNED : SELDP_BORROWED),
            SELDP_OK);
    }
    /* Unsorted, with a duplicate and ids the container does not hold. */
    const seldp_param_id ids[] = {70, 5, 20, 30, 20, 1000, 0};
    seldp_grads *sel = NULL, *rest = NULL;
    assert_int_equal(seldp_grads_partition(g, ids, 7, &sel, &rest), SELDP_OK);
    const seldp_param_id want_sel[] = {0, 20, 30, 70}, want_rest[] = {10, 40, 50, 60};
    assert_ids(sel, want_sel, 4);
    assert_ids(rest, want_rest, 4);
    assert_int_equal(seldp_grads_count(g), 0);
    /* Ownership and tensors move with their entries. */
    assert_int_equal(seldp_grads_ownership(sel, 70), SELDP_OWNED);
    assert_true(((float *)seldp_grads_get(sel, 70)->data)[7] == 7.0f);
    assert_int_equal(seldp_grads_ownership(sel, 20), SELDP_BORROWED);
    assert_ptr_equal(seldp_grads_get(sel, 20)->data, borrowed[2]);
    assert_int_equal(seldp_grads_ownership(rest, 10), SELDP_OWNED);
    assert_int_equal(seldp_grads_ownership(rest, 40), SELDP_BORROWED);

    /* Merging back restores the original container. */
    assert_int_equal(seldp_grads_merge(g, sel), SELDP_OK);
    assert_int_equal(seldp_grads_merge(g, rest), SELDP_OK);
    const seldp_param_id all[] = {0, 10, 20, 30, 40, 50, 60, 70};
    assert_ids(g, all, 8);
    assert_int_equal(seldp_grads_count(sel), 0);
    assert_int_equal(seldp_grads_count(rest), 0);
    assert_int_equal(seldp_grads_ownership(g, 50), SELDP_OWNED);
    seldp_grads_destroy(sel);
    seldp_grads_destroy(rest);

    /* An empty selection: everything is untouched. */
    assert_int_equal(seldp_grads_partition(g, NULL, 0, &sel, &rest), SELDP_OK);
    assert_int_equal(seldp_grads_count(sel), 0);
    assert_ids(rest, all, 8);
    assert_int_equal(seldp_grads_count(g), 0);
    /* An empty container partitions into two empty ones. */
    seldp_grads *sel2 = NULL, *rest2 = NULL;
    assert_int_equal(seldp_grads_partition(g, ids, 7, &sel2, &rest2), SELDP_OK);
    assert_int_equal(seldp_grads_count(sel2) + seldp_grads_count(rest2), 0);
    seldp_grads_destroy(sel2);
    seldp_grads_destroy(rest2);

    /* Bad arguments create nothing and leave the container alone. */
    sel2 = rest2 = NULL;
    assert_int_equal(seldp_grads_partition(rest, NULL, 3, &sel2, &rest2),
                     SELDP_ERR_INVALID_ARGUMENT);
    assert_null(sel2);
    assert_null(rest2);
    assert_int_equal(seldp_grads_partition(rest, ids, 7, NULL, &rest2), SELDP_ERR_INVALID_ARGUMENT);
    assert_ids(rest, all, 8);
    seldp_grads_destroy(sel);
    seldp_grads_destroy(rest); /* frees the owned ones */
    seldp_grads_destroy(g);
}

static void test_merge_overlap(void **state)
{
    (void)state;
    seldp_grads *a = new_grads(), *b = new_grads();
    const seldp_param_id ida[] = {1, 5, 9}, idb[] = {2, 5, 12};
    for (int i = 0; i < 3; i++) {
        seldp_tensor t = borrowed_tensor(i), u = borrowed_tensor(3 + i);
        assert_int_equal(seldp_grads_put(a, ida[i], &t, SELDP_BORROWED), SELDP_OK);
        assert_int_equal(seldp_grads_put(b, idb[i], &u, SELDP_BORROWED), SELDP_OK);
    }
    assert_int_equal(seldp_grads_merge(a, b), SELDP_ERR_DUPLICATE);
    assert_non_null(strstr(seldp_last_error(), "5"));
    assert_ids(a, ida, 3);
    assert_ids(b, idb, 3);
    assert_ptr_equal(seldp_grads_get(a, 5)->data, borrowed[1]);
    assert_ptr_equal(seldp_grads_get(b, 5)->data, borrowed[4]);

    /* Remove the overlap and merge. */
    assert_true(seldp_grads_remove(b, 5));
    assert_int_equal(seldp_grads_merge(a, b), SELDP_OK);
    const seldp_param_id merged[] = {1, 2, 5, 9, 12};
    assert_ids(a, merged, 5);
    assert_int_equal(seldp_grads_count(b), 0);
    assert_ptr_equal(seldp_grads_get(a, 12)->data, borrowed[5]);

    /* Merging an empty container, into an empty one, into itself. */
    assert_int_equal(seldp_grads_merge(a, b), SELDP_OK);
    assert_ids(a, merged, 5);
    assert_int_equal(seldp_grads_merge(b, a), SELDP_OK);
    assert_ids(b, merged, 5);
    assert_int_equal(seldp_grads_count(a), 0);
    assert_int_equal(seldp_grads_merge(b, b), SELDP_ERR_DUPLICATE);
    assert_ids(b, merged, 5);
    assert_int_equal(seldp_grads_merge(a, a), SELDP_OK);
    assert_int_equal(seldp_grads_merge(NULL, a), SELDP_ERR_INVALID_ARGUMENT);
    seldp_grads_destroy(a);
    seldp_grads_destroy(b);
}

/* Many random ids against a simple reference: partition puts every entry on the right
 * side, in order, exactly once. */
static void test_random_partition(void **state)
{
    (void)state;
    enum { N = 500, SEL = 200 };
    seldp_grads *g = new_grads();
    bool in[N] = {false}, selected[N] = {false};
    seldp_param_id ids[SEL];
    size_t count = 0;
    for (int i = 0; i < N; i++) {
        int id = (int)(tr_hash(3, (uint64_t)i) % N);
        seldp_tensor t = borrowed_tensor(id % 16);
        seldp_status st = seldp_grads_put(g, (seldp_param_id)id, &t, SELDP_BORROWED);
        assert_int_equal(st, in[id] ? SELDP_ERR_DUPLICATE : SELDP_OK);
        count += !in[id];
        in[id] = true;
    }
    for (int i = 0; i < SEL; i++) {
        ids[i] = tr_hash(4, (uint64_t)i) % (2 * N);
        if (ids[i] < N)
            selected[ids[i]] = true;
    }
    seldp_grads *sel = NULL, *rest = NULL;
    assert_int_equal(seldp_grads_partition(g, ids, SEL, &sel, &rest), SELDP_OK);
    assert_int_equal(seldp_grads_count(sel) + seldp_grads_count(rest), count);
    seldp_param_id prev = 0;
    for (size_t i = 0; i < seldp_grads_count(sel); i++) {
        seldp_param_id id;
        assert_true(seldp_grads_at(sel, i, &id, NULL));
        assert_true(in[id] && selected[id]);
        assert_true(i == 0 || id > prev);
        prev = id;
    }
    for (size_t i = 0; i < seldp_grads_count(rest); i++) {
        seldp_param_id id;
        assert_true(seldp_grads_at(rest, i, &id, NULL));
        assert_true(in[id] && !selected[id]);
        assert_true(i == 0 || id > prev);
        prev = id;
    }
    seldp_grads_destroy(sel);
    seldp_grads_destroy(rest);
    seldp_grads_destroy(g);
}

/* reserve: room for n more entries; an impossible request fails and changes nothing. */
static void test_reserve(void **state)
{
    (void)state;
    seldp_grads *g = new_grads();
    seldp_tensor a = borrowed_tensor(0), b = borrowed_tensor(1);
    assert_int_equal(seldp_grads_put(g, 5, &a, SELDP_BORROWED), SELDP_OK);
    assert_int_equal(seldp_grads_reserve(g, 100), SELDP_OK);
    assert_ids(g, (const seldp_param_id[]){5}, 1);
    assert_ptr_equal(seldp_grads_get(g, 5)->data, borrowed[0]);
    assert_int_equal(seldp_grads_reserve(g, SIZE_MAX), SELDP_ERR_NOMEM);
    assert_non_null(strstr(seldp_last_error(), "reserv"));
    assert_ids(g, (const seldp_param_id[]){5}, 1);
    for (seldp_param_id id = 100; id < 200; id++)
        assert_int_equal(seldp_grads_put(g, id, id == 150 ? &b : &a, SELDP_BORROWED), SELDP_OK);
    assert_int_equal(seldp_grads_count(g), 101);
    assert_ptr_equal(seldp_grads_get(g, 150)->data, borrowed[1]);
    assert_int_equal(seldp_grads_reserve(g, 0), SELDP_OK);
    assert_int_equal(seldp_grads_reserve(NULL, 1), SELDP_ERR_INVALID_ARGUMENT);
    seldp_grads_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_order),    cmocka_unit_test(test_ownership_take_remove),
        cmocka_unit_test(test_partition),        cmocka_unit_test(test_merge_overlap),
        cmocka_unit_test(test_random_partition), cmocka_unit_test(test_reserve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
