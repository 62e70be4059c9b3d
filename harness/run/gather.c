/* The ranks of a multi-process run (one rank per MPI process, or N rank threads per process
 * with --ranks-per-process) meet on rank 0.
 *
 * Each process packs what the checks, the reference and the reports read of its rank into
 * one blob; rank 0 unpacks every other rank's blob into a mirror of that rank: an hx_rank
 * whose tm_model has the rank's experts and ids, holding the rank's parameter bytes, its
 * tokens, its reduced gradients and its rank-local check results. step_checks.c, report.c and
 * the dump's manifest then read every rank alike, so the reports of a multi-process run
 * equal those of the in-process run of the same layout.
 *
 * The blobs travel by seldp_comm_allgatherv over the world (the communicator interface has
 * no gather to one rank): every process receives them, only rank 0 keeps them. Every rank of a
 * process sends its own blob from its own thread; rank 0 unpacks those of the ranks that run in
 * other processes (its own process's ranks are there already). tiny-moe's
 * ranks hold kilobytes, so the extra traffic does not matter for a correctness harness.
 * Every process runs the same host code, so host byte order and type sizes agree. */
#include <stdlib.h>
#include <string.h>

#include "set_rank.h"
#include "capture.h"
#include "grid.h"
#include "checks.h"
#include "gather.h"
#include "rank.h"
#include "run.h"

/* ---- packing ----------------------------------------------------------------------------- */

static void put(hx_buf *b, const void *data, size_t n)
{
    hx_buf_append(b, data, n);
}

static void put_u64(hx_buf *b, uint64_t v)
{
    put(b, &v, sizeof v);
}

static void put_check(hx_buf *b, const hx_check_result *c)
{
    put(b, &c->tested, sizeof c->tested);
    put(b, &c->failed, sizeof c->failed);
    put(b, c->first_failure, sizeof c->first_failure);
}

typedef struct reader {
    const unsigned char *p;
    size_t left;
    bool short_read;
} reader;

static void get(reader *r, void *out, size_t n)
{
    if (r->short_read || n > r->left) {
        r->short_read = true;
        memset(out, 0, n);
        return;
    }
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
}

static uint64_t get_u64(reader *r)
{
    uint64_t v;
    get(r, &v, sizeof v);
    return v;
}

static void get_check(reader *r, hx_check_result *c)
{
    get(r, &c->tested, sizeof c->tested);
    get(r, &c->failed, sizeof c->failed);
    get(r, c->first_failure, sizeof c->first_failure);
    c->first_failure[sizeof c->first_failure - 1] = '\0';
}

/* ---- the exchange ------------------------------------------------------------------------ */

/* Collective over the world: every process contributes `mine`; on rank 0 *all (malloc'd)
 * holds every blob and offsets[r] where rank r's starts (offsets has world + 1 entries). */
static seldp_status exchange(hx_run *run, hx_rank *me, const hx_buf *mine, const char *what,
                             void **all, size_t *offsets)
{
    int W = run->opts.world;
    size_t *lens = hx_calloc((size_t)W, sizeof *lens);
    if (!lens)
        return SELDP_ERR_NOMEM;
    seldp_status st = seldp_comm_allgatherv(me->world, hx_buf_str(mine), mine->len, all, lens);
    if (st != SELDP_OK) {
        free(lens);
        return hx_fail_lib(st, "rank %d: allgatherv of %s", me->rank, what);
    }
    offsets[0] = 0;
    for (int r = 0; r < W; r++)
        offsets[r + 1] = offsets[r] + lens[r];
    free(lens);
    return SELDP_OK;
}

/* The mirror of rank r on rank 0: a model with r's experts and ids, and the arrays the
 * checks read. Made once, refilled by every exchange. */
static seldp_status mirror_create(hx_run *run, hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    const hx_layout *l = run->layout;
    int *owned = hx_calloc((size_t)l->experts, sizeof *owned);
    if (!owned)
        return SELDP_ERR_NOMEM;
    int n_owned = hx_layout_owned(l, rk->rank, owned);
    if (hx_grid_sharded(run)) { /* its shards, as hx_grid_setup makes them */
        tm_config shard_cfg = hx_grid_shard_config(run);
        tm_part part = hx_grid_part(run, rk->rank);
        HX_CHECK_LIB(tm_model_create_part(&shard_cfg, &part, rk->rank, owned, n_owned, NULL, NULL,
                                          &rk->model),
                     "rank 0: the mirror of rank %d's shards", rk->rank);
    } else {
        HX_CHECK_LIB(
            tm_model_create(&run->opts.model, rk->rank, owned, n_owned, NULL, NULL, &rk->model),
            "rank 0: the mirror of rank %d's model", rk->rank);
    }
    rk->n_params = tm_param_count(rk->model);
    rk->pre_init = hx_calloc(rk->n_params, sizeof *rk->pre_init);
    HX_CHECK(hx_rank_sets_list(rk));
    rk->counts = hx_calloc((size_t)run->opts.world, sizeof *rk->counts);
    rk->routed = hx_calloc((size_t)(run->opts.model.layers * l->experts), sizeof *rk->routed);
    if (!rk->pre_init || !rk->counts || !rk->routed)
        HX_FAIL(SELDP_ERR_NOMEM, "rank 0: out of memory");
    for (size_t i = 0; i < rk->n_params; i++) {
        size_t bytes = seldp_tensor_nbytes(&tm_param_at(rk->model, i)->tensor);
        rk->pre_init[i] = hx_calloc(bytes ? bytes : 1, 1);
        if (!rk->pre_init[i])
            HX_FAIL(SELDP_ERR_NOMEM, "rank 0: out of memory");
    }
fail:
    free(owned);
    return st;
}

/* Every parameter's size and bytes, in tm_param_at order (the mirror has the same order). */
static void put_params(hx_buf *b, const hx_rank *rk)
{
    put_u64(b, rk->n_params);
    for (size_t i = 0; i < rk->n_params; i++) {
        const seldp_tensor *t = &tm_param_at(rk->model, i)->tensor;
        put_u64(b, seldp_tensor_nbytes(t));
        put(b, t->data, seldp_tensor_nbytes(t));
    }
}

/* Into the mirror's parameters, or into `pre_init` when given. */
static seldp_status get_params(reader *r, hx_rank *rk, void **pre_init)
{
    if (get_u64(r) != rk->n_params)
        return hx_fail(SELDP_ERR_INTERNAL, "rank 0: rank %d sent another parameter count",
                       rk->rank);
    for (size_t i = 0; i < rk->n_params; i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        size_t bytes = seldp_tensor_nbytes(&p->tensor);
        if (get_u64(r) != bytes)
            return hx_fail(SELDP_ERR_INTERNAL, "rank 0: rank %d sent %s with another size",
                           rk->rank, p->path);
        get(r, pre_init ? pre_init[i] : p->tensor.data, bytes);
    }
    return SELDP_OK;
}

/* Unpack rank r's blob with `fn` into its mirror (made on first use). */
typedef seldp_status (*unpack_fn)(hx_run *run, hx_rank *rk, reader *r);

static seldp_status unpack_all(hx_run *run, const void *all, const size_t *offsets, unpack_fn fn)
{
    for (int r = 0; r < run->opts.world; r++) {
        if (hx_backend_is_local(run->backend, r))
            continue;
        hx_rank *rk = &run->ranks[r];
        if (!rk->model) {
            seldp_status st = mirror_create(run, rk);
            if (st != SELDP_OK)
                return st;
        }
        reader in = {(const unsigned char *)all + offsets[r], offsets[r + 1] - offsets[r], false};
        seldp_status st = fn(run, rk, &in);
        if (st != SELDP_OK)
            return st;
        if (in.short_read || in.left != 0)
            return hx_fail(SELDP_ERR_INTERNAL, "rank 0: rank %d's blob has %s bytes", r,
                           in.short_read ? "too few" : "too many");
    }
    return SELDP_OK;
}

/* Collective: pack with `pack`, exchange, unpack on rank 0. */
static seldp_status gather(hx_run *run, hx_rank *rk, void (*pack)(hx_rank *, hx_buf *),
                           unpack_fn unpack, const char *what)
{
    seldp_status st = SELDP_OK;
    int me = rk->rank;
    hx_buf blob = {0};
    void *all = NULL;
    size_t *offsets = hx_calloc((size_t)run->opts.world + 1, sizeof *offsets);
    if (!offsets)
        return SELDP_ERR_NOMEM;
    pack(rk, &blob);
    if (!hx_buf_ok(&blob))
        HX_FAIL(SELDP_ERR_NOMEM, "rank %d: out of memory packing %s", me, what);
    HX_CHECK(exchange(run, rk, &blob, what, &all, offsets));
    if (me == 0)
        HX_CHECK(unpack_all(run, all, offsets, unpack));
fail:
    hx_buf_free(&blob);
    free(all);
    free(offsets);
    return st;
}

/* ---- after initialize -------------------------------------------------------------------- */

static void pack_init(hx_rank *rk, hx_buf *b)
{
    put_u64(b, rk->n_params);
    for (size_t i = 0; i < rk->n_params; i++) {
        size_t bytes = seldp_tensor_nbytes(&tm_param_at(rk->model, i)->tensor);
        put_u64(b, bytes);
        put(b, rk->pre_init[i], bytes);
    }
    put_params(b, rk);
    put_check(b, &rk->init_untouched);
    /* rank 0 merges its own results; the others' travel once */
    if (hx_backend_process_rank(rk->run->backend) != 0)
        rk->init_untouched = (hx_check_result){0};
}

static seldp_status unpack_init(hx_run *run, hx_rank *rk, reader *r)
{
    (void)run;
    seldp_status st = get_params(r, rk, rk->pre_init);
    if (st == SELDP_OK)
        st = get_params(r, rk, NULL);
    get_check(r, &rk->init_untouched);
    return st;
}

seldp_status hx_gather_init(hx_run *run, hx_rank *rk)
{
    return gather(run, rk, pack_init, unpack_init, "the parameters after initialize");
}

/* ---- after a step ------------------------------------------------------------------------ */

/* The index of the parameter `id` in tm_param_at order (the first path of a tied id). */
static size_t param_index(const tm_model *m, seldp_param_id id)
{
    for (size_t i = 0; i < tm_param_count(m); i++)
        if (!tm_param_at(m, i)->alias && tm_param_at(m, i)->id == id)
            return i;
    return SIZE_MAX;
}

/* (L,T,K): the router's choices of a step (dispatch.c). */
static size_t choices_count(const hx_rank *rk)
{
    const tm_config *cfg = &rk->run->opts.model;
    return (size_t)cfg->layers * rk->T * (size_t)cfg->top_k;
}

static void pack_step(hx_rank *rk, hx_buf *b)
{
    put_u64(b, rk->T);
    put(b, rk->tokens, rk->T * sizeof *rk->tokens);
    put(b, rk->targets, rk->T * sizeof *rk->targets);
    put(b, rk->choices, choices_count(rk) * sizeof *rk->choices);
    put(b, &rk->loss_sum, sizeof rk->loss_sum);
    put(b, &rk->t_compute, sizeof rk->t_compute);
    put(b, &rk->t_dispatch, sizeof rk->t_dispatch);
    put(b, &rk->t_reduce, sizeof rk->t_reduce);
    for (int i = 0; i < rk->n_sets; i++)
        put_u64(b, rk->sets[i].global_weight);
    put_check(b, &rk->reduce_untouched);
    if (hx_backend_process_rank(rk->run->backend) != 0)
        rk->reduce_untouched = (hx_check_result){0};
    put_params(b, rk);
    size_t n = seldp_grads_count(rk->grads);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++) {
        seldp_param_id id;
        const seldp_tensor *g;
        seldp_grads_at(rk->grads, i, &id, &g);
        put_u64(b, param_index(rk->model, id));
        int32_t head[2] = {(int32_t)g->dtype, (int32_t)g->ndim};
        put(b, head, sizeof head);
        put(b, g->shape, (size_t)g->ndim * sizeof g->shape[0]);
        put_u64(b, seldp_tensor_nbytes(g));
        put(b, g->data, seldp_tensor_nbytes(g));
    }
}

/* This process's captured inputs of the step (capture.h): its own rank's contributions. */
static void put_capture(hx_buf *b, const hx_run *run)
{
    uint64_t n = 0;
    for (int i = 0; i < run->sets.n; i++)
        for (int k = 0; k < run->capture[i].n; k++)
            n += run->capture[i].entries[k].inputs > 0;
    put_u64(b, n);
    for (int i = 0; i < run->sets.n; i++) {
        for (int k = 0; k < run->capture[i].n; k++) {
            hx_capture_entry *e = &run->capture[i].entries[k];
            if (e->inputs == 0)
                continue;
            hx_capture_settle(e);
            put_u64(b, (uint64_t)i);
            put(b, e->path, sizeof e->path);
            put_u64(b, e->n);
            put_u64(b, (uint64_t)e->inputs);
            put(b, e->in_sum, e->n * sizeof *e->in_sum);
            put(b, e->in_abs, e->n * sizeof *e->in_abs);
            put(b, e->local_sum, e->n * sizeof *e->local_sum);
        }
    }
}

static seldp_status get_capture(reader *r, hx_run *run)
{
    seldp_status st = SELDP_OK;
    hx_capture_entry e = {0};
    uint64_t n = get_u64(r);
    for (uint64_t k = 0; k < n && !r->short_read && st == SELDP_OK; k++) {
        uint64_t set = get_u64(r);
        get(r, e.path, sizeof e.path);
        e.path[sizeof e.path - 1] = '\0';
        e.n = get_u64(r);
        e.inputs = (int)get_u64(r);
        if (set >= (uint64_t)run->sets.n || e.n > r->left)
            return hx_fail(SELDP_ERR_INTERNAL, "rank 0: a captured input of a set it has not");
        e.in_sum = hx_calloc(e.n + 1, sizeof *e.in_sum);
        e.in_abs = hx_calloc(e.n + 1, sizeof *e.in_abs);
        e.local_sum = hx_calloc(e.n + 1, sizeof *e.local_sum);
        if (!e.in_sum || !e.in_abs || !e.local_sum)
            st = hx_fail(SELDP_ERR_NOMEM, "rank 0: out of memory");
        if (st == SELDP_OK) {
            get(r, e.in_sum, e.n * sizeof *e.in_sum);
            get(r, e.in_abs, e.n * sizeof *e.in_abs);
            get(r, e.local_sum, e.n * sizeof *e.local_sum);
            if (!r->short_read)
                st = hx_capture_merge(run, &run->sets.sets[set], &e);
        }
        free(e.in_sum);
        free(e.in_abs);
        free(e.local_sum);
    }
    return st;
}

static seldp_status get_grads(reader *r, hx_rank *rk)
{
    seldp_status st = SELDP_OK;
    seldp_tensor t = {0};
    seldp_grads_destroy(rk->grads);
    rk->grads = NULL;
    HX_CHECK_LIB(seldp_grads_create(&rk->grads), "rank 0: the mirror of rank %d's gradients",
                 rk->rank);
    uint64_t n = get_u64(r);
    for (uint64_t i = 0; i < n && !r->short_read; i++) {
        uint64_t index = get_u64(r);
        int32_t head[2];
        get(r, head, sizeof head);
        const tm_param_info *p = index < rk->n_params ? tm_param_at(rk->model, index) : NULL;
        if (!p || head[1] < 0 || head[1] > SELDP_MAX_DIMS)
            HX_FAIL(SELDP_ERR_INTERNAL, "rank 0: rank %d sent a gradient it has no parameter of",
                    rk->rank);
        t = (seldp_tensor){.dtype = (seldp_dtype)head[0], .ndim = head[1]};
        get(r, t.shape, (size_t)t.ndim * sizeof t.shape[0]);
        t.device = SELDP_HOST_DEVICE;
        HX_CHECK_LIB(seldp_tensor_alloc(&t), "rank 0: the mirror of rank %d's gradient of %s",
                     rk->rank, p->path);
        if (get_u64(r) != seldp_tensor_nbytes(&t))
            HX_FAIL(SELDP_ERR_INTERNAL, "rank 0: rank %d sent the gradient of %s with another size",
                    rk->rank, p->path);
        get(r, t.data, seldp_tensor_nbytes(&t));
        HX_CHECK_LIB(seldp_grads_put(rk->grads, p->id, &t, SELDP_OWNED),
                     "rank 0: the mirror of rank %d's gradient of %s", rk->rank, p->path);
        t.data = NULL;
    }
fail:
    seldp_tensor_free(&t);
    return st;
}

static seldp_status unpack_step(hx_run *run, hx_rank *rk, reader *r)
{
    const hx_rank *root = &run->ranks[0];
    size_t T = (size_t)get_u64(r);
    if (r->short_read || T > r->left)
        return hx_fail(SELDP_ERR_INTERNAL, "rank 0: rank %d sent a truncated step", rk->rank);
    free(rk->tokens);
    free(rk->targets);
    free(rk->choices);
    rk->T = T;
    rk->tokens = hx_calloc(T, sizeof *rk->tokens);
    rk->targets = hx_calloc(T, sizeof *rk->targets);
    rk->choices = hx_calloc(choices_count(rk), sizeof *rk->choices);
    if (!rk->tokens || !rk->targets || !rk->choices)
        return SELDP_ERR_NOMEM;
    get(r, rk->tokens, T * sizeof *rk->tokens);
    get(r, rk->targets, T * sizeof *rk->targets);
    get(r, rk->choices, choices_count(rk) * sizeof *rk->choices);
    get(r, &rk->loss_sum, sizeof rk->loss_sum);
    get(r, &rk->t_compute, sizeof rk->t_compute);
    get(r, &rk->t_dispatch, sizeof rk->t_dispatch);
    get(r, &rk->t_reduce, sizeof rk->t_reduce);
    for (int i = 0; i < rk->n_sets; i++)
        rk->sets[i].global_weight = get_u64(r);
    get_check(r, &rk->reduce_untouched);
    /* the same on every rank: allgathered and allreduced by the step itself */
    memcpy(rk->counts, root->counts, (size_t)run->opts.world * sizeof *rk->counts);
    memcpy(rk->routed, root->routed,
           (size_t)(run->opts.model.layers * run->layout->experts) * sizeof *rk->routed);
    rk->global_tokens = root->global_tokens;
    seldp_status st = get_params(r, rk, NULL);
    if (st == SELDP_OK)
        st = get_grads(r, rk);
    return st;
}

static void pack_update(hx_rank *rk, hx_buf *b)
{
    const hx_check_result *c = &rk->update_check;
    put_check(b, c);
    put(b, &c->worst, sizeof c->worst);
    put(b, &c->bound, sizeof c->bound);
    put(b, &c->resolution, sizeof c->resolution);
}

static seldp_status unpack_update(hx_run *run, hx_rank *rk, reader *r)
{
    (void)run;
    hx_check_result *c = &rk->update_check;
    get_check(r, c);
    get(r, &c->worst, sizeof c->worst);
    get(r, &c->bound, sizeof c->bound);
    get(r, &c->resolution, sizeof c->resolution);
    c->metric = true;
    return SELDP_OK;
}

seldp_status hx_gather_update(hx_run *run, hx_rank *rk)
{
    return gather(run, rk, pack_update, unpack_update, "the post-step check's results");
}

seldp_status hx_gather_step(hx_run *run, hx_rank *rk)
{
    return gather(run, rk, pack_step, unpack_step, "the step's records");
}

/* A process's captures travel once, with its first rank's blob. */
static void pack_capture(hx_rank *rk, hx_buf *b)
{
    if (rk->rank == hx_backend_local_first(rk->run->backend))
        put_capture(b, rk->run);
    else
        put_u64(b, 0);
}

static seldp_status unpack_capture(hx_run *run, hx_rank *rk, reader *r)
{
    (void)rk;
    return get_capture(r, run);
}

seldp_status hx_gather_capture(hx_run *run, hx_rank *rk)
{
    seldp_status st = gather(run, rk, pack_capture, unpack_capture, "the reductions' inputs");
    if (hx_backend_process_rank(run->backend) > 0 &&
        rk->rank == hx_backend_local_first(run->backend))
        hx_capture_reset(run); /* rank 0 holds them now */
    return st;
}

/* ---- agreement --------------------------------------------------------------------------- */

typedef struct verdict {
    int32_t status;
    int32_t pad;
    int64_t failures;
    char error[1024];
} verdict;

seldp_status hx_gather_verdict(hx_run *run, hx_rank *rk, seldp_status mine, int64_t failures)
{
    seldp_status st = SELDP_OK;
    int me = rk->rank;
    int W = run->opts.world;
    verdict v = {.status = (int32_t)mine, .failures = failures};
    void *all = NULL;
    size_t *lens = hx_calloc((size_t)W, sizeof *lens);
    if (!lens)
        return SELDP_ERR_NOMEM;
    if (mine != SELDP_OK)
        snprintf(v.error, sizeof v.error, "%s", hx_last_error());
    st = seldp_comm_allgatherv(rk->world, &v, sizeof v, &all, lens);
    if (st != SELDP_OK) {
        free(lens);
        if (mine != SELDP_OK)
            return hx_fail(mine, "%s", v.error); /* keep this process's own reason */
        return hx_fail_lib(st, "rank %d: agreeing on the outcome", me);
    }
    const verdict *votes = all;
    for (int r = 0; r < W; r++) {
        if (lens[r] != sizeof v) {
            st = hx_fail(SELDP_ERR_INTERNAL, "rank %d: rank %d sent a verdict of %zu bytes", me, r,
                         lens[r]);
            break;
        }
        if (votes[r].status != SELDP_OK && st == SELDP_OK) {
            st = (seldp_status)votes[r].status;
            hx_fail(st, "%.*s", (int)sizeof votes[r].error, votes[r].error);
        }
    }
    if (lens[0] == sizeof v && me == hx_backend_local_first(run->backend))
        run->root_failures = votes[0].failures;
    free(all);
    free(lens);
    return st;
}
