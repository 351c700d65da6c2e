/* perplexity.c - the perplexity run: chunks of ctx tokens, each from an
 * empty cache, scored over their second half (the definition is in
 * docs/quality.md and matches the PyTorch reference of the demo model). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval.h"
#include "util/parallel.h"

int mx_ppl_plan(long n_tokens, int ctx, int max_chunks, int *n_chunks, mx_err *e)
{
    if (ctx < 4)
        return mx_fail(e, MX_EINVAL, "--ctx %d is too small (at least 4: the second half of a chunk is scored)",
                       ctx);
    if (n_tokens < 2L * ctx)
        return mx_fail(e, MX_EINVAL,
                       "the text has %ld tokens, fewer than 2 x ctx = %ld: give a longer text or a smaller --ctx",
                       n_tokens, 2L * ctx);
    long n = n_tokens / ctx;
    if (max_chunks > 0 && n > max_chunks)
        n = max_chunks;
    if (n > INT32_MAX / ctx)
        n = INT32_MAX / ctx;
    *n_chunks = (int)n;
    return MX_OK;
}

int mx_ppl_begin(mx_ppl_run *r, mx_err *e)
{
    r->first = r->ctx / 2;
    if (r->batch <= 0 || r->batch > r->ctx)
        r->batch = r->ctx;
    memset(&r->nll, 0, sizeof r->nll);
    r->n_cmp = 0;
    r->seq = NULL;
    r->cmp = NULL;
    r->row_nll = NULL;
    size_t V = (size_t)r->m->vocab;
    r->logits = malloc(sizeof(float) * V * (size_t)r->batch);
    r->row_nll = malloc(sizeof(double) * (size_t)r->batch);
    if (!r->logits || !r->row_nll)
        goto oom;
    if (r->base) {
        long n_pos = (long)r->n_chunks * (r->ctx - 1 - r->first);
        r->cmp = malloc(sizeof(mx_kl_pos) * (size_t)n_pos);
        if (!r->cmp)
            goto oom;
    }
    int rc = mx_seq_new(r->m, r->ctx, &r->seq, e);
    if (rc) {
        mx_ppl_end(r);
        return rc;
    }
    return MX_OK;
oom:
    mx_ppl_end(r);
    return mx_fail(e, MX_ENOMEM, "perplexity: out of memory for the logits of %d tokens x %d vocabulary",
                   r->batch, r->m->vocab);
}

/* rows[n, vocab] are the logits of positions lo.. of the chunk: turns each
 * into log-probs in place (in parallel: a vocabulary of exponentials per
 * row), then accumulates, saves or compares them in order. */
static int score_rows(mx_ppl_run *r, float *rows, const int32_t *tok, int lo, int n, mx_err *e)
{
    const int V = r->m->vocab;
    double *nll = r->row_nll;
#pragma omp parallel for num_threads(mx_threads()) schedule(static)
    for (int j = 0; j < n; j++) {
        float *row = rows + (size_t)j * (size_t)V;
        double target = row[tok[lo + j + 1]];
        nll[j] = mx_log_softmax(row, V, row) - target;
    }
    for (int j = 0; j < n; j++) {
        const float *lp = rows + (size_t)j * (size_t)V;
        if (!isfinite(nll[j]))
            return mx_fail(e, MX_ERANGE, "position %d: the model's logits are not finite", lo + j);
        mx_mean_add(&r->nll, nll[j]);
        int rc = MX_OK;
        if (r->save)
            rc = mx_klbase_append(r->save, lp, nll[j], e);
        if (!rc && r->base) {
            mx_klbase_rec rec;
            rc = mx_klbase_read(r->base, &rec, e);
            if (!rc)
                mx_kl_compare_pos(mx_klbase_get_info(r->base), &rec, lp, nll[j], &r->cmp[r->n_cmp++]);
        }
        if (rc)
            return rc;
    }
    return MX_OK;
}

int mx_ppl_chunk(mx_ppl_run *r, int i, mx_err *e)
{
    const int32_t *tok = r->tokens + (size_t)i * (size_t)r->ctx;
    const int last = r->ctx - 1;            /* position ctx-1 has no target in the chunk */
    mx_seq_reset(r->seq);
    for (int p0 = 0; p0 < r->ctx; p0 += r->batch) {
        int n = r->ctx - p0 < r->batch ? r->ctx - p0 : r->batch;
        int lo = p0 > r->first ? p0 : r->first, hi = p0 + n < last ? p0 + n : last;
        int rc;
        if (lo >= hi) {
            rc = mx_forward(r->m, r->seq, tok + p0, n, NULL, NULL, e);
        } else if (n == 1) {
            /* one token without a trace: the single-token decode path (the
             * one the fused MoE kernel serves) */
            rc = mx_forward(r->m, r->seq, tok + p0, 1, r->logits, NULL, e);
        } else {
            mx_forward_trace tr = {.all_logits = r->logits};
            rc = mx_forward(r->m, r->seq, tok + p0, n, NULL, &tr, e);
        }
        if (!rc && lo < hi)
            rc = score_rows(r, r->logits + (size_t)(lo - p0) * (size_t)r->m->vocab, tok, lo, hi - lo, e);
        if (rc) {
            mx_err_prefix(e, "chunk %d", i);
            return rc;
        }
    }
    return MX_OK;
}

void mx_ppl_end(mx_ppl_run *r)
{
    mx_seq_free(r->seq);
    free(r->logits);
    free(r->row_nll);
    free(r->cmp);
    r->seq = NULL;
    r->logits = NULL;
    r->row_nll = NULL;
    r->cmp = NULL;
}
