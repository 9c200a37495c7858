/* The model's text split into channels: reasoning (<think>...</think>), tool
 * calls (<tool_call>{json}</tool_call>) and content, holding back only a
 * possible marker prefix. What comes out goes to render.h: a piece of content,
 * a piece of reasoning, a finished tool call. Completions are raw text: all
 * content. Every call here: the caller holds j->mu. */
#ifndef Q3_SERVER_CHANNEL_H
#define Q3_SERVER_CHANNEL_H

#include <stddef.h>

#include "server/job.h"
#include "util/strbuf.h"

typedef enum srv_channel {
    SRV_CHANNEL_CONTENT,    /* the answer */
    SRV_CHANNEL_REASONING,  /* inside <think>: reasoning_content */
    SRV_CHANNEL_TOOL_CALL,  /* inside <tool_call>: JSON held until the call ends */
} srv_channel;

/* One answer's splitting state; zero-initialised, freed by srv_out_free. */
typedef struct srv_out {
    srv_channel mode;      /* the channel text goes to now */
    q3_strbuf pend;        /* srv_out_text: text not yet classified */
    q3_strbuf tool;        /* the current tool call's text */
    int content_any, reasoning_any;
    int held_nl;           /* newlines held back at the end of the reasoning */
} srv_out;

/* Generated text, split at the markers. */
void srv_out_text(srv_out *o, srv_job *j, const char *text, size_t len);
/* Text already known to be of channel ch (what a splitter by token ids hands
 * over; chat only). A change of channel closes the previous one as its end
 * marker would: srv_out_close. */
void srv_out_put(srv_out *o, srv_job *j, srv_channel ch, const char *s, size_t n);
/* The current channel's end marker came: a tool call's text is parsed now (not
 * a tool call after all: it stays text); what follows is content. */
void srv_out_close(srv_out *o, srv_job *j);
/* The answer ends: flushes what is held (a channel still open ends unclosed:
 * a cut-off tool call is text), sets j->res.finish (a tool call turns a stop
 * into SRV_FINISH_TOOL_CALLS) and, for a stream, appends the final chunks
 * (srv_render_end). */
void srv_out_finish(srv_out *o, srv_job *j, srv_finish finish);
void srv_out_free(srv_out *o);

/* Parses one tool call's text ({"name": ..., "arguments": ...}); 0 on success
 * (name and arguments are new heap strings), -1 if it is not one. */
int srv_parse_tool_call(const char *text, size_t len, char **name, char **arguments);

#endif
