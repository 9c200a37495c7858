/* The byte-level recognizer (recognizer.h): hash-consed stacks, interned
 * states, memoized transitions. */
#include <stdlib.h>
#include <string.h>

#include "grammar/recognizer.h"
#include "util/error.h"

static uint32_t mix2(uint32_t a, uint32_t b)
{
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

static int fail_nomem(rec *r)
{
    r->failed = 1;
    q3_fail(Q3_ERR_NOMEM, "out of memory");
    return REC_ERROR;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* ---- nodes --------------------------------------------------------------------- */

static int rehash_nodes(rec *r, uint32_t cap)
{
    int32_t *h = calloc(cap, sizeof *h);
    if (!h) return -1;
    for (int i = 1; i < r->n_nodes; i++) {
        uint32_t k = mix2((uint32_t)r->npos[i], (uint32_t)r->npar[i]) & (cap - 1);
        while (h[k]) k = (k + 1) & (cap - 1);
        h[k] = i + 1;
    }
    free(r->nhash);
    r->nhash = h;
    r->nhash_cap = cap;
    return 0;
}

/* The node (pos, par), made if new; -1 on failure. */
static int node(rec *r, int pos, int par)
{
    if ((uint32_t)r->n_nodes * 2 >= r->nhash_cap && rehash_nodes(r, r->nhash_cap ? r->nhash_cap * 2 : 1024))
        return -1;
    uint32_t k = mix2((uint32_t)pos, (uint32_t)par) & (r->nhash_cap - 1);
    for (int32_t e; (e = r->nhash[k]); k = (k + 1) & (r->nhash_cap - 1))
        if (r->npos[e - 1] == pos && r->npar[e - 1] == par) return e - 1;
    if (r->n_nodes == r->cap_nodes) {
        size_t c = (size_t)r->cap_nodes, c2 = c, c3 = c;
        if (grow((void **)&r->npos, &c, c + 1, sizeof *r->npos) || grow((void **)&r->npar, &c2, c2 + 1, sizeof *r->npar) ||
            grow((void **)&r->seen, &c3, c3 + 1, sizeof *r->seen))
            return -1;
        memset(r->seen + r->cap_nodes, 0, (c - (size_t)r->cap_nodes) * sizeof *r->seen);
        r->cap_nodes = (int)c;
    }
    int id = r->n_nodes++;
    r->npos[id] = pos;
    r->npar[id] = par;
    r->seen[id] = 0;
    r->nhash[k] = id + 1;
    return id;
}

/* The stack after the symbol at pos is matched: its parent if pos ends its alternative. */
static int cont(rec *r, int pos, int par)
{
    return r->g->syms[pos + 1].kind == GS_END ? par : node(r, pos + 1, par);
}

static int add(rec *r, int x)
{
    if (r->n_buf == r->cap_buf) {
        size_t c = (size_t)r->cap_buf;
        if (grow((void **)&r->buf, &c, c + 1, sizeof *r->buf)) return -1;
        r->cap_buf = (int)c;
    }
    if (r->n_buf >= REC_MAX_STACKS) {
        r->failed = 1;
        q3_fail(Q3_ERR_UNSUPPORTED, "the grammar is too ambiguous: more than %d parses of one prefix", REC_MAX_STACKS);
        return -1;
    }
    r->buf[r->n_buf++] = x;
    return 0;
}

/* Adds the stacks x expands to (tops at a byte class or token; 0 when it empties). */
static int closure(rec *r, int x)
{
    for (;;) {
        if (x == 0) {
            if (r->seen[0] == r->stamp) return 0;
            r->seen[0] = r->stamp;
            return add(r, 0);
        }
        if (r->seen[x] == r->stamp) return 0;
        r->seen[x] = r->stamp;
        int pos = r->npos[x];
        gsym s = r->g->syms[pos];
        if (s.kind == GS_END) {
            x = r->npar[x];
            continue;
        }
        if (s.kind != GS_RULE) return add(r, x);
        int k = cont(r, pos, r->npar[x]);
        if (k < 0) return -1;
        int a0 = r->g->rule_alt0[s.arg], na = r->g->rule_nalt[s.arg];
        for (int a = a0; a < a0 + na; a++) {
            int y = node(r, r->g->alt_start[a], k);
            if (y < 0 || closure(r, y)) return -1;
        }
        return 0;
    }
}

static void begin(rec *r)
{
    r->n_buf = 0;
    if (++r->stamp == 0) { /* wrapped: clear the stamps */
        memset(r->seen, 0, (size_t)r->cap_nodes * sizeof *r->seen);
        r->stamp = 1;
    }
}

/* ---- states -------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t hash_set(const int32_t *v, int n)
{
    uint32_t h = 0x811c9dc5u ^ (uint32_t)n;
    for (int i = 0; i < n; i++) h = mix2(h, (uint32_t)v[i]);
    return h;
}

static int rehash_states(rec *r, uint32_t cap)
{
    int32_t *h = calloc(cap, sizeof *h);
    if (!h) return -1;
    for (int s = 0; s < r->n_states; s++) {
        uint32_t k = hash_set(r->pool + r->st_off[s], r->st_len[s]) & (cap - 1);
        while (h[k]) k = (k + 1) & (cap - 1);
        h[k] = s + 1;
    }
    free(r->shash);
    r->shash = h;
    r->shash_cap = cap;
    return 0;
}

/* The state of the stacks in buf (sorted and deduplicated here): REC_DEAD if none. */
static int intern(rec *r)
{
    if (r->n_buf == 0) return REC_DEAD;
    qsort(r->buf, (size_t)r->n_buf, sizeof *r->buf, cmp_i32);
    if ((uint32_t)r->n_states * 2 >= r->shash_cap && rehash_states(r, r->shash_cap ? r->shash_cap * 2 : 256))
        return fail_nomem(r);
    uint32_t k = hash_set(r->buf, r->n_buf) & (r->shash_cap - 1);
    for (int32_t e; (e = r->shash[k]); k = (k + 1) & (r->shash_cap - 1)) {
        int s = e - 1;
        if (r->st_len[s] == r->n_buf && !memcmp(r->pool + r->st_off[s], r->buf, (size_t)r->n_buf * sizeof *r->buf))
            return s;
    }
    if (r->n_states == r->cap_states) {
        size_t c = (size_t)r->cap_states, c1 = c, c2 = c, c3 = c, c4 = c, c5 = c, c6 = c, c7 = c, c8 = c;
        if (grow((void **)&r->st_off, &c, c + 1, sizeof *r->st_off) ||
            grow((void **)&r->st_len, &c1, c1 + 1, sizeof *r->st_len) ||
            grow((void **)&r->st_trans, &c2, c2 + 1, sizeof *r->st_trans) ||
            grow((void **)&r->st_loop, &c3, c3 + 1, sizeof *r->st_loop) ||
            grow((void **)&r->st_loop_ok, &c4, c4 + 1, sizeof *r->st_loop_ok) ||
            grow((void **)&r->st_text, &c5, c5 + 1, sizeof *r->st_text) ||
            grow((void **)&r->st_budget, &c6, c6 + 1, sizeof *r->st_budget) ||
            grow((void **)&r->st_tails, &c7, c7 + 1, sizeof *r->st_tails) ||
            grow((void **)&r->st_run, &c8, c8 + 1, sizeof *r->st_run))
            return fail_nomem(r);
        r->cap_states = (int)c;
    }
    if (grow((void **)&r->pool, &r->cap_pool, r->n_pool + (size_t)r->n_buf, sizeof *r->pool)) return fail_nomem(r);
    int s = r->n_states++;
    r->st_off[s] = (int32_t)r->n_pool;
    r->st_len[s] = r->n_buf;
    r->st_trans[s] = NULL;
    r->st_loop_ok[s] = 0;
    r->st_text[s] = REC_UNKNOWN;
    r->st_budget[s] = REC_UNKNOWN;
    r->st_tails[s] = -1;
    r->st_run[s] = REC_UNKNOWN;
    memcpy(r->pool + r->n_pool, r->buf, (size_t)r->n_buf * sizeof *r->buf);
    r->n_pool += (size_t)r->n_buf;
    r->shash[k] = s + 1;
    r->bytes += (size_t)r->n_buf * sizeof(int32_t) + 56;
    return s;
}

q3_status rec_init(rec *r, const q3g *g, int root)
{
    memset(r, 0, sizeof *r);
    r->g = g;
    r->root = root;
    if (node(r, -1, 0) != 0) { /* node 0: the empty stack (its fields are never read) */
        rec_free(r);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    return Q3_OK;
}

void rec_free(rec *r)
{
    free(r->npos);
    free(r->npar);
    free(r->nhash);
    free(r->seen);
    for (int s = 0; s < r->n_states; s++) free(r->st_trans[s]);
    free(r->st_off);
    free(r->st_len);
    free(r->st_trans);
    free(r->st_loop);
    free(r->st_loop_ok);
    free(r->st_text);
    free(r->st_budget);
    free(r->st_tails);
    free(r->st_run);
    free(r->runs);
    free(r->shash);
    free(r->pool);
    free(r->buf);
    free(r->key_tmp);
    free(r->key_chains);
    free(r->cmp_key[0]);
    free(r->cmp_key[1]);
    for (int i = 0; i < REC_MEMO; i++) free(r->memo_mask[i]);
    memset(r, 0, sizeof *r);
}

int rec_start(rec *r)
{
    begin(r);
    const q3g *g = r->g;
    int a0 = g->rule_alt0[r->root], na = g->rule_nalt[r->root];
    for (int a = a0; a < a0 + na; a++) {
        int y = node(r, g->alt_start[a], 0);
        if (y < 0) return fail_nomem(r);
        if (closure(r, y)) return r->failed ? REC_ERROR : fail_nomem(r);
    }
    return intern(r);
}

int rec_next_uncached(rec *r, int s, unsigned c)
{
    begin(r);
    const q3g *g = r->g;
    int32_t off = r->st_off[s], n = r->st_len[s];
    for (int i = 0; i < n; i++) {
        int x = r->pool[off + i];
        if (x == 0) continue;
        gsym sym = g->syms[r->npos[x]];
        if (sym.kind != GS_BYTES || !gclass_has(&g->classes[sym.arg], c)) continue;
        int k = cont(r, r->npos[x], r->npar[x]);
        if (k < 0) return fail_nomem(r);
        if (closure(r, k)) return r->failed ? REC_ERROR : fail_nomem(r);
        off = r->st_off[s]; /* the pool does not move here, but stay safe */
    }
    return intern(r);
}

/* The transition row of s, made on first use (NULL on failure): its bytes in
 * groups, bytes that the same stacks of s take (the state after a byte
 * depends only on which stacks take it: rec_next_uncached advances exactly
 * those), so one next state a group. Stacks whose tops are the same class
 * take the same bytes, so a byte's signature is the set of the distinct
 * classes that hold it; it changes only at a byte where some class starts or
 * stops (classes are mostly ranges), and is computed at those bytes alone.
 * The bytes no stack takes are one group, dead at once. Where the tops have
 * more than 64 distinct classes (more than a signature has bits), every byte
 * is its own group. */
static rec_row *trans_row(rec *r, int s)
{
    if (r->st_trans[s]) return r->st_trans[s];
    uint8_t grp[256];
    int32_t cls[64];
    uint64_t seen[256], edge[4] = {1, 0, 0, 0}; /* byte 0 and where some class starts or stops */
    gclass live = {{0}};
    int k = 0, n_grp = 0, alone = 0;
    for (int i = 0; i < r->st_len[s] && !alone; i++) {
        int x = r->pool[r->st_off[s] + i];
        if (!x) continue;
        gsym sym = r->g->syms[r->npos[x]];
        if (sym.kind != GS_BYTES) continue;
        int dup = 0;
        for (int j = 0; j < k && !dup; j++) dup = cls[j] == sym.arg;
        if (dup) continue;
        if (k == 64) {
            alone = 1; /* more classes than a signature has bits */
            break;
        }
        cls[k++] = sym.arg;
        const gclass *cl = &r->g->classes[sym.arg];
        for (int w = 0; w < 4; w++) live.w[w] |= cl->w[w];
        uint64_t carry = 0;
        for (int w = 0; w < 4; w++) { /* bit b of (w << 1 | carry): whether byte b - 1 is in the class */
            edge[w] |= cl->w[w] ^ (cl->w[w] << 1 | carry);
            carry = cl->w[w] >> 63;
        }
    }
    int dead = -1;
    for (int b = 0; b < 256 && !alone;) { /* b: an edge; its run of bytes goes to the next */
        uint64_t sig = 0;
        for (int j = 0; j < k; j++) sig |= (uint64_t)gclass_has(&r->g->classes[cls[j]], (unsigned)b) << j;
        int g = 0;
        while (g < n_grp && seen[g] != sig) g++;
        if (g == n_grp) seen[n_grp++] = sig;
        if (!sig) dead = g;
        int next = 256;
        for (int w = (b + 1) >> 6; w < 4 && b + 1 < 256; w++) {
            uint64_t m = edge[w] & (w == (b + 1) >> 6 ? ~0ull << ((b + 1) & 63) : ~0ull);
            if (m) {
                next = w * 64 + __builtin_ctzll(m);
                break;
            }
        }
        memset(grp + b, g, (size_t)(next - b));
        b = next;
    }
    if (alone) { /* (otherwise at most 256 groups: one a byte at most) */
        n_grp = 256;
        for (int b = 0; b < 256; b++) grp[b] = (uint8_t)b;
    }
    rec_row *t = malloc(sizeof *t + (size_t)n_grp * sizeof *t->next);
    if (!t) return NULL;
    memcpy(t->grp, grp, sizeof grp);
    if (alone) memset(&live, 0xFF, sizeof live); /* not gathered: every byte may live */
    t->live = live;
    for (int j = 0; j < n_grp; j++) t->next[j] = !alone && j == dead ? REC_DEAD : REC_UNKNOWN;
    r->st_trans[s] = t;
    r->bytes += sizeof *t + (size_t)n_grp * sizeof *t->next;
    return t;
}

const rec_row *rec_row_of(rec *r, int s) { return trans_row(r, s); }

int rec_next_fill(rec *r, int s, unsigned c)
{
    rec_row *t = trans_row(r, s);
    if (!t) return fail_nomem(r);
    int g = t->grp[c];
    if (t->next[g] != REC_UNKNOWN) return t->next[g];
    int n = rec_next_uncached(r, s, c);
    if (n == REC_ERROR) return n;
    r->st_trans[s]->next[g] = n; /* the row stays put; st_trans may have moved */
    return n;
}

int rec_run_add(rec *r)
{
    if (grow((void **)&r->runs, &r->cap_runs, (size_t)r->n_runs + 1, sizeof *r->runs)) return fail_nomem(r);
    r->bytes += sizeof *r->runs;
    return r->n_runs++;
}

int rec_group(rec *r, int s, unsigned c, gclass *out)
{
    memset(out, 0, sizeof *out);
    const rec_row *t = trans_row(r, s);
    if (!t) return fail_nomem(r);
    for (unsigned b = 0; b < 256; b++)
        if (t->grp[b] == t->grp[c]) gclass_add(out, b);
    return 0;
}

int rec_next_token(rec *r, int s, int tok)
{
    begin(r);
    const q3g *g = r->g;
    for (int i = 0; i < r->st_len[s]; i++) {
        int x = r->pool[r->st_off[s] + i];
        if (x == 0) continue;
        gsym sym = g->syms[r->npos[x]];
        if (sym.kind != GS_TOKEN || (int)sym.arg != tok) continue;
        int k = cont(r, r->npos[x], r->npar[x]);
        if (k < 0) return fail_nomem(r);
        if (closure(r, k)) return r->failed ? REC_ERROR : fail_nomem(r);
    }
    return intern(r);
}

int rec_can_continue(const rec *r, int s)
{
    for (int i = 0; i < r->st_len[s]; i++) {
        int x = r->pool[r->st_off[s] + i];
        if (x && r->g->syms[r->npos[x]].kind == GS_BYTES) return 1;
    }
    return 0;
}

int rec_subset(const rec *r, int a, int b)
{
    const int32_t *x = r->pool + r->st_off[a], *y = r->pool + r->st_off[b];
    int nx = r->st_len[a], ny = r->st_len[b], j = 0;
    for (int i = 0; i < nx; i++) { /* both sorted */
        while (j < ny && y[j] < x[i]) j++;
        if (j == ny || y[j] != x[i]) return 0;
        j++;
    }
    return 1;
}

typedef struct chain {
    uint64_t h;
    size_t off, len; /* in the words rec_state_key writes them to */
} chain;

static int cmp_chain(const void *a, const void *b, void *words)
{
    const chain *x = a, *y = b;
    const int32_t *w = words;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return memcmp(w + x->off, w + y->off, x->len * sizeof *w);
}

/* The words of position pos in a key: pos itself, or where it stands in a
 * counted repetition with its counts taken up to `upto` (three words, the
 * first negative so that no position reads the same). */
static int pos_words(const q3g *g, int pos, int upto, int32_t *w, int32_t *least)
{
    int k = g->sym_rep ? g->sym_rep[pos] : -1;
    if (k < 0) {
        w[0] = pos;
        return 1;
    }
    const grepeat *c = &g->reps[k];
    if (c->tot < *least) *least = c->tot;
    w[0] = -1 - c->rep;
    w[1] = c->req < upto ? c->req : upto;
    w[2] = c->tot < upto ? c->tot : upto;
    return 3;
}

long rec_state_key(rec *r, int s, int upto, int32_t **key, size_t *key_cap, uint64_t *hash, int32_t *least)
{
    int n = r->st_len[s];
    size_t words = 0;
    for (int i = 0; i < n; i++) {
        words++;
        for (int x = r->pool[r->st_off[s] + i]; x; x = r->npar[x]) words += 3;
    }
    if (grow((void **)key, key_cap, words ? words : 1, sizeof **key) ||
        grow((void **)&r->key_tmp, &r->key_tmp_cap, words ? words : 1, sizeof *r->key_tmp) ||
        grow(&r->key_chains, &r->key_chains_cap, (size_t)(n ? n : 1), sizeof(chain)))
        return -1;
    int32_t *tmp = r->key_tmp;
    chain *ch = r->key_chains;
    *least = INT32_MAX;
    size_t o = 0;
    for (int i = 0; i < n; i++) { /* each stack's positions, top first, behind its length */
        size_t at = o++;
        uint64_t h = 0x9e3779b97f4a7c15ull;
        for (int x = r->pool[r->st_off[s] + i]; x; x = r->npar[x]) {
            int nw = pos_words(r->g, r->npos[x], upto, tmp + o, least);
            for (int k = 0; k < nw; k++) h = (h ^ (uint32_t)tmp[o + k]) * 0xff51afd7ed558ccdull;
            o += (size_t)nw;
        }
        tmp[at] = (int32_t)(o - at - 1);
        ch[i] = (chain){.h = h ^ (h >> 31), .off = at, .len = o - at};
    }
    qsort_r(ch, (size_t)n, sizeof *ch, cmp_chain, tmp); /* node numbers differ between recognizers: order by content */
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(*key + o, tmp + ch[i].off, ch[i].len * sizeof *tmp);
        o += ch[i].len;
        h = (h ^ ch[i].h) * 0x100000001b3ull;
    }
    *hash = h ^ (h >> 29);
    return (long)o;
}

int rec_wants_token(const rec *r, int s)
{
    for (int i = 0; i < r->st_len[s]; i++) {
        int x = r->pool[r->st_off[s] + i];
        if (x && r->g->syms[r->npos[x]].kind == GS_TOKEN) return 1;
    }
    return 0;
}

const gclass *rec_loop(rec *r, int s)
{
    if (!r->st_loop_ok[s]) {
        gclass l = {{0}};
        /* only bytes some stack can take may loop */
        gclass any = {{0}};
        for (int i = 0; i < r->st_len[s]; i++) {
            int x = r->pool[r->st_off[s] + i];
            if (!x) continue;
            gsym sym = r->g->syms[r->npos[x]];
            if (sym.kind != GS_BYTES) continue;
            for (int w = 0; w < 4; w++) any.w[w] |= r->g->classes[sym.arg].w[w];
        }
        for (unsigned c = 0; c < 256; c++) {
            if (!gclass_has(&any, c)) continue;
            int t = rec_next(r, s, c);
            if (t == REC_ERROR) return NULL;
            if (t == s) gclass_add(&l, c);
        }
        r->st_loop[s] = l;
        r->st_loop_ok[s] = 1;
    }
    return &r->st_loop[s];
}

/* ---- compaction ------------------------------------------------------------------- */

static int copy_stack(rec *dst, const rec *src, int x, int32_t *map)
{
    if (x == 0) return 0;
    if (map[x] >= 0) return map[x];
    int p = copy_stack(dst, src, src->npar[x], map);
    if (p < 0) return -1;
    int y = node(dst, src->npos[x], p);
    map[x] = y;
    return y;
}

int rec_compact(rec *r, int *s, size_t limit)
{
    size_t held = r->bytes + (size_t)r->cap_nodes * 12 + (size_t)r->nhash_cap * 4;
    if (held < limit) return 0;
    rec fresh;
    if (rec_init(&fresh, r->g, r->root)) return -1;
    int32_t *map = malloc((size_t)r->n_nodes * sizeof *map);
    if (!map) {
        rec_free(&fresh);
        return -1;
    }
    for (int i = 0; i < r->n_nodes; i++) map[i] = -1;
    begin(&fresh);
    for (int i = 0; i < r->st_len[*s]; i++) {
        int y = copy_stack(&fresh, r, r->pool[r->st_off[*s] + i], map);
        if (y < 0 || add(&fresh, y)) {
            free(map);
            rec_free(&fresh);
            return -1;
        }
    }
    free(map);
    int ns = intern(&fresh);
    if (ns < 0) {
        rec_free(&fresh);
        return -1;
    }
    rec_free(r);
    *r = fresh;
    *s = ns;
    return 1;
}
