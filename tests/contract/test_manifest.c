/* Contract of the schema manifest (src/manifest.h) that initialize all-gathers: it carries
 * every selected path with its dtype, shape, alias group, frozen flag and device kind; the
 * decoder rejects any truncated or malformed blob with SELDP_ERR_PARSE without reading
 * outside it; the comparison names the first differing path and every differing rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"
#include "manifest.h"

/* A model with a tied alias, a frozen scalar, an empty tensor, 8 dimensions and an
 * unselected parameter; the selection {1, 2, 3, 4} makes 5 entries. */
static void build_model(seldp_model **out, seldp__manifest *m)
{
    static float a[6], e[1];
    static uint16_t b[1];
    static uint8_t z[4];
    static const seldp_param_id sorted[] = {1, 2, 3, 4};
    seldp_model *model = NULL;
    seldp_tensor ta = seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, a, 2, SHAPE(2, 3));
    seldp_tensor tb = seldp_tensor_view(SELDP_BF16, SELDP_HOST_DEVICE, b, 0, NULL);
    seldp_tensor td = seldp_tensor_view(SELDP_U8, SELDP_HOST_DEVICE, z, 1, SHAPE(0));
    seldp_tensor te =
        seldp_tensor_view(SELDP_F32, SELDP_HOST_DEVICE, e, 8, SHAPE(1, 1, 1, 1, 1, 1, 1, 1));
    seldp_tensor tz = seldp_tensor_view(SELDP_U8, SELDP_HOST_DEVICE, z, 1, SHAPE(4));
    assert_int_equal(seldp_model_create(0, &model), SELDP_OK);
    assert_int_equal(seldp_model_add(model, "layers.a", 1, &ta, false, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(model, "layers.b", 2, &tb, true, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(model, "layers.c", 1, &ta, false, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(model, "layers.d", 3, &td, false, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(model, "layers.e", 4, &te, false, NULL), SELDP_OK);
    assert_int_equal(seldp_model_add(model, "layers.unselected", 9, &tz, false, NULL), SELDP_OK);
    assert_int_equal(seldp__manifest_build(model, sorted, 4, m), SELDP_OK);
    *out = model;
}

static void encode(const seldp__manifest *m, unsigned char **blob, size_t *bytes)
{
    void *p = NULL;
    assert_int_equal(seldp__manifest_encode(m, &p, bytes), SELDP_OK);
    *blob = p;
}

static void build_records_every_selected_path(void **state)
{
    (void)state;
    seldp_model *model;
    seldp__manifest m;
    build_model(&model, &m);
    assert_int_equal(m.count, 5);
    assert_string_equal(m.entries[0].path, "layers.a");
    assert_string_equal(m.entries[2].path, "layers.c");
    assert_int_equal(m.entries[2].alias, 0); /* tied to layers.a */
    assert_int_equal(m.entries[0].alias, 0);
    assert_int_equal(m.entries[1].alias, 1);
    assert_true(m.entries[1].frozen);
    assert_int_equal(m.entries[1].ndim, 0);
    assert_int_equal(m.entries[1].dtype, SELDP_BF16);
    assert_int_equal(m.entries[3].shape[0], 0);
    assert_int_equal(m.entries[4].ndim, 8);
    seldp__manifest_free(&m);
    seldp_model_destroy(model);
}

static void encode_decode_round_trip(void **state)
{
    (void)state;
    seldp_model *model;
    seldp__manifest m, d;
    unsigned char *blob, *again;
    size_t bytes, bytes2;
    build_model(&model, &m);
    encode(&m, &blob, &bytes);
    assert_int_equal(seldp__manifest_decode(blob, bytes, &d), SELDP_OK);
    assert_int_equal(d.count, m.count);
    for (size_t i = 0; i < m.count; i++) {
        assert_string_equal(d.entries[i].path, m.entries[i].path);
        assert_int_equal(d.entries[i].dtype, m.entries[i].dtype);
        assert_int_equal(d.entries[i].ndim, m.entries[i].ndim);
        assert_memory_equal(d.entries[i].shape, m.entries[i].shape,
                            (size_t)m.entries[i].ndim * sizeof(int64_t));
        assert_int_equal(d.entries[i].alias, m.entries[i].alias);
        assert_int_equal(d.entries[i].frozen, m.entries[i].frozen);
        assert_int_equal(d.entries[i].device_kind, m.entries[i].device_kind);
    }
    encode(&d, &again, &bytes2);
    assert_int_equal(bytes2, bytes);
    assert_memory_equal(again, blob, bytes);
    assert_int_equal(seldp__manifest_compare((seldp__manifest[]){m, d}, 2, 0, (int[]){0, 1}),
                     SELDP_OK);
    free(again);
    free(blob);
    seldp__manifest_free(&d);
    seldp__manifest_free(&m);
    seldp_model_destroy(model);
}

static void every_truncation_is_a_parse_error(void **state)
{
    (void)state;
    seldp_model *model;
    seldp__manifest m, d;
    unsigned char *blob;
    size_t bytes;
    build_model(&model, &m);
    encode(&m, &blob, &bytes);
    for (size_t len = 0; len < bytes; len++) {
        /* a copy of exactly len bytes, so that ASan sees any read past it */
        unsigned char *cut = malloc(len ? len : 1);
        assert_non_null(cut);
        memcpy(cut, blob, len);
        if (seldp__manifest_decode(cut, len, &d) != SELDP_ERR_PARSE)
            fail_msg("a blob cut to %zu of %zu bytes was not rejected", len, bytes);
        free(cut);
    }
    free(blob);
    seldp__manifest_free(&m);
    seldp_model_destroy(model);
}

/* Any single corrupted byte is either rejected or decodes to a manifest that encodes back
 * to the very same bytes (the encoding is canonical); never a crash or an overread. */
static void corrupted_bytes_are_rejected_or_canonical(void **state)
{
    (void)state;
    static const unsigned char masks[] = {0x01, 0x02, 0x10, 0x80, 0xff};
    seldp_model *model;
    seldp__manifest m;
    unsigned char *blob;
    size_t bytes, accepted = 0, rejected = 0;
    build_model(&model, &m);
    encode(&m, &blob, &bytes);
    for (size_t at = 0; at < bytes; at++) {
        for (size_t k = 0; k < sizeof masks; k++) {
            unsigned char *bad = malloc(bytes);
            seldp__manifest d;
            seldp_status st;
            assert_non_null(bad);
            memcpy(bad, blob, bytes);
            bad[at] ^= masks[k];
            st = seldp__manifest_decode(bad, bytes, &d);
            if (st == SELDP_OK) {
                unsigned char *again;
                size_t n;
                encode(&d, &again, &n);
                if (n != bytes || memcmp(again, bad, bytes) != 0)
                    fail_msg("byte %zu ^ 0x%02x decoded to a manifest that encodes differently", at,
                             masks[k]);
                free(again);
                seldp__manifest_free(&d);
                accepted++;
            } else {
                assert_int_equal(st, SELDP_ERR_PARSE);
                rejected++;
            }
            free(bad);
        }
    }
    assert_true(rejected > 0 && accepted > 0);
    free(blob);
    seldp__manifest_free(&m);
    seldp_model_destroy(model);
}

/* --- hand-made blobs ------------------------------------------------------- */

typedef struct blob {
    unsigned char b[512];
    size_t n;
} blob;

static void put(blob *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        b->b[b->n++] = (unsigned char)(v >> (8 * i));
}

static void header(blob *b, const char *magic, uint32_t version, uint32_t count)
{
    b->n = 0;
    memcpy(b->b, magic, 4);
    b->n = 4;
    put(b, version, 4);
    put(b, count, 4);
}

static void entry(blob *b, const char *path, uint32_t len, unsigned dtype, unsigned ndim,
                  unsigned flags, unsigned kind, uint32_t alias, uint64_t extent)
{
    put(b, len, 4);
    memcpy(b->b + b->n, path, len);
    b->n += len;
    put(b, dtype, 1);
    put(b, ndim, 1);
    put(b, flags, 1);
    put(b, kind, 1);
    put(b, alias, 4);
    for (unsigned d = 0; d < ndim; d++)
        put(b, d == 0 ? extent : 1, 8);
}

static void expect_parse(const blob *b, const char *what)
{
    seldp__manifest d;
    unsigned char *copy = malloc(b->n ? b->n : 1);
    seldp_status st;
    assert_non_null(copy);
    memcpy(copy, b->b, b->n);
    st = seldp__manifest_decode(copy, b->n, &d);
    free(copy);
    if (st != SELDP_ERR_PARSE)
        fail_msg("%s: decode returned %s, expected SELDP_ERR_PARSE", what, seldp_status_name(st));
}

static void malformed_blobs_are_rejected(void **state)
{
    (void)state;
    blob b;
    seldp__manifest d;

    header(&b, "SDPM", 1, 0);
    assert_int_equal(seldp__manifest_decode(b.b, b.n, &d), SELDP_OK);
    assert_int_equal(d.count, 0);
    seldp__manifest_free(&d);
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 0, 4);
    assert_int_equal(seldp__manifest_decode(b.b, b.n, &d), SELDP_OK);
    seldp__manifest_free(&d);

    header(&b, "SDPX", 1, 0);
    expect_parse(&b, "bad magic");
    header(&b, "SDPM", 2, 0);
    expect_parse(&b, "unknown version");
    header(&b, "SDPM", 1, 1000);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 0, 4);
    expect_parse(&b, "count beyond the blob");
    header(&b, "SDPM", 1, UINT32_MAX);
    expect_parse(&b, "huge count");
    header(&b, "SDPM", 1, 2);
    entry(&b, "b", 1, SELDP_F32, 1, 0, 0, 0, 4);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 1, 4);
    expect_parse(&b, "paths out of order");
    header(&b, "SDPM", 1, 2);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 0, 4);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 1, 4);
    expect_parse(&b, "duplicate path");
    header(&b, "SDPM", 1, 2);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 1, 4);
    entry(&b, "b", 1, SELDP_F32, 1, 0, 0, 1, 4);
    expect_parse(&b, "alias to a later path");
    header(&b, "SDPM", 1, 3);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 0, 4);
    entry(&b, "b", 1, SELDP_F32, 1, 0, 0, 0, 4);
    entry(&b, "c", 1, SELDP_F32, 1, 0, 0, 1, 4);
    expect_parse(&b, "alias to a path that is itself an alias");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_DTYPE_COUNT, 1, 0, 0, 0, 4);
    expect_parse(&b, "invalid dtype");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, SELDP_MAX_DIMS + 1, 0, 0, 0, 4);
    expect_parse(&b, "too many dimensions");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, 1, 2, 0, 0, 4);
    expect_parse(&b, "unknown flag");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 2, 0, 4);
    expect_parse(&b, "invalid device kind");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 0, (uint64_t)1 << 63);
    expect_parse(&b, "negative extent");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, 2, 0, 0, 0, 4);
    b.n -= 8;
    put(&b, (uint64_t)1 << 62, 8); /* 4 x 2^62 elements of 4 bytes */
    expect_parse(&b, "byte size overflow");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a", 1, SELDP_F32, 1, 0, 0, 0, 4);
    put(&b, 0, 1);
    expect_parse(&b, "trailing byte");
    header(&b, "SDPM", 1, 1);
    entry(&b, "", 0, SELDP_F32, 1, 0, 0, 0, 4);
    expect_parse(&b, "empty path");
    header(&b, "SDPM", 1, 1);
    entry(&b, "a\0b", 3, SELDP_F32, 1, 0, 0, 0, 4);
    expect_parse(&b, "NUL inside a path");
    header(&b, "SDPM", 1, 1);
    put(&b, 1000, 4);
    memcpy(b.b + b.n, "abc", 3);
    b.n += 3;
    expect_parse(&b, "path longer than the blob");
    expect_parse(&(blob){{0}, 0}, "empty blob");
}

/* --- comparison ------------------------------------------------------------ */

static seldp__manifest_entry E(const char *path, seldp_dtype dtype, int64_t extent, uint32_t alias,
                               bool frozen)
{
    seldp__manifest_entry e;
    memset(&e, 0, sizeof e);
    e.path = path;
    e.dtype = dtype;
    e.ndim = 1;
    e.shape[0] = extent;
    e.alias = alias;
    e.frozen = frozen;
    e.device_kind = SELDP_DEVICE_HOST;
    return e;
}

static void expect_schema(seldp__manifest *ms, int n, int root, const char *needle1,
                          const char *needle2)
{
    int world[4] = {10, 11, 12, 13};
    assert_int_equal(seldp__manifest_compare(ms, n, root, world), SELDP_ERR_SCHEMA);
    if (!strstr(seldp_last_error(), needle1) || (needle2 && !strstr(seldp_last_error(), needle2)))
        fail_msg("message lacks \"%s\"%s%s: %s", needle1, needle2 ? " or " : "",
                 needle2 ? needle2 : "", seldp_last_error());
}

static void comparison_names_first_path_and_ranks(void **state)
{
    (void)state;
    seldp__manifest_entry base[3] = {E("a", SELDP_F32, 4, 0, false), E("b", SELDP_BF16, 2, 1, true),
                                     E("c", SELDP_F32, 4, 0, false)};
    seldp__manifest_entry r[4][3];
    seldp__manifest ms[4];
    for (int i = 0; i < 4; i++) {
        memcpy(r[i], base, sizeof base);
        ms[i] = (seldp__manifest){3, r[i], NULL};
    }
    assert_int_equal(seldp__manifest_compare(ms, 4, 0, (int[]){0, 1, 2, 3}), SELDP_OK);

    r[1][2].shape[0] = 5;      /* c on rank 1 */
    r[2][1].dtype = SELDP_F16; /* b on rank 2: the first differing path */
    r[3][1].dtype = SELDP_F16;
    expect_schema(ms, 4, 0, "at 'b'", "group ranks differing from root here: 2,3");
    expect_schema(ms, 4, 0, "group rank 2 (world rank 12) has dtype f16", "has dtype bf16");

    /* relative to another root, the ranks that differ are the others */
    expect_schema(ms, 4, 2, "root (group rank 2, world rank 12)", "here: 0,1");

    memcpy(r[2], base, sizeof base);
    memcpy(r[3], base, sizeof base);
    expect_schema(ms, 4, 0, "at 'c'", "shape [5]");

    memcpy(r[1], base, sizeof base);
    /* c untied on rank 1: a's alias set is the first that differs, and both sets are named */
    r[1][2].alias = 2;
    expect_schema(ms, 4, 0, "at 'a'",
                  "root (group rank 0, world rank 10) has alias set {'a', 'c'}");
    expect_schema(ms, 4, 0, "group rank 1 (world rank 11) has alias set {'a'} (untied", NULL);
    /* a tied to b instead of c on rank 1: a's set differs, not only b's and c's */
    r[1][1].alias = 0;
    r[1][2].alias = 2;
    expect_schema(ms, 4, 0, "at 'a'", "alias set {'a', 'b'}, root");
    /* the same sets under other indices are equal */
    memcpy(r[1], base, sizeof base);
    assert_int_equal(seldp__manifest_compare(ms, 4, 0, (int[]){0, 1, 2, 3}), SELDP_OK);

    memcpy(r[1], base, sizeof base);
    r[3][1].frozen = false;
    expect_schema(ms, 4, 0, "at 'b'", "trainable");

    memcpy(r[3], base, sizeof base);
    r[2][0].device_kind = SELDP_DEVICE_CUDA;
    expect_schema(ms, 4, 0, "at 'a'", "cuda");

    memcpy(r[2], base, sizeof base);
    ms[1].count = 2; /* c missing on rank 1 */
    expect_schema(ms, 4, 0, "selected on root", "but not on group rank 1 (world rank 11)");
    expect_schema(ms, 4, 1, "at 'c': selected on group rank 0", "not on root");
    ms[1].count = 3;
    assert_int_equal(seldp__manifest_compare(ms, 4, 0, (int[]){0, 1, 2, 3}), SELDP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(build_records_every_selected_path),
        cmocka_unit_test(encode_decode_round_trip),
        cmocka_unit_test(every_truncation_is_a_parse_error),
        cmocka_unit_test(corrupted_bytes_are_rejected_or_canonical),
        cmocka_unit_test(malformed_blobs_are_rejected),
        cmocka_unit_test(comparison_names_first_path_and_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
