/* Token sampler: penalties, temperature, top-k, softmax, top-p, min-p, draw.
 * See sampler.h for the contract. */
#include "sample/sampler.h"
#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Largest penalty window accepted (the ring buffer is allocated up front). */
#define MAX_PENALTY_LAST_N (1 << 20)

/* Top-p without top-k first selects this many of the most probable tokens,
 * and grows the selection by TOP_P_GROWTH until the mass reaches p. */
#define TOP_P_FIRST_SELECTION 256
#define TOP_P_GROWTH 8

struct q3_sampler {
    q3_sampler_params p;
    int n_vocab;
    uint64_t rng[4];   /* xoshiro256** state */
    float *work;       /* [n_vocab] penalized logits, then (dense) probabilities */
    int32_t *cand_id;  /* [n_vocab] kept ids (sparse) */
    float *cand_p;     /* [n_vocab] their logits, then probabilities (sparse) */
    int32_t *count;    /* [n_vocab] occurrences in the window while penalizing; all zero between calls */
    int32_t *history;  /* [penalty_last_n] ring of accepted ids */
    int hist_len;      /* ids in the ring */
    int hist_next;     /* where the next accepted id goes */
};

/* ---- PRNG: splitmix64 seeding, xoshiro256** stream --------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t st[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++) st[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t st[4])
{
    uint64_t result = rotl(st[1] * 5, 7) * 9;
    uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = rotl(st[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t st[4]) { return (double)(rng_next(st) >> 11) * 0x1p-53; }

/* ---- configuration ------------------------------------------------------ */

q3_sampler_params q3_sampler_defaults(int thinking)
{
    q3_sampler_params p = {
        .size = sizeof p,
        .temperature = thinking ? 0.6f : 0.7f,
        .top_k = 20,
        .top_p = thinking ? 0.95f : 0.8f,
        .min_p = 0.0f,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
    };
    return p;
}

q3_status q3_sampler_params_check(const q3_sampler_params *p)
{
    Q3_NOT_NULL(p);
    if (!isfinite(p->temperature))
        return q3_fail(Q3_ERR_INVALID, "sampler: temperature must be a finite number");
    if (p->top_k < 0)
        return q3_fail(Q3_ERR_INVALID, "sampler: top_k is %d, must be >= 0 (0: off)", p->top_k);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return q3_fail(Q3_ERR_INVALID, "sampler: top_p is %g, must be in [0, 1] (1: off)",
                       (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return q3_fail(Q3_ERR_INVALID, "sampler: min_p is %g, must be in [0, 1] (0: off)",
                       (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return q3_fail(Q3_ERR_INVALID, "sampler: repeat_penalty is %g, must be > 0 (1: off)",
                       (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty))
        return q3_fail(Q3_ERR_INVALID, "sampler: presence_penalty must be a finite number");
    if (!isfinite(p->frequency_penalty))
        return q3_fail(Q3_ERR_INVALID, "sampler: frequency_penalty must be a finite number");
    if (p->size > sizeof *p)
        return q3_fail(Q3_ERR_INVALID, "sampler: the parameters are %zu bytes, this library knows %zu: the "
                       "program was built against a newer q3.h", p->size, sizeof *p);
    if (p->penalty_last_n < 0 || p->penalty_last_n > MAX_PENALTY_LAST_N)
        return q3_fail(Q3_ERR_INVALID, "sampler: penalty_last_n is %d, must be in [0, %d]",
                       p->penalty_last_n, MAX_PENALTY_LAST_N);
    return Q3_OK;
}

q3_status q3_sampler_new(const q3_sampler_params *p, int n_vocab, q3_sampler **out)
{
    Q3_NOT_NULL(out);
    *out = NULL;
    Q3_NOT_NULL(p);
    q3_status st = q3_sampler_params_check(p);
    if (st != Q3_OK) return st;
    if (n_vocab <= 0)
        return q3_fail(Q3_ERR_INVALID, "sampler: vocabulary size is %d, must be > 0", n_vocab);

    q3_sampler *s = calloc(1, sizeof *s);
    if (!s) return q3_fail(Q3_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    size_t v = (size_t)n_vocab;
    s->work = malloc(v * sizeof *s->work);
    s->cand_id = malloc(v * sizeof *s->cand_id);
    s->cand_p = malloc(v * sizeof *s->cand_p);
    s->count = calloc(v, sizeof *s->count);
    s->history = malloc((size_t)(p->penalty_last_n > 0 ? p->penalty_last_n : 1) * sizeof *s->history);
    if (!s->work || !s->cand_id || !s->cand_p || !s->count || !s->history) {
        q3_sampler_free(s);
        return q3_fail(Q3_ERR_NOMEM, "sampler: out of memory for a vocabulary of %d", n_vocab);
    }
    q3_sampler_reset(s);
    *out = s;
    return Q3_OK;
}

void q3_sampler_free(q3_sampler *s)
{
    if (!s) return;
    free(s->work);
    free(s->cand_id);
    free(s->cand_p);
    free(s->count);
    free(s->history);
    free(s);
}

void q3_sampler_reset(q3_sampler *s)
{
    if (!s) return;
    s->hist_len = 0;
    s->hist_next = 0;
    rng_seed(s->rng, s->p.seed);
}

/* ---- penalties ---------------------------------------------------------- */

void q3_sampler_accept(q3_sampler *s, int32_t id)
{
    if (!s) return;
    int cap = s->p.penalty_last_n;
    if (cap == 0 || id < 0 || id >= s->n_vocab) return;
    s->history[s->hist_next] = id;
    s->hist_next = (s->hist_next + 1) % cap;
    if (s->hist_len < cap) s->hist_len++;
}

void q3_sampler_apply_penalties(q3_sampler *s, float *logits)
{
    if (!s || !logits) return;
    float rp = s->p.repeat_penalty, pp = s->p.presence_penalty, fp = s->p.frequency_penalty;
    if (rp == 1.0f && pp == 0.0f && fp == 0.0f) return;
    /* The ring's first hist_len slots hold the window (order does not matter):
     * count each id, then penalize each distinct id once, clearing its count. */
    for (int i = 0; i < s->hist_len; i++) s->count[s->history[i]]++;
    for (int i = 0; i < s->hist_len; i++) {
        int32_t id = s->history[i], c = s->count[id];
        if (!c) continue;
        s->count[id] = 0;
        float x = logits[id];
        if (rp != 1.0f) x = x > 0.0f ? x / rp : x * rp;
        logits[id] = x - (fp * (float)c + pp);
    }
}

/* ---- selection helpers -------------------------------------------------- */

/* Candidate order: higher value first, then lower id. */
static inline int ranks_below(float va, int32_t ia, float vb, int32_t ib)
{
    return va < vb || (va == vb && ia > ib);
}

/* Sifts heap slot i down in a heap whose root holds the lowest-ranked entry. */
static void heap_sift_down(int32_t *ids, float *vals, size_t n, size_t i)
{
    for (;;) {
        size_t lo = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_below(vals[l], ids[l], vals[lo], ids[lo])) lo = l;
        if (r < n && ranks_below(vals[r], ids[r], vals[lo], ids[lo])) lo = r;
        if (lo == i) return;
        int32_t ti = ids[i]; ids[i] = ids[lo]; ids[lo] = ti;
        float tv = vals[i]; vals[i] = vals[lo]; vals[lo] = tv;
        i = lo;
    }
}

/* Writes the m highest-ranked entries of the dense row src[n] (id = index)
 * into ids/vals[0..m), best first. O(n log m); never sorts the whole row.
 * Because ids are scanned in increasing order, an entry equal to the heap's
 * worst never displaces it, which keeps the lower id on ties. */
static void select_top(const float *src, size_t n, size_t m, int32_t *ids, float *vals)
{
    for (size_t i = 0; i < m; i++) {
        ids[i] = (int32_t)i;
        vals[i] = src[i];
    }
    for (size_t i = m / 2; i-- > 0;) heap_sift_down(ids, vals, m, i);
    for (size_t i = m; i < n; i++) {
        if (src[i] > vals[0]) {
            ids[0] = (int32_t)i;
            vals[0] = src[i];
            heap_sift_down(ids, vals, m, 0);
        }
    }
    /* Heap sort: the worst goes to the back each time. */
    for (size_t end = m; end > 1; end--) {
        int32_t ti = ids[0]; ids[0] = ids[end - 1]; ids[end - 1] = ti;
        float tv = vals[0]; vals[0] = vals[end - 1]; vals[end - 1] = tv;
        heap_sift_down(ids, vals, end - 1, 0);
    }
}

/* softmax(v / T) in place over n values, from logits to probabilities.
 * If the largest value is infinite, the entries equal to it share the mass. */
static void softmax_scaled(float *v, size_t n, float inv_temp)
{
    float max = v[0];
    for (size_t i = 1; i < n; i++)
        if (v[i] > max) max = v[i];
    double sum = 0.0;
    if (isinf(max)) {
        for (size_t i = 0; i < n; i++) {
            v[i] = v[i] == max ? 1.0f : 0.0f;
            sum += v[i];
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            v[i] = expf((v[i] - max) * inv_temp);
            sum += v[i];
        }
    }
    float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++) v[i] *= inv;
}

/* ---- the filtering pipeline --------------------------------------------- */

/* What survives stages 1-6. Dense: every id, probabilities in s->work.
 * Sparse: cand_id/cand_p[0..n), best first when sorted. */
typedef struct kept_set {
    int dense;
    int sorted;
    size_t n;
    double total; /* probability mass kept (renormalize by this) */
} kept_set;

static kept_set filter(q3_sampler *s, const float *logits)
{
    const q3_sampler_params *p = &s->p;
    size_t v = (size_t)s->n_vocab;
    kept_set k = {0};

    memcpy(s->work, logits, v * sizeof *s->work);
    q3_sampler_apply_penalties(s, s->work);

    /* Greedy: the argmax, lowest id on ties. A temperature so small that
     * 1/T overflows is the same limit. */
    float inv_temp = 1.0f / p->temperature;
    if (p->temperature <= 0.0f || isinf(inv_temp)) {
        size_t best = 0;
        for (size_t i = 1; i < v; i++)
            if (s->work[i] > s->work[best]) best = i;
        s->cand_id[0] = (int32_t)best;
        s->cand_p[0] = 1.0f;
        k.n = 1;
        k.sorted = 1;
        k.total = 1.0;
        return k;
    }

    /* Temperature scales every logit by the same positive factor, which keeps
     * their order: so top-k runs on the raw logits and only the survivors get
     * scaled, inside the softmax. */
    if (p->top_k > 0 && (size_t)p->top_k < v) {
        k.n = (size_t)p->top_k;
        select_top(s->work, v, k.n, s->cand_id, s->cand_p);
        k.sorted = 1;
        softmax_scaled(s->cand_p, k.n, inv_temp);
    } else {
        k.dense = 1;
        k.n = v;
        softmax_scaled(s->work, v, inv_temp);
    }

    if (p->top_p < 1.0f) {
        /* Without top-k, select a growing prefix of the most probable tokens
         * until it holds mass p; a sharp distribution stops at the first. */
        size_t avail = k.n, m = k.n;
        if (k.dense) m = avail < TOP_P_FIRST_SELECTION ? avail : TOP_P_FIRST_SELECTION;
        for (;;) {
            if (k.dense) select_top(s->work, v, m, s->cand_id, s->cand_p);
            double cum = 0.0;
            size_t cut = 0;
            while (cut < m && cum < p->top_p) cum += s->cand_p[cut++];
            if (cum >= p->top_p || m == avail) {
                k.dense = 0;
                k.sorted = 1;
                k.n = cut > 0 ? cut : 1;
                break;
            }
            m = m * TOP_P_GROWTH < avail ? m * TOP_P_GROWTH : avail;
        }
    }

    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        if (k.dense) {
            for (size_t i = 0; i < v; i++)
                if (s->work[i] > pmax) pmax = s->work[i];
        } else {
            pmax = s->cand_p[0]; /* sparse sets are sorted at this point */
        }
        float threshold = p->min_p * pmax;
        size_t n = 0;
        if (k.dense) { /* compacts into the sparse arrays, in id order */
            for (size_t i = 0; i < v; i++)
                if (s->work[i] >= threshold) {
                    s->cand_id[n] = (int32_t)i;
                    s->cand_p[n++] = s->work[i];
                }
            k.dense = 0;
            k.sorted = 0;
        } else {
            for (size_t i = 0; i < k.n; i++)
                if (s->cand_p[i] >= threshold) {
                    s->cand_id[n] = s->cand_id[i];
                    s->cand_p[n++] = s->cand_p[i];
                }
        }
        k.n = n; /* >= 1: p_max itself always passes */
    }

    const float *probs = k.dense ? s->work : s->cand_p;
    double total = 0.0;
    for (size_t i = 0; i < k.n; i++) total += probs[i];
    k.total = total;
    return k;
}

/* ---- drawing and inspection --------------------------------------------- */

/* A row the sampler can draw from: no NaN or +inf (the softmax would be NaN,
 * and a draw over NaN picks a token no distribution chose) and at least one
 * finite logit (-inf forbids a token). Q3_ERR_INVALID naming the first bad id. */
static q3_status row_check(const q3_sampler *s, const float *logits)
{
    int finite = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        float x = logits[i];
        if (isnan(x) || x == INFINITY)
            return q3_fail(Q3_ERR_INVALID, "sampler: the logit of token %d is %s: the model produced non-finite values", i,
                           isnan(x) ? "NaN" : "+inf");
        finite |= x != -INFINITY;
    }
    if (!finite) return q3_fail(Q3_ERR_INVALID, "sampler: every logit is -inf: no token is allowed");
    return Q3_OK;
}

int32_t q3_sampler_sample(q3_sampler *s, const float *logits)
{
    if (!s || !logits) return q3_fail(Q3_ERR_INVALID, "q3_sampler_sample: %s is NULL", s ? "logits" : "the sampler"), -1;
    if (row_check(s, logits)) return -1;
    kept_set k = filter(s, logits);
    if (!k.dense && k.n == 1) return s->cand_id[0];

    const float *probs = k.dense ? s->work : s->cand_p;
    double target = rng_uniform(s->rng) * k.total, cum = 0.0;
    size_t last_nonzero = 0;
    for (size_t i = 0; i < k.n; i++) {
        if (probs[i] <= 0.0f) continue;
        last_nonzero = i;
        cum += probs[i];
        if (target < cum) return k.dense ? (int32_t)i : s->cand_id[i];
    }
    /* Rounding left target at or past the sum: the last token with mass. */
    return k.dense ? (int32_t)last_nonzero : s->cand_id[last_nonzero];
}

static int compare_candidates(const void *a, const void *b, void *ctx)
{
    const float *probs = ctx;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    if (ranks_below(probs[ia], ia, probs[ib], ib)) return 1;
    if (ranks_below(probs[ib], ib, probs[ia], ia)) return -1;
    return 0;
}

size_t q3_sampler_candidates(q3_sampler *s, const float *logits,
                             const int32_t **ids, const float **probs)
{
    if (ids) *ids = NULL;
    if (probs) *probs = NULL;
    if (!s || !logits || !ids || !probs) return q3_fail(Q3_ERR_INVALID, "q3_sampler_candidates: an argument is NULL"), 0;
    if (row_check(s, logits)) return 0;
    kept_set k = filter(s, logits);
    size_t n = k.n;
    if (k.dense) {
        for (size_t i = 0; i < n; i++) s->cand_id[i] = (int32_t)i;
    } else if (!k.sorted) {
        /* Scatter the kept probabilities by id into work so the sort can
         * look them up, then sort the ids. */
        for (size_t i = 0; i < n; i++) s->work[s->cand_id[i]] = s->cand_p[i];
    }
    if (k.dense || !k.sorted) {
        qsort_r(s->cand_id, n, sizeof *s->cand_id, compare_candidates, s->work);
        for (size_t i = 0; i < n; i++) s->cand_p[i] = s->work[s->cand_id[i]];
    }
    float inv = (float)(1.0 / k.total);
    for (size_t i = 0; i < n; i++) s->cand_p[i] *= inv;
    *ids = s->cand_id;
    *probs = s->cand_p;
    return n;
}
