/* Completeness against the official JSON Schema Test Suite (draft 4 files,
 * copied into tests/data/json-schema-test-suite): every schema either compiles
 * or is refused naming a keyword; for each compiled one, every valid instance,
 * written compactly and written with whitespace (cJSON's indented form), split
 * into tokens canonically and at random boundaries, is accepted token by token
 * to the end; every invalid instance is rejected somewhere (or left
 * incomplete), except where a documented approximation allows it (oneOf is
 * read as anyOf). Objects are written in the schema's property order (the
 * order q3 generates). Prints the coverage. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q3.h"
#include "test.h"

#define TOKENIZER_JSON TEST_DATA "/golden/e2e/tokenizer.json"
#define SUITE TEST_DATA "/json-schema-test-suite/draft4"

static q3_tokenizer *tok;
static uint64_t rng = 0x243F6A8885A308D3ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* The property schemas of schema in the order q3 merges them: its own
 * "properties", then those of its allOf parts (first occurrence wins). */
static int gather(const cJSON *schema, const cJSON **out, int n, int cap)
{
    if (!cJSON_IsObject(schema)) return n;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(schema, "properties")) {
        int seen = 0;
        for (int i = 0; i < n; i++) seen |= !strcmp(out[i]->string, p->string);
        if (!seen && n < cap) out[n++] = p;
    }
    const cJSON *part;
    cJSON_ArrayForEach(part, cJSON_GetObjectItemCaseSensitive(schema, "allOf")) n = gather(part, out, n, cap);
    return n;
}

/* Reorders inst's members (in place) to the order q3 writes them. */
static void reorder(cJSON *inst, const cJSON *schema)
{
    if (!cJSON_IsObject(schema)) return;
    if (cJSON_IsObject(inst)) {
        const cJSON *props[256];
        int np = gather(schema, props, 0, 256);
        cJSON *sorted = cJSON_CreateObject();
        for (int i = 0; i < np; i++) {
            cJSON *m = cJSON_DetachItemFromObjectCaseSensitive(inst, props[i]->string);
            if (m) {
                reorder(m, props[i]);
                cJSON_AddItemToObject(sorted, props[i]->string, m);
            }
        }
        while (inst->child) { /* the others keep their order, after */
            cJSON *m = cJSON_DetachItemViaPointer(inst, inst->child);
            cJSON_AddItemToObject(sorted, m->string, m);
        }
        while (sorted->child) {
            cJSON *m = cJSON_DetachItemViaPointer(sorted, sorted->child);
            cJSON_AddItemToObject(inst, m->string, m);
        }
        cJSON_Delete(sorted);
    } else if (cJSON_IsArray(inst)) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(schema, "items");
        int i = 0;
        for (cJSON *c = inst->child; c; c = c->next, i++)
            reorder(c, cJSON_IsArray(items) ? cJSON_GetArrayItem(items, i) : items);
    }
}

/* 1: accepted to the end and complete; 0: not. random: split at random byte boundaries first. */
static int accepted(q3_grammar *G, const char *text, int random)
{
    size_t len = strlen(text);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!random) {
        if (q3_tokenizer_encode(tok, text, len, Q3_ENCODE_SPECIAL_AS_TEXT, &ids, &n)) return 0;
    } else { /* pieces of 1..8 bytes, each tokenized alone: a token split the tokenizer would not make */
        size_t cap = len + 8;
        ids = malloc(cap * sizeof *ids);
        for (size_t at = 0; at < len;) {
            size_t k = 1 + rnd() % 8;
            if (k > len - at) k = len - at;
            /* keep UTF-8 characters whole within a piece (the tokenizer takes valid UTF-8) */
            while (at + k < len && ((unsigned char)text[at + k] & 0xC0) == 0x80) k++;
            int32_t *p = NULL;
            size_t pn = 0;
            if (q3_tokenizer_encode(tok, text + at, k, Q3_ENCODE_SPECIAL_AS_TEXT, &p, &pn)) {
                free(ids);
                return 0;
            }
            if (n + pn > cap) ids = realloc(ids, (cap = 2 * (n + pn)) * sizeof *ids);
            memcpy(ids + n, p, pn * sizeof *p);
            n += pn;
            free(p);
            at += k;
        }
    }
    q3_matcher *m;
    int ok = !q3_matcher_new(G, 0, &m);
    for (size_t i = 0; ok && i < n; i++) ok = q3_matcher_accept(m, ids[i]) == Q3_OK;
    ok = ok && q3_matcher_state(m) != Q3_MATCH_OPEN;
    if (ok) ok = q3_matcher_accept(m, q3_tokenizer_end_of_turn(tok)) == Q3_OK;
    q3_matcher_free(m);
    free(ids);
    return ok;
}

static int uses(const cJSON *s, const char *kw)
{
    if (!s) return 0;
    if (s->string && !strcmp(s->string, kw)) return 1;
    for (const cJSON *c = s->child; c; c = c->next)
        if (uses(c, kw)) return 1;
    return 0;
}

int main(void)
{
    if (q3_tokenizer_load(TOKENIZER_JSON, &tok)) {
        CHECK(0, "tokenizer: %s", q3_last_error());
        TEST_DONE();
    }
    DIR *d = opendir(SUITE);
    CHECK(d != NULL, "%s missing", SUITE);
    if (!d) TEST_DONE();
    char *names[64];
    int nf = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nf < 64) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) names[nf++] = strdup(e->d_name);
    }
    closedir(d);
    int schemas = 0, compiled = 0, refused = 0, valid_n = 0, valid_ok = 0, invalid_n = 0, invalid_rejected = 0,
        invalid_oneof = 0;
    char refused_kw[4096] = "";
    for (int f = 0; f < nf; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", SUITE, names[f]);
        FILE *fp = fopen(path, "rb");
        fseek(fp, 0, SEEK_END);
        long sz = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        char *buf = malloc((size_t)sz + 1);
        buf[fread(buf, 1, (size_t)sz, fp)] = 0;
        fclose(fp);
        cJSON *groups = cJSON_Parse(buf);
        free(buf);
        const cJSON *g;
        cJSON_ArrayForEach(g, groups) {
            schemas++;
            const cJSON *schema = cJSON_GetObjectItemCaseSensitive(g, "schema");
            const char *desc = cJSON_GetObjectItemCaseSensitive(g, "description")->valuestring;
            char *s = cJSON_PrintUnformatted(schema);
            q3_grammar *G = NULL;
            q3_status st = q3_grammar_compile(tok, Q3_GRAMMAR_JSON_SCHEMA, s, strlen(s), &G);
            free(s);
            if (st) {
                refused++;
                const char *msg = q3_last_error(), *q = strstr(msg, "keyword '");
                if (getenv("Q3_SUITE_VERBOSE")) printf("refused: %s / %s: %s\n", names[f], desc, msg);
                if (q) q += 8;
                else q = strstr(msg, "$ref") ? "'$ref'" : NULL;
                CHECK(st == Q3_ERR_UNSUPPORTED || st == Q3_ERR_INVALID, "%s / %s: status %d", names[f], desc, st);
                CHECK(q != NULL || strstr(msg, "$ref"), "%s / %s: the refusal names no keyword: %s", names[f], desc, msg);
                char kw[64] = "?";
                if (q) sscanf(q + 1, "%63[^']", kw);
                if (!strstr(refused_kw, kw) && strlen(refused_kw) + strlen(kw) + 3 < sizeof refused_kw)
                    snprintf(refused_kw + strlen(refused_kw), sizeof refused_kw - strlen(refused_kw), "%s%s",
                             refused_kw[0] ? ", " : "", kw);
                continue;
            }
            compiled++;
            int oneof = uses(schema, "oneOf");
            const cJSON *t;
            cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(g, "tests")) {
                cJSON *inst = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(t, "data"), 1);
                reorder(inst, schema);
                char *compact = cJSON_PrintUnformatted(inst), *spaced = cJSON_Print(inst);
                const char *tdesc = cJSON_GetObjectItemCaseSensitive(t, "description")->valuestring;
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(t, "valid"))) {
                    valid_n++;
                    int ok = accepted(G, compact, 0) && accepted(G, compact, 1) && accepted(G, spaced, 0) &&
                             accepted(G, spaced, 1);
                    valid_ok += ok;
                    CHECK(ok, "%s / %s / %s: valid instance %s not accepted", names[f], desc, tdesc, compact);
                } else {
                    invalid_n++;
                    int acc = accepted(G, compact, 0);
                    if (!acc) invalid_rejected++;
                    else if (oneof) invalid_oneof++;
                    else CHECK(0, "%s / %s / %s: invalid instance %s accepted", names[f], desc, tdesc, compact);
                }
                free(compact);
                free(spaced);
                cJSON_Delete(inst);
            }
            q3_grammar_free(G);
        }
        cJSON_Delete(groups);
        free(names[f]);
    }
    printf("JSON Schema Test Suite, draft 4: %d schemas: %d compiled, %d refused naming a keyword (%s)\n", schemas,
           compiled, refused, refused_kw);
    printf("valid instances accepted: %d of %d (each compact and indented, tokenized canonically and at random)\n",
           valid_ok, valid_n);
    printf("invalid instances rejected: %d of %d (%d accepted by oneOf read as anyOf, documented)\n", invalid_rejected,
           invalid_n, invalid_oneof);
    q3_tokenizer_free(tok);
    TEST_DONE();
}
