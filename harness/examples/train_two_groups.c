/* A minimal data-parallel training loop over a two-group layout, written only against the
 * installed seldp API (#include <seldp/seldp.h>, link seldp).
 *
 * Four in-process ranks (one pthread each, host-staged transport) fit y = a . x by SGD. Every
 * rank holds a shared weight `shared.weight`, replicated over the world; the even ranks also
 * hold an expert weight `experts.0.weight`, replicated over an expert group split from the
 * world. Each rank starts from its own random weights and draws its own number of tokens per
 * step. A rank's loss is the sum over its tokens of 0.5 (pred - y)^2; the objective is the
 * mean over all tokens of all ranks:
 *   - shared gradients: seldp_session_reduce over the world, weighted by token counts;
 *   - expert gradients: normalized by the global token count, then seldp_session_sum over the
 *     expert group;
 *   - then the global gradient norm over both groups (each replica set counted once) clips the
 *     gradients to MAX_GRAD_NORM before the SGD update.
 * The program exits non-zero unless the loss falls and the replicas end bit-identical. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <seldp/seldp.h>

enum { WORLD = 4, DIM = 8, STEPS = 60 };

#define LEARNING_RATE 1.0f
#define MAX_GRAD_NORM 0.5
#define ID_SHARED     ((seldp_param_id)1)
#define ID_EXPERT     ((seldp_param_id)2)

#define TRY(call)                                                                                  \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st != SELDP_OK)                                                                        \
            goto fail;                                                                             \
    } while (0)

struct rank_state {
    seldp_host_world *host;
    int rank;
    seldp_status status;
    char error[512];  /* seldp_last_error() is per thread: copied here for the main thread */
    double loss[2];   /* global mean loss at the first and the last step */
    bool replicas_ok; /* every replica bit-identical after training */
};

/* The target weights every rank's data is drawn from. */
static float truth(int i)
{
    return 0.25f * (float)(i % 5) - 0.5f;
}

static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float next_uniform(uint64_t *state)
{
    return (float)(next_random(state) >> 40) / (float)(1u << 23) - 1.0f;
}

/* Forward and backward of this rank's loss sum over `tokens` fresh samples. */
static double local_step(uint64_t *rng, int tokens, const float *w_shared, const float *w_expert,
                         float *g_shared, float *g_expert)
{
    double loss = 0.0;
    memset(g_shared, 0, DIM * sizeof(float));
    if (w_expert)
        memset(g_expert, 0, DIM * sizeof(float));
    for (int t = 0; t < tokens; t++) {
        float x[DIM], pred = 0.0f, y = 0.0f;
        for (int i = 0; i < DIM; i++) {
            x[i] = next_uniform(rng);
            y += truth(i) * x[i];
            pred += (w_shared[i] + (w_expert ? w_expert[i] : 0.0f)) * x[i];
        }
        float err = pred - y;
        loss += 0.5 * (double)err * (double)err;
        for (int i = 0; i < DIM; i++) {
            g_shared[i] += err * x[i];
            if (w_expert)
                g_expert[i] += err * x[i];
        }
    }
    return loss;
}

/* Allgather `count` floats over `comm` and compare every rank's bytes with group rank 0's. */
static seldp_status replicas_identical(seldp_comm *comm, const float *w, bool *same)
{
    seldp_status st = SELDP_OK;
    float all[WORLD * DIM];
    int n = seldp_comm_size(comm);
    TRY(seldp_comm_allgather(comm, w, all, DIM * sizeof(float), SELDP_HOST_DEVICE));
    for (int r = 1; r < n; r++)
        if (memcmp(all, all + r * DIM, DIM * sizeof(float)) != 0)
            *same = false;
fail:
    return st;
}

static void *rank_main(void *arg)
{
    struct rank_state *rs = arg;
    seldp_status st = SELDP_OK;
    seldp_comm *world = NULL, *expert_group = NULL;
    seldp_model *model = NULL;
    seldp_session *shared = NULL, *expert = NULL;
    seldp_grads *grads = NULL;
    const bool owns_expert = rs->rank % 2 == 0;
    const int64_t shape[1] = {DIM};
    float w_shared[DIM], w_expert[DIM], g_shared[DIM], g_expert[DIM];
    uint64_t rng = 1000u + (uint64_t)rs->rank; /* replicas differ before initialize */

    for (int i = 0; i < DIM; i++) {
        w_shared[i] = next_uniform(&rng);
        w_expert[i] = next_uniform(&rng);
    }

    TRY(seldp_host_comm_init(rs->host, rs->rank, SELDP_HOST_DEVICE, &world));
    TRY(seldp_comm_split(world, owns_expert ? 0 : SELDP_COMM_NO_GROUP, rs->rank, &expert_group));

    /* Describe the rank-local model: seldp borrows the tensors, never copies them. */
    TRY(seldp_model_create(rs->rank, &model));
    seldp_tensor t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, w_shared, 1, shape);
    TRY(seldp_model_add(model, "shared.weight", ID_SHARED, &t, false, NULL));
    if (owns_expert) {
        t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, w_expert, 1, shape);
        TRY(seldp_model_add(model, "experts.0.weight", ID_EXPERT, &t, false, NULL));
    }

    /* [initialize] */
    /* One session per replica group; each broadcasts its selection from group rank 0. */
    const seldp_param_id shared_ids[] = {ID_SHARED};
    const seldp_param_id expert_ids[] = {ID_EXPERT};
    TRY(seldp_session_initialize(world, model, 0, shared_ids, 1, NULL, &shared));
    if (expert_group)
        TRY(seldp_session_initialize(expert_group, model, 0, expert_ids, 1, NULL, &expert));
    /* [initialize] */

    for (int step = 0; step < STEPS; step++) {
        int tokens = 8 + 8 * rs->rank + (step % 3); /* token counts differ between ranks */
        double loss =
            local_step(&rng, tokens, w_shared, owns_expert ? w_expert : NULL, g_shared, g_expert);

        TRY(seldp_grads_create(&grads));
        t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, g_shared, 1, shape);
        TRY(seldp_grads_put(grads, ID_SHARED, &t, SELDP_BORROWED));
        if (owns_expert) {
            t = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, g_expert, 1, shape);
            TRY(seldp_grads_put(grads, ID_EXPERT, &t, SELDP_BORROWED));
        }

        /* [reduce] */
        /* Shared weights: token-weighted mean over the world. The expert gradient in the same
         * container is not selected by this session and passes through untouched. */
        uint64_t global_tokens = 0;
        TRY(seldp_session_reduce(shared, grads, (uint64_t)tokens, SELDP_MISSING_ERROR,
                                 &global_tokens));
        if (expert) {
            /* Expert weights: normalize by the global token count, then sum over the group. */
            for (int i = 0; i < DIM; i++)
                g_expert[i] /= (float)global_tokens;
            TRY(seldp_session_sum(expert, grads, true, SELDP_MISSING_ERROR, NULL));
        }
        /* [reduce] */

        /* [clip] */
        /* The L2 norm of the whole gradient, the same on every rank: each rank lists the
         * sessions it belongs to, and each replica set counts once (the expert's through its
         * group rank 0). Every listed gradient is scaled when the norm exceeds MAX_GRAD_NORM. */
        seldp_norm_part parts[2] = {{shared, grads, SELDP_NORM_REPLICATED},
                                    {expert, grads, SELDP_NORM_REPLICATED}};
        seldp_grad_norm_result norm;
        TRY(seldp_clip_grad_norm(world, parts, expert ? 2 : 1, MAX_GRAD_NORM, &norm));
        /* [clip] */

        /* SGD on the reduced gradients, read back from the container; a non-finite norm
         * (found on every rank alike) skips the update. */
        const float *g = seldp_grads_get(grads, ID_SHARED)->data;
        for (int i = 0; i < DIM && !norm.found_inf; i++)
            w_shared[i] -= LEARNING_RATE * g[i];
        if (expert && !norm.found_inf) {
            g = seldp_grads_get(grads, ID_EXPERT)->data;
            for (int i = 0; i < DIM; i++)
                w_expert[i] -= LEARNING_RATE * g[i];
        }
        seldp_grads_destroy(grads);
        grads = NULL;

        /* The loss of the global objective, for the progress line. */
        TRY(seldp_comm_allreduce(world, &loss, &loss, 1, SELDP_F64, SELDP_HOST_DEVICE));
        loss /= (double)global_tokens;
        if (step == 0)
            rs->loss[0] = loss;
        rs->loss[1] = loss;
        if (rs->rank == 0 && (step % 10 == 0 || step == STEPS - 1))
            printf("step %2d  tokens %4" PRIu64 "  loss %.6e  grad norm %.3e%s\n", step,
                   global_tokens, loss, norm.norm, norm.clipped ? " (clipped)" : "");
    }

    rs->replicas_ok = true;
    TRY(replicas_identical(world, w_shared, &rs->replicas_ok));
    if (expert_group)
        TRY(replicas_identical(expert_group, w_expert, &rs->replicas_ok));

fail:
    rs->status = st;
    if (st != SELDP_OK) {
        snprintf(rs->error, sizeof rs->error, "%s", seldp_last_error());
        if (world)
            seldp_comm_abort(world); /* the other ranks return instead of waiting for us */
    }
    seldp_grads_destroy(grads);
    seldp_session_destroy(expert);
    seldp_session_destroy(shared);
    seldp_model_destroy(model);
    seldp_comm_destroy(expert_group);
    seldp_comm_destroy(world);
    return NULL;
}

int main(void)
{
    seldp_host_world *host = NULL;
    struct rank_state ranks[WORLD];
    pthread_t threads[WORLD];
    int failed = 0;

    printf("seldp %s\n", seldp_version());
    printf("layout: world of %d ranks shares `shared.weight`; ranks 0 and 2 form the expert group "
           "of `experts.0.weight`\n",
           WORLD);
    if (seldp_host_world_create(WORLD, NULL, &host) != SELDP_OK) {
        fprintf(stderr, "cannot create the world: %s\n", seldp_last_error());
        return 1;
    }
    for (int r = 0; r < WORLD; r++) {
        memset(&ranks[r], 0, sizeof ranks[r]);
        ranks[r].host = host;
        ranks[r].rank = r;
        if (pthread_create(&threads[r], NULL, rank_main, &ranks[r]) != 0) {
            fprintf(stderr, "cannot start rank %d\n", r);
            return 1; /* the started ranks would wait for this one forever */
        }
    }
    for (int r = 0; r < WORLD; r++)
        pthread_join(threads[r], NULL);
    seldp_host_world_destroy(host);

    for (int r = 0; r < WORLD; r++) {
        const struct rank_state *rs = &ranks[r];
        if (rs->status != SELDP_OK) {
            fprintf(stderr, "rank %d: %s: %s\n", r, seldp_status_name(rs->status), rs->error);
            failed = 1;
        } else if (!rs->replicas_ok) {
            fprintf(stderr, "rank %d: replicas differ after training\n", r);
            failed = 1;
        }
    }
    if (!failed && !(ranks[0].loss[1] < 1e-3 * ranks[0].loss[0])) {
        fprintf(stderr, "loss did not fall enough: %.6e -> %.6e\n", ranks[0].loss[0],
                ranks[0].loss[1]);
        failed = 1;
    }
    if (!failed)
        printf("ok: loss %.3e -> %.3e, replicas identical\n", ranks[0].loss[0], ranks[0].loss[1]);
    return failed;
}
