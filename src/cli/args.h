/* Numbers on the command line, parsed strictly and the same way by every
 * command: the whole string, finite, in range, an integer where an integer is
 * meant. "--temp nan", "-n 1.5", "--ctx 1e20" and "--top-k 1e12" are errors
 * with a message naming the option and its valid range, never a silent
 * default or an out-of-range cast. */
#ifndef Q3_CLI_ARGS_H
#define Q3_CLI_ARGS_H

/* The largest context length, -n, bench --depth and --prompt the command line
 * takes (2^24 tokens: far past any Qwen3 context, far below int overflow). */
#define CLI_MAX_CTX (1 << 24)

/* A decimal integer (optional sign, digits only) in [lo, hi]. Returns 0 with
 * *out set, or 1 after printing "q3 CMD: NAME must be an integer in lo..hi,
 * not 'TEXT'". */
int cli_parse_int(const char *cmd, const char *name, const char *text, long long lo, long long hi,
                  long long *out);

/* A finite decimal number in [lo, hi] (strtod syntax, no "nan", no "inf").
 * Returns 0 with *out set, or 1 after printing why. */
int cli_parse_double(const char *cmd, const char *name, const char *text, double lo, double hi,
                     double *out);

#endif
