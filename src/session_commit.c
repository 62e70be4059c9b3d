/* The commit of a reduction: the results written into the caller's container, after every
 * collective of the call has succeeded on every rank. Staged results are converted from the
 * F32 staging buffer into the caller's tensors (or the results allocated in advance), owned
 * results take the place of the caller's entries, and gradients absent on every active rank
 * are removed. Nothing here allocates but the container's own bookkeeping, whose room was
 * reserved before the agreement. */
#include <stdlib.h>

#include "device.h"
#include "internal.h"
#include "kernels.h"
#include "session_reduce.h"

/* Remove the entry of `id`, freeing it when the container owned it. */
static void drop_gradient(seldp_grads *grads, seldp_param_id id)
{
    seldp_tensor t;
    seldp_ownership own;
    if (seldp_grads_take(grads, id, &t, &own) && own == SELDP_OWNED)
        seldp_tensor_free(&t);
}

/* Put the owned result of `id` in place of the caller's entry, if any. When the container
 * cannot grow (SELDP_ERR_NOMEM), the caller's entry is put back and the error returned. */
static seldp_status replace_gradient(seldp_grads *grads, seldp_param_id id, seldp_tensor *result)
{
    seldp_tensor old;
    seldp_ownership own = SELDP_BORROWED;
    bool had = seldp_grads_take(grads, id, &old, &own);
    seldp_status st = seldp_grads_put(grads, id, result, SELDP_OWNED);
    if (st != SELDP_OK) {
        if (had)
            seldp_grads_put(grads, id, &old, own);
        return st;
    }
    result->data = NULL; /* the container owns it now */
    if (had && own == SELDP_OWNED)
        seldp_tensor_free(&old);
    return SELDP_OK;
}

/* The staged results converted into the caller's tensors, or the results allocated in
 * prepare, in batches (one kernel launch per batch on a GPU). */
static seldp_status commit_convert(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;
    seldp__convert_queue q = {.device = s->device};

    for (size_t k = 0; k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = seldp__reduce_result_dtype(c, g);
        if (!slot->present)
            continue;
        bool in_place = slot->has_grad && slot->grad.dtype == dtype;
        if (slot->in_place)
            continue; /* the overlapped reduction wrote its results there already */
        SELDP_CHECK(
            seldp__convert_queue_add(&q, (seldp__convert_seg){
                                             .dst = in_place ? slot->grad.data : slot->result.data,
                                             .src = s->staging + slot->offset,
                                             .dst_dtype = dtype,
                                             .src_dtype = c->staged_as_result ? dtype : SELDP_F32,
                                             .n = seldp_tensor_numel(&g->tensor),
                                         }));
    }
    SELDP_CHECK(seldp__convert_queue_flush(&q));
fail:
    return st;
}

/* Write the results into the caller's container. Everything it needs, the container's
 * room for new entries included, was allocated before the agreement. */
seldp_status seldp__reduce_commit(reduce_call *c)
{
    seldp_status st = SELDP_OK;
    seldp_session *s = c->s;

    if (c->staged)
        SELDP_CHECK(commit_convert(c));
    for (size_t k = 0; k < s->n_slots; k++) {
        const session_param *g = &s->params[s->slot_param[k]];
        reduce_slot *slot = &c->slots[k];
        seldp_dtype dtype = seldp__reduce_result_dtype(c, g);
        if (!slot->present) {
            drop_gradient(c->grads, g->id);
        } else if (!(slot->has_grad && slot->grad.dtype == dtype)) {
            /* owned results (written by the transport, or by commit_convert from the staging
             * buffer) go into the container in place of the caller's entry */
            SELDP_CHECK(replace_gradient(c->grads, g->id, &slot->result));
        }
    }
fail:
    return st;
}
