/* sample.c - next-token selection: repetition penalty, temperature, top-k,
 * top-p, min-p and a seeded draw.
 *
 * The filters are defined on the candidate list sorted by logit descending
 * (ties: lower id first), so that the candidate set is a pure function of the
 * logits and the parameters and the tests can compute it by hand:
 *   top-k  keeps the first k entries;
 *   top-p  keeps the shortest prefix whose softmax mass (over what top-k
 *          kept) reaches top_p (always at least one token);
 *   min-p  keeps entries whose probability is >= min_p * the largest one.
 * The draw walks the survivors in that order with one uniform double from a
 * xoshiro256** generator seeded through splitmix64. */
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void mx_sample_defaults(mx_sample_params *p)
{
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->frequency_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->seed = 0;
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct mx_sampler {
    mx_sample_params p;
    int32_t vocab;
    uint64_t rng[4];
    cand *c;            /* (vocab) work list */
    double *prob;       /* (vocab) probabilities of the work list */
    uint8_t *seen;      /* (vocab) marks for the repetition penalty */
    int32_t *bias_id;   /* logit_bias: ids and values */
    float *bias_val;
    size_t n_bias;
    mx_sample_filter_fn filter;
    void *filter_ud;
    int32_t *count;     /* (vocab) accepted tokens, for frequency/presence; NULL until needed */
    int32_t *counted;   /* distinct ids with count > 0 */
    size_t n_counted;
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

mx_sampler *mx_sampler_new(const mx_sample_params *p, int32_t vocab)
{
    if (!p || vocab <= 0)
        return NULL;
    mx_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->p = *p;
    s->vocab = vocab;
    s->c = malloc((size_t)vocab * sizeof *s->c);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->seen = calloc((size_t)vocab, 1);
    if (!s->c || !s->prob || !s->seen) {
        mx_sampler_free(s);
        return NULL;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    return s;
}

void mx_sampler_free(mx_sampler *s)
{
    if (!s)
        return;
    free(s->c);
    free(s->prob);
    free(s->seen);
    free(s->bias_id);
    free(s->bias_val);
    free(s->count);
    free(s->counted);
    free(s);
}

int mx_sampler_set_bias(mx_sampler *s, const int32_t *ids, const float *bias, size_t n)
{
    free(s->bias_id);
    free(s->bias_val);
    s->bias_id = n ? malloc(n * sizeof *s->bias_id) : NULL;
    s->bias_val = n ? malloc(n * sizeof *s->bias_val) : NULL;
    s->n_bias = 0;
    if (n && (!s->bias_id || !s->bias_val))
        return -1;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab) {
            s->bias_id[s->n_bias] = ids[i];
            s->bias_val[s->n_bias++] = bias[i];
        }
    return 0;
}

void mx_sampler_set_filter(mx_sampler *s, mx_sample_filter_fn fn, void *ud)
{
    s->filter = fn;
    s->filter_ud = ud;
}

void mx_sampler_accept(mx_sampler *s, int32_t id)
{
    if (id < 0 || id >= s->vocab || (s->p.frequency_penalty == 0 && s->p.presence_penalty == 0))
        return;
    if (!s->count) {
        s->count = calloc((size_t)s->vocab, sizeof *s->count);
        s->counted = malloc((size_t)s->vocab * sizeof *s->counted);
        if (!s->count || !s->counted) {   /* out of memory: no penalty */
            free(s->count);
            free(s->counted);
            s->count = s->counted = NULL;
            return;
        }
    }
    if (s->count[id]++ == 0)
        s->counted[s->n_counted++] = id;
}

/* Biases, the filter, then the penalties on the tokens seen.  Returns 0,
 * or -1 when the filter left no token. */
static int adjust(mx_sampler *s, float *logits, const int32_t *hist, size_t nhist);

/* The largest of x[0 .. n) (n >= 1), NaNs skipped (-INFINITY if all are
 * NaN).  Eight running maxima: independent chains the compiler packs
 * into max instructions (`x > m ? x : m` is exactly what they compute,
 * NaN included). */
static float block_max(const float *x, size_t n)
{
    float l[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            l[k] = x[i + k] > l[k] ? x[i + k] : l[k];
    for (; i < n; i++)
        l[0] = x[i] > l[0] ? x[i] : l[0];
    float m = l[0];
    for (int k = 1; k < 8; k++)
        m = l[k] > m ? l[k] : m;
    return m;
}

/* Values a scan looks at at once: only a block whose maximum can change
 * the answer is read value by value. */
#define SCAN_BLOCK 512

/* The first index of the largest value (strict >: lowest id wins ties;
 * NaNs never win, a NaN at 0 stays), block by block: only a block whose
 * maximum beats the best so far is searched for its first occurrence.
 * The plain loop compared with logits[best] reloaded at every step and
 * ran at about 4.6 ns a value: 0.7 ms for a 152k vocabulary, a quarter of
 * a GPU decode step (docs/cuda.md); this takes about 10 us. */
int32_t mx_argmax(const float *logits, int32_t n)
{
    int32_t best = 0;
    float bv = n > 0 ? logits[0] : 0.0f;
    for (int32_t i0 = 1; i0 < n; i0 += SCAN_BLOCK) {
        const int32_t end = n - i0 > SCAN_BLOCK ? i0 + SCAN_BLOCK : n;
        const float m = block_max(logits + i0, (size_t)(end - i0));
        if (m > bv) {   /* the block holds a new best: its first occurrence */
            int32_t i = i0;
            while (!(logits[i] == m))
                i++;
            best = i;
            bv = m;
        }
    }
    return best;
}

/* Penalises each distinct id in the last repeat_last_n of history once, as
 * llama.cpp and HF do: positive logits are divided, negative multiplied. */
static void apply_penalty(mx_sampler *s, float *logits, const int32_t *hist, size_t nhist)
{
    float pen = s->p.repeat_penalty;
    if (pen == 1.0f || pen <= 0.0f || !hist || nhist == 0 || s->p.repeat_last_n == 0)
        return;
    size_t n = s->p.repeat_last_n < 0 ? nhist : (size_t)s->p.repeat_last_n;
    if (n > nhist)
        n = nhist;
    const int32_t *h = hist + (nhist - n);
    for (size_t i = 0; i < n; i++) {
        int32_t t = h[i];
        if (t < 0 || t >= s->vocab || s->seen[t])
            continue;
        s->seen[t] = 1;
        logits[t] = logits[t] > 0 ? logits[t] / pen : logits[t] * pen;
    }
    for (size_t i = 0; i < n; i++)   /* reset the marks for the next call */
        if (h[i] >= 0 && h[i] < s->vocab)
            s->seen[h[i]] = 0;
}

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit > y->logit)
        return -1;
    if (x->logit < y->logit)
        return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Min-heap on (logit, -id) for top-k selection: the root is the worst kept. */
static int cand_worse(const cand *a, const cand *b)
{
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void heap_down(cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_worse(&h[l], &h[m]))
            m = l;
        if (r < n && cand_worse(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Fills s->c with the k best (logit desc, id asc), sorted; returns k. */
static size_t select_top(mx_sampler *s, const float *logits, size_t k)
{
    size_t n = (size_t)s->vocab;
    cand *c = s->c;
    if (k >= n) {
        for (size_t i = 0; i < n; i++)
            c[i] = (cand){logits[i], (int32_t)i};
        qsort(c, n, sizeof *c, cand_cmp);
        return n;
    }
    for (size_t i = 0; i < k; i++)
        c[i] = (cand){logits[i], (int32_t)i};
    for (size_t i = k / 2; i-- > 0;)
        heap_down(c, k, i);
    /* a block enters the heap only where its largest value beats the
     * worst kept (ties go to the lower id, already kept): most blocks of a
     * large vocabulary are passed over at memory speed */
    for (size_t i0 = k; i0 < n; i0 += SCAN_BLOCK) {
        const size_t end = n - i0 > SCAN_BLOCK ? i0 + SCAN_BLOCK : n;
        if (!(block_max(logits + i0, end - i0) > c[0].logit))
            continue;
        for (size_t i = i0; i < end; i++) {
            cand x = {logits[i], (int32_t)i};
            if (cand_worse(&c[0], &x)) {
                c[0] = x;
                heap_down(c, k, 0);
            }
        }
    }
    qsort(c, k, sizeof *c, cand_cmp);
    return k;
}

/* Runs penalty, temperature and the filters; leaves the survivors in s->c
 * and their renormalised probabilities in s->prob (sorted as above).
 * Returns the count (>= 1).  NaN logits are treated as -inf. */
static size_t filter(mx_sampler *s, float *logits)
{
    size_t n = (size_t)s->vocab;
    float inv_t = 1.0f / s->p.temperature;
    /* NaN to -inf: `v > -inf ? v : -inf` is the packed max instruction's
     * exact behaviour, so eight at a time compile to vector code (a third
     * of the instructions of the plain loop with isnan) */
    size_t i8 = 0;
    for (; i8 + 8 <= n; i8 += 8) {
        float v[8];
        for (int k = 0; k < 8; k++)
            v[k] = logits[i8 + k] * inv_t;
        for (int k = 0; k < 8; k++)
            logits[i8 + k] = v[k] > -INFINITY ? v[k] : -INFINITY;
    }
    for (; i8 < n; i8++)
        logits[i8] = isnan(logits[i8]) ? -INFINITY : logits[i8] * inv_t;

    size_t k = s->p.top_k > 0 ? (size_t)s->p.top_k : n;
    size_t m;
    double norm = 0;   /* > 0: mass of the whole vocabulary, when truncated */
    if (k < n) {
        m = select_top(s, logits, k);
    } else {
        /* No top-k: sort only the tokens that can matter.  Every token with
         * p >= pmax*1e-6 is kept; if their mass already reaches top_p, the
         * rest (all smaller) can never enter the nucleus, nor pass min-p
         * when min_p >= 1e-6. */
        float mx = logits[mx_argmax(logits, (int32_t)n)];
        double total = 0;
        for (size_t i = 0; i < n; i++)
            total += exp((double)logits[i] - mx);
        float cut = mx - 13.8155f;   /* ln(1e6) */
        double kept = 0;
        m = 0;
        for (size_t i = 0; i < n; i++)
            if (logits[i] >= cut) {
                s->c[m++] = (cand){logits[i], (int32_t)i};
                kept += exp((double)logits[i] - mx);
            }
        int enough = s->p.top_p < 1.0f && kept / total >= s->p.top_p;
        if (!enough && !(s->p.min_p >= 1e-6f)) {
            m = select_top(s, logits, n);
        } else {
            qsort(s->c, m, sizeof *s->c, cand_cmp);
            norm = total;
        }
    }

    /* softmax over the kept set */
    cand *c = s->c;
    double *p = s->prob, sum = 0;
    for (size_t i = 0; i < m; i++) {
        p[i] = exp((double)c[i].logit - c[0].logit);
        sum += p[i];
    }
    if (!(sum > 0) || !isfinite(sum)) {   /* all -inf: fall back to the first */
        p[0] = 1;
        return 1;
    }
    if (norm > 0)   /* top-p mass is relative to the whole vocabulary */
        sum = norm;
    for (size_t i = 0; i < m; i++)
        p[i] /= sum;

    if (s->p.top_p < 1.0f) {
        double cum = 0;
        size_t keep = m;
        for (size_t i = 0; i < m; i++) {
            cum += p[i];
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (s->p.min_p > 0.0f) {
        double thr = (double)s->p.min_p * p[0];
        size_t keep = 1;
        while (keep < m && p[keep] >= thr)
            keep++;
        m = keep;
    }
    sum = 0;
    for (size_t i = 0; i < m; i++)
        sum += p[i];
    for (size_t i = 0; i < m; i++)
        p[i] /= sum;
    return m;
}

static int adjust(mx_sampler *s, float *logits, const int32_t *hist, size_t nhist)
{
    for (size_t i = 0; i < s->n_bias; i++)
        logits[s->bias_id[i]] += s->bias_val[i];
    if (s->filter && s->filter(s->filter_ud, logits, s->vocab) == 0)
        return -1;
    apply_penalty(s, logits, hist, nhist);
    for (size_t i = 0; s->count && i < s->n_counted; i++) {
        int32_t t = s->counted[i];
        logits[t] -= s->p.frequency_penalty * (float)s->count[t] + s->p.presence_penalty;
    }
    return 0;
}

int32_t mx_sampler_sample(mx_sampler *s, float *logits, const int32_t *history, size_t nhist)
{
    if (adjust(s, logits, history, nhist))
        return -1;
    if (s->p.temperature <= 0.0f)
        return mx_argmax(logits, s->vocab);
    size_t m = filter(s, logits);
    double r = rng_uniform(s->rng), cum = 0;
    for (size_t i = 0; i < m; i++) {
        cum += s->prob[i];
        if (r < cum)
            return s->c[i].id;
    }
    return s->c[m - 1].id;   /* rounding left r just above the total */
}

static int id_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

size_t mx_sampler_candidates(mx_sampler *s, float *logits, const int32_t *history,
                             size_t nhist, int32_t *ids_out)
{
    if (adjust(s, logits, history, nhist))
        return 0;
    if (s->p.temperature <= 0.0f) {
        ids_out[0] = mx_argmax(logits, s->vocab);
        return 1;
    }
    size_t m = filter(s, logits);
    size_t k = 0;
    for (size_t i = 0; i < m; i++)
        if (s->prob[i] > 0)
            ids_out[k++] = s->c[i].id;
    qsort(ids_out, k, sizeof *ids_out, id_cmp);
    return k;
}
