/* moe.h - the feed-forward block of a mixture-of-experts layer.
 *
 *   logits = router(x)                              [E]   (the model)
 *   route  = the router's rule: k experts and weights     (router.c)
 *   y = sum_k w_k * down_k(silu(gate_k x) * up_k x)
 *       + sum_m v_m * mlp_m(x)                           (shared expert, dense MLP)
 *
 * The expert sum of T tokens is described once, as a job (which experts run
 * on which tokens with which weights), and computed by one of two paths:
 *   fused   one token: the gate/up rows of all its experts split evenly over
 *           the threads with silu(g)*u in the epilogue, then the output rows
 *           split evenly with the weights folded in (fused.c)
 *   gather  any number of tokens: (token, expert) pairs grouped by expert,
 *           each selected expert's weights streamed once for all its tokens
 *           (gather.c).  The proven baseline: prefill, batched decode, and
 *           whatever fused declines.
 * Which path runs is decided in one function, mx_moe_choose (dispatch.c),
 * which also owns the environment switches and the dispatch statistics.
 *
 * Both paths run inside the caller's OpenMP parallel region: every thread
 * of the team calls them (the model's forward pass is one region per
 * call).  mx_moe_fused / mx_moe_gather below wrap them in a region of
 * their own for tests and benchmarks. */
#ifndef MX_MOE_H
#define MX_MOE_H

#include <stdint.h>

#include "quant/quant.h"
#include "util/parallel.h"
#include "util/scratch.h"

#define MX_MAX_TOPK 64
/* MLPs besides the routed experts in one block (a shared expert, a dense
 * MLP running beside the experts). */
#define MX_MOE_MAX_EXTRA 2

/* The gate's activation of a gated MLP: down(act(gate x) * up x). */
typedef enum mx_act {
    MX_ACT_SILU,       /* x * sigmoid(x) (SwiGLU: most families) */
    MX_ACT_GELU_TANH,  /* GELU, tanh approximation (GeGLU: Gemma) */
} mx_act;

/* A gated MLP: down(act(gate x) * up x).  Gate/up [ff, d], down [d, ff]. */
typedef struct mx_mlp {
    mx_linear gate, up, down;
} mx_mlp;

/* The routed experts of one layer (views into the checkpoint). */
typedef struct mx_experts {
    int n;                         /* number of experts */
    int64_t d_model, d_ff;         /* x width, expert width */
    mx_linear *gate, *up, *down;   /* [n] each: gate/up [d_ff, d_model], down [d_model, d_ff] */
    int stacked;                   /* 1: views into one stacked tensor; 0: per expert */
} mx_experts;

/* One token's choice: k experts and their weights, in the order the router
 * ranked them. */
typedef struct mx_route {
    int k;
    int idx[MX_MAX_TOPK];
    float w[MX_MAX_TOPK];
} mx_route;

/* ---- routing (router.c): logits in, a route out --------------------------- */

typedef enum mx_router_kind {
    /* softmax over all experts, top-k (ties to the lower index, as
     * torch.topk), renormalised when norm_topk (Qwen, Mixtral, OLMoE) */
    MX_ROUTER_SOFTMAX_TOPK,
    /* s = sigmoid(logits); experts chosen on s + bias (bias may be NULL),
     * within the topk_group best of n_group groups (each scored by the sum
     * of its two best) when n_group > 1, the others' choice scores set to 0
     * as DeepSeek-V3 does; weights are the unbiased s of the chosen,
     * divided by (their sum + norm_eps) when norm_topk, times scale
     * (dots1, MiniMax-M2, LFM2) */
    MX_ROUTER_SIGMOID,
    /* Phi-3.5-MoE's sparsemixer (inference form, k = 2): expert 1 is the
     * argmax; every logit whose gap to the max, relative to
     * max(|logit|, max), exceeds 2 * jitter is masked, and the weight is
     * expert 1's softmax probability over the rest; expert 2 the same
     * among the others. The weights do not sum to 1. */
    MX_ROUTER_SPARSEMIXER,
} mx_router_kind;

/* A layer's routing rule, as the family and config set it. */
typedef struct mx_router {
    mx_router_kind kind;
    int k;                         /* experts per token */
    int norm_topk;                 /* renormalise the k weights */
    int n_group, topk_group;       /* sigmoid: group-limited choice when n_group > 1 */
    float scale;                   /* sigmoid: routed_scaling_factor (1 when absent) */
    float norm_eps;                /* sigmoid: added to the sum when renormalising */
    float jitter;                  /* sparsemixer: router_jitter_noise */
    const float *bias;             /* sigmoid: [E] choice bias (e_score_correction_bias), or NULL */
    const float *expert_scale;     /* [E] each chosen expert's weight times this (Gemma 4), or NULL */
} mx_router;

/* Routes one token from its router logits[n]. */
void mx_moe_route(const mx_router *rt, const float *logits, int n, mx_route *out);

/* ---- the job --------------------------------------------------------------- */

/* What one block computes for T tokens x [T, d_model]:
 *   out[t] = sum_j routes[t].w[j] * expert_{routes[t].idx[j]}(x_t)
 *          + sum_m extra_w[m][t] * extra[m](x_t)
 * with every path; out [T, d_model] is overwritten. */
typedef struct mx_moe_job {
    const mx_experts *ex;          /* routed experts; NULL for a dense layer */
    const mx_route *routes;        /* [T] (when ex) */
    int n_extra;
    const mx_mlp *extra[MX_MOE_MAX_EXTRA];
    const float *extra_w[MX_MOE_MAX_EXTRA];   /* [T] weight per token; NULL: 1 */
    mx_act act;                    /* the gates' activation (SiLU unless set) */
    const float *x;
    int64_t T, d_model;
    float *out;
    /* When not NULL, out is left alone and every (token, slot) output goes
     * here unweighted, [P, d_model] in job order: token 0's routed experts
     * as its route lists them, then its extras, then token 1's ...  For a
     * caller that sums the slots itself: the ranks of expert parallelism
     * (src/dist) each run a share of a token's experts and rank 0 adds them
     * up in this order, as out would have been summed. */
    float *slots;
} mx_moe_job;

/* ---- dispatch (dispatch.c): the one decision, the switches, the counts ---- */

typedef enum mx_moe_path { MX_MOE_GATHER, MX_MOE_FUSED } mx_moe_path;

/* The path for a job: fused when it is one token, the fused path is enabled
 * (MLXCEL_FUSED_MOE), every expert's width is within MLXCEL_FUSED_MOE_MAX_DFF
 * and the fused kernel takes the weights (mx_moe_fused_takes); gather
 * otherwise.  A pure function of the job and the switches, so every thread
 * of a team reaches the same answer.  *why (may be NULL) gets the reason
 * fused was not chosen, or NULL. */
mx_moe_path mx_moe_choose(const mx_moe_job *j, const char **why);

/* The switches, read from the environment once (not per layer):
 * MLXCEL_FUSED_MOE (on unless 0/false/off/no, any case) and
 * MLXCEL_FUSED_MOE_MAX_DFF.  Tests and `bench --compare-fused` override the
 * first with mx_moe_set_fused (-1 restores the environment's choice);
 * mx_moe_env_reload makes the next call read the environment again. */
int mx_moe_fused_enabled(void);
void mx_moe_set_fused(int on);
int64_t mx_moe_fused_max_dff(void);
void mx_moe_env_reload(void);

/* Dispatch statistics: MoE-block executions on each path (dense layers are
 * not counted), counted by the code that ran them.  Printed by
 * MLXCEL_TRACE_MOE=1 / --stats as `moe-dispatch fused=N gather=M`. */
typedef struct mx_moe_stats {
    long fused, gather;
} mx_moe_stats;
void mx_moe_stats_get(mx_moe_stats *s);
void mx_moe_stats_reset(void);
void mx_moe_count(mx_moe_path path, long n);

/* ---- the fused path (fused.c) ---------------------------------------------- */

/* NULL when the fused kernel takes these weights (all quantized: it exists
 * to stream packed experts), else why not. */
const char *mx_moe_fused_takes(const mx_linear *gate, const mx_linear *up, const mx_linear *down);

/* One token's experts as the fused kernel runs them: the routed ones and
 * the extra MLPs, each with its weight. */
typedef struct mx_moe_plan {
    int n;
    const mx_linear *gate[MX_MAX_TOPK + MX_MOE_MAX_EXTRA];
    const mx_linear *up[MX_MAX_TOPK + MX_MOE_MAX_EXTRA];
    const mx_linear *down[MX_MAX_TOPK + MX_MOE_MAX_EXTRA];
    float w[MX_MAX_TOPK + MX_MOE_MAX_EXTRA];
    int64_t off[MX_MAX_TOPK + MX_MOE_MAX_EXTRA + 1];   /* expert j's rows of h: [off[j], off[j+1]) */
    int64_t d_model;
    mx_act act;
    float *slots;   /* the job's slots: expert j's output unweighted at slots + j * d_model */
} mx_moe_plan;

/* The plan of a one-token job. */
void mx_moe_plan_of(mx_moe_plan *p, const mx_moe_job *j);
/* Bytes of the buffers the fused path needs for plan p with nth threads:
 * h and u shared (off[n] floats each), then each thread's phase-2
 * scratch (x comes prepared in the caller's mx_vec). */
size_t mx_moe_fused_bytes(const mx_moe_plan *p, int nth);
/* The largest mx_moe_fused_bytes any one-token job of these weights can
 * need (k routed experts of width d_ff plus the extras). */
size_t mx_moe_fused_bytes_max(int64_t d_model, int k, int64_t d_ff, const int64_t *extra_ff,
                              int n_extra, int nth);

/* Runs plan p on the calling thread's share; every thread of the team
 * calls it with the same plan (each may hold its own copy), its own x
 * (the same values), and the same buf of mx_moe_fused_bytes(p, nth) bytes.
 * out [d_model] (or the plan's slots) is shared and complete when every
 * thread has returned (the function ends with a barrier).  team: the run's
 * team (joined by every thread; its size is the thread count), ith this
 * thread's index. */
void mx_moe_fused_team(const mx_moe_plan *p, mx_vec *x, void *buf, float *out, mx_team *team,
                       int ith);

/* ---- the gather path (gather.c) -------------------------------------------- */

/* State the threads of a team share while they run one gather job; the
 * caller provides it (shared, e.g. static or in the model) and the arena
 * the job's buffers are carved from. */
typedef struct mx_moe_gather_state mx_moe_gather_state;
mx_moe_gather_state *mx_moe_gather_state_new(void);
void mx_moe_gather_state_free(mx_moe_gather_state *s);

/* Runs the job; every thread of the team calls it with the same job, state
 * and arena.  Returns MX_OK or MX_ENOMEM (e set on the thread that found
 * it; every thread returns the same code).  Ends with a barrier; team is
 * the run's (joined by every thread), ith this thread's index. */
int mx_moe_gather_team(const mx_moe_job *j, mx_moe_gather_state *st, mx_arena *arena,
                       mx_team *team, int ith, mx_err *e);

/* ---- standalone (own parallel region; tests, benchmarks) ------------------ */

/* One token through the fused path: out[d_model] = sum_k w_k expert_k(x). */
int mx_moe_fused(const mx_experts *ex, const mx_route *r, const float *x, float *out, mx_err *e);
/* T tokens through the gather path. */
int mx_moe_gather(const mx_experts *ex, const mx_route *routes, const float *x, int64_t T,
                  float *out, mx_err *e);
/* Any job through the path mx_moe_choose picks, counted in the statistics
 * when the job has routed experts. */
int mx_moe_run(const mx_moe_job *j, mx_err *e);

/* silu(x) = x * sigmoid(x), as torch computes it in float32. */
static inline float mx_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

/* GELU with the tanh approximation, as torch's gelu(approximate="tanh"). */
static inline float mx_gelu_tanh(float x)
{
    const float k = 0.7978845608028654f;   /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + __builtin_tanhf(k * (x + 0.044715f * x * x * x)));
}

/* act(g) * u, the gated MLP's hidden value. */
static inline float mx_glu(mx_act act, float g, float u)
{
    return (act == MX_ACT_GELU_TANH ? mx_gelu_tanh(g) : mx_silu(g)) * u;
}

#endif
