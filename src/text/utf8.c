#include "text/utf8.h"

#include <string.h>

int q3_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }

    /* Length of the sequence, and the allowed range of its second byte (which is
     * where overlongs, surrogates and code points above U+10FFFF are excluded). */
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) { need = 2; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return -1; /* a stray continuation byte, C0/C1, or F5..FF */
    }
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0; /* valid so far, truncated */
        unsigned b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80, hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return need;
}

size_t q3_utf8_validate(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs dominate real text: check 8 bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int k = q3_utf8_next(s + i, n - i, &cp);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

int q3_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) return 0;
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
