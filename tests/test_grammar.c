/* The grammar engine: exact token masks against a brute-force oracle over the
 * full Qwen3 vocabulary, at random reachable prefixes of several grammars;
 * ends, named tokens and the thinking phase; the GBNF front end's syntax and
 * errors. (JSON Schema: test_grammar_schema.c; the suite: test_grammar_suite.c.) */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/mask.h"
#include "q3.h"
#include "test.h"

#define TOKENIZER_JSON TEST_DATA "/golden/e2e/tokenizer.json"

static q3_tokenizer *tok;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static int bit(const uint64_t *m, int32_t r) { return (int)(m[r >> 6] >> (r & 63) & 1); }

/* Walks `steps` random allowed tokens through g, comparing the mask with the
 * oracle at every step; returns the number of mismatching steps. out (if
 * given) gets the generated text. */
static int walk(q3_grammar *G, int steps, char *out, size_t out_cap)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) {
        CHECK(0, "q3_matcher_new: %s", q3_last_error());
        return 1;
    }
    const gvocab *v = G->v;
    size_t words = gvocab_mask_words(v);
    uint64_t *brute = malloc(words * 8);
    int32_t *allowed = malloc((size_t)v->n_ids * sizeof *allowed);
    int bad = 0;
    size_t out_len = 0;
    for (int step = 0; step < steps; step++) {
        const uint64_t *mask;
        if (matcher_rank_mask(m, &mask)) {
            CHECK(0, "mask: %s", q3_last_error());
            bad++;
            break;
        }
        if (mask_brute(&m->r, v, m->state, brute)) {
            bad++;
            break;
        }
        int diff = 0;
        for (int32_t r = 0; r < v->n_trie_ranks; r++)
            if (bit(mask, r) != bit(brute, r)) {
                if (!diff)
                    fprintf(stderr, "mask mismatch at step %d: token %d (%s) mask %d oracle %d\n", step,
                            v->id_of_rank[r], "", bit(mask, r), bit(brute, r));
                diff++;
            }
        if (diff) bad++;
        /* ends only where complete; no added token the grammar does not name */
        int complete = rec_accepting(&m->r, m->state);
        if (bit(mask, v->rank_of[v->eot]) != complete || bit(mask, v->rank_of[v->eos]) != complete) bad++;
        for (int32_t id = 0; id < v->n_ids; id++) {
            if (v->in_trie[id] || id == v->eot || id == v->eos) continue;
            int named = 0;
            for (int i = 0; i < G->g->n_token_names; i++) named |= G->token_ids[i] == id;
            if (!named && bit(mask, v->rank_of[id])) {
                fprintf(stderr, "added token %d allowed\n", id);
                bad++;
                break;
            }
        }
        int n = 0;
        for (int32_t id = 0; id < v->n_ids; id++)
            if (bit(mask, v->rank_of[id]) && id != v->eot && id != v->eos) allowed[n++] = id;
        if (!n) {
            CHECK(complete, "no token allowed and the output is not complete");
            break;
        }
        int32_t id = allowed[rnd() % (uint32_t)n];
        if (q3_matcher_accept(m, id)) {
            CHECK(0, "accept of an allowed token failed: %s", q3_last_error());
            bad++;
            break;
        }
        const char *b;
        size_t l;
        if (out && !q3_tokenizer_piece(tok, id, &b, &l) && out_len + l < out_cap) {
            memcpy(out + out_len, b, l);
            out_len += l;
        }
    }
    if (out) out[out_len] = 0;
    free(brute);
    free(allowed);
    q3_matcher_free(m);
    return bad;
}

static q3_grammar *compile(q3_grammar_kind k, const char *text)
{
    q3_grammar *G = NULL;
    q3_status st = q3_grammar_compile(tok, k, text, text ? strlen(text) : 0, &G);
    CHECK(st == Q3_OK, "compile %.60s: %s", text ? text : "", q3_last_error());
    return G;
}

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_oracle(void)
{
    const char *grammars[] = {
        JSON_GBNF,
        "root ::= \"hello\" ( \" \" [a-z]+ ){1,3} \"!\"\n",
        "root ::= [0-9]{3} \"-\" [0-9]{4} | \"(\" [0-9]{3} \") \" [0-9]{3} \"-\" [0-9]{4}\n",
        "root ::= item (\",\" item)*\nitem ::= [^,\\n]{1,12} | \"\\\"\" [^\"]* \"\\\"\"\n",
        "root ::= \"<\" .* \">\" | [\\u00e0-\\u00ff\\u4e00-\\u4e10]+\n",
    };
    for (size_t i = 0; i < sizeof grammars / sizeof grammars[0]; i++) {
        q3_grammar *G = compile(Q3_GRAMMAR_GBNF, grammars[i]);
        if (!G) continue;
        for (int seed = 0; seed < 2; seed++) {
            rng_state = 0x1234567ull * (uint64_t)(seed + 1) + i;
            char text[4096];
            int bad = walk(G, 10, text, sizeof text);
            CHECK(bad == 0, "grammar %zu seed %d: %d steps differ from the oracle (text so far: %s)", i, seed, bad,
                  text);
        }
        q3_grammar_free(G);
    }
}

static void check_text(q3_grammar *G, const char *text, int want_complete, long want_reject_at)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return;
    size_t ok = 0;
    q3_status st = q3_matcher_accept_bytes(m, text, strlen(text), &ok);
    if (want_reject_at >= 0) {
        CHECK(st == Q3_ERR_INVALID && (long)ok == want_reject_at, "'%s': want rejected at %ld, got st %d at %zu", text,
              want_reject_at, st, ok);
    } else {
        CHECK(st == Q3_OK, "'%s' rejected at %zu", text, ok);
        int complete = q3_matcher_state(m) != Q3_MATCH_OPEN;
        CHECK(complete == want_complete, "'%s': complete %d, want %d", text, complete, want_complete);
    }
    q3_matcher_free(m);
}

static void test_gbnf_language(void)
{
    q3_grammar *G = compile(Q3_GRAMMAR_GBNF, JSON_GBNF);
    if (G) {
        check_text(G, "{\"a\": [1, 2.5e3, true, null, \"x\\u00e9\"]}", 1, -1);
        check_text(G, "{\"a\": [1, 2", 0, -1);
        check_text(G, "{\"a\" 1}", 0, 5);
        check_text(G, "{\"a\": 01}", 0, 7);
        check_text(G, "{\"caf\xc3\xa9\": \"\xe4\xb8\xad\"}", 1, -1);
        check_text(G, "{\"\xc3\": 1}", 0, 3); /* a lone lead byte then a quote */
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_GBNF, "root ::= \"a\"{2,3} x? # comment\nx ::= [^a-y]\n");
    if (G) {
        check_text(G, "aa", 1, -1);
        check_text(G, "aaa", 1, -1);
        check_text(G, "aaaz", 1, -1);
        check_text(G, "aaaa", 0, 3);
        check_text(G, "aab", 0, 2);
        check_text(G, "a", 0, -1);
        q3_grammar_free(G);
    }
    struct {
        const char *g, *msg;
        q3_status st;
    } bad[] = {
        {"root ::= foo\n", "'foo' is used but not defined", Q3_ERR_INVALID},
        {"start ::= \"x\"\n", "no rule 'root'", Q3_ERR_INVALID},
        {"root ::= root \"x\" | \"y\"\n", "left-recursive", Q3_ERR_UNSUPPORTED},
        {"root ::= \"x\n", "unterminated literal", Q3_ERR_INVALID},
        {"root ::= [a-z", "unterminated character class", Q3_ERR_INVALID},
        {"root ::= \"a\" ) \"b\"\n", "line 1, column 14", Q3_ERR_INVALID},
        {"root ::= \"x\" root\n", "matches no string", Q3_ERR_INVALID},
        {"root ::= \"a\"{3,1}\n", "n < m", Q3_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        q3_grammar *B = NULL;
        q3_status st = q3_grammar_compile(tok, Q3_GRAMMAR_GBNF, bad[i].g, strlen(bad[i].g), &B);
        CHECK(st == bad[i].st && !B, "'%s': status %d, want %d", bad[i].g, st, bad[i].st);
        CHECK_CONTAINS(q3_last_error(), bad[i].msg);
        q3_grammar_free(B);
    }
}

/* Ends, named tokens, the thinking phase, and the apply/mask entry points agreeing. */
static void test_tokens_and_thinking(void)
{
    q3_grammar *G = compile(Q3_GRAMMAR_GBNF, "root ::= <tool_call> \"\\n{}\\n\" </tool_call>\n");
    if (!G) return;
    int32_t tc = q3_tokenizer_token_id(tok, "<tool_call>", 11), tce = q3_tokenizer_token_id(tok, "</tool_call>", 12);
    int32_t eot = q3_tokenizer_end_of_turn(tok), think_end = q3_tokenizer_token_id(tok, "</think>", 8);
    int n_vocab = 151936;
    uint32_t *bits = calloc((size_t)n_vocab / 32 + 1, 4);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    q3_matcher *m;
    CHECK(q3_matcher_new(G, 0, &m) == Q3_OK, "new");
    CHECK(q3_matcher_mask(m, bits, n_vocab) == Q3_OK, "mask");
    int n = 0;
    for (int id = 0; id < n_vocab; id++) n += bits[id >> 5] >> (id & 31) & 1;
    CHECK(n == 1 && (bits[tc >> 5] >> (tc & 31) & 1), "only <tool_call> allowed at the start (%d allowed)", n);
    for (int id = 0; id < n_vocab; id++) logits[id] = 0.0f;
    CHECK(q3_matcher_apply(m, logits, n_vocab) == Q3_OK, "apply");
    int agree = 1;
    for (int id = 0; id < n_vocab; id++) agree &= (logits[id] == 0.0f) == (int)(bits[id >> 5] >> (id & 31) & 1);
    CHECK(agree, "apply and mask agree");
    CHECK(q3_matcher_accept(m, eot) == Q3_ERR_INVALID, "end before the text is complete");
    CHECK(q3_matcher_accept(m, tc) == Q3_OK, "<tool_call>");
    size_t ok;
    CHECK(q3_matcher_accept_bytes(m, "\n{}\n", 4, &ok) == Q3_OK, "body");
    CHECK(q3_matcher_state(m) == Q3_MATCH_OPEN, "open before </tool_call>");
    CHECK(q3_matcher_accept(m, tce) == Q3_OK, "</tool_call>");
    CHECK(q3_matcher_state(m) == Q3_MATCH_DONE, "done after it");
    q3_matcher_mask(m, bits, n_vocab);
    n = 0;
    for (int id = 0; id < n_vocab; id++) n += bits[id >> 5] >> (id & 31) & 1;
    CHECK(n == 2 && (bits[eot >> 5] >> (eot & 31) & 1), "only the two ends allowed when done (%d)", n);
    CHECK(q3_matcher_accept(m, eot) == Q3_OK, "end");
    q3_matcher_free(m);
    q3_grammar_free(G);

    /* thinking: free until </think>, no end before it; then newlines, then the grammar */
    G = compile(Q3_GRAMMAR_GBNF, "root ::= \"yes\" | \"no\"\n");
    if (!G) return;
    CHECK(q3_matcher_new(G, Q3_MATCHER_AFTER_THINK, &m) == Q3_OK, "new");
    q3_matcher_mask(m, bits, n_vocab);
    int32_t hello = q3_tokenizer_token_id(tok, "hello", 5);
    CHECK((bits[hello >> 5] >> (hello & 31) & 1) && !(bits[eot >> 5] >> (eot & 31) & 1), "thinking is free, no end");
    CHECK(q3_matcher_accept(m, hello) == Q3_OK, "think text");
    CHECK(q3_matcher_accept(m, think_end) == Q3_OK, "</think>");
    CHECK(q3_matcher_accept_bytes(m, "\n\nyes", 5, &ok) == Q3_OK, "two newlines then the answer");
    CHECK(q3_matcher_state(m) == Q3_MATCH_DONE, "done");
    q3_matcher_reset(m);
    CHECK(q3_matcher_accept(m, think_end) == Q3_OK, "</think>");
    CHECK(q3_matcher_accept_bytes(m, "\n\n\nyes", 6, &ok) == Q3_ERR_INVALID && ok == 2, "three newlines rejected");
    q3_matcher_free(m);
    q3_grammar_free(G);
    free(bits);
    free(logits);
}

/* The compile cache hands out the same grammar; apply and mask agree where most tokens are allowed too. */
static void test_cache_and_apply(void)
{
    q3_grammar *A = compile(Q3_GRAMMAR_GBNF, JSON_GBNF), *B = compile(Q3_GRAMMAR_GBNF, JSON_GBNF);
    CHECK(A && A == B, "the same text compiles to the cached grammar");
    q3_grammar_free(B);
    q3_matcher *m;
    if (!A || q3_matcher_new(A, 0, &m)) return;
    size_t ok;
    q3_matcher_accept_bytes(m, "{\"ab", 4, &ok); /* inside a string: almost everything allowed */
    int n_vocab = 151936;
    uint32_t *bits = calloc((size_t)n_vocab / 32 + 1, 4);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    for (int id = 0; id < n_vocab; id++) logits[id] = 1.0f;
    q3_matcher_mask(m, bits, n_vocab);
    q3_matcher_apply(m, logits, n_vocab);
    int agree = 1, allowed = 0;
    for (int id = 0; id < n_vocab; id++) {
        int b = (int)(bits[id >> 5] >> (id & 31) & 1);
        allowed += b;
        agree &= (logits[id] == 1.0f) == b;
    }
    CHECK(agree && allowed > 100000, "apply and mask agree inside a string (%d allowed)", allowed);
    q3_matcher_free(m);
    q3_grammar_free(A);
    /* apply's paths: the ten digits (kept, the row forbidden, put back), ~17 thousand (past its
       4,096 kept: the zero bits forbidden one by one), ~69 thousand (over a quarter of the row) */
    const char *regexes[] = {"[0-9]+", "[a-z][a-z]*", "[a-zA-Z ][a-zA-Z ]*"};
    int sizes[3] = {0};
    for (int r = 0; r < 3; r++) {
        q3_grammar *R = compile(Q3_GRAMMAR_REGEX, regexes[r]);
        if (!R || q3_matcher_new(R, 0, &m)) {
            q3_grammar_free(R);
            continue;
        }
        for (int id = 0; id < n_vocab; id++) logits[id] = (float)(id % 7);
        q3_matcher_mask(m, bits, n_vocab);
        q3_matcher_apply(m, logits, n_vocab);
        agree = 1, allowed = 0;
        for (int id = 0; id < n_vocab; id++) {
            int b = (int)(bits[id >> 5] >> (id & 31) & 1);
            allowed += b;
            agree &= b ? logits[id] == (float)(id % 7) : logits[id] == -INFINITY;
        }
        sizes[r] = allowed;
        CHECK(agree && allowed > 0, "apply and mask agree for /%s/ (%d allowed)", regexes[r], allowed);
        q3_matcher_free(m);
        q3_grammar_free(R);
    }
    CHECK(sizes[0] <= 4096 && sizes[1] > 4096 && sizes[1] < n_vocab / 4 && sizes[2] >= n_vocab / 4,
          "the regexes reach each of apply's paths (%d, %d, %d allowed)", sizes[0], sizes[1], sizes[2]);
    free(bits);
    free(logits);
}

int main(void)
{
    if (q3_tokenizer_load(TOKENIZER_JSON, &tok)) {
        CHECK(0, "tokenizer: %s", q3_last_error());
        TEST_DONE();
    }
    test_oracle();
    test_gbnf_language();
    test_tokens_and_thinking();
    test_cache_and_apply();
    q3_tokenizer_free(tok);
    TEST_DONE();
}
