/* The q3 command line: one file per command, each `int cmd_NAME(argc, argv)`
 * returning the process exit status. Only the CLI prints and exits. */
#ifndef Q3_CLI_H
#define Q3_CLI_H

#include <stddef.h>

#include "q3.h"

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
int cmd_embed(int argc, char **argv);
int cmd_rerank(int argc, char **argv);
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

/* What q3 embed and q3 rerank open (cmd_embed.c). */
typedef struct cli_retrieval {
    const char *model, *backend;
    int n_ctx, threads;
} cli_retrieval;
/* The model (refused when its markers say it is for the other task), its
 * tokenizer and a context. 0, or 1 after printing why (nothing left open). */
int cli_retrieval_open(const char *cmd, const cli_retrieval *r, q3_task want, q3_model **m, q3_tokenizer **tok,
                       q3_ctx **ctx);
void cli_retrieval_close(q3_model *m, q3_tokenizer *tok, q3_ctx *ctx);
/* The non-blank lines of text[0..len) (NUL-terminated), cut in place; *lines
 * malloc'd. The count, or -1 when out of memory. */
int cli_split_lines(char *text, size_t len, char ***lines);

#endif
