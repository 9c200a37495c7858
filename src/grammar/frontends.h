/* The front ends: each reads its text and builds rules into a builder,
 * returning the start rule in *root. Errors go through q3_fail:
 * Q3_ERR_INVALID for malformed text (with where), Q3_ERR_UNSUPPORTED naming
 * the keyword or construct q3 does not compile. */
#ifndef Q3_GRAMMAR_FRONTENDS_H
#define Q3_GRAMMAR_FRONTENDS_H

#include <stddef.h>

#include "grammar/grammar.h"

/* gbnf.c: llama.cpp's GBNF; the start is the rule `root`. */
q3_status gbnf_compile(gb *b, const char *text, size_t len, int *root);

/* regex.c: a regex the whole text must match (anchors implied; ^ and $ at
 * the ends are accepted and mean nothing more). */
q3_status regex_compile(gb *b, const char *re, size_t len, int *root);
/* The same into an existing rule (an alternative is opened on it): for
 * JSON Schema's `pattern`, whose matches are the JSON string's content. */
q3_status regex_into(gb *b, int rule, const char *re, size_t len);

/* json_schema.c: a JSON Schema (text is JSON). */
q3_status json_schema_compile(gb *b, const char *text, size_t len, int *root);
/* Any JSON object. */
q3_status json_object_compile(gb *b, int *root);
/* A forced tool call: text is {"tools": [...], "name": optional}. */
q3_status tool_call_compile(gb *b, const char *text, size_t len, int *root);

/* choice.c: text is a JSON array of strings; the output is one of them. */
q3_status choice_compile(gb *b, const char *text, size_t len, int *root);

#endif
