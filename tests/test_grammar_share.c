/* A grammar's masks shared by its matchers (src/grammar/mask_share.h): a
 * second matcher walking the same text finds every mask the first one kept
 * and they are the same bits; state keys are the same across recognizers;
 * matchers of one grammar on several threads at once get the masks a fresh
 * computation gives (this test also runs under ThreadSanitizer in CI); and
 * the table stays within its bound. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/mask.h"
#include "q3.h"
#include "test.h"

#define TOKENIZER_JSON TEST_DATA "/golden/e2e/tokenizer.json"

static q3_tokenizer *tok;

/* A schema no other test compiles (the compile cache would hand over its grammar, kept masks and all). */
static const char *schema = "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":24},"
                            "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]}},"
                            "\"n\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":700}},"
                            "\"required\":[\"title\",\"tags\",\"n\"],\"additionalProperties\":false}";
static const char *text = "{\"title\": \"Shared masks \\u00e9t\\u00e9\", \"tags\": [\"red\", \"blue\"], \"n\": 512}";

static size_t words_of(const q3_grammar *G) { return gvocab_mask_words(G->v); }

/* Walks text's tokens with a fresh matcher, copying each mask into masks
 * (n_ids + 1 of them, words each). Returns the masks taken, or -1. */
static int walk(q3_grammar *G, const int32_t *ids, size_t n, uint64_t *masks)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return -1;
    size_t words = words_of(G);
    int taken = 0;
    for (size_t i = 0; i <= n; i++) {
        const uint64_t *mask;
        if (matcher_rank_mask(m, &mask)) break;
        memcpy(masks + i * words, mask, words * sizeof *mask);
        taken++;
        if (i == n || q3_matcher_accept(m, ids[i])) break;
    }
    q3_matcher_free(m);
    return taken;
}

static void test_second_matcher(void)
{
    q3_grammar *G = NULL;
    CHECK(q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &G) == Q3_OK, "compile: %s",
          q3_last_error());
    if (!G) return;
    CHECK(G->share != NULL, "a compiled grammar has a table for shared masks");
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &ids, &n) == Q3_OK, "encode");
    size_t words = words_of(G);
    uint64_t *a = malloc((n + 1) * words * 8), *b = malloc((n + 1) * words * 8);
    int ta = walk(G, ids, n, a);
    CHECK(ta == (int)n + 1, "the first matcher walked %d of %zu masks", ta, n + 1);
    size_t bytes = 0, kept = mask_share_count(G->share, &bytes);
    CHECK(kept > 0 && kept <= (size_t)ta, "the first walk kept %zu masks for %d steps", kept, ta);
    CHECK(bytes <= MASK_SHARE_GRAMMAR_BYTES, "%zu bytes kept, bound %zu", bytes, (size_t)MASK_SHARE_GRAMMAR_BYTES);
    int tb = walk(G, ids, n, b);
    CHECK(tb == ta, "the second matcher walked %d masks, the first %d", tb, ta);
    CHECK(mask_share_count(G->share, NULL) == kept, "the second walk met no state the first had not kept (%zu, then %zu)",
          kept, mask_share_count(G->share, NULL));
    CHECK(ta == tb && !memcmp(a, b, (size_t)ta * words * 8), "the second matcher's masks are the first one's");
    /* the same walk with nothing shared: every mask computed afresh */
    mask_share *share = G->share;
    G->share = NULL;
    int tc = walk(G, ids, n, b);
    G->share = share;
    CHECK(tc == ta && !memcmp(a, b, (size_t)ta * words * 8), "shared masks equal masks computed without the table");
    free(a);
    free(b);
    free(ids);
    q3_grammar_free(G);
}

/* The key of a state does not depend on the recognizer's numbering: two
 * recognizers reaching the same text by different orders of work (one
 * computed masks on the way, making states the other never made) write the
 * same key; a different state writes another. */
static void test_keys(void)
{
    q3_grammar *G = NULL;
    if (q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &G)) {
        CHECK(0, "compile: %s", q3_last_error());
        return;
    }
    q3_matcher *m1, *m2;
    CHECK(q3_matcher_new(G, 0, &m1) == Q3_OK && q3_matcher_new(G, 0, &m2) == Q3_OK, "matchers");
    const char *prefix = "{\"title\": \"ab";
    const uint64_t *mask;
    for (const char *p = prefix; *p; p++) { /* m1 computes a mask at every byte: many more states */
        CHECK(matcher_rank_mask(m1, &mask) == Q3_OK, "mask");
        CHECK(q3_matcher_accept_bytes(m1, p, 1, NULL) == Q3_OK, "byte");
    }
    CHECK(q3_matcher_accept_bytes(m2, prefix, strlen(prefix), NULL) == Q3_OK, "bytes");
    CHECK(m1->r.n_states != m2->r.n_states, "the two recognizers made different states (%d, %d)", m1->r.n_states,
          m2->r.n_states);
    int32_t *k1 = NULL, *k2 = NULL;
    size_t c1 = 0, c2 = 0;
    uint64_t h1 = 0, h2 = 0;
    int32_t least;
    long n1 = rec_state_key(&m1->r, m1->state, INT32_MAX, &k1, &c1, &h1, &least),
         n2 = rec_state_key(&m2->r, m2->state, INT32_MAX, &k2, &c2, &h2, &least);
    CHECK(n1 > 0 && n1 == n2 && h1 == h2 && !memcmp(k1, k2, (size_t)n1 * 4), "the same state, the same key (%ld, %ld words)",
          n1, n2);
    CHECK(q3_matcher_accept_bytes(m2, "c", 1, NULL) == Q3_OK, "byte");
    n2 = rec_state_key(&m2->r, m2->state, INT32_MAX, &k2, &c2, &h2, &least);
    CHECK(n2 > 0 && (n2 != n1 || memcmp(k1, k2, (size_t)n1 * 4)), "another state, another key");
    free(k1);
    free(k2);
    q3_matcher_free(m1);
    q3_matcher_free(m2);
    q3_grammar_free(G);
}

typedef struct walker {
    q3_grammar *G;
    uint64_t seed;
    int steps, bad, done;
} walker;

/* Random allowed tokens; each mask (the table's or its own) against one
 * computed afresh by this thread's recognizer. */
static void *random_walk(void *arg)
{
    walker *w = arg;
    const gvocab *v = w->G->v;
    size_t words = gvocab_mask_words(v);
    uint64_t *fresh = malloc(words * 8);
    int32_t *allowed = malloc((size_t)v->n_ids * 4);
    q3_matcher *m = NULL;
    if (!fresh || !allowed || q3_matcher_new(w->G, 0, &m)) {
        w->bad++;
        goto out;
    }
    for (int s = 0; s < w->steps; s++) {
        const uint64_t *mask;
        if (matcher_rank_mask(m, &mask) || mask_trie(&m->r, v, m->state, -1, fresh)) {
            w->bad++;
            break;
        }
        for (size_t k = 0; k < words; k++) w->bad += (mask[k] ^ fresh[k]) != 0;
        int n = 0;
        for (int32_t id = 0; id < v->n_ids; id++)
            if (mask[v->rank_of[id] >> 6] >> (v->rank_of[id] & 63) & 1 && id != v->eot && id != v->eos) allowed[n++] = id;
        if (!n) break;
        w->seed = w->seed * 6364136223846793005ull + 1442695040888963407ull;
        if (q3_matcher_accept(m, allowed[(w->seed >> 33) % (uint64_t)n])) {
            w->bad++;
            break;
        }
        w->done++;
    }
out:
    q3_matcher_free(m);
    free(fresh);
    free(allowed);
    return NULL;
}

/* Counts in keys: inside a string of at most 200 characters, states after 3
 * and 5 characters (195+ left, more than the longest token) write the same
 * key up to the longest token; after 100 and 101 they do not, but they do up
 * to the least count the second holds (what mask.h's keep relies on): 98, the
 * characters allowed after the one being read. */
static long key_after(q3_grammar *G, const char *text, int upto, int32_t **key, size_t *cap, uint64_t *h, int32_t *least)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return -1;
    long n = q3_matcher_accept_bytes(m, text, strlen(text), NULL) ? -1 : rec_state_key(&m->r, m->state, upto, key, cap, h, least);
    q3_matcher_free(m);
    return n;
}

static void test_count_keys(void)
{
    q3_grammar *G = NULL;
    const char *s = "{\"type\":\"string\",\"maxLength\":200}";
    if (q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, s, strlen(s), &G)) {
        CHECK(0, "compile: %s", q3_last_error());
        return;
    }
    char t[4][128];
    int lens[4] = {3, 5, 100, 101};
    for (int i = 0; i < 4; i++) {
        t[i][0] = '"';
        memset(t[i] + 1, 'a', (size_t)lens[i]);
        t[i][lens[i] + 1] = 0;
    }
    int upto = G->v->max_token_bytes;
    CHECK(upto > 0 && upto < 195, "the longest token has %d bytes", upto);
    int32_t *k[2] = {NULL, NULL}, least[2];
    size_t cap[2] = {0, 0};
    uint64_t h[2];
    long n0 = key_after(G, t[0], upto, &k[0], &cap[0], &h[0], &least[0]);
    long n1 = key_after(G, t[1], upto, &k[1], &cap[1], &h[1], &least[1]);
    CHECK(n0 > 0 && n0 == n1 && h[0] == h[1] && !memcmp(k[0], k[1], (size_t)n0 * 4),
          "195 and 197 characters left: one key up to %d bytes", upto);
    CHECK(least[0] == 196 && least[1] == 194, "the least counts left: %d, %d", least[0], least[1]);
    n0 = key_after(G, t[2], upto, &k[0], &cap[0], &h[0], &least[0]);
    n1 = key_after(G, t[3], upto, &k[1], &cap[1], &h[1], &least[1]);
    CHECK(n0 > 0 && n1 > 0 && (n0 != n1 || memcmp(k[0], k[1], (size_t)n0 * 4)), "100 and 99 characters left: two keys");
    CHECK(least[0] == 99 && least[1] == 98, "the least counts left: %d, %d", least[0], least[1]);
    n0 = key_after(G, t[2], 98, &k[0], &cap[0], &h[0], &least[0]);
    n1 = key_after(G, t[3], 98, &k[1], &cap[1], &h[1], &least[1]);
    CHECK(n0 > 0 && n0 == n1 && !memcmp(k[0], k[1], (size_t)n0 * 4), "100 and 99 characters left: one key up to 98 bytes");
    free(k[0]);
    free(k[1]);
    q3_grammar_free(G);
}

static void test_threads(void)
{
    static const char *s2 = "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"x\",\"y\"]},"
                            "\"v\":{\"type\":\"number\"}},\"required\":[\"k\",\"v\"],\"additionalProperties\":false},"
                            "\"maxItems\":6}";
    q3_grammar *G = NULL;
    if (q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, s2, strlen(s2), &G)) {
        CHECK(0, "compile: %s", q3_last_error());
        return;
    }
    enum { T = 4 };
    walker w[T];
    pthread_t th[T];
    int started[T];
    for (int i = 0; i < T; i++) {
        w[i] = (walker){.G = G, .seed = (uint64_t)(i % 2) * 1000 + 17, .steps = 24}; /* two seeds, each twice */
        started[i] = pthread_create(&th[i], NULL, random_walk, &w[i]) == 0;
    }
    for (int i = 0; i < T; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        CHECK(started[i], "thread %d did not start", i);
        CHECK(w[i].bad == 0, "thread %d: %d masks differ from a fresh computation", i, w[i].bad);
        CHECK(w[i].done > 4, "thread %d walked only %d tokens", i, w[i].done);
    }
    CHECK(w[0].done == w[2].done && w[1].done == w[3].done, "the same seed walks the same tokens on any thread");
    CHECK(mask_share_count(G->share, NULL) > 0, "the threads kept masks");
    q3_grammar_free(G);
}

int main(void)
{
    if (q3_tokenizer_load(TOKENIZER_JSON, &tok)) {
        CHECK(0, "tokenizer: %s", q3_last_error());
        TEST_DONE();
    }
    test_second_matcher();
    test_keys();
    test_count_keys();
    test_threads();
    q3_tokenizer_free(tok);
    TEST_DONE();
}
