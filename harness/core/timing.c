/* The phases of a step and their wall and CPU times (timing.h). CPU time is the whole
 * process's (getrusage), so a phase in which only the main thread runs, or only the ranks,
 * shows what that side used: on a shared machine it stays meaningful where wall time
 * stretches with the load. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "timing.h"

static const char *const phase_names[HX_PHASE_COUNT] = {"ranks", "reference", "check", "other"};

const char *hx_phase_name(hx_phase p)
{
    return p >= 0 && p < HX_PHASE_COUNT ? phase_names[p] : "?";
}

static double seconds(struct timeval tv)
{
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static hx_phase_time clocks_now(void)
{
    struct rusage ru;
    hx_phase_time t = {.wall = hx_now()};
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        t.user = seconds(ru.ru_utime);
        t.sys = seconds(ru.ru_stime);
    }
    return t;
}

void hx_split_start(hx_step_split *split)
{
    memset(split, 0, sizeof *split);
    split->mark = clocks_now();
}

double hx_split_charge(hx_step_split *split, hx_phase p)
{
    hx_phase_time now = clocks_now();
    hx_phase_time *t = &split->phase[p];
    double wall = now.wall - split->mark.wall;
    t->wall += wall;
    t->user += now.user - split->mark.user;
    t->sys += now.sys - split->mark.sys;
    split->mark = now;
    return wall;
}

double hx_split_finish(hx_step_split *split)
{
    hx_split_charge(split, HX_PHASE_OTHER);
    double step = 0.0;
    for (int p = 0; p < HX_PHASE_COUNT; p++)
        step += split->phase[p].wall;
    return step;
}

void hx_split_describe(const hx_step_split *split, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int p = 0; p < HX_PHASE_COUNT && at < size; p++) {
        double s = split->phase[p].wall;
        int n = s >= 1.0 ? snprintf(buf + at, size - at, "%s%s %.1f s", p ? ", " : "",
                                    hx_phase_name(p), s)
                         : snprintf(buf + at, size - at, "%s%s %.1f ms", p ? ", " : "",
                                    hx_phase_name(p), 1e3 * s);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

void hx_split_json(const hx_step_split *split, hx_buf *b)
{
    hx_buf_puts(b, ", \"ranks\": ");
    hx_buf_json_number(b, split->phase[HX_PHASE_RANKS].wall);
    hx_buf_puts(b, ", \"other\": ");
    hx_buf_json_number(b, split->phase[HX_PHASE_OTHER].wall);
    hx_buf_puts(b, ", \"cpu\": {");
    for (int p = 0; p < HX_PHASE_COUNT; p++) {
        hx_buf_printf(b, "%s\"%s\": {\"user\": ", p ? ", " : "", hx_phase_name(p));
        hx_buf_json_number(b, split->phase[p].user);
        hx_buf_puts(b, ", \"sys\": ");
        hx_buf_json_number(b, split->phase[p].sys);
        hx_buf_puts(b, "}");
    }
    hx_buf_puts(b, "}");
}
