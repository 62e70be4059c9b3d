/* The known framework bugs in lockstep sweeps (label slow; results/bugs/): for each planted bug
 * of the second set, the sweep over layouts where it shows fails with the bug planted (every run
 * where it acts fails its own checks, and the sweep's findings name it) and passes without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bugs.h"
#include "cli.h"
#include "harness_test.h"
#include "util.h"

static const struct {
    const char *name;
    const char *sweep; /* the sweep and the options the bug needs */
} sweeps[] = {
    {"router-tp", "--sweep " HX_TEST_SWEEPS "/tp.json --dtype f32"},
    {"shared-expert-tp", "--sweep " HX_TEST_SWEEPS "/tp.json --dtype bf16 --shared-expert-ff 32"},
    {"aux-cp", "--sweep " HX_TEST_SWEEPS "/cp.json --dtype bf16 --aux-loss-coeff 0.1"},
    {"aux-dp", "--sweep worlds --ep 4 --dtype f32 --aux-loss-coeff 0.1"},
    {"norm-per-group", "--sweep ep --world 8 --dtype bf16 --clip-grad 0.1"},
    {"edp1-skip", "--sweep " HX_TEST_SWEEPS "/edp1.json --dtype f32"},
    {"half-accum", "--sweep worlds --ep 2 --dtype f16"},
};

static void test_sweeps(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof sweeps / sizeof sweeps[0]; i++) {
        char dir[1200], path[1300], want[200];
        snprintf(dir, sizeof dir, "%s/out", hx_test_dir(sweeps[i].name));
        hx_test_run run;
        hx_test_harness(&run, "%s --global-batch 255 --steps 3 --inject %s --quiet --out %s",
                        sweeps[i].sweep, sweeps[i].name, dir);
        if (run.status != HX_EXIT_FAIL)
            fail_msg("sweep %s with --inject %s exited %d, expected 1\n%s%s", sweeps[i].sweep,
                     sweeps[i].name, run.status, run.err, run.out);
        char *md = NULL;
        snprintf(path, sizeof path, "%s/sweep.md", dir);
        assert_int_equal(hx_read_file(path, &md, NULL), SELDP_OK);
        snprintf(want, sizeof want, "known bug %s (", sweeps[i].name);
        if (!strstr(md, "## Findings") || !strstr(md, want))
            fail_msg("sweep.md of --inject %s lacks findings naming it:\n%s", sweeps[i].name, md);
        free(md);
        /* the first run of each sweep is one where the bug cannot show: it passes */
        assert_non_null(strstr(run.out, "sweep result: FAIL ("));
        hx_test_harness(&run, "%s --global-batch 255 --steps 3 --quiet --out %s", sweeps[i].sweep,
                        dir);
        if (run.status != HX_EXIT_PASS || strstr(run.out, "diagnosis"))
            fail_msg("sweep %s without a bug exited %d, expected a pass\n%s%s", sweeps[i].sweep,
                     run.status, run.err, run.out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweeps)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
