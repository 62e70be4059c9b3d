/* The harness run: rank threads, the reductions of docs/harness.md (dispatch: dispatch.c), the
 * update, and the main thread's phases (see run.h); creating a run is run_create.c. */
#define _POSIX_C_SOURCE 200809L

#include "set_rank.h"
#include "checks.h"
#include "console.h"
#include "dump.h"
#include "gather.h"
#include "rank.h"
#include "rank_setup.h"
#include "reduce.h"
#include "run.h"
#include "execute.h"
#include "step_reduce.h"
#include "step_checks.h"

#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "checkpoint.h"
#include "gpu_rank.h"
#include "grid.h"
#include "overlap.h"
#include "router.h"
#include "inject.h"
#include "capture.h"
#include "diagnose.h"
#include "diverge.h"
#include "lockstep.h"
#include "microbatch.h"
#include "optimizer.h"
#include "zero.h"
#include "loss_scale.h"

/* ---- the phase gate ---------------------------------------------------------------------- */

/* Wait until the world's rank threads and the main thread have all arrived. false when the
 * gate is broken (a rank failed): the caller stops. */
static bool gate_wait(hx_run *run)
{
    pthread_mutex_lock(&run->gate_lock);
    if (run->gate_broken) {
        pthread_mutex_unlock(&run->gate_lock);
        return false;
    }
    unsigned generation = run->gate_generation;
    if (++run->gate_arrived == run->opts.world + 1) {
        run->gate_arrived = 0;
        run->gate_generation++;
        pthread_cond_broadcast(&run->gate_cond);
        pthread_mutex_unlock(&run->gate_lock);
        return true;
    }
    while (generation == run->gate_generation && !run->gate_broken)
        pthread_cond_wait(&run->gate_cond, &run->gate_lock);
    bool passed = generation != run->gate_generation;
    pthread_mutex_unlock(&run->gate_lock);
    return passed;
}

static void gate_break(hx_run *run)
{
    pthread_mutex_lock(&run->gate_lock);
    run->gate_broken = true;
    pthread_cond_broadcast(&run->gate_cond);
    pthread_mutex_unlock(&run->gate_lock);
}

/* ---- small helpers ----------------------------------------------------------------------- */

static seldp_status rank_step(hx_rank *rk, int step)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    rk->t_dispatch = 0;
    rk->step = step;
    rk->overflow_planted = false;
    HX_CHECK(hx_lockstep_load(rk, step)); /* a sweep's lockstep: the first run's weights */
    HX_CHECK(hx_draw_tokens(rk, step));
    uint64_t mine = rk->T;
    HX_CHECK_LIB(seldp_comm_allgather(rk->world, &mine, rk->counts, sizeof mine, SELDP_HOST_DEVICE),
                 "rank %d: allgather of token counts", rk->rank);
    rk->global_tokens = 0;
    for (int b = 0; b < run->n_batch; b++)
        rk->global_tokens += rk->counts[run->batch_ranks[b]];
    double t0 = hx_now();
    HX_CHECK(hx_micro_compute(rk)); /* its micro-batches (microbatch.h) */
    rk->t_compute = hx_now() - t0;
    /* the others are on their way into the reductions: they must return, not wait */
    if (run->opts.inject == HX_FAULT_FAIL && rk->rank == run->opts.world - 1 && step == 0)
        HX_FAIL(SELDP_ERR_INTERNAL, "rank %d: --inject fail: a planted failure in step 1",
                rk->rank);
    HX_CHECK(hx_rank_reduce(rk));
    if (run->opts.inject != HX_FAULT_NONE)
        HX_CHECK(hx_plant_fault(rk));
fail:
    return st;
}

/* The update (optimizer.h): SGD or AdamW on every trainable parameter that has a reduced
 * gradient, after --clip-grad's clipping; on the host model, then copied to the GPU of a rank
 * that computes there. */
static seldp_status rank_update(hx_rank *rk)
{
    /* --zero 1: the distributed optimizer updates this rank's range (zero.h) */
    return rk->run->opts.zero ? hx_zero_update(rk) : hx_opt_update(rk);
}

static void rank_fail(hx_rank *rk, seldp_status st)
{
    rk->status = st;
    snprintf(rk->error, sizeof rk->error, "%s", hx_last_error());
    if (rk->world)
        seldp_comm_abort(rk->world);
    gate_break(rk->run);
}

static void rank_cleanup(hx_rank *rk)
{
    hx_rank_sets_cleanup(rk);
    hx_grid_cleanup(rk);
    hx_overlap_cleanup(rk);
    seldp_comm_destroy(rk->shard_comm);
    rk->shard_comm = NULL;
    hx_rank_comms_destroy(&rk->comms);
    seldp_comm_destroy(rk->world);
    rk->world = NULL;
    /* device memory goes on the rank's own thread, before the main thread takes over */
    seldp_grads_destroy(rk->device_grads);
    rk->device_grads = NULL;
    if (rk->gpu)
        hx_gpu_detach(rk);
}

static void *rank_main(void *arg)
{
    hx_rank *rk = arg;
    hx_run *run = rk->run;
    seldp_status st = hx_rank_setup(rk);
    if (st != SELDP_OK) {
        rank_fail(rk, st);
        goto out;
    }
    if (!gate_wait(run) || !gate_wait(run)) /* the main thread checks initialize */
        goto out;
    for (int step = run->first_step; step < run->opts.steps; step++) {
        st = rank_step(rk, step);
        if (st != SELDP_OK) {
            rank_fail(rk, st);
            goto out;
        }
        if (!gate_wait(run) || !gate_wait(run)) /* the main thread checks the step */
            goto out;
        st = rank_update(rk);
        if (st != SELDP_OK) {
            rank_fail(rk, st);
            goto out;
        }
        /* the main thread checks the update (and dumps the last step) */
        if (!gate_wait(run) || !gate_wait(run))
            goto out;
        if (hx_ckpt_due(run, step)) {
            st = hx_ckpt_write_rank(rk, step);
            if (st != SELDP_OK) {
                rank_fail(rk, st);
                goto out;
            }
            if (!gate_wait(run)) /* the main thread writes the index */
                goto out;
        }
    }
out:
    rank_cleanup(rk);
    return NULL;
}

/* ---- the main thread --------------------------------------------------------------------- */

static seldp_status main_step(hx_run *run, int step)
{
    seldp_status st = SELDP_OK;
    hx_step_record *rec = &run->steps[step];
    int W = run->opts.world;
    tm_reference *ref = NULL;
    for (int b = 0; b < run->n_batch; b++)
        rec->tokens += run->ranks[run->batch_ranks[b]].T;
    for (int r = 0; r < W; r++) {
        hx_rank *rk = &run->ranks[r];
        rec->loss += rk->loss_sum;
        rec->t_compute = fmax(rec->t_compute, rk->t_compute);
        rec->t_dispatch = fmax(rec->t_dispatch, rk->t_dispatch);
        rec->t_reduce = fmax(rec->t_reduce, rk->t_reduce);
    }
    rec->loss /= (double)rec->tokens;
    hx_split_charge(&rec->split, HX_PHASE_OTHER);
    /* every replica set's root's values into the model the reference reads */
    HX_CHECK(hx_grid_assemble(run, run->global));
    /* --zero 1: every member's reduced gradients from the members' ranges (zero.h) */
    HX_CHECK(hx_zero_assemble(run));
    /* the ranks' activation caches have had their last reader (the backward; the next forward
     * sizes them again): at world 2048 about 0.65 GB the reference's peak need not hold */
    for (int r = 0; r < W; r++)
        if (run->ranks[r].model)
            tm_model_release_caches(run->ranks[r].model);
    /* the ranks' step buffers are free now, scattered over the allocator's arenas: hand their
     * pages back before the reference takes its own (at world 2048 about 1.5 GiB) */
    malloc_trim(0);
    tm_reference_set_threads(run->opts.reference_threads);
    /* every micro-batch of every batch rank or data shard (microbatch.h) */
    HX_CHECK(hx_micro_reference(run, step, &ref));
    rec->ties_followed = tm_reference_ties_followed(ref);
    rec->dropped = tm_reference_dropped(ref);
    rec->t_reference = hx_split_charge(&rec->split, HX_PHASE_REFERENCE);
    rec->ref_loss = tm_reference_loss(ref);
    hx_loss_scale_step(run, step); /* --loss-scale: the step's S and overflow */
    if (!hx_step_diverged(run, step, ref)) {
        HX_CHECK(hx_check_step(run, step, ref));
        if (run->opts.clip_grad > 0)
            hx_clip_check(run, step, ref);
        hx_diagnose(run, step);
    }
    if (run->lockstep)
        HX_CHECK(hx_lockstep_step(run, step));
    hx_capture_reset(run); /* the next step's inputs */
    rec->t_check = hx_split_charge(&rec->split, HX_PHASE_CHECK);
fail:
    tm_reference_destroy(ref);
    return st;
}

/* --dump after the last step: the rank files of this process's ranks, the manifest. */
static seldp_status dump_if_last(const hx_run *run, int step)
{
    if (step != run->opts.steps - 1 || !run->opts.dump_dir)
        return SELDP_OK;
    return hx_dump_write(run, step, run->opts.dump_dir);
}

/* --save: the index of the step's shards, and the line that says so. */
static seldp_status save_commit(hx_run *run, int step)
{
    seldp_status st = hx_ckpt_commit(run, step);
    if (st == SELDP_OK && run->out) {
        fprintf(run->out, "checkpoint: step %d saved in %s\n", step + 1, run->opts.save_dir);
        fflush(run->out);
    }
    return st;
}

/* Every rank a thread of this process, the main thread checking between the phases. */
/* The run's status from ranks [first, first + n) when it has none yet: the first real error,
 * ranks that only saw the abort of another coming last. */
static void first_rank_error(hx_run *run, int first, int n)
{
    for (int pass = 0; pass < 2 && run->status == SELDP_OK; pass++) {
        for (int r = first; r < first + n; r++) {
            const hx_rank *rk = &run->ranks[r];
            if (rk->status == SELDP_OK || (pass == 0 && rk->status == SELDP_ERR_ABORTED))
                continue;
            run->status = rk->status;
            snprintf(run->error, sizeof run->error, "%s", rk->error);
            return;
        }
    }
}

static seldp_status execute_threads(hx_run *run)
{
    seldp_status st = SELDP_OK;
    int W = run->opts.world;
    int started = 0;
    for (int r = 0; r < W; r++) {
        if (pthread_create(&run->ranks[r].thread, NULL, rank_main, &run->ranks[r]) != 0) {
            gate_break(run);
            HX_FAIL(SELDP_ERR_INTERNAL, "cannot start the thread of rank %d", r);
        }
        run->ranks[r].started = true;
        started++;
    }
    if (!gate_wait(run))
        goto joined;
    run->t_setup = hx_now() - run->t_begin;
    double t0 = hx_now();
    hx_check_init(run);
    run->t_init = hx_now() - t0;
    hx_print_init(run);
    if (!gate_wait(run))
        goto joined;
    for (int step = run->first_step; step < run->opts.steps; step++) {
        hx_split_start(&run->steps[step].split);
        if (!gate_wait(run))
            goto joined;
        hx_split_charge(&run->steps[step].split, HX_PHASE_RANKS);
        st = main_step(run, step);
        if (st != SELDP_OK) {
            snprintf(run->error, sizeof run->error, "%s", hx_last_error());
            run->status = st;
            gate_break(run);
            goto joined;
        }
        if (!gate_wait(run)) /* the ranks update */
            goto joined;
        if (!gate_wait(run))
            goto joined;
        /* the post-step check of every rank's update, then the dump (the update included) */
        hx_opt_check_step(run, step);
        if (run->opts.zero && run->opts.clip_grad > 0) /* the clipped ranges, for the dump */
            st = hx_zero_assemble(run);
        if (st == SELDP_OK && (hx_ckpt_due(run, step) || /* --zero 1: the state whole */
                               (run->lockstep && step == run->opts.steps - 1)))
            st = hx_zero_consolidate(run, false);
        if (st == SELDP_OK && step == run->opts.steps - 1 && run->opts.dump_dir)
            st = hx_zero_consolidate(run, true); /* the dump's opt/ whole */
        if (st == SELDP_OK)
            st = dump_if_last(run, step);
        if (st != SELDP_OK) {
            snprintf(run->error, sizeof run->error, "%s", hx_last_error());
            run->status = st;
            gate_break(run);
            goto joined;
        }
        run->steps_done = step + 1;
        run->steps[step].t_step = hx_split_finish(&run->steps[step].split);
        hx_print_progress(run, step, run->steps[step].t_step);
        if (!gate_wait(run))
            goto joined;
        if (hx_ckpt_due(run, step)) {
            if (!gate_wait(run)) /* every writer has written its shard */
                goto joined;
            st = save_commit(run, step);
            if (st != SELDP_OK) {
                snprintf(run->error, sizeof run->error, "%s", hx_last_error());
                run->status = st;
                gate_break(run);
                goto joined;
            }
        }
    }
joined:
    for (int r = 0; r < W; r++)
        if (run->ranks[r].started)
            pthread_join(run->ranks[r].thread, NULL);
    if (run->lockstep && run->status == SELDP_OK && run->steps_done == run->opts.steps &&
        run->steps_done > run->first_step) {
        st = hx_lockstep_finish(run);
        if (st != SELDP_OK) {
            run->status = st;
            snprintf(run->error, sizeof run->error, "%s", hx_last_error());
        }
    }
    first_rank_error(run, 0, W);
    return run->status;
fail:
    run->status = st;
    snprintf(run->error, sizeof run->error, "%s", hx_last_error());
    for (int r = 0; r < started; r++)
        pthread_join(run->ranks[r].thread, NULL);
    return st;
}

/* A rank of a multi-process run, on its own thread: the main thread with one rank per MPI
 * process, one of the process's rank threads with --ranks-per-process (the hybrid
 * transport). The phases are those of the threads, with collectives in place of the gate:
 * rank 0 gathers what the checks read (gather.c), and after each phase every rank learns
 * whether every other could go on, so all stop together. A rank whose library call fails
 * aborts the world, as a thread does; the others then stop at their next collective. The
 * process's first rank keeps the run's shared records (timings, steps done, the dump). */
static seldp_status execute_rank(hx_run *run, hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    bool root = rk->rank == 0;
    bool leader = rk->rank == hx_backend_local_first(run->backend);
    bool hybrid = hx_backend_hybrid(run->backend);
    st = hx_rank_setup(rk);
    if (st != SELDP_OK)
        goto aborted;
    st = hx_gather_init(run, rk);
    if (st != SELDP_OK)
        goto aborted;
    if (leader)
        run->t_setup = hx_now() - run->t_begin;
    if (root) {
        double t0 = hx_now();
        hx_check_init(run);
        run->t_init = hx_now() - t0;
        hx_print_init(run);
    }
    if (hybrid) /* rank 0 read its process's ranks in place: they wait for it */
        HX_CHECK(hx_gather_verdict(run, rk, SELDP_OK, 0));
    for (int step = run->first_step; step < run->opts.steps; step++) {
        if (leader)
            hx_split_start(&run->steps[step].split);
        st = rank_step(rk, step);
        if (st != SELDP_OK)
            goto aborted;
        st = hx_gather_step(run, rk);
        if (st == SELDP_OK)
            st = hx_gather_capture(run, rk);
        if (st != SELDP_OK)
            goto aborted;
        if (leader)
            hx_split_charge(&run->steps[step].split, HX_PHASE_RANKS);
        seldp_status mine = root ? main_step(run, step) : SELDP_OK;
        HX_CHECK(hx_gather_verdict(run, rk, mine, 0));
        if (leader) {
            run->steps_done = step + 1;
            run->steps[step].t_step = hx_split_finish(&run->steps[step].split);
        }
        if (root)
            hx_print_progress(run, step, run->steps[step].t_step);
        st = rank_update(rk);
        if (st != SELDP_OK)
            goto aborted;
        /* the post-step check: each process its rank's, merged on rank 0 */
        st = hx_opt_check_process(run, rk, step);
        if (st != SELDP_OK)
            goto aborted;
        /* the dump holds the update (each process its ranks' files) */
        if (step == run->opts.steps - 1 && run->opts.dump_dir)
            HX_CHECK(hx_gather_verdict(run, rk, leader ? dump_if_last(run, step) : SELDP_OK, 0));
        if (hx_ckpt_due(run, step)) {
            HX_CHECK(hx_gather_verdict(run, rk, hx_ckpt_write_rank(rk, step), 0));
            HX_CHECK(hx_gather_verdict(run, rk, root ? save_commit(run, step) : SELDP_OK, 0));
        }
    }
    /* every process exits with the status rank 0's checks decide */
    HX_CHECK(hx_gather_verdict(run, rk, SELDP_OK, root ? hx_run_failures(run) : 0));
    rank_cleanup(rk);
    return SELDP_OK;
aborted:
    rank_fail(rk, st);
fail:
    rk->status = st;
    snprintf(rk->error, sizeof rk->error, "%s", hx_last_error());
    if (rk->world)
        seldp_comm_abort(rk->world);
    rank_cleanup(rk);
    return st;
}

/* One rank in this process (mpirun), on the main thread. */
static seldp_status execute_processes(hx_run *run)
{
    hx_rank *rk = &run->ranks[hx_backend_process_rank(run->backend)];
    seldp_status st = execute_rank(run, rk);
    if (st != SELDP_OK) {
        run->status = st;
        snprintf(run->error, sizeof run->error, "%s", rk->error);
    }
    return st;
}

static void *hybrid_rank_main(void *arg)
{
    hx_rank *rk = arg;
    (void)execute_rank(rk->run, rk);
    return NULL;
}

/* --ranks-per-process (the hybrid transport): this process's ranks, a thread each, every one
 * as execute_rank; the main thread waits for them. The first real error wins, as with
 * threads. */
static seldp_status execute_hybrid(hx_run *run)
{
    int first = hx_backend_local_first(run->backend), n = hx_backend_local_count(run->backend);
    for (int r = first; r < first + n; r++) {
        if (pthread_create(&run->ranks[r].thread, NULL, hybrid_rank_main, &run->ranks[r]) != 0) {
            run->ranks[r].status =
                hx_fail(SELDP_ERR_INTERNAL, "cannot start the thread of rank %d", r);
            snprintf(run->ranks[r].error, sizeof run->ranks[r].error, "%s", hx_last_error());
            for (int j = first; j < r; j++)
                if (run->ranks[j].world)
                    seldp_comm_abort(run->ranks[j].world);
            break;
        }
        run->ranks[r].started = true;
    }
    for (int r = first; r < first + n; r++)
        if (run->ranks[r].started)
            pthread_join(run->ranks[r].thread, NULL);
    first_rank_error(run, first, n);
    return run->status;
}

seldp_status hx_run_execute(hx_run *run, FILE *out)
{
    seldp_status st = SELDP_OK;
    run->t_begin = hx_now();
    run->out = run->opts.quiet || !hx_run_is_root(run) ? NULL : out;
    if (run->out) {
        hx_print_header(run, run->out);
        fflush(run->out);
    }
    tm_blas_single_thread();
    if (hx_run_is_root(run)) {
        int *all = hx_calloc((size_t)run->layout->experts, sizeof *all);
        if (!all)
            HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
        for (int e = 0; e < run->layout->experts; e++)
            all[e] = e;
        st = tm_model_create(&run->opts.model, 0, all, run->layout->experts, NULL, NULL,
                             &run->global);
        free(all);
        if (st != SELDP_OK)
            HX_FAIL_LIB(st, "creating the reference's model");
    }
    if (hx_backend_hybrid(run->backend))
        st = execute_hybrid(run);
    else
        st = hx_backend_multiprocess(run->backend) ? execute_processes(run) : execute_threads(run);
    run->t_total = hx_now() - run->t_begin;
    return st;
fail:
    run->status = st;
    snprintf(run->error, sizeof run->error, "%s", hx_last_error());
    run->t_total = hx_now() - run->t_begin;
    return st;
}
