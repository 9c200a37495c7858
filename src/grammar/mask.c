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
    int32_t i = 1;
    while (i < v->n_nodes) {
        while (i >= fend[depth]) depth--;
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
