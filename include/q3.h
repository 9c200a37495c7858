/* q3 — a Qwen3 inference engine in C. Public API.
 *
 * Every function that can fail returns a q3_status (or NULL) and leaves a
 * human-readable message in q3_last_error() (per thread). Handles are opaque;
 * the caller owns what it opened and frees it with the matching close/free. */
#ifndef Q3_H
#define Q3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum q3_status {
    Q3_OK = 0,
    Q3_ERR_IO,          /* a file is missing, unreadable, or cannot be mapped */
    Q3_ERR_FORMAT,      /* a file's contents are malformed (header, JSON, offsets) */
    Q3_ERR_INVALID,     /* an argument or config value is out of range */
    Q3_ERR_UNSUPPORTED, /* well-formed, but not something q3 runs (arch, dtype) */
    Q3_ERR_NOMEM,       /* an allocation failed */
    Q3_ERR_CONTEXT,     /* the session's context length would be exceeded */
} q3_status;

/* The message of the last failure on this thread ("" if none). */
const char *q3_last_error(void);
const char *q3_status_name(q3_status st);

/* ---- model ------------------------------------------------------------ */

typedef struct q3_model q3_model;

/* Opens a Hugging Face folder (config.json + model.safetensors or shards).
 * Weights are mmapped read-only, validated against the config. */
q3_status q3_model_open(const char *path, q3_model **out);
void q3_model_close(q3_model *m);

int q3_model_vocab_size(const q3_model *m);
int q3_model_max_context(const q3_model *m);

/* ---- session ---------------------------------------------------------- */

typedef struct q3_session q3_session;

typedef struct q3_session_opts {
    int n_ctx;            /* context length in tokens (0: min(model max, 4096)) */
    int chunk;            /* prefill chunk size S (0: 128) */
    const char *backend;  /* compute unit name: "ref", "cpu" (NULL: best available) */
    const char *prefill_backend; /* split-phase: unit for prefill (NULL: backend) */
    const char *decode_backend;  /* split-phase: unit for decode (NULL: backend) */
    const char *kv_dtype; /* "f32", "f16", "bf16" (NULL: the backend's default) */
} q3_session_opts;

q3_status q3_session_new(q3_model *m, const q3_session_opts *opts, q3_session **out);
void q3_session_free(q3_session *s);

/* Runs n tokens through the prefill graph (in chunks of S) and appends their
 * K/V to the session. If logits is non-NULL: with all_rows, logits receives
 * [n][vocab] (row t = after tokens[0..t]); otherwise [vocab] for the last token. */
q3_status q3_session_prefill(q3_session *s, const int32_t *tokens, size_t n,
                             float *logits, int all_rows);

/* Runs one token through the decode graph; logits (may be NULL) gets [vocab]. */
q3_status q3_session_decode(q3_session *s, int32_t token, float *logits);

int q3_session_pos(const q3_session *s);   /* tokens in the KV cache */
int q3_session_n_ctx(const q3_session *s);
void q3_session_reset(q3_session *s);      /* forget all tokens */
/* Keeps the first pos tokens and forgets the rest (pos <= q3_session_pos). */
q3_status q3_session_rewind(q3_session *s, int pos);

#ifdef __cplusplus
}
#endif
#endif
