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
    q3_task task;    /* what the model serves: chat (GENERATE), embeddings (EMBED) or rerank (RERANK) */
    int hidden;      /* the model's hidden size: an embedding's length */
} srv_api;

/* Fill j (kind, prompt, sampling, stop, stream, ...) from a request body.
 * Return 0, or the HTTP status with e set (j then holds nothing to free
 * beyond what srv_job_unref frees). */
int srv_parse_chat(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);
int srv_parse_completion(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);

/* POST /tokenize and /detokenize bodies -> answer JSON (0) or an error status. */
int srv_tokenize(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e);
int srv_detokenize(const srv_api *a, const char *body, size_t len, srv_buf *out, srv_err *e);

/* GET /v1/models */
void srv_models_json(const srv_api *a, long long created, srv_buf *out);

#endif
