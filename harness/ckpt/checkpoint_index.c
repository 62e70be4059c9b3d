/* The parser of a checkpoint's index.json (see checkpoint.h for the format): strict, every
 * field checked, every error one line naming the file and the field. */
#include "checkpoint_index.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"
#include "util.h"

bool hx_ckpt_hex64(const char *text, uint64_t *out)
{
    if (!text || strlen(text) != 16)
        return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = text[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* ---- resume: the index ------------------------------------------------------------------- */

void hx_ckpt_close(hx_ckpt *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_files; i++)
        free(c->files[i].name);
    for (size_t i = 0; i < c->n_tensors; i++)
        free(c->tensors[i].path);
    free(c->files);
    free(c->tensors);
    free(c->dir);
    free(c->notes);
    for (size_t i = 0; i < c->n_steps; i++)
        free(c->step_paths[i]);
    free(c->step_paths);
    free(c->steps);
    free(c);
}

int hx_ckpt_step(const hx_ckpt *c)
{
    return c->step;
}

uint64_t hx_ckpt_token_state(const hx_ckpt *c)
{
    return c->token_state;
}

static bool dtype_parse(const char *name, seldp_dtype *out)
{
    for (int d = 0; name && d < SELDP_DTYPE_COUNT; d++) {
        const char *n = hx_st_dtype_name((seldp_dtype)d);
        if (n && strcmp(n, name) == 0) {
            *out = (seldp_dtype)d;
            return true;
        }
    }
    return false;
}

static bool json_int(const hx_json *v, int64_t min, int64_t max, int64_t *out)
{
    if (!v || v->type != HX_JSON_NUMBER || !v->is_integer || v->integer < min || v->integer > max)
        return false;
    *out = v->integer;
    return true;
}

static const char *json_str(const hx_json *v)
{
    return v && v->type == HX_JSON_STRING ? v->string : NULL;
}

/* index.json ends with its own checksum: of every byte before the line that holds it. The
 * text need not be NUL-terminated. The checksum's basis (the format version's, hx_fnv1a) into
 * *basis: this version's, or version 1's. */
static seldp_status check_index_checksum(const char *path, const char *text, size_t len,
                                         uint64_t *basis)
{
    const char *at = NULL;
    size_t key = strlen(CKPT_INDEX_CHECKSUM);
    for (size_t i = 0; i + key <= len; i++)
        if (memcmp(text + i, CKPT_INDEX_CHECKSUM, key) == 0)
            at = text + i;
    if (!at)
        return hx_fail(SELDP_ERR_PARSE, "%s: no %s (not a complete checkpoint index)", path,
                       CKPT_INDEX_CHECKSUM);
    const char *line = at;
    while (line > text && line[-1] != '\n')
        line--;
    uint64_t want = 0, got = hx_fnv1a(text, (size_t)(line - text), HX_FNV1A_BASIS);
    const char *after = at + key;
    const char *hex = memchr(after, '"', (size_t)(text + len - after));
    char digits[17] = {0};
    if (hex && (size_t)(text + len - hex) > 17)
        memcpy(digits, hex + 1, 16);
    if (!hx_ckpt_hex64(digits, &want))
        return hx_fail(SELDP_ERR_PARSE, "%s: index_checksum is not 16 hex digits", path);
    *basis = HX_FNV1A_BASIS;
    if (want != got && hx_fnv1a(text, (size_t)(line - text), HX_FNV1A_BASIS_V1) == want)
        *basis = HX_FNV1A_BASIS_V1;
    else if (want != got)
        return hx_fail(SELDP_ERR_PARSE,
                       "%s: corrupted: its checksum is %016" PRIx64
                       ", index_checksum says %016" PRIx64,
                       path, got, want);
    return SELDP_OK;
}

static seldp_status parse_config(const char *path, const hx_json *v, tm_config *cfg)
{
    static const char *const ints[] = {"vocab", "d_model", "d_ff",     "experts",
                                       "top_k", "layers",  "lora_rank"};
    int *fields[] = {&cfg->vocab, &cfg->d_model, &cfg->d_ff,     &cfg->experts,
                     &cfg->top_k, &cfg->layers,  &cfg->lora_rank};
    int64_t x = 0;
    *cfg = (tm_config)TM_CONFIG_INIT;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (!json_int(hx_json_get(v, ints[i]), 0, 1 << 30, &x))
            return hx_fail(SELDP_ERR_PARSE, "%s: config.%s: expected a non-negative integer", path,
                           ints[i]);
        *fields[i] = (int)x;
    }
    const hx_json *eps = hx_json_get(v, "eps"), *alpha = hx_json_get(v, "lora_alpha");
    const hx_json *seed = hx_json_get(v, "seed");
    if (!eps || eps->type != HX_JSON_NUMBER || !alpha || alpha->type != HX_JSON_NUMBER)
        return hx_fail(SELDP_ERR_PARSE, "%s: config: eps and lora_alpha must be numbers", path);
    cfg->eps = eps->number;
    cfg->lora_alpha = alpha->number;
    if (!seed || seed->type != HX_JSON_NUMBER || !seed->is_integer)
        return hx_fail(SELDP_ERR_PARSE, "%s: config.seed: expected an integer", path);
    cfg->seed = (uint64_t)seed->integer;
    if (!tm_dtype_parse(json_str(hx_json_get(v, "dtype")) ? json_str(hx_json_get(v, "dtype")) : "",
                        &cfg->dtype))
        return hx_fail(SELDP_ERR_PARSE, "%s: config.dtype: expected f32, bf16 or f16", path);
    if (!tm_quant_parse(json_str(hx_json_get(v, "quant")) ? json_str(hx_json_get(v, "quant")) : "",
                        &cfg->quant))
        return hx_fail(SELDP_ERR_PARSE, "%s: config.quant: expected none, nf4 or awq", path);
    return SELDP_OK;
}

/* The config's shared expert and router keys, all or none (an older index has none). */
static seldp_status parse_router(const char *path, const hx_json *v, tm_config *cfg, bool *known)
{
    static const char *const numbers[] = {"aux_loss_coeff", "z_loss_coeff", "capacity_factor"};
    double *fields[] = {&cfg->aux_loss_coeff, &cfg->z_loss_coeff, &cfg->capacity_factor};
    const hx_json *shared = hx_json_get(v, "d_ff_shared"),
                  *scope = hx_json_get(v, "aux_loss_scope");
    int64_t x = 0;
    *known = shared != NULL;
    if (!*known)
        return SELDP_OK;
    if (!json_int(shared, 0, 1 << 30, &x))
        return hx_fail(SELDP_ERR_PARSE, "%s: config.d_ff_shared: expected a non-negative integer",
                       path);
    cfg->d_ff_shared = (int)x;
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0]; i++) {
        const hx_json *n = hx_json_get(v, numbers[i]);
        if (!n || n->type != HX_JSON_NUMBER || !(n->number >= 0))
            return hx_fail(SELDP_ERR_PARSE, "%s: config.%s: expected a number >= 0", path,
                           numbers[i]);
        *fields[i] = n->number;
    }
    if (!tm_aux_scope_parse(json_str(scope) ? json_str(scope) : "", &cfg->aux_loss_scope))
        return hx_fail(SELDP_ERR_PARSE, "%s: config.aux_loss_scope: expected global or local",
                       path);
    return SELDP_OK;
}

static seldp_status parse_files(hx_ckpt *c, const char *path, const hx_json *files)
{
    if (!files || files->type != HX_JSON_OBJECT || files->count == 0)
        return hx_fail(SELDP_ERR_PARSE, "%s: files: expected a non-empty object", path);
    c->files = hx_calloc(files->count, sizeof *c->files);
    if (!c->files)
        return SELDP_ERR_NOMEM;
    for (size_t i = 0; i < files->count; i++) {
        ckpt_file *f = &c->files[c->n_files];
        const char *name = files->keys[i];
        int64_t bytes = 0;
        if (strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || !name[0])
            return hx_fail(SELDP_ERR_PARSE, "%s: files: '%s' is not a file name of the directory",
                           path, name);
        if (!json_int(hx_json_get(&files->items[i], "bytes"), 8, INT64_MAX, &bytes) ||
            !hx_ckpt_hex64(json_str(hx_json_get(&files->items[i], "header_checksum")),
                           &f->header_checksum))
            return hx_fail(SELDP_ERR_PARSE,
                           "%s: files.%s: needs bytes (>= 8) and header_checksum (16 hex digits)",
                           path, name);
        f->bytes = (uint64_t)bytes;
        f->name = hx_strdup(name);
        if (!f->name)
            return SELDP_ERR_NOMEM;
        c->n_files++;
    }
    return SELDP_OK;
}

static seldp_status parse_tensor(hx_ckpt *c, const char *path, const char *name, const hx_json *v,
                                 ckpt_tensor *t)
{
    const hx_json *shape = hx_json_get(v, "shape"), *slice = hx_json_get(v, "slice");
    const hx_json *offsets = hx_json_get(v, "offsets");
    const char *file = json_str(hx_json_get(v, "file"));
    int64_t x = 0, begin = 0, end = 0;
    if (!shape || shape->type != HX_JSON_ARRAY || shape->count > SELDP_MAX_DIMS || !slice ||
        slice->type != HX_JSON_ARRAY || slice->count != shape->count || !offsets ||
        offsets->type != HX_JSON_ARRAY || offsets->count != 2 || !file ||
        !dtype_parse(json_str(hx_json_get(v, "dtype")), &t->dtype) ||
        !hx_ckpt_hex64(json_str(hx_json_get(v, "checksum")), &t->checksum))
        return hx_fail(SELDP_ERR_PARSE,
                       "%s: tensors.%s: needs shape, dtype, file, slice (one [begin, end] per "
                       "dimension), offsets [begin, end] and checksum",
                       path, name);
    t->ndim = (int)shape->count;
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        const hx_json *s = &slice->items[d];
        if (!json_int(&shape->items[d], 0, INT32_MAX, &x) || s->type != HX_JSON_ARRAY ||
            s->count != 2 || !json_int(&s->items[0], 0, x, &begin) ||
            !json_int(&s->items[1], begin, x, &end))
            return hx_fail(SELDP_ERR_PARSE,
                           "%s: tensors.%s: dimension %d: shape and slice [begin, end] must be "
                           "integers with 0 <= begin <= end <= shape",
                           path, name, d);
        t->shape[d] = x;
        t->slice[d][0] = begin;
        t->slice[d][1] = end;
        numel *= (uint64_t)(end - begin);
    }
    if (!json_int(&offsets->items[0], 8, INT64_MAX, &begin) ||
        !json_int(&offsets->items[1], begin, INT64_MAX, &end) ||
        (uint64_t)(end - begin) != numel * seldp_dtype_size(t->dtype))
        return hx_fail(SELDP_ERR_PARSE,
                       "%s: tensors.%s: offsets must be [begin, end] holding the slice's %" PRIu64
                       " elements of %s",
                       path, name, numel, hx_st_dtype_name(t->dtype));
    t->offset = (uint64_t)begin;
    t->nbytes = (uint64_t)(end - begin);
    t->file = -1;
    for (size_t i = 0; i < c->n_files; i++)
        if (strcmp(c->files[i].name, file) == 0)
            t->file = (int)i;
    if (t->file < 0)
        return hx_fail(SELDP_ERR_PARSE, "%s: tensors.%s: file '%s' is not among the files", path,
                       name, file);
    if (t->offset + t->nbytes > c->files[t->file].bytes)
        return hx_fail(SELDP_ERR_PARSE, "%s: tensors.%s: offsets run past the end of %s", path,
                       name, file);
    t->path = hx_strdup(name);
    return t->path ? SELDP_OK : SELDP_ERR_NOMEM;
}

/* training.optimizer, .optimizer_steps and .loss_scale (absent: SGD, no loss scaling). */
static seldp_status parse_optimizer(hx_ckpt *c, const char *path, const hx_json *training)
{
    const char *name = json_str(hx_json_get(training, "optimizer"));
    if (name && strcmp(name, "adamw") != 0 && strcmp(name, "sgd") != 0)
        return hx_fail(SELDP_ERR_PARSE, "%s: training.optimizer: expected sgd or adamw", path);
    c->adamw = name && strcmp(name, "adamw") == 0;
    const hx_json *steps = hx_json_get(training, "optimizer_steps");
    if (steps) {
        if (steps->type != HX_JSON_OBJECT)
            return hx_fail(SELDP_ERR_PARSE, "%s: training.optimizer_steps: expected an object",
                           path);
        c->step_paths = hx_calloc(steps->count + 1, sizeof *c->step_paths);
        c->steps = hx_calloc(steps->count + 1, sizeof *c->steps);
        if (!c->step_paths || !c->steps)
            return SELDP_ERR_NOMEM;
        for (size_t i = 0; i < steps->count; i++) {
            int64_t x = 0;
            if (!json_int(&steps->items[i], 0, INT32_MAX, &x))
                return hx_fail(SELDP_ERR_PARSE,
                               "%s: training.optimizer_steps.%s: expected a step count", path,
                               steps->keys[i]);
            c->step_paths[i] = hx_strdup(steps->keys[i]);
            if (!c->step_paths[i])
                return SELDP_ERR_NOMEM;
            c->steps[i] = x;
            c->n_steps = i + 1;
        }
    }
    const hx_json *scale = hx_json_get(training, "loss_scale");
    if (scale) {
        int64_t good = 0;
        if (scale->type != HX_JSON_NUMBER || !(scale->number >= 1) ||
            !json_int(hx_json_get(training, "loss_scale_good"), 0, INT32_MAX, &good))
            return hx_fail(SELDP_ERR_PARSE,
                           "%s: training.loss_scale: expected a number >= 1 with loss_scale_good",
                           path);
        c->loss_scale_known = true;
        c->loss_scale = scale->number;
        c->loss_scale_good = good;
    }
    return SELDP_OK;
}

static seldp_status parse_index(hx_ckpt *c, const char *path, const hx_json *root)
{
    seldp_status st = SELDP_OK;
    int64_t x = 0;
    const char *format = json_str(hx_json_get(root, "format"));
    if (!format || strcmp(format, CKPT_FORMAT) != 0)
        return hx_fail(SELDP_ERR_PARSE, "%s: format: expected \"%s\"", path, CKPT_FORMAT);
    if (!json_int(hx_json_get(root, "version"), 0, INT32_MAX, &x) || (x != 1 && x != CKPT_VERSION))
        return hx_fail(SELDP_ERR_PARSE, "%s: version: expected 1 or %d", path, CKPT_VERSION);
    c->version = (int)x;
    if ((c->version == 1) != (c->basis == HX_FNV1A_BASIS_V1))
        return hx_fail(SELDP_ERR_PARSE,
                       "%s: version %d, but its index_checksum is the checksum of version %d", path,
                       c->version, c->version == 1 ? CKPT_VERSION : 1);
    if (!json_int(hx_json_get(root, "step"), 1, 100000, &x))
        return hx_fail(SELDP_ERR_PARSE, "%s: step: expected an integer in 1..100000", path);
    c->step = (int)x;
    if (!json_int(hx_json_get(root, "generation"), 0, INT32_MAX, &x))
        return hx_fail(SELDP_ERR_PARSE, "%s: generation: expected a non-negative integer", path);
    c->generation = (int)x;
    HX_CHECK(parse_config(path, hx_json_get(root, "config"), &c->config));
    HX_CHECK(parse_router(path, hx_json_get(root, "config"), &c->config, &c->router_known));
    const hx_json *training = hx_json_get(root, "training");
    const hx_json *master = hx_json_get(training, "fp32_master");
    if (!master || master->type != HX_JSON_BOOL)
        return hx_fail(SELDP_ERR_PARSE, "%s: training.fp32_master: expected true or false", path);
    c->fp32_master = master->boolean;
    const hx_json *lr = hx_json_get(training, "lr"), *batch = hx_json_get(training, "global_batch");
    if (lr || batch) {
        if (!lr || lr->type != HX_JSON_NUMBER || !(lr->number >= 0) ||
            !json_int(batch, 0, INT32_MAX, &x))
            return hx_fail(SELDP_ERR_PARSE,
                           "%s: training: expected lr (a number >= 0) and global_batch (an "
                           "integer >= 0) together",
                           path);
        c->training_known = true;
        c->lr = lr->number;
        c->global_batch = (int)x;
    }
    HX_CHECK(parse_optimizer(c, path, training));
    const hx_json *stream = hx_json_get(root, "token_stream");
    const char *kind = json_str(hx_json_get(stream, "kind"));
    if (kind && strcmp(kind, "global") == 0) {
        c->global_stream = true;
        if (!hx_ckpt_hex64(json_str(hx_json_get(stream, "state")), &c->token_state))
            return hx_fail(SELDP_ERR_PARSE, "%s: token_stream.state: expected 16 hex digits", path);
    } else if (!kind || strcmp(kind, "per-rank") != 0) {
        return hx_fail(SELDP_ERR_PARSE, "%s: token_stream.kind: expected global or per-rank", path);
    }
    const char *algorithm = json_str(hx_json_get(root, "checksum"));
    if (!algorithm || strcmp(algorithm, "fnv1a64") != 0)
        return hx_fail(SELDP_ERR_PARSE, "%s: checksum: expected \"fnv1a64\"", path);
    HX_CHECK(parse_files(c, path, hx_json_get(root, "files")));
    const hx_json *tensors = hx_json_get(root, "tensors");
    if (!tensors || tensors->type != HX_JSON_OBJECT || tensors->count == 0)
        return hx_fail(SELDP_ERR_PARSE, "%s: tensors: expected a non-empty object", path);
    c->tensors = hx_calloc(tensors->count, sizeof *c->tensors);
    if (!c->tensors)
        return SELDP_ERR_NOMEM;
    for (size_t i = 0; i < tensors->count; i++) {
        HX_CHECK(
            parse_tensor(c, path, tensors->keys[i], &tensors->items[i], &c->tensors[c->n_tensors]));
        c->n_tensors++;
    }
fail:
    return st;
}

seldp_status hx_ckpt_parse(const char *text, size_t len, const char *path, const char *dir,
                           hx_ckpt **out)
{
    seldp_status st = SELDP_OK;
    hx_json *root = NULL;
    *out = NULL;
    hx_ckpt *c = hx_calloc(1, sizeof *c);
    if (!c)
        return SELDP_ERR_NOMEM;
    c->dir = hx_strdup(dir);
    if (!c->dir)
        HX_FAIL(SELDP_ERR_NOMEM, "out of memory");
    HX_CHECK(check_index_checksum(path, text, len, &c->basis));
    HX_CHECK(hx_json_parse(text, len, path, &root));
    HX_CHECK(parse_index(c, path, root));
    *out = c;
    c = NULL;
fail:
    hx_json_free(root);
    hx_ckpt_close(c);
    return st;
}
