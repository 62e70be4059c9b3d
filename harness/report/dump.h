/* The dump of a step (dump.c, docs/formats.md). */
#ifndef HX_DUMP_H
#define HX_DUMP_H

#include "seldp/status.h"

typedef struct hx_run hx_run;

/* The dump of `step`: the rank files of the ranks in this process; manifest.json from the
 * root process. */
seldp_status hx_dump_write(const hx_run *run, int step, const char *dir);

#endif
