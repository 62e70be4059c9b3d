/* The harness's safetensors writer and reader: a round trip of every dtype and of metadata,
 * and the malformed files the reader must refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness_test.h"
#include "safetensors.h"

static void test_round_trip(void **state)
{
    (void)state;
    const char *dir = hx_test_dir("round_trip");
    char path[1200];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    uint16_t bf16[3] = {0x3f80, 0xc000, 0x7fc0};
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    int32_t i32[4] = {-1, 2, 2147483647, -2147483647 - 1};
    double f64[2] = {0.1, -1e300};
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s5[1] = {5}, s22[2] = {2, 2}, s0[1] = {0};
    hx_st_writer *w = NULL;
    assert_int_equal(hx_st_writer_create(&w), SELDP_OK);
    /* names with a slash and dots, as the dump writes them */
    assert_int_equal(hx_st_add(w, "param/layers.0.router.weight", SELDP_F32, 2, s23, f32), 0);
    assert_int_equal(hx_st_add(w, "grad/x", SELDP_BF16, 1, s3, bf16), 0);
    assert_int_equal(hx_st_add(w, "bytes", SELDP_U8, 1, s5, u8), 0);
    assert_int_equal(hx_st_add(w, "words", SELDP_I32, 2, s22, i32), 0);
    assert_int_equal(hx_st_add(w, "wide", SELDP_F64, 1, (int64_t[]){2}, f64), 0);
    assert_int_equal(hx_st_add(w, "empty", SELDP_I32, 1, s0, NULL), 0);
    assert_int_equal(hx_st_add(w, "scalar", SELDP_F32, 0, NULL, &f32[2]), 0);
    assert_int_equal(hx_st_add(w, "bytes", SELDP_U8, 1, s5, u8), SELDP_ERR_DUPLICATE);
    assert_int_equal(hx_st_add(w, "__metadata__", SELDP_U8, 1, s5, u8), SELDP_ERR_DUPLICATE);
    assert_int_equal(hx_st_add_metadata(w, "config", "{\"vocab\": 64, \"q\": \"a\\\"b\"}"), 0);
    assert_int_equal(hx_st_add_metadata(w, "note", "line\nbreak"), 0);
    assert_int_equal(hx_st_add_metadata(w, "note", "again"), SELDP_ERR_DUPLICATE);
    assert_int_equal(hx_st_write(w, path), SELDP_OK);
    hx_st_writer_destroy(w);

    hx_st_file *f = NULL;
    if (hx_st_read(path, &f) != SELDP_OK)
        fail_msg("%s", hx_last_error());
    assert_int_equal(hx_st_count(f), 7);
    /* tensors come back in name order */
    assert_string_equal(hx_st_at(f, 0)->name, "bytes");
    assert_string_equal(hx_st_at(f, 6)->name, "words");
    const hx_st_tensor *t = hx_st_find(f, "param/layers.0.router.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, SELDP_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->nbytes, sizeof f32);
    assert_memory_equal(t->data, f32, sizeof f32);
    assert_memory_equal(hx_st_find(f, "grad/x")->data, bf16, sizeof bf16);
    assert_int_equal(hx_st_find(f, "grad/x")->dtype, SELDP_BF16);
    assert_memory_equal(hx_st_find(f, "bytes")->data, u8, sizeof u8);
    assert_memory_equal(hx_st_find(f, "words")->data, i32, sizeof i32);
    assert_memory_equal(hx_st_find(f, "wide")->data, f64, sizeof f64);
    assert_int_equal(hx_st_find(f, "empty")->nbytes, 0);
    assert_int_equal(hx_st_find(f, "scalar")->ndim, 0);
    assert_true(*(const float *)hx_st_find(f, "scalar")->data == 3.25f);
    /* wider elements first, so every tensor is aligned to its element size */
    for (size_t i = 0; i < hx_st_count(f); i++) {
        const hx_st_tensor *x = hx_st_at(f, i);
        assert_int_equal((uintptr_t)x->data % seldp_dtype_size(x->dtype), 0);
    }
    assert_null(hx_st_find(f, "absent"));
    assert_string_equal(hx_st_metadata(f, "config"), "{\"vocab\": 64, \"q\": \"a\\\"b\"}");
    assert_string_equal(hx_st_metadata(f, "note"), "line\nbreak");
    assert_null(hx_st_metadata(f, "absent"));
    hx_st_file_free(f);

    /* the header is padded to 8 bytes and its length is little-endian */
    char *bytes = NULL;
    size_t len = 0;
    assert_int_equal(hx_read_file(path, &bytes, &len), SELDP_OK);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | (unsigned char)bytes[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal(bytes[8], '{');
    free(bytes);
}

/* A file of one header and `data_len` data bytes. */
static seldp_status parse_file(const char *header, size_t data_len, hx_st_file **f)
{
    size_t hl = strlen(header);
    unsigned char *bytes = calloc(8 + hl + data_len + 1, 1);
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(bytes + 8, header, hl);
    seldp_status st = hx_st_parse(bytes, 8 + hl + data_len, "bad.safetensors", f);
    free(bytes);
    return st;
}

static void expect_refused(const char *header, size_t data_len, const char *why)
{
    hx_st_file *f = NULL;
    seldp_status st = parse_file(header, data_len, &f);
    if (st == SELDP_OK) {
        hx_st_file_free(f);
        fail_msg("accepted: %s", header);
    }
    assert_int_equal(st, SELDP_ERR_PARSE);
    if (!strstr(hx_last_error(), why) || !strstr(hx_last_error(), "bad.safetensors"))
        fail_msg("header %s: message '%s' lacks '%s'", header, hx_last_error(), why);
}

static void test_malformed(void **state)
{
    (void)state;
    hx_st_file *f = NULL;
    /* a good one first, so the helper is known to work */
    assert_int_equal(
        parse_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &f),
        SELDP_OK);
    hx_st_file_free(f);
    assert_int_equal(hx_st_parse("\x01\x02", 2, "bad.safetensors", &f), SELDP_ERR_PARSE);
    assert_int_equal(hx_st_parse("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10, "bad.safetensors", &f),
                     SELDP_ERR_PARSE);
    assert_non_null(strstr(hx_last_error(), "exceeds"));
    expect_refused("[]", 0, "does not start with");
    expect_refused(" {}", 0, "does not start with '{'");
    expect_refused("{\"a\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                   "unknown dtype F8");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                   "needs 12");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
                   "shape[0]");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
                   3, "without gaps or overlap");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4,
                   "starts at byte 2");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 5, "holds 5");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"x\":1}}", 2,
                   "unknown member \"x\"");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2, "data_offsets");
    expect_refused("{\"__metadata__\":{\"k\":1}}", 0, "expected a string");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},}", 2,
                   "trailing comma");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
