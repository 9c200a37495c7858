/* The q3 command line: one file per command, each `int cmd_NAME(argc, argv)`
 * returning the process exit status. Only the CLI prints and exits. */
#ifndef Q3_CLI_H
#define Q3_CLI_H

#include <stddef.h>

int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_grammar(int argc, char **argv);

/* Prints "q3 CMD: <message>" to stderr; returns 1 for `return cli_error(...)`. */
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The most any command reads from stdin or an input file. */
#define CLI_MAX_INPUT_BYTES ((size_t)1 << 30)

/* All of stdin, NUL-terminated (caller frees; *len its length, may be NULL);
 * NULL after printing why. */
char *cli_read_stdin(const char *cmd, size_t *len);

/* All of the file at path ('-': stdin), NUL-terminated (caller frees; *len
 * its length); NULL after printing why (a FIFO or a device is refused). */
char *cli_read_path(const char *cmd, const char *path, size_t *len);

#endif
