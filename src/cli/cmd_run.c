/* q3 run: one prompt (chat-templated by default) or a whole conversation in,
 * streamed text out; timings on stderr. Public API only (include/q3.h). */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/gen_common.h"

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static cJSON *message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

/* A --messages file as a conversation object (an array is wrapped), checked
 * strictly by the library first (NUL characters, duplicate keys, its shape).
 * NULL after printing why. */
static cJSON *read_conversation(cli_gen *g, const char *path)
{
    size_t len;
    const char *where = strcmp(path, "-") ? path : "stdin";
    char *text = cli_read_path(g->cmd, path, &len);
    if (!text) return NULL;
    if (strlen(text) != len) {
        cli_error(g->cmd, "%s: the file contains a NUL byte (at offset %zu)", where, strlen(text));
        free(text);
        return NULL;
    }
    char *rendered = NULL;
    size_t rlen;
    if (q3_chat_format_json(text, len, &rendered, &rlen)) {
        cli_error(g->cmd, "%s: %s", where, q3_last_error());
        free(text);
        return NULL;
    }
    free(rendered);
    cJSON *conv = cJSON_ParseWithLength(text, len);
    free(text);
    if (cJSON_IsArray(conv)) {
        cJSON *obj = cJSON_CreateObject();
        cJSON_AddItemToObject(obj, "messages", conv);
        conv = obj;
    } else if (!cJSON_IsObject(conv)) {
        cJSON_Delete(conv);
        cli_error(g->cmd, "%s: expected a messages array or a conversation object", where);
        return NULL;
    }
    return conv;
}

int cmd_run(int argc, char **argv)
{
    cli_gen g;
    cli_gen_init(&g, "run");
    const char *prompt = NULL, *prompt_file = NULL, *system = NULL, *system_file = NULL, *messages = NULL;
    int raw = 0;
    cli_opt tab[CLI_GEN_N_OPTS + 16] = {
        CLI_OPT("prompt", 'p', CLI_STR, &prompt, "TEXT", "the user's message (plain text with --raw); '-': stdin"),
        CLI_OPT("file", 'f', CLI_FILE, &prompt_file, "FILE", "the prompt from a file ('-': stdin)", .flags = CLI_STDIN),
        CLI_OPT("system", 0, CLI_STR, &system, "TEXT", "a system message before the prompt", .dash = "sys"),
        CLI_OPT("system-prompt", 0, CLI_STR, &system, "TEXT", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("system-file", 0, CLI_FILE, &system_file, "FILE", "the system message from a file ('-': stdin)", .flags = CLI_STDIN),
        CLI_OPT("messages", 0, CLI_FILE, &messages, "FILE", "a conversation ('-': stdin): an OpenAI-style messages array, or an object\n"
         "{messages, tools, enable_thinking} as q3 chat-template reads", .flags = CLI_STDIN),
        CLI_OPT("raw", 0, CLI_FLAG, &raw, NULL, "plain completion, no chat template"),
        CLI_OPT("output-ids", 0, CLI_FLAG, &g.output_ids, NULL, "print the generated ids as a JSON array on the last line"),
    };
    int n = 0;
    while (tab[n].name) n++;
    cli_gen_add_opts(&g, tab + n);
    cli_spec spec = {
        "run", "q3 run -m MODEL [-p PROMPT | -f FILE | --messages FILE] [options]",
        "Generates from a prompt (chat-templated unless --raw) or a conversation, streaming\n"
        "the text to stdout; timings and the seed to stderr. No prompt option: stdin.\n",
        tab, 0, NULL};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if ((rc = cli_gen_parsed(&g, &spec))) return rc;
    int n_prompt_src = !!prompt + !!prompt_file + !!messages;
    if (n_prompt_src > 1) return cli_usage_error("run", "-p, -f and --messages exclude each other");
    if (messages && (raw || system || system_file))
        return cli_usage_error("run", "--messages goes without --raw, --system and --system-file");
    if (system && system_file) return cli_usage_error("run", "--system and --system-file exclude each other");
    int n_stdin = (prompt && !strcmp(prompt, "-")) + (prompt_file && !strcmp(prompt_file, "-")) +
                  (messages && !strcmp(messages, "-")) + (system_file && !strcmp(system_file, "-")) + !n_prompt_src;
    if (n_stdin > 1) return cli_usage_error("run", "only one input can come from stdin");

    char *prompt_text = NULL, *system_text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    q3_gen_result res = {0};
    cJSON *conv = NULL;
    rc = 1;
    if (!messages) {
        const char *src = prompt_file ? prompt_file : prompt && strcmp(prompt, "-") ? NULL : "-";
        if (src && !strcmp(src, "-") && isatty(STDIN_FILENO) && !prompt)
            return cli_usage_error("run", "no prompt: -p PROMPT, -f FILE, --messages FILE, or text on stdin");
        if (src) {
            size_t len;
            if (!(prompt = prompt_text = cli_read_path("run", src, &len))) goto done;
            if (strlen(prompt) != len) { /* -p cannot carry one either: refuse rather than cut the prompt */
                cli_error("run", "%s: the prompt contains a NUL byte (at offset %zu): q3 takes text without NUL bytes",
                          strcmp(src, "-") ? src : "stdin", strlen(prompt));
                goto done;
            }
        }
    }
    if (system_file) {
        size_t len;
        if (!(system = system_text = cli_read_path("run", system_file, &len))) goto done;
        if (strlen(system) != len) {
            cli_error("run", "%s: the system message contains a NUL byte", system_file);
            goto done;
        }
    }
    if ((rc = cli_gen_open(&g))) goto done;
    rc = 1;
    int thinking = !g.no_think;
    if (raw) {
        if (q3_tokenizer_encode(g.tok, prompt, strlen(prompt), Q3_ENCODE_DEFAULT, &ids, &n_ids)) {
            cli_error("run", "prompt: %s", q3_last_error());
            goto done;
        }
    } else {
        if (cli_gen_check_template(&g)) goto done;
        if (messages) {
            if (!(conv = read_conversation(&g, messages))) goto done;
            const cJSON *et = cJSON_GetObjectItemCaseSensitive(conv, "enable_thinking");
            if (cJSON_IsFalse(et)) thinking = 0;
        } else {
            conv = cJSON_CreateObject();
            cJSON *msgs = cJSON_AddArrayToObject(conv, "messages");
            if (system) cJSON_AddItemToArray(msgs, message("system", system));
            cJSON_AddItemToArray(msgs, message("user", prompt));
        }
        if (g.no_think) {
            cJSON_DeleteItemFromObjectCaseSensitive(conv, "enable_thinking");
            cJSON_AddBoolToObject(conv, "enable_thinking", 0);
        }
        if (cli_gen_encode_chat(&g, conv, &ids, &n_ids)) {
            cli_error("run", "%s%s%s", messages ? messages : "", messages ? ": " : "", q3_last_error());
            goto done;
        }
    }
    if (cli_gen_sampler(&g, thinking)) goto done;
    int grc = cli_gen_grammar(&g, thinking && !raw);
    if (grc) {
        rc = grc;
        goto done;
    }
    cli_gen_print_prompt(&g, ids, n_ids);
    signal(SIGINT, on_sigint);
    q3_gen_opts o = {.max_tokens = g.max_tokens, .stop = g.stops, .n_stop = g.n_stops, .interrupt = &interrupted,
                     .on_text = cli_gen_print, .user = &g, .split_channels = !g.raw, .grammar = g.matcher};
    if (q3_generate(g.session, g.sampler, g.tok, ids, n_ids, &o, &res)) {
        cli_error("run", "%s", q3_last_error());
        goto done;
    }
    cli_gen_print_stats(&g, &res, g.load_s);
    if (g.output_ids) {
        printf("\n[");
        for (int i = 0; i < res.n_ids; i++) printf("%s%d", i ? "," : "", res.ids[i]);
        printf("]\n");
    }
    rc = res.stop == Q3_STOP_INTERRUPT ? 130 : 0;
done:
    cJSON_Delete(conv);
    free(res.ids);
    free(ids);
    free(prompt_text);
    free(system_text);
    cli_gen_close(&g);
    return rc;
}
