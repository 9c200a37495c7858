/* JSON the way Python's json.dumps(ensure_ascii=False) writes it; see
 * json_write.h for the rules and why number literals are kept. */
#include "text/json_write.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/strbuf.h"

/* ---- parsing, keeping number literals ---------------------------------- */

/* Finds the next number token at or after *cursor in valid JSON text,
 * skipping over strings (whose digits are not numbers). A number token is
 * what cJSON's own lexer takes: a '-' or digit, then any of [0-9+-.eE].
 * Returns its start and length, and moves *cursor past it; NULL at the end. */
static const char *next_number_token(const char **cursor, size_t *len)
{
    const char *p = *cursor;
    while (*p) {
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (*p) p++;
        } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
            const char *start = p;
            while (*p && strchr("0123456789+-.eE", *p)) p++;
            *len = (size_t)(p - start);
            *cursor = p;
            return start;
        } else {
            p++;
        }
    }
    return NULL;
}

/* Gives every number node of the list starting at node (and of everything
 * below it) its literal, walking the tree in document order in step with
 * the text: the k-th number node is the k-th number token. */
static q3_status attach_literals(cJSON *node, const char **cursor)
{
    for (; node; node = node->next) {
        if (cJSON_IsNumber(node)) {
            size_t n = 0;
            const char *tok = next_number_token(cursor, &n);
            if (!tok) return q3_fail(Q3_ERR_FORMAT, "JSON: number literals out of step with the parse");
            char *lit = cJSON_malloc(n + 1);
            if (!lit) return q3_fail(Q3_ERR_NOMEM, "JSON: out of memory keeping a number literal");
            memcpy(lit, tok, n);
            lit[n] = 0;
            node->valuestring = lit;
        } else if (node->child) {
            q3_status st = attach_literals(node->child, cursor);
            if (st != Q3_OK) return st;
        }
    }
    return Q3_OK;
}

size_t q3_json_find_nul(const char *text, size_t len)
{
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == 0) return i;
        if (!in_string) {
            in_string = c == '"';
        } else if (c == '"') {
            in_string = 0;
        } else if (c == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && len - i >= 6 && !memcmp(text + i + 2, "0000", 4)) return i;
            i++; /* the escaped character */
        }
    }
    return len;
}

q3_status q3_json_parse(const char *text, cJSON **out)
{
    *out = NULL;
    size_t len = strlen(text), nul = q3_json_find_nul(text, len);
    if (nul < len) {
        int line = 1, col = 1;
        for (size_t i = 0; i < nul; i++) {
            if (text[i] == '\n') line++, col = 1;
            else col++;
        }
        return q3_fail(Q3_ERR_UNSUPPORTED,
                       "JSON: a string holds \\u0000 (a NUL character) at line %d, column %d: q3 takes "
                       "text without NUL characters",
                       line, col);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        /* cJSON reports where it stopped; turn that into line:column. */
        const char *at = end ? end : text;
        int line = 1, col = 1;
        for (const char *p = text; p < at && *p; p++) {
            if (*p == '\n') line++, col = 1;
            else col++;
        }
        if (!*text || strspn(text, " \t\r\n") == strlen(text))
            return q3_fail(Q3_ERR_FORMAT, "JSON: empty input");
        return q3_fail(Q3_ERR_FORMAT, "JSON syntax error at line %d, column %d (near \"%.20s\")",
                       line, col, at);
    }
    const char *cursor = text;
    q3_status st = attach_literals(root, &cursor);
    if (st != Q3_OK) {
        cJSON_Delete(root);
        return st;
    }
    *out = root;
    return Q3_OK;
}

/* ---- numbers ----------------------------------------------------------- */

/* The node's source literal if it still describes the node's value (a
 * caller may have changed valuedouble since parsing), else NULL. */
static const char *number_literal(const cJSON *num)
{
    const char *lit = num->valuestring;
    if (!lit || !*lit) return NULL;
    char *end = NULL;
    double v = strtod(lit, &end);
    if (*end || !(v == num->valuedouble || (isnan(v) && isnan(num->valuedouble)))) return NULL;
    return lit;
}

int q3_json_number_is_int(const cJSON *number)
{
    const char *lit = number_literal(number);
    if (lit) return strpbrk(lit, ".eE") == NULL;
    double v = number->valuedouble;
    return isfinite(v) && v == floor(v) && fabs(v) <= 9007199254740992.0;
}

/* Shortest decimal digits that read back as x (x finite, nonzero, > 0):
 * digits (no sign, no trailing zeros) into dig, and the power of ten of the
 * first digit into *exp10, so x = d.ddd * 10^exp10. Among equally short
 * candidates the nearest wins, as in Python's repr: for each precision we
 * try the correctly rounded one (printf rounds exactly), then its two
 * neighbours, which matter only where the gap below x is half the gap above
 * (powers of two). */
static void shortest_digits(double x, char dig[24], int *exp10)
{
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        /* tmp is "d.ddde[+-]XX": gather the mantissa as an integer. */
        uint64_t m = 0;
        const char *p = tmp;
        for (; *p && *p != 'e'; p++)
            if (*p >= '0' && *p <= '9') m = m * 10 + (uint64_t)(*p - '0');
        int e = atoi(p + 1) - (prec - 1); /* x ~= m * 10^e */
        uint64_t cands[3] = {m, m - 1, m + 1};
        for (int c = 0; c < 3; c++) {
            if (cands[c] == 0) continue;
            snprintf(tmp, sizeof tmp, "%" PRIu64 "e%d", cands[c], e);
            if (strtod(tmp, NULL) != x) continue;
            int n = snprintf(dig, 24, "%" PRIu64, cands[c]);
            int first = n - 1 + e;
            while (n > 1 && dig[n - 1] == '0') dig[--n] = 0;
            *exp10 = first;
            return;
        }
    }
    /* Unreachable: 17 significant digits always round-trip a double. */
    snprintf(tmp, sizeof tmp, "%.16e", x);
    int n = 0;
    for (const char *p = tmp; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') dig[n++] = *p;
    dig[n] = 0;
    *exp10 = atoi(strchr(tmp, 'e') + 1);
}

int q3_json_format_double(double x, char *buf, size_t cap)
{
    if (isnan(x)) return snprintf(buf, cap, "nan");
    if (isinf(x)) return snprintf(buf, cap, x < 0 ? "-inf" : "inf");
    if (x == 0) return snprintf(buf, cap, signbit(x) ? "-0.0" : "0.0");

    char dig[24];
    int e;
    shortest_digits(fabs(x), dig, &e);
    int nd = (int)strlen(dig);
    const char *sign = x < 0 ? "-" : "";

    /* Python's repr switches to exponent form below 1e-4 and from 1e16 on. */
    if (e < -4 || e >= 16) {
        return snprintf(buf, cap, "%s%c%s%se%c%02d", sign, dig[0], nd > 1 ? "." : "", dig + 1,
                        e < 0 ? '-' : '+', abs(e));
    }
    char tmp[48];
    if (e < 0) { /* 0.000ddd */
        snprintf(tmp, sizeof tmp, "%s0.%.*s%s", sign, -e - 1, "000", dig);
    } else if (nd <= e + 1) { /* ddd000.0 */
        snprintf(tmp, sizeof tmp, "%s%s%.*s.0", sign, dig, e + 1 - nd, "0000000000000000");
    } else { /* dd.ddd */
        snprintf(tmp, sizeof tmp, "%s%.*s.%s", sign, e + 1, dig, dig + e + 1);
    }
    return snprintf(buf, cap, "%s", tmp);
}

int q3_json_format_number(const cJSON *number, char *buf, size_t cap)
{
    const char *lit = number_literal(number);
    if (lit && !strpbrk(lit, ".eE")) {
        /* An integer literal: Python's int prints its digits exactly,
         * without leading zeros, and -0 as 0. */
        const char *d = lit;
        int neg = *d == '-';
        if (neg || *d == '+') d++;
        while (d[0] == '0' && d[1]) d++;
        if (!strcmp(d, "0")) neg = 0;
        return snprintf(buf, cap, "%s%s", neg ? "-" : "", d);
    }
    double v = number->valuedouble;
    if (!lit && q3_json_number_is_int(number)) return snprintf(buf, cap, "%.0f", v);
    if (isnan(v)) return snprintf(buf, cap, "NaN");
    if (isinf(v)) return snprintf(buf, cap, v < 0 ? "-Infinity" : "Infinity");
    return q3_json_format_double(v, buf, cap);
}

/* ---- writing ----------------------------------------------------------- */


/* A JSON string as Python's encoder writes it with ensure_ascii=False. */
static void write_string(q3_strbuf *b, const char *s)
{
    q3_strbuf_put(b, "\"", 1);
    const char *run = s; /* bytes copied verbatim since the last escape */
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        char hex[8];
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (*p < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", *p);
                esc = hex;
            }
        }
        if (esc) {
            q3_strbuf_put(b, run, (size_t)((const char *)p - run));
            q3_strbuf_puts(b, esc);
            run = (const char *)p + 1;
        }
    }
    q3_strbuf_puts(b, run);
    q3_strbuf_put(b, "\"", 1);
}

/* The last member of obj named key, as a Python dict would keep it. */
static const cJSON *last_member(const cJSON *obj, const char *key)
{
    const cJSON *found = NULL;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (c->string && !strcmp(c->string, key)) found = c;
    return found;
}

static int seen_before(const cJSON *obj, const cJSON *member)
{
    for (const cJSON *c = obj->child; c != member; c = c->next)
        if (c->string && !strcmp(c->string, member->string)) return 1;
    return 0;
}

static q3_status write_value(q3_strbuf *b, const cJSON *v)
{
    char num[64];
    switch (v->type & 0xff) {
    case cJSON_NULL: q3_strbuf_puts(b, "null"); break;
    case cJSON_False: q3_strbuf_puts(b, "false"); break;
    case cJSON_True: q3_strbuf_puts(b, "true"); break;
    case cJSON_Number: {
        int n = q3_json_format_number(v, num, sizeof num);
        if (n < (int)sizeof num) {
            q3_strbuf_puts(b, num);
        } else { /* a very long integer literal */
            char *big = malloc((size_t)n + 1);
            if (!big) return q3_fail(Q3_ERR_NOMEM, "JSON: out of memory");
            q3_json_format_number(v, big, (size_t)n + 1);
            q3_strbuf_puts(b, big);
            free(big);
        }
        break;
    }
    case cJSON_String: write_string(b, v->valuestring ? v->valuestring : ""); break;
    case cJSON_Raw: q3_strbuf_puts(b, v->valuestring ? v->valuestring : ""); break;
    case cJSON_Array: {
        q3_strbuf_puts(b, "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) q3_strbuf_puts(b, ", ");
            q3_status st = write_value(b, c);
            if (st != Q3_OK) return st;
        }
        q3_strbuf_puts(b, "]");
        break;
    }
    case cJSON_Object: {
        q3_strbuf_puts(b, "{");
        int first = 1;
        for (const cJSON *c = v->child; c; c = c->next) {
            if (!c->string) return q3_fail(Q3_ERR_INVALID, "JSON: object member without a key");
            if (seen_before(v, c)) continue;
            if (!first) q3_strbuf_puts(b, ", ");
            first = 0;
            write_string(b, c->string);
            q3_strbuf_puts(b, ": ");
            q3_status st = write_value(b, last_member(v, c->string));
            if (st != Q3_OK) return st;
        }
        q3_strbuf_puts(b, "}");
        break;
    }
    default: return q3_fail(Q3_ERR_INVALID, "JSON: node of unknown type %d", v->type);
    }
    return Q3_OK;
}

q3_status q3_json_dumps(const cJSON *item, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    if (!item) return q3_fail(Q3_ERR_INVALID, "JSON: nothing to write (NULL)");
    q3_strbuf b = {0};
    q3_status st = write_value(&b, item);
    if (st == Q3_OK && b.oom) st = q3_fail(Q3_ERR_NOMEM, "JSON: out of memory");
    if (st == Q3_OK && !b.data) { /* cannot happen: every value writes something */
        b.data = calloc(1, 1);
        if (!b.data) st = q3_fail(Q3_ERR_NOMEM, "JSON: out of memory");
    }
    if (st != Q3_OK) {
        free(b.data);
        return st;
    }
    *out = b.data;
    if (len) *len = b.len;
    return Q3_OK;
}
