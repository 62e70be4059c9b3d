/* cuBLAS is loaded when the first GPU rank needs it (models/cuda/tmc_cublas.h), not linked:
 * before the first call no cuBLAS is mapped into the process (so host-only rank threads carry
 * none of its thread-local storage); the first call, from many threads at once, loads it once
 * and hands every thread the same complete table; later calls return that table. Runs without
 * a GPU (loading a library needs no device). */
#define _GNU_SOURCE

#include <link.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "cuda/tmc_cublas.h"

static int count_cublas(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libcublas"))
        (*(int *)data)++;
    return 0;
}

static int cublas_objects(void)
{
    int n = 0;
    dl_iterate_phdr(count_cublas, &n);
    return n;
}

enum { THREADS = 8 };

static void *fetch(void *arg)
{
    *(const tmc_cublas **)arg = tmc_cublas_api(NULL);
    return NULL;
}

static void test_loaded_on_first_use_once(void **state)
{
    (void)state;
    assert_int_equal(cublas_objects(), 0); /* not linked */
    pthread_t t[THREADS];
    const tmc_cublas *got[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, fetch, &got[i]), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    const char *why = "unset";
    const tmc_cublas *api = tmc_cublas_api(&why);
    if (!api)
        fail_msg("%s", why);
    assert_null(why);
    for (int i = 0; i < THREADS; i++)
        assert_ptr_equal(got[i], api);
    assert_true(cublas_objects() >= 1);
    assert_non_null(api->create);
    assert_non_null(api->destroy);
    assert_non_null(api->set_stream);
    assert_non_null(api->set_math_mode);
    assert_non_null(api->sgemm);
    assert_non_null(api->status_string);
    /* the entry points are cuBLAS's own: it names its statuses */
    const char *ok = api->status_string(CUBLAS_STATUS_SUCCESS);
    const char *uninit = api->status_string(CUBLAS_STATUS_NOT_INITIALIZED);
    assert_non_null(ok);
    assert_non_null(uninit);
    assert_true(ok[0] != '\0' && strcmp(ok, uninit) != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loaded_on_first_use_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
