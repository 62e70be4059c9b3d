/* OpenBLAS's kernels (models/startup/blas_core.c, docs/environment.md OPENBLAS_CORETYPE): this
 * program, like every program that links OpenBLAS, runs the CPU's kernels, not the fallback of
 * a CPU model OpenBLAS does not know. Each case runs this program again as a child with a
 * chosen environment; the child prints the kernels it ran (tm_blas_core), its
 * OPENBLAS_CORETYPE and its arguments. Unset, the child runs the kernels of the CPU's
 * instruction sets (after starting again with the same arguments where OpenBLAS fell back);
 * set, even to the fallback itself, the child runs what it names and does not start again;
 * under valgrind's preload it never starts again. */
#define _GNU_SOURCE

#include <limits.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tinymoe.h"

static char self[PATH_MAX];

/* Whether the CPU has kernels better than Prescott's (AVX2 and FMA at least: blas_core.c
 * names SkylakeX or Haswell for it). */
static bool cpu_has_better(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

typedef struct child_report {
    char core[512], env[512], args[512];
} child_report;

/* Run this program as `--child a "b c"` under `env_prefix` (an env(1) argument list). */
static void run_child(const char *env_prefix, child_report *out)
{
    char cmd[PATH_MAX + 512];
    snprintf(cmd, sizeof cmd,
             "env -u OPENBLAS_CORETYPE -u LD_PRELOAD %s '%s' --child a 'b c' 2>/dev/null",
             env_prefix, self);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[512];
    memset(out, 0, sizeof *out);
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "core=", 5) == 0)
            snprintf(out->core, sizeof out->core, "%s", line + 5);
        else if (strncmp(line, "env=", 4) == 0)
            snprintf(out->env, sizeof out->env, "%s", line + 4);
        else if (strncmp(line, "args=", 5) == 0)
            snprintf(out->args, sizeof out->args, "%s", line + 5);
    }
    assert_int_equal(pclose(p), 0);
    if (!out->core[0])
        fail_msg("the child of `%s` printed no kernels", cmd);
    assert_string_equal(out->args, "a|b c|");
}

static void test_unset_runs_the_cpus_kernels(void **state)
{
    (void)state;
    child_report r;
    run_child("", &r);
    if (!cpu_has_better())
        skip(); /* no AVX2: OpenBLAS's own choice is the only one */
    if (strcmp(r.core, "Prescott") == 0)
        fail_msg("OPENBLAS_CORETYPE unset: the child ran Prescott's kernels on a CPU with AVX2");
    /* started again: with the kernels named in its environment, which are not the fallback */
    if (r.env[0]) {
        assert_string_equal(r.core, r.env);
        assert_true(strcmp(r.env, "SkylakeX") == 0 || strcmp(r.env, "Haswell") == 0);
    }
}

static void test_set_is_left_alone(void **state)
{
    (void)state;
    child_report r;
    run_child("OPENBLAS_CORETYPE=Prescott", &r);
    assert_string_equal(r.env, "Prescott");
    assert_string_equal(r.core, "Prescott");
    if (cpu_has_better()) {
        run_child("OPENBLAS_CORETYPE=Haswell", &r);
        assert_string_equal(r.env, "Haswell");
        assert_string_equal(r.core, "Haswell");
    }
}

static void test_valgrind_preload_is_not_left(void **state)
{
    (void)state;
    child_report r;
    /* a preload that does not exist: the loader says so (on stderr) and goes on */
    run_child("LD_PRELOAD=/nonexistent/vgpreload_core-amd64-linux.so", &r);
    if (r.env[0])
        fail_msg("under valgrind's preload the child started again (OPENBLAS_CORETYPE=%s)", r.env);
}

/* This process too: ctest runs it with the environment it has. */
static void test_this_program(void **state)
{
    (void)state;
    const char *env = getenv("OPENBLAS_CORETYPE");
    if (env) /* ctest's, or this program's own after starting again */
        assert_string_equal(tm_blas_core(), env);
    else if (cpu_has_better())
        assert_string_not_equal(tm_blas_core(), "Prescott");
    else
        skip();
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0) {
        const char *env = getenv("OPENBLAS_CORETYPE");
        printf("core=%s\nenv=%s\nargs=", tm_blas_core(), env ? env : "");
        for (int i = 2; i < argc; i++)
            printf("%s|", argv[i]);
        printf("\n");
        return 0;
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unset_runs_the_cpus_kernels),
        cmocka_unit_test(test_set_is_left_alone),
        cmocka_unit_test(test_valgrind_preload_is_not_left),
        cmocka_unit_test(test_this_program),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
