/* NFC, done only where it can change something.
 *
 * A "stable" character is a starter (canonical combining class 0) that NFC keeps as
 * it is and that never combines with a character before it. NFC never acts across a
 * stable character, so the text splits, before each stable character, into segments
 * that normalise independently; a segment made of one stable character is already
 * NFC. Only the other segments (a character followed by combining marks, Hangul
 * jamo, ...) go through utf8proc. Text that is all stable -- ASCII, most prose, CJK,
 * emoji -- is returned as is, without a copy.
 *
 * Which characters are stable is worked out once per process from utf8proc's own
 * tables: a character is unstable if its combining class is not 0, if NFC changes it
 * on its own, or if it appears after the first position of some canonical
 * decomposition (it may then be the second half of a composition).
 *
 * One deliberate difference from utf8proc_NFC: the reference tokenizer normalises with
 * Unicode 9.0 tables, where characters assigned later are plain starters that never
 * reorder, decompose or compose. The characters below are those utf8proc treats
 * otherwise; they are made stable here, so they pass through untouched and split
 * segments exactly as the reference's tables have it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"
#include "util/error.h"

/* ==== the table of unstable characters ========================================== */

/* Code points that utf8proc 2.8 (Unicode 15) finds unstable but Unicode 9.0 did not
 * assign (from Perl's \p{Present_In: 9.0}): later combining marks (U+07FD, U+0C3C,
 * U+1AC1, ...) and the second halves of later compositions (U+11930, ...). */
static const uint32_t newer_than_unicode_9[][2] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},     {0xC3C, 0xC3C},
    {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},
    {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34},
    {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97},
    {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE},
    {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

/* Canonical decompositions stop at U+2FA1D; above this, stability is ccc == 0. */
#define NFC_TABLE_LIMIT 0x30000u

static uint8_t unstable_bits[NFC_TABLE_LIMIT / 8];
static uint8_t newer_bits[NFC_TABLE_LIMIT / 8]; /* newer_than_unicode_9 */
static pthread_once_t unstable_once = PTHREAD_ONCE_INIT;

static void mark_unstable(uint32_t cp)
{
    if (cp < NFC_TABLE_LIMIT) unstable_bits[cp >> 3] |= (uint8_t)(1u << (cp & 7));
}

static void build_unstable_table(void)
{
    for (uint32_t cp = 0x80; cp < NFC_TABLE_LIMIT; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->combining_class != 0) mark_unstable(cp);
        if (p->decomp_seqindex == UINT16_MAX && !(cp >= 0xAC00 && cp <= 0xD7A3)) continue;

        utf8proc_int32_t d[32];
        int last_boundclass = 0;
        utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32,
                                                     UTF8PROC_DECOMPOSE, &last_boundclass);
        if (k <= 0 || k > 32 || (k == 1 && d[0] == (utf8proc_int32_t)cp)) continue; /* compatibility only */
        for (utf8proc_ssize_t i = 1; i < k; i++) mark_unstable((uint32_t)d[i]);
        utf8proc_ssize_t m = utf8proc_normalize_utf32(d, k, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
        if (m != 1 || d[0] != (utf8proc_int32_t)cp) mark_unstable(cp);
    }
    /* Hangul jamo compose algorithmically; keep the whole block out of the fast path. */
    for (uint32_t cp = 0x1100; cp <= 0x11FF; cp++) mark_unstable(cp);
    /* Newer than the reference's tables: plain starters (see the top of the file). */
    for (size_t i = 0; i < sizeof newer_than_unicode_9 / sizeof newer_than_unicode_9[0]; i++)
        for (uint32_t cp = newer_than_unicode_9[i][0]; cp <= newer_than_unicode_9[i][1]; cp++)
            unstable_bits[cp >> 3] &= (uint8_t)~(1u << (cp & 7)),
                newer_bits[cp >> 3] |= (uint8_t)(1u << (cp & 7));
}

/* A stable character that utf8proc must not see at all (it would reorder or compose
 * it with the marks that follow). */
static inline int is_newer(uint32_t cp)
{
    return cp < NFC_TABLE_LIMIT && (newer_bits[cp >> 3] & (1u << (cp & 7)));
}

static inline int is_stable(uint32_t cp)
{
    if (cp < 0x80) return 1;
    if (cp < NFC_TABLE_LIMIT) return !(unstable_bits[cp >> 3] & (1u << (cp & 7)));
    return utf8proc_get_property((utf8proc_int32_t)cp)->combining_class == 0;
}

int tk_nfc_newer_than_unicode9(uint32_t cp)
{
    pthread_once(&unstable_once, build_unstable_table);
    return is_newer(cp);
}

/* ==== NFC ========================================================================== */

/* Appends NFC(s[0..n)) to out. */
static q3_status nfc_segment(const char *s, size_t n, tk_buf *out)
{
    utf8proc_int32_t stack_buf[256], *buf = stack_buf;
    utf8proc_ssize_t cap = 256;
    utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    for (;;) {
        utf8proc_ssize_t k = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n,
                                                buf, cap, opt);
        if (k < 0) {
            if (buf != stack_buf) free(buf);
            return q3_fail(Q3_ERR_INVALID, "NFC: %s", utf8proc_errmsg(k));
        }
        if (k > cap) {
            if (buf != stack_buf) free(buf);
            cap = k;
            buf = malloc((size_t)cap * sizeof *buf);
            if (!buf) return q3_fail(Q3_ERR_NOMEM, "NFC: out of memory");
            continue;
        }
        utf8proc_ssize_t bytes = utf8proc_reencode(buf, k, opt);
        int fail = bytes < 0 || tk_buf_append(out, buf, (size_t)bytes);
        if (buf != stack_buf) free(buf);
        if (fail) return q3_fail(Q3_ERR_NOMEM, "NFC: out of memory");
        return Q3_OK;
    }
}

/* Appends text[from, to) to out. */
static q3_status copy_through(const char *text, size_t from, size_t to, tk_buf *out)
{
    if (tk_buf_append(out, text + from, to - from)) return q3_fail(Q3_ERR_NOMEM, "NFC: out of memory");
    return Q3_OK;
}

q3_status tk_nfc(const char *text, size_t n, tk_buf *out, const char **res, size_t *res_len)
{
    const unsigned char *s = (const unsigned char *)text;
    *res = text;
    *res_len = n;
    pthread_once(&unstable_once, build_unstable_table);

    out->len = 0;
    size_t seg = 0;    /* start of the current segment (a stable character, or 0) */
    size_t copied = 0; /* text[0..copied) is already in out (once out is in use) */
    int dirty = 0, using_out = 0;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            /* ASCII is stable: it ends a dirty segment. Then skip its run, 8 bytes at a time. */
            if (dirty) {
                q3_status st = copy_through(text, copied, seg, out);
                if (st == Q3_OK) st = nfc_segment(text + seg, i - seg, out);
                if (st != Q3_OK) return st;
                copied = i;
                dirty = 0;
                using_out = 1;
            }
            size_t j = i + 1;
            while (j + 8 <= n) {
                uint64_t w;
                memcpy(&w, s + j, 8);
                if (w & 0x8080808080808080ull) break;
                j += 8;
            }
            while (j < n && s[j] < 0x80) j++;
            seg = j - 1;
            i = j;
            continue;
        }
        uint32_t cp;
        int len = q3_utf8_decode_valid(s + i, &cp);
        if (is_stable(cp)) {
            if (dirty) {
                q3_status st = copy_through(text, copied, seg, out);
                if (st == Q3_OK) st = nfc_segment(text + seg, i - seg, out);
                if (st != Q3_OK) return st;
                copied = i;
                dirty = 0;
                using_out = 1;
            }
            /* A segment starts at a stable character, or just after a newer one. */
            seg = is_newer(cp) ? i + (size_t)len : i;
        } else {
            dirty = 1;
        }
        i += (size_t)len;
    }
    if (dirty) {
        q3_status st = copy_through(text, copied, seg, out);
        if (st == Q3_OK) st = nfc_segment(text + seg, n - seg, out);
        if (st != Q3_OK) return st;
        copied = n;
        using_out = 1;
    }
    if (!using_out) return Q3_OK;
    q3_status st = copy_through(text, copied, n, out);
    if (st != Q3_OK) return st;
    *res = out->data;
    *res_len = out->len;
    return Q3_OK;
}
