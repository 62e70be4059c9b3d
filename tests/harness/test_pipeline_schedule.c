/* --pipeline-schedule (docs/harness.md, Micro-batches: Pipelines): the stages of a pipeline run
 * several micro-batches in flight, 1F1B (the default) or all-forward-all-backward, exchanging
 * activations and gradients on a communicator of each pair of adjacent stages.
 *   - the plans (hx_pipe_plan) for P = 1..8 stages and M = 1..12 micro-batches: both ranks of
 *     every link issue the same sequence of transfers, a simulation of the stages with each
 *     transfer a rendezvous of its two ranks finishes (no stage waits forever), every stage runs
 *     the forwards and the backwards in micro-batch order 0..M-1, 1F1B's warmup is Megatron's
 *     (P - stage - 1 forwards, at most M) and no stage holds more micro-batches than
 *     hx_pipe_in_flight says;
 *   - 1F1B, AFAB and the sequential order give the same dump bit for bit (every rank's
 *     parameters, gradients, updated parameters and optimizer state, after two steps) on a
 *     Megatron grid with tp 2, pp 2, ep 2 and 4 micro-batches, and on 4 stages with 3 micro-batches
 *     and with 2 (fewer than the stages), in f32 and bf16, under SGD and AdamW, router losses and
 *     capacity on; each run passes its checks; report.json records the schedule (1f1b by
 *     default);
 *   - bad input: an unknown schedule, or the option without pipeline stages: one line, exit 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "harness_test.h"
#include "pipeline.h"
#include "run.h"

#define COMMON "--quiet --timeout 60"
#define MAX_P  8
#define MAX_M  12

/* ---- the plans ---------------------------------------------------------------------------- */

/* A transfer as its link sees it: which link (its lower stage), what moves, whose. */
typedef struct link_op {
    int link;      /* -1: not a transfer */
    int act, grad; /* the micro-batches of the activations and gradients moved (-1: none) */
} link_op;

static link_op link_of(const hx_pipe_action *a, int stage)
{
    switch (a->op) {
    case HX_PIPE_RECV_ACT:
        return (link_op){stage - 1, a->m, -1};
    case HX_PIPE_SEND_GRAD:
        return (link_op){stage - 1, -1, a->m};
    case HX_PIPE_RECV_ACT_SEND_GRAD:
        return (link_op){stage - 1, a->m, a->g};
    case HX_PIPE_SEND_ACT:
        return (link_op){stage, a->m, -1};
    case HX_PIPE_RECV_GRAD:
        return (link_op){stage, -1, a->m};
    case HX_PIPE_SEND_ACT_RECV_GRAD:
        return (link_op){stage, a->m, a->g};
    default:
        return (link_op){-1, -1, -1};
    }
}

static void check_plans(hx_pipe_schedule schedule, int P, int M)
{
    hx_pipe_action *plan[MAX_P];
    size_t n[MAX_P], pc[MAX_P] = {0};
    int forwards[MAX_P] = {0}, backwards[MAX_P] = {0}, held[MAX_P] = {0}, most[MAX_P] = {0};
    int before_first_backward[MAX_P] = {0};
    const char *name = hx_pipe_schedule_name(schedule);
    for (int s = 0; s < P; s++) {
        plan[s] = calloc(HX_PIPE_ACTIONS_MAX(M), sizeof *plan[s]);
        assert_non_null(plan[s]);
        n[s] = hx_pipe_plan(schedule, s, P, M, plan[s]);
        assert_true(n[s] <= HX_PIPE_ACTIONS_MAX(M));
        before_first_backward[s] = -1;
    }
    for (bool moved = true; moved;) {
        moved = false;
        /* forwards and backwards run on their own */
        for (int s = 0; s < P; s++) {
            while (pc[s] < n[s] && link_of(&plan[s][pc[s]], s).link < 0) {
                const hx_pipe_action *a = &plan[s][pc[s]++];
                if (a->op == HX_PIPE_FORWARD) {
                    if (a->m != forwards[s])
                        fail_msg("%s P %d M %d stage %d: forward %d after %d forwards", name, P, M,
                                 s, a->m, forwards[s]);
                    forwards[s]++;
                    held[s]++;
                    most[s] = held[s] > most[s] ? held[s] : most[s];
                } else {
                    if (a->m != backwards[s] || a->m >= forwards[s])
                        fail_msg("%s P %d M %d stage %d: backward %d after %d backwards and %d "
                                 "forwards",
                                 name, P, M, s, a->m, backwards[s], forwards[s]);
                    if (backwards[s] == 0)
                        before_first_backward[s] = forwards[s];
                    backwards[s]++;
                    held[s]--;
                }
                moved = true;
            }
        }
        /* a transfer goes when both ranks of its link are at it, and it must be the same */
        for (int s = 0; s + 1 < P; s++) {
            if (pc[s] >= n[s] || pc[s + 1] >= n[s + 1])
                continue;
            link_op up = link_of(&plan[s][pc[s]], s),
                    down = link_of(&plan[s + 1][pc[s + 1]], s + 1);
            if (up.link != s || down.link != s)
                continue;
            if (up.act != down.act || up.grad != down.grad)
                fail_msg("%s P %d M %d link %d-%d: stage %d moves (act %d, grad %d), stage %d "
                         "(act %d, grad %d)",
                         name, P, M, s, s + 1, s, up.act, up.grad, s + 1, down.act, down.grad);
            pc[s]++;
            pc[s + 1]++;
            moved = true;
        }
    }
    for (int s = 0; s < P; s++) {
        if (pc[s] != n[s])
            fail_msg("%s P %d M %d: stage %d waits forever at action %zu of %zu", name, P, M, s,
                     pc[s], n[s]);
        assert_int_equal(forwards[s], M);
        assert_int_equal(backwards[s], M);
        assert_true(most[s] <= hx_pipe_in_flight(schedule, P, M));
        if (schedule == HX_PIPE_1F1B) {
            /* Megatron's warmup, then the steady state's first forward */
            int warmup = P - s - 1 < M ? P - s - 1 : M;
            assert_int_equal(before_first_backward[s], warmup < M ? warmup + 1 : M);
        } else if (schedule == HX_PIPE_AFAB) {
            assert_int_equal(before_first_backward[s], M);
        } else {
            assert_int_equal(most[s], 1);
        }
        free(plan[s]);
    }
}

static void plans_match_and_finish(void **state)
{
    (void)state;
    const hx_pipe_schedule schedules[] = {HX_PIPE_1F1B, HX_PIPE_AFAB, HX_PIPE_SEQUENTIAL};
    for (int k = 0; k < 3; k++)
        for (int P = 1; P <= MAX_P; P++)
            for (int M = 1; M <= MAX_M; M++)
                check_plans(schedules[k], P, M);
    /* several micro-batches in flight: stage 0 of 4 holds 4 under 1F1B, all of them under AFAB */
    assert_int_equal(hx_pipe_in_flight(HX_PIPE_1F1B, 4, 8), 4);
    assert_int_equal(hx_pipe_in_flight(HX_PIPE_1F1B, 4, 2), 2);
    assert_int_equal(hx_pipe_in_flight(HX_PIPE_AFAB, 4, 8), 8);
}

/* ---- the same bits ------------------------------------------------------------------------ */

static char *read_all(const char *path, size_t *len)
{
    char *text = NULL;
    if (hx_read_file(path, &text, len) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    return text;
}

/* Run `args` under `schedule` (NULL: the default) into dir/dump; require a pass. */
static void run_schedule(const char *args, const char *schedule, const char *dir)
{
    char opt[64] = "";
    if (schedule)
        snprintf(opt, sizeof opt, "--pipeline-schedule %s", schedule);
    hx_test_run run;
    hx_test_harness(&run, "%s %s %s --out %s --dump %s/dump", COMMON, args, opt, dir, dir);
    if (run.status != HX_EXIT_PASS)
        fail_msg("seldp-harness %s %s\nexit %d\n%s%s", args, opt, run.status, run.err, run.out);
    hx_json *report = hx_test_report(dir);
    const hx_json *o = hx_json_get(report, "options");
    assert_non_null(o);
    const hx_json *s = hx_json_get(o, "pipeline_schedule");
    assert_non_null(s);
    assert_string_equal(s->string, schedule ? schedule : "1f1b");
    hx_json_free(report);
}

/* Every rank's dump file of `a` equals the one of `b`, byte for byte. */
static void same_dumps(const char *a, const char *b, int world, const char *what)
{
    for (int r = 0; r < world; r++) {
        char pa[1300], pb[1300];
        snprintf(pa, sizeof pa, "%s/dump/rank%d.safetensors", a, r);
        snprintf(pb, sizeof pb, "%s/dump/rank%d.safetensors", b, r);
        size_t la = 0, lb = 0;
        char *ta = read_all(pa, &la), *tb = read_all(pb, &lb);
        if (la != lb || memcmp(ta, tb, la) != 0)
            fail_msg("%s: rank %d's dump differs between the schedules", what, r);
        free(ta);
        free(tb);
    }
}

static void schedules_agree(const char *args, int world)
{
    char seq[1200], afab[1200], one[1200];
    snprintf(seq, sizeof seq, "%s", hx_test_dir("sequential"));
    run_schedule(args, "sequential", seq);
    snprintf(afab, sizeof afab, "%s", hx_test_dir("afab"));
    run_schedule(args, "afab", afab);
    snprintf(one, sizeof one, "%s", hx_test_dir("1f1b"));
    run_schedule(args, NULL, one); /* the default */
    same_dumps(seq, afab, world, args);
    same_dumps(seq, one, world, args);
}

static void megatron_tp_pp_ep(void **state)
{
    (void)state;
    const char *grid = "--framework megatron --world 8 --tp 2 --pp 2 --ep 2 --micro-batches 4 "
                       "--steps 2 --tokens 16";
    char args[512];
    snprintf(args, sizeof args, "%s --dtype f32 --aux-loss-coeff 0.01", grid);
    schedules_agree(args, 8);
    snprintf(args, sizeof args, "%s --dtype bf16 --optimizer adamw --capacity-factor 1.25", grid);
    schedules_agree(args, 8);
}

static void four_stages(void **state)
{
    (void)state;
    const char *grid = "--framework megatron --world 8 --pp 4 --ep 2 --layers 4 --steps 2 "
                       "--tokens 16";
    char args[512];
    snprintf(args, sizeof args, "%s --micro-batches 3 --dtype f32 --optimizer adamw", grid);
    schedules_agree(args, 8);
    /* fewer micro-batches than stages: 1F1B's warmup is capped at M */
    snprintf(args, sizeof args,
             "%s --micro-batches 2 --dtype bf16 --aux-loss-coeff 0.01 --z-loss-coeff 0.001", grid);
    schedules_agree(args, 8);
}

/* ---- bad input ---------------------------------------------------------------------------- */

static void bad_input(void **state)
{
    (void)state;
    hx_test_usage_error("--pipeline-schedule 'xyz': expected 1f1b, afab or sequential",
                        "--quiet --out none --pipeline-schedule xyz");
    hx_test_usage_error("--pipeline-schedule afab: needs pipeline stages (--pp > 1)",
                        "--quiet --out none --world 4 --ep 2 --micro-batches 2 "
                        "--pipeline-schedule afab");
    hx_test_usage_error("--pipeline-schedule 1f1b: needs pipeline stages",
                        "--quiet --out none --framework megatron --world 4 --tp 2 --ep 2 "
                        "--pipeline-schedule 1f1b");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plans_match_and_finish),
        cmocka_unit_test(megatron_tp_pp_ep),
        cmocka_unit_test(four_stages),
        cmocka_unit_test(bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
