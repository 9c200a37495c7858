/* The model's text into content, reasoning and tool calls (see channel.h). */
#include "server/channel.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "server/render.h"

static void emit_content(srv_out *o, srv_job *j, const char *s, size_t n)
{
    if (!o->content_any) { /* the blank lines after a think block */
        while (n && (*s == '\n')) { s++; n--; }
        if (!n) return;
        o->content_any = 1;
    }
    srv_render_content(j, s, n);
}

static void emit_reasoning(srv_out *o, srv_job *j, const char *s, size_t n, int final)
{
    if (!o->reasoning_any) {
        while (n && *s == '\n') { s++; n--; }
        if (!n) return;
    }
    /* newlines at the end are held until more reasoning follows */
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
    if (final) o->held_nl = 0;
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

static void tool_call_done(srv_out *o, srv_job *j)
{
    char *name, *args;
    const char *t = o->tool.data ? o->tool.data : "";
    if (j->res.n_tool_calls >= SRV_MAX_TOOL_CALLS || srv_parse_tool_call(t, o->tool.len, &name, &args)) {
        /* not a tool call after all: it stays text */
        emit_content(o, j, "<tool_call>", 11);
        emit_content(o, j, t, o->tool.len);
        emit_content(o, j, "</tool_call>", 12);
    } else {
        srv_render_tool_call(j, name, args);
    }
    o->tool.len = 0;
}

/* Markers the text is split at, by mode. */
static const char *const MARK_THINK = "<think>", *const MARK_THINK_END = "</think>";
static const char *const MARK_TOOL = "<tool_call>", *const MARK_TOOL_END = "</tool_call>";

/* Length of the longest suffix of s[0..n) that is a proper prefix of mark. */
static size_t partial_mark(const char *s, size_t n, const char *mark)
{
    size_t ml = strlen(mark);
    for (size_t k = ml - 1; k > 0; k--)
        if (k <= n && !memcmp(s + n - k, mark, k)) return k;
    return 0;
}

static void process(srv_out *o, srv_job *j, int final)
{
    for (;;) {
        const char *s = o->pend.data ? o->pend.data : "";
        size_t n = o->pend.len;
        const char *m1 = NULL, *m2 = NULL;
        if (o->mode == 0) {
            m1 = j->req.parse_reasoning ? MARK_THINK : NULL;
            m2 = j->req.parse_tools ? MARK_TOOL : NULL;
        } else {
            m1 = o->mode == 1 ? MARK_THINK_END : MARK_TOOL_END;
        }
        const char *h1 = m1 ? memmem(s, n, m1, strlen(m1)) : NULL, *h2 = m2 ? memmem(s, n, m2, strlen(m2)) : NULL;
        const char *hit = h1, *mark = m1;
        if (h2 && (!hit || h2 < hit)) { hit = h2; mark = m2; }
        size_t upto = hit ? (size_t)(hit - s) : n;
        if (!hit && !final) {
            size_t k1 = m1 ? partial_mark(s, n, m1) : 0, k2 = m2 ? partial_mark(s, n, m2) : 0;
            upto = n - (k1 > k2 ? k1 : k2);
        }
        if (o->mode == 0) emit_content(o, j, s, upto);
        else if (o->mode == 1) emit_reasoning(o, j, s, upto, hit != NULL || final);
        else q3_strbuf_put(&o->tool, s, upto);
        size_t consumed = upto;
        if (hit) {
            consumed += strlen(mark);
            if (o->mode == 0) o->mode = mark == MARK_THINK ? 1 : 2;
            else {
                if (o->mode == 1) o->content_any = 0; /* strip the blank lines after </think> */
                if (o->mode == 2) tool_call_done(o, j);
                o->mode = 0;
            }
        }
        memmove(o->pend.data, s + consumed, n - consumed);
        o->pend.len = n - consumed;
        if (o->pend.data) o->pend.data[o->pend.len] = 0;
        if (!hit) break;
    }
    if (final && o->mode == 2) { /* an unfinished tool call is text */
        emit_content(o, j, MARK_TOOL, strlen(MARK_TOOL));
        emit_content(o, j, o->tool.data ? o->tool.data : "", o->tool.len);
        o->tool.len = 0;
        o->mode = 0;
    }
}

void srv_out_text(srv_out *o, srv_job *j, const char *text, size_t len)
{
    if (j->req.kind == SRV_COMPLETION) { /* raw text: no markers */
        srv_render_content(j, text, len);
        return;
    }
    q3_strbuf_put(&o->pend, text, len);
    process(o, j, 0);
}

void srv_out_finish(srv_out *o, srv_job *j, const char *finish_reason)
{
    if (j->req.kind == SRV_CHAT) process(o, j, 1);
    if (j->res.n_tool_calls && !strcmp(finish_reason, "stop")) finish_reason = "tool_calls";
    j->res.finish_reason = finish_reason;
    srv_render_end(j);
}

void srv_out_free(srv_out *o)
{
    free(o->pend.data);
    free(o->tool.data);
    memset(o, 0, sizeof *o);
}
