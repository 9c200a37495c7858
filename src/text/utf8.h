/* UTF-8 helpers: strict decoding (no overlongs, no surrogates, nothing above
 * U+10FFFF), validation with the offset of the first bad byte, encoding, and
 * the "maximal subpart" rule for replacing invalid bytes with U+FFFD. */
#ifndef Q3_TEXT_UTF8_H
#define Q3_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define Q3_UTF8_REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD, 3 bytes */

/* Decodes the character at s[0..n) (n >= 1).
 * Returns  k > 0: a valid character of k bytes, its code point in *cp;
 *          0:     s[0..n) is a proper prefix of a valid character (more bytes needed);
 *          -k < 0: the first k bytes are invalid: the "maximal subpart" (a lead byte and
 *                  the continuation bytes that still fit it), to be replaced by one U+FFFD. */
int q3_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* Returns n if s[0..n) is valid UTF-8, else the byte offset of the first byte of the
 * first invalid (or truncated) character. */
size_t q3_utf8_validate(const char *s, size_t n);

/* Writes the UTF-8 form of cp (<= U+10FFFF, not a surrogate) to out; returns 1..4,
 * or 0 for a code point that has no UTF-8 form. */
int q3_utf8_encode(uint32_t cp, char out[4]);

/* Decodes one character of *valid* UTF-8 (the caller validated it); returns its length. */
static inline int q3_utf8_decode_valid(const unsigned char *s, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu); return 2; }
    if (c < 0xF0) {
        *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
}

#endif
