/* The OpenAI wire format, in three parts: request.h (bodies into jobs),
 * render.h (jobs into JSON answers and SSE chunks), channel.h (the model's
 * text into content, reasoning and tool calls). */
#ifndef Q3_SERVER_OPENAI_H
#define Q3_SERVER_OPENAI_H

#include "channel.h"
#include "render.h"
#include "request.h"

#endif
