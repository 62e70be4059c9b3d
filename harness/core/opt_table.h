/* Declarative option tables: one row per option says its name, the kind of its value and its
 * range, the field it is stored in, its default, its help line and --help section, and the
 * expectation its errors state. One getopt_long loop (hx_opt_parse) parses any table, the
 * defaults and the --help text come from the same rows. seldp-harness (options_table.c) and
 * seldp-bench (bench/help.c) each have a table of these rows; this file knows neither. */
#ifndef HX_OPT_TABLE_H
#define HX_OPT_TABLE_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What an option's value is; the kind decides parsing, storage, default and help text. */
typedef enum hx_opt_kind {
    HX_OPT_FLAG,   /* no value: stores the opposite of its default (bool) */
    HX_OPT_INT,    /* an integer in [min, max] (int, or size_t when the field is 8 bytes) */
    HX_OPT_DOUBLE, /* a finite number in [dmin, dmax], either end open (double) */
    HX_OPT_ENUM,   /* one of `names` (case-insensitive), stored as its value (int) */
    HX_OPT_STRING, /* any text, borrowed from argv (const char *); NULL default: "none" */
    HX_OPT_PATH,   /* a non-empty file or directory name (const char *) */
    HX_OPT_SEED,   /* an unsigned 64-bit integer, decimal or 0x hex (uint64_t) */
    HX_OPT_SIZE,   /* bytes with an optional K, M or G (powers of 1024) and B (size_t) */
    HX_OPT_CUSTOM, /* `parse` decides; `store` says how the default is stored */
    HX_OPT_ACTION  /* --help, --version: the parser returns HX_OPT_DONE with the row */
} hx_opt_kind;

/* One name of an enum option and the value it stores. */
typedef struct hx_opt_name {
    const char *name;
    int value;
} hx_opt_name;

struct hx_opt_row;

/* A custom option's parser: arg into the struct at `base`. False: the value is bad (the error
 * states the row's expectation). */
typedef bool (*hx_opt_parse_fn)(const struct hx_opt_row *row, const char *arg, void *base);
/* Text of the value at `base` (an option argument that parses back to it), or of the default
 * for --help; "" when there is none. */
typedef void (*hx_opt_text_fn)(const struct hx_opt_row *row, const void *base, char *buf,
                               size_t size);

/* A bool field marked when the option is given: HX_OPT_MARK(type, field); 0: none. */
#define HX_OPT_MARK(type, field) (offsetof(type, field) + 1)

/* Whether a sweep file may name the option (sweep_entries.c). */
enum {
    HX_SWEEP_NO = 0,    /* not a sweep key: "unknown key" */
    HX_SWEEP_KEY = 1,   /* a key of a run */
    HX_SWEEP_SHARED = 2 /* the same in every run: the command line's only */
};

typedef struct hx_opt_row {
    struct option opt; /* name, has_arg, val: a short option's letter, or a unique id >= 256 */
    hx_opt_kind kind;
    size_t offset, size; /* the field: offsetof and sizeof (HX_OPT_FIELD) */
    long long min, max;  /* INT, SIZE */
    double dmin, dmax;   /* DOUBLE */
    bool open_min, open_max;
    const hx_opt_name *names; /* ENUM: {NULL, 0}-terminated */
    long long def;            /* default of FLAG (0/1), INT, ENUM, SEED, SIZE, CUSTOM int */
    double def_double;        /* default of DOUBLE (CUSTOM double) */
    const char *def_string;   /* default of STRING and PATH (NULL: none) */
    hx_opt_kind store;        /* CUSTOM: how its default is stored (INT, DOUBLE, STRING;
                                 CUSTOM: def_string through `parse`; FLAG: not stored) */
    const char *metavar;
    const char *help;
    int section;        /* the table's --help section */
    const char *expect; /* "an integer in 1..4096": what errors say is expected (NULL: from
                           the kind and range) */
    const char *(*expect_fn)(void); /* the expectation made at run time (NULL: expect) */
    size_t mark[2];                 /* bool fields set when given (HX_OPT_MARK), 0: none */
    hx_opt_parse_fn parse;          /* CUSTOM */
    hx_opt_text_fn show;            /* --help's default text (NULL: from the kind) */
    hx_opt_text_fn value;           /* the value as an argument (NULL: from the kind) */
    const char *json;               /* its key in report.json's "options" (NULL: not there) */
    int sweep;                      /* HX_SWEEP_* */
    const char *sweep_alias;        /* another key a sweep file may use for it */
    bool unset;                     /* the default means "not given" and lies outside the range
                                       (0: off, -1: derived); --help shows what it means */
} hx_opt_row;

#define HX_OPT_FIELD(type, field)                                                                  \
    .offset = offsetof(type, field), .size = sizeof(((type *)0)->field)

/* A program's table: its rows and what its messages and --help need. */
typedef struct hx_opt_table {
    const hx_opt_row *rows;
    size_t n;
    const char *prog;                  /* "seldp-harness": the errors' prefix */
    const char *const *section_titles; /* [n_sections] */
    int n_sections;
} hx_opt_table;

/* Outcome of one parse. */
typedef enum hx_opt_result {
    HX_OPT_OK = 0,   /* every option stored */
    HX_OPT_DONE = 1, /* an ACTION row was given: *action names it */
    HX_OPT_BAD = 2   /* one line on err */
} hx_opt_result;

/* The most rows a table may have (the getopt arrays are this long). */
#define HX_OPT_ROWS_MAX 128

/* Every row's default into the struct at base. */
void hx_opt_defaults(const hx_opt_table *t, void *base);

/* argv (argv[0] the program) into base through the rows, one getopt_long loop; given[row] (NULL:
 * not kept) marks each row named. Errors: "PROG: --name 'value': expected EXPECT" naming
 * the option as it was typed. Resets getopt first. */
hx_opt_result hx_opt_parse(const hx_opt_table *t, int argc, char **argv, void *base, bool *given,
                           const hx_opt_row **action, FILE *err);

/* One value through one row (no getopt): false after "PROG: WHERE--name 'value': expected ..."
 * into msg (without "PROG: ", `where` first, e.g. "file:1:2: "). */
bool hx_opt_parse_value(const hx_opt_row *row, const char *arg, void *base, char *msg, size_t size);

/* What errors say row expects ("an integer in 1..4096"). */
void hx_opt_expect(const hx_opt_row *row, char *buf, size_t size);

/* The row named `name` (long name, or its sweep alias when `alias`), or NULL. */
const hx_opt_row *hx_opt_find(const hx_opt_table *t, const char *name, bool alias);

/* The value at base as an argument that parses back to it ("" for an unset string; a flag:
 * "true" or "false"). */
void hx_opt_value_text(const hx_opt_row *row, const void *base, char *buf, size_t size);

/* The default as --help shows it (from the row's default, or its `show`). */
void hx_opt_default_text(const hx_opt_row *row, char *buf, size_t size);

/* The option's own name of an enum value, or NULL. */
const char *hx_opt_enum_name(const hx_opt_row *row, int value);

/* --help's option lines: every section's title, then its rows in table order, each with its
 * help and "[default: X]" (none for ACTION rows), wrapped at 100 columns. */
void hx_opt_print_help(const hx_opt_table *t, FILE *out);

/* One row's line(s) of --help; with `shorts` the short letter first ("  -b, --minbytes SIZE"). */
void hx_opt_print_row(const hx_opt_row *row, FILE *out, bool shorts, bool show_default);

/* "256M" -> 268435456: K, M, G (powers of 1024), an optional B; at most 1e15 bytes. false
 * (and *out untouched) for anything else. */
bool hx_opt_parse_size(const char *text, size_t *out);

#endif
