/* Where the CLI finds its built-in defaults: the real Qwen3 tokenizer fetched
 * by `make deps` (models/qwen3-tokenizer) and the synthetic Qwen3-0.6B that
 * `q3 bench` and `q3 probe` build on first use (CACHE/synth-qwen3-0.6b). */
#ifndef Q3_TOOLS_DEFAULTS_H
#define Q3_TOOLS_DEFAULTS_H

#include "q3.h"

/* The cache folder the synthetic model is built into: $Q3_MODELS, else
 * $Q3_CACHE_DIR, else $XDG_CACHE_HOME/q3, else ~/.cache/q3. Never relative
 * to the working directory unless one of those variables says so. */
const char *q3_cache_dir(void);

/* The folder holding tokenizer.json of the built-in tokenizer, or NULL.
 * Looks at $Q3_TOKENIZER, then beside the binary (BIN/../models/qwen3-tokenizer
 * in the source tree, BIN/../share/q3/qwen3-tokenizer), then the cache folder. */
const char *q3_default_tokenizer_dir(void);

/* *dir: the path of the synthetic Qwen3-0.6B checkpoint, written on first use
 * into the cache folder (with "q3 CMD: ..." progress lines on stderr). Q3_OK,
 * or a status with q3_last_error() saying why. */
q3_status q3_default_model(const char *cmd, const char **dir);

#endif
