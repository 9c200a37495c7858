/* Qwen3's chat template, rendered in C.
 *
 * A Qwen3 model folder carries its chat template as Jinja text (in
 * tokenizer_config.json's "chat_template", or in chat_template.jinja). q3
 * runs no Jinja: it recognises the template by its exact text and renders
 * what that template renders, byte for byte, with the same inputs as
 * Hugging Face transformers' apply_chat_template: messages, tools,
 * add_generation_prompt and enable_thinking. A folder whose template q3
 * does not know is reported as such instead of being rendered with the
 * wrong one.
 *
 * Where the Jinja template would fail (a user turn with null content, an
 * assistant turn without content, a tool call without arguments) we fail
 * too, with a message saying what to change. Where the template would
 * silently drop or garble something we refuse it instead: a message with an
 * unknown or missing role, a non-array `tools`, containers where the
 * template would print Python's repr. */
#ifndef Q3_TEXT_CHAT_TEMPLATE_H
#define Q3_TEXT_CHAT_TEMPLATE_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "util/status.h"
#include "text/tokenizer.h"

/* ---- recognising a model's template ------------------------------------- */

typedef enum q3_chat_template_kind {
    Q3_CHAT_TEMPLATE_UNKNOWN = 0,
    Q3_CHAT_TEMPLATE_QWEN3, /* Qwen3 (0.6B .. 235B-A22B), thinking + tools */
} q3_chat_template_kind;

/* Which known template this text is (exact bytes: same length and same
 * 64-bit FNV-1a hash); Q3_CHAT_TEMPLATE_UNKNOWN for anything else. */
q3_chat_template_kind q3_chat_template_identify(const char *text, size_t len);

/* 1 if text (NUL-terminated) is Qwen3's chat template, else 0. */
int q3_chat_template_is_qwen3(const char *template_text);

/* "qwen3", or "unknown". */
const char *q3_chat_template_name(q3_chat_template_kind kind);

/* Finds and identifies the chat template at path, which is one of
 *   - a model folder: its chat_template.jinja if present (newer transformers
 *     save the template there), else its tokenizer_config.json;
 *   - a tokenizer_config.json (any *.json): its "chat_template", a string or
 *     a list of {"name", "template"} of which "default" is used;
 *   - any other file: the template text itself.
 * Q3_ERR_UNSUPPORTED when there is no template or it is not one q3 knows
 * (the message names the file, the size and the hash); Q3_ERR_IO /
 * Q3_ERR_FORMAT for unreadable or malformed files. */
q3_status q3_chat_template_load(const char *path, q3_chat_template_kind *out);

/* ---- rendering ----------------------------------------------------------- */

typedef struct q3_chat_options {
    int add_generation_prompt; /* 1: end with "<|im_start|>assistant\n" */
    int enable_thinking;       /* -1: not passed (the model thinks), 0: false
                                  (an empty think block after the generation
                                  prompt), 1: true (same as not passed) */
} q3_chat_options;

/* Renders messages (a JSON array of {"role", "content", ...}) as Qwen3's
 * template does. tools: NULL, JSON null, or an array of tool schemas (each
 * written with Python's json.dumps). opts NULL means add_generation_prompt=1,
 * enable_thinking=-1. Message fields used:
 *   role               "system" | "user" | "assistant" | "tool"
 *   content            a string (system, user, assistant); a tool turn's
 *                      content may also be a number, boolean or null, printed
 *                      as Python's str() prints it, or missing ("")
 *   reasoning_content  assistant, optional string: the thinking; without it
 *                      a "<think>...</think>" prefix of content is split off
 *   tool_calls         assistant, optional array of {"function": {"name",
 *                      "arguments"}} or {"name", "arguments"}; arguments a
 *                      string (written as is) or any JSON value (json.dumps)
 * *out is a NUL-terminated heap string the caller frees. */
q3_status q3_chat_render_messages(const cJSON *messages, const cJSON *tools,
                                  const q3_chat_options *opts, char **out);

/* Renders a conversation: either an object {"messages", "tools",
 * "add_generation_prompt", "enable_thinking"} (other members ignored; tools
 * and enable_thinking may be null or missing = not passed;
 * add_generation_prompt null or missing = true), or a bare messages array
 * (add_generation_prompt = true, no tools, enable_thinking not passed). */
q3_status q3_chat_render(const cJSON *conversation, char **out);

/* ---- content as plain text -------------------------------------------------
 *
 * What a conversation holds (every role's content and reasoning, tool results,
 * tool-call names and arguments, tool schemas) is text, never markup: a user who
 * writes "<|im_end|>\n<|im_start|>system\n..." must not open a system turn. The
 * renderer therefore says which stretches of its output came from the
 * conversation, and q3_chat_encode tokenizes those without matching special tokens
 * (added tokens flagged special, such as <|im_start|> and <|im_end|>; added tokens
 * that are not special, such as <think> and <tool_call>, are matched as Hugging
 * Face and llama.cpp match them in unparsed text). The whole text is still
 * tokenized in one pass, so content without special-token text gets exactly the
 * ids the reference gets. */

typedef struct q3_chat_rendered {
    char *text;              /* NUL-terminated, len bytes */
    size_t len;
    q3_text_span *content;   /* [n_content]: the stretches that came from the
                                conversation, in order, not overlapping */
    size_t n_content;
} q3_chat_rendered;

/* q3_chat_render, also recording the content spans. *out is freed with
 * q3_chat_rendered_free (on failure it is empty). */
q3_status q3_chat_render_spans(const cJSON *conversation, q3_chat_rendered *out);
void q3_chat_rendered_free(q3_chat_rendered *r);

/* Q3_CHAT_PARSE_SPECIAL_IN_CONTENT (include/q3.h): content tokenized as the reference does. */

/* Renders the conversation (as q3_chat_render) and appends its ids to out: the
 * template's markup with special tokens, the content as plain text (unless flags
 * has Q3_CHAT_PARSE_SPECIAL_IN_CONTENT). On failure out is as it was. */
q3_status q3_chat_encode(const q3_tokenizer *tok, const cJSON *conversation, unsigned flags, q3_tokens *out);

#endif
