/* q3 embed: texts in, one embedding each out (JSON lines or raw float32).
 * Public API only (include/q3.h): q3_embed_tokenize, q3_embed. Also the
 * opening of a model for embedding or reranking, which q3 rerank shares. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"

#define MAX_PROMPTS 1024

int cli_retrieval_open(const char *cmd, const cli_retrieval *r, q3_task want, q3_model **m, q3_tokenizer **tok,
                       q3_ctx **ctx)
{
    *m = NULL;
    *tok = NULL;
    *ctx = NULL;
    if (q3_model_open(r->model, m)) return cli_error(cmd, "%s", q3_last_error());
    q3_task t = q3_model_task(*m);
    if (t != want && t != Q3_TASK_GENERATE) {
        cli_error(cmd, "%s is %s model, not %s one (its markers: see docs/embeddings.md)", r->model,
                  t == Q3_TASK_EMBED ? "an embedding" : "a reranker", want == Q3_TASK_EMBED ? "an embedding" : "a reranker");
        q3_model_close(*m);
        *m = NULL;
        return 1;
    }
    if (q3_tokenizer_for_model(*m, tok)) {
        cli_error(cmd, "%s", q3_last_error());
        q3_model_close(*m);
        *m = NULL;
        return 1;
    }
    q3_ctx_opts co = q3_ctx_opts_default();
    co.n_ctx = r->n_ctx;
    co.n_threads = r->threads;
    co.backend = r->backend;
    if (q3_ctx_new(*m, &co, ctx)) {
        cli_error(cmd, "%s", q3_last_error());
        q3_tokenizer_free(*tok);
        q3_model_close(*m);
        *tok = NULL;
        *m = NULL;
        return 1;
    }
    return 0;
}

void cli_retrieval_close(q3_model *m, q3_tokenizer *tok, q3_ctx *ctx)
{
    q3_ctx_free(ctx);
    q3_tokenizer_free(tok);
    q3_model_close(m);
}

/* The lines of text (blank lines skipped, a trailing \r dropped), pointers
 * into text (cut in place). Returns the count, or -1 out of memory. */
int cli_split_lines(char *text, size_t len, char ***lines)
{
    int n = 0, cap = 0;
    *lines = NULL;
    char *p = text, *end = text + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end, *next = nl ? nl + 1 : end;
        if (e > p && e[-1] == '\r') e--;
        *e = 0; /* at end: the NUL the reader put there */
        if (e > p) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                char **q = realloc(*lines, (size_t)cap * sizeof *q);
                if (!q) {
                    free(*lines);
                    *lines = NULL;
                    return -1;
                }
                *lines = q;
            }
            (*lines)[n++] = p;
        }
        p = next;
    }
    return n;
}

static void print_vec_json(FILE *f, const float *v, int dim)
{
    fputc('[', f);
    for (int k = 0; k < dim; k++) fprintf(f, k ? ",%.9g" : "%.9g", v[k]);
    fputc(']', f);
}

int cmd_embed(int argc, char **argv)
{
    const char *cmd = "embed";
    cli_retrieval r = {0};
    const char *prompts[MAX_PROMPTS], *file = NULL, *instruct = NULL, *out_path = NULL;
    int n_prompts = 0, jsonl = 0, normalize = 0, no_normalize = 0, dim = 0, raw = 0, batch = 0;
    const cli_opt tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &r.model, "PATH", "the model: a folder or a .gguf (Qwen3-Embedding)", .flags = CLI_REQUIRED),
        CLI_OPT("prompt", 'p', CLI_STRS, prompts, "TEXT", "a text to embed (repeatable: one embedding each)", .hi = MAX_PROMPTS,
                .count = &n_prompts),
        CLI_OPT("file", 'f', CLI_FILE, &file, "PATH", "texts to embed, one a line (blank lines skipped; '-': stdin)",
                .flags = CLI_STDIN),
        CLI_OPT("jsonl", 0, CLI_FLAG, &jsonl, NULL,
                "stdin holds one JSON object a line with a \"text\" string (and\n"
                "optionally \"instruct\"); each is printed back with \"embedding\" added"),
        CLI_OPT("instruct", 0, CLI_STR, &instruct, "TASK",
                "embed the texts as queries of this task: \"Instruct: TASK\\nQuery:TEXT\"\n"
                "(documents take none)"),
        CLI_OPT("dim", 0, CLI_INT, &dim, "D", "the first D values of each embedding, renormalized (Matryoshka;\n32..hidden; default: all)",
                .lo = 1, .hi = 1 << 20),
        CLI_OPT("normalize", 0, CLI_FLAG, &normalize, NULL, "L2-normalize each embedding (the default)"),
        CLI_OPT("no-normalize", 0, CLI_FLAG, &no_normalize, NULL, "the raw final-norm hidden state of the last token"),
        CLI_OPT("raw", 0, CLI_FLAG, &raw, NULL, "write float32 little-endian [n][dim] instead of JSON lines"),
        CLI_OPT("output", 'o', CLI_STR, &out_path, "PATH", "write to PATH instead of stdout"),
        CLI_OPT("ctx", 'c', CLI_INT, &r.n_ctx, "N", "the longest input in tokens (default: min(model's, 4096))", .lo = 1,
                .hi = 1 << 24),
        CLI_OPT("batch", 'b', CLI_INT, &batch, "N", "tokens packed into one run (default 1024)", .lo = 1, .hi = 65536),
        CLI_OPT("threads", 't', CLI_INT, &r.threads, "N", "threads (default: one per physical core)", .lo = 1, .hi = 256),
        CLI_OPT("backend", 0, CLI_STR, &r.backend, "NAME", "compute unit: ref, cpu (default: the best present)"),
        {0},
    };
    cli_spec spec = {cmd, "q3 embed -m MODEL (-p TEXT... | -f FILE | --jsonl) [--instruct TASK] [--dim D] [--raw] [options]",
                     "Embeds each text with a Qwen3-Embedding model: the final-norm hidden state of its last\n"
                     "token (<|endoftext|>, appended), L2-normalized. Prints one JSON line per text,\n"
                     "{\"index\": i, \"embedding\": [...]}, in input order. Inputs are packed into batches\n"
                     "without padding; each is computed exactly as it would be alone.\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if ((n_prompts > 0) + (file != NULL) + jsonl != 1)
        return cli_usage_error(cmd, "give the texts one way: -p TEXT, -f FILE or --jsonl");
    if (normalize && no_normalize) return cli_usage_error(cmd, "--normalize and --no-normalize exclude each other");
    if (raw && jsonl) return cli_usage_error(cmd, "--raw writes vectors only; --jsonl prints objects back");

    /* the texts */
    char *all = NULL, **lines = NULL;
    const char **texts = prompts, **instructs = NULL;
    cJSON **objs = NULL;
    int n = n_prompts;
    size_t all_len = 0;
    if (file || jsonl) {
        all = file ? cli_read_path(cmd, file, &all_len) : cli_read_stdin(cmd, &all_len);
        if (!all) return 1;
        if (strlen(all) != all_len) {
            free(all);
            return cli_error(cmd, "%s: a NUL byte in the input", file && strcmp(file, "-") ? file : "stdin");
        }
        n = cli_split_lines(all, all_len, &lines);
        if (n < 0) {
            free(all);
            return cli_error(cmd, "out of memory");
        }
        texts = (const char **)lines;
    }
    rc = 0;
    if (jsonl) {
        objs = calloc((size_t)n + 1, sizeof *objs);
        instructs = calloc((size_t)n + 1, sizeof *instructs);
        texts = calloc((size_t)n + 1, sizeof *texts);
        for (int i = 0; i < n && !rc; i++) {
            objs[i] = cJSON_Parse(lines[i]);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(objs[i], "text");
            const cJSON *in = cJSON_GetObjectItemCaseSensitive(objs[i], "instruct");
            if (!cJSON_IsObject(objs[i]) || !cJSON_IsString(t))
                rc = cli_error(cmd, "stdin line %d: expected a JSON object with a \"text\" string", i + 1);
            else if (in && !cJSON_IsString(in))
                rc = cli_error(cmd, "stdin line %d: \"instruct\" must be a string", i + 1);
            else {
                texts[i] = t->valuestring;
                instructs[i] = in ? in->valuestring : NULL;
            }
        }
    }
    if (!rc && n == 0) rc = cli_error(cmd, "no texts to embed");

    q3_model *m = NULL;
    q3_tokenizer *tok = NULL;
    q3_ctx *ctx = NULL;
    int32_t **ids = NULL;
    size_t *lens = NULL;
    float *vecs = NULL;
    if (!rc) rc = cli_retrieval_open(cmd, &r, Q3_TASK_EMBED, &m, &tok, &ctx);
    int hidden = m ? q3_model_hidden_size(m) : 0;
    if (!rc && dim > hidden) rc = cli_usage_error(cmd, "--dim %d: this model's embeddings have %d values", dim, hidden);
    int d = dim ? dim : hidden;
    if (!rc) {
        ids = calloc((size_t)n, sizeof *ids);
        lens = calloc((size_t)n, sizeof *lens);
        vecs = malloc((size_t)n * (size_t)d * sizeof *vecs);
        if (!ids || !lens || !vecs) rc = cli_error(cmd, "out of memory");
    }
    for (int i = 0; i < n && !rc; i++) {
        const char *ins = instructs && instructs[i] ? instructs[i] : instruct;
        if (q3_embed_tokenize(tok, ins, texts[i], strlen(texts[i]), &ids[i], &lens[i]))
            rc = cli_error(cmd, "text %d: %s", i + 1, q3_last_error());
    }
    if (!rc) {
        q3_embed_opts eo = q3_embed_opts_default();
        eo.dim = d;
        eo.unnormalized = no_normalize;
        eo.batch_tokens = batch;
        if (q3_embed(ctx, (const int32_t *const *)ids, lens, (size_t)n, &eo, vecs)) rc = cli_error(cmd, "%s", q3_last_error());
    }
    FILE *out = stdout;
    if (!rc && out_path && !(out = fopen(out_path, raw ? "wb" : "w"))) rc = cli_error(cmd, "cannot write %s", out_path);
    if (!rc && raw && isatty(fileno(out))) rc = cli_usage_error(cmd, "--raw writes binary: redirect it or use -o FILE");
    for (int i = 0; i < n && !rc; i++) {
        const float *v = vecs + (size_t)i * d;
        if (raw) {
            if (fwrite(v, sizeof(float), (size_t)d, out) != (size_t)d) rc = cli_error(cmd, "a write failed");
        } else if (jsonl) {
            cJSON_DeleteItemFromObjectCaseSensitive(objs[i], "embedding");
            char *s = cJSON_PrintUnformatted(objs[i]);
            size_t sl = s ? strlen(s) : 0;
            if (!s || sl < 2) rc = cli_error(cmd, "out of memory");
            else {
                fwrite(s, 1, sl - 1, out); /* the object without its closing brace */
                fputs(sl > 2 ? ",\"embedding\":" : "\"embedding\":", out);
                print_vec_json(out, v, d);
                fputs("}\n", out);
            }
            free(s);
        } else {
            fprintf(out, "{\"index\":%d,\"tokens\":%zu,\"embedding\":", i, lens[i]);
            print_vec_json(out, v, d);
            fputs("}\n", out);
        }
    }
    if (out && out != stdout && fclose(out) && !rc) rc = cli_error(cmd, "writing %s failed", out_path);
    if (out == stdout && fflush(stdout) && !rc) rc = cli_error(cmd, "writing stdout failed");
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    for (int i = 0; objs && i < n; i++) cJSON_Delete(objs[i]);
    free(objs);
    free(ids);
    free(lens);
    free(vecs);
    if (jsonl) free(texts);
    free(instructs);
    free(lines);
    free(all);
    cli_retrieval_close(m, tok, ctx);
    return rc;
}
