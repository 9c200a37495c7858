#include "tools/text.h"

#include "text/chat_template.h"
#include "text/json_write.h"

size_t q3_tool_json_find_nul(const char *text, size_t len) { return q3_json_find_nul(text, len); }

q3_status q3_tool_json_parse(const char *text, cJSON **out) { return q3_json_parse(text, out); }

q3_status q3_tool_json_dumps(const cJSON *item, char **out, size_t *len) { return q3_json_dumps(item, out, len); }

q3_status q3_tool_chat_render(const cJSON *conversation, char **out) { return q3_chat_render(conversation, out); }

q3_status q3_tool_chat_template_check(const char *dir)
{
    q3_chat_template_kind kind;
    return q3_chat_template_load(dir, &kind);
}
