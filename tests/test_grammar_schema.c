/* JSON Schema, regex and tool-call front ends: texts accepted and rejected,
 * exact integer and number ranges, refused keywords named, and the mask
 * oracle on a recursive schema, a schema with formats, and a regex. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/mask.h"
#include "q3.h"
#include "test.h"

#define TOKENIZER_JSON TEST_DATA "/golden/e2e/tokenizer.json"

static q3_tokenizer *tok;

static q3_grammar *compile(q3_grammar_kind k, const char *text)
{
    q3_grammar *G = NULL;
    q3_status st = q3_grammar_compile(tok, k, text, strlen(text), &G);
    CHECK(st == Q3_OK, "compile %.80s: %s", text, q3_last_error());
    return G;
}

/* 1 complete, 0 a valid prefix, -1 rejected. */
static int run_text(q3_grammar *G, const char *text)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return -2;
    size_t ok;
    q3_status st = q3_matcher_accept_bytes(m, text, strlen(text), &ok);
    int r = st ? -1 : q3_matcher_state(m) != Q3_MATCH_OPEN ? 1 : 0;
    q3_matcher_free(m);
    return r;
}

#define ACCEPT(G, t) CHECK(run_text(G, t) == 1, "'%s' should be accepted (got %d)", t, run_text(G, t))
#define PREFIX(G, t) CHECK(run_text(G, t) == 0, "'%s' should be a valid prefix (got %d)", t, run_text(G, t))
#define INCOMPLETE(G, t) CHECK(run_text(G, t) != 1, "'%s' should not be accepted as complete", t)
#define REJECT(G, t) CHECK(run_text(G, t) == -1, "'%s' should be rejected (got %d)", t, run_text(G, t))

static void test_objects(void)
{
    q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA,
                            "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
                            "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
                            "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",null]},\"maxItems\":2}},"
                            "\"required\":[\"name\"],\"additionalProperties\":false}");
    if (!G) return;
    ACCEPT(G, "{\"name\":\"bob\"}");
    ACCEPT(G, "{\"name\": \"bob\", \"age\": 42, \"tags\": [\"a\", null]}");
    ACCEPT(G, "{ \"name\" : \"\\u00e9\\n\" , \"tags\" : [ ] }");
    ACCEPT(G, "{\n  \"name\": \"x\",\n  \"age\": 150\n}");
    REJECT(G, "{\"age\": 3}");                     /* name is required and comes first */
    REJECT(G, "{\"name\":\"bob\",\"age\":151}");
    REJECT(G, "{\"name\":\"bob\",\"age\":-1}");
    REJECT(G, "{\"name\":\"toolong\"}");
    REJECT(G, "{\"name\":\"b\",\"tags\":[\"a\",\"b\",\"a\"]}");
    REJECT(G, "{\"name\":\"b\",\"other\":1}");
    REJECT(G, "{\"name\":\"b\",}");
    PREFIX(G, "{\"name\":\"b\"");
    char spaces[128] = "{";
    memset(spaces + 1, ' ', 40);
    spaces[41] = 0;
    REJECT(G, spaces); /* whitespace is bounded */
    q3_grammar_free(G);

    /* additional properties: allowed after the listed ones, never with a listed name */
    G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}");
    if (G) {
        ACCEPT(G, "{\"a\":1,\"b\":\"x\"}");
        ACCEPT(G, "{\"ab\":\"x\"}");
        ACCEPT(G, "{\"b\":\"x\",\"\\u0061\":\"y\"}");
        REJECT(G, "{\"a\":\"x\"}");
        REJECT(G, "{\"b\":\"x\",\"a\":\"y\"}");
        REJECT(G, "{\"b\":1}");
        ACCEPT(G, "\"not an object\""); /* no type: other types are not constrained */
        ACCEPT(G, "[1,{\"x\":null}]");
        q3_grammar_free(G);
    }
}

static void test_numbers(void)
{
    struct {
        const char *schema;
        long lo, hi; /* accepted integers within [-3000, 3000] */
    } ranges[] = {
        {"{\"type\":\"integer\",\"minimum\":-37,\"maximum\":1234}", -37, 1234},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":9,\"exclusiveMaximum\":100}", 10, 99},
        {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":7.5}", 1, 7},
        {"{\"type\":\"integer\",\"maximum\":-10}", -3000, -10},
        {"{\"type\":\"integer\",\"minimum\":999}", 999, 3000},
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", 0, 0},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA, ranges[i].schema);
        if (!G) continue;
        int wrong = 0;
        for (long v = -3000; v <= 3000; v++) {
            char t[32];
            snprintf(t, sizeof t, "%ld", v);
            int want = v >= ranges[i].lo && v <= ranges[i].hi, got = run_text(G, t) == 1;
            if (want != got && wrong++ < 3) fprintf(stderr, "%s: %ld accepted %d\n", ranges[i].schema, v, got);
        }
        CHECK(wrong == 0, "%s: %d integers wrong", ranges[i].schema, wrong);
        REJECT(G, "012");
        REJECT(G, "1.5");
        q3_grammar_free(G);
    }
    q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":-2,\"exclusiveMaximum\":3}");
    if (G) {
        const char *yes[] = {"-2", "-2.0", "-1.999", "0", "-0.5", "2.999", "1", "0.25"};
        const char *no[] = {"-2.001", "3", "3.0", "3.5", "-3", "10"};
        for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) ACCEPT(G, yes[i]);
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) REJECT(G, no[i]);
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\"}");
    if (G) {
        ACCEPT(G, "-1.5e+10");
        ACCEPT(G, "0");
        REJECT(G, "01");
        PREFIX(G, "1.");
        REJECT(G, "1.e");
        REJECT(G, ".5");
        q3_grammar_free(G);
    }
}

static void test_strings_and_formats(void)
{
    q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA,
                            "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
                            "\"u\":{\"format\":\"uuid\",\"type\":\"string\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},"
                            "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},"
                            "\"free\":{\"type\":\"string\",\"pattern\":\"ab\"},"
                            "\"dt\":{\"type\":\"string\",\"format\":\"date-time\"},"
                            "\"e\":{\"type\":\"string\",\"format\":\"email\"}},\"additionalProperties\":false}");
    if (!G) return;
    ACCEPT(G, "{\"d\":\"2024-02-29\",\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip\":\"192.168.0.255\","
              "\"code\":\"AB-123\",\"free\":\"xxabyy\",\"dt\":\"2024-01-01T12:00:00Z\",\"e\":\"a.b@c.org\"}");
    REJECT(G, "{\"d\":\"2024-13-01\"}");
    REJECT(G, "{\"ip\":\"256.1.1.1\"}");
    REJECT(G, "{\"code\":\"AB-12\"}");
    REJECT(G, "{\"code\":\"AB-1234\"}");
    REJECT(G, "{\"free\":\"xxayy\"}");
    REJECT(G, "{\"dt\":\"2024-01-01 25:00:00Z\"}");
    q3_grammar_free(G);
    G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c\\n$\"}");
    if (G) {
        ACCEPT(G, "\"a\\\"b\\\\c\\n\""); /* ", \ and newline as JSON escapes them */
        REJECT(G, "\"a\"");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    if (G) {
        REJECT(G, "\"a\"");
        ACCEPT(G, "\"\xc3\xa9\\n\"");
        ACCEPT(G, "\"abc\"");
        REJECT(G, "\"abcd\"");
        q3_grammar_free(G);
    }
}

static void test_combinators(void)
{
    const char *rec = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                      "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
                      "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA, rec);
    if (G) {
        ACCEPT(G, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}");
        REJECT(G, "{\"v\":1,\"kids\":[{\"w\":2}]}");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_JSON_SCHEMA,
                "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\",\"minimum\":5}],"
                "\"definitions\":{}}");
    if (G) {
        ACCEPT(G, "\"a\"");
        ACCEPT(G, "7");
        INCOMPLETE(G, "4");
        REJECT(G, "4.5");
        REJECT(G, "\"ab\"");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_JSON_SCHEMA,
                "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                "{\"properties\":{\"b\":{\"const\":true},\"a\":{\"maximum\":3}},\"required\":[\"b\"]}],"
                "\"additionalProperties\":false}");
    if (G) {
        ACCEPT(G, "{\"a\":3,\"b\":true}");
        REJECT(G, "{\"a\":4,\"b\":true}");
        REJECT(G, "{\"a\":3}");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":[\"array\",\"null\"],\"prefixItems\":[{\"type\":\"boolean\"},"
                                        "{\"type\":\"string\"}],\"items\":false,\"minItems\":1}");
    if (G) {
        ACCEPT(G, "null");
        ACCEPT(G, "[true]");
        ACCEPT(G, "[false, \"x\"]");
        REJECT(G, "[]");
        REJECT(G, "[true, \"x\", 1]");
        REJECT(G, "[\"x\"]");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_JSON_SCHEMA, "{\"const\":{\"k\":[1,\"two\",null]}}");
    if (G) {
        ACCEPT(G, "{\"k\":[1,\"two\",null]}");
        ACCEPT(G, "{ \"k\" : [ 1 , \"two\" , null ] }");
        REJECT(G, "{\"k\":[1,\"two\"]}");
        q3_grammar_free(G);
    }
}

static void test_refusals(void)
{
    struct {
        const char *schema, *named;
    } bad[] = {
        {"{\"type\":\"integer\",\"multipleOf\":3}", "'multipleOf'"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "'uniqueItems'"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", "'patternProperties'"},
        {"{\"if\":{\"type\":\"string\"},\"then\":{\"minLength\":1}}", "'if'"},
        {"{\"not\":{\"type\":\"string\"}}", "'not'"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "hostname"},
        {"{\"type\":\"number\",\"minimum\":1.5}", "'minimum'"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "'$ref'"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "lookaround"},
        {"{\"properties\":{\"x\":{\"minProperties\":1}}}", "'minProperties'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        q3_grammar *G = NULL;
        q3_status st = q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, bad[i].schema, strlen(bad[i].schema), &G);
        CHECK(st == Q3_ERR_UNSUPPORTED && !G, "%s: status %d (%s)", bad[i].schema, st, q3_last_error());
        CHECK_CONTAINS(q3_last_error(), bad[i].named);
        q3_grammar_free(G);
    }
    /* the published lists (q3_json_schema_keywords, /props) say what compiling does */
    const char *const *refused = q3_json_schema_keywords(Q3_SCHEMA_REFUSED);
    int n_refused = 0;
    for (int i = 0; refused && refused[i]; i++, n_refused++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"object\",\"%s\":{}}", refused[i]);
        q3_grammar *G = NULL;
        q3_status st = q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, schema, strlen(schema), &G);
        char named[80];
        snprintf(named, sizeof named, "'%s'", refused[i]);
        CHECK(st == Q3_ERR_UNSUPPORTED && strstr(q3_last_error(), named), "%s: status %d (%s)", schema, st, q3_last_error());
        q3_grammar_free(G);
    }
    const char *const *formats = q3_json_schema_keywords(Q3_SCHEMA_FORMATS);
    int n_formats = 0;
    for (int i = 0; formats && formats[i]; i++, n_formats++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"format\":\"%s\"}", formats[i]);
        q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA, schema);
        q3_grammar_free(G);
    }
    int has_max = 0;
    for (const char *const *k = q3_json_schema_keywords(Q3_SCHEMA_SUPPORTED); k && *k; k++) has_max |= !strcmp(*k, "maxLength");
    CHECK(n_refused >= 20 && n_formats == 6 && has_max && !q3_json_schema_keywords((q3_schema_list)99),
          "keyword lists: %d refused, %d formats, maxLength %d", n_refused, n_formats, has_max);
    q3_grammar *G = NULL;
    CHECK(q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":", 8, &G) == Q3_ERR_INVALID, "malformed JSON");
    CHECK(q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"strin\"}", 16, &G) == Q3_ERR_INVALID, "bad type");
    CHECK_CONTAINS(q3_last_error(), "strin");
}

static void test_regex_choice_tool(void)
{
    q3_grammar *G = compile(Q3_GRAMMAR_REGEX, "(\\+1 )?\\(?[0-9]{3}\\)?[ -]?[0-9]{3}-[0-9]{4}");
    if (G) {
        ACCEPT(G, "+1 (555) 123-4567");
        ACCEPT(G, "555 123-4567");
        REJECT(G, "555-12-4567");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_REGEX, "^[^\\s@]+@(?:[a-z]+\\.)+[a-z]{2,}$");
    if (G) {
        ACCEPT(G, "me@x.example.com");
        INCOMPLETE(G, "me@x");
        REJECT(G, "me@@x");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_CHOICE, "[\"positive\", \"negative\", \"neutral\"]");
    if (G) {
        ACCEPT(G, "negative");
        PREFIX(G, "neu");
        REJECT(G, "negatives");
        q3_grammar_free(G);
    }
    G = compile(Q3_GRAMMAR_TOOL_CALL,
                "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],"
                "\"additionalProperties\":false}}},{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}],"
                "\"name\":\"get_weather\"}");
    if (G) {
        int32_t *ids = NULL;
        size_t n = 0;
        const char *text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &ids, &n);
        q3_matcher *m;
        q3_matcher_new(G, 0, &m);
        int ok = n > 0;
        for (size_t i = 0; i < n && ok; i++) ok = q3_matcher_accept(m, ids[i]) == Q3_OK;
        CHECK(ok && q3_matcher_state(m) == Q3_MATCH_DONE, "the tool call's tokens are accepted to the end");
        q3_matcher_free(m);
        free(ids);
        q3_grammar_free(G);
    }
}

/* The first trie rank where masks a and b differ; -1 if none. */
static int32_t first_difference(const gvocab *v, const uint64_t *a, const uint64_t *b)
{
    for (int32_t r = 0; r < v->n_trie_ranks; r++)
        if ((a[r >> 6] ^ b[r >> 6]) >> (r & 63) & 1) return r;
    return -1;
}

/* Accepts a random token the mask allows (no end token; allowed: scratch of
 * n_ids). 1: none allowed; -1: the matcher refused it; 0: accepted. */
static int random_step(q3_matcher *m, const gvocab *v, const uint64_t *mask, int32_t *allowed, uint64_t *seed)
{
    int n = 0;
    for (int32_t id = 0; id < v->n_ids; id++)
        if (mask[v->rank_of[id] >> 6] >> (v->rank_of[id] & 63) & 1 && id != v->eot && id != v->eos) allowed[n++] = id;
    if (!n) return 1;
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    return q3_matcher_accept(m, allowed[(*seed >> 33) % (uint64_t)n]) ? -1 : 0;
}

/* The oracle on schema-made grammars. */
static int oracle_walk(q3_grammar *G, uint64_t seed, int steps)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return 1;
    const gvocab *v = G->v;
    uint64_t *brute = malloc(gvocab_mask_words(v) * 8);
    int32_t *allowed = malloc((size_t)v->n_ids * 4);
    int bad = 0;
    for (int s = 0; s < steps; s++) {
        const uint64_t *mask;
        if (matcher_rank_mask(m, &mask) || mask_brute(&m->r, v, m->state, brute)) {
            bad++;
            break;
        }
        bad += first_difference(v, mask, brute) >= 0;
        int st = random_step(m, v, mask, allowed, &seed);
        if (st) {
            bad += st < 0;
            break;
        }
    }
    free(brute);
    free(allowed);
    q3_matcher_free(m);
    return bad;
}

/* The mask after the bytes of prefix against the oracle: 0 when they agree,
 * 1 when not or when there is no mask (the first difference printed). With
 * keep, the matcher is handed back there (at the prefix's state, or NULL) for
 * the caller's own checks and its to free. */
static int oracle_at(q3_grammar *G, const char *prefix, q3_matcher **keep)
{
    q3_matcher *m;
    if (keep) *keep = NULL;
    if (q3_matcher_new(G, 0, &m)) return 1;
    const gvocab *v = G->v;
    uint64_t *brute = malloc(gvocab_mask_words(v) * 8);
    int bad = 0;
    const uint64_t *mask;
    size_t ok;
    if (!brute || q3_matcher_accept_bytes(m, prefix, strlen(prefix), &ok) || matcher_rank_mask(m, &mask) ||
        mask_brute(&m->r, v, m->state, brute))
        bad = 1;
    int32_t r = bad ? -1 : first_difference(v, mask, brute);
    if (r >= 0) {
        fprintf(stderr, "after '%s': token %d: mask %d, oracle %d\n", prefix, v->id_of_rank[r],
                (int)(mask[r >> 6] >> (r & 63) & 1), (int)(brute[r >> 6] >> (r & 63) & 1));
        bad = 1;
    }
    free(brute);
    if (keep) *keep = m;
    else q3_matcher_free(m);
    return bad;
}

/* Walks `steps` random allowed tokens; at each step the matcher's mask (often
 * remembered from an earlier visit of the state) must equal one computed
 * afresh, and every 16th step the oracle's. Returns the steps that differ. */
static int cache_walk(q3_grammar *G, uint64_t seed, int steps)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return 1;
    const gvocab *v = G->v;
    size_t words = gvocab_mask_words(v);
    uint64_t *fresh = malloc(words * 8), *brute = malloc(words * 8);
    int32_t *allowed = malloc((size_t)v->n_ids * 4);
    int bad = 0, hits = 0;
    for (int s = 0; s < steps; s++) {
        const uint64_t *mask;
        int before = m->mask_state;
        int cached = 0;
        for (int i = 0; i < MATCHER_CACHE; i++) cached |= m->cache[i].state == m->state;
        hits += cached && before != m->state;
        if (matcher_rank_mask(m, &mask) || mask_trie(&m->r, v, m->state, -1, fresh)) {
            bad++;
            break;
        }
        bad += first_difference(v, mask, fresh) >= 0;
        if (s % 16 == 15) {
            if (mask_brute(&m->r, v, m->state, brute)) bad++;
            bad += first_difference(v, mask, brute) >= 0;
        }
        int st = random_step(m, v, mask, allowed, &seed);
        if (st) {
            bad += st < 0;
            break;
        }
    }
    CHECK(hits > 0, "the long walk came back to no remembered state (%d steps)", steps);
    free(fresh);
    free(brute);
    free(allowed);
    q3_matcher_free(m);
    return bad;
}

/* Strings: tokens may end inside a UTF-8 character (byte-level BPE), which the
 * mask allows in whole subtrees where text may go on; within a maxLength the
 * character a token begins counts. */
static void test_oracle_strings(void)
{
    static const struct {
        const char *schema;
        const char *prefixes[8];
    } cases[] = {
        {"{\"type\":\"string\"}", {"\"", "\"\xe4", "\"\xe4\xb8", "\"ab\\", "\"ab\\u00", "\"\xf0\x9f", NULL}},
        {"{\"type\":\"string\",\"maxLength\":4}",
         {"\"", "\"ab", "\"abc", "\"abcd", "\"a\xe4", "\"abc\xe4\xb8", "\"\\n\\u00e9b", NULL}},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":5}", {"\"", "\"\xc3", "\"\xc3\xa9", "\"\xc3\xa9x\xe2\x82", NULL}},
        /* an unanchored pattern: no one state after a character, but a set that takes any text */
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", {"\"", "\"xx", "\"xxa", "\"xxa\xe4", "\"b\\", NULL}},
        {"{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"maxLength\":40}},\"required\":[\"k\"],"
         "\"additionalProperties\":false}",
         {"{\"k\": \"", "{\"k\": \"\xe6\x97\xa5\xe6", "{\"k\": \"0123456789012345678901234567890123456", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA, cases[i].schema);
        if (!G) continue;
        for (int k = 0; cases[i].prefixes[k]; k++)
            CHECK(oracle_at(G, cases[i].prefixes[k], NULL) == 0, "%s after '%s': mask differs from the oracle", cases[i].schema,
                  cases[i].prefixes[k]);
        q3_grammar_free(G);
    }
    /* a long walk through two free strings: more states than the matcher's
       cache holds come back (characters begun, escapes), each mask checked */
    q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA,
                            "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\","
                            "\"maxLength\":12}},\"required\":[\"a\",\"b\"],\"additionalProperties\":false}");
    if (G) {
        CHECK(cache_walk(G, 4242, 64) == 0, "long walk: a remembered mask differs from a fresh one or the oracle");
        q3_grammar_free(G);
    }
}

/* One directed state checked against the oracle: a fresh grammar (kind,
 * text) with its shared masks set aside (every mask computed here, none taken
 * from another matcher), a matcher moved past prefix, and its mask compared
 * with the brute force (oracle_at). 1 when they agree (c->m sits at the
 * state, for the caller's own checks), 0 when not (a check failed);
 * oracle_done frees it all either way. */
typedef struct oracle_case {
    q3_grammar *G;
    mask_share *share;
    q3_matcher *m;
} oracle_case;

static int oracle_case_at(oracle_case *c, q3_grammar_kind kind, const char *text, const char *prefix,
                          const char *what, size_t i)
{
    memset(c, 0, sizeof *c);
    if (!(c->G = compile(kind, text))) return 0;
    c->share = c->G->share;
    c->G->share = NULL;
    int bad = oracle_at(c->G, prefix, &c->m);
    CHECK(!bad, "%s %zu (%s after '%.40s'): no mask, or it differs from the oracle", what, i, text, prefix);
    return !bad;
}

static void oracle_done(oracle_case *c)
{
    q3_matcher_free(c->m);
    if (c->G) {
        c->G->share = c->share;
        q3_grammar_free(c->G);
    }
}

/* The masks of states inside a string built from the vocabulary's text tokens
 * and tails (mask.c's text_tails): where any character leads back to the
 * state, or to one that reads the same up to the longest token (a maxLength
 * far off, no minLength left), and where not (the counts near, a minLength
 * still owed, named keys beside free ones); each against the oracle, with
 * whether the path was taken. */
static void test_oracle_tails(void)
{
    char near[200] = "\"";
    memset(near + 1, 'a', 180); /* 120 characters left of 300: fewer than the longest token */
    static const char *gbnf = "root ::= \"\\\"\" [^\"]* \"\\\"\"\n";
    const struct {
        q3_grammar_kind kind;
        const char *text, *prefix;
        int tails;
    } cases[] = {
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\"}", "\"", 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\"}", "\"ab\xe4\xb8\xad", 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":300}", "\"", 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":300}", near, 0},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":3,\"maxLength\":300}", "\"", 0},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":3,\"maxLength\":300}", "\"abc", 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5}", "[\"x\", \"", 1},
        {Q3_GRAMMAR_JSON, "", "{\"", 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}}}", "{\"", 0},
        {Q3_GRAMMAR_GBNF, gbnf, "\"", 1}, /* control characters are text here: tails of newlines allowed */
        {Q3_GRAMMAR_GBNF, gbnf, "\"x\n", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        oracle_case c;
        if (oracle_case_at(&c, cases[i].kind, cases[i].text, cases[i].prefix, "case", i))
            CHECK(c.m->r.st_tails[c.m->state] == cases[i].tails, "case %zu: text and tails %s", i,
                  cases[i].tails ? "not taken" : "taken");
        oracle_done(&c);
    }
}

/* Counted runs (mask.c's run_from): inside an item{m,n} of one byte class
 * a subtree of that class no deeper than the counts left is allowed whole.
 * Each mask against the oracle, and the run must have been found. */
static void test_oracle_runs(void)
{
    const struct {
        q3_grammar_kind kind;
        const char *text, *prefix;
    } cases[] = {
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"ada@exam"},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"ada@example.o"},
        {Q3_GRAMMAR_REGEX, "[a-z]{0,40}-[0-9]{3}", "abc"},
        {Q3_GRAMMAR_REGEX, "[a-z]{0,40}-[0-9]{3}", "abcdefghijklmnopqrstuvwxyz"}, /* 14 left */
        {Q3_GRAMMAR_GBNF, "root ::= [a-z]{2,60} \"!\"\n", "ab"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        oracle_case c;
        if (oracle_case_at(&c, cases[i].kind, cases[i].text, cases[i].prefix, "run case", i)) {
            int runs = 0;
            for (int k = 0; k < c.m->r.n_runs; k++) runs += c.m->r.runs[k].reach > 0;
            CHECK(runs > 0, "run case %zu: no counted run found", i);
        }
        oracle_done(&c);
    }
}

/* Byte class tables (class_table.h): a state that loops on a class of its
 * own, or starts a counted run of one that reaches past the longest token
 * starting in it, takes its mask from the class's tokens and exits. Each mask
 * against the oracle, and whether the table was taken. */
static void test_oracle_classes(void)
{
    static const char *words = "root ::= \"hello\" ( \" \" [a-z]+ ){1,3} \"!\"\n";
    static const char *fields = "root ::= [^,]* \",\" [0-9]+\n";
    static const char *names = "root ::= [a-zA-Z_]+ \"=\" [0-9]+\n";
    const struct {
        q3_grammar_kind kind;
        const char *text, *prefix;
        int table;
    } cases[] = {
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"ada", 1},  /* local part: a loop */
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"", 0},     /* its first character */
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"a.b", 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"ada@exam", 1}, /* a label: a run */
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", "\"ada@example.o", 1},
        {Q3_GRAMMAR_REGEX, "[a-z]{0,40}-[0-9]{3}", "abc", 1},
        {Q3_GRAMMAR_REGEX, "[a-z]{0,40}-[0-9]{3}", "abcdefghijklmnopqrstuvwxyz", 0}, /* 14 left: short of the longest */
        {Q3_GRAMMAR_GBNF, words, "hello ab", 1},
        {Q3_GRAMMAR_GBNF, words, "hello ab cd ef", 1}, /* the last word: no space after it */
        {Q3_GRAMMAR_GBNF, fields, "x", 0},              /* every byte but a comma: too many nodes for a table */
        {Q3_GRAMMAR_GBNF, names, "x", 1},               /* letters and underscores */
        {Q3_GRAMMAR_GBNF, names, "ab_c=4", 0},          /* digits: ten, too few for a table */
        /* keys beside named ones: a character past ASCII is one shared rule for every prefix */
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"ab\":{},\"ac\":{\"type\":\"integer\"}}}", "{\"a", 0},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"ab\":{},\"ac\":{\"type\":\"integer\"}}}", "{\"a\xc3", 0},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"ab\":{},\"ac\":{\"type\":\"integer\"}}}", "{\"a\xe4\xb8", 0},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"properties\":{\"\xc3\xa9t\xc3\xa9\":{}}}", "{\"\xc3", 0}, /* a name past ASCII */
        {Q3_GRAMMAR_GBNF, fields, "x,1", 0},            /* digits: ten, too few for a table */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        oracle_case c;
        if (oracle_case_at(&c, cases[i].kind, cases[i].text, cases[i].prefix, "class case", i)) {
            const gclass_table *ct = NULL;
            CHECK(mask_class_table(&c.m->r, c.G->v, c.m->state, &ct) == Q3_OK, "class case %zu: %s", i,
                  q3_last_error());
            CHECK((ct != NULL) == cases[i].table, "class case %zu (after '%s'): the class table %s", i,
                  cases[i].prefix, ct ? "was taken" : "was not taken");
        }
        oracle_done(&c);
    }
}

static void test_oracle(void)
{
    const char *schemas[] = {
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":3}},\"required\":[\"id\"]}},"
        "\"$ref\":\"#/$defs/n\"}",
        "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
        "\"mood\":{\"enum\":[\"happy\",\"sad\",3.5]},\"note\":{\"type\":\"string\",\"maxLength\":4}},"
        "\"required\":[\"when\",\"mood\",\"note\"],\"additionalProperties\":false}",
        /* bounded string text: mask.c allows a subtree whole only within the characters left */
        "{\"type\":\"string\",\"maxLength\":9}",
        "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":30}},"
        "\"required\":[\"k\"],\"additionalProperties\":false}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof schemas[0]; i++) {
        q3_grammar *G = compile(Q3_GRAMMAR_JSON_SCHEMA, schemas[i]);
        if (!G) continue;
        for (int seed = 1; seed <= 2; seed++)
            CHECK(oracle_walk(G, (uint64_t)seed * 7919 + i, 10) == 0, "schema %zu seed %d: mask differs from the oracle", i, seed);
        q3_grammar_free(G);
    }
    q3_grammar *G = compile(Q3_GRAMMAR_REGEX, "[A-Z][a-z]{2,8}( [A-Z][a-z]+)*, [0-9]{5}");
    if (G) {
        CHECK(oracle_walk(G, 99, 10) == 0, "regex: mask differs from the oracle");
        q3_grammar_free(G);
    }
}

/* Feeds text in chunks of 1 to 9 bytes (characters split too); before each
 * chunk the matcher's mask must equal one computed afresh, and every 8th the
 * oracle's. *same, *derived: the matcher's masks taken whole from a state
 * whose counts differ only past the longest token, and derived from the last
 * mask (matcher.c). Returns the chunks whose masks differ. */
static int counted_walk(q3_grammar *G, const char *text, unsigned *same, unsigned *derived)
{
    q3_matcher *m;
    if (q3_matcher_new(G, 0, &m)) return 1;
    const gvocab *v = G->v;
    size_t words = gvocab_mask_words(v), len = strlen(text);
    uint64_t *fresh = malloc(words * 8), *brute = malloc(words * 8);
    int bad = 0, k = 0;
    for (size_t at = 0; at < len; k++) {
        const uint64_t *mask;
        if (matcher_rank_mask(m, &mask) || mask_trie(&m->r, v, m->state, -1, fresh)) {
            bad++;
            break;
        }
        int32_t r = first_difference(v, mask, fresh);
        if (r < 0 && k % 8 == 0) {
            if (mask_brute(&m->r, v, m->state, brute)) bad++;
            r = first_difference(v, mask, brute);
        }
        if (r >= 0) {
            fprintf(stderr, "after %zu bytes of '%.40s...': token %d differs\n", at, text, v->id_of_rank[r]);
            bad++;
        }
        size_t n = (size_t)(1 + (k * 5 + 2) % 9);
        if (n > len - at) n = len - at;
        if (q3_matcher_accept_bytes(m, text + at, n, NULL)) {
            fprintf(stderr, "after %zu bytes of '%.40s...': %s\n", at, text, q3_last_error());
            bad++;
            break;
        }
        at += n;
    }
    *same = m->n_same;
    *derived = m->n_derived;
    free(fresh);
    free(brute);
    q3_matcher_free(m);
    return bad;
}

/* Counted repetitions (maxLength, minLength, {m,n}, maxItems): a state is
 * another count of the same positions at every character, and the matcher
 * takes or derives most of their masks from states met before; each must be
 * exact. */
static void test_oracle_counts(void)
{
    static const struct {
        int kind;
        const char *grammar, *text;
        int want_same, want_derived;
    } cases[] = {
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":200}",
         "\"Great battery, but the screen is hard to read in direct sunlight \\n and the case feels cheap: "
         "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \\u00e9\\\" then more words until the end of the budget is near, "
         "to the end.\"",
         1, 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":140,\"maxLength\":160}",
         "\"0123456789abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 the quick brown fox "
         "jumps over the lazy dog, again and again and again!!!!\"",
         1, 1},
        {Q3_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"format\":\"email\"}},\"required\":[\"e\"],"
         "\"additionalProperties\":false}",
         "{\"e\": \"ada.lovelace@analytical-engine-department-of-mathematics.example.org\"}", 0, 1},
        {Q3_GRAMMAR_REGEX, "[a-z ]{0,150}-[0-9]{3}",
         "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
         "dolore magna aliqua-123",
         0, 1},
        {Q3_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":150}",
         "[1, 2, 3, 40, 500, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]", 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q3_grammar *G = compile(cases[i].kind, cases[i].grammar);
        if (!G) continue;
        unsigned same = 0, derived = 0;
        CHECK(counted_walk(G, cases[i].text, &same, &derived) == 0, "%s: a mask differs", cases[i].grammar);
        CHECK(same >= (unsigned)cases[i].want_same && derived >= (unsigned)cases[i].want_derived,
              "%s: %u masks taken from a state with more counts, %u derived (expected some)", cases[i].grammar, same,
              derived);
        q3_grammar_free(G);
    }
}

int main(void)
{
    if (q3_tokenizer_load(TOKENIZER_JSON, &tok)) {
        CHECK(0, "tokenizer: %s", q3_last_error());
        TEST_DONE();
    }
    test_objects();
    test_numbers();
    test_strings_and_formats();
    test_combinators();
    test_refusals();
    test_regex_choice_tool();
    test_oracle();
    test_oracle_strings();
    test_oracle_tails();
    test_oracle_runs();
    test_oracle_classes();
    test_oracle_counts();
    q3_tokenizer_free(tok);
    TEST_DONE();
}
