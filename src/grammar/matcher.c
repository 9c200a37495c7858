/* q3_matcher: one sequence's position in a grammar, its masks, and the
 * thinking phase before the constraint starts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled.h"
#include "grammar/mask.h"
#include "q3.h"
#include "util/error.h"

/* The recognizer's tables are rebuilt around the current state past this. */
#define MATCHER_TABLE_LIMIT ((size_t)64 << 20)

/* A mask is derived from the last one (mask.h's keep) when the two states
 * differ only in counts of at least this many: below it, most of the trie
 * would be walked anyway. */
#define DERIVE_MIN 8

static void cache_clear(q3_matcher *m)
{
    for (int i = 0; i < MATCHER_CACHE; i++) {
        m->cache[i].state = -1;
        m->cache[i].n_key = -1;
    }
    m->mask_state = -1;
    m->last_slot = -1;
}

static q3_status start(q3_matcher *m)
{
    m->phase = (m->flags & Q3_MATCHER_AFTER_THINK) && m->G->think_close >= 0 ? 0 : 1;
    m->state = rec_start(&m->r);
    if (m->state < 0) return m->state == REC_DEAD ? q3_fail(Q3_ERR_INVALID, "the grammar matches nothing")
                                                  : Q3_ERR_NOMEM;
    return Q3_OK;
}

q3_status q3_matcher_new(const q3_grammar *G, unsigned flags, q3_matcher **out)
{
    *out = NULL;
    if (!G) return q3_fail(Q3_ERR_INVALID, "q3_matcher_new: no grammar");
    if (flags & ~(unsigned)Q3_MATCHER_AFTER_THINK) return q3_fail(Q3_ERR_INVALID, "q3_matcher_new: unknown flags %#x", flags);
    q3_matcher *m = calloc(1, sizeof *m);
    if (!m) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    m->G = G;
    m->flags = flags;
    size_t words = gvocab_mask_words(G->v);
    int root = (flags & Q3_MATCHER_AFTER_THINK) ? G->g->root_after_think : G->g->root;
    q3_status st = rec_init(&m->r, G->g, root);
    if (st) {
        free(m);
        return st;
    }
    m->mask = malloc(words * sizeof *m->mask);
    cache_clear(m);
    if (!m->mask) {
        q3_matcher_free(m);
        return q3_fail(Q3_ERR_NOMEM, "out of memory");
    }
    if ((st = start(m))) {
        q3_matcher_free(m);
        return st;
    }
    *out = m;
    return Q3_OK;
}

void q3_matcher_free(q3_matcher *m)
{
    if (!m) return;
    rec_free(&m->r);
    free(m->mask);
    for (int i = 0; i < MATCHER_CACHE; i++) {
        free(m->cache[i].bits);
        free(m->cache[i].key);
    }
    free(m->key);
    free(m->side[0]);
    free(m->side[1]);
    free(m);
}

void q3_matcher_reset(q3_matcher *m)
{
    int root = m->r.root;
    rec_free(&m->r); /* forget the old text's tables too */
    cache_clear(m);
    if (rec_init(&m->r, m->G->g, root) || start(m)) m->state = REC_ERROR;
}

static int is_end(const gvocab *v, int32_t id) { return id >= 0 && (id == v->eot || id == v->eos); }

static inline void set_rank(uint64_t *m, int32_t r) { m[r >> 6] |= 1ull << (r & 63); }

/* The mask of slot i is the current state's. */
static q3_status serve(q3_matcher *m, int i, const uint64_t **out)
{
    *out = m->cur = m->cache[i].view;
    m->mask_state = m->state;
    m->last_slot = i;
    return Q3_OK;
}

/* Slot c (the next one) holds the current state's mask, view, with its key
 * (m->key, n_key words, hash h; n_key < 0: none). */
static void fill_slot(q3_matcher *m, int c, const uint64_t *view, long n_key, uint64_t h)
{
    m->cache[c].state = m->state;
    m->cache[c].view = view;
    m->cache[c].n_key = -1;
    if (n_key >= 0 && (size_t)n_key > m->cache[c].key_cap) {
        int32_t *k = realloc(m->cache[c].key, (size_t)n_key * sizeof *k);
        if (k) {
            m->cache[c].key = k;
            m->cache[c].key_cap = (size_t)n_key;
        }
    }
    if (n_key >= 0 && (size_t)n_key <= m->cache[c].key_cap) {
        if (n_key) memcpy(m->cache[c].key, m->key, (size_t)n_key * sizeof *m->key);
        m->cache[c].n_key = n_key;
    }
    m->cache[c].hash = h;
    m->cache_next = (c + 1) % MATCHER_CACHE;
}

/* The slot whose mask the current state's can be derived from (mask.h's
 * keep = least), or -1: the last mask's, when the two states read the same
 * up to least bytes (the least count left in the current state, between
 * DERIVE_MIN and the longest token). */
static int derive_from(q3_matcher *m, int32_t least, int32_t upto)
{
    int i = m->last_slot;
    if (least < DERIVE_MIN || least >= upto || i < 0 || m->cache[i].state < 0) return -1;
    uint64_t h[2];
    int32_t l[2];
    long n0 = rec_state_key(&m->r, m->state, least, &m->side[0], &m->side_cap[0], &h[0], &l[0]);
    long n1 = rec_state_key(&m->r, m->cache[i].state, least, &m->side[1], &m->side_cap[1], &h[1], &l[1]);
    if (n0 < 0 || n0 != n1 || h[0] != h[1] || memcmp(m->side[0], m->side[1], (size_t)n0 * sizeof *m->side[0])) return -1;
    return i;
}

q3_status matcher_rank_mask(q3_matcher *m, const uint64_t **out)
{
    const gvocab *v = m->G->v;
    size_t words = gvocab_mask_words(v);
    if (m->phase == 0) { /* thinking: anything but the end */
        memset(m->mask, 0xff, words * sizeof *m->mask);
        for (int k = 0; k < 2; k++) {
            int32_t e = k ? v->eos : v->eot;
            if (e >= 0) m->mask[v->rank_of[e] >> 6] &= ~(1ull << (v->rank_of[e] & 63));
        }
        m->mask_state = -1;
        *out = m->mask;
        return Q3_OK;
    }
    if (m->phase == 2) {
        memset(m->mask, 0, words * sizeof *m->mask);
        if (v->eot >= 0) set_rank(m->mask, v->rank_of[v->eot]);
        m->mask_state = -1;
        *out = m->mask;
        return Q3_OK;
    }
    if (m->mask_state == m->state) {
        *out = m->cur;
        return Q3_OK;
    }
    for (int i = 0; i < MATCHER_CACHE; i++)
        if (m->cache[i].state == m->state) return serve(m, i, out);
    /* a state met before whose counts differ only past the longest token
       (rec_state_key): the same mask. Without counted positions and without a
       shared table no key can serve (one recognizer's distinct states have
       distinct keys), so none is written. */
    int32_t upto = v->max_token_bytes, least = INT32_MAX;
    uint64_t h = 0;
    long n_key = m->G->share || m->G->g->sym_rep
                     ? rec_state_key(&m->r, m->state, upto, &m->key, &m->key_cap, &h, &least)
                     : -1;
    if (n_key >= 0)
        for (int i = 0; i < MATCHER_CACHE; i++)
            if (m->cache[i].state >= 0 && m->cache[i].n_key == n_key && m->cache[i].hash == h &&
                !memcmp(m->cache[i].key, m->key, (size_t)n_key * sizeof *m->key)) {
                m->cache[i].state = m->state;
                m->n_same++;
                return serve(m, i, out);
            }
    /* the grammar's, if another matcher (or this one, before a compaction) met the state */
    int c = m->cache_next;
    const uint64_t *shared = n_key >= 0 ? mask_share_find(m->G->share, m->key, (size_t)n_key, h) : NULL;
    if (shared) {
        fill_slot(m, c, shared, n_key, h);
        return serve(m, c, out);
    }
    /* computed into the next cache slot (round robin), or into m->mask when
       there is no memory for one; from the last mask when it can be */
    int from = derive_from(m, least, upto);
    if (!m->cache[c].bits) m->cache[c].bits = malloc(words * sizeof(uint64_t));
    uint64_t *dst = m->cache[c].bits ? m->cache[c].bits : m->mask;
    int keep = -1;
    if (from >= 0) {
        if (m->cache[from].view != dst) memcpy(dst, m->cache[from].view, words * sizeof *dst);
        keep = least;
        m->n_derived++;
    }
    m->cache[c].state = m->mask_state = -1; /* cur may be this slot: forgotten until the mask is whole */
    m->last_slot = -1;
    q3_status st = mask_trie(&m->r, v, m->state, keep, dst);
    if (st) return st;
    const q3g *g = m->G->g;
    if (rec_wants_token(&m->r, m->state))
        for (int i = 0; i < g->n_token_names; i++) {
            int t = rec_next_token(&m->r, m->state, i);
            if (t == REC_ERROR) return Q3_ERR_NOMEM;
            if (t >= 0) set_rank(dst, v->rank_of[m->G->token_ids[i]]);
        }
    if (rec_accepting(&m->r, m->state)) {
        if (v->eot >= 0) set_rank(dst, v->rank_of[v->eot]);
        if (v->eos >= 0) set_rank(dst, v->rank_of[v->eos]);
    }
    if (n_key >= 0) mask_share_put(m->G->share, m->key, (size_t)n_key, h, dst);
    if (dst == m->mask) {
        *out = m->cur = dst;
        m->mask_state = m->state;
        return Q3_OK;
    }
    fill_slot(m, c, dst, n_key, h);
    return serve(m, c, out);
}

q3_status q3_matcher_mask(q3_matcher *m, uint32_t *allowed, int n_vocab)
{
    const uint64_t *mask;
    q3_status st = matcher_rank_mask(m, &mask);
    if (st) return st;
    const gvocab *v = m->G->v;
    memset(allowed, 0, ((size_t)n_vocab + 31) / 32 * sizeof *allowed);
    int n = n_vocab < v->n_ids ? n_vocab : v->n_ids;
    for (int id = 0; id < n; id++) {
        int32_t r = v->rank_of[id];
        if (mask[r >> 6] >> (r & 63) & 1) allowed[id >> 5] |= 1u << (id & 31);
    }
    return Q3_OK;
}

/* p[0..n) = -inf: a few values, then copies of what is filled (libc's wide
 * copies; a loop of single stores took 90 us for Qwen3's row). */
static void fill_forbidden(float *p, size_t n)
{
    size_t k = n < 64 ? n : 64;
    for (size_t i = 0; i < k; i++) p[i] = -INFINITY;
    while (k < n) {
        size_t c = k < n - k ? k : n - k;
        memcpy(p + k, p, c * sizeof *p);
        k += c;
    }
}

q3_status q3_matcher_apply(q3_matcher *m, float *logits, int n_vocab)
{
    const uint64_t *mask;
    q3_status st = matcher_rank_mask(m, &mask);
    if (st) return st;
    const gvocab *v = m->G->v;
    int n = n_vocab < v->n_ids ? n_vocab : v->n_ids;
    size_t words = gvocab_mask_words(v);
    for (int id = n; id < n_vocab; id++) logits[id] = -INFINITY;
    if (!v->shared_ranks && n == v->n_ids) {
        size_t allowed = 0; /* counted until it passes 4096 (then: many), zero words skipped */
        for (size_t w = 0; w < words && allowed <= 4096; w++)
            if (mask[w]) allowed += (size_t)__builtin_popcountll(mask[w]);
        if (allowed < (size_t)n / 4) { /* few allowed: keep them, forbid the whole row, put them back */
            float keep[4096];
            int32_t kid[4096];
            if (allowed <= 4096) {
                size_t k = 0;
                for (size_t w = 0; w < words; w++)
                    for (uint64_t b = mask[w]; b; b &= b - 1) {
                        int32_t id = v->id_of_rank[(int32_t)(w * 64) + __builtin_ctzll(b)];
                        kid[k] = id;
                        keep[k++] = logits[id];
                    }
                fill_forbidden(logits, (size_t)n);
                for (size_t i = 0; i < k; i++) logits[kid[i]] = keep[i];
                return Q3_OK;
            }
        }
        /* many allowed: forbid the others, visiting only the zero bits */
        for (size_t w = 0; w < words; w++) {
            uint64_t z = ~mask[w];
            if (w == words - 1 && v->n_ids % 64) z &= (1ull << (v->n_ids % 64)) - 1;
            for (; z; z &= z - 1) logits[v->id_of_rank[(int32_t)(w * 64) + __builtin_ctzll(z)]] = -INFINITY;
        }
        return Q3_OK;
    }
    const int32_t *rank_of = v->rank_of;
    for (int id = 0; id < n; id++) {
        int32_t r = rank_of[id];
        if (!(mask[r >> 6] >> (r & 63) & 1)) logits[id] = -INFINITY;
    }
    return Q3_OK;
}

static q3_status moved(q3_matcher *m, int s)
{
    m->state = s;
    int c = rec_compact(&m->r, &m->state, MATCHER_TABLE_LIMIT);
    if (c < 0) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    if (c) cache_clear(m);
    return Q3_OK;
}

q3_status q3_matcher_accept(q3_matcher *m, int32_t id)
{
    const gvocab *v = m->G->v;
    if (id < 0 || id >= v->n_ids) return q3_fail(Q3_ERR_INVALID, "token %d is not in the vocabulary", id);
    if (m->phase == 0) {
        if (is_end(v, id)) return q3_fail(Q3_ERR_INVALID, "the output may not end while thinking");
        if (id == m->G->think_close) m->phase = 1;
        return Q3_OK;
    }
    if (m->phase == 2) return q3_fail(Q3_ERR_INVALID, "the output has ended");
    if (is_end(v, id)) {
        if (!rec_accepting(&m->r, m->state)) return q3_fail(Q3_ERR_INVALID, "the output is not complete");
        m->phase = 2;
        return Q3_OK;
    }
    int s;
    if (v->in_trie[id]) {
        s = mask_feed(&m->r, m->state, (const unsigned char *)v->bytes + v->off[id], v->len[id], NULL);
    } else {
        s = REC_DEAD;
        for (int i = 0; i < m->G->g->n_token_names; i++)
            if (m->G->token_ids[i] == id) {
                s = rec_next_token(&m->r, m->state, i);
                break;
            }
    }
    if (s == REC_ERROR) return Q3_ERR_NOMEM;
    if (s < 0) return q3_fail(Q3_ERR_INVALID, "token %d is not allowed here", id);
    return moved(m, s);
}

q3_status q3_matcher_accept_bytes(q3_matcher *m, const char *text, size_t len, size_t *n_ok)
{
    if (n_ok) *n_ok = 0;
    if (m->phase != 1) return q3_fail(Q3_ERR_INVALID, "q3_matcher_accept_bytes: the matcher is not in its constrained text");
    size_t k = 0;
    int s = mask_feed(&m->r, m->state, (const unsigned char *)text, len, &k);
    if (n_ok) *n_ok = k;
    if (s == REC_ERROR) return Q3_ERR_NOMEM;
    if (s < 0) {
        /* keep the position of the longest valid prefix */
        int p = mask_feed(&m->r, m->state, (const unsigned char *)text, k, NULL);
        if (p >= 0) moved(m, p);
        return q3_fail(Q3_ERR_INVALID, "rejected at byte %zu", k);
    }
    return moved(m, s);
}

q3_match_state q3_matcher_state(const q3_matcher *m)
{
    if (m->phase == 0) return Q3_MATCH_OPEN;
    if (m->phase == 2) return Q3_MATCH_DONE;
    if (!rec_accepting(&m->r, m->state)) return Q3_MATCH_OPEN;
    return rec_can_continue(&m->r, m->state) || rec_wants_token(&m->r, m->state) ? Q3_MATCH_COMPLETE : Q3_MATCH_DONE;
}
