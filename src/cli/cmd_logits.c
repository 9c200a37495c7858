/* q3 logits: float32 little-endian logits [n_tokens][vocab], row t = after tokens[0..t]. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "q3.h"
#include "util/outfile.h"

static const char *usage =
    "usage: q3 logits -m MODEL --tokens 1,2,3 [--decode-from K] [--chunk S] [--backend NAME]\n"
    "                 [--kv f32|f16|bf16] -o OUT.f32\n"
    "  writes float32 little-endian logits [n_tokens][vocab]; row t = the logits after tokens[0..t].\n"
    "  --decode-from K: the first K tokens go through prefill, every later one through decode.\n";

/* Parses "1,2,3" into a new array; returns the count or -1 with a message. */
static long parse_ids(const char *s, int32_t **out)
{
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        cli_error("logits", "--tokens: out of memory");
        return -1;
    }
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(ids);
            cli_error("logits", "--tokens: '%s' is not a comma-separated list of token ids", s);
            return -1;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!grown) {
                free(ids);
                cli_error("logits", "--tokens: out of memory");
                return -1;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    *out = ids;
    return (long)n;
}

int cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL, *out_path = NULL;
    q3_session_opts o = {0};
    long decode_from = -1;
    long long num;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!v) return cli_error("logits", "option '%s' needs a value\n%s", a, usage);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "-o")) out_path = v;
        else if (!strcmp(a, "--decode-from")) { if (cli_parse_int("logits", a, v, 1, CLI_MAX_CTX, &num)) return 1; decode_from = (long)num; }
        else if (!strcmp(a, "--chunk")) { if (cli_parse_int("logits", a, v, 1, 4096, &num)) return 1; o.chunk = (int)num; }
        else if (!strcmp(a, "--backend")) o.backend = v;
        else if (!strcmp(a, "--kv")) o.kv_dtype = v;
        else if (!strcmp(a, "--ctx")) { if (cli_parse_int("logits", a, v, 1, CLI_MAX_CTX, &num)) return 1; o.n_ctx = (int)num; }
        else return cli_error("logits", "unknown option '%s'\n%s", a, usage);
        i++;
    }
    if (!model || !tokens || !out_path) return cli_error("logits", "-m, --tokens and -o are required\n%s", usage);
    int32_t *ids;
    long n = parse_ids(tokens, &ids);
    if (n < 0) return 1;
    if (n == 0) { free(ids); return cli_error("logits", "--tokens is empty"); }
    if (decode_from > n || decode_from == 0) {
        free(ids);
        return cli_error("logits", "--decode-from %ld must be in 1..%ld", decode_from, n);
    }
    if (q3_outfile_check(out_path)) { free(ids); return cli_error("logits", "-o: %s", q3_last_error()); }
    q3_model *m;
    if (q3_model_open(model, &m)) { free(ids); return cli_error("logits", "%s", q3_last_error()); }
    int rc = 1;
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
    if (q3_write_file_atomic(out_path, logits, (size_t)n * V * sizeof(float))) {
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
