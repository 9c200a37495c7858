/* The model's text into content, reasoning and tool calls (see channel.h).
 *
 * Two layers: the marker splitter (srv_out_text) finds <think>, </think>,
 * <tool_call> and </tool_call> in the text and hands each piece on with its
 * channel; the policy below decides what a channel's text becomes and hands
 * that to render.h. A splitter by token ids calls the policy layer directly
 * (srv_out_put, srv_out_close). */
#include "server/channel.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "server/render.h"

/* The markers, as the model writes them. */
static const char MARK_THINK[] = "<think>", MARK_THINK_END[] = "</think>";
static const char MARK_TOOL[] = "<tool_call>", MARK_TOOL_END[] = "</tool_call>";

/* ---- the policy: what each channel's text becomes ------------------------------- */

/* Content: blank lines that open it (at the start, after a think block) are dropped. */
static void put_content(srv_out *o, srv_job *j, const char *s, size_t n)
{
    if (!o->content_any) {
        while (n && (*s == '\n')) { s++; n--; }
        if (!n) return;
        o->content_any = 1;
    }
    srv_render_content(j, s, n);
}

/* Reasoning: blank lines that open it are dropped; newlines at the end are held
 * until more reasoning follows (and dropped when it closes). */
static void put_reasoning(srv_out *o, srv_job *j, const char *s, size_t n)
{
    if (!o->reasoning_any) {
        while (n && *s == '\n') { s++; n--; }
        if (!n) return;
    }
    size_t body = n;
    while (body && s[body - 1] == '\n') body--;
    if (body) {
        static const char nl[] = "\n\n\n\n\n\n\n\n";
        while (o->held_nl > 0) {
            int k = o->held_nl > 8 ? 8 : o->held_nl;
            srv_render_reasoning(j, nl, (size_t)k);
            o->held_nl -= k;
        }
        srv_render_reasoning(j, s, body);
        o->reasoning_any = 1;
    }
    o->held_nl += (int)(n - body);
}

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

/* A tool call's text ends: closed (its end marker came) or cut off (the
 * answer ended inside it). A closed call that parses, while there is room,
 * becomes a tool call; anything else is not a tool call after all and stays
 * text, its markers as far as they came included. */
static void tool_call_end(srv_out *o, srv_job *j, int closed)
{
    char *name, *args;
    const char *t = o->tool.data ? o->tool.data : "";
    if (closed && j->res.n_tool_calls < SRV_MAX_TOOL_CALLS && !srv_parse_tool_call(t, o->tool.len, &name, &args)) {
        srv_render_tool_call(j, name, args);
    } else {
        put_content(o, j, MARK_TOOL, strlen(MARK_TOOL));
        put_content(o, j, t, o->tool.len);
        if (closed) put_content(o, j, MARK_TOOL_END, strlen(MARK_TOOL_END));
    }
    o->tool.len = 0;
}

/* Text of the current channel. */
static void put(srv_out *o, srv_job *j, const char *s, size_t n)
{
    switch (o->mode) {
    case SRV_CHANNEL_CONTENT: put_content(o, j, s, n); break;
    case SRV_CHANNEL_REASONING: put_reasoning(o, j, s, n); break;
    case SRV_CHANNEL_TOOL_CALL: q3_strbuf_put(&o->tool, s, n); break;
    }
}

/* The current channel ends (closed: its end marker came; else the answer
 * ended inside it); what follows is content. */
static void close_channel(srv_out *o, srv_job *j, int closed)
{
    switch (o->mode) {
    case SRV_CHANNEL_CONTENT: break;
    case SRV_CHANNEL_REASONING:
        o->held_nl = 0;
        if (closed) o->content_any = 0; /* the blank lines after </think> go too */
        break;
    case SRV_CHANNEL_TOOL_CALL: tool_call_end(o, j, closed); break;
    }
    o->mode = SRV_CHANNEL_CONTENT;
}

void srv_out_put(srv_out *o, srv_job *j, srv_channel ch, const char *s, size_t n)
{
    if (ch != o->mode) {
        close_channel(o, j, 1);
        o->mode = ch;
    }
    put(o, j, s, n);
}

void srv_out_close(srv_out *o, srv_job *j) { close_channel(o, j, 1); }

/* ---- the marker splitter ---------------------------------------------------------- */

/* Length of the longest suffix of s[0..n) that is a proper prefix of mark. */
static size_t partial_mark(const char *s, size_t n, const char *mark)
{
    size_t ml = strlen(mark);
    for (size_t k = ml - 1; k > 0; k--)
        if (k <= n && !memcmp(s + n - k, mark, k)) return k;
    return 0;
}

/* Hands on what o->pend holds, up to a possible marker prefix at its end
 * (final: all of it, and an open channel ends there). */
static void split(srv_out *o, srv_job *j, int final)
{
    for (;;) {
        const char *s = o->pend.data ? o->pend.data : "";
        size_t n = o->pend.len;
        /* the markers that can come next: an opening one in content, else the channel's end */
        const char *m1 = NULL, *m2 = NULL;
        if (o->mode == SRV_CHANNEL_CONTENT) {
            m1 = j->req.parse_reasoning ? MARK_THINK : NULL;
            m2 = j->req.parse_tools ? MARK_TOOL : NULL;
        } else {
            m1 = o->mode == SRV_CHANNEL_REASONING ? MARK_THINK_END : MARK_TOOL_END;
        }
        const char *h1 = m1 ? memmem(s, n, m1, strlen(m1)) : NULL, *h2 = m2 ? memmem(s, n, m2, strlen(m2)) : NULL;
        const char *hit = h1, *mark = m1;
        if (h2 && (!hit || h2 < hit)) { hit = h2; mark = m2; }
        size_t upto = hit ? (size_t)(hit - s) : n;
        if (!hit && !final) {
            size_t k1 = m1 ? partial_mark(s, n, m1) : 0, k2 = m2 ? partial_mark(s, n, m2) : 0;
            upto = n - (k1 > k2 ? k1 : k2);
        }
        put(o, j, s, upto);
        size_t consumed = upto;
        if (hit) {
            consumed += strlen(mark);
            if (o->mode == SRV_CHANNEL_CONTENT) o->mode = mark == MARK_THINK ? SRV_CHANNEL_REASONING : SRV_CHANNEL_TOOL_CALL;
            else close_channel(o, j, 1);
        }
        memmove(o->pend.data, s + consumed, n - consumed);
        o->pend.len = n - consumed;
        if (o->pend.data) o->pend.data[o->pend.len] = 0;
        if (!hit) break;
    }
    if (final) close_channel(o, j, 0);
}

void srv_out_text(srv_out *o, srv_job *j, const char *text, size_t len)
{
    if (j->req.kind == SRV_COMPLETION) { /* raw text: no markers */
        srv_render_content(j, text, len);
        return;
    }
    q3_strbuf_put(&o->pend, text, len);
    split(o, j, 0);
}

void srv_out_finish(srv_out *o, srv_job *j, srv_finish finish)
{
    if (j->req.kind == SRV_CHAT) split(o, j, 1);
    if (j->res.n_tool_calls && (finish == SRV_FINISH_STOP || finish == SRV_FINISH_STOP_STRING)) finish = SRV_FINISH_TOOL_CALLS;
    j->res.finish = finish;
    srv_render_end(j);
}

void srv_out_free(srv_out *o)
{
    free(o->pend.data);
    free(o->tool.data);
    memset(o, 0, sizeof *o);
}
