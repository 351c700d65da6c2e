/* router.c - routing rules: router logits in, a token's experts and their
 * weights out.  Nothing here knows how the experts are then computed. */
#include <math.h>
#include <string.h>

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

/* Sigmoid scores, the choice on score + bias within the best groups, the
 * unbiased scores as weights (DeepSeek-V3's rule, as dots1, MiniMax-M2 and
 * LFM2 use it). */
static void route_sigmoid(const mx_router *rt, const float *logits, int n, mx_route *r)
{
    float s[4096], choice[4096];
    for (int i = 0; i < n; i++) {
        s[i] = 1.0f / (1.0f + expf(-logits[i]));
        choice[i] = s[i] + (rt->bias ? rt->bias[i] : 0.0f);
    }
    if (rt->n_group > 1 && n % rt->n_group == 0 && rt->topk_group < rt->n_group) {
        /* each group scored by the sum of its two best choice scores; the
         * experts outside the topk_group best groups get choice 0 (a mask
         * of zeros, not of -inf: transformers' masked_fill(0.0)) */
        const int G = rt->n_group, per = n / G;
        float gscore[256];
        for (int g = 0; g < G && g < 256; g++) {
            int two[2];
            top_k(choice + g * per, per, per >= 2 ? 2 : 1, two);
            gscore[g] = choice[g * per + two[0]] + (per >= 2 ? choice[g * per + two[1]] : 0.0f);
        }
        int keep[256];
        top_k(gscore, G, rt->topk_group, keep);
        unsigned char kept[256] = {0};
        for (int j = 0; j < rt->topk_group; j++)
            kept[keep[j]] = 1;
        for (int i = 0; i < n; i++)
            if (!kept[i / per])
                choice[i] = 0.0f;
    }
    top_k(choice, n, r->k, r->idx);
    float sum = 0.0f;
    for (int j = 0; j < r->k; j++) {
        r->w[j] = s[r->idx[j]];
        sum += r->w[j];
    }
    for (int j = 0; j < r->k; j++) {
        if (rt->norm_topk)
            r->w[j] /= sum + rt->norm_eps;
        r->w[j] *= rt->scale;
    }
}

/* Softmax of v[n] (masked entries -inf) evaluated at index i. */
static float softmax_at(const float *v, int n, int i)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++)
        if (v[j] > mx)
            mx = v[j];
    for (int j = 0; j < n; j++)
        sum += expf(v[j] - mx);
    return expf(v[i] - mx) / sum;
}

/* Phi-3.5-MoE's sparsemixer at inference: two experts, each the argmax of
 * the logits still in play, weighted by its softmax probability over the
 * logits within 2*jitter (relative) of it. */
static void route_sparsemixer(const mx_router *rt, const float *logits, int n, mx_route *r)
{
    float cur[4096], masked[4096];
    memcpy(cur, logits, sizeof(float) * (size_t)n);
    for (int j = 0; j < r->k; j++) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (cur[i] > cur[best])
                best = i;
        const float mx = cur[best];
        for (int i = 0; i < n; i++) {
            /* the factor reads the original logits, as transformers does */
            const float factor = fabsf(logits[i]) > mx ? fabsf(logits[i]) : mx;
            masked[i] = (mx - logits[i]) / factor > 2.0f * rt->jitter ? -INFINITY : cur[i];
        }
        r->idx[j] = best;
        r->w[j] = softmax_at(masked, n, best);
        cur[best] = -INFINITY;
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
    case MX_ROUTER_SIGMOID: route_sigmoid(rt, logits, n, out); break;
    case MX_ROUTER_SPARSEMIXER: route_sparsemixer(rt, logits, n, out); break;
    }
    if (rt->expert_scale)
        for (int j = 0; j < out->k; j++)
            out->w[j] *= rt->expert_scale[out->idx[j]];
}
