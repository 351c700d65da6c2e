/* model.h - a loaded model and the forward pass.
 *
 * A token's path (forward.c, one function per block): embedding row ->
 * for each layer [RMSNorm -> attention -> residual -> RMSNorm -> MoE
 * experts or dense MLP -> residual] -> final RMSNorm -> lm_head -> logits.
 * The same code runs a one-token decode step, a prompt and a batched decode
 * step of several sequences.
 *
 * Weights are views into the mmap'ed safetensors (see load.c); only norm
 * weights and biases are converted to f32 at load.  A sequence's state (KV
 * cache and position) lives in its own mx_seq so several sequences can be
 * decoded side by side.  One forward call runs at a time per model (the
 * model owns the scratch arenas). */
#ifndef MX_MODEL_H
#define MX_MODEL_H

#include <stdint.h>

#include "format/config.h"
#include "format/safetensors.h"
#include "model/family.h"
#include "moe/moe.h"
#include "quant/quant.h"
#include "util/parallel.h"
#include "util/scratch.h"

/* A normalisation of the residual stream: RMSNorm (b NULL) or, for
 * families whose table says so, LayerNorm with a bias.  [d] each, f32. */
typedef struct mx_norm {
    const float *w, *b;
} mx_norm;

/* Rotary embedding as a layer applies it: the first `dims` values of each
 * head (all of them, or a partial rotary factor's share) rotated in
 * rotate-half pairs (i, i + dims/2) by position * inv_freq[i], with cos and
 * sin scaled by mscale.  LongRoPE (Phi-3.5) has a second set of
 * frequencies and scale for calls reaching past orig_max positions. */
typedef struct mx_rope {
    int dims;
    float *inv_freq;             /* [dims/2] */
    float mscale;
    float *inv_freq_long;        /* [dims/2] LongRoPE's long factors, else NULL */
    float mscale_long;
    int orig_max;
} mx_rope;

#define MX_MAX_ROPES 2

/* One layer's attention and its geometry (the same in every layer for most
 * families). */
typedef struct mx_attn {
    mx_linear q, k, v, o;        /* q [nh*hd, d], k/v [nkv*hd, d], o [d, nh*hd] */
    float *q_norm, *k_norm;      /* [hd] per-head or [nh*hd]/[nkv*hd] full width; NULL if none */
    int n_heads, n_kv, head_dim, q_dim, kv_dim;
    int rope;                    /* index into the model's ropes */
    int window;                  /* attends to the last `window` positions (0: all) */
    int k_eq_v;                  /* no v projection: v is the raw k projection (Gemma 4 full layers) */
    int out_gate;                /* q_proj also gives a gate per head: out * sigmoid(gate) (Qwen3-Next) */
    int v_norm;                  /* v heads get a weightless RMSNorm */
    float scale;                 /* the scores' scale */
} mx_attn;

/* A gated DeltaNet layer (Qwen3-Next's linear attention): per key head,
 * in_proj_qkvz gives [q dk | k dk | v r*dv | z r*dv] and in_proj_ba
 * [b r | a r] (r = nv / nk value heads per key head); q, k, v go through a
 * depthwise causal convolution + SiLU; q and k are L2-normalised; each
 * value head keeps a dk x dv state S updated per token by the gated delta
 * rule S = S * exp(g); S += k (beta (v - S^T k))^T, out = S^T q / sqrt(dk);
 * the output is rmsnorm(out) * norm * silu(z), then out_proj. */
typedef struct mx_deltanet {
    mx_linear qkvz, ba, out;     /* [2*nk*dk + 2*nv*dv, d], [2*nv, d], [d, nv*dv] */
    float *conv_w;               /* [conv_dim][K] (conv_dim = 2*nk*dk + nv*dv) */
    float *A_log, *dt_bias;      /* [nv] */
    float *norm_w;               /* [dv] the gated RMSNorm's weight */
    int nk, nv, dk, dv, K, conv_dim;
} mx_deltanet;

/* A short-convolution layer (LFM2): in_proj gives B, C, x (d each); out =
 * out_proj(C * conv(B * x)) with a depthwise causal convolution of L taps. */
typedef struct mx_shortconv {
    mx_linear in, out;           /* [3d, d], [d, d] */
    float *conv_w;               /* [d][L] */
    float *conv_b;               /* [d] or NULL */
    int L;
} mx_shortconv;

/* What mixes the tokens of a layer. */
typedef enum mx_mixer { MX_MIXER_ATTENTION, MX_MIXER_DELTANET, MX_MIXER_SHORTCONV } mx_mixer;

typedef struct mx_moe_block {
    mx_linear router;            /* [E, d] */
    mx_router rule;              /* how its logits become a route */
    mx_experts experts;
    int has_shared;
    mx_mlp shared;               /* shared experts every token runs */
    int shared_gated;            /* 1: weighted by sigmoid(shared_gate x) (Qwen2-MoE); 0: by 1 */
    mx_linear shared_gate;       /* [1, d] when gated */
    float *router_in_scale;      /* [d] Gemma 4: the router reads rmsnorm(x) * this / sqrt(d); else NULL */
    uint64_t expert_bytes;       /* one routed expert's weights (its three matrices, scales, biases) */
    const unsigned char *bound;  /* [n experts] which experts this process bound (a slice of the
                                    experts: mx_model_load_opts); NULL: all */
} mx_moe_block;

typedef struct mx_layer {
    mx_norm attn_norm, ffn_norm; /* the inputs of the mixer (attention ...) and the feed-forward */
    mx_mixer mixer;
    mx_deltanet dn;              /* when mixer is DELTANET */
    mx_shortconv sc;             /* when mixer is SHORTCONV */
    mx_norm attn_out_norm;       /* attention's output before the residual add (w NULL: none) */
    mx_norm ffn_out_norm;        /* the feed-forward's output (w NULL: none) */
    /* parallel layers (Gemma 4): MoE and the dense MLP on the same stream,
     * out = ffn_out_norm(mlp_out_norm(mlp(ffn_norm x)) + moe_out_norm(moe(moe_in_norm x))) */
    int parallel;
    mx_norm mlp_out_norm, moe_in_norm, moe_out_norm;
    float scalar;                /* the layer's output times this (1 for most families) */
    mx_attn attn;
    int is_moe;
    mx_mlp mlp;                  /* when !is_moe, or parallel */
    mx_moe_block moe;            /* when is_moe */
} mx_layer;

struct mx_seq;
struct mx_forward_trace;
struct mx_wcache;

/* Another device that runs the forward pass of a model (src/cuda): when a
 * model has one, mx_forward / mx_forward_batch check their arguments and
 * hand the call to it; a sequence's state on the device hangs off
 * mx_seq.dev and is freed through seq_free. */
typedef struct mx_backend {
    const char *name;
    int (*forward)(void *ctx, struct mx_seq *s, const int32_t *tokens, int n, float *logits,
                   const struct mx_forward_trace *trace, mx_err *e);
    /* n greedy steps from token `first` at s->pos (mx_decode_greedy: the
     * arguments checked, the position not yet advanced); ids[i] the argmax
     * after step i.  NULL, or -1 returned: the caller steps through
     * forward. */
    int (*greedy)(void *ctx, struct mx_seq *s, int32_t first, int n, int32_t *ids, mx_err *e);
    void (*seq_free)(void *ctx, struct mx_seq *s);
    void (*free)(void *ctx);
    /* One decode step of n sequences, token i appended to seqs[i] at its
     * position, logits [n][vocab] (arguments checked, positions not yet
     * advanced).  NULL: mx_forward_batch calls forward once per sequence. */
    int (*forward_batch)(void *ctx, struct mx_seq *const *seqs, const int32_t *tokens, int n,
                         float *logits, mx_err *e);
} mx_backend;
/* Where the routed experts of a job run when not all of them are in this
 * process (expert parallelism over MPI, src/dist).  The forward pass hands
 * every job with routed experts to run(), on every thread of its team as it
 * would call the paths, with the path mx_moe_choose picked, the calling
 * thread's prepared x (the fused path's), the pass's fused buffer, the
 * pass's team (util/parallel.h: its barrier and dynamic loops) and the
 * thread's index in it; run() leaves job->out as that path would and
 * returns the same code on every thread. */
typedef struct mx_moe_remote mx_moe_remote;
struct mx_moe_remote {
    int (*run)(mx_moe_remote *r, const mx_moe_job *job, mx_moe_path path, mx_vec *x,
               void *fused_buf, mx_team *team, int ith, mx_err *e);
    void (*release)(mx_moe_remote *r);   /* by mx_model_free */
};

typedef struct mx_model {
    mx_config cfg;               /* with the family's defaults applied */
    const mx_family *fam;
    char *dir;
    mx_st_set *st;               /* the mmap'ed weights */
    /* dimensions, derived once (a layer's own attention geometry is in
     * its mx_attn; these are the config's) */
    int d, n_layers, n_heads, n_kv, head_dim, vocab, q_dim, kv_dim;
    int n_experts, top_k, norm_topk;
    float eps;
    mx_act act;                  /* the MLPs' gate activation */
    float embed_scale;           /* embeddings times this (1, or sqrt(d) for Gemma) */
    float softcap;               /* logits = tanh(z / softcap) * softcap when > 0 */
    mx_rope ropes[MX_MAX_ROPES];
    int n_ropes;
    mx_linear embed;             /* [vocab, d] */
    mx_layer *layers;            /* [n_layers] */
    mx_norm final_norm;
    mx_linear lm_head;           /* [vocab, d]; a copy of embed when tied */
    int tied;
    /* allocations to free */
    void **owned;
    int n_owned, cap_owned;
    /* scratch of a forward call: the pass's activations, and the gather
     * path's buffers and state (util/scratch.h) */
    mx_arena arena, moe_arena;
    mx_moe_gather_state *gather;
    /* the device the forward pass runs on (NULL: this CPU) */
    const mx_backend *backend;
    void *backend_ctx;
    mx_moe_remote *remote;       /* NULL: every routed expert runs in this process */
    int experts_only;            /* only routed experts were bound (mx_model_load_opts) */
    /* one-token calls of a small model: the whole team or one thread, by
     * measurement (util/parallel.h); tune_on: 0 not decided yet, 1, -1 */
    mx_tuner tune;
    int tune_on;
    /* the repacked forms of the quantized matrices (src/wcache: a cache
     * file or memory, as MLXCEL_REPACK / --repack say); never NULL after a
     * load, its info says what was used */
    struct mx_wcache *wcache;
} mx_model;

/* Loads DIR (config.json, generation_config.json, safetensors), through
 * the loader mx_model_set_loader set, if any. */
int mx_model_load(const char *dir, mx_model **out, mx_err *e);

/* How much of a checkpoint one process takes: expert parallelism
 * (src/dist) gives each rank a share of the routed experts. */
typedef struct mx_model_load_opts {
    /* Called once every layer is read and its experts sized
     * (mx_moe_block.expert_bytes) but before any expert is bound: clears in
     * owned [n_layers][n_experts] (all 1 on entry) the experts this process
     * leaves to others.  NULL: all experts. */
    int (*slice)(void *ctx, const mx_model *m, unsigned char *owned, mx_err *e);
    void *ctx;
    /* Bind the routed experts alone (a rank that runs nothing else): no
     * attention, embeddings, norms, routers, shared experts or lm_head;
     * such a model cannot run a forward pass. */
    int experts_only;
    /* Map each tensor when it is bound, and a stack of experts only over
     * the experts bound, instead of whole files: the process's address
     * space holds its share alone (ulimit -v). */
    int lazy;
} mx_model_load_opts;

/* mx_model_load with options (o may be NULL), never through a loader. */
int mx_model_load_ex(const char *dir, const mx_model_load_opts *o, mx_model **out, mx_err *e);

/* Routes this process's mx_model_load calls through fn (NULL: the plain
 * loader): a rank of expert parallelism loads its share and connects the
 * model to the other ranks (src/dist). */
typedef int (*mx_model_loader)(const char *dir, mx_model **out, mx_err *e);
void mx_model_set_loader(mx_model_loader fn);
void mx_model_free(mx_model *m);

/* Calls fn on every quantized linear layer with weights bound (attention,
 * mixers, MLPs, routers, shared and bound routed experts, lm_head; not the
 * embedding, which is read a row at a time) (repack.c). */
void mx_model_each_qlinear(mx_model *m, void (*fn)(mx_linear *l, void *ctx), void *ctx);
/* The weight cache of a loaded model: whether a valid cache file exists
 * for it, without building one (mlxcel inspect).  MX_OK or MX_ENOMEM. */
struct mx_wcache_info;
int mx_model_wcache_probe(mx_model *m, struct mx_wcache_info *info, mx_err *e);

/* Bytes of weights one decoded token streams (attention, router, k experts,
 * shared expert, dense MLPs, lm_head, one embedding row). */
uint64_t mx_model_active_bytes(const mx_model *m);
/* Bytes of all tensors in the checkpoint; parameter count (dequantized). */
uint64_t mx_model_weight_bytes(const mx_model *m);
uint64_t mx_model_param_count(const mx_model *m);
/* KV cache bytes for n_ctx tokens. */
uint64_t mx_model_kv_bytes(const mx_model *m, int n_ctx);

/* A sequence: its position and, per layer, what it remembers of the tokens
 * so far: a KV cache (attention layers) or a recurrent state (convolution
 * windows, DeltaNet matrices).  A recurrent state cannot be rewound, so a
 * sequence with one can only go back to position 0 (mx_seq_rewind). */
typedef struct mx_seq {
    const mx_model *m;
    int n_ctx, pos;
    float *k, *v;                /* per layer l, at kv_off[l]: [n_kv][n_ctx][head_dim] of that layer */
    size_t *kv_off;              /* [n_layers] offsets into k and v, in floats */
    float *state;                /* per layer l, at state_off[l]: its recurrent state */
    size_t *state_off;           /* [n_layers + 1] offsets into state, in floats */
    void *dev;                   /* the backend's state of this sequence (its KV cache), or NULL */
} mx_seq;

int mx_seq_new(const mx_model *m, int n_ctx, mx_seq **out, mx_err *e);
void mx_seq_free(mx_seq *s);
/* Back to position 0 (the recurrent state cleared). */
void mx_seq_reset(mx_seq *s);
/* Keeps the first `pos` tokens (pos <= s->pos) and returns how many were
 * kept: pos for a model of attention layers alone, else pos only when it
 * is the current position (nothing to undo) and 0 otherwise (the state is
 * cleared: the caller feeds the tokens again). */
int mx_seq_rewind(mx_seq *s, int pos);
/* Floats of recurrent state one sequence of this model keeps (0 for
 * attention-only models). */
size_t mx_model_state_floats(const mx_model *m);

/* Hands the model's forward pass to a backend (NULL: back to the CPU;
 * the previous backend is freed).  Sequences made before keep no device
 * state until their next call. */
void mx_model_set_backend(mx_model *m, const mx_backend *b, void *ctx);

/* Optional outputs of a forward call, for tests and tools. */
typedef struct mx_forward_trace {
    float *hidden;        /* [(layers+1), T, d]: [0] embeddings, [i] after layer i,
                             the last with the final norm applied */
    float *router_logits; /* [layers, T, E] (MoE layers only are written) */
    float *all_logits;    /* [T, vocab] */
} mx_forward_trace;

/* Runs tokens[n] at positions s->pos .. s->pos+n-1, appending to the KV
 * cache.  logits (may be NULL) gets the last token's logits [vocab].  An id
 * outside the vocabulary or running past n_ctx is an error (MX_ERANGE) and
 * leaves the sequence unchanged. */
int mx_forward(mx_model *m, mx_seq *s, const int32_t *tokens, int n, float *logits,
               const mx_forward_trace *trace, mx_err *e);

/* One decode step for n different sequences at once: token i is appended
 * to seqs[i] at its position.  The weights are streamed once for all of
 * them (the MoE block takes the gather path); logits gets [n, vocab]. */
int mx_forward_batch(mx_model *m, mx_seq *const *seqs, const int32_t *tokens, int n, float *logits,
                     mx_err *e);

#endif
