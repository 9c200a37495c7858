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

/* ---- version and symbols ------------------------------------------------ */

#define Q3_VERSION_MAJOR 0
#define Q3_VERSION_MINOR 2
#define Q3_VERSION_PATCH 0
#define Q3_VERSION_STRING "0.2.0"

/* Only what this header declares leaves libq3.so (the library is built with
 * hidden visibility; Q3_API marks the exceptions). */
#if defined(__GNUC__) || defined(__clang__)
#define Q3_API __attribute__((visibility("default")))
#else
#define Q3_API
#endif

/* The library's version ("0.2.0"): compare with Q3_VERSION_STRING to catch a
 * program built against one header and run with another library. */
Q3_API const char *q3_version(void);

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
Q3_API const char *q3_last_error(void);
Q3_API const char *q3_status_name(q3_status st);

/* ---- model ------------------------------------------------------------ */

typedef struct q3_model q3_model;

/* Opens a Hugging Face folder (config.json + model.safetensors or shards).
 * Weights are mmapped read-only, validated against the config. */
Q3_API q3_status q3_model_open(const char *path, q3_model **out);
Q3_API void q3_model_close(q3_model *m);

Q3_API int q3_model_vocab_size(const q3_model *m);
Q3_API int q3_model_max_context(const q3_model *m);

/* ---- context: many sequences, one step at a time ----------------------- */

/* A context owns its compute-unit instances (threads, scratch), one KV pool
 * for all its sequences, and the prefill and decode graphs. The model must
 * outlive its contexts. A context is used by one thread at a time; two
 * contexts (of one model or two) may run on two threads at once. */
typedef struct q3_ctx q3_ctx;

typedef struct q3_ctx_opts {
    int n_ctx;            /* positions per sequence (0: min(model max, 4096)) */
    int chunk;            /* prefill chunk size S (0: 128) */
    int max_seqs;         /* sequences at once = rows of a decode step (0: 1; at most 256) */
    int kv_tokens;        /* KV pool size in tokens, all sequences together (0: room for max_seqs full contexts) */
    int n_threads;        /* threads of the CPU unit (0: one per physical core) */
    const char *backend;  /* compute unit name: "ref", "cpu" (NULL: best available) */
    const char *prefill_backend; /* split-phase: unit for prefill (NULL: backend) */
    const char *decode_backend;  /* split-phase: unit for decode (NULL: backend) */
    const char *kv_dtype; /* "f32", "f16", "bf16" (NULL: the decode unit's default) */
} q3_ctx_opts;

Q3_API q3_status q3_ctx_new(q3_model *m, const q3_ctx_opts *opts, q3_ctx **out);
Q3_API void q3_ctx_free(q3_ctx *c);

/* Sequences are small integers in [0, max_seqs). A new one is empty. */
Q3_API q3_status q3_seq_new(q3_ctx *c, int *seq);
/* Frees the sequence's KV blocks (full prompt blocks stay cached for reuse). */
Q3_API void q3_seq_drop(q3_ctx *c, int seq);
/* Keeps the first pos positions. */
Q3_API q3_status q3_seq_truncate(q3_ctx *c, int seq, int pos);
/* A new sequence holding seq's positions (full KV blocks shared, not copied). */
Q3_API q3_status q3_seq_fork(q3_ctx *c, int seq, int *child);
/* Positions held (-1 if seq is not a live sequence). */
Q3_API int q3_seq_pos(const q3_ctx *c, int seq);
/* An empty sequence takes the K/V of the longest cached prefix of tokens
 * (whole KV blocks of earlier prompts, never the last token, so a prefill of
 * the rest still yields logits). Returns the positions taken; prefill
 * tokens[returned..n) next. */
Q3_API int q3_seq_reuse_prefix(q3_ctx *c, int seq, const int32_t *tokens, size_t n);

/* One row of a decode step: the sequence's next token; logits (may be NULL)
 * receives [vocab] for the position after it. */
typedef struct q3_decode_row {
    int seq;
    int32_t token;
    float *logits;
} q3_decode_row;

/* One step: a decode row for each of n_decode distinct sequences (one pass
 * over the weights for all of them) and, optionally (prefill_seq >= 0), one
 * prefill chunk of n_prefill <= chunk tokens of another sequence. With
 * prefill_logits, the chunk's logits: [n_prefill][vocab] with
 * prefill_all_rows, else [vocab] of its last token.
 * A sequence's logits are bit for bit the same whatever else shares its step.
 * On failure (an unknown or repeated sequence, a token outside the
 * vocabulary, a full context, a full KV pool) no sequence changes. */
typedef struct q3_step {
    const q3_decode_row *decode;
    int n_decode;
    int prefill_seq;      /* -1: no prefill */
    const int32_t *prefill_tokens;
    int n_prefill;
    float *prefill_logits;
    int prefill_all_rows;
} q3_step;

Q3_API q3_status q3_ctx_step(q3_ctx *c, const q3_step *s);

Q3_API int q3_ctx_n_ctx(const q3_ctx *c);
Q3_API int q3_ctx_max_seqs(const q3_ctx *c);
Q3_API int q3_ctx_chunk(const q3_ctx *c);
/* KV pool: blocks held by sequences, cached for prefix reuse, in all; tokens per block. */
Q3_API void q3_ctx_kv_usage(const q3_ctx *c, int *used, int *cached, int *total, int *block_tokens);

/* ---- session: one sequence ---------------------------------------------- */

typedef struct q3_session q3_session;

typedef struct q3_session_opts {
    int n_ctx;            /* context length in tokens (0: min(model max, 4096)) */
    int chunk;            /* prefill chunk size S (0: 128) */
    int n_threads;        /* threads of the CPU unit (0: one per physical core) */
    const char *backend;  /* compute unit name: "ref", "cpu" (NULL: best available) */
    const char *prefill_backend; /* split-phase: unit for prefill (NULL: backend) */
    const char *decode_backend;  /* split-phase: unit for decode (NULL: backend) */
    const char *kv_dtype; /* "f32", "f16", "bf16" (NULL: the backend's default) */
} q3_session_opts;

Q3_API q3_status q3_session_new(q3_model *m, const q3_session_opts *opts, q3_session **out);
Q3_API void q3_session_free(q3_session *s);

/* Runs n tokens through the prefill graph (in chunks of S) and appends their
 * K/V to the session. If logits is non-NULL: with all_rows, logits receives
 * [n][vocab] (row t = after tokens[0..t]); otherwise [vocab] for the last token. */
Q3_API q3_status q3_session_prefill(q3_session *s, const int32_t *tokens, size_t n,
                             float *logits, int all_rows);

/* Runs one token through the decode graph; logits (may be NULL) gets [vocab]. */
Q3_API q3_status q3_session_decode(q3_session *s, int32_t token, float *logits);

Q3_API int q3_session_pos(const q3_session *s);   /* tokens in the KV cache */
Q3_API int q3_session_n_ctx(const q3_session *s);
Q3_API void q3_session_reset(q3_session *s);      /* forget all tokens */
/* Keeps the first pos tokens and forgets the rest (pos <= q3_session_pos). */
Q3_API q3_status q3_session_rewind(q3_session *s, int pos);

#ifdef __cplusplus
}
#endif
#endif
