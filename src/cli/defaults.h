/* Where the CLI finds its built-in defaults: the real Qwen3 tokenizer fetched
 * by `make deps` (models/qwen3-tokenizer) and the synthetic Qwen3-0.6B that
 * `q3 bench` and `q3 probe` build on first use (models/synth-qwen3-0.6b). */
#ifndef Q3_CLI_DEFAULTS_H
#define Q3_CLI_DEFAULTS_H

#include <stddef.h>

/* The folder holding tokenizer.json of the built-in tokenizer, or NULL.
 * Looks at $Q3_TOKENIZER, ./models/qwen3-tokenizer, then beside the binary. */
const char *cli_default_tokenizer_dir(void);

/* Path of the synthetic Qwen3-0.6B checkpoint, written on first use
 * ($Q3_MODELS or ./models). Returns NULL after printing an error. */
const char *cli_default_model(const char *cmd);

#endif
