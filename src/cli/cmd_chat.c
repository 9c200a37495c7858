/* q3 chat: an interactive conversation. History is kept and templated each
 * turn; the KV cache keeps the prefix the new render shares with the old. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/gen_common.h"
#include "text/chat_template.h"

static const char *usage_head =
    "usage: q3 chat -m MODEL [--system TEXT] [options]\n"
    "  type a message and Enter; /reset forgets the conversation, /quit (or Ctrl-D) leaves;\n"
    "  Ctrl-C stops the current answer.\n";

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static cJSON *new_history(const char *system)
{
    cJSON *msgs = cJSON_CreateArray();
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(msgs, m);
    }
    return msgs;
}

static void add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* The answer as the history keeps it: whole characters only. An answer cut
 * inside a character (-n, Ctrl-C, a full context) ends with a partial UTF-8
 * sequence that the next render could not encode; the streaming detokenizer
 * holds such a tail back (and turns bytes that never form a character into
 * U+FFFD, as the user saw them), so pushing every id without the final flush
 * keeps exactly the whole characters. NULL when out of memory. */
static char *history_text(const q3_tokenizer *tok, const int32_t *ids, int n)
{
    q3_detok d;
    q3_detok_init(&d, tok);
    char *out = calloc(1, 1);
    size_t len = 0;
    for (int i = 0; out && i < n; i++) {
        const char *piece;
        size_t plen;
        if (q3_detok_push(&d, ids[i], &piece, &plen)) continue;
        char *grown = plen ? realloc(out, len + plen + 1) : out;
        if (!grown) {
            free(out);
            out = NULL;
            break;
        }
        out = grown;
        memcpy(out + len, piece, plen);
        len += plen;
        out[len] = 0;
    }
    q3_detok_free(&d);
    return out;
}

int cmd_chat(int argc, char **argv)
{
    cli_gen g;
    cli_gen_init(&g, "chat");
    const char *system = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_gen_option(&g, &i, argc, argv);
        if (r < 0) return 1;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s%s", usage_head, cli_gen_usage);
            return 0;
        }
        if (!strcmp(argv[i], "--system") && i + 1 < argc) system = argv[++i];
        else return cli_error("chat", "unknown option '%s' (q3 chat --help)", argv[i]);
    }
    if (cli_gen_open(&g) || cli_gen_check_template(&g)) {
        cli_gen_close(&g);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt interrupts the read */
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(STDIN_FILENO);
    cJSON *history = new_history(system);
    int32_t *cached = NULL; /* the ids the KV cache holds, in order */
    size_t n_cached = 0;
    char *line = NULL;
    size_t cap = 0;
    if (tty)
        fprintf(stderr, "q3 chat: %s (context %d tokens). /reset, /quit; Ctrl-C stops an answer.\n", g.model_path,
                q3_session_n_ctx(g.session));
    for (;;) {
        if (tty) fputs("\n> ", stdout);
        fflush(stdout);
        interrupted = 0;
        errno = 0;
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) {
            if (errno == EINTR) {
                clearerr(stdin);
                fputs("\n(/quit or Ctrl-D to leave)", stderr);
                continue;
            }
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (strlen(line) != (size_t)len) {
            fprintf(stderr, "q3 chat: the line contains a NUL byte (at offset %zu); it was not sent\n", strlen(line));
            continue;
        }
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            cJSON_Delete(history);
            history = new_history(system);
            q3_session_reset(g.session);
            n_cached = 0;
            fprintf(stderr, "(conversation forgotten)\n");
            continue;
        }
        if (!strcmp(line, "/help")) {
            fprintf(stderr, "/reset forgets the conversation; /quit leaves; Ctrl-C stops an answer\n");
            continue;
        }
        add_message(history, "user", line);
        cJSON *conv = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(conv, "messages", history);
        cJSON_AddBoolToObject(conv, "add_generation_prompt", 1);
        if (g.no_think) cJSON_AddBoolToObject(conv, "enable_thinking", 0);
        q3_tokens toks = {0};
        q3_status st = cli_gen_encode_chat(&g, conv, &toks);
        cJSON_Delete(conv);
        int32_t *ids = toks.ids;
        size_t n = toks.n;
        if (st) {
            fprintf(stderr, "q3 chat: %s\n", q3_last_error());
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            free(ids);
            continue;
        }
        cli_gen_print_prompt(&g, ids, n);
        /* reuse the cached prefix; feed only what is new */
        size_t common = 0;
        while (common < n_cached && common < n && cached[common] == ids[common]) common++;
        if (common == n) common--; /* the last prompt token must be fed to get logits */
        q3_session_rewind(g.session, (int)common);
        q3_sampler_reset(g.sampler);
        q3_gen_opts o = {.max_tokens = g.max_tokens, .stop = g.stops, .n_stop = g.n_stops,
                         .interrupt = &interrupted, .on_text = cli_gen_print, .user = &g};
        g.in_think = 0;
        q3_gen_result res;
        st = q3_generate(g.session, g.sampler, g.tok, ids + common, n - common, &o, &res);
        if (st == Q3_ERR_CONTEXT) {
            fprintf(stderr, "q3 chat: the context is full (%d tokens): /reset to start a new conversation, or "
                    "restart with a larger --ctx\n", q3_session_n_ctx(g.session));
            q3_session_rewind(g.session, (int)common);
            n_cached = common;
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            free(ids);
            continue;
        }
        if (st) {
            fprintf(stderr, "q3 chat: %s\n", q3_last_error());
            break;
        }
        fputc('\n', stdout);
        cli_gen_print_stats(&g, &res);
        if (res.stop == Q3_STOP_CONTEXT)
            fprintf(stderr, "q3 chat: the context is full: the answer was cut; /reset to start over\n");
        /* the cache now holds the prompt and every generated token but the last */
        size_t keep = n + (res.n_ids > 0 ? (size_t)res.n_ids - 1 : 0);
        int32_t *grown = realloc(cached, (keep + 1) * sizeof *cached);
        if (grown) {
            cached = grown;
            memcpy(cached, ids, n * sizeof *ids);
            if (res.n_ids > 1) memcpy(cached + n, res.ids, ((size_t)res.n_ids - 1) * sizeof *ids);
            n_cached = keep;
        } else {
            n_cached = 0; /* no record of the cache: the next turn feeds the whole conversation */
        }
        int n_text = res.n_ids;
        if (res.stop == Q3_STOP_END_OF_TURN) n_text--;
        char *answer = history_text(g.tok, res.ids, n_text);
        add_message(history, "assistant", answer ? answer : "");
        free(answer);
        free(res.ids);
        free(ids);
    }
    free(line);
    free(cached);
    cJSON_Delete(history);
    cli_gen_close(&g);
    return 0;
}
