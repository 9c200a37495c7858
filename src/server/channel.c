/* The model's text into content, reasoning and tool calls (see channel.h).
 *
 * The library's generation loop splits the text by token id (q3_gen_opts
 * split_channels: each q3_text_piece carries its channel and the span's
 * edges, thinking and content already shaped); this is the server's policy
 * for what each channel becomes on the wire, handed to render.h. */
#include "channel.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "render.h"

/* The markup as the model writes it: the text of a span that is not parsed. */
static const char *const OPEN_MARK[] = {"", "<think>", "<tool_call>"};
static const char *const CLOSE_MARK[] = {"", "</think>", "</tool_call>"};

int srv_parse_tool_call(const char *text, size_t len, char **name, char **arguments)
{
    *name = *arguments = NULL;
    cJSON *v = cJSON_ParseWithLength(text, len);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(v, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(v, "arguments");
    if (!cJSON_IsObject(v) || !cJSON_IsString(nm)) {
        cJSON_Delete(v);
        return -1;
    }
    *name = strdup(nm->valuestring);
    if (cJSON_IsString(args)) *arguments = strdup(args->valuestring);
    else if (args) *arguments = cJSON_PrintUnformatted(args);
    else *arguments = strdup("{}");
    cJSON_Delete(v);
    if (!*name || !*arguments) {
        free(*name);
        free(*arguments);
        *name = *arguments = NULL;
        return -1;
    }
    return 0;
}

/* A tool call's text ends: closed (its end token came) or cut off (the
 * answer ended inside it). A closed call that parses, while there is room,
 * becomes a tool call; anything else is not a tool call after all and stays
 * text, its markup as far as it came included. */
static void tool_call_end(srv_out *o, srv_job *j, int closed)
{
    char *name, *args;
    const char *t = o->tool.data ? o->tool.data : "";
    if (closed && j->res.n_tool_calls < SRV_MAX_TOOL_CALLS && !srv_parse_tool_call(t, o->tool.len, &name, &args)) {
        srv_render_tool_call(j, name, args);
    } else {
        srv_render_content(j, OPEN_MARK[Q3_CHANNEL_TOOL_CALL], strlen(OPEN_MARK[Q3_CHANNEL_TOOL_CALL]));
        srv_render_content(j, t, o->tool.len);
        if (closed) srv_render_content(j, CLOSE_MARK[Q3_CHANNEL_TOOL_CALL], strlen(CLOSE_MARK[Q3_CHANNEL_TOOL_CALL]));
    }
    o->tool.len = 0;
}

/* Whether the request asked for channel ch apart (else its span is text). */
static int parsed(const srv_job *j, q3_channel ch)
{
    return ch == Q3_CHANNEL_THINKING ? j->req.parse_reasoning : ch == Q3_CHANNEL_TOOL_CALL ? j->req.parse_tools : 0;
}

void srv_out_piece(srv_out *o, srv_job *j, const q3_text_piece *p)
{
    q3_channel ch = p->channel;
    if (ch == Q3_CHANNEL_CONTENT) {
        srv_render_content(j, p->text, p->len);
        return;
    }
    if (!parsed(j, ch)) { /* the span as the text it was */
        if (p->edge == Q3_EDGE_OPEN) srv_render_content(j, OPEN_MARK[ch], strlen(OPEN_MARK[ch]));
        else if (p->edge == Q3_EDGE_CLOSE) srv_render_content(j, CLOSE_MARK[ch], strlen(CLOSE_MARK[ch]));
        else srv_render_content(j, p->text, p->len);
        return;
    }
    if (ch == Q3_CHANNEL_THINKING) {
        if (p->edge == Q3_EDGE_NONE) srv_render_reasoning(j, p->text, p->len);
        return;
    }
    switch (p->edge) { /* a tool call: held until it ends */
    case Q3_EDGE_OPEN: o->tool.len = 0; break;
    case Q3_EDGE_NONE: srv_buf_put(&o->tool, p->text, p->len); break;
    case Q3_EDGE_CLOSE: tool_call_end(o, j, 1); break;
    case Q3_EDGE_CUT: tool_call_end(o, j, 0); break;
    }
}

void srv_out_finish(srv_out *o, srv_job *j, srv_finish finish)
{
    if (j->res.n_tool_calls && (finish == SRV_FINISH_STOP || finish == SRV_FINISH_STOP_STRING)) finish = SRV_FINISH_TOOL_CALLS;
    j->res.finish = finish;
    srv_render_end(j);
}

void srv_out_free(srv_out *o)
{
    free(o->tool.data);
    memset(o, 0, sizeof *o);
}
