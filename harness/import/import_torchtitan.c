/* --from-torchtitan FILE: a torchtitan train config (TOML) as harness options (import.h;
 * docs/harness-interop.md lists the keys).
 *
 * [parallelism] gives the degrees, [training] the batch sizes, the clipping and the dtypes,
 * [model] name and flavor the experts, top-k, layers and shared experts of the flavors that
 * torchtitan defines in Python (the table below, from pytorch/torchtitan at 238fa995, the last
 * release with TOML configs). Everything else is listed as ignored, one line per key. The
 * checks are torchtitan's own (ParallelDims._validate and the trainer's batch check, at
 * 0119de15, whose meshes the harness's torchtitan preset builds). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "toml.h"
#include "util.h"

/* The MoE flavors: torchtitan/models/<name>/__init__.py (MoEArgs defaults: 8 experts, one
 * shared expert, top-1; interleave_moe_layer_step 2 for llama4 unless set). */
static const struct {
    const char *model, *flavor;
    int layers, experts, top_k, shared, moe_every;
} flavors[] = {
    {"deepseek_v3", "debugmodel", 6, 8, 3, 2, 1},
    {"deepseek_v3", "debugmodel_flex_attn", 6, 8, 3, 2, 1},
    {"deepseek_v3", "16B", 27, 64, 6, 2, 1},
    {"deepseek_v3", "236B", 60, 160, 6, 2, 1},
    {"deepseek_v3", "671B", 61, 256, 8, 1, 1},
    {"llama4", "debugmodel", 6, 8, 1, 1, 2},
    {"llama4", "17bx16e", 48, 16, 1, 1, 1},
    {"llama4", "17bx128e", 48, 128, 1, 1, 2},
    {"llama4", "debugmodel_irope", 6, 8, 1, 1, 2},
    {"llama4", "17bx16e_irope", 48, 16, 1, 1, 1},
    {"llama4", "17bx128e_irope", 48, 128, 1, 1, 2},
    {"qwen3", "debugmodel_moe", 8, 64, 8, 0, 1},
    {"qwen3", "30B-A3B", 48, 128, 8, 0, 1},
    {"qwen3", "235B-A22B", 94, 128, 8, 0, 1},
    {"gpt_oss", "debugmodel", 4, 8, 4, 0, 1},
    {"gpt_oss", "20b", 24, 32, 4, 0, 1},
    {"gpt_oss", "120b", 36, 128, 4, 0, 1},
};
#define N_FLAVORS (sizeof flavors / sizeof flavors[0])

/* Sections whose every key is ignored, with the reason. */
static const struct {
    const char *section, *why;
} ignored_sections[] = {
    {"job", "job bookkeeping"},
    {"profiling", "profiling"},
    {"metrics", "logging"},
    {"optimizer", "the harness trains with SGD at --lr"},
    {"lr_scheduler", "the harness trains with SGD at --lr"},
    {"checkpoint", "the harness's checkpoints are --save and --resume"},
    {"activation_checkpoint", "recomputation changes no gradient"},
    {"compile", "compilation changes no gradient"},
    {"quantize", "tiny-moe's quantized bases are --quant"},
    {"float8", "tiny-moe's quantized bases are --quant"},
    {"comm", "communication settings"},
    {"memory_estimation", "memory estimation"},
    {"fault_tolerance", "fault tolerance"},
    {"experimental", "experimental hooks"},
    {"validation", "the harness checks every step against its FP64 reference"},
    {"debug", "torchtitan's debugging switches"},
};

typedef struct tt_ctx {
    hx_import *imp;
    const char *path;
    const hx_json *model_name, *flavor;
    const hx_json *dtype, *param, *reduce, *max_norm;
} tt_ctx;

static seldp_status key_error(const tt_ctx *c, const char *key, const hx_json *v,
                              const char *expected)
{
    char text[128];
    hx_import_leaf_text(v, text, sizeof text);
    return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "--from-torchtitan %s:%d:%d: %s = %s: expected %s",
                   c->path, v->line, v->column, key, text, expected);
}

static seldp_status int_of(const tt_ctx *c, const char *key, const hx_json *v, long min, long *out)
{
    if (v->type != HX_JSON_NUMBER || !v->is_integer || v->integer < min || v->integer > 1 << 24)
        return key_error(c, key, v, min < 0 ? "-1 or a positive integer" : "a positive integer");
    *out = (long)v->integer;
    return SELDP_OK;
}

static bool ignore(tt_ctx *c, const char *key, const hx_json *v, const char *why)
{
    char text[128];
    hx_import_leaf_text(v, text, sizeof text);
    return hx_import_line(c->imp, HX_IMPORT_TORCHTITAN, "ignored %s = %s: %s", key, text, why);
}

static seldp_status set_degree(tt_ctx *c, const char *key, const hx_json *v, const char *option)
{
    long x = 0;
    seldp_status st = int_of(c, key, v, 1, &x);
    if (st != SELDP_OK)
        return st;
    char value[32];
    snprintf(value, sizeof value, "%ld", x);
    return hx_import_set(c->imp, HX_IMPORT_TORCHTITAN, option, value, false, "%s = %ld", key, x);
}

/* One leaf `key` (its dotted path) of the config. */
static seldp_status read_leaf(tt_ctx *c, const char *key, const hx_json *v)
{
    static const struct {
        const char *key, *option;
    } degrees[] = {
        {"parallelism.tensor_parallel_degree", "tp"},
        {"parallelism.pipeline_parallel_degree", "pp"},
        {"parallelism.context_parallel_degree", "cp"},
        {"parallelism.expert_parallel_degree", "ep"},
        {"parallelism.expert_tensor_parallel_degree", "etp"},
    };
    for (size_t i = 0; i < sizeof degrees / sizeof degrees[0]; i++)
        if (strcmp(key, degrees[i].key) == 0)
            return set_degree(c, key, v, degrees[i].option);
    hx_import *imp = c->imp;
    if (strcmp(key, "parallelism.data_parallel_replicate_degree") == 0)
        return int_of(c, key, v, 1, &imp->torchtitan.replicate);
    if (strcmp(key, "parallelism.data_parallel_shard_degree") == 0) {
        seldp_status st = int_of(c, key, v, -1, &imp->torchtitan.shard);
        if (st == SELDP_OK && imp->torchtitan.shard == 0)
            return key_error(c, key, v, "-1 or a positive integer (dp_shard must -1 or >=1)");
        return st;
    }
    if (strcmp(key, "parallelism.pipeline_parallel_microbatch_size") == 0)
        return int_of(c, key, v, 1, &imp->torchtitan.pp_microbatch);
    if (strcmp(key, "training.local_batch_size") == 0)
        return int_of(c, key, v, 1, &imp->torchtitan.local_batch);
    if (strcmp(key, "training.global_batch_size") == 0) {
        seldp_status st = int_of(c, key, v, -1, &imp->torchtitan.global_batch);
        if (st == SELDP_OK && imp->torchtitan.global_batch == 0)
            return key_error(c, key, v, "-1 or a positive integer");
        return st;
    }
    const struct {
        const char *key;
        const hx_json **into;
    } kept[] = {
        {"model.name", &c->model_name},
        {"model.flavor", &c->flavor},
        {"training.dtype", &c->dtype},
        {"training.mixed_precision_param", &c->param},
        {"training.mixed_precision_reduce", &c->reduce},
        {"training.max_norm", &c->max_norm},
    };
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        if (strcmp(key, kept[i].key) == 0) {
            *kept[i].into = v;
            return SELDP_OK;
        }
    }
    const char *why = NULL;
    for (size_t i = 0; i < sizeof ignored_sections / sizeof ignored_sections[0]; i++) {
        size_t n = strlen(ignored_sections[i].section);
        if (strncmp(key, ignored_sections[i].section, n) == 0 && key[n] == '.')
            why = ignored_sections[i].why;
    }
    if (!why && strcmp(key, "parallelism.fsdp_reshard_after_forward") == 0)
        why = "resharding changes no gradient";
    if (!why && strcmp(key, "parallelism.enable_async_tensor_parallel") == 0)
        why = "overlapping TP changes no gradient";
    if (!why && strcmp(key, "parallelism.pipeline_parallel_schedule") == 0)
        why = "tiny-moe runs its pipeline 1F1B";
    if (!why && strncmp(key, "training.", 9) == 0)
        why = strcmp(key, "training.seq_len") == 0 ? "tiny-moe's tokens per rank are --tokens"
              : strcmp(key, "training.steps") == 0 ? "the harness trains --steps"
                                                   : "no tiny-moe setting";
    if (!why && strncmp(key, "model.", 6) == 0)
        why = "tiny-moe's sizes are its own (--d-model, --d-ff, --vocab)";
    if (!ignore(c, key, v, why ? why : "no tiny-moe setting"))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    return SELDP_OK;
}

static seldp_status walk(tt_ctx *c, const hx_json *node, hx_buf *key)
{
    size_t mark = key->len;
    for (size_t i = 0; i < node->count; i++) {
        char part[256];
        hx_buf_printf(key, "%s%s", mark ? "." : "", hx_printable(node->keys[i], part, sizeof part));
        if (!hx_buf_ok(key))
            return SELDP_ERR_NOMEM;
        const hx_json *v = &node->items[i];
        seldp_status st =
            v->type == HX_JSON_OBJECT ? walk(c, v, key) : read_leaf(c, hx_buf_str(key), v);
        if (st != SELDP_OK)
            return st;
        key->len = mark;
        key->data[mark] = '\0';
    }
    return SELDP_OK;
}

static seldp_status string_of(const tt_ctx *c, const char *key, const hx_json *v,
                              const char *const *allowed, int *index)
{
    if (v->type == HX_JSON_STRING)
        for (int i = 0; allowed[i]; i++)
            if (strcmp(v->string, allowed[i]) == 0) {
                *index = i;
                return SELDP_OK;
            }
    char expected[128];
    snprintf(expected, sizeof expected, "\"%s\" or \"%s\"", allowed[0], allowed[1]);
    return key_error(c, key, v, expected);
}

/* training.dtype, mixed_precision_param, mixed_precision_reduce: FSDP's mixed precision keeps
 * FP32 master weights and reduces in mixed_precision_reduce; dtype bfloat16 has no FP32 copy. */
static seldp_status map_dtype(tt_ctx *c)
{
    static const char *const dtypes[] = {"bfloat16", "float32", NULL};
    int dtype = 1, param = 0, reduce = 1;
    seldp_status st = SELDP_OK;
    if (c->dtype)
        HX_CHECK(string_of(c, "training.dtype", c->dtype, dtypes, &dtype));
    if (c->param)
        HX_CHECK(string_of(c, "training.mixed_precision_param", c->param, dtypes, &param));
    if (c->reduce)
        HX_CHECK(string_of(c, "training.mixed_precision_reduce", c->reduce, dtypes, &reduce));
    if (hx_import_given(c->imp, "dtype"))
        return SELDP_OK; /* --dtype decides --fp32-master with it */
    if (dtype == 0) {
        HX_CHECK(hx_import_set(c->imp, HX_IMPORT_TORCHTITAN, "dtype", "bf16", false,
                               "training.dtype = \"bfloat16\" (no FP32 copy of the weights)"));
    } else if (param == 0) {
        HX_CHECK(hx_import_set(c->imp, HX_IMPORT_TORCHTITAN, "dtype", "bf16", !c->param,
                               "training.mixed_precision_param = \"bfloat16\"%s",
                               c->param ? "" : " (torchtitan's default)"));
        if (reduce == 1)
            HX_CHECK(hx_import_set(c->imp, HX_IMPORT_TORCHTITAN, "fp32-master", "", !c->param,
                                   "FSDP's FP32 weights, mixed_precision_reduce = \"float32\""));
    } else {
        HX_CHECK(hx_import_set(c->imp, HX_IMPORT_TORCHTITAN, "dtype", "f32", false,
                               "training.mixed_precision_param = \"float32\""));
    }
fail:
    return st;
}

static seldp_status map_model(tt_ctx *c)
{
    seldp_status st = SELDP_OK;
    hx_import *imp = c->imp;
    const char *name =
        c->model_name && c->model_name->type == HX_JSON_STRING ? c->model_name->string : "llama3";
    const char *flavor =
        c->flavor && c->flavor->type == HX_JSON_STRING ? c->flavor->string : "debugmodel";
    for (size_t i = 0; i < N_FLAVORS; i++) {
        if (strcmp(flavors[i].model, name) != 0 || strcmp(flavors[i].flavor, flavor) != 0)
            continue;
        char v[32];
        const char *src = "model.name = \"%s\", flavor = \"%s\" (%s)";
        snprintf(v, sizeof v, "%d", flavors[i].experts);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "experts", v, false, src, name, flavor,
                               "num_experts"));
        snprintf(v, sizeof v, "%d", flavors[i].top_k);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "top-k", v, false, src, name, flavor,
                               "top_k"));
        snprintf(v, sizeof v, "%d", flavors[i].layers);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "layers", v, false, src, name, flavor,
                               "n_layers"));
        imp->torchtitan.flavor_experts = true;
        imp->torchtitan.shared = flavors[i].shared;
        if (flavors[i].moe_every > 1 &&
            !hx_import_line(imp, HX_IMPORT_TORCHTITAN,
                            "note: %s %s puts an MoE layer every %d layers; every tiny-moe layer "
                            "is one",
                            name, flavor, flavors[i].moe_every))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        if (!hx_import_line(imp, HX_IMPORT_TORCHTITAN,
                            "note: %s's router (its score function, load_balance_coeff's expert "
                            "bias) is not tiny-moe's softmax top-K: the groups and the reduction "
                            "are what the import reproduces",
                            name))
            return hx_fail(SELDP_ERR_NOMEM, "out of memory");
        return SELDP_OK;
    }
    if (!hx_import_line(imp, HX_IMPORT_TORCHTITAN,
                        "model.name = \"%s\", flavor = \"%s\": not an MoE flavor the import knows "
                        "(give --experts, --top-k and --layers)",
                        name, flavor))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
fail:
    return st;
}

seldp_status hx_import_torchtitan(const char *text, size_t len, const char *path, hx_import *imp)
{
    seldp_status st = SELDP_OK;
    hx_json *root = NULL;
    hx_buf key = {0};
    tt_ctx c = {.imp = imp, .path = path};
    imp->torchtitan.replicate = 1;
    imp->torchtitan.shard = -1;
    imp->torchtitan.local_batch = 8;   /* Training.local_batch_size */
    imp->torchtitan.global_batch = -1; /* one gradient accumulation step */
    imp->torchtitan.pp_microbatch = 1;
    if (hx_toml_parse(text, len, path, &root) != SELDP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", hx_last_error());
        return hx_fail(SELDP_ERR_PARSE, "--from-torchtitan %s", why);
    }
    HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "framework", "torchtitan", false,
                           "a torchtitan train config"));
    hx_buf_append(&key, "", 0);
    HX_CHECK(walk(&c, root, &key));
    HX_CHECK(map_model(&c));
    HX_CHECK(map_dtype(&c));
    if (c.max_norm) {
        if (c.max_norm->type != HX_JSON_NUMBER || c.max_norm->number < 0 ||
            !isfinite(c.max_norm->number))
            HX_CHECK(key_error(&c, "training.max_norm", c.max_norm, "a number >= 0"));
        char v[48];
        snprintf(v, sizeof v, "%.17g", c.max_norm->number);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "clip-grad", v, false,
                               "training.max_norm = %g", c.max_norm->number));
    } else {
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "clip-grad", "1", true,
                               "no training.max_norm (torchtitan's default 1.0)"));
    }
fail:
    hx_buf_free(&key);
    hx_json_free(root);
    return st;
}

/* ---- what follows from the sizes --------------------------------------------------------- */

seldp_status hx_import_torchtitan_finish(hx_import *imp, const hx_import_sizes *s)
{
    seldp_status st = SELDP_OK;
    char v[32];
    long r = imp->torchtitan.replicate, shard = imp->torchtitan.shard;
    long model = (long)s->cp * s->tp * s->pp;
    /* the world: dp_replicate * dp_shard * cp * tp * pp, or dp_shard the world's rest */
    if (shard > 0) {
        long world = r * shard * model;
        if (hx_import_given(imp, "world") && world != s->world)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-torchtitan: Invalid parallel dims: dp_replicate(%ld) * "
                           "dp_shard(%ld) * cp(%d) * tp(%d) * pp(%d) != WORLD_SIZE(%d) (--world)",
                           r, shard, s->cp, s->tp, s->pp, s->world);
        snprintf(v, sizeof v, "%ld", world);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "world", v, false,
                               "parallelism.data_parallel_shard_degree = %ld (x replicate %ld x cp "
                               "x tp x pp)",
                               shard, r));
    } else {
        if (model < 1 || s->world % (r * model) != 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-torchtitan: Invalid parallel dims: dp_replicate(%ld) * cp(%d) * "
                           "tp(%d) * pp(%d) does not divide WORLD_SIZE(%d)%s",
                           r, s->cp, s->tp, s->pp, s->world,
                           s->world_known ? "" : " (the default --world: give --world)");
        shard = s->world / (r * model);
    }
    if (r > 1 && !hx_import_line(imp, HX_IMPORT_TORCHTITAN,
                                 "data_parallel_replicate_degree = %ld: HSDP; its groups are the "
                                 "harness's dp_shard = %ld (replicate x shard) groups, "
                                 "replication and sharding not told apart",
                                 r, r * shard))
        return hx_fail(SELDP_ERR_NOMEM, "out of memory");
    /* ParallelDims._validate: EP borrows all of cp (and tp at etp 1) and part of dp_shard */
    if (s->ep > 1) {
        long borrowed = s->etp == s->tp ? s->cp : (long)s->cp * s->tp;
        if (s->ep % borrowed != 0 || (shard * borrowed) % s->ep != 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-torchtitan: parallelism.expert_parallel_degree = %d: "
                           "torchtitan asserts ep %% %ld == 0 and (dp_shard * %ld) %% ep == 0 "
                           "(dp_shard %ld: EP borrows all of cp%s and part of dp_shard)",
                           s->ep, borrowed, borrowed, shard, s->etp == s->tp ? "" : " and tp");
    }
    /* the trainer: global = local * dp * gradient accumulation steps; PP splits the local
     * batch into micro-batches of pipeline_parallel_microbatch_size */
    long local = imp->torchtitan.local_batch, dp = r * shard;
    long global = imp->torchtitan.global_batch < 0 ? local * dp : imp->torchtitan.global_batch;
    if (global % (local * dp) != 0)
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "--from-torchtitan: training.global_batch_size = %ld: global batch size "
                       "must be multiple of local batch size times data-parallel degree (%ld %% "
                       "(%ld * %ld) != 0)",
                       global, global, local, dp);
    long micro = global / (local * dp);
    if (s->pp > 1) {
        if (local % imp->torchtitan.pp_microbatch != 0)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                           "--from-torchtitan: parallelism.pipeline_parallel_microbatch_size = "
                           "%ld must divide training.local_batch_size = %ld",
                           imp->torchtitan.pp_microbatch, local);
        micro *= local / imp->torchtitan.pp_microbatch;
    }
    if (micro > 1) {
        snprintf(v, sizeof v, "%ld", micro);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "micro-batches", v, false,
                               "training.local_batch_size = %ld, global_batch_size = %ld%s "
                               "(data-parallel degree %ld)",
                               local, global, s->pp > 1 ? ", the pipeline's micro-batches" : "",
                               dp));
    }
    if (imp->torchtitan.shared > 0 && !hx_import_given(imp, "shared-expert-ff")) {
        /* torchtitan's shared experts: one ungated FFN of num_shared_experts expert widths */
        long tp = s->tp > 0 ? s->tp : 1;
        long fs = (long)imp->torchtitan.shared * s->d_ff;
        fs = (fs + tp - 1) / tp * tp;
        snprintf(v, sizeof v, "%ld", fs);
        HX_CHECK(hx_import_set(imp, HX_IMPORT_TORCHTITAN, "shared-expert-ff", v, false,
                               "num_shared_experts = %ld of the flavor (%ld x --d-ff %d)",
                               imp->torchtitan.shared, imp->torchtitan.shared, s->d_ff));
    }
fail:
    return st;
}
