/* OpenAI answers: the error envelope, a whole (non-stream) response, and a
 * stream's SSE chunks (`data: {...}\n\n`, then `data: [DONE]\n\n`), with usage
 * and logprobs. No I/O: bytes go into strbufs (a stream's into j->sse).
 *
 * The output functions (srv_stream_begin .. srv_render_end) take a job whose
 * j->mu the caller holds; for a stream each appends an SSE chunk, otherwise
 * srv_render_content/_reasoning/_tool_call add to the whole answer. */
#ifndef Q3_SERVER_RENDER_H
#define Q3_SERVER_RENDER_H

#include <stddef.h>

#include "job.h"
#include "buf.h"

struct cJSON;

/* An error answer: HTTP status and the OpenAI envelope's fields. */
typedef struct srv_err {
    int status;            /* 0: no error */
    const char *type;      /* "invalid_request_error", ... */
    const char *code;      /* NULL or e.g. "model_not_found" */
    char param[64];        /* "" or the offending field */
    char message[384];
} srv_err;

/* Fills e; returns status. The message and param are made valid UTF-8 (they
 * may echo a client's bytes): bytes that are not become U+FFFD. */
int srv_err_set(srv_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}} into b (code: e->code, or the status as a number). */
void srv_err_json(const srv_err *e, srv_buf *b);

/* The error answer of a job that ended without an answer (FAILED, or
 * GONE_QUEUED: answered 500, though only a half-closed client still reads it). */
void srv_job_err(const srv_job *j, srv_err *e);

/* The wire's finish_reason for f ("stop", "length", "tool_calls"); NULL for
 * SRV_FINISH_NONE. The one place the enum becomes the wire's word. */
const char *srv_finish_wire(srv_finish f);

/* Appends s[0..n) (UTF-8; NUL bytes and all) as a quoted JSON string. */
void srv_json_string(srv_buf *b, const char *s, size_t n);

/* Appends item's unformatted JSON to b (b->oom when cJSON runs out of memory). */
void srv_put_json(srv_buf *b, const struct cJSON *item);

/* ---- the answer as it comes (caller holds j->mu) ---------------------------- */

/* The stream's first chunk (delta.role "assistant" for chat; nothing for
 * completions). */
void srv_stream_begin(srv_job *j);
/* A piece of the answer's text, or of its reasoning (chat only). */
void srv_render_content(srv_job *j, const char *s, size_t n);
void srv_render_reasoning(srv_job *j, const char *s, size_t n);
/* A whole tool call: recorded in the job (which takes both heap strings) and,
 * for a stream, sent as a tool_calls delta. */
void srv_render_tool_call(srv_job *j, char *name, char *arguments);
/* Stream: the final chunk (with res.finish), the usage chunk (include_usage)
 * and `data: [DONE]`. Nothing for a whole answer. */
void srv_render_end(srv_job *j);
/* Stream of a FAILED job: its error event and `data: [DONE]`, once (then
 * st.sse_state is SRV_SSE_ERROR_SENT). */
void srv_render_failure(srv_job *j);

/* A whole non-stream answer. */
void srv_response_json(const srv_job *j, srv_buf *out);

#endif
