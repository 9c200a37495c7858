/* Per-tokenizer tables (vocab.h): token bytes, the token trie in preorder,
 * ranks, and each subtree's byte union. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/vocab.h"
#include "util/error.h"

#define MAX_VOCABS 16

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t key;
    gvocab *v;
} registry[MAX_VOCABS];
static int n_registry;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static void vocab_free(gvocab *v)
{
    if (!v) return;
    free(v->rank_of);
    free(v->id_of_rank);
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->in_trie);
    free(v->lab);
    free(v->end);
    free(v->rank_lo);
    free(v->tok_rank);
    free(v->kid_off);
    free(v->kid);
    free(v->kid_lab);
    free(v->uni);
    free(v->unions);
    free(v->uok);
    free(v->below);
    free(v);
}

static int cmp_tokens(const void *a, const void *b, void *ctx)
{
    const gvocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

int utf8_text_next(int q, unsigned b)
{
    switch (q) {
    case U_B:
        if (b < 0x80) return b >= 0x20 && b != '"' && b != '\\' ? U_B : -1;
        if (b >= 0xC2 && b <= 0xDF) return U_C1;
        if (b == 0xE0) return U_E0;
        if (b == 0xED) return U_ED;
        if (b >= 0xE1 && b <= 0xEF) return U_C2;
        if (b == 0xF0) return U_F0;
        if (b >= 0xF1 && b <= 0xF3) return U_C3;
        if (b == 0xF4) return U_F4;
        return -1;
    case U_C1: return b >= 0x80 && b <= 0xBF ? U_B : -1;
    case U_C2: return b >= 0x80 && b <= 0xBF ? U_C1 : -1;
    case U_C3: return b >= 0x80 && b <= 0xBF ? U_C2 : -1;
    case U_E0: return b >= 0xA0 && b <= 0xBF ? U_C1 : -1;
    case U_ED: return b >= 0x80 && b <= 0x9F ? U_C1 : -1;
    case U_F0: return b >= 0x90 && b <= 0xBF ? U_C2 : -1;
    case U_F4: return b >= 0x80 && b <= 0x8F ? U_C2 : -1;
    }
    return -1;
}

static uint64_t class_hash(const gclass *c)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4; i++) h = (h ^ c->w[i]) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 29);
}

static q3_status build(const q3_tokenizer *tok, int32_t n_ids, int32_t eot, int32_t eos, gvocab **out)
{
    double t0 = seconds();
    gvocab *v = calloc(1, sizeof *v);
    if (!v) return q3_fail(Q3_ERR_NOMEM, "out of memory");
    v->n_ids = n_ids;
    v->eot = eot;
    v->eos = eos;
    size_t total = 0;
    for (int32_t id = 0; id < n_ids; id++) {
        size_t l;
        if (q3_tokenizer_token_bytes(tok, id, &l)) total += l;
    }
    v->bytes = malloc(total + 1);
    v->off = calloc((size_t)n_ids, sizeof *v->off);
    v->len = calloc((size_t)n_ids, sizeof *v->len);
    v->in_trie = calloc((size_t)n_ids, 1);
    v->rank_of = malloc((size_t)n_ids * sizeof *v->rank_of);
    v->id_of_rank = malloc((size_t)n_ids * sizeof *v->id_of_rank);
    int32_t *order = malloc((size_t)n_ids * sizeof *order);
    size_t cap_nodes = total + 2;
    v->lab = malloc(cap_nodes);
    v->end = malloc(cap_nodes * sizeof *v->end);
    v->rank_lo = malloc((cap_nodes + 1) * sizeof *v->rank_lo);
    v->tok_rank = malloc(cap_nodes * sizeof *v->tok_rank);
    int32_t *parent = malloc(cap_nodes * sizeof *parent);
    if (!v->bytes || !v->off || !v->len || !v->in_trie || !v->rank_of || !v->id_of_rank || !order || !v->lab ||
        !v->end || !v->rank_lo || !v->tok_rank || !parent)
        goto oom;
    size_t pos = 0, max_len = 0;
    int32_t n_trie = 0;
    for (int32_t id = 0; id < n_ids; id++) {
        size_t l = 0;
        const char *b = q3_tokenizer_token_bytes(tok, id, &l);
        v->off[id] = (uint32_t)pos;
        v->len[id] = (uint32_t)l;
        if (b && l) memcpy(v->bytes + pos, b, l);
        pos += l;
        if (b && l && !q3_tokenizer_is_added(tok, id)) {
            v->in_trie[id] = 1;
            order[n_trie++] = id;
            if (l > max_len) max_len = l;
        }
    }
    qsort_r(order, (size_t)n_trie, sizeof *order, cmp_tokens, v);
    int32_t *path = malloc((max_len + 1) * sizeof *path);
    if (!path) goto oom;
    path[0] = 0;
    v->lab[0] = 0;
    v->tok_rank[0] = -1;
    v->rank_lo[0] = 0;
    parent[0] = -1;
    int32_t n_nodes = 1, rank = 0;
    size_t cur = 0;
    for (int32_t k = 0; k < n_trie; k++) {
        int32_t id = order[k];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[id];
        size_t L = v->len[id], lcp = 0;
        if (k) {
            int32_t p = order[k - 1];
            const unsigned char *pb = (const unsigned char *)v->bytes + v->off[p];
            size_t pl = v->len[p], m = pl < L ? pl : L;
            while (lcp < m && pb[lcp] == b[lcp]) lcp++;
            if (lcp == L && pl == L) { /* the same bytes as the previous token: the same rank */
                v->rank_of[id] = rank - 1;
                v->shared_ranks = 1;
                continue;
            }
        }
        for (size_t d = cur; d > lcp; d--) v->end[path[d]] = n_nodes;
        for (size_t d = lcp + 1; d <= L; d++) {
            int32_t x = n_nodes++;
            v->lab[x] = b[d - 1];
            v->tok_rank[x] = -1;
            v->rank_lo[x] = rank;
            parent[x] = path[d - 1];
            path[d] = x;
        }
        cur = L;
        v->tok_rank[path[L]] = rank;
        v->rank_of[id] = rank;
        v->id_of_rank[rank] = id;
        rank++;
    }
    for (size_t d = cur; d > 0; d--) v->end[path[d]] = n_nodes;
    v->end[0] = n_nodes;
    free(path);
    v->n_nodes = n_nodes;
    v->n_trie_ranks = rank;
    v->rank_lo[n_nodes] = rank;
    for (int32_t id = 0; id < n_ids; id++)
        if (!v->in_trie[id]) {
            v->rank_of[id] = rank;
            v->id_of_rank[rank] = id;
            rank++;
        }
    for (int32_t r = rank; r < n_ids; r++) v->id_of_rank[r] = -1; /* ranks shared by equal tokens */
    /* children lists: preorder visits a node's children in byte order */
    v->kid_off = calloc((size_t)n_nodes + 1, sizeof *v->kid_off);
    v->kid = malloc((size_t)(n_nodes > 1 ? n_nodes - 1 : 1) * sizeof *v->kid);
    v->kid_lab = malloc((size_t)(n_nodes > 1 ? n_nodes - 1 : 1));
    if (!v->kid_off || !v->kid || !v->kid_lab) goto oom;
    for (int32_t x = 1; x < n_nodes; x++) v->kid_off[parent[x] + 1]++;
    for (int32_t x = 0; x < n_nodes; x++) v->kid_off[x + 1] += v->kid_off[x];
    {
        int32_t *fill = malloc((size_t)n_nodes * sizeof *fill);
        if (!fill) goto oom;
        memcpy(fill, v->kid_off, (size_t)n_nodes * sizeof *fill);
        for (int32_t x = 1; x < n_nodes; x++) {
            int32_t k = fill[parent[x]]++;
            v->kid[k] = x;
            v->kid_lab[k] = v->lab[x];
        }
        free(fill);
    }
    /* byte unions, bottom-up, then deduplicated */
    gclass *u = calloc((size_t)n_nodes, sizeof *u);
    v->uni = malloc((size_t)n_nodes * sizeof *v->uni);
    if (!u || !v->uni) {
        free(u);
        goto oom;
    }
    for (int32_t x = n_nodes - 1; x > 0; x--) {
        gclass_add(&u[x], v->lab[x]);
        gclass *p = &u[parent[x]];
        for (int w = 0; w < 4; w++) p->w[w] |= u[x].w[w];
    }
    uint32_t hcap = 1024;
    while (hcap < (uint32_t)n_nodes) hcap *= 2;
    hcap *= 2;
    int32_t *h = calloc(hcap, sizeof *h);
    v->unions = malloc((size_t)n_nodes * sizeof *v->unions);
    if (!h || !v->unions) {
        free(u);
        free(h);
        goto oom;
    }
    for (int32_t x = 0; x < n_nodes; x++) {
        uint32_t k = (uint32_t)class_hash(&u[x]) & (hcap - 1);
        for (;;) {
            if (!h[k]) {
                v->unions[v->n_unions] = u[x];
                h[k] = ++v->n_unions;
                break;
            }
            if (!memcmp(&v->unions[h[k] - 1], &u[x], sizeof u[x])) break;
            k = (k + 1) & (hcap - 1);
        }
        v->uni[x] = (uint32_t)(h[k] - 1);
    }
    free(h);
    free(u);
    v->uok = malloc((size_t)n_nodes);
    v->below = calloc((size_t)n_nodes, sizeof *v->below);
    if (!v->uok || !v->below) goto oom;
    memset(v->uok, 0xFF, (size_t)n_nodes); /* a token may end inside a character: the text goes on */
    for (int32_t x = n_nodes - 1; x > 0; x--) { /* children come after their parent: fold each into it */
        uint8_t keep = 0;
        for (int q = 0; q < U_N; q++) {
            int q2 = utf8_text_next(q, v->lab[x]);
            if (q2 >= 0 && (v->uok[x] >> q2 & 1)) keep |= (uint8_t)(1u << q);
        }
        v->uok[parent[x]] &= keep;
        uint16_t b = (uint16_t)(v->below[x] + 1 > 65535 ? 65535 : v->below[x] + 1);
        if (b > v->below[parent[x]]) v->below[parent[x]] = b;
    }
    gclass *shrunk = realloc(v->unions, (size_t)(v->n_unions ? v->n_unions : 1) * sizeof *v->unions);
    if (shrunk) v->unions = shrunk;
    free(order);
    free(parent);
    v->bytes_held = sizeof *v + total + (size_t)n_ids * (4 + 4 + 4 + 4 + 1) +
                    (size_t)n_nodes * (1 + 4 + 4 + 4 + 4 + 1 + 2 + 4 + 4 + 1) + (size_t)v->n_unions * sizeof(gclass);
    v->build_s = seconds() - t0;
    *out = v;
    return Q3_OK;
oom:
    free(order);
    free(parent);
    vocab_free(v);
    return q3_fail(Q3_ERR_NOMEM, "out of memory building the token trie");
}

/* The last tokenizer seen, with a fingerprint of 256 of its tokens: the same
 * pointer and fingerprint skip hashing the whole vocabulary (about 1 MB) on
 * every compile. A different tokenizer at a freed one's address with the same
 * size and the same sampled tokens would be taken for it. */
static const q3_tokenizer *last_tok;
static uint64_t last_print;
static gvocab *last_v;

static uint64_t fingerprint(const q3_tokenizer *tok, int32_t n_ids, int32_t eot, int32_t eos)
{
    uint64_t h = fnv(0xcbf29ce484222325ull, &n_ids, sizeof n_ids);
    h = fnv(h, &eot, sizeof eot);
    h = fnv(h, &eos, sizeof eos);
    for (int k = 0; k < 256 && n_ids > 0; k++) {
        int32_t id = (int32_t)(((int64_t)k * n_ids) / 256);
        size_t l = 0;
        const char *b = q3_tokenizer_token_bytes(tok, id, &l);
        h = fnv(h, &l, sizeof l);
        if (b) h = fnv(h, b, l);
    }
    return h;
}

q3_status gvocab_get(const q3_tokenizer *tok, int32_t n_ids, int32_t eot, int32_t eos, const gvocab **out)
{
    uint64_t print = fingerprint(tok, n_ids, eot, eos);
    pthread_mutex_lock(&registry_lock);
    if (last_tok == tok && last_print == print && last_v) {
        *out = last_v;
        pthread_mutex_unlock(&registry_lock);
        return Q3_OK;
    }
    pthread_mutex_unlock(&registry_lock);
    uint64_t key = fnv(0xcbf29ce484222325ull, &n_ids, sizeof n_ids);
    key = fnv(key, &eot, sizeof eot);
    key = fnv(key, &eos, sizeof eos);
    for (int32_t id = 0; id < n_ids; id++) {
        size_t l = 0;
        const char *b = q3_tokenizer_token_bytes(tok, id, &l);
        unsigned char kind = (unsigned char)(b ? 1 + q3_tokenizer_is_added(tok, id) : 0);
        key = fnv(key, &kind, 1);
        key = fnv(key, &l, sizeof l);
        if (b) key = fnv(key, b, l);
    }
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < n_registry; i++)
        if (registry[i].key == key) {
            *out = last_v = registry[i].v;
            last_tok = tok;
            last_print = print;
            pthread_mutex_unlock(&registry_lock);
            return Q3_OK;
        }
    q3_status st = Q3_OK;
    if (n_registry == MAX_VOCABS) {
        st = q3_fail(Q3_ERR_UNSUPPORTED, "more than %d distinct vocabularies in one process", MAX_VOCABS);
    } else {
        gvocab *v = NULL;
        st = build(tok, n_ids, eot, eos, &v);
        if (!st) {
            registry[n_registry].key = key;
            registry[n_registry].v = v;
            n_registry++;
            *out = last_v = v;
            last_tok = tok;
            last_print = print;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}
