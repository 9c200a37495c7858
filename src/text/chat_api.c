/* The chat template's public face (include/q3.h): conversations given as C
 * messages or as JSON text, rendered and tokenized with content as plain text
 * (q3_chat_encode does the work). */
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"
#include "text/json_write.h"
#include "util/error.h"
#include "util/opts.h"

/* Parses JSON text that may not be NUL-terminated. */
static q3_status parse(const char *json, size_t len, cJSON **out)
{
    *out = NULL;
    if (q3_json_find_nul(json, len) != len)
        return q3_fail(Q3_ERR_INVALID, "the conversation holds a NUL byte (\\u0000), which q3 does not accept");
    char *text = malloc(len + 1);
    if (!text) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    memcpy(text, json, len);
    text[len] = 0;
    q3_status st = q3_json_parse(text, out);
    free(text);
    return st;
}

static q3_status take_ids(q3_status st, q3_tokens *t, int32_t **ids, size_t *n_ids)
{
    if (st) {
        q3_tokens_free(t);
        return st;
    }
    *ids = t->ids;
    *n_ids = t->n;
    return Q3_OK;
}

q3_status q3_chat_tokenize_json(const q3_tokenizer *tok, const char *json, size_t len, unsigned flags, int32_t **ids,
                                size_t *n_ids)
{
    Q3_NOT_NULL(ids);
    Q3_NOT_NULL(n_ids);
    *ids = NULL;
    *n_ids = 0;
    Q3_NOT_NULL(tok);
    Q3_NOT_NULL(json);
    if (flags & ~(unsigned)Q3_CHAT_PARSE_SPECIAL_IN_CONTENT) return q3_fail(Q3_ERR_INVALID, "q3_chat_tokenize_json: unknown flags 0x%x", flags);
    cJSON *conv;
    q3_status st = parse(json, len, &conv);
    if (st) return st;
    q3_tokens t = {0};
    st = q3_chat_encode(tok, conv, flags, &t);
    cJSON_Delete(conv);
    return take_ids(st, &t, ids, n_ids);
}

q3_status q3_chat_format_json(const char *json, size_t len, char **text, size_t *text_len)
{
    Q3_NOT_NULL(text);
    *text = NULL;
    Q3_NOT_NULL(json);
    cJSON *conv;
    q3_status st = parse(json, len, &conv);
    if (st) return st;
    st = q3_chat_render(conv, text);
    cJSON_Delete(conv);
    if (!st && text_len) *text_len = strlen(*text);
    return st;
}

q3_chat_opts q3_chat_opts_default(void)
{
    q3_chat_opts o = {.size = sizeof o, .add_generation_prompt = 1, .enable_thinking = -1};
    return o;
}

q3_status q3_chat_tokenize(const q3_tokenizer *tok, const q3_chat_message *messages, size_t n,
                           const q3_chat_opts *opts, int32_t **ids, size_t *n_ids)
{
    Q3_NOT_NULL(ids);
    Q3_NOT_NULL(n_ids);
    *ids = NULL;
    *n_ids = 0;
    Q3_NOT_NULL(tok);
    if (n && !messages) return q3_fail(Q3_ERR_INVALID, "q3_chat_tokenize: messages is NULL");
    q3_chat_opts o = q3_chat_opts_default();
    if (opts) {
        q3_status ost = q3_opts_read(&o, sizeof o, opts, "q3_chat_tokenize options");
        if (ost) return ost;
    }
    if (o.flags & ~(unsigned)Q3_CHAT_PARSE_SPECIAL_IN_CONTENT) return q3_fail(Q3_ERR_INVALID, "q3_chat_tokenize: unknown flags 0x%x", o.flags);
    if ((unsigned)o.add_generation_prompt > 1 || o.enable_thinking < -1 || o.enable_thinking > 1)
        return q3_fail(Q3_ERR_INVALID, "q3_chat_tokenize: add_generation_prompt is 0 or 1 (%d), enable_thinking -1, 0 or 1 (%d)",
                       o.add_generation_prompt, o.enable_thinking);
    cJSON *conv = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(conv, "messages");
    q3_status st = Q3_OK;
    for (size_t i = 0; i < n && msgs; i++) {
        if (!messages[i].role || !messages[i].content) {
            st = q3_fail(Q3_ERR_INVALID, "message %zu has no %s", i, messages[i].role ? "content" : "role");
            break;
        }
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddStringToObject(m, "role", messages[i].role) ||
            !cJSON_AddStringToObject(m, "content", messages[i].content) || !cJSON_AddItemToArray(msgs, m)) {
            cJSON_Delete(m);
            st = q3_fail(Q3_ERR_NOMEM, "out of memory");
            break;
        }
    }
    if (!st && (!msgs || !cJSON_AddBoolToObject(conv, "add_generation_prompt", o.add_generation_prompt)))
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
    if (!st && o.enable_thinking >= 0 && !cJSON_AddBoolToObject(conv, "enable_thinking", o.enable_thinking))
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
    q3_tokens t = {0};
    if (!st) st = q3_chat_encode(tok, conv, o.flags, &t);
    cJSON_Delete(conv);
    return take_ids(st, &t, ids, n_ids);
}
