/* seldp-bench's streaming copy (harness/bench/copy.c), the copy that measures the bound B:
 * every byte arrives, at every alignment of source and destination and every length around
 * its 64-byte body and 256-byte memcpy cut, and nothing outside the destination is written.
 * Run with the CPU's widest copy and with SELDP_BENCH_COPY=sse2 and avx2 (ctest), and the
 * kind in use is the one asked for. The copy is the host transport's (seldp__stream_copy):
 * the lengths also cross its four-page body (16 KiB) and the lines left after it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bench.h"

#define GUARD 64

static unsigned char byte_at(size_t i)
{
    return (unsigned char)(i * 131u + (i >> 8) * 7u + 1u);
}

/* Copy `len` bytes from src offset `so` to dst offset `dof` and check every byte of the
 * destination buffer: the copy inside, the 0xA5 fill outside. */
static void check_copy(size_t len, size_t so, size_t dof)
{
    size_t cap = len + 2 * GUARD + 128;
    unsigned char *src = aligned_alloc(64, (cap + 63) / 64 * 64);
    unsigned char *dst = aligned_alloc(64, (cap + 63) / 64 * 64);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < cap; i++)
        src[i] = byte_at(i);
    memset(dst, 0xA5, cap);
    bench_stream_copy(dst + GUARD + dof, src + so, len);
    for (size_t i = 0; i < cap; i++) {
        bool inside = i >= GUARD + dof && i < GUARD + dof + len;
        unsigned char want = inside ? byte_at(i - GUARD - dof + so) : 0xA5;
        if (dst[i] != want)
            fail_msg("len %zu, src offset %zu, dst offset %zu: byte %zu is 0x%02x, expected "
                     "0x%02x (%s)",
                     len, so, dof, i, dst[i], want, inside ? "copied" : "outside the copy");
    }
    free(src);
    free(dst);
}

static void copies_every_length_and_alignment(void **state)
{
    (void)state;
    static const size_t lens[] = {0,
                                  1,
                                  15,
                                  63,
                                  64,
                                  65,
                                  127,
                                  128,
                                  255,
                                  256,
                                  257,
                                  319,
                                  320,
                                  383,
                                  1000,
                                  4095,
                                  4096,
                                  4097,
                                  16383,
                                  16384,
                                  16384 + 64 + 3,
                                  3 * 16384 - 65,
                                  65536 + 17};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (size_t so = 0; so < 64; so += 7)
            for (size_t dof = 0; dof < 64; dof += 5)
                check_copy(lens[l], so, dof);
}

static void large_copy(void **state)
{
    (void)state;
    check_copy((size_t)8 << 20, 3, 29);
    check_copy(((size_t)8 << 20) + 64, 0, 0);
}

static void kind_is_the_one_asked_for(void **state)
{
    (void)state;
    const char *ask = getenv("SELDP_BENCH_COPY");
    bench_copy_kind kind = bench_stream_kind();
#if defined(__x86_64__)
    if (ask && strcmp(ask, "sse2") == 0)
        assert_int_equal(kind, BENCH_COPY_SSE2);
    else if (ask && strcmp(ask, "avx2") == 0)
        assert_true(kind == BENCH_COPY_AVX2 || kind == BENCH_COPY_NONE);
    else
        assert_true(kind == BENCH_COPY_SSE2 || kind == BENCH_COPY_AVX2 ||
                    kind == BENCH_COPY_AVX512);
    if (kind == BENCH_COPY_NONE)
        skip(); /* AVX2 asked for on a CPU without it */
    const char *name = kind == BENCH_COPY_AVX512 ? "AVX-512"
                       : kind == BENCH_COPY_AVX2 ? "AVX2"
                                                 : "SSE2";
    assert_non_null(strstr(bench_stream_name(), name));
#else
    (void)ask;
    assert_int_equal(kind, BENCH_COPY_NONE);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kind_is_the_one_asked_for),
        cmocka_unit_test(copies_every_length_and_alignment),
        cmocka_unit_test(large_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
