/* Helpers of the checkpoint tests (see ckpt_test.h). */
#include "ckpt_test.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"
#include "safetensors.h"
#include "util.h"

void ckpt_test_read(const char *dir, ckpt_test *out)
{
    char path[2048];
    char *text = NULL;
    size_t len = 0;
    hx_json *index = NULL;
    memset(out, 0, sizeof *out);
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (hx_read_file(path, &text, &len) != SELDP_OK ||
        hx_json_parse(text, len, path, &index) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    free(text);
    const hx_json *step = hx_json_get(index, "step");
    assert_non_null(step);
    out->step = (int)step->integer;
    const hx_json *state = hx_json_get(hx_json_get(index, "token_stream"), "state");
    if (state && state->type == HX_JSON_STRING)
        snprintf(out->token_state, sizeof out->token_state, "%s", state->string);
    const hx_json *tensors = hx_json_get(index, "tensors");
    assert_non_null(tensors);
    out->count = tensors->count;
    out->tensors = calloc(tensors->count, sizeof *out->tensors);
    assert_non_null(out->tensors);
    for (size_t i = 0; i < tensors->count; i++) {
        ckpt_test_tensor *t = &out->tensors[i];
        const hx_json *file = hx_json_get(&tensors->items[i], "file");
        assert_non_null(file);
        snprintf(t->name, sizeof t->name, "%s", tensors->keys[i]);
        snprintf(path, sizeof path, "%s/%s", dir, file->string);
        hx_st_file *f = NULL;
        if (hx_st_read(path, &f) != SELDP_OK)
            fail_msg("%s", hx_last_error());
        const hx_st_tensor *s = hx_st_find(f, t->name);
        if (!s)
            fail_msg("%s: no tensor %s", path, t->name);
        t->dtype = s->dtype;
        t->nbytes = s->nbytes;
        t->numel = s->nbytes / seldp_dtype_size(s->dtype);
        t->bytes = malloc(s->nbytes ? s->nbytes : 1);
        assert_non_null(t->bytes);
        memcpy(t->bytes, s->data, s->nbytes);
        hx_st_file_free(f);
    }
    hx_json_free(index);
}

void ckpt_test_free(ckpt_test *c)
{
    for (size_t i = 0; i < c->count; i++)
        free(c->tensors[i].bytes);
    free(c->tensors);
    memset(c, 0, sizeof *c);
}

static const ckpt_test_tensor *find(const ckpt_test *c, const char *name)
{
    for (size_t i = 0; i < c->count; i++)
        if (strcmp(c->tensors[i].name, name) == 0)
            return &c->tensors[i];
    return NULL;
}

void ckpt_test_same(const ckpt_test *a, const ckpt_test *b, const char *what)
{
    if (a->count != b->count || a->step != b->step)
        fail_msg("%s: %zu tensors at step %d vs %zu at step %d", what, a->count, a->step, b->count,
                 b->step);
    if (strcmp(a->token_state, b->token_state) != 0)
        fail_msg("%s: token stream state %s vs %s", what, a->token_state, b->token_state);
    for (size_t i = 0; i < a->count; i++) {
        const ckpt_test_tensor *x = &a->tensors[i], *y = find(b, x->name);
        if (!y)
            fail_msg("%s: %s missing in the second checkpoint", what, x->name);
        if (x->dtype != y->dtype || x->nbytes != y->nbytes ||
            memcmp(x->bytes, y->bytes, x->nbytes) != 0)
            fail_msg("%s: %s differs", what, x->name);
    }
}

static double value(const ckpt_test_tensor *t, size_t i)
{
    if (t->dtype == SELDP_F32) {
        float f;
        memcpy(&f, t->bytes + 4 * i, 4);
        return f;
    }
    float f = 0;
    uint16_t h;
    memcpy(&h, t->bytes + 2 * i, 2);
    seldp_half_to_f32(t->dtype, &h, &f, 1);
    return f;
}

double ckpt_test_distance(const ckpt_test *a, const ckpt_test *b, char *worst, size_t size)
{
    double max = 0;
    if (a->count != b->count)
        fail_msg("%zu tensors vs %zu", a->count, b->count);
    for (size_t i = 0; i < a->count; i++) {
        const ckpt_test_tensor *x = &a->tensors[i], *y = find(b, x->name);
        if (!y || x->dtype != y->dtype || x->nbytes != y->nbytes)
            fail_msg("%s: missing or of another dtype or size", x->name);
        if (x->dtype != SELDP_F32 && x->dtype != SELDP_BF16 && x->dtype != SELDP_F16) {
            if (memcmp(x->bytes, y->bytes, x->nbytes) != 0)
                fail_msg("%s (%s) differs; it is never trained", x->name,
                         seldp_dtype_name(x->dtype));
            continue;
        }
        double diff = 0, norm = 0;
        for (size_t j = 0; j < x->numel; j++) {
            double u = value(x, j), v = value(y, j);
            diff += (u - v) * (u - v);
            norm += v * v;
        }
        double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
        if (rel > max || isnan(rel)) {
            max = rel;
            if (worst)
                snprintf(worst, size, "%s", x->name);
        }
    }
    return max;
}

bool ckpt_test_differ(const ckpt_test *a, const ckpt_test *b)
{
    for (size_t i = 0; i < a->count; i++) {
        const ckpt_test_tensor *y = find(b, a->tensors[i].name);
        if (!y || y->nbytes != a->tensors[i].nbytes ||
            memcmp(y->bytes, a->tensors[i].bytes, y->nbytes) != 0)
            return true;
    }
    return a->count != b->count;
}
