/* router.c - routing rules: router logits in, a token's experts and their
 * weights out.  Nothing here knows how the experts are then computed. */
#include <math.h>

#include "moe/moe.h"

/* Indices of the k largest of v[n] into idx, descending; ties go to the
 * lower index, as torch.topk does on CPU.  k is small (2..8) and n at most
 * a few hundred, so repeated selection is the simple choice. */
static void top_k(const float *v, int n, int k, int *idx)
{
    unsigned char taken[4096] = {0};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!taken[i] && (best < 0 || v[i] > v[best]))
                best = i;
        taken[best] = 1;
        idx[j] = best;
    }
}

/* Softmax over all logits (in float with the max subtracted, as torch's
 * softmax), then the top k. */
static void route_softmax_topk(const mx_router *rt, const float *logits, int n, mx_route *r)
{
    float p[4096];
    float mx = logits[0], sum = 0.0f;
    for (int i = 1; i < n; i++)
        if (logits[i] > mx)
            mx = logits[i];
    for (int i = 0; i < n; i++) {
        p[i] = expf(logits[i] - mx);
        sum += p[i];
    }
    top_k(p, n, r->k, r->idx);
    for (int j = 0; j < r->k; j++)
        r->w[j] = p[r->idx[j]] / sum;
    if (rt->norm_topk) {
        float s = 0.0f;
        for (int j = 0; j < r->k; j++)
            s += r->w[j];
        for (int j = 0; j < r->k; j++)
            r->w[j] /= s;
    }
}

void mx_moe_route(const mx_router *rt, const float *logits, int n, mx_route *out)
{
    if (n > 4096)   /* the loader refuses more experts than this */
        n = 4096;
    int k = rt->k < MX_MAX_TOPK ? rt->k : MX_MAX_TOPK;
    out->k = k < n ? k : n;
    switch (rt->kind) {
    case MX_ROUTER_SOFTMAX_TOPK: route_softmax_topk(rt, logits, n, out); break;
    }
}
