/* What `q3 run` and `q3 chat` share: options for the model, tokenizer,
 * session and sampler; opening them; and printing streamed text with the
 * model's thinking set apart from its answer. */
#ifndef Q3_CLI_GEN_COMMON_H
#define Q3_CLI_GEN_COMMON_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "q3.h"
#include "run/generate.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

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
    int no_think, hide_think, raw, output_ids;
    int parse_special_in_content; /* message content may hold special tokens (unsafe) */
    int verbose_prompt;           /* print the prompt's ids to stderr */
    q3_model *model;
    q3_tokenizer *tok;
    q3_session *session;
    q3_sampler *sampler;
    /* printing state */
    int in_think, color, after_think;
    int32_t think_open, think_close;
} cli_gen;

void cli_gen_init(cli_gen *g, const char *cmd);
/* Consumes argv[*i] (and its value) if it is a shared option: 1 consumed,
 * 0 not a shared option, -1 error (printed). */
int cli_gen_option(cli_gen *g, int *i, int argc, char **argv);
extern const char *cli_gen_usage;
/* Opens model, tokenizer (model folder, --tokenizer, or the GGUF), session,
 * sampler. Returns 0 or prints an error and returns 1. */
int cli_gen_open(cli_gen *g);
void cli_gen_close(cli_gen *g);
/* Checks the model's chat template is Qwen3's (prints why not); 0 if usable. */
int cli_gen_check_template(cli_gen *g);
/* The ids of a conversation ({messages, ...} as q3_chat_render takes it): the
 * template's markup with special tokens, the content as plain text (unless
 * --parse-special-in-content). Prints nothing: the status and q3_last_error say why. */
q3_status cli_gen_encode_chat(const cli_gen *g, const cJSON *conversation, q3_tokens *out);
/* With --verbose-prompt: the prompt's ids and their tokens, to stderr. */
void cli_gen_print_prompt(const cli_gen *g, const int32_t *ids, size_t n);
/* on_text callback for q3_generate: prints to stdout, thinking dimmed or hidden. */
void cli_gen_print(void *user, int32_t id, const char *text, size_t len);
void cli_gen_print_stats(const cli_gen *g, const q3_gen_result *r);

#endif
