/* POST /v1/embeddings (OpenAI's shape) and POST /v1/rerank, /rerank (the
 * shape llama-server, vLLM, Jina and Cohere clients send): request bodies
 * into jobs (HTTP threads), the batched run of many such jobs (the engine
 * thread), and their answers. */
#ifndef Q3_SERVER_EMBED_API_H
#define Q3_SERVER_EMBED_API_H

#include <stddef.h>
#include <stdint.h>

#include "job.h"
#include "render.h"
#include "request.h"

/* The most inputs (texts, or documents) one request may carry. */
#define SRV_MAX_EMBED_INPUTS 2048

/* A request's inputs and, once it ran, its results. Written by the HTTP
 * thread that parses it; out by the engine thread before the job ends; read
 * by the answering thread after. */
typedef struct srv_embed_req {
    int n;                /* inputs */
    int32_t **ids;        /* [n] token ids of each (embeddings: the text + <|endoftext|>; rerank: the prompt) */
    size_t *lens;         /* [n] */
    long long n_tokens;   /* sum of lens: usage.prompt_tokens */
    int dim;              /* embeddings: values per vector (1..hidden) */
    int base64;           /* embeddings: encoding_format "base64" */
    char **docs;          /* rerank: [n] the documents' text (return_documents) */
    int top_n;            /* rerank: results kept (n when not asked) */
    int return_documents;
    float *out;           /* [n][dim] embeddings, or [n] scores */
} srv_embed_req;

void srv_embed_free(srv_embed_req *r);

/* 0 when the server's model generates; else 400 with e saying which endpoint it serves. */
int srv_check_generate(const srv_api *a, srv_err *e);

/* Bodies into jobs: 0, or the HTTP status with e set (a 400 names the field). */
int srv_parse_embeddings(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);
int srv_parse_rerank(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);

/* Runs jobs[0..n) (EMBED and RERANK jobs, all of one context; hidden: the
 * model's hidden size) in one packed batch of each kind and fills their results. 0, or -1 with msg set (every
 * job then failed). The engine thread. */
int srv_embed_run(q3_ctx *ctx, const q3_tokenizer *tok, int hidden, srv_job *const *jobs, int n, char *msg,
                  size_t msg_cap);

/* The answer of an EMBED or RERANK job that ran. */
void srv_embed_response_json(const srv_job *j, srv_buf *out);

#endif
