/* The pre-tokenizer: splits text into pieces with the split regex of tokenizer.json.
 *
 * Two engines, same answers:
 *   - PCRE2 (UTF + UCP, JIT), for any pattern. The reference's `\s` is Unicode
 *     White_Space; PCRE2's is not (it adds U+180E, and with UCP differs elsewhere), so
 *     `\s`/`\S` are rewritten into explicit White_Space classes before compiling.
 *   - a hand-written matcher for Qwen2's pattern, taken when the file's pattern is
 *     exactly that one: no regex engine calls per piece, and its \p{L}/\p{N} come from
 *     utf8proc (a newer Unicode than PCRE2 10.42's, closer to the reference's 16.0). */
#include <pthread.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"
#include "util/error.h"

/* ==== character classes ===================================================== */

enum { C_L = 1, C_N = 2, C_WS = 4, C_CRLF = 8 }; /* C_CRLF implies C_WS; 0: anything else */

/* ASCII: letters, digits, White_Space (\t \n \v \f \r and space), CR/LF. */
static const unsigned char ascii_class[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 12, 4, 4, 12, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0,
};

/* Unicode White_Space outside ASCII: U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000. (Not U+180E, not U+FEFF.) */
static inline int is_white_space_nonascii(uint32_t cp)
{
    if (cp < 0x1680) return cp == 0x85 || cp == 0xA0;
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static unsigned class_from_utf8proc(uint32_t cp)
{
    if (is_white_space_nonascii(cp)) return C_WS;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return C_L;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return C_N;
    default:
        return 0;
    }
}

/* The classes of the Basic Multilingual Plane, one byte each (64 KB, built once per
 * process on first use: CJK and other non-ASCII text then costs a table lookup a
 * character instead of a call into utf8proc). */
static unsigned char bmp_class[0x10000];
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static void build_bmp_class(void)
{
    for (uint32_t cp = 0; cp < 0x10000; cp++)
        bmp_class[cp] = (unsigned char)(cp < 0x80 ? ascii_class[cp] : class_from_utf8proc(cp));
}

static inline unsigned class_of_cp(uint32_t cp)
{
    if (cp < 0x80) return ascii_class[cp];
    if (cp < 0x10000) {
        pthread_once(&bmp_once, build_bmp_class);
        return bmp_class[cp];
    }
    return class_from_utf8proc(cp);
}

/* The class of the character at s[i] (valid UTF-8, i < n); its length in *len. */
static inline __attribute__((always_inline)) unsigned class_at(const unsigned char *s, size_t i, int *len)
{
    if (s[i] < 0x80) { *len = 1; return ascii_class[s[i]]; }
    uint32_t cp;
    *len = q3_utf8_decode_valid(s + i, &cp);
    return class_of_cp(cp);
}

/* End of the run of characters starting at i whose class has a bit of `mask` set
 * (or, with invert, has none of them). */
static inline __attribute__((always_inline)) size_t run_end(const unsigned char *s, size_t n, size_t i, unsigned mask, int invert)
{
    while (i < n) {
        if (s[i] < 0x80) {
            unsigned c = ascii_class[s[i]];
            if (((c & mask) != 0) == invert) break;
            i++;
            continue;
        }
        int len;
        unsigned c = class_at(s, i, &len);
        if (((c & mask) != 0) == invert) break;
        i += (size_t)len;
    }
    return i;
}

/* ==== the Qwen2 matcher ======================================================= */

/* Pattern, alternative by alternative (the first that matches wins, as in a
 * backtracking engine):
 *   1  (?i:'s|'t|'re|'ve|'m|'ll|'d)
 *   2  [^\r\n\p{L}\p{N}]?\p{L}+
 *   3  \p{N}
 *   4   ?[^\s\p{L}\p{N}]+[\r\n]*
 *   5  \s*[\r\n]+
 *   6  \s+(?!\S)
 *   7  \s+
 * Every character is matched by one of 2..7, so the pieces cover the text. */

/* Length of a contraction suffix at s[i..n) (the part after the apostrophe), 0 if none.
 * Case-insensitive as Unicode simple folding has it: 's' also matches U+017F (ſ). */
static size_t contraction_len(const unsigned char *s, size_t n, size_t i)
{
    if (i >= n) return 0;
    unsigned c = s[i] | 0x20; /* ASCII lower case (harmless for the bytes compared below) */
    if (s[i] < 0x80) {
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return 1;
        if (i + 1 < n && s[i + 1] < 0x80) {
            unsigned d = s[i + 1] | 0x20;
            if ((c == 'r' || c == 'v') && d == 'e') return 2;
            if (c == 'l' && d == 'l') return 2;
        }
        return 0;
    }
    if (s[i] == 0xC5 && i + 1 < n && s[i + 1] == 0xBF) return 2; /* U+017F LATIN SMALL LETTER LONG S */
    return 0;
}

size_t tk_qwen2_piece_end(const unsigned char *s, size_t n, size_t pos)
{
    /* 1: contractions */
    if (s[pos] == '\'') {
        size_t k = contraction_len(s, n, pos + 1);
        if (k) return pos + 1 + k;
    }
    int len0;
    unsigned c0 = class_at(s, pos, &len0);
    size_t after0 = pos + (size_t)len0;

    /* 2: an optional non-letter, non-digit, non-CR/LF, then letters */
    if (c0 & C_L) return run_end(s, n, after0, C_L, 0);
    if (!(c0 & (C_N | C_CRLF)) && after0 < n) {
        int len1;
        if (class_at(s, after0, &len1) & C_L) return run_end(s, n, after0 + (size_t)len1, C_L, 0);
    }

    /* 3: one digit */
    if (c0 & C_N) return after0;

    /* 4: an optional space, then symbols, then CR/LFs */
    size_t p = pos;
    unsigned c = c0;
    if (s[pos] == ' ' && after0 < n) {
        int len1;
        unsigned c1 = class_at(s, after0, &len1);
        if (!(c1 & (C_WS | C_L | C_N))) p = after0, c = c1;
    }
    if (!(c & (C_WS | C_L | C_N))) {
        size_t e = run_end(s, n, p, C_WS | C_L | C_N, 1);
        while (e < n && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }

    /* c0 is White_Space from here on. */
    size_t ws_end = pos, last_start = pos, last_crlf_end = 0;
    while (ws_end < n) {
        int len;
        unsigned cc = class_at(s, ws_end, &len);
        if (!(cc & C_WS)) break;
        last_start = ws_end;
        ws_end += (size_t)len;
        if (cc & C_CRLF) last_crlf_end = ws_end;
    }
    /* 5: whitespace up to and including its last CR/LF */
    if (last_crlf_end) return last_crlf_end;
    /* 6: whitespace not followed by a non-space: all of it at the end of the text,
     *    else all but its last character */
    if (ws_end == n) return n;
    if (last_start > pos) return last_start;
    /* 7: the single whitespace character before a non-space */
    return ws_end;
}

/* ==== PCRE2 ===================================================================== */

/* Unicode White_Space as the inside of a PCRE2 character class. */
#define WS_CLASS_BODY "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Rewrites \s and \S of a Rust-syntax pattern for PCRE2 (see the top of the file).
 * Returns Q3_OK with the new pattern in out (NUL-terminated). */
static q3_status rewrite_whitespace(const char *pattern, tk_buf *out, const char *name)
{
    /* Inside a class, `members` counts what it holds so far: a ']' first is literal. */
    int in_class = 0, members = 0, negated = 0;
    for (size_t i = 0; pattern[i]; i++) {
        char ch = pattern[i];
        int fail;
        if (ch == '\\' && pattern[i + 1]) {
            char e = pattern[++i];
            if (e == 's') {
                fail = in_class ? tk_buf_append(out, WS_CLASS_BODY, strlen(WS_CLASS_BODY))
                                : tk_buf_append(out, "[" WS_CLASS_BODY "]", strlen(WS_CLASS_BODY) + 2);
            } else if (e == 'S') {
                if (in_class)
                    return q3_fail(Q3_ERR_UNSUPPORTED,
                                   "%s: pre-tokenizer pattern: \\S inside a character class is not supported",
                                   name);
                fail = tk_buf_append(out, "[^" WS_CLASS_BODY "]", strlen(WS_CLASS_BODY) + 3);
            } else {
                char esc[2] = {'\\', e};
                fail = tk_buf_append(out, esc, 2);
            }
            members++;
        } else {
            if (!in_class && ch == '[') {
                in_class = 1, members = 0, negated = 0;
            } else if (in_class && ch == '^' && members == 0 && !negated) {
                negated = 1;
            } else if (in_class && ch == ']' && members > 0) {
                in_class = 0;
            } else {
                members++;
            }
            fail = tk_buf_append(out, &ch, 1);
        }
        if (fail) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", name);
    }
    if (tk_buf_append(out, "", 1)) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", name);
    return Q3_OK;
}

q3_status tk_splitter_init(tk_splitter *sp, const char *pattern, int use_fast, const char *name)
{
    memset(sp, 0, sizeof *sp);
    if (!pattern) {
        sp->kind = TK_SPLIT_NONE;
        return Q3_OK;
    }
    tk_buf rewritten = {0};
    q3_status st = rewrite_whitespace(pattern, &rewritten, name);
    if (st != Q3_OK) {
        tk_buf_free(&rewritten);
        return st;
    }
    int err;
    PCRE2_SIZE err_off;
    sp->re = pcre2_compile((PCRE2_SPTR)rewritten.data, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                           &err, &err_off, NULL);
    tk_buf_free(&rewritten);
    if (!sp->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return q3_fail(Q3_ERR_UNSUPPORTED, "%s: pre-tokenizer pattern does not compile: %s (pattern %s)",
                       name, (const char *)msg, pattern);
    }
    sp->jit = pcre2_jit_compile(sp->re, PCRE2_JIT_COMPLETE) == 0;
    sp->kind = use_fast && strcmp(pattern, TK_QWEN2_PATTERN) == 0 ? TK_SPLIT_QWEN2 : TK_SPLIT_PCRE2;
    return Q3_OK;
}

void tk_splitter_free(tk_splitter *sp)
{
    if (sp->re) pcre2_code_free(sp->re);
    memset(sp, 0, sizeof *sp);
}

/* One match call from `from` under the match limit `limit` (when it->mc is set). */
static int match_call(tk_split_iter *it, size_t from, uint32_t limit)
{
    const tk_splitter *sp = it->sp;
    if (it->mc) pcre2_set_match_limit(it->mc, limit);
    int rc = sp->jit ? pcre2_jit_match(sp->re, it->s, it->n, from, 0, it->md, it->mc)
                     : pcre2_match(sp->re, it->s, it->n, from, PCRE2_NO_UTF_CHECK, it->md, it->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* a long backtrack: the interpreter uses the heap */
        rc = pcre2_match(sp->re, it->s, it->n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, it->md, it->mc);
    return rc;
}

/* The next non-empty match at or after `from`; 1 found, 0 none, -1 error.
 * The match limit starts at TK_MATCH_BASE and doubles while PCRE2 reports it hit,
 * up to what the rest of the text allows; a call that needed more than
 * TK_MATCH_BASE + TK_MATCH_PER_BYTE steps per byte it consumed is refused, so the
 * whole split takes at most a constant number of steps per byte. */
static int pcre2_next_match(tk_split_iter *it, size_t from, size_t *ms, size_t *me)
{
    while (from < it->n) {
        uint64_t cap64 = 2 * ((uint64_t)TK_MATCH_BASE + (uint64_t)TK_MATCH_PER_BYTE * (it->n - from));
        uint32_t cap = cap64 > UINT32_MAX ? UINT32_MAX : (uint32_t)cap64;
        uint32_t limit = TK_MATCH_BASE;
        int rc;
        while ((rc = match_call(it, from, limit)) == PCRE2_ERROR_MATCHLIMIT && it->mc && limit < cap)
            limit = limit > cap / 2 ? cap : 2 * limit;
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) {
            q3_fail(Q3_ERR_INVALID,
                    "the pre-tokenizer pattern backtracks too much at byte %zu (%s; q3 allows %u steps "
                    "plus %u per byte of text): this tokenizer's split pattern is not usable",
                    from, rc == PCRE2_ERROR_MATCHLIMIT ? "over the match limit" : "over the depth limit",
                    TK_MATCH_BASE, TK_MATCH_PER_BYTE);
            return -1;
        }
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            q3_fail(Q3_ERR_INVALID, "pre-tokenizer regex failed at byte %zu: %s", from, (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(it->md);
        size_t consumed = rc == PCRE2_ERROR_NOMATCH ? it->n - from : (size_t)ov[1] - from;
        if (consumed == 0) consumed = 1; /* an empty match moves on one character */
        /* the call at limit/2 failed: it took more than that */
        if (limit > TK_MATCH_BASE &&
            limit / 2 > (uint64_t)TK_MATCH_BASE + (uint64_t)TK_MATCH_PER_BYTE * consumed) {
            q3_fail(Q3_ERR_INVALID,
                    "the pre-tokenizer pattern backtracks too much at byte %zu (over %u steps for %zu "
                    "bytes; q3 allows %u plus %u per byte): this tokenizer's split pattern is not usable",
                    from, limit / 2, consumed, TK_MATCH_BASE, TK_MATCH_PER_BYTE);
            return -1;
        }
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        /* An empty match: look again one character further on. */
        from = ov[0] + 1;
        while (from < it->n && (it->s[from] & 0xC0) == 0x80) from++;
    }
    return 0;
}

int tk_split_next(tk_split_iter *it, size_t *start, size_t *end)
{
    if (it->pos >= it->n) return 0;
    switch (it->sp->kind) {
    case TK_SPLIT_NONE:
        *start = it->pos;
        *end = it->pos = it->n;
        return 1;
    case TK_SPLIT_QWEN2:
        *start = it->pos;
        *end = it->pos = tk_qwen2_piece_end(it->s, it->n, it->pos);
        return 1;
    case TK_SPLIT_PCRE2:
        break;
    }
    if (it->have_next) {
        it->have_next = 0;
        *start = it->next_s;
        *end = it->pos = it->next_e;
        return 1;
    }
    size_t ms, me;
    int r = pcre2_next_match(it, it->pos, &ms, &me);
    if (r < 0) return -1;
    if (r == 0) { /* the rest is a gap */
        *start = it->pos;
        *end = it->pos = it->n;
        return 1;
    }
    if (ms > it->pos) { /* the gap first, the match next time */
        *start = it->pos;
        *end = it->pos = ms;
        it->next_s = ms;
        it->next_e = me;
        it->have_next = 1;
        return 1;
    }
    *start = ms;
    *end = it->pos = me;
    return 1;
}
