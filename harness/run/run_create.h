/* A run's making and unmaking: the options and the layout checked, every rank's records
 * allocated (run_create.c); hx_run_destroy frees what the run and its ranks hold. */
#ifndef HX_RUN_CREATE_H
#define HX_RUN_CREATE_H

#include "options.h"
#include "run.h"

/* Validate the options (model config, layout) and prepare a run. A failure here is a usage
 * error: SELDP_ERR_INVALID_ARGUMENT or _PARSE or _UNSUPPORTED, hx_last_error one line. */
seldp_status hx_run_create(const hx_options *opts, hx_run **out);

/* Frees everything the run and its ranks hold; NULL is a no-op. */
void hx_run_destroy(hx_run *run);

#endif
