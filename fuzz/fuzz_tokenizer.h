/* Tokenizer oracles shared by fuzz_tokenizer_json and fuzz_tokenize: NFC from
 * utf8proc over the whole text (q3 normalises segment by segment), the text a
 * round trip must give back, and the decode / streaming-decode checks. */
#ifndef Q3_FUZZ_TOKENIZER_H
#define Q3_FUZZ_TOKENIZER_H

#include <utf8proc.h>

#include "fuzz_common.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"

/* Whether valid UTF-8 s[0..n) holds a code point that Unicode 9.0 (the reference
 * tokenizer's NFC tables) did not assign but utf8proc's newer tables treat as a
 * combining or composing character. q3 follows the reference there, utf8proc does
 * not, so utf8proc cannot be the NFC oracle for such text. */
static int fuzz_has_post_unicode9_mark(const char *s, size_t n)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return 0;
        if (tk_nfc_newer_than_unicode9((uint32_t)cp)) return 1;
        i += (size_t)k;
    }
    return 0;
}

/* NFC of s[0..n) (valid UTF-8, NULs allowed) into a new buffer; NULL on failure
 * or where utf8proc is no oracle (fuzz_has_post_unicode9_mark). */
static char *fuzz_nfc(const char *s, size_t n, size_t *out_len)
{
    if (fuzz_has_post_unicode9_mark(s, n)) return NULL;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)(n ? s : ""), (utf8proc_ssize_t)n, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) {
        free(dst);
        return NULL;
    }
    *out_len = (size_t)r;
    return (char *)dst;
}

/* The added tokens of tok (ids and contents), for the expected round trip. */
typedef struct fuzz_added {
    const char *s;
    size_t n;
    int32_t id;
    int special;
} fuzz_added;

static size_t fuzz_added_list(const q3_tokenizer *tok, fuzz_added *list, size_t cap)
{
    size_t k = 0;
    int32_t n = q3_tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < n && k < cap; id++) {
        if (!q3_tokenizer_is_added(tok, id)) continue;
        size_t len;
        const char *s = q3_tokenizer_token_bytes(tok, id, &len);
        if (s && len) list[k++] = (fuzz_added){s, len, id, q3_tokenizer_is_special(tok, id)};
    }
    return k;
}

/* What decode(encode(text)) must be when no added token strips whitespace:
 * the text cut at added-token matches (leftmost, then longest; special ones
 * skipped with Q3_ENCODE_SPECIAL_AS_TEXT), each gap in NFC (when nfc), each
 * match as it is. NULL if NFC failed. */
static char *fuzz_expected_text(const fuzz_added *added, size_t n_added, int skip_special, int nfc,
                                const char *text, size_t len, size_t *out_len)
{
    char *out = malloc(4 * len + 16);
    size_t w = 0, gap = 0, p = 0;
    if (!out) return NULL;
    for (;;) {
        size_t best = 0;
        if (p < len)
            for (size_t k = 0; k < n_added; k++) {
                if (skip_special && added[k].special) continue;
                if (added[k].n > best && added[k].n <= len - p && !memcmp(text + p, added[k].s, added[k].n))
                    best = added[k].n;
            }
        if (best || p >= len) {
            if (p > gap) {
                size_t nl = p - gap;
                char *g = nfc ? fuzz_nfc(text + gap, p - gap, &nl) : NULL;
                if (nfc && !g) {
                    free(out);
                    return NULL;
                }
                if (nl > 4 * len + 16 - w) { /* NFC grows UTF-8 text at most 3x */
                    free(g);
                    free(out);
                    return NULL;
                }
                memcpy(out + w, g ? g : text + gap, nl);
                w += nl;
                free(g);
            }
            if (p >= len) break;
            memcpy(out + w, text + p, best);
            w += best;
            p += best;
            gap = p;
        } else {
            p++;
        }
    }
    *out_len = w;
    return out;
}

/* Decodes ids both ways and checks them: q3_tokenizer_decode gives the tokens'
 * bytes; the streaming detokenizer always gives valid UTF-8, equal to the
 * decoded bytes whenever those are valid UTF-8. Returns the decoded text (caller
 * frees) or NULL if an id is not a token (then decode must fail, and so must the
 * stream at that id). */
static char *fuzz_check_decode(const q3_tokenizer *tok, const int32_t *ids, size_t n, size_t *out_len)
{
    char *text = NULL;
    size_t len = 0;
    q3_status st = q3_tokenizer_decode(tok, ids, n, &text, &len);
    int all_valid = 1;
    size_t want = 0;
    for (size_t i = 0; i < n; i++) {
        size_t tl = 0;
        const char *tb = q3_tokenizer_token_bytes(tok, ids[i], &tl);
        if (!tb) all_valid = 0;
        want += tl;
    }
    if (!all_valid) {
        FUZZ_CHECK(st == Q3_ERR_INVALID && text == NULL, "decode of a non-token id: %s", q3_status_name(st));
        free(text);
        text = NULL;
    } else {
        FUZZ_CHECK(st == Q3_OK && text && len == want && text[len] == 0, "decode: %s, %zu bytes for %zu",
                   q3_status_name(st), len, want);
        if (st != Q3_OK) {
            free(text);
            text = NULL;
        }
    }

    q3_detok d;
    q3_detok_init(&d, tok);
    char *stream = malloc(3 * want + 3 * n + 16);
    size_t sw = 0;
    for (size_t i = 0; i < n && stream; i++) {
        const char *piece;
        size_t pl;
        st = q3_detok_push(&d, ids[i], &piece, &pl);
        size_t tl;
        if (!q3_tokenizer_token_bytes(tok, ids[i], &tl)) {
            FUZZ_CHECK(st == Q3_ERR_INVALID && pl == 0, "detok accepted id %d", (int)ids[i]);
            continue;
        }
        FUZZ_CHECK(st == Q3_OK, "detok push %d: %s", (int)ids[i], q3_last_error());
        FUZZ_CHECK(fuzz_utf8_valid(piece, pl), "detok gave invalid UTF-8 for id %d", (int)ids[i]);
        memcpy(stream + sw, piece, pl);
        sw += pl;
    }
    if (stream) {
        const char *piece;
        size_t pl;
        st = q3_detok_flush(&d, &piece, &pl);
        FUZZ_CHECK(st == Q3_OK && fuzz_utf8_valid(piece, pl), "detok flush");
        if (st == Q3_OK) {
            memcpy(stream + sw, piece, pl);
            sw += pl;
        }
        if (text && fuzz_utf8_valid(text, len))
            FUZZ_CHECK(sw == len && !memcmp(stream, text, len), "streamed text differs from decode");
    }
    free(stream);
    q3_detok_free(&d);
    *out_len = len;
    return text;
}

/* Encodes text (with flags) after one sentinel id and checks: invalid UTF-8
 * fails with Q3_ERR_INVALID leaving the ids as they were; valid text gives
 * ids that are tokens, never a special token with Q3_ENCODE_SPECIAL_AS_TEXT,
 * and (when expect is non-NULL) decodes to exactly expect. Returns the status. */
static q3_status fuzz_check_encode(const q3_tokenizer *tok, const char *text, size_t len, unsigned flags,
                                   const char *expect, size_t expect_len)
{
    q3_tokens toks = {0};
    toks.ids = malloc(sizeof *toks.ids * 4);
    toks.cap = 4;
    toks.ids[0] = 12345;
    toks.n = 1;
    q3_status st = q3_tokenizer_encode_append(tok, text, len, flags, &toks);
    int valid = fuzz_utf8_valid(text, len);
    if (!valid) {
        FUZZ_CHECK(st == Q3_ERR_INVALID, "invalid UTF-8 encoded with %s", q3_status_name(st));
        FUZZ_CHECK(toks.n == 1 && toks.ids[0] == 12345, "a failed encode changed the ids");
    } else if (st == Q3_OK) {
        FUZZ_CHECK(toks.n >= 1 && toks.ids[0] == 12345, "encode_append did not append");
        FUZZ_CHECK(len == 0 || toks.n > 1, "non-empty text gave no ids");
        for (size_t i = 1; i < toks.n; i++) {
            size_t tl;
            FUZZ_CHECK(q3_tokenizer_token_bytes(tok, toks.ids[i], &tl) != NULL, "encode gave non-token %d",
                       (int)toks.ids[i]);
            if (flags & Q3_ENCODE_SPECIAL_AS_TEXT)
                FUZZ_CHECK(!q3_tokenizer_is_special(tok, toks.ids[i]), "special token %d from untrusted text",
                           (int)toks.ids[i]);
        }
        size_t dl = 0;
        char *dec = fuzz_check_decode(tok, toks.ids + 1, toks.n - 1, &dl);
        if (expect && dec)
            FUZZ_CHECK(dl == expect_len && !memcmp(dec, expect, dl), "decode(encode(text)) is not the text");
        free(dec);
    } else {
        FUZZ_CHECK_FAILURE(st);
        FUZZ_CHECK(toks.n == 1 && toks.ids[0] == 12345, "a failed encode changed the ids");
    }
    q3_tokens_free(&toks);
    return st;
}

#endif
