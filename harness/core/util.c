/* The harness's error message, text buffer, file and clock helpers (see util.h). */
#define _POSIX_C_SOURCE 200809L

#include "util.h"

#include "tinymoe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HX_ERROR_BYTES 1024

static _Thread_local char last_error[HX_ERROR_BYTES];

seldp_status hx_fail(seldp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

seldp_status hx_fail_lib(seldp_status status, const char *fmt, ...)
{
    char context[HX_ERROR_BYTES / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    const char *lib = seldp_last_error();
    if (!lib[0])
        lib = tm_last_error(); /* a tiny-moe call failed: it keeps its own channel */
    snprintf(last_error, sizeof last_error, "%s: %s%s%s", context, seldp_status_name(status),
             lib[0] ? ": " : "", lib);
    return status;
}

const char *hx_last_error(void)
{
    return last_error;
}

void *hx_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        hx_fail(SELDP_ERR_NOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

char *hx_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *copy = hx_calloc(n, 1);
    if (copy)
        memcpy(copy, s, n);
    return copy;
}

static bool buf_reserve(hx_buf *buf, size_t extra)
{
    if (buf->failed)
        return false;
    if (buf->len + extra + 1 <= buf->cap)
        return true;
    size_t cap = buf->cap ? buf->cap : 256;
    while (cap < buf->len + extra + 1)
        cap *= 2;
    char *data = realloc(buf->data, cap);
    if (!data) {
        buf->failed = true;
        return false;
    }
    buf->data = data;
    buf->cap = cap;
    return true;
}

void hx_buf_append(hx_buf *buf, const char *bytes, size_t n)
{
    if (!buf_reserve(buf, n))
        return;
    memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
    buf->data[buf->len] = '\0';
}

void hx_buf_puts(hx_buf *buf, const char *s)
{
    hx_buf_append(buf, s, strlen(s));
}

void hx_buf_vprintf(hx_buf *buf, const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0 || !buf_reserve(buf, (size_t)n))
        return;
    vsnprintf(buf->data + buf->len, (size_t)n + 1, fmt, ap);
    buf->len += (size_t)n;
}

void hx_buf_printf(hx_buf *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hx_buf_vprintf(buf, fmt, ap);
    va_end(ap);
}

void hx_buf_json_string(hx_buf *buf, const char *s)
{
    hx_buf_append(buf, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            hx_buf_puts(buf, "\\\"");
            break;
        case '\\':
            hx_buf_puts(buf, "\\\\");
            break;
        case '\n':
            hx_buf_puts(buf, "\\n");
            break;
        case '\r':
            hx_buf_puts(buf, "\\r");
            break;
        case '\t':
            hx_buf_puts(buf, "\\t");
            break;
        default:
            if (*p < 0x20)
                hx_buf_printf(buf, "\\u%04x", *p);
            else
                hx_buf_append(buf, (const char *)p, 1);
        }
    }
    hx_buf_append(buf, "\"", 1);
}

void hx_buf_json_number(hx_buf *buf, double value)
{
    if (!isfinite(value)) {
        hx_buf_puts(buf, "null");
        return;
    }
    char text[40];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(text, sizeof text, "%.*g", precision, value);
        if (strtod(text, NULL) == value)
            break;
    }
    hx_buf_puts(buf, text);
}

bool hx_buf_ok(hx_buf *buf)
{
    if (buf->failed)
        hx_fail(SELDP_ERR_NOMEM, "out of memory building a text of %zu bytes", buf->len);
    return !buf->failed;
}

const char *hx_buf_str(const hx_buf *buf)
{
    return buf->data ? buf->data : "";
}

void hx_buf_free(hx_buf *buf)
{
    free(buf->data);
    *buf = (hx_buf){0};
}

seldp_status hx_read_file(const char *path, char **data, size_t *len)
{
    seldp_status st = SELDP_OK;
    char *text = NULL;
    struct stat info;
    FILE *f = fopen(path, "rb");
    if (!f)
        HX_FAIL(SELDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    /* A directory opens and seeks like a file of an absurd size on Linux. */
    if (fstat(fileno(f), &info) != 0 || !S_ISREG(info.st_mode))
        HX_FAIL(SELDP_ERR_IO, "%s: expected a regular file", path);
    if (fseek(f, 0, SEEK_END) != 0)
        HX_FAIL(SELDP_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        HX_FAIL(SELDP_ERR_IO, "%s: cannot read its size", path);
    text = malloc((size_t)size + 1);
    if (!text)
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory reading %ld bytes", path, size);
    if (fread(text, 1, (size_t)size, f) != (size_t)size)
        HX_FAIL(SELDP_ERR_IO, "%s: short read", path);
    text[size] = '\0';
    fclose(f);
    *data = text;
    if (len)
        *len = (size_t)size;
    return SELDP_OK;
fail:
    free(text);
    if (f)
        fclose(f);
    return st;
}

seldp_status hx_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return hx_fail(SELDP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    bool ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok)
        return hx_fail(SELDP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return SELDP_OK;
}

seldp_status hx_mkdir_p(const char *path)
{
    char partial[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof partial)
        return hx_fail(SELDP_ERR_IO, "directory path '%s' is empty or too long", path);
    memcpy(partial, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (partial[i] != '/' && partial[i] != '\0')
            continue;
        char saved = partial[i];
        partial[i] = '\0';
        if (mkdir(partial, 0777) != 0 && errno != EEXIST)
            return hx_fail(SELDP_ERR_IO, "%s: cannot create directory: %s", partial,
                           strerror(errno));
        partial[i] = saved;
    }
    struct stat info;
    if (stat(path, &info) != 0 || !S_ISDIR(info.st_mode))
        return hx_fail(SELDP_ERR_IO, "%s: exists and is not a directory", path);
    return SELDP_OK;
}

double hx_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t hx_fnv1a(const void *data, size_t n, uint64_t basis)
{
    const unsigned char *p = data;
    uint64_t h = basis;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t hx_checksum(const void *data, size_t n)
{
    return hx_fnv1a(data, n, HX_FNV1A_BASIS);
}

/* xxHash64's round and its primes: the word multiplied in, rotated, multiplied again, so a
 * changed bit reaches every higher bit and, rotated, the lower ones at the next round */
static uint64_t hash_round(uint64_t acc, uint64_t w)
{
    acc += w * 0xc2b2ae3d27d4eb4full;
    acc = (acc << 31) | (acc >> 33);
    return acc * 0x9e3779b185ebca87ull;
}

uint64_t hx_bytes_hash(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t lane[4] = {0x60ea27eeadc0b5d6ull, 0xc2b2ae3d27d4eb4full, 0ull, 0x61c8864e7a143579ull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; j++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * (size_t)j, sizeof w);
            lane[j] = hash_round(lane[j], w);
        }
    }
    uint64_t h = hash_round(hx_checksum(p + i, n - i), (uint64_t)n);
    for (int j = 0; j < 4; j++)
        h = hash_round(h, lane[j]);
    h ^= h >> 33;
    h *= 0xc2b2ae3d27d4eb4full;
    return h ^ (h >> 29);
}

seldp_status hx_check_writable(const char *path, bool dir, const char *option)
{
    char probe[4200];
    struct stat sb;
    if (!dir) {
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            return hx_fail(SELDP_ERR_IO, "%s %s: is a directory, expected a file", option, path);
        FILE *f = fopen(path, "a"); /* appended to at the end anyway */
        if (!f)
            return hx_fail(SELDP_ERR_IO, "%s %s: cannot be written (%s)", option, path,
                           strerror(errno));
        fclose(f);
        return SELDP_OK;
    }
    if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return hx_fail(SELDP_ERR_IO, "%s %s: exists and is not a directory", option, path);
    if (hx_mkdir_p(path) != SELDP_OK)
        return hx_fail(SELDP_ERR_IO, "%s %s: cannot create it (%s)", option, path, strerror(errno));
    /* a file made and removed again: what the run will do there, tried before any step */
    snprintf(probe, sizeof probe, "%s/.seldp-write-test-%ld", path, (long)getpid());
    FILE *f = fopen(probe, "w");
    if (!f)
        return hx_fail(SELDP_ERR_IO, "%s %s: cannot write into it (%s)", option, path,
                       strerror(errno));
    fclose(f);
    remove(probe);
    return SELDP_OK;
}
