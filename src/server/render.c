/* OpenAI answers (see render.h): the error envelope, whole responses, SSE
 * chunks, usage and logprobs. */
#include "render.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- the error envelope ----------------------------------------------------------- */

/* The length of the UTF-8 character at s[0..n) (1..4), or 0 if it is not a
 * whole, valid one (RFC 3629: no overlongs, surrogates or values past U+10FFFF). */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) return 1;
    size_t len = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3 : s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (s[0] == 0xe0 && s[1] < 0xa0) return 0;  /* overlong */
    if (s[0] == 0xed && s[1] >= 0xa0) return 0;  /* surrogate */
    if (s[0] == 0xf0 && s[1] < 0x90) return 0;  /* overlong */
    if (s[0] == 0xf4 && s[1] >= 0x90) return 0;  /* past U+10FFFF */
    return len;
}

/* s (NUL-terminated, in a buffer of cap bytes) made valid UTF-8 in place: a
 * byte that does not start a whole character becomes U+FFFD, and the text is
 * cut at a character boundary if that makes it too long. Error messages echo
 * the client's bytes (a model name, a path), and JSON must be UTF-8. */
static void utf8_clean(char *s, size_t cap)
{
    char out[512];
    size_t n = strlen(s), o = 0, lim = cap < sizeof out ? cap : sizeof out;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_char((const unsigned char *)s + i, n - i);
        const char *src = l ? s + i : "\xef\xbf\xbd";
        size_t sl = l ? l : 3;
        if (o + sl + 1 > lim) break;
        memcpy(out + o, src, sl);
        o += sl;
        i += l ? l : 1;
    }
    out[o] = 0;
    memcpy(s, out, o + 1);
}

int srv_err_set(srv_err *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    utf8_clean(e->param, sizeof e->param);
    utf8_clean(e->message, sizeof e->message);
    return status;
}

void srv_json_string(srv_buf *b, const char *s, size_t n)
{
    srv_buf_put(b, "\"", 1);
    size_t run = 0; /* s[run..i) goes out as it is */
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char u[8];
        const char *esc = ch == '"' ? "\\\"" : ch == '\\' ? "\\\\" : ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : NULL;
        if (!esc && ch < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", ch);
            esc = u;
        }
        if (!esc) continue;
        srv_buf_put(b, s + run, i - run);
        srv_buf_puts(b, esc);
        run = i + 1;
    }
    srv_buf_put(b, s + run, n - run);
    srv_buf_put(b, "\"", 1);
}

/* A text field that may hold NUL bytes (cJSON's strings end at the first). */
static void add_text(cJSON *o, const char *key, const char *s, size_t n)
{
    srv_buf b = {0};
    srv_json_string(&b, s ? s : "", s ? n : 0);
    cJSON_AddRawToObject(o, key, b.data && !b.oom ? b.data : "\"\"");
    free(b.data);
}

static cJSON *text_item(const char *s, size_t n)
{
    srv_buf b = {0};
    srv_json_string(&b, s ? s : "", s ? n : 0);
    cJSON *it = cJSON_CreateRaw(b.data && !b.oom ? b.data : "\"\"");
    free(b.data);
    return it;
}

/* Appends item's unformatted JSON (cJSON escapes strings as JSON requires). */
void srv_put_json(srv_buf *b, const cJSON *item)
{
    char *s = cJSON_PrintUnformatted(item);
    if (!s) { b->oom = 1; return; }
    srv_buf_puts(b, s);
    cJSON_free(s);
}

void srv_err_json(const srv_err *e, srv_buf *b)
{
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNumberToObject(err, "code", e->status);
    srv_put_json(b, root);
    cJSON_Delete(root);
}

/* The status of an error answer gives its type. */
static const char *err_type(int status) { return status >= 500 ? "server_error" : "invalid_request_error"; }

void srv_job_err(const srv_job *j, srv_err *e)
{
    if (j->res.state == SRV_JOB_GONE_QUEUED) /* only a client that half-closed its socket still reads this */
        srv_err_set(e, 500, "invalid_request_error", NULL, NULL, "%s", j->res.err_msg);
    else
        srv_err_set(e, j->res.err_status, err_type(j->res.err_status), NULL, NULL, "%s", j->res.err_msg);
}

void srv_render_failure(srv_job *j)
{
    if (j->st.sse_state == SRV_SSE_ERROR_SENT) return;
    srv_err e;
    srv_job_err(j, &e);
    srv_buf_puts(&j->st.sse, "data: ");
    srv_err_json(&e, &j->st.sse);
    srv_buf_puts(&j->st.sse, "\n\ndata: [DONE]\n\n");
    j->st.sse_state = SRV_SSE_ERROR_SENT;
}

/* ---- pieces of an answer ---------------------------------------------------------- */

static cJSON *usage_json(const srv_job *j)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->req.n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->res.n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", j->req.n_prompt + j->res.n_completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->res.n_cached);
    return u;
}

static cJSON *chunk_head(const srv_job *j)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", j->req.id);
    cJSON_AddStringToObject(c, "object", j->req.kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)j->req.created);
    cJSON_AddStringToObject(c, "model", j->req.model_name);
    return c;
}

static void sse_put(srv_job *j, cJSON *chunk)
{
    srv_buf_puts(&j->st.sse, "data: ");
    srv_put_json(&j->st.sse, chunk);
    srv_buf_puts(&j->st.sse, "\n\n");
    cJSON_Delete(chunk);
}

/* A chunk with one choice; delta (chat) or text (completion) given by the caller. */
static cJSON *chunk_choice(const srv_job *j, cJSON **choice)
{
    cJSON *c = chunk_head(j), *arr = cJSON_AddArrayToObject(c, "choices");
    *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, *choice);
    cJSON_AddNumberToObject(*choice, "index", 0);
    return c;
}

/* The bytes of a token (none for an unknown id or no tokenizer). */
static const char *token_bytes(const q3_tokenizer *tok, int32_t id, size_t *n)
{
    const char *b = NULL;
    *n = 0;
    if (tok && q3_tokenizer_piece(tok, id, &b, n)) *n = 0;
    return b;
}

/* A token's text as valid UTF-8 (bytes that are not part of a whole character
 * become U+FFFD, as the library's detokenizer writes them), and its raw bytes.
 * d: the caller's detokenizer of tok (NULL: no text), left afresh by the flush. */
static void token_text(q3_detokenizer *d, const q3_tokenizer *tok, int32_t id, srv_buf *text, cJSON **bytes)
{
    size_t n = 0;
    const char *b = token_bytes(tok, id, &n);
    if (bytes) *bytes = cJSON_CreateArray();
    const char *s;
    size_t sl;
    if (n && d && !q3_detokenizer_push(d, id, &s, &sl)) srv_buf_put(text, s, sl);
    if (n && d && !q3_detokenizer_flush(d, &s, &sl)) srv_buf_put(text, s, sl);
    for (size_t i = 0; bytes && i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)b[i]));
}

static cJSON *lp_item(q3_detokenizer *d, const q3_tokenizer *tok, int32_t id, float lp)
{
    cJSON *o = cJSON_CreateObject(), *bytes;
    srv_buf t = {0};
    token_text(d, tok, id, &t, &bytes);
    add_text(o, "token", t.data, t.len);
    cJSON_AddNumberToObject(o, "logprob", lp);
    cJSON_AddItemToObject(o, "bytes", bytes);
    free(t.data);
    return o;
}

/* The logprobs object for entries [from, to): chat {"content": [...]}, or the
 * completions form {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static cJSON *logprobs_json(const srv_job *j, int from, int to)
{
    cJSON *o = cJSON_CreateObject();
    q3_detokenizer *d = NULL; /* one for all the entries' texts */
    if (j->req.tok && q3_detokenizer_new(j->req.tok, &d)) d = NULL;
    if (j->req.kind == SRV_CHAT) {
        cJSON *arr = cJSON_AddArrayToObject(o, "content");
        for (int i = from; i < to; i++) {
            const q3_token_logprob *l = &j->res.lp[i];
            cJSON *it = lp_item(d, j->req.tok, l->id, l->logprob), *top = cJSON_AddArrayToObject(it, "top_logprobs");
            for (int k = 0; k < l->n_top; k++) cJSON_AddItemToArray(top, lp_item(d, j->req.tok, l->top_id[k], l->top_logprob[k]));
            cJSON_AddItemToArray(arr, it);
        }
        q3_detokenizer_free(d);
        return o;
    }
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    size_t off = 0;
    for (int i = 0; i < from; i++) {
        size_t n = 0;
        token_bytes(j->req.tok, j->res.lp[i].id, &n);
        off += n;
    }
    for (int i = from; i < to; i++) {
        const q3_token_logprob *l = &j->res.lp[i];
        srv_buf t = {0};
        token_text(d, j->req.tok, l->id, &t, NULL);
        cJSON_AddItemToArray(toks, text_item(t.data, t.len));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(l->logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        size_t n = 0;
        token_bytes(j->req.tok, l->id, &n);
        off += n;
        free(t.data);
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < l->n_top; k++) {
            srv_buf tt = {0};
            token_text(d, j->req.tok, l->top_id[k], &tt, NULL);
            if (!cJSON_GetObjectItemCaseSensitive(top, tt.data ? tt.data : ""))
                cJSON_AddNumberToObject(top, tt.data ? tt.data : "", l->top_logprob[k]);
            free(tt.data);
        }
        cJSON_AddItemToArray(tops, top);
    }
    q3_detokenizer_free(d);
    return o;
}

/* Stream chunks carry the entries not yet sent (j->mu held by the caller). */
static void choice_logprobs(srv_job *j, cJSON *choice)
{
    if (!j->req.logprobs) {
        cJSON_AddNullToObject(choice, "logprobs");
        return;
    }
    cJSON_AddItemToObject(choice, "logprobs", logprobs_json(j, j->st.lp_sent, j->res.n_lp));
    j->st.lp_sent = j->res.n_lp;
}

const char *srv_finish_wire(srv_finish f)
{
    switch (f) {
    case SRV_FINISH_STOP:
    case SRV_FINISH_STOP_STRING: return "stop";
    case SRV_FINISH_LENGTH: return "length";
    case SRV_FINISH_TOOL_CALLS: return "tool_calls";
    case SRV_FINISH_NONE: break;
    }
    return NULL;
}

/* "finish_reason": the wire's word, or null while the answer goes on. */
static void choice_tail(cJSON *choice, srv_finish f)
{
    const char *w = srv_finish_wire(f);
    if (w) cJSON_AddStringToObject(choice, "finish_reason", w);
    else cJSON_AddNullToObject(choice, "finish_reason");
}

/* llama-server's /completion answer: {"index", "content", "stop", ...}; with
 * `last`, the counts and why it stopped ("eos", "word", "limit"). */
static cJSON *llama_chunk(const srv_job *j, const char *content, size_t n, int last)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    add_text(c, "content", content, n);
    cJSON_AddBoolToObject(c, "stop", last);
    if (!last) return c;
    cJSON_AddStringToObject(c, "model", j->req.model_name);
    cJSON_AddNumberToObject(c, "tokens_predicted", j->res.n_completion);
    cJSON_AddNumberToObject(c, "tokens_evaluated", j->req.n_prompt);
    cJSON_AddNumberToObject(c, "tokens_cached", j->res.n_cached);
    srv_finish f = j->res.finish;
    cJSON_AddStringToObject(c, "stop_type", f == SRV_FINISH_LENGTH ? "limit" : f == SRV_FINISH_STOP_STRING ? "word" : "eos");
    cJSON_AddBoolToObject(c, "truncated", 0);
    return c;
}

/* ---- the answer as it comes: SSE chunks, or the whole answer's fields ------------- */

void srv_stream_begin(srv_job *j)
{
    if (j->req.kind != SRV_CHAT) return;
    cJSON *choice, *c = chunk_choice(j, &choice);
    cJSON *d = cJSON_AddObjectToObject(choice, "delta");
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    cJSON_AddNullToObject(choice, "logprobs");
    choice_tail(choice, SRV_FINISH_NONE);
    sse_put(j, c);
}


/* A piece of content (0) or reasoning (1): a chunk for a stream, else appended
 * to the whole answer. */
static void put_text(srv_job *j, int reasoning, const char *s, size_t n)
{
    if (!n) return;
    if (!j->req.stream) {
        srv_buf_put(reasoning ? &j->res.reasoning : &j->res.content, s, n);
        return;
    }
    if (j->req.kind == SRV_LLAMA_COMPLETION) {
        sse_put(j, llama_chunk(j, s, n, 0));
        return;
    }
    cJSON *choice, *c = chunk_choice(j, &choice);
    if (j->req.kind == SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(choice, "delta");
        add_text(d, reasoning ? "reasoning_content" : "content", s, n);
    } else {
        add_text(choice, "text", s, n);
    }
    choice_logprobs(j, choice);
    choice_tail(choice, SRV_FINISH_NONE);
    sse_put(j, c);
}

void srv_render_content(srv_job *j, const char *s, size_t n) { put_text(j, 0, s, n); }
void srv_render_reasoning(srv_job *j, const char *s, size_t n) { put_text(j, 1, s, n); }

void srv_render_tool_call(srv_job *j, char *name, char *arguments)
{
    int k = j->res.n_tool_calls++;
    j->res.tool_calls[k].name = name;
    j->res.tool_calls[k].arguments = arguments;
    if (!j->req.stream) return;
    cJSON *choice, *c = chunk_choice(j, &choice);
    cJSON *d = cJSON_AddObjectToObject(choice, "delta"), *arr = cJSON_AddArrayToObject(d, "tool_calls");
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, tc);
    char id[96];
    snprintf(id, sizeof id, "call_%s_%d", j->req.id, k);
    cJSON_AddNumberToObject(tc, "index", k);
    cJSON_AddStringToObject(tc, "id", id);
    cJSON_AddStringToObject(tc, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(tc, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", arguments);
    choice_logprobs(j, choice);
    choice_tail(choice, SRV_FINISH_NONE);
    sse_put(j, c);
}

void srv_render_end(srv_job *j)
{
    if (!j->req.stream) return;
    if (j->req.kind == SRV_LLAMA_COMPLETION) { /* llama-server ends this stream with stop: true, no [DONE] */
        sse_put(j, llama_chunk(j, "", 0, 1));
        return;
    }
    cJSON *choice, *c = chunk_choice(j, &choice);
    if (j->req.kind == SRV_CHAT) cJSON_AddObjectToObject(choice, "delta");
    else cJSON_AddStringToObject(choice, "text", "");
    choice_logprobs(j, choice);
    choice_tail(choice, j->res.finish);
    sse_put(j, c);
    if (j->req.include_usage) {
        c = chunk_head(j);
        cJSON_AddArrayToObject(c, "choices");
        cJSON_AddItemToObject(c, "usage", usage_json(j));
        sse_put(j, c);
    }
    srv_buf_puts(&j->st.sse, "data: [DONE]\n\n");
}

/* ---- a whole answer --------------------------------------------------------------- */

void srv_response_json(const srv_job *j, srv_buf *out)
{
    if (j->req.kind == SRV_LLAMA_COMPLETION) {
        cJSON *r = llama_chunk(j, j->res.content.data, j->res.content.len, 1);
        srv_put_json(out, r);
        cJSON_Delete(r);
        return;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", j->req.id);
    cJSON_AddStringToObject(r, "object", j->req.kind == SRV_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)j->req.created);
    cJSON_AddStringToObject(r, "model", j->req.model_name);
    cJSON *arr = cJSON_AddArrayToObject(r, "choices"), *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    if (j->req.kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (j->res.n_tool_calls && !j->res.content.len) cJSON_AddNullToObject(m, "content");
        else add_text(m, "content", j->res.content.data, j->res.content.len);
        if (j->res.reasoning.len) add_text(m, "reasoning_content", j->res.reasoning.data, j->res.reasoning.len);
        if (j->res.n_tool_calls) {
            cJSON *tcs = cJSON_AddArrayToObject(m, "tool_calls");
            for (int k = 0; k < j->res.n_tool_calls; k++) {
                cJSON *tc = cJSON_CreateObject();
                cJSON_AddItemToArray(tcs, tc);
                char id[96];
                snprintf(id, sizeof id, "call_%s_%d", j->req.id, k);
                cJSON_AddStringToObject(tc, "id", id);
                cJSON_AddStringToObject(tc, "type", "function");
                cJSON *f = cJSON_AddObjectToObject(tc, "function");
                cJSON_AddStringToObject(f, "name", j->res.tool_calls[k].name);
                cJSON_AddStringToObject(f, "arguments", j->res.tool_calls[k].arguments);
            }
        }
    } else {
        add_text(choice, "text", j->res.content.data, j->res.content.len);
    }
    if (j->req.logprobs) cJSON_AddItemToObject(choice, "logprobs", logprobs_json(j, 0, j->res.n_lp));
    else cJSON_AddNullToObject(choice, "logprobs");
    choice_tail(choice, j->res.finish != SRV_FINISH_NONE ? j->res.finish : SRV_FINISH_STOP);
    cJSON_AddItemToObject(r, "usage", usage_json(j));
    srv_put_json(out, r);
    cJSON_Delete(r);
}
