/* Token masks (mask.h). */
#include <stdlib.h>
#include <string.h>

#include "grammar/class_table.h"
#include "grammar/mask.h"
#include "util/error.h"

static inline void set_bit(uint64_t *m, int32_t r) { m[r >> 6] |= 1ull << (r & 63); }

/* Copies src's bits [lo, hi) into m. */
static void copy_range(uint64_t *m, const uint64_t *src, int32_t lo, int32_t hi)
{
    if (lo >= hi) return;
    int32_t wl = lo >> 6, wh = (hi - 1) >> 6;
    uint64_t first = ~0ull << (lo & 63), last = ~0ull >> (63 - ((hi - 1) & 63));
    if (wl == wh) first &= last;
    m[wl] = (m[wl] & ~first) | (src[wl] & first);
    if (wl == wh) return;
    if (wh > wl + 1) memcpy(m + wl + 1, src + wl + 1, (size_t)(wh - wl - 1) * sizeof *m);
    m[wh] = (m[wh] & ~last) | (src[wh] & last);
}

#define MAX_DEPTH 1024
/* How many characters ahead text_budget looks: a subtree whose tokens are
 * longer (240 of Qwen3's tokens are) is walked instead, down to where what is
 * left fits. Looking as far as the longest token (128 bytes) made the first
 * mask inside a maxLength string make that many counted states at once. */
#define TEXT_LOOKAHEAD 32
/* A frame's text budget is computed when a child with at least this many
 * tokens below it could be allowed whole by it: finding the budget of a new
 * state costs about as much as walking a few hundred trie nodes (every byte of
 * every UTF-8 character from it), and most frames of a walk are small
 * subtrees, where the walk is cheaper; a budget already known is taken
 * whatever the size. */
#define TEXT_LAZY_MIN 64
/* The same for a counted run's (run_from): computed for a child with this many tokens below. */
#define RUN_LAZY_MIN 64
/* A child that leads to a state looping on its byte takes that state's whole
 * mask (loop_mask) when it has at least this many tokens below; fewer are
 * walked (a whole mask costs a walk of its own the first time). */
#define LOOP_COPY_MIN 256

/* ---- JSON string text -----------------------------------------------------------
 * Where the next characters may be any JSON string text (UTF-8 but controls,
 * " and \\), the state after one such character is often the same whichever
 * it is: the state itself inside a free string, the next count inside a string
 * with a maxLength. text_next finds that state, checked, not assumed, by
 * walking a UTF-8 automaton beside the recognizer (every byte of every such
 * character must keep a stack alive and every character end on the same state);
 * text_budget follows it to count how many characters may come. Then a subtree
 * whose tokens go on with such text alone (gkid's uok), and with no more
 * bytes than the budget, is allowed whole, as one range of ranks. A token may
 * end inside a character: the character it began is alive (every byte of every
 * character keeps a stack alive) and counted (a token's bytes are at least the
 * characters it begins). */

/* The state after any one character of text from s, or REC_DEAD (none or not
 * one state), or REC_ERROR. */
static int text_next(rec *r, int s)
{
    if (r->st_text[s] != REC_UNKNOWN) return r->st_text[s];
    int xs[64], qs[64], n = 1, ok = 1, after = -1;
    xs[0] = s;
    qs[0] = U_B;
    for (int k = 0; k < n && ok; k++) {
        int pt = REC_UNKNOWN, pq = -1; /* the last byte's: the next bytes mostly repeat it */
        for (unsigned b = 0; b < 256 && ok; b++) {
            int q = utf8_text_next(qs[k], b);
            if (q < 0) continue;
            int t = rec_next(r, xs[k], b);
            if (t == pt && q == pq) continue;
            pt = t;
            pq = q;
            if (t == REC_ERROR) return REC_ERROR;
            if (t < 0) {
                ok = 0;
            } else if (q == U_B) {
                if (after < 0) after = t;
                ok = t == after;
            } else {
                int seen = 0;
                for (int i = 0; i < n; i++) seen |= xs[i] == t && qs[i] == q;
                if (!seen) {
                    if (n == 64) ok = 0;
                    else {
                        xs[n] = t;
                        qs[n++] = q;
                    }
                }
            }
        }
    }
    return r->st_text[s] = ok && after >= 0 ? after : REC_DEAD;
}

/* Whether any text at all may follow s: the states that characters of text
 * lead to from s (at most CLOSED_MAX of them, each byte of each character
 * followed through the UTF-8 automaton) all take every such byte. The case of
 * an unanchored `pattern` ("a+" is .*a+.*) or of a GBNF string rule with
 * several parses, where the state after a character depends on which one it
 * is. 1: yes (each of those states gets an unbounded budget), 0: not known to,
 * or REC_ERROR. */
#define CLOSED_MAX 32
static int text_closed(rec *r, int s)
{
    int set[CLOSED_MAX], n_set = 1;
    set[0] = s;
    for (int j = 0; j < n_set; j++) {
        int xs[64], qs[64], n = 1;
        xs[0] = set[j];
        qs[0] = U_B;
        for (int k = 0; k < n; k++) {
            int pt = REC_UNKNOWN, pq = -1; /* the last byte's, as in text_next */
            for (unsigned b = 0; b < 256; b++) {
                int q = utf8_text_next(qs[k], b);
                if (q < 0) continue;
                int t = rec_next(r, xs[k], b);
                if (t == REC_ERROR) return REC_ERROR;
                if (t < 0) return 0;
                if (t == pt && q == pq) continue;
                pt = t;
                pq = q;
                int *ys = q == U_B ? set : xs, *n_ys = q == U_B ? &n_set : &n, cap = q == U_B ? CLOSED_MAX : 64;
                int seen = 0;
                for (int i = 0; i < *n_ys && !seen; i++) seen = ys[i] == t && (q == U_B || qs[i] == q);
                if (seen) continue;
                if (*n_ys == cap) return 0;
                if (q != U_B) qs[n] = q;
                ys[(*n_ys)++] = t;
            }
        }
    }
    for (int j = 0; j < n_set; j++) r->st_budget[set[j]] = INT32_MAX;
    return 1;
}

/* Whether s holds every stack of a state that each character of text leads
 * back to (the inside of a free string, beside the keys an object names or
 * the prefixes of a `pattern`): then no text can kill s (rec_subset). Tries
 * the states one ASCII character leads to. 1: yes, 0: not found, or REC_ERROR. */
static int text_holds_loop(rec *r, int s)
{
    int tried[8], n_tried = 0;
    for (unsigned b = 0x20; b < 0x80; b++) {
        if (utf8_text_next(U_B, b) != U_B) continue;
        int t = rec_next(r, s, b);
        if (t < 0) return t == REC_ERROR ? REC_ERROR : 0; /* some text kills s */
        int seen = 0;
        for (int i = 0; i < n_tried && !seen; i++) seen = tried[i] == t;
        if (seen) continue;
        if (n_tried == 8) return 0;
        tried[n_tried++] = t;
        int u = text_next(r, t);
        if (u == REC_ERROR) return REC_ERROR;
        if (u == t && rec_subset(r, t, s)) return 1;
    }
    return 0;
}

/* How many characters of text may follow s (INT32_MAX: any number), or
 * REC_ERROR. The walk stops after `enough` characters (TEXT_LOOKAHEAD, so
 * never more than that many states are made ahead of the output): then s gets
 * `enough`, a lower bound, and the states on the way are left to their own
 * walk. A lower bound is safe: a subtree it does not cover is walked. */
static int32_t text_budget(rec *r, int s, int enough)
{
    if (r->st_budget[s] != REC_UNKNOWN) return r->st_budget[s];
    int chain[MAX_DEPTH + 1], n = 0, x = s;
    if (enough > MAX_DEPTH) enough = MAX_DEPTH;
    int32_t base = 0;
    for (;;) {
        if (r->st_budget[x] != REC_UNKNOWN) { base = r->st_budget[x]; break; }
        int t = text_next(r, x);
        if (t == REC_ERROR) return REC_ERROR;
        if (t == x) { r->st_budget[x] = base = INT32_MAX; break; }
        if (t == REC_DEAD) { /* not one state: perhaps a set of them that takes any text */
            int c = text_holds_loop(r, x);
            if (c == 0) c = text_closed(r, x);
            if (c == REC_ERROR) return REC_ERROR;
            if (c) { r->st_budget[x] = base = INT32_MAX; break; }
        }
        chain[n++] = x;
        if (t < 0) { base = -1; break; } /* -1: x itself gets 0 below */
        if (n == enough) return r->st_budget[s] = enough;
        x = t;
    }
    /* chain[k] may take one character more than chain[k + 1] */
    for (int k = n - 1; k >= 0; k--) {
        base = base == INT32_MAX ? INT32_MAX : base + 1;
        r->st_budget[chain[k]] = base;
    }
    return r->st_budget[s];
}

/* Whether states a and b read the same up to `upto` bytes (equal
 * rec_state_key words): 1, 0, or -1 (out of memory). Without counted
 * positions distinct states read differently. */
static int same_upto(rec *r, int a, int b, int upto)
{
    if (a == b) return 1;
    if (!r->g->sym_rep || r->st_len[a] != r->st_len[b]) return 0; /* a key has a chain per stack */
    int32_t least;
    uint64_t h[2];
    long n0 = rec_state_key(r, a, upto, &r->cmp_key[0], &r->cmp_key_cap[0], &h[0], &least);
    long n1 = n0 < 0 ? -1 : rec_state_key(r, b, upto, &r->cmp_key[1], &r->cmp_key_cap[1], &h[1], &least);
    if (n0 < 0 || n1 < 0) return -1;
    return n0 == n1 && h[0] == h[1] && !memcmp(r->cmp_key[0], r->cmp_key[1], (size_t)n0 * sizeof *r->cmp_key[0]);
}

/* A counted run (the inside of an item{m,n} of one byte class, say): s's
 * byte c leads to t, which reads the same as s up to u bytes (same_upto at
 * u = the least count left in t). Then, by induction on the bytes, from s
 * every string of up to u + 1 bytes that lead from s to t is alive: the state
 * after i of them reads as s for u + 1 - i more bytes. Memoized for the first
 * t asked: 1 with *reach (u) when t is that state, reads the same, and the
 * subtree's bytes `under` (unless NULL) are all bytes that s's stacks take as
 * they take c (so that lead to t too: r->runs[r->st_run[s]].cls); 0 when not,
 * or -1 (out of memory). The bytes are compared first: comparing the states'
 * keys costs more, and is done once. */
static int run_from(rec *r, int s, unsigned c, int t, const gclass *under, int32_t *reach)
{
    if (r->st_run[s] == REC_UNKNOWN) {
        int k = rec_run_add(r);
        if (k < 0 || rec_group(r, s, c, &r->runs[k].cls)) return -1;
        r->runs[k].next = t;
        r->runs[k].reach = REC_UNKNOWN;
        r->st_run[s] = k;
    }
    struct rec_run *x = &r->runs[r->st_run[s]];
    if (x->next != t || (under && !gclass_subset(under, &x->cls))) return 0;
    if (x->reach == REC_UNKNOWN) {
        int32_t u = 0, least = 0;
        uint64_t h;
        if (r->st_len[s] == r->st_len[t] && rec_state_key(r, t, 0, &r->cmp_key[0], &r->cmp_key_cap[0], &h, &least) < 0)
            return -1;
        if (least != INT32_MAX && least > 0) {
            int same = same_upto(r, s, t, least);
            if (same < 0) return -1;
            u = same ? least : 0;
        }
        x = &r->runs[r->st_run[s]];
        x->reach = u;
    }
    if (x->reach <= 0) return 0;
    *reach = x->reach;
    return 1;
}

/* Whether the mask of s is mask_text_loop's: 1, 0, or -1 (out of memory).
 * So when any one character of text leads from s to one state t that reads
 * the same as s up to the longest token (t == s: the inside of a free string;
 * equal rec_state_key words up to that many bytes: a string with at least
 * that many characters still allowed and none still needed). Then, by
 * induction on the characters, the state after a token's text reads the same
 * as s for the rest of the token: its text is alive (every byte of every
 * character keeps a stack alive from s, text_next checked) and its tail is
 * alive from there exactly when from s. */
static int text_tails(rec *r, const gvocab *v, int s)
{
    if (r->st_tails[s] >= 0) return r->st_tails[s];
    /* a few characters first: most states take some of them differently (or
       not at all), and text_next tries every byte of every character */
    static const unsigned char probe[] = {'a', 'Z', '0', ' ', '~', '!'};
    int first = rec_next(r, s, probe[0]);
    if (first == REC_ERROR) return -1;
    for (size_t i = 1; i < sizeof probe && first >= 0; i++) {
        int x = rec_next(r, s, probe[i]);
        if (x == REC_ERROR) return -1;
        if (x != first) first = REC_DEAD;
    }
    if (first < 0) return r->st_tails[s] = 0;
    int t = text_next(r, s), same = t == s;
    if (t == REC_ERROR) return -1;
    if (t >= 0 && !same && (same = same_upto(r, s, t, v->max_token_bytes)) < 0) return -1;
    return r->st_tails[s] = (int8_t)same;
}

/* The mask of a state s for which text_tails holds: every token of text
 * (vocab.h's text_only) and the others by their tails, walked from s. */
static q3_status mask_text_loop(rec *r, const gvocab *v, int s, uint64_t *mask)
{
    memcpy(mask, v->text_only, gvocab_mask_words(v) * sizeof *mask);
    struct {
        int32_t k, kend;
        int state;
    } f[MAX_DEPTH];
    const gtail *tails = v->tails;
    int depth = 0;
    f[0].k = 0;
    f[0].kend = v->n_tail_root_kids;
    f[0].state = s;
    for (;;) {
        if (f[depth].k == f[depth].kend) {
            if (depth == 0) break;
            depth--;
            continue;
        }
        const gtail *e = &tails[f[depth].k++];
        int T = rec_next(r, f[depth].state, e->lab);
        if (T < 0) {
            if (T == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "token mask: %s", "the recognizer failed");
            continue;
        }
        for (int32_t i = e->ranks_lo; i < e->ranks_hi; i++) set_bit(mask, v->tail_ranks[i]);
        if (e->kids_hi > e->kids_lo) {
            if (depth + 1 >= MAX_DEPTH) return q3_fail(Q3_ERR_UNSUPPORTED, "token longer than %d bytes", MAX_DEPTH);
            depth++;
            f[depth].k = e->kids_lo;
            f[depth].kend = e->kids_hi;
            f[depth].state = T;
        }
    }
    return Q3_OK;
}

/* ---- a child that loops --------------------------------------------------------
 * When a token's first byte c leads from S to T and from T back to T, every
 * token c.rest (the root's child c and its subtree) is allowed from S exactly
 * when rest is allowed from T, which is when c.rest is allowed from T (T
 * reads c and is T again). So the root's child takes its bits, one range of
 * ranks, from T's whole mask (deeper children do not: their tokens begin with
 * the bytes before c):
 * the free text after the first letter of a key that some named key starts
 * with, the digits after a number's first, the characters of an email's local
 * part. T's mask is computed once (a walk of its own, which does not nest
 * further) and kept in the recognizer's memo, where T's own turn finds it. */

static const uint64_t *memo_find(const rec *r, int s)
{
    for (int i = 0; i < REC_MEMO; i++)
        if (r->memo_state[i] == s + 1) return r->memo_mask[i];
    return NULL;
}

/* T's whole mask (trie bits), from the memo or computed into it; NULL on failure. */
static const uint64_t *loop_mask(rec *r, const gvocab *v, int T)
{
    const uint64_t *m = memo_find(r, T);
    if (m) return m;
    int i = r->memo_next;
    size_t words = gvocab_mask_words(v);
    if (!r->memo_mask[i]) {
        r->memo_mask[i] = malloc(words * sizeof *r->memo_mask[i]);
        if (!r->memo_mask[i]) return NULL;
        r->bytes += words * sizeof *r->memo_mask[i];
    }
    r->memo_state[i] = 0; /* reused: empty until whole */
    r->memo_depth++;
    q3_status st = mask_trie(r, v, T, -1, r->memo_mask[i]);
    r->memo_depth--;
    if (st) return NULL;
    r->memo_state[i] = T + 1;
    r->memo_next = (i + 1) % REC_MEMO;
    return r->memo_mask[i];
}

/* After a dead child with byte c among kids [k, kend) (sorted by byte): the
 * first sibling whose byte some stack of S takes (the row's live bytes), or
 * kend; the ones between are dead too. A state that takes few bytes (a count
 * used up, a closing quote owed) makes most children dead. */
static int32_t next_live(const rec *r, int S, const gkid *kids, int32_t k, int32_t kend, unsigned c)
{
    if (kend - k < 8) return k; /* a few: tried in turn */
    const gclass *live = &r->st_trans[S]->live;
    unsigned nb = 256;
    for (unsigned w = (c + 1) >> 6; w < 4 && c + 1 < 256; w++) {
        uint64_t m = live->w[w] & (w == (c + 1) >> 6 ? ~0ull << ((c + 1) & 63) : ~0ull);
        if (m) {
            nb = w * 64 + (unsigned)__builtin_ctzll(m);
            break;
        }
    }
    if (nb == 256) return kend;
    while (k < kend) { /* the first with lab >= nb */
        int32_t mid = k + (kend - k) / 2;
        if (kids[mid].lab < nb) k = mid + 1;
        else kend = mid;
    }
    return k;
}

/* The walk: the children kids[k0 .. kend0) tried from state s (root: they are
 * the trie's root children; else children deeper in the trie, whose tokens
 * begin with the bytes above them), and below them depth first; root children
 * whose byte is in skip are left alone. Sets the allowed tokens' bits (and with
 * keep >= 0 clears the decided ones: see mask_trie). */
static q3_status walk(rec *r, const gvocab *v, int s, int32_t k0, int32_t kend0, int root, const gclass *skip, int keep,
                      uint64_t *mask)
{
    /* a frame: a node whose children are being tried (kids k .. kend), the
       state after its bytes, and how many characters of JSON string text may
       follow that state (REC_UNKNOWN until a child needs it) */
    struct {
        int32_t k, kend, text;
        int state;
    } f[MAX_DEPTH];
    const gkid *kids = v->kids;
    int depth = 0;
    f[0].k = k0;
    f[0].kend = kend0;
    f[0].state = s;
    f[0].text = REC_UNKNOWN;
    for (;;) {
        if (f[depth].k == f[depth].kend) {
            if (depth == 0) break;
            depth--;
            continue;
        }
        const gkid *e = &kids[f[depth].k++];
        if (keep >= 0) { /* the child's byte is the (depth + 1)-th */
            if (depth + 1 + (int)e->below <= keep) continue; /* every token below is kept */
            if (depth + 1 > keep) gvocab_mask_put(mask, e->rank_lo, e->rank_hi, 0); /* every token below is decided here */
        }
        unsigned c = e->lab;
        int S = f[depth].state;
        if (depth == 0 && skip && gclass_has(skip, c)) continue;
        int q = utf8_text_next(U_B, c);
        if (q >= 0 && (e->uok >> q & 1)) { /* every token below goes on with text only */
            if (f[depth].text == REC_UNKNOWN &&
                (r->st_budget[S] != REC_UNKNOWN || e->rank_hi - e->rank_lo >= TEXT_LAZY_MIN)) {
                f[depth].text = text_budget(r, S, TEXT_LOOKAHEAD);
                if (f[depth].text == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "out of memory");
            }
            if (f[depth].text > 0 && (int32_t)e->below + 1 <= f[depth].text) { /* and no more of it than may come */
                gvocab_mask_put(mask, e->rank_lo, e->rank_hi, 1);
                continue;
            }
        }
        int T = rec_next(r, S, c);
        if (T < 0) {
            if (T == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "token mask: %s", "the recognizer failed");
            if (keep < 0 || depth + 1 > keep) { /* the dead siblings after it: untouched, or cleared whole */
                int32_t k = f[depth].k, j = next_live(r, S, kids, k, f[depth].kend, c);
                if (keep >= 0 && j > k) gvocab_mask_put(mask, kids[k].rank_lo, kids[j - 1].rank_hi, 0);
                f[depth].k = j;
            }
            continue; /* the child's subtree is never touched */
        }
        if (depth == 0 && root && T != S && e->kids_hi > e->kids_lo && !r->memo_depth &&
            (e->rank_hi - e->rank_lo >= LOOP_COPY_MIN || memo_find(r, T))) {
            int TT = rec_next(r, T, c);
            if (TT == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "token mask: %s", "the recognizer failed");
            if (TT == T) {
                const uint64_t *whole = loop_mask(r, v, T);
                if (!whole) return q3_fail(Q3_ERR_NOMEM, "out of memory");
                copy_range(mask, whole, e->rank_lo, e->rank_hi);
                continue;
            }
        }
        if (T == S) {
            const gclass *loop = rec_loop(r, S);
            if (!loop) return Q3_ERR_NOMEM;
            if (gclass_subset(&v->unions[e->uni], loop)) {
                gvocab_mask_put(mask, e->rank_lo, e->rank_hi, 1);
                continue;
            }
        } else if (e->kids_hi > e->kids_lo && r->g->sym_rep &&
                   (r->st_run[S] != REC_UNKNOWN || e->rank_hi - e->rank_lo >= RUN_LAZY_MIN)) {
            int32_t reach;
            int run = run_from(r, S, c, T, &v->unions[e->uni], &reach);
            if (run < 0) return q3_fail(Q3_ERR_NOMEM, "out of memory");
            if (run && (int32_t)e->below <= reach) {
                gvocab_mask_put(mask, e->rank_lo, e->rank_hi, 1);
                continue;
            }
        }
        if (e->tok_rank >= 0) set_bit(mask, e->tok_rank);
        if (e->kids_hi > e->kids_lo) {
            if (depth + 1 >= MAX_DEPTH) return q3_fail(Q3_ERR_UNSUPPORTED, "token longer than %d bytes", MAX_DEPTH);
            int32_t text = T == S ? f[depth].text : REC_UNKNOWN;
            depth++;
            f[depth].k = e->kids_lo;
            f[depth].kend = e->kids_hi;
            f[depth].state = T;
            f[depth].text = text;
        }
    }
    return Q3_OK;
}

/* Bytes in a state's group before a table of them (class_table.h) is tried:
 * a smaller class leaves most tokens to the walk anyway. */
#define CLASS_TABLE_MIN 16

/* The mask of a state s that every byte of t's class leads back to (or that
 * starts a long enough run of it: mask_class_table): every token whose bytes
 * are all in the class, the root's other children walked, and the exits of
 * each byte s takes walked from s (the bytes before an exit are in the class,
 * so lead back to s, or to a state that reads as s). */
static q3_status mask_class_loop(rec *r, const gvocab *v, int s, const gclass_table *t, uint64_t *mask)
{
    memcpy(mask, t->in_cls, gvocab_mask_words(v) * sizeof *mask);
    q3_status st = walk(r, v, s, 0, v->n_root_kids, 1, &t->cls, -1, mask);
    if (st) return st;
    for (unsigned b = 0; b < 256; b++) {
        if (gclass_has(&t->cls, b) || t->exit_lo[b] == t->exit_lo[b + 1]) continue;
        int T = rec_next(r, s, b);
        if (T == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "token mask: %s", "the recognizer failed");
        if (T < 0) continue;
        for (int32_t i = t->exit_lo[b]; i < t->exit_lo[b + 1]; i++)
            if ((st = walk(r, v, s, t->exits[i], t->exits[i] + 1, 0, NULL, -1, mask))) return st;
    }
    return Q3_OK;
}

/* mask.h. The class tried is s's largest group of bytes (they lead to one
 * state t; at least CLASS_TABLE_MIN of them): when t is s, s loops on it;
 * when t starts a counted run (run_from) that reaches at least as far as the
 * longest token that starts in the class, every such token reads from s as
 * from a state that loops on it, and the bytes before an exit lead to a state
 * that reads as s for the rest of the token. */
q3_status mask_class_table(rec *r, const gvocab *v, int s, const gclass_table **out)
{
    *out = NULL;
    const rec_row *row = rec_row_of(r, s);
    if (!row) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    int n[256] = {0}, best = -1;
    for (unsigned b = 0; b < 256; b++)
        if (gclass_has(&row->live, b) && ++n[row->grp[b]] >= CLASS_TABLE_MIN &&
            (best < 0 || n[row->grp[b]] > n[row->grp[best]]))
            best = (int)b;
    if (best < 0) return Q3_OK;
    gclass cls = {{0}};
    unsigned c = 256;
    for (unsigned b = 0; b < 256; b++)
        if (row->grp[b] == row->grp[best] && gclass_has(&row->live, b)) {
            gclass_add(&cls, b);
            if (c == 256) c = b;
        }
    int t = rec_next(r, s, c);
    if (t == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "token mask: %s", "the recognizer failed");
    if (t < 0) return Q3_OK;
    int32_t reach = INT32_MAX - 1;
    if (t != s) {
        if (!r->g->sym_rep) return Q3_OK; /* no counted positions: no run */
        int run = run_from(r, s, c, t, &cls, &reach);
        if (run < 0) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        if (!run) return Q3_OK;
    }
    const gclass_table *ct;
    q3_status st = gclass_table_get(v, &cls, &ct);
    if (st) return st;
    if (ct && ct->max_len <= reach + 1) *out = ct;
    return Q3_OK;
}

q3_status mask_trie(rec *r, const gvocab *v, int s, int keep, uint64_t *mask)
{
    const uint64_t *memo = memo_find(r, s);
    if (memo) { /* whole: it overrides what keep would keep */
        memcpy(mask, memo, gvocab_mask_words(v) * sizeof *mask);
        return Q3_OK;
    }
    if (keep < 0) {
        int t = text_tails(r, v, s);
        if (t < 0) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        if (t) return mask_text_loop(r, v, s, mask);
        const gclass_table *ct;
        q3_status st = mask_class_table(r, v, s, &ct);
        if (st) return st;
        if (ct) return mask_class_loop(r, v, s, ct, mask);
    }
    if (keep < 0) memset(mask, 0, gvocab_mask_words(v) * sizeof *mask);
    else gvocab_mask_put(mask, v->n_trie_ranks, v->n_ids, 0);
    return walk(r, v, s, 0, v->n_root_kids, 1, NULL, keep, mask);
}

int mask_feed(rec *r, int st, const unsigned char *s, size_t n, size_t *n_ok)
{
    size_t k = 0;
    for (; k < n && st >= 0; k++) {
        int t = rec_next(r, st, s[k]);
        if (t < 0) {
            st = t;
            break;
        }
        st = t;
    }
    if (n_ok) *n_ok = k;
    return st;
}

q3_status mask_brute(rec *r, const gvocab *v, int s, uint64_t *mask)
{
    memset(mask, 0, gvocab_mask_words(v) * sizeof *mask);
    for (int32_t id = 0; id < v->n_ids; id++) {
        if (!v->in_trie[id]) continue;
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[id];
        int st = s;
        for (uint32_t k = 0; k < v->len[id] && st >= 0; k++) st = rec_next_uncached(r, st, b[k]);
        if (st == REC_ERROR) return Q3_ERR_NOMEM;
        if (st >= 0) set_bit(mask, v->rank_of[id]);
    }
    return Q3_OK;
}
