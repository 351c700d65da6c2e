/* stats.c - the statistics of perplexity and KL divergence, in double.
 * Definitions and the reasons for them: docs/quality.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval.h"

/* ---- one distribution ---- */

double mx_logsumexp(const float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    if (mx == -INFINITY || isnan(mx))
        return mx;
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - (double)mx);
    return (double)mx + log(s);
}

double mx_log_softmax(const float *x, int n, float *out)
{
    double lse = mx_logsumexp(x, n);
    for (int i = 0; i < n; i++)
        out[i] = (float)((double)x[i] - lse);
    return lse;
}

double mx_nll(const float *x, int n, int32_t target)
{
    return mx_logsumexp(x, n) - (double)x[target];
}

/* Order of the top-k selection: a larger value first, then a lower id. */
static int ranks_before(const float *x, int32_t a, int32_t b)
{
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}

/* heap[0] is the candidate that ranks last, the first to be replaced */
static void sift_down(const float *x, int32_t *heap, int k, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && ranks_before(x, heap[w], heap[l]))
            w = l;
        if (r < k && ranks_before(x, heap[w], heap[r]))
            w = r;
        if (w == i)
            return;
        int32_t t = heap[i];
        heap[i] = heap[w], heap[w] = t;
        i = w;
    }
}

void mx_top_k(const float *x, int n, int k, int32_t *ids)
{
    for (int i = 0; i < k; i++)
        ids[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(x, ids, k, i);
    for (int i = k; i < n; i++) {
        if (ranks_before(x, i, ids[0])) {
            ids[0] = i;
            sift_down(x, ids, k, 0);
        }
    }
    /* heap sort: take the last-ranked out to the end, best ends up first */
    for (int end = k - 1; end > 0; end--) {
        int32_t t = ids[0];
        ids[0] = ids[end], ids[end] = t;
        sift_down(x, ids, end, 0);
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

double mx_tail_mass(const float *lp, int n, const int32_t *ids, int k)
{
    int32_t sorted[MX_KLBASE_MAX_TOPK];
    if (k > MX_KLBASE_MAX_TOPK)
        k = MX_KLBASE_MAX_TOPK;
    memcpy(sorted, ids, sizeof(int32_t) * (size_t)k);
    qsort(sorted, (size_t)k, sizeof(int32_t), cmp_i32);
    double s = 0;
    int j = 0;
    for (int i = 0; i < n; i++) {
        if (j < k && sorted[j] == i) {
            j++;
            continue;
        }
        s += exp((double)lp[i]);
    }
    return s;
}

/* ---- running mean ---- */

void mx_mean_add(mx_mean_acc *a, double x)
{
    a->n++;
    double d = x - a->mean;
    a->mean += d / (double)a->n;
    a->m2 += d * (x - a->mean);
}

double mx_mean_err(const mx_mean_acc *a)
{
    if (a->n < 2)
        return 0;
    double var = a->m2 / (double)a->n;
    return sqrt(var / (double)(a->n - 1));
}

double mx_ppl(const mx_mean_acc *nll)
{
    return exp(nll->mean);
}

double mx_ppl_err(const mx_mean_acc *nll)
{
    return mx_ppl(nll) * mx_mean_err(nll);
}

double mx_quantile_sorted(const double *sorted, long n, double q)
{
    double r = q * (double)(n - 1);
    long lo = (long)floor(r);
    if (lo >= n - 1)
        return sorted[n - 1];
    if (lo < 0)
        return sorted[0];
    double f = r - (double)lo;
    return sorted[lo] + f * (sorted[lo + 1] - sorted[lo]);
}

/* ---- KL divergence ---- */

double mx_kl_full(const float *lp_base, const float *lp_new, int n)
{
    double zb = mx_logsumexp(lp_base, n), zn = mx_logsumexp(lp_new, n);
    double s = 0;
    for (int i = 0; i < n; i++) {
        double a = (double)lp_base[i] - zb;
        double p = exp(a);
        if (p == 0)
            continue;          /* 0 * log 0 = 0 */
        s += p * (a - ((double)lp_new[i] - zn));
    }
    return s;
}

double mx_kl_topk(const int32_t *ids, const float *lp_top, int k, double tail_base,
                  const float *lp_new, int n)
{
    double tail_new = mx_tail_mass(lp_new, n, ids, k);
    double zb = tail_base, zn = tail_new;
    for (int j = 0; j < k; j++) {
        zb += exp((double)lp_top[j]);
        zn += exp((double)lp_new[ids[j]]);
    }
    double lzb = log(zb), lzn = log(zn), s = 0;
    for (int j = 0; j < k; j++) {
        double a = (double)lp_top[j] - lzb, p = exp(a);
        if (p > 0)
            s += p * (a - ((double)lp_new[ids[j]] - lzn));
    }
    if (tail_base > 0) {
        double a = log(tail_base) - lzb;
        s += exp(a) * (a - (log(tail_new) - lzn));   /* +inf when tail_new == 0 */
    }
    return s;
}

/* ---- one position against the base ---- */

void mx_kl_compare_pos(const mx_klbase_info *info, const mx_klbase_rec *base, const float *lp_new,
                       double nll_new, mx_kl_pos *out)
{
    if (info->form == MX_KLBASE_FULL)
        out->kl = mx_kl_full(base->lp, lp_new, info->vocab);
    else
        out->kl = mx_kl_topk(base->ids, base->lp_top, info->top_k, base->tail, lp_new, info->vocab);
    out->nll_base = base->nll;
    out->nll_new = nll_new;
    out->same_top = mx_argmax(lp_new, info->vocab) == base->top1;
}

/* ---- summary ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int mx_kl_summarize(const mx_kl_pos *pos, long n, mx_kl_summary *s, mx_err *e)
{
    if (n < 2)
        return mx_fail(e, MX_EINVAL, "KL summary: %ld compared positions, need at least 2", n);
    double *kl = malloc(sizeof(double) * (size_t)n);
    if (!kl)
        return mx_fail(e, MX_ENOMEM, "KL summary: out of memory for %ld positions", n);
    memset(s, 0, sizeof *s);
    s->n = n;
    mx_mean_acc akl = {0}, ab = {0}, an = {0}, ad = {0}, adp = {0}, adp2 = {0};
    long same = 0;
    for (long i = 0; i < n; i++) {
        const mx_kl_pos *p = &pos[i];
        kl[i] = p->kl;
        mx_mean_add(&akl, p->kl);
        mx_mean_add(&ab, p->nll_base);
        mx_mean_add(&an, p->nll_new);
        mx_mean_add(&ad, p->nll_new - p->nll_base);
        double dp = exp(-p->nll_new) - exp(-p->nll_base);
        mx_mean_add(&adp, dp);
        mx_mean_add(&adp2, dp * dp);
        same += p->same_top != 0;
    }
    qsort(kl, (size_t)n, sizeof(double), cmp_double);
    s->kl_mean = akl.mean;
    s->kl_mean_err = mx_mean_err(&akl);
    s->kl_median = mx_quantile_sorted(kl, n, 0.5);
    s->kl_p99 = mx_quantile_sorted(kl, n, 0.99);
    s->kl_min = kl[0];
    s->kl_max = kl[n - 1];
    free(kl);

    double f = (double)same / (double)n;
    s->same_top = f;
    s->same_top_err = sqrt(f * (1 - f) / (double)(n - 1));

    s->ppl_base = mx_ppl(&ab), s->ppl_base_err = mx_ppl_err(&ab);
    s->ppl_new = mx_ppl(&an), s->ppl_new_err = mx_ppl_err(&an);
    /* Var(PPL_new - PPL_base) by first-order propagation, with the
     * covariance of the two mean NLLs (same tokens, strongly correlated):
     * Var(d) = Var(a) + Var(b) - 2 Cov(a, b), and Cov(a, b) follows from
     * Var(a - b) of the paired differences. */
    double va = mx_mean_err(&an) * mx_mean_err(&an), vb = mx_mean_err(&ab) * mx_mean_err(&ab);
    double vd = mx_mean_err(&ad) * mx_mean_err(&ad);
    double cov = (va + vb - vd) / 2;
    double var = s->ppl_new * s->ppl_new * va + s->ppl_base * s->ppl_base * vb -
                 2 * s->ppl_new * s->ppl_base * cov;
    s->dppl = s->ppl_new - s->ppl_base;
    s->dppl_err = var > 0 ? sqrt(var) : 0;
    /* the ratio from the paired differences: exp(mean(nll_new - nll_base)) */
    double ratio = exp(ad.mean);
    s->dppl_rel = ratio - 1;
    s->dppl_rel_err = ratio * mx_mean_err(&ad);

    s->dp_mean = adp.mean, s->dp_mean_err = mx_mean_err(&adp);
    s->dp_rms = sqrt(adp2.mean);
    s->dp_rms_err = s->dp_rms > 0 ? mx_mean_err(&adp2) / (2 * s->dp_rms) : 0;
    return MX_OK;
}
