/* Byte-level BPE: the vocabulary and merge hash maps, the merge loop, and a per-call
 * cache of piece -> ids (real text repeats its words a lot). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "util/error.h"

/* ==== small utilities ===================================================== */

int tk_buf_reserve(tk_buf *b, size_t extra)
{
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int tk_buf_append(tk_buf *b, const void *p, size_t n)
{
    if (tk_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void tk_buf_free(tk_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int tk_tokens_reserve(q3_tokens *out, size_t extra)
{
    if (out->n + extra <= out->cap) return 0;
    size_t cap = out->cap ? out->cap : 64;
    while (cap < out->n + extra) cap *= 2;
    int32_t *p = realloc(out->ids, cap * sizeof *p);
    if (!p) return -1;
    out->ids = p;
    out->cap = cap;
    return 0;
}

/* ==== hashing ============================================================== */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

uint64_t tk_hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x100000001B3ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ (w * 0x87c37b91114253d5ull)) * 0x4cf5ad432745937full;
        h = (h << 31) | (h >> 33);
        s += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ (w * 0x87c37b91114253d5ull)) * 0x4cf5ad432745937full;
    }
    return mix64(h);
}

/* ==== vocabulary map: bytes -> id ========================================== */

static uint32_t table_size_for(size_t n)
{
    size_t size = 1024;
    while (size < n + n / 2 + 1) size *= 2; /* load factor <= 2/3 */
    return (uint32_t)size;
}

static int vocab_alloc(q3_tokenizer *t, size_t n)
{
    uint32_t size = table_size_for(n);
    tk_vocab_slot *slots = malloc((size_t)size * sizeof *slots);
    if (!slots) return -1;
    memset(slots, 0xFF, (size_t)size * sizeof *slots); /* id = -1 */
    free(t->vocab_slots);
    t->vocab_slots = slots;
    t->vocab_mask = size - 1;
    return 0;
}

static int merge_alloc(q3_tokenizer *t, size_t n)
{
    uint32_t size = table_size_for(n);
    tk_merge_slot *slots = malloc((size_t)size * sizeof *slots);
    if (!slots) return -1;
    memset(slots, 0xFF, (size_t)size * sizeof *slots); /* key = UINT64_MAX */
    free(t->merge_slots);
    t->merge_slots = slots;
    t->merge_mask = size - 1;
    return 0;
}

int tk_maps_alloc(q3_tokenizer *t, size_t n_vocab, size_t n_merges)
{
    return vocab_alloc(t, n_vocab) || merge_alloc(t, n_merges) ? -1 : 0;
}

static inline uint64_t key_head(const void *bytes, size_t n)
{
    uint64_t h = 0;
    memcpy(&h, bytes, n < 8 ? n : 8);
    return h;
}

/* The slot holding bytes[0..n) (hash h), or the empty slot where it would go. */
static inline tk_vocab_slot *vocab_probe(const q3_tokenizer *t, const void *bytes, size_t n, uint64_t h)
{
    uint32_t h32 = (uint32_t)h, mask = t->vocab_mask;
    uint64_t head = key_head(bytes, n);
    for (uint32_t i = (uint32_t)(h >> 32) & mask;; i = (i + 1) & mask) {
        tk_vocab_slot *s = &t->vocab_slots[i];
        if (s->id < 0) return s;
        if (s->hash == h32 && s->len == n && s->head == head &&
            (n <= 8 || memcmp(t->bytes.data + s->off + 8, (const char *)bytes + 8, n - 8) == 0))
            return s;
    }
}

int32_t tk_vocab_find(const q3_tokenizer *t, const void *bytes, size_t n)
{
    return vocab_probe(t, bytes, n, tk_hash_bytes(bytes, n))->id;
}

int32_t tk_vocab_find_h(const q3_tokenizer *t, const void *bytes, size_t n, uint64_t h)
{
    return vocab_probe(t, bytes, n, h)->id;
}

void tk_vocab_prefetch(const q3_tokenizer *t, uint64_t h)
{
    __builtin_prefetch(&t->vocab_slots[(uint32_t)(h >> 32) & t->vocab_mask]);
}

q3_status tk_vocab_insert_h(q3_tokenizer *t, int32_t id, uint64_t h, int32_t *existing)
{
    *existing = -1;
    if ((t->n_bpe + 1) * 3 > ((size_t)t->vocab_mask + 1) * 2) { /* keep the load <= 2/3 */
        tk_vocab_slot *old = t->vocab_slots;
        size_t old_size = (size_t)t->vocab_mask + 1;
        t->vocab_slots = NULL;
        if (vocab_alloc(t, old_size * 2)) {
            t->vocab_slots = old;
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the vocabulary", t->name);
        }
        for (size_t i = 0; i < old_size; i++) {
            if (old[i].id < 0) continue;
            uint64_t h = tk_hash_bytes(t->bytes.data + old[i].off, old[i].len);
            *vocab_probe(t, t->bytes.data + old[i].off, old[i].len, h) = old[i];
        }
        free(old);
    }
    const char *key = t->bytes.data + t->tok_off[id];
    size_t n = t->tok_len[id];
    tk_vocab_slot *s = vocab_probe(t, key, n, h);
    if (s->id >= 0) {
        *existing = s->id;
        return Q3_OK;
    }
    *s = (tk_vocab_slot){(uint32_t)h, id, (uint32_t)n, t->tok_off[id], key_head(key, n)};
    t->n_bpe++;
    return Q3_OK;
}

/* ==== merge map: (left, right) -> (rank, merged) ============================ */

static inline uint64_t pair_key(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* The slot of pair (left, right), or NULL if they do not merge. */
static inline const tk_merge_slot *merge_find(const q3_tokenizer *t, int32_t left, int32_t right)
{
    uint64_t key = pair_key(left, right);
    uint32_t mask = t->merge_mask;
    for (uint32_t i = (uint32_t)mix64(key) & mask;; i = (i + 1) & mask) {
        const tk_merge_slot *s = &t->merge_slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

void tk_merge_prefetch(const q3_tokenizer *t, int32_t left, int32_t right)
{
    __builtin_prefetch(&t->merge_slots[(uint32_t)mix64(pair_key(left, right)) & t->merge_mask]);
}

static void merge_put(q3_tokenizer *t, uint64_t key, int32_t rank, int32_t merged)
{
    uint32_t mask = t->merge_mask;
    uint32_t i = (uint32_t)mix64(key) & mask;
    while (t->merge_slots[i].key != UINT64_MAX) i = (i + 1) & mask;
    t->merge_slots[i].key = key;
    t->merge_slots[i].rank = rank;
    t->merge_slots[i].merged = merged;
}

/* Rank = number of merges listed before this one. A pair listed twice keeps its
 * first (lower) rank. */
q3_status tk_merge_insert(q3_tokenizer *t, int32_t left, int32_t right, int32_t merged)
{
    int32_t rank = (int32_t)t->n_merges++;
    if (merge_find(t, left, right)) return Q3_OK;
    if ((t->n_merges + 1) * 3 > ((size_t)t->merge_mask + 1) * 2) {
        tk_merge_slot *old = t->merge_slots;
        size_t old_size = (size_t)t->merge_mask + 1;
        t->merge_slots = NULL;
        if (merge_alloc(t, old_size * 2)) {
            t->merge_slots = old;
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the merges", t->name);
        }
        for (size_t i = 0; i < old_size; i++)
            if (old[i].key != UINT64_MAX) merge_put(t, old[i].key, old[i].rank, old[i].merged);
        free(old);
    }
    merge_put(t, pair_key(left, right), rank, merged);
    return Q3_OK;
}

/* ==== the merge loop ========================================================= */

void tk_scratch_free(tk_scratch *sc)
{
    tk_buf_free(&sc->nfc);
    if (sc->md) pcre2_match_data_free(sc->md);
    free(sc->sym);
    free(sc->prev);
    free(sc->next);
    free(sc->rank);
    free(sc->merged);
    free(sc->heap);
    free(sc->cache);
    tk_buf_free(&sc->cache_keys);
    free(sc->cache_ids);
    memset(sc, 0, sizeof *sc);
}

static int scratch_reserve(tk_scratch *sc, size_t n)
{
    if (n <= sc->cap) return 0;
    size_t cap = sc->cap ? sc->cap : 64;
    while (cap < n) cap *= 2;
    int32_t **arrays[] = {&sc->sym, &sc->prev, &sc->next, &sc->rank, &sc->merged};
    for (size_t k = 0; k < sizeof arrays / sizeof arrays[0]; k++) {
        int32_t *p = realloc(*arrays[k], cap * sizeof(int32_t));
        if (!p) return -1;
        *arrays[k] = p;
    }
    uint64_t *h = realloc(sc->heap, cap * 3 * sizeof *h); /* n-1 initial pairs + 2 pushes a merge */
    if (!h) return -1;
    sc->heap = h;
    sc->cap = cap;
    return 0;
}

/* rank[i] / merged[i] describe the pair (sym[i], sym[next[i]]); INT_MAX: no merge. */
static inline void set_pair(const q3_tokenizer *t, tk_scratch *sc, int32_t i)
{
    int32_t j = sc->next[i];
    const tk_merge_slot *m = j >= 0 ? merge_find(t, sc->sym[i], sc->sym[j]) : NULL;
    sc->rank[i] = m ? m->rank : INT_MAX;
    sc->merged[i] = m ? m->merged : -1;
}

/* Merges the pair at i with its right neighbour; refreshes the two pairs it touches. */
static inline void merge_at(const q3_tokenizer *t, tk_scratch *sc, int32_t i)
{
    int32_t j = sc->next[i];
    sc->sym[i] = sc->merged[i];
    sc->sym[j] = -1; /* dead */
    sc->next[i] = sc->next[j];
    if (sc->next[j] >= 0) sc->prev[sc->next[j]] = i;
    set_pair(t, sc, i);
    if (sc->prev[i] >= 0) set_pair(t, sc, sc->prev[i]);
}

/* Min-heap of (rank << 32 | position): the lowest rank first, the leftmost on ties. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = v;
    return top;
}

/* Pieces longer than this use the heap: the scan is quadratic. */
#define TK_BPE_SCAN_MAX 48

q3_status tk_bpe_uncached(const q3_tokenizer *t, tk_scratch *sc, const unsigned char *piece,
                          size_t n, int use_heap, q3_tokens *out)
{
    if (n > (size_t)INT32_MAX / 2)
        return q3_fail(Q3_ERR_INVALID, "%s: a pre-tokenizer piece of %zu bytes is too long",
                       t->name, n);
    if (scratch_reserve(sc, n) || tk_tokens_reserve(out, n))
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory encoding a piece of %zu bytes",
                       t->name, n);
    if (t->ignore_merges) {
        int32_t id = tk_vocab_find(t, piece, n);
        if (id >= 0) {
            out->ids[out->n++] = id;
            return Q3_OK;
        }
    }
    int32_t ni = (int32_t)n;
    for (int32_t i = 0; i < ni; i++) {
        sc->sym[i] = t->byte_id[piece[i]];
        sc->prev[i] = i - 1;
        sc->next[i] = i + 1 < ni ? i + 1 : -1;
    }
    for (int32_t i = 0; i < ni; i++) set_pair(t, sc, i);

    if (!use_heap) {
        for (;;) {
            int32_t best = INT_MAX, at = -1;
            for (int32_t i = 0; i >= 0; i = sc->next[i])
                if (sc->rank[i] < best) best = sc->rank[i], at = i;
            if (at < 0) break;
            merge_at(t, sc, at);
        }
    } else {
        size_t hn = 0;
        for (int32_t i = 0; i < ni; i++)
            if (sc->rank[i] != INT_MAX) heap_push(sc->heap, &hn, (uint64_t)sc->rank[i] << 32 | (uint32_t)i);
        while (hn) {
            uint64_t top = heap_pop(sc->heap, &hn);
            int32_t i = (int32_t)(uint32_t)top, r = (int32_t)(top >> 32);
            /* Stale if i was merged away or its pair changed since the push. */
            if (sc->sym[i] < 0 || sc->rank[i] != r) continue;
            merge_at(t, sc, i);
            if (sc->rank[i] != INT_MAX) heap_push(sc->heap, &hn, (uint64_t)sc->rank[i] << 32 | (uint32_t)i);
            int32_t p = sc->prev[i];
            if (p >= 0 && sc->rank[p] != INT_MAX)
                heap_push(sc->heap, &hn, (uint64_t)sc->rank[p] << 32 | (uint32_t)p);
        }
    }
    for (int32_t i = 0; i >= 0; i = sc->next[i]) out->ids[out->n++] = sc->sym[i];
    return Q3_OK;
}

/* ==== the piece cache ======================================================== */

/* Pieces longer than this are not cached (they rarely repeat). */
#define TK_CACHE_MAX_PIECE 128

static int cache_grow(tk_scratch *sc)
{
    uint32_t size = sc->cache ? (sc->cache_mask + 1) * 2 : 4096;
    tk_cache_slot *slots = calloc(size, sizeof *slots); /* key_len 0 = empty */
    if (!slots) return -1;
    if (sc->cache) {
        for (uint32_t i = 0; i <= sc->cache_mask; i++) {
            tk_cache_slot *s = &sc->cache[i];
            if (!s->key_len) continue;
            uint32_t j = s->hash & (size - 1);
            while (slots[j].key_len) j = (j + 1) & (size - 1);
            slots[j] = *s;
        }
        free(sc->cache);
    }
    sc->cache = slots;
    sc->cache_mask = size - 1;
    return 0;
}

q3_status tk_bpe_piece(const q3_tokenizer *t, tk_scratch *sc, const unsigned char *piece,
                       size_t n, q3_tokens *out)
{
    if (n == 1) { /* every byte is a token */
        if (tk_tokens_reserve(out, 1))
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the token ids", t->name);
        out->ids[out->n++] = t->byte_id[piece[0]];
        return Q3_OK;
    }
    if (n > TK_CACHE_MAX_PIECE) return tk_bpe_uncached(t, sc, piece, n, 1, out);

    if (!sc->cache && cache_grow(sc))
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the piece cache", t->name);
    uint32_t h = (uint32_t)tk_hash_bytes(piece, n);
    uint32_t i = h & sc->cache_mask;
    for (;; i = (i + 1) & sc->cache_mask) {
        tk_cache_slot *s = &sc->cache[i];
        if (!s->key_len) break;
        if (s->hash == h && s->key_len == n && memcmp(sc->cache_keys.data + s->key_off, piece, n) == 0) {
            if (tk_tokens_reserve(out, s->n_ids))
                return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the token ids", t->name);
            memcpy(out->ids + out->n, sc->cache_ids + s->ids_off, s->n_ids * sizeof(int32_t));
            out->n += s->n_ids;
            return Q3_OK;
        }
    }

    size_t first = out->n;
    q3_status st = tk_bpe_uncached(t, sc, piece, n, n > TK_BPE_SCAN_MAX, out);
    if (st != Q3_OK) return st;
    size_t k = out->n - first;

    /* Remember it; on allocation failure (or a cache past 4 GiB) just do not cache. */
    if ((sc->cache_used + 1) * 2 > sc->cache_mask + 1) {
        if (cache_grow(sc)) return Q3_OK;
        for (i = h & sc->cache_mask; sc->cache[i].key_len; i = (i + 1) & sc->cache_mask) {}
    }
    if (sc->cache_keys.len + n > UINT32_MAX || sc->cache_ids_len + k > UINT32_MAX) return Q3_OK;
    if (sc->cache_ids_len + k > sc->cache_ids_cap) {
        size_t cap = sc->cache_ids_cap ? sc->cache_ids_cap * 2 : 4096;
        while (cap < sc->cache_ids_len + k) cap *= 2;
        int32_t *p = realloc(sc->cache_ids, cap * sizeof *p);
        if (!p) return Q3_OK;
        sc->cache_ids = p;
        sc->cache_ids_cap = cap;
    }
    size_t key_off = sc->cache_keys.len;
    if (tk_buf_append(&sc->cache_keys, piece, n)) return Q3_OK;
    memcpy(sc->cache_ids + sc->cache_ids_len, out->ids + first, k * sizeof(int32_t));
    sc->cache[i] = (tk_cache_slot){h, (uint32_t)key_off, (uint32_t)n,
                                   (uint32_t)sc->cache_ids_len, (uint32_t)k};
    sc->cache_ids_len += k;
    sc->cache_used++;
    return Q3_OK;
}
