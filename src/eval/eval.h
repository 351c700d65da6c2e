/* eval.h - measuring a model's quality on text: perplexity and the KL
 * divergence between two runs (docs/quality.md has the definitions).
 *
 *   tokens --[chunk i = tokens[i*C, (i+1)*C), empty cache]--> mx_forward
 *     -> logits of positions j in [C/2, C-1), scored against token j+1
 *     -> per position: NLL (double), log-probs rounded to f32
 *        -> running mean NLL -> PPL = exp(mean) +- PPL * s
 *        -> saved to a base file (mx_klbase_append), or compared with the
 *           base file's record of the same position (mx_kl_compare_pos)
 *
 * Everything is computed in double from the f32 logits; the log-probs are
 * rounded to f32 once (the form a base file stores), and both sides of a
 * comparison use that same form, so a run compared with itself gives KL 0
 * exactly. */
#ifndef MX_EVAL_H
#define MX_EVAL_H

#include <stdint.h>

#include "model/model.h"
#include "sample/sample.h"   /* mx_argmax: the lowest id wins a tie */
#include "util/err.h"

/* ---- one distribution, given as a row of logits ---- */

/* log(sum(exp(x))) in double, shifted by the max so nothing overflows. */
double mx_logsumexp(const float *x, int n);
/* out[i] = x[i] - logsumexp(x), computed in double and rounded to f32;
 * returns logsumexp(x).  out may be x (in place). */
double mx_log_softmax(const float *x, int n, float *out);
/* -log softmax(x)[target], in double. */
double mx_nll(const float *x, int n, int32_t target);
/* The k largest values' indices, largest first (ties: lower index first);
 * 1 <= k <= n. */
void mx_top_k(const float *x, int n, int k, int32_t *ids);
/* sum of exp(lp[i]) over the i NOT in ids[0..k) (distinct), in double,
 * summed in index order: the probability mass outside a top-k set. */
double mx_tail_mass(const float *lp, int n, const int32_t *ids, int k);

/* ---- a running mean and its standard error ---- */

/* Welford's update (stable when all values are equal, e.g. uniform logits). */
typedef struct mx_mean_acc {
    long n;
    double mean, m2;             /* m2 = sum of (x - mean)^2 */
} mx_mean_acc;

void mx_mean_add(mx_mean_acc *a, double x);
/* sqrt(var / (n - 1)) with var the population variance (as llama.cpp's
 * perplexity); 0 when n < 2. */
double mx_mean_err(const mx_mean_acc *a);
/* exp(mean NLL) and its uncertainty PPL * mx_mean_err (error propagation). */
double mx_ppl(const mx_mean_acc *nll);
double mx_ppl_err(const mx_mean_acc *nll);

/* Value at quantile q in [0, 1] of sorted[n] (n >= 1), interpolating
 * linearly between the two nearest ranks (rank q*(n-1)). */
double mx_quantile_sorted(const double *sorted, long n, double q);

/* ---- KL divergence KL(base || new) = sum p_base * (log p_base - log p_new) ---- */

/* Both distributions in full, as (f32) log-probs; each is renormalised in
 * double first, so the result is the exact KL of two distributions (>= 0 up
 * to double rounding) and 0 exactly for equal inputs. */
double mx_kl_full(const float *lp_base, const float *lp_new, int n);
/* The base as its top-k (ids, log-probs) and the mass of the rest; the new
 * distribution in full.  The rest of each distribution is lumped into one
 * outcome (and both coarsened distributions renormalised), so this is the KL
 * of the two distributions coarsened to k+1 outcomes: never negative, 0 for
 * equal inputs, and a lower bound of the full KL (data-processing
 * inequality); the gap is the KL within the rest, weighted by its base mass. */
double mx_kl_topk(const int32_t *ids, const float *lp_top, int k, double tail_base,
                  const float *lp_new, int n);

/* ---- the base file of a run (format in docs/quality.md) ---- */

enum { MX_KLBASE_FULL = 1, MX_KLBASE_TOPK = 2 };
#define MX_KLBASE_MAX_TOPK 4096

typedef struct mx_klbase_info {
    int form;                    /* MX_KLBASE_FULL or MX_KLBASE_TOPK */
    int top_k;                   /* K for MX_KLBASE_TOPK, 0 for full */
    int vocab, ctx, n_chunks, first;
    char model_type[64];         /* informational: what made the file */
    uint64_t params;             /* informational */
} mx_klbase_info;

/* One scored position as stored.  Pointers are into the reader's buffer,
 * valid until the next read. */
typedef struct mx_klbase_rec {
    double nll;                  /* NLL of the target under the base run */
    const float *lp;             /* full: [vocab] log-probs */
    const int32_t *ids;          /* top-k: [K] ids, most probable first */
    const float *lp_top;         /* top-k: [K] their log-probs */
    double tail;                 /* top-k: mass of all other ids */
    int32_t top1;                /* the base's most probable id */
} mx_klbase_rec;

typedef struct mx_klbase mx_klbase;

/* Positions a run scores: n_chunks * (ctx - 1 - first). */
long mx_klbase_positions(const mx_klbase_info *info);
/* Writes the header and tokens[n_chunks * ctx]. */
int mx_klbase_create(const char *path, const mx_klbase_info *info, const int32_t *tokens,
                     mx_klbase **out, mx_err *e);
/* Appends the next scored position: lp = its full log-probs [vocab] (from
 * mx_log_softmax), nll = the NLL of its target. */
int mx_klbase_append(mx_klbase *f, const float *lp, double nll, mx_err *e);
/* Opens for reading; checks the magic, version, fields and the file size. */
int mx_klbase_open(const char *path, mx_klbase **out, mx_err *e);
const mx_klbase_info *mx_klbase_get_info(const mx_klbase *f);
const int32_t *mx_klbase_tokens(const mx_klbase *f);   /* [n_chunks * ctx] */
/* Refuses (MX_EINVAL, naming the difference) a base file that another
 * vocabulary, context, chunk count or tokenization made. */
int mx_klbase_check(const mx_klbase *f, int vocab, int ctx, int n_chunks, const int32_t *tokens,
                    mx_err *e);
/* Reads the next scored position. */
int mx_klbase_read(mx_klbase *f, mx_klbase_rec *rec, mx_err *e);
/* Closes; a writer checks that every position was appended and that the
 * data reached the file.  f may be NULL. */
int mx_klbase_close(mx_klbase *f, mx_err *e);

/* ---- comparing one position with the base ---- */

typedef struct mx_kl_pos {
    double kl;                   /* KL(base || new) */
    double nll_base, nll_new;    /* of the target token */
    int same_top;                /* both runs' most probable id agree */
} mx_kl_pos;

/* lp_new: this run's log-probs [vocab]; nll_new: its target's NLL. */
void mx_kl_compare_pos(const mx_klbase_info *info, const mx_klbase_rec *base, const float *lp_new,
                       double nll_new, mx_kl_pos *out);

typedef struct mx_kl_summary {
    long n;
    double kl_mean, kl_mean_err, kl_median, kl_p99, kl_max, kl_min;
    double same_top, same_top_err;           /* fractions */
    double ppl_base, ppl_base_err, ppl_new, ppl_new_err;
    double dppl, dppl_err;                   /* PPL(new) - PPL(base) */
    double dppl_rel, dppl_rel_err;           /* PPL(new) / PPL(base) - 1 */
    double dp_mean, dp_mean_err;             /* p_new - p_base of the target */
    double dp_rms, dp_rms_err;
} mx_kl_summary;

/* Statistics over n >= 2 compared positions (definitions in docs/quality.md). */
int mx_kl_summarize(const mx_kl_pos *pos, long n, mx_kl_summary *s, mx_err *e);

/* ---- the perplexity run itself ---- */

typedef struct mx_ppl_run {
    mx_model *m;
    mx_seq *seq;
    const int32_t *tokens;       /* the whole text's ids */
    int ctx, n_chunks, first, batch;
    mx_klbase *save;             /* when set, every position is appended to it */
    mx_klbase *base;             /* when set, every position is compared with it */
    mx_mean_acc nll;             /* over all scored positions so far */
    mx_kl_pos *cmp;              /* [positions] when base is set */
    long n_cmp;
    float *logits;               /* [batch, vocab]: logits, then log-probs in place */
    double *row_nll;             /* [batch] */
} mx_ppl_run;

/* Chunks of ctx tokens in n_tokens, capped by max_chunks (0: no cap).  A
 * text shorter than 2 * ctx tokens, or ctx < 4, is an error naming both. */
int mx_ppl_plan(long n_tokens, int ctx, int max_chunks, int *n_chunks, mx_err *e);
/* Sets up a run (r->m, tokens, ctx, n_chunks and optionally batch, save and
 * base are filled by the caller; batch 0 means ctx: one forward per chunk). */
int mx_ppl_begin(mx_ppl_run *r, mx_err *e);
/* Runs chunk i (0-based, in order) from an empty cache and scores it. */
int mx_ppl_chunk(mx_ppl_run *r, int i, mx_err *e);
void mx_ppl_end(mx_ppl_run *r);

#endif
