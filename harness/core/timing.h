/* Where a step's time goes: its wall time split into phases that add up to the whole, with
 * the CPU time (user and system, every thread of the process) each phase used.
 *
 *   ranks      from the step's start until every rank has finished its update, forward,
 *              backward and reductions (the main thread waits meanwhile: the CPU is the
 *              ranks'); under mpirun, this process's rank and the gathering to rank 0
 *   reference  the replicas copied into the reference's model and the FP64 reference
 *   check      the step's checks
 *   other      the rest: the progress line, --dump, handing the phases over
 *
 * The caller marks the phase boundaries in order (hx_split_start, hx_split_charge...,
 * hx_split_finish); each interval goes to exactly one phase. */
#ifndef HX_TIMING_H
#define HX_TIMING_H

#include "util.h"

typedef enum hx_phase {
    HX_PHASE_RANKS,
    HX_PHASE_REFERENCE,
    HX_PHASE_CHECK,
    HX_PHASE_OTHER,
    HX_PHASE_COUNT
} hx_phase;

typedef struct hx_phase_time {
    double wall, user, sys; /* seconds */
} hx_phase_time;

typedef struct hx_step_split {
    hx_phase_time phase[HX_PHASE_COUNT];
    hx_phase_time mark; /* the clocks at the last boundary */
} hx_step_split;

/* The phase's JSON key and the step line's word ("ranks", "reference", "check", "other"). */
const char *hx_phase_name(hx_phase p);

/* Start the step: clear the split and read the clocks. */
void hx_split_start(hx_step_split *split);

/* Charge the time since the last boundary to phase p; returns that interval's wall time. */
double hx_split_charge(hx_step_split *split, hx_phase p);

/* End the step, charging what remains to "other"; returns the step's wall time, the sum of
 * the phases. */
double hx_split_finish(hx_step_split *split);

/* The phases' wall times for the step line: "ranks 1.2 s, reference 0.3 s, check 0.1 s,
 * other 0.0 s" (ms below one second). */
void hx_split_describe(const hx_step_split *split, char *buf, size_t size);

/* Append to a JSON object under construction: , "ranks": s, "other": s (the wall times of
 * the phases report.json did not have) and , "cpu": {"ranks": {"user": s, "sys": s}, ...}. */
void hx_split_json(const hx_step_split *split, hx_buf *b);

#endif
