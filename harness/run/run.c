/* The run's queries that every component may ask (run.h): whether this process is the
 * root, its failed checks, whether it passed; and the recording of a check's outcome. */
#include <stdarg.h>

#include "run.h"

bool hx_run_is_root(const hx_run *run)
{
    return hx_backend_process_rank(run->backend) <= 0;
}

int64_t hx_run_failures(const hx_run *run)
{
    if (!hx_run_is_root(run))
        return run->root_failures;
    int64_t n = 0;
    for (int c = 0; c < HX_CHECK_COUNT; c++)
        n += run->checks[c].failed;
    return n;
}

bool hx_run_passed(const hx_run *run)
{
    return run->status == SELDP_OK && run->steps_done == run->opts.steps &&
           hx_run_failures(run) == 0;
}

void hx_check_record(hx_run *run, hx_check_id id, bool failed, double value, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hx_check_vnote(&run->checks[id], failed, value, fmt, ap);
    va_end(ap);
}

void hx_check_metric(hx_run *run, hx_check_id id, bool failed, double ratio, double bound,
                     double resolution, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hx_check_vmetric(&run->checks[id], failed, ratio, bound, resolution, fmt, ap);
    va_end(ap);
}

int hx_micro_count(const hx_run *run)
{
    return run->opts.micro_batches > 1 ? run->opts.micro_batches : 1;
}
