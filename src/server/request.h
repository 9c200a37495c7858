/* OpenAI request bodies into jobs (chat and completions), the tokenize and
 * detokenize endpoints, and the models list. Pure functions of their inputs
 * (no I/O; only an id counter and a seed counter, both atomic): HTTP threads
 * call them, several at once. */
#ifndef Q3_SERVER_REQUEST_H
#define Q3_SERVER_REQUEST_H

#include <stddef.h>

#include "job.h"
#include "render.h"
#include "q3.h"
#include "buf.h"

/* What parsing needs to know about the server; outlives every call. */
typedef struct srv_api {
    const q3_tokenizer *tok;
    const char *model_name;
    int n_ctx;
    int vocab;
    int kv_tokens;          /* the KV pool in tokens (0: room for n_ctx); prompt + max_tokens must fit */
    size_t max_text_bytes;  /* text longer than this has more than n_ctx tokens (srv_api_limits) */
    q3_task task;    /* what the model serves: chat (GENERATE), embeddings (EMBED) or rerank (RERANK) */
    int hidden;      /* the model's hidden size: an embedding's length */
    size_t max_json_values; /* a body with more JSON values is refused before it is parsed (0: no bound) */
} srv_api;

/* Sets a->max_text_bytes from the tokenizer: the longest token's bytes x 3
 * (NFC may shrink text threefold) x n_ctx. Text past it is refused without
 * tokenizing it: it cannot fit the context. And a->max_json_values: 4 x n_ctx
 * + SRV_MAX_LOGIT_BIAS + 4096 (a value the request uses becomes at least a
 * token of the prompt, or is a logit_bias entry; the rest is room for the
 * fields around them): a body past it is refused before cJSON makes a node
 * (about 80 bytes) of each of its values, which for an 8 MB body of `1,1,1`
 * was about 330 MB. */
void srv_api_limits(srv_api *a);

/* Fill j (kind, prompt, sampling, stop, stream, ...) from a request body.
 * Return 0, or the HTTP status with e set (j then holds nothing to free
 * beyond what srv_job_unref frees). */
/* The body as one JSON object, refused (NULL, e set) when it is not valid JSON, not an
 * object, holds a NUL character, more JSON values than a->max_json_values or a key twice
 * in one object. Every endpoint's parser starts here. */
struct cJSON *srv_parse_body(const srv_api *a, const char *body, size_t len, srv_err *e);

int srv_parse_chat(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);
int srv_parse_completion(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);
/* llama-server's POST /completion: the same fields as /v1/completions, its own answer (SRV_LLAMA_COMPLETION). */
int srv_parse_llama_completion(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);

/* POST /tokenize and /detokenize bodies -> answer JSON (0) or an error status. */
int srv_tokenize(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e);
int srv_detokenize(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e);

/* What /props says of structured output: each request field that carries a
 * constraint and the kind it holds, the JSON Schema keywords and formats
 * followed and those refused (the caller owns the object). */
struct cJSON *srv_structured_output_json(void);

/* GET /v1/models */
void srv_models_json(const srv_api *a, long long created, srv_buf *out);
/* GET /v1/models/{id}: the one model object */
void srv_model_json(const srv_api *a, long long created, srv_buf *out);

#endif
