/* The checkpoint format's versions (docs/formats.md, Checkpoints): version 2's checksums are
 * FNV-1a 64 as any implementation computes it (checked here by one of the test's own);
 * version 1's, from the basis its writer used, are still read, and resuming a version-1 copy
 * of a checkpoint trains to the same bits as resuming the checkpoint; an index whose version
 * and checksum disagree is refused in one line. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "checkpoint_index.h"
#include "exit.h"
#include "harness_test.h"

#define RUN_ARGS "--world 4 --ep 2 --global-batch 64 --quiet"

static char saved[1024]; /* a version-2 checkpoint of step 2 */

/* FNV-1a 64 from its published offset basis and prime, written here independently. */
static uint64_t fnv1a64(const void *data, size_t n, uint64_t basis)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++)
        basis = (basis ^ p[i]) * 1099511628211ull;
    return basis;
}

static const uint64_t published_basis = 14695981039346656037ull;

static char *read_text(const char *dir, const char *file, size_t *len)
{
    char path[2300], *text = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_int_equal(hx_read_file(path, &text, len), SELDP_OK);
    return text;
}

static void copy_dir(const char *from, const char *to)
{
    DIR *d = opendir(from);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        size_t len = 0;
        char *bytes = read_text(from, e->d_name, &len), dst[2300];
        snprintf(dst, sizeof dst, "%s/%s", to, e->d_name);
        assert_int_equal(hx_write_file(dst, bytes, len), SELDP_OK);
        free(bytes);
    }
    closedir(d);
}

/* Replace the 16 hex digits of `old` in text (exactly once) with those of `new`. */
static void replace_sum(char *text, uint64_t old, uint64_t new)
{
    char from[17], to[17];
    snprintf(from, sizeof from, "%016" PRIx64, old);
    snprintf(to, sizeof to, "%016" PRIx64, new);
    char *at = strstr(text, from);
    assert_non_null(at);
    assert_null(strstr(at + 1, from));
    memcpy(at, to, 16);
}

/* index.json's text up to its last line, with an index_checksum from `basis`, into dir. */
static void write_index(const char *dir, char *text, uint64_t basis)
{
    char *line = strstr(text, "  \"index_checksum\"");
    assert_non_null(line);
    char tail[64], path[2300];
    snprintf(tail, sizeof tail, "  \"index_checksum\": \"%016" PRIx64 "\"\n}\n",
             fnv1a64(text, (size_t)(line - text), basis));
    hx_buf b = {0};
    hx_buf_append(&b, text, (size_t)(line - text));
    hx_buf_puts(&b, tail);
    snprintf(path, sizeof path, "%s/index.json", dir);
    assert_int_equal(hx_write_file(path, b.data, b.len), SELDP_OK);
    hx_buf_free(&b);
}

/* A copy of `saved` in `dir` as version 1 wrote it: every checksum from version 1's basis. */
static void make_version_1(const char *dir, uint64_t index_basis)
{
    copy_dir(saved, dir);
    hx_ckpt *c = NULL;
    assert_int_equal(hx_ckpt_open(saved, &c), SELDP_OK);
    size_t len = 0;
    char *text = read_text(saved, "index.json", &len);
    for (size_t i = 0; i < c->n_files; i++) {
        size_t n = 0;
        char *bytes = read_text(saved, c->files[i].name, &n);
        uint64_t header = 0;
        for (int b = 7; b >= 0; b--)
            header = header << 8 | (unsigned char)bytes[b];
        replace_sum(text, c->files[i].header_checksum,
                    fnv1a64(bytes, (size_t)header + 8, HX_FNV1A_BASIS_V1));
        for (size_t t = 0; t < c->n_tensors; t++)
            if (c->tensors[t].file == (int)i)
                replace_sum(text, c->tensors[t].checksum,
                            fnv1a64(bytes + c->tensors[t].offset, (size_t)c->tensors[t].nbytes,
                                    HX_FNV1A_BASIS_V1));
        free(bytes);
    }
    char *version = strstr(text, "\"version\": 2,");
    assert_non_null(version);
    version[11] = '1';
    write_index(dir, text, index_basis);
    free(text);
    hx_ckpt_close(c);
}

static int setup(void **state)
{
    (void)state;
    snprintf(saved, sizeof saved, "%s", hx_test_dir("saved"));
    hx_test_run run;
    hx_test_harness(&run, RUN_ARGS " --steps 2 --out none --save %s", saved);
    if (run.status != HX_EXIT_PASS)
        fail_msg("%s%s", run.err, run.out);
    return 0;
}

/* Version 2: FNV-1a 64 exactly, the index's own checksum and every file's and tensor's. */
static void version_2_is_fnv1a64(void **state)
{
    (void)state;
    assert_true(HX_FNV1A_BASIS == published_basis);
    size_t len = 0;
    char *text = read_text(saved, "index.json", &len);
    assert_non_null(strstr(text, "\"version\": 2,"));
    char *line = strstr(text, "  \"index_checksum\"");
    assert_non_null(line);
    char want[17];
    snprintf(want, sizeof want, "%016" PRIx64,
             fnv1a64(text, (size_t)(line - text), published_basis));
    assert_non_null(strstr(line, want));
    hx_ckpt *c = NULL;
    assert_int_equal(hx_ckpt_open(saved, &c), SELDP_OK);
    assert_int_equal(c->version, 2);
    for (size_t i = 0; i < c->n_files; i++) {
        size_t n = 0;
        char *bytes = read_text(saved, c->files[i].name, &n);
        for (size_t t = 0; t < c->n_tensors; t++)
            if (c->tensors[t].file == (int)i)
                assert_true(fnv1a64(bytes + c->tensors[t].offset, (size_t)c->tensors[t].nbytes,
                                    published_basis) == c->tensors[t].checksum);
        free(bytes);
    }
    hx_ckpt_close(c);
    free(text);
}

/* A version-1 copy resumes, to the same dump as the checkpoint itself. */
static void version_1_resumes_the_same(void **state)
{
    (void)state;
    char v1[1024], dump1[1024], dump2[1024];
    snprintf(v1, sizeof v1, "%s", hx_test_dir("v1"));
    make_version_1(v1, HX_FNV1A_BASIS_V1);
    hx_ckpt *c = NULL;
    assert_int_equal(hx_ckpt_open(v1, &c), SELDP_OK);
    assert_int_equal(c->version, 1);
    hx_ckpt_close(c);
    snprintf(dump1, sizeof dump1, "%s", hx_test_dir("dump-v1"));
    snprintf(dump2, sizeof dump2, "%s", hx_test_dir("dump-v2"));
    hx_test_run run;
    hx_test_harness(&run, RUN_ARGS " --steps 4 --out none --resume %s --dump %s", v1, dump1);
    if (run.status != HX_EXIT_PASS)
        fail_msg("resuming version 1: exit %d\n%s%s", run.status, run.err, run.out);
    hx_test_harness(&run, RUN_ARGS " --steps 4 --out none --resume %s --dump %s", saved, dump2);
    assert_int_equal(run.status, HX_EXIT_PASS);
    DIR *d = opendir(dump2);
    assert_non_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        size_t n1 = 0, n2 = 0;
        char *a = read_text(dump1, e->d_name, &n1), *b = read_text(dump2, e->d_name, &n2);
        if (n1 != n2 || memcmp(a, b, n1) != 0)
            fail_msg("dump %s differs between the version-1 and version-2 resumes", e->d_name);
        free(a);
        free(b);
        files++;
    }
    closedir(d);
    assert_true(files > 0);
}

/* The version and the index's checksum must agree. */
static void version_and_checksum_disagree(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", hx_test_dir("mixed"));
    make_version_1(dir, HX_FNV1A_BASIS); /* version 1 with version 2's index checksum */
    hx_test_usage_error("version 1, but its index_checksum is the checksum of version 2",
                        RUN_ARGS " --steps 4 --out none --resume %s", dir);
    size_t len = 0;
    copy_dir(saved, dir);
    char *text = read_text(saved, "index.json", &len);
    write_index(dir, text, HX_FNV1A_BASIS_V1); /* version 2 with version 1's */
    free(text);
    hx_test_usage_error("version 2, but its index_checksum is the checksum of version 1",
                        RUN_ARGS " --steps 4 --out none --resume %s", dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_2_is_fnv1a64),
        cmocka_unit_test(version_1_resumes_the_same),
        cmocka_unit_test(version_and_checksum_disagree),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
