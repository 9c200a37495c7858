/* GBNF, llama.cpp's grammar syntax: `name ::= alternatives`, literals
 * "...", character classes [...] (ranges, ^ negation, escapes), `.` (any
 * character), groups ( ), rule names, postfix * + ? {m} {m,} {m,n} {,n},
 * `|`, comments from # to the end of the line, and named tokens <name>
 * (an added token such as <think>). Classes and `.` are over code points,
 * spelled as UTF-8. A rule's body runs until the next `name ::=`. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/frontends.h"
#include "util/error.h"

typedef struct gp {
    gb *b;
    const char *s, *e, *p; /* text, end, cursor */
    int depth;
} gp;

static q3_status err_at(gp *g, const char *what)
{
    int line = 1, col = 1;
    for (const char *q = g->s; q < g->p && q < g->e; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return q3_fail(Q3_ERR_INVALID, "line %d, column %d: %s", line, col, what);
}

static int is_word(int c) { return isalnum(c) || c == '-' || c == '_'; }

/* Skips spaces, newlines and comments. */
static void skip(gp *g)
{
    while (g->p < g->e) {
        if (*g->p == '#') {
            while (g->p < g->e && *g->p != '\n') g->p++;
        } else if (*g->p == ' ' || *g->p == '\t' || *g->p == '\n' || *g->p == '\r') {
            g->p++;
        } else {
            break;
        }
    }
}

/* Whether a rule definition `name ::=` starts at the cursor. */
static int at_definition(const gp *g)
{
    const char *q = g->p;
    if (q >= g->e || !is_word((unsigned char)*q)) return 0;
    while (q < g->e && is_word((unsigned char)*q)) q++;
    while (q < g->e && (*q == ' ' || *q == '\t')) q++;
    return g->e - q >= 3 && !memcmp(q, "::=", 3);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (after a backslash: an escape) as a
 * code point; -1 on a bad escape or bad UTF-8 (message set). */
static long read_char(gp *g)
{
    if (g->p >= g->e) return err_at(g, "unexpected end of the grammar"), -1;
    unsigned char c = (unsigned char)*g->p;
    if (c == '\\') {
        g->p++;
        if (g->p >= g->e) return err_at(g, "unexpected end after '\\'"), -1;
        char e = *g->p++;
        int n = 0;
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '\'': case '-': case '^': case '/': case '.':
        case '(': case ')': case '*': case '+': case '?': case '{': case '}': case '|':
            return e;
        case 'x': n = 2; break;
        case 'u': n = 4; break;
        case 'U': n = 8; break;
        default: g->p--; return err_at(g, "unknown escape"), -1;
        }
        long v = 0;
        for (int i = 0; i < n; i++) {
            int h = g->p < g->e ? hexval((unsigned char)*g->p) : -1;
            if (h < 0) return err_at(g, "bad hex escape"), -1;
            v = v * 16 + h;
            g->p++;
        }
        if (v > 0x10FFFF) return err_at(g, "escape beyond U+10FFFF"), -1;
        return v;
    }
    /* UTF-8 */
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || g->e - g->p < n) return err_at(g, "invalid UTF-8"), -1;
    long v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; i++) {
        unsigned char d = (unsigned char)g->p[i];
        if ((d & 0xC0) != 0x80) return err_at(g, "invalid UTF-8"), -1;
        v = (v << 6) | (d & 0x3F);
    }
    g->p += n;
    return v;
}

static q3_status parse_alternatives(gp *g, int rule, char close);

/* An element's rule, for a postfix operator to wrap. */
static q3_status parse_primary(gp *g, int *item, char *lit, size_t *lit_len)
{
    gb *b = g->b;
    *item = -1;
    *lit_len = 0;
    char c = *g->p;
    if (c == '"') {
        g->p++;
        size_t n = 0;
        while (g->p < g->e && *g->p != '"') {
            long v = read_char(g);
            if (v < 0) return Q3_ERR_INVALID;
            if (n + 4 > 4096) return err_at(g, "literal longer than 4096 bytes");
            n += (size_t)utf8_put((uint32_t)v, lit + n);
        }
        if (g->p >= g->e) return err_at(g, "unterminated literal");
        g->p++;
        *lit_len = n;
        if (n == 0) { /* "" : the empty string */
            *item = gb_rule(b, NULL, "empty");
            gb_alt(b, *item);
        }
        return Q3_OK;
    }
    if (c == '[') {
        g->p++;
        int neg = 0;
        if (g->p < g->e && *g->p == '^') {
            neg = 1;
            g->p++;
        }
        cp_range r[512];
        size_t n = 0;
        while (g->p < g->e && *g->p != ']') {
            long lo = read_char(g);
            if (lo < 0) return Q3_ERR_INVALID;
            long hi = lo;
            if (g->e - g->p >= 2 && *g->p == '-' && g->p[1] != ']') {
                g->p++;
                hi = read_char(g);
                if (hi < 0) return Q3_ERR_INVALID;
                if (hi < lo) return err_at(g, "a range whose end comes before its start");
            }
            if (n == sizeof r / sizeof r[0]) return err_at(g, "more than 512 items in a character class");
            r[n++] = (cp_range){(uint32_t)lo, (uint32_t)hi};
        }
        if (g->p >= g->e) return err_at(g, "unterminated character class");
        g->p++;
        *item = gb_codepoints(b, r, n, neg);
        return Q3_OK;
    }
    if (c == '.') {
        g->p++;
        *item = gb_codepoints(b, NULL, 0, 1);
        return Q3_OK;
    }
    if (c == '(') {
        g->p++;
        if (++g->depth > 200) return err_at(g, "groups nested more than 200 deep");
        *item = gb_rule(b, NULL, "group");
        q3_status st = parse_alternatives(g, *item, ')');
        g->depth--;
        if (st) return st;
        if (g->p >= g->e || *g->p != ')') return err_at(g, "expected ')'");
        g->p++;
        return Q3_OK;
    }
    if (c == '<') {
        const char *q = g->p;
        while (q < g->e && *q != '>' && *q != '\n') q++;
        if (q >= g->e || *q != '>') return err_at(g, "expected '>' closing a token name");
        char name[128];
        size_t n = (size_t)(q - g->p) + 1;
        if (n >= sizeof name) return err_at(g, "token name too long");
        memcpy(name, g->p, n);
        name[n] = 0;
        g->p = q + 1;
        *item = gb_rule(b, NULL, "token");
        gb_alt(b, *item);
        gb_token(b, *item, name);
        return Q3_OK;
    }
    if (is_word((unsigned char)c)) {
        const char *q = g->p;
        while (q < g->e && is_word((unsigned char)*q)) q++;
        *item = gb_rule_named(b, g->p, (size_t)(q - g->p));
        g->p = q;
        return Q3_OK;
    }
    return err_at(g, "expected a literal, a character class, a rule name or '('");
}

static int read_int(gp *g, int *v)
{
    if (g->p >= g->e || !isdigit((unsigned char)*g->p)) return 0;
    long x = 0;
    while (g->p < g->e && isdigit((unsigned char)*g->p)) {
        x = x * 10 + (*g->p++ - '0');
        if (x > 100000) return 0;
    }
    *v = (int)x;
    return 1;
}

/* A sequence into the last alternative of rule; stops at '|', close, or the next definition. */
static q3_status parse_sequence(gp *g, int rule, char close)
{
    gb *b = g->b;
    static __thread char lit[4096 + 8];
    for (;;) {
        skip(g);
        if (g->p >= g->e || *g->p == '|' || (close && *g->p == close) || at_definition(g)) return Q3_OK;
        int item;
        size_t lit_len;
        q3_status st = parse_primary(g, &item, lit, &lit_len);
        if (st) return st;
        /* postfix operators apply to the element just read */
        const char *save = g->p;
        while (g->p < g->e && (*g->p == ' ' || *g->p == '\t')) g->p++;
        char op = g->p < g->e ? *g->p : 0;
        if (op == '*' || op == '+' || op == '?' || op == '{') {
            if (item < 0) item = gb_lit_rule(b, lit, lit_len);
            g->p++;
            if (op == '*') item = gb_star(b, item);
            else if (op == '+') item = gb_plus(b, item);
            else if (op == '?') item = gb_opt(b, item);
            else {
                int lo = 0, hi = -1;
                while (g->p < g->e && *g->p == ' ') g->p++;
                int has_lo = read_int(g, &lo);
                while (g->p < g->e && *g->p == ' ') g->p++;
                if (g->p < g->e && *g->p == ',') {
                    g->p++;
                    while (g->p < g->e && *g->p == ' ') g->p++;
                    if (!read_int(g, &hi)) hi = -1;
                } else {
                    if (!has_lo) return err_at(g, "expected a number in {m,n}");
                    hi = lo;
                }
                while (g->p < g->e && *g->p == ' ') g->p++;
                if (g->p >= g->e || *g->p != '}') return err_at(g, "expected '}'");
                g->p++;
                if (hi >= 0 && hi < lo) return err_at(g, "{m,n} with n < m");
                if ((hi >= 0 ? hi : lo) > 10000) return err_at(g, "a repetition bound above 10000");
                item = gb_repeat(b, item, lo, hi);
            }
            gb_ref(b, rule, item);
        } else {
            g->p = save;
            if (item < 0) gb_lit(b, rule, lit, lit_len);
            else gb_ref(b, rule, item);
        }
        if (gb_error(b)) return q3_fail(gb_error(b), "out of memory");
    }
}

static q3_status parse_alternatives(gp *g, int rule, char close)
{
    gb_alt(g->b, rule);
    for (;;) {
        q3_status st = parse_sequence(g, rule, close);
        if (st) return st;
        if (g->p < g->e && *g->p == '|') {
            g->p++;
            gb_alt(g->b, rule);
            continue;
        }
        return Q3_OK;
    }
}

q3_status gbnf_compile(gb *b, const char *text, size_t len, int *root)
{
    gp g = {b, text, text + len, text, 0};
    for (;;) {
        skip(&g);
        if (g.p >= g.e) break;
        if (!at_definition(&g)) return err_at(&g, "expected a rule definition `name ::= ...`");
        const char *q = g.p;
        while (q < g.e && is_word((unsigned char)*q)) q++;
        int r = gb_rule_named(b, g.p, (size_t)(q - g.p));
        if (gb_rule_defined(b, r)) return err_at(&g, "rule defined twice");
        g.p = q;
        while (*g.p != ':') g.p++;
        g.p += 3;
        q3_status st = parse_alternatives(&g, r, 0);
        if (st) return st;
        if (g.p < g.e && !at_definition(&g)) return err_at(&g, "unexpected character");
    }
    int r = gb_rule_named(b, "root", 4);
    if (!gb_rule_defined(b, r)) return q3_fail(Q3_ERR_INVALID, "the grammar has no rule 'root'");
    *root = r;
    return gb_error(b) ? q3_fail(gb_error(b), "out of memory") : Q3_OK;
}
