/* q3 — entry point: dispatches to one command per file. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "q3.h"
#include "tools/files.h"
#include "tools/process.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate from a prompt or a conversation, streaming the text"},
    {"chat", cmd_chat, "talk with a model, turn by turn"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with continuous batching"},
    {"info", cmd_info, "print a model's config, parameters, bytes and KV-cache size"},
    {"logits", cmd_logits, "write the logits of a token sequence (float32 [n][vocab])"},
    {"bench", cmd_bench, "the split-phase table: prefill ms/chunk, decode ms/token, tok/s, RTFx per unit"},
    {"probe", cmd_probe, "per-op placement of the prefill and decode graphs under each policy, and why"},
    {"chat-template", cmd_chat_template, "render a conversation with Qwen3's chat template"},
    {"synth", cmd_synth, "write a Qwen3 checkpoint with random weights (0.6B shapes by default)"},
    {"convert", cmd_convert, "write a GGUF (f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k, ...) from a model folder or GGUF"},
    {"compare", cmd_compare, "accuracy of quantized weights: KL divergence and top-1 agreement vs the model"},
    {"tokenize", cmd_tokenize, "print the token ids of a text (or of JSONL lines) as JSON"},
    {"detokenize", cmd_detokenize, "print the text of token ids (a JSON array or a comma list)"},
    {"embed", cmd_embed, "embeddings of texts (Qwen3-Embedding): JSON lines or raw float32"},
    {"rerank", cmd_rerank, "score documents against a query (Qwen3-Reranker), best first"},
    {"grammar", cmd_grammar, "compile a JSON Schema, GBNF grammar, regex or choice; check a text against it"},
};

int cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "q3 %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

char *cli_read_path(const char *cmd, const char *path, size_t *len)
{
    if (!strcmp(path, "-")) return cli_read_stdin(cmd, len);
    char *text = NULL;
    if (q3_tool_read_file(path, CLI_MAX_INPUT_BYTES, &text, len) != Q3_OK) {
        cli_error(cmd, "%s", q3_last_error());
        return NULL;
    }
    return text;
}

char *cli_read_stdin(const char *cmd, size_t *len)
{
    char *text = NULL;
    if (q3_tool_read_stdin(CLI_MAX_INPUT_BYTES, &text, len) != Q3_OK) {
        cli_error(cmd, "%s", q3_last_error());
        return NULL;
    }
    return text;
}

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: q3 COMMAND [options]   (q3 COMMAND --help, or q3 help COMMAND, for its options)\n"
               "       q3 --version\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-14s %s\n", "help", "this list, or a command's help (q3 help COMMAND)");
    fprintf(f, "\nEvery command: -h/--help; usage errors exit 2, runtime errors 1. Reference: docs/cli.md.\n");
}

/* The environment variables the CPU unit reads ignore a value they do not
 * understand; the command line refuses it instead (exit 2), so a typo is never
 * a silent default. 0, or 2 after saying which variable and what it takes. */
static int check_environment(void)
{
    const char *t = getenv("Q3_THREADS"), *isa = getenv("Q3_CPU_ISA");
    long long n;
    if (t && *t && cli_scan_int(t, 1, 256, &n)) {
        fprintf(stderr, "q3: Q3_THREADS='%.40s' is not a number of threads in 1..256 (fix or unset it)\n", t);
        return 2;
    }
    if (isa && *isa && strcmp(isa, "avx2") && strcmp(isa, "avx512")) {
        fprintf(stderr, "q3: Q3_CPU_ISA='%.40s' is not a kernel table q3 can be asked for: avx2 or avx512 (fix or unset it)\n", isa);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    q3_process_init();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || (!strcmp(argv[1], "help") && argc == 2)) {
        usage(stdout);
        return q3_process_finish_stdout(0);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("q3 %s\n", q3_version());
        return q3_process_finish_stdout(0);
    }
    if (!strcmp(argv[1], "help")) {
        if (argc > 3) {
            fprintf(stderr, "q3 help: one command at most (see q3 --help)\n");
            return 2;
        }
        for (size_t i = 0; i < N_COMMANDS; i++)
            if (!strcmp(argv[2], commands[i].name)) {
                char *args[] = {argv[2], "--help", NULL};
                return q3_process_finish_stdout(commands[i].fn(2, args));
            }
        fprintf(stderr, "q3 help: unknown command '%.60s' (see q3 --help)\n", argv[2]);
        return 2;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = check_environment();
            return rc ? rc : q3_process_finish_stdout(commands[i].fn(argc - 1, argv + 1));
        }
    fprintf(stderr, "q3: unknown command '%.60s' (see q3 --help)\n", argv[1]);
    return 2;
}
