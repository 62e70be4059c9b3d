/* A strict reader of the TOML that training configs are written in (torchtitan's train
 * configs): tables ([a.b]), dotted keys (a.b = 1), bare and quoted keys, basic and literal
 * strings, integers (decimal with underscores, 0x, 0o, 0b), floats (inf and nan too),
 * booleans, arrays (over several lines, trailing comma allowed) and inline tables.
 *
 * Strict as TOML 1.0 is: a key defined twice, a table defined twice, a table reopened that a
 * dotted key or an inline table made, a value where a table is and the reverse are errors;
 * so are control characters, malformed UTF-8 and a line that goes on after its value. What
 * the subset leaves out is refused by name (multi-line strings, arrays of tables, dates and
 * times) rather than misread. Errors name the line and column (1-based).
 *
 * The result is the JSON tree of json.h: a table is an object (keys in file order), an
 * integer a number with is_integer set, a float a number without. */
#ifndef HX_TOML_H
#define HX_TOML_H

#include <stddef.h>

#include "json.h"

/* Parse `len` bytes of `text` (no terminating NUL needed). On success *out is the root table,
 * the caller's to free with hx_json_free. On failure SELDP_ERR_PARSE (SELDP_ERR_NOMEM when
 * out of memory) with "<what>:<line>:<column>: <why>" as the last error; *out is NULL. */
seldp_status hx_toml_parse(const char *text, size_t len, const char *what, hx_json **out);

#endif
