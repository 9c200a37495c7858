/* q3_grammar_compile: a front end's rules, finished, bound to a vocabulary. */
#include <pthread.h>
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

/* ---- the compile cache ----------------------------------------------------------
 * The last CACHE_SIZE grammars compiled, by vocabulary, kind and text: a server
 * that gets the same schema with every request compiles it once. Grammars are
 * immutable, so the cache hands out the same one with a reference more. */

#define CACHE_SIZE 32

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static q3_grammar *cache[CACHE_SIZE]; /* most recent first */

static void grammar_unref(q3_grammar *G)
{
    if (!G || __atomic_sub_fetch(&G->refs, 1, __ATOMIC_ACQ_REL)) return;
    q3g_free(G->g);
    mask_share_free(G->share);
    free(G->token_ids);
    free(G->key);
    free(G);
}

static q3_grammar *cache_find(const gvocab *v, const char *key, size_t key_len)
{
    pthread_mutex_lock(&cache_lock);
    q3_grammar *G = NULL;
    for (int i = 0; i < CACHE_SIZE && cache[i]; i++)
        if (cache[i]->v == v && cache[i]->key_len == key_len && !memcmp(cache[i]->key, key, key_len)) {
            G = cache[i];
            memmove(cache + 1, cache, (size_t)i * sizeof *cache); /* to the front */
            cache[0] = G;
            __atomic_add_fetch(&G->refs, 1, __ATOMIC_ACQ_REL);
            break;
        }
    pthread_mutex_unlock(&cache_lock);
    return G;
}

static void cache_put(q3_grammar *G)
{
    __atomic_add_fetch(&G->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&cache_lock);
    q3_grammar *old = cache[CACHE_SIZE - 1];
    memmove(cache + 1, cache, (CACHE_SIZE - 1) * sizeof *cache);
    cache[0] = G;
    pthread_mutex_unlock(&cache_lock);
    grammar_unref(old);
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
    if (!text) len = 0;
    char *key = malloc(len + 1);
    if (!key) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    key[0] = (char)('0' + (int)kind);
    if (len) memcpy(key + 1, text, len);
    if ((*out = cache_find(v, key, len + 1))) {
        free(key);
        return Q3_OK;
    }
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
        free(key);
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
    if (st) {
        free(key);
        return q3_fail_wrap(st, "%s", kind_name(kind));
    }
    g->root_after_think = think;
    q3_grammar *G = calloc(1, sizeof *G);
    if (!G || !(G->token_ids = calloc((size_t)(g->n_token_names ? g->n_token_names : 1), sizeof *G->token_ids))) {
        free(G);
        free(key);
        q3g_free(g);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    G->refs = 1;
    G->key = key;
    G->key_len = len + 1;
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
    G->share = mask_share_new(gvocab_mask_words(v)); /* NULL: masks are not shared, nothing else changes */
    cache_put(G);
    *out = G;
    return Q3_OK;
}

void q3_grammar_free(q3_grammar *G) { grammar_unref(G); }

size_t q3_grammar_bytes(const q3_grammar *G)
{
    return sizeof *G + G->g->bytes + (size_t)G->g->n_token_names * sizeof *G->token_ids;
}
