#include "cli/gen_common.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/defaults.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer_gguf.h"
#include "util/file.h"

const char *cli_gen_usage =
    "model and session:\n"
    "  -m, --model PATH       a Hugging Face folder (or .gguf)\n"
    "  --tokenizer PATH       tokenizer.json (or its folder) when the model has none\n"
    "  --ctx N                context length (default: min(model, 4096))\n"
    "  --chunk N              prefill chunk (default 128)\n"
    "  --backend UNIT         compute unit (default: the best present)\n"
    "  --kv f32|f16|bf16      KV cache type\n"
    "generation:\n"
    "  -n N                   at most N new tokens (default: until the end of the turn or context)\n"
    "  --temp T --top-k K --top-p P --min-p P   sampling (defaults: Qwen's, per thinking mode;\n"
    "                         --temp 0 is greedy)\n"
    "  --repeat-penalty R --presence-penalty P --seed S\n"
    "  --stop STR             stop when STR appears (repeatable)\n"
    "  --no-think             no thinking (an empty think block is added)\n"
    "  --hide-think           do not print the thinking\n"
    "  --parse-special-in-content   let message content hold special tokens: \"<|im_end|>\" in a\n"
    "                         message becomes the control token (the reference's behaviour; unsafe:\n"
    "                         by default content is plain text, only the template's markup is special)\n"
    "  --verbose-prompt       print the prompt's token ids to stderr before generating\n";

void cli_gen_init(cli_gen *g, const char *cmd)
{
    memset(g, 0, sizeof *g);
    g->cmd = cmd;
    g->temp = g->top_p = g->min_p = g->repeat_penalty = g->presence_penalty = -1e30f;
    g->top_k = -1;
    g->seed = -1;
    g->think_open = g->think_close = -2;
}

int cli_gen_option(cli_gen *g, int *i, int argc, char **argv)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--no-think")) { g->no_think = 1; return 1; }
    if (!strcmp(a, "--hide-think")) { g->hide_think = 1; return 1; }
    if (!strcmp(a, "--parse-special-in-content")) { g->parse_special_in_content = 1; return 1; }
    if (!strcmp(a, "--verbose-prompt")) { g->verbose_prompt = 1; return 1; }
    static const char *valued[] = {"-m", "--model", "--tokenizer", "--ctx", "--chunk", "--backend", "--kv", "-n",
                                   "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                                   "--presence-penalty", "--seed", "--stop", NULL};
    int known = 0;
    for (int k = 0; valued[k]; k++) known |= !strcmp(a, valued[k]);
    if (!known) return 0;
    if (*i + 1 >= argc) {
        cli_error(g->cmd, "option '%s' needs a value", a);
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) { g->model_path = v; return 1; }
    if (!strcmp(a, "--tokenizer")) { g->tokenizer_path = v; return 1; }
    if (!strcmp(a, "--backend")) { g->so.backend = v; return 1; }
    if (!strcmp(a, "--kv")) { g->so.kv_dtype = v; return 1; }
    if (!strcmp(a, "--stop")) {
        if (g->n_stops == CLI_MAX_STOPS) { cli_error(g->cmd, "at most %d --stop strings", CLI_MAX_STOPS); return -1; }
        g->stops[g->n_stops++] = v;
        return 1;
    }
    /* numbers: strictly, in the ranges the session and the sampler accept */
    long long n = 0;
    double x = 0;
    int bad;
    if (!strcmp(a, "--ctx")) bad = cli_parse_int(g->cmd, a, v, 1, CLI_MAX_CTX, &n), g->so.n_ctx = (int)n;
    else if (!strcmp(a, "--chunk")) bad = cli_parse_int(g->cmd, a, v, 1, 4096, &n), g->so.chunk = (int)n;
    else if (!strcmp(a, "-n")) bad = cli_parse_int(g->cmd, a, v, 1, CLI_MAX_CTX, &n), g->max_tokens = (int)n;
    else if (!strcmp(a, "--top-k")) bad = cli_parse_int(g->cmd, a, v, 0, INT32_MAX, &n), g->top_k = (int)n;
    else if (!strcmp(a, "--seed")) bad = cli_parse_int(g->cmd, a, v, 0, LLONG_MAX, &n), g->seed = n;
    else if (!strcmp(a, "--temp")) bad = cli_parse_double(g->cmd, a, v, 0, 1e4, &x), g->temp = (float)x;
    else if (!strcmp(a, "--top-p")) bad = cli_parse_double(g->cmd, a, v, 0, 1, &x), g->top_p = (float)x;
    else if (!strcmp(a, "--min-p")) bad = cli_parse_double(g->cmd, a, v, 0, 1, &x), g->min_p = (float)x;
    else if (!strcmp(a, "--repeat-penalty"))
        bad = cli_parse_double(g->cmd, a, v, 1e-3, 1e3, &x), g->repeat_penalty = (float)x;
    else /* --presence-penalty */
        bad = cli_parse_double(g->cmd, a, v, -1e3, 1e3, &x), g->presence_penalty = (float)x;
    return bad ? -1 : 1;
}

/* tokenizer.json beside the model, --tokenizer (a file or a folder), or a GGUF's own. */
static int open_tokenizer(cli_gen *g)
{
    char p[PATH_MAX];
    const char *src = g->tokenizer_path;
    if (src) {
        if (q3_is_dir(src)) {
            snprintf(p, sizeof p, "%s/tokenizer.json", src);
            src = p;
        }
    } else if (q3_is_dir(g->model_path)) {
        snprintf(p, sizeof p, "%s/tokenizer.json", g->model_path);
        int present;
        if (q3_regular_or_absent(p, &present)) return cli_error(g->cmd, "%s", q3_last_error());
        if (!present)
            return cli_error(g->cmd, "%s has no tokenizer.json: pass --tokenizer PATH (the built-in one is %s)",
                             g->model_path, cli_default_tokenizer_dir() ? cli_default_tokenizer_dir() : "not fetched: make deps");
        src = p;
    } else {
        /* a GGUF carries its own tokenizer */
        if (!g->model->gguf || q3_tokenizer_load_gguf(g->model->gguf, &g->tok))
            return cli_error(g->cmd, "%s (pass --tokenizer PATH)", q3_last_error());
        return 0;
    }
    if (q3_tokenizer_load(src, &g->tok)) return cli_error(g->cmd, "%s", q3_last_error());
    return 0;
}

int cli_gen_open(cli_gen *g)
{
    if (!g->model_path) return cli_error(g->cmd, "no model given (-m MODEL)");
    if (q3_model_open(g->model_path, &g->model)) return cli_error(g->cmd, "%s", q3_last_error());
    if (open_tokenizer(g)) return 1;
    if (q3_tokenizer_vocab_size(g->tok) > q3_model_vocab_size(g->model))
        return cli_error(g->cmd, "the tokenizer has %d tokens but the model's vocabulary is %d",
                         q3_tokenizer_vocab_size(g->tok), q3_model_vocab_size(g->model));
    if (q3_session_new(g->model, &g->so, &g->session)) return cli_error(g->cmd, "%s", q3_last_error());
    q3_sampler_params sp = q3_sampler_defaults(!g->no_think);
    if (g->temp > -1e29f) sp.temperature = g->temp;
    if (g->top_k >= 0) sp.top_k = g->top_k;
    if (g->top_p > -1e29f) sp.top_p = g->top_p;
    if (g->min_p > -1e29f) sp.min_p = g->min_p;
    if (g->repeat_penalty > -1e29f) sp.repeat_penalty = g->repeat_penalty;
    if (g->presence_penalty > -1e29f) sp.presence_penalty = g->presence_penalty;
    if (g->seed >= 0) sp.seed = (uint64_t)g->seed;
    if (q3_sampler_new(&sp, q3_model_vocab_size(g->model), &g->sampler)) return cli_error(g->cmd, "%s", q3_last_error());
    g->think_open = q3_tokenizer_token_id(g->tok, "<think>", 7);
    g->think_close = q3_tokenizer_token_id(g->tok, "</think>", 8);
    g->color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR");
    return 0;
}

int cli_gen_check_template(cli_gen *g)
{
    if (!q3_is_dir(g->model_path)) { /* a GGUF: its tokenizer.chat_template */
        q3_gguf_tokenizer_info info;
        if (!g->model->gguf || q3_gguf_tokenizer_info_read(g->model->gguf, &info))
            return cli_error(g->cmd, "%s", q3_last_error());
        if (info.template_kind != Q3_CHAT_TEMPLATE_QWEN3) {
            if (!info.chat_template) {
                fprintf(stderr, "q3 %s: %s has no chat template; using Qwen3's\n", g->cmd, g->model_path);
                return 0;
            }
            return cli_error(g->cmd, "%s: its chat template is not one q3 knows (use --raw to skip templating)",
                             g->model_path);
        }
        return 0;
    }
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", g->model_path);
    char j[PATH_MAX];
    snprintf(j, sizeof j, "%s/chat_template.jinja", g->model_path);
    int has_config, has_jinja; /* a FIFO or a device there is an error, not "no template" */
    if (q3_regular_or_absent(p, &has_config) || q3_regular_or_absent(j, &has_jinja))
        return cli_error(g->cmd, "%s", q3_last_error());
    if (!has_config && !has_jinja) {
        fprintf(stderr, "q3 %s: %s has no chat template; using Qwen3's\n", g->cmd, g->model_path);
        return 0;
    }
    q3_chat_template_kind kind;
    if (q3_chat_template_load(g->model_path, &kind))
        return cli_error(g->cmd, "%s (use --raw to skip the chat template)", q3_last_error());
    return 0;
}

q3_status cli_gen_encode_chat(const cli_gen *g, const cJSON *conversation, q3_tokens *out)
{
    return q3_chat_encode(g->tok, conversation, g->parse_special_in_content ? Q3_CHAT_PARSE_SPECIAL_IN_CONTENT : 0,
                          out);
}

void cli_gen_print_prompt(const cli_gen *g, const int32_t *ids, size_t n)
{
    if (!g->verbose_prompt) return;
    fprintf(stderr, "prompt: %zu tokens\n", n);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const unsigned char *t = (const unsigned char *)q3_tokenizer_token_bytes(g->tok, ids[i], &len);
        fprintf(stderr, "%6d -> '", (int)ids[i]);
        for (size_t k = 0; k < len; k++) {
            if (t[k] == '\n') fputs("\\n", stderr);
            else if (t[k] == '\\' || t[k] == '\'') fprintf(stderr, "\\%c", t[k]);
            else if (t[k] < 0x20 || t[k] == 0x7F) fprintf(stderr, "\\x%02X", t[k]);
            else fputc(t[k], stderr);
        }
        fputs(q3_tokenizer_is_special(g->tok, ids[i]) ? "' (special)\n" : "'\n", stderr);
    }
}

void cli_gen_print(void *user, int32_t id, const char *text, size_t len)
{
    cli_gen *g = user;
    if (id == g->think_open) {
        g->in_think = 1;
        if (g->hide_think) return;
        if (g->color) { fputs("\033[2m", stdout); }
    }
    if (g->in_think && g->hide_think) {
        if (id == g->think_close) { g->in_think = 0; g->after_think = 1; }
        return;
    }
    if (g->after_think && g->hide_think) { /* drop the blank lines after a hidden think block */
        while (len && (*text == '\n')) { text++; len--; }
        if (!len) return;
        g->after_think = 0;
    }
    fwrite(text, 1, len, stdout);
    if (id == g->think_close && g->in_think) {
        g->in_think = 0;
        if (g->color) fputs("\033[0m", stdout);
    }
    fflush(stdout);
}

void cli_gen_print_stats(const cli_gen *g, const q3_gen_result *r)
{
    if (g->in_think && g->color) fputs("\033[0m", stdout);
    fflush(stdout);
    fprintf(stderr, "\n[prefill: %d tokens in %.2f s = %.1f tok/s; decode: %d tokens in %.2f s = %.1f tok/s; stop: %s]\n",
            r->n_prompt, r->prefill_s, r->prefill_s > 0 ? r->n_prompt / r->prefill_s : 0.0, r->n_ids, r->decode_s,
            r->decode_s > 0 ? (r->n_ids > 1 ? r->n_ids - 1 : r->n_ids) / r->decode_s : 0.0, q3_stop_reason_name(r->stop));
}

void cli_gen_close(cli_gen *g)
{
    q3_sampler_free(g->sampler);
    q3_session_free(g->session);
    q3_tokenizer_free(g->tok);
    q3_model_close(g->model);
}
