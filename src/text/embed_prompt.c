/* The inputs Qwen3-Embedding and Qwen3-Reranker expect, as their model cards'
 * reference code builds them (see q3_embed_tokenize and q3_rerank_tokenize in
 * q3.h for the exact text). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q3.h" /* q3_embed_tokenize, q3_rerank_tokenize: public */
#include "text/embed_prompt.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/strbuf.h"

static q3_status need_token(const q3_tokenizer *tok, const char *text, int32_t *id)
{
    *id = q3_tokenizer_token_id(tok, text, strlen(text));
    if (*id < 0) return q3_fail(Q3_ERR_UNSUPPORTED, "the tokenizer has no %s token: not a Qwen3 tokenizer", text);
    return Q3_OK;
}

static q3_status append_id(q3_tokens *t, int32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        int32_t *p = realloc(t->ids, cap * sizeof *p);
        if (!p) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return Q3_OK;
}

static q3_status done(q3_status st, q3_tokens *t, int32_t **ids, size_t *n_ids)
{
    if (st) {
        q3_tokens_free(t);
        return st;
    }
    *ids = t->ids;
    *n_ids = t->n;
    return Q3_OK;
}

q3_status q3_embed_tokenize(const q3_tokenizer *tok, const char *instruct, const char *text, size_t len, int32_t **ids,
                            size_t *n_ids)
{
    q3_clear_error();
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return q3_fail(Q3_ERR_INVALID, "embed: no text");
    int32_t eot;
    q3_status st = need_token(tok, "<|endoftext|>", &eot);
    if (st) return st;
    q3_tokens t = {0};
    if (instruct) { /* get_detailed_instruct: "Instruct: {task}\nQuery:{query}" (no space after "Query:") */
        q3_strbuf b = {0};
        q3_strbuf_printf(&b, "Instruct: %s\nQuery:", instruct);
        q3_strbuf_put(&b, text ? text : "", len);
        st = b.oom ? q3_fail(Q3_ERR_NOMEM, "out of memory")
                   : q3_tokenizer_encode_append(tok, b.data ? b.data : "", b.len, Q3_ENCODE_SPECIAL_AS_TEXT, &t);
        free(b.data);
    } else {
        st = q3_tokenizer_encode_append(tok, text ? text : "", len, Q3_ENCODE_SPECIAL_AS_TEXT, &t);
    }
    if (!st) st = append_id(&t, eot);
    return done(st, &t, ids, n_ids);
}

static const char RERANK_PREFIX[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
static const char RERANK_SUFFIX[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

char *q3_rerank_prompt_text(const char *instruct, const char *query, const char *doc)
{
    q3_strbuf b = {0};
    q3_strbuf_puts(&b, RERANK_PREFIX);
    q3_strbuf_printf(&b, "<Instruct>: %s\n<Query>: %s\n<Document>: %s", instruct ? instruct : Q3_RERANK_DEFAULT_INSTRUCT,
                     query, doc);
    q3_strbuf_puts(&b, RERANK_SUFFIX);
    if (b.oom) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

q3_status q3_rerank_tokenize(const q3_tokenizer *tok, const char *instruct, const char *query, const char *doc,
                             int32_t **ids, size_t *n_ids)
{
    q3_clear_error();
    *ids = NULL;
    *n_ids = 0;
    if (!query || !doc) return q3_fail(Q3_ERR_INVALID, "rerank: a query and a document are needed");
    int32_t id;
    q3_status st = need_token(tok, "<|im_start|>", &id);
    if (st) return st;
    q3_tokens t = {0};
    q3_strbuf b = {0};
    q3_strbuf_printf(&b, "<Instruct>: %s\n<Query>: %s\n<Document>: %s", instruct ? instruct : Q3_RERANK_DEFAULT_INSTRUCT,
                     query, doc);
    if (b.oom) st = q3_fail(Q3_ERR_NOMEM, "out of memory");
    /* the template's markup as special tokens; the user's text as text */
    if (!st) st = q3_tokenizer_encode_append(tok, RERANK_PREFIX, sizeof RERANK_PREFIX - 1, Q3_ENCODE_DEFAULT, &t);
    if (!st) st = q3_tokenizer_encode_append(tok, b.data, b.len, Q3_ENCODE_SPECIAL_AS_TEXT, &t);
    if (!st) st = q3_tokenizer_encode_append(tok, RERANK_SUFFIX, sizeof RERANK_SUFFIX - 1, Q3_ENCODE_DEFAULT, &t);
    free(b.data);
    return done(st, &t, ids, n_ids);
}
