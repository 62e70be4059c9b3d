/* The parsers of untrusted bytes under corrupt and outsized input: the schema-manifest
 * decoder (a blob another rank sent), layout files and safetensors files.
 *
 * Sweeps: every truncation and every single-byte corruption (0x00, 0xff, low bit, high bit)
 * of a well-formed input gives a clean error or a valid result, never a crash or a read
 * outside the input (the asan preset runs this); a corrupted manifest that still decodes
 * re-encodes to the same bytes and compares with the original without trouble.
 * Regressions: what the fuzzers (tests/fuzz) and these sweeps found. */
#define _GNU_SOURCE /* clock_gettime, mkdtemp, mallopt */

#include <limits.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "contract.h"
#include "json.h"
#include "layout.h"
#include "manifest.h"
#include "safetensors.h"

static const unsigned char mutations[][2] = {{0x00, 0}, {0xff, 0}, {0x01, 1}, {0x80, 1}};
#define N_MUTATIONS (sizeof mutations / sizeof mutations[0])

/* Byte i of `good` replaced (or xor-ed) by mutation m, into `bad`; false when unchanged. */
static bool mutate(const unsigned char *good, size_t i, size_t m, unsigned char *bad, size_t n)
{
    memcpy(bad, good, n);
    bad[i] = mutations[m][1] ? (unsigned char)(good[i] ^ mutations[m][0]) : mutations[m][0];
    return bad[i] != good[i];
}

/* This thread's CPU time: what a parse costs, whatever else the machine runs. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The regressions below are about growth, not speed: `read` costs n items and then 8n; a
 * linear (or n log n) reader costs about 8x, a quadratic one 64x. The heap is kept (no trim,
 * no mmap) and warmed by one read of 8n first, so that the smaller read does not run on pages
 * the larger one must fault in; caches still make the larger read dearer per item (its keys
 * and hash table outgrow them), and a busy machine shares them: the best of three readings of
 * each size and a ratio of 32 between them leave room for that without admitting a quadratic
 * reader. Each call returns its CPU seconds. */
typedef double (*sized_read)(size_t n);

static void assert_linear_growth(sized_read read, size_t n, const char *what)
{
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    (void)read(8 * n);
    double small = 1e30, large = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double a = read(n), b = read(8 * n);
        small = a < small ? a : small;
        large = b < large ? b : large;
    }
    double floor_s = 1e-4; /* a clock tick's worth, so that a fast small read is not 0 */
    double ratio = large / (small > floor_s ? small : floor_s);
    printf("  %s: %zu in %.3f s, %zu in %.3f s (x%.1f)\n", what, n, small, 8 * n, large, ratio);
    if (ratio > 32.0)
        fail_msg("%s: 8x the items cost %.1fx the time (%.3f s against %.3f s): not linear", what,
                 ratio, large, small);
}

/* --- manifests ----------------------------------------------------------------------------- */

/* The standard layout's manifest (tied alias, frozen, three dtypes) as a blob. */
static void standard_manifest(seldp__manifest *m, void **blob, size_t *bytes, test_model *tm)
{
    seldp_param_id ids[STD_N];
    assert_int_equal(ct_init(tm, 0), SELDP_OK);
    assert_int_equal(std_model(tm, 0), SELDP_OK);
    std_selection(0, ids);
    for (size_t i = 1; i < STD_N; i++) /* ascending, as the builder wants them */
        for (size_t j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
            seldp_param_id t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    assert_int_equal(seldp__manifest_build(tm->model, ids, STD_N, m), SELDP_OK);
    assert_int_equal(seldp__manifest_encode(m, blob, bytes), SELDP_OK);
}

static void manifest_sweep(void **state)
{
    (void)state;
    test_model tm;
    seldp__manifest good;
    void *blob = NULL;
    size_t bytes = 0, decoded = 0, rejected = 0;
    standard_manifest(&good, &blob, &bytes, &tm);
    unsigned char *bad = malloc(bytes);
    assert_non_null(bad);

    for (size_t len = 0; len < bytes; len++) {
        seldp__manifest m = {0, NULL, NULL};
        /* an exact-size copy, so that ASan catches a read past the end */
        unsigned char *cut = malloc(len ? len : 1);
        assert_non_null(cut);
        memcpy(cut, blob, len);
        if (seldp__manifest_decode(cut, len, &m) != SELDP_ERR_PARSE || m.entries || m.strings)
            fail_msg("the manifest cut to %zu of %zu bytes was not rejected cleanly", len, bytes);
        free(cut);
    }
    for (size_t i = 0; i < bytes; i++) {
        for (size_t k = 0; k < N_MUTATIONS; k++) {
            seldp__manifest m = {0, NULL, NULL}, pair[2];
            const int world_ranks[2] = {0, 1};
            void *again = NULL;
            size_t again_bytes = 0;
            if (!mutate(blob, i, k, bad, bytes))
                continue;
            seldp_status st = seldp__manifest_decode(bad, bytes, &m);
            if (st != SELDP_OK) {
                if (st != SELDP_ERR_PARSE || m.entries)
                    fail_msg("byte %zu mutation %zu: %s", i, k, seldp_status_name(st));
                rejected++;
                continue;
            }
            decoded++;
            assert_int_equal(seldp__manifest_encode(&m, &again, &again_bytes), SELDP_OK);
            if (again_bytes != bytes || memcmp(again, bad, bytes) != 0)
                fail_msg("byte %zu mutation %zu: decodes but does not re-encode the same", i, k);
            free(again);
            pair[0] = good;
            pair[1] = m;
            st = seldp__manifest_compare(pair, 2, 0, world_ranks);
            if (st != SELDP_OK && st != SELDP_ERR_SCHEMA)
                fail_msg("byte %zu mutation %zu: compare returned %s", i, k, seldp_status_name(st));
            seldp__manifest_free(&m);
        }
    }
    printf("  manifest of %zu bytes: %zu truncations rejected; %zu corruptions rejected, %zu "
           "still well-formed\n",
           bytes, bytes, rejected, decoded);
    free(bad);
    free(blob);
    seldp__manifest_free(&good);
    ct_free(&tm);
}

/* --- layout files -------------------------------------------------------------------------- */

static const char hot_expert[] =
    "{\"description\": \"expert 0 is hot\", \"world\": 4, \"shared_root\": 1,\n"
    " \"ep_groups\": [[0, 1], [2, 3]],\n"
    " \"experts\": [{\"owners\": [0, 1, 2, 3]}, {\"owners\": [0, 2], \"root\": 2},\n"
    "             {\"owners\": [1, 3]}, {\"owners\": [1, 3], \"root\": 3}]}\n";

/* Parse an exact-size copy; a layout that loads must round-trip through its JSON. */
static seldp_status parse_layout(const unsigned char *text, size_t len)
{
    hx_layout *l = NULL, *again = NULL;
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, text, len);
    seldp_status st = hx_layout_parse(copy, len, "sweep.json", 0, 0, HX_ROOTS_FIRST, &l);
    free(copy);
    if (st != SELDP_OK) {
        assert_null(l);
        return st;
    }
    hx_buf a = {0}, b = {0};
    hx_layout_json(l, &a);
    assert_int_equal(hx_layout_parse(hx_buf_str(&a), a.len, "again", 0, 0, HX_ROOTS_FIRST, &again),
                     SELDP_OK);
    hx_layout_json(again, &b);
    assert_string_equal(hx_buf_str(&a), hx_buf_str(&b));
    hx_buf_free(&a);
    hx_buf_free(&b);
    hx_layout_destroy(again);
    hx_layout_destroy(l);
    return SELDP_OK;
}

static void layout_sweep(void **state)
{
    (void)state;
    const unsigned char *good = (const unsigned char *)hot_expert;
    size_t n = strlen(hot_expert), loaded = 0, rejected = 0;
    unsigned char *bad = malloc(n);
    assert_non_null(bad);
    assert_int_equal(parse_layout(good, n), SELDP_OK);
    for (size_t len = 0; len + 1 < n; len++) { /* all but the final newline */
        seldp_status st = parse_layout(good, len);
        if (st != SELDP_ERR_PARSE && st != SELDP_ERR_INVALID_ARGUMENT)
            fail_msg("the layout cut to %zu bytes: %s", len, seldp_status_name(st));
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < N_MUTATIONS; k++) {
            if (!mutate(good, i, k, bad, n))
                continue;
            seldp_status st = parse_layout(bad, n);
            if (st == SELDP_OK)
                loaded++;
            else if (st == SELDP_ERR_PARSE || st == SELDP_ERR_INVALID_ARGUMENT)
                rejected++;
            else
                fail_msg("byte %zu mutation %zu: %s", i, k, seldp_status_name(st));
        }
    }
    printf("  layout of %zu bytes: corruptions rejected %zu, still valid %zu\n", n, rejected,
           loaded);
    free(bad);
}

/* --- safetensors files --------------------------------------------------------------------- */

static unsigned char *small_safetensors(size_t *len)
{
    char dir[] = "/tmp/seldp-robust-st-XXXXXX", path[64];
    hx_st_writer *w = NULL;
    float f[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[4] = {0x3c00, 0x4000, 0x7c00, 0x7e00};
    int32_t q[2] = {-1, 7};
    char *bytes = NULL;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/small.safetensors", dir);
    assert_int_equal(hx_st_writer_create(&w), SELDP_OK);
    assert_int_equal(hx_st_add(w, "param/embed.weight", SELDP_F32, 2, SHAPE(2, 3), f), SELDP_OK);
    assert_int_equal(hx_st_add(w, "grad/norm", SELDP_F16, 1, SHAPE(4), h), SELDP_OK);
    assert_int_equal(hx_st_add(w, "tokens", SELDP_I32, 1, SHAPE(2), q), SELDP_OK);
    assert_int_equal(hx_st_add(w, "empty", SELDP_BF16, 2, SHAPE(0, 3), NULL), SELDP_OK);
    assert_int_equal(hx_st_add_metadata(w, "config", "{\"vocab\": 8}"), SELDP_OK);
    assert_int_equal(hx_st_write(w, path), SELDP_OK);
    hx_st_writer_destroy(w);
    assert_int_equal(hx_read_file(path, &bytes, len), SELDP_OK);
    unlink(path);
    rmdir(dir);
    return (unsigned char *)bytes;
}

static void safetensors_sweep(void **state)
{
    (void)state;
    size_t n = 0, read_back = 0, rejected = 0;
    unsigned char *good = small_safetensors(&n);
    unsigned char *bad = malloc(n);
    hx_st_file *f = NULL;
    assert_non_null(bad);
    assert_int_equal(hx_st_parse(good, n, "good", &f), SELDP_OK);
    hx_st_file_free(f);
    for (size_t len = 0; len < n; len++) {
        f = NULL;
        if (hx_st_parse(good, len, "cut", &f) != SELDP_ERR_PARSE || f)
            fail_msg("the file cut to %zu of %zu bytes was not rejected cleanly", len, n);
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < N_MUTATIONS; k++) {
            if (!mutate(good, i, k, bad, n))
                continue;
            f = NULL;
            seldp_status st = hx_st_parse(bad, n, "bad", &f);
            if (st == SELDP_OK) {
                size_t total = 0;
                for (size_t t = 0; t < hx_st_count(f); t++)
                    total += hx_st_at(f, t)->nbytes;
                assert_true(total <= n);
                hx_st_file_free(f);
                read_back++;
            } else if (st == SELDP_ERR_PARSE && !f) {
                rejected++;
            } else {
                fail_msg("byte %zu mutation %zu: %s", i, k, seldp_status_name(st));
            }
        }
    }
    printf("  safetensors of %zu bytes: corruptions rejected %zu, still readable %zu\n", n,
           rejected, read_back);
    free(bad);
    free(good);
}

/* --- regressions ---------------------------------------------------------------------------- */

/* harness/core/json.c compared each member name with every earlier one: a safetensors header of
 * 80,000 tensors took 25 s to read, 10^6 (within the 100 MB header limit) hours. */
/* One object of n members "member.i": parsed, and its CPU seconds. */
static double parse_members(size_t n)
{
    hx_buf text = {0};
    hx_json *doc = NULL;
    hx_buf_puts(&text, "{");
    for (size_t i = 0; i < n; i++)
        hx_buf_printf(&text, "%s\"member.%zu\": %zu", i ? ", " : "", i, i);
    hx_buf_puts(&text, "}");
    assert_true(hx_buf_ok(&text));
    double t0 = cpu_s();
    assert_int_equal(hx_json_parse(hx_buf_str(&text), text.len, "many", &doc), SELDP_OK);
    double took = cpu_s() - t0;
    assert_int_equal(doc->count, n);
    char last[32];
    snprintf(last, sizeof last, "member.%zu", n - 1);
    assert_string_equal(doc->keys[n - 1], last);
    hx_json_free(doc);
    hx_buf_free(&text);
    return took;
}

static void json_object_of_many_members(void **state)
{
    (void)state;
    /* quadratic, 200,000 members took minutes */
    assert_linear_growth(parse_members, 25000, "object members");

    /* the last member repeats the first: still found, at the repeat's position */
    const size_t n = 1000;
    hx_buf text = {0};
    hx_json *doc = NULL;
    hx_buf_puts(&text, "{");
    for (size_t i = 0; i < n; i++)
        hx_buf_printf(&text, "%s\"member.%zu\": %zu", i ? ", " : "", i, i);
    hx_buf_puts(&text, ", \"member.0\": 1}");
    assert_true(hx_buf_ok(&text));
    assert_int_equal(hx_json_parse(hx_buf_str(&text), text.len, "many", &doc), SELDP_ERR_PARSE);
    assert_null(doc);
    assert_non_null(strstr(hx_last_error(), "duplicate member \"member.0\""));
    char at[32];
    snprintf(at, sizeof at, "many:1:%zu:", text.len - 13);
    assert_non_null(strstr(hx_last_error(), at));
    hx_buf_free(&text);
}

/* The same through the safetensors reader: a header naming n empty tensors, read, and its
 * CPU seconds. */
static double read_tensors(size_t n)
{
    hx_buf header = {0};
    hx_buf_puts(&header, "{");
    for (size_t i = 0; i < n; i++)
        hx_buf_printf(&header,
                      "%s\"t%zu\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                      i ? "," : "", i);
    hx_buf_puts(&header, "}");
    while (header.len % 8)
        hx_buf_puts(&header, " ");
    assert_true(hx_buf_ok(&header));
    unsigned char *file = malloc(8 + header.len);
    assert_non_null(file);
    for (int i = 0; i < 8; i++)
        file[i] = (unsigned char)((uint64_t)header.len >> (8 * i));
    memcpy(file + 8, header.data, header.len);
    hx_st_file *f = NULL;
    double t0 = cpu_s();
    assert_int_equal(hx_st_parse(file, 8 + header.len, "many", &f), SELDP_OK);
    double took = cpu_s() - t0;
    assert_int_equal(hx_st_count(f), n);
    char last[32];
    snprintf(last, sizeof last, "t%zu", n - 1);
    assert_non_null(hx_st_find(f, last));
    hx_st_file_free(f);
    free(file);
    hx_buf_free(&header);
    return took;
}

static void safetensors_of_many_tensors(void **state)
{
    (void)state;
    assert_linear_growth(read_tensors, 10000, "safetensors header");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(manifest_sweep),
        cmocka_unit_test(layout_sweep),
        cmocka_unit_test(safetensors_sweep),
        cmocka_unit_test(json_object_of_many_members),
        cmocka_unit_test(safetensors_of_many_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
