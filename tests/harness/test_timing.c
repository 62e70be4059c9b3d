/* The split of a step's time (harness/core/timing.h): report.json gives every step's wall time by
 * phase (ranks, reference, check, other) with each phase's CPU time, the phases add up to the
 * step, and the step line names them. The run is the scale layout of results/bench/scale.sh
 * (many experts, top-8) on a small world, so it also pins that the FP64 reference routes and
 * differentiates a wide top-K as the ranks do. No assertion depends on how fast the machine
 * is. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "timing.h"

#define STEPS 2

static const char *const phases[] = {"ranks", "reference", "check", "other"};

static double number(const hx_json *object, const char *key, const char *where)
{
    const hx_json *v = hx_json_get(object, key);
    if (!v || v->type != HX_JSON_NUMBER)
        fail_msg("%s: no number \"%s\"", where, key);
    return v->number;
}

/* Spin until the wall clock has moved on by at least `s` seconds past `since`. */
static void spin_past(double since, double s)
{
    while (hx_now() < since + s)
        ;
}

static void phases_add_up_in_the_report(void **state)
{
    (void)state;
    hx_test_run run;
    const char *dir = hx_test_dir("report");
    hx_test_harness(&run, "--world 8 --ep 4 --experts 64 --top-k 8 --steps %d --out %s", STEPS,
                    dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("exited %d: %s%s", run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    int64_t tested = 0, failed = 0;
    hx_test_check(report, "tokens per expert equal the reference's", &tested, &failed);
    assert_int_equal(tested, (int64_t)STEPS * 2 * 64); /* steps x layers x experts */
    assert_int_equal(failed, 0);
    hx_test_check(report, "reduced gradients vs the FP64 reference", &tested, &failed);
    assert_true(tested > 0);
    assert_int_equal(failed, 0);
    const hx_json *steps = hx_json_get(report, "steps");
    assert_non_null(steps);
    assert_int_equal(steps->count, STEPS);
    for (size_t i = 0; i < steps->count; i++) {
        char where[64];
        snprintf(where, sizeof where, "steps[%zu].time_s", i);
        const hx_json *t = hx_json_get(&steps->items[i], "time_s");
        assert_non_null(t);
        const hx_json *cpu = hx_json_get(t, "cpu");
        if (!cpu || cpu->type != HX_JSON_OBJECT)
            fail_msg("%s: no object \"cpu\"", where);
        double sum = 0.0;
        for (size_t p = 0; p < sizeof phases / sizeof phases[0]; p++) {
            double wall = number(t, phases[p], where);
            const hx_json *c = hx_json_get(cpu, phases[p]);
            if (!c)
                fail_msg("%s.cpu: no \"%s\"", where, phases[p]);
            double user = number(c, "user", where), sys = number(c, "sys", where);
            if (!(wall >= 0.0 && user >= 0.0 && sys >= 0.0))
                fail_msg("%s.%s: wall %g, user %g, sys %g: negative", where, phases[p], wall, user,
                         sys);
            sum += wall;
        }
        double step = number(t, "step", where);
        if (fabs(sum - step) > 1e-9 * fmax(1.0, step))
            fail_msg("%s: the phases add up to %.9f s, the step took %.9f s", where, sum, step);
        /* every phase but "other" does work in each step: a hook that never charged its
         * phase would leave it at zero and move its time to "other" */
        for (size_t p = 0; p < 3; p++)
            if (!(number(t, phases[p], where) > 0.0))
                fail_msg("%s: phase \"%s\" has no time", where, phases[p]);
        const hx_json *ranks_cpu = hx_json_get(cpu, "ranks");
        if (!(number(ranks_cpu, "user", where) + number(ranks_cpu, "sys", where) > 0.0))
            fail_msg("%s.cpu.ranks: the ranks used no CPU", where);
    }
    hx_json_free(report);
    /* the step lines name the phases, in the report's order */
    for (int s = 1; s <= STEPS; s++) {
        char head[32];
        snprintf(head, sizeof head, "step %d/%d ", s, STEPS);
        const char *line = strstr(run.out, head);
        if (!line)
            fail_msg("no line '%s' in:\n%s", head, run.out);
        const char *end = strchr(line, '\n');
        const char *at = strstr(line, " ms (ranks ");
        if (!at || (end && at > end))
            fail_msg("'%.*s': no ' ms (ranks '", (int)(end ? end - line : 200), line);
        for (size_t p = 1; p < sizeof phases / sizeof phases[0]; p++) {
            char word[32];
            snprintf(word, sizeof word, ", %s ", phases[p]);
            const char *next = strstr(at, word);
            if (!next || (end && next > end))
                fail_msg("'%.*s': no '%s' after the previous phase", (int)(end ? end - line : 200),
                         line, word);
            at = next;
        }
    }
}

static void intervals_go_to_one_phase_each(void **state)
{
    (void)state;
    hx_step_split split;
    hx_split_start(&split);
    spin_past(split.mark.wall, 1e-3);
    double ranks = hx_split_charge(&split, HX_PHASE_RANKS);
    assert_true(ranks >= 1e-3);
    spin_past(split.mark.wall, 1e-3);
    double ref = hx_split_charge(&split, HX_PHASE_REFERENCE);
    spin_past(split.mark.wall, 1e-3);
    ref += hx_split_charge(&split, HX_PHASE_REFERENCE); /* a phase charged twice adds up */
    spin_past(split.mark.wall, 1e-3);
    double step = hx_split_finish(&split); /* the rest goes to "other" */
    assert_true(split.phase[HX_PHASE_RANKS].wall == ranks);
    assert_true(fabs(split.phase[HX_PHASE_REFERENCE].wall - ref) <= 1e-12);
    assert_true(ref >= 2e-3);
    assert_true(split.phase[HX_PHASE_CHECK].wall == 0.0);
    assert_true(split.phase[HX_PHASE_OTHER].wall >= 1e-3);
    double sum = 0.0;
    for (int p = 0; p < HX_PHASE_COUNT; p++) {
        sum += split.phase[p].wall;
        assert_true(split.phase[p].user >= 0.0 && split.phase[p].sys >= 0.0);
    }
    assert_true(step == sum);
    assert_true(step >= 4e-3);
}

static void step_line_words(void **state)
{
    (void)state;
    hx_step_split split = {0};
    split.phase[HX_PHASE_RANKS].wall = 21.25;
    split.phase[HX_PHASE_REFERENCE].wall = 0.25;
    split.phase[HX_PHASE_CHECK].wall = 0.0125;
    char buf[160];
    hx_split_describe(&split, buf, sizeof buf);
    assert_string_equal(buf, "ranks 21.2 s, reference 250.0 ms, check 12.5 ms, other 0.0 ms");
    /* a short buffer is cut, never overrun */
    char small[12];
    hx_split_describe(&split, small, sizeof small);
    assert_string_equal(small, "ranks 21.2 ");
    assert_string_equal(hx_phase_name(HX_PHASE_CHECK), "check");
    assert_string_equal(hx_phase_name(HX_PHASE_COUNT), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(intervals_go_to_one_phase_each),
        cmocka_unit_test(step_line_words),
        cmocka_unit_test(phases_add_up_in_the_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
