/* Reading a Hugging Face tokenizer.json.
 *
 * The file is 11 MB, almost all of it model.vocab (151k entries) and model.merges
 * (151k pairs). Building a cJSON tree of that takes ~100 ms (a million small
 * allocations), more than the whole load budget, so a small validating scanner walks
 * the document once, finds where each top-level part lies, and feeds vocab and
 * merges straight into the tokenizer without building anything. The small parts
 * (added_tokens, normalizer, pre_tokenizer, model options) are parsed with cJSON. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "text/tokenizer_gguf.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"
#include "util/error.h"
#include "util/file.h"

#define TK_JSON_MAX_BYTES ((size_t)1 << 30)
#define TK_JSON_MAX_DEPTH 512

/* ==== a minimal JSON scanner ======================================================= */

typedef struct jscan {
    const char *base, *p, *end;
    const char *path;
    tk_buf tmp; /* unescaped strings */
} jscan;

/* A value's place in the file. */
typedef struct jspan {
    const char *start, *end; /* start == NULL: absent */
} jspan;

static q3_status jfail(jscan *j, const char *at, const char *what)
{
    if (at > j->end) at = j->end;
    int line = 1;
    for (const char *q = j->base; q < at; q++) line += *q == '\n';
    if (at >= j->end)
        return q3_fail(Q3_ERR_FORMAT, "%s: malformed JSON: %s at the end of the file (truncated?)", j->path, what);
    return q3_fail(Q3_ERR_FORMAT, "%s: malformed JSON at byte %zu (line %d): %s", j->path,
                   (size_t)(at - j->base), line, what);
}

/* tokenizer.json is pretty-printed: a third of it is runs of spaces, skipped 8 at a time. */
static inline void skip_ws(jscan *j)
{
    const char *p = j->p, *end = j->end;
    for (;;) {
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            uint64_t x = w ^ 0x2020202020202020ull; /* zero bytes where there are spaces */
            if (x) {
                p += __builtin_ctzll(x) / 8; /* little-endian: the first non-space */
                break;
            }
            p += 8;
        }
        if (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) {
            p++;
            continue;
        }
        break;
    }
    j->p = p;
}

/* Consumes character c (after whitespace). */
static q3_status expect(jscan *j, char c, const char *what)
{
    skip_ws(j);
    if (j->p >= j->end || *j->p != c) return jfail(j, j->p, what);
    j->p++;
    return Q3_OK;
}

static int hex4(const char *p, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* The first byte at or after p that ends a run of plain string bytes: '"', '\\' or a
 * control character (or end). Eight bytes at a time: a word has such a byte iff one of
 * its bytes is '"', '\\' or below 0x20 (the usual has-zero-byte trick, per test). */
static inline const char *plain_run_end(const char *p, const char *end)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        uint64_t hit = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w);
        if (hit & highs) break;
        p += 8;
    }
    while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
    return p;
}

/* Reads the string at j->p (after whitespace). s, len: its unescaped bytes, either in
 * the file or in j->tmp (valid until the next read_string). */
static q3_status read_string(jscan *j, const char **s, size_t *len)
{
    skip_ws(j);
    if (j->p >= j->end || *j->p != '"') return jfail(j, j->p, "expected a string");
    const char *start = ++j->p, *end = j->end;
    const char *p = plain_run_end(start, end);
    if (p < end && *p == '"') { /* no escapes: the common case */
        *s = start;
        *len = (size_t)(p - start);
        j->p = p + 1;
        return Q3_OK;
    }
    j->tmp.len = 0;
    if (tk_buf_append(&j->tmp, start, (size_t)(p - start))) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", j->path);
    while (p < end && *p != '"') {
        if ((unsigned char)*p < 0x20) return jfail(j, p, "control character in a string");
        if (*p != '\\') {
            const char *q = p;
            while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
            if (tk_buf_append(&j->tmp, p, (size_t)(q - p))) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", j->path);
            p = q;
            continue;
        }
        if (p + 1 >= end) return jfail(j, end, "unterminated string"); /* a lone backslash last */
        char e = p[1], c;
        p += 2;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (end - p < 4 || hex4(p, &cp)) return jfail(j, p - 2, "bad \\u escape");
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return jfail(j, p - 6, "unpaired surrogate in a \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return jfail(j, p - 6, "unpaired surrogate in a \\u escape");
            }
            char u[4];
            int k = q3_utf8_encode(cp, u);
            if (tk_buf_append(&j->tmp, u, (size_t)k)) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", j->path);
            continue;
        }
        default: return jfail(j, p - 2, "bad escape in a string");
        }
        if (tk_buf_append(&j->tmp, &c, 1)) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", j->path);
    }
    if (p >= end) return jfail(j, end, "unterminated string");
    j->p = p + 1;
    *s = j->tmp.data;
    *len = j->tmp.len;
    return Q3_OK;
}

/* Skips a string without unescaping it. */
static q3_status skip_string(jscan *j)
{
    const char *p = j->p + 1, *end = j->end;
    for (;;) {
        p = plain_run_end(p, end);
        if (p >= end) return jfail(j, end, "unterminated string");
        if (*p == '"') break;
        if ((unsigned char)*p < 0x20) return jfail(j, p, "control character in a string");
        if (end - p < 2) return jfail(j, end, "unterminated string"); /* not p = end + 1 */
        p += 2; /* a backslash and the character it escapes (checked when read) */
    }
    j->p = p + 1;
    return Q3_OK;
}

static q3_status skip_number(jscan *j)
{
    const char *p = j->p, *end = j->end, *start = p;
    if (p < end && *p == '-') p++;
    const char *digits = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    if (p == digits) return jfail(j, start, "expected a value");
    if (p < end && *p == '.') {
        const char *f = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == f) return jfail(j, start, "bad number");
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const char *x = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == x) return jfail(j, start, "bad number");
    }
    j->p = p;
    return Q3_OK;
}

/* Skips one value (validating its syntax); its extent goes to *span if non-NULL. */
static q3_status skip_value(jscan *j, jspan *span, int depth)
{
    skip_ws(j);
    if (j->p >= j->end) return jfail(j, j->p, "expected a value");
    if (depth > TK_JSON_MAX_DEPTH) return jfail(j, j->p, "nested too deeply");
    const char *start = j->p;
    q3_status st = Q3_OK;
    char c = *j->p;
    if (c == '"') {
        st = skip_string(j);
    } else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        skip_ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
        } else {
            for (;;) {
                if (c == '{') {
                    skip_ws(j);
                    if (j->p >= j->end || *j->p != '"') return jfail(j, j->p, "expected a key");
                    if ((st = skip_string(j)) || (st = expect(j, ':', "expected ':'"))) return st;
                }
                if ((st = skip_value(j, NULL, depth + 1))) return st;
                skip_ws(j);
                if (j->p < j->end && *j->p == ',') { j->p++; continue; }
                if (j->p < j->end && *j->p == close) { j->p++; break; }
                return jfail(j, j->p, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
            }
        }
    } else if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n)) return jfail(j, j->p, "expected a value");
        j->p += n;
    } else {
        st = skip_number(j);
    }
    if (st == Q3_OK && span) span->start = start, span->end = j->p;
    return st;
}

/* Iterates the members of the object at j->p: call with *first = 1; returns Q3_OK with
 * *key set, or with *key = NULL after the closing brace. */
static q3_status next_member(jscan *j, int *first, const char **key, size_t *key_len)
{
    q3_status st;
    if (*first) {
        if ((st = expect(j, '{', "expected an object"))) return st;
        skip_ws(j);
        *first = 0;
        if (j->p < j->end && *j->p == '}') { j->p++; *key = NULL; return Q3_OK; }
    } else {
        skip_ws(j);
        if (j->p < j->end && *j->p == '}') { j->p++; *key = NULL; return Q3_OK; }
        if ((st = expect(j, ',', "expected ',' or '}'"))) return st;
    }
    if ((st = read_string(j, key, key_len))) return st;
    return expect(j, ':', "expected ':'");
}

static int key_is(const char *key, size_t len, const char *name)
{
    return strlen(name) == len && memcmp(key, name, len) == 0;
}

/* ==== the big parts: vocab and merges ================================================= */

/* Entries collected for one tk_add_*_batch call. Strings point into the file; the few
 * that had escapes are copied into `esc` (their p is set when the batch is flushed,
 * since esc may move as it grows). */
typedef struct batch {
    tk_str a[TK_BATCH], b[TK_BATCH];
    size_t a_esc[TK_BATCH], b_esc[TK_BATCH]; /* offset in esc + 1; 0: p is in the file */
    int32_t id[TK_BATCH];
    size_t n;
    tk_buf esc;
} batch;

/* Keeps string s (from read_string) for the batch. */
static q3_status keep_string(jscan *j, batch *B, const char *s, size_t n, tk_str *dst, size_t *esc_off)
{
    dst->p = s;
    dst->n = n;
    *esc_off = 0;
    if (s >= j->base && s < j->end) return Q3_OK;
    *esc_off = B->esc.len + 1;
    if (tk_buf_append(&B->esc, s, n)) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", j->path);
    return Q3_OK;
}

static void resolve_escaped(batch *B)
{
    for (size_t k = 0; k < B->n; k++) {
        if (B->a_esc[k]) B->a[k].p = B->esc.data + B->a_esc[k] - 1;
        if (B->b_esc[k]) B->b[k].p = B->esc.data + B->b_esc[k] - 1;
    }
}

static q3_status flush_vocab(batch *B, q3_tokenizer *t)
{
    resolve_escaped(B);
    q3_status st = tk_add_vocab_batch(t, B->a, B->id, B->n);
    B->n = 0;
    B->esc.len = 0;
    return st;
}

static q3_status flush_merges(batch *B, q3_tokenizer *t)
{
    resolve_escaped(B);
    q3_status st = tk_add_merge_batch(t, B->a, B->b, B->n);
    B->n = 0;
    B->esc.len = 0;
    return st;
}

static q3_status read_vocab(jscan *j, q3_tokenizer *t, batch *B)
{
    int first = 1;
    B->n = 0;
    B->esc.len = 0;
    for (;;) {
        const char *key;
        size_t key_len;
        __builtin_prefetch(j->p + 1024); /* the file streams in from memory */
        q3_status st = next_member(j, &first, &key, &key_len);
        if (st != Q3_OK) return st;
        if (!key) return B->n ? flush_vocab(B, t) : Q3_OK;
        skip_ws(j);
        const char *p = j->p, *end = j->end;
        long long id = 0;
        const char *digits = p;
        while (p < end && *p >= '0' && *p <= '9' && id <= TK_MAX_ID) id = id * 10 + (*p++ - '0');
        if (p >= end) return jfail(j, p, "expected a number");
        if (p == digits || *p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9'))
            return q3_fail(Q3_ERR_FORMAT, "%s: model.vocab: the id of \"%.*s\" is not a non-negative integer below %d",
                           j->path, (int)(key_len > 60 ? 60 : key_len), key, TK_MAX_ID);
        j->p = p;
        size_t k = B->n;
        if ((st = keep_string(j, B, key, key_len, &B->a[k], &B->a_esc[k]))) return st;
        B->b_esc[k] = 0;
        B->id[k] = (int32_t)id;
        if (++B->n == TK_BATCH && (st = flush_vocab(B, t))) return st;
    }
}

static q3_status read_merges(jscan *j, q3_tokenizer *t, batch *B)
{
    q3_status st;
    B->n = 0;
    B->esc.len = 0;
    if ((st = expect(j, '[', "model.merges: expected an array"))) return st;
    skip_ws(j);
    if (j->p < j->end && *j->p == ']') { j->p++; return Q3_OK; }
    for (size_t i = 0;; i++) {
        size_t k = B->n;
        __builtin_prefetch(j->p + 1024); /* the file streams in from memory */
        skip_ws(j);
        if (j->p < j->end && *j->p == '"') { /* "left right" */
            const char *s;
            size_t n;
            if ((st = read_string(j, &s, &n))) return st;
            const char *sp = memchr(s, ' ', n);
            if (!sp || sp == s || sp + 1 == s + n || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)))
                return q3_fail(Q3_ERR_FORMAT, "%s: model.merges[%zu] (\"%.*s\") is not two tokens separated by one space",
                               j->path, i, (int)(n > 60 ? 60 : n), s);
            if ((st = keep_string(j, B, s, (size_t)(sp - s), &B->a[k], &B->a_esc[k])) ||
                (st = keep_string(j, B, sp + 1, (size_t)(s + n - sp - 1), &B->b[k], &B->b_esc[k])))
                return st;
        } else if (j->p < j->end && *j->p == '[') { /* ["left", "right"] */
            j->p++;
            const char *s;
            size_t n;
            if ((st = read_string(j, &s, &n)) || (st = keep_string(j, B, s, n, &B->a[k], &B->a_esc[k])) ||
                (st = expect(j, ',', "model.merges: expected a pair of strings")) ||
                (st = read_string(j, &s, &n)) || (st = keep_string(j, B, s, n, &B->b[k], &B->b_esc[k])) ||
                (st = expect(j, ']', "model.merges: expected a pair of strings")))
                return st;
        } else {
            return jfail(j, j->p, "model.merges: each merge must be a string or a pair of strings");
        }
        if (++B->n == TK_BATCH && (st = flush_merges(B, t))) return st;
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        if (j->p < j->end && *j->p == ']') { j->p++; return B->n ? flush_merges(B, t) : Q3_OK; }
        return jfail(j, j->p, "model.merges: expected ',' or ']'");
    }
}

/* ==== the small parts (cJSON) ============================================================ */

static cJSON *parse_span(jscan *j, jspan sp)
{
    return sp.start ? cJSON_ParseWithLength(sp.start, (size_t)(sp.end - sp.start)) : NULL;
}

static const char *type_of(const cJSON *o)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static int flag(const cJSON *o, const char *name)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, name));
}

/* normalizer: null, NFC, or a Sequence of those. */
static q3_status read_normalizer(jscan *j, const cJSON *n, int *nfc)
{
    if (!n || cJSON_IsNull(n)) return Q3_OK;
    const char *ty = type_of(n);
    if (!ty) return q3_fail(Q3_ERR_FORMAT, "%s: normalizer: no \"type\" string", j->path);
    if (!strcmp(ty, "NFC")) { *nfc = 1; return Q3_OK; }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
        if (!cJSON_IsArray(list)) return q3_fail(Q3_ERR_FORMAT, "%s: normalizer: Sequence without a \"normalizers\" array", j->path);
        cJSON_ArrayForEach(it, list) {
            q3_status st = read_normalizer(j, it, nfc);
            if (st != Q3_OK) return st;
        }
        return Q3_OK;
    }
    return q3_fail(Q3_ERR_UNSUPPORTED, "%s: normalizer type \"%s\" is not supported (only NFC)", j->path, ty);
}

/* pre_tokenizer: a Split on a regex (behavior Isolated) and/or a ByteLevel step, alone
 * or in a Sequence. *pattern (owned by the cJSON tree) receives the split regex. */
static q3_status read_pre_tokenizer(jscan *j, const cJSON *pt, const char **pattern, int *n_splits)
{
    if (!pt || cJSON_IsNull(pt)) return Q3_OK;
    const char *ty = type_of(pt);
    if (!ty) return q3_fail(Q3_ERR_FORMAT, "%s: pre_tokenizer: no \"type\" string", j->path);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"), *it;
        if (!cJSON_IsArray(list))
            return q3_fail(Q3_ERR_FORMAT, "%s: pre_tokenizer: Sequence without a \"pretokenizers\" array", j->path);
        cJSON_ArrayForEach(it, list) {
            q3_status st = read_pre_tokenizer(j, it, pattern, n_splits);
            if (st != Q3_OK) return st;
        }
        return Q3_OK;
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (flag(pt, "add_prefix_space"))
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel with add_prefix_space is not supported", j->path);
        const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        if (!use_regex || cJSON_IsTrue(use_regex)) { /* the default is true */
            *pattern = TK_GPT2_PATTERN;
            ++*n_splits;
        }
        return Q3_OK;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        if (!cJSON_IsString(re))
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: only {\"Regex\": ...} patterns are supported",
                           j->path);
        if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated"))
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: only behavior \"Isolated\" is supported",
                           j->path);
        if (flag(pt, "invert"))
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre_tokenizer Split with invert is not supported", j->path);
        *pattern = re->valuestring;
        ++*n_splits;
        return Q3_OK;
    }
    return q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported", j->path, ty);
}

static q3_status read_added_tokens(jscan *j, q3_tokenizer *t, const cJSON *list)
{
    if (!list || cJSON_IsNull(list)) return Q3_OK;
    if (!cJSON_IsArray(list)) return q3_fail(Q3_ERR_FORMAT, "%s: \"added_tokens\" is not an array", j->path);
    int i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, list) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsNumber(id) || !(id->valuedouble >= 0 && id->valuedouble < TK_MAX_ID) ||
            id->valuedouble != (double)(int32_t)id->valuedouble || !cJSON_IsString(content))
            return q3_fail(Q3_ERR_FORMAT, "%s: added_tokens[%d] needs an integer \"id\" and a string \"content\"",
                           j->path, i);
        if (flag(a, "single_word"))
            return q3_fail(Q3_ERR_UNSUPPORTED, "%s: added_tokens[%d] (\"%s\"): single_word is not supported", j->path,
                           i, content->valuestring);
        q3_status st = tk_add_added(t, content->valuestring, strlen(content->valuestring),
                                    (int32_t)id->valuedouble, flag(a, "special"), flag(a, "lstrip"),
                                    flag(a, "rstrip"));
        if (st != Q3_OK) return st;
        i++;
    }
    return Q3_OK;
}

/* model's small options: type BPE, and nothing q3 does not implement. */
static q3_status check_model_option(jscan *j, q3_tokenizer *t, const char *key, size_t key_len, jspan sp)
{
    cJSON *v = parse_span(j, sp);
    if (!v) return q3_fail(Q3_ERR_FORMAT, "%s: model.%.*s: cannot parse", j->path, (int)key_len, key);
    q3_status st = Q3_OK;
    if (key_is(key, key_len, "type")) {
        if (!cJSON_IsString(v) || strcmp(v->valuestring, "BPE"))
            st = q3_fail(Q3_ERR_UNSUPPORTED, "%s: model.type is %s, only \"BPE\" is supported", j->path,
                         cJSON_IsString(v) ? v->valuestring : "not a string");
    } else if (key_is(key, key_len, "byte_fallback")) {
        if (cJSON_IsTrue(v)) st = q3_fail(Q3_ERR_UNSUPPORTED, "%s: model.byte_fallback is not supported", j->path);
    } else if (key_is(key, key_len, "ignore_merges")) {
        t->ignore_merges = cJSON_IsTrue(v);
    } else if (key_is(key, key_len, "dropout")) {
        if (cJSON_IsNumber(v) && v->valuedouble > 0)
            st = q3_fail(Q3_ERR_UNSUPPORTED, "%s: model.dropout is not supported", j->path);
    } else if (key_is(key, key_len, "continuing_subword_prefix") || key_is(key, key_len, "end_of_word_suffix")) {
        if (cJSON_IsString(v) && v->valuestring[0])
            st = q3_fail(Q3_ERR_UNSUPPORTED, "%s: model.%.*s is not supported", j->path, (int)key_len, key);
    }
    cJSON_Delete(v);
    return st;
}

/* ==== the whole file ======================================================================== */

/* ==== merges on a second thread ===================================================== */

/* While the main thread reads the vocabulary, a helper thread parses and decodes the
 * merges (half the file) from where they are guessed to start: the first `"merges"`
 * followed by `: [` (a vocabulary key "merges" is followed by a number, and no string
 * holds an unescaped quote). The main thread uses the helper's work only if its own
 * parse reaches model.merges exactly there and the helper parsed it all; otherwise it
 * reads the merges itself (which also gives the error messages). */
typedef struct merges_job {
    const char *base, *end, *path;
    const char *start;   /* the guessed '[' of model.merges */
    const char *stop;    /* just after its ']' */
    tk_buf bytes;        /* decoded parts */
    tk_merge_rec *recs;
    size_t n, cap;
    int ok;              /* the whole array parsed and decoded */
    int running;
    pthread_t thread;
} merges_job;

/* Files smaller than this are read on one thread. */
#define TK_PARALLEL_MIN_BYTES ((size_t)2 << 20)

static const char *guess_merges_start(const char *base, const char *end)
{
    static const char key[] = "\"merges\"";
    const char *p = base;
    while ((p = memmem(p, (size_t)(end - p), key, sizeof key - 1))) {
        const char *q = p + sizeof key - 1;
        while (q < end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) q++;
        if (q < end && *q == ':') {
            q++;
            while (q < end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) q++;
            if (q < end && *q == '[') return q;
        }
        p += sizeof key - 1;
    }
    return NULL;
}

static int job_push(merges_job *job, const char *a, size_t an, const char *b, size_t bn)
{
    if (job->n == job->cap) {
        size_t cap = job->cap ? job->cap * 2 : 1 << 16;
        tk_merge_rec *r = realloc(job->recs, cap * sizeof *r);
        if (!r) return -1;
        job->recs = r;
        job->cap = cap;
    }
    return tk_decode_merge(a, an, b, bn, &job->bytes, &job->recs[job->n++]) ? -1 : 0;
}

/* The helper: the same grammar as read_merges; any problem just ends it (ok = 0). */
static void *merges_job_run(void *arg)
{
    merges_job *job = arg;
    jscan j = {.base = job->base, .p = job->start + 1, .end = job->end, .path = job->path};
    char small[256];
    int ok = 0;
    skip_ws(&j);
    if (j.p < j.end && *j.p == ']') {
        j.p++;
        ok = 1;
    }
    while (!ok) {
        const char *s, *b;
        size_t n, bn;
        skip_ws(&j);
        __builtin_prefetch(j.p + 1024);
        if (j.p < j.end && *j.p == '"') {
            if (read_string(&j, &s, &n)) break;
            const char *sp = memchr(s, ' ', n);
            if (!sp || sp == s || sp + 1 == s + n || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1))) break;
            if (job_push(job, s, (size_t)(sp - s), sp + 1, (size_t)(s + n - sp - 1))) break;
        } else if (j.p < j.end && *j.p == '[') {
            j.p++;
            if (read_string(&j, &s, &n) || n > sizeof small) break;
            memcpy(small, s, n); /* s may sit in j.tmp, which the next read reuses */
            if (expect(&j, ',', "") || read_string(&j, &b, &bn) || expect(&j, ']', "")) break;
            if (job_push(job, small, n, b, bn)) break;
        } else {
            break;
        }
        skip_ws(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        if (j.p < j.end && *j.p == ']') { j.p++; ok = 1; }
        break;
    }
    job->ok = ok;
    job->stop = j.p;
    tk_buf_free(&j.tmp);
    return NULL;
}

static void job_start(merges_job *job, const char *base, const char *end, const char *path)
{
    memset(job, 0, sizeof *job);
    if ((size_t)(end - base) < TK_PARALLEL_MIN_BYTES) return;
    job->base = base, job->end = end, job->path = path;
    job->start = guess_merges_start(base, end);
    tk_byte_level_init(); /* before the helper decodes anything */
    if (job->start && pthread_create(&job->thread, NULL, merges_job_run, job) == 0) job->running = 1;
}

/* Waits for the helper; returns 1 if its work is usable for merges starting at `at`. */
static int job_finish(merges_job *job, const char *at)
{
    if (job->running) pthread_join(job->thread, NULL);
    job->running = 0;
    return job->ok && at == job->start;
}

static void job_free(merges_job *job)
{
    job_finish(job, NULL);
    tk_buf_free(&job->bytes);
    free(job->recs);
    memset(job, 0, sizeof *job);
}

/* The small options of "model", kept to be checked once the tokenizer exists. */
typedef struct model_opts {
    struct { const char *key; size_t len; jspan sp; } opt[16];
    int n;
} model_opts;

/* Reads the "model" object at j->p into *tp (created on the way, sized from the file
 * length). vocab and merges are read in place, in one pass, unless merges come first:
 * then they are read after vocab. */
static q3_status read_model_members(jscan *j, q3_tokenizer **tp, model_opts *mo, batch *B, merges_job *job)
{
    q3_status st;
    skip_ws(j);
    if (j->p >= j->end || *j->p != '{') return q3_fail(Q3_ERR_FORMAT, "%s: \"model\" is not an object", j->path);
    jspan merges = {0};
    int have_vocab = 0, have_merges = 0, first = 1, from_job = 0;
    for (;;) {
        const char *key;
        size_t key_len;
        if ((st = next_member(j, &first, &key, &key_len))) return st;
        if (!key) break;
        skip_ws(j);
        if (key_is(key, key_len, "vocab")) {
            if (j->p >= j->end || *j->p != '{')
                return q3_fail(Q3_ERR_FORMAT, "%s: model.vocab is not an object", j->path);
            if (have_vocab) return q3_fail(Q3_ERR_FORMAT, "%s: model.vocab appears twice", j->path);
            /* ~75 bytes of file per vocabulary entry and merge in Qwen's; the maps grow if needed. */
            size_t guess = (size_t)(j->end - j->base) / 80 + 1024;
            /* no more ids than TK_MAX_ID, however large (or blank) the file is */
            if ((st = tk_new(j->path, guess < TK_MAX_ID ? guess : TK_MAX_ID, guess, tp))) return st;
            if ((st = read_vocab(j, *tp, B))) return st;
            have_vocab = 1;
        } else if (key_is(key, key_len, "merges")) {
            if (j->p >= j->end || *j->p != '[')
                return q3_fail(Q3_ERR_FORMAT, "%s: model.merges is not an array", j->path);
            if (have_merges) return q3_fail(Q3_ERR_FORMAT, "%s: model.merges appears twice", j->path);
            if (job_finish(job, j->p)) {
                from_job = 1; /* added below, once the vocabulary is complete */
                j->p = job->stop;
            } else if (have_vocab) {
                st = read_merges(j, *tp, B);
            } else {
                st = skip_value(j, &merges, 0);
            }
            if (st) return st;
            have_merges = 1;
        } else {
            int keep = mo->n < 16 && key != j->tmp.data; /* keys with escapes are no option we know */
            if (keep) mo->opt[mo->n].key = key, mo->opt[mo->n].len = key_len;
            if ((st = skip_value(j, keep ? &mo->opt[mo->n].sp : NULL, 0))) return st;
            mo->n += keep;
        }
    }
    if (!have_vocab) return q3_fail(Q3_ERR_FORMAT, "%s: model has no \"vocab\"", j->path);
    if (!have_merges) return q3_fail(Q3_ERR_FORMAT, "%s: model has no \"merges\"", j->path);
    if (from_job) return tk_add_decoded_merges(*tp, job->bytes.data, job->recs, job->n);
    if (merges.start) {
        const char *resume = j->p;
        j->p = merges.start;
        if ((st = read_merges(j, *tp, B))) return st;
        j->p = resume;
    }
    return Q3_OK;
}

static q3_status read_model(jscan *j, q3_tokenizer **tp, model_opts *mo, merges_job *job)
{
    batch *B = calloc(1, sizeof *B);
    if (!B) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", j->path);
    q3_status st = read_model_members(j, tp, mo, B, job);
    tk_buf_free(&B->esc);
    free(B);
    return st;
}

static q3_status load_json(jscan *j, q3_tokenizer **out)
{
    q3_status st = Q3_OK;
    q3_tokenizer *t = NULL;
    jspan added = {0}, normalizer = {0}, pre_tokenizer = {0};
    model_opts mo = {.n = 0};
    int first = 1, have_model = 0;
    skip_ws(j);
    if (j->p >= j->end) return jfail(j, j->p, "empty file");
    if (*j->p != '{') return jfail(j, j->p, "the top level is not an object");
    merges_job job;
    job_start(&job, j->base, j->end, j->path);
    for (;;) {
        const char *key;
        size_t key_len;
        if ((st = next_member(j, &first, &key, &key_len))) goto done;
        if (!key) break;
        if (key_is(key, key_len, "model")) {
            if (have_model) {
                st = q3_fail(Q3_ERR_FORMAT, "%s: \"model\" appears twice", j->path);
                goto done;
            }
            have_model = 1;
            st = read_model(j, &t, &mo, &job);
            job_free(&job);
            if (st) goto done;
            continue;
        }
        jspan *dst = key_is(key, key_len, "added_tokens")    ? &added
                     : key_is(key, key_len, "normalizer")    ? &normalizer
                     : key_is(key, key_len, "pre_tokenizer") ? &pre_tokenizer
                                                             : NULL;
        if ((st = skip_value(j, dst, 0))) goto done;
    }
    skip_ws(j);
    if (j->p != j->end) {
        st = jfail(j, j->p, "text after the end of the top-level object");
        goto done;
    }
    if (!have_model) {
        st = q3_fail(Q3_ERR_FORMAT, "%s: no \"model\" object (is this a tokenizer.json?)", j->path);
        goto done;
    }

    for (int i = 0; i < mo.n && st == Q3_OK; i++) st = check_model_option(j, t, mo.opt[i].key, mo.opt[i].len, mo.opt[i].sp);

    cJSON *added_json = NULL, *norm_json = NULL, *pre_json = NULL;
    if (st == Q3_OK && added.start && !(added_json = parse_span(j, added)))
        st = q3_fail(Q3_ERR_FORMAT, "%s: \"added_tokens\": cannot parse", j->path);
    if (st == Q3_OK && normalizer.start && !(norm_json = parse_span(j, normalizer)))
        st = q3_fail(Q3_ERR_FORMAT, "%s: \"normalizer\": cannot parse", j->path);
    if (st == Q3_OK && pre_tokenizer.start && !(pre_json = parse_span(j, pre_tokenizer)))
        st = q3_fail(Q3_ERR_FORMAT, "%s: \"pre_tokenizer\": cannot parse", j->path);

    if (st == Q3_OK) st = read_added_tokens(j, t, added_json);
    int nfc = 0, n_splits = 0;
    const char *pattern = NULL;
    if (st == Q3_OK) st = read_normalizer(j, norm_json, &nfc);
    if (st == Q3_OK) st = read_pre_tokenizer(j, pre_json, &pattern, &n_splits);
    if (st == Q3_OK && n_splits > 1)
        st = q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre_tokenizer: more than one split step is not supported", j->path);
    if (st == Q3_OK) st = tk_finish(t, pattern, nfc);

    cJSON_Delete(added_json);
    cJSON_Delete(norm_json);
    cJSON_Delete(pre_json);
done:
    job_free(&job);
    if (st != Q3_OK) {
        q3_tokenizer_free(t);
        return st;
    }
    *out = t;
    return Q3_OK;
}

static q3_status load_json_file(const char *path, q3_tokenizer **out);

q3_status q3_tokenizer_load(const char *path, q3_tokenizer **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(path);
    char p[PATH_MAX];
    if (q3_is_dir(path)) { /* a model folder: its tokenizer.json */
        if ((size_t)snprintf(p, sizeof p, "%s/tokenizer.json", path) >= sizeof p)
            return q3_fail(Q3_ERR_INVALID, "%s: path too long", path);
        path = p;
    }
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".gguf")) return q3_tokenizer_load_gguf_file(path, out); /* its metadata's */
    return load_json_file(path, out);
}

static q3_status load_json_file(const char *path, q3_tokenizer **out)
{
    *out = NULL;
    /* Mapped, not read: no copy of the 11 MB; MAP_POPULATE sets up all its pages in
     * one go rather than a fault every few pages. */
    int fd;
    size_t size;
    q3_status ost = q3_open_regular(path, &fd, &size); /* a FIFO or a device is refused, not waited on */
    if (ost) return ost;
    if (size > TK_JSON_MAX_BYTES) {
        close(fd);
        return q3_fail(Q3_ERR_FORMAT, "%s: %zu bytes, more than a tokenizer.json can be", path, size);
    }
    void *data = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0) : NULL;
    close(fd);
    if (data == MAP_FAILED) return q3_fail(Q3_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    const char *buf = data ? data : "";
    jscan j = {.base = buf, .p = buf, .end = buf + size, .path = path};
    q3_status st = load_json(&j, out);
    tk_buf_free(&j.tmp);
    if (data) munmap(data, size);
    return st;
}
