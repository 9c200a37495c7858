/* The OpenAI wire format: request bodies into jobs, answers into JSON bodies
 * and SSE chunks, and the model's text into content, reasoning_content and
 * tool_calls. Pure functions of their inputs (no I/O, no globals): the HTTP
 * threads parse and render with them, the engine thread feeds text through
 * srv_out. */
#ifndef Q3_SERVER_OPENAI_H
#define Q3_SERVER_OPENAI_H

#include <stddef.h>

#include "server/job.h"
#include "text/tokenizer.h"
#include "util/strbuf.h"

typedef struct srv_api {
    const q3_tokenizer *tok;
    const char *model_name;
    int n_ctx;
    int vocab;
} srv_api;

/* An error answer: HTTP status and the OpenAI envelope's fields. */
typedef struct srv_err {
    int status;            /* 0: no error */
    const char *type;      /* "invalid_request_error", ... */
    const char *code;      /* NULL or e.g. "model_not_found" */
    char param[64];        /* "" or the offending field */
    char message[384];
} srv_err;

int srv_err_set(srv_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}} into b. */
void srv_err_json(const srv_err *e, q3_strbuf *b);

/* Fill j (kind, prompt, sampling, stop, stream, ...) from a request body.
 * Return 0, or the HTTP status with e set (j then holds nothing to free
 * beyond what srv_job_unref frees). */
int srv_parse_chat(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);
int srv_parse_completion(const srv_api *a, const char *body, size_t len, srv_job *j, srv_err *e);

/* POST /tokenize and /detokenize bodies -> answer JSON (0) or an error status. */
int srv_tokenize(const srv_api *a, const char *body, size_t len, q3_strbuf *out, srv_err *e);
int srv_detokenize(const srv_api *a, const char *body, size_t len, q3_strbuf *out, srv_err *e);

/* GET /v1/models */
void srv_models_json(const srv_api *a, long long created, q3_strbuf *out);

/* ---- the model's text, as it comes --------------------------------------- */

/* Splits the generated text into reasoning (<think>...</think>), tool calls
 * (<tool_call>{json}</tool_call>) and content, holding back only a possible
 * marker prefix. For a stream each piece becomes an SSE chunk in j->sse;
 * otherwise it accumulates in j->content / j->reasoning / j->tool_calls.
 * The caller holds j->mu. */
typedef struct srv_out {
    int mode;              /* 0 content, 1 reasoning, 2 inside a tool call */
    q3_strbuf pend;        /* text not yet classified */
    q3_strbuf tool;        /* the current tool call's text */
    int content_any, reasoning_any;
    int held_nl;           /* newlines held back at the end of the reasoning */
} srv_out;

void srv_out_text(srv_out *o, srv_job *j, const char *text, size_t len);
/* Flushes what is held and, for a stream, appends the final chunk, the usage
 * chunk (include_usage) and `data: [DONE]`. Sets j->finish_reason (a tool
 * call turns "stop" into "tool_calls"). */
void srv_out_finish(srv_out *o, srv_job *j, const char *finish_reason);
void srv_out_free(srv_out *o);

/* The stream's first chunk (delta.role "assistant" for chat; nothing for
 * completions), appended to j->sse. */
void srv_stream_begin(srv_job *j);
/* A whole non-stream answer. */
void srv_response_json(const srv_job *j, q3_strbuf *out);

/* Parses one tool call's text ({"name": ..., "arguments": ...}); 0 on success
 * (name and arguments are new heap strings), -1 if it is not one. */
int srv_parse_tool_call(const char *text, size_t len, char **name, char **arguments);

#endif
