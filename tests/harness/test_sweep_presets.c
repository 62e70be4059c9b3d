/* The sweep presets on a framework's grid (sweep_entries.h): --sweep ep under Megatron with
 * --tp 2 sweeps Megatron's orders (ep inside and outside dp) and leaves out what the framework
 * refuses and what repeats a layout; worlds leaves out the worlds the grid does not fit; the
 * frameworks preset keeps each framework and drops only its own repeats; a sweep file's
 * objects become the runs' options. The entries only: nothing is trained here. */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness_test.h"
#include "interop_test.h"
#include "options.h"
#include "sweep_entries.h"

typedef struct entries {
    hx_sweep s;
    char *out, *err;
    bool ok;
} entries;

static void build(entries *e, const char *name, const char *args)
{
    char line[1024];
    snprintf(line, sizeof line, "seldp-harness %s", args);
    char *argv[64];
    int argc = 0;
    for (char *tok = strtok(line, " "); tok && argc < 63; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    static hx_options base;
    hx_options_default(&base);
    FILE *null = fopen("/dev/null", "w");
    assert_int_equal(hx_options_parse(argc, argv, &base, null, null), HX_PARSE_RUN);
    fclose(null);
    memset(e, 0, sizeof *e);
    e->s.name = name;
    size_t no, ne;
    FILE *out = open_memstream(&e->out, &no), *err = open_memstream(&e->err, &ne);
    e->ok = hx_sweep_entries(&e->s, &base, out, err);
    fclose(out);
    fclose(err);
}

static void done(entries *e)
{
    for (int i = 0; i < e->s.n; i++)
        for (int a = 0; a < e->s.entries[i].n_args; a++)
            free(e->s.entries[i].args[a]);
    free(e->s.entries);
    free(e->out);
    free(e->err);
}

/* The options run i adds, as one string: "--ep 2 --order tp-cp-ep-dp-pp". */
static void args_of(const entries *e, int i, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int a = 0; a < e->s.entries[i].n_args && at < size; a++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s", a ? " " : "", e->s.entries[i].args[a]);
}

static void expect_runs(const entries *e, const char *const *expected, int n)
{
    char text[256];
    if (!e->ok)
        fail_msg("refused: %s", e->err);
    for (int i = 0; i < e->s.n && i < n; i++) {
        args_of(e, i, text, sizeof text);
        if (strcmp(text, expected[i]) != 0)
            fail_msg("run %d: '%s', expected '%s'\n%s", i + 1, text, expected[i], e->out);
    }
    if (e->s.n != n)
        fail_msg("%d runs, expected %d:\n%s", e->s.n, n, e->out);
}

static void ep_on_a_megatron_grid(void **state)
{
    (void)state;
    entries e;
    build(&e, "ep", "--framework megatron --world 8 --tp 2");
    static const char *const runs[] = {
        "--ep 1 --order tp-cp-ep-dp-pp", "--ep 2 --order tp-cp-ep-dp-pp",
        "--ep 2 --order tp-cp-dp-ep-pp", "--ep 4 --order tp-cp-ep-dp-pp"};
    expect_runs(&e, runs, 4);
    it_has(e.out, "sweep ep: leaves out world 8, ep 1 tp-cp-dp-ep-pp: the same groups as run 1",
           "notes");
    it_has(e.out, "sweep ep: leaves out world 8, ep 4 tp-cp-dp-ep-pp: the same groups as run 4",
           "notes");
    it_has(e.out,
           "ep 8 tp-cp-ep-dp-pp: layout megatron (world 8, tp 2, pp 1, cp 1, ep 8, order "
           "tp-cp-ep-dp-pp): world_size (8) is not divisible by "
           "expert_tensor_model_pipeline_parallel size (16)",
           "notes");
    done(&e);
}

static void ep_without_a_grid(void **state)
{
    (void)state;
    entries e;
    build(&e, "ep", "--world 8");
    static const char *const plain[] = {"--ep 1 --order ep-dp", "--ep 2 --order ep-dp",
                                        "--ep 2 --order dp-ep", "--ep 4 --order ep-dp",
                                        "--ep 4 --order dp-ep", "--ep 8 --order ep-dp"};
    expect_runs(&e, plain, 6);
    done(&e);
    /* torchtitan has one mesh: one run per ep it accepts */
    build(&e, "ep", "--framework torchtitan --world 8 --tp 2");
    static const char *const titan[] = {"--ep 1", "--ep 2", "--ep 4", "--ep 8"};
    expect_runs(&e, titan, 4);
    done(&e);
}

static void worlds_on_a_grid(void **state)
{
    (void)state;
    entries e;
    build(&e, "worlds", "--framework megatron --tp 2 --ep 2");
    static const char *const runs[] = {"--world 2 --ep 1", "--world 4 --ep 2", "--world 8 --ep 2"};
    expect_runs(&e, runs, 3);
    it_has(e.out, "sweep worlds: leaves out world 1, ep 1: layout megatron (world 1, tp 2",
           "notes");
    done(&e);
}

static void frameworks_keep_each_framework(void **state)
{
    (void)state;
    entries e;
    build(&e, "frameworks", "--world 8 --ep 4");
    assert_true(e.ok);
    assert_int_equal(e.s.n, 7); /* at tp 1 the frameworks agree, and each is kept */
    done(&e);
    build(&e, "frameworks", "--world 8 --ep 4 --cp 2");
    assert_true(e.ok);
    it_has(e.out, "leaves out world 8, ep 4, deepspeed ep-dp: layout deepspeed", "notes");
    it_has(e.out, "have no context parallelism", "notes");
    done(&e);
    /* nothing fits: one line, no runs */
    build(&e, "ep", "--framework deepspeed --world 8 --cp 2");
    assert_false(e.ok);
    it_has(e.err,
           "--sweep ep: no layout of the preset fits world 8, 8 experts and the command "
           "line's grid (tp 1, pp 1, cp 2)",
           "stderr");
    done(&e);
}

static void sweep_file_text(void **state)
{
    (void)state;
    hx_sweep s = {.name = "runs.json"};
    const char *text = "[{\"ep\": 2, \"order\": \"tp-dp-ep\", \"name\": \"partial order\"},\n"
                       " {\"framework\": \"deepspeed\", \"fp32-master\": true}]";
    FILE *err = fopen("/dev/null", "w");
    assert_true(hx_sweep_file_parse(&s, text, strlen(text), err));
    fclose(err);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.entries[0].label, "partial order");
    assert_int_equal(s.entries[0].n_args, 4);
    assert_string_equal(s.entries[0].args[3], "tp-dp-ep");
    assert_string_equal(s.entries[1].args[2], "--fp32-master");
    for (int i = 0; i < s.n; i++)
        for (int a = 0; a < s.entries[i].n_args; a++)
            free(s.entries[i].args[a]);
    free(s.entries);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ep_on_a_megatron_grid), cmocka_unit_test(ep_without_a_grid),
        cmocka_unit_test(worlds_on_a_grid),      cmocka_unit_test(frameworks_keep_each_framework),
        cmocka_unit_test(sweep_file_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
