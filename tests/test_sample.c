/* test_sample.c - sampler filters, determinism, distribution, stop strings.
 * Expected candidate sets are computed here from the definitions in
 * sample.h / sample.c, independently of the implementation. */
#include "sample/sample.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static mx_sample_params params(float t, int k, float p, float minp)
{
    mx_sample_params sp;
    mx_sample_defaults(&sp);
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = minp;
    sp.seed = 1234;
    return sp;
}

/* Candidates for a copy of logits (the call modifies its input). */
static size_t cands(const mx_sample_params *sp, const float *logits, int n,
                    const int32_t *hist, size_t nh, int32_t *ids)
{
    float buf[64];
    memcpy(buf, logits, sizeof(float) * (size_t)n);
    mx_sampler *s = mx_sampler_new(sp, n);
    size_t k = mx_sampler_candidates(s, buf, hist, nh, ids);
    mx_sampler_free(s);
    return k;
}

static int same_set(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    if (na != nb)
        return 0;
    for (size_t i = 0; i < na; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

static void test_defaults(void)
{
    mx_sample_params p;
    mx_sample_defaults(&p);
    CHECK(fabsf(p.temperature - 0.8f) < 1e-6f);
    CHECK(p.top_k == 40);
    CHECK(fabsf(p.top_p - 0.95f) < 1e-6f);
    CHECK(fabsf(p.min_p - 0.05f) < 1e-6f);
    CHECK(p.repeat_penalty == 1.0f);
    CHECK(p.repeat_last_n == 64);
}

static void test_argmax_greedy(void)
{
    float l[6] = {1, 5, 3, 5, -2, 0};
    CHECK(mx_argmax(l, 6) == 1);   /* tie: lowest id */
    mx_sample_params sp = params(0.0f, 40, 0.95f, 0.05f);
    mx_sampler *s = mx_sampler_new(&sp, 6);
    float b[6];
    memcpy(b, l, sizeof b);
    CHECK(mx_sampler_sample(s, b, NULL, 0) == 1);
    mx_sampler_free(s);

    /* top_k = 1 with any temperature equals greedy */
    unsigned long long r = 7;
    sp = params(1.5f, 1, 1.0f, 0.0f);
    s = mx_sampler_new(&sp, 64);
    int ok = 1;
    for (int it = 0; it < 200; it++) {
        float x[64], y[64];
        for (int i = 0; i < 64; i++)
            x[i] = y[i] = test_randf(&r) * 5;
        if (mx_sampler_sample(s, x, NULL, 0) != mx_argmax(y, 64))
            ok = 0;
    }
    CHECK(ok);
    mx_sampler_free(s);
}

/* mx_argmax against its definition (the first index of a strictly larger
 * value, scanning up) on arrays full of ties, NaNs, infinities and signed
 * zeros, of every length around the blocks it scans. */
static int32_t argmax_def(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void test_argmax_edges(void)
{
    enum { N = 1600 };
    static float x[N];
    unsigned long long r = 11;
    int bad = 0;
    for (int it = 0; it < 6000; it++) {
        const int32_t n = 1 + it % N;
        for (int32_t i = 0; i < n; i++) {
            const int v = (int)((test_randf(&r) + 1.0f) * 4.0f);   /* 0 .. 7 */
            const float w = (float)(int)((test_randf(&r) + 1.0f) * 2.5f);   /* 0 .. 4: ties */
            x[i] = v == 0 ? NAN : v == 1 ? -INFINITY : v == 2 ? -0.0f : v == 3 ? 0.0f
                 : v == 4 && it % 7 == 0 ? INFINITY : w;
        }
        if (it % 5 == 0)   /* all one value, or a NaN first */
            for (int32_t i = 0; i < n; i++)
                x[i] = it % 10 == 0 ? -INFINITY : x[0];
        if (mx_argmax(x, n) != argmax_def(x, n))
            bad++;
    }
    CHECK(bad == 0);
    CHECK(mx_argmax(x, 0) == 0);
}

static void test_determinism(void)
{
    mx_sample_params sp = params(1.0f, 0, 1.0f, 0.0f);
    int32_t a[100], b[100], c[100];
    uint64_t seeds[3] = {42, 42, 43};
    int32_t *outs[3] = {a, b, c};
    for (int k = 0; k < 3; k++) {
        sp.seed = seeds[k];
        mx_sampler *s = mx_sampler_new(&sp, 32);
        for (int i = 0; i < 100; i++) {
            float l[32];
            for (int j = 0; j < 32; j++)
                l[j] = 0.1f * (float)(j % 7);
            outs[k][i] = mx_sampler_sample(s, l, NULL, 0);
        }
        mx_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
}

/* Reference filter from the definitions, on a small vocabulary. */
static size_t expected_set(const float *logits, int n, float t, int k, float top_p,
                           float min_p, int32_t *ids)
{
    int order[64];
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 0; i < n; i++)   /* selection sort: logit desc, id asc */
        for (int j = i + 1; j < n; j++) {
            int a = order[i], b = order[j];
            if (logits[b] > logits[a] || (logits[b] == logits[a] && b < a)) {
                order[i] = b;
                order[j] = a;
            }
        }
    int m = (k > 0 && k < n) ? k : n;
    double p[64], sum = 0;
    for (int i = 0; i < m; i++)
        sum += (p[i] = exp((double)(logits[order[i]] - logits[order[0]]) / t));
    for (int i = 0; i < m; i++)
        p[i] /= sum;
    if (top_p < 1) {
        double cum = 0;
        for (int i = 0; i < m; i++) {
            cum += p[i];
            if (cum >= top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (min_p > 0) {
        int keep = 0;
        for (int i = 0; i < m; i++)
            if (p[i] >= min_p * p[0])
                keep = i + 1;
        m = keep;
    }
    for (int i = 0; i < m; i++)
        ids[i] = order[i];
    for (int i = 0; i < m; i++)   /* sort by id */
        for (int j = i + 1; j < m; j++)
            if (ids[j] < ids[i]) {
                int32_t x = ids[i];
                ids[i] = ids[j];
                ids[j] = x;
            }
    return (size_t)m;
}

static void test_filters_by_hand(void)
{
    /* probabilities at T=1 proportional to exp(logit) */
    float l[8] = {2.0f, 1.0f, 0.0f, 3.0f, -1.0f, 1.0f, -5.0f, 0.5f};
    int32_t got[8], want[8];
    size_t ng, nw;

    /* top-k = 3 keeps ids 3, 0 and the lower id of the tie at 1.0 (1) */
    mx_sample_params sp = params(1.0f, 3, 1.0f, 0.0f);
    ng = cands(&sp, l, 8, NULL, 0, got);
    int32_t k3[3] = {0, 1, 3};
    CHECK(same_set(got, ng, k3, 3));

    /* top-p: softmax over all; mass of id 3 alone = e^3/Z */
    double Z = 0;
    for (int i = 0; i < 8; i++)
        Z += exp(l[i]);
    double p3 = exp(3) / Z, p0 = exp(2) / Z;
    sp = params(1.0f, 0, (float)(p3 - 0.01), 0.0f);   /* just below p3: only id 3 */
    ng = cands(&sp, l, 8, NULL, 0, got);
    CHECK(ng == 1 && got[0] == 3);
    sp = params(1.0f, 0, (float)(p3 + 0.01), 0.0f);   /* needs id 0 too */
    ng = cands(&sp, l, 8, NULL, 0, got);
    int32_t p2[2] = {0, 3};
    CHECK(same_set(got, ng, p2, 2));
    sp = params(1.0f, 0, (float)(p3 + p0 + 0.001), 0.0f);   /* + the 1.0 tie: id 1 first */
    ng = cands(&sp, l, 8, NULL, 0, got);
    int32_t p3s[3] = {0, 1, 3};
    CHECK(same_set(got, ng, p3s, 3));

    /* min-p relative to the max: e^(l-3) >= 0.3 -> l >= 3 + ln 0.3 = 1.796 */
    sp = params(1.0f, 0, 1.0f, 0.3f);
    ng = cands(&sp, l, 8, NULL, 0, got);
    CHECK(same_set(got, ng, p2, 2));
    sp = params(1.0f, 0, 1.0f, 0.1f);   /* l >= 3 + ln 0.1 = 0.697: ids 0,1,3,5 */
    ng = cands(&sp, l, 8, NULL, 0, got);
    int32_t m4[4] = {0, 1, 3, 5};
    CHECK(same_set(got, ng, m4, 4));

    /* temperature sharpens: T=0.5 squares the ratios: e^(2(l-3)) >= 0.1 -> l >= 1.849 */
    sp = params(0.5f, 0, 1.0f, 0.1f);
    ng = cands(&sp, l, 8, NULL, 0, got);
    CHECK(same_set(got, ng, p2, 2));

    /* all filters off: every id */
    sp = params(1.0f, 0, 1.0f, 0.0f);
    ng = cands(&sp, l, 8, NULL, 0, got);
    CHECK(ng == 8);

    /* random logits against the reference over many parameter sets */
    unsigned long long r = 99;
    int ok = 1;
    for (int it = 0; it < 500; it++) {
        float x[40];
        for (int i = 0; i < 40; i++)
            x[i] = test_randf(&r) * 4;
        float t = 0.3f + 1.5f * (float)((test_rand_u64(&r) % 100) / 100.0);
        int k = (int)(test_rand_u64(&r) % 45);
        float tp = 0.5f + 0.5f * (float)((test_rand_u64(&r) % 101) / 100.0);
        float mp = 0.2f * (float)((test_rand_u64(&r) % 101) / 100.0);
        sp = params(t, k, tp, mp);
        int32_t g[64], w[64];
        size_t a = cands(&sp, x, 40, NULL, 0, g);
        size_t b = expected_set(x, 40, t, k, tp, mp, w);
        if (!same_set(g, a, w, b)) {
            ok = 0;
            fprintf(stderr, "  mismatch: t=%g k=%d top_p=%g min_p=%g: %zu vs %zu\n",
                    t, k, tp, mp, a, b);
        }
    }
    CHECK(ok);
    (void)want;
    (void)nw;
}

static void test_penalty(void)
{
    float l[5] = {2.0f, -1.0f, 1.9f, 0.5f, 1.0f};
    mx_sample_params sp = params(0.0f, 0, 1.0f, 0.0f);
    sp.repeat_penalty = 1.5f;
    mx_sampler *s = mx_sampler_new(&sp, 5);
    float b[5];
    memcpy(b, l, sizeof b);
    int32_t hist[4] = {0, 1, 0, 0};   /* repeated ids count once */
    CHECK(mx_sampler_sample(s, b, hist, 4) == 2);   /* 2.0/1.5 < 1.9 */
    CHECK(fabsf(b[0] - 2.0f / 1.5f) < 1e-6f);
    CHECK(fabsf(b[1] - (-1.5f)) < 1e-6f);           /* negative: multiplied */
    CHECK(b[2] == 1.9f && b[3] == 0.5f);
    /* the window: only the last repeat_last_n ids count */
    memcpy(b, l, sizeof b);
    mx_sampler_free(s);
    sp.repeat_last_n = 1;
    s = mx_sampler_new(&sp, 5);
    int32_t hist2[2] = {0, 3};
    CHECK(mx_sampler_sample(s, b, hist2, 2) == 0);
    CHECK(b[0] == 2.0f && fabsf(b[3] - 0.5f / 1.5f) < 1e-6f);
    mx_sampler_free(s);
    /* out-of-range ids in the history are ignored */
    s = mx_sampler_new(&sp, 5);
    memcpy(b, l, sizeof b);
    int32_t bad[2] = {-4, 99};
    CHECK(mx_sampler_sample(s, b, bad, 2) == 0);
    mx_sampler_free(s);
}

static void test_distribution(void)
{
    float l[6] = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 1.5f};
    const float T = 0.7f;
    mx_sample_params sp = params(T, 0, 1.0f, 0.0f);
    sp.seed = 2024;
    mx_sampler *s = mx_sampler_new(&sp, 6);
    int count[6] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        float b[6];
        memcpy(b, l, sizeof b);
        int32_t id = mx_sampler_sample(s, b, NULL, 0);
        if (id >= 0 && id < 6)
            count[id]++;
    }
    mx_sampler_free(s);
    double Z = 0, p[6];
    for (int i = 0; i < 6; i++)
        Z += (p[i] = exp(l[i] / T));
    int ok = 1;
    for (int i = 0; i < 6; i++) {
        double f = (double)count[i] / N, pi = p[i] / Z;
        double sd = sqrt(pi * (1 - pi) / N);
        if (fabs(f - pi) > 5 * sd + 1e-3) {
            ok = 0;
            fprintf(stderr, "  id %d: freq %.4f vs p %.4f\n", i, f, pi);
        }
    }
    CHECK(ok);
}

static void test_large_vocab(void)
{
    /* the pre-filtered path (no top-k) must agree with greedy at top_p tiny */
    enum { V = 5000 };
    static float x[V], y[V];
    unsigned long long r = 5;
    for (int i = 0; i < V; i++)
        x[i] = y[i] = test_randf(&r) * 10;
    mx_sample_params sp = params(1.0f, 0, 0.0001f, 0.0f);
    mx_sampler *s = mx_sampler_new(&sp, V);
    CHECK(mx_sampler_sample(s, x, NULL, 0) == mx_argmax(y, V));
    mx_sampler_free(s);
    /* top_p = 0.9 over a flat-ish distribution: the set equals the reference
     * computed by brute force on the sorted list */
    for (int i = 0; i < V; i++)
        x[i] = y[i] = test_randf(&r) * 0.5f;
    sp = params(1.0f, 0, 0.9f, 0.0f);
    s = mx_sampler_new(&sp, V);
    static int32_t ids[V];
    size_t n = mx_sampler_candidates(s, x, NULL, 0, ids);
    mx_sampler_free(s);
    /* brute force: count tokens above the cut implied by the returned set */
    double Z = 0;
    for (int i = 0; i < V; i++)
        Z += exp(y[i]);
    float minkept = INFINITY;
    double mass = 0;
    for (size_t i = 0; i < n; i++) {
        mass += exp(y[ids[i]]) / Z;
        if (y[ids[i]] < minkept)
            minkept = y[ids[i]];
    }
    CHECK(mass >= 0.9 - 1e-6);
    CHECK(mass - exp(minkept) / Z < 0.9 + 1e-6);   /* minimal prefix */
}

/* top-k over a large vocabulary (the heap fed block by block) against a
 * brute-force ranking: logit descending, the lower id first on ties. */
static int rank_cmp(const void *a, const void *b)
{
    const float *x = a, *y = b;   /* {logit, id} pairs */
    if (x[0] != y[0])
        return x[0] > y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static int id_order(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_topk_large(void)
{
    enum { V = 20000, K = 40 };
    static float x[V], pairs[V][2];
    static int32_t ids[V], want[K];
    unsigned long long r = 17;
    int bad = 0;
    for (int it = 0; it < 12; it++) {
        for (int i = 0; i < V; i++) {
            /* coarse values (many ties); rising, falling or flat runs */
            float v = (float)(int)((test_randf(&r) + 1.0f) * (it % 3 == 0 ? 3.0f : 200.0f));
            v += it % 3 == 1 ? (float)i * 0.01f : it % 3 == 2 ? -(float)i * 0.01f : 0.0f;
            x[i] = pairs[i][0] = v * 0.05f;
            pairs[i][1] = (float)i;
        }
        qsort(pairs, V, sizeof pairs[0], rank_cmp);
        for (int i = 0; i < K; i++)
            want[i] = (int32_t)pairs[i][1];
        qsort(want, K, sizeof want[0], id_order);
        mx_sample_params sp = params(1.0f, K, 1.0f, 0.0f);
        mx_sampler *s = mx_sampler_new(&sp, V);
        const size_t n = mx_sampler_candidates(s, x, NULL, 0, ids);
        mx_sampler_free(s);
        if (n != K || memcmp(ids, want, sizeof want) != 0)
            bad++;
    }
    CHECK(bad == 0);
}

/* NaN logits are never candidates: the candidates of logits with NaNs
 * (inside the eight-value groups the temperature pass works on, and in
 * the tail after them) equal those of the same logits with -inf there,
 * under top-k, top-p and min-p alike. */
static void test_nan_logits(void)
{
    enum { V = 1003 };
    static float x[V], y[V];
    static int32_t a[V], b[V];
    unsigned long long r = 23;
    const float tk[3][3] = {{1.0f, 1.0f, 0.0f}, {0.9f, 0.7f, 0.0f}, {1.3f, 1.0f, 0.05f}};   /* temp, top_p, min_p */
    int bad = 0;
    for (int it = 0; it < 6; it++) {
        for (int i = 0; i < V; i++) {
            const float v = test_randf(&r) * 4.0f;
            const int nan = (i % 7 == it % 7) || i == V - 1 || i == V - 2;   /* the tail: 1003 = 125 * 8 + 3 */
            x[i] = nan ? NAN : v;
            y[i] = nan ? -INFINITY : v;
        }
        const float *p3 = tk[it % 3];
        mx_sample_params sp = params(p3[0], it < 3 ? 50 : 0, p3[1], p3[2]);
        mx_sampler *s1 = mx_sampler_new(&sp, V), *s2 = mx_sampler_new(&sp, V);
        const size_t n1 = mx_sampler_candidates(s1, x, NULL, 0, a), n2 = mx_sampler_candidates(s2, y, NULL, 0, b);
        if (n1 != n2 || n1 == 0 || memcmp(a, b, n1 * sizeof a[0]) != 0)
            bad++;
        for (size_t i = 0; i < n1; i++)
            if (a[i] % 7 == it % 7 || a[i] >= V - 2)
                bad++;
        mx_sampler_free(s1);
        mx_sampler_free(s2);
    }
    CHECK(bad == 0);
}

/* ---- stop strings ---- */

typedef struct {
    char buf[512];
    size_t n;
} acc;

static int feed(mx_stopper *s, acc *a, const char *t)
{
    char *o;
    size_t n;
    int r = mx_stopper_feed(s, t, strlen(t), &o, &n);
    memcpy(a->buf + a->n, o, n);
    a->n += n;
    a->buf[a->n] = 0;
    free(o);
    return r;
}

static void flush(mx_stopper *s, acc *a)
{
    char *o;
    size_t n;
    mx_stopper_flush(s, &o, &n);
    memcpy(a->buf + a->n, o, n);
    a->n += n;
    a->buf[a->n] = 0;
    free(o);
}

static void test_stopper(void)
{
    const char *st1[] = {"<|im_end|>"};
    mx_stopper *s = mx_stopper_new(st1, 1);
    acc a = {{0}, 0};
    CHECK(feed(s, &a, "<|im_end|>rest") == 1);
    CHECK(a.n == 0);
    mx_stopper_free(s);

    s = mx_stopper_new(st1, 1);
    a.n = 0;
    CHECK(feed(s, &a, "Hello <|im") == 0);
    CHECK(strcmp(a.buf, "Hello ") == 0);   /* the partial stop is held */
    CHECK(feed(s, &a, "_end|> more") == 1);
    CHECK(strcmp(a.buf, "Hello ") == 0);
    mx_stopper_free(s);

    /* char by char, never emitting a prefix before it is disproved */
    s = mx_stopper_new(st1, 1);
    a.n = 0;
    const char *txt = "ab<|im_x<|im_end|>zz";
    int stopped = 0, leak = 0;
    for (const char *p = txt; *p && !stopped; p++) {
        char c[2] = {*p, 0};
        stopped = feed(s, &a, c);
        if (strstr(a.buf, "<|im_e") || (a.n && a.buf[a.n - 1] == '<' && !stopped && p[1] == '|'))
            leak = 1;
    }
    CHECK(stopped);
    CHECK(!leak);
    CHECK(strcmp(a.buf, "ab<|im_x") == 0);
    mx_stopper_free(s);

    /* flush returns what was held */
    s = mx_stopper_new(st1, 1);
    a.n = 0;
    CHECK(feed(s, &a, "tail <|im_") == 0);
    CHECK(strcmp(a.buf, "tail ") == 0);
    flush(s, &a);
    CHECK(strcmp(a.buf, "tail <|im_") == 0);
    mx_stopper_free(s);

    /* several stops; the earliest start wins */
    const char *st2[] = {"abc", "bcd", "</s>"};
    s = mx_stopper_new(st2, 3);
    a.n = 0;
    CHECK(feed(s, &a, "xxab") == 0);
    CHECK(strcmp(a.buf, "xx") == 0);
    CHECK(feed(s, &a, "cd") == 1);
    CHECK(strcmp(a.buf, "xx") == 0);
    mx_stopper_free(s);

    /* "ab" completes while "abc" is still a prefix: the complete one stops */
    const char *st3[] = {"abc", "ab"};
    s = mx_stopper_new(st3, 2);
    a.n = 0;
    CHECK(feed(s, &a, "1a") == 0);
    CHECK(strcmp(a.buf, "1") == 0);
    CHECK(feed(s, &a, "b") == 1);
    CHECK(strcmp(a.buf, "1") == 0);
    mx_stopper_free(s);

    /* a disproved prefix is released, and an overlapping restart is held */
    const char *st4[] = {"aab"};
    s = mx_stopper_new(st4, 1);
    a.n = 0;
    CHECK(feed(s, &a, "aa") == 0);
    CHECK(a.n == 0);
    CHECK(feed(s, &a, "a") == 0);   /* "aaa": the last "aa" may still start it */
    CHECK(strcmp(a.buf, "a") == 0);
    CHECK(feed(s, &a, "b!") == 1);
    CHECK(strcmp(a.buf, "a") == 0);
    mx_stopper_free(s);

    /* UTF-8: multi-byte stop split across feeds */
    const char *st5[] = {"\xe2\x80\x94" "END"};   /* em dash + END */
    s = mx_stopper_new(st5, 1);
    a.n = 0;
    CHECK(feed(s, &a, "caf\xc3\xa9 \xe2\x80\x94") == 0);
    CHECK(strcmp(a.buf, "caf\xc3\xa9 ") == 0);
    CHECK(feed(s, &a, "EN") == 0);
    CHECK(feed(s, &a, "X") == 0);   /* disproved: everything comes out */
    CHECK(strcmp(a.buf, "caf\xc3\xa9 \xe2\x80\x94" "ENX") == 0);
    mx_stopper_free(s);

    /* no stops: pass-through; empty stops are ignored */
    const char *st6[] = {""};
    s = mx_stopper_new(st6, 1);
    a.n = 0;
    CHECK(feed(s, &a, "plain") == 0);
    CHECK(strcmp(a.buf, "plain") == 0);
    mx_stopper_free(s);
    s = mx_stopper_new(NULL, 0);
    a.n = 0;
    CHECK(feed(s, &a, "x") == 0 && strcmp(a.buf, "x") == 0);
    flush(s, &a);
    CHECK(strcmp(a.buf, "x") == 0);
    mx_stopper_free(s);
}

/* A filter that allows only even ids (counts its calls). */
static int filter_calls;
static size_t even_only(void *ud, float *logits, int32_t vocab)
{
    (void)ud;
    filter_calls++;
    size_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (i % 2)
            logits[i] = -INFINITY;
        else
            n++;
    }
    return n;
}

static size_t nothing_allowed(void *ud, float *logits, int32_t vocab)
{
    (void)ud;
    for (int32_t i = 0; i < vocab; i++)
        logits[i] = -INFINITY;
    return 0;
}

/* logit_bias, the filter hook, frequency and presence penalties: greedy
 * picks computed by hand from the definitions in sample.h. */
static void test_bias_filter_penalties(void)
{
    mx_sample_params sp = params(0.0f, 0, 1.0f, 0.0f);
    float base[6] = {1.0f, 5.0f, 2.0f, 4.9f, 0.5f, 3.0f};
    float l[6];

    /* bias: id 4 gets +10 -> 10.5 beats 5 */
    mx_sampler *s = mx_sampler_new(&sp, 6);
    int32_t bid[2] = {4, 99};   /* 99: outside the vocabulary, ignored */
    float bv[2] = {10.0f, 50.0f};
    CHECK(mx_sampler_set_bias(s, bid, bv, 2) == 0);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 4);
    /* -100 bans the best */
    int32_t ban = 1;
    float m100 = -100.0f;
    CHECK(mx_sampler_set_bias(s, &ban, &m100, 1) == 0);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 3);
    mx_sampler_free(s);

    /* filter: only even ids -> best even is 5.0? no: ids 0,2,4 -> 2 (2.0) */
    s = mx_sampler_new(&sp, 6);
    filter_calls = 0;
    mx_sampler_set_filter(s, even_only, NULL);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 2);
    CHECK(filter_calls == 1);
    /* and with temperature: the candidates are even ids only */
    mx_sampler_free(s);
    mx_sample_params hot = params(1.0f, 0, 1.0f, 0.0f);
    s = mx_sampler_new(&hot, 6);
    mx_sampler_set_filter(s, even_only, NULL);
    int32_t ids[6];
    memcpy(l, base, sizeof l);
    size_t k = mx_sampler_candidates(s, l, NULL, 0, ids);
    CHECK(k == 3 && ids[0] == 0 && ids[1] == 2 && ids[2] == 4);
    for (int i = 0; i < 50; i++) {
        memcpy(l, base, sizeof l);
        int32_t id = mx_sampler_sample(s, l, NULL, 0);
        CHECKF(id % 2 == 0, "filtered draw %d", id);
    }
    mx_sampler_set_filter(s, nothing_allowed, NULL);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == -1);
    mx_sampler_free(s);

    /* frequency penalty 0.06 per occurrence: after id 1 twice, 5 - 0.12 =
     * 4.88 < 4.9 -> id 3; after one, 4.94 still wins */
    sp.frequency_penalty = 0.06f;
    s = mx_sampler_new(&sp, 6);
    mx_sampler_accept(s, 1);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 1);
    mx_sampler_accept(s, 1);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 3);
    mx_sampler_free(s);
    /* presence penalty 0.2: once is enough, twice is no worse than once */
    sp.frequency_penalty = 0.0f;
    sp.presence_penalty = 0.2f;
    s = mx_sampler_new(&sp, 6);
    mx_sampler_accept(s, 3);
    mx_sampler_accept(s, 3);
    mx_sampler_accept(s, 1);
    memcpy(l, base, sizeof l);
    l[3] = 5.15f;   /* 5.15 - 0.2 = 4.95 > 5 - 0.2 = 4.8 */
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 3);
    mx_sampler_free(s);
    /* negative penalties encourage repetition */
    sp.presence_penalty = -0.5f;
    s = mx_sampler_new(&sp, 6);
    mx_sampler_accept(s, 5);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 1);   /* 3.5 < 5 */
    mx_sampler_accept(s, 3);
    memcpy(l, base, sizeof l);
    CHECK(mx_sampler_sample(s, l, NULL, 0) == 3);   /* 5.4 > 5 */
    mx_sampler_free(s);
}

int main(void)
{
    test_defaults();
    test_argmax_greedy();
    test_argmax_edges();
    test_topk_large();
    test_nan_logits();
    test_determinism();
    test_filters_by_hand();
    test_penalty();
    test_distribution();
    test_large_vocab();
    test_stopper();
    test_bias_filter_penalties();
    return test_summary();
}
