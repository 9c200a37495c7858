/* Sampler tests on crafted logits: kept sets of each filter, greedy ties,
 * seeding, penalties, empirical frequencies, invalid configurations. */
#include "test.h"
#include "sample/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ------------------------------------------------------------ */

/* Plain sampling: T 1, no filters, no penalties. Tests switch stages on. */
static q3_sampler_params plain(void)
{
    q3_sampler_params p = {
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
        .repeat_penalty = 1.0f, .presence_penalty = 0.0f, .penalty_last_n = 64, .seed = 1,
    };
    return p;
}

static q3_sampler *make(q3_sampler_params p, int n_vocab)
{
    q3_sampler *s = NULL;
    q3_status st = q3_sampler_new(&p, n_vocab, &s);
    CHECK(st == Q3_OK && s, "q3_sampler_new: %s", q3_last_error());
    return s;
}

/* Logits whose softmax (T 1) is exactly the given distribution. */
static void logits_from_probs(const double *probs, int n, float *out)
{
    for (int i = 0; i < n; i++) out[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

/* Checks that the kept candidate set is exactly `want` (in that order) and,
 * if want_p is given, that the probabilities match to 1e-5. */
static void check_kept(const char *what, q3_sampler_params p, const float *logits, int n_vocab,
                       const int32_t *want, size_t n_want, const double *want_p)
{
    q3_sampler *s = make(p, n_vocab);
    if (!s) return;
    const int32_t *ids;
    const float *probs;
    size_t n = q3_sampler_candidates(s, logits, &ids, &probs);
    CHECK(n == n_want, "%s: kept %zu, expected %zu", what, n, n_want);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += probs[i];
    CHECK(fabs(sum - 1.0) < 1e-5, "%s: kept probabilities sum to %f", what, sum);
    for (size_t i = 0; i < n && i < n_want; i++) {
        CHECK(ids[i] == want[i], "%s: candidate %zu is id %d, expected %d", what, i, ids[i], want[i]);
        if (want_p)
            CHECK(fabs(probs[i] - want_p[i]) < 1e-5, "%s: p[%zu] = %f, expected %f", what, i,
                  (double)probs[i], want_p[i]);
    }
    q3_sampler_free(s);
}

/* ---- configuration ------------------------------------------------------ */

static void test_defaults(void)
{
    q3_sampler_params t = q3_sampler_defaults(1), n = q3_sampler_defaults(0);
    CHECK(t.temperature == 0.6f && t.top_p == 0.95f && t.top_k == 20 && t.min_p == 0.0f,
          "thinking defaults T %g p %g k %d min_p %g", (double)t.temperature, (double)t.top_p,
          t.top_k, (double)t.min_p);
    CHECK(n.temperature == 0.7f && n.top_p == 0.8f && n.top_k == 20 && n.min_p == 0.0f,
          "non-thinking defaults T %g p %g k %d min_p %g", (double)n.temperature, (double)n.top_p,
          n.top_k, (double)n.min_p);
    CHECK(t.repeat_penalty == 1.0f && t.presence_penalty == 0.0f, "defaults have no penalties");
    CHECK(q3_sampler_params_check(&t) == Q3_OK && q3_sampler_params_check(&n) == Q3_OK,
          "defaults are valid");
}

static void expect_invalid(const char *what, q3_sampler_params p, int n_vocab, const char *needle)
{
    q3_sampler *s = (q3_sampler *)1;
    q3_status st = q3_sampler_new(&p, n_vocab, &s);
    CHECK(st == Q3_ERR_INVALID, "%s: status %d", what, st);
    CHECK(s == NULL, "%s: *out not cleared", what);
    CHECK_CONTAINS(q3_last_error(), needle);
}

static void test_invalid(void)
{
    q3_sampler_params p;
    p = plain(); p.top_p = -0.1f; expect_invalid("negative top_p", p, 10, "top_p");
    p = plain(); p.top_p = 1.01f; expect_invalid("top_p > 1", p, 10, "top_p");
    p = plain(); p.top_p = NAN; expect_invalid("NaN top_p", p, 10, "top_p");
    p = plain(); p.min_p = -0.5f; expect_invalid("negative min_p", p, 10, "min_p");
    p = plain(); p.min_p = 1.5f; expect_invalid("min_p > 1", p, 10, "min_p");
    p = plain(); p.top_k = -1; expect_invalid("negative top_k", p, 10, "top_k");
    p = plain(); p.repeat_penalty = 0.0f; expect_invalid("zero repeat penalty", p, 10, "repeat_penalty");
    p = plain(); p.repeat_penalty = -1.0f; expect_invalid("negative repeat penalty", p, 10, "repeat_penalty");
    p = plain(); p.presence_penalty = INFINITY; expect_invalid("infinite presence", p, 10, "presence_penalty");
    p = plain(); p.temperature = NAN; expect_invalid("NaN temperature", p, 10, "temperature");
    p = plain(); p.penalty_last_n = -1; expect_invalid("negative window", p, 10, "penalty_last_n");
    p = plain(); expect_invalid("empty vocabulary", p, 0, "vocabulary");
    /* Edges that are valid. */
    p = plain(); p.top_p = 0.0f; p.min_p = 1.0f; p.temperature = -1.0f; p.top_k = 1000000;
    CHECK(q3_sampler_params_check(&p) == Q3_OK, "edge values are valid: %s", q3_last_error());
}

/* ---- greedy ------------------------------------------------------------- */

static void test_greedy(void)
{
    q3_sampler_params p = plain();
    p.temperature = 0.0f;
    p.top_k = 2; /* filters do not matter to greedy */
    p.top_p = 0.1f;
    float logits[] = {1, 5, 3, 5, 2};
    q3_sampler *s = make(p, 5);
    CHECK(q3_sampler_sample(s, logits) == 1, "greedy picks the lowest id on a tie");
    float later[] = {1, 5, 3, 5.5f, 2};
    CHECK(q3_sampler_sample(s, later) == 3, "greedy picks the argmax");
    float all_neg_inf[] = {-INFINITY, -INFINITY, -INFINITY};
    q3_sampler_free(s);

    p.temperature = -1.0f;
    s = make(p, 3);
    /* every token forbidden: refused, not a silent id 0 (issue 27) */
    CHECK(q3_sampler_sample(s, all_neg_inf) == -1 && strstr(q3_last_error(), "-inf"), "greedy on all -inf is refused: %s",
          q3_last_error());
    q3_sampler_free(s);

    /* A temperature whose inverse overflows is greedy too (no NaN). */
    p = plain();
    p.temperature = 1e-40f;
    s = make(p, 5);
    for (int i = 0; i < 20; i++) CHECK(q3_sampler_sample(s, later) == 3, "tiny temperature is greedy");
    q3_sampler_free(s);
    p.temperature = 1e-30f;
    s = make(p, 5);
    for (int i = 0; i < 20; i++) CHECK(q3_sampler_sample(s, later) == 3, "T 1e-30 is near-greedy");
    q3_sampler_free(s);

    /* A full Qwen vocabulary against a brute-force argmax. */
    int v = 151936;
    float *big = malloc((size_t)v * sizeof *big);
    srand(7);
    for (int i = 0; i < v; i++) big[i] = (float)rand() / RAND_MAX * 20.0f - 10.0f;
    big[123456] = 11.0f;
    big[99] = 11.0f;
    p.temperature = 0.0f;
    s = make(p, v);
    CHECK(q3_sampler_sample(s, big) == 99, "greedy over 151936 logits");
    q3_sampler_free(s);
    free(big);
}

/* ---- filters: exact kept sets ------------------------------------------- */

static void test_top_k(void)
{
    float logits[] = {1, 4, 2, 4, 3, 0};
    q3_sampler_params p = plain();

    p.top_k = 3;
    {
        /* 4 and 4 tie: lower id first. */
        double e1 = exp(4.0), e3 = exp(3.0), z = 2 * e1 + e3;
        int32_t want[] = {1, 3, 4};
        double want_p[] = {e1 / z, e1 / z, e3 / z};
        check_kept("top_k 3", p, logits, 6, want, 3, want_p);
    }
    p.top_k = 1;
    {
        int32_t want[] = {1};
        double want_p[] = {1.0};
        check_kept("top_k 1 with a tie at the top", p, logits, 6, want, 1, want_p);
    }
    {
        float tie[] = {3, 5, 3, 3};
        int32_t want[] = {1, 0};
        p.top_k = 2;
        check_kept("top_k 2 with a tie at the boundary", p, tie, 4, want, 2, NULL);
    }
    int32_t all[] = {1, 3, 4, 2, 0, 5};
    p.top_k = 100;
    check_kept("top_k larger than the vocabulary", p, logits, 6, all, 6, NULL);
    p.top_k = 6;
    check_kept("top_k equal to the vocabulary", p, logits, 6, all, 6, NULL);
    p.top_k = 0;
    check_kept("top_k off", p, logits, 6, all, 6, NULL);

    /* Temperature reshapes the kept probabilities: softmax(logit / T). */
    p.top_k = 2;
    p.temperature = 0.5f;
    {
        float l[] = {0, 1, 2};
        double a = exp(2.0 / 0.5), b = exp(1.0 / 0.5);
        int32_t want[] = {2, 1};
        double want_p[] = {a / (a + b), b / (a + b)};
        check_kept("top_k 2 at T 0.5", p, l, 3, want, 2, want_p);
    }
}

static void test_top_p(void)
{
    /* Distribution by id: 0.05 0.5 0.1 0.2 0.15 */
    double probs[] = {0.05, 0.5, 0.1, 0.2, 0.15};
    float logits[5];
    logits_from_probs(probs, 5, logits);
    q3_sampler_params p = plain();

    p.top_p = 0.6f; /* 0.5 + 0.2 = 0.7 >= 0.6 */
    {
        int32_t want[] = {1, 3};
        double want_p[] = {0.5 / 0.7, 0.2 / 0.7};
        check_kept("top_p 0.6", p, logits, 5, want, 2, want_p);
    }
    p.top_p = 0.45f;
    {
        int32_t want[] = {1};
        check_kept("top_p below the first token's mass", p, logits, 5, want, 1, NULL);
    }
    p.top_p = 0.0f;
    {
        int32_t want[] = {1};
        check_kept("top_p 0 keeps one token", p, logits, 5, want, 1, NULL);
    }
    p.top_p = 0.86f; /* 0.85 after three, 0.95 after four */
    {
        int32_t want[] = {1, 3, 4, 2};
        double want_p[] = {0.5 / 0.95, 0.2 / 0.95, 0.15 / 0.95, 0.1 / 0.95};
        check_kept("top_p 0.86", p, logits, 5, want, 4, want_p);
    }
    p.top_p = 1.0f;
    {
        int32_t want[] = {1, 3, 4, 2, 0};
        check_kept("top_p 1 keeps everything", p, logits, 5, want, 5, NULL);
    }
    {
        /* Equal probabilities at the cut: the lower id comes first. */
        double tp[] = {0.3, 0.4, 0.3};
        float tl[3];
        logits_from_probs(tp, 3, tl);
        p.top_p = 0.5f;
        int32_t want[] = {1, 0};
        check_kept("top_p with a tie at the cut", p, tl, 3, want, 2, NULL);
    }
    /* With top-k first: top-p sees the renormalized top-k set. */
    p.top_k = 3;  /* keeps 0.5 0.2 0.15 -> 0.588 0.235 0.176 */
    p.top_p = 0.8f; /* 0.588 + 0.235 = 0.823 */
    {
        int32_t want[] = {1, 3};
        check_kept("top_k 3 then top_p 0.8", p, logits, 5, want, 2, NULL);
    }
}

static int cmp_desc(const void *a, const void *b, void *ctx)
{
    const float *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (v[x] != v[y]) return v[x] > v[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Top-p without top-k over a whole vocabulary, where the selection has to
 * grow several times, against a brute-force full sort. */
static void test_top_p_dense(void)
{
    int v = 151936;
    float *logits = malloc((size_t)v * sizeof *logits);
    int32_t *order = malloc((size_t)v * sizeof *order);
    srand(11);
    for (int i = 0; i < v; i++) logits[i] = (float)rand() / RAND_MAX * 2.0f; /* flat-ish */
    float pvals[] = {0.3f, 0.9f, 0.999f};
    for (size_t t = 0; t < N_ELEMS(pvals); t++) {
        /* Reference: the same float softmax, then a full sort. */
        float max = logits[0];
        for (int i = 1; i < v; i++) if (logits[i] > max) max = logits[i];
        double z = 0;
        float *fp = malloc((size_t)v * sizeof *fp);
        for (int i = 0; i < v; i++) { fp[i] = expf(logits[i] - max); z += fp[i]; }
        float inv = (float)(1.0 / z);
        for (int i = 0; i < v; i++) fp[i] *= inv;
        for (int i = 0; i < v; i++) order[i] = i;
        qsort_r(order, (size_t)v, sizeof *order, cmp_desc, fp);
        double cum = 0;
        size_t cut = 0;
        while (cut < (size_t)v && cum < pvals[t]) cum += fp[order[cut++]];
        free(fp);

        q3_sampler_params p = plain();
        p.top_p = pvals[t];
        q3_sampler *s = make(p, v);
        const int32_t *ids;
        const float *probs;
        size_t n = q3_sampler_candidates(s, logits, &ids, &probs);
        CHECK(n == cut, "dense top_p %g: kept %zu, brute force %zu", (double)pvals[t], n, cut);
        int same = n == cut;
        for (size_t i = 0; same && i < n; i++) same = ids[i] == order[i];
        CHECK(same, "dense top_p %g: kept ids differ from brute force", (double)pvals[t]);
        q3_sampler_free(s);
    }
    free(logits);
    free(order);
}

static void test_min_p(void)
{
    double probs[] = {0.05, 0.5, 0.1, 0.2, 0.15};
    float logits[5];
    logits_from_probs(probs, 5, logits);
    q3_sampler_params p = plain();

    p.min_p = 0.25f; /* threshold 0.125 */
    {
        int32_t want[] = {1, 3, 4};
        double want_p[] = {0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85};
        check_kept("min_p 0.25 (dense)", p, logits, 5, want, 3, want_p);
        p.top_k = 4;
        check_kept("min_p 0.25 after top_k 4", p, logits, 5, want, 3, want_p);
        p.top_k = 0;
    }
    p.min_p = 1.0f;
    {
        int32_t want[] = {1};
        check_kept("min_p 1 keeps the maximum", p, logits, 5, want, 1, NULL);
        double tp[] = {0.4, 0.2, 0.4};
        float tl[3];
        logits_from_probs(tp, 3, tl);
        int32_t want2[] = {0, 2};
        double want2_p[] = {0.5, 0.5};
        check_kept("min_p 1 keeps every tied maximum", p, tl, 3, want2, 2, want2_p);
    }
    p.min_p = 0.0f;
    {
        int32_t want[] = {1, 3, 4, 2, 0};
        check_kept("min_p 0 is off", p, logits, 5, want, 5, NULL);
    }
    /* top-p then min-p: top_p 0.9 keeps 4 (0.95), min_p 0.28 -> >= 0.14 */
    p.top_p = 0.9f;
    p.min_p = 0.28f;
    {
        int32_t want[] = {1, 3, 4};
        check_kept("top_p 0.9 then min_p 0.28", p, logits, 5, want, 3, NULL);
    }
}

/* ---- seeding ------------------------------------------------------------ */

static void draw_sequence(uint64_t seed, int n, int32_t *out, int with_inspection)
{
    q3_sampler_params p = plain();
    p.seed = seed;
    float logits[50];
    for (int i = 0; i < 50; i++) logits[i] = (float)(i % 7) * 0.3f;
    q3_sampler *s = make(p, 50);
    for (int i = 0; i < n; i++) {
        if (with_inspection) {
            const int32_t *ids;
            const float *probs;
            q3_sampler_candidates(s, logits, &ids, &probs);
        }
        out[i] = q3_sampler_sample(s, logits);
    }
    q3_sampler_free(s);
}

static void test_seed(void)
{
    int32_t a[200], b[200], c[200], d[200];
    draw_sequence(42, 200, a, 0);
    draw_sequence(42, 200, b, 0);
    draw_sequence(43, 200, c, 0);
    draw_sequence(42, 200, d, 1);
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed reproduces the sequence");
    CHECK(memcmp(a, c, sizeof a) != 0, "a different seed gives a different sequence");
    CHECK(memcmp(a, d, sizeof a) == 0, "q3_sampler_candidates does not advance the PRNG");

    /* reset restarts the PRNG. */
    q3_sampler_params p = plain();
    p.seed = 42;
    float logits[50];
    for (int i = 0; i < 50; i++) logits[i] = (float)(i % 7) * 0.3f;
    q3_sampler *s = make(p, 50);
    for (int i = 0; i < 10; i++) q3_sampler_sample(s, logits);
    q3_sampler_reset(s);
    int same = 1;
    for (int i = 0; i < 200; i++) same &= q3_sampler_sample(s, logits) == a[i];
    CHECK(same, "reset restarts the sequence");
    q3_sampler_free(s);
}

/* ---- penalties ---------------------------------------------------------- */

static void test_penalties(void)
{
    const float base[] = {2.0f, -2.0f, 1.0f, 0.5f, -1.0f, 3.0f, 0.0f};
    float l[7];
    q3_sampler_params p = plain();

    /* Repetition: positive divided, negative multiplied, each id once. */
    p.repeat_penalty = 2.0f;
    q3_sampler *s = make(p, 7);
    q3_sampler_accept(s, 0);
    q3_sampler_accept(s, 1);
    q3_sampler_accept(s, 1); /* seen twice: still penalized once */
    q3_sampler_accept(s, 4);
    q3_sampler_accept(s, 6);
    q3_sampler_accept(s, -3);  /* out of range: ignored */
    q3_sampler_accept(s, 700);
    memcpy(l, base, sizeof l);
    q3_sampler_apply_penalties(s, l);
    const float want_rep[] = {1.0f, -4.0f, 1.0f, 0.5f, -2.0f, 3.0f, 0.0f};
    for (int i = 0; i < 7; i++)
        CHECK(l[i] == want_rep[i], "repeat penalty: logit %d is %g, expected %g", i, (double)l[i],
              (double)want_rep[i]);
    /* The penalty steers greedy away: 2.0 -> 1.0 loses to an unseen 1.5. */
    float g[] = {2.0f, 1.5f};
    q3_sampler_params gp = p;
    gp.temperature = 0.0f;
    q3_sampler *gs = make(gp, 2);
    CHECK(q3_sampler_sample(gs, g) == 0, "greedy before the penalty");
    q3_sampler_accept(gs, 0);
    CHECK(q3_sampler_sample(gs, g) == 1, "greedy after the penalty");
    CHECK(g[0] == 2.0f, "sample does not modify the caller's logits");
    q3_sampler_free(gs);
    q3_sampler_free(s);

    /* Presence: a constant off every seen id, both signs. */
    p = plain();
    p.presence_penalty = 0.5f;
    s = make(p, 7);
    q3_sampler_accept(s, 1);
    q3_sampler_accept(s, 5);
    q3_sampler_accept(s, 5);
    memcpy(l, base, sizeof l);
    q3_sampler_apply_penalties(s, l);
    const float want_pres[] = {2.0f, -2.5f, 1.0f, 0.5f, -1.0f, 2.5f, 0.0f};
    for (int i = 0; i < 7; i++)
        CHECK(l[i] == want_pres[i], "presence penalty: logit %d is %g, expected %g", i,
              (double)l[i], (double)want_pres[i]);
    q3_sampler_free(s);

    /* Both, over a window of 2: only the last two accepted ids count. */
    p = plain();
    p.repeat_penalty = 1.25f;
    p.presence_penalty = 0.25f;
    p.penalty_last_n = 2;
    s = make(p, 7);
    q3_sampler_accept(s, 0);
    q3_sampler_accept(s, 2);
    q3_sampler_accept(s, 4);
    memcpy(l, base, sizeof l);
    q3_sampler_apply_penalties(s, l);
    const float want_both[] = {2.0f, -2.0f, 1.0f / 1.25f - 0.25f, 0.5f, -1.0f * 1.25f - 0.25f,
                               3.0f, 0.0f};
    for (int i = 0; i < 7; i++)
        CHECK(l[i] == want_both[i], "window of 2: logit %d is %g, expected %g", i, (double)l[i],
              (double)want_both[i]);
    q3_sampler_reset(s);
    memcpy(l, base, sizeof l);
    q3_sampler_apply_penalties(s, l);
    CHECK(memcmp(l, base, sizeof l) == 0, "reset forgets the history");
    q3_sampler_free(s);

    /* A window of 0 disables the penalties. */
    p.penalty_last_n = 0;
    s = make(p, 7);
    q3_sampler_accept(s, 0);
    memcpy(l, base, sizeof l);
    q3_sampler_apply_penalties(s, l);
    CHECK(memcmp(l, base, sizeof l) == 0, "penalty_last_n 0 penalizes nothing");
    q3_sampler_free(s);
}

/* ---- empirical frequencies ---------------------------------------------- */

static void check_frequencies(const char *what, q3_sampler_params p, const float *logits, int v)
{
    enum { DRAWS = 20000 };
    q3_sampler *s = make(p, v);
    if (!s) return;
    const int32_t *ids;
    const float *probs;
    size_t n = q3_sampler_candidates(s, logits, &ids, &probs);
    double *want = calloc((size_t)v, sizeof *want);
    int *count = calloc((size_t)v, sizeof *count);
    for (size_t i = 0; i < n; i++) want[ids[i]] = probs[i];
    for (int i = 0; i < DRAWS; i++) {
        int32_t id = q3_sampler_sample(s, logits);
        if (id >= 0 && id < v) count[id]++;
    }
    int outside = 0, bad = 0;
    for (int i = 0; i < v; i++) {
        double f = (double)count[i] / DRAWS, q = want[i];
        if (q == 0.0) {
            outside += count[i];
            continue;
        }
        double tol = 4.5 * sqrt(q * (1 - q) / DRAWS) + 1e-3;
        if (fabs(f - q) > tol) {
            bad++;
            fprintf(stderr, "  %s: id %d drawn %.4f, expected %.4f (tol %.4f)\n", what, i, f, q, tol);
        }
    }
    CHECK(outside == 0, "%s: %d draws outside the kept set", what, outside);
    CHECK(bad == 0, "%s: %d ids off their probability", what, bad);
    free(want);
    free(count);
    q3_sampler_free(s);
}

static void test_frequencies(void)
{
    float logits[12];
    for (int i = 0; i < 12; i++) logits[i] = (float)((i * 7) % 12) * 0.25f;
    q3_sampler_params p = plain();
    check_frequencies("no filters", p, logits, 12);
    p.top_k = 8;
    p.top_p = 0.9f;
    p.min_p = 0.2f;
    p.temperature = 0.8f;
    p.seed = 99;
    check_frequencies("top_k 8, top_p 0.9, min_p 0.2, T 0.8", p, logits, 12);
    p = q3_sampler_defaults(1);
    check_frequencies("thinking defaults", p, logits, 12);
    p.top_k = 0;
    p.min_p = 0.3f;
    check_frequencies("dense min_p", p, logits, 12);
}

/* ---- the full vocabulary ------------------------------------------------ */

/* Qwen3's 151936 logits with the thinking defaults and a penalty: every draw
 * is an id the filters kept (top-k 20: one of the 20 largest logits, after the
 * penalty). Sampling speed is measured in benchmarks, not here. */
static void test_full_vocab(void)
{
    int v = 151936;
    float *logits = malloc((size_t)v * sizeof *logits);
    float *sorted = malloc((size_t)v * sizeof *sorted);
    srand(3);
    for (int i = 0; i < v; i++) logits[i] = (float)rand() / RAND_MAX * 10.0f;
    q3_sampler_params p = q3_sampler_defaults(1);
    p.repeat_penalty = 1.1f;
    q3_sampler *s = make(p, v);
    for (int i = 0; i < 64; i++) q3_sampler_accept(s, i * 100);
    /* the 20th largest logit after the penalty (positive logits are divided by it) */
    for (int i = 0; i < v; i++) sorted[i] = (i % 100 == 0 && i < 6400) ? logits[i] / 1.1f : logits[i];
    float kth = -INFINITY;
    for (int k = 0; k < 20; k++) { /* 20 passes of a max below the previous one */
        float best = -INFINITY;
        for (int i = 0; i < v; i++)
            if (sorted[i] > best && (k == 0 || sorted[i] < kth)) best = sorted[i];
        kth = best;
    }
    int bad = 0;
    for (int i = 0; i < 200; i++) {
        int id = q3_sampler_sample(s, logits);
        if (id < 0 || id >= v || sorted[id] < kth) bad++;
    }
    CHECK(bad == 0, "%d of 200 draws outside the top 20", bad);
    q3_sampler_free(s);
    free(sorted);
    free(logits);
}

int main(void)
{
    test_defaults();
    test_invalid();
    test_greedy();
    test_top_k();
    test_top_p();
    test_top_p_dense();
    test_min_p();
    test_seed();
    test_penalties();
    test_frequencies();
    test_full_vocab();
    TEST_DONE();
}
