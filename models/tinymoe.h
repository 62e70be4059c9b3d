/* tiny-moe: the toy mixture-of-experts model of docs/model.md, its quantized variants
 * (NF4 and AWQ-style frozen bases with LoRA adapters), a CPU forward/backward in FP32
 * with OpenBLAS split so that experts can run on another rank, and an independent FP64
 * reference of the global loss and its gradient.
 *
 * Conventions: torch Linear, a weight is [out, in] and y = x W^T. Shapes in comments
 * are row-major, llm.c style: `x (n,D)` is n rows of D floats. T is the number of tokens
 * of this rank's step, K the top-k, E the expert count.
 *
 * One step on one rank (the harness moves the expert rows between ranks):
 *
 *   tm_begin_step(m)                          upcast/dequantize weights, zero gradients
 *   tm_embed_forward(m, tokens, T, h)         h (T,D)
 *   for l in 0..L-1:
 *     tm_route_forward(m, l, h, &route)       route.x (T,D), route.expert/gate (T,K)
 *     [tm_route_counts / tm_route_set_balance: global load-balancing statistics]
 *     -- dispatch: row route.x[t] goes to the owner of route.expert[t*K+k] (-1: dropped) --
 *     tm_expert_forward(m, l, e, x, n, y)     on the owner, for its packed rows
 *     -- return: the owner's y rows come back to slot (t,k) of y (T,K,D) --
 *     tm_combine_forward(m, l, y, h)          h += sum_k gate * y (+ the shared expert)
 *   tm_head_forward_backward(m, h, targets, &loss, dh)
 *   tm_router_loss_sum(m)                     this rank's share of the router losses
 *   for l in L-1..0:
 *     tm_combine_backward(m, l, dh, dy)       dy (T,K,D) = gate * dh
 *     tm_route_get(m, l, &route)              layer l's routing again, for the dispatch
 *     -- dispatch dy rows like the forward rows --
 *     tm_expert_backward(m, l, e, x, dy, n, dx)   on the owner (same x as its forward)
 *     -- return dx rows into dx (T,K,D) --
 *     tm_route_backward(m, l, dx, dh)         dh: grad of layer output -> of layer input
 *   tm_embed_backward(m, dh)
 *   tm_export_grads(m, ...)
 *
 * A sharded rank (docs/model.md, Sharded and pipelined grid) holds a part of the model
 * (tm_model_create_part: its pipeline stage's layers, the shard sizes V/tp, F/etp, Fs/tp) and, with
 * tensor parallelism, computes the same calls collectively over its TP group (tm_model_set_tp); a
 * later stage's tm_embed_forward only sizes the caches, its input coming from the previous stage.
 *
 * Every parameter gradient is the derivative of the rank's LOSS SUM (not the mean): the sum
 * of its token losses plus its share of the router losses (docs/model.md, Routing extensions) times
 * the global token count N, so that the shares of all data shards add up to N times the global
 * objective. All functions are for one thread at a time per model; distinct models may be used from
 * distinct threads. Errors are reported as seldp_status with a message in tm_last_error()
 * (tiny-moe's own channel; a tm_ failure clears seldp_last_error()). */
#ifndef TINYMOE_H
#define TINYMOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/dtype.h"
#include "seldp/grads.h"
#include "seldp/model.h"
#include "seldp/status.h"
#include "seldp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Message of the last failing tm_ call on the calling thread ("" if none): it names the
 * rank, the path and what was expected; a failing seldp call inside it is quoted with its
 * status and message. Owned by tiny-moe, valid until the next failing tm_ call on this
 * thread. A tm_ failure also clears seldp_last_error(), so a caller reading both channels
 * finds the newer message in the non-empty one. */
const char *tm_last_error(void);

/** Forget the calling thread's last tiny-moe error. */
void tm_clear_error(void);

/* ---------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------- */

/** How expert weights are stored. */
typedef enum tm_quant {
    TM_QUANT_NONE = 0, /**< dense trainable w1/w2 */
    TM_QUANT_NF4 = 1,  /**< frozen NF4 base + trainable LoRA adapters */
    TM_QUANT_AWQ = 2   /**< frozen AWQ-style 4-bit base + trainable LoRA adapters */
} tm_quant;

/** The token set of the load-balancing loss (docs/model.md, Routing extensions). */
typedef enum tm_aux_scope {
    TM_AUX_GLOBAL = 0, /**< f and P over the whole global batch (every data shard) */
    TM_AUX_LOCAL = 1   /**< each data shard's own tokens, weighted by its token share */
} tm_aux_scope;

/** Model configuration. Grows at the end; start from TM_CONFIG_INIT. */
typedef struct tm_config {
    int vocab;         /**< V */
    int d_model;       /**< D */
    int d_ff;          /**< F */
    int experts;       /**< E */
    int top_k;         /**< K, 1 <= K <= E */
    int layers;        /**< L */
    double eps;        /**< RMSNorm epsilon */
    seldp_dtype dtype; /**< storage of trainable parameters: SELDP_F32, SELDP_BF16, SELDP_F16 */
    tm_quant quant;    /**< expert weight format */
    int lora_rank;     /**< r (quantized variants only) */
    double lora_alpha; /**< alpha; the adapter scale is alpha / r */
    uint64_t seed;     /**< initialization seed (mixed with the rank) */
    /* Routing extensions (docs/model.md), all off when zero. */
    int d_ff_shared;             /**< Fs of the ungated shared expert; 0: none */
    double aux_loss_coeff;       /**< alpha of the load-balancing loss; 0: off */
    tm_aux_scope aux_loss_scope; /**< its token set: global (default) or each data shard */
    double z_loss_coeff;         /**< beta of the router z-loss; 0: off */
    double capacity_factor;      /**< cf of the expert capacity; 0: no capacity, no drop */
} tm_config;

#define TM_CONFIG_INIT                                                                             \
    {                                                                                              \
        64, 32, 64, 4, 2, 2, 1e-6, SELDP_F32, TM_QUANT_NONE, 4, 8.0, 1234, 0, 0.0, TM_AUX_GLOBAL,  \
            0.0, 0.0                                                                               \
    }

/** Quantization group size of the AWQ-style format (along `in`). */
#define TM_AWQ_GROUP 32
/** NF4 block size (consecutive elements sharing one absmax). */
#define TM_NF4_BLOCK 64

/** Validate a config: positive sizes, K <= E, a storage dtype among F32/BF16/F16, eps > 0;
 * for nf4: D*F a multiple of 64; for awq: D and F multiples of 32; for both: r >= 1;
 * d_ff_shared >= 0; aux_loss_coeff, z_loss_coeff and capacity_factor finite and >= 0; a
 * known aux_loss_scope.
 * Returns SELDP_ERR_INVALID_ARGUMENT naming the offending field. */
seldp_status tm_config_check(const tm_config *cfg);

/** "none", "nf4", "awq"; "invalid" outside the enum. */
const char *tm_quant_name(tm_quant quant);
/** Parse a quant name (case-insensitive). false, *out untouched, when unknown. */
bool tm_quant_parse(const char *name, tm_quant *out);
/** "f32", "bf16", "f16" for the storage dtypes; "invalid" for any other dtype. */
const char *tm_dtype_name(seldp_dtype dtype);
/** "global", "local"; "invalid" outside the enum. */
const char *tm_aux_scope_name(tm_aux_scope scope);
/** Parse an aux-loss scope name (case-insensitive). false when unknown, *out untouched. */
bool tm_aux_scope_parse(const char *name, tm_aux_scope *out);
/** Parse a storage dtype name (f32, bf16, f16; case-insensitive). false when unknown or not a
 * storage dtype, *out untouched. */
bool tm_dtype_parse(const char *name, seldp_dtype *out);

/** Write the config as one JSON object with the keys, in this order, `vocab, d_model, d_ff,
 * experts, top_k, layers, eps, dtype, quant, lora_rank, lora_alpha, seed, d_ff_shared,
 * aux_loss_coeff, aux_loss_scope, z_loss_coeff, capacity_factor` (docs/formats.md, Config JSON)
 * into buf (always NUL-terminated). Floats are written so that they parse back to the same value.
 * Returns the length it needed (excluding the NUL), like snprintf: a result >= size means
 * the text was truncated. */
size_t tm_config_json(const tm_config *cfg, char *buf, size_t size);

/* ---------------------------------------------------------------------------------------
 * Portable random numbers (the same bytes on every machine)
 * ------------------------------------------------------------------------------------- */

/** splitmix64: advances *state and returns the next 64-bit value. */
uint64_t tm_splitmix64(uint64_t *state);

/** FNV-1a 64-bit hash of a NUL-terminated string. */
uint64_t tm_hash_path(const char *path);

/* ---------------------------------------------------------------------------------------
 * The rank-local model
 * ------------------------------------------------------------------------------------- */

typedef struct tm_model tm_model;

/** What a parameter occurrence is, for building replica-group selections. Bit flags, so a
 * mask of roles can filter tm_export_grads and tm_model_copy_params. */
typedef enum tm_role {
    TM_ROLE_SHARED = 1u << 0,        /**< trainable, replicated over the shared group: embed
                                          (and its tied lm_head alias), norms, routers, the
                                          shared expert */
    TM_ROLE_SHARED_BUFFER = 1u << 1, /**< frozen, shared group: nf4.codebook */
    TM_ROLE_EXPERT = 1u << 2,        /**< trainable dense expert weight (quant none) */
    TM_ROLE_EXPERT_BASE = 1u << 3,   /**< frozen quantized base of an expert (qweight, absmax,
                                          scales, qzeros): the expert's data group */
    TM_ROLE_ADAPTER = 1u << 4        /**< trainable LoRA A or B of an expert */
} tm_role;

#define TM_ROLES_ALL 0x1fu
/** Roles that receive gradients. */
#define TM_ROLES_TRAINABLE (TM_ROLE_SHARED | TM_ROLE_EXPERT | TM_ROLE_ADAPTER)
/** Roles replicated over an expert's data group. */
#define TM_ROLES_EXPERT_GROUP (TM_ROLE_EXPERT | TM_ROLE_EXPERT_BASE | TM_ROLE_ADAPTER)
/** Roles replicated over the shared group. */
#define TM_ROLES_SHARED_GROUP (TM_ROLE_SHARED | TM_ROLE_SHARED_BUFFER)

/** One parameter occurrence of a model (the same fields it was registered with in the seldp
 * view, plus its role). The tied pair embed.weight / lm_head.weight are two occurrences with
 * the same id and storage; lm_head.weight has alias = true. Owned by the model. */
typedef struct tm_param_info {
    const char *path;
    seldp_param_id id;
    seldp_tensor tensor; /**< the storage (host), in the parameter's dtype */
    bool frozen;
    tm_role role;
    int layer;  /**< -1 for embed, lm_head, final_norm, nf4.codebook */
    int expert; /**< -1 unless role is EXPERT, EXPERT_BASE or ADAPTER */
    bool alias; /**< a second path of an id registered earlier (lm_head.weight) */
} tm_param_info;

/** Chooses the ParamId of `path` on `rank`. Called once per distinct parameter (not for the
 * lm_head.weight alias, which reuses embed.weight's id). Must return distinct ids for
 * distinct paths of one rank. */
typedef seldp_param_id (*tm_param_id_fn)(const char *path, int rank, void *user);

/** The default ParamId scheme: splitmix64 of (FNV-1a(path) XOR splitmix64(rank + 1)). Ids
 * of one path differ between ranks, as seldp allows. */
seldp_param_id tm_default_param_id(const char *path, int rank, void *user);

/** Create the model of one rank: the shared parameters and, in every layer, the experts
 * listed in `experts` (n_experts distinct ids in [0, E), any order; may be empty). All
 * parameters of one dtype live in one contiguous host allocation. Values are drawn from
 * streams keyed by (cfg->seed, rank, path), so the same seed and rank give the same bytes
 * on any machine and a different rank gives different bytes; quantized bases are made by
 * quantizing a dense random weight drawn the same way. Every occurrence is registered in a
 * seldp_model view (tm_model_view) with its path (docs/model.md, Parameters), the ids from `id_fn`
 * (NULL: the default scheme), frozen = true for quantized bases and the codebook, and tag = the
 * occurrence's tm_param_info. On success *out owns everything; on failure nothing is
 * allocated and seldp_last_error names the problem (INVALID_ARGUMENT for a bad config or
 * expert list, ALIAS/DUPLICATE for ids that collide, NOMEM). */
seldp_status tm_model_create(const tm_config *cfg, int rank, const int *experts, int n_experts,
                             tm_param_id_fn id_fn, void *id_user, tm_model **out);

/** The part of the logical model one pipeline stage holds (docs/model.md, Sharded and
 * pipelined grid): layers [first_layer, end_layer), the embedding (stage 0) and the head with
 * the final norm (the last stage). With both, embed.weight and its tied alias lm_head.weight
 * share one storage as in tm_model_create; with the head alone the copy is a parameter of its
 * own registered as `lm_head.weight` (its own id). */
typedef struct tm_part {
    int first_layer;
    int end_layer;
    bool embed;
    bool head;
} tm_part;

/** As tm_model_create, holding only `part` of the model: parameters of the other layers,
 * and the embedding or the head where the part lacks them, are not created or registered
 * (nf4.codebook always is). Sharded tensors are made by passing a config of the shard's sizes
 * (vocab V/tp, d_ff F/etp, d_ff_shared Fs/tp). Such a model holds parameters and gradients;
 * it is not for the forward functions (a working model of full shapes computes, and
 * tm_model_set_grad hands its gradients over). INVALID_ARGUMENT for a part outside
 * [0, layers) or an empty one. */
seldp_status tm_model_create_part(const tm_config *cfg, const tm_part *part, int rank,
                                  const int *experts, int n_experts, tm_param_id_fn id_fn,
                                  void *id_user, tm_model **out);

/** The part the model holds (every layer, embedding and head for tm_model_create). */
tm_part tm_model_part(const tm_model *m);

/** Replace the FP32 gradient accumulator of the trainable occurrence at `path` by grad
 * (numel floats). NOT_FOUND for an unknown or frozen path. */
seldp_status tm_model_set_grad(tm_model *m, const char *path, const float *grad);

/** Mark expert e of layer l as having seen rows this step (its gradients get exported) or
 * not. No-op out of range. */
void tm_model_set_seen(tm_model *m, int l, int e, bool seen);

/** Tensor parallelism (docs/model.md, Sharded and pipelined grid) of a model created with the shard
 * sizes (vocab V/tp, d_ff_shared Fs/tp): the communication of its TP group, which the caller
 * supplies so that tiny-moe stays free of transports. With it the model computes as Megatron's
 * tensor-parallel layers with sequence parallelism do: each TP rank's own tokens go through
 * the norms, routers and experts; they are gathered over TP before the vocabulary-parallel
 * embedding and head and the column-parallel w1 of the shared expert, and the partial
 * results of the embedding, the row-parallel w2 and the head's input gradient are summed
 * over TP and scattered back (an allreduce, then this rank's rows); the loss combines the
 * logits' maximum, sum of exponentials and target logit over TP. Gradients of the split
 * tensors cover every token of the TP group; those of the replicated norms and routers this
 * rank's own tokens (the caller sums them over TP). Every function that communicates is then
 * collective over the TP group, also on a rank without tokens. */
typedef struct tm_tp {
    int size; /**< TP ranks; 1: none */
    int rank; /**< this rank's position: its vocabulary rows begin at rank * V/size */
    void *user;
    /** Gather `bytes` of every TP rank (the sizes may differ) into `all`, in TP order. */
    seldp_status (*gather)(void *user, const void *mine, size_t bytes, void *all);
    /** Sum `count` elements of `dtype` (F32 or F64) over the TP group, in place, the same
     * bits on every rank. */
    seldp_status (*sum)(void *user, void *buf, size_t count, seldp_dtype dtype);
} tm_tp;

/** Make the model tensor-parallel (copied; size 1 turns it off). INVALID_ARGUMENT for a
 * rank outside [0, size) or, with size > 1, a missing callback. */
seldp_status tm_model_set_tp(tm_model *m, const tm_tp *tp);

/** Free the model, its view and its buffers. NULL is a no-op. */
void tm_model_destroy(tm_model *m);

/** The config the model was created with. */
const tm_config *tm_model_config(const tm_model *m);
/** The rank the model was created for. */
int tm_model_rank(const tm_model *m);
/** True when the model holds expert e (in every layer). */
bool tm_model_owns(const tm_model *m, int e);

/** The seldp view of every occurrence. Owned by the model; valid until it is destroyed. */
seldp_model *tm_model_view(tm_model *m);

/** Number of occurrences (paths), including the lm_head.weight alias. */
size_t tm_param_count(const tm_model *m);
/** The i-th occurrence in creation order (embed, lm_head, layers..., final_norm, codebook);
 * NULL when out of range. */
const tm_param_info *tm_param_at(const tm_model *m, size_t i);
/** The occurrence at `path`, or NULL. */
const tm_param_info *tm_param_find(const tm_model *m, const char *path);

/** Copy the stored bytes of every occurrence of `src` whose role is in `roles` and whose
 * expert is `expert` (-1: any), into the occurrence of `dst` at the same path. Used to build
 * a "global" model (all experts) from the ranks' replicas for the reference. Paths of src
 * absent from dst are skipped. Both models must have equal configs. Returns
 * SELDP_ERR_SCHEMA when a path has another dtype or shape, INVALID_ARGUMENT for other
 * configs; on failure some tensors may already be copied. */
seldp_status tm_model_copy_params(tm_model *dst, const tm_model *src, unsigned roles, int expert);

/* ---------------------------------------------------------------------------------------
 * Forward and backward on the CPU, FP32
 * ------------------------------------------------------------------------------------- */

/** Make OpenBLAS single-threaded (openblas_set_num_threads(1)): call once before rank
 * threads compute, so that each rank's GEMMs stay on its own thread. */
void tm_blas_single_thread(void);

/** The kernels OpenBLAS runs ("SkylakeX", "Haswell", ...): a program on the fallback of a CPU
 * model OpenBLAS does not know starts again on the CPU's (models/startup/blas_core.c). */
const char *tm_blas_core(void);

/** Start a step: upcast the stored weights to FP32 working copies (quantized bases are
 * dequantized and W + (alpha/r) B A formed), zero every gradient accumulator and forget
 * which experts saw tokens. Call after any change to the stored parameters (initialize's
 * broadcast, an optimizer update) and before every step. */
void tm_begin_step(tm_model *m);

/** The next micro-batch of a step under gradient accumulation (docs/model.md, Micro-batches):
 * as tm_begin_step, but the gradient accumulators and the experts' seen marks are kept, so
 * that the backward of this micro-batch adds to those of the step's earlier ones. */
void tm_begin_micro_batch(tm_model *m);

/** The factor the router losses of the coming micro-batch carry in the loss sum (default 1):
 * under gradient accumulation the step's objective weights micro-batch m's router losses by
 * 1/M while its token losses count by their share of the step's N tokens, so the loss-sum
 * convention scales micro-batch m's router terms by N / (M N_m). tm_router_loss_sum and the
 * router-loss gradients are multiplied by it. INVALID_ARGUMENT unless finite and >= 0. */
seldp_status tm_model_set_router_scale(tm_model *m, double scale);

/** Micro-batches in flight (a pipeline schedule, docs/model.md, Micro-batches): the model keeps
 * what a forward leaves for its backward (every layer's activations, the token ids, the
 * tensor-parallel token counts and the router losses' factor of tm_model_set_router_scale) in
 * numbered cache sets; set 0 is the one a model starts with. tm_model_use_caches makes set
 * `set` (created empty the first time) the one every forward and backward piece reads and
 * writes until the next call; tm_begin_step and tm_begin_micro_batch reset only the set in use.
 * The weights, gradient accumulators and seen marks are shared by every set, so micro-batch m's
 * forward in set k and its backward later in the same set add into the one set of gradients.
 * INVALID_ARGUMENT for set outside 0..4095, NOMEM. */
seldp_status tm_model_use_caches(tm_model *m, int set);
/** The cache set in use. */
int tm_model_cache_set(const tm_model *m);
/** Frees the activation buffers of every cache set (the next forward sizes them again), once
 * the step's backwards are done: a forward rewrites all of them, so the next step's values are
 * the same bits. Keeps the sets themselves and the one in use. */
void tm_model_release_caches(tm_model *m);

/** Embedding lookup for this rank's T tokens. tokens (T) ids in [0, V); h (T,D) out.
 * Sizes the step's activation caches for T (T may be 0). Returns INVALID_ARGUMENT for a
 * token out of range, NOMEM. */
seldp_status tm_embed_forward(tm_model *m, const int32_t *tokens, size_t T, float *h);

/** The routing of one layer, as produced by tm_route_forward. Pointers are owned by the
 * model and valid until the next tm_begin_step or tm_embed_forward. */
typedef struct tm_route {
    size_t T;
    int K;
    const int *expert; /**< (T,K) expert of slot k of token t; slots in decreasing p; -1
                            for a slot dropped by the capacity (it goes nowhere) */
    const float *gate; /**< (T,K) renormalized gates (over the top-K, before dropping) */
    const float *x;    /**< (T,D) u = rmsnorm(h) * g: the row each slot sends to its expert */
    const int *choice; /**< (T,K) the top-K experts as routed, before any dropping */
} tm_route;

/** Layer l's router: u = rmsnorm(h) * g, p = softmax(u W_r^T), the K largest p (ties: lower
 * index), gates = p / sum. With a capacity factor cf, expert e keeps the first
 * C = ceil(cf * T * K / E) of this rank's assignments to it in token order (this rank's tokens
 * are one data shard) and the others are dropped (expert -1; the gates stay as they are).
 * The load-balancing statistics start as this rank's own (tm_route_set_balance replaces
 * them). h (T,D) is the layer input and is cached. Returns INVALID_ARGUMENT for l out of
 * range or a call before tm_embed_forward. */
seldp_status tm_route_forward(tm_model *m, int l, const float *h, tm_route *route);

/** When one data shard's tokens are spread over several ranks (its TP x CP ranks, in the
 * shard's token order), decide layer l's drops for the shard: C from the shard's
 * `shard_tokens`, and this rank's assignments to e counted after before[e] (E) assignments of
 * the shard's earlier ranks (an exclusive prefix sum of tm_route_counts over them). Replaces
 * the drops of tm_route_forward (which treat this rank's tokens as the shard) in route.expert;
 * the load-balancing statistics are not touched (tm_route_set_balance). Call after
 * tm_route_forward and before the dispatch. Returns INVALID_ARGUMENT when layer l was not
 * routed or was already combined, before is NULL, shard_tokens is below this rank's T, or
 * before[e] + this rank's count exceeds shard_tokens. */
seldp_status tm_route_set_shard(tm_model *m, int l, uint64_t shard_tokens, const int64_t *before);

/** Layer l's assignments per expert this step, as routed (before any drop): counts (E) out.
 * The sums over the data shards, with their token count, are the global statistics of the
 * load-balancing loss. Returns INVALID_ARGUMENT when layer l was not routed in this step. */
seldp_status tm_route_counts(const tm_model *m, int l, int64_t *counts);

/** The token set f_e of layer l's load-balancing loss is taken from: counts (E) assignments
 * per expert (before dropping) over `tokens` tokens; f_e = counts[e] / (tokens * K). With
 * aux_loss_scope global the caller passes the sums over every data shard (and the global
 * token count); without a call (or with scope local) the layer uses this rank's own. Call
 * between tm_route_forward and tm_route_backward. Returns INVALID_ARGUMENT when layer l was
 * not routed, tokens is 0 while this rank has tokens, or a count is negative or exceeds
 * tokens. */
seldp_status tm_route_set_balance(tm_model *m, int l, const int64_t *counts, uint64_t tokens);

/** This rank's share of the router losses of the step, summed over layers, times N (the
 * loss-sum convention): per layer aux_loss_coeff * E * sum_e f_e * sum_{t here} p[t,e] plus
 * z_loss_coeff * sum_{t here} logsumexp(z_t)^2. Summed over all data shards and divided by
 * N it is the router-loss part of the global objective (for either scope). 0 with both
 * losses off; valid after every layer was routed (and given its balance). */
double tm_router_loss_sum(const tm_model *m);

/** The scale the backward gives the router losses' gradient, the load-balancing loss's and the
 * z-loss's apart (1 and 1 until called), as a framework's loss scaler of the auxiliary losses
 * sets it; the losses' values (tm_router_loss_sum) keep their coefficients. Returns
 * INVALID_ARGUMENT for a scale that is negative or not finite. */
seldp_status tm_set_router_loss_grad_scale(tm_model *m, double aux, double z);

/** The routing layer l's tm_route_forward produced in this step (pointers as above), for the
 * backward's dispatch. Returns INVALID_ARGUMENT when layer l was not routed in this step. */
seldp_status tm_route_get(const tm_model *m, int l, tm_route *route);

/** Expert e of layer l on n packed rows: y = silu(x W1^T) W2^T with the effective weights
 * (dense, or dequantized base + (alpha/r) B A). x (n,D) in, y (n,D) out. Keeps no cache
 * (tm_expert_backward recomputes), so it may be called any number of times per step.
 * Returns NOT_FOUND when the model does not hold e, INVALID_ARGUMENT for l out of range. */
seldp_status tm_expert_forward(tm_model *m, int l, int e, const float *x, size_t n, float *y);

/** Backward of tm_expert_forward: given the same x (n,D) and dy (n,D), writes dx (n,D) and
 * accumulates the expert's gradients (w1/w2, or LoRA A/B of both; never the frozen base).
 * With n > 0 the expert is marked as having seen tokens, so its gradients get exported.
 * dx may be NULL when not needed. Errors as tm_expert_forward; NOMEM. */
seldp_status tm_expert_backward(tm_model *m, int l, int e, const float *x, const float *dy,
                                size_t n, float *dx);

/** h = h_in + sum_k gate[t,k] * y[t,k,:] (+ silu(u W1s^T) W2s^T with a shared expert), with
 * h_in the layer input cached by
 * tm_route_forward (so h is normally the same buffer, updated in place). y (T,K,D): the
 * expert output of slot k of token t (as returned by its owner; rows of dropped slots are
 * not read); cached for the backward. h (T,D) out. */
seldp_status tm_combine_forward(tm_model *m, int l, const float *y, float *h);

/** dy[t,k,:] = gate[t,k] * dh[t,:] for every slot (0 for a dropped one), and dgate[t,k] =
 * dh[t]·y[t,k] kept for tm_route_backward; with a shared expert, its gradients accumulate and
 * its input gradient is kept for tm_route_backward. dh (T,D) is the gradient of the layer
 * output; dy (T,K,D) out. */
seldp_status tm_combine_backward(tm_model *m, int l, const float *dh, float *dy);

/** The rest of layer l's backward. dx (T,K,D): the gradient with respect to the expert input
 * of slot k of token t (from its owner's tm_expert_backward; rows of dropped slots are not
 * read). Backpropagates the gate gradients through the top-K renormalization, and the
 * load-balancing and z-losses, through the softmax into W_r, adds the slots' dx,
 * and goes through the RMSNorm into g and h. dh (T,D): in, the gradient of the layer output;
 * out, the gradient of the layer input (the residual path included). */
seldp_status tm_route_backward(tm_model *m, int l, const float *dx, float *dh);

/** The head: z = rmsnorm(h) * g_f, logits = z embed^T (tied), *loss_sum = sum over the T
 * tokens of logsumexp(logits) - logits[target] (in double). Accumulates the gradients of
 * the loss sum into g_f and embed (as lm_head) and writes dh (T,D). h (T,D) the last
 * layer's output; targets (T). Returns INVALID_ARGUMENT for a target out of range. */
seldp_status tm_head_forward_backward(tm_model *m, const float *h, const int32_t *targets,
                                      double *loss_sum, float *dh);

/** Backward of the lookup: adds dh (T,D) into the rows of embed's gradient. */
seldp_status tm_embed_backward(tm_model *m, const float *dh);

/** A whole step on one rank that holds every expert: tm_begin_step, forward, backward,
 * with the experts run locally; the rank's tokens are the whole batch (one data shard).
 * *loss_sum (may be NULL) receives the loss sum, router losses included. Returns
 * INVALID_ARGUMENT when an expert is not held. */
seldp_status tm_step_local(tm_model *m, const int32_t *tokens, const int32_t *targets, size_t T,
                           double *loss_sum);

/** True when expert e of layer l received at least one row in this step's backward. */
bool tm_expert_seen(const tm_model *m, int l, int e);

/** The FP32 gradient accumulator of the occurrence at `path` (numel = the parameter's);
 * NULL for frozen parameters and unknown paths. Valid until the model is destroyed. */
const float *tm_param_grad(const tm_model *m, const char *path);

/** Put this step's gradients into `out`: one owned entry per trainable parameter whose role is
 * in `roles`, keyed by its id, with the parameter's shape, holding scale * accumulator
 * rounded to the parameter dtype (fp32 = false) or kept in F32 (fp32 = true). Experts (and
 * their adapters) that saw no row in this step produce no entry; frozen parameters never
 * do; a tied parameter gives one entry. Returns DUPLICATE when an id is already in `out`
 * (entries put before the failure are removed again), NOMEM. */
seldp_status tm_export_grads(const tm_model *m, unsigned roles, double scale, bool fp32,
                             seldp_grads *out);

/** tm_export_grads for one occurrence: the entry of tm_param_at(m, index), with the same
 * bits tm_export_grads gives it, or none (OK, nothing put) where tm_export_grads gives none
 * (frozen, the tied alias, an expert that saw no row). For putting a layer's gradients into a
 * container as soon as its backward is done. INVALID_ARGUMENT for an index out of range;
 * DUPLICATE, NOMEM as tm_export_grads (nothing put). */
seldp_status tm_export_grad(const tm_model *m, size_t index, double scale, bool fp32,
                            seldp_grads *out);

/* ---------------------------------------------------------------------------------------
 * Quantization (exactly the bit layouts of docs/model.md, Quantized variants)
 * ------------------------------------------------------------------------------------- */

/** The standard 16-value NF4 table, ascending, codebook[7] == 0. */
extern const float tm_nf4_codebook[16];

/** NF4-quantize n floats (n a multiple of 64): absmax (n/64) of each block of 64
 * consecutive elements, each element mapped to the nearest codebook entry of w/absmax
 * (ties: lower code; an all-zero block gets absmax 0 and code 7); element 2j in the high
 * nibble of qweight[j], 2j+1 in its low nibble. qweight (n/2) and absmax (n/64) out.
 * Returns INVALID_ARGUMENT when n is not a multiple of 64. */
seldp_status tm_nf4_quantize(const float *w, size_t n, uint8_t *qweight, float *absmax);

/** w[i] = codebook[q_i] * absmax[i/64] for n elements (n a multiple of 64). */
void tm_nf4_dequantize(const uint8_t *qweight, const float *absmax, const float *codebook, size_t n,
                       float *w);

/** AWQ-style quantization of W (out,in), in a multiple of 32: per row and group of 32
 * inputs, scale s = (max - min) / 15 rounded to F16, zero z = round(-min / s) clamped to
 * [0,15], q = clamp(round(w / s) + z, 0, 15). qweight (out, in/8) I32 with element 8j+k of
 * a row in bits 4k..4k+3 of word j; scales (out, in/32) F16 bits; qzeros
 * (out, ceil(in/32/8)) I32 with group g's zero in word g/8, bits 4(g%8).., unused nibbles 0.
 * Returns INVALID_ARGUMENT when in is not a multiple of 32. */
seldp_status tm_awq_quantize(const float *w, int out, int in, int32_t *qweight, uint16_t *scales,
                             int32_t *qzeros);

/** W[o,i] = (q[o,i] - z[o,i/32]) * s[o,i/32], computed in F32. */
void tm_awq_dequantize(const int32_t *qweight, const uint16_t *scales, const int32_t *qzeros,
                       int out, int in, float *w);

/* ---------------------------------------------------------------------------------------
 * The FP64 reference
 * ------------------------------------------------------------------------------------- */

typedef struct tm_reference tm_reference;

/** Finite-difference hook: add `delta` to element `index` of the parameter at `path` after
 * it is upcast to FP64 (for a tied parameter, either path perturbs the one storage). */
typedef struct tm_ref_perturb {
    const char *path;
    size_t index;
    double delta;
} tm_ref_perturb;

/** The threads the reference runs on (process-wide; `threads` <= 0: the online cores, the
 * default; at most 64). The experts of a layer and the router's token blocks are computed on
 * any of them and their shared sums committed in a fixed order, so every result is the same
 * bits whatever the count. Call it between references, not during one. */
void tm_reference_set_threads(int threads);
/** The thread count the next reference will use. */
int tm_reference_threads(void);
/** fn(ctx, item) for items 0 to items - 1 on the reference's threads, each once, on any of
 * them in any order; returns when all have run. For work whose items write only their own
 * results (the harness's checks), so the results do not depend on the thread count. */
void tm_parallel_for(int items, void (*fn)(void *ctx, int item), void *ctx);

/** The global objective in FP64 (cblas_dgemm), by code independent of the
 * FP32 path: the mean over all tokens of all ranks of the token loss, plus the router losses
 * the config enables (docs/model.md, Routing extensions), and its gradient for every trainable
 * parameter. Each of the n_ranks token lists is one data shard (capacity and the local-scope
 * load-balancing loss are per shard, in the order of its tokens). `weights` must hold every path of
 * `cfg` (docs/model.md, Parameters) with all experts (e.g. tm_model_view of a model created with
 * all experts and filled with tm_model_copy_params); values are read as stored and upcast exactly,
 * quantized bases dequantized in FP64. tokens[r], targets[r] (counts[r]) are rank r's, for n_ranks
 * ranks. perturb may be NULL. On success *out owns the result. Errors: INVALID_ARGUMENT (config,
 * token or target out of range, no token at all), NOT_FOUND (a path missing), SHAPE/DTYPE
 * (a tensor not as docs/model.md's parameter table says), NOMEM. */
seldp_status tm_reference_compute(const tm_config *cfg, const seldp_model *weights,
                                  const int32_t *const *tokens, const int32_t *const *targets,
                                  const size_t *counts, int n_ranks, const tm_ref_perturb *perturb,
                                  tm_reference **out);

/** As tm_reference_compute, following the FP32 model at near ties: choices[r] (NULL, or any
 * entry NULL, to never follow) is rank r's (L, counts[r], K) top-K experts as its model chose
 * them (tm_route.choice of each layer). Where the reference's FP64 top-K of a token differs
 * from the model's choice only by a near tie (every chosen logit at least the largest unchosen
 * one minus 1e-4 * (1 + max |logit|)), the two precisions may rank the experts either way, and
 * a gradient is discontinuous there: the reference takes the model's set, and counts it
 * (tm_reference_ties_followed). A larger difference is kept, so the checks still see a
 * routing that no rounding explains. */
seldp_status tm_reference_compute_routed(const tm_config *cfg, const seldp_model *weights,
                                         const int32_t *const *tokens,
                                         const int32_t *const *targets, const size_t *counts,
                                         int n_ranks, const tm_ref_perturb *perturb,
                                         const int *const *choices, tm_reference **out);

/** One micro-batch of a step for tm_reference_compute_micro: its data shards' token lists
 * (as tm_reference_compute_routed takes them) and the model's choices (NULL to never follow). */
typedef struct tm_micro_batch {
    const int32_t *const *tokens;
    const int32_t *const *targets;
    const size_t *counts;
    int n_shards;
    const int *const *choices;
} tm_micro_batch;

/** The reference of a step of M micro-batches under gradient accumulation (docs/model.md,
 * Micro-batches): the mean token loss over every token of every micro-batch plus each
 * micro-batch's router losses (over its own data shards: capacity and load-balancing statistics
 * per micro-batch) weighted 1/M, and its gradient. The magnitudes add the accumulation's
 * rounding (one per micro-batch and element). The result's counts (tokens, routed, dropped,
 * ties followed) are the sums over the micro-batches. M = 1 is tm_reference_compute_routed.
 * INVALID_ARGUMENT for M < 1 or a micro-batch without tokens; otherwise as
 * tm_reference_compute_routed. */
seldp_status tm_reference_compute_micro(const tm_config *cfg, const seldp_model *weights,
                                        const tm_micro_batch *micro, int M, tm_reference **out);

/** Assignments (token x choice x layer) the capacity dropped over every layer and data shard. */
size_t tm_reference_dropped(const tm_reference *ref);

/** Tokens-and-layers at which tm_reference_compute_routed followed the model's near tie. */
size_t tm_reference_ties_followed(const tm_reference *ref);

/** Free a result. NULL is a no-op. */
void tm_reference_destroy(tm_reference *ref);

/** The global mean loss. */
double tm_reference_loss(const tm_reference *ref);

/** Total token count over all ranks. */
size_t tm_reference_tokens(const tm_reference *ref);

/** The gradient of the mean loss with respect to the parameter at `path` (numel elements,
 * row-major in its shape; the tied embed.weight and lm_head.weight give the same array).
 * NULL for frozen parameters, unknown paths, and experts that no token reached (whose
 * gradients must stay absent). */
const double *tm_reference_grad(const tm_reference *ref, const char *path, size_t *numel);

/** The magnitude of each element of tm_reference_grad's array (the same numel and NULL
 * cases): the standard deviation of the FP32 model's rounding error of that element, in units
 * of the FP32 unit roundoff, carried through the forward and the backward by variance
 * propagation (each sum's own rounding and its inputs' errors in quadrature;
 * reference_magnitude.c). Where the terms of an element cancel it stays large while the value
 * shrinks. The checks bound the FP32 error by a few of these (docs/tolerances.md). */
const double *tm_reference_magnitude(const tm_reference *ref, const char *path, size_t *numel);

/** The magnitude of the global mean loss: the standard deviation of the FP32 model's rounding
 * error of the loss (token losses and router losses), in units of the FP32 unit roundoff, by the
 * same variance propagation as tm_reference_magnitude. */
double tm_reference_loss_magnitude(const tm_reference *ref);

/** The largest value among the FP32 model's intermediates the reference formed: a norm's sum
 * of squares, the head's largest logit and log-sum-exp. Beyond FLT_MAX the FP32 model has
 * overflowed where the FP64 reference did not (the run diverged). */
double tm_reference_largest(const tm_reference *ref);

/** Number of tokens (over all ranks, counting each of the K slots) that layer l routed to
 * expert e and that expert e processed (assignments dropped by the capacity not counted). */
size_t tm_reference_routed(const tm_reference *ref, int l, int e);

/** ||scale * g - ref|| / ||ref|| over n elements, g read in its own dtype (F32, F64, F16,
 * BF16); when ||ref|| == 0 the absolute norm ||scale * g|| is returned. A negative value
 * when g's dtype is not a float type or its numel is not n. */
double tm_rel_error(const seldp_tensor *g, double scale, const double *ref, size_t n);

#ifdef __cplusplus
}
#endif
#endif
