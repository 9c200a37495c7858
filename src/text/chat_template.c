/* Qwen3's chat template in C. The rendering below follows
 * tests/data/tokenizer/chat_template.jinja statement by statement; the
 * comments quote the Jinja each part stands for, so the two can be read
 * side by side. See chat_template.h for what is accepted and refused. */
#include "text/chat_template.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_write.h"
#include "util/error.h"
#include "util/file.h"
#include "util/strbuf.h"

/* ---- recognising templates ----------------------------------------------- */

/* Qwen3's template (tokenizer_config.json of the Qwen3 releases) is known by
 * its length and 64-bit FNV-1a hash: q3 only renders the exact text whose
 * behaviour chat_template.c reproduces. */
#define QWEN3_TEMPLATE_LEN 4116
#define QWEN3_TEMPLATE_FNV1A 0x2bfdb7aa9754484eull

static uint64_t fnv1a64(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

q3_chat_template_kind q3_chat_template_identify(const char *text, size_t len)
{
    if (text && len == QWEN3_TEMPLATE_LEN && fnv1a64(text, len) == QWEN3_TEMPLATE_FNV1A)
        return Q3_CHAT_TEMPLATE_QWEN3;
    return Q3_CHAT_TEMPLATE_UNKNOWN;
}

int q3_chat_template_is_qwen3(const char *template_text)
{
    return template_text &&
           q3_chat_template_identify(template_text, strlen(template_text)) == Q3_CHAT_TEMPLATE_QWEN3;
}

const char *q3_chat_template_name(q3_chat_template_kind kind)
{
    return kind == Q3_CHAT_TEMPLATE_QWEN3 ? "qwen3" : "unknown";
}

/* Identifies text taken from `where` (a file name, or a file and key). */
static q3_status identify_or_fail(const char *text, size_t len, const char *where,
                                  q3_chat_template_kind *out)
{
    *out = q3_chat_template_identify(text, len);
    if (*out != Q3_CHAT_TEMPLATE_UNKNOWN) return Q3_OK;
    return q3_fail(Q3_ERR_UNSUPPORTED,
                   "%s: the chat template (%zu bytes, fnv1a64 %016llx) is not one q3 knows "
                   "(q3 renders only Qwen3's template); it will not render chats with a "
                   "template it does not implement",
                   where, len, (unsigned long long)fnv1a64(text, len));
}

/* The template inside a parsed tokenizer_config.json. */
static q3_status template_from_config(const cJSON *config, const char *path,
                                      q3_chat_template_kind *out)
{
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(config, "chat_template");
    if (!tmpl || cJSON_IsNull(tmpl))
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s has no chat_template: this model has no chat format",
                       path);
    if (cJSON_IsString(tmpl))
        return identify_or_fail(tmpl->valuestring, strlen(tmpl->valuestring), path, out);
    if (cJSON_IsArray(tmpl)) {
        /* Several named templates: transformers uses the one named "default". */
        const cJSON *entry;
        cJSON_ArrayForEach(entry, tmpl) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry, "name");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(entry, "template");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(text))
                return identify_or_fail(text->valuestring, strlen(text->valuestring), path, out);
        }
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "%s: chat_template is a list of named templates without one named \"default\"",
                       path);
    }
    return q3_fail(Q3_ERR_FORMAT, "%s: chat_template must be a string or a list, not a %s", path,
                   cJSON_IsObject(tmpl) ? "object" : "scalar");
}

q3_status q3_chat_template_load(const char *path, q3_chat_template_kind *out)
{
    enum { MAX_CONFIG_BYTES = 64 << 20 };
    *out = Q3_CHAT_TEMPLATE_UNKNOWN;
    if (!path) return q3_fail(Q3_ERR_INVALID, "chat template: no path given");

    char *file = NULL;
    q3_status st;
    if (q3_is_dir(path)) {
        /* A model folder: chat_template.jinja wins over tokenizer_config.json,
         * as in transformers. */
        size_t n = strlen(path) + sizeof "/tokenizer_config.json";
        file = malloc(n);
        if (!file) return q3_fail(Q3_ERR_NOMEM, "chat template: out of memory");
        snprintf(file, n, "%s/chat_template.jinja", path);
        if (!q3_file_exists(file)) snprintf(file, n, "%s/tokenizer_config.json", path);
        if (!q3_file_exists(file)) {
            free(file);
            return q3_fail(Q3_ERR_IO,
                           "%s: no chat template (neither chat_template.jinja nor "
                           "tokenizer_config.json is there)",
                           path);
        }
        path = file;
    }

    char *text = NULL;
    size_t len = 0;
    st = q3_read_file(path, MAX_CONFIG_BYTES, &text, &len);
    if (st == Q3_OK) {
        size_t plen = strlen(path);
        if (plen >= 5 && !strcmp(path + plen - 5, ".json")) {
            cJSON *config = cJSON_ParseWithLength(text, len);
            if (!config || !cJSON_IsObject(config))
                st = q3_fail(Q3_ERR_FORMAT, "%s: not a JSON object", path);
            else
                st = template_from_config(config, path, out);
            cJSON_Delete(config);
        } else {
            st = identify_or_fail(text, len, path, out);
        }
    }
    free(text);
    free(file);
    return st;
}


/* ---- the few Python str methods the template uses ------------------------ */

typedef struct span {
    const char *s;
    size_t n;
} span;

static span span_of(const char *s) { return (span){s, strlen(s)}; }

/* The rendered text and which stretches of it came from the conversation
 * (content), as opposed to the template's own markup. */
typedef struct chat_out {
    q3_strbuf b;
    q3_text_span *spans; /* [n_spans], in order, not overlapping, not adjacent */
    size_t n_spans, cap_spans;
} chat_out;

/* Records b[start, b.len) as content (merged with the span before it if they touch). */
static void content_end(chat_out *o, size_t start)
{
    size_t end = o->b.oom ? start : o->b.len;
    if (end <= start) return;
    if (o->n_spans && o->spans[o->n_spans - 1].start + o->spans[o->n_spans - 1].len == start) {
        o->spans[o->n_spans - 1].len += end - start;
        return;
    }
    if (o->n_spans == o->cap_spans) {
        size_t cap = o->cap_spans ? 2 * o->cap_spans : 16;
        q3_text_span *grown = realloc(o->spans, cap * sizeof *grown);
        if (!grown) {
            o->b.oom = 1;
            return;
        }
        o->spans = grown;
        o->cap_spans = cap;
    }
    o->spans[o->n_spans++] = (q3_text_span){start, end - start};
}

static void emit_content(chat_out *o, span s)
{
    size_t start = o->b.len;
    q3_strbuf_put(&o->b, s.s, s.n);
    content_end(o, start);
}

static span lstrip_newlines(span t) /* t.lstrip('\n') */
{
    while (t.n && t.s[0] == '\n') t.s++, t.n--;
    return t;
}

static span rstrip_newlines(span t) /* t.rstrip('\n') */
{
    while (t.n && t.s[t.n - 1] == '\n') t.n--;
    return t;
}

static span strip_newlines(span t) { return rstrip_newlines(lstrip_newlines(t)); }

/* First / last occurrence of needle in t, or NULL. */
static const char *find_first(span t, const char *needle)
{
    return memmem(t.s, t.n, needle, strlen(needle));
}

static const char *find_last(span t, const char *needle)
{
    const char *last = NULL, *p;
    span rest = t;
    while ((p = find_first(rest, needle))) {
        last = p;
        rest.n -= (size_t)(p + 1 - rest.s);
        rest.s = p + 1;
    }
    return last;
}

static int starts_with(span t, const char *lit)
{
    size_t n = strlen(lit);
    return t.n >= n && !memcmp(t.s, lit, n);
}

static int ends_with(span t, const char *lit)
{
    size_t n = strlen(lit);
    return t.n >= n && !memcmp(t.s + t.n - n, lit, n);
}

/* ---- JSON values seen as the Python objects Jinja sees ------------------- */

/* obj[key] as a Python dict built from this JSON holds it: the last member
 * of that name (JSON may repeat keys; json.loads keeps the last). NULL if
 * absent or obj is not an object. */
static const cJSON *member(const cJSON *obj, const char *key)
{
    const cJSON *found = NULL;
    if (!cJSON_IsObject(obj)) return NULL;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (c->string && !strcmp(c->string, key)) found = c;
    return found;
}

/* Python truthiness; a missing value (Jinja's Undefined) is false too. */
static int truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

static const char *type_name(const cJSON *v)
{
    if (!v) return "missing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "of unknown type";
}

/* Whether `{{ v }}` can print v: Jinja prints Python's str(v), which for a
 * list or dict is Python's repr; we do not reproduce that and refuse it. */
static int printable_scalar(const cJSON *v)
{
    return !v || cJSON_IsNull(v) || cJSON_IsBool(v) || cJSON_IsNumber(v) || cJSON_IsString(v);
}

/* Emits `{{ v }}`: missing -> "", null -> "None", booleans "True"/"False",
 * numbers as Python prints an int or float, strings as they are.
 * v must satisfy printable_scalar. */
static void emit_python_str(q3_strbuf *b, const cJSON *v)
{
    char num[64];
    if (!v) return;
    if (cJSON_IsNull(v)) q3_strbuf_puts(b, "None");
    else if (cJSON_IsTrue(v)) q3_strbuf_puts(b, "True");
    else if (cJSON_IsFalse(v)) q3_strbuf_puts(b, "False");
    else if (cJSON_IsString(v)) q3_strbuf_puts(b, v->valuestring);
    else if (cJSON_IsNumber(v)) {
        int n = q3_json_number_is_int(v) ? q3_json_format_number(v, num, sizeof num)
                                          : q3_json_format_double(v->valuedouble, num, sizeof num);
        if (n < (int)sizeof num) {
            q3_strbuf_puts(b, num);
        } else { /* a very long integer literal */
            char *big = malloc((size_t)n + 1);
            if (!big) {
                b->oom = 1;
                return;
            }
            q3_json_format_number(v, big, (size_t)n + 1);
            q3_strbuf_puts(b, big);
            free(big);
        }
    }
}

/* ---- messages, checked ---------------------------------------------------- */

typedef enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } chat_role;

/* One message, checked against what the template can render. */
typedef struct chat_msg {
    chat_role role;
    const char *role_name;   /* as given: "system", "user", ... */
    span content;            /* system, user, assistant: the text */
    const cJSON *tool_content; /* tool: the content node (may be NULL: missing) */
    int has_reasoning;       /* assistant: reasoning_content given (not null) */
    span reasoning;          /* assistant: reasoning_content, if has_reasoning */
    const cJSON *tool_calls; /* assistant: the array, or NULL for none */
} chat_msg;

/* The function object a tool call names: "function" if truthy, else the
 * call itself ({%- if tool_call.function %}{% set tool_call = ... %}). */
static const cJSON *call_function(const cJSON *call)
{
    const cJSON *fn = member(call, "function");
    return truthy(fn) ? fn : call;
}

static q3_status check_tool_calls(const cJSON *calls, size_t i)
{
    size_t k = 0;
    const cJSON *call;
    if (!cJSON_IsArray(calls))
        return q3_fail(Q3_ERR_INVALID, "messages[%zu] (assistant): tool_calls must be an array, not %s",
                       i, type_name(calls));
    cJSON_ArrayForEach(call, calls) {
        if (!cJSON_IsObject(call))
            return q3_fail(Q3_ERR_INVALID,
                           "messages[%zu].tool_calls[%zu] must be an object, not %s", i, k,
                           type_name(call));
        const cJSON *fn_member = member(call, "function");
        if (truthy(fn_member) && !cJSON_IsObject(fn_member))
            return q3_fail(Q3_ERR_INVALID,
                           "messages[%zu].tool_calls[%zu].function must be an object, not %s", i, k,
                           type_name(fn_member));
        const cJSON *fn = call_function(call);
        const cJSON *name = member(fn, "name");
        if (!printable_scalar(name))
            return q3_fail(Q3_ERR_UNSUPPORTED,
                           "messages[%zu].tool_calls[%zu]: the function name must be a string, not %s",
                           i, k, type_name(name));
        if (!member(fn, "arguments"))
            return q3_fail(Q3_ERR_INVALID,
                           "messages[%zu].tool_calls[%zu] has no \"arguments\" (the template "
                           "cannot render a call without them; use {} for none)",
                           i, k);
        k++;
    }
    return Q3_OK;
}

/* Checks messages[i] and fills *m. */
static q3_status check_message(const cJSON *msg, size_t i, chat_msg *m)
{
    memset(m, 0, sizeof *m);
    if (!cJSON_IsObject(msg))
        return q3_fail(Q3_ERR_INVALID, "messages[%zu] must be an object, not %s", i, type_name(msg));

    const cJSON *role = member(msg, "role");
    if (!cJSON_IsString(role))
        return q3_fail(Q3_ERR_INVALID, "messages[%zu]: \"role\" must be a string, not %s", i,
                       type_name(role));
    const char *r = role->valuestring;
    if (!strcmp(r, "system")) m->role = ROLE_SYSTEM;
    else if (!strcmp(r, "user")) m->role = ROLE_USER;
    else if (!strcmp(r, "assistant")) m->role = ROLE_ASSISTANT;
    else if (!strcmp(r, "tool")) m->role = ROLE_TOOL;
    else
        return q3_fail(Q3_ERR_INVALID,
                       "messages[%zu]: unknown role \"%.40s\" (Qwen3's template knows system, "
                       "user, assistant and tool)",
                       i, r);
    m->role_name = r;

    const cJSON *content = member(msg, "content");
    if (m->role == ROLE_TOOL) {
        if (!printable_scalar(content))
            return q3_fail(Q3_ERR_UNSUPPORTED,
                           "messages[%zu] (tool): content is %s; pass the tool's result as a "
                           "string (e.g. its JSON text)",
                           i, type_name(content));
        m->tool_content = content;
        return Q3_OK;
    }
    if (!cJSON_IsString(content))
        return q3_fail(Q3_ERR_INVALID,
                       "messages[%zu] (%s): content must be a string, not %s%s", i, r,
                       type_name(content),
                       m->role == ROLE_ASSISTANT ? " (use \"\" for a turn of tool calls only)" : "");
    m->content = span_of(content->valuestring);

    if (m->role != ROLE_ASSISTANT) return Q3_OK;
    const cJSON *reasoning = member(msg, "reasoning_content");
    if (reasoning && !cJSON_IsNull(reasoning)) {
        if (!cJSON_IsString(reasoning))
            return q3_fail(Q3_ERR_INVALID,
                           "messages[%zu] (assistant): reasoning_content must be a string, not %s",
                           i, type_name(reasoning));
        m->has_reasoning = 1;
        m->reasoning = span_of(reasoning->valuestring);
    }
    const cJSON *calls = member(msg, "tool_calls");
    if (calls && !cJSON_IsNull(calls)) {
        q3_status st = check_tool_calls(calls, i);
        if (st != Q3_OK) return st;
        if (calls->child) m->tool_calls = calls; /* an empty list renders nothing */
    }
    return Q3_OK;
}

/* ---- rendering ------------------------------------------------------------- */

static const char TOOLS_HEADER[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char TOOLS_FOOTER[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

/* Emits v | tojson. */
static q3_status emit_json(q3_strbuf *b, const cJSON *v)
{
    char *text = NULL;
    size_t len = 0;
    q3_status st = q3_json_dumps(v, &text, &len);
    if (st != Q3_OK) return st;
    q3_strbuf_put(b, text, len);
    free(text);
    return Q3_OK;
}

/* The system block: the tools list (with the first system message inside
 * it), or the first system message alone. */
static q3_status render_system_block(chat_out *o, const chat_msg *msgs, const cJSON *tools)
{
    q3_strbuf *b = &o->b;
    if (truthy(tools)) { /* {%- if tools %} */
        q3_strbuf_puts(b, "<|im_start|>system\n");
        if (msgs[0].role == ROLE_SYSTEM) {
            emit_content(o, msgs[0].content);
            q3_strbuf_puts(b, "\n\n");
        }
        q3_strbuf_puts(b, TOOLS_HEADER);
        const cJSON *tool;
        cJSON_ArrayForEach(tool, tools) {
            q3_strbuf_puts(b, "\n");
            size_t start = b->len;
            q3_status st = emit_json(b, tool);
            if (st != Q3_OK) return st;
            content_end(o, start);
        }
        q3_strbuf_puts(b, TOOLS_FOOTER);
    } else if (msgs[0].role == ROLE_SYSTEM) {
        q3_strbuf_puts(b, "<|im_start|>system\n");
        emit_content(o, msgs[0].content);
        q3_strbuf_puts(b, "<|im_end|>\n");
    }
    return Q3_OK;
}

/* ns.last_query_index: the last user message that is a real query, not
 * tool output relayed as a user turn (wrapped in <tool_response> ...
 * </tool_response>); n - 1 if there is none. Assistant turns after it keep
 * their thinking; those before it lose it. */
static size_t last_query_index(const chat_msg *msgs, size_t n)
{
    for (size_t k = n; k-- > 0;) {
        const chat_msg *m = &msgs[k];
        if (m->role == ROLE_USER &&
            !(starts_with(m->content, "<tool_response>") && ends_with(m->content, "</tool_response>")))
            return k;
    }
    return n - 1;
}

static q3_status render_tool_calls(chat_out *o, const cJSON *calls, span content)
{
    q3_strbuf *b = &o->b;
    const cJSON *call;
    int first = 1;
    cJSON_ArrayForEach(call, calls) {
        /* {%- if (loop.first and content) or (not loop.first) %} */
        if (!first || content.n) q3_strbuf_puts(b, "\n");
        first = 0;
        const cJSON *fn = call_function(call);
        q3_strbuf_puts(b, "<tool_call>\n{\"name\": \"");
        size_t start = b->len;
        emit_python_str(b, member(fn, "name"));
        content_end(o, start);
        q3_strbuf_puts(b, "\", \"arguments\": ");
        const cJSON *args = member(fn, "arguments");
        start = b->len;
        if (cJSON_IsString(args)) {
            q3_strbuf_puts(b, args->valuestring); /* a string is taken to be JSON already */
        } else {
            q3_status st = emit_json(b, args);
            if (st != Q3_OK) return st;
        }
        content_end(o, start);
        q3_strbuf_puts(b, "}\n</tool_call>");
    }
    return Q3_OK;
}

static q3_status render_assistant(chat_out *o, const chat_msg *m, size_t index, size_t last_query,
                                  int is_last)
{
    q3_strbuf *b = &o->b;
    span content = m->content;
    span reasoning = {"", 0};
    if (m->has_reasoning) {
        reasoning = m->reasoning;
    } else if (find_first(content, "</think>")) {
        /* content = content.split('</think>')[-1].lstrip('\n')
         * reasoning = content.split('</think>')[0].rstrip('\n')
         *                    .split('<think>')[-1].lstrip('\n') */
        const char *first_close = find_first(content, "</think>");
        const char *last_close = find_last(content, "</think>");
        const char *after = last_close + strlen("</think>");
        span before = rstrip_newlines((span){content.s, (size_t)(first_close - content.s)});
        const char *open = find_last(before, "<think>");
        if (open) {
            const char *inner = open + strlen("<think>");
            before = (span){inner, (size_t)(before.s + before.n - inner)};
        }
        reasoning = lstrip_newlines(before);
        content = lstrip_newlines((span){after, (size_t)(m->content.s + m->content.n - after)});
    }

    q3_strbuf_puts(b, "<|im_start|>");
    q3_strbuf_puts(b, m->role_name);
    if (index > last_query && (is_last || reasoning.n)) {
        /* After the last query the thinking is kept (and the final turn
         * always shows a think block, even an empty one). */
        q3_strbuf_puts(b, "\n<think>\n");
        emit_content(o, strip_newlines(reasoning));
        q3_strbuf_puts(b, "\n</think>\n\n");
        emit_content(o, lstrip_newlines(content));
    } else {
        q3_strbuf_puts(b, "\n");
        emit_content(o, content);
    }
    if (m->tool_calls) {
        q3_status st = render_tool_calls(o, m->tool_calls, content);
        if (st != Q3_OK) return st;
    }
    q3_strbuf_puts(b, "<|im_end|>\n");
    return Q3_OK;
}

static q3_status render(chat_out *o, const chat_msg *msgs, size_t n, const cJSON *tools,
                        const q3_chat_options *opts)
{
    q3_strbuf *b = &o->b;
    q3_status st = render_system_block(o, msgs, tools);
    if (st != Q3_OK) return st;

    size_t last_query = last_query_index(msgs, n);
    for (size_t i = 0; i < n; i++) {
        const chat_msg *m = &msgs[i];
        int is_last = i + 1 == n;
        switch (m->role) {
        case ROLE_SYSTEM:
            if (i == 0) break; /* already in the system block */
            /* fallthrough */
        case ROLE_USER:
            q3_strbuf_puts(b, "<|im_start|>");
            q3_strbuf_puts(b, m->role_name);
            q3_strbuf_puts(b, "\n");
            emit_content(o, m->content);
            q3_strbuf_puts(b, "<|im_end|>\n");
            break;
        case ROLE_ASSISTANT:
            st = render_assistant(o, m, i, last_query, is_last);
            if (st != Q3_OK) return st;
            break;
        case ROLE_TOOL:
            /* Consecutive tool results share one user turn. */
            if (i == 0 || msgs[i - 1].role != ROLE_TOOL) q3_strbuf_puts(b, "<|im_start|>user");
            q3_strbuf_puts(b, "\n<tool_response>\n");
            size_t start = b->len;
            emit_python_str(b, m->tool_content);
            content_end(o, start);
            q3_strbuf_puts(b, "\n</tool_response>");
            if (is_last || msgs[i + 1].role != ROLE_TOOL) q3_strbuf_puts(b, "<|im_end|>\n");
            break;
        }
    }

    if (opts->add_generation_prompt) {
        q3_strbuf_puts(b, "<|im_start|>assistant\n");
        if (opts->enable_thinking == 0) q3_strbuf_puts(b, "<think>\n\n</think>\n\n");
    }
    return Q3_OK;
}

/* Renders into o (the caller frees o->b.data and o->spans, also on failure). */
static q3_status render_messages(const cJSON *messages, const cJSON *tools, const q3_chat_options *opts,
                                 chat_out *o)
{
    static const q3_chat_options defaults = {.add_generation_prompt = 1, .enable_thinking = -1};
    if (!opts) opts = &defaults;
    if (!cJSON_IsArray(messages))
        return q3_fail(Q3_ERR_INVALID, "chat: messages must be an array, not %s", type_name(messages));
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
        return q3_fail(Q3_ERR_INVALID, "chat: tools must be an array or null, not %s",
                       type_name(tools));
    size_t n = (size_t)cJSON_GetArraySize(messages);
    if (n == 0) return q3_fail(Q3_ERR_INVALID, "chat: messages is empty");

    chat_msg *msgs = calloc(n, sizeof *msgs);
    if (!msgs) return q3_fail(Q3_ERR_NOMEM, "chat: out of memory for %zu messages", n);
    q3_status st = Q3_OK;
    size_t i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, messages) {
        st = check_message(msg, i, &msgs[i]);
        if (st != Q3_OK) break;
        i++;
    }

    if (st == Q3_OK) st = render(o, msgs, n, tools, opts);
    if (st == Q3_OK && o->b.oom) st = q3_fail(Q3_ERR_NOMEM, "chat: out of memory rendering");
    if (st == Q3_OK && !o->b.data) { /* cannot happen: a system or user turn writes something */
        o->b.data = calloc(1, 1);
        if (!o->b.data) st = q3_fail(Q3_ERR_NOMEM, "chat: out of memory rendering");
    }
    free(msgs);
    return st;
}

q3_status q3_chat_render_messages(const cJSON *messages, const cJSON *tools,
                                  const q3_chat_options *opts, char **out)
{
    chat_out o = {0};
    *out = NULL;
    q3_status st = render_messages(messages, tools, opts, &o);
    free(o.spans);
    if (st != Q3_OK) {
        free(o.b.data);
        return st;
    }
    *out = o.b.data;
    return Q3_OK;
}

/* A conversation flag: true, false, or null/missing = dflt. */
static q3_status read_flag(const cJSON *conv, const char *key, int dflt, int *out)
{
    const cJSON *v = member(conv, key);
    if (!v || cJSON_IsNull(v)) *out = dflt;
    else if (cJSON_IsBool(v)) *out = cJSON_IsTrue(v);
    else return q3_fail(Q3_ERR_INVALID, "chat: %s must be true, false or null, not %s", key,
                        type_name(v));
    return Q3_OK;
}

/* The messages, tools and options of a conversation (see q3_chat_render). */
static q3_status conversation_parts(const cJSON *conversation, const cJSON **messages, const cJSON **tools,
                                    q3_chat_options *opts)
{
    *tools = NULL;
    opts->add_generation_prompt = 1;
    opts->enable_thinking = -1;
    if (cJSON_IsArray(conversation)) {
        *messages = conversation;
        return Q3_OK;
    }
    if (!cJSON_IsObject(conversation))
        return q3_fail(Q3_ERR_INVALID,
                       "chat: a conversation is an object with \"messages\" or a messages array, not %s",
                       type_name(conversation));
    *messages = member(conversation, "messages");
    if (!*messages) return q3_fail(Q3_ERR_INVALID, "chat: the conversation has no \"messages\"");
    q3_status st = read_flag(conversation, "add_generation_prompt", 1, &opts->add_generation_prompt);
    if (st == Q3_OK) st = read_flag(conversation, "enable_thinking", -1, &opts->enable_thinking);
    *tools = member(conversation, "tools");
    return st;
}

q3_status q3_chat_render(const cJSON *conversation, char **out)
{
    *out = NULL;
    const cJSON *messages, *tools;
    q3_chat_options opts;
    q3_status st = conversation_parts(conversation, &messages, &tools, &opts);
    if (st != Q3_OK) return st;
    return q3_chat_render_messages(messages, tools, &opts, out);
}

q3_status q3_chat_render_spans(const cJSON *conversation, q3_chat_rendered *out)
{
    memset(out, 0, sizeof *out);
    const cJSON *messages, *tools;
    q3_chat_options opts;
    q3_status st = conversation_parts(conversation, &messages, &tools, &opts);
    if (st != Q3_OK) return st;
    chat_out o = {0};
    st = render_messages(messages, tools, &opts, &o);
    if (st != Q3_OK) {
        free(o.b.data);
        free(o.spans);
        return st;
    }
    out->text = o.b.data;
    out->len = o.b.len;
    out->content = o.spans;
    out->n_content = o.n_spans;
    return Q3_OK;
}

void q3_chat_rendered_free(q3_chat_rendered *r)
{
    free(r->text);
    free(r->content);
    memset(r, 0, sizeof *r);
}

q3_status q3_chat_encode(const q3_tokenizer *tok, const cJSON *conversation, unsigned flags, q3_tokens *out)
{
    q3_chat_rendered r;
    q3_status st = q3_chat_render_spans(conversation, &r);
    if (st != Q3_OK) return st;
    if (flags & Q3_CHAT_PARSE_SPECIAL_IN_CONTENT)
        st = q3_tokenizer_encode_append(tok, r.text, r.len, Q3_ENCODE_DEFAULT, out);
    else
        st = q3_tokenizer_encode_spans(tok, r.text, r.len, r.content, r.n_content, out);
    q3_chat_rendered_free(&r);
    return st;
}
