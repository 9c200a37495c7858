/* JSON Schema -> grammar rules.
 *
 * Supported (draft 4, 6, 7, 2019-09 and 2020-12 spellings): type (a name or
 * a list; integer, number, string, boolean, null, object, array), properties,
 * required, additionalProperties (false, true or a schema), items (a schema;
 * a list: draft 4-2019's tuple form), prefixItems, additionalItems,
 * minItems/maxItems, enum, const, anyOf, oneOf (as anyOf: a text matching
 * several branches is accepted), allOf (merged keyword by keyword), $ref (JSON
 * pointers into this document: #, #/$defs/x, #/definitions/x, ..., recursion
 * included), $defs/definitions, minLength/maxLength, pattern, format
 * (date-time, date, time, uuid, email, ipv4), minimum/maximum/
 * exclusiveMinimum/exclusiveMaximum (numbers and booleans, draft 4's form
 * too) for integers, exactly, and for numbers when the bounds are integers,
 * nullable (OpenAPI). JSON Schema's other keywords (not, if/then/else,
 * patternProperties, multipleOf, uniqueItems: true, min/maxProperties,
 * dependencies, contains, ...: is_refused) are refused with their name: they
 * would change the language and q3 would not follow it. Words that are not
 * JSON Schema keywords (title, description, default, x-anything) are
 * annotations, read past, as the specification says.
 *
 * The text: objects list their properties in the schema's order, then any
 * additional ones; whitespace between tokens is at most WS_MAX characters of
 * [ \t\n\r]; a string's characters are UTF-8 or JSON escapes (with a pattern
 * or a format: the escapes JSON writers use, for ", \ and control
 * characters); a number with a bound has no exponent. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/frontends.h"
#include "q3.h"
#include "util/error.h"

#define WS_MAX 32
#define MAX_DEPTH 64

typedef struct memo {
    const cJSON *node;
    char *key; /* for merged schemas: their text */
    int rule;
} memo;

typedef struct js {
    gb *b;
    cJSON *doc;
    memo *m;
    int n_m, cap_m;
    cJSON **owned; /* merged schemas, freed at the end */
    int n_owned, cap_owned;
    int ws, value, string, number_any, integer_any, chr, escape; /* shared rules, -1 until made */
    int depth;
} js;

static q3_status compile(js *j, const cJSON *s, int *out);

static q3_status refuse(const char *kw, const char *why)
{
    return q3_fail(Q3_ERR_UNSUPPORTED, "unsupported keyword '%s'%s%s", kw, why ? ": " : "", why ? why : "");
}

static q3_status nomem(void) { return q3_fail(Q3_ERR_NOMEM, "out of memory"); }

static int own(js *j, cJSON *x)
{
    if (!x) return -1;
    if (j->n_owned == j->cap_owned) {
        int c = j->cap_owned ? 2 * j->cap_owned : 16;
        cJSON **n = realloc(j->owned, (size_t)c * sizeof *n);
        if (!n) {
            cJSON_Delete(x);
            return -1;
        }
        j->owned = n;
        j->cap_owned = c;
    }
    j->owned[j->n_owned++] = x;
    return 0;
}

static int memo_add(js *j, const cJSON *node, char *key, int rule)
{
    if (j->n_m == j->cap_m) {
        int c = j->cap_m ? 2 * j->cap_m : 64;
        memo *n = realloc(j->m, (size_t)c * sizeof *n);
        if (!n) return -1;
        j->m = n;
        j->cap_m = c;
    }
    j->m[j->n_m++] = (memo){node, key, rule};
    return 0;
}

/* ---- shared pieces --------------------------------------------------------------- */

static int ws(js *j)
{
    if (j->ws < 0) {
        int c = gb_rule(j->b, "ws_char", NULL);
        gclass k = {{0}};
        gclass_add(&k, ' ');
        gclass_add(&k, '\t');
        gclass_add(&k, '\n');
        gclass_add(&k, '\r');
        gb_alt(j->b, c);
        gb_bytes(j->b, c, &k);
        j->ws = gb_repeat(j->b, c, 0, WS_MAX);
    }
    return j->ws;
}

/* An escape of a JSON string: \" \\ \/ \b \f \n \r \t or \uXXXX. */
static int string_escape(js *j)
{
    if (j->escape >= 0) return j->escape;
    int r = j->escape = gb_rule(j->b, "json_escape", NULL);
    gb_alt(j->b, r);
    gb_byte(j->b, r, '\\');
    gclass e = {{0}};
    for (const char *p = "\"\\/bfnrt"; *p; p++) gclass_add(&e, (unsigned char)*p);
    gb_bytes(j->b, r, &e);
    gb_alt(j->b, r);
    gb_lit(j->b, r, "\\u", 2);
    gclass h = {{0}};
    for (const char *p = "0123456789abcdefABCDEF"; *p; p++) gclass_add(&h, (unsigned char)*p);
    for (int i = 0; i < 4; i++) gb_bytes(j->b, r, &h);
    return r;
}

/* One character of a JSON string: UTF-8 but ", \ and controls; or an escape. */
static int string_char(js *j)
{
    if (j->chr >= 0) return j->chr;
    static const cp_range plain[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
    int r = j->chr = gb_rule(j->b, "json_char", NULL);
    gb_alt(j->b, r);
    gb_ref(j->b, r, gb_codepoints(j->b, plain, 3, 0));
    gb_alt(j->b, r);
    gb_ref(j->b, r, string_escape(j));
    return r;
}

static int string_of(js *j, int lo, int hi)
{
    int r = gb_rule(j->b, NULL, "string");
    gb_alt(j->b, r);
    gb_byte(j->b, r, '"');
    gb_ref(j->b, r, gb_repeat(j->b, string_char(j), lo, hi));
    gb_byte(j->b, r, '"');
    return r;
}

static void digits(gb *b, int r, char lo, char hi)
{
    gclass c = {{0}};
    for (int d = lo; d <= hi; d++) gclass_add(&c, (unsigned)d);
    gb_bytes(b, r, &c);
}

static int digit_rule(gb *b, char lo, char hi)
{
    int r = gb_rule(b, NULL, "digit");
    gb_alt(b, r);
    digits(b, r, lo, hi);
    return r;
}

/* Decimal strings of one length n between a and b (inclusive, digit by digit). */
static int digits_between(gb *b, const char *a, const char *z, int n)
{
    int r = gb_rule(b, NULL, "digits");
    gb_alt(b, r);
    if (n == 0) return r;
    int all = 1;
    for (int i = 0; i < n; i++) all &= a[i] == '0' && z[i] == '9';
    if (all) {
        gb_ref(b, r, gb_repeat(b, digit_rule(b, '0', '9'), n, n));
        return r;
    }
    if (a[0] == z[0]) {
        gb_byte(b, r, (unsigned char)a[0]);
        gb_ref(b, r, digits_between(b, a + 1, z + 1, n - 1));
        return r;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    gb_byte(b, r, (unsigned char)a[0]);
    gb_ref(b, r, digits_between(b, a + 1, nines, n - 1));
    if (a[0] + 1 <= z[0] - 1) {
        gb_alt(b, r);
        digits(b, r, (char)(a[0] + 1), (char)(z[0] - 1));
        if (n > 1) gb_ref(b, r, gb_repeat(b, digit_rule(b, '0', '9'), n - 1, n - 1));
    }
    gb_alt(b, r);
    gb_byte(b, r, (unsigned char)z[0]);
    gb_ref(b, r, digits_between(b, zeros, z + 1, n - 1));
    return r;
}

/* Non-negative integers in [lo, hi] written without leading zeros (hi < 0: no upper bound). */
static int uint_range(gb *b, long long lo, long long hi)
{
    int r = gb_rule(b, NULL, "uint");
    char ls[24];
    int ln = snprintf(ls, sizeof ls, "%lld", lo);
    int hn = 0;
    if (hi >= 0) {
        char hs[24];
        hn = snprintf(hs, sizeof hs, "%lld", hi);
    }
    long long p10 = 1;
    for (int i = 1; i < ln; i++) p10 *= 10;
    for (int L = ln; L <= (hi >= 0 ? hn : ln); L++, p10 *= 10) {
        long long a = L == 1 ? lo : (lo > p10 ? lo : p10), z = p10 * 10 - 1;
        if (hi >= 0 && hi < z) z = hi;
        if (a > z) continue;
        char as[24], zs[24];
        snprintf(as, sizeof as, "%0*lld", L, a);
        snprintf(zs, sizeof zs, "%0*lld", L, z);
        gb_alt(b, r);
        gb_ref(b, r, digits_between(b, as, zs, L));
    }
    if (hi < 0) { /* every longer number */
        gb_alt(b, r);
        digits(b, r, '1', '9');
        gb_ref(b, r, gb_repeat(b, digit_rule(b, '0', '9'), ln, -1));
    }
    if (!gb_rule_defined(b, r)) {
        gclass none = {{0}};
        gb_alt(b, r);
        gb_bytes(b, r, &none);
    }
    return r;
}

enum { FRAC_NONE, FRAC_ZERO, FRAC_NONZERO, FRAC_ANY };

/* The fraction after an integer part: FRAC_NONE none; FRAC_ZERO none or all
 * zeros; FRAC_NONZERO some digit not 0; FRAC_ANY either. */
static int frac_rule(gb *b, int kind)
{
    int r = gb_rule(b, NULL, "frac");
    int d = digit_rule(b, '0', '9');
    if (kind == FRAC_NONE || kind == FRAC_ZERO || kind == FRAC_ANY) gb_alt(b, r); /* no fraction */
    if (kind == FRAC_ZERO) {
        gb_alt(b, r);
        gb_byte(b, r, '.');
        gb_ref(b, r, gb_plus(b, digit_rule(b, '0', '0')));
    } else if (kind == FRAC_NONZERO || kind == FRAC_ANY) {
        gb_alt(b, r);
        gb_byte(b, r, '.');
        gb_ref(b, r, gb_star(b, digit_rule(b, '0', '0')));
        digits(b, r, '1', '9');
        gb_ref(b, r, gb_star(b, d));
        if (kind == FRAC_ANY) {
            gb_alt(b, r);
            gb_byte(b, r, '.');
            gb_ref(b, r, gb_plus(b, digit_rule(b, '0', '0')));
        }
    }
    return r;
}

static int frac_and(int a, int b)
{
    if (a == FRAC_ANY) return b;
    if (b == FRAC_ANY) return a;
    if (a == b) return a;
    return FRAC_NONE - 1; /* empty */
}

/* Magnitudes m = I.F >= 0 with lo (<0: none) / hi (<0: none) bounds, each
 * exclusive or not; integers only when ints. Adds alternatives to r. */
static void magnitudes(gb *b, int r, int ints, long long lo, int lo_ex, long long hi, int hi_ex, const char *sign)
{
    /* per integer part I: the fraction it may have */
    long long i_lo = lo < 0 ? 0 : lo, i_hi = hi; /* middle range, refined below */
    int at_lo = lo >= 0 ? (lo_ex ? FRAC_NONZERO : FRAC_ANY) : FRAC_ANY;
    int at_hi = hi >= 0 ? (hi_ex ? FRAC_NONE - 1 : FRAC_ZERO) : FRAC_ANY;
    int any = ints ? FRAC_NONE : FRAC_ANY;
    struct mag_piece { long long a, z; int f; } piece[3];
    int np = 0;
    if (hi >= 0 && lo > hi) return;
    if (hi >= 0 && lo >= 0 && lo == hi) {
        piece[np++] = (struct mag_piece){lo, lo, frac_and(at_lo, at_hi)};
    } else {
        if (lo >= 0) {
            piece[np++] = (struct mag_piece){lo, lo, at_lo};
            i_lo = lo + 1;
        }
        if (hi >= 0) {
            piece[np++] = (struct mag_piece){hi, hi, at_hi};
            i_hi = hi - 1;
        }
        if (hi < 0 || i_lo <= i_hi) piece[np++] = (struct mag_piece){i_lo, hi < 0 ? -1 : i_hi, FRAC_ANY};
    }
    for (int k = 0; k < np; k++) {
        int f = piece[k].f;
        if (ints) f = (f == FRAC_ANY || f == FRAC_ZERO) ? FRAC_NONE : FRAC_NONE - 1;
        else if (f == FRAC_ANY) f = any;
        if (f < FRAC_NONE) continue;
        gb_alt(b, r);
        gb_lit(b, r, sign, strlen(sign));
        gb_ref(b, r, uint_range(b, piece[k].a, piece[k].z));
        if (f != FRAC_NONE) gb_ref(b, r, frac_rule(b, f));
    }
}

/* Numbers (ints: integers) within [lo, hi] (has_lo/has_hi; *_ex exclusive), integer bounds. */
static int bounded_number(gb *b, int ints, int has_lo, long long lo, int lo_ex, int has_hi, long long hi, int hi_ex)
{
    int r = gb_rule(b, NULL, ints ? "integer" : "number");
    /* v >= 0 */
    if (!has_hi || hi > 0 || (hi == 0 && !hi_ex)) {
        long long mlo = has_lo && lo >= 0 ? lo : -1;
        int mlo_ex = has_lo && lo >= 0 ? lo_ex : 0;
        magnitudes(b, r, ints, mlo, mlo_ex, has_hi ? hi : -1, has_hi ? hi_ex : 0, "");
    }
    /* v < 0: "-" then a magnitude m > 0 with -hi <= m <= -lo */
    if (!has_lo || lo < 0) {
        long long mlo = has_hi && hi < 0 ? -hi : 0;
        int mlo_ex = has_hi && hi < 0 ? hi_ex : 1;
        magnitudes(b, r, ints, mlo, mlo_ex, has_lo ? -lo : -1, has_lo ? lo_ex : 0, "-");
    }
    if (!gb_rule_defined(b, r)) {
        gclass none = {{0}};
        gb_alt(b, r);
        gb_bytes(b, r, &none);
    }
    return r;
}

static int number_any(js *j, int ints)
{
    int *slot = ints ? &j->integer_any : &j->number_any;
    if (*slot >= 0) return *slot;
    gb *b = j->b;
    int r = gb_rule(b, ints ? "integer" : "number", NULL);
    gb_alt(b, r);
    gb_ref(b, r, gb_opt(b, gb_lit_rule(b, "-", 1)));
    gb_ref(b, r, uint_range(b, 0, -1));
    if (!ints) {
        int d = digit_rule(b, '0', '9');
        int f = gb_rule(b, NULL, "frac");
        gb_alt(b, f);
        gb_byte(b, f, '.');
        gb_ref(b, f, gb_plus(b, d));
        gb_ref(b, r, gb_opt(b, f));
        int e = gb_rule(b, NULL, "exp");
        gb_alt(b, e);
        gclass ee = {{0}}, pm = {{0}};
        gclass_add(&ee, 'e');
        gclass_add(&ee, 'E');
        gclass_add(&pm, '+');
        gclass_add(&pm, '-');
        gb_bytes(b, e, &ee);
        int s = gb_rule(b, NULL, "sign");
        gb_alt(b, s);
        gb_bytes(b, s, &pm);
        gb_ref(b, e, gb_opt(b, s));
        gb_ref(b, e, gb_plus(b, d));
        gb_ref(b, r, gb_opt(b, e));
    }
    *slot = r;
    return r;
}

/* Any JSON value. */
static int value_any(js *j);

static int object_any(js *j)
{
    gb *b = j->b;
    int w = ws(j), v = value_any(j), str = j->string >= 0 ? j->string : (j->string = string_of(j, 0, -1));
    int member = gb_rule(b, NULL, "member");
    gb_alt(b, member);
    gb_ref(b, member, str);
    gb_ref(b, member, w);
    gb_byte(b, member, ':');
    gb_ref(b, member, w);
    gb_ref(b, member, v);
    gb_ref(b, member, w);
    int more = gb_rule(b, NULL, "more");
    gb_alt(b, more);
    gb_byte(b, more, ',');
    gb_ref(b, more, w);
    gb_ref(b, more, member);
    int body = gb_rule(b, NULL, "members");
    gb_alt(b, body);
    gb_ref(b, body, member);
    gb_ref(b, body, gb_star(b, more));
    int r = gb_rule(b, NULL, "object");
    gb_alt(b, r);
    gb_byte(b, r, '{');
    gb_ref(b, r, w);
    gb_ref(b, r, gb_opt(b, body));
    gb_byte(b, r, '}');
    return r;
}

static int value_any(js *j)
{
    if (j->value >= 0) return j->value;
    gb *b = j->b;
    int r = j->value = gb_rule(b, "value", NULL);
    int w = ws(j);
    gb_alt(b, r);
    gb_ref(b, r, object_any(j));
    /* array */
    int more = gb_rule(b, NULL, "more");
    gb_alt(b, more);
    gb_byte(b, more, ',');
    gb_ref(b, more, w);
    gb_ref(b, more, r);
    gb_ref(b, more, w);
    int items = gb_rule(b, NULL, "items");
    gb_alt(b, items);
    gb_ref(b, items, r);
    gb_ref(b, items, w);
    gb_ref(b, items, gb_star(b, more));
    gb_alt(b, r);
    gb_byte(b, r, '[');
    gb_ref(b, r, w);
    gb_ref(b, r, gb_opt(b, items));
    gb_byte(b, r, ']');
    gb_alt(b, r);
    gb_ref(b, r, j->string >= 0 ? j->string : (j->string = string_of(j, 0, -1)));
    gb_alt(b, r);
    gb_ref(b, r, number_any(j, 0));
    static const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        gb_alt(b, r);
        gb_lit(b, r, lits[i], strlen(lits[i]));
    }
    return r;
}

/* ---- literal values (const, enum) -------------------------------------------------- */

static q3_status literal(js *j, int r, const cJSON *v)
{
    gb *b = j->b;
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        int obj = cJSON_IsObject(v);
        gb_byte(b, r, obj ? '{' : '[');
        gb_ref(b, r, ws(j));
        const cJSON *c;
        int first = 1;
        cJSON_ArrayForEach(c, v) {
            if (!first) {
                gb_byte(b, r, ',');
                gb_ref(b, r, ws(j));
            }
            first = 0;
            if (obj) {
                cJSON *k = cJSON_CreateString(c->string);
                char *t = k ? cJSON_PrintUnformatted(k) : NULL;
                cJSON_Delete(k);
                if (!t) return nomem();
                gb_lit(b, r, t, strlen(t));
                free(t);
                gb_ref(b, r, ws(j));
                gb_byte(b, r, ':');
                gb_ref(b, r, ws(j));
            }
            q3_status st = literal(j, r, c);
            if (st) return st;
            gb_ref(b, r, ws(j));
        }
        gb_byte(b, r, obj ? '}' : ']');
        return Q3_OK;
    }
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return nomem();
    gb_lit(b, r, t, strlen(t));
    free(t);
    return Q3_OK;
}

/* ---- $ref --------------------------------------------------------------------------- */

static q3_status resolve(js *j, const char *ref, const cJSON **out)
{
    if (ref[0] != '#') return refuse("$ref", "only references into the same document (#...) are supported");
    const cJSON *cur = j->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') return refuse("$ref", "anchors (#name) are not supported; use a JSON pointer (#/...)");
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            char c = *p++;
            if (c == '~' && (*p == '0' || *p == '1')) c = *p++ == '0' ? '~' : '/';
            else if (c == '%' && p[0] && p[1]) {
                char hx[3] = {p[0], p[1], 0};
                c = (char)strtol(hx, NULL, 16);
                p += 2;
            }
            tok[n++] = c;
        }
        tok[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *e;
            long i = strtol(tok, &e, 10);
            cur = *e || !n ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else if (cJSON_IsObject(cur)) {
            const cJSON *c = NULL;
            for (c = cur->child; c; c = c->next)
                if (c->string && !strcmp(c->string, tok)) break;
            cur = c;
        } else {
            cur = NULL;
        }
        if (!cur) return q3_fail(Q3_ERR_INVALID, "$ref '%s' points to nothing in the schema", ref);
    }
    *out = cur;
    return Q3_OK;
}

/* ---- keywords ------------------------------------------------------------------------ */

/* JSON Schema's own keywords (draft 3 to 2020-12) that q3 does not compile:
 * refused by name. Other unknown keywords are not JSON Schema's and, as the
 * specification says, annotations: read past. */
static const char *const refused_words[] = {"not", "if", "then", "else", "dependencies", "dependentRequired", "dependentSchemas",
                              "patternProperties", "propertyNames", "minProperties", "maxProperties", "multipleOf",
                              "contains", "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems",
                              "$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "extends",
                              "disallow", "divisibleBy", "contentSchema", NULL};

static const char *const supported_words[] = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                              "additionalItems", "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf",
                              "$ref", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                              "exclusiveMinimum", "exclusiveMaximum", "nullable", "uniqueItems", NULL};

static int listed(const char *const *a, const char *k)
{
    for (int i = 0; a[i]; i++)
        if (!strcmp(k, a[i])) return 1;
    return 0;
}

static int is_refused(const char *k) { return listed(refused_words, k); }
static int is_supported(const char *k) { return listed(supported_words, k); }

enum { T_NULL = 1, T_BOOL = 2, T_OBJECT = 4, T_ARRAY = 8, T_STRING = 16, T_NUMBER = 32, T_INTEGER = 64, T_ALL = 127 };

static int type_bit(const char *t)
{
    static const char *n[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, n[i])) return 1 << i;
    return 0;
}

static q3_status types_of(const cJSON *s, int *out)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    int m = 0;
    if (!t) {
        m = T_ALL;
    } else if (cJSON_IsString(t)) {
        if (!(m = type_bit(t->valuestring))) return q3_fail(Q3_ERR_INVALID, "unknown type '%s'", t->valuestring);
    } else if (cJSON_IsArray(t)) {
        const cJSON *c;
        cJSON_ArrayForEach(c, t) {
            int bit = cJSON_IsString(c) ? type_bit(c->valuestring) : 0;
            if (!bit) return q3_fail(Q3_ERR_INVALID, "'type' holds something that is not a type name");
            m |= bit;
        }
    } else {
        return q3_fail(Q3_ERR_INVALID, "'type' must be a string or an array of strings");
    }
    if (m & T_NUMBER) m |= T_INTEGER;
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    if (cJSON_IsTrue(nl)) m |= T_NULL;
    *out = m;
    return Q3_OK;
}

/* Whether value v has one of the types of mask m. */
static int value_in_types(const cJSON *v, int m)
{
    if (cJSON_IsNull(v)) return m & T_NULL;
    if (cJSON_IsBool(v)) return m & T_BOOL;
    if (cJSON_IsObject(v)) return m & T_OBJECT;
    if (cJSON_IsArray(v)) return m & T_ARRAY;
    if (cJSON_IsString(v)) return m & T_STRING;
    if (cJSON_IsNumber(v)) {
        if (m & T_NUMBER) return 1;
        return (m & T_INTEGER) && v->valuedouble == floor(v->valuedouble);
    }
    return 0;
}

static int get_count(const cJSON *s, const char *k, int dflt, q3_status *st)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) {
        *st = q3_fail(Q3_ERR_INVALID, "'%s' must be a non-negative integer", k);
        return dflt;
    }
    if (v->valuedouble > 10000) {
        *st = refuse(k, "bounds above 10000 are not supported");
        return dflt;
    }
    return (int)v->valuedouble;
}

/* ---- strings ------------------------------------------------------------------------- */

/* The formats q3 follows: format_names[i] is matched by format_re[i]. */
static const char *const format_names[] = {"date", "time", "date-time", "uuid", "email", "ipv4", NULL};
static const char *const format_re[] = {
    "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$",
    "^([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$",
    "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
    "(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$",
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    "(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$",
    "^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$",
};
_Static_assert(sizeof format_names / sizeof *format_names == sizeof format_re / sizeof *format_re + 1,
               "a regex for each format");

static q3_status string_rule(js *j, const cJSON *s, int *out)
{
    q3_status st = Q3_OK;
    int lo = get_count(s, "minLength", 0, &st), hi = get_count(s, "maxLength", -1, &st);
    if (st) return st;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const char *re = NULL;
    if (fmt) {
        if (!cJSON_IsString(fmt)) return q3_fail(Q3_ERR_INVALID, "'format' must be a string");
        for (size_t i = 0; format_names[i]; i++)
            if (!strcmp(format_names[i], fmt->valuestring)) re = format_re[i];
        if (!re) return q3_fail(Q3_ERR_UNSUPPORTED, "unsupported keyword 'format': '%s' (supported: date, time, date-time, uuid, email, ipv4)", fmt->valuestring);
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return q3_fail(Q3_ERR_INVALID, "'pattern' must be a string");
        if (re) return refuse("pattern", "together with 'format' is not supported");
        re = pat->valuestring;
    }
    if (re && (lo > 0 || hi >= 0)) return refuse(pat ? "pattern" : "format", "together with minLength/maxLength is not supported");
    if (hi >= 0 && hi < lo) {
        *out = gb_rule(j->b, NULL, "empty_string");
        gclass none = {{0}};
        gb_alt(j->b, *out);
        gb_bytes(j->b, *out, &none);
        return Q3_OK;
    }
    if (!re) {
        if (lo == 0 && hi < 0) {
            if (j->string < 0) j->string = string_of(j, 0, -1);
            *out = j->string;
        } else {
            *out = string_of(j, lo, hi);
        }
        return Q3_OK;
    }
    int body = gb_rule(j->b, NULL, "pattern");
    if ((st = regex_into(j->b, body, re, strlen(re)))) return q3_fail_wrap(st, "%s", pat ? "pattern" : "format");
    int r = gb_rule(j->b, NULL, "string");
    gb_alt(j->b, r);
    gb_byte(j->b, r, '"');
    gb_ref(j->b, r, body);
    gb_byte(j->b, r, '"');
    *out = r;
    return Q3_OK;
}

/* ---- numbers -------------------------------------------------------------------------- */

/* A bound (draft 4: minimum + exclusiveMinimum boolean; later: both numbers). */
static q3_status bound(const cJSON *s, int upper, int *has, double *v, int *ex)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, upper ? "maximum" : "minimum");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, upper ? "exclusiveMaximum" : "exclusiveMinimum");
    *has = 0;
    *ex = 0;
    if (m) {
        if (!cJSON_IsNumber(m)) return q3_fail(Q3_ERR_INVALID, "'%s' must be a number", upper ? "maximum" : "minimum");
        *has = 1;
        *v = m->valuedouble;
    }
    if (e) {
        if (cJSON_IsBool(e)) {
            *ex = cJSON_IsTrue(e) && *has;
        } else if (cJSON_IsNumber(e)) {
            if (!*has || (upper ? e->valuedouble <= *v : e->valuedouble >= *v)) {
                *has = 1;
                *v = e->valuedouble;
                *ex = 1;
            }
        } else {
            return q3_fail(Q3_ERR_INVALID, "'%s' must be a number or a boolean", upper ? "exclusiveMaximum" : "exclusiveMinimum");
        }
    }
    if (*has && fabs(*v) > 9e15) return refuse(upper ? "maximum" : "minimum", "bounds beyond 9e15 are not supported");
    return Q3_OK;
}

static q3_status number_rule(js *j, const cJSON *s, int ints, int *out)
{
    int hl, hh, el, eh;
    double lo = 0, hi = 0;
    q3_status st = bound(s, 0, &hl, &lo, &el);
    if (!st) st = bound(s, 1, &hh, &hi, &eh);
    if (st) return st;
    if (!hl && !hh) {
        *out = number_any(j, ints);
        return Q3_OK;
    }
    if (ints) { /* integer bounds: round inwards */
        if (hl && lo != floor(lo)) {
            lo = ceil(lo);
            el = 0;
        }
        if (hh && hi != floor(hi)) {
            hi = floor(hi);
            eh = 0;
        }
        if (hl && el) { lo += 1; el = 0; }
        if (hh && eh) { hi -= 1; eh = 0; }
    } else if ((hl && lo != floor(lo)) || (hh && hi != floor(hi))) {
        return refuse(hl && lo != floor(lo) ? (el ? "exclusiveMinimum" : "minimum") : (eh ? "exclusiveMaximum" : "maximum"),
                      "a non-integer bound on a number is not supported (integer bounds are, and any bound on an integer)");
    }
    *out = bounded_number(j->b, ints, hl, (long long)lo, el, hh, (long long)hi, eh);
    return Q3_OK;
}

/* ---- objects --------------------------------------------------------------------------- */

/* The code point at s[*i] (valid UTF-8, as cJSON leaves strings), advancing *i. */
static uint32_t next_cp(const char *s, size_t *i)
{
    unsigned char c = (unsigned char)s[*i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n && s[*i + (size_t)k]; k++) v = (v << 6) | ((unsigned char)s[*i + (size_t)k] & 0x3Fu);
    *i += (size_t)n;
    return v;
}

/* A JSON string that is none of names[0..n): a trie over the names' code
 * points; leaving it (another character, or any escape) frees the rest. */
static int key_except(js *j, const char *const *names, int n)
{
    gb *b = j->b;
    int any = j->string >= 0 ? j->string : (j->string = string_of(j, 0, -1));
    if (n == 0) return any;
    int tail = gb_rule(b, NULL, "key_tail"); /* any characters, then the closing quote */
    gb_alt(b, tail);
    gb_ref(b, tail, gb_star(b, string_char(j)));
    gb_byte(b, tail, '"');
    typedef struct { int name; size_t len; int rule; } pre; /* a prefix: names[name][0..len) */
    size_t cap = 1;
    for (int i = 0; i < n; i++) cap += strlen(names[i]);
    pre *ps = malloc(cap * sizeof *ps);
    cp_range *kids = malloc((cap + 5) * sizeof *kids);
    if (!ps || !kids) {
        free(ps);
        free(kids);
        gb_set_error(b, Q3_ERR_NOMEM, "out of memory");
        return any;
    }
    size_t np = 0;
    int multi_tail = -1;
    ps[np++] = (pre){0, 0, gb_rule(b, NULL, "key")};
    for (size_t k = 0; k < np; k++) {
        pre P = ps[k];
        const char *pp = names[P.name];
        int r = P.rule, is_name = 0;
        size_t nk = 0;
        for (int i = 0; i < n; i++) {
            size_t l = strlen(names[i]);
            if (l < P.len || memcmp(names[i], pp, P.len)) continue;
            if (l == P.len) {
                is_name = 1;
                continue;
            }
            size_t e = P.len;
            uint32_t cp = next_cp(names[i], &e);
            int seen = 0;
            for (size_t q = 0; q < nk; q++) seen |= kids[q].lo == cp;
            if (seen) continue;
            kids[nk++] = (cp_range){cp, cp};
            ps[np++] = (pre){i, e, gb_rule(b, NULL, "key")};
            gb_alt(b, r);
            gb_lit(b, r, names[i] + P.len, e - P.len);
            gb_ref(b, r, ps[np - 1].rule);
        }
        if (!is_name) {
            gb_alt(b, r);
            gb_byte(b, r, '"');
        }
        /* another plain character: not ", \, a control, nor a child. Where every
           child is ASCII, a character past ASCII is one shared rule called last
           (multi_tail), so that the states inside its bytes are the same
           whatever the prefix, not a set of them for each prefix */
        int ascii = 1;
        for (size_t q = 0; q < nk; q++) ascii &= kids[q].hi < 0x80;
        kids[nk++] = (cp_range){0, 0x1F};
        kids[nk++] = (cp_range){'"', '"'};
        kids[nk++] = (cp_range){'\\', '\\'};
        if (ascii) {
            if (multi_tail < 0) {
                static const cp_range past_ascii = {0x80, 0x10FFFF};
                multi_tail = gb_rule(b, NULL, "key_multi_tail");
                gb_alt(b, multi_tail);
                gb_ref(b, multi_tail, gb_codepoints(b, &past_ascii, 1, 0));
                gb_ref(b, multi_tail, tail);
            }
            kids[nk++] = (cp_range){0x80, 0x10FFFF};
            gb_alt(b, r);
            gb_ref(b, r, multi_tail);
        }
        gb_alt(b, r);
        gb_ref(b, r, gb_codepoints(b, kids, nk, 1));
        gb_ref(b, r, tail);
        gb_alt(b, r); /* an escape (it may spell a name's character: a different text, so allowed) */
        gb_ref(b, r, string_escape(j));
        gb_ref(b, r, tail);
    }
    int key = gb_rule(b, NULL, "other_key");
    gb_alt(b, key);
    gb_byte(b, key, '"');
    gb_ref(b, key, ps[0].rule);
    free(ps);
    free(kids);
    return key;
}

static q3_status object_rule(js *j, const cJSON *s, int *out)
{
    gb *b = j->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return q3_fail(Q3_ERR_INVALID, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return q3_fail(Q3_ERR_INVALID, "'required' must be an array");
    /* the members: the listed properties, then required names not listed (their schema: additionalProperties) */
    int n = 0, cap = cJSON_GetArraySize(props) + cJSON_GetArraySize(req) + 1;
    const char **names = malloc((size_t)cap * sizeof *names);
    const cJSON **schemas = malloc((size_t)cap * sizeof *schemas);
    int *required = calloc((size_t)cap, sizeof *required);
    q3_status st = Q3_OK;
    if (!names || !schemas || !required) {
        st = nomem();
        goto done;
    }
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        names[n] = p->string;
        schemas[n++] = p;
    }
    cJSON_ArrayForEach(p, req) {
        if (!cJSON_IsString(p)) {
            st = q3_fail(Q3_ERR_INVALID, "'required' must hold strings");
            goto done;
        }
        int k;
        for (k = 0; k < n; k++)
            if (!strcmp(names[k], p->valuestring)) break;
        if (k == n) {
            names[n] = p->valuestring;
            schemas[n++] = add; /* NULL: any value */
        }
        required[k] = 1;
    }
    int w = ws(j);
    int *kv = malloc((size_t)(n + 1) * sizeof *kv);
    if (!kv) {
        st = nomem();
        goto done;
    }
    for (int i = 0; i < n; i++) {
        int v;
        if (schemas[i]) {
            if ((st = compile(j, schemas[i], &v))) {
                free(kv);
                goto done;
            }
        } else {
            v = value_any(j);
        }
        cJSON *k = cJSON_CreateString(names[i]);
        char *t = k ? cJSON_PrintUnformatted(k) : NULL;
        cJSON_Delete(k);
        if (!t) {
            free(kv);
            st = nomem();
            goto done;
        }
        kv[i] = gb_rule(b, NULL, "kv");
        gb_alt(b, kv[i]);
        gb_lit(b, kv[i], t, strlen(t));
        free(t);
        gb_ref(b, kv[i], w);
        gb_byte(b, kv[i], ':');
        gb_ref(b, kv[i], w);
        gb_ref(b, kv[i], v);
        gb_ref(b, kv[i], w);
    }
    /* additional members: any other key with the additionalProperties schema (absent or true: any value) */
    int add_kv = -1;
    if (!cJSON_IsFalse(add)) {
        int v;
        if (add && !cJSON_IsTrue(add)) {
            if ((st = compile(j, add, &v))) {
                free(kv);
                goto done;
            }
        } else {
            v = value_any(j);
        }
        add_kv = gb_rule(b, NULL, "kv_more");
        gb_alt(b, add_kv);
        gb_ref(b, add_kv, key_except(j, names, n));
        gb_ref(b, add_kv, w);
        gb_byte(b, add_kv, ':');
        gb_ref(b, add_kv, w);
        gb_ref(b, add_kv, v);
        gb_ref(b, add_kv, w);
    }
    /* start_i: members from i on, none written yet; after_i: the same after one was written */
    int start = gb_rule(b, NULL, "start"), after = gb_rule(b, NULL, "after");
    gb_alt(b, start);
    gb_alt(b, after);
    if (add_kv >= 0) {
        int more = gb_rule(b, NULL, "more");
        gb_alt(b, more);
        gb_byte(b, more, ',');
        gb_ref(b, more, w);
        gb_ref(b, more, add_kv);
        int moreS = gb_star(b, more);
        gb_alt(b, start);
        gb_ref(b, start, add_kv);
        gb_ref(b, start, moreS);
        gb_alt(b, after);
        gb_ref(b, after, moreS);
    }
    for (int i = n - 1; i >= 0; i--) {
        int s2 = gb_rule(b, NULL, "start"), a2 = gb_rule(b, NULL, "after");
        gb_alt(b, s2);
        gb_ref(b, s2, kv[i]);
        gb_ref(b, s2, after);
        gb_alt(b, a2);
        gb_byte(b, a2, ',');
        gb_ref(b, a2, w);
        gb_ref(b, a2, kv[i]);
        gb_ref(b, a2, after);
        if (!required[i]) {
            gb_alt(b, s2);
            gb_ref(b, s2, start);
            gb_alt(b, a2);
            gb_ref(b, a2, after);
        }
        start = s2;
        after = a2;
    }
    free(kv);
    int r = gb_rule(b, NULL, "object");
    gb_alt(b, r);
    gb_byte(b, r, '{');
    gb_ref(b, r, w);
    gb_ref(b, r, start);
    gb_byte(b, r, '}');
    *out = r;
done:
    free(names);
    free(schemas);
    free(required);
    return st;
}

/* ---- arrays ------------------------------------------------------------------------------ */

static q3_status array_rule(js *j, const cJSON *s, int *out)
{
    gb *b = j->b;
    q3_status st = Q3_OK;
    int lo = get_count(s, "minItems", 0, &st), hi = get_count(s, "maxItems", -1, &st);
    if (st) return st;
    const cJSON *uniq = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (cJSON_IsTrue(uniq)) return refuse("uniqueItems", "true is not supported");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *rest = items;
    if (cJSON_IsArray(items)) { /* the tuple form of drafts 4 to 2019-09 */
        if (prefix) return q3_fail(Q3_ERR_INVALID, "'items' as an array together with 'prefixItems'");
        prefix = items;
        rest = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    } else if (cJSON_GetObjectItemCaseSensitive(s, "additionalItems")) {
        rest = items; /* additionalItems means nothing without a tuple */
    }
    if (prefix && !cJSON_IsArray(prefix)) return q3_fail(Q3_ERR_INVALID, "'prefixItems' must be an array");
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    int w = ws(j);
    int *pv = malloc((size_t)(k + 1) * sizeof *pv);
    if (!pv) return nomem();
    for (int i = 0; i < k; i++)
        if ((st = compile(j, cJSON_GetArrayItem(prefix, i), &pv[i]))) {
            free(pv);
            return st;
        }
    int rv = -1;
    if (!cJSON_IsFalse(rest)) {
        if (rest && !cJSON_IsTrue(rest)) {
            if ((st = compile(j, rest, &rv))) {
                free(pv);
                return st;
            }
        } else {
            rv = value_any(j);
        }
    }
    /* elem_i: element i (0-based) with its separator */
    /* tail(i): the elements from i on, i written so far */
    int tail = gb_rule(b, NULL, "tail");
    gb_alt(b, tail);
    {
        /* after the prefix: c more rest elements, c in [max(lo-k,0), hi-k] */
        int cmin = lo > k ? lo - k : 0, cmax = hi < 0 ? -1 : hi - k;
        if (cmax >= 0 && cmax < cmin) {
            gclass none = {{0}};
            gb_bytes(b, tail, &none);
        } else if (rv >= 0 && cmax != 0) {
            int sep = gb_rule(b, NULL, "item");
            gb_alt(b, sep);
            gb_byte(b, sep, ',');
            gb_ref(b, sep, w);
            gb_ref(b, sep, rv);
            gb_ref(b, sep, w);
            if (k > 0) {
                gb_ref(b, tail, gb_repeat(b, sep, cmin, cmax));
            } else {
                /* the first element has no comma */
                int first = gb_rule(b, NULL, "items");
                gb_alt(b, first);
                gb_ref(b, first, rv);
                gb_ref(b, first, w);
                gb_ref(b, first, gb_repeat(b, sep, cmin > 0 ? cmin - 1 : 0, cmax < 0 ? -1 : cmax - 1));
                if (cmin == 0) gb_ref(b, tail, gb_opt(b, first));
                else gb_ref(b, tail, first);
            }
        } else if (cmin > 0) {
            gclass none = {{0}};
            gb_bytes(b, tail, &none);
        }
    }
    for (int i = k - 1; i >= 0; i--) {
        int t = gb_rule(b, NULL, "tail");
        gb_alt(b, t);
        if (i > 0) {
            gb_byte(b, t, ',');
            gb_ref(b, t, w);
        }
        gb_ref(b, t, pv[i]);
        gb_ref(b, t, w);
        gb_ref(b, t, tail);
        if (i >= lo && (hi < 0 || i <= hi)) gb_alt(b, t); /* stop after i elements */
        if (hi >= 0 && i >= hi) { /* no room for element i */
            int e = gb_rule(b, NULL, "tail");
            gb_alt(b, e);
            t = e;
        }
        tail = t;
    }
    free(pv);
    int r = gb_rule(b, NULL, "array");
    gb_alt(b, r);
    gb_byte(b, r, '[');
    gb_ref(b, r, w);
    gb_ref(b, r, tail);
    gb_byte(b, r, ']');
    *out = r;
    return Q3_OK;
}

/* ---- allOf: merging schemas ---------------------------------------------------------------- */

static q3_status deref(js *j, const cJSON *s, const cJSON **out)
{
    for (int hops = 0; hops < 64; hops++) {
        const cJSON *ref = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "$ref") : NULL;
        if (!ref) break;
        if (!cJSON_IsString(ref)) return q3_fail(Q3_ERR_INVALID, "'$ref' must be a string");
        int other = 0;
        for (const cJSON *c = s->child; c; c = c->next) other |= strcmp(c->string, "$ref") && is_supported(c->string);
        if (other) break; /* a $ref beside other keywords: merged by the caller */
        q3_status st = resolve(j, ref->valuestring, &s);
        if (st) return st;
    }
    *out = s;
    return Q3_OK;
}

static q3_status merge_into(js *j, cJSON *dst, const cJSON *src);

/* dst (owned, an object) gets src's keywords; both already dereferenced. */
static q3_status merge_into(js *j, cJSON *dst, const cJSON *src)
{
    if (cJSON_IsTrue(src)) return Q3_OK;
    if (cJSON_IsFalse(src)) {
        cJSON_DeleteItemFromObjectCaseSensitive(dst, "enum");
        cJSON_AddItemToObject(dst, "enum", cJSON_CreateArray());
        return Q3_OK;
    }
    if (!cJSON_IsObject(src)) return q3_fail(Q3_ERR_INVALID, "a schema must be an object or a boolean");
    for (const cJSON *c = src->child; c; c = c->next) {
        const char *k = c->string;
        if (is_refused(k)) return refuse(k, NULL);
        if (!is_supported(k)) continue; /* an annotation */
        cJSON *d = cJSON_GetObjectItemCaseSensitive(dst, k);
        if (!d) {
            cJSON_AddItemToObject(dst, k, cJSON_Duplicate(c, 1));
            continue;
        }
        if (!strcmp(k, "type")) {
            int a = 0, b2 = 0;
            cJSON tmp1 = {0}, tmp2 = {0};
            (void)tmp1;
            (void)tmp2;
            cJSON *wa = cJSON_CreateObject(), *wb = cJSON_CreateObject();
            cJSON_AddItemToObject(wa, "type", cJSON_Duplicate(d, 1));
            cJSON_AddItemToObject(wb, "type", cJSON_Duplicate(c, 1));
            q3_status st = types_of(wa, &a);
            if (!st) st = types_of(wb, &b2);
            cJSON_Delete(wa);
            cJSON_Delete(wb);
            if (st) return st;
            int m = a & b2;
            if ((a & T_NUMBER) && (b2 & T_INTEGER) && !(b2 & T_NUMBER)) m |= T_INTEGER;
            if ((b2 & T_NUMBER) && (a & T_INTEGER) && !(a & T_NUMBER)) m |= T_INTEGER;
            if ((m & T_NUMBER) && !((a & T_NUMBER) && (b2 & T_NUMBER))) m &= ~T_NUMBER;
            cJSON *arr = cJSON_CreateArray();
            static const char *n[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
            for (int i = 0; i < 7; i++)
                if (m & (1 << i)) cJSON_AddItemToArray(arr, cJSON_CreateString(n[i]));
            if (!cJSON_GetArraySize(arr)) {
                cJSON_Delete(arr);
                cJSON_DeleteItemFromObjectCaseSensitive(dst, "enum");
                cJSON_AddItemToObject(dst, "enum", cJSON_CreateArray());
                continue;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(dst, "type", arr);
        } else if (!strcmp(k, "properties")) {
            for (const cJSON *p = c->child; p; p = p->next) {
                cJSON *dp = cJSON_GetObjectItemCaseSensitive(d, p->string);
                if (!dp) {
                    cJSON_AddItemToObject(d, p->string, cJSON_Duplicate(p, 1));
                } else {
                    cJSON *all = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(all, "allOf");
                    cJSON_AddItemToArray(arr, cJSON_Duplicate(dp, 1));
                    cJSON_AddItemToArray(arr, cJSON_Duplicate(p, 1));
                    cJSON_ReplaceItemInObjectCaseSensitive(d, p->string, all);
                }
            }
        } else if (!strcmp(k, "required")) {
            for (const cJSON *p = c->child; p; p = p->next) {
                int have = 0;
                for (const cJSON *q = d->child; q; q = q->next) have |= cJSON_Compare(p, q, 1);
                if (!have) cJSON_AddItemToArray(d, cJSON_Duplicate(p, 1));
            }
        } else if (!strcmp(k, "minLength") || !strcmp(k, "minItems") || !strcmp(k, "minimum")) {
            if (c->valuedouble > d->valuedouble) cJSON_SetNumberValue(d, c->valuedouble);
        } else if (!strcmp(k, "maxLength") || !strcmp(k, "maxItems") || !strcmp(k, "maximum")) {
            if (c->valuedouble < d->valuedouble) cJSON_SetNumberValue(d, c->valuedouble);
        } else if (!strcmp(k, "exclusiveMinimum") && cJSON_IsNumber(c) && cJSON_IsNumber(d)) {
            if (c->valuedouble > d->valuedouble) cJSON_SetNumberValue(d, c->valuedouble);
        } else if (!strcmp(k, "exclusiveMaximum") && cJSON_IsNumber(c) && cJSON_IsNumber(d)) {
            if (c->valuedouble < d->valuedouble) cJSON_SetNumberValue(d, c->valuedouble);
        } else if (!strcmp(k, "additionalProperties") || !strcmp(k, "items")) {
            if (cJSON_IsArray(c) || cJSON_IsArray(d)) return refuse("allOf", "merging tuple 'items' is not supported");
            cJSON *all = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(all, "allOf");
            cJSON_AddItemToArray(arr, cJSON_Duplicate(d, 1));
            cJSON_AddItemToArray(arr, cJSON_Duplicate(c, 1));
            cJSON_ReplaceItemInObjectCaseSensitive(dst, k, all);
        } else if (!strcmp(k, "allOf")) {
            for (const cJSON *p = c->child; p; p = p->next) cJSON_AddItemToArray(d, cJSON_Duplicate(p, 1));
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
            /* both: any pair */
            cJSON *arr = cJSON_CreateArray();
            for (const cJSON *x = d->child; x; x = x->next)
                for (const cJSON *y = c->child; y; y = y->next) {
                    cJSON *all = cJSON_CreateObject(), *aa = cJSON_AddArrayToObject(all, "allOf");
                    cJSON_AddItemToArray(aa, cJSON_Duplicate(x, 1));
                    cJSON_AddItemToArray(aa, cJSON_Duplicate(y, 1));
                    cJSON_AddItemToArray(arr, all);
                }
            cJSON_ReplaceItemInObjectCaseSensitive(dst, k, arr);
        } else if (!strcmp(k, "enum")) {
            cJSON *arr = cJSON_CreateArray();
            for (const cJSON *x = d->child; x; x = x->next) {
                int in = 0;
                for (const cJSON *y = c->child; y; y = y->next) in |= cJSON_Compare(x, y, 1);
                if (in) cJSON_AddItemToArray(arr, cJSON_Duplicate(x, 1));
            }
            cJSON_ReplaceItemInObjectCaseSensitive(dst, "enum", arr);
        } else if (cJSON_Compare(c, d, 1)) {
            continue;
        } else if (!strcmp(k, "const")) {
            cJSON_DeleteItemFromObjectCaseSensitive(dst, "enum");
            cJSON_AddItemToObject(dst, "enum", cJSON_CreateArray());
        } else {
            return refuse("allOf", "two different values of one keyword that q3 cannot combine");
        }
    }
    (void)j;
    return Q3_OK;
}

/* ---- the schema ---------------------------------------------------------------------------- */

static q3_status compile_body(js *j, const cJSON *s, int r);

static q3_status compile(js *j, const cJSON *s, int *out)
{
    for (int i = 0; i < j->n_m; i++)
        if (j->m[i].node == s) {
            *out = j->m[i].rule;
            return Q3_OK;
        }
    if (++j->depth > MAX_DEPTH) return q3_fail(Q3_ERR_UNSUPPORTED, "the schema nests deeper than %d", MAX_DEPTH);
    int r = gb_rule(j->b, NULL, "schema");
    if (memo_add(j, s, NULL, r)) return nomem();
    q3_status st = compile_body(j, s, r);
    j->depth--;
    *out = r;
    return st;
}

static q3_status compile_body(js *j, const cJSON *s, int r)
{
    gb *b = j->b;
    if (cJSON_IsTrue(s)) {
        gb_alt(b, r);
        gb_ref(b, r, value_any(j));
        return Q3_OK;
    }
    if (cJSON_IsFalse(s)) {
        gclass none = {{0}};
        gb_alt(b, r);
        gb_bytes(b, r, &none);
        return Q3_OK;
    }
    if (!cJSON_IsObject(s)) return q3_fail(Q3_ERR_INVALID, "a schema must be an object or a boolean");
    for (const cJSON *c = s->child; c; c = c->next)
        if (is_refused(c->string)) return refuse(c->string, NULL);
    q3_status st;
    /* $ref: alone, the target; beside other keywords (2019-09+), merged with them */
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (ref || all) {
        if (ref && !cJSON_IsString(ref)) return q3_fail(Q3_ERR_INVALID, "'$ref' must be a string");
        int other = 0;
        for (const cJSON *c = s->child; c; c = c->next)
            other |= strcmp(c->string, "$ref") && is_supported(c->string);
        if (ref && !other) {
            const cJSON *t;
            if ((st = resolve(j, ref->valuestring, &t))) return st;
            int tr;
            if ((st = compile(j, t, &tr))) return st;
            gb_alt(b, r);
            gb_ref(b, r, tr);
            return Q3_OK;
        }
        if (all && !cJSON_IsArray(all)) return q3_fail(Q3_ERR_INVALID, "'allOf' must be an array");
        /* merged: this schema without $ref and allOf, then each part */
        cJSON *m = cJSON_CreateObject();
        if (own(j, m)) return nomem();
        for (const cJSON *c = s->child; c; c = c->next)
            if (strcmp(c->string, "$ref") && strcmp(c->string, "allOf") && is_supported(c->string))
                cJSON_AddItemToObject(m, c->string, cJSON_Duplicate(c, 1));
        if (ref) {
            const cJSON *t;
            if ((st = resolve(j, ref->valuestring, &t)) || (st = deref(j, t, &t)) || (st = merge_into(j, m, t))) return st;
        }
        const cJSON *part;
        cJSON_ArrayForEach(part, all) {
            const cJSON *t;
            if ((st = deref(j, part, &t)) || (st = merge_into(j, m, t))) return st;
        }
        /* the merged text names the schema: the same merge twice (recursion through allOf) is one rule */
        char *key = cJSON_PrintUnformatted(m);
        if (!key) return nomem();
        for (int i = 0; i < j->n_m; i++)
            if (j->m[i].key && !strcmp(j->m[i].key, key)) {
                free(key);
                gb_alt(b, r);
                gb_ref(b, r, j->m[i].rule);
                return Q3_OK;
            }
        if (memo_add(j, m, key, r)) {
            free(key);
            return nomem();
        }
        return compile_body(j, m, r);
    }
    /* anyOf / oneOf: each branch merged with the rest of this schema */
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (cJSON_GetObjectItemCaseSensitive(s, "anyOf") && cJSON_GetObjectItemCaseSensitive(s, "oneOf"))
        return refuse("oneOf", "together with anyOf in one schema is not supported");
    if (any) {
        if (!cJSON_IsArray(any) || !cJSON_GetArraySize(any))
            return q3_fail(Q3_ERR_INVALID, "'%s' must be a non-empty array", any->string);
        int other = 0;
        for (const cJSON *c = s->child; c; c = c->next)
            other |= c != any && is_supported(c->string);
        const cJSON *br;
        cJSON_ArrayForEach(br, any) {
            int br_rule;
            if (!other) {
                if ((st = compile(j, br, &br_rule))) return st;
            } else {
                cJSON *m = cJSON_CreateObject();
                if (own(j, m)) return nomem();
                cJSON *arr = cJSON_AddArrayToObject(m, "allOf");
                cJSON *rest = cJSON_CreateObject();
                for (const cJSON *c = s->child; c; c = c->next)
                    if (c != any && is_supported(c->string)) cJSON_AddItemToObject(rest, c->string, cJSON_Duplicate(c, 1));
                cJSON_AddItemToArray(arr, rest);
                cJSON_AddItemToArray(arr, cJSON_Duplicate(br, 1));
                if ((st = compile(j, m, &br_rule))) return st;
            }
            gb_alt(b, r);
            gb_ref(b, r, br_rule);
        }
        return Q3_OK;
    }
    int types;
    if ((st = types_of(s, &types))) return st;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        if (en && !cJSON_IsArray(en)) return q3_fail(Q3_ERR_INVALID, "'enum' must be an array");
        int any_alt = 0;
        for (const cJSON *v = cn ? cn : en->child; v; v = cn ? NULL : v->next) {
            if (!value_in_types(v, types)) continue;
            if (cn && en) { /* both: the const if it is in the enum */
                int in = 0;
                for (const cJSON *e = en->child; e; e = e->next) in |= cJSON_Compare(v, e, 1);
                if (!in) continue;
            }
            gb_alt(b, r);
            if ((st = literal(j, r, v))) return st;
            any_alt = 1;
        }
        if (!any_alt) {
            gclass none = {{0}};
            gb_alt(b, r);
            gb_bytes(b, r, &none);
        }
        return Q3_OK;
    }
    if (types & T_NULL) {
        gb_alt(b, r);
        gb_lit(b, r, "null", 4);
    }
    if (types & T_BOOL) {
        gb_alt(b, r);
        gb_lit(b, r, "true", 4);
        gb_alt(b, r);
        gb_lit(b, r, "false", 5);
    }
    int x = -1;
    if (types & T_STRING) {
        if ((st = string_rule(j, s, &x))) return st;
        gb_alt(b, r);
        gb_ref(b, r, x);
    }
    if (types & (T_NUMBER | T_INTEGER)) {
        if ((st = number_rule(j, s, !(types & T_NUMBER), &x))) return st;
        gb_alt(b, r);
        gb_ref(b, r, x);
    }
    if (types & T_OBJECT) {
        if ((st = object_rule(j, s, &x))) return st;
        gb_alt(b, r);
        gb_ref(b, r, x);
    }
    if (types & T_ARRAY) {
        if ((st = array_rule(j, s, &x))) return st;
        gb_alt(b, r);
        gb_ref(b, r, x);
    }
    return gb_error(b) ? q3_fail(gb_error(b), "out of memory") : Q3_OK;
}

static void js_free(js *j)
{
    for (int i = 0; i < j->n_m; i++) free(j->m[i].key);
    free(j->m);
    for (int i = 0; i < j->n_owned; i++) cJSON_Delete(j->owned[i]);
    free(j->owned);
    cJSON_Delete(j->doc);
}

static q3_status parse_doc(const char *text, size_t len, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out) return q3_fail(Q3_ERR_INVALID, "the schema is not valid JSON (near byte %zu)", end ? (size_t)(end - text) : 0);
    return Q3_OK;
}

q3_status json_schema_compile(gb *b, const char *text, size_t len, int *root)
{
    js j = {.b = b, .ws = -1, .value = -1, .string = -1, .number_any = -1, .integer_any = -1, .chr = -1, .escape = -1};
    q3_status st = parse_doc(text, len, &j.doc);
    if (st) return st;
    int r;
    st = compile(&j, j.doc, &r);
    js_free(&j);
    if (st) return st;
    *root = r;
    return gb_error(b) ? q3_fail(gb_error(b), "out of memory") : Q3_OK;
}

q3_status json_object_compile(gb *b, int *root)
{
    js j = {.b = b, .ws = -1, .value = -1, .string = -1, .number_any = -1, .integer_any = -1, .chr = -1, .escape = -1};
    *root = object_any(&j);
    js_free(&j);
    return gb_error(b) ? q3_fail(gb_error(b), "out of memory") : Q3_OK;
}

/* <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call> for each tool (or the named one). */
q3_status tool_call_compile(gb *b, const char *text, size_t len, int *root)
{
    js j = {.b = b, .ws = -1, .value = -1, .string = -1, .number_any = -1, .integer_any = -1, .chr = -1, .escape = -1};
    q3_status st = parse_doc(text, len, &j.doc);
    if (st) return st;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j.doc, "tools");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j.doc, "name");
    if (!cJSON_IsArray(tools) || (name && !cJSON_IsString(name))) {
        js_free(&j);
        return q3_fail(Q3_ERR_INVALID, "a tool call constraint is {\"tools\": [...], \"name\": \"optional\"}");
    }
    int r = gb_rule(b, "tool_call", NULL), found = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!fn) fn = t;
        const cJSON *fname = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(fname)) {
            js_free(&j);
            return q3_fail(Q3_ERR_INVALID, "a tool without a function name");
        }
        if (name && strcmp(name->valuestring, fname->valuestring)) continue;
        found = 1;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        int args;
        if (params) {
            /* $refs inside parameters point into the parameters themselves */
            cJSON *saved = j.doc;
            j.doc = (cJSON *)params;
            st = compile(&j, params, &args);
            j.doc = saved;
            if (st) {
                js_free(&j);
                return q3_fail_wrap(st, "tool '%s'", fname->valuestring);
            }
        } else {
            args = object_any(&j);
        }
        cJSON *k = cJSON_CreateString(fname->valuestring);
        char *ks = k ? cJSON_PrintUnformatted(k) : NULL;
        cJSON_Delete(k);
        if (!ks) {
            js_free(&j);
            return nomem();
        }
        gb_alt(b, r);
        gb_token(b, r, "<tool_call>");
        gb_lit(b, r, "\n{\"name\": ", 10);
        gb_lit(b, r, ks, strlen(ks));
        gb_lit(b, r, ", \"arguments\": ", 15);
        gb_ref(b, r, args);
        gb_lit(b, r, "}\n", 2);
        gb_token(b, r, "</tool_call>");
        free(ks);
    }
    js_free(&j);
    if (!found)
        return q3_fail(Q3_ERR_INVALID, name ? "no tool named '%s'" : "no tools%s", name ? name->valuestring : "");
    *root = r;
    return gb_error(b) ? q3_fail(gb_error(b), "out of memory") : Q3_OK;
}

const char *const *q3_json_schema_keywords(q3_schema_list which)
{
    switch (which) {
    case Q3_SCHEMA_SUPPORTED: return supported_words;
    case Q3_SCHEMA_REFUSED: return refused_words;
    case Q3_SCHEMA_FORMATS: return format_names;
    }
    return NULL;
}
