/* q3 tokenize / q3 detokenize: text <-> token ids with a model's tokenizer.json. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/defaults.h"
#include "text/json_write.h"
#include "text/tokenizer.h"
#include "text/tokenizer_gguf.h"
#include "util/file.h"

/* ==== shared: options, the tokenizer, stdin ===================================== */

static void usage_tokenize(FILE *f)
{
    fprintf(f,
            "usage: q3 tokenize [-m MODEL | -t TOKENIZER] [--jsonl] [--special-as-text] [TEXT...]\n"
            "  Prints the token ids of TEXT (the arguments joined by spaces; stdin if none) as a\n"
            "  JSON array. The text is taken byte for byte: `echo hi |` includes the newline.\n"
            "  -m, --model PATH       the model folder (its tokenizer.json), or a .gguf\n"
            "  -t, --tokenizer PATH   a tokenizer.json, or a folder holding one\n"
            "                         (neither: the built-in Qwen3 tokenizer, see `make deps`)\n"
            "  --jsonl                stdin holds one JSON object a line with a \"text\" string; each\n"
            "                         is printed back with \"ids\" added\n"
            "  --special-as-text      <|im_start|> and other special tokens in the text are plain text\n");
}

static void usage_detokenize(FILE *f)
{
    fprintf(f,
            "usage: q3 detokenize [-m MODEL | -t TOKENIZER] [IDS...]\n"
            "  Prints the text of token ids given as a JSON array (\"[9707, 11]\") or a list\n"
            "  separated by commas or spaces, from the arguments or, if none, stdin.\n"
            "  -m, --model PATH       the model folder (its tokenizer.json), or a .gguf\n"
            "  -t, --tokenizer PATH   a tokenizer.json, or a folder holding one\n"
            "                         (neither: the built-in Qwen3 tokenizer, see `make deps`)\n");
}

typedef struct tok_opts {
    const char *model, *tokenizer;
    int jsonl, special_as_text;
    char **args; /* the positional arguments */
    int n_args;
} tok_opts;

/* Returns 0, 1 (error, printed), or 2 (--help printed). */
static int parse_opts(const char *cmd, int argc, char **argv, int allow_text_flags, tok_opts *o,
                      void (*usage)(FILE *))
{
    memset(o, 0, sizeof *o);
    o->args = calloc((size_t)argc + 1, sizeof *o->args);
    if (!o->args) return cli_error(cmd, "out of memory");
    int only_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_args || a[0] != '-' || !a[1]) {
            o->args[o->n_args++] = argv[i];
        } else if (!strcmp(a, "--")) {
            only_args = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "-t") || !strcmp(a, "--tokenizer")) {
            if (i + 1 >= argc) return cli_error(cmd, "%s needs a path", a);
            int is_model = !strcmp(a, "-m") || !strcmp(a, "--model");
            *(is_model ? &o->model : &o->tokenizer) = argv[++i];
        } else if (allow_text_flags && !strcmp(a, "--jsonl")) {
            o->jsonl = 1;
        } else if (allow_text_flags && !strcmp(a, "--special-as-text")) {
            o->special_as_text = 1;
        } else {
            usage(stderr);
            return cli_error(cmd, "unknown option '%s'", a);
        }
    }
    if (!o->model && !o->tokenizer && !(o->tokenizer = cli_default_tokenizer_dir())) {
        usage(stderr);
        return cli_error(cmd, "no tokenizer: pass -m MODEL or -t TOKENIZER.json (or fetch the built-in one: make deps)");
    }
    return 0;
}

static int open_tokenizer(const char *cmd, const tok_opts *o, q3_tokenizer **tok)
{
    const char *src = o->tokenizer ? o->tokenizer : o->model;
    char path[PATH_MAX];
    if (q3_is_dir(src)) {
        snprintf(path, sizeof path, "%s/tokenizer.json", src);
        src = path;
    }
    size_t n = strlen(src);
    int gguf = n >= 5 && !strcmp(src + n - 5, ".gguf"); /* the tokenizer in its metadata */
    q3_status st = gguf ? q3_tokenizer_load_gguf_file(src, tok) : q3_tokenizer_load(src, tok);
    if (st != Q3_OK) return cli_error(cmd, "%s", q3_last_error());
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
            cJSON *obj = q3_json_find_nul(line, n) < n ? NULL : cJSON_ParseWithLength(line, n);
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, "text");
            if (obj == NULL && q3_json_find_nul(line, n) < n) {
                rc = cli_error(cmd, "stdin line %zu: a NUL character (\\u0000 or a raw NUL byte) in the JSON: q3 "
                               "takes text without NUL characters", line_no);
            } else if (!cJSON_IsObject(obj) || !cJSON_IsString(text)) {
                rc = cli_error(cmd, "stdin line %zu: expected a JSON object with a \"text\" string", line_no);
            } else {
                q3_tokens ids = {0};
                if (q3_tokenizer_encode_append(tok, text->valuestring, strlen(text->valuestring), flags, &ids)) {
                    rc = cli_error(cmd, "stdin line %zu: %s", line_no, q3_last_error());
                } else {
                    cJSON *arr = cJSON_CreateArray();
                    for (size_t i = 0; arr && i < ids.n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids.ids[i]));
                    cJSON_DeleteItemFromObjectCaseSensitive(obj, "ids");
                    cJSON_AddItemToObject(obj, "ids", arr);
                    char *out = cJSON_PrintUnformatted(obj);
                    if (out) puts(out);
                    else rc = cli_error(cmd, "out of memory");
                    free(out);
                }
                q3_tokens_free(&ids);
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
    int rc = parse_opts(cmd, argc, argv, 1, &o, usage_tokenize);
    q3_tokenizer *tok = NULL;
    if (!rc) rc = open_tokenizer(cmd, &o, &tok);
    unsigned flags = o.special_as_text ? Q3_ENCODE_SPECIAL_AS_TEXT : Q3_ENCODE_DEFAULT;
    if (!rc && o.jsonl) {
        if (o.n_args) rc = cli_error(cmd, "--jsonl reads stdin; it takes no text arguments");
        else rc = tokenize_jsonl(cmd, tok, flags);
    } else if (!rc) {
        size_t len;
        char *text = input_text(cmd, &o, &len);
        q3_tokens ids = {0};
        if (!text) rc = 1; /* said why */
        else if (q3_tokenizer_encode_append(tok, text, len, flags, &ids)) rc = cli_error(cmd, "%s", q3_last_error());
        else print_ids(stdout, ids.ids, ids.n);
        q3_tokens_free(&ids);
        free(text);
    }
    q3_tokenizer_free(tok);
    free(o.args);
    return rc == 2 ? 0 : rc;
}

/* ==== q3 detokenize ================================================================ */

/* Parses "[1, 2, 3]", "1,2,3" or "1 2 3" (brackets, commas and white space all
 * separate). Returns 0, or 1 after printing an error. */
static int parse_ids(const char *cmd, const char *s, q3_tokens *out)
{
    const char *p = s;
    for (;;) {
        p += strspn(p, " \t\r\n,[]");
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX)
            return cli_error(cmd, "not a token id at \"%.20s\"", p);
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 256;
            int32_t *ids = realloc(out->ids, cap * sizeof *ids);
            if (!ids) return cli_error(cmd, "out of memory");
            out->ids = ids;
            out->cap = cap;
        }
        out->ids[out->n++] = (int32_t)v;
        p = end;
    }
    return 0;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *cmd = "detokenize";
    tok_opts o;
    int rc = parse_opts(cmd, argc, argv, 0, &o, usage_detokenize);
    q3_tokenizer *tok = NULL;
    if (!rc) rc = open_tokenizer(cmd, &o, &tok);
    if (!rc) {
        size_t len;
        char *in = input_text(cmd, &o, &len);
        q3_tokens ids = {0};
        char *text = NULL;
        size_t text_len = 0;
        if (!in) rc = 1; /* said why */
        else if (memchr(in, 0, len)) rc = cli_error(cmd, "the ids contain a NUL byte");
        else rc = parse_ids(cmd, in, &ids);
        if (!rc && q3_tokenizer_decode(tok, ids.ids, ids.n, &text, &text_len)) rc = cli_error(cmd, "%s", q3_last_error());
        if (!rc) fwrite(text, 1, text_len, stdout);
        free(text);
        q3_tokens_free(&ids);
        free(in);
    }
    q3_tokenizer_free(tok);
    free(o.args);
    return rc == 2 ? 0 : rc;
}
