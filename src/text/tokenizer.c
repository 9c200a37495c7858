/* The tokenizer: building it, encode, decode, the streaming detokenizer, lookups.
 * (tokenizer.json is read in tokenizer_json.c; BPE itself is in bpe.c.) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"
#include "util/error.h"

/* ==== byte-level alphabet (GPT-2's bytes_to_unicode) ============================= */

/* Printable bytes (33..126, 161..172, 174..255) stand for themselves; the other 68
 * (0..32, 127..160, 173) are moved, in order, to U+0100..U+0143. Returns the byte that
 * code point cp stands for, or -1 if cp is not in the alphabet. */
static int byte_level_to_byte(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(127 + (k - 33));
    return 173;
}

/* The byte of each two-byte character of the alphabet (U+00A1..U+0143: lead byte
 * C2..C5), indexed by (lead - 0xC2) << 6 | (continuation & 0x3F); -1 if none. */
static int16_t two_byte_to_byte[256];
static pthread_once_t two_byte_once = PTHREAD_ONCE_INIT;

static void build_two_byte_table(void)
{
    for (unsigned i = 0; i < 256; i++)
        two_byte_to_byte[i] = (int16_t)byte_level_to_byte(((0xC2 + (i >> 6)) & 0x1Fu) << 6 | (i & 0x3F));
}

void tk_byte_level_init(void)
{
    pthread_once(&two_byte_once, build_two_byte_table);
}

/* Decodes a byte-level string into raw bytes appended to out. Returns 0; 1 if a
 * character is outside the alphabet (or bad UTF-8), its byte offset in *bad_at;
 * -1 out of memory. */
int tk_byte_level_decode(const char *bl, size_t n, tk_buf *out, size_t *bad_at)
{
    if (out->len + n > out->cap && tk_buf_reserve(out, n)) return -1; /* never longer than the input */
    const unsigned char *s = (const unsigned char *)bl;
    unsigned char *dst = (unsigned char *)out->data + out->len;
    size_t i = 0, w = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c - 33u <= 126u - 33u) { /* printable ASCII stands for itself */
            dst[w++] = (unsigned char)c;
            i++;
            continue;
        }
        unsigned lead = c - 0xC2u;
        if (lead < 4 && i + 1 < n && (s[i + 1] & 0xC0) == 0x80) {
            int b = two_byte_to_byte[lead << 6 | (s[i + 1] & 0x3Fu)];
            if (b >= 0) {
                dst[w++] = (unsigned char)b;
                i += 2;
                continue;
            }
        }
        *bad_at = i;
        return 1;
    }
    out->len += w;
    return 0;
}

/* ==== building ====================================================================== */

q3_status tk_new(const char *name, size_t n_vocab, size_t n_merges, q3_tokenizer **out)
{
    *out = NULL;
    tk_byte_level_init();
    q3_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", name ? name : "tokenizer");
    pthread_mutex_init(&t->pool_lock, NULL);
    t->name = strdup(name ? name : "tokenizer");
    t->merge_guess = 256;
    if (!t->name || tk_maps_alloc(t, n_vocab, n_merges) || tk_buf_reserve(&t->bytes, n_vocab * 8)) {
        q3_tokenizer_free(t);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", name ? name : "tokenizer");
    }
    *out = t;
    return Q3_OK;
}

/* Makes ids [0, n) addressable. */
static q3_status ensure_ids(q3_tokenizer *t, int32_t n)
{
    if (n <= t->n_ids) return Q3_OK;
    int32_t cap = t->n_ids ? t->n_ids : 1024;
    while (cap < n) cap = cap > TK_MAX_ID / 2 ? TK_MAX_ID : cap * 2;
    uint32_t *off = realloc(t->tok_off, (size_t)cap * sizeof *off);
    if (off) t->tok_off = off;
    uint32_t *len = realloc(t->tok_len, (size_t)cap * sizeof *len);
    if (len) t->tok_len = len;
    uint8_t *kind = realloc(t->tok_kind, (size_t)cap);
    if (kind) t->tok_kind = kind;
    if (!off || !len || !kind) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for %d ids", t->name, cap);
    memset(off + t->n_ids, 0, (size_t)(cap - t->n_ids) * sizeof *off);
    memset(len + t->n_ids, 0, (size_t)(cap - t->n_ids) * sizeof *len);
    memset(kind + t->n_ids, TK_KIND_NONE, (size_t)(cap - t->n_ids));
    t->n_ids = cap; /* trimmed to the largest id + 1 in tk_finish */
    return Q3_OK;
}

static q3_status check_id(q3_tokenizer *t, int32_t id, const char *what, const char *text, size_t len)
{
    if (id < 0 || id >= TK_MAX_ID)
        return q3_fail(Q3_ERR_FORMAT, "%s: %s \"%.*s\" has id %d, outside 0..%d", t->name, what,
                       (int)(len > 60 ? 60 : len), text, (int)id, TK_MAX_ID - 1);
    return ensure_ids(t, id + 1);
}

/* Loading is bound by cache misses in the hash maps (6 MB of vocabulary slots, 4 MB of
 * merge slots), so tokens and merges are added in batches: first every key of the
 * batch is hashed and its slot prefetched, then the slots are used. */

q3_status tk_add_vocab_batch(q3_tokenizer *t, const tk_str *bl, const int32_t *ids, size_t n)
{
    uint64_t h[TK_BATCH];
    if (n > TK_BATCH) return q3_fail(Q3_ERR_INVALID, "%s: vocabulary batch of %zu", t->name, n);
    for (size_t k = 0; k < n; k++) {
        int32_t id = ids[k];
        const char *s = bl[k].p;
        int sl = (int)(bl[k].n > 60 ? 60 : bl[k].n);
        q3_status st = check_id(t, id, "vocabulary token", s, bl[k].n);
        if (st != Q3_OK) return st;
        if (t->tok_kind[id] != TK_KIND_NONE)
            return q3_fail(Q3_ERR_FORMAT, "%s: vocabulary: id %d is given to two tokens (the second is \"%.*s\")",
                           t->name, (int)id, sl, s);
        size_t off = t->bytes.len, bad_at = 0;
        if (off + bl[k].n > UINT32_MAX) return q3_fail(Q3_ERR_FORMAT, "%s: vocabulary too large", t->name);
        int r = tk_byte_level_decode(s, bl[k].n, &t->bytes, &bad_at);
        if (r < 0) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
        if (r > 0)
            return q3_fail(Q3_ERR_FORMAT,
                           "%s: vocabulary token %d \"%.*s\": the character at byte %zu is not in the byte-level alphabet",
                           t->name, (int)id, sl, s, bad_at);
        size_t len = t->bytes.len - off;
        if (len == 0) return q3_fail(Q3_ERR_FORMAT, "%s: vocabulary token %d is empty", t->name, (int)id);
        t->tok_off[id] = (uint32_t)off;
        t->tok_len[id] = (uint32_t)len;
        t->tok_kind[id] = TK_KIND_BPE;
        h[k] = tk_hash_bytes(t->bytes.data + off, len);
        tk_vocab_prefetch(t, h[k]);
    }
    for (size_t k = 0; k < n; k++) {
        /* Two entries with the same bytes: the first keeps the bytes -> id direction. */
        int32_t existing;
        q3_status st = tk_vocab_insert_h(t, ids[k], h[k], &existing);
        if (st != Q3_OK) return st;
    }
    return Q3_OK;
}

int tk_decode_merge(const char *a, size_t a_len, const char *b, size_t b_len, tk_buf *bytes, tk_merge_rec *rec)
{
    size_t bad_at, start = bytes->len;
    int r = tk_byte_level_decode(a, a_len, bytes, &bad_at);
    if (r) return r < 0 ? -1 : 1;
    size_t mid = bytes->len;
    r = tk_byte_level_decode(b, b_len, bytes, &bad_at);
    if (r) return r < 0 ? -1 : 2;
    rec->off = start;
    rec->a_len = (uint32_t)(mid - start);
    rec->b_len = (uint32_t)(bytes->len - mid);
    rec->ha = tk_hash_bytes(bytes->data + start, rec->a_len);
    rec->hb = tk_hash_bytes(bytes->data + mid, rec->b_len);
    return 0;
}

/* Shows bytes for a message: as text, at most 40 bytes. */
static const char *shown(const char *p, size_t n, char buf[48])
{
    size_t k = n > 40 ? 40 : n;
    memcpy(buf, p, k);
    buf[k] = 0;
    return buf;
}

q3_status tk_add_decoded_merges(q3_tokenizer *t, const char *base, const tk_merge_rec *recs, size_t n)
{
    for (size_t done = 0; done < n; done += TK_BATCH) {
        const tk_merge_rec *r = recs + done;
        size_t m = n - done < TK_BATCH ? n - done : TK_BATCH;
        int32_t left[TK_BATCH], right[TK_BATCH], merged[TK_BATCH];
        uint64_t hab[TK_BATCH];
        /* 1: prefetch the slots of both parts; check the likely id of the result. */
        for (size_t k = 0; k < m; k++) {
            tk_vocab_prefetch(t, r[k].ha);
            tk_vocab_prefetch(t, r[k].hb);
            /* Vocabularies made by BPE training list each merge's result in merge order
             * (Qwen's: id 256 + rank), so try the id after the previous result first. */
            int32_t g = t->merge_guess + (int32_t)k;
            size_t ab = (size_t)r[k].a_len + r[k].b_len;
            const char *bytes = base + r[k].off;
            merged[k] = -1;
            if (g < t->n_ids && t->tok_kind[g] == TK_KIND_BPE && t->tok_len[g] == ab &&
                memcmp(t->bytes.data + t->tok_off[g], bytes, ab) == 0)
                merged[k] = g;
            else
                tk_vocab_prefetch(t, hab[k] = tk_hash_bytes(bytes, ab));
        }
        /* 2: look the parts up. */
        for (size_t k = 0; k < m; k++) {
            const char *bytes = base + r[k].off;
            size_t ab = (size_t)r[k].a_len + r[k].b_len;
            left[k] = tk_vocab_find_h(t, bytes, r[k].a_len, r[k].ha);
            right[k] = tk_vocab_find_h(t, bytes + r[k].a_len, r[k].b_len, r[k].hb);
            if (merged[k] < 0) merged[k] = tk_vocab_find_h(t, bytes, ab, hab[k]);
            if (left[k] < 0 || right[k] < 0 || merged[k] < 0) {
                char b1[48], b2[48];
                const char *what = left[k] < 0 ? "its left part" : right[k] < 0 ? "its right part" : "the merged token";
                return q3_fail(Q3_ERR_FORMAT, "%s: merge %zu (\"%s\" + \"%s\"): %s is not in the vocabulary",
                               t->name, t->n_merges + k, shown(bytes, r[k].a_len, b1),
                               shown(bytes + r[k].a_len, r[k].b_len, b2), what);
            }
            tk_merge_prefetch(t, left[k], right[k]);
        }
        /* 3: insert, in order (the order is the rank). */
        for (size_t k = 0; k < m; k++) {
            q3_status st = tk_merge_insert(t, left[k], right[k], merged[k]);
            if (st != Q3_OK) return st;
        }
        t->merge_guess = merged[m - 1] + 1;
    }
    return Q3_OK;
}

q3_status tk_add_merge_batch(q3_tokenizer *t, const tk_str *a, const tk_str *b, size_t n)
{
    /* Decoded into scratch after the end of the token arena (dropped at the end). */
    tk_buf *arena = &t->bytes;
    size_t keep = arena->len;
    tk_merge_rec recs[TK_BATCH];
    if (n > TK_BATCH) return q3_fail(Q3_ERR_INVALID, "%s: merge batch of %zu", t->name, n);
    q3_status st = Q3_OK;
    for (size_t k = 0; k < n && st == Q3_OK; k++) {
        int r = tk_decode_merge(a[k].p, a[k].n, b[k].p, b[k].n, arena, &recs[k]);
        if (r < 0) st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
        else if (r)
            st = q3_fail(Q3_ERR_FORMAT,
                         "%s: merge %zu (\"%.*s\" \"%.*s\"): the %s part has a character outside the byte-level alphabet",
                         t->name, t->n_merges + k, (int)(a[k].n > 40 ? 40 : a[k].n), a[k].p,
                         (int)(b[k].n > 40 ? 40 : b[k].n), b[k].p, r == 1 ? "left" : "right");
    }
    if (st == Q3_OK) st = tk_add_decoded_merges(t, arena->data, recs, n);
    arena->len = keep;
    return st;
}

q3_status tk_add_added(q3_tokenizer *t, const char *content, size_t len, int32_t id, int special,
                       int lstrip, int rstrip)
{
    q3_status st = check_id(t, id, "added token", content, len);
    if (st != Q3_OK) return st;
    if (len == 0) return q3_fail(Q3_ERR_FORMAT, "%s: added token %d has empty content", t->name, (int)id);
    if (q3_utf8_validate(content, len) != len)
        return q3_fail(Q3_ERR_FORMAT, "%s: added token %d is not valid UTF-8", t->name, (int)id);
    if (t->tok_kind[id] == TK_KIND_ADDED || t->tok_kind[id] == TK_KIND_SPECIAL)
        return q3_fail(Q3_ERR_FORMAT, "%s: added token %d (\"%.*s\") is listed twice", t->name, (int)id,
                       (int)len, content);
    if (t->tok_kind[id] == TK_KIND_BPE) {
        /* Also in the vocabulary (allowed when it is the same text). */
        if (t->tok_len[id] != len || memcmp(t->bytes.data + t->tok_off[id], content, len) != 0)
            return q3_fail(Q3_ERR_FORMAT,
                           "%s: added token \"%.*s\" has id %d, which the vocabulary gives to another token",
                           t->name, (int)len, content, (int)id);
    } else {
        size_t off = t->bytes.len;
        if (off + len > UINT32_MAX) return q3_fail(Q3_ERR_FORMAT, "%s: vocabulary too large", t->name);
        if (tk_buf_append(&t->bytes, content, len)) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
        t->tok_off[id] = (uint32_t)off;
        t->tok_len[id] = (uint32_t)len;
    }
    t->tok_kind[id] = special ? TK_KIND_SPECIAL : TK_KIND_ADDED;

    tk_added *a = realloc(t->added, (t->n_added + 1) * sizeof *a);
    if (!a) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
    t->added = a;
    a[t->n_added++] = (tk_added){t->tok_off[id], (uint32_t)len, id, (uint8_t)!!special,
                                 (uint8_t)!!lstrip, (uint8_t)!!rstrip};
    return Q3_OK;
}

static int added_longest_first(const void *pa, const void *pb)
{
    const tk_added *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

q3_status tk_finish(q3_tokenizer *t, const char *pattern, int nfc)
{
    for (int b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        t->byte_id[b] = tk_vocab_find(t, &byte, 1);
        if (t->byte_id[b] < 0)
            return q3_fail(Q3_ERR_FORMAT,
                           "%s: the vocabulary has no token for the byte 0x%02X (byte-level BPE needs all 256)",
                           t->name, b);
    }
    q3_status st = tk_build_byte_pairs(t);
    if (st != Q3_OK) return st;
    /* Trim the id range to the largest id present. */
    int32_t n = t->n_ids;
    while (n > 0 && t->tok_kind[n - 1] == TK_KIND_NONE) n--;
    t->n_ids = n;

    if (t->n_added) /* qsort(NULL, 0, ...) is undefined: no added tokens, no array */
        qsort(t->added, t->n_added, sizeof *t->added, added_longest_first);
    t->added_one_first = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        unsigned char first = (unsigned char)t->bytes.data[t->added[i].off];
        t->added_first[first] = 1;
        t->added_one_first = i == 0 || t->added_one_first == first ? first : -2;
    }
    if (t->added_one_first < 0) t->added_one_first = -1;

    t->nfc = nfc;
    if (nfc) { /* builds the process-wide NFC table now rather than in the first encode */
        const char *r;
        size_t rl;
        tk_buf none = {0};
        tk_nfc("", 0, &none, &r, &rl);
    }
    return tk_splitter_init(&t->split, pattern, 1, t->name);
}

void q3_tokenizer_free(q3_tokenizer *t)
{
    if (!t) return;
    free(t->name);
    free(t->tok_off);
    free(t->tok_len);
    free(t->tok_kind);
    tk_buf_free(&t->bytes);
    free(t->vocab_slots);
    free(t->merge_slots);
    free(t->merge_result);
    free(t->byte_pair_rank);
    free(t->added);
    tk_splitter_free(&t->split);
    for (int i = 0; i < t->n_pool; i++) {
        tk_scratch_free(t->pool[i]);
        free(t->pool[i]);
    }
    pthread_mutex_destroy(&t->pool_lock);
    free(t);
}

/* ==== from parts ===================================================================== */

q3_status q3_tokenizer_from_parts(const q3_tokenizer_parts *p, const char *name, q3_tokenizer **out)
{
    *out = NULL;
    if (!name) name = "tokenizer";
    if (!p || (p->n_vocab && !p->vocab) || (p->n_merges && !p->merges) || (p->n_added && !p->added))
        return q3_fail(Q3_ERR_INVALID, "%s: tokenizer parts: a count is set but its array is NULL", name);
    if (p->n_vocab > TK_MAX_ID)
        return q3_fail(Q3_ERR_FORMAT, "%s: %zu vocabulary entries, more than %d", name, p->n_vocab, TK_MAX_ID);
    /* Before tk_new sizes the merge map from it (a uint32 table size, which a larger
     * count would wrap). */
    if (p->n_merges > TK_MAX_MERGES)
        return q3_fail(Q3_ERR_FORMAT, "%s: %zu merges, more than %d", name, p->n_merges, TK_MAX_MERGES);

    q3_tokenizer *t;
    q3_status st = tk_new(name, p->n_vocab, p->n_merges, &t);
    if (st != Q3_OK) return st;

    /* An id that is an added token takes the added token's content, not vocab[id]. */
    uint8_t *is_added = calloc(p->n_vocab + 1, 1);
    if (!is_added) {
        q3_tokenizer_free(t);
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", name);
    }
    for (size_t i = 0; i < p->n_added; i++)
        if (p->added[i].id >= 0 && (size_t)p->added[i].id < p->n_vocab) is_added[p->added[i].id] = 1;

    /* In batches, as the JSON reader does (see tk_add_vocab_batch). */
    tk_str a[TK_BATCH], b[TK_BATCH];
    int32_t ids[TK_BATCH];
    size_t k = 0;
    for (size_t i = 0; i < p->n_vocab && st == Q3_OK; i++) {
        if (p->vocab[i] && !is_added[i]) {
            a[k] = (tk_str){p->vocab[i], strlen(p->vocab[i])};
            ids[k++] = (int32_t)i;
        }
        if (k == TK_BATCH || (i + 1 == p->n_vocab && k)) {
            st = tk_add_vocab_batch(t, a, ids, k);
            k = 0;
        }
    }
    free(is_added);

    for (size_t i = 0; i < p->n_merges && st == Q3_OK; i++) {
        const char *m = p->merges[i];
        const char *sp = m ? strchr(m, ' ') : NULL;
        if (!sp || strchr(sp + 1, ' ') || sp == m || !sp[1]) {
            st = q3_fail(Q3_ERR_FORMAT, "%s: merge %zu (\"%s\") is not two tokens separated by one space",
                         name, i, m ? m : "(null)");
            break;
        }
        a[k] = (tk_str){m, (size_t)(sp - m)};
        b[k++] = (tk_str){sp + 1, strlen(sp + 1)};
        if (k == TK_BATCH || i + 1 == p->n_merges) {
            st = tk_add_merge_batch(t, a, b, k);
            k = 0;
        }
    }
    for (size_t i = 0; i < p->n_added && st == Q3_OK; i++) {
        const q3_added_token *a = &p->added[i];
        if (!a->content) st = q3_fail(Q3_ERR_FORMAT, "%s: added token %d has no content", name, (int)a->id);
        else st = tk_add_added(t, a->content, strlen(a->content), a->id, a->special, a->lstrip, a->rstrip);
    }
    if (st == Q3_OK) st = tk_finish(t, p->split_regex ? p->split_regex : TK_QWEN2_PATTERN, p->nfc);
    if (st != Q3_OK) {
        q3_tokenizer_free(t);
        return st;
    }
    *out = t;
    return Q3_OK;
}

/* ==== encode =========================================================================== */

void q3_tokens_free(q3_tokens *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

static inline int is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* An added token found in the text: it covers [start, end). */
typedef struct added_match {
    size_t start, end;
    int32_t id;
} added_match;

/* Spans of the text where special added tokens are not matched. */
typedef struct plain_spans {
    const q3_text_span *s;
    size_t n;
} plain_spans;

/* 1 if [start, end) overlaps one of the spans (sorted, not overlapping). */
static int overlaps_plain(const plain_spans *ps, size_t start, size_t end)
{
    if (!ps || !ps->n) return 0;
    size_t lo = 0, hi = ps->n; /* the first span that starts at or after end */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ps->s[mid].start < end) lo = mid + 1;
        else hi = mid;
    }
    return lo > 0 && ps->s[lo - 1].start + ps->s[lo - 1].len > start;
}

/* Finds the leftmost added token at or after `from` (the longest of those starting
 * there), with lstrip/rstrip whitespace folded in (lstrip never reaches before
 * `floor`). A special one is skipped with Q3_ENCODE_SPECIAL_AS_TEXT or where it
 * overlaps a plain span. Returns 0 if there is none. */
static int find_added(const q3_tokenizer *t, const char *text, size_t len, size_t from, size_t floor,
                      unsigned flags, const plain_spans *plain, added_match *m)
{
    if (!t->n_added) return 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t p = from; p < len; p++) {
        if (t->added_one_first >= 0) { /* all start with the same byte ('<' in Qwen): memchr */
            const unsigned char *q = memchr(s + p, t->added_one_first, len - p);
            if (!q) return 0;
            p = (size_t)(q - s);
        } else if (!t->added_first[s[p]]) {
            continue;
        }
        for (size_t k = 0; k < t->n_added; k++) {
            const tk_added *a = &t->added[k];
            if (a->special && (flags & Q3_ENCODE_SPECIAL_AS_TEXT)) continue;
            if (a->len > len - p || memcmp(s + p, t->bytes.data + a->off, a->len) != 0) continue;
            if (a->special && overlaps_plain(plain, p, p + a->len)) continue;
            size_t start = p, end = p + a->len;
            if (a->lstrip) {
                while (start > floor) {
                    size_t q = start - 1;
                    while (q > floor && (s[q] & 0xC0) == 0x80) q--;
                    uint32_t cp;
                    q3_utf8_decode_valid(s + q, &cp);
                    if (!is_white_space(cp)) break;
                    start = q;
                }
            }
            if (a->rstrip) {
                while (end < len) {
                    uint32_t cp;
                    int k2 = q3_utf8_decode_valid(s + end, &cp);
                    if (!is_white_space(cp)) break;
                    end += (size_t)k2;
                }
            }
            m->start = start;
            m->end = end;
            m->id = a->id;
            return 1;
        }
    }
    return 0;
}

/* A scratch from the tokenizer's pool, or a new one (NULL: out of memory). */
static tk_scratch *scratch_acquire(const q3_tokenizer *ct)
{
    q3_tokenizer *t = (q3_tokenizer *)ct; /* the pool is the mutable part (see tokenizer_impl.h) */
    tk_scratch *sc = NULL;
    pthread_mutex_lock(&t->pool_lock);
    if (t->n_pool) sc = t->pool[--t->n_pool];
    pthread_mutex_unlock(&t->pool_lock);
    return sc ? sc : calloc(1, sizeof *sc);
}

static void scratch_release(const q3_tokenizer *ct, tk_scratch *sc)
{
    q3_tokenizer *t = (q3_tokenizer *)ct;
    tk_scratch_trim(sc);
    pthread_mutex_lock(&t->pool_lock);
    if (t->n_pool < TK_POOL) {
        t->pool[t->n_pool++] = sc;
        sc = NULL;
    }
    pthread_mutex_unlock(&t->pool_lock);
    if (sc) {
        tk_scratch_free(sc);
        free(sc);
    }
}

/* Encodes text without added tokens: NFC, split, BPE each piece. */
static q3_status encode_plain(const q3_tokenizer *t, tk_scratch *sc, const char *text, size_t len,
                              q3_tokens *out)
{
    if (len == 0) return Q3_OK;
    const char *s = text;
    size_t n = len;
    if (t->nfc) {
        q3_status st = tk_nfc(text, len, &sc->nfc, &s, &n);
        if (st != Q3_OK) return st;
    }
    if (t->split.kind == TK_SPLIT_PCRE2 && !sc->md) {
        sc->md = pcre2_match_data_create_from_pattern(t->split.re, NULL);
        if (!sc->md) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
    }
    if (t->split.kind == TK_SPLIT_PCRE2 && !sc->mc) {
        sc->mc = pcre2_match_context_create(NULL);
        if (!sc->mc) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
        pcre2_set_depth_limit(sc->mc, TK_MATCH_DEPTH);
    }
    tk_split_iter it = {.sp = &t->split, .s = (const unsigned char *)s, .n = n, .md = sc->md, .mc = sc->mc};
    size_t ps, pe;
    int r;
    while ((r = tk_split_next(&it, &ps, &pe)) == 1) {
        q3_status st = tk_bpe_piece(t, sc, (const unsigned char *)s + ps, pe - ps, out);
        if (st != Q3_OK) return st;
    }
    return r < 0 ? q3_fail_wrap(Q3_ERR_INVALID, "%s", t->name) : Q3_OK;
}

static q3_status encode(const q3_tokenizer *t, const char *text, size_t len, unsigned flags,
                        const plain_spans *plain, q3_tokens *out)
{
    if (!text && len) return q3_fail(Q3_ERR_INVALID, "encode: text is NULL");
    size_t bad = q3_utf8_validate(text, len);
    if (bad < len)
        return q3_fail(Q3_ERR_INVALID, "encode: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                       (unsigned)(unsigned char)text[bad]);
    size_t n0 = out->n;
    tk_scratch *sc = scratch_acquire(t);
    if (!sc) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
    q3_status st = Q3_OK;
    size_t pos = 0;
    while (pos < len && st == Q3_OK) {
        added_match m = {0};
        int found = find_added(t, text, len, pos, pos, flags, plain, &m);
        size_t plain_end = found ? m.start : len;
        st = encode_plain(t, sc, text + pos, plain_end - pos, out);
        if (st == Q3_OK && found) {
            if (tk_tokens_reserve(out, 1)) st = q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
            else out->ids[out->n++] = m.id;
        }
        pos = found ? m.end : len;
    }
    scratch_release(t, sc);
    if (st != Q3_OK) out->n = n0;
    return st;
}

q3_status q3_tokenizer_encode_append(const q3_tokenizer *t, const char *text, size_t len,
                                     unsigned flags, q3_tokens *out)
{
    return encode(t, text, len, flags, NULL, out);
}

q3_status q3_tokenizer_encode_spans(const q3_tokenizer *t, const char *text, size_t len,
                                    const q3_text_span *plain, size_t n_plain, q3_tokens *out)
{
    if (!plain && n_plain) return q3_fail(Q3_ERR_INVALID, "encode: plain spans are NULL");
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].start > len || plain[i].len > len - plain[i].start ||
            (i && plain[i].start < plain[i - 1].start + plain[i - 1].len))
            return q3_fail(Q3_ERR_INVALID, "encode: plain span %zu is outside the text or out of order", i);
    plain_spans ps = {plain, n_plain};
    return encode(t, text, len, Q3_ENCODE_DEFAULT, &ps, out);
}

q3_status q3_tokenizer_encode(const q3_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                              size_t *n_ids)
{
    q3_tokens toks = {0};
    Q3_NOT_NULL(ids);
    Q3_NOT_NULL(n_ids);
    *ids = NULL;
    *n_ids = 0;
    Q3_NOT_NULL(t);
    if (len && !text) return q3_fail(Q3_ERR_INVALID, "q3_tokenizer_encode: text is NULL");
    if (flags & ~(unsigned)Q3_ENCODE_SPECIAL_AS_TEXT) return q3_fail(Q3_ERR_INVALID, "q3_tokenizer_encode: unknown flags 0x%x", flags);
    q3_status st = q3_tokenizer_encode_append(t, text ? text : "", len, flags, &toks);
    if (st != Q3_OK) {
        q3_tokens_free(&toks);
        return st;
    }
    *ids = toks.ids;
    *n_ids = toks.n;
    return Q3_OK;
}

/* ==== decode ============================================================================ */

static q3_status check_decode_id(const q3_tokenizer *t, int32_t id, size_t at)
{
    if (id < 0 || id >= t->n_ids || t->tok_kind[id] == TK_KIND_NONE)
        return q3_fail(Q3_ERR_INVALID, "decode: id %d (at position %zu) is not a token (vocabulary: 0..%d)",
                       (int)id, at, (int)t->n_ids - 1);
    return Q3_OK;
}

q3_status q3_tokenizer_decode(const q3_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len)
{
    Q3_NOT_NULL(text);
    *text = NULL;
    if (len) *len = 0;
    Q3_NOT_NULL(t);
    if (n && !ids) return q3_fail(Q3_ERR_INVALID, "q3_tokenizer_decode: ids is NULL");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        q3_status st = check_decode_id(t, ids[i], i);
        if (st != Q3_OK) return st;
        total += t->tok_len[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) return q3_fail(Q3_ERR_NOMEM, "decode: out of memory for %zu bytes", total);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + w, t->bytes.data + t->tok_off[ids[i]], t->tok_len[ids[i]]);
        w += t->tok_len[ids[i]];
    }
    buf[w] = 0;
    *text = buf;
    if (len) *len = w;
    return Q3_OK;
}

/* ==== streaming detokenizer =============================================================== */

void q3_detok_init(q3_detok *d, const q3_tokenizer *tok)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
}

void q3_detok_free(q3_detok *d)
{
    free(d->buf);
    memset(d, 0, sizeof *d);
}

/* Emits the held bytes followed by in[0..n) into d->buf: whole characters pass, bad
 * bytes become U+FFFD, an unfinished character at the end is held back (if final,
 * it becomes U+FFFD too). */
static q3_status detok_emit(q3_detok *d, const char *in, size_t n, int final, const char **text, size_t *len)
{
    size_t total = d->n_held + n;
    size_t need = 4 * total + 4; /* output (<= 3 bytes per input byte) then the input */
    if (need > d->cap) {
        char *p = realloc(d->buf, need);
        if (!p) return q3_fail(Q3_ERR_NOMEM, "detokenizer: out of memory");
        d->buf = p;
        d->cap = need;
    }
    unsigned char *src = (unsigned char *)d->buf + 3 * total + 3;
    memcpy(src, d->held, d->n_held);
    if (n) memcpy(src + d->n_held, in, n);
    d->n_held = 0;

    char *dst = d->buf;
    size_t i = 0, w = 0;
    while (i < total) {
        uint32_t cp;
        int k = q3_utf8_next(src + i, total - i, &cp);
        if (k > 0) {
            memcpy(dst + w, src + i, (size_t)k);
            w += (size_t)k;
            i += (size_t)k;
        } else if (k == 0 && !final) {
            d->n_held = total - i; /* <= 3 */
            memcpy(d->held, src + i, d->n_held);
            break;
        } else {
            memcpy(dst + w, Q3_UTF8_REPLACEMENT, 3);
            w += 3;
            i += k < 0 ? (size_t)-k : total - i;
        }
    }
    *text = dst;
    *len = w;
    return Q3_OK;
}

q3_status q3_detok_push(q3_detok *d, int32_t id, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    q3_status st = check_decode_id(d->tok, id, 0);
    if (st != Q3_OK) return st;
    const q3_tokenizer *t = d->tok;
    return detok_emit(d, t->bytes.data + t->tok_off[id], t->tok_len[id], 0, text, len);
}

q3_status q3_detok_flush(q3_detok *d, const char **text, size_t *len)
{
    return detok_emit(d, NULL, 0, 1, text, len);
}

/* ==== lookups =============================================================================== */

int32_t q3_tokenizer_vocab_size(const q3_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t q3_tokenizer_token_id(const q3_tokenizer *t, const char *text, size_t len)
{
    if (!t || (len && !text)) return -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->bytes.data + t->added[i].off, text, len) == 0)
            return t->added[i].id;
    return len ? tk_vocab_find(t, text, len) : -1;
}

const char *q3_tokenizer_token_bytes(const q3_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || t->tok_kind[id] == TK_KIND_NONE) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_len[id];
    return t->bytes.data + t->tok_off[id];
}

int q3_tokenizer_is_added(const q3_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->tok_kind[id] >= TK_KIND_ADDED;
}

int q3_tokenizer_is_special(const q3_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_ids && t->tok_kind[id] == TK_KIND_SPECIAL;
}

/* ==== the public detokenizer and the turn-ending ids ===================================== */

struct q3_detokenizer {
    q3_detok d;
};

q3_status q3_detokenizer_new(const q3_tokenizer *tok, q3_detokenizer **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(tok);
    *out = calloc(1, sizeof **out);
    if (!*out) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    q3_detok_init(&(*out)->d, tok);
    return Q3_OK;
}

q3_status q3_detokenizer_push(q3_detokenizer *d, int32_t id, const char **text, size_t *len)
{
    Q3_NOT_NULL(d);
    Q3_NOT_NULL(text);
    Q3_NOT_NULL(len);
    return q3_detok_push(&d->d, id, text, len);
}

q3_status q3_detokenizer_flush(q3_detokenizer *d, const char **text, size_t *len)
{
    Q3_NOT_NULL(d);
    Q3_NOT_NULL(text);
    Q3_NOT_NULL(len);
    return q3_detok_flush(&d->d, text, len);
}

void q3_detokenizer_free(q3_detokenizer *d)
{
    if (!d) return;
    q3_detok_free(&d->d);
    free(d);
}

int32_t q3_tokenizer_end_of_turn(const q3_tokenizer *tok) { return q3_tokenizer_token_id(tok, "<|im_end|>", 10); }
int32_t q3_tokenizer_end_of_text(const q3_tokenizer *tok) { return q3_tokenizer_token_id(tok, "<|endoftext|>", 13); }

q3_status q3_tokenizer_piece(const q3_tokenizer *tok, int32_t id, const char **bytes, size_t *len)
{
    Q3_NOT_NULL(bytes);
    Q3_NOT_NULL(len);
    *bytes = NULL;
    *len = 0;
    Q3_NOT_NULL(tok);
    *bytes = q3_tokenizer_token_bytes(tok, id, len);
    if (!*bytes) return q3_fail(Q3_ERR_INVALID, "token id %d is not in the vocabulary [0, %d)", id, q3_tokenizer_vocab_size(tok));
    return Q3_OK;
}
