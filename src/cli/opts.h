/* The one option parser of the q3 command line. Each command describes its
 * options in a table (long name, short name, kind, where the value goes, the
 * value's name and a help line); cli_parse reads argv GNU-style against it
 * and cli_help prints --help from the same table, so the two cannot drift
 * (and docs/cli.md is checked against --help by tests/test_cli.c).
 *
 *   -x V   -xN   --long V   --long=V   -abc V   --   (ends options; '-' alone is a positional)
 *
 * A single dash and several letters is one name, never bundled letters:
 * "-ngl 99" is the option whose `dash` is "ngl" (llama.cpp's spellings), or
 * "unknown option '-ngl'"; a glued value ("-n16") only for a one-letter
 * option that takes a number, and only when the rest is one.
 *
 * Exit codes: a usage error (unknown option, missing value, bad number, an
 * input file that does not exist, a positional where none is taken, a missing
 * required option) prints ONE line
 *     q3 CMD: <the problem> (see q3 CMD --help)
 * and the command exits 2; runtime errors (a malformed model, out of memory,
 * a failed write) exit 1. */
#ifndef Q3_CLI_OPTS_H
#define Q3_CLI_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_kind {
    CLI_FLAG,   /* int *: set to 1; takes no value */
    CLI_INT,    /* int *: a decimal integer in [lo, hi] */
    CLI_LLONG,  /* long long *: a decimal integer in [lo, hi] */
    CLI_FLOAT,  /* float *: a finite number in [lo, hi] */
    CLI_DOUBLE, /* double *: a finite number in [lo, hi] */
    CLI_STR,    /* const char **: any text */
    CLI_FILE,   /* const char **: a path that must exist ('-' is stdin when CLI_STDIN is set) */
    CLI_STRS,   /* const char **dest[hi entries], *count: repeatable */
    CLI_ONOFF,  /* int *: 1 alone or with on|auto|1|true, 0 with off|0|false; takes
                   the next argument only when it is one of those (llama.cpp's -fa) */
} cli_kind;

enum {
    CLI_REQUIRED = 1 << 0, /* missing: a usage error */
    CLI_STDIN = 1 << 1,    /* CLI_FILE: '-' means standard input */
    CLI_HIDDEN = 1 << 2,   /* an alias: parsed, not listed in --help */
};

typedef struct cli_opt {
    const char *name; /* long name without "--"; NULL ends a table */
    char short_name;  /* 0: none */
    const char *dash; /* NULL, or a spelling of several letters after one dash ("ngl" for -ngl) */
    cli_kind kind;
    void *dest;
    const char *meta; /* the value's name in --help ("PATH", "N"); NULL for flags */
    const char *help; /* one or more lines ('\n' separated) */
    double lo, hi;    /* numbers: the accepted range; CLI_STRS: hi = capacity */
    int *count;       /* CLI_STRS: entries stored */
    int flags;        /* CLI_REQUIRED | CLI_STDIN | CLI_HIDDEN */
} cli_opt;

typedef struct cli_spec {
    const char *cmd;        /* "run" */
    const char *usage;      /* synopsis lines, each without "usage: " ("q3 run -m MODEL -p PROMPT [options]") */
    const char *about;      /* what the command does (may be NULL) */
    const cli_opt *opts;    /* table, ended by {NULL} */
    int max_positional;     /* 0: none taken; -1: any number */
    const char *notes;      /* text after the options (may be NULL) */
} cli_spec;

/* A table entry: CLI_OPT("threads", 't', CLI_INT, &n, "N", "help", .lo = 1, .hi = 256) */
#define CLI_OPT(n, s, k, d, m, h, ...) \
    {.name = (n), .short_name = (s), .kind = (k), .dest = (d), .meta = (m), .help = (h), __VA_ARGS__}

/* llama.cpp's spellings of what q3 has (or accepts and ignores), for the
 * commands with a model context: cli_llama_add_opts appends them to a table
 * (hidden where q3 has its own name), cli_llama_apply resolves them after
 * cli_parse. */
typedef struct cli_llama {
    const char *ngl;        /* -ngl/--n-gpu-layers: accepted; a CPU build notes it ignores it */
    int fa;                 /* -fa/--flash-attn: accepted; q3's attention is always fused */
    const char *ctk, *ctv;  /* -ctk/-ctv: q3 has one type for both (--kv) */
    int batch;              /* -b/--batch-size: accepted; q3 prefills in --chunk pieces */
} cli_llama;
#define CLI_LLAMA_N_OPTS 7
/* Appends -ngl, -fa, -ctk, -ctv, -b and -ub (the last into *chunk) to tab;
 * returns how many (at most CLI_LLAMA_N_OPTS). */
int cli_llama_add_opts(cli_llama *l, int *chunk, cli_opt *tab);
/* After cli_parse: *kv_dtype from --kv, -ctk and -ctv (a usage error when they
 * disagree, or a type q3 has not: f32, f16, bf16, q8_0), and the note for
 * -ngl on stderr. Returns 0 or 2 (printed). */
int cli_llama_apply(const cli_spec *s, const cli_llama *l, const char **kv_dtype);

#define CLI_HELP_SHOWN (-1)

/* Parses argv[1..argc) against s. Positionals are moved, in order, to
 * argv[1..1+*n_pos). Returns 0; CLI_HELP_SHOWN after printing --help to
 * stdout (exit 0); or 2 after printing one line to stderr. */
int cli_parse(const cli_spec *s, int argc, char **argv, int *n_pos);

/* Prints the help of s (usage, about, options, notes). */
void cli_help(const cli_spec *s, FILE *f);

/* Prints "q3 CMD: <message> (see q3 CMD --help)" to stderr; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 if the option named `name` (long name) was given in the last cli_parse of s. */
int cli_given(const cli_spec *s, const char *name);

/* Parses a list of token ids: "1,2,3", "1 2 3" or "[1, 2, 3]" (brackets,
 * commas and white space separate; what tokenize prints). *ids is malloc'd.
 * Returns 0, or -1 with *bad pointing at the first text that is not an id in
 * 0..INT32_MAX (or NULL when out of memory). */
int cli_parse_ids(const char *text, int32_t **ids, size_t *n, const char **bad);

#endif
