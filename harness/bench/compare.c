/* seldp-bench --compare mpi,gloo: run seldp-bench-mpi under mpirun, and seldp-bench-gloo.py
 * (torch.distributed's gloo backend) under python3, with the same ranks, sizes, iterations
 * and timing rule, and read their rows back (one JSON object per line). */
#define _GNU_SOURCE /* popen */

#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "json.h"

/* The row of one JSON line from seldp-bench-mpi or the gloo program; false when it is not
 * one. */
static bool row_from_json(const char *line, const char *what, bench_row *row)
{
    hx_json *v = NULL;
    if (hx_json_parse(line, strlen(line), what, &v) != SELDP_OK)
        return false;
    const hx_json *op = hx_json_get(v, "op"), *impl = hx_json_get(v, "impl");
    const hx_json *ranks = hx_json_get(v, "ranks"), *bytes = hx_json_get(v, "bytes");
    const hx_json *time = hx_json_get(v, "time_us"), *wrong = hx_json_get(v, "wrong");
    bool ok = op && op->type == HX_JSON_STRING && impl && impl->type == HX_JSON_STRING && ranks &&
              ranks->is_integer && bytes && bytes->is_integer && time &&
              time->type == HX_JSON_NUMBER && wrong && wrong->is_integer;
    if (ok) {
        *row =
            bench_row_make(op->string, impl->string, (int)ranks->integer, (size_t)bytes->integer);
        row->time_us = time->number;
        row->wrong = wrong->integer;
        snprintf(row->dtype, sizeof row->dtype, "f32");
    }
    hx_json_free(v);
    return ok;
}

int bench_mpi_rows(const bench_opts *o, const char *self_dir, int P, bench_rows *rows)
{
    char cmd[2048];
    /* Open MPI refuses more processes than cores, and root, unless asked */
    snprintf(cmd, sizeof cmd,
             "'%s' -np %d --oversubscribe%s '%s/seldp-bench-mpi' -o %s -b %zu -e %zu -f %g -n %d "
             "-w %d --json",
             o->mpirun, P, geteuid() == 0 ? " --allow-run-as-root" : "", self_dir,
             bench_op_name(o->op), o->min_bytes, o->max_bytes, o->factor, o->iters, o->warmup);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "seldp-bench: cannot run %s\n", cmd);
        return 1;
    }
    char line[4096];
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        bench_row row;
        if (line[0] != '{' || !row_from_json(line, "seldp-bench-mpi output", &row))
            continue; /* MPI's own messages */
        bench_row_finish_rows(&row, rows);
        bench_rows_add(rows, &row);
        got++;
    }
    int status = pclose(p);
    if (status != 0 || got == 0) {
        fprintf(stderr, "seldp-bench: %s: exit status %d, %d rows\n", cmd, status, got);
        return 1;
    }
    return 0;
}

/* The exit status the gloo program uses to say that torch with gloo is not importable. */
#define GLOO_SKIP 77

/* One run of the gloo program under `python`; *skipped when it could not import torch with
 * gloo (or the interpreter could not be run), with the reason in why. */
static int gloo_run(const bench_opts *o, const char *python, const char *self_dir, int P,
                    bench_rows *rows, bool *skipped, char *why, size_t why_size)
{
    char script[4096], cmd[6144];
    *skipped = false;
    if (o->gloo_script)
        snprintf(script, sizeof script, "%s", o->gloo_script);
    else
        snprintf(script, sizeof script, "%s/seldp-bench-gloo.py", self_dir);
    snprintf(cmd, sizeof cmd, "'%s' '%s' -o %s --ranks %d -b %zu -e %zu -f %g -n %d -w %d 2>&1",
             python, script, bench_op_name(o->op), P, o->min_bytes, o->max_bytes, o->factor,
             o->iters, o->warmup);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "seldp-bench: cannot run %s\n", cmd);
        return 1;
    }
    char line[4096];
    int got = 0, bad = 0;
    why[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        bench_row row;
        if (line[0] != '{') {
            /* the program's notes and torch's messages: keep the last for a failure */
            if (line[0] != '\n')
                snprintf(why, why_size, "%.500s", line);
            continue;
        }
        if (!row_from_json(line, "the gloo program's output", &row) ||
            strcmp(row.impl, "gloo") != 0 || row.ranks != P ||
            strcmp(row.op, bench_op_name(o->op)) != 0) {
            bad++;
            snprintf(why, why_size, "unexpected row: %.480s", line);
            continue;
        }
        bench_row_finish_rows(&row, rows);
        bench_rows_add(rows, &row);
        got++;
    }
    int status = pclose(p);
    int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    why[strcspn(why, "\n")] = '\0';
    if (code == GLOO_SKIP && got == 0) {
        *skipped = true;
        if (!why[0])
            snprintf(why, why_size, "the gloo program skipped");
        return 0;
    }
    if (code == 127 && got == 0) {
        *skipped = true;
        char said[512];
        snprintf(said, sizeof said, "%s", why[0] ? why : "not found");
        snprintf(why, why_size, "cannot run '%.100s' '%.200s' (%.150s)", python, script, said);
        return 0;
    }
    if (code != 0 || got == 0 || bad) {
        fprintf(stderr, "seldp-bench: %s: exit status %d, %d rows, %d malformed: %s\n", cmd, code,
                got, bad, why);
        return 1;
    }
    return 0;
}

/* The interpreters --compare gloo tries when --python is not given: the first on PATH, then
 * the system's (Debian's python3-torch installs for /usr/bin/python3, which a python3 of
 * pyenv or a virtual environment earlier on PATH does not see). */
static const char *const GLOO_PYTHONS[] = {"python3", "/usr/bin/python3"};

int bench_gloo_rows(const bench_opts *o, const char *self_dir, int P, bench_rows *rows,
                    bool *skipped)
{
    char why[512] = "";
    size_t n = o->python ? 1 : sizeof GLOO_PYTHONS / sizeof GLOO_PYTHONS[0];
    for (size_t i = 0; i < n; i++) {
        const char *python = o->python ? o->python : GLOO_PYTHONS[i];
        int failed = gloo_run(o, python, self_dir, P, rows, skipped, why, sizeof why);
        if (failed || !*skipped)
            return failed;
    }
    fprintf(o->json ? stderr : stdout, "# no gloo column, %d ranks: %s\n", P, why);
    return 0;
}
