/* q3 run: one prompt (chat-templated by default) or a whole conversation in,
 * streamed text out; speeds on stderr. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/gen_common.h"
#include "text/chat_template.h"
#include "text/json_write.h"
#include "util/file.h"

static const char *usage_head =
    "usage: q3 run -m MODEL -p PROMPT [options]\n"
    "       q3 run -m MODEL --messages FILE.json [options]\n"
    "  -p PROMPT              the user's message (or plain text with --raw); '-' or none: stdin\n"
    "  --raw                  plain completion, no chat template\n"
    "  --system TEXT          a system message before the prompt\n"
    "  --messages FILE        a conversation: an OpenAI-style messages array, or an object\n"
    "                         {messages, tools, enable_thinking} as q3 chat-template reads\n"
    "  --output-ids           print the generated ids as a JSON array on the last line\n";

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

/* The prompt's ids: the raw prompt (special tokens parsed), or the rendered
 * conversation (its content as plain text unless --parse-special-in-content). */
static int build_prompt(cli_gen *g, const char *prompt, const char *system, const char *messages_path, int raw,
                        q3_tokens *out)
{
    if (raw) {
        if (q3_tokenizer_encode_append(g->tok, prompt, strlen(prompt), Q3_ENCODE_DEFAULT, out))
            return cli_error(g->cmd, "prompt: %s", q3_last_error());
        return 0;
    }
    if (cli_gen_check_template(g)) return 1;
    cJSON *conv = NULL;
    if (messages_path) {
        char *text;
        size_t len;
        if (q3_read_file(messages_path, 64u << 20, &text, &len)) return cli_error(g->cmd, "%s", q3_last_error());
        size_t nul = strlen(text);
        if (nul != len) {
            free(text);
            return cli_error(g->cmd, "%s: the file contains a NUL byte (at offset %zu)", messages_path, nul);
        }
        q3_status st = q3_json_parse(text, &conv);
        free(text);
        if (st) return cli_error(g->cmd, "%s: %s", messages_path, q3_last_error());
        if (cJSON_IsArray(conv)) {
            cJSON *obj = cJSON_CreateObject();
            cJSON_AddItemToObject(obj, "messages", conv);
            conv = obj;
        } else if (!cJSON_IsObject(conv)) {
            cJSON_Delete(conv);
            return cli_error(g->cmd, "%s: expected a messages array or a conversation object", messages_path);
        }
    } else {
        conv = cJSON_CreateObject();
        cJSON *msgs = cJSON_AddArrayToObject(conv, "messages");
        if (system) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", system);
            cJSON_AddItemToArray(msgs, m);
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", prompt);
        cJSON_AddItemToArray(msgs, m);
    }
    if (g->no_think) {
        cJSON_DeleteItemFromObject(conv, "enable_thinking");
        cJSON_AddBoolToObject(conv, "enable_thinking", 0);
    }
    if (!cJSON_GetObjectItem(conv, "add_generation_prompt")) cJSON_AddBoolToObject(conv, "add_generation_prompt", 1);
    q3_status st = cli_gen_encode_chat(g, conv, out);
    cJSON_Delete(conv);
    if (st) return cli_error(g->cmd, "%s%s%s", messages_path ? messages_path : "", messages_path ? ": " : "",
                             q3_last_error());
    return 0;
}

int cmd_run(int argc, char **argv)
{
    cli_gen g;
    cli_gen_init(&g, "run");
    const char *prompt = NULL, *system = NULL, *messages = NULL;
    int raw = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_gen_option(&g, &i, argc, argv);
        if (r < 0) return 1;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s%s", usage_head, cli_gen_usage);
            return 0;
        }
        if (!strcmp(a, "--raw")) raw = 1;
        else if (!strcmp(a, "--output-ids")) g.output_ids = 1;
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(a, "--system") && i + 1 < argc) system = argv[++i];
        else if (!strcmp(a, "--messages") && i + 1 < argc) messages = argv[++i];
        else return cli_error("run", "unknown option '%s' (q3 run --help)", a);
    }
    if (messages && (prompt || raw)) return cli_error("run", "--messages goes without -p and --raw");
    char *stdin_text = NULL;
    if (!messages && (!prompt || !strcmp(prompt, "-"))) {
        if (isatty(STDIN_FILENO)) return cli_error("run", "no prompt: -p PROMPT, --messages FILE, or text on stdin");
        size_t len;
        prompt = stdin_text = cli_read_stdin("run", &len);
        if (!prompt) return 1;
        if (strlen(prompt) != len) { /* -p cannot carry one either: refuse rather than cut the prompt */
            cli_error("run", "stdin: the prompt contains a NUL byte (at offset %zu): q3 takes text without NUL bytes",
                      strlen(prompt));
            free(stdin_text);
            return 1;
        }
    }
    int rc = 1;
    q3_tokens prompt_ids = {0};
    q3_gen_result res = {0};
    if (cli_gen_open(&g)) goto done;
    if (build_prompt(&g, prompt, system, messages, raw, &prompt_ids)) goto done;
    cli_gen_print_prompt(&g, prompt_ids.ids, prompt_ids.n);
    signal(SIGINT, on_sigint);
    q3_gen_opts o = {.max_tokens = g.max_tokens, .stop = g.stops, .n_stop = g.n_stops, .interrupt = &interrupted,
                     .on_text = cli_gen_print, .user = &g};
    if (q3_generate(g.session, g.sampler, g.tok, prompt_ids.ids, prompt_ids.n, &o, &res)) {
        cli_error("run", "%s", q3_last_error());
        goto done;
    }
    cli_gen_print_stats(&g, &res);
    if (g.output_ids) {
        printf("\n[");
        for (int i = 0; i < res.n_ids; i++) printf("%s%d", i ? "," : "", res.ids[i]);
        printf("]\n");
    }
    rc = res.stop == Q3_STOP_INTERRUPT ? 130 : 0;
done:
    free(res.ids);
    q3_tokens_free(&prompt_ids);
    free(stdin_text);
    cli_gen_close(&g);
    return rc;
}
