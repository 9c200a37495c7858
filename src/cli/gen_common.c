#include "cli/gen_common.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "tools/defaults.h"

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_gen_init(cli_gen *g, const char *cmd)
{
    memset(g, 0, sizeof *g);
    g->cmd = cmd;
    g->temp = g->top_p = g->min_p = g->repeat_penalty = g->presence_penalty = -1e30f;
    g->top_k = -1;
    g->seed = -1;
    g->ended_line = 1;
}

int cli_gen_add_opts(cli_gen *g, cli_opt *t)
{
    const cli_opt o[] = {
        CLI_OPT("model", 'm', CLI_FILE, &g->model_path, "PATH", "a Hugging Face folder or a .gguf", .flags = CLI_REQUIRED),
        CLI_OPT("tokenizer", 0, CLI_FILE, &g->tokenizer_path, "PATH", "tokenizer.json (or its folder) when the model has none"),
        CLI_OPT("threads", 't', CLI_INT, &g->so.n_threads, "N", "CPU threads (default: one per physical core, or $Q3_THREADS)", .lo = 1, .hi = 256),
        CLI_OPT("ctx-size", 'c', CLI_INT, &g->so.n_ctx, "N", "context length (default: min(model, 4096)); --ctx too", .lo = 1, .hi = CLI_MAX_CTX),
        CLI_OPT("ctx", 0, CLI_INT, &g->so.n_ctx, "N", NULL, .lo = 1, .hi = CLI_MAX_CTX, .flags = CLI_HIDDEN),
        CLI_OPT("chunk", 0, CLI_INT, &g->so.chunk, "N", "prefill chunk in tokens (default 128)", .lo = 1, .hi = 4096),
        CLI_OPT("backend", 0, CLI_STR, &g->so.backend, "UNIT", "compute unit: cpu or ref (default: the best present)"),
        CLI_OPT("kv", 0, CLI_STR, &g->so.kv_dtype, "TYPE", "KV cache type: f32, f16, bf16 or q8_0 (default f16 on cpu)"),
        CLI_OPT("n-predict", 'n', CLI_INT, &g->max_tokens, "N", "at most N new tokens (default: until the end of the turn or context)", .lo = 1, .hi = CLI_MAX_CTX),
        CLI_OPT("temp", 0, CLI_FLOAT, &g->temp, "T", "temperature; 0 is greedy (defaults: Qwen's, per thinking mode,\n"
                                                 "under the model's generation_config.json)", .hi = 1e4),
        CLI_OPT("top-k", 0, CLI_INT, &g->top_k, "K", "keep the K most likely tokens (0: off)", .hi = INT32_MAX),
        CLI_OPT("top-p", 0, CLI_FLOAT, &g->top_p, "P", "nucleus sampling (1: off)", .hi = 1),
        CLI_OPT("min-p", 0, CLI_FLOAT, &g->min_p, "P", "drop tokens below P x the top probability (0: off)", .hi = 1),
        CLI_OPT("repeat-penalty", 0, CLI_FLOAT, &g->repeat_penalty, "R", "penalize the last 64 tokens (1: off)", .lo = 1e-3, .hi = 1e3),
        CLI_OPT("presence-penalty", 0, CLI_FLOAT, &g->presence_penalty, "P", "subtract P from seen tokens' logits (0: off)", .lo = -1e3, .hi = 1e3),
        CLI_OPT("seed", 's', CLI_LLONG, &g->seed, "N", "sampling seed (default: random, printed to stderr)", .hi = (double)LLONG_MAX),
        CLI_OPT("stop", 0, CLI_STRS, g->stops, "STR", "stop when STR appears (repeatable)", .hi = CLI_MAX_STOPS, .count = &g->n_stops),
        CLI_OPT("no-think", 0, CLI_FLAG, &g->no_think, NULL, "no thinking (an empty think block is added)"),
        CLI_OPT("hide-think", 0, CLI_FLAG, &g->hide_think, NULL, "do not print the thinking"),
        CLI_OPT("no-perf", 0, CLI_FLAG, &g->no_perf, NULL, "do not print the timings"),
        CLI_OPT("parse-special-in-content", 0, CLI_FLAG, &g->parse_special_in_content, NULL, "let message content hold special tokens: \"<|im_end|>\" in a message\n"
         "becomes the control token (the reference's behaviour; unsafe: by\n"
         "default content is plain text, only the template's markup is special)"),
        CLI_OPT("verbose-prompt", 0, CLI_FLAG, &g->verbose_prompt, NULL, "print the prompt's token ids to stderr first"),
        CLI_OPT("no-warmup", 0, CLI_FLAG, &g->no_warmup, NULL, "no warm-up decode step at load (the first prompt's time then\n"
                "includes reading the weights from disk)"),
        CLI_OPT("grammar", 0, CLI_STR, &g->grammar_text, "GBNF", "constrain the answer to a GBNF grammar (llama.cpp's syntax)"),
        CLI_OPT("grammar-file", 0, CLI_FILE, &g->grammar_file, "FILE", "the same from a file"),
        CLI_OPT("json-schema", 'j', CLI_STR, &g->schema_text, "SCHEMA", "constrain the answer to JSON valid against a JSON Schema\n"
         "(docs/structured-output.md: what is supported; '{}': any JSON)"),
        CLI_OPT("json-schema-file", 0, CLI_FILE, &g->schema_file, "FILE", "the same from a file"),
    };
    size_t n = sizeof o / sizeof o[0];
    memcpy(t, o, sizeof o);
    return (int)n + cli_llama_add_opts(&g->llama, &g->so.chunk, t + n);
}

int cli_gen_parsed(cli_gen *g, const cli_spec *s)
{
    return cli_llama_apply(s, &g->llama, &g->so.kv_dtype);
}

int cli_open_tokenizer(const char *cmd, const char *path, q3_model *m, q3_tokenizer **tok)
{
    if (path) return q3_tokenizer_load(path, tok) ? cli_error(cmd, "%s", q3_last_error()) : 0;
    if (q3_tokenizer_for_model(m, tok)) {
        const char *dflt = q3_default_tokenizer_dir();
        return cli_error(cmd, "%s: pass --tokenizer PATH (the built-in one is %s)", q3_last_error(),
                         dflt ? dflt : "not fetched: make deps");
    }
    return 0;
}

int cli_gen_open(cli_gen *g)
{
    double t0 = cli_now();
    if (q3_model_open(g->model_path, &g->model)) return cli_error(g->cmd, "%s", q3_last_error());
    if (g->so.n_ctx > q3_model_max_context(g->model)) /* the flag's range depends on the model: still a usage error */
        return cli_usage_error(g->cmd, "-c/--ctx-size %d is more than this model's context (%d)", g->so.n_ctx,
                               q3_model_max_context(g->model));
    if (cli_open_tokenizer(g->cmd, g->tokenizer_path, g->model, &g->tok)) return 1;
    if (q3_tokenizer_vocab_size(g->tok) > q3_model_vocab_size(g->model))
        return cli_error(g->cmd, "the tokenizer has %d tokens but the model's vocabulary is %d: they do not belong "
                         "together (a model with no tokenizer of its own, such as q3 synth --preset tiny, is run by "
                         "token ids: q3 logits --tokens 1,2,3, q3 bench)",
                         q3_tokenizer_vocab_size(g->tok), q3_model_vocab_size(g->model));
    if (q3_session_new(g->model, &g->so, &g->session)) return cli_error(g->cmd, "%s", q3_last_error());
    if (!g->no_warmup) {
        double tw = cli_now();
        float *logits = malloc((size_t)q3_model_vocab_size(g->model) * sizeof *logits);
        int32_t tok = q3_tokenizer_end_of_text(g->tok);
        if (tok < 0 || tok >= q3_model_vocab_size(g->model)) tok = 0;
        q3_status st = logits ? q3_session_decode(g->session, tok, logits) : Q3_ERR_NOMEM;
        free(logits);
        q3_session_reset(g->session);
        if (st) return cli_error(g->cmd, "warm-up: %s", st == Q3_ERR_NOMEM ? "out of memory" : q3_last_error());
        g->warmup_s = cli_now() - tw;
    }
    g->color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR");
    g->load_s = cli_now() - t0;
    return 0;
}

/* generation_config.json of a model folder over p (the fields q3's sampler
 * has); a file that is absent or not JSON changes nothing. */
static void apply_generation_config(const char *model_path, q3_sampler_params *p)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/generation_config.json", model_path);
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) return;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_ParseWithLength(buf, n);
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "temperature")) && cJSON_IsNumber(v) && v->valuedouble >= 0)
        p->temperature = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "top_p")) && cJSON_IsNumber(v) && v->valuedouble >= 0 &&
        v->valuedouble <= 1)
        p->top_p = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "top_k")) && cJSON_IsNumber(v) && v->valuedouble >= 0 &&
        v->valuedouble <= INT32_MAX)
        p->top_k = (int)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "min_p")) && cJSON_IsNumber(v) && v->valuedouble >= 0 &&
        v->valuedouble <= 1)
        p->min_p = (float)v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "repetition_penalty")) && cJSON_IsNumber(v) && v->valuedouble > 0)
        p->repeat_penalty = (float)v->valuedouble;
    cJSON_Delete(j);
}

int cli_gen_sampler(cli_gen *g, int thinking)
{
    q3_sampler_params sp = q3_sampler_defaults(thinking);
    struct stat st;
    if (thinking && !stat(g->model_path, &st) && S_ISDIR(st.st_mode)) apply_generation_config(g->model_path, &sp);
    if (g->temp > -1e29f) sp.temperature = g->temp;
    if (g->top_k >= 0) sp.top_k = g->top_k;
    if (g->top_p > -1e29f) sp.top_p = g->top_p;
    if (g->min_p > -1e29f) sp.min_p = g->min_p;
    if (g->repeat_penalty > -1e29f) sp.repeat_penalty = g->repeat_penalty;
    if (g->presence_penalty > -1e29f) sp.presence_penalty = g->presence_penalty;
    if (g->seed >= 0) {
        sp.seed = (uint64_t)g->seed;
    } else {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
            r = (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid() ^ (uint64_t)(cli_now() * 1e9);
        sp.seed = r & (uint64_t)LLONG_MAX; /* what --seed accepts */
        if (sp.temperature > 0)
            fprintf(stderr, "q3 %s: seed %llu (--seed %llu repeats this run)\n", g->cmd, (unsigned long long)sp.seed,
                    (unsigned long long)sp.seed);
    }
    g->sp = sp;
    g->seed_used = sp.seed;
    if (q3_sampler_new(&sp, q3_model_vocab_size(g->model), &g->sampler)) return cli_error(g->cmd, "%s", q3_last_error());
    return 0;
}

int cli_gen_check_template(cli_gen *g)
{
    int present;
    if (q3_model_chat_template_check(g->model, &present))
        return cli_error(g->cmd, "%s (use --raw to skip the chat template)", q3_last_error());
    if (!present) fprintf(stderr, "q3 %s: %s has no chat template; using Qwen3's\n", g->cmd, g->model_path);
    return 0;
}

q3_status cli_gen_encode_chat(const cli_gen *g, const cJSON *conversation, int32_t **ids, size_t *n)
{
    char *text = cJSON_PrintUnformatted(conversation);
    *ids = NULL;
    *n = 0;
    if (!text) return Q3_ERR_NOMEM;
    q3_status st = q3_chat_tokenize_json(g->tok, text, strlen(text),
                                         g->parse_special_in_content ? Q3_CHAT_PARSE_SPECIAL_IN_CONTENT : 0, ids, n);
    free(text);
    return st;
}

void cli_gen_print_prompt(const cli_gen *g, const int32_t *ids, size_t n)
{
    if (!g->verbose_prompt) return;
    fprintf(stderr, "prompt: %zu tokens\n", n);
    for (size_t i = 0; i < n; i++) {
        char *t = NULL;
        size_t len = 0;
        if (q3_tokenizer_decode(g->tok, ids + i, 1, &t, &len)) len = 0;
        fprintf(stderr, "%6d -> '", (int)ids[i]);
        for (size_t k = 0; k < len; k++) {
            unsigned char c = (unsigned char)t[k];
            if (c == '\n') fputs("\\n", stderr);
            else if (c == '\\' || c == '\'') fprintf(stderr, "\\%c", c);
            else if (c < 0x20 || c == 0x7F) fprintf(stderr, "\\x%02X", c);
            else fputc(c, stderr);
        }
        free(t);
        fputs(q3_tokenizer_is_special(g->tok, ids[i]) ? "' (special)\n" : "'\n", stderr);
    }
}

void cli_gen_print(void *user, const q3_text_piece *p)
{
    cli_gen *g = user;
    int thinking = p->channel == Q3_CHANNEL_THINKING;
    if (thinking && g->hide_think) return;
    switch (p->edge) {
    case Q3_EDGE_OPEN:
        if (thinking) {
            g->in_think = 1;
            fputs(g->color ? "\033[2m<think>\n" : "<think>\n", stdout);
        } else if (p->channel == Q3_CHANNEL_TOOL_CALL) {
            fputs("<tool_call>", stdout);
        }
        break;
    case Q3_EDGE_CLOSE:
    case Q3_EDGE_CUT:
        if (thinking) {
            g->in_think = 0;
            fputs(p->edge == Q3_EDGE_CLOSE ? "\n</think>\n\n" : "\n", stdout);
            if (g->color) fputs("\033[0m", stdout);
        } else if (p->channel == Q3_CHANNEL_TOOL_CALL && p->edge == Q3_EDGE_CLOSE) {
            fputs("</tool_call>", stdout);
        }
        break;
    case Q3_EDGE_NONE:
        fwrite(p->text, 1, p->len, stdout);
        if (p->len) g->ended_line = p->text[p->len - 1] == '\n';
        break;
    }
    if (p->edge != Q3_EDGE_NONE) g->ended_line = 0;
    fflush(stdout);
}

/* "  12.34 ms /    10 tokens (    1.23 ms per token,   810.37 tokens per second)" */
static void timing_line(const char *what, double s, int n, const char *unit)
{
    double ms = 1e3 * s;
    fprintf(stderr, "q3: %-16s = %10.2f ms / %5d %-6s (%8.2f ms per token, %8.2f tokens per second)\n", what, ms, n,
            unit, n > 0 ? ms / n : 0.0, s > 0 ? n / s : 0.0);
}

void cli_gen_print_stats(const cli_gen *g, const q3_gen_result *r, double load_s)
{
    if (g->in_think && g->color) fputs("\033[0m", stdout);
    /* on a terminal, the shell's prompt starts on a line of its own; a pipe gets the text as generated */
    if (!g->ended_line && isatty(STDOUT_FILENO)) fputc('\n', stdout);
    fflush(stdout);
    if (g->no_perf) return;
    /* the first generated token comes from the prompt's logits; each later
     * one took a decode run of the token before it */
    int runs = r->n_ids > 1 ? r->n_ids - 1 : 0;
    fputc('\n', stderr);
    if (load_s >= 0 && g->warmup_s > 0)
        fprintf(stderr, "q3: %-16s = %10.2f ms (warm-up decode step %.2f ms: weights paged in before the prompt)\n",
                "load time", 1e3 * load_s, 1e3 * g->warmup_s);
    else if (load_s >= 0)
        fprintf(stderr, "q3: %-16s = %10.2f ms\n", "load time", 1e3 * load_s);
    timing_line("prompt eval time", r->prefill_s, r->n_prompt, "tokens");
    timing_line("eval time", r->decode_s, runs, "runs");
    double total = (load_s > 0 ? load_s : 0) + r->prefill_s + r->decode_s;
    fprintf(stderr, "q3: %-16s = %10.2f ms / %5d tokens\n", "total time", 1e3 * total, r->n_prompt + r->n_ids);
    fprintf(stderr, "q3: generated %d tokens, stop: %s, seed %llu, %s\n", r->n_ids, q3_stop_reason_name(r->stop),
            (unsigned long long)g->seed_used, g->sp.temperature > 0 ? "sampled" : "greedy");
}

int cli_gen_grammar(cli_gen *g, int thinking)
{
    int given = !!g->grammar_text + !!g->grammar_file + !!g->schema_text + !!g->schema_file;
    if (!given) return 0;
    if (given > 1)
        return cli_usage_error(g->cmd, "--grammar, --grammar-file, --json-schema and --json-schema-file exclude each other");
    q3_grammar_kind kind = g->grammar_text || g->grammar_file ? Q3_GRAMMAR_GBNF : Q3_GRAMMAR_JSON_SCHEMA;
    const char *file = g->grammar_file ? g->grammar_file : g->schema_file;
    char *owned = NULL;
    const char *text = g->grammar_text ? g->grammar_text : g->schema_text;
    size_t len = text ? strlen(text) : 0;
    if (file && !(text = owned = cli_read_path(g->cmd, file, &len))) return 1;
    q3_status st = q3_grammar_compile(g->tok, kind, text, len, &g->grammar);
    free(owned);
    if (st) {
        cli_error(g->cmd, "%s%s%s", file ? file : "", file ? ": " : "", q3_last_error());
        return st == Q3_ERR_INVALID || st == Q3_ERR_UNSUPPORTED ? 2 : 1;
    }
    if (q3_matcher_new(g->grammar, thinking ? Q3_MATCHER_AFTER_THINK : 0, &g->matcher))
        return cli_error(g->cmd, "%s", q3_last_error());
    return 0;
}

void cli_gen_close(cli_gen *g)
{
    q3_matcher_free(g->matcher);
    q3_grammar_free(g->grammar);
    q3_sampler_free(g->sampler);
    q3_session_free(g->session);
    q3_tokenizer_free(g->tok);
    q3_model_close(g->model);
}
