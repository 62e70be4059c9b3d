/* The environment table (src/env.h): every row is complete, read by the file it names and
 * listed in docs/environment.md; no other C file of src/, harness/ or models/ calls getenv;
 * each kind's reader takes what docs/environment.md says and nothing else. */
#define _XOPEN_SOURCE 700

#include <ftw.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "env.h"

#ifndef SELDP_SOURCE_DIR
#error "SELDP_SOURCE_DIR: the repository's root"
#endif

/* A whole file, NUL-terminated (the test fails when it cannot be read). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

/* The row's enumerator as the reading file spells it: SELDP__ENV_ and the name without
 * its SELDP_ prefix. */
static void enumerator(const char *name, char *buf, size_t size)
{
    const char *rest = strncmp(name, "SELDP_", 6) == 0 ? name + 6 : name;
    snprintf(buf, size, "SELDP__ENV_%s", rest);
}

static void test_every_row_is_complete_read_and_documented(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/environment.md", SELDP_SOURCE_DIR);
    char *doc = slurp(path);
    for (int i = 0; i < SELDP__ENV_COUNT; i++) {
        const seldp__env_var *v = &seldp__env_vars[i];
        if (!v->name || !v->name[0] || !v->read_by)
            fail_msg("row %d: no name or reader", i);
        for (int k = 0; k < i; k++)
            if (strcmp(seldp__env_vars[k].name, v->name) == 0)
                fail_msg("%s: two rows", v->name);
        switch (v->kind) {
        case SELDP__ENV_CHOICE:
            if (!v->choices || !v->choices[0])
                fail_msg("%s: a choice without names", v->name);
            break;
        case SELDP__ENV_NUMBER:
            if (v->min < 1 || v->min > v->max)
                fail_msg("%s: range [%llu, %llu]", v->name, v->min, v->max);
            break;
        case SELDP__ENV_FLAG:
        case SELDP__ENV_PRESENT:
            break;
        default:
            fail_msg("%s: kind %d", v->name, (int)v->kind);
        }
        char quoted[128];
        snprintf(quoted, sizeof quoted, "`%s`", v->name);
        if (!strstr(doc, quoted))
            fail_msg("%s: not in docs/environment.md", v->name);
        snprintf(path, sizeof path, "%s/%s", SELDP_SOURCE_DIR, v->read_by);
        char *reader = slurp(path), id[128];
        enumerator(v->name, id, sizeof id);
        if (!strstr(reader, id))
            fail_msg("%s: %s does not read %s", v->name, v->read_by, id);
        free(reader);
    }
    free(doc);
}

static int getenv_calls;
static char getenv_where[4096];

static int scan(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    size_t n = strlen(path);
    bool c = n > 2 && (strcmp(path + n - 2, ".c") == 0 || strcmp(path + n - 2, ".h") == 0 ||
                       (n > 3 && strcmp(path + n - 3, ".cu") == 0));
    if (type != FTW_F || !c || strstr(path, "/src/env.c"))
        return 0;
    char *text = slurp(path);
    if (strstr(text, "getenv(") || strstr(text, "secure_getenv(")) {
        getenv_calls++;
        size_t used = strlen(getenv_where);
        snprintf(getenv_where + used, sizeof getenv_where - used, " %s", path);
    }
    free(text);
    return 0;
}

/* One table: nothing but src/env.c reads the environment. */
static void test_no_other_file_calls_getenv(void **state)
{
    (void)state;
    static const char *const trees[] = {"src", "harness", "models"};
    for (size_t i = 0; i < sizeof trees / sizeof trees[0]; i++) {
        char root[1024];
        snprintf(root, sizeof root, "%s/%s", SELDP_SOURCE_DIR, trees[i]);
        assert_int_equal(nftw(root, scan, 16, FTW_PHYS), 0);
    }
    if (getenv_calls)
        fail_msg("getenv outside src/env.c:%s", getenv_where);
}

static void set(const char *name, const char *value)
{
    if (value)
        assert_int_equal(setenv(name, value, 1), 0);
    else
        assert_int_equal(unsetenv(name), 0);
}

static void test_choice(void **state)
{
    (void)state;
    static const struct {
        const char *value;
        int index;
    } cases[] = {{NULL, -1},     {"", -1},      {"fused", 0},   {"bucketed", 1}, {"auto", 2},
                 {"fused ", -2}, {"FUSED", -2}, {"bucket", -2}, {"fusedx", -2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set("SELDP_REDUCE_PATH", cases[i].value);
        if (seldp__env_choice(SELDP__ENV_REDUCE_PATH) != cases[i].index)
            fail_msg("SELDP_REDUCE_PATH='%s': %d, expected %d",
                     cases[i].value ? cases[i].value : "(unset)",
                     seldp__env_choice(SELDP__ENV_REDUCE_PATH), cases[i].index);
    }
    set("SELDP_REDUCE_PATH", "x");
    assert_string_equal(seldp__env_text(SELDP__ENV_REDUCE_PATH), "x");
    set("SELDP_REDUCE_PATH", "");
    assert_null(seldp__env_text(SELDP__ENV_REDUCE_PATH));
    set("SELDP_REDUCE_PATH", NULL);
}

static void test_flag(void **state)
{
    (void)state;
    /* off by default: the collectives' agreement */
    set("SELDP_DEBUG_COLLECTIVES", NULL);
    assert_false(seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES));
    set("SELDP_DEBUG_COLLECTIVES", "");
    assert_false(seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES));
    set("SELDP_DEBUG_COLLECTIVES", "0");
    assert_false(seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES));
    set("SELDP_DEBUG_COLLECTIVES", "1");
    assert_true(seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES));
    set("SELDP_DEBUG_COLLECTIVES", "yes");
    assert_true(seldp__env_flag(SELDP__ENV_DEBUG_COLLECTIVES));
    set("SELDP_DEBUG_COLLECTIVES", NULL);
    /* on by default: the benchmark's pinning */
    set("SELDP_BENCH_PIN", NULL);
    assert_true(seldp__env_flag(SELDP__ENV_BENCH_PIN));
    set("SELDP_BENCH_PIN", "");
    assert_true(seldp__env_flag(SELDP__ENV_BENCH_PIN));
    set("SELDP_BENCH_PIN", "0");
    assert_false(seldp__env_flag(SELDP__ENV_BENCH_PIN));
    set("SELDP_BENCH_PIN", NULL);
}

static void test_number(void **state)
{
    (void)state;
    static const struct {
        const char *value;
        bool ok;
        unsigned long long n;
    } cases[] = {{NULL, false, 0},
                 {"", false, 0},
                 {"4096", true, 4096},
                 {"1", true, 1},
                 {"1073741824", true, 1073741824ull},
                 {"1073741825", false, 0},
                 {"0", false, 0},
                 {"-1", false, 0},
                 {"+5", false, 0},
                 {" 5", false, 0},
                 {"5 ", false, 0},
                 {"12k", false, 0},
                 {"99999999999999999999999", false, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set("SELDP_MPI_MAX_MESSAGE", cases[i].value);
        unsigned long long n = 7;
        bool ok = seldp__env_number(SELDP__ENV_MPI_MAX_MESSAGE, &n);
        if (ok != cases[i].ok || (ok && n != cases[i].n) || (!ok && n != 7))
            fail_msg("SELDP_MPI_MAX_MESSAGE='%s': %d %llu, expected %d %llu",
                     cases[i].value ? cases[i].value : "(unset)", ok, n, cases[i].ok, cases[i].n);
    }
    set("SELDP_MPI_MAX_MESSAGE", NULL);
}

static void test_present(void **state)
{
    (void)state;
    set("PMIX_RANK", NULL);
    assert_false(seldp__env_present(SELDP__ENV_PMIX_RANK));
    set("PMIX_RANK", "");
    assert_false(seldp__env_present(SELDP__ENV_PMIX_RANK));
    set("PMIX_RANK", "0"); /* rank 0 is a rank */
    assert_true(seldp__env_present(SELDP__ENV_PMIX_RANK));
    set("PMIX_RANK", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_is_complete_read_and_documented),
        cmocka_unit_test(test_no_other_file_calls_getenv),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_flag),
        cmocka_unit_test(test_number),
        cmocka_unit_test(test_present),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
