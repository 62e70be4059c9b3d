/* seldp-harness: options, the run, the check table, reports and the exit status. */
#include "cli.h"

#include <string.h>

#include "checkpoint.h"
#include "layout_show.h"
#include "options.h"
#include "report.h"
#include "run.h"
#include "execute.h"
#include "run_create.h"
#include "sweep.h"

int hx_main(int argc, char **argv, FILE *out, FILE *err)
{
    hx_options opts;
    hx_options_default(&opts);
    switch (hx_options_parse(argc, argv, &opts, out, err)) {
    case HX_PARSE_EXIT:
        return HX_EXIT_PASS;
    case HX_PARSE_ERROR:
        return HX_EXIT_USAGE;
    case HX_PARSE_RUN:
        break;
    }
    if (opts.print_layout || opts.compare_groups)
        return hx_layout_show_main(&opts, out, err);
    if (opts.sweep)
        return hx_sweep_main(argc, argv, &opts, out, err);
    hx_run *run = NULL;
    if (hx_run_create(&opts, &run) != SELDP_OK) {
        fprintf(err, "seldp-harness: %s\n", hx_last_error());
        return HX_EXIT_USAGE;
    }
    /* the changes --resume records (resume.h), one line each */
    const char *notes = run->resume ? hx_ckpt_notes(run->resume) : "";
    for (const char *line = notes; *line && !opts.quiet && hx_run_is_root(run);) {
        size_t n = strcspn(line, "\n");
        fprintf(out, "resume: %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
    seldp_status st = hx_run_execute(run, out);
    if (st == SELDP_OK && opts.inject == HX_FAULT_ABSENT && !run->absent_planted &&
        hx_run_is_root(run) && !hx_backend_multiprocess(run->backend)) {
        /* the self-test never found its defect to plant: it tested nothing */
        fprintf(err,
                "seldp-harness: --inject absent: needs an expert no token reaches on rank %d "
                "(more experts than tokens, e.g. --experts 64 --tokens 8): none did in %d "
                "steps, so nothing was planted\n",
                opts.world - 1, run->steps_done);
        hx_run_destroy(run);
        return HX_EXIT_USAGE;
    }
    /* with one rank per MPI process, rank 0's process prints and writes the reports */
    bool root = hx_run_is_root(run);
    if (!opts.quiet && root)
        hx_report_print_checks(run, out);
    if (root && run->diagnosis[0])
        fprintf(out, "diagnosis: %s\n", run->diagnosis);
    if (root && run->diverged_step)
        fprintf(out,
                "diverged: step %d: %s; steps %d to %d were not checked (a smaller --lr keeps "
                "the run in range)\n",
                run->diverged_step, run->diverged_why, run->diverged_step, run->steps_done);
    if (st != SELDP_OK)
        fprintf(err, "seldp-harness: the run stopped: %s\n", run->error);
    int status = hx_run_passed(run) ? HX_EXIT_PASS : HX_EXIT_FAIL;
    if (root && opts.out_dir && opts.out_dir[0]) {
        if (hx_report_write(run, opts.out_dir) != SELDP_OK) {
            fprintf(err, "seldp-harness: %s\n", hx_last_error());
            status = HX_EXIT_FAIL;
        }
    }
    if (root && opts.summary) {
        const char *name = opts.out_dir && opts.out_dir[0] ? strrchr(opts.out_dir, '/') : NULL;
        name = name ? name + 1 : opts.out_dir && opts.out_dir[0] ? opts.out_dir : "run";
        if (hx_report_append_summary(run, name, opts.summary) != SELDP_OK) {
            fprintf(err, "seldp-harness: %s\n", hx_last_error());
            status = HX_EXIT_FAIL;
        }
    }
    if (root)
        fprintf(out, "result: %s (%lld failed checks, %d/%d steps, %.2f s)%s%s%s\n",
                status == HX_EXIT_PASS ? "PASS" : "FAIL", (long long)hx_run_failures(run),
                run->steps_done, run->opts.steps, run->t_total,
                opts.out_dir && opts.out_dir[0] ? "; report in " : "",
                opts.out_dir && opts.out_dir[0] ? opts.out_dir : "",
                opts.out_dir && opts.out_dir[0] ? "/report.md" : "");
    fflush(out);
    hx_run_destroy(run);
    return status;
}
