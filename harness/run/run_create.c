/* hx_run_create: options resolved into a run, its layout, ranks, sets, checks and outputs
 * checked before any step (run.h); refused runs create nothing. */
#define _POSIX_C_SOURCE 200809L

#include "sets.h"
#include "checks.h"
#include "run.h"
#include "run_create.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "grid.h"
#include "overlap.h"
#include "router.h"
#include "inject.h"
#include "capture.h"
#include "microbatch.h"
#include "optimizer.h"
#include "zero.h"
#include "loss_scale.h"
#include "rank.h"

static double tolerance_for(seldp_dtype dtype)
{
    switch (dtype) {
    case SELDP_F16:
        return 2e-3;
    case SELDP_BF16:
        return 1e-2;
    default:
        return 1e-5;
    }
}

static int gcd(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* --save's generation and --resume's checkpoint, read and verified whole here, so that a bad
 * one is refused before anything runs (a rule against the checkpoint, not between options). */
static seldp_status checkpoint_options(hx_run *run)
{
    seldp_status st = SELDP_OK;
    const hx_options *o = &run->opts;
    if (o->save_dir)
        run->ckpt_generation = hx_ckpt_next_generation(o->save_dir);
    if (!o->resume_dir)
        return SELDP_OK;
    st = hx_ckpt_open(o->resume_dir, &run->resume);
    if (st == SELDP_OK)
        st = hx_ckpt_verify(run->resume, o);
    if (st != SELDP_OK)
        return st; /* the message names the file under DIR and the problem */
    run->first_step = hx_ckpt_step(run->resume);
    if (run->first_step >= o->steps)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--resume %s: the checkpoint ends step %d; --steps %d leaves nothing to "
                       "train (--steps is the total, resumed steps included)",
                       o->resume_dir, run->first_step, o->steps);
    return st;
}

/* The ranks whose tokens form the global batch: every rank, or with pipeline parallelism
 * the stage-0 ranks (the later stages take their stage-0 rank's tokens). */
static seldp_status batch_ranks(hx_run *run)
{
    int W = run->opts.world;
    run->batch_ranks = hx_calloc((size_t)W, sizeof *run->batch_ranks);
    if (!run->batch_ranks)
        return SELDP_ERR_NOMEM;
    run->n_batch = 0;
    for (int r = 0; r < W; r++)
        if (hx_grid_batch_rank(run, r) == r)
            run->batch_ranks[run->n_batch++] = r;
    return SELDP_OK;
}

seldp_status hx_run_create(const hx_options *opts, hx_run **out)
{
    seldp_status st = SELDP_OK;
    hx_run *run = hx_calloc(1, sizeof *run);
    if (!run)
        return SELDP_ERR_NOMEM;
    run->opts = *opts;
    pthread_mutex_init(&run->gate_lock, NULL);
    pthread_cond_init(&run->gate_cond, NULL);
    hx_options *o = &run->opts;
    HX_CHECK(hx_options_rules(o, NULL)); /* options_check.c: every rule between options */
    if (o->zero)
        o->fp32_master = true; /* the distributed optimizer's FP32 gradients and masters */
    HX_CHECK(hx_overlap_check_backend(o));
    /* one rank per MPI process: the world is the number of processes unless given (a rule
     * against the environment, not between options) */
    if (o->ranks_per_process && !hx_backend_under_mpirun())
        HX_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                "--ranks-per-process %d: only under mpirun (every process hosts that many rank "
                "threads); without mpirun every rank is a thread of this process already",
                o->ranks_per_process);
    hx_backend_request_hybrid(o->ranks_per_process);
    if (hx_backend_uses_processes(o->backend)) {
        int processes = 0, rank = 0;
        HX_CHECK(hx_backend_processes(&processes, &rank));
        if (o->ranks_per_process)
            processes *= o->ranks_per_process; /* the ranks */
        if (!o->world_given && !o->layout_file) {
            o->world = processes;
            if (!o->ep_given)
                o->ep = gcd(o->ep, processes);
        }
    }
    if (o->layout_file) {
        HX_CHECK(hx_layout_load(o->layout_file, o->world_given ? o->world : 0,
                                o->experts_given ? o->model.experts : 0, o->roots, &run->layout));
        o->world = run->layout->world;
        o->model.experts = run->layout->experts;
    } else {
        HX_CHECK(hx_layout_generate_grid(o->world, o->ep, o->model.experts, &o->grid, o->roots,
                                         &run->layout));
    }
    HX_CHECK(hx_layout_roots_merge(run->layout, &o->roots, &o->roots_given));
    st = tm_config_check(&o->model);
    if (st != SELDP_OK)
        HX_FAIL(SELDP_ERR_INVALID_ARGUMENT, "model options: %s", tm_last_error());
    HX_CHECK(checkpoint_options(run));
    HX_CHECK(hx_backend_open(o->backend, o->world, o->timeout_s, &run->backend));
    HX_CHECK(hx_router_check(run));
    HX_CHECK(hx_grid_check_options(run));
    HX_CHECK(hx_micro_check(run));
    HX_CHECK(hx_opt_check(run));
    HX_CHECK(hx_zero_check(run));
    HX_CHECK(hx_loss_scale_check(run));
    HX_CHECK(hx_overlap_check_devices(run));
    HX_CHECK(batch_ranks(run));
    HX_CHECK(hx_sets_build(run));
    if (!o->inject_anywhere)
        HX_CHECK(hx_inject_check(run));
    run->grad_dtype = o->fp32_master ? SELDP_F32 : o->model.dtype;
    run->tolerance = tolerance_for(run->grad_dtype);
    run->tol = hx_tolerance_of(&o->model, run->grad_dtype);
    HX_CHECK(hx_capture_create(run));
    int L = o->model.layers, E = run->layout->experts;
    run->ranks = hx_calloc((size_t)o->world, sizeof *run->ranks);
    run->set_errors = hx_calloc((size_t)run->sets.n, sizeof *run->set_errors);
    run->steps = hx_calloc((size_t)(o->steps ? o->steps : 1), sizeof *run->steps);
    run->expert_tokens = hx_calloc((size_t)(L * E), sizeof *run->expert_tokens);
    run->set_weights = hx_calloc((size_t)run->sets.n, sizeof *run->set_weights);
    if (!run->ranks || !run->set_errors || !run->steps || !run->expert_tokens || !run->set_weights)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    for (int c = 0; c < HX_CHECK_COUNT; c++)
        run->checks[c].limit = NAN;
    static const hx_check_id metrics[] = {HX_CHECK_LOSS,       HX_CHECK_REDUCTION,
                                          HX_CHECK_RANK_GRADS, HX_CHECK_GRAD_ERROR,
                                          HX_CHECK_GRAD_NORM,  HX_CHECK_UPDATE};
    for (size_t k = 0; k < sizeof metrics / sizeof *metrics; k++) {
        run->checks[metrics[k]].metric = true;
        run->checks[metrics[k]].limit = 1.0;
    }
    for (int r = 0; r < o->world; r++) {
        run->ranks[r].rank = r;
        run->ranks[r].run = run;
        run->ranks[r].loss_scale = 1.0;
        run->ranks[r].batch_rank = hx_grid_batch_rank(run, r);
    }
    double saved_scale = 0;
    int64_t saved_good = 0;
    bool resumed = hx_ckpt_loss_scale(run->resume, &saved_scale, &saved_good);
    hx_loss_scale_init(run, resumed ? &saved_scale : NULL, saved_good);
    /* every output is writable before a step runs (a run is not lost to a bad path at its
     * end), checked last: a refused run creates nothing */
    if (o->out_dir && o->out_dir[0])
        HX_CHECK(hx_check_writable(o->out_dir, true, "--out"));
    if (o->dump_dir)
        HX_CHECK(hx_check_writable(o->dump_dir, true, "--dump"));
    if (o->save_dir)
        HX_CHECK(hx_check_writable(o->save_dir, true, "--save"));
    if (o->summary)
        HX_CHECK(hx_check_writable(o->summary, false, "--summary"));
    *out = run;
    return SELDP_OK;
fail:
    hx_run_destroy(run);
    return st;
}

void hx_run_destroy(hx_run *run)
{
    if (!run)
        return;
    for (int r = 0; run->ranks && r < run->opts.world; r++) {
        hx_rank *rk = &run->ranks[r];
        for (size_t i = 0; rk->pre_init && i < rk->n_params; i++)
            free(rk->pre_init[i]);
        for (size_t i = 0; rk->master && i < rk->n_params; i++)
            free(rk->master[i]);
        free(rk->pre_init);
        free(rk->master);
        free(rk->sets);
        free(rk->counts);
        free(rk->routed);
        free(rk->tokens);
        free(rk->targets);
        free(rk->choices);
        seldp_grads_destroy(rk->grads);
        hx_opt_destroy(rk->opt);
        hx_zero_destroy(rk->zero);
        tm_model_destroy(rk->model);
        free(rk->grid);
    }
    free(run->batch_ranks);
    tm_model_destroy(run->global);
    hx_ckpt_close(run->resume);
    free(run->ranks);
    free(run->set_errors);
    free(run->steps);
    free(run->expert_tokens);
    free(run->set_weights);
    hx_capture_destroy(run);
    hx_sets_free(&run->sets);
    hx_backend_close(run->backend);
    hx_layout_destroy(run->layout);
    pthread_mutex_destroy(&run->gate_lock);
    pthread_cond_destroy(&run->gate_cond);
    free(run);
}
