/* The run's reports (report.c): the check table, report.json and the summary row, and the
 * config JSON. */
#ifndef HX_REPORT_H
#define HX_REPORT_H

#include <stdio.h>

#include "seldp/status.h"
#include "tinymoe.h"

#include "util.h"

typedef struct hx_run hx_run;

void hx_report_print_checks(const hx_run *run, FILE *out);
seldp_status hx_report_write(const hx_run *run, const char *dir);
/* Append the run's row of the summary table to `path` (with the table's header when the
 * file is new or empty). `name` labels the row. */
seldp_status hx_report_append_summary(const hx_run *run, const char *name, const char *path);

/* The config JSON (docs/formats.md, Config JSON; tm_config_json) appended to buf. */
void hx_config_json(const tm_config *cfg, hx_buf *buf);

#endif
