/* lookup.c - prompt lookup: drafting from n-gram matches in the context,
 * and the cost model that decides how much of a draft is worth verifying
 * (gen.h explains the scheme; gen.c runs the verification). */
#include <string.h>

#include "gen/gen.h"

/* Matches passed over before one token is drafted anyway (which also
 * measures a call of two tokens again); the interval doubles after each
 * such probe, up to PROBE_MAX, until drafting pays again. */
#define PROBE_FIRST 64
#define PROBE_MAX 1024

int mx_lookup_draft(const int32_t *ctx, int n, int max_ngram, int max_draft, int32_t *draft,
                    int *match)
{
    *match = 0;
    if (n < 2 || max_ngram < 1 || max_draft < 1)
        return 0;
    /* every earlier occurrence of the last token, most recent first, and
     * how far back it agrees with the suffix: the longest wins, the most
     * recent among equals (recent text is the likelier to be repeated) */
    int best_len = 0, best_end = -1;
    const int32_t last = ctx[n - 1];
    for (int j = n - 2; j >= 0 && best_len < max_ngram; j--) {
        if (ctx[j] != last)
            continue;
        int len = 1;
        while (len < max_ngram && j - len >= 0 && ctx[j - len] == ctx[n - 1 - len])
            len++;
        if (len > best_len) {
            best_len = len;
            best_end = j;
        }
    }
    if (!best_len)
        return 0;
    /* what followed it; past the end of ctx the draft continues itself
     * (best_end + 1 < n, so src - n < i: an entry already written) */
    for (int i = 0; i < max_draft; i++) {
        const int src = best_end + 1 + i;
        draft[i] = src < n ? ctx[src] : draft[src - n];
    }
    *match = best_len;
    return max_draft;
}

void mx_lookup_init(mx_lookup *lk, int max_draft, int always)
{
    memset(lk, 0, sizeof *lk);
    lk->max_draft = max_draft < 0 ? 0 : max_draft > MX_LOOKUP_MAX ? MX_LOOKUP_MAX : max_draft;
    lk->always = always;
    lk->probe_every = PROBE_FIRST;
}

/* The time of a forward call of T tokens: measured, else interpolated
 * between the nearest measured sizes, else, up to twice the largest
 * measured size lo, the time of lo: a call costs at least what a smaller
 * one does, and this lower bound lets a larger size be tried when the
 * acceptance rate says it might pay (once it has run, its own time
 * counts).  -1: further out, or nothing measured beyond one token.  So
 * drafts grow by doubling: the first two are of one token (timing the size
 * all others are guessed from, twice), and a size is tried only when its
 * guess pays.  The guesses are not a line through the one-token step: a
 * step of one token takes another path (the fused MoE kernel), and a call
 * of two may cost several of it while sixteen cost little more than two
 * (on a busy machine, where each call waits for the CPUs). */
static double time_of(const mx_lookup *lk, int T)
{
    if (lk->t_fwd[T] > 0)
        return lk->t_fwd[T];
    int lo = 1, hi = 0;
    for (int t = 2; t <= MX_LOOKUP_MAX + 1; t++) {
        if (lk->t_fwd[t] <= 0)
            continue;
        if (t < T)
            lo = t;
        else if (!hi)
            hi = t;
    }
    if (hi)
        return lk->t_fwd[lo] + (lk->t_fwd[hi] - lk->t_fwd[lo]) * (T - lo) / (hi - lo);
    if (lo == 1 || T > 2 * lo)
        return -1;
    return lk->t_fwd[lo];
}

static int match_class(int match)
{
    return match < 1 ? 1 : match > MX_LOOKUP_NGRAM ? MX_LOOKUP_NGRAM : match;
}

int mx_lookup_choose(mx_lookup *lk, int match, int avail)
{
    if (avail > lk->max_draft)
        avail = lk->max_draft;
    if (avail <= 0)
        return 0;
    if (lk->always)
        return avail;
    const double t1 = lk->t_fwd[1];
    if (t1 <= 0)
        return 0;                /* a plain step first: it is the yardstick */
    const double *hit = lk->hit[match_class(match)], *tried = lk->tried[match_class(match)];
    int best = 0;
    double best_rate = 1 / t1, expect = 1, reach = 1, p = 0.5;
    for (int k = 1; k <= avail; k++) {
        /* draft[k-1]'s rate, drawn towards the rate before it (1/2 for
         * the first) by two imagined comparisons: a position seldom
         * reached is taken to go on like the one before */
        p = (hit[k - 1] + 2 * p) / (tried[k - 1] + 2);
        reach *= p;
        expect += reach;         /* tokens a call of k drafted yields */
        double t = time_of(lk, k + 1);
        if (k == 1 && lk->n_fwd[2] < 2) {
            best = 1;            /* calls of two tokens timed less than twice: time one */
            break;
        }
        if (t < 0)
            break;
        if (expect / t > best_rate) {
            best_rate = expect / t;
            best = k;
        }
    }
    if (best) {
        lk->idle = 0;
        lk->probe_every = PROBE_FIRST;
        return best;
    }
    if (++lk->idle >= lk->probe_every) {
        lk->idle = 0;
        if (lk->probe_every < PROBE_MAX)
            lk->probe_every *= 2;
        return 1;
    }
    return 0;
}

void mx_lookup_record(mx_lookup *lk, int T, double seconds, int match, int checked, int accepted)
{
    if (T >= 1 && T <= MX_LOOKUP_MAX + 1 && seconds > 0) {
        /* the mean of the first five, then a moving average: one slow call
         * (the machine busy elsewhere) does not decide alone */
        const int n = ++lk->n_fwd[T];
        const double w = n < 5 ? 1.0 / n : 0.2;
        lk->t_fwd[T] += w * (seconds - lk->t_fwd[T]);
    }
    double *hit = lk->hit[match_class(match)], *tried = lk->tried[match_class(match)];
    /* decaying counts of the positions compared: the rates follow the
     * text as it changes */
    for (int i = 0; i < checked && i < MX_LOOKUP_MAX; i++) {
        hit[i] = 0.9 * hit[i] + (i < accepted);
        tried[i] = 0.9 * tried[i] + 1;
    }
}
