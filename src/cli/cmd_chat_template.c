/* q3 chat-template: renders conversations with Qwen3's chat template.
 *
 *   q3 chat-template [options] [FILE]     one conversation -> its render
 *   q3 chat-template --jsonl [FILE]       one conversation a line -> the same
 *                                         object with "rendered" added
 *
 * A conversation is an object {"messages", "tools", "add_generation_prompt",
 * "enable_thinking"} (as in tests/data/tokenizer/chat_public.jsonl) or a bare
 * messages array. FILE "-" or none reads stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "q3.h"
#include "tools/files.h"
#include "tools/text.h"

#define CMD "chat-template"

typedef struct chat_cli_opts {
    int jsonl, check, no_think, no_generation_prompt;
    const char *model, *file;
} chat_cli_opts;

/* ---- input --------------------------------------------------------------- */

static char *read_input(const char *file, size_t *len)
{
    if (!file || !strcmp(file, "-")) {
        return cli_read_stdin(CMD, len);
    }
    char *text = NULL;
    if (q3_tool_read_file(file, CLI_MAX_INPUT_BYTES, &text, len) != Q3_OK) {
        cli_error(CMD, "%s", q3_last_error());
        return NULL;
    }
    return text;
}

/* ---- one conversation ------------------------------------------------------ */

/* Sets conv[key] = value as a Python dict would: in the place of an
 * existing member of that name (dropping any repeats), else at the end. */
static void set_member(cJSON *conv, const char *key, cJSON *value)
{
    cJSON *first = cJSON_GetObjectItemCaseSensitive(conv, key);
    if (!first) {
        cJSON_AddItemToObject(conv, key, value);
        return;
    }
    for (cJSON *c = first->next, *next; c; c = next) {
        next = c->next;
        if (c->string && !strcmp(c->string, key)) cJSON_Delete(cJSON_DetachItemViaPointer(conv, c));
    }
    cJSON_ReplaceItemInObjectCaseSensitive(conv, key, value); /* replaces `first` */
}

/* Turns parsed input into a conversation object with the command-line
 * overrides applied; takes ownership of root. NULL (message printed) if
 * root is neither an object nor an array. */
static cJSON *as_conversation(cJSON *root, const chat_cli_opts *o, const char *where)
{
    cJSON *conv = root;
    if (cJSON_IsArray(root)) {
        conv = cJSON_CreateObject();
        if (!conv) {
            cJSON_Delete(root);
            cli_error(CMD, "out of memory");
            return NULL;
        }
        cJSON_AddItemToObject(conv, "messages", root);
    } else if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        cli_error(CMD, "%s: expected a conversation object or a messages array", where);
        return NULL;
    }
    if (o->no_think) set_member(conv, "enable_thinking", cJSON_CreateFalse());
    if (o->no_generation_prompt) set_member(conv, "add_generation_prompt", cJSON_CreateFalse());
    return conv;
}

/* Parses and renders text; *conv_out (may be NULL) keeps the conversation.
 * Returns the render (caller frees) or NULL with the error printed. */
static char *render_one(const char *text, const chat_cli_opts *o, const char *where,
                        cJSON **conv_out)
{
    cJSON *root = NULL;
    if (q3_tool_json_parse(text, &root) != Q3_OK) {
        cli_error(CMD, "%s: %s", where, q3_last_error());
        return NULL;
    }
    cJSON *conv = as_conversation(root, o, where);
    if (!conv) return NULL;
    char *rendered = NULL;
    if (q3_tool_chat_render(conv, &rendered) != Q3_OK) cli_error(CMD, "%s: %s", where, q3_last_error());
    if (conv_out && rendered) *conv_out = conv;
    else cJSON_Delete(conv);
    return rendered;
}

/* ---- modes ---------------------------------------------------------------- */

static int run_single(char *text, const chat_cli_opts *o)
{
    int from_stdin = !o->file || !strcmp(o->file, "-");
    char *rendered = render_one(text, o, from_stdin ? "stdin" : o->file, NULL);
    if (!rendered) return 1;
    fputs(rendered, stdout);
    free(rendered);
    return fflush(stdout) == 0 ? 0 : cli_error(CMD, "cannot write the output");
}

static int run_jsonl(char *text, const chat_cli_opts *o)
{
    int line_no = 0, matched = 0, checked = 0, status = 0;
    char *next = text;
    while (next && *next) {
        char *line = next;
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        line_no++;
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r') line[--n] = 0;
        if (strspn(line, " \t") == n) continue; /* blank line */

        char where[32];
        snprintf(where, sizeof where, "line %d", line_no);
        cJSON *conv = NULL;
        char *rendered = render_one(line, o, where, &conv);
        if (!rendered) return 1; /* stop: later output lines would be out of step */

        if (o->check) {
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(conv, "rendered");
            checked++;
            if (!cJSON_IsString(want)) {
                cli_error(CMD, "%s: no \"rendered\" to check against", where);
                status = 1;
            } else if (strcmp(want->valuestring, rendered)) {
                size_t i = 0;
                while (rendered[i] == want->valuestring[i]) i++;
                cli_error(CMD, "%s: render differs from \"rendered\" at byte %zu", where, i);
                status = 1;
            } else {
                matched++;
            }
        } else {
            cJSON *value = cJSON_CreateString(rendered);
            char *out = NULL;
            if (value) set_member(conv, "rendered", value);
            if (!value || q3_tool_json_dumps(conv, &out, NULL) != Q3_OK) {
                cJSON_Delete(conv);
                free(rendered);
                return cli_error(CMD, "%s: %s", where, value ? q3_last_error() : "out of memory");
            }
            puts(out);
            free(out);
        }
        cJSON_Delete(conv);
        free(rendered);
    }
    if (o->check) printf("%d of %d renders match\n", matched, checked);
    if (fflush(stdout) != 0) return cli_error(CMD, "cannot write the output");
    return status;
}

int cmd_chat_template(int argc, char **argv)
{
    chat_cli_opts o = {0};
    const cli_opt tab[] = {
        CLI_OPT("jsonl", 0, CLI_FLAG, &o.jsonl, NULL,
                "one conversation object per line; each output line is the\n"
                "same object with \"rendered\" added"),
        CLI_OPT("check", 0, CLI_FLAG, &o.check, NULL,
                "with --jsonl: compare each render with the line's own\n"
                "\"rendered\" and report differences instead of printing"),
        CLI_OPT("no-think", 0, CLI_FLAG, &o.no_think, NULL, "enable_thinking=false (an empty think block after the prompt)"),
        CLI_OPT("no-generation-prompt", 0, CLI_FLAG, &o.no_generation_prompt, NULL, "add_generation_prompt=false"),
        CLI_OPT("model", 'm', CLI_FILE, &o.model, "DIR", "first check that DIR's chat template is one q3 renders"),
        {0},
    };
    cli_spec spec = {CMD, "q3 chat-template [options] [FILE]",
                     "Renders a conversation with Qwen3's chat template, exactly as Hugging Face\n"
                     "transformers' apply_chat_template would. FILE (or stdin, or \"-\") holds an object\n"
                     "{\"messages\", \"tools\", \"add_generation_prompt\", \"enable_thinking\"} or a bare\n"
                     "messages array; add_generation_prompt defaults to true.\n",
                     tab, 1, NULL};
    int n_pos = 0;
    int rc = cli_parse(&spec, argc, argv, &n_pos);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (n_pos) {
        struct stat sb;
        if (strcmp(argv[1], "-") && stat(argv[1], &sb))
            return cli_usage_error(CMD, "%.200s: %s", argv[1], errno == ENOENT ? "no such file or folder" : strerror(errno));
        o.file = argv[1];
    }
    if (o.check && !o.jsonl) return cli_usage_error(CMD, "--check works with --jsonl");

    if (o.model) {
        if (q3_tool_chat_template_check(o.model) != Q3_OK) return cli_error(CMD, "%s", q3_last_error());
    }

    size_t len = 0;
    char *text = read_input(o.file, &len);
    if (!text) return 1;
    if (strlen(text) != len) {
        free(text);
        return cli_error(CMD, "%s: the input contains a NUL byte",
                         o.file && strcmp(o.file, "-") ? o.file : "stdin");
    }
    rc = o.jsonl ? run_jsonl(text, &o) : run_single(text, &o);
    free(text);
    return rc;
}
