/* family.h - model families as data plus small hooks.
 *
 * Everything that differs between families is here: config defaults and
 * key aliases, tensor names, the attention and routing variants the shared
 * forward pass selects, and the synth presets with the real models' shapes.
 * The forward pass (forward.c), the loader (load.c) and synth read only
 * this table, so no family name and no tensor-name literal appears outside
 * family.c and the family_*.c files.
 *
 * Adding a family = one family_*.c file defining an mx_family + one row in
 * the table in family.c (docs/architecture.md has the checklist). */
#ifndef MX_FAMILY_H
#define MX_FAMILY_H

#include "format/config.h"
#include "moe/moe.h"

struct cJSON;

/* Where q_norm / k_norm apply. */
typedef enum mx_qk_norm {
    MX_QK_NORM_NONE,
    MX_QK_NORM_HEAD,   /* RMSNorm over each head's head_dim (Qwen3) */
    MX_QK_NORM_FULL,   /* RMSNorm over the whole q / k projection, before the head split (OLMoE) */
} mx_qk_norm;

/* The normalisation of the residual stream. */
typedef enum mx_norm_kind {
    MX_NORM_RMS,       /* RMSNorm with a weight */
    MX_NORM_LAYER,     /* LayerNorm with weight and bias (Phi-3.5-MoE) */
} mx_norm_kind;

/* How a family's checkpoints store the router (mlx-lm's choice). */
typedef enum mx_router_store {
    MX_ROUTER_8BIT,          /* 8 bits, group 64: the model's quant_predicate (most MoE families) */
    MX_ROUTER_DEFAULT_BITS,  /* the checkpoint's default bits: no quant_predicate (Phi-3.5-MoE) */
    MX_ROUTER_FLOAT,         /* not quantized: a bare parameter, not a Linear (dots1) */
} mx_router_store;

/* Experts every token runs beside the routed ones. */
typedef enum mx_shared_kind {
    MX_SHARED_NONE,
    MX_SHARED_GATED,   /* weighted by sigmoid(shared_gate x) (Qwen2-MoE) */
    MX_SHARED_PLAIN,   /* weight 1; width moe_intermediate * n_shared_experts (dots1) */
} mx_shared_kind;

/* How a family names its tensors.  Each field is one path component (or a
 * printf template where noted); a NULL field takes the default in
 * parentheses, the names transformers' Llama-style models use. */
typedef struct mx_names {
    const char *model;             /* prefix of everything but lm_head ("model") */
    const char *embed;             /* ("embed_tokens") */
    const char *final_norm;        /* ("norm") */
    const char *lm_head;           /* ("lm_head") */
    const char *layer;             /* template with the layer index ("layers.%d") */
    const char *attn_norm;         /* attention's input norm ("input_layernorm") */
    const char *ffn_norm;          /* feed-forward's input norm ("post_attention_layernorm") */
    const char *attn_out_norm;     /* a norm of attention's output before the residual add (none) */
    const char *ffn_out_norm;      /* a norm of the feed-forward's output (none) */
    const char *mlp_out_norm;      /* parallel layers: the dense branch's output norm (none) */
    const char *moe_in_norm;       /* parallel layers: the experts' input norm (none) */
    const char *moe_out_norm;      /* parallel layers: the experts' output norm (none) */
    const char *layer_scalar;      /* [1]: the layer's output times this (none) */
    const char *attn;              /* ("self_attn") */
    const char *attn_proj[4];      /* q, k, v, o ("q_proj", "k_proj", "v_proj", "o_proj") */
    const char *qk_norm[2];        /* ("q_norm", "k_norm") */
    const char *mlp;               /* a dense layer's MLP ("mlp") */
    const char *moe;               /* an MoE layer's block ("mlp"; "" = the layer itself) */
    const char *router;            /* in the block ("gate") */
    const char *router_bias;       /* the router's choice bias, in the block (none) */
    const char *router_scale;      /* [d]: the router reads rmsnorm(x) * this / sqrt(d) (none) */
    const char *expert_scale;      /* [E]: a chosen expert's weight times this (none) */
    const char *stacked;           /* experts stacked [E, out, in] ("switch_mlp") */
    const char *stacked_proj[3];   /* its gate, up, down ("gate_proj", "up_proj", "down_proj") */
    const char *per_expert;        /* template with the expert index ("experts.%d") */
    const char *expert_proj[3];    /* gate, up, down of one expert (as stacked_proj) */
    const char *mlp_proj[3];       /* gate, up, down of an MLP / shared expert (same defaults) */
    const char *shared;            /* the shared expert ("shared_expert") */
    const char *shared_gate;       /* its sigmoid gate ("shared_expert_gate") */
    /* linear-attention layers (layer_types "linear_attention"): the block
     * ("linear_attn") and its tensors */
    const char *deltanet;
    const char *dn_qkvz, *dn_ba, *dn_conv, *dn_a_log, *dn_dt_bias, *dn_norm, *dn_out;
    /* short-convolution layers (layer_types "conv"): the block ("conv") and
     * its tensors */
    const char *shortconv;
    const char *sc_in, *sc_conv, *sc_out;
} mx_names;

/* A published architecture's shape, for `mlxcel synth`. */
typedef struct mx_preset {
    const char *name;
    const char *about;             /* one line for --help */
    int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;
    int experts, top_k, moe_intermediate, shared_intermediate;   /* 0: no shared expert */
    double rope_theta, rms_eps;
    int qkv_bias, norm_topk_prob, tied;
    int max_position;
    mx_dtype dtype;                /* torch_dtype: norms, biases, default scales */
    int stacked;                   /* default expert layout: 1 stacked, 0 per expert */
    int chatml_specials;           /* 1: <|endoftext|> <|im_start|> <|im_end|>; 0: <s> </s> */
    int qwen_tokenizer;            /* 1: NFC + the Qwen2 split; 0: GPT-2 byte level */
    /* beyond the common shape (0: the model has no such thing); the
     * family's synth_config writes them as its config.json spells them */
    int first_dense;               /* first_k_dense_replace: the first layers are dense MLPs */
    int n_group, topk_group;       /* group-limited routing */
    double routed_scale;           /* routed_scaling_factor */
    int o_bias, lm_head_bias;      /* o_proj / lm_head carry a bias (q/k/v: qkv_bias) */
    double partial_rotary;         /* share of each head's dimensions rotated (0: all) */
    int sliding_window;            /* sliding-window attention of this many positions */
    int full_every;                /* with a window: every full_every-th layer (and the last)
                                      attends to everything */
    int global_head_dim, global_kv_heads;   /* full-attention layers' head size and kv heads
                                               (K = V: no v projection) */
    /* hybrids: each layer's token mixer, one letter per layer, the string
     * repeated over the layers ('A' attention, 'D' gated DeltaNet, 'C' short
     * convolution, as `mlxcel inspect` prints them); NULL: attention only */
    const char *mixers;
    int linear_k_heads, linear_v_heads, linear_head_dim;   /* DeltaNet heads (k and v dims equal) */
    int conv_kernel;               /* DeltaNet's or the short convolution's kernel length */
    int dense_layers;              /* num_dense_layers (LFM2): the first layers are dense MLPs */
} mx_preset;

/* Layer l's mixer letter of a preset ('A' without a mixers string). */
static inline char mx_preset_mixer(const mx_preset *p, int l)
{
    if (!p->mixers || !p->mixers[0])
        return 'A';
    size_t n = 0;
    while (p->mixers[n])
        n++;
    return p->mixers[(size_t)l % n];
}

struct mx_family {
    const char *model_type;
    const char *architecture;      /* config.json architectures[0] */
    /* Fills the fields config.json left unset with HF transformers'
     * defaults for this family. */
    void (*apply_defaults)(mx_config *c);
    const mx_config_alias *aliases;   /* NULL-terminated; may be NULL */
    mx_names names;
    /* variants the shared forward pass selects */
    mx_norm_kind norm;
    mx_qk_norm qk_norm;
    mx_router_kind router;
    float router_norm_eps;         /* sigmoid routers: added to the sum when renormalising */
    mx_shared_kind shared_expert;  /* may have a shared expert, of this kind */
    mx_router_store router_store;  /* how checkpoints store the router (synth, inspect) */
    int parallel_dense;            /* MoE layers also run a dense MLP beside the experts,
                                      each branch with its own norms (Gemma 4) */
    int v_norm;                    /* v heads get a weightless RMSNorm (Gemma 4) */
    float attn_scale;              /* attention's score scale (0: head_dim^-0.5) */
    int embed_scale;               /* embeddings times sqrt(hidden) (Gemma) */
    int attn_out_gate;             /* q_proj also gives a sigmoid gate of each head's output (Qwen3-Next) */
    /* synth: presets (NULL-terminated by name) and the family's own
     * config.json keys */
    const mx_preset *presets;
    void (*synth_config)(const mx_preset *p, struct cJSON *config);
};
typedef struct mx_family mx_family;

/* The family for a model_type (names resolved: no NULL field), or NULL. */
const mx_family *mx_family_find(const char *model_type);
/* The supported model types, comma separated ("qwen2_moe, qwen3_moe, ..."). */
const char *mx_family_list(void);
/* The i-th family of the table (names resolved), NULL past the end. */
const mx_family *mx_family_at(int i);
/* A preset by name and its family, or NULL. */
const mx_preset *mx_preset_find(const char *name, const mx_family **fam);

/* Sets v to d when it is MX_UNSET (helpers for the defaults hooks). */
static inline void mx_default_int(int *v, int d) { if (*v == MX_UNSET) *v = d; }
static inline void mx_default_dbl(double *v, double d) { if (*v < 0) *v = d; }

#endif
