/* The Qwen3 tokenizer against the reference (HF tokenizers) golden ids, plus its
 * internals checked against each other: the hand-written Qwen2 splitter against
 * PCRE2, the heap BPE against the scan BPE, the NFC fast path against utf8proc_NFC,
 * from_parts against load. Run from the repository root. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

#include "temps.h"
#include "test.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"
#include "util/file.h"

#define TOKENIZER_JSON TEST_DATA "/golden/e2e/tokenizer.json"
#define TOK_DATA TEST_DATA "/tokenizer"

/* ==== helpers ================================================================== */

/* A deterministic xorshift generator for the randomised checks. */
static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}

typedef struct jsonl {
    cJSON **rows;
    char **lines;
    size_t n;
} jsonl;

static jsonl read_jsonl(const char *path)
{
    jsonl out = {0};
    char *buf;
    size_t len;
    if (q3_read_file(path, 1 << 26, &buf, &len) != Q3_OK) {
        CHECK(0, "cannot read %s: %s", path, q3_last_error());
        return out;
    }
    for (char *line = buf; *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line) {
            cJSON *row = cJSON_Parse(line);
            CHECK(row != NULL, "%s: line %zu does not parse", path, out.n + 1);
            if (row) {
                out.rows = realloc(out.rows, (out.n + 1) * sizeof *out.rows);
                out.lines = realloc(out.lines, (out.n + 1) * sizeof *out.lines);
                out.lines[out.n] = strdup(line);
                out.rows[out.n++] = row;
            }
        }
        if (!nl) break;
        line = nl + 1;
    }
    free(buf);
    return out;
}

static void free_jsonl(jsonl *j)
{
    for (size_t i = 0; i < j->n; i++) cJSON_Delete(j->rows[i]), free(j->lines[i]);
    free(j->rows);
    free(j->lines);
}

/* The ids array of a row as int32s (caller frees). */
static int32_t *ids_of(const cJSON *row, const char *key, size_t *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(row, key);
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) ids[i++] = (int32_t)x->valuedouble;
    return ids;
}

/* The string field `key` of row i, decoded from the raw line: unlike cJSON's, it may
 * hold NUL bytes (the corpus has "nul\u0000byte"). Returns a buffer of static storage. */
static const char *text_of(const jsonl *j, size_t i, const char *key, size_t *len)
{
    static char out[1 << 16];
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(j->lines[i], pat);
    size_t w = 0;
    *len = 0;
    if (!p) return "";
    for (p += strlen(pat); *p && *p != '"' && w + 4 < sizeof out; p++) {
        if (*p != '\\') { out[w++] = *p; continue; }
        char e = *++p;
        const char *map = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", e);
        if (e != 'u' && map) { out[w++] = map[1]; continue; }
        uint32_t cp = (uint32_t)strtoul((char[5]){p[1], p[2], p[3], p[4], 0}, NULL, 16);
        p += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
            uint32_t lo = (uint32_t)strtoul((char[5]){p[3], p[4], p[5], p[6], 0}, NULL, 16);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        }
        w += (size_t)q3_utf8_encode(cp, out + w);
    }
    out[w] = 0;
    *len = w;
    return out;
}

static const char *str_of(const cJSON *row, const char *key)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(row, key);
    return cJSON_IsString(s) ? s->valuestring : "";
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s [", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? "," : "", ids[i]);
    fprintf(stderr, "]\n");
}

/* Encodes text and compares with want; prints both on a mismatch. Returns 1 if equal. */
static int encodes_to_n(const q3_tokenizer *tok, const char *text, size_t len, const int32_t *want, size_t n_want)
{
    int32_t *ids;
    size_t n;
    q3_status st = q3_tokenizer_encode(tok, text, len, Q3_ENCODE_DEFAULT, &ids, &n);
    if (st != Q3_OK) {
        fprintf(stderr, "  encode failed: %s\n", q3_last_error());
        return 0;
    }
    int ok = same_ids(ids, n, want, n_want);
    if (!ok) {
        print_ids("got ", ids, n);
        print_ids("want", want, n_want);
    }
    free(ids);
    return ok;
}

static int encodes_to(const q3_tokenizer *tok, const char *text, const int32_t *want, size_t n_want)
{
    return encodes_to_n(tok, text, strlen(text), want, n_want);
}

/* ==== golden ids ================================================================== */

static void test_golden(const q3_tokenizer *tok)
{
    jsonl g = read_jsonl(TOK_DATA "/golden_public.jsonl");
    CHECK(g.n == 298, "golden_public.jsonl has %zu lines", g.n);
    size_t ok = 0;
    for (size_t i = 0; i < g.n; i++) {
        size_t n;
        int32_t *want = ids_of(g.rows[i], "ids", &n);
        size_t len;
        const char *text = text_of(&g, i, "text", &len);
        int good = encodes_to_n(tok, text, len, want, n);
        CHECK(good, "golden line %zu: %.80s", i + 1, text);
        ok += good;
        free(want);
    }
    printf("golden_public: %zu/%zu exact\n", ok, g.n);
    free_jsonl(&g);

    jsonl c = read_jsonl(TOK_DATA "/chat_public.jsonl");
    CHECK(c.n == 12, "chat_public.jsonl has %zu lines", c.n);
    ok = 0;
    for (size_t i = 0; i < c.n; i++) {
        size_t n;
        int32_t *want = ids_of(c.rows[i], "ids", &n);
        size_t len;
        const char *text = text_of(&c, i, "rendered", &len);
        int good = encodes_to_n(tok, text, len, want, n);
        CHECK(good, "chat line %zu", i + 1);
        ok += good;
        free(want);
    }
    printf("chat_public: %zu/%zu exact\n", ok, c.n);
    free_jsonl(&c);

    /* Bonus: cases that depend on the reference's Unicode tables. */
    jsonl e = read_jsonl(TOK_DATA "/golden_unicode_version_edge.jsonl");
    ok = 0;
    for (size_t i = 0; i < e.n; i++) {
        size_t n, n_got;
        int32_t *want = ids_of(e.rows[i], "ids", &n), *got;
        const char *text = str_of(e.rows[i], "text");
        if (q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &got, &n_got) == Q3_OK) {
            int good = same_ids(got, n_got, want, n);
            ok += good;
            if (!good) printf("  unicode edge %zu differs: %s\n", i + 1, str_of(e.rows[i], "note"));
            free(got);
        }
        free(want);
    }
    printf("golden_unicode_version_edge (bonus): %zu/%zu exact\n", ok, e.n);
    /* All of them match (NFC follows the reference's Unicode 9.0 tables), so hold on to it. */
    CHECK(ok == e.n && e.n == 12, "unicode edge cases: %zu/%zu", ok, e.n);
    free_jsonl(&e);
}

/* decode(encode(x)) == NFC(x) over the corpus. */
static void test_roundtrip(const q3_tokenizer *tok)
{
    jsonl g = read_jsonl(TOK_DATA "/golden_public.jsonl");
    size_t changed = 0;
    for (size_t i = 0; i < g.n; i++) {
        const char *text = str_of(g.rows[i], "text");
        int32_t *ids;
        size_t n, len;
        char *back;
        CHECK(q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &ids, &n) == Q3_OK, "encode");
        CHECK(q3_tokenizer_decode(tok, ids, n, &back, &len) == Q3_OK, "decode");
        char *nfc = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text);
        CHECK(len == strlen(nfc) && memcmp(back, nfc, len) == 0, "round trip of line %zu: %.60s", i + 1, text);
        changed += strcmp(nfc, text) != 0;
        free(nfc);
        free(back);
        free(ids);
    }
    printf("round trip: %zu lines, %zu of them changed by NFC\n", g.n, changed);
    free_jsonl(&g);
}

static void test_spot_checks(const q3_tokenizer *tok)
{
    CHECK(encodes_to(tok, "<think>\n\n</think>", (int32_t[]){151667, 271, 151668}, 3), "think block");
    CHECK(encodes_to(tok, "<|im_start", (int32_t[]){27, 91, 318, 4906}, 4), "not an added token");
    CHECK(encodes_to(tok, "12345", (int32_t[]){16, 17, 18, 19, 20}, 5), "digits one by one");
    CHECK(encodes_to(tok, "", NULL, 0), "empty");
    CHECK(encodes_to(tok, "<|im_end|><|im_end|>", (int32_t[]){151645, 151645}, 2), "adjacent added");

    int32_t *ids;
    size_t n;
    CHECK(q3_tokenizer_encode(tok, "", 0, Q3_ENCODE_DEFAULT, &ids, &n) == Q3_OK && n == 0 && ids == NULL, "empty gives NULL");
    /* Text containing NUL bytes is text like any other. */
    CHECK(q3_tokenizer_encode(tok, "a\0b", 3, Q3_ENCODE_DEFAULT, &ids, &n) == Q3_OK && n == 3, "NUL inside: %zu ids", n);
    free(ids);

    /* Special tokens as plain text when asked. */
    q3_tokens t = {0};
    CHECK(q3_tokenizer_encode_append(tok, "<|im_end|>", 10, Q3_ENCODE_SPECIAL_AS_TEXT, &t) == Q3_OK, "as text");
    CHECK(t.n > 1 && t.ids[0] != 151645, "<|im_end|> as text: %zu ids", t.n);
    size_t before = t.n;
    CHECK(q3_tokenizer_encode_append(tok, "<think>", 7, Q3_ENCODE_SPECIAL_AS_TEXT, &t) == Q3_OK, "append");
    CHECK(t.n == before + 1 && t.ids[before] == 151667, "<think> is added but not special");
    q3_tokens_free(&t);

    /* Lookups. */
    CHECK(q3_tokenizer_vocab_size(tok) == 151669, "vocab size %d", q3_tokenizer_vocab_size(tok));
    CHECK(q3_tokenizer_token_id(tok, "<|im_end|>", 10) == 151645, "im_end id");
    CHECK(q3_tokenizer_token_id(tok, "<|endoftext|>", 13) == 151643, "endoftext id");
    CHECK(q3_tokenizer_token_id(tok, " the", 4) == 279, "' the' id %d", q3_tokenizer_token_id(tok, " the", 4));
    CHECK(q3_tokenizer_token_id(tok, "no such token at all", 20) == -1, "missing");
    size_t len;
    const char *b = q3_tokenizer_token_bytes(tok, 151645, &len);
    CHECK(b && len == 10 && !memcmp(b, "<|im_end|>", 10), "im_end bytes");
    b = q3_tokenizer_token_bytes(tok, 198, &len);
    CHECK(b && len == 1 && b[0] == '\n', "198 is a newline");
    CHECK(q3_tokenizer_token_bytes(tok, 151669, &len) == NULL && len == 0, "out of range");
    CHECK(q3_tokenizer_token_bytes(tok, -1, &len) == NULL, "negative");
    CHECK(q3_tokenizer_is_special(tok, 151645) && !q3_tokenizer_is_special(tok, 151667), "special flags");
    CHECK(q3_tokenizer_is_added(tok, 151667) && !q3_tokenizer_is_added(tok, 279), "added flags");

    char *text;
    CHECK(q3_tokenizer_decode(tok, (int32_t[]){9707, 151645}, 2, &text, &len) == Q3_OK &&
              !strcmp(text, "Hello<|im_end|>"), "decode with an added token");
    free(text);
    CHECK(q3_tokenizer_decode(tok, (int32_t[]){9707, 999999}, 2, &text, &len) == Q3_ERR_INVALID, "bad id");
    CHECK_CONTAINS(q3_last_error(), "999999");
}

/* ==== invalid input ============================================================ */

static void test_invalid_utf8(const q3_tokenizer *tok)
{
    struct { const char *s; size_t len, at; } cases[] = {
        {"abc\xC3(", 5, 3},         /* a lead byte without its continuation */
        {"\x80xyz", 4, 0},          /* a stray continuation byte */
        {"ok \xC0\xAF", 5, 3},      /* overlong '/' */
        {"ab\xED\xA0\x80", 5, 2},   /* a surrogate */
        {"tail \xE2\x82", 7, 5},    /* truncated at the end */
        {"\xF4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"x\xFF", 2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        q3_tokens t = {0};
        q3_status st = q3_tokenizer_encode_append(tok, cases[i].s, cases[i].len, 0, &t);
        CHECK(st == Q3_ERR_INVALID && t.n == 0, "invalid UTF-8 case %zu: status %d", i, st);
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", cases[i].at);
        CHECK_CONTAINS(q3_last_error(), want);
        q3_tokens_free(&t);
    }
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

/* Each broken file must fail with a message naming the file, never crash. */
static void expect_load_fails(const char *path, const void *data, size_t n, const char *needle)
{
    write_file(path, data, n);
    q3_tokenizer *tok = (q3_tokenizer *)1;
    q3_status st = q3_tokenizer_load(path, &tok);
    CHECK(st != Q3_OK && tok == NULL, "loading a broken file (%s) succeeded", needle);
    CHECK_CONTAINS(q3_last_error(), path);
    if (needle) CHECK_CONTAINS(q3_last_error(), needle);
    q3_tokenizer_free(tok == (q3_tokenizer *)1 ? NULL : tok);
}

#define LOAD_FAILS(json, needle) expect_load_fails(path, json, sizeof(json) - 1, needle)

static void test_broken_files(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_XXXXXX", test_tmpdir());
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);

    q3_tokenizer *tok;
    CHECK(q3_tokenizer_load("/nonexistent/tokenizer.json", &tok) == Q3_ERR_IO, "missing file");
    CHECK_CONTAINS(q3_last_error(), "/nonexistent/tokenizer.json");

    LOAD_FAILS("", "empty");
    LOAD_FAILS("[1,2]", "not an object");
    LOAD_FAILS("{\"version\": \"1.0\"}", "no \"model\"");
    LOAD_FAILS("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", "no \"vocab\"");
    LOAD_FAILS("{\"model\": {\"vocab\": [], \"merges\": []}}", "vocab is not an object");
    LOAD_FAILS("{\"model\": {\"vocab\": {}}}", "no \"merges\"");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": \"0\"}, \"merges\": []}}", "not a non-negative integer");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": {}}}", "merges is not an array");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", "not in the vocabulary");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}", "no token for the byte");
    LOAD_FAILS("{\"model\": {\"type\": \"Unigram\", \"vocab\": {}, \"merges\": []}}", "only \"BPE\"");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\\q\": 0}, \"merges\": []}}", "bad escape");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0,}, \"merges\": []}}", "malformed JSON");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []} \"x\"}", "malformed JSON");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}} junk", "after the end");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 12345678901}, \"merges\": []}}",
               "the id of \"a\" is not a non-negative integer below 1048575");
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 2000000}, \"merges\": []}}", "has id 2000000, outside 0..1048574");
    /* a skipped string ending in a lone backslash at the end of the file */
    LOAD_FAILS("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [], \"x\": \"\\", "unterminated string");
    LOAD_FAILS("{\"x\": \"ab\\", "unterminated string");
    LOAD_FAILS("{\"ab\\", "unterminated string"); /* a key read (unescaped), not skipped */

    /* The real file, cut short at many places. */
    char *buf;
    size_t len;
    if (q3_read_file(TOKENIZER_JSON, 1 << 26, &buf, &len) == Q3_OK) {
        size_t cuts[] = {1, 100, 5000, 200000, len / 3, len / 2, len - 1000, len - 3, len - 1};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
            expect_load_fails(path, buf, cuts[i], "truncated");
        /* The real file with the merges' type broken. */
        char *m = strstr(buf, "\"merges\": [");
        if (!m) m = strstr(buf, "\"merges\":[");
        CHECK(m != NULL, "the file has merges");
        if (m) {
            char *br = strchr(m, '[');
            *br = '{';
            expect_load_fails(path, buf, len, "merges is not an array");
            *br = '[';
        }
        /* A vocabulary id that is not an integer: "!": 0 -> "!": 0.5 */
        char *v = strstr(buf, "\"!\": 0");
        CHECK(v != NULL, "the file has \"!\": 0");
        if (v) {
            size_t at = (size_t)(v - buf) + 6;
            char *edited = malloc(len + 2);
            memcpy(edited, buf, at);
            memcpy(edited + at, ".5", 2);
            memcpy(edited + at + 2, buf + at, len - at);
            expect_load_fails(path, edited, len + 2, "the id of \"!\"");
            free(edited);
        }
        free(buf);
    }
    /* A small valid file, then thousands of random corruptions of it: each must load
     * or fail cleanly (run under SAN=1 to catch memory errors). */
    static const char small[] =
        "{\"added_tokens\": [{\"id\": 5, \"content\": \"<e>\", \"special\": true}],"
        " \"normalizer\": {\"type\": \"NFC\"},"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\","
        " \"pattern\": {\"Regex\": \"\\\\s+|\\\\S+\"}, \"behavior\": \"Isolated\", \"invert\": false},"
        " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120\": 3, \"\\u0120ab\": 4},"
        " \"merges\": [\"a b\", [\"\\u0120\", \"ab\"]]}}";
    /* This vocabulary lacks most bytes: load fails in tk_finish, after everything else ran. */
    q3_tokenizer *t2;
    write_file(path, small, sizeof small - 1);
    CHECK(q3_tokenizer_load(path, &t2) == Q3_ERR_FORMAT, "small: %s", q3_last_error());
    CHECK_CONTAINS(q3_last_error(), "no token for the byte 0x00");
    char mutated[sizeof small + 8];
    size_t loaded = 0;
    for (int k = 0; k < 3000; k++) {
        size_t n = sizeof small - 1;
        memcpy(mutated, small, n);
        int edits = 1 + (int)(rng_next() % 3);
        for (int e = 0; e < edits && n > 1; e++) {
            size_t at = rng_next() % n;
            switch (rng_next() % 4) {
            case 0: mutated[at] = (char)(rng_next() & 0xFF); break;             /* any byte */
            case 1: mutated[at] = "{}[]\",:\\ 0u"[rng_next() % 12]; break;     /* JSON syntax */
            case 2: n = at; break;                                             /* truncate */
            case 3: memmove(mutated + at, mutated + at + 1, n - at - 1); n--; break; /* delete */
            }
        }
        write_file(path, mutated, n);
        q3_tokenizer *t3 = NULL;
        if (q3_tokenizer_load(path, &t3) == Q3_OK) loaded++;
        else CHECK(t3 == NULL && strstr(q3_last_error(), path), "corrupt file %d: \"%s\"", k, q3_last_error());
        q3_tokenizer_free(t3);
    }
    CHECK(loaded == 0, "%zu corrupt files loaded", loaded);
    unlink(path);
}

/* ==== streaming detokenizer ======================================================= */

/* Feeds ids one by one; checks that every chunk is valid UTF-8 and that the whole is
 * the expected text. */
static void check_stream(const q3_tokenizer *tok, const int32_t *ids, size_t n, const char *want,
                         size_t *split_chars)
{
    q3_detok d;
    q3_detok_init(&d, tok);
    char out[4096];
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        CHECK(q3_detok_push(&d, ids[i], &s, &len) == Q3_OK, "push");
        CHECK(q3_utf8_validate(s, len) == len, "chunk %zu is not valid UTF-8", i);
        size_t tl;
        q3_tokenizer_token_bytes(tok, ids[i], &tl);
        if (q3_utf8_validate(q3_tokenizer_token_bytes(tok, ids[i], &tl), tl) != tl) ++*split_chars;
        if (w + len < sizeof out) memcpy(out + w, s, len), w += len;
    }
    const char *s;
    size_t len;
    CHECK(q3_detok_flush(&d, &s, &len) == Q3_OK && len == 0, "nothing left at the end");
    CHECK(w == strlen(want) && memcmp(out, want, w) == 0, "stream gives \"%.*s\", want \"%s\"", (int)w, out, want);
    q3_detok_free(&d);
}

static void test_streaming(const q3_tokenizer *tok)
{
    const char *texts[] = {
        "Hello 🤗 world 🎉🎉!", "日本語のテキストを分割する", "emoji family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
        "mixed: café, naïve, Ελληνικά, русский, 한국어, 中文", "𠀀𠀁𠀂 rare CJK", "<|im_start|>assistant\n😀<|im_end|>",
    };
    size_t split_chars = 0;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        size_t n;
        CHECK(q3_tokenizer_encode(tok, texts[i], strlen(texts[i]), Q3_ENCODE_DEFAULT, &ids, &n) == Q3_OK, "encode");
        check_stream(tok, ids, n, texts[i], &split_chars);
        free(ids);
    }
    CHECK(split_chars > 0, "some token holds part of a character (%zu)", split_chars);

    /* "€" (E2 82 AC) one byte token at a time: nothing, nothing, then the whole. */
    int32_t b[3];
    for (int i = 0; i < 3; i++) b[i] = q3_tokenizer_token_id(tok, &"\xE2\x82\xAC"[i], 1);
    CHECK(b[0] >= 0 && b[1] >= 0 && b[2] >= 0, "byte tokens");
    q3_detok d;
    q3_detok_init(&d, tok);
    const char *s;
    size_t len;
    q3_detok_push(&d, b[0], &s, &len);
    CHECK(len == 0, "held after 1 byte");
    q3_detok_push(&d, b[1], &s, &len);
    CHECK(len == 0, "held after 2 bytes");
    q3_detok_push(&d, b[2], &s, &len);
    CHECK(len == 3 && !memcmp(s, "\xE2\x82\xAC", 3), "euro whole");
    /* An unfinished character cut off by the end: U+FFFD at the flush. */
    q3_detok_push(&d, b[0], &s, &len);
    CHECK(len == 0, "held");
    q3_detok_flush(&d, &s, &len);
    CHECK(len == 3 && !memcmp(s, Q3_UTF8_REPLACEMENT, 3), "flush gives U+FFFD");
    /* A byte that can never start a character: U+FFFD at once, then the next text. */
    int32_t ff = q3_tokenizer_token_id(tok, "\xFF", 1), a = q3_tokenizer_token_id(tok, "a", 1);
    q3_detok_push(&d, ff, &s, &len);
    CHECK(len == 3 && !memcmp(s, Q3_UTF8_REPLACEMENT, 3), "0xFF gives U+FFFD");
    /* An unfinished character interrupted by another token. */
    q3_detok_push(&d, b[0], &s, &len);
    q3_detok_push(&d, a, &s, &len);
    CHECK(len == 4 && !memcmp(s, Q3_UTF8_REPLACEMENT "a", 4), "interrupted: %zu bytes", len);
    CHECK(q3_detok_push(&d, -5, &s, &len) == Q3_ERR_INVALID, "bad id");
    q3_detok_free(&d);
}

/* ==== internals against each other ================================================== */

/* A deterministic generator of awkward strings: letters, digits, marks, spaces of all
 * kinds, CR/LF, apostrophes, CJK, emoji, ... */
#define rng rng_next

static size_t random_text(char *out, size_t max_chars)
{
    static const uint32_t alphabet[] = {
        'a', 'b', 'Z', 's', 't', 'l', 'e', 'r', 'v', 'm', 'd', 'S', 'L', 'E', '\'', '\'', '0', '7', ' ', ' ',
        ' ', '\t', '\n', '\r', '\v', '\f', '.', ',', '!', '(', '-', '_', '"', 0x85, 0xA0, 0x1680, 0x2003,
        0x2028, 0x202F, 0x3000, 0x180E, 0xFEFF, 0x200B, 0xE9, 0x301, 0x308, 0x327, 0x17F, 0x212A, 0x3B1,
        0x416, 0x5D0, 0x627, 0x663, 0x915, 0x94D, 0x4E2D, 0x6587, 0x3042, 0xAC00, 0x1100, 0x1161, 0x11A8,
        0xFF10, 0x2160, 0xB2, 0xBD, 0x1F600, 0x1F468, 0x200D, 0x1F3FB, 0x20000, 0x10400, 0xE0001, 0x1D7CE,
    };
    size_t n = 1 + rng() % max_chars, w = 0;
    for (size_t i = 0; i < n; i++) w += (size_t)q3_utf8_encode(alphabet[rng() % (sizeof alphabet / sizeof alphabet[0])], out + w);
    out[w] = 0;
    return w;
}

/* The hand-written Qwen2 splitter must cut exactly where PCRE2 cuts. */
static void test_splitters_agree(void)
{
    tk_splitter re;
    CHECK(tk_splitter_init(&re, TK_QWEN2_PATTERN, 0, "test") == Q3_OK, "compile: %s", q3_last_error());
    CHECK(re.kind == TK_SPLIT_PCRE2, "PCRE2 path");
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re.re, NULL);
    jsonl g = read_jsonl(TOK_DATA "/golden_public.jsonl");
    char text[4096];
    size_t disagree = 0, pieces = 0;
    for (size_t k = 0; k < g.n + 20000; k++) {
        size_t n;
        if (k < g.n) {
            const char *s = str_of(g.rows[k], "text");
            n = strlen(s);
            if (n >= sizeof text) continue;
            memcpy(text, s, n + 1);
        } else {
            n = random_text(text, 40);
        }
        tk_split_iter it = {.sp = &re, .s = (const unsigned char *)text, .n = n, .md = md};
        size_t ps, pe, pos = 0;
        int r;
        while ((r = tk_split_next(&it, &ps, &pe)) == 1) {
            size_t fast_end = tk_qwen2_piece_end((const unsigned char *)text, n, pos);
            pieces++;
            if (ps != pos || pe != fast_end) {
                if (disagree++ < 5) fprintf(stderr, "  split differs in \"%s\" at byte %zu: PCRE2 [%zu,%zu) fast end %zu\n",
                                            text, pos, ps, pe, fast_end);
                break;
            }
            pos = pe;
        }
        CHECK(r == 0 || r == 1, "split error");
    }
    CHECK(disagree == 0, "the Qwen2 splitter and PCRE2 disagree on %zu strings", disagree);
    printf("splitters agree on %zu pieces\n", pieces);
    free_jsonl(&g);
    pcre2_match_data_free(md);
    tk_splitter_free(&re);

    /* PCRE2's own \s would differ: the rewrite must make U+180E not a space and U+0085 one. */
    CHECK(tk_splitter_init(&re, "\\s+|[^\\s]+", 0, "test") == Q3_OK, "compile");
    md = pcre2_match_data_create_from_pattern(re.re, NULL);
    const char *s = "a\xC2\x85\xE1\xA0\x8E" "b"; /* a U+0085 U+180E b */
    tk_split_iter it = {.sp = &re, .s = (const unsigned char *)s, .n = strlen(s), .md = md};
    size_t ps, pe, cuts[8], nc = 0;
    while (tk_split_next(&it, &ps, &pe) == 1 && nc < 8) cuts[nc++] = pe;
    CHECK(nc == 3 && cuts[0] == 1 && cuts[1] == 3 && cuts[2] == 7, "\\s rewrite: %zu pieces", nc);
    pcre2_match_data_free(md);
    tk_splitter_free(&re);
    CHECK(tk_splitter_init(&re, "[^\\S]", 0, "test") == Q3_ERR_UNSUPPORTED, "\\S in a class");
    CHECK(tk_splitter_init(&re, "(unclosed", 0, "test") == Q3_ERR_UNSUPPORTED, "bad pattern");
}

/* The heap BPE (long pieces) and the scan BPE (short ones) must agree. */
static void test_bpe_variants(const q3_tokenizer *tok)
{
    tk_scratch sc = {0};
    q3_tokens a = {0}, b = {0};
    char text[4096];
    size_t disagree = 0;
    for (int k = 0; k < 3000; k++) {
        size_t n;
        if (k % 3 == 0) { /* a long run of letters from a small set: many equal ranks */
            n = 1 + rng() % 300;
            for (size_t i = 0; i < n; i++) text[i] = "aabbe rst"[rng() % 9];
        } else {
            n = random_text(text, 60);
        }
        a.n = b.n = 0;
        tk_bpe_uncached(tok, &sc, (const unsigned char *)text, n, 0, &a);
        tk_bpe_uncached(tok, &sc, (const unsigned char *)text, n, 1, &b);
        if (!same_ids(a.ids, a.n, b.ids, b.n)) disagree++;
    }
    CHECK(disagree == 0, "heap and scan BPE disagree on %zu strings", disagree);
    q3_tokens_free(&a);
    q3_tokens_free(&b);
    tk_scratch_free(&sc);
}

/* The segment-wise NFC must equal utf8proc_NFC of the whole. */
static void test_nfc(void)
{
    char text[4096];
    tk_buf buf = {0};
    size_t disagree = 0, copies = 0;
    for (int k = 0; k < 20000; k++) {
        size_t n = random_text(text, 30);
        const char *r;
        size_t rn;
        CHECK(tk_nfc(text, n, &buf, &r, &rn) == Q3_OK, "nfc");
        char *want = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text);
        if (strlen(want) != rn || memcmp(want, r, rn)) {
            if (disagree++ < 3) fprintf(stderr, "  NFC differs for \"%s\"\n", text);
        }
        copies += r != text;
        free(want);
    }
    const char *ascii = "plain ASCII text", *r;
    size_t rn;
    tk_nfc(ascii, strlen(ascii), &buf, &r, &rn);
    CHECK(r == ascii, "ASCII is not copied");
    const char *cjk = "日本語 😀 café";
    tk_nfc(cjk, strlen(cjk), &buf, &r, &rn);
    CHECK(r == cjk, "already-NFC text is not copied");
    CHECK(disagree == 0, "NFC differs from utf8proc_NFC on %zu strings", disagree);
    CHECK(copies > 0, "some strings needed NFC");
    tk_buf_free(&buf);
}

/* ==== from_parts =================================================================== */

/* GPT-2's bytes_to_unicode, to write raw bytes back in byte-level form. */
static size_t to_byte_level(const char *bytes, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned b = (unsigned char)bytes[i];
        uint32_t cp;
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)) cp = b;
        else if (b <= 32) cp = 256 + b;
        else if (b <= 160) cp = 256 + 33 + (b - 127);
        else cp = 256 + 67;
        w += (size_t)q3_utf8_encode(cp, out + w);
    }
    out[w] = 0;
    return w;
}

static void test_tiny_from_parts(void)
{
    /* 256 byte tokens, then "ab", "abc", and one added token. */
    static char store[258][8];
    const char *vocab[258];
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        to_byte_level(&byte, 1, store[b]);
        vocab[b] = store[b];
    }
    vocab[256] = "ab";
    vocab[257] = "abc";
    const char *merges[] = {"a b", "ab c"};
    q3_added_token added[] = {{"<eos>", 258, 1, 0, 0}, {"<sep>", 259, 0, 1, 1}};
    q3_tokenizer_parts p = {vocab, 258, merges, 2, added, 2, NULL, 1};
    q3_tokenizer *tok;
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_OK, "tiny: %s", q3_last_error());
    if (!tok) return;
    CHECK(encodes_to(tok, "abc ab<eos>", (int32_t[]){257, ' ', 256, 258}, 4), "tiny encode");
    /* lstrip/rstrip swallow the spaces around <sep>. */
    CHECK(encodes_to(tok, "a <sep> b", (int32_t[]){'a', 259, 'b'}, 3), "strip");
    CHECK(q3_tokenizer_vocab_size(tok) == 260, "tiny vocab size");
    q3_tokenizer_free(tok);

    /* Another split pattern goes through PCRE2: here "ab" never merges across pieces
     * "a" | "b" (digits split one by one), and gaps between matches are pieces too. */
    p.split_regex = "[a]|[0-9]";
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_OK, "tiny with a regex: %s", q3_last_error());
    if (tok) {
        /* pieces: "a" (match) "bc " (gap) "a" (match) "b" (gap): "bc " has no merge */
        CHECK(encodes_to(tok, "abc ab", (int32_t[]){'a', 'b', 'c', ' ', 'a', 'b'}, 6), "regex pieces");
        CHECK(encodes_to(tok, "12ab", (int32_t[]){'1', '2', 'a', 'b'}, 4), "regex digits");
        q3_tokenizer_free(tok);
    }
    p.split_regex = NULL;

    const char *bad_merges[] = {"a  b"};
    p.merges = bad_merges;
    p.n_merges = 1;
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_ERR_FORMAT && !tok, "bad merge");
    CHECK_CONTAINS(q3_last_error(), "tiny");
    const char *unknown[] = {"x yz"};
    p.merges = unknown;
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_ERR_FORMAT, "unknown merge part");
    CHECK_CONTAINS(q3_last_error(), "not in the vocabulary");

    /* Counts beyond the limits fail before the arrays are read or the maps sized
     * from them (a merge count near 2^32 used to wrap the map's size). */
    p.n_merges = (size_t)1 << 24;
    tok = (q3_tokenizer *)1;
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_ERR_FORMAT && !tok, "2^24 merges");
    CHECK_CONTAINS(q3_last_error(), "tiny: 16777216 merges, more than 16777215");
    p.n_merges = SIZE_MAX;
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_ERR_FORMAT && !tok, "SIZE_MAX merges");
    CHECK_CONTAINS(q3_last_error(), "merges, more than 16777215");
    p.n_merges = 1;
    p.n_vocab = (size_t)1 << 20;
    CHECK(q3_tokenizer_from_parts(&p, "tiny", &tok) == Q3_ERR_FORMAT && !tok, "2^20 tokens");
    CHECK_CONTAINS(q3_last_error(), "tiny: 1048576 vocabulary entries, more than 1048575");
}

/* The full Qwen3 tokenizer rebuilt from parts (as a GGUF reader would) must encode the
 * corpus exactly as the loaded one. */
static void test_qwen_from_parts(const q3_tokenizer *loaded)
{
    char *buf;
    size_t len;
    if (q3_read_file(TOKENIZER_JSON, 1 << 26, &buf, &len) != Q3_OK) return;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON *vocab = cJSON_GetObjectItem(model, "vocab"), *merges = cJSON_GetObjectItem(model, "merges");
    cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    size_t n_vocab = 0, n_merges = (size_t)cJSON_GetArraySize(merges), n_added = (size_t)cJSON_GetArraySize(added);
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) if ((size_t)x->valuedouble + 1 > n_vocab) n_vocab = (size_t)x->valuedouble + 1;
    const char **v = calloc(n_vocab, sizeof *v);
    cJSON_ArrayForEach(x, vocab) v[(size_t)x->valuedouble] = x->string;
    char **m = calloc(n_merges, sizeof *m);
    size_t i = 0;
    cJSON_ArrayForEach(x, merges) {
        const char *a = cJSON_GetArrayItem(x, 0)->valuestring, *b = cJSON_GetArrayItem(x, 1)->valuestring;
        m[i] = malloc(strlen(a) + strlen(b) + 2);
        sprintf(m[i++], "%s %s", a, b);
    }
    q3_added_token *ad = calloc(n_added, sizeof *ad);
    i = 0;
    cJSON_ArrayForEach(x, added) {
        ad[i].content = cJSON_GetObjectItem(x, "content")->valuestring;
        ad[i].id = (int32_t)cJSON_GetObjectItem(x, "id")->valuedouble;
        ad[i++].special = cJSON_IsTrue(cJSON_GetObjectItem(x, "special"));
    }
    q3_tokenizer_parts p = {v, n_vocab, (const char *const *)m, n_merges, ad, n_added, NULL, 1};
    q3_tokenizer *tok;
    CHECK(q3_tokenizer_from_parts(&p, "parts", &tok) == Q3_OK, "from parts: %s", q3_last_error());
    if (tok) {
        jsonl g = read_jsonl(TOK_DATA "/golden_public.jsonl");
        size_t same = 0;
        for (size_t k = 0; k < g.n; k++) {
            const char *text = str_of(g.rows[k], "text");
            int32_t *a, *b;
            size_t na, nb;
            q3_tokenizer_encode(tok, text, strlen(text), Q3_ENCODE_DEFAULT, &a, &na);
            q3_tokenizer_encode(loaded, text, strlen(text), Q3_ENCODE_DEFAULT, &b, &nb);
            same += same_ids(a, na, b, nb);
            free(a);
            free(b);
        }
        CHECK(same == g.n, "from_parts agrees with load on %zu/%zu lines", same, g.n);
        CHECK(q3_tokenizer_vocab_size(tok) == q3_tokenizer_vocab_size(loaded), "vocab size");
        free_jsonl(&g);
        q3_tokenizer_free(tok);
    }
    for (i = 0; i < n_merges; i++) free(m[i]);
    free(m);
    free(v);
    free(ad);
    cJSON_Delete(root);
}

/* ==== threads ============================================================================ */

/* Several threads encoding with one tokenizer at once (the scratch pool is shared). */
typedef struct corpus {
    size_t n;
    char **text;
    size_t *len, *n_want;
    int32_t **want;
} corpus;

typedef struct thread_job {
    const q3_tokenizer *tok;
    const corpus *c;
    size_t wrong;
} thread_job;

static void *encode_corpus(void *arg)
{
    thread_job *job = arg;
    const corpus *c = job->c;
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < c->n; i++) {
            int32_t *ids;
            size_t n;
            if (q3_tokenizer_encode(job->tok, c->text[i], c->len[i], Q3_ENCODE_DEFAULT, &ids, &n) != Q3_OK) {
                job->wrong++;
                continue;
            }
            job->wrong += !same_ids(ids, n, c->want[i], c->n_want[i]);
            free(ids);
        }
    return NULL;
}

static void test_threads(const q3_tokenizer *tok)
{
    jsonl g = read_jsonl(TOK_DATA "/golden_public.jsonl");
    corpus c = {g.n, calloc(g.n, sizeof(char *)), calloc(g.n, sizeof(size_t)), calloc(g.n, sizeof(size_t)),
                calloc(g.n, sizeof(int32_t *))};
    for (size_t i = 0; i < g.n; i++) {
        const char *t = text_of(&g, i, "text", &c.len[i]);
        c.text[i] = malloc(c.len[i] + 1);
        memcpy(c.text[i], t, c.len[i] + 1);
        c.want[i] = ids_of(g.rows[i], "ids", &c.n_want[i]);
    }
    enum { N = 4 };
    pthread_t th[N];
    thread_job jobs[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = (thread_job){tok, &c, 0};
        CHECK(pthread_create(&th[i], NULL, encode_corpus, &jobs[i]) == 0, "thread");
    }
    size_t wrong = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        wrong += jobs[i].wrong;
    }
    CHECK(wrong == 0, "%zu wrong encodings from concurrent threads", wrong);
    for (size_t i = 0; i < g.n; i++) free(c.text[i]), free(c.want[i]);
    free(c.text), free(c.len), free(c.n_want), free(c.want);
    free_jsonl(&g);
}

/* ==== main ============================================================================ */

int main(void)
{
    /* Loaded twice: a second load of the same file must work as the first
       (load time is measured in bench/bench_tokenizer, not here). */
    q3_tokenizer *tok = NULL;
    for (int r = 0; r < 2; r++) {
        q3_tokenizer *t;
        q3_status st = q3_tokenizer_load(TOKENIZER_JSON, &t);
        CHECK(st == Q3_OK, "load: %s", q3_last_error());
        if (st != Q3_OK) TEST_DONE();
        if (tok) {
            CHECK(q3_tokenizer_vocab_size(t) == q3_tokenizer_vocab_size(tok), "a second load differs");
            q3_tokenizer_free(tok);
        }
        tok = t;
    }

    test_golden(tok);
    test_roundtrip(tok);
    test_spot_checks(tok);
    test_invalid_utf8(tok);
    test_broken_files();
    test_streaming(tok);
    test_splitters_agree();
    test_bpe_variants(tok);
    test_nfc();
    test_tiny_from_parts();
    test_qwen_from_parts(tok);
    test_threads(tok);
    q3_tokenizer_free(tok);
    TEST_DONE();
}
