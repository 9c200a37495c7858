/* Regexes, the subset written for formats: literals, `.`, classes [...]
 * (ranges, ^, \d \w \s and their negations), groups ( ) (?: ) (?<name> ),
 * alternation, * + ? {m} {m,} {m,n} (lazy forms too: the same language),
 * escapes. ^ and $ only at the pattern's two ends. Refused with their name:
 * backreferences, lookaround, \b, inline flags, possessive quantifiers.
 * Classes are ASCII as PCRE2 has them by default (\d is [0-9]); `.` is any
 * code point but a newline.
 *
 * Two uses: a regex the whole output matches (regex_compile), and a JSON
 * Schema `pattern` (regex_into), which matches the string's decoded content:
 * there each character is spelled as JSON writes it (", \ and control
 * characters as their escapes), and the pattern is unanchored unless ^ / $
 * say otherwise. */
#include <stdlib.h>
#include <string.h>

#include "grammar/frontends.h"
#include "util/error.h"

typedef struct rx {
    gb *b;
    const char *s, *e, *p;
    int json;  /* characters spelled as inside a JSON string */
    int depth;
} rx;

static q3_status bad(rx *x, q3_status st, const char *what)
{
    return q3_fail(st, "regex /%.*s/ at offset %d: %s", (int)(x->e - x->s > 200 ? 200 : x->e - x->s), x->s,
                   (int)(x->p - x->s), what);
}

static int hexv(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ---- code point sets ------------------------------------------------------------- */

typedef struct cpset {
    cp_range r[256];
    size_t n;
    int overflow;
} cpset;

static void cs_add(cpset *c, uint32_t lo, uint32_t hi)
{
    if (c->n == sizeof c->r / sizeof c->r[0]) {
        c->overflow = 1;
        return;
    }
    c->r[c->n++] = (cp_range){lo, hi};
}

static int cmp_r(const void *a, const void *b)
{
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorted and merged; complemented within [0, 10FFFF] if neg. */
static void cs_normalize(cpset *c, int neg)
{
    qsort(c->r, c->n, sizeof c->r[0], cmp_r);
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (k && c->r[i].lo <= c->r[k - 1].hi + 1) {
            if (c->r[i].hi > c->r[k - 1].hi) c->r[k - 1].hi = c->r[i].hi;
        } else {
            c->r[k++] = c->r[i];
        }
    }
    c->n = k;
    if (!neg) return;
    cpset o = {.n = 0};
    uint32_t next = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->r[i].lo > next) cs_add(&o, next, c->r[i].lo - 1);
        next = c->r[i].hi + 1;
    }
    if (next <= 0x10FFFF) cs_add(&o, next, 0x10FFFF);
    *c = o;
}

/* \d \w \s and their capitals into c. */
static void cs_shorthand(cpset *c, char k)
{
    cpset t = {.n = 0};
    char lk = (char)(k | 0x20);
    if (lk == 'd') cs_add(&t, '0', '9');
    if (lk == 'w') {
        cs_add(&t, '0', '9');
        cs_add(&t, 'A', 'Z');
        cs_add(&t, 'a', 'z');
        cs_add(&t, '_', '_');
    }
    if (lk == 's') {
        cs_add(&t, '\t', '\r'); /* \t \n \v \f \r */
        cs_add(&t, ' ', ' ');
    }
    cs_normalize(&t, k != lk);
    for (size_t i = 0; i < t.n; i++) cs_add(c, t.r[i].lo, t.r[i].hi);
}

/* JSON's spelling of a character that must be escaped (", \, controls), or NULL. */
static const char *json_escape(uint32_t cp, char buf[8])
{
    switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    }
    if (cp < 0x20) {
        static const char hx[] = "0123456789abcdef";
        memcpy(buf, "\\u00", 4);
        buf[4] = hx[cp >> 4];
        buf[5] = hx[cp & 15];
        buf[6] = 0;
        return buf;
    }
    return NULL;
}

/* A rule matching one character of the (normalized) set c. */
static int set_rule(rx *x, cpset *c)
{
    if (!x->json) return gb_codepoints(x->b, c->r, c->n, 0);
    /* the characters JSON escapes, each as its escape; the rest as UTF-8 */
    cpset plain = {.n = 0};
    int r = gb_rule(x->b, NULL, "jchar");
    for (size_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi;
        for (uint32_t cp = lo; cp <= hi && cp < 0x20; cp++) {
            char buf[8];
            const char *e = json_escape(cp, buf);
            gb_alt(x->b, r);
            gb_lit(x->b, r, e, strlen(e));
        }
        if (hi < 0x20) continue;
        if (lo < 0x20) lo = 0x20;
        uint32_t a = lo;
        for (uint32_t sp = '"';; sp = '\\') { /* cut out " and \ */
            if (a <= sp && sp <= hi) {
                gb_alt(x->b, r);
                gb_lit(x->b, r, sp == '"' ? "\\\"" : "\\\\", 2);
                if (a < sp) cs_add(&plain, a, sp - 1);
                a = sp + 1;
            }
            if (sp == '\\') break;
        }
        if (a <= hi) cs_add(&plain, a, hi);
    }
    if (plain.n) {
        gb_alt(x->b, r);
        gb_ref(x->b, r, gb_codepoints(x->b, plain.r, plain.n, 0));
    }
    if (!gb_rule_defined(x->b, r)) {
        gclass none = {{0}};
        gb_alt(x->b, r);
        gb_bytes(x->b, r, &none);
    }
    return r;
}

/* ---- the parser ---------------------------------------------------------------------- */

/* One character (after a backslash: its escape) into c; the shorthands add their sets. */
static q3_status read_char(rx *x, cpset *c, int in_class)
{
    if (x->p >= x->e) return bad(x, Q3_ERR_INVALID, "unexpected end");
    unsigned char ch = (unsigned char)*x->p;
    if (ch == '\\') {
        x->p++;
        if (x->p >= x->e) return bad(x, Q3_ERR_INVALID, "a trailing backslash");
        char k = *x->p++;
        switch (k) {
        case 'd': case 'D': case 'w': case 'W': case 's': case 'S': cs_shorthand(c, k); return Q3_OK;
        case 'n': cs_add(c, '\n', '\n'); return Q3_OK;
        case 'r': cs_add(c, '\r', '\r'); return Q3_OK;
        case 't': cs_add(c, '\t', '\t'); return Q3_OK;
        case 'f': cs_add(c, '\f', '\f'); return Q3_OK;
        case 'v': cs_add(c, '\v', '\v'); return Q3_OK;
        case '0': cs_add(c, 0, 0); return Q3_OK;
        case 'b':
            if (in_class) {
                cs_add(c, '\b', '\b');
                return Q3_OK;
            }
            return bad(x, Q3_ERR_UNSUPPORTED, "\\b (a word boundary) is not supported");
        case 'B': return bad(x, Q3_ERR_UNSUPPORTED, "\\B (not a word boundary) is not supported");
        case 'x': case 'u': {
            int n = k == 'x' ? 2 : 4;
            uint32_t v = 0;
            if (k == 'x' && x->p < x->e && *x->p == '{') n = -1;
            if (n < 0) {
                x->p++;
                while (x->p < x->e && *x->p != '}' && hexv((unsigned char)*x->p) >= 0 && v <= 0x10FFFF)
                    v = v * 16 + (uint32_t)hexv((unsigned char)*x->p++);
                if (x->p >= x->e || *x->p != '}') return bad(x, Q3_ERR_INVALID, "bad \\x{...}");
                x->p++;
            } else {
                for (int i = 0; i < n; i++) {
                    int h = x->p < x->e ? hexv((unsigned char)*x->p) : -1;
                    if (h < 0) return bad(x, Q3_ERR_INVALID, "bad hex escape");
                    v = v * 16 + (uint32_t)h;
                    x->p++;
                }
            }
            if (v > 0x10FFFF) return bad(x, Q3_ERR_INVALID, "escape beyond U+10FFFF");
            cs_add(c, v, v);
            return Q3_OK;
        }
        case 'p': case 'P': return bad(x, Q3_ERR_UNSUPPORTED, "Unicode properties (\\p, \\P) are not supported");
        case 'A': case 'z': case 'Z': case 'G': return bad(x, Q3_ERR_UNSUPPORTED, "anchors other than ^ and $ are not supported");
        default:
            if (k >= '1' && k <= '9') return bad(x, Q3_ERR_UNSUPPORTED, "backreferences are not supported");
            if ((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z')) return bad(x, Q3_ERR_UNSUPPORTED, "unknown escape");
            cs_add(c, (unsigned char)k, (unsigned char)k);
            return Q3_OK;
        }
    }
    int n = ch < 0x80 ? 1 : (ch >> 5) == 6 ? 2 : (ch >> 4) == 14 ? 3 : (ch >> 3) == 30 ? 4 : 0;
    if (!n || x->e - x->p < n) return bad(x, Q3_ERR_INVALID, "invalid UTF-8");
    uint32_t v = n == 1 ? ch : n == 2 ? (ch & 0x1Fu) : n == 3 ? (ch & 0x0Fu) : (ch & 0x07u);
    for (int i = 1; i < n; i++) v = (v << 6) | ((unsigned char)x->p[i] & 0x3Fu);
    x->p += n;
    cs_add(c, v, v);
    return Q3_OK;
}

static q3_status parse_class(rx *x, int *item)
{
    x->p++; /* [ */
    int neg = 0;
    if (x->p < x->e && *x->p == '^') {
        neg = 1;
        x->p++;
    }
    cpset c = {.n = 0};
    int first = 1;
    while (x->p < x->e && (*x->p != ']' || first)) {
        first = 0;
        if (x->e - x->p >= 2 && x->p[0] == '[' && x->p[1] == ':')
            return bad(x, Q3_ERR_UNSUPPORTED, "POSIX classes [:name:] are not supported");
        size_t before = c.n;
        const char *at = x->p;
        q3_status st = read_char(x, &c, 1);
        if (st) return st;
        int single = c.n == before + 1 && !(at[0] == '\\' && strchr("dDwWsS", at[1]));
        if (single && x->e - x->p >= 2 && *x->p == '-' && x->p[1] != ']') {
            x->p++;
            cpset hi = {.n = 0};
            if ((st = read_char(x, &hi, 1))) return st;
            if (hi.n != 1 || hi.r[0].lo != hi.r[0].hi) return bad(x, Q3_ERR_INVALID, "a range ending in a class");
            if (hi.r[0].lo < c.r[c.n - 1].lo) return bad(x, Q3_ERR_INVALID, "a range out of order");
            c.r[c.n - 1].hi = hi.r[0].lo;
        }
    }
    if (x->p >= x->e) return bad(x, Q3_ERR_INVALID, "unterminated character class");
    x->p++;
    if (c.overflow) return bad(x, Q3_ERR_UNSUPPORTED, "a character class with more than 256 items");
    cs_normalize(&c, neg);
    *item = set_rule(x, &c);
    return Q3_OK;
}

static q3_status parse_alts(rx *x, int rule);

static q3_status parse_atom(rx *x, int *item)
{
    char c = *x->p;
    if (c == '(') {
        x->p++;
        if (x->p < x->e && *x->p == '?') {
            x->p++;
            if (x->p < x->e && *x->p == ':') {
                x->p++;
            } else if (x->p < x->e && (*x->p == '<' || *x->p == 'P') &&
                       !(x->e - x->p >= 2 && x->p[0] == '<' && (x->p[1] == '=' || x->p[1] == '!'))) {
                if (*x->p == 'P') x->p++;
                if (x->p >= x->e || *x->p != '<') return bad(x, Q3_ERR_UNSUPPORTED, "(?P...) other than a named group");
                while (x->p < x->e && *x->p != '>') x->p++;
                if (x->p >= x->e) return bad(x, Q3_ERR_INVALID, "unterminated group name");
                x->p++;
            } else if (x->p < x->e && (*x->p == '=' || *x->p == '!' || *x->p == '<')) {
                return bad(x, Q3_ERR_UNSUPPORTED, "lookaround ((?=, (?!, (?<=, (?<!) is not supported");
            } else {
                return bad(x, Q3_ERR_UNSUPPORTED, "inline flags and other (? groups are not supported");
            }
        }
        if (++x->depth > 100) return bad(x, Q3_ERR_UNSUPPORTED, "groups nested more than 100 deep");
        *item = gb_rule(x->b, NULL, "group");
        q3_status st = parse_alts(x, *item);
        x->depth--;
        if (st) return st;
        if (x->p >= x->e || *x->p != ')') return bad(x, Q3_ERR_INVALID, "expected ')'");
        x->p++;
        return Q3_OK;
    }
    if (c == '[') return parse_class(x, item);
    if (c == '.') {
        x->p++;
        cpset s = {.n = 0};
        cs_add(&s, '\n', '\n');
        cs_normalize(&s, 1);
        *item = set_rule(x, &s);
        return Q3_OK;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return bad(x, Q3_ERR_INVALID, "a quantifier with nothing before it");
    if (c == '^' || c == '$') return bad(x, Q3_ERR_UNSUPPORTED, "^ and $ are supported only at the ends of the pattern");
    cpset s = {.n = 0};
    q3_status st = read_char(x, &s, 0);
    if (st) return st;
    cs_normalize(&s, 0);
    if (s.n == 1 && s.r[0].lo == s.r[0].hi && !x->json) {
        char buf[4];
        int n = utf8_put(s.r[0].lo, buf);
        *item = gb_lit_rule(x->b, buf, (size_t)n);
        return Q3_OK;
    }
    *item = set_rule(x, &s);
    return Q3_OK;
}

static int read_num(rx *x, int *v)
{
    const char *q = x->p;
    long n = 0;
    while (x->p < x->e && *x->p >= '0' && *x->p <= '9' && n <= 100000) n = n * 10 + (*x->p++ - '0');
    *v = (int)n;
    return x->p > q;
}

/* Whether the cursor is at the pattern's final $. */
static int at_final_dollar(const rx *x) { return x->p + 1 == x->e && *x->p == '$' && x->depth == 0; }

static q3_status parse_seq(rx *x, int rule)
{
    for (;;) {
        if (x->p >= x->e || *x->p == '|' || *x->p == ')' || at_final_dollar(x)) return Q3_OK;
        int item;
        q3_status st = parse_atom(x, &item);
        if (st) return st;
        while (x->p < x->e && (*x->p == '*' || *x->p == '+' || *x->p == '?' || *x->p == '{')) {
            char q = *x->p;
            int lo = 0, hi = -1;
            if (q == '{') {
                const char *save = x->p++;
                int has_lo = read_num(x, &lo), ok = has_lo;
                if (x->p < x->e && *x->p == ',') {
                    x->p++;
                    if (!read_num(x, &hi)) hi = -1;
                } else {
                    hi = lo;
                }
                if (!ok || x->p >= x->e || *x->p != '}') { /* not a quantifier: a literal { */
                    x->p = save;
                    break;
                }
                x->p++;
                if (hi >= 0 && hi < lo) return bad(x, Q3_ERR_INVALID, "{m,n} with n < m");
                if ((hi >= 0 ? hi : lo) > 10000) return bad(x, Q3_ERR_UNSUPPORTED, "a repetition bound above 10000");
                item = gb_repeat(x->b, item, lo, hi);
            } else {
                x->p++;
                item = q == '*' ? gb_star(x->b, item) : q == '+' ? gb_plus(x->b, item) : gb_opt(x->b, item);
            }
            if (x->p < x->e && *x->p == '?') x->p++; /* lazy: the same language */
            else if (x->p < x->e && *x->p == '+') return bad(x, Q3_ERR_UNSUPPORTED, "possessive quantifiers are not supported");
        }
        gb_ref(x->b, rule, item);
        if (gb_error(x->b)) return q3_fail(gb_error(x->b), "out of memory");
    }
}

static q3_status parse_alts(rx *x, int rule)
{
    gb_alt(x->b, rule);
    for (;;) {
        q3_status st = parse_seq(x, rule);
        if (st) return st;
        if (x->p < x->e && *x->p == '|') {
            x->p++;
            gb_alt(x->b, rule);
            continue;
        }
        return Q3_OK;
    }
}

/* Parses the pattern into rule (one alternative opened); *anch_start, *anch_end: ^ and $ seen. */
static q3_status parse_top(rx *x, int rule, int *anch_start, int *anch_end)
{
    *anch_start = *anch_end = 0;
    if (x->p < x->e && *x->p == '^') {
        *anch_start = 1;
        x->p++;
    }
    int body = gb_rule(x->b, NULL, "regex");
    q3_status st = parse_alts(x, body);
    if (st) return st;
    if (at_final_dollar(x)) {
        *anch_end = 1;
        x->p++;
    }
    if (x->p < x->e) return bad(x, Q3_ERR_INVALID, *x->p == ')' ? "unbalanced ')'" : "unexpected character");
    gb_alt(x->b, rule);
    if (x->json && !*anch_start) {
        cpset any = {.n = 0};
        cs_normalize(&any, 1);
        gb_ref(x->b, rule, gb_star(x->b, set_rule(x, &any)));
    }
    gb_ref(x->b, rule, body);
    if (x->json && !*anch_end) {
        cpset any = {.n = 0};
        cs_normalize(&any, 1);
        gb_ref(x->b, rule, gb_star(x->b, set_rule(x, &any)));
    }
    return gb_error(x->b) ? q3_fail(gb_error(x->b), "out of memory") : Q3_OK;
}

q3_status regex_compile(gb *b, const char *re, size_t len, int *root)
{
    rx x = {b, re, re + len, re, 0, 0};
    int r = gb_rule(b, "root", NULL), a, z;
    q3_status st = parse_top(&x, r, &a, &z);
    if (st) return st;
    *root = r;
    return Q3_OK;
}

q3_status regex_into(gb *b, int rule, const char *re, size_t len)
{
    rx x = {b, re, re + len, re, 1, 0};
    int a, z;
    return parse_top(&x, rule, &a, &z);
}
