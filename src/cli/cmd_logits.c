/* q3 logits: float32 little-endian logits [n_tokens][vocab], row t = after tokens[0..t]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/files.h"

int cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL, *out_path = NULL;
    q3_session_opts o = {0};
    int decode_from = -1;
    cli_llama llama = {0};
    cli_opt tab[16 + CLI_LLAMA_N_OPTS] = {
        CLI_OPT("model", 'm', CLI_FILE, &model, "PATH", "a Hugging Face folder or a .gguf", .flags = CLI_REQUIRED),
        CLI_OPT("tokens", 0, CLI_STR, &tokens, "IDS",
                "the token ids: 1,2,3 or [1, 2, 3] (what q3 tokenize prints); '-': stdin", .flags = CLI_REQUIRED),
        CLI_OPT("output", 'o', CLI_STR, &out_path, "FILE", "where the logits go ('-': stdout)", .flags = CLI_REQUIRED),
        CLI_OPT("decode-from", 0, CLI_INT, &decode_from, "K",
                "the first K tokens go through prefill, every later one through decode", .lo = 1, .hi = CLI_MAX_CTX),
        CLI_OPT("threads", 't', CLI_INT, &o.n_threads, "N", "CPU threads (default: one per physical core)", .lo = 1,
                .hi = 256),
        CLI_OPT("ctx-size", 'c', CLI_INT, &o.n_ctx, "N", "context length (default: min(model, 4096), or the tokens); --ctx too",
                .lo = 1, .hi = CLI_MAX_CTX),
        CLI_OPT("ctx", 0, CLI_INT, &o.n_ctx, "N", NULL, .lo = 1, .hi = CLI_MAX_CTX, .flags = CLI_HIDDEN),
        CLI_OPT("chunk", 0, CLI_INT, &o.chunk, "N", "prefill chunk in tokens (default 128)", .lo = 1, .hi = 4096),
        CLI_OPT("backend", 0, CLI_STR, &o.backend, "UNIT", "compute unit: cpu or ref (default: the best present)"),
        CLI_OPT("kv", 0, CLI_STR, &o.kv_dtype, "TYPE", "KV cache type: f32, f16, bf16 or q8_0"),
    };
    int n_tab = 0;
    while (tab[n_tab].name) n_tab++;
    cli_llama_add_opts(&llama, &o.chunk, tab + n_tab);
    cli_spec spec = {"logits", "q3 logits -m MODEL --tokens 1,2,3 -o OUT.f32 [options]",
                     "Writes float32 little-endian logits [n_tokens][vocab]; row t = the logits after tokens[0..t].\n",
                     tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if ((rc = cli_llama_apply(&spec, &llama, &o.kv_dtype))) return rc;
    char *tok_text = NULL;
    if (!strcmp(tokens, "-")) {
        size_t len;
        if (!(tokens = tok_text = cli_read_stdin("logits", &len))) return 1;
    }
    int32_t *ids;
    size_t n_ids;
    const char *bad;
    if (cli_parse_ids(tokens, &ids, &n_ids, &bad)) {
        rc = bad ? cli_usage_error("logits", "--tokens: not a token id at '%.20s'", bad)
                 : cli_error("logits", "out of memory");
        free(tok_text);
        return rc;
    }
    free(tok_text);
    long n = (long)n_ids;
    if (n == 0) { free(ids); return cli_usage_error("logits", "--tokens is empty"); }
    if (decode_from > n || decode_from == 0) {
        free(ids);
        return cli_usage_error("logits", "--decode-from %d must be in 1..%ld", decode_from, n);
    }
    int to_stdout = !strcmp(out_path, "-");
    if (!to_stdout && q3_tool_output_check(out_path)) { free(ids); return cli_error("logits", "-o: %s", q3_last_error()); }
    q3_model *m;
    if (q3_model_open(model, &m)) { free(ids); return cli_error("logits", "%s", q3_last_error()); }
    rc = 1;
    q3_session *s = NULL;
    size_t V = (size_t)q3_model_vocab_size(m);
    float *logits = malloc((size_t)n * V * sizeof(float));
    if (!o.n_ctx) o.n_ctx = n > 4096 ? (int)n : 0;
    if (!logits) { cli_error("logits", "out of memory for %ld x %zu logits", n, V); goto done; }
    if (q3_session_new(m, &o, &s)) { cli_error("logits", "%s", q3_last_error()); goto done; }
    size_t k = decode_from > 0 ? (size_t)decode_from : (size_t)n;
    if (q3_session_prefill(s, ids, k, logits, 1)) { cli_error("logits", "%s", q3_last_error()); goto done; }
    for (size_t t = k; t < (size_t)n; t++)
        if (q3_session_decode(s, ids[t], logits + t * V)) { cli_error("logits", "%s", q3_last_error()); goto done; }
    if (to_stdout) {
        if (fwrite(logits, sizeof(float), (size_t)n * V, stdout) != (size_t)n * V) {
            cli_error("logits", "cannot write to standard output");
            goto done;
        }
    } else if (q3_tool_write_file(out_path, logits, (size_t)n * V * sizeof(float))) {
        cli_error("logits", "%s", q3_last_error());
        goto done;
    }
    rc = 0;
done:
    q3_session_free(s);
    q3_model_close(m);
    free(logits);
    free(ids);
    return rc;
}
