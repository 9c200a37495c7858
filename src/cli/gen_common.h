/* What `q3 run` and `q3 chat` share: options for the model, tokenizer,
 * session and sampler; opening them; printing streamed text with the
 * model's thinking set apart from its answer; the timings. Uses only the
 * public API (include/q3.h), so the CLI exercises it every day (issue 12). */
#ifndef Q3_CLI_GEN_COMMON_H
#define Q3_CLI_GEN_COMMON_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "cli/opts.h"
#include "q3.h"

#define CLI_MAX_STOPS 16

typedef struct cli_gen {
    const char *cmd;
    const char *model_path, *tokenizer_path;
    q3_session_opts so;
    float temp, top_p, min_p, repeat_penalty, presence_penalty; /* < -1e29: not given */
    int top_k;                                                  /* -1: not given */
    long long seed;                                             /* -1: not given */
    int max_tokens;
    const char *stops[CLI_MAX_STOPS];
    int n_stops;
    int no_think, hide_think, raw, output_ids, no_perf;
    int parse_special_in_content; /* message content may hold special tokens (unsafe) */
    int verbose_prompt;           /* print the prompt's ids to stderr */
    int no_warmup;                /* skip the warm-up decode step before the prompt is timed */
    cli_llama llama;              /* llama.cpp's spellings (-ngl, -fa, -ctk/-ctv, -b, -ub) */
    /* structured output: at most one of these (llama.cpp's option names) */
    const char *grammar_text, *grammar_file, *schema_text, *schema_file;
    q3_grammar *grammar;
    q3_matcher *matcher; /* NULL: unconstrained; reset for each answer */
    q3_model *model;
    q3_tokenizer *tok;
    q3_session *session;
    q3_sampler *sampler;
    q3_sampler_params sp; /* what the sampler runs with (after cli_gen_sampler) */
    uint64_t seed_used;
    double load_s; /* model + tokenizer + session + warm-up */
    double warmup_s; /* the warm-up step alone (0: none) */
    /* printing state */
    int in_think, color;
    int ended_line; /* the text printed so far ends with a newline (or nothing was printed) */
} cli_gen;

void cli_gen_init(cli_gen *g, const char *cmd);
/* Appends the shared options (model, session, sampling, printing) to tab;
 * returns how many. tab must have room for CLI_GEN_N_OPTS more. */
#define CLI_GEN_N_OPTS (29 + CLI_LLAMA_N_OPTS)
int cli_gen_add_opts(cli_gen *g, cli_opt *tab);
/* After cli_parse of s: resolves llama.cpp's spellings (cli_llama_apply).
 * Returns 0 or 2 (a usage error, printed). */
int cli_gen_parsed(cli_gen *g, const cli_spec *s);
/* The tokenizer at path (a tokenizer.json, a folder holding one, or a .gguf's
 * metadata), or model m's own when path is NULL. Returns 0 or prints an error
 * naming cmd and returns 1. */
int cli_open_tokenizer(const char *cmd, const char *path, q3_model *m, q3_tokenizer **tok);
/* Opens model, tokenizer (model folder, --tokenizer, or the GGUF), session,
 * then (unless --no-warmup) runs one decode step and forgets it, as llama.cpp
 * warms up: the weights are paged in from disk and the kernels' packed copies
 * made before the prompt is timed, so the load time holds that work and the
 * prompt's speed does not. Returns 0, or prints an error and returns the exit
 * status: 2 for a usage error (a context past the model's), else 1. */
int cli_gen_open(cli_gen *g);
/* The sampler: Qwen's defaults for the mode (thinking or not), the model
 * folder's generation_config.json over them (thinking mode only: that is the
 * mode it is written for), the command line's flags over both; a random seed
 * (printed to stderr) unless --seed. Returns 0 or 1 (printed). */
int cli_gen_sampler(cli_gen *g, int thinking);
void cli_gen_close(cli_gen *g);
/* With --grammar, --grammar-file, -j/--json-schema or --json-schema-file:
 * compiles it (for output after </think> when thinking) into g->matcher.
 * Returns 0, 2 after a usage error (two given, or a refused keyword or
 * rule: printed), or 1. */
int cli_gen_grammar(cli_gen *g, int thinking);
/* Checks the model's chat template is Qwen3's (prints why not); 0 if usable. */
int cli_gen_check_template(cli_gen *g);
/* The ids of a conversation ({messages, ...} as q3_chat_tokenize_json takes
 * it): the template's markup with special tokens, the content as plain text
 * (unless --parse-special-in-content). Prints nothing: q3_last_error says why. */
q3_status cli_gen_encode_chat(const cli_gen *g, const cJSON *conversation, int32_t **ids, size_t *n);
/* With --verbose-prompt: the prompt's ids and their tokens, to stderr. */
void cli_gen_print_prompt(const cli_gen *g, const int32_t *ids, size_t n);
/* on_text callback for q3_generate (split_channels): prints to stdout, the
 * thinking between <think> and </think>, dimmed, or hidden (--hide-think). */
void cli_gen_print(void *user, const q3_text_piece *p);
/* Ends the streamed text and prints llama.cpp-style timings to stderr (not
 * with --no-perf): load (load_s >= 0), prompt eval, eval, total. */
void cli_gen_print_stats(const cli_gen *g, const q3_gen_result *r, double load_s);
/* Seconds on a monotonic clock. */
double cli_now(void);

#endif
