/* The grammar builder (grammar.h): rules and alternatives grown in place,
 * then finished into the flat, immutable q3g the recognizer reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/error.h"

typedef struct galt {
    gsym *s;
    int32_t *rep; /* [cap] beside s: the grepeat a position stands at, or -1 */
    int n, cap;
} galt;

typedef struct grule {
    char *name;
    galt *alts;
    int n, cap;
    int defined; /* gb_alt was called on it */
    int used;    /* some alternative references it */
} grule;

struct gb {
    grule *rules;
    int n_rules, cap_rules;
    gclass *classes;
    int n_classes, cap_classes;
    int *class_hash; /* open addressing: class index + 1, 0 empty */
    int hash_cap;
    char **tokens;
    int n_tokens, cap_tokens;
    grepeat *reps;
    int n_reps, cap_reps;
    int n_repeats; /* counted repetitions made (their ids) */
    int n_generated;
    q3_status err;
    char errmsg[256];
};

void gb_set_error(gb *b, q3_status st, const char *msg)
{
    if (b->err) return;
    b->err = st;
    snprintf(b->errmsg, sizeof b->errmsg, "%s", msg);
}

q3_status gb_error(const gb *b) { return b->err; }

static void *grow(gb *b, void *p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return p;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    if (!q) {
        gb_set_error(b, Q3_ERR_NOMEM, "out of memory");
        return NULL;
    }
    *cap = c;
    return q;
}

gb *gb_new(void) { return calloc(1, sizeof(gb)); }

void gb_free(gb *b)
{
    if (!b) return;
    for (int r = 0; r < b->n_rules; r++) {
        for (int a = 0; a < b->rules[r].n; a++) {
            free(b->rules[r].alts[a].s);
            free(b->rules[r].alts[a].rep);
        }
        free(b->rules[r].alts);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->classes);
    free(b->class_hash);
    for (int i = 0; i < b->n_tokens; i++) free(b->tokens[i]);
    free(b->tokens);
    free(b->reps);
    free(b);
}

static int new_rule(gb *b, char *name)
{
    if (!name) {
        gb_set_error(b, Q3_ERR_NOMEM, "out of memory");
        return 0;
    }
    grule *nr = grow(b, b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules);
    if (!nr) {
        free(name);
        return 0;
    }
    b->rules = nr;
    memset(&b->rules[b->n_rules], 0, sizeof *b->rules);
    b->rules[b->n_rules].name = name;
    return b->n_rules++;
}

int gb_rule(gb *b, const char *name, const char *hint)
{
    if (name) return new_rule(b, strdup(name));
    char buf[96];
    snprintf(buf, sizeof buf, "%s_%d", hint ? hint : "r", b->n_generated++);
    return new_rule(b, strdup(buf));
}

int gb_rule_named(gb *b, const char *name, size_t len)
{
    for (int r = 0; r < b->n_rules; r++)
        if (strlen(b->rules[r].name) == len && !memcmp(b->rules[r].name, name, len)) return r;
    return new_rule(b, strndup(name, len));
}

int gb_rule_defined(const gb *b, int r) { return b->rules[r].defined; }
const char *gb_rule_name(const gb *b, int r) { return b->rules[r].name; }

void gb_alt(gb *b, int r)
{
    if (b->err) return;
    grule *R = &b->rules[r];
    galt *na = grow(b, R->alts, &R->cap, R->n + 1, sizeof *R->alts);
    if (!na) return;
    R->alts = na;
    memset(&R->alts[R->n++], 0, sizeof *R->alts);
    R->defined = 1;
}

static void push(gb *b, int r, unsigned kind, unsigned arg)
{
    if (b->err) return;
    grule *R = &b->rules[r];
    if (!R->n) gb_alt(b, r);
    if (b->err) return;
    galt *A = &R->alts[R->n - 1];
    if (A->n == A->cap) {
        int cap = A->cap, cap2 = A->cap;
        gsym *ns = grow(b, A->s, &cap, A->n + 1, sizeof *A->s);
        if (!ns) return;
        A->s = ns;
        int32_t *nr = grow(b, A->rep, &cap2, A->n + 1, sizeof *A->rep);
        if (!nr) return;
        A->rep = nr;
        A->cap = cap;
    }
    A->s[A->n].kind = kind;
    A->s[A->n].arg = arg;
    A->rep[A->n] = -1;
    A->n++;
}

static uint64_t class_hash(const gclass *c)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4; i++) h = (h ^ c->w[i]) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 31);
}

static int class_index(gb *b, const gclass *c)
{
    if (b->n_classes * 2 >= b->hash_cap) {
        int cap = b->hash_cap ? b->hash_cap * 2 : 64;
        int *h = calloc((size_t)cap, sizeof *h);
        if (!h) {
            gb_set_error(b, Q3_ERR_NOMEM, "out of memory");
            return -1;
        }
        for (int i = 0; i < b->n_classes; i++) {
            size_t k = class_hash(&b->classes[i]) & (size_t)(cap - 1);
            while (h[k]) k = (k + 1) & (size_t)(cap - 1);
            h[k] = i + 1;
        }
        free(b->class_hash);
        b->class_hash = h;
        b->hash_cap = cap;
    }
    size_t k = class_hash(c) & (size_t)(b->hash_cap - 1);
    while (b->class_hash[k]) {
        int i = b->class_hash[k] - 1;
        if (!memcmp(&b->classes[i], c, sizeof *c)) return i;
        k = (k + 1) & (size_t)(b->hash_cap - 1);
    }
    gclass *nc = grow(b, b->classes, &b->cap_classes, b->n_classes + 1, sizeof *b->classes);
    if (!nc) return -1;
    b->classes = nc;
    b->classes[b->n_classes] = *c;
    b->class_hash[k] = b->n_classes + 1;
    return b->n_classes++;
}

void gb_bytes(gb *b, int r, const gclass *c)
{
    if (b->err) return;
    int i = class_index(b, c);
    if (i >= 0) push(b, r, GS_BYTES, (unsigned)i);
}

void gb_byte(gb *b, int r, unsigned char c)
{
    gclass k = {{0}};
    gclass_add(&k, c);
    gb_bytes(b, r, &k);
}

void gb_lit(gb *b, int r, const char *s, size_t n)
{
    if (!b->rules[r].n) gb_alt(b, r); /* an empty literal still opens the alternative */
    for (size_t i = 0; i < n; i++) gb_byte(b, r, (unsigned char)s[i]);
}

void gb_ref(gb *b, int r, int callee)
{
    if (b->err) return;
    b->rules[callee].used = 1;
    push(b, r, GS_RULE, (unsigned)callee);
}

void gb_token(gb *b, int r, const char *name)
{
    if (b->err) return;
    int i;
    for (i = 0; i < b->n_tokens; i++)
        if (!strcmp(b->tokens[i], name)) break;
    if (i == b->n_tokens) {
        char **nt = grow(b, b->tokens, &b->cap_tokens, b->n_tokens + 1, sizeof *b->tokens);
        if (!nt) return;
        b->tokens = nt;
        if (!(b->tokens[i] = strdup(name))) {
            gb_set_error(b, Q3_ERR_NOMEM, "out of memory");
            return;
        }
        b->n_tokens++;
    }
    push(b, r, GS_TOKEN, (unsigned)i);
}

/* ---- repetition helpers ----------------------------------------------------
 * All right-recursive: the recognizer's tail calls keep x* in constant stack. */

int gb_star(gb *b, int item)
{
    int s = gb_rule(b, NULL, b->rules[item].name);
    gb_alt(b, s);
    gb_ref(b, s, item);
    gb_ref(b, s, s);
    gb_alt(b, s);
    return s;
}

int gb_plus(gb *b, int item)
{
    int star = gb_star(b, item);
    int p = gb_rule(b, NULL, b->rules[item].name);
    gb_alt(b, p);
    gb_ref(b, p, item);
    gb_ref(b, p, star);
    return p;
}

int gb_opt(gb *b, int item)
{
    int o = gb_rule(b, NULL, b->rules[item].name);
    gb_alt(b, o);
    gb_ref(b, o, item);
    gb_alt(b, o);
    return o;
}

/* Marks the last symbol of r's last alternative as the position where
 * repetition `id` needs req more items and allows tot (grammar.h's grepeat):
 * each symbol so marked follows an item, so it is where a parser stack waits
 * while the item is read. */
static void mark_count(gb *b, int r, int id, int req, int tot)
{
    if (b->err) return;
    grepeat *nr = grow(b, b->reps, &b->cap_reps, b->n_reps + 1, sizeof *b->reps);
    if (!nr) return;
    b->reps = nr;
    b->reps[b->n_reps] = (grepeat){.rep = id, .req = req, .tot = tot};
    galt *A = &b->rules[r].alts[b->rules[r].n - 1];
    A->rep[A->n - 1] = b->n_reps++;
}

int gb_repeat(gb *b, int item, int min, int max)
{
    int id = b->n_repeats++;
    int r = gb_rule(b, NULL, b->rules[item].name);
    gb_alt(b, r);
    for (int i = 0; i < min; i++) {
        gb_ref(b, r, item);
        if (i > 0) mark_count(b, r, id, min - i, max < 0 ? INT32_MAX : max - i);
    }
    if (max < 0) {
        gb_ref(b, r, gb_star(b, item));
        if (min > 0) mark_count(b, r, id, 0, INT32_MAX);
    } else if (max > min) {
        /* tail_k: up to k more items, nested so that no two parses of one text exist */
        int tail = gb_opt(b, item);
        for (int k = 2; k <= max - min; k++) {
            int t = gb_rule(b, NULL, b->rules[item].name);
            gb_alt(b, t);
            gb_ref(b, t, item);
            gb_ref(b, t, tail);
            mark_count(b, t, id, 0, k - 1);
            gb_alt(b, t);
            tail = t;
        }
        gb_ref(b, r, tail);
        if (min > 0) mark_count(b, r, id, 0, max - min);
    }
    return r;
}

int gb_lit_rule(gb *b, const char *s, size_t n)
{
    int r = gb_rule(b, NULL, "lit");
    gb_alt(b, r);
    gb_lit(b, r, s, n);
    return r;
}

/* ---- finishing -------------------------------------------------------------- */

void q3g_free(q3g *g)
{
    if (!g) return;
    free(g->syms);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g->rule_nalt);
    if (g->rule_name)
        for (int r = 0; r < g->n_rules; r++) free(g->rule_name[r]);
    free(g->rule_name);
    free(g->classes);
    free(g->sym_rep);
    free(g->reps);
    if (g->token_names)
        for (int i = 0; i < g->n_token_names; i++) free(g->token_names[i]);
    free(g->token_names);
    free(g);
}

static int class_empty(const gclass *c) { return !(c->w[0] | c->w[1] | c->w[2] | c->w[3]); }

/* Left recursion: a rule reachable from itself through leftmost positions
 * (those after only nullable symbols). Returns a rule on a cycle, or -1. */
static int left_cycle(gb *b, const unsigned char *nullable, int r, unsigned char *color)
{
    color[r] = 1;
    grule *R = &b->rules[r];
    for (int a = 0; a < R->n; a++) {
        galt *A = &R->alts[a];
        for (int i = 0; i < A->n; i++) {
            if (A->s[i].kind != GS_RULE) break;
            int c = (int)A->s[i].arg;
            if (color[c] == 1) return c;
            if (color[c] == 0) {
                int k = left_cycle(b, nullable, c, color);
                if (k >= 0) return k;
            }
            if (!nullable[c]) break;
        }
    }
    color[r] = 2;
    return -1;
}

q3_status gb_finish(gb *b, int root, q3g **out)
{
    *out = NULL;
    if (b->err) return q3_fail(b->err, "%s", b->errmsg);
    int n = b->n_rules;
    for (int r = 0; r < n; r++)
        if (b->rules[r].used && !b->rules[r].defined)
            return q3_fail(Q3_ERR_INVALID, "rule '%s' is used but not defined", b->rules[r].name);
    unsigned char *prod = calloc((size_t)n, 1), *nullable = calloc((size_t)n, 1), *color = calloc((size_t)n, 1);
    q3g *g = calloc(1, sizeof *g);
    q3_status st = Q3_OK;
    if (!prod || !nullable || !color || !g) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* productive: some alternative whose every symbol can derive a finite string */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (prod[r]) continue;
            for (int a = 0; a < b->rules[r].n && !prod[r]; a++) {
                galt *A = &b->rules[r].alts[a];
                int ok = 1;
                for (int i = 0; i < A->n && ok; i++) {
                    if (A->s[i].kind == GS_RULE) ok = prod[A->s[i].arg];
                    else if (A->s[i].kind == GS_BYTES) ok = !class_empty(&b->classes[A->s[i].arg]);
                }
                if (ok) prod[r] = changed = 1;
            }
        }
    }
    if (!prod[root]) {
        st = q3_fail(Q3_ERR_INVALID, "the grammar matches no string (rule '%s' never ends)", b->rules[root].name);
        goto done;
    }
    /* drop the alternatives that can never complete */
    for (int r = 0; r < n; r++) {
        grule *R = &b->rules[r];
        int k = 0;
        for (int a = 0; a < R->n; a++) {
            galt *A = &R->alts[a];
            int ok = 1;
            for (int i = 0; i < A->n && ok; i++) {
                if (A->s[i].kind == GS_RULE) ok = prod[A->s[i].arg];
                else if (A->s[i].kind == GS_BYTES) ok = !class_empty(&b->classes[A->s[i].arg]);
            }
            if (ok) R->alts[k++] = *A;
            else {
                free(A->s);
                free(A->rep);
            }
        }
        R->n = k;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < b->rules[r].n && !nullable[r]; a++) {
                galt *A = &b->rules[r].alts[a];
                int ok = 1;
                for (int i = 0; i < A->n && ok; i++) ok = A->s[i].kind == GS_RULE && nullable[A->s[i].arg];
                if (ok) nullable[r] = changed = 1;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        if (color[r]) continue;
        int c = left_cycle(b, nullable, r, color);
        if (c >= 0) {
            st = q3_fail(Q3_ERR_UNSUPPORTED,
                         "rule '%s' is left-recursive (it can reach itself before reading a byte); "
                         "write `a ::= b c*` instead of `a ::= a c | b`",
                         b->rules[c].name);
            goto done;
        }
    }
    /* flatten */
    int n_alts = 0, n_syms = 0;
    for (int r = 0; r < n; r++) {
        n_alts += b->rules[r].n;
        for (int a = 0; a < b->rules[r].n; a++) n_syms += b->rules[r].alts[a].n + 1;
    }
    g->syms = malloc((size_t)(n_syms ? n_syms : 1) * sizeof *g->syms);
    g->alt_start = malloc((size_t)(n_alts ? n_alts : 1) * sizeof *g->alt_start);
    g->rule_alt0 = malloc((size_t)n * sizeof *g->rule_alt0);
    g->rule_nalt = malloc((size_t)n * sizeof *g->rule_nalt);
    g->rule_name = calloc((size_t)n, sizeof *g->rule_name);
    g->classes = malloc((size_t)(b->n_classes ? b->n_classes : 1) * sizeof *g->classes);
    g->token_names = calloc((size_t)(b->n_tokens ? b->n_tokens : 1), sizeof *g->token_names);
    if (b->n_reps) {
        g->sym_rep = malloc((size_t)(n_syms ? n_syms : 1) * sizeof *g->sym_rep);
        g->reps = malloc((size_t)b->n_reps * sizeof *g->reps);
        if (!g->sym_rep || !g->reps) {
            st = q3_fail(Q3_ERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(g->reps, b->reps, (size_t)b->n_reps * sizeof *g->reps);
        g->n_reps = b->n_reps;
    }
    if (!g->syms || !g->alt_start || !g->rule_alt0 || !g->rule_nalt || !g->rule_name || !g->classes ||
        !g->token_names) {
        st = q3_fail(Q3_ERR_NOMEM, "out of memory");
        goto done;
    }
    g->n_rules = n;
    int ai = 0, si = 0;
    for (int r = 0; r < n; r++) {
        g->rule_alt0[r] = ai;
        g->rule_nalt[r] = b->rules[r].n;
        if (!(g->rule_name[r] = strdup(b->rules[r].name))) {
            st = q3_fail(Q3_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int a = 0; a < b->rules[r].n; a++) {
            galt *A = &b->rules[r].alts[a];
            g->alt_start[ai++] = si;
            if (A->n) memcpy(g->syms + si, A->s, (size_t)A->n * sizeof *A->s);
            if (g->sym_rep) {
                if (A->n) memcpy(g->sym_rep + si, A->rep, (size_t)A->n * sizeof *A->rep);
                g->sym_rep[si + A->n] = -1;
            }
            si += A->n;
            g->syms[si].kind = GS_END;
            g->syms[si].arg = 0;
            si++;
        }
    }
    g->n_syms = n_syms;
    g->n_alts = n_alts;
    if (b->n_classes) memcpy(g->classes, b->classes, (size_t)b->n_classes * sizeof *g->classes);
    g->n_classes = b->n_classes;
    for (int i = 0; i < b->n_tokens; i++)
        if (!(g->token_names[i] = strdup(b->tokens[i]))) {
            st = q3_fail(Q3_ERR_NOMEM, "out of memory");
            goto done;
        }
    g->n_token_names = b->n_tokens;
    g->root = root;
    g->root_after_think = -1;
    g->bytes = sizeof *g + (size_t)n_syms * sizeof *g->syms + (size_t)n_alts * sizeof(int) +
               (size_t)n * (2 * sizeof(int) + sizeof(char *) + 16) + (size_t)b->n_classes * sizeof(gclass) +
               (g->sym_rep ? (size_t)n_syms * sizeof *g->sym_rep : 0) + (size_t)g->n_reps * sizeof *g->reps;
done:
    free(prod);
    free(nullable);
    free(color);
    if (st) q3g_free(g);
    else *out = g;
    return st;
}
