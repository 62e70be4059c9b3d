/* --overlap: a rank's reductions overlapped with its backward (issue #18), as DDP's gradient
 * hooks do. After the forward each rank starts the overlapped reduction of every session it
 * belongs to (seldp_session_reduce_start and kin, the weights of the blocking step); as its
 * backward finishes a layer it exports that layer's gradients (experts, adapters, router,
 * norm, shared expert) into rk->grads and marks them ready, the final norm and an untied
 * head copy after the head, the embedding after its backward; hx_rank_reduce then finishes
 * the sessions in the blocking order, with the blocking reductions' checks. The library
 * reduces a bucket as soon as its gradients are marked, so the results are those of the
 * blocking reductions, bit for bit. Under --zero 1 the sessions' overlapped reductions are
 * reduce-scatters into the ranks' ranges (zero.h); with micro-batches only the last one's
 * forward starts them and its backward marks the gradients ready (microbatch.c).
 *
 * Host ranks in one process only: the MPI transport runs one collective of a world at a time
 * in a process (the backward's dispatch would wait for the reductions in flight, and MPI is
 * initialized for one thread), and a GPU rank's backward exports its gradients in one piece. */
#ifndef HX_OVERLAP_H
#define HX_OVERLAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/seldp.h"
#include "tinymoe.h"

#include "options.h"
#include "util.h"

typedef struct hx_run hx_run;
typedef struct hx_rank hx_rank;

/* hx_overlap_ready's points of the backward besides a layer index: after the head (the final
 * norm, an untied head copy), and after the embedding's backward (everything left). */
#define HX_READY_HEAD (-1)
#define HX_READY_REST (-2)

/* Refuse --overlap where it cannot hold (one line, a usage error; SELDP_OK without it): with
 * ranks in MPI processes, before any transport starts (hx_overlap_check_backend: mpirun is the
 * environment's to say; --backend nccl is a rule between options, options_check.c); with a
 * rank on a GPU, once the backend knows the devices (hx_overlap_check_devices). */
seldp_status hx_overlap_check_backend(const hx_options *opts);
seldp_status hx_overlap_check_devices(const hx_run *run);

/* After the forward, before the head: fresh gradient containers, and the start of every
 * session's reduction of rk->grads. Needs rk->routed (the world's tokens per expert). */
seldp_status hx_overlap_begin(hx_rank *rk);

/* The backward has produced the final gradients of layer `point` (or HX_READY_HEAD,
 * HX_READY_REST): export them into rk->grads (zeros owed under the error policy included) and
 * mark them ready in their sessions. */
seldp_status hx_overlap_ready(hx_rank *rk, int point);

/* The finishes, in the blocking order, with the blocking reductions' checks. */
seldp_status hx_overlap_finish(hx_rank *rk);

/* Free the rank's overlap state (its sessions, destroyed by the caller, cancel a reduction
 * still in flight). */
void hx_overlap_cleanup(hx_rank *rk);

#endif
