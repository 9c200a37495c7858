/* Sets of code points as UTF-8 byte sequences: a range [lo, hi] is cut where
 * the encoding's length changes and where continuation bytes stop lining up,
 * until each piece is a product of byte ranges (one per byte position). */
#include <stdlib.h>

#include "grammar/grammar.h"

int utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

typedef struct emit_ctx {
    gb *b;
    int rule;
    gclass ascii; /* the one-byte pieces, gathered into one class */
} emit_ctx;

static void emit_seq(emit_ctx *e, uint32_t lo, uint32_t hi)
{
    char a[4], z[4];
    int n = utf8_put(lo, a);
    utf8_put(hi, z);
    if (n == 1) {
        for (uint32_t c = lo; c <= hi; c++) gclass_add(&e->ascii, c);
        return;
    }
    gb_alt(e->b, e->rule);
    for (int k = 0; k < n; k++) {
        gclass c = {{0}};
        for (unsigned v = (unsigned char)a[k]; v <= (unsigned char)z[k]; v++) gclass_add(&c, v);
        gb_bytes(e->b, e->rule, &c);
    }
}

static void split(emit_ctx *e, uint32_t lo, uint32_t hi)
{
    if (lo > hi) return;
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            split(e, lo, bounds[i]);
            split(e, bounds[i] + 1, hi);
            return;
        }
    if (hi > 0x7F)
        for (int i = 1; i < 4; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) != (hi & ~m)) {
                if (lo & m) {
                    split(e, lo, lo | m);
                    split(e, (lo | m) + 1, hi);
                    return;
                }
                if ((hi & m) != m) {
                    split(e, lo, (hi & ~m) - 1);
                    split(e, hi & ~m, hi);
                    return;
                }
            }
        }
    emit_seq(e, lo, hi);
}

static int cmp_range(const void *a, const void *b)
{
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int gb_codepoints(gb *b, const cp_range *ranges, size_t n, int negate)
{
    /* sorted, merged, clipped to Unicode; then the complement if asked; then minus surrogates */
    cp_range *r = malloc((n + 2) * sizeof *r), *out = malloc((2 * n + 4) * sizeof *out);
    int rule = gb_rule(b, NULL, "char");
    if (!r || !out) {
        free(r);
        free(out);
        gb_set_error(b, Q3_ERR_NOMEM, "out of memory");
        return rule;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].lo > ranges[i].hi || ranges[i].lo > 0x10FFFF) continue;
        r[m] = ranges[i];
        if (r[m].hi > 0x10FFFF) r[m].hi = 0x10FFFF;
        m++;
    }
    qsort(r, m, sizeof *r, cmp_range);
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi) r[k - 1].hi = r[i].hi;
        } else {
            r[k++] = r[i];
        }
    }
    size_t no = 0;
    if (negate) {
        uint32_t next = 0;
        for (size_t i = 0; i < k; i++) {
            if (r[i].lo > next) out[no++] = (cp_range){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10FFFF) out[no++] = (cp_range){next, 0x10FFFF};
    } else {
        for (size_t i = 0; i < k; i++) out[no++] = r[i];
    }
    emit_ctx e = {b, rule, {{0}}};
    for (size_t i = 0; i < no; i++) {
        uint32_t lo = out[i].lo, hi = out[i].hi;
        if (lo <= 0xDFFF && hi >= 0xD800) { /* surrogates are not characters */
            if (lo < 0xD800) split(&e, lo, 0xD7FF);
            if (hi > 0xDFFF) split(&e, 0xE000, hi);
        } else {
            split(&e, lo, hi);
        }
    }
    if (e.ascii.w[0] | e.ascii.w[1]) {
        gb_alt(b, rule);
        gb_bytes(b, rule, &e.ascii);
    }
    if (!gb_rule_defined(b, rule)) { /* the empty set: an alternative that never matches */
        gclass none = {{0}};
        gb_alt(b, rule);
        gb_bytes(b, rule, &none);
    }
    free(r);
    free(out);
    return rule;
}
