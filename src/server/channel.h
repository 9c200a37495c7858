/* The model's text split into channels: reasoning (<think>...</think>), tool
 * calls (<tool_call>{json}</tool_call>) and content, holding back only a
 * possible marker prefix. What comes out goes to render.h: a piece of content,
 * a piece of reasoning, a finished tool call. Completions are raw text: all
 * content. The caller holds j->mu. */
#ifndef Q3_SERVER_CHANNEL_H
#define Q3_SERVER_CHANNEL_H

#include <stddef.h>

#include "server/job.h"
#include "util/strbuf.h"

typedef struct srv_out {
    int mode;              /* 0 content, 1 reasoning, 2 inside a tool call */
    q3_strbuf pend;        /* text not yet classified */
    q3_strbuf tool;        /* the current tool call's text */
    int content_any, reasoning_any;
    int held_nl;           /* newlines held back at the end of the reasoning */
} srv_out;

void srv_out_text(srv_out *o, srv_job *j, const char *text, size_t len);
/* Flushes what is held, sets j->finish_reason (a tool call turns "stop" into
 * "tool_calls") and, for a stream, appends the final chunks (srv_render_end). */
void srv_out_finish(srv_out *o, srv_job *j, const char *finish_reason);
void srv_out_free(srv_out *o);

/* Parses one tool call's text ({"name": ..., "arguments": ...}); 0 on success
 * (name and arguments are new heap strings), -1 if it is not one. */
int srv_parse_tool_call(const char *text, size_t len, char **name, char **arguments);

#endif
