/* A grammar's masks shared by its matchers (mask_share.h): an open-addressing
 * table from state keys to masks, under a lock. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/mask_share.h"

typedef struct entry {
    uint64_t h;     /* 0: empty (hashes are made nonzero) */
    int32_t *key;
    size_t n;
    uint64_t *bits;
} entry;

struct mask_share {
    pthread_mutex_t lock;
    size_t words;
    entry *e;
    size_t cap, count, bytes;
};

static size_t total_bytes; /* every table's masks (atomic) */

mask_share *mask_share_new(size_t words)
{
    mask_share *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->words = words;
    s->cap = 64;
    s->e = calloc(s->cap, sizeof *s->e);
    if (!s->e) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

void mask_share_free(mask_share *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++)
        if (s->e[i].h) {
            free(s->e[i].key);
            free(s->e[i].bits);
        }
    __atomic_sub_fetch(&total_bytes, s->bytes, __ATOMIC_RELAXED);
    pthread_mutex_destroy(&s->lock);
    free(s->e);
    free(s);
}

static uint64_t nonzero(uint64_t h) { return h ? h : 1; }

/* The slot of key in s->e: its entry, or the empty slot where it would go. */
static entry *slot(entry *e, size_t cap, const int32_t *key, size_t n, uint64_t h)
{
    for (size_t i = (size_t)h & (cap - 1);; i = (i + 1) & (cap - 1))
        if (!e[i].h || (e[i].h == h && e[i].n == n && !memcmp(e[i].key, key, n * sizeof *key))) return &e[i];
}

const uint64_t *mask_share_find(mask_share *s, const int32_t *key, size_t n, uint64_t h)
{
    if (!s) return NULL;
    h = nonzero(h);
    pthread_mutex_lock(&s->lock);
    entry *x = slot(s->e, s->cap, key, n, h);
    const uint64_t *bits = x->h ? x->bits : NULL;
    pthread_mutex_unlock(&s->lock);
    return bits;
}

void mask_share_put(mask_share *s, const int32_t *key, size_t n, uint64_t h, const uint64_t *bits)
{
    if (!s) return;
    h = nonzero(h);
    size_t cost = s->words * sizeof *bits + n * sizeof *key;
    if (__atomic_load_n(&s->bytes, __ATOMIC_RELAXED) + cost > MASK_SHARE_GRAMMAR_BYTES) return; /* full: no copy made */
    if (__atomic_add_fetch(&total_bytes, cost, __ATOMIC_RELAXED) > MASK_SHARE_TOTAL_BYTES) {
        __atomic_sub_fetch(&total_bytes, cost, __ATOMIC_RELAXED);
        return;
    }
    int32_t *k = malloc(n ? n * sizeof *k : 1);
    uint64_t *b = malloc(s->words * sizeof *b);
    int kept = 0;
    if (k && b) {
        memcpy(k, key, n * sizeof *k);
        memcpy(b, bits, s->words * sizeof *b);
        pthread_mutex_lock(&s->lock);
        if (s->bytes + cost <= MASK_SHARE_GRAMMAR_BYTES) {
            if (2 * (s->count + 1) > s->cap) { /* grow: at most half full */
                entry *e = calloc(2 * s->cap, sizeof *e);
                if (e) {
                    for (size_t i = 0; i < s->cap; i++)
                        if (s->e[i].h) *slot(e, 2 * s->cap, s->e[i].key, s->e[i].n, s->e[i].h) = s->e[i];
                    free(s->e);
                    s->e = e;
                    s->cap *= 2;
                }
            }
            entry *x = slot(s->e, s->cap, k, n, h);
            if (!x->h && 2 * (s->count + 1) <= s->cap) { /* new (another thread may have kept it first) */
                *x = (entry){.h = h, .key = k, .n = n, .bits = b};
                s->count++;
                __atomic_store_n(&s->bytes, s->bytes + cost, __ATOMIC_RELAXED);
                kept = 1;
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
    if (!kept) {
        free(k);
        free(b);
        __atomic_sub_fetch(&total_bytes, cost, __ATOMIC_RELAXED);
    }
}

size_t mask_share_count(mask_share *s, size_t *bytes)
{
    if (bytes) *bytes = 0;
    if (!s) return 0;
    pthread_mutex_lock(&s->lock);
    size_t n = s->count;
    if (bytes) *bytes = s->bytes;
    pthread_mutex_unlock(&s->lock);
    return n;
}
