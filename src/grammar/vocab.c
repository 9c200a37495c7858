/* Per-tokenizer tables (vocab.h): token bytes, the token trie in preorder,
 * ranks, each subtree's byte union, packed into child records. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* A table the mask walk reads at random (the trie's child records: 10 MB for
 * Qwen3's vocabulary), on 2 MB pages where the kernel gives them (madvise; a
 * hint, the memory is the same without): the walk's cache misses are then not
 * also TLB misses. Freed with free(). */
static void *walk_table_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge / 2) return malloc(bytes ? bytes : 1);
    size_t rounded = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, rounded)) return NULL;
    madvise(p, rounded, MADV_HUGEPAGE);
    return p;
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
    free(v->kids);
    free(v->unions);
    free(v->text_only);
    free(v->tails);
    free(v->tail_ranks);
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

/* Stored plus one, so that what no range names is 0 (-1: not such text).
 * GNU range designators (gcc and clang). */
#define N(q) ((q) + 1)
const uint8_t utf8_text1[U_N][256] = {
    [U_B] = {[0x20 ... 0x21] = N(U_B), [0x23 ... 0x5B] = N(U_B), [0x5D ... 0x7F] = N(U_B), [0xC2 ... 0xDF] = N(U_C1),
             [0xE0] = N(U_E0), [0xE1 ... 0xEC] = N(U_C2), [0xED] = N(U_ED), [0xEE ... 0xEF] = N(U_C2),
             [0xF0] = N(U_F0), [0xF1 ... 0xF3] = N(U_C3), [0xF4] = N(U_F4)},
    [U_C1] = {[0x80 ... 0xBF] = N(U_B)},
    [U_C2] = {[0x80 ... 0xBF] = N(U_C1)},
    [U_C3] = {[0x80 ... 0xBF] = N(U_C2)},
    [U_E0] = {[0xA0 ... 0xBF] = N(U_C1)},
    [U_ED] = {[0x80 ... 0x9F] = N(U_C1)},
    [U_F0] = {[0x90 ... 0xBF] = N(U_C2)},
    [U_F4] = {[0x80 ... 0x8F] = N(U_C2)},
};
#undef N

static uint64_t class_hash(const gclass *c)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4; i++) h = (h ^ c->w[i]) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 29);
}

/* The trie as build makes it, one array per field by node (preorder; node 0
 * is the root), before it is packed into gkid records. */
typedef struct trie {
    uint8_t *lab;      /* [n_nodes] the byte into the node */
    int32_t *end;      /* [n_nodes] first index after the subtree */
    int32_t *rank_lo;  /* [n_nodes + 1] ranks before the node's subtree; [n_nodes] = n_trie_ranks */
    int32_t *tok_rank; /* [n_nodes] the token ending here, or -1 */
    int32_t *kid_off;  /* [n_nodes + 1] node v's children are kid[kid_off[v] .. kid_off[v + 1]) */
    int32_t *kid;      /* [n_nodes - 1] */
    uint32_t *uni;     /* [n_nodes] */
    uint8_t *uok;      /* [n_nodes] */
    uint16_t *below;   /* [n_nodes] */
} trie;

static void trie_free(trie *t)
{
    free(t->lab);
    free(t->end);
    free(t->rank_lo);
    free(t->tok_rank);
    free(t->kid_off);
    free(t->kid);
    free(t->uni);
    free(t->uok);
    free(t->below);
}

/* ---- text tokens and tails (vocab.h) -------------------------------------------------------- */

typedef struct tail_entry {
    const unsigned char *b;
    uint32_t len;
    int32_t rank;
} tail_entry;

static int cmp_tails(const void *a, const void *b)
{
    const tail_entry *x = a, *y = b;
    int c = memcmp(x->b, y->b, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* text_only, and the tails' trie built as the token trie is: tails sorted,
 * nodes made in preorder along each one's path past what it shares with the
 * one before, then packed as children blocks. */
static q3_status build_tails(gvocab *v)
{
    size_t words = gvocab_mask_words(v);
    v->text_only = calloc(words, sizeof *v->text_only);
    tail_entry *e = malloc((size_t)(v->n_trie_ranks ? v->n_trie_ranks : 1) * sizeof *e);
    if (!v->text_only || !e) {
        free(e);
        return Q3_ERR_NOMEM;
    }
    int32_t n_e = 0;
    size_t total = 0;
    for (int32_t r = 0; r < v->n_trie_ranks; r++) {
        int32_t id = v->id_of_rank[r];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[id];
        uint32_t len = v->len[id], start = 0, i = 0;
        int q = U_B;
        for (; i < len; i++) {
            q = utf8_text_next(q, b[i]);
            if (q < 0) break;
            if (q == U_B) start = i + 1;
        }
        if (i == len) {
            v->text_only[r >> 6] |= 1ull << (r & 63);
            continue;
        }
        e[n_e++] = (tail_entry){.b = b + start, .len = len - start, .rank = r};
        total += len - start;
    }
    qsort(e, (size_t)n_e, sizeof *e, cmp_tails);
    size_t cap = total + 1;
    uint8_t *lab = malloc(cap);
    int32_t *parent = malloc(cap * sizeof *parent), *lo = malloc(cap * sizeof *lo), *hi = malloc(cap * sizeof *hi);
    int32_t *path = malloc(((size_t)v->max_token_bytes + 1) * sizeof *path);
    int32_t *kid_off = calloc(cap + 1, sizeof *kid_off);
    v->tail_ranks = malloc((size_t)(n_e ? n_e : 1) * sizeof *v->tail_ranks);
    q3_status st = Q3_ERR_NOMEM;
    if (!lab || !parent || !lo || !hi || !path || !kid_off || !v->tail_ranks) goto done;
    int32_t n = 1; /* node 0: the root */
    path[0] = 0;
    parent[0] = -1;
    for (int32_t k = 0; k < n_e; k++) {
        uint32_t lcp = 0;
        if (k) {
            uint32_t m = e[k - 1].len < e[k].len ? e[k - 1].len : e[k].len;
            while (lcp < m && e[k - 1].b[lcp] == e[k].b[lcp]) lcp++;
        }
        for (uint32_t d = lcp + 1; d <= e[k].len; d++) {
            lab[n] = e[k].b[d - 1];
            parent[n] = path[d - 1];
            lo[n] = hi[n] = 0;
            path[d] = n++;
        }
        int32_t x = path[e[k].len];
        if (lo[x] == hi[x]) lo[x] = k;
        hi[x] = k + 1;
        v->tail_ranks[k] = e[k].rank;
    }
    /* preorder: a node's children in byte order, its parent's block before theirs */
    for (int32_t x = 1; x < n; x++) kid_off[parent[x] + 1]++;
    for (int32_t x = 0; x < n; x++) kid_off[x + 1] += kid_off[x];
    v->tails = malloc((size_t)(n > 1 ? n - 1 : 1) * sizeof *v->tails);
    if (!v->tails) goto done;
    for (int32_t x = 1; x < n; x++) { /* children of one parent come in order: x is the next of its parent's */
        int32_t k = kid_off[parent[x]]++;
        v->tails[k] = (gtail){.lab = lab[x], .ranks_lo = lo[x], .ranks_hi = hi[x], .kids_lo = x, .kids_hi = x};
    }
    /* kid_off[x] now ends x's block: its children are [kid_off[x - 1], kid_off[x]) with kid_off[-1] = 0 */
    for (int32_t k = 0; k < n - 1; k++) {
        int32_t x = v->tails[k].kids_lo;
        v->tails[k].kids_lo = kid_off[x - 1];
        v->tails[k].kids_hi = kid_off[x];
    }
    v->n_tail_nodes = n;
    v->n_tail_root_kids = n > 1 ? kid_off[0] : 0;
    v->bytes_held += words * sizeof *v->text_only + (size_t)(n - 1) * sizeof *v->tails +
                     (size_t)n_e * sizeof *v->tail_ranks;
    st = Q3_OK;
done:
    free(e);
    free(lab);
    free(parent);
    free(lo);
    free(hi);
    free(path);
    free(kid_off);
    return st;
}

static q3_status build(const q3_tokenizer *tok, int32_t n_ids, int32_t eot, int32_t eos, gvocab **out)
{
    double t0 = seconds();
    trie t = {0};
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
    t.lab = malloc(cap_nodes);
    t.end = malloc(cap_nodes * sizeof *t.end);
    t.rank_lo = malloc((cap_nodes + 1) * sizeof *t.rank_lo);
    t.tok_rank = malloc(cap_nodes * sizeof *t.tok_rank);
    int32_t *parent = malloc(cap_nodes * sizeof *parent);
    if (!v->bytes || !v->off || !v->len || !v->in_trie || !v->rank_of || !v->id_of_rank || !order || !t.lab ||
        !t.end || !t.rank_lo || !t.tok_rank || !parent)
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
    v->max_token_bytes = (int32_t)max_len;
    qsort_r(order, (size_t)n_trie, sizeof *order, cmp_tokens, v);
    int32_t *path = malloc((max_len + 1) * sizeof *path);
    if (!path) goto oom;
    path[0] = 0;
    t.lab[0] = 0;
    t.tok_rank[0] = -1;
    t.rank_lo[0] = 0;
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
        for (size_t d = cur; d > lcp; d--) t.end[path[d]] = n_nodes;
        for (size_t d = lcp + 1; d <= L; d++) {
            int32_t x = n_nodes++;
            t.lab[x] = b[d - 1];
            t.tok_rank[x] = -1;
            t.rank_lo[x] = rank;
            parent[x] = path[d - 1];
            path[d] = x;
        }
        cur = L;
        t.tok_rank[path[L]] = rank;
        v->rank_of[id] = rank;
        v->id_of_rank[rank] = id;
        rank++;
    }
    for (size_t d = cur; d > 0; d--) t.end[path[d]] = n_nodes;
    t.end[0] = n_nodes;
    free(path);
    v->n_nodes = n_nodes;
    v->n_trie_ranks = rank;
    t.rank_lo[n_nodes] = rank;
    for (int32_t id = 0; id < n_ids; id++)
        if (!v->in_trie[id]) {
            v->rank_of[id] = rank;
            v->id_of_rank[rank] = id;
            rank++;
        }
    for (int32_t r = rank; r < n_ids; r++) v->id_of_rank[r] = -1; /* ranks shared by equal tokens */
    /* children lists: preorder visits a node's children in byte order */
    t.kid_off = calloc((size_t)n_nodes + 1, sizeof *t.kid_off);
    t.kid = malloc((size_t)(n_nodes > 1 ? n_nodes - 1 : 1) * sizeof *t.kid);
    if (!t.kid_off || !t.kid) goto oom;
    for (int32_t x = 1; x < n_nodes; x++) t.kid_off[parent[x] + 1]++;
    for (int32_t x = 0; x < n_nodes; x++) t.kid_off[x + 1] += t.kid_off[x];
    {
        int32_t *fill = malloc((size_t)n_nodes * sizeof *fill);
        if (!fill) goto oom;
        memcpy(fill, t.kid_off, (size_t)n_nodes * sizeof *fill);
        for (int32_t x = 1; x < n_nodes; x++) {
            int32_t k = fill[parent[x]]++;
            t.kid[k] = x;
        }
        free(fill);
    }
    /* byte unions, bottom-up, then deduplicated */
    gclass *u = calloc((size_t)n_nodes, sizeof *u);
    t.uni = malloc((size_t)n_nodes * sizeof *t.uni);
    if (!u || !t.uni) {
        free(u);
        goto oom;
    }
    for (int32_t x = n_nodes - 1; x > 0; x--) {
        gclass_add(&u[x], t.lab[x]);
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
        t.uni[x] = (uint32_t)(h[k] - 1);
    }
    free(h);
    free(u);
    t.uok = malloc((size_t)n_nodes);
    t.below = calloc((size_t)n_nodes, sizeof *t.below);
    if (!t.uok || !t.below) goto oom;
    memset(t.uok, 0xFF, (size_t)n_nodes); /* a token may end inside a character: the text goes on */
    for (int32_t x = n_nodes - 1; x > 0; x--) { /* children come after their parent: fold each into it */
        uint8_t keep = 0;
        for (int q = 0; q < U_N; q++) {
            int q2 = utf8_text_next(q, t.lab[x]);
            if (q2 >= 0 && (t.uok[x] >> q2 & 1)) keep |= (uint8_t)(1u << q);
        }
        t.uok[parent[x]] &= keep;
        uint16_t b = (uint16_t)(t.below[x] + 1 > 65535 ? 65535 : t.below[x] + 1);
        if (b > t.below[parent[x]]) t.below[parent[x]] = b;
    }
    gclass *shrunk = realloc(v->unions, (size_t)(v->n_unions ? v->n_unions : 1) * sizeof *v->unions);
    if (shrunk) v->unions = shrunk;
    /* packed: kid k of the node lists stands for node t.kid[k] */
    v->kids = walk_table_alloc((size_t)(n_nodes > 1 ? n_nodes - 1 : 1) * sizeof *v->kids);
    if (!v->kids) goto oom;
    for (int32_t k = 0; k < n_nodes - 1; k++) {
        int32_t x = t.kid[k];
        v->kids[k] = (gkid){.rank_lo = t.rank_lo[x], .rank_hi = t.rank_lo[t.end[x]], .kids_lo = t.kid_off[x],
                            .kids_hi = t.kid_off[x + 1], .tok_rank = t.tok_rank[x], .uni = t.uni[x],
                            .below = t.below[x], .lab = t.lab[x], .uok = t.uok[x]};
    }
    v->n_root_kids = t.kid_off[1];
    free(order);
    free(parent);
    trie_free(&t);
    v->bytes_held = sizeof *v + total + (size_t)n_ids * (4 + 4 + 4 + 4 + 1) +
                    (size_t)(n_nodes - 1) * sizeof(gkid) + (size_t)v->n_unions * sizeof(gclass);
    if (build_tails(v)) {
        vocab_free(v);
        return q3_fail(Q3_ERR_NOMEM, "out of memory building the token trie");
    }
    v->build_s = seconds() - t0;
    *out = v;
    return Q3_OK;
oom:
    free(order);
    free(parent);
    trie_free(&t);
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
