/* moe.h - mixture-of-experts block: router, gather path, fused decode path.
 *
 *   logits = router(x)                       [E]
 *   p = softmax(logits); top-k; renormalise when norm_topk_prob
 *   y = sum_k p_k * down_k(silu(gate_k x) * up_k x)
 *
 * Two ways to compute the expert sum:
 *   gather  any number of tokens: (token, expert) pairs grouped by expert,
 *           each selected expert's weights streamed once per batch.  The
 *           proven baseline, used for prefill and whenever fused declines.
 *   fused   one token: gate/up of the k experts with silu(g)*u folded into
 *           the epilogue, then down with the router weight folded in; all
 *           threads busy in both phases, one barrier, no allocation.
 * The shared expert (Qwen2-MoE) is added by the model, not here. */
#ifndef MX_MOE_H
#define MX_MOE_H

#include <stdint.h>

#include "quant/quant.h"

#define MX_MAX_TOPK 64

typedef struct mx_experts {
    int n;                 /* number of experts */
    int64_t d_model, d_ff; /* x width, expert width */
    mx_linear *gate, *up, *down;   /* [n] each: gate/up [d_ff, d_model], down [d_model, d_ff] */
    int stacked;           /* 1: views into one stacked tensor; 0: per expert */
} mx_experts;

typedef struct mx_route {
    int k;
    int idx[MX_MAX_TOPK];
    float w[MX_MAX_TOPK];
} mx_route;

/* Softmax over logits[n], top-k (descending, lower index first on ties, as
 * torch.topk), renormalised when norm_topk. */
void mx_moe_route(const float *logits, int n, int k, int norm_topk, mx_route *r);

/* Why the fused path would not take this block (NULL when it would). */
const char *mx_moe_fused_declines(const mx_experts *ex);

/* Is the fused path enabled (MLXCEL_FUSED_MOE, read once; tests may
 * override with mx_moe_set_fused) and what is the largest d_ff it takes
 * (MLXCEL_FUSED_MOE_MAX_DFF). */
int mx_moe_fused_enabled(void);
void mx_moe_set_fused(int on);     /* -1 restores the environment's choice */
int64_t mx_moe_fused_max_dff(void);

/* One token: out[d_model] = sum_k w_k * expert_k(x).  Overwrites out. */
void mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out);

/* T tokens: out[T, d_model] = sum over each token's route.  Overwrites out. */
int mx_moe_gather(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                  float *out, mx_err *e);

/* Computes the expert sum for T tokens, choosing the path: fused when T == 1,
 * enabled, and mx_moe_fused_declines() is NULL; gather otherwise.  Counts
 * the choice in the dispatch statistics. */
int mx_moe_experts(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                   float *out, mx_err *e);

/* Dispatch statistics: MoE-layer executions on each path. */
typedef struct mx_moe_stats {
    long fused, gather;
} mx_moe_stats;
void mx_moe_stats_get(mx_moe_stats *s);
void mx_moe_stats_reset(void);

/* silu(x) = x * sigmoid(x), as torch computes it in float32. */
static inline float mx_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

#endif
