/* The text-layer pieces the q3 commands use that the public API does not
 * carry: JSON read and written the way q3's tests compare it (numbers keep
 * their source text), the check for NUL characters in JSON text, and Qwen3's
 * chat template applied to a parsed conversation (chat-template's --jsonl
 * keeps the conversation to print it back). The library keeps these internal
 * (src/text/json_write.c, src/text/chat_template.c). */
#ifndef Q3_TOOLS_TEXT_H
#define Q3_TOOLS_TEXT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "q3.h"

/* The offset of the first raw NUL byte or "\u0000" escape inside a string of
 * text[0..len), or len if there is none (cJSON would end the string there). */
size_t q3_tool_json_find_nul(const char *text, size_t len);

/* Parses NUL-terminated JSON text; fails naming line and column, and on a
 * "\u0000" escape. *out is the caller's (cJSON_Delete). */
q3_status q3_tool_json_parse(const char *text, cJSON **out);

/* Prints item compactly as Python's json.dumps would (numbers as parsed);
 * *out malloc'd, the caller's; len may be NULL. */
q3_status q3_tool_json_dumps(const cJSON *item, char **out, size_t *len);

/* Renders a conversation object {"messages", "tools", "add_generation_prompt",
 * "enable_thinking"} with Qwen3's chat template; *out malloc'd, the caller's. */
q3_status q3_tool_chat_render(const cJSON *conversation, char **out);

/* Whether the chat template of the model folder at dir is one q3 renders
 * (Q3_OK), or why not. */
q3_status q3_tool_chat_template_check(const char *dir);

#endif
