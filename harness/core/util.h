/* Small helpers every harness file uses: the harness's error message, a growable
 * text buffer, and checked allocation.
 *
 * Harness names carry the `hx_` prefix (the harness is a program built on the
 * public API, not part of the library). Fallible harness functions return a
 * seldp_status and leave a one-line message in hx_last_error() of the calling
 * thread; a message from the library (seldp_last_error) is carried over by hx_fail_lib. */
#ifndef HX_UTIL_H
#define HX_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/status.h"

#if defined(__GNUC__)
#define HX_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define HX_PRINTF(fmt_index, first_arg)
#endif

/* Record a printf-style message as the calling thread's last harness error; returns status. */
HX_PRINTF(2, 3) seldp_status hx_fail(seldp_status status, const char *fmt, ...);

/* Record "<context>: <library message>" for a failed library call; returns status. */
HX_PRINTF(2, 3) seldp_status hx_fail_lib(seldp_status status, const char *fmt, ...);

/* The calling thread's last harness error ("" if none). Valid until the next hx_fail. */
const char *hx_last_error(void);

/* Evaluate a seldp_status call; on failure store it in `st` and jump to `fail`. */
#define HX_CHECK(call)                                                                             \
    do {                                                                                           \
        seldp_status hx_check_status_ = (call);                                                    \
        if (hx_check_status_ != SELDP_OK) {                                                        \
            st = hx_check_status_;                                                                 \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* As HX_CHECK for a library call: the library's message is kept, prefixed by the context. */
#define HX_CHECK_LIB(call, ...)                                                                    \
    do {                                                                                           \
        seldp_status hx_check_status_ = (call);                                                    \
        if (hx_check_status_ != SELDP_OK) {                                                        \
            st = hx_fail_lib(hx_check_status_, __VA_ARGS__);                                       \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Jump to `fail` with st = hx_fail(...). */
#define HX_FAIL(...)                                                                               \
    do {                                                                                           \
        st = hx_fail(__VA_ARGS__);                                                                 \
        goto fail;                                                                                 \
    } while (0)

/* Jump to `fail` with st = hx_fail_lib(...): a failed library call's status and message. */
#define HX_FAIL_LIB(status, ...)                                                                   \
    do {                                                                                           \
        st = hx_fail_lib((status), __VA_ARGS__);                                                   \
        goto fail;                                                                                 \
    } while (0)

/* calloc that records SELDP_ERR_NOMEM as the last error when it fails (returns NULL). */
void *hx_calloc(size_t count, size_t size);

/* strdup that records SELDP_ERR_NOMEM when it fails. */
char *hx_strdup(const char *s);

/* A growable NUL-terminated text buffer. Zero-initialize, append, free with hx_buf_free.
 * An allocation failure is sticky: later appends do nothing and hx_buf_ok returns false. */
typedef struct hx_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed;
} hx_buf;

HX_PRINTF(2, 3) void hx_buf_printf(hx_buf *buf, const char *fmt, ...);
void hx_buf_vprintf(hx_buf *buf, const char *fmt, va_list ap);
void hx_buf_append(hx_buf *buf, const char *bytes, size_t n);
void hx_buf_puts(hx_buf *buf, const char *s);

/* Append `s` as a JSON string literal (quoted, escaped). */
void hx_buf_json_string(hx_buf *buf, const char *s);

/* Append a double as JSON: shortest round-trip form; non-finite values as null. */
void hx_buf_json_number(hx_buf *buf, double value);

/* True unless an allocation failed; records SELDP_ERR_NOMEM as the last error if it did. */
bool hx_buf_ok(hx_buf *buf);

/* The text (never NULL: "" for an empty buffer). */
const char *hx_buf_str(const hx_buf *buf);

void hx_buf_free(hx_buf *buf);

/* Read a whole file into a malloc'd NUL-terminated block; *len (may be NULL) gets its size.
 * SELDP_ERR_IO naming the path when it cannot be read. */
seldp_status hx_read_file(const char *path, char **data, size_t *len);

/* Write `n` bytes to `path` (created or truncated). SELDP_ERR_IO naming the path on failure. */
seldp_status hx_write_file(const char *path, const void *data, size_t n);

/* Create a directory and its parents (like mkdir -p). SELDP_ERR_IO on failure. */
seldp_status hx_mkdir_p(const char *path);

/* Whether the run can write `path`, a folder when dir (made if missing, a file created in it
 * and removed again) or a file appended to (created empty if missing): SELDP_ERR_IO with one
 * line naming `option`, the path and why otherwise. */
seldp_status hx_check_writable(const char *path, bool dir, const char *option);

/* Monotonic clock in seconds. */
double hx_now(void);

/* 64-bit FNV-1a (docs/formats.md, Checkpoints): from `basis`, each byte xor-ed in, then
 * multiplied by 0x100000001b3. HX_FNV1A_BASIS is the algorithm's offset basis; checkpoints
 * of format version 1 were written from HX_FNV1A_BASIS_V1 (FNV's basis in decimal short of
 * its last digit), which reading them still takes. */
#define HX_FNV1A_BASIS    0xcbf29ce484222325ull
#define HX_FNV1A_BASIS_V1 0x14650fb0739d0383ull
uint64_t hx_fnv1a(const void *data, size_t n, uint64_t basis);

/* hx_fnv1a from HX_FNV1A_BASIS: the checksums the checkpoint files carry. */
uint64_t hx_checksum(const void *data, size_t n);

/* A 64-bit hash of `n` bytes for telling in memory whether a tensor's bytes changed (the
 * replica and untouched-gradient checks): xxHash64's round on 8-byte words in four interleaved
 * lanes (each round a bijection of its lane for a given word, and of the word for a given
 * lane, so any one changed word changes the hash), several times hx_checksum's speed. Not a
 * file format: its values are never written. */
uint64_t hx_bytes_hash(const void *data, size_t n);

#endif
