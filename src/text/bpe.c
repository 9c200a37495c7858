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
    if (n) { /* the last 1..7 bytes, without a variable-length memcpy */
        uint64_t w = 0;
        if (n >= 4) {
            uint32_t lo, hi;
            memcpy(&lo, s, 4);
            memcpy(&hi, s + n - 4, 4); /* overlaps lo when n < 8 */
            w = (uint64_t)hi << 32 | lo;
        } else {
            w = (uint64_t)s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16;
        }
        h = (h ^ (w * 0x87c37b91114253d5ull)) * 0x4cf5ad432745937full;
    }
    return mix64(h);
}

/* ==== vocabulary map: bytes -> id ========================================== */

/* Slots for n entries, or 0 when n is beyond what a 32-bit table can hold
 * (callers bound their counts far below that; this keeps the table honest). */
static uint32_t table_size_for(size_t n)
{
    if (n > (size_t)1 << 30) return 0;
    size_t size = 1024;
    while (size < n + n / 2 + 1) size *= 2; /* load factor <= 2/3 */
    return (uint32_t)size;
}

static int vocab_alloc(q3_tokenizer *t, size_t n)
{
    uint32_t size = table_size_for(n);
    if (!size) return -1;
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
    if (!size) return -1;
    uint64_t *slots = malloc((size_t)size * sizeof *slots);
    if (!slots) return -1;
    memset(slots, 0xFF, (size_t)size * sizeof *slots); /* TK_SLOT_EMPTY */
    free(t->merge_slots);
    t->merge_slots = slots;
    t->merge_mask = size - 1;
    return 0;
}

int tk_maps_alloc(q3_tokenizer *t, size_t n_vocab, size_t n_merges)
{
    return vocab_alloc(t, n_vocab) || merge_alloc(t, n_merges) ? -1 : 0;
}

/* Bytes 0..7 of a key, zero-padded (no variable-length memcpy: this is hot). */
static inline uint64_t key_head(const void *bytes, size_t n)
{
    const unsigned char *s = bytes;
    uint64_t h;
    if (n >= 8) {
        memcpy(&h, s, 8);
    } else if (n >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, s, 4);
        memcpy(&hi, s + n - 4, 4); /* overlapping bytes land where lo has them */
        h = lo | (uint64_t)hi << (8 * (n - 4));
    } else {
        h = n ? (uint64_t)s[0] | (uint64_t)s[n / 2] << (8 * (n / 2)) | (uint64_t)s[n - 1] << (8 * (n - 1)) : 0;
    }
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

/* ==== merge map: (left, right) -> rank ====================================== */

/* A slot packs left id (20 bits), right id (20 bits) and rank (24 bits) into 8 bytes,
 * so the 151k merges of Qwen take 2 MB: the size of this machine's L2, where random
 * lookups cost ~20 ns instead of ~200. The merged token is t->merge_result[rank]. */
#define TK_SLOT_EMPTY UINT64_MAX

static inline uint64_t pair_key(int32_t left, int32_t right) /* 40 bits */
{
    return (uint64_t)(uint32_t)left << TK_ID_BITS | (uint32_t)right;
}

static inline uint32_t pair_home(const q3_tokenizer *t, uint64_t key)
{
    return (uint32_t)mix64(key) & t->merge_mask;
}

/* The rank of merging (left, right), or INT32_MAX if they do not merge. */
static inline int32_t merge_rank(const q3_tokenizer *t, int32_t left, int32_t right)
{
    uint64_t key = pair_key(left, right);
    uint32_t mask = t->merge_mask;
    for (uint32_t i = pair_home(t, key);; i = (i + 1) & mask) {
        uint64_t s = t->merge_slots[i];
        if (s >> TK_RANK_BITS == key) return (int32_t)(s & ((1u << TK_RANK_BITS) - 1));
        if (s == TK_SLOT_EMPTY) return INT32_MAX;
    }
}

void tk_merge_prefetch(const q3_tokenizer *t, int32_t left, int32_t right)
{
    __builtin_prefetch(&t->merge_slots[pair_home(t, pair_key(left, right))]);
}

static void merge_put(q3_tokenizer *t, uint64_t slot)
{
    uint32_t mask = t->merge_mask;
    uint32_t i = pair_home(t, slot >> TK_RANK_BITS);
    while (t->merge_slots[i] != TK_SLOT_EMPTY) i = (i + 1) & mask;
    t->merge_slots[i] = slot;
}

/* Rank = number of merges listed before this one. A pair listed twice keeps its
 * first (lower) rank. */
q3_status tk_merge_insert(q3_tokenizer *t, int32_t left, int32_t right, int32_t merged)
{
    if (t->n_merges >= TK_MAX_MERGES)
        return q3_fail(Q3_ERR_FORMAT, "%s: more than %d merges", t->name, TK_MAX_MERGES);
    if (t->n_merges == t->merge_result_cap) {
        size_t cap = t->merge_result_cap ? t->merge_result_cap * 2 : 4096;
        int32_t *r = realloc(t->merge_result, cap * sizeof *r);
        if (!r) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the merges", t->name);
        t->merge_result = r;
        t->merge_result_cap = cap;
    }
    int32_t rank = (int32_t)t->n_merges++;
    t->merge_result[rank] = merged;
    if (merge_rank(t, left, right) != INT32_MAX) return Q3_OK;
    if ((t->n_merges + 1) * 3 > ((size_t)t->merge_mask + 1) * 2) {
        uint64_t *old = t->merge_slots;
        size_t old_size = (size_t)t->merge_mask + 1;
        t->merge_slots = NULL;
        if (merge_alloc(t, old_size * 2)) {
            t->merge_slots = old;
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the merges", t->name);
        }
        for (size_t i = 0; i < old_size; i++)
            if (old[i] != TK_SLOT_EMPTY) merge_put(t, old[i]);
        free(old);
    }
    merge_put(t, pair_key(left, right) << TK_RANK_BITS | (uint64_t)rank);
    return Q3_OK;
}

q3_status tk_build_byte_pairs(q3_tokenizer *t)
{
    if (!t->byte_pair_rank) t->byte_pair_rank = malloc(256 * 256 * sizeof *t->byte_pair_rank);
    if (!t->byte_pair_rank) return q3_fail(Q3_ERR_NOMEM, "%s: out of memory", t->name);
    for (int i = 0; i < 256 * 256; i++) t->byte_pair_rank[i] = INT32_MAX;
    /* One sequential pass over the merges (not 65536 random lookups). */
    for (uint32_t i = 0; i <= t->merge_mask; i++) {
        uint64_t s = t->merge_slots[i];
        if (s == TK_SLOT_EMPTY) continue;
        int32_t left = (int32_t)(s >> (TK_RANK_BITS + TK_ID_BITS)), right = (int32_t)((s >> TK_RANK_BITS) & ((1u << TK_ID_BITS) - 1));
        if (t->tok_len[left] != 1 || t->tok_len[right] != 1) continue;
        unsigned char a = (unsigned char)t->bytes.data[t->tok_off[left]], b = (unsigned char)t->bytes.data[t->tok_off[right]];
        if (t->byte_id[a] == left && t->byte_id[b] == right)
            t->byte_pair_rank[a * 256 + b] = (int32_t)(s & ((1u << TK_RANK_BITS) - 1));
    }
    return Q3_OK;
}

/* ==== the merge loop ========================================================= */

void tk_scratch_free(tk_scratch *sc)
{
    tk_buf_free(&sc->nfc);
    if (sc->md) pcre2_match_data_free(sc->md);
    if (sc->mc) pcre2_match_context_free(sc->mc);
    free(sc->sym);
    free(sc->prev);
    free(sc->next);
    free(sc->rank);
    free(sc->heap);
    free(sc->cache);
    tk_buf_free(&sc->cache_keys);
    free(sc->cache_ids);
    memset(sc, 0, sizeof *sc);
}

void tk_scratch_trim(tk_scratch *sc)
{
    if (sc->cap > TK_SCRATCH_KEEP) {
        free(sc->sym), free(sc->prev), free(sc->next), free(sc->rank), free(sc->heap);
        sc->sym = sc->prev = sc->next = sc->rank = NULL;
        sc->heap = NULL;
        sc->cap = 0;
    }
    if (sc->nfc.cap > TK_SCRATCH_KEEP) tk_buf_free(&sc->nfc);
}

static int scratch_reserve(tk_scratch *sc, size_t n)
{
    if (n <= sc->cap) return 0;
    size_t cap = sc->cap ? sc->cap : 64;
    while (cap < n) cap *= 2;
    int32_t **arrays[] = {&sc->sym, &sc->prev, &sc->next, &sc->rank};
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

/* rank[i] is the rank of the pair (sym[i], sym[next[i]]); INT32_MAX: no merge. */
static inline void set_pair(const q3_tokenizer *t, tk_scratch *sc, int32_t i)
{
    int32_t j = sc->next[i];
    sc->rank[i] = j >= 0 ? merge_rank(t, sc->sym[i], sc->sym[j]) : INT32_MAX;
}

/* Merges the pair at i with its right neighbour; refreshes the two pairs it touches. */
static inline void merge_at(const q3_tokenizer *t, tk_scratch *sc, int32_t i)
{
    int32_t j = sc->next[i];
    sc->sym[i] = t->merge_result[sc->rank[i]];
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
    if (n > (size_t)INT32_MAX / 4)
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
    /* The first round of pairs are byte pairs: a 256 KB table, no hashing. */
    int32_t ni = (int32_t)n;
    for (int32_t i = 0; i < ni; i++) {
        sc->sym[i] = t->byte_id[piece[i]];
        sc->prev[i] = i - 1;
        sc->next[i] = i + 1;
        sc->rank[i] = i + 1 < ni ? t->byte_pair_rank[piece[i] * 256 + piece[i + 1]] : INT32_MAX;
    }
    sc->next[ni - 1] = -1;

    if (!use_heap) {
        for (;;) {
            int32_t best = INT32_MAX, at = -1;
            for (int32_t i = 0; i >= 0; i = sc->next[i])
                if (sc->rank[i] < best) best = sc->rank[i], at = i;
            if (at < 0) break;
            merge_at(t, sc, at);
        }
    } else {
        size_t hn = 0;
        for (int32_t i = 0; i < ni; i++)
            if (sc->rank[i] != INT32_MAX) heap_push(sc->heap, &hn, (uint64_t)sc->rank[i] << 32 | (uint32_t)i);
        while (hn) {
            uint64_t top = heap_pop(sc->heap, &hn);
            int32_t i = (int32_t)(uint32_t)top, r = (int32_t)(top >> 32);
            /* Stale if i was merged away or its pair changed since the push. */
            if (sc->sym[i] < 0 || sc->rank[i] != r) continue;
            merge_at(t, sc, i);
            if (sc->rank[i] != INT32_MAX) heap_push(sc->heap, &hn, (uint64_t)sc->rank[i] << 32 | (uint32_t)i);
            int32_t p = sc->prev[i];
            if (p >= 0 && sc->rank[p] != INT32_MAX)
                heap_push(sc->heap, &hn, (uint64_t)sc->rank[p] << 32 | (uint32_t)p);
        }
    }
    for (int32_t i = 0; i >= 0; i = sc->next[i]) out->ids[out->n++] = sc->sym[i];
    return Q3_OK;
}

/* ==== the piece cache ======================================================== */

/* The cache lives as long as its scratch (see the pool in tokenizer.c), so it is
 * bounded: past these limits it starts over. */
#define TK_CACHE_MAX_PIECE 4096
#define TK_CACHE_MAX_ENTRIES (1u << 16)
#define TK_CACHE_MAX_BYTES ((size_t)4 << 20)

static void cache_clear(tk_scratch *sc)
{
    if (sc->cache) memset(sc->cache, 0, ((size_t)sc->cache_mask + 1) * sizeof *sc->cache);
    sc->cache_used = 0;
    sc->cache_keys.len = 0;
    sc->cache_ids_len = 0;
}

static int cache_grow(tk_scratch *sc)
{
    uint32_t size = sc->cache ? (sc->cache_mask + 1) * 2 : 1024;
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

/* The ids of a cached entry, appended to out. */
static inline q3_status cache_emit(const q3_tokenizer *t, const tk_scratch *sc, const tk_cache_slot *s,
                                   q3_tokens *out)
{
    if (out->n + s->n_ids > out->cap && tk_tokens_reserve(out, s->n_ids))
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the token ids", t->name);
    if (s->n_ids == 1) out->ids[out->n] = (int32_t)s->ids;
    else memcpy(out->ids + out->n, sc->cache_ids + s->ids, s->n_ids * sizeof(int32_t));
    out->n += s->n_ids;
    return Q3_OK;
}

q3_status tk_bpe_piece(const q3_tokenizer *t, tk_scratch *sc, const unsigned char *piece,
                       size_t n, q3_tokens *out)
{
    if (n == 1) { /* every byte is a token */
        if (out->n == out->cap && tk_tokens_reserve(out, 1))
            return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the token ids", t->name);
        out->ids[out->n++] = t->byte_id[piece[0]];
        return Q3_OK;
    }
    if (n > TK_CACHE_MAX_PIECE) return tk_bpe_uncached(t, sc, piece, n, 1, out);

    if (!sc->cache && cache_grow(sc))
        return q3_fail(Q3_ERR_NOMEM, "%s: out of memory for the piece cache", t->name);
    uint32_t h = (uint32_t)tk_hash_bytes(piece, n);
    uint64_t head = key_head(piece, n);
    uint32_t i = h & sc->cache_mask;
    for (;; i = (i + 1) & sc->cache_mask) {
        const tk_cache_slot *s = &sc->cache[i];
        if (!s->key_len) break;
        if (s->hash == h && s->key_len == n && s->head == head &&
            (n <= 8 || memcmp(sc->cache_keys.data + s->key_off, piece + 8, n - 8) == 0))
            return cache_emit(t, sc, s, out);
    }

    size_t first = out->n;
    q3_status st = tk_bpe_uncached(t, sc, piece, n, n > TK_BPE_SCAN_MAX, out);
    if (st != Q3_OK) return st;
    size_t k = out->n - first;

    /* Remember it (on allocation failure, just do not). */
    if (sc->cache_used >= TK_CACHE_MAX_ENTRIES || sc->cache_keys.len + n > TK_CACHE_MAX_BYTES ||
        sc->cache_ids_len + k > TK_CACHE_MAX_BYTES / sizeof(int32_t)) {
        cache_clear(sc);
        for (i = h & sc->cache_mask; sc->cache[i].key_len; i = (i + 1) & sc->cache_mask) {}
    }
    if ((sc->cache_used + 1) * 2 > sc->cache_mask + 1) {
        if (cache_grow(sc)) return Q3_OK;
        for (i = h & sc->cache_mask; sc->cache[i].key_len; i = (i + 1) & sc->cache_mask) {}
    }
    tk_cache_slot slot = {.head = head, .hash = h, .key_len = (uint32_t)n, .n_ids = (uint32_t)k};
    if (n > 8) { /* the bytes past the head */
        slot.key_off = (uint32_t)sc->cache_keys.len;
        if (tk_buf_append(&sc->cache_keys, piece + 8, n - 8)) return Q3_OK;
    }
    if (k == 1) {
        slot.ids = (uint32_t)out->ids[first];
    } else {
        if (sc->cache_ids_len + k > sc->cache_ids_cap) {
            size_t cap = sc->cache_ids_cap ? sc->cache_ids_cap * 2 : 4096;
            while (cap < sc->cache_ids_len + k) cap *= 2;
            int32_t *p = realloc(sc->cache_ids, cap * sizeof *p);
            if (!p) return Q3_OK;
            sc->cache_ids = p;
            sc->cache_ids_cap = cap;
        }
        memcpy(sc->cache_ids + sc->cache_ids_len, out->ids + first, k * sizeof(int32_t));
        slot.ids = (uint32_t)sc->cache_ids_len;
        sc->cache_ids_len += k;
    }
    sc->cache[i] = slot;
    sc->cache_used++;
    return Q3_OK;
}
