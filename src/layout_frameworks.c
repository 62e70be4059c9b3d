/* How each framework builds its groups, written from its own group-construction code:
 *
 *   Megatron-Core   Megatron-LM megatron/core/parallel_state.py (NVIDIA/Megatron-LM at
 *                   00caa53af30912914981c86f39db123961678bbd): RankGenerator,
 *                   generate_masked_orthogonal_rank_groups, initialize_model_parallel.
 *   Megatron 0.9    the same file of the core_r0.9.0 release: one RankGenerator whose
 *                   get_ranks(token, independent_ep=True) splits dp into (ep, dp / ep).
 *   DeepSpeed       deepspeed/utils/groups.py (deepspeedai/DeepSpeed at
 *                   0899bfad02577b690dde15565b4b92bd729687f0): _create_expert_and_data_parallel
 *                   (its mp_size-less path) without expert tensor parallelism,
 *                   _get_expert_parallel_ranks with it, as deepspeed/moe/layer.py
 *                   MoE._create_process_groups (at 639460ab3299c47139aff6a28627aa4e901391ba)
 *                   chooses; the dense groups are Megatron's mpu (tensor fastest, then data,
 *                   then pipeline).
 *   torchtitan      torchtitan/distributed/parallel_dims.py (pytorch/torchtitan at
 *                   0119de156de558030726b8539ef0078d8aaaec99): ParallelDims._validate and
 *                   build_mesh, with dp_replicate = 1 (FSDP over every data rank).
 *
 * Every framework broadcasts a group's parameters from its group rank 0 (Megatron's
 * broadcast_params, DeepSpeed's _get_broadcast_src_rank / _get_expert_broadcast_src_rank)
 * and gives EP position j the experts j * E / ep .. (j + 1) * E / ep - 1 (Megatron's
 * local_expert_indices_offset, DeepSpeed's num_local_experts per EP rank, torchtitan's
 * Shard(0) of the expert dimension over the EP mesh). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"
#include "layout_impl.h"

#define REJECT(...) return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* ---- Megatron's order strings ------------------------------------------------------------ */

/* The tokens in the order of RankGenerator.name_to_size, which decides which missing token
 * is reported first. */
enum { TOK_TP, TOK_PP, TOK_DP, TOK_EP, TOK_CP, N_TOK };
static const char *const tok_names[N_TOK] = {"tp", "pp", "dp", "ep", "cp"};

/* An order string as token ids, fastest first. */
typedef struct order_tokens {
    int n;
    int ids[N_TOK];
} order_tokens;

static seldp_status parse_order(const seldp_layout *l, const char *order, order_tokens *out)
{
    out->n = 0;
    const char *p = order;
    for (;;) {
        const char *dash = strchr(p, '-');
        size_t len = dash ? (size_t)(dash - p) : strlen(p);
        int id = -1;
        for (int t = 0; t < N_TOK; t++)
            if (len == 2 && strncasecmp(p, tok_names[t], 2) == 0)
                id = t;
        if (id < 0)
            REJECT("%s: order '%s': '%.*s' is not one of Megatron's tokens tp, cp, ep, dp, pp",
                   l->what, order, (int)len, p);
        for (int i = 0; i < out->n; i++)
            if (out->ids[i] == id)
                REJECT("%s: order '%s': '%s' appears twice", l->what, order, tok_names[id]);
        out->ids[out->n++] = id;
        if (!dash)
            break;
        p = dash + 1;
    }
    return SELDP_OK;
}

static bool order_has(const order_tokens *o, int id)
{
    for (int i = 0; i < o->n; i++)
        if (o->ids[i] == id)
            return true;
    return false;
}

/* RankGenerator.__init__: a token of size > 1 must be in the order; the missing ones are
 * appended (slowest) with size 1. */
static seldp_status generator_order(const seldp_layout *l, const int size_of[N_TOK],
                                    const order_tokens *given, order_tokens *out)
{
    *out = *given;
    for (int t = 0; t < N_TOK; t++) {
        if (order_has(given, t))
            continue;
        if (size_of[t] != 1)
            REJECT("%s: The size of (%s) is (%d), but you haven't specified the order (%s).",
                   l->what, tok_names[t], size_of[t], l->cfg.order);
        out->ids[out->n++] = t;
    }
    return SELDP_OK;
}

/* RankGenerator.get_ranks(token): the groups varying the dimensions named in `tokens`
 * (a 0-terminated list of ids + 1, so that TOK_TP can be listed). `skip` drops one token
 * from the grid (Megatron 0.9's order without ep), -1 for none. */
static seldp_status generator_groups(seldp_layout *l, seldp_group_kind kind,
                                     const order_tokens *order, const int size_of[N_TOK], int skip,
                                     const int *tokens)
{
    int sizes[N_TOK], n = 0;
    bool mask[N_TOK];
    for (int i = 0; i < order->n; i++) {
        int id = order->ids[i];
        if (id == skip)
            continue;
        sizes[n] = size_of[id];
        mask[n] = false;
        for (const int *t = tokens; *t; t++)
            mask[n] = mask[n] || *t - 1 == id;
        n++;
    }
    return seldp__layout_masked(l, kind, n, sizes, mask);
}

#define TOKENS(...)                                                                                \
    (const int[])                                                                                  \
    {                                                                                              \
        __VA_ARGS__, 0                                                                             \
    }
#define T(id) ((id) + 1)

static seldp_status experts_divisible(const seldp_layout *l, const char *reason)
{
    if (l->cfg.experts > 0 && l->cfg.experts % l->cfg.ep != 0)
        REJECT("%s: %s (experts %d, ep %d)", l->what, reason, l->cfg.experts, l->cfg.ep);
    return SELDP_OK;
}

/* ---- Megatron-Core: the dense grid and the separate expert grid ------------------------- */

static seldp_status build_megatron(seldp_layout *l)
{
    seldp_status st = SELDP_OK;
    seldp_layout_config *c = &l->cfg;
    if (!c->order)
        c->order = "tp-cp-ep-dp-pp";
    if (c->etp == 0)
        c->etp = c->tp; /* expert_tensor_parallel_size defaults to tp */
    int model = c->tp * c->pp * c->cp;
    if (c->world % model != 0)
        REJECT("%s: world_size (%d) is not divisible by %d", l->what, c->world, model);
    l->dp = c->world / model;
    /* in initialize_model_parallel's order: the dense generator, the expert sizes, the
     * expert generator */
    order_tokens given, dense, expert;
    SELDP_CHECK(parse_order(l, c->order, &given));
    const int dense_size[N_TOK] = {c->tp, c->pp, l->dp, 1, c->cp};
    SELDP_CHECK(generator_order(l, dense_size, &given, &dense));
    int expert_model = c->etp * c->ep * c->pp;
    if (c->world % expert_model != 0)
        REJECT("%s: world_size (%d) is not divisible by expert_tensor_model_pipeline_parallel size "
               "(%d)",
               l->what, c->world, expert_model);
    int edp = c->world / expert_model;
    const int expert_size[N_TOK] = {c->etp, c->pp, edp, c->ep, 1};
    SELDP_CHECK(generator_order(l, expert_size, &given, &expert));
    size_t len = strlen(c->order);
    if (!(len >= 2 && strcasecmp(c->order + len - 2, "pp") == 0) && c->pp != 1 && edp != l->dp)
        REJECT("%s: When not using pp-last rank ordering, the data parallel size of the attention "
               "and moe layers must be the same (dp %d, expert dp %d)",
               l->what, l->dp, edp);
    SELDP_CHECK(experts_divisible(l, "Number of experts should be a multiple of expert model "
                                     "parallel_size."));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_TP, &dense, dense_size, -1, TOKENS(T(TOK_TP))));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_PP, &dense, dense_size, -1, TOKENS(T(TOK_PP))));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_CP, &dense, dense_size, -1, TOKENS(T(TOK_CP))));
    SELDP_CHECK(
        generator_groups(l, SELDP_GROUP_DP, &dense, dense_size, -1, TOKENS(T(TOK_DP), T(TOK_CP))));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_EP, &expert, expert_size, -1, TOKENS(T(TOK_EP))));
    SELDP_CHECK(
        generator_groups(l, SELDP_GROUP_EXPERT_DP, &expert, expert_size, -1, TOKENS(T(TOK_DP))));
    SELDP_CHECK(
        generator_groups(l, SELDP_GROUP_EXPERT_TP, &expert, expert_size, -1, TOKENS(T(TOK_TP))));
    /* initialize_model_parallel asserts both grids give the same pipeline groups */
    layout_kind dense_pp = l->kinds[SELDP_GROUP_PP];
    l->kinds[SELDP_GROUP_PP] = (layout_kind){0};
    st = generator_groups(l, SELDP_GROUP_PP, &expert, expert_size, -1, TOKENS(T(TOK_PP)));
    bool same = st == SELDP_OK && memcmp(dense_pp.ranks, l->kinds[SELDP_GROUP_PP].ranks,
                                         (size_t)c->world * sizeof(int)) == 0;
    free(l->kinds[SELDP_GROUP_PP].ranks);
    free(l->kinds[SELDP_GROUP_PP].group_of);
    free(l->kinds[SELDP_GROUP_PP].pos_of);
    l->kinds[SELDP_GROUP_PP] = dense_pp;
    SELDP_CHECK(st);
    if (!same)
        REJECT("%s: Pipeline parallel groups are expected to be the same for Non-Expert and "
               "Expert part (order %s puts pp inside the grids, whose dp sizes differ: %d and %d)",
               l->what, c->order, l->dp, edp);
    return seldp__layout_embedding(l);
fail:
    return st;
}

/* ---- Megatron-Core 0.9: expert parallelism carved out of data parallelism --------------- */

static seldp_status build_megatron_0_9(seldp_layout *l)
{
    seldp_status st = SELDP_OK;
    seldp_layout_config *c = &l->cfg;
    if (!c->order)
        c->order = "tp-cp-ep-dp-pp";
    if (c->etp == 0)
        c->etp = c->tp;
    if (c->etp != c->tp)
        REJECT("%s: Megatron-Core 0.9 has no expert_tensor_parallel_size: experts are split over "
               "the tensor-parallel group, so etp must equal tp (%d)",
               l->what, c->tp);
    int model = c->tp * c->pp * c->cp;
    if (c->world % model != 0)
        REJECT("%s: world_size (%d) is not divisible by %d", l->what, c->world, model);
    l->dp = c->world / model;
    if (l->dp % c->ep != 0)
        REJECT("%s: data_parallel_size (%d) is not divisible by expert_model_parallel_size (%d)",
               l->what, l->dp, c->ep);
    order_tokens given, order;
    SELDP_CHECK(parse_order(l, c->order, &given));
    if (order_has(&given, TOK_EP) && !strstr(c->order, "ep-dp") && !strstr(c->order, "dp-ep"))
        REJECT("%s: The ep and dp must be adjacent in order (%s).", l->what, c->order);
    const int size_of[N_TOK] = {c->tp, c->pp, l->dp, c->ep, c->cp};
    SELDP_CHECK(generator_order(l, size_of, &given, &order));
    SELDP_CHECK(experts_divisible(l, "Number of experts should be a multiple of expert model "
                                     "parallel_size."));
    /* get_ranks(token, independent_ep=False): the order without ep, dp whole */
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_TP, &order, size_of, TOK_EP, TOKENS(T(TOK_TP))));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_PP, &order, size_of, TOK_EP, TOKENS(T(TOK_PP))));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_CP, &order, size_of, TOK_EP, TOKENS(T(TOK_CP))));
    SELDP_CHECK(
        generator_groups(l, SELDP_GROUP_DP, &order, size_of, TOK_EP, TOKENS(T(TOK_DP), T(TOK_CP))));
    /* the expert tensor group is the tensor group */
    SELDP_CHECK(
        generator_groups(l, SELDP_GROUP_EXPERT_TP, &order, size_of, TOK_EP, TOKENS(T(TOK_TP))));
    /* independent_ep=True: dp becomes (ep, dp / ep) where the order names them; expert
     * gradients reduce over data-modulo-expert with context parallelism ('dp-cp') */
    const int ep_size_of[N_TOK] = {c->tp, c->pp, l->dp / c->ep, c->ep, c->cp};
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_EP, &order, ep_size_of, -1, TOKENS(T(TOK_EP))));
    SELDP_CHECK(generator_groups(l, SELDP_GROUP_EXPERT_DP, &order, ep_size_of, -1,
                                 TOKENS(T(TOK_DP), T(TOK_CP))));
    return seldp__layout_embedding(l);
fail:
    return st;
}

/* ---- DeepSpeed --------------------------------------------------------------------------- */

/* The dense groups of Megatron's mpu, which DeepSpeed takes its data-parallel group from:
 * tensor fastest, then data, then pipeline. */
static seldp_status deepspeed_dense(seldp_layout *l)
{
    seldp_status st = SELDP_OK;
    const int sizes[3] = {l->cfg.tp, l->dp, l->cfg.pp};
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_TP, 3, sizes, (const bool[]){1, 0, 0}));
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_DP, 3, sizes, (const bool[]){0, 1, 0}));
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_PP, 3, sizes, (const bool[]){0, 0, 1}));
    SELDP_CHECK(seldp__layout_singletons(l, SELDP_GROUP_CP));
    return SELDP_OK;
fail:
    return st;
}

/* _get_expert_parallel_ranks (expert tensor parallelism: every TP rank holds a shard of
 * each of its experts; with tp 1 it gives _create_expert_and_data_parallel's groups):
 * per stage and TP lane a data-parallel list, cut into EP groups of ep consecutive
 * entries; the entries at one EP position form an expert-data group. */
static seldp_status deepspeed_expert_tp(seldp_layout *l, bool data_before, int *ep_ranks,
                                        int *edp_ranks)
{
    const seldp_layout_config *c = &l->cfg;
    int world = c->world, tp = c->tp, ep = c->ep, dp = l->dp;
    int pp_stride = world / c->pp;
    int n_ep = 0, n_edp = 0;
    int *list = malloc((size_t)dp * sizeof *list);
    if (!list)
        return seldp__fail(SELDP_ERR_NOMEM, "out of memory building %s", l->what);
    for (int stage = 0; stage < world; stage += pp_stride) {
        for (int i = 0; i < tp; i++) {
            int n = 0;
            if (data_before) {
                int dp_stride = world / ep / tp / c->pp;
                for (int ds = 0; ds < dp_stride; ds++)
                    for (int r = stage + i + ds * tp; r < stage + pp_stride; r += dp_stride * tp)
                        list[n++] = r;
            } else {
                for (int r = stage + i; r < stage + pp_stride; r += tp)
                    list[n++] = r;
            }
            for (int g = 0; g < dp; g += ep)
                for (int j = 0; j < ep; j++)
                    ep_ranks[n_ep++] = list[g + j];
            for (int j = 0; j < ep; j++)
                for (int g = 0; g < dp; g += ep)
                    edp_ranks[n_edp++] = list[g + j];
        }
    }
    free(list);
    return SELDP_OK;
}

/* _create_expert_and_data_parallel (no expert tensor parallelism: MoE._create_process_groups
 * calls it whenever enable_expert_tensor_parallelism is off, whatever mp_size): per stage of
 * pp_stride ranks, EP groups of ep consecutive ranks and expert-data groups strided by ep;
 * data before expert: expert-data groups of consecutive ranks, EP groups strided. Experts
 * are whole on every rank, so EP groups span the TP ranks. */
static void deepspeed_expert_whole(const seldp_layout *l, bool data_before, int *ep_ranks,
                                   int *edp_ranks)
{
    const seldp_layout_config *c = &l->cfg;
    int world = c->world, ep = c->ep;
    int pp_stride = world / c->pp, ep_stride = pp_stride / ep;
    int n_ep = 0, n_edp = 0;
    for (int stage = 0; stage < world; stage += pp_stride) {
        for (int i = 0; i < ep; i++) {
            if (data_before)
                for (int r = stage + i * ep_stride; r < stage + (i + 1) * ep_stride; r++)
                    edp_ranks[n_edp++] = r;
            else
                for (int r = stage + i; r < stage + pp_stride; r += ep)
                    edp_ranks[n_edp++] = r;
        }
        if (data_before)
            for (int i = 0; i < ep_stride; i++)
                for (int r = stage + i; r < stage + pp_stride; r += ep_stride)
                    ep_ranks[n_ep++] = r;
    }
    if (!data_before)
        for (int r = 0; r < world; r++)
            ep_ranks[n_ep++] = r;
}

static seldp_status build_deepspeed(seldp_layout *l)
{
    seldp_status st = SELDP_OK;
    seldp_layout_config *c = &l->cfg;
    int *ep_ranks = NULL, *edp_ranks = NULL;
    bool data_before = false;
    if (!c->order)
        c->order = "ep-dp";
    if (strcasecmp(c->order, "dp-ep") == 0)
        data_before = true;
    else if (strcasecmp(c->order, "ep-dp") != 0)
        REJECT("%s: DeepSpeed's orders are ep-dp (expert before data, the default) and dp-ep "
               "(use_data_before_expert_parallel_)",
               l->what);
    if (c->etp == 0)
        c->etp = 1; /* enable_expert_tensor_parallelism defaults to False */
    if (c->cp != 1)
        REJECT("%s: DeepSpeed's groups (deepspeed/utils/groups.py) have no context parallelism: "
               "cp must be 1",
               l->what);
    if (c->etp != 1 && c->etp != c->tp)
        REJECT("%s: DeepSpeed splits experts over the whole tensor-parallel group "
               "(enable_expert_tensor_parallelism: etp = tp = %d) or not at all (etp 1)",
               l->what, c->tp);
    if (c->world % (c->tp * c->pp) != 0)
        REJECT("%s: %d is not divisible by %d (world over tp * pp)", l->what, c->world,
               c->tp * c->pp);
    l->dp = c->world / (c->tp * c->pp);
    bool whole = c->etp == 1;
    if (whole ? (c->world / c->pp) % c->ep != 0 : l->dp % c->ep != 0)
        REJECT("%s: %d is not divisible by %d (%s over ep)", l->what,
               whole ? c->world / c->pp : l->dp, c->ep,
               whole ? "the ranks of a pipeline stage" : "the data-parallel size");
    SELDP_CHECK(experts_divisible(l, "num_experts must be divisible by ep_size"));
    SELDP_CHECK(deepspeed_dense(l));
    ep_ranks = malloc((size_t)c->world * sizeof *ep_ranks);
    edp_ranks = malloc((size_t)c->world * sizeof *edp_ranks);
    if (!ep_ranks || !edp_ranks)
        SELDP_FAIL(SELDP_ERR_NOMEM, "out of memory building %s", l->what);
    if (whole)
        deepspeed_expert_whole(l, data_before, ep_ranks, edp_ranks);
    else
        SELDP_CHECK(deepspeed_expert_tp(l, data_before, ep_ranks, edp_ranks));
    SELDP_CHECK(seldp__layout_set(l, SELDP_GROUP_EP, c->world / c->ep, c->ep, ep_ranks));
    int edp = whole ? c->world / c->pp / c->ep : l->dp / c->ep;
    SELDP_CHECK(seldp__layout_set(l, SELDP_GROUP_EXPERT_DP, c->world / edp, edp, edp_ranks));
    /* DeepSpeed zips EP groups by list position, but a rank's EP rank (which experts it
     * holds) is its place in the sorted group: where an EP group straddles TP lanes out of
     * rank order, one expert-data group would mix different experts */
    for (int i = 0; i < c->world; i++)
        if (l->kinds[SELDP_GROUP_EP].pos_of[edp_ranks[i]] !=
            l->kinds[SELDP_GROUP_EP].pos_of[edp_ranks[i - i % edp]])
            SELDP_FAIL(
                SELDP_ERR_INVALID_ARGUMENT,
                "%s: DeepSpeed's expert-data group of rank %d would hold ranks of different "
                "EP positions (different experts): its EP groups straddle the TP lanes out of "
                "rank order; choose ep dividing the data-parallel size %d",
                l->what, edp_ranks[i - i % edp], l->dp);
    if (whole) {
        SELDP_CHECK(seldp__layout_singletons(l, SELDP_GROUP_EXPERT_TP));
    } else {
        const int sizes[3] = {c->tp, l->dp, c->pp};
        SELDP_CHECK(
            seldp__layout_masked(l, SELDP_GROUP_EXPERT_TP, 3, sizes, (const bool[]){1, 0, 0}));
    }
    SELDP_CHECK(seldp__layout_embedding(l));
    free(ep_ranks);
    free(edp_ranks);
    return SELDP_OK;
fail:
    free(ep_ranks);
    free(edp_ranks);
    return st;
}

/* ---- torchtitan -------------------------------------------------------------------------- */

static seldp_status build_torchtitan(seldp_layout *l)
{
    seldp_status st = SELDP_OK;
    seldp_layout_config *c = &l->cfg;
    if (c->order && c->order[0])
        REJECT("%s: torchtitan has no order: its mesh is pp, dp_replicate, dp_shard, cp, tp "
               "(slowest first)",
               l->what);
    c->order = NULL;
    /* expert_tensor_parallel_degree defaults to 1; without EP it is not read: the experts
     * are split over the tensor-parallel mesh like every other weight */
    if (c->etp == 0 || c->ep == 1)
        c->etp = c->ep > 1 ? 1 : c->tp;
    int dp_shard = c->world / (c->cp * c->tp * c->pp);
    if (dp_shard < 1 || dp_shard * c->cp * c->tp * c->pp != c->world)
        REJECT("%s: Invalid parallel dims: dp_replicate(1) * dp_shard(%d) * cp(%d) * tp(%d) * "
               "pp(%d) != WORLD_SIZE(%d)",
               l->what, dp_shard, c->cp, c->tp, c->pp, c->world);
    l->dp = dp_shard;
    if (c->ep > 1) {
        if (c->etp != c->tp && c->etp != 1)
            REJECT("%s: Currently we only support ETP=TP or ETP=1", l->what);
        /* EP borrows all of cp (and of tp when etp is 1) and part of dp_shard */
        int borrowed = c->etp == c->tp ? c->cp : c->cp * c->tp;
        if (c->ep % borrowed != 0 || (dp_shard * borrowed) % c->ep != 0)
            REJECT("%s: ep must borrow all of %s and part of dp_shard: ep %% %d == 0 and "
                   "(dp_shard * %d) %% ep == 0 fail with dp_shard %d",
                   l->what, c->etp == c->tp ? "cp" : "cp and tp", borrowed, borrowed, dp_shard);
    }
    SELDP_CHECK(experts_divisible(l, "num_experts must be divisible by the ep degree"));
    /* the dense mesh [pp, dp_shard, cp, tp], slowest first; given fastest first here */
    const int dense[4] = {c->tp, c->cp, dp_shard, c->pp};
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_TP, 4, dense, (const bool[]){1, 0, 0, 0}));
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_CP, 4, dense, (const bool[]){0, 1, 0, 0}));
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_DP, 4, dense, (const bool[]){0, 1, 1, 0}));
    SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_PP, 4, dense, (const bool[]){0, 0, 0, 1}));
    if (c->ep == 1) {
        /* the experts are dense weights: sharded over dp_shard_cp, split over tp */
        SELDP_CHECK(seldp__layout_singletons(l, SELDP_GROUP_EP));
        SELDP_CHECK(
            seldp__layout_masked(l, SELDP_GROUP_EXPERT_DP, 4, dense, (const bool[]){0, 1, 1, 0}));
        SELDP_CHECK(
            seldp__layout_masked(l, SELDP_GROUP_EXPERT_TP, 4, dense, (const bool[]){1, 0, 0, 0}));
    } else if (c->etp == c->tp) {
        /* the EP mesh [pp, dp_shard_in_ep, ep, tp]: ep covers cp and part of dp_shard */
        const int sparse[4] = {c->tp, c->ep, dp_shard * c->cp / c->ep, c->pp};
        SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_EP, 4, sparse, (const bool[]){0, 1, 0, 0}));
        SELDP_CHECK(
            seldp__layout_masked(l, SELDP_GROUP_EXPERT_DP, 4, sparse, (const bool[]){0, 0, 1, 0}));
        SELDP_CHECK(
            seldp__layout_masked(l, SELDP_GROUP_EXPERT_TP, 4, sparse, (const bool[]){1, 0, 0, 0}));
    } else {
        /* the EP mesh [pp, dp_shard_in_ep, ep]: ep covers tp, cp and part of dp_shard */
        const int sparse[3] = {c->ep, dp_shard * c->cp * c->tp / c->ep, c->pp};
        SELDP_CHECK(seldp__layout_masked(l, SELDP_GROUP_EP, 3, sparse, (const bool[]){1, 0, 0}));
        SELDP_CHECK(
            seldp__layout_masked(l, SELDP_GROUP_EXPERT_DP, 3, sparse, (const bool[]){0, 1, 0}));
        SELDP_CHECK(seldp__layout_singletons(l, SELDP_GROUP_EXPERT_TP));
    }
    /* torchtitan ties no weights across stages; the embedding groups say which ranks would
     * hold a tied copy (the first and last stage), as for the other frameworks */
    return seldp__layout_embedding(l);
fail:
    return st;
}

seldp_status seldp__layout_build(seldp_layout *l)
{
    switch (l->cfg.framework) {
    case SELDP_FRAMEWORK_MEGATRON:
        return build_megatron(l);
    case SELDP_FRAMEWORK_MEGATRON_0_9:
        return build_megatron_0_9(l);
    case SELDP_FRAMEWORK_DEEPSPEED:
        return build_deepspeed(l);
    case SELDP_FRAMEWORK_TORCHTITAN:
        return build_torchtitan(l);
    case SELDP_FRAMEWORK_NONE:
        break; /* explicit groups: seldp_layout_create_from_groups */
    }
    return seldp__fail(SELDP_ERR_INVALID_ARGUMENT, "%s: unknown framework", l->what);
}
