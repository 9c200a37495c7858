/* The reranker's prompt as text (embed_prompt.c), for what writes it
 * elsewhere: a GGUF's tokenizer.chat_template.rerank ({query} and {document}
 * as llama.cpp substitutes them). */
#ifndef Q3_TEXT_EMBED_PROMPT_H
#define Q3_TEXT_EMBED_PROMPT_H

/* The whole prompt for (instruct, query, doc) (instruct NULL: the default),
 * NUL-terminated, malloc'd (the caller frees it); NULL when out of memory. */
char *q3_rerank_prompt_text(const char *instruct, const char *query, const char *doc);

#endif
