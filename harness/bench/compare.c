/* seldp-bench --compare mpi: run seldp-bench-mpi under mpirun with the same ranks, sizes,
 * iterations and timing rule, and read its rows back (one JSON object per line). */
#define _GNU_SOURCE /* popen */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "json.h"

/* The row of one JSON line from seldp-bench-mpi; false when it is not one. */
static bool row_from_json(const char *line, bench_row *row)
{
    hx_json *v = NULL;
    if (hx_json_parse(line, strlen(line), "seldp-bench-mpi output", &v) != SELDP_OK)
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
        if (line[0] != '{' || !row_from_json(line, &row))
            continue; /* MPI's own messages */
        bench_row_finish(&row, bench_rows_copy_bw(rows, row.ranks, row.bytes));
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
