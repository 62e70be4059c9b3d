/* --resume refuses a checkpoint that is missing, truncated, corrupted or does not fit the run:
 * exit status 2, one line naming the file and the problem, and nothing written (neither the
 * report nor a new checkpoint). Corruption sweeps flip bytes all over index.json and the shards:
 * no flip is accepted. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <inttypes.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "checkpoint.h"
#include "checkpoint_index.h"
#include "cli.h"
#include "harness_test.h"
#include "options.h"

#define RUN_ARGS "--world 4 --ep 2 --dtype bf16 --quant nf4 --global-batch 64"

static bool full;           /* argument "full": the complete sweeps */
static char pristine[1024]; /* a checkpoint of step 2, never changed */
static char work[1024];     /* a copy each case may damage */
static char out_dir[1024];
static char save_dir[1024];

static void copy_dir(const char *from, const char *to)
{
    DIR *d = opendir(to);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        char path[2300];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", to, e->d_name);
        unlink(path);
    }
    closedir(d);
    d = opendir(from);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        char src[2300], dst[2300], *bytes = NULL;
        size_t len = 0;
        if (e->d_name[0] == '.')
            continue;
        snprintf(src, sizeof src, "%s/%s", from, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", to, e->d_name);
        assert_int_equal(hx_read_file(src, &bytes, &len), SELDP_OK);
        assert_int_equal(hx_write_file(dst, bytes, len), SELDP_OK);
        free(bytes);
    }
    closedir(d);
}

/* The name of the shard of `rank` in the working copy. */
static void shard_path(int rank, char *buf, size_t size)
{
    char suffix[64];
    snprintf(suffix, sizeof suffix, "-rank%05d.safetensors", rank);
    DIR *d = opendir(work);
    assert_non_null(d);
    buf[0] = '\0';
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name), m = strlen(suffix);
        if (n > m && strcmp(e->d_name + n - m, suffix) == 0)
            snprintf(buf, size, "%s/%s", work, e->d_name);
    }
    closedir(d);
    assert_true(buf[0] != '\0');
}

static int setup(void **state)
{
    (void)state;
    snprintf(pristine, sizeof pristine, "%s", hx_test_dir(full ? "full-pristine" : "pristine"));
    hx_test_run run;
    hx_test_harness(&run, RUN_ARGS " --steps 2 --quiet --out none --save %s", pristine);
    if (run.status != HX_EXIT_PASS)
        fail_msg("%s%s", run.err, run.out);
    snprintf(work, sizeof work, "%s", hx_test_dir(full ? "full-work" : "work"));
    snprintf(out_dir, sizeof out_dir, "%s/report", hx_test_dir(full ? "full-out" : "out"));
    snprintf(save_dir, sizeof save_dir, "%s/ckpt", hx_test_dir(full ? "full-save" : "save"));
    return 0;
}

static void flip(const char *path, long offset, unsigned char mask)
{
    char *bytes = NULL;
    size_t len = 0;
    assert_int_equal(hx_read_file(path, &bytes, &len), SELDP_OK);
    size_t at = offset < 0 ? len - (size_t)(-offset) : (size_t)offset;
    assert_true(at < len);
    bytes[at] = (char)(bytes[at] ^ mask);
    assert_int_equal(hx_write_file(path, bytes, len), SELDP_OK);
    free(bytes);
}

/* Resume from the working copy with extra options: refused with a line holding each of the
 * NULL-terminated substrings, nothing written. */
static void refused(const char *extra, ...)
{
    hx_test_run run;
    hx_test_harness(&run, RUN_ARGS " --steps 4 --quiet --out %s --save %s --resume %s %s", out_dir,
                    save_dir, work, extra);
    if (run.status != HX_EXIT_USAGE)
        fail_msg("exit %d, expected 2 (refused)\n%s%s", run.status, run.err, run.out);
    size_t len = strlen(run.err);
    assert_true(len > 0 && run.err[len - 1] == '\n');
    assert_true(strchr(run.err, '\n') == run.err + len - 1); /* one line */
    va_list ap;
    va_start(ap, extra);
    for (const char *want; (want = va_arg(ap, const char *)) != NULL;)
        if (!strstr(run.err, want))
            fail_msg("the refusal does not say \"%s\": %s", want, run.err);
    va_end(ap);
    struct stat sb;
    assert_int_not_equal(stat(out_dir, &sb), 0);
    assert_int_not_equal(stat(save_dir, &sb), 0);
}

static void test_missing(void **state)
{
    (void)state;
    char path[2300];
    copy_dir(pristine, work);
    snprintf(path, sizeof path, "%s/index.json", work);
    unlink(path);
    refused("", "index.json", "missing", NULL);
    copy_dir(pristine, work);
    shard_path(1, path, sizeof path);
    unlink(path);
    refused("", strrchr(path, '/') + 1, "missing", NULL);
    hx_test_run run;
    hx_test_harness(&run, RUN_ARGS " --steps 4 --out none --resume %s/nowhere", work);
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "nowhere/index.json: missing"));
}

static void test_truncated(void **state)
{
    (void)state;
    char path[2300];
    copy_dir(pristine, work);
    shard_path(0, path, sizeof path);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size / 2), 0);
    refused("", strrchr(path, '/') + 1, "truncated", NULL);
    copy_dir(pristine, work);
    snprintf(path, sizeof path, "%s/index.json", work);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 40), 0);
    refused("", "index.json", NULL);
}

static void test_corrupted(void **state)
{
    (void)state;
    char path[2300];
    copy_dir(pristine, work);
    shard_path(1, path, sizeof path);
    flip(path, -3, 0x10); /* the last tensor's data */
    refused("", strrchr(path, '/') + 1, "corrupted", "does not match its checksum", NULL);
    copy_dir(pristine, work);
    shard_path(0, path, sizeof path);
    flip(path, 40, 0x01); /* inside the header */
    refused("", strrchr(path, '/') + 1, "corrupted", "header", NULL);
    copy_dir(pristine, work);
    snprintf(path, sizeof path, "%s/index.json", work);
    flip(path, 100, 0x01);
    refused("", "index.json", "corrupted", NULL);
}

/* A valid index (its checksum recomputed) that describes another model. */
static void test_index_of_another_model(void **state)
{
    (void)state;
    char path[2300], *text = NULL;
    size_t len = 0;
    copy_dir(pristine, work);
    snprintf(path, sizeof path, "%s/index.json", work);
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    char *experts = strstr(text, "\"experts\":8");
    assert_non_null(experts);
    experts[10] = '9';
    char *line = strstr(text, "  \"index_checksum\"");
    assert_non_null(line);
    char tail[64];
    snprintf(tail, sizeof tail, "  \"index_checksum\": \"%016" PRIx64 "\"\n}\n",
             hx_checksum(text, (size_t)(line - text)));
    hx_buf b = {0};
    hx_buf_append(&b, text, (size_t)(line - text));
    hx_buf_puts(&b, tail);
    assert_int_equal(hx_write_file(path, b.data, b.len), SELDP_OK);
    hx_buf_free(&b);
    free(text);
    refused("", "index.json", "experts 9", NULL);
}

static void test_does_not_fit_the_run(void **state)
{
    (void)state;
    copy_dir(pristine, work);
    refused("--dtype f32", "index.json", "dtype change", "bf16", NULL);
    refused("--d-model 64", "index.json", "d_model", NULL);
    refused("--quant awq", "index.json", "quant nf4", NULL);
    refused("--fp32-master", "index.json", "--fp32-master", NULL);
    refused("--seed 7", "index.json", "seed", NULL);
    refused("--steps 2", "step 2", "nothing to train", NULL);
    hx_test_run run;
    hx_test_harness(&run,
                    "--world 4 --ep 2 --dtype bf16 --quant nf4 --steps 4 --out none "
                    "--resume %s",
                    work);
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "token stream is global"));
    hx_test_harness(&run, "--save-every 2 --out none");
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "--save-every 2: needs --save"));
    hx_test_harness(&run, "--global-batch 10 --tokens 5 --out none");
    assert_int_equal(run.status, HX_EXIT_USAGE);
    assert_non_null(strstr(run.err, "exclude each other"));
}

/* Flip one bit at bytes of `file`: every `dense_stride`-th of [0, dense) (dense 0: the
 * safetensors length and header), then every `stride`-th: every
 * damaged copy is refused by the checks --resume runs first. Returns the flips made. */
static int sweep(const char *file, size_t dense, size_t dense_stride, size_t stride,
                 const hx_options *opts)
{
    char path[2300], *bytes = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", work, file);
    copy_dir(pristine, work);
    assert_int_equal(hx_read_file(path, &bytes, &len), SELDP_OK);
    if (dense == 0) {
        assert_true(len >= 8);
        for (int i = 7; i >= 0; i--)
            dense = dense << 8 | (unsigned char)bytes[i];
        dense += 8;
    }
    int flips = 0;
    for (size_t at = 0; at < len; at += at < dense ? dense_stride : stride) {
        unsigned char mask = (unsigned char)(1u << (at % 8));
        bytes[at] = (char)(bytes[at] ^ mask);
        assert_int_equal(hx_write_file(path, bytes, len), SELDP_OK);
        hx_ckpt *c = NULL;
        seldp_status st = hx_ckpt_open(work, &c);
        if (st == SELDP_OK)
            st = hx_ckpt_verify(c, opts);
        hx_ckpt_close(c);
        if (st == SELDP_OK)
            fail_msg("%s: a flip of bit %u at byte %zu was accepted", file, at % 8, at);
        bytes[at] = (char)(bytes[at] ^ mask);
        flips++;
    }
    assert_int_equal(hx_write_file(path, bytes, len), SELDP_OK);
    free(bytes);
    return flips;
}

static void test_corruption_sweeps(void **state)
{
    (void)state;
    char line[] = "seldp-harness " RUN_ARGS " --steps 4";
    char *argv[32];
    int argc = 0;
    for (char *tok = strtok(line, " "); tok; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    hx_options opts;
    hx_options_default(&opts);
    assert_int_equal(hx_options_parse(argc, argv, &opts, stdout, stderr), HX_PARSE_RUN);
    /* the pristine copy passes */
    copy_dir(pristine, work);
    hx_ckpt *c = NULL;
    assert_int_equal(hx_ckpt_open(work, &c), SELDP_OK);
    assert_int_equal(hx_ckpt_verify(c, &opts), SELDP_OK);
    hx_ckpt_close(c);
    /* the full sweep (every byte of the index and the headers, every 61st of the data) runs
     * under the slow label; the default one samples */
    size_t step = full ? 1 : 7;
    int flips = sweep("index.json", (size_t)-1, step, 1, &opts);
    char path[2300];
    for (int r = 0; r < 2; r++) {
        shard_path(r, path, sizeof path);
        /* every byte of the length and the header, then every 61st byte of the data */
        flips += sweep(strrchr(path, '/') + 1, 0, step, full ? 61 : 401, &opts);
    }
    print_message("%d single-bit flips over index.json and the shards, all refused\n", flips);
    assert_true(flips > (full ? 40000 : 4000));
}

/* The index parser reads only the `len` bytes it is given (a fuzzing find: it once searched
 * for its checksum key past the end of a text without a NUL; ASan sees such reads). */
static void test_index_without_nul(void **state)
{
    (void)state;
    char path[2300], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/index.json", pristine);
    assert_int_equal(hx_read_file(path, &text, &len), SELDP_OK);
    for (size_t cut = 0; cut <= len; cut += cut < 64 || len - cut < 64 ? 1 : 97) {
        char *exact = malloc(cut ? cut : 1); /* no NUL after the text */
        assert_non_null(exact);
        memcpy(exact, text, cut);
        hx_ckpt *c = NULL;
        seldp_status st = hx_ckpt_parse(exact, cut, "index.json", pristine, &c);
        /* only the whole text (or all but its final newline) is a complete index */
        assert_int_equal(st == SELDP_OK, cut >= len - 1);
        assert_true(st == SELDP_OK ? c != NULL : c == NULL);
        hx_ckpt_close(c);
        free(exact);
    }
    free(text);
}

int main(int argc, char **argv)
{
    full = argc > 1 && strcmp(argv[1], "full") == 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_corrupted),
        cmocka_unit_test(test_index_of_another_model),
        cmocka_unit_test(test_does_not_fit_the_run),
        cmocka_unit_test(test_index_without_nul),
        cmocka_unit_test(test_corruption_sweeps),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
