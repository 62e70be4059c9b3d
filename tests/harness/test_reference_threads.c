/* --reference-threads: the FP64 reference, its error scales and the checks, which run on the
 * same threads, and so every verdict are the same bits on 1 and on 3 threads, and from one run
 * to the next (the reductions' captured inputs are summed in whatever order the rank threads
 * arrive, and must not show it): report.json's checks (their first failures' texts included),
 * steps, tensor classes and groups compared value for value, times aside. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"

/* a and b equal, "time_s" members aside; the first difference into where */
static bool same(const hx_json *a, const hx_json *b, char *where, size_t size, const char *at)
{
    if (a->type != b->type) {
        snprintf(where, size, "%s: types differ", at);
        return false;
    }
    switch (a->type) {
    case HX_JSON_NUMBER:
        if (memcmp(&a->number, &b->number, sizeof a->number) != 0) {
            snprintf(where, size, "%s: %.17g against %.17g", at, a->number, b->number);
            return false;
        }
        return true;
    case HX_JSON_BOOL:
        return a->boolean == b->boolean;
    case HX_JSON_STRING:
        if (strcmp(a->string, b->string) != 0) {
            snprintf(where, size, "%s: \"%s\" against \"%s\"", at, a->string, b->string);
            return false;
        }
        return true;
    case HX_JSON_ARRAY:
    case HX_JSON_OBJECT:
        if (a->count != b->count) {
            snprintf(where, size, "%s: %zu members against %zu", at, a->count, b->count);
            return false;
        }
        for (size_t i = 0; i < a->count; i++) {
            char sub[256];
            if (a->type == HX_JSON_OBJECT) {
                if (strcmp(a->keys[i], "time_s") == 0)
                    continue;
                snprintf(sub, sizeof sub, "%s.%s", at, a->keys[i]);
            } else {
                snprintf(sub, sizeof sub, "%s[%zu]", at, i);
            }
            if (!same(&a->items[i], &b->items[i], where, size, sub))
                return false;
        }
        return true;
    default:
        return true;
    }
}

static hx_json *run_expecting(const char *layout, int threads, const char *name, int status)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", hx_test_dir(name));
    hx_test_run run;
    hx_test_harness(&run, "%s --reference-threads %d --quiet --out %s", layout, threads, dir);
    if (run.status != status)
        fail_msg("%s --reference-threads %d: exit %d\n%s%s", layout, threads, run.status, run.err,
                 run.out);
    return hx_test_report(dir);
}

static void compare_expecting(const char *layout, int status)
{
    hx_json *one = run_expecting(layout, 1, "one", status);
    hx_json *again = run_expecting(layout, 1, "again", status);
    hx_json *three = run_expecting(layout, 3, "three", status);
    static const char *const parts[] = {"checks", "steps", "tensor_classes", "groups",
                                        "expert_tokens"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        char where[512] = "";
        const hx_json *a = hx_json_get(one, parts[i]);
        assert_non_null(a);
        if (!same(a, hx_json_get(again, parts[i]), where, sizeof where, parts[i]))
            fail_msg("%s: two runs on one thread differ at %s", layout, where);
        if (!same(a, hx_json_get(three, parts[i]), where, sizeof where, parts[i]))
            fail_msg("%s: one thread and three differ at %s", layout, where);
    }
    hx_json_free(one);
    hx_json_free(again);
    hx_json_free(three);
}

static void compare(const char *layout)
{
    compare_expecting(layout, HX_EXIT_PASS);
}

static void many_experts(void **state)
{
    (void)state;
    compare("--world 16 --ep 8 --experts 32 --top-k 4 --steps 2 --aux-loss-coeff 0.01");
}

static void framework_grid(void **state)
{
    (void)state;
    compare("--framework megatron --world 16 --tp 2 --pp 2 --ep 2 --shared-expert-ff 64 "
            "--steps 2");
}

/* The post-step check of AdamW with clipping and FP32 masters, rank by rank on the threads. */
static void optimizer_step(void **state)
{
    (void)state;
    compare("--world 8 --ep 4 --experts 16 --steps 2 --optimizer adamw --clip-grad 0.5 --dtype "
            "bf16 --fp32-master");
}

/* A failing run: which failure each check names first, and every count, whatever the threads
 * the checks ran on. */
static void planted_bug(void **state)
{
    (void)state;
    compare_expecting("--world 8 --ep 4 --experts 16 --steps 2 --inject ep-scale", HX_EXIT_FAIL);
    compare_expecting("--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --steps 1 --inject "
                      "shared-expert-tp --shared-expert-ff 32",
                      HX_EXIT_FAIL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_experts),
        cmocka_unit_test(framework_grid),
        cmocka_unit_test(optimizer_step),
        cmocka_unit_test(planted_bug),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
