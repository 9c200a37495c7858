/* The model's text as the wire has it: content, reasoning_content and
 * tool_calls, from the channels the library's generation loop splits by
 * token id. What comes out goes to render.h: a piece of content, a piece of
 * reasoning, a finished tool call. Every call here: the caller holds j->mu. */
#ifndef Q3_SERVER_CHANNEL_H
#define Q3_SERVER_CHANNEL_H

#include <stddef.h>

#include "job.h"
#include "buf.h"

/* One answer's state: the tool call being read; zero-initialised, freed by
 * srv_out_free. */
typedef struct srv_out {
    srv_buf tool;        /* the current tool call's text */
} srv_out;

/* A piece of the generated text, as the generation loop hands it over
 * (q3_gen_opts.split_channels for chat, everything content for
 * completions): content goes out as content; thinking as reasoning_content;
 * a tool call's JSON is held until its closing token and then parsed (not a
 * tool call after all, or cut off: it stays text, markup included); a span
 * the request did not ask apart stays text. */
void srv_out_piece(srv_out *o, srv_job *j, const q3_text_piece *p);
/* The answer ends: sets j->res.finish (a tool call turns a stop into
 * SRV_FINISH_TOOL_CALLS) and, for a stream, appends the final chunks
 * (srv_render_end). */
void srv_out_finish(srv_out *o, srv_job *j, srv_finish finish);
void srv_out_free(srv_out *o);

/* Parses one tool call's text ({"name": ..., "arguments": ...}); 0 on success
 * (name and arguments are new heap strings), -1 if it is not one. */
int srv_parse_tool_call(const char *text, size_t len, char **name, char **arguments);

#endif
