/* gather.c - the general expert path for any number of tokens.
 *
 * (token, expert) pairs are grouped by expert; each selected expert runs its
 * gate/up/down as quantized matmuls over just its tokens, so its weights are
 * streamed once per batch, and results are scattered back weighted by the
 * router.  Single-token experts use the matvec kernel. */
#include <stdlib.h>
#include <string.h>

#include "moe/moe.h"

int mx_moe_gather(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                  float *out, mx_err *e)
{
    const int64_t D = ex->d_model, F = ex->d_ff;
    /* count tokens per expert */
    int64_t *count = calloc((size_t)ex->n, sizeof *count);
    int64_t *tok = malloc(sizeof *tok * (size_t)T * MX_MAX_TOPK);
    float *wt = malloc(sizeof *wt * (size_t)T * MX_MAX_TOPK);
    int64_t maxn = 0;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < routes[t].k; j++)
            if (++count[routes[t].idx[j]] > maxn)
                maxn = count[routes[t].idx[j]];
    float *xs = malloc(sizeof *xs * (size_t)(maxn * D + 2 * maxn * F + maxn * D));
    if (!count || !tok || !wt || (maxn && !xs)) {
        free(count), free(tok), free(wt), free(xs);
        return mx_fail(e, MX_ENOMEM, "moe gather: out of memory for %lld tokens", (long long)T);
    }
    float *g = xs + maxn * D, *u = g + maxn * F, *y = u + maxn * F;
    memset(out, 0, sizeof *out * (size_t)(T * D));

    for (int ei = 0; ei < ex->n; ei++) {
        if (!count[ei])
            continue;
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < routes[t].k; j++)
                if (routes[t].idx[j] == ei) {
                    tok[n] = t;
                    wt[n] = routes[t].w[j];
                    memcpy(xs + n * D, x + t * D, sizeof *xs * (size_t)D);
                    n++;
                }
        if (n == 1) {
            mx_linear_matvec(&ex->gate[ei], xs, g);
            mx_linear_matvec(&ex->up[ei], xs, u);
        } else {
            mx_linear_matmul(&ex->gate[ei], xs, n, g);
            mx_linear_matmul(&ex->up[ei], xs, n, u);
        }
        for (int64_t i = 0; i < n * F; i++)
            g[i] = mx_silu(g[i]) * u[i];
        if (n == 1)
            mx_linear_matvec(&ex->down[ei], g, y);
        else
            mx_linear_matmul(&ex->down[ei], g, n, y);
        for (int64_t i = 0; i < n; i++) {
            float *o = out + tok[i] * D;
            const float *yi = y + i * D;
            for (int64_t d = 0; d < D; d++)
                o[d] += wt[i] * yi[d];
        }
    }
    free(count), free(tok), free(wt), free(xs);
    return MX_OK;
}
