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

/* Is the fused path enabled (MLXCEL_FUSED_MOE; tests may override with
 * mx_moe_set_fused) and what is the largest d_ff it takes
 * (MLXCEL_FUSED_MOE_MAX_DFF).  Both variables are read once, not per layer;
 * mx_moe_env_reload makes the next call read them again. */
int mx_moe_fused_enabled(void);
void mx_moe_set_fused(int on);     /* -1 restores the environment's choice */
int64_t mx_moe_fused_max_dff(void);
void mx_moe_env_reload(void);

/* One token: out[d_model] = sum_k w_k * expert_k(x).  Overwrites out.
 * Runs the two phases below in a parallel region of its own. */
void mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out);

/* The fused kernel's two phases, for callers that run them inside their
 * own parallel region (every thread calls each phase with its (ith, nth);
 * a barrier separates them).  A plan lists the experts of one token: the
 * routed ones (mx_moe_plan_init) and any SwiGLU MLP added with its own
 * weight (the Qwen2-MoE shared expert, a dense layer). */
typedef struct mx_moe_plan {
    int n;
    const mx_linear *gate[MX_MAX_TOPK + 1], *up[MX_MAX_TOPK + 1], *down[MX_MAX_TOPK + 1];
    float w[MX_MAX_TOPK + 1];
    int64_t off[MX_MAX_TOPK + 2];   /* expert j's rows of h: [off[j], off[j+1]) */
    int64_t d_model;
} mx_moe_plan;

void mx_moe_plan_init(mx_moe_plan *p, const mx_experts *ex, const mx_route *r);
/* Adds one more SwiGLU MLP (at most MX_MAX_TOPK + 1 in all). */
void mx_moe_plan_add(mx_moe_plan *p, const mx_linear *gate, const mx_linear *up,
                     const mx_linear *down, float w);
/* Phase 1 for rows [lo, hi) of the experts' gate/up rows stacked (off[n]
 * in all): h[i] = silu(g_i) * u_i; h and u (off[n] floats) are shared by
 * the threads, x is the calling thread's own. */
void mx_moe_phase1(const mx_moe_plan *p, mx_vec *x, float *h, float *u, int64_t lo, int64_t hi);
/* Phase 2 (after every thread's phase 1) for output rows [lo, hi) of
 * d_model: out[r] = sum_j w_j down_j . h_j.  A thread sets up its own
 * prepared h_j once per block (mx_moe_phase2_init, over mx_moe_phase2_bytes
 * bytes of its own 64-byte-aligned scratch) and then runs any number of row
 * ranges; each h_j is prepared on its first use. */
typedef struct mx_moe_hvecs {
    mx_vec h[MX_MAX_TOPK + 1];
    float *row;                  /* down_j . h_j for the rows being done */
} mx_moe_hvecs;
size_t mx_moe_phase2_bytes(const mx_moe_plan *p);
void mx_moe_phase2_init(const mx_moe_plan *p, const float *h, void *scratch, mx_moe_hvecs *hv);
void mx_moe_phase2(const mx_moe_plan *p, mx_moe_hvecs *hv, float *out, int64_t lo, int64_t hi);

/* Counts n MoE-layer executions on the fused path in the dispatch
 * statistics (for callers that run the phases themselves). */
void mx_moe_count_fused(long n);

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
