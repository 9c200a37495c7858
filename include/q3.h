/* q3 — a Qwen3 inference engine in C. Public API.
 *
 * Every function that can fail returns a q3_status (or NULL) and leaves a
 * human-readable message in q3_last_error() (per thread). Handles are opaque;
 * the caller owns what it opened and frees it with the matching close/free.
 *
 * NULL: a NULL handle or out-pointer given to a function that returns a
 * status fails with Q3_ERR_INVALID naming the argument; frees and other void
 * calls do nothing with NULL; getters of NULL answer 0, -1, NULL or "" (see
 * docs/api.md). Negative counts and unknown flags are refused the same way. */
#ifndef Q3_H
#define Q3_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version and symbols ------------------------------------------------ */

#define Q3_VERSION_MAJOR 0
#define Q3_VERSION_MINOR 4
#define Q3_VERSION_PATCH 0
#define Q3_VERSION_STRING "0.4.0"

/* Only what this header declares leaves libq3.so (the library is built with
 * hidden visibility; Q3_API marks the exceptions). */
#if defined(__GNUC__) || defined(__clang__)
#define Q3_API __attribute__((visibility("default")))
#else
#define Q3_API
#endif

/* The library's version ("0.4.0"): compare with Q3_VERSION_STRING to catch a
 * program built against one header and run with another library. */
Q3_API const char *q3_version(void);

/* src/util/status.h defines the same enum for the library's internals. */
#ifndef Q3_STATUS_DEFINED
#define Q3_STATUS_DEFINED
typedef enum q3_status {
    Q3_OK = 0,
    Q3_ERR_IO,          /* a file is missing, unreadable, or cannot be mapped */
    Q3_ERR_FORMAT,      /* a file's contents are malformed (header, JSON, offsets) */
    Q3_ERR_INVALID,     /* an argument or config value is out of range */
    Q3_ERR_UNSUPPORTED, /* well-formed, but not something q3 runs (arch, dtype) */
    Q3_ERR_NOMEM,       /* an allocation failed */
    Q3_ERR_CONTEXT,     /* the session's context length would be exceeded */
    Q3_ERR_KV_FULL,     /* the context's KV pool has no free block (others' sequences hold them) */
} q3_status;
#endif

/* The message of the last failure on this thread ("" if none). */
Q3_API const char *q3_last_error(void);
Q3_API const char *q3_status_name(q3_status st);

/* Sets this thread's q3_last_error() to the formatted message and returns st:
 * for code built on q3 that reports through the same channel (a logits
 * processor's reason for failing, an application's own errors). */
Q3_API q3_status q3_fail(q3_status st, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Seconds on a monotonic clock (CLOCK_MONOTONIC): for timing, not dates. */
Q3_API double q3_now(void);

/* ---- option structs ----------------------------------------------------
 *
 * Every option struct starts with `size`, so that it can grow without
 * breaking programs built against an older q3.h: fields are only ever
 * appended, and the library reads the first `size` bytes, taking the
 * defaults for fields a shorter struct does not have. Initialize with the
 * struct's q3_*_default() (which sets size) and change the fields you need;
 * a struct zero-initialized by hand (size 0) is also accepted and read
 * with this header's layout (for q3_ctx_opts, q3_session_opts and
 * q3_gen_opts zero is each field's default; not for q3_chat_opts and
 * q3_sampler_params). A size larger than the library knows fails with
 * Q3_ERR_INVALID (the program was built against a newer q3.h). */

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
 * contexts (of one model or two) may run on two threads at once. A call that
 * changes a context while another thread is inside one fails with
 * Q3_ERR_INVALID ("another thread is using this context"). */
typedef struct q3_ctx q3_ctx;

typedef struct q3_ctx_opts {
    size_t size;          /* sizeof(q3_ctx_opts), set by q3_ctx_opts_default() (0: this header's) */
    int n_ctx;            /* positions per sequence (0: min(model max, 4096)) */
    int chunk;            /* prefill chunk size S (0: 128) */
    int max_seqs;         /* sequences at once = rows of a decode step (0: 1; at most 256) */
    int kv_tokens;        /* KV pool size in tokens, all sequences together (0: room for max_seqs full contexts) */
    int n_threads;        /* threads of the CPU unit (0: one per physical core) */
    const char *backend;  /* compute unit name: "ref", "cpu" (NULL: best available) */
    const char *prefill_backend; /* split-phase: unit for prefill (NULL: backend) */
    const char *decode_backend;  /* split-phase: unit for decode (NULL: backend) */
    const char *kv_dtype; /* "f32", "f16", "bf16", "q8_0" (NULL: the decode unit's default) */
} q3_ctx_opts;

/* Every field at its default (0 / NULL), size set. */
Q3_API q3_ctx_opts q3_ctx_opts_default(void);
Q3_API q3_status q3_ctx_new(q3_model *m, const q3_ctx_opts *opts, q3_ctx **out);
Q3_API void q3_ctx_free(q3_ctx *c);

/* Sequences are small integers in [0, max_seqs). A new one is empty. */
Q3_API q3_status q3_seq_new(q3_ctx *c, int *seq);
/* Frees the sequence's KV blocks (full prompt blocks stay cached for reuse).
 * A generator of the dropped sequence is refused from now on, even when
 * q3_seq_new hands the same id out again. */
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
    size_t size;          /* sizeof(q3_session_opts), set by q3_session_opts_default() (0: this header's) */
    int n_ctx;            /* context length in tokens (0: min(model max, 4096)) */
    int chunk;            /* prefill chunk size S (0: 128) */
    int n_threads;        /* threads of the CPU unit (0: one per physical core) */
    const char *backend;  /* compute unit name: "ref", "cpu" (NULL: best available) */
    const char *prefill_backend; /* split-phase: unit for prefill (NULL: backend) */
    const char *decode_backend;  /* split-phase: unit for decode (NULL: backend) */
    const char *kv_dtype; /* "f32", "f16", "bf16", "q8_0" (NULL: the backend's default) */
} q3_session_opts;

Q3_API q3_session_opts q3_session_opts_default(void);
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

/* ---- tokenizer ------------------------------------------------------------
 *
 * Qwen3's tokenizer as Hugging Face `tokenizers` runs it: added tokens
 * (<|im_start|>, <think>, ...) first, NFC, the pre-tokenizer's split regex,
 * byte-level BPE. A tokenizer does not change once loaded: any number of
 * threads may encode and decode with one at once. */

typedef struct q3_tokenizer q3_tokenizer;

/* Loads a Hugging Face tokenizer.json (path: the file, or a folder holding
 * it), or the tokenizer in a .gguf file's metadata. Q3_ERR_IO, Q3_ERR_FORMAT (malformed,
 * truncated, inconsistent) or Q3_ERR_UNSUPPORTED (an option q3 does not
 * implement), the message naming the file and the field. Free with
 * q3_tokenizer_free. */
Q3_API q3_status q3_tokenizer_load(const char *tokenizer_json_path, q3_tokenizer **out);
/* The tokenizer a model comes with: its folder's tokenizer.json, or the
 * tokenizer a GGUF carries. Independent of the model once loaded. */
Q3_API q3_status q3_tokenizer_for_model(const q3_model *m, q3_tokenizer **out);
Q3_API void q3_tokenizer_free(q3_tokenizer *tok);

enum {
    Q3_ENCODE_DEFAULT = 0,    /* special-token text ("<|im_end|>") becomes the special token */
    Q3_ENCODE_SPECIAL_AS_TEXT = 1 << 0, /* ... stays text: for untrusted text */
};

/* Token ids of text[0..len) (UTF-8; invalid UTF-8 fails naming the offset).
 * *ids is a new malloc'd array the caller frees (NULL when *n_ids is 0). */
Q3_API q3_status q3_tokenizer_encode(const q3_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                     int32_t **ids, size_t *n_ids);

/* The bytes of ids[0..n) concatenated, NUL-terminated, in a new malloc'd
 * buffer the caller frees (*len excludes the NUL). Exact bytes: not valid
 * UTF-8 if the ids end inside a character (the detokenizer below holds such
 * characters back). An id out of range fails with Q3_ERR_INVALID. */
Q3_API q3_status q3_tokenizer_decode(const q3_tokenizer *tok, const int32_t *ids, size_t n, char **text, size_t *len);

/* Ids: the largest + 1. */
Q3_API int32_t q3_tokenizer_vocab_size(const q3_tokenizer *tok);
/* The id of the token whose text is exactly text[0..len) (added tokens
 * first, then the vocabulary by its bytes: " the"); -1 if none. */
Q3_API int32_t q3_tokenizer_token_id(const q3_tokenizer *tok, const char *text, size_t len);
/* The bytes of one token (a special token's text, "<|im_end|>"; a byte-level
 * token's raw bytes, which may be part of a UTF-8 character): *bytes points
 * into the tokenizer (valid while it lives), not NUL-terminated.
 * Q3_ERR_INVALID for an id out of range. Any thread. */
Q3_API q3_status q3_tokenizer_piece(const q3_tokenizer *tok, int32_t id, const char **bytes, size_t *len);
/* 1 if id is a control token (<|im_end|>, <|endoftext|>, ...), else 0. */
Q3_API int q3_tokenizer_is_special(const q3_tokenizer *tok, int32_t id);
/* The ids that end a turn (<|im_end|>) and the text (<|endoftext|>); -1 if
 * the tokenizer has none. Generation stops at either. */
Q3_API int32_t q3_tokenizer_end_of_turn(const q3_tokenizer *tok);
Q3_API int32_t q3_tokenizer_end_of_text(const q3_tokenizer *tok);

/* Streaming detokenizer: push ids one at a time, get text that is always
 * whole UTF-8 (a character split across tokens is held until it is whole;
 * bytes that can never form one become U+FFFD). *text is valid until the
 * next call on d. One per stream; not thread-safe. The tokenizer must
 * outlive it. */
typedef struct q3_detokenizer q3_detokenizer;
Q3_API q3_status q3_detokenizer_new(const q3_tokenizer *tok, q3_detokenizer **out);
Q3_API q3_status q3_detokenizer_push(q3_detokenizer *d, int32_t id, const char **text, size_t *len);
/* What is still held (an unfinished character as U+FFFD); the detokenizer starts afresh. */
Q3_API q3_status q3_detokenizer_flush(q3_detokenizer *d, const char **text, size_t *len);
Q3_API void q3_detokenizer_free(q3_detokenizer *d);

/* ---- chat template ----------------------------------------------------------
 *
 * Qwen3's chat template rendered in C, byte for byte as transformers'
 * apply_chat_template renders it. Message content is always tokenized as
 * plain text: only the template's own markup becomes special tokens, so a
 * message holding "<|im_end|>\n<|im_start|>system" cannot open a turn (unless
 * Q3_CHAT_PARSE_SPECIAL_IN_CONTENT asks for the reference's behaviour). */

typedef struct q3_chat_message {
    const char *role;     /* "system", "user", "assistant" or "tool" */
    const char *content;  /* UTF-8 text */
} q3_chat_message;

typedef struct q3_chat_opts {
    size_t size;               /* sizeof(q3_chat_opts), set by q3_chat_opts_default() (0: this header's) */
    int add_generation_prompt; /* 1: end with the assistant's turn opened */
    int enable_thinking;       /* -1: not passed (Qwen3 thinks), 0: no thinking (an empty think block), 1: think */
    unsigned flags;            /* Q3_CHAT_PARSE_SPECIAL_IN_CONTENT */
} q3_chat_opts;

/* add_generation_prompt 1, enable_thinking -1, no flags; size set. */
Q3_API q3_chat_opts q3_chat_opts_default(void);

enum {
    /* special-token text inside messages becomes special tokens, as transformers'
       apply_chat_template(tokenize=True) does: unsafe with untrusted content */
    Q3_CHAT_PARSE_SPECIAL_IN_CONTENT = 1 << 0,
};

/* Whether a model's chat template is one q3 renders: Q3_OK with *present 1
 * when its template (chat_template.jinja or tokenizer_config.json of a folder,
 * tokenizer.chat_template of a GGUF) is Qwen3's, Q3_OK with *present 0 when it
 * has none (callers may use Qwen3's), Q3_ERR_UNSUPPORTED when it is another
 * template (the functions below would render the wrong prompt), Q3_ERR_IO /
 * Q3_ERR_FORMAT when the file cannot be read. Reads files; any thread. */
Q3_API q3_status q3_model_chat_template_check(const q3_model *m, int *present);

/* The prompt ids of messages[0..n) (opts NULL: add_generation_prompt 1,
 * enable_thinking -1). *ids is malloc'd; the caller frees it. */
Q3_API q3_status q3_chat_tokenize(const q3_tokenizer *tok, const q3_chat_message *messages, size_t n,
                                  const q3_chat_opts *opts, int32_t **ids, size_t *n_ids);

/* The same from a JSON conversation (text[0..len)): a messages array, or an
 * object {"messages", "tools", "add_generation_prompt", "enable_thinking"};
 * messages may carry reasoning_content and tool_calls, tool turns their
 * results (OpenAI's shapes). flags: Q3_CHAT_PARSE_SPECIAL_IN_CONTENT or 0. */
Q3_API q3_status q3_chat_tokenize_json(const q3_tokenizer *tok, const char *json, size_t len, unsigned flags,
                                       int32_t **ids, size_t *n_ids);

/* The rendered text of a JSON conversation (as above), NUL-terminated,
 * malloc'd; the caller frees it. */
Q3_API q3_status q3_chat_format_json(const char *json, size_t len, char **text, size_t *text_len);

/* ---- sampler ------------------------------------------------------------
 *
 * Turns a row of logits into the next token id: penalties (repetition,
 * presence, frequency, over the last penalty_last_n accepted tokens),
 * temperature, top-k, softmax, top-p, min-p, then a draw from the sampler's
 * own seeded generator (src/sample/sampler.h has the details). A sampler is not
 * thread-safe: one per generation stream; different samplers may run on
 * different threads at once. */

typedef struct q3_sampler_params {
    size_t size;            /* sizeof(q3_sampler_params), set by q3_sampler_defaults() (0: this header's) */
    float temperature;      /* <= 0: greedy argmax */
    int top_k;              /* 0: off; >= vocab behaves as off */
    float top_p;            /* in [0, 1]; 1: off */
    float min_p;            /* in [0, 1]; 0: off */
    float repeat_penalty;   /* > 0; 1: off */
    float presence_penalty; /* subtracted from seen tokens' logits; 0: off */
    float frequency_penalty;/* times the token's count in the window, subtracted; 0: off */
    int penalty_last_n;     /* how many recent accepted tokens the penalties see; 0: none */
    uint64_t seed;          /* same seed + same inputs -> same draws */
} q3_sampler_params;

/* Qwen's recommended settings. thinking: T 0.6, top-p 0.95, top-k 20, min-p 0;
 * otherwise T 0.7, top-p 0.8, top-k 20, min-p 0. No penalties, seed 0.
 * Start from these (not from zero: repeat_penalty 0 is invalid). */
Q3_API q3_sampler_params q3_sampler_defaults(int thinking);

/* Checks every field's range; Q3_ERR_INVALID with a message naming the field. */
Q3_API q3_status q3_sampler_params_check(const q3_sampler_params *p);

typedef struct q3_sampler q3_sampler;

/* Creates a sampler for logits rows of n_vocab floats. Allocates all scratch
 * (a few bytes times n_vocab) now. The caller frees it with q3_sampler_free. */
Q3_API q3_status q3_sampler_new(const q3_sampler_params *p, int n_vocab, q3_sampler **out);
Q3_API void q3_sampler_free(q3_sampler *s);

/* Forgets the token history and restarts the PRNG from the seed. */
Q3_API void q3_sampler_reset(q3_sampler *s);

/* Records a token (prompt or generated) in the penalty window. Ids outside
 * [0, n_vocab) are ignored. */
Q3_API void q3_sampler_accept(q3_sampler *s, int32_t id);

/* Applies the penalties to a caller's row of n_vocab logits, in place: each
 * distinct id in the window is penalized once, all others are untouched. */
Q3_API void q3_sampler_apply_penalties(q3_sampler *s, float *logits);

/* Picks the next token from logits[n_vocab] (not modified). Does not accept
 * the token: call q3_sampler_accept with it if it should count for penalties.
 * -1 (q3_last_error says why) for a row with a NaN or +inf logit, or with
 * every logit -inf: no distribution to draw from. */
Q3_API int32_t q3_sampler_sample(q3_sampler *s, const float *logits);

/* Runs stages 1-6 and returns the number of kept candidates (0, *ids and
 * *probs NULL, for a row q3_sampler_sample refuses); *ids and *probs
 * (renormalized, summing to 1) point into the sampler's scratch, valid until
 * the next call on s. Ordered by descending probability, ties by lower id.
 * Does not advance the PRNG. Meant for tests and inspection, not the hot path
 * (it may sort the whole kept set). */
Q3_API size_t q3_sampler_candidates(q3_sampler *s, const float *logits,
                             const int32_t **ids, const float **probs);


/* ---- structured output: grammars and token masks -------------------------
 *
 * A constraint is compiled once (q3_grammar: a JSON Schema, any JSON object,
 * a GBNF grammar, a regex, a choice of strings, or a forced tool call) for a
 * tokenizer, then followed per sequence by a q3_matcher: its mask allows
 * exactly the tokens t for which the output so far + bytes(t) is a prefix of
 * some string of the language, an end-of-turn token only where the output is
 * complete, and added tokens (<think>, <tool_call>, <|im_start|>...) only
 * where the grammar names them. docs/structured-output.md lists what each
 * front end supports and what it refuses. */

typedef struct q3_grammar q3_grammar;

typedef enum q3_grammar_kind {
    Q3_GRAMMAR_JSON_SCHEMA = 0, /* text: a JSON Schema (draft 4 to 2020-12 spellings) */
    Q3_GRAMMAR_JSON,            /* any JSON object (response_format json_object); text: NULL or "" */
    Q3_GRAMMAR_GBNF,            /* text: llama.cpp's GBNF; the rule `root` starts */
    Q3_GRAMMAR_REGEX,           /* text: a regex the whole output must match */
    Q3_GRAMMAR_CHOICE,          /* text: a JSON array of strings, the output one of them */
    Q3_GRAMMAR_TOOL_CALL,       /* text: {"tools": [OpenAI tools], "name": "f" (optional)}: the output is
                                   Qwen3's <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>,
                                   the arguments valid against the tool's parameters */
} q3_grammar_kind;

/* Compiles text[0..len) for tok's vocabulary. A keyword, rule or construct
 * that would change the language and is not supported fails with
 * Q3_ERR_UNSUPPORTED and a message naming it; malformed text with
 * Q3_ERR_INVALID. Builds the tokenizer's tables on first use (once per
 * process, kept until exit). The grammar is immutable: matchers on several
 * threads may share it; the tokenizer must outlive it. The same kind and text
 * for the same vocabulary again (among the last 32 compiled) return the same
 * grammar from a cache; each q3_grammar_compile needs its q3_grammar_free. */
Q3_API q3_status q3_grammar_compile(const q3_tokenizer *tok, q3_grammar_kind kind, const char *text, size_t len,
                                    q3_grammar **out);
Q3_API void q3_grammar_free(q3_grammar *g);
/* Bytes the compiled grammar holds (not the shared per-tokenizer tables). */
Q3_API size_t q3_grammar_bytes(const q3_grammar *g);

typedef enum q3_schema_list {
    Q3_SCHEMA_SUPPORTED = 0, /* the JSON Schema keywords the compiler follows */
    Q3_SCHEMA_REFUSED,       /* JSON Schema's keywords it refuses by name (any other word is an annotation) */
    Q3_SCHEMA_FORMATS,       /* the values of "format" it follows */
} q3_schema_list;
/* One of the JSON Schema compiler's lists: static strings, NULL-terminated
 * (NULL for an unknown list). Any thread. */
Q3_API const char *const *q3_json_schema_keywords(q3_schema_list which);

typedef struct q3_matcher q3_matcher;

enum {
    /* the constraint starts after the first </think>: thinking is free (the
       output may not end before it closes), then one or two newlines may come
       before the constrained text */
    Q3_MATCHER_AFTER_THINK = 1 << 0,
};

/* A matcher at the start of g's language (flags: Q3_MATCHER_AFTER_THINK or
 * 0). g must outlive it. One thread at a time; one per sequence. */
Q3_API q3_status q3_matcher_new(const q3_grammar *g, unsigned flags, q3_matcher **out);
Q3_API void q3_matcher_free(q3_matcher *m);
/* Back to the start. */
Q3_API void q3_matcher_reset(q3_matcher *m);

/* The allowed tokens as bits by id: allowed[id / 32] >> (id % 32) & 1, for
 * ids [0, n_vocab) (ids beyond the tokenizer's are never allowed). */
Q3_API q3_status q3_matcher_mask(q3_matcher *m, uint32_t *allowed, int n_vocab);
/* Sets logits[id] = -INFINITY for every token the mask forbids. */
Q3_API q3_status q3_matcher_apply(q3_matcher *m, float *logits, int n_vocab);
/* Moves past token id. Q3_ERR_INVALID (the matcher unchanged) when the mask
 * forbids it. */
Q3_API q3_status q3_matcher_accept(q3_matcher *m, int32_t id);
/* Moves past the bytes text[0..len) as far as they are a prefix of the
 * language; *n_ok: how many were taken. Q3_ERR_INVALID when not all were. */
Q3_API q3_status q3_matcher_accept_bytes(q3_matcher *m, const char *text, size_t len, size_t *n_ok);

typedef enum q3_match_state {
    Q3_MATCH_OPEN = 0,   /* the output so far is a proper prefix: it must go on */
    Q3_MATCH_COMPLETE,   /* complete, and it may also go on */
    Q3_MATCH_DONE,       /* complete, and nothing may follow (an end-of-turn token did, or only it can) */
} q3_match_state;
Q3_API q3_match_state q3_matcher_state(const q3_matcher *m);

/* ---- generation ----------------------------------------------------------
 *
 * One generation loop for every application (q3 run, q3 chat, q3 serve and
 * library users): prompt prefill, then per step a row of logits ->
 * log-probabilities (optional) -> the caller's logits processor (optional:
 * masks, biases) -> the sampler (penalties, temperature, ...) -> the token ->
 * text, split into channels (optional), held back while it may begin a stop
 * string -> on_text. */

typedef enum q3_stop_reason {
    Q3_STOP_END_OF_TURN,  /* <|im_end|> or <|endoftext|> */
    Q3_STOP_STRING,       /* a user stop string appeared (it is not emitted) */
    Q3_STOP_LENGTH,       /* max_tokens generated */
    Q3_STOP_INTERRUPT,    /* *interrupt became non-zero */
    Q3_STOP_CONTEXT,      /* the session's context is full */
    Q3_STOP_CANCEL,       /* q3_gen_cancel: the caller ended it */
    Q3_STOP_ERROR,        /* the logits processor failed (q3_gen_error says why) */
} q3_stop_reason;

/* What a piece of generated text is, when q3_gen_opts.split_channels asks
 * for the split (Qwen3's markup, by token id: <think> ... </think> is
 * thinking, <tool_call> ... </tool_call> a tool call; without the split, or
 * for a tokenizer without those tokens, everything is content). */
typedef enum q3_channel {
    Q3_CHANNEL_CONTENT = 0, /* the answer */
    Q3_CHANNEL_THINKING,    /* reasoning, between <think> and </think> */
    Q3_CHANNEL_TOOL_CALL,   /* a tool call's JSON, between <tool_call> and </tool_call> */
} q3_channel;

/* Where a piece sits in its channel's span. */
typedef enum q3_edge {
    Q3_EDGE_NONE = 0,  /* text inside the span */
    Q3_EDGE_OPEN,      /* the span opens (its opening token came); no text */
    Q3_EDGE_CLOSE,     /* the span closed by its closing token; no text */
    Q3_EDGE_CUT,       /* generation ended inside the span (no closing token); no text */
} q3_edge;

/* One piece of generated text, handed to on_text. text[0..len) is whole
 * UTF-8, valid only during the call. With split_channels: the markup tokens
 * are not text (they become OPEN/CLOSE edges); thinking loses its leading
 * and trailing newlines and content its leading newlines (the blank lines
 * the template puts around a think block); a markup token out of place
 * (</think> in content, <think> in a tool call) stays text. */
typedef struct q3_text_piece {
    const char *text;
    size_t len;
    int32_t id;          /* the token that completed the piece (-1: none, at the end) */
    q3_channel channel;
    q3_edge edge;
} q3_text_piece;

/* A generated token's log-probability under the model's distribution
 * (softmax of the raw logits: before the logits processor, penalties and
 * temperature) and the most likely alternatives. */
#define Q3_MAX_TOP_LOGPROBS 20
typedef struct q3_token_logprob {
    int32_t id;
    float logprob;
    int n_top;                           /* alternatives below (top_logprobs asked) */
    int32_t top_id[Q3_MAX_TOP_LOGPROBS]; /* most likely first, lower id first on ties */
    float top_logprob[Q3_MAX_TOP_LOGPROBS];
} q3_token_logprob;

typedef struct q3_gen q3_gen;

typedef struct q3_gen_opts {
    size_t size;                         /* sizeof(q3_gen_opts), set by q3_gen_opts_default() (0: this header's) */
    int max_tokens;                      /* 0: until the context is full */
    const char *const *stop;             /* user stop strings */
    int n_stop;
    volatile sig_atomic_t *interrupt;    /* NULL or a flag a signal handler sets */
    /* text as it is made (see q3_text_piece); runs inside q3_gen_step */
    void (*on_text)(void *user, const q3_text_piece *piece);
    void *user;                          /* passed to on_text, on_token and on_logits */
    int split_channels;                  /* 1: thinking and tool calls apart from content (q3_channel) */
    /* The logits processor: called for every sampled position with the row
     * of n_vocab logits, which it may change in place (-INFINITY forbids a
     * token; a grammar mask, a bias). q3_gen_result_get(g)->ids holds the
     * tokens generated so far. A status other than Q3_OK ends this generator
     * (Q3_STOP_ERROR, the message in q3_gen_error) and no other. NULL: none. */
    q3_status (*on_logits)(void *user, q3_gen *g, float *logits, int n_vocab);
    /* Each sampled token, after it is recorded and before its text (NULL: none). */
    void (*on_token)(void *user, q3_gen *g, int32_t id);
    int logprobs;                        /* 1: record each token's q3_token_logprob */
    int top_logprobs;                    /* alternatives per token, 0..Q3_MAX_TOP_LOGPROBS */
    int no_prompt_penalty;               /* 1: the prompt's tokens stay out of the sampler's penalty
                                            window (OpenAI's presence/frequency count only output) */
    /* The constraint (borrowed; NULL: none): its mask is applied to each row
     * after on_logits, and each sampled token moves it on. Its tokenizer
     * must be the generator's. */
    q3_matcher *grammar;
} q3_gen_opts;

/* Every field 0 / NULL, size set. */
Q3_API q3_gen_opts q3_gen_opts_default(void);

typedef struct q3_gen_result {
    int32_t *ids;        /* generated ids, the end-of-turn token included if one ended it (q3_generate: caller frees) */
    int n_ids;
    int n_prompt;
    double prefill_s, decode_s;
    q3_stop_reason stop;
} q3_gen_result;

/* Runs prompt[0..n) through the session (which may already hold earlier
 * turns), then generates. A prompt that does not fit fails with
 * Q3_ERR_CONTEXT and changes nothing; a context that fills while generating
 * ends the answer with Q3_STOP_CONTEXT. The loop of q3_gen_step over one
 * generator. */
Q3_API q3_status q3_generate(q3_session *s, q3_sampler *smp, const q3_tokenizer *tok, const int32_t *prompt, size_t n,
                      const q3_gen_opts *o, q3_gen_result *r);

/* ---- step by step, many sequences at once ------------------------------------------ */

/* One sequence being generated: its prompt still to prefill, its sampler,
 * its streaming detokenizer and stop strings. Generators of one context
 * advance together, one q3_ctx_step at a time (q3_gen_step): each step
 * carries the decode row of every generator that is generating and the
 * next prefill chunk of the first one (in the order given) still
 * prefilling. */

/* A generator for sequence seq of c (which may already hold earlier turns).
 * smp, tok and the strings of o are borrowed: they must outlive it. tok may
 * be NULL (ids only: no text, no stop strings, no channels). */
Q3_API q3_status q3_gen_new(q3_ctx *c, int seq, q3_sampler *smp, const q3_tokenizer *tok, const q3_gen_opts *o,
                     q3_gen **out);
Q3_API void q3_gen_free(q3_gen *g);

/* Queues the prompt (copied): the next steps prefill it, then generation
 * starts. Q3_ERR_CONTEXT when it does not fit beside what the sequence
 * holds (at least one position must stay free to generate); Q3_ERR_INVALID
 * for an id outside the vocabulary (checked before anything is queued). */
Q3_API q3_status q3_gen_prompt(q3_gen *g, const int32_t *prompt, size_t n);
/* The same when the sequence already holds prompt[0..skip) as its last
 * positions (a prefix q3_seq_reuse_prefix took): only prompt[skip..n) is
 * prefilled, and all n tokens count as the prompt (penalties, n_prompt). */
Q3_API q3_status q3_gen_prompt_from(q3_gen *g, const int32_t *prompt, size_t n, size_t skip);

/* One step for the generators gens[0..n) (all of one context; finished ones
 * are skipped). on_text callbacks run before it returns. A failed step
 * (Q3_ERR_KV_FULL: the KV pool is full) changes no sequence; the caller may
 * finish a generator (q3_gen_cancel) and step again. */
Q3_API q3_status q3_gen_step(q3_gen *const *gens, int n);
/* The same with a token budget per step (0: none beyond one chunk): the
 * decode rows first, then the prefill chunk takes what is left of budget
 * (at least one token), so a long prompt is spread over many steps and the
 * generating sequences keep their pace. Q3_STEP_PACED: a budget that follows
 * the decode rows, the prefill chunk taking at most 3 tokens for every 2
 * rows (at least Q3_STEP_PACED_MIN), so a step carrying a prefill costs about
 * twice one without and the streams' inter-token latency stays near even.
 * A step with no decode row prefills a whole chunk (no sequence is waiting
 * on it). Chunks of any size give the same tokens and logits. */
#define Q3_STEP_PACED (-1)
#define Q3_STEP_PACED_MIN 16
Q3_API q3_status q3_gen_step_budget(q3_gen *const *gens, int n, int budget);

/* Gives the generator's KV blocks back to the pool now (full blocks stay in
 * the prefix cache) and pauses nothing else: the next step that carries it
 * takes back what the cache still has, then computes the rest again from
 * the sequence's tokens (prompt positions as prefill chunks, generated ones
 * as decode rows, as they first were), so the tokens and logits that follow
 * are the same as without the preemption; positions of earlier turns
 * generated by decode are prefilled (the same up to rounding). Leave it out
 * of the steps until the pool has room again. Q3_ERR_INVALID for a stopped
 * generator or a dropped sequence. */
Q3_API q3_status q3_gen_preempt(q3_gen *g);

/* Ends a generator now with the given reason (text held back for stop
 * strings is dropped; an open channel span gets no CUT edge). */
Q3_API void q3_gen_cancel(q3_gen *g, q3_stop_reason why);

/* 1 once the generator has stopped (its result is final). */
Q3_API int q3_gen_done(const q3_gen *g);
/* 1 while the prompt is still being prefilled (or, after q3_gen_preempt, its
 * positions are being computed again). */
Q3_API int q3_gen_prefilling(const q3_gen *g);
/* The result so far (ids: owned by the generator, valid until it is freed). */
Q3_API const q3_gen_result *q3_gen_result_get(const q3_gen *g);
/* The sequence the generator runs on. */
Q3_API int q3_gen_seq(const q3_gen *g);
/* With opts.logprobs: one entry per generated id (*n of them), owned by the
 * generator, valid until its next step or its end; NULL and 0 otherwise. */
Q3_API const q3_token_logprob *q3_gen_logprobs(const q3_gen *g, int *n);
/* Why a generator ended with Q3_STOP_ERROR ("" otherwise); owned by it. */
Q3_API const char *q3_gen_error(const q3_gen *g);

Q3_API const char *q3_stop_reason_name(q3_stop_reason r);


/* ---- embeddings and reranker scores ------------------------------------------
 *
 * Qwen3-Embedding and Qwen3-Reranker are Qwen3 causal LMs used without
 * generating: a prefill-only pass over many inputs packed into one run (no
 * padding, each input attending to itself alone, no K/V kept), ending at the
 * final norm's hidden state of each input's last token (an embedding) or at
 * two rows of the LM head there (a reranker's "yes" and "no" logits). An
 * input's result is bit for bit the same alone or packed among others. These
 * calls use the context's prefill unit and its own buffers; the context's
 * sequences and KV pool are untouched, so they may come between steps. */

typedef enum q3_task {
    Q3_TASK_GENERATE = 0, /* a chat / text model */
    Q3_TASK_EMBED,        /* an embedding model (last-token pooling) */
    Q3_TASK_RERANK,       /* a yes/no reranker */
} q3_task;

/* What the checkpoint is for, from its own markers: a GGUF's <arch>.pooling_type
 * (3, last: EMBED; 4, rank: RERANK); a folder's 1_Pooling/config.json with
 * pooling_mode_lasttoken (EMBED) or config_sentence_transformers.json with
 * model_type CrossEncoder (RERANK), else its name containing "embedding" or
 * "reranker" (any case); GENERATE otherwise. Any model can be run either way:
 * this only says what it was made for. */
Q3_API q3_task q3_model_task(const q3_model *m);
Q3_API const char *q3_task_name(q3_task t); /* "generate", "embed", "rerank" */
/* The hidden size: an embedding's full length. */
Q3_API int q3_model_hidden_size(const q3_model *m);

typedef struct q3_embed_opts {
    size_t size;          /* sizeof(q3_embed_opts), set by q3_embed_opts_default() (0: this header's) */
    int dim;              /* values per embedding: the first dim of the hidden state (Matryoshka),
                             1..hidden (0: hidden) */
    int unnormalized;     /* 1: the raw hidden state; 0: L2-normalized (after the cut to dim) */
    int batch_tokens;     /* tokens packed into one run (0: 1024); a longer input runs alone */
} q3_embed_opts;

/* Every field 0, size set. */
Q3_API q3_embed_opts q3_embed_opts_default(void);

/* v[0..dim) divided by its L2 norm (computed in double), in place, as
 * q3_embed normalizes (a zero vector stays zero): for a caller that cuts a
 * raw embedding to fewer dimensions itself. */
Q3_API void q3_embed_normalize(float *v, int dim);

/* Qwen3-Embedding's input: "Instruct: {instruct}\nQuery:{text}" (a query with
 * a task instruction) or text alone (instruct NULL: a document), tokenized
 * as plain text (special-token text stays text), then <|endoftext|>
 * appended. *ids is malloc'd; the caller frees it. */
Q3_API q3_status q3_embed_tokenize(const q3_tokenizer *tok, const char *instruct, const char *text, size_t len,
                                   int32_t **ids, size_t *n_ids);

/* The embeddings of inputs[i][0..lens[i]) for i < n into out[i * dim ..
 * (i + 1) * dim) (dim: o->dim, or the hidden size), each from the last
 * token's final-norm hidden state. Inputs are token ids (q3_embed_tokenize
 * makes Qwen3-Embedding's); each must be 1..q3_ctx_n_ctx tokens
 * (Q3_ERR_CONTEXT otherwise) of ids in the vocabulary (Q3_ERR_INVALID,
 * naming the input). The context's thread, between steps. */
Q3_API q3_status q3_embed(q3_ctx *c, const int32_t *const *inputs, const size_t *lens, size_t n,
                          const q3_embed_opts *o, float *out);

/* The instruction Qwen3-Reranker's model card uses when none is given. */
#define Q3_RERANK_DEFAULT_INSTRUCT "Given a web search query, retrieve relevant passages that answer the query"

/* Qwen3-Reranker's prompt for one (query, document) pair (instruct NULL: the
 * default above), as its model card's reference code builds it:
 *   <|im_start|>system\nJudge whether the Document meets the requirements based on
 *   the Query and the Instruct provided. Note that the answer can only be "yes" or
 *   "no".<|im_end|>\n<|im_start|>user\n
 *   <Instruct>: {instruct}\n<Query>: {query}\n<Document>: {doc}
 *   <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
 * (the three parts tokenized apart and joined, the middle one as plain text).
 * *ids is malloc'd; the caller frees it. */
Q3_API q3_status q3_rerank_tokenize(const q3_tokenizer *tok, const char *instruct, const char *query, const char *doc,
                                    int32_t **ids, size_t *n_ids);

/* The relevance of each prompt inputs[i][0..lens[i]) (q3_rerank_tokenize
 * makes them): scores[i] = P(yes) / (P(yes) + P(no)) from the logits of the
 * tokens "yes" and "no" (tok's ids for them) at its last position, computed
 * as two dot products, not the whole LM head (a GGUF's cls.output.weight,
 * llama.cpp's converter's copy of those two rows, when it has one; then tok
 * may be NULL). logits (may be NULL) gets
 * [n][2]: the two logits (yes, no). o may be NULL (dim and unnormalized do
 * not apply). Limits and failures as q3_embed. */
Q3_API q3_status q3_rerank(q3_ctx *c, const q3_tokenizer *tok, const int32_t *const *inputs, const size_t *lens,
                           size_t n, const q3_embed_opts *o, float *scores, float *logits);


#ifdef __cplusplus
}
#endif
#endif
