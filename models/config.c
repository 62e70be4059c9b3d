/* tiny-moe configuration: validation, names, the config JSON (docs/formats.md), and the portable
 * hash and random numbers every initialization and ParamId is drawn from. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "tm_internal.h"

static const char *const quant_names[] = {"none", "nf4", "awq"};

const char *tm_quant_name(tm_quant quant)
{
    if ((unsigned)quant < sizeof quant_names / sizeof quant_names[0])
        return quant_names[quant];
    return "invalid";
}

bool tm_quant_parse(const char *name, tm_quant *out)
{
    if (!name || !out)
        return false;
    for (unsigned q = 0; q < sizeof quant_names / sizeof quant_names[0]; q++) {
        if (strcasecmp(name, quant_names[q]) == 0) {
            *out = (tm_quant)q;
            return true;
        }
    }
    return false;
}

static const char *const scope_names[] = {"global", "local"};

const char *tm_aux_scope_name(tm_aux_scope scope)
{
    if ((unsigned)scope < sizeof scope_names / sizeof scope_names[0])
        return scope_names[scope];
    return "invalid";
}

bool tm_aux_scope_parse(const char *name, tm_aux_scope *out)
{
    if (!name || !out)
        return false;
    for (unsigned i = 0; i < sizeof scope_names / sizeof scope_names[0]; i++) {
        if (strcasecmp(name, scope_names[i]) == 0) {
            *out = (tm_aux_scope)i;
            return true;
        }
    }
    return false;
}

/* The routing extensions (docs/model.md): sizes and coefficients that are off at zero. */
static seldp_status check_routing(const tm_config *cfg)
{
    if (cfg->d_ff_shared < 0)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tiny-moe config: d_ff_shared = %d, expected >= 0 (0: no shared expert)",
                        cfg->d_ff_shared);
    const struct {
        const char *name;
        double value;
    } coeffs[] = {{"aux_loss_coeff", cfg->aux_loss_coeff},
                  {"z_loss_coeff", cfg->z_loss_coeff},
                  {"capacity_factor", cfg->capacity_factor}};
    for (size_t i = 0; i < sizeof coeffs / sizeof coeffs[0]; i++) {
        if (!(coeffs[i].value >= 0.0) || !isfinite(coeffs[i].value))
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "tiny-moe config: %s = %g, expected a finite number >= 0 (0: off)",
                            coeffs[i].name, coeffs[i].value);
    }
    if ((unsigned)cfg->aux_loss_scope >= sizeof scope_names / sizeof scope_names[0])
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tiny-moe config: aux_loss_scope %d, expected global or local",
                        (int)cfg->aux_loss_scope);
    return SELDP_OK;
}

static bool is_storage_dtype(seldp_dtype dtype)
{
    return dtype == SELDP_F32 || dtype == SELDP_BF16 || dtype == SELDP_F16;
}

const char *tm_dtype_name(seldp_dtype dtype)
{
    return is_storage_dtype(dtype) ? seldp_dtype_name(dtype) : "invalid";
}

bool tm_dtype_parse(const char *name, seldp_dtype *out)
{
    seldp_dtype d;
    if (!out || !seldp_dtype_parse(name, &d) || !is_storage_dtype(d))
        return false;
    *out = d;
    return true;
}

seldp_status tm_config_check(const tm_config *cfg)
{
    if (!cfg)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tiny-moe config: NULL");
    const struct {
        const char *name;
        int value;
    } sizes[] = {{"vocab", cfg->vocab},     {"d_model", cfg->d_model}, {"d_ff", cfg->d_ff},
                 {"experts", cfg->experts}, {"top_k", cfg->top_k},     {"layers", cfg->layers}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value <= 0)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "tiny-moe config: %s = %d, expected a positive size", sizes[i].name,
                            sizes[i].value);
    }
    if (cfg->top_k > cfg->experts)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tiny-moe config: top_k = %d exceeds experts = %d", cfg->top_k,
                        cfg->experts);
    if (!(cfg->eps > 0.0))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tiny-moe config: eps = %g, expected > 0",
                        cfg->eps);
    if (!is_storage_dtype(cfg->dtype))
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tiny-moe config: dtype %s, expected f32, bf16 or f16",
                        seldp_dtype_name(cfg->dtype));
    seldp_status st = check_routing(cfg);
    if (st != SELDP_OK)
        return st;
    switch (cfg->quant) {
    case TM_QUANT_NONE:
        return SELDP_OK;
    case TM_QUANT_NF4:
        if (((int64_t)cfg->d_model * cfg->d_ff) % TM_NF4_BLOCK != 0)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "tiny-moe config: nf4 needs d_model*d_ff (%d*%d) to be a "
                            "multiple of %d",
                            cfg->d_model, cfg->d_ff, TM_NF4_BLOCK);
        break;
    case TM_QUANT_AWQ:
        if (cfg->d_model % TM_AWQ_GROUP != 0 || cfg->d_ff % TM_AWQ_GROUP != 0)
            return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                            "tiny-moe config: awq needs d_model (%d) and d_ff (%d) to be "
                            "multiples of %d",
                            cfg->d_model, cfg->d_ff, TM_AWQ_GROUP);
        break;
    default:
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT, "tiny-moe config: quant %d unknown",
                        (int)cfg->quant);
    }
    if (cfg->lora_rank <= 0)
        return tm__fail(SELDP_ERR_INVALID_ARGUMENT,
                        "tiny-moe config: lora_rank = %d, expected >= 1 with quant %s",
                        cfg->lora_rank, tm_quant_name(cfg->quant));
    return SELDP_OK;
}

/* The shortest of %.15g/%.16g/%.17g that parses back to the same double. */
static void format_double(double v, char *buf, size_t size)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

size_t tm_config_json(const tm_config *cfg, char *buf, size_t size)
{
    char eps[40], alpha[40], aux[40], z[40], cf[40];
    format_double(cfg->eps, eps, sizeof eps);
    format_double(cfg->lora_alpha, alpha, sizeof alpha);
    format_double(cfg->aux_loss_coeff, aux, sizeof aux);
    format_double(cfg->z_loss_coeff, z, sizeof z);
    format_double(cfg->capacity_factor, cf, sizeof cf);
    int n = snprintf(buf, size,
                     "{\"vocab\":%d,\"d_model\":%d,\"d_ff\":%d,\"experts\":%d,\"top_k\":%d,"
                     "\"layers\":%d,\"eps\":%s,\"dtype\":\"%s\",\"quant\":\"%s\","
                     "\"lora_rank\":%d,\"lora_alpha\":%s,\"seed\":%llu,\"d_ff_shared\":%d,"
                     "\"aux_loss_coeff\":%s,\"aux_loss_scope\":\"%s\",\"z_loss_coeff\":%s,"
                     "\"capacity_factor\":%s}",
                     cfg->vocab, cfg->d_model, cfg->d_ff, cfg->experts, cfg->top_k, cfg->layers,
                     eps, tm_dtype_name(cfg->dtype), tm_quant_name(cfg->quant), cfg->lora_rank,
                     alpha, (unsigned long long)cfg->seed, cfg->d_ff_shared, aux,
                     tm_aux_scope_name(cfg->aux_loss_scope), z, cf);
    return n < 0 ? 0 : (size_t)n;
}

uint64_t tm_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tm_hash_path(const char *path)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

seldp_param_id tm_default_param_id(const char *path, int rank, void *user)
{
    (void)user;
    uint64_t r = (uint64_t)(int64_t)rank + 1;
    uint64_t state = tm_hash_path(path) ^ tm_splitmix64(&r);
    return tm_splitmix64(&state);
}
