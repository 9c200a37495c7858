/* Token masks (mask.h). */
#include <string.h>

#include "grammar/mask.h"
#include "util/error.h"

static inline void set_bit(uint64_t *m, int32_t r) { m[r >> 6] |= 1ull << (r & 63); }

/* Sets ranks [lo, hi). */
static void set_range(uint64_t *m, int32_t lo, int32_t hi)
{
    if (lo >= hi) return;
    int32_t wl = lo >> 6, wh = (hi - 1) >> 6;
    uint64_t first = ~0ull << (lo & 63), last = ~0ull >> (63 - ((hi - 1) & 63));
    if (wl == wh) {
        m[wl] |= first & last;
        return;
    }
    m[wl] |= first;
    for (int32_t w = wl + 1; w < wh; w++) m[w] = ~0ull;
    m[wh] |= last;
}

static inline int subset(const gclass *a, const gclass *b)
{
    return !((a->w[0] & ~b->w[0]) | (a->w[1] & ~b->w[1]) | (a->w[2] & ~b->w[2]) | (a->w[3] & ~b->w[3]));
}

#define MAX_DEPTH 1024

/* ---- JSON string text -----------------------------------------------------------
 * Whether every character of JSON string text leads from s back to
 * s: checked, not assumed, by walking the UTF-8 automaton beside the
 * recognizer: from s, each character (ASCII but controls, " and \; or a valid
 * multibyte sequence) must come back to s, and every byte on the way must keep
 * a stack alive. Then a subtree whose tokens go on with such text alone
 * (vocab.h's uok) is allowed whole, as one range of ranks. */

/* 1 if JSON string text loops at s, 0 if not, -1 on failure. */
static int text_loops(rec *r, int s)
{
    if (r->st_text[s]) return r->st_text[s] == 2;
    int xs[64], qs[64], n = 1, ok = 1;
    xs[0] = s;
    qs[0] = U_B;
    for (int k = 0; k < n && ok; k++) {
        for (unsigned b = 0; b < 256 && ok; b++) {
            int q = utf8_text_next(qs[k], b);
            if (q < 0) continue;
            int t = rec_next(r, xs[k], b);
            if (t == REC_ERROR) return -1;
            if (t < 0) {
                ok = 0;
            } else if (q == U_B) {
                ok = t == s;
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
    r->st_text[s] = ok ? 2 : 1;
    return ok;
}

q3_status mask_trie(rec *r, const gvocab *v, int s, uint64_t *mask)
{
    memset(mask, 0, gvocab_mask_words(v) * sizeof *mask);
    int32_t fend[MAX_DEPTH];
    int fstate[MAX_DEPTH];
    int depth = 0;
    fend[0] = v->n_nodes;
    fstate[0] = s;
    const uint8_t *lab = v->lab;
    const int32_t *end = v->end, *tok_rank = v->tok_rank;
    int ftext[MAX_DEPTH]; /* the frame's state loops on JSON string text */
    ftext[0] = text_loops(r, s);
    if (ftext[0] < 0) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    int32_t i = 1;
    while (i < v->n_nodes) {
        while (i >= fend[depth]) depth--;
        if (ftext[depth]) {
            int q = utf8_text_next(U_B, lab[i]);
            if (q >= 0 && (v->uok[i] >> q & 1)) { /* every token below goes on with text only */
                set_range(mask, v->rank_lo[i], v->rank_lo[end[i]]);
                i = end[i];
                continue;
            }
        }
        int S = fstate[depth];
        int T = rec_next(r, S, lab[i]);
        if (T < 0) {
            if (T == REC_ERROR) return q3_fail(Q3_ERR_NOMEM, "token mask: %s", "the recognizer failed");
            i = end[i];
            continue;
        }
        if (T == S) {
            const gclass *loop = rec_loop(r, S);
            if (!loop) return Q3_ERR_NOMEM;
            if (subset(&v->unions[v->uni[i]], loop)) {
                set_range(mask, v->rank_lo[i], v->rank_lo[end[i]]);
                i = end[i];
                continue;
            }
        }
        if (tok_rank[i] >= 0) set_bit(mask, tok_rank[i]);
        if (end[i] > i + 1) {
            if (depth + 1 >= MAX_DEPTH) return q3_fail(Q3_ERR_UNSUPPORTED, "token longer than %d bytes", MAX_DEPTH);
            depth++;
            fend[depth] = end[i];
            fstate[depth] = T;
            ftext[depth] = T == S ? ftext[depth - 1] : text_loops(r, T);
            if (ftext[depth] < 0) return q3_fail(Q3_ERR_NOMEM, "out of memory");
        }
        i++;
    }
    return Q3_OK;
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
