/* q3 chat: an interactive conversation. History is kept and templated each
 * turn; the KV cache keeps the prefix the new render shares with the old.
 * Public API only (include/q3.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/gen_common.h"

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static const char *repl_help =
    "  /set temp T | top_p P | top_k K    change sampling from the next answer on\n"
    "  /set system TEXT                   the system message (the conversation starts over)\n"
    "  /set think on|off                  thinking (and Qwen's sampling defaults for the mode)\n"
    "  /clear, /reset                     forget the conversation\n"
    "  /bye, /quit, /exit, Ctrl-D         leave\n"
    "  /help                              this list\n"
    "  \"\"\"                                begin and end a message of several lines\n"
    "  Ctrl-C stops an answer.\n";

static void add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

static cJSON *new_history(const char *system)
{
    cJSON *msgs = cJSON_CreateArray();
    if (system) add_message(msgs, "system", system);
    return msgs;
}

/* The answer as the history keeps it: whole characters only. An answer cut
 * inside a character (-n, Ctrl-C, a full context) ends with a partial UTF-8
 * sequence that the next render could not encode; the streaming detokenizer
 * holds such a tail back (and turns bytes that never form a character into
 * U+FFFD, as the user saw them), so pushing every id without the final flush
 * keeps exactly the whole characters. NULL when out of memory. */
static char *history_text(const q3_tokenizer *tok, const int32_t *ids, int n)
{
    q3_detokenizer *d;
    if (q3_detokenizer_new(tok, &d)) return NULL;
    char *out = calloc(1, 1);
    size_t len = 0;
    for (int i = 0; out && i < n; i++) {
        const char *piece;
        size_t plen;
        if (q3_detokenizer_push(d, ids[i], &piece, &plen)) continue;
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
    q3_detokenizer_free(d);
    return out;
}

/* A /set command: 0 done (said so), 1 refused (said why). */
static int set_command(cli_gen *g, const char *args, char **system, cJSON **history, size_t *n_cached)
{
    char key[32] = "";
    int klen = 0;
    while (*args == ' ') args++;
    while (args[klen] && args[klen] != ' ' && klen < 31) klen++;
    memcpy(key, args, (size_t)klen);
    key[klen] = 0;
    const char *v = args + klen;
    while (*v == ' ') v++;
    long long k;
    double x;
    if (!strcmp(key, "system")) {
        free(*system);
        *system = *v ? strdup(v) : NULL;
        cJSON_Delete(*history);
        *history = new_history(*system);
        q3_session_reset(g->session);
        *n_cached = 0;
        fprintf(stderr, "(system message %s; conversation started over)\n", *system ? "set" : "removed");
        return 0;
    }
    if (!strcmp(key, "think")) {
        if (strcmp(v, "on") && strcmp(v, "off")) {
            fprintf(stderr, "/set think on|off\n");
            return 1;
        }
        g->no_think = !strcmp(v, "off");
    } else if (!strcmp(key, "temp") || !strcmp(key, "temperature")) {
        if (cli_scan_double(v, 0, 1e4, &x)) { fprintf(stderr, "/set temp takes a number in 0..10000\n"); return 1; }
        g->temp = (float)x;
    } else if (!strcmp(key, "top_p") || !strcmp(key, "top-p")) {
        if (cli_scan_double(v, 0, 1, &x)) { fprintf(stderr, "/set top_p takes a number in 0..1\n"); return 1; }
        g->top_p = (float)x;
    } else if (!strcmp(key, "top_k") || !strcmp(key, "top-k")) {
        if (cli_scan_int(v, 0, INT32_MAX, &k)) { fprintf(stderr, "/set top_k takes an integer >= 0\n"); return 1; }
        g->top_k = (int)k;
    } else {
        fprintf(stderr, "/set what? temp, top_p, top_k, system, think\n");
        return 1;
    }
    q3_sampler_free(g->sampler);
    g->sampler = NULL;
    g->seed = (long long)g->seed_used; /* the same seed, not printed again */
    if (cli_gen_sampler(g, !g->no_think)) return 1;
    fprintf(stderr, "(temp %g, top_p %g, top_k %d, thinking %s)\n", (double)g->sp.temperature, (double)g->sp.top_p,
            g->sp.top_k, g->no_think ? "off" : "on");
    return 0;
}

/* Reads a line into *line (no newline). -1 at the end of input, -2 interrupted. */
static ssize_t read_line(char **line, size_t *cap)
{
    errno = 0;
    ssize_t len = getline(line, cap, stdin);
    if (len < 0) return errno == EINTR ? -2 : -1;
    while (len && ((*line)[len - 1] == '\n' || (*line)[len - 1] == '\r')) (*line)[--len] = 0;
    return len;
}

int cmd_chat(int argc, char **argv)
{
    cli_gen g;
    cli_gen_init(&g, "chat");
    const char *system_arg = NULL, *system_file = NULL;
    cli_opt tab[CLI_GEN_N_OPTS + 8] = {
        CLI_OPT("system", 0, CLI_STR, &system_arg, "TEXT", "a system message", .dash = "sys"),
        CLI_OPT("system-prompt", 0, CLI_STR, &system_arg, "TEXT", NULL, .flags = CLI_HIDDEN),
        CLI_OPT("system-file", 0, CLI_FILE, &system_file, "FILE", "the system message from a file"),
    };
    int n = 0;
    while (tab[n].name) n++;
    cli_gen_add_opts(&g, tab + n);
    char notes[1024];
    snprintf(notes, sizeof notes, "In the chat:\n%s", repl_help);
    cli_spec spec = {"chat", "q3 chat -m MODEL [--system TEXT] [options]",
                     "Talks with a model turn by turn: type a message and Enter.\n", tab, 0, notes};
    int rc = cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if ((rc = cli_gen_parsed(&g, &spec))) return rc;
    if (system_arg && system_file) return cli_usage_error("chat", "--system and --system-file exclude each other");
    char *system = NULL;
    if (system_file) {
        size_t len;
        if (!(system = cli_read_path("chat", system_file, &len))) return 1;
    } else if (system_arg) {
        system = strdup(system_arg);
    }
    if ((rc = cli_gen_open(&g)) || (rc = cli_gen_check_template(&g)) || (rc = cli_gen_sampler(&g, !g.no_think))) {
        cli_gen_close(&g);
        free(system);
        return rc;
    }
    int grc = cli_gen_grammar(&g, !g.no_think);
    if (grc) {
        cli_gen_close(&g);
        free(system);
        return grc;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt interrupts the read */
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(STDIN_FILENO);
    cJSON *history = new_history(system);
    int32_t *cached = NULL; /* the ids the KV cache holds, in order */
    size_t n_cached = 0;
    char *line = NULL, *block = NULL;
    size_t cap = 0;
    if (tty)
        fprintf(stderr, "q3 chat: %s (context %d tokens). /help for commands; Ctrl-C stops an answer.\n",
                g.model_path, q3_session_n_ctx(g.session));
    for (;;) {
        if (tty) fputs("\n> ", stdout);
        fflush(stdout);
        interrupted = 0;
        ssize_t len = read_line(&line, &cap);
        if (len == -2) {
            clearerr(stdin);
            fputs("\n(/bye or Ctrl-D to leave)", stderr);
            continue;
        }
        if (len < 0) {
            if (tty) fputc('\n', stdout);
            break;
        }
        if (!len) continue;
        if (strlen(line) != (size_t)len) {
            fprintf(stderr, "q3 chat: the line contains a NUL byte (at offset %zu); it was not sent\n", strlen(line));
            continue;
        }
        const char *text = line;
        if (!strncmp(line, "\"\"\"", 3)) { /* a message of several lines, up to a line ending in """ */
            free(block);
            size_t blen = strlen(line + 3);
            block = malloc(blen + 1);
            if (!block) break;
            memcpy(block, line + 3, blen + 1);
            int closed = blen >= 3 && !strcmp(block + blen - 3, "\"\"\"");
            if (closed) block[blen -= 3] = 0;
            while (!closed) {
                if (tty) fputs(". ", stdout);
                fflush(stdout);
                ssize_t l = read_line(&line, &cap);
                if (l < 0) break;
                size_t ll = (size_t)l;
                closed = ll >= 3 && !strcmp(line + ll - 3, "\"\"\"");
                if (closed) line[ll -= 3] = 0;
                char *grown = realloc(block, blen + ll + 2);
                if (!grown) break;
                block = grown;
                if (blen) block[blen++] = '\n';
                memcpy(block + blen, line, ll + 1);
                blen += ll;
            }
            if (!closed) {
                fprintf(stderr, "q3 chat: the message was not closed with \"\"\"; it was not sent\n");
                if (feof(stdin)) break;
                clearerr(stdin);
                continue;
            }
            if (!blen) continue;
            text = block;
        } else if (line[0] == '/') {
            if (!strcmp(line, "/quit") || !strcmp(line, "/exit") || !strcmp(line, "/bye")) break;
            if (!strcmp(line, "/reset") || !strcmp(line, "/clear")) {
                cJSON_Delete(history);
                history = new_history(system);
                q3_session_reset(g.session);
                n_cached = 0;
                fprintf(stderr, "(conversation forgotten)\n");
            } else if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
                fputs(repl_help, stderr);
            } else if (!strncmp(line, "/set ", 5) || !strcmp(line, "/set")) {
                set_command(&g, line + 4, &system, &history, &n_cached);
            } else {
                fprintf(stderr, "unknown command '%.40s'; the commands are:\n%s", line, repl_help);
            }
            continue;
        }
        add_message(history, "user", text);
        cJSON *conv = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(conv, "messages", history);
        cJSON_AddBoolToObject(conv, "add_generation_prompt", 1);
        if (g.no_think) cJSON_AddBoolToObject(conv, "enable_thinking", 0);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        q3_status st = cli_gen_encode_chat(&g, conv, &ids, &n_ids);
        cJSON_Delete(conv);
        if (st) {
            fprintf(stderr, "q3 chat: %s\n", st == Q3_ERR_NOMEM ? "out of memory" : q3_last_error());
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            free(ids);
            continue;
        }
        cli_gen_print_prompt(&g, ids, n_ids);
        /* reuse the cached prefix; feed only what is new */
        size_t common = 0;
        while (common < n_cached && common < n_ids && cached[common] == ids[common]) common++;
        if (common == n_ids) common--; /* the last prompt token must be fed to get logits */
        q3_session_rewind(g.session, (int)common);
        q3_sampler_reset(g.sampler);
        if (g.grammar) { /* each answer from the grammar's start, in this turn's thinking mode */
            q3_matcher_free(g.matcher);
            g.matcher = NULL;
            if (q3_matcher_new(g.grammar, g.no_think ? 0 : Q3_MATCHER_AFTER_THINK, &g.matcher)) {
                fprintf(stderr, "q3 chat: %s\n", q3_last_error());
                free(ids);
                rc = 1;
                break;
            }
        }
        q3_gen_opts o = {.max_tokens = g.max_tokens, .stop = g.stops, .n_stop = g.n_stops,
                         .interrupt = &interrupted, .on_text = cli_gen_print, .user = &g,
                         .split_channels = 1, .grammar = g.matcher};
        g.in_think = 0;
        q3_gen_result res;
        st = q3_generate(g.session, g.sampler, g.tok, ids + common, n_ids - common, &o, &res);
        if (st == Q3_ERR_CONTEXT) {
            fprintf(stderr, "q3 chat: the context is full (%d tokens): /clear to start a new conversation, or "
                    "restart with a larger --ctx\n", q3_session_n_ctx(g.session));
            q3_session_rewind(g.session, (int)common);
            n_cached = common;
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            free(ids);
            continue;
        }
        if (st) {
            fprintf(stderr, "q3 chat: %s\n", q3_last_error());
            free(ids);
            rc = 1;
            break;
        }
        fputc('\n', stdout);
        cli_gen_print_stats(&g, &res, -1);
        if (res.stop == Q3_STOP_CONTEXT)
            fprintf(stderr, "q3 chat: the context is full: the answer was cut; /clear to start over\n");
        /* the cache now holds the prompt and every generated token but the last */
        size_t keep = n_ids + (res.n_ids > 0 ? (size_t)res.n_ids - 1 : 0);
        int32_t *grown = realloc(cached, (keep + 1) * sizeof *cached);
        if (grown) {
            cached = grown;
            memcpy(cached, ids, n_ids * sizeof *ids);
            if (res.n_ids > 1) memcpy(cached + n_ids, res.ids, ((size_t)res.n_ids - 1) * sizeof *ids);
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
    free(block);
    free(cached);
    free(system);
    cJSON_Delete(history);
    cli_gen_close(&g);
    return rc;
}
