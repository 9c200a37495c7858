/* q3 tokenize / q3 detokenize: text <-> token ids with a model's tokenizer.json. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/gen_common.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/defaults.h"
#include "tools/text.h"

/* ==== shared: options, the tokenizer, stdin ===================================== */

typedef struct tok_opts {
    const char *model, *tokenizer;
    int jsonl, special_as_text;
    char **args; /* the positional arguments */
    int n_args;
} tok_opts;

/* Returns 0, 2 (usage error, printed) or CLI_HELP_SHOWN. */
static int parse_opts(const char *cmd, int argc, char **argv, int tokenize, tok_opts *o)
{
    memset(o, 0, sizeof *o);
    const cli_opt tok_tab[] = {
        CLI_OPT("model", 'm', CLI_FILE, &o->model, "PATH", "the model folder (its tokenizer.json), or a .gguf"),
        CLI_OPT("tokenizer", 0, CLI_FILE, &o->tokenizer, "PATH",
                "a tokenizer.json, or a folder holding one (neither: the built-in\n"
                "Qwen3 tokenizer, see `make deps`; -t was this option before 0.3)"),
        CLI_OPT("jsonl", 0, CLI_FLAG, &o->jsonl, NULL,
                "stdin holds one JSON object a line with a \"text\" string; each\n"
                "is printed back with \"ids\" added"),
        CLI_OPT("special-as-text", 0, CLI_FLAG, &o->special_as_text, NULL,
                "<|im_start|> and other special tokens in the text are plain text"),
        {0},
    };
    const cli_opt detok_tab[] = {
        tok_tab[0],
        tok_tab[1],
        CLI_OPT("jsonl", 0, CLI_FLAG, &o->jsonl, NULL,
                "stdin holds one JSON line each: an array of ids, or an object with\n"
                "\"ids\" (what tokenize --jsonl prints); each is printed back as an\n"
                "object with \"text\" set"),
        {0},
    };
    cli_spec spec_tok = {"tokenize", "q3 tokenize [-m MODEL | --tokenizer PATH] [--jsonl] [--special-as-text] [TEXT...]",
                         "Prints the token ids of TEXT (the arguments joined by spaces; stdin if none) as a\n"
                         "JSON array. The text is taken byte for byte: `echo hi |` includes the newline.\n",
                         tok_tab, -1, NULL};
    cli_spec spec_detok = {"detokenize", "q3 detokenize [-m MODEL | --tokenizer PATH] [--jsonl] [IDS...]",
                           "Prints the text of token ids given as a JSON array (\"[9707, 11]\") or a list\n"
                           "separated by commas or spaces, from the arguments or, if none, stdin; then a newline.\n",
                           detok_tab, -1, NULL};
    int rc = cli_parse(tokenize ? &spec_tok : &spec_detok, argc, argv, &o->n_args);
    if (rc) return rc;
    o->args = argv + 1;
    if (o->jsonl && o->n_args) return cli_usage_error(cmd, "--jsonl reads stdin; it takes no arguments");
    if (o->model && o->tokenizer) return cli_usage_error(cmd, "-m and --tokenizer exclude each other");
    if (!o->model && !o->tokenizer && !(o->tokenizer = q3_default_tokenizer_dir()))
        return cli_usage_error(cmd, "no tokenizer: pass -m MODEL or --tokenizer PATH (or fetch the built-in one: make deps)");
    return 0;
}

/* The positional arguments joined by single spaces, or stdin if there are none. */
static char *input_text(const char *cmd, const tok_opts *o, size_t *len)
{
    if (!o->n_args) return cli_read_stdin(cmd, len);
    size_t total = 1;
    for (int i = 0; i < o->n_args; i++) total += strlen(o->args[i]) + 1;
    char *s = malloc(total), *w = s;
    if (!s) {
        cli_error(cmd, "out of memory");
        return NULL;
    }
    for (int i = 0; i < o->n_args; i++) {
        if (i) *w++ = ' ';
        size_t l = strlen(o->args[i]);
        memcpy(w, o->args[i], l);
        w += l;
    }
    *w = 0;
    *len = (size_t)(w - s);
    return s;
}

static void print_ids(FILE *f, const int32_t *ids, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) fprintf(f, i ? ", %d" : "%d", (int)ids[i]);
    fputs("]\n", f);
}

/* ==== q3 tokenize ================================================================== */

/* Each stdin line: a JSON object with "text"; prints it back with "ids" added. */
static int tokenize_jsonl(const char *cmd, const q3_tokenizer *tok, unsigned flags)
{
    size_t len;
    char *all = cli_read_stdin(cmd, &len);
    if (!all) return 1;
    int rc = 0;
    size_t line_no = 0;
    char *line = all;
    while (line < all + len && !rc) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        char *end = nl ? nl : all + len;
        line_no++;
        size_t n = (size_t)(end - line);
        if (n && line[n - 1] == '\r') n--;
        const char *p = line;
        while (p < line + n && (*p == ' ' || *p == '\t')) p++;
        if (p < line + n) { /* blank lines are skipped */
            cJSON *obj = q3_tool_json_find_nul(line, n) < n ? NULL : cJSON_ParseWithLength(line, n);
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, "text");
            if (obj == NULL && q3_tool_json_find_nul(line, n) < n) {
                rc = cli_error(cmd, "stdin line %zu: a NUL character (\\u0000 or a raw NUL byte) in the JSON: q3 "
                               "takes text without NUL characters", line_no);
            } else if (!cJSON_IsObject(obj) || !cJSON_IsString(text)) {
                rc = cli_error(cmd, "stdin line %zu: expected a JSON object with a \"text\" string", line_no);
            } else {
                int32_t *ids = NULL;
                size_t n_ids = 0;
                if (q3_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), flags, &ids, &n_ids)) {
                    rc = cli_error(cmd, "stdin line %zu: %s", line_no, q3_last_error());
                } else {
                    cJSON *arr = cJSON_CreateArray();
                    for (size_t i = 0; arr && i < n_ids; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
                    cJSON_DeleteItemFromObjectCaseSensitive(obj, "ids");
                    cJSON_AddItemToObject(obj, "ids", arr);
                    char *out = cJSON_PrintUnformatted(obj);
                    if (out) puts(out);
                    else rc = cli_error(cmd, "out of memory");
                    free(out);
                }
                free(ids);
            }
            cJSON_Delete(obj);
        }
        line = end + 1;
    }
    free(all);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *cmd = "tokenize";
    tok_opts o;
    int rc = parse_opts(cmd, argc, argv, 1, &o);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    q3_tokenizer *tok = NULL;
    rc = cli_open_tokenizer(cmd, o.tokenizer ? o.tokenizer : o.model, NULL, &tok);
    unsigned flags = o.special_as_text ? Q3_ENCODE_SPECIAL_AS_TEXT : Q3_ENCODE_DEFAULT;
    if (!rc && o.jsonl) {
        rc = tokenize_jsonl(cmd, tok, flags);
    } else if (!rc) {
        size_t len;
        char *text = input_text(cmd, &o, &len);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (!text) rc = 1; /* said why */
        else if (q3_tokenizer_encode(tok, text, len, flags, &ids, &n_ids)) rc = cli_error(cmd, "%s", q3_last_error());
        else print_ids(stdout, ids, n_ids);
        free(ids);
        free(text);
    }
    q3_tokenizer_free(tok);
    return rc;
}

/* ==== q3 detokenize ================================================================ */

/* Each stdin line: an array of ids, or an object with "ids"; printed back as
 * an object with "text" set. */
static int detokenize_jsonl(const char *cmd, const q3_tokenizer *tok)
{
    size_t len;
    char *all = cli_read_stdin(cmd, &len);
    if (!all) return 1;
    int rc = 0;
    size_t line_no = 0;
    char *line = all;
    while (line < all + len && !rc) {
        char *nl = memchr(line, '\n', (size_t)(all + len - line));
        char *end = nl ? nl : all + len;
        size_t n = (size_t)(end - line);
        line_no++;
        if (strspn(line, " \t\r") < n) {
            cJSON *v = q3_tool_json_find_nul(line, n) < n ? NULL : cJSON_ParseWithLength(line, n);
            cJSON *obj = v;
            if (cJSON_IsArray(v)) {
                obj = cJSON_CreateObject();
                cJSON_AddItemToObject(obj, "ids", v);
            }
            const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, "ids");
            int ok = cJSON_IsObject(obj) && cJSON_IsArray(arr);
            int nids = ok ? cJSON_GetArraySize(arr) : 0;
            int32_t *ids = ok ? malloc(((size_t)nids + 1) * sizeof *ids) : NULL;
            for (int i = 0; ids && i < nids; i++) {
                const cJSON *x = cJSON_GetArrayItem(arr, i);
                if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > INT32_MAX ||
                    x->valuedouble != (double)(int32_t)x->valuedouble)
                    ok = 0;
                else
                    ids[i] = (int32_t)x->valuedouble;
            }
            char *text = NULL;
            size_t tlen;
            if (!ok || !ids) {
                rc = cli_error(cmd, "stdin line %zu: expected an array of token ids or an object with \"ids\"", line_no);
            } else if (q3_tokenizer_decode(tok, ids, (size_t)nids, &text, &tlen)) {
                rc = cli_error(cmd, "stdin line %zu: %s", line_no, q3_last_error());
            } else {
                cJSON_DeleteItemFromObjectCaseSensitive(obj, "text");
                cJSON_AddItemToObject(obj, "text", cJSON_CreateString(text));
                char *out = cJSON_PrintUnformatted(obj);
                if (out) puts(out);
                else rc = cli_error(cmd, "out of memory");
                free(out);
            }
            free(text);
            free(ids);
            cJSON_Delete(obj);
        }
        line = end + 1;
    }
    free(all);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *cmd = "detokenize";
    tok_opts o;
    int rc = parse_opts(cmd, argc, argv, 0, &o);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    q3_tokenizer *tok = NULL;
    rc = cli_open_tokenizer(cmd, o.tokenizer ? o.tokenizer : o.model, NULL, &tok);
    if (!rc && o.jsonl) {
        rc = detokenize_jsonl(cmd, tok);
    } else if (!rc) {
        size_t len;
        char *in = input_text(cmd, &o, &len);
        int32_t *ids = NULL;
        size_t n = 0;
        const char *bad = NULL;
        char *text = NULL;
        size_t text_len = 0;
        if (!in) rc = 1; /* said why */
        else if (memchr(in, 0, len)) rc = cli_error(cmd, "the ids contain a NUL byte");
        else if (cli_parse_ids(in, &ids, &n, &bad))
            rc = bad ? (o.n_args ? cli_usage_error : cli_error)(cmd, "not a token id at \"%.20s\"", bad)
                     : cli_error(cmd, "out of memory");
        if (!rc && q3_tokenizer_decode(tok, ids, n, &text, &text_len)) rc = cli_error(cmd, "%s", q3_last_error());
        if (!rc) {
            fwrite(text, 1, text_len, stdout);
            fputc('\n', stdout);
        }
        free(text);
        free(ids);
        free(in);
    }
    q3_tokenizer_free(tok);
    return rc;
}
