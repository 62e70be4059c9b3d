/* hx_bytes_hash (harness/core/util.h), the in-memory hash of the replica and untouched-gradient
 * checks: equal bytes hash equal wherever they lie; one flipped bit anywhere, a different
 * length, words exchanged between lanes or two sign bits of one lane change it; and
 * hx_checksum, the checkpoint files' FNV-1a 64, gives the algorithm's published values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util.h"

#define MAX_BYTES 200

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (unsigned char)(seed >> 56);
    }
}

static void equal_bytes_hash_equal_at_any_address(void **state)
{
    (void)state;
    unsigned char a[MAX_BYTES + 8], b[MAX_BYTES + 16];
    for (size_t n = 0; n <= MAX_BYTES; n++) {
        fill(a, n, n);
        for (size_t off = 0; off < 8; off++) {
            memcpy(b + off, a, n);
            assert_true(hx_bytes_hash(a, n) == hx_bytes_hash(b + off, n));
        }
    }
}

static void every_flipped_bit_changes_it(void **state)
{
    (void)state;
    unsigned char a[MAX_BYTES];
    for (size_t n = 1; n <= MAX_BYTES; n += 13) {
        fill(a, n, 3 * n);
        uint64_t h = hx_bytes_hash(a, n);
        for (size_t i = 0; i < n; i++)
            for (int bit = 0; bit < 8; bit++) {
                a[i] ^= (unsigned char)(1u << bit);
                if (hx_bytes_hash(a, n) == h)
                    fail_msg("%zu bytes: flipping bit %d of byte %zu leaves the hash", n, bit, i);
                a[i] ^= (unsigned char)(1u << bit);
            }
        assert_true(hx_bytes_hash(a, n) == h);
    }
}

static void length_and_lanes_count(void **state)
{
    (void)state;
    unsigned char zeros[MAX_BYTES] = {0};
    for (size_t n = 1; n < MAX_BYTES; n++)
        assert_true(hx_bytes_hash(zeros, n) != hx_bytes_hash(zeros, n - 1));
    /* two 8-byte words swapped between lanes, and two 32-byte blocks swapped */
    unsigned char a[64], b[64];
    fill(a, sizeof a, 9);
    memcpy(b, a, sizeof a);
    memcpy(b, a + 8, 8);
    memcpy(b + 8, a, 8);
    assert_true(hx_bytes_hash(a, sizeof a) != hx_bytes_hash(b, sizeof b));
    memcpy(b, a + 32, 32);
    memcpy(b + 32, a, 32);
    assert_true(hx_bytes_hash(a, sizeof a) != hx_bytes_hash(b, sizeof b));
    /* two floats negated that one lane reads in consecutive rounds (a multiply alone carries a
     * top bit's change to nothing, so two of them would cancel) */
    float f[16];
    for (int i = 0; i < 16; i++)
        f[i] = 1.0f + (float)i;
    uint64_t h = hx_bytes_hash(f, sizeof f);
    f[1] = -f[1];
    f[9] = -f[9];
    assert_true(hx_bytes_hash(f, sizeof f) != h);
}

static void checkpoint_checksum_is_fnv1a(void **state)
{
    (void)state;
    /* FNV-1a 64's published values (docs/formats.md: "checksum": "fnv1a64") */
    assert_true(hx_checksum("", 0) == 0xcbf29ce484222325ull);
    assert_true(hx_checksum("a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(hx_checksum("foobar", 6) == 0x85944171f73967e8ull);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(equal_bytes_hash_equal_at_any_address),
        cmocka_unit_test(every_flipped_bit_changes_it),
        cmocka_unit_test(length_and_lanes_count),
        cmocka_unit_test(checkpoint_checksum_is_fnv1a),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
