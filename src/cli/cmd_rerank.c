/* q3 rerank: one query, many documents, each scored by a Qwen3-Reranker
 * (P(yes) / (P(yes) + P(no))) and printed best first. Public API only
 * (include/q3.h): q3_rerank_tokenize, q3_rerank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"

typedef struct ranked {
    int index;
    float score;
} ranked;

/* best first; equal scores keep the documents' order */
static int by_score(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return x->index - y->index;
}

static void print_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

int cmd_rerank(int argc, char **argv)
{
    const char *cmd = "rerank";
    cli_retrieval r = {0};
    const char *query = NULL, *docs_path = NULL, *instruct = NULL;
    int top_n = 0, batch = 0, no_docs = 0;
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &r.model, "PATH", "the model: a folder or a .gguf (Qwen3-Reranker)", .flags = CLI_REQUIRED),
        CLI_OPT("query", 'q', CLI_STR, &query, "TEXT", "the query", .flags = CLI_REQUIRED),
        CLI_OPT("docs", 'd', CLI_FILE, &docs_path, "PATH", "the documents, one a line (blank lines skipped; '-': stdin)",
                .flags = CLI_REQUIRED | CLI_STDIN),
        CLI_OPT("top-n", 'n', CLI_INT, &top_n, "N", "print the N best only (default: all)", .lo = 1, .hi = 1 << 30),
        CLI_OPT("instruct", 0, CLI_STR, &instruct, "TASK",
                "the task instruction (default: \"" Q3_RERANK_DEFAULT_INSTRUCT "\")"),
        CLI_OPT("no-documents", 0, CLI_FLAG, &no_docs, NULL, "leave the documents' text out of the output"),
        CLI_OPT("ctx", 'c', CLI_INT, &r.n_ctx, "N", "the longest prompt in tokens (default: min(model's, 4096))", .lo = 1,
                .hi = 1 << 24),
        CLI_OPT("batch", 'b', CLI_INT, &batch, "N", "tokens packed into one run (default 1024)", .lo = 1, .hi = 65536),
        CLI_OPT("threads", 't', CLI_INT, &r.threads, "N", "threads (default: one per physical core)", .lo = 1, .hi = 256),
        CLI_OPT("backend", 0, CLI_STR, &r.backend, "NAME", "compute unit: ref, cpu (default: the best present)"),
        {0},
    };
    cli_spec spec = {cmd, "q3 rerank -m MODEL --query TEXT --docs FILE [--top-n N] [--instruct TASK] [options]",
                     "Scores each document against the query with a Qwen3-Reranker model: the prompt of its\n"
                     "model card, then P(yes) / (P(yes) + P(no)) from the logits of \"yes\" and \"no\" at the\n"
                     "last position. Prints one JSON line per document, best first:\n"
                     "{\"index\": i, \"relevance_score\": s, \"document\": \"...\"}.\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    size_t len;
    char *all = cli_read_path(cmd, docs_path, &len), **docs = NULL;
    if (!all) return 1;
    if (strlen(all) != len) {
        free(all);
        return cli_error(cmd, "%s: a NUL byte in the documents", strcmp(docs_path, "-") ? docs_path : "stdin");
    }
    int n = cli_split_lines(all, len, &docs);
    if (n < 0) rc = cli_error(cmd, "out of memory");
    else if (n == 0) rc = cli_error(cmd, "%s: no documents", strcmp(docs_path, "-") ? docs_path : "stdin");
    q3_model *m = NULL;
    q3_tokenizer *tok = NULL;
    q3_ctx *ctx = NULL;
    int32_t **ids = NULL;
    size_t *lens = NULL;
    float *scores = NULL;
    ranked *order = NULL;
    if (!rc) rc = cli_retrieval_open(cmd, &r, Q3_TASK_RERANK, &m, &tok, &ctx);
    if (!rc) {
        ids = calloc((size_t)n, sizeof *ids);
        lens = calloc((size_t)n, sizeof *lens);
        scores = calloc((size_t)n, sizeof *scores);
        order = calloc((size_t)n, sizeof *order);
        if (!ids || !lens || !scores || !order) rc = cli_error(cmd, "out of memory");
    }
    for (int i = 0; i < n && !rc; i++)
        if (q3_rerank_tokenize(tok, instruct, query, docs[i], &ids[i], &lens[i]))
            rc = cli_error(cmd, "document %d: %s", i + 1, q3_last_error());
    if (!rc) {
        q3_embed_opts eo = q3_embed_opts_default();
        eo.batch_tokens = batch;
        if (q3_rerank(ctx, tok, (const int32_t *const *)ids, lens, (size_t)n, &eo, scores, NULL))
            rc = cli_error(cmd, "%s", q3_last_error());
    }
    if (!rc) {
        for (int i = 0; i < n; i++) order[i] = (ranked){i, scores[i]};
        qsort(order, (size_t)n, sizeof *order, by_score);
        int shown = top_n && top_n < n ? top_n : n;
        for (int k = 0; k < shown; k++) {
            printf("{\"index\":%d,\"relevance_score\":%.9g", order[k].index, order[k].score);
            if (!no_docs) {
                fputs(",\"document\":", stdout);
                print_json_string(stdout, docs[order[k].index]);
            }
            fputs("}\n", stdout);
        }
        if (fflush(stdout)) rc = cli_error(cmd, "writing stdout failed");
    }
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(scores);
    free(order);
    free(docs);
    free(all);
    cli_retrieval_close(m, tok, ctx);
    return rc;
}
