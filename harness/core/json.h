/* A small strict JSON (RFC 8259) parser for layout files, safetensors headers and reports.
 *
 * Strict: no comments, no trailing commas, no duplicate object keys, no leading zeros,
 * only the four whitespace characters of the RFC, one value per text. Errors name the
 * line and column (1-based) of the offending character. Strings are decoded to UTF-8
 * (\u escapes and surrogate pairs included); a string holding U+0000 is rejected, so
 * every decoded string is an ordinary C string. Objects keep their keys in file order. */
#ifndef HX_JSON_H
#define HX_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seldp/status.h"

typedef enum hx_json_type {
    HX_JSON_NULL,
    HX_JSON_BOOL,
    HX_JSON_NUMBER,
    HX_JSON_STRING,
    HX_JSON_ARRAY,
    HX_JSON_OBJECT
} hx_json_type;

typedef struct hx_json hx_json;

/* One value. Arrays and objects hold `count` children in `items`; objects also hold
 * their keys in `keys` (same index). `line`/`column` locate the value in the text. */
struct hx_json {
    hx_json_type type;
    bool boolean;
    double number;
    bool is_integer; /* the literal had no fraction or exponent */
    int64_t integer; /* its value when is_integer and it fits in 64 bits */
    char *string;
    size_t count;
    hx_json *items;
    char **keys;
    int line;
    int column;
};

/* Parse `len` bytes of `text`. On success *out is a tree the caller frees with
 * hx_json_free. On failure returns SELDP_ERR_PARSE with "<what>:<line>:<column>: <why>"
 * as the last error, `what` naming the source (a file name, "layout file"...). */
seldp_status hx_json_parse(const char *text, size_t len, const char *what, hx_json **out);

/* Free a tree from hx_json_parse. NULL is a no-op. */
void hx_json_free(hx_json *value);

/* The member `key` of an object, or NULL (also for a non-object). */
const hx_json *hx_json_get(const hx_json *object, const char *key);

/* The length of the well-formed UTF-8 sequence at s (at most `avail` bytes, avail >= 1), or 0
 * when it is malformed (overlong, a surrogate, above U+10FFFF, cut short). */
size_t hx_utf8_length(const unsigned char *s, size_t avail);

/* Append code point `cp` (at most U+10FFFF, not a surrogate) to b as UTF-8. */
struct hx_buf;
void hx_buf_put_utf8(struct hx_buf *b, unsigned cp);

/* `s` for a one-line message: control characters written as \n, \t, \r or \xNN, the rest as
 * it is; cut to fit `size` (at least 1). Returns buf. */
const char *hx_printable(const char *s, char *buf, size_t size);

/* Name of a type: "null", "boolean", "number", "string", "array", "object". */
const char *hx_json_type_name(hx_json_type type);

#endif
