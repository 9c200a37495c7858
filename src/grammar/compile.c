/* q3_grammar_compile: a front end's rules, finished, bound to a vocabulary. */
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/frontends.h"
#include "q3.h"
#include "util/error.h"

static const char *kind_name(q3_grammar_kind k)
{
    switch (k) {
    case Q3_GRAMMAR_JSON_SCHEMA: return "JSON Schema";
    case Q3_GRAMMAR_JSON: return "JSON object";
    case Q3_GRAMMAR_GBNF: return "GBNF grammar";
    case Q3_GRAMMAR_REGEX: return "regex";
    case Q3_GRAMMAR_CHOICE: return "choice";
    case Q3_GRAMMAR_TOOL_CALL: return "tool call";
    }
    return "grammar";
}

q3_status q3_grammar_compile(const q3_tokenizer *tok, q3_grammar_kind kind, const char *text, size_t len,
                             q3_grammar **out)
{
    *out = NULL;
    if (!tok) return q3_fail(Q3_ERR_INVALID, "q3_grammar_compile: no tokenizer");
    if (!text && kind != Q3_GRAMMAR_JSON) return q3_fail(Q3_ERR_INVALID, "q3_grammar_compile: no text");
    int32_t n_ids = q3_tokenizer_vocab_size(tok);
    const gvocab *v;
    q3_status st = gvocab_get(tok, n_ids, q3_tokenizer_end_of_turn(tok), q3_tokenizer_end_of_text(tok), &v);
    if (st) return st;
    gb *b = gb_new();
    if (!b) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    int root = -1;
    switch (kind) {
    case Q3_GRAMMAR_JSON_SCHEMA: st = json_schema_compile(b, text, len, &root); break;
    case Q3_GRAMMAR_JSON: st = json_object_compile(b, &root); break;
    case Q3_GRAMMAR_GBNF: st = gbnf_compile(b, text, len, &root); break;
    case Q3_GRAMMAR_REGEX: st = regex_compile(b, text, len, &root); break;
    case Q3_GRAMMAR_CHOICE: st = choice_compile(b, text, len, &root); break;
    case Q3_GRAMMAR_TOOL_CALL: st = tool_call_compile(b, text, len, &root); break;
    default: st = q3_fail(Q3_ERR_INVALID, "q3_grammar_compile: unknown kind %d", (int)kind);
    }
    if (st) {
        gb_free(b);
        return q3_fail_wrap(st, "%s", kind_name(kind));
    }
    /* after </think>: up to two newlines, then the language */
    int nl = gb_rule(b, NULL, "think_newline"), think = gb_rule(b, "after_think", NULL);
    gb_alt(b, nl);
    gb_byte(b, nl, '\n');
    gb_alt(b, think);
    gb_ref(b, think, gb_repeat(b, nl, 0, 2));
    gb_ref(b, think, root);
    q3g *g = NULL;
    st = gb_finish(b, root, &g);
    gb_free(b);
    if (st) return q3_fail_wrap(st, "%s", kind_name(kind));
    g->root_after_think = think;
    q3_grammar *G = calloc(1, sizeof *G);
    if (!G || !(G->token_ids = calloc((size_t)(g->n_token_names ? g->n_token_names : 1), sizeof *G->token_ids))) {
        free(G);
        q3g_free(g);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    G->g = g;
    G->v = v;
    G->kind = kind;
    for (int i = 0; i < g->n_token_names; i++) {
        const char *name = g->token_names[i];
        int32_t id = q3_tokenizer_token_id(tok, name, strlen(name));
        if (id < 0 || id >= v->n_ids || v->in_trie[id]) {
            q3_grammar_free(G);
            return q3_fail(Q3_ERR_INVALID, "%s: the token %s is not an added token of this vocabulary",
                           kind_name(kind), name);
        }
        G->token_ids[i] = id;
    }
    G->think_close = q3_tokenizer_token_id(tok, "</think>", 8);
    *out = G;
    return Q3_OK;
}

void q3_grammar_free(q3_grammar *G)
{
    if (!G) return;
    q3g_free(G->g);
    free(G->token_ids);
    free(G);
}

size_t q3_grammar_bytes(const q3_grammar *G)
{
    return sizeof *G + G->g->bytes + (size_t)G->g->n_token_names * sizeof *G->token_ids;
}
