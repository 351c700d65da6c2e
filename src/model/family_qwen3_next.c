/* family_qwen3_next.c - Qwen3-Next (Qwen3NextForCausalLM): gated DeltaNet
 * linear-attention layers (layer_types "linear_attention", or all but
 * every full_attention_interval-th layer) interleaved with gated full
 * attention (q_proj twice as wide: per head [q | gate], output times
 * sigmoid(gate)), per-head q/k norms, partial rotary; the MoE block is
 * Qwen2-MoE's (softmax top-k, a sigmoid-gated shared expert).  The
 * checkpoint's RMSNorm weights are stored as 1 + w (mlx-lm's sanitize), so
 * they are plain weights here; the DeltaNet output norm's weight is used as
 * is. */
#include <string.h>

#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Qwen3NextConfig defaults */
    mx_default_int(&c->vocab_size, 151936);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 5632);
    mx_default_int(&c->num_hidden_layers, 48);
    mx_default_int(&c->num_attention_heads, 16);
    mx_default_int(&c->num_key_value_heads, 2);
    mx_default_int(&c->head_dim, 256);
    mx_default_int(&c->max_position_embeddings, 32768);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 10000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->moe_intermediate_size, 512);
    mx_default_int(&c->shared_expert_intermediate_size, 512);
    mx_default_int(&c->num_experts_per_tok, 10);
    mx_default_int(&c->num_experts, 512);
    mx_default_int(&c->norm_topk_prob, 1);
    mx_default_int(&c->use_sliding_window, 0);
}

/* layer_types from the preset's mixer letters ('D' linear_attention, 'A'
 * full_attention) and the interval they repeat with. */
static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "num_experts", p->experts);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(c, "shared_expert_intermediate_size", p->shared_intermediate);
    cJSON_AddNumberToObject(c, "decoder_sparse_step", 1);
    cJSON_AddArrayToObject(c, "mlp_only_layers");
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddBoolToObject(c, "attention_bias", 0);
    cJSON_AddNumberToObject(c, "partial_rotary_factor", p->partial_rotary);
    cJSON_AddNumberToObject(c, "linear_num_key_heads", p->linear_k_heads);
    cJSON_AddNumberToObject(c, "linear_num_value_heads", p->linear_v_heads);
    cJSON_AddNumberToObject(c, "linear_key_head_dim", p->linear_head_dim);
    cJSON_AddNumberToObject(c, "linear_value_head_dim", p->linear_head_dim);
    cJSON_AddNumberToObject(c, "linear_conv_kernel_dim", p->conv_kernel);
    cJSON_AddNumberToObject(c, "full_attention_interval", (double)strlen(p->mixers));
    cJSON *types = cJSON_AddArrayToObject(c, "layer_types");
    for (int l = 0; l < p->layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(mx_preset_mixer(p, l) == 'D'
                                                           ? "linear_attention"
                                                           : "full_attention"));
}

/* Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct's config.json): 80B
 * parameters, 3B active, three DeltaNet layers to one gated attention
 * layer; about 45 GB at 4 bits, more than a 24 GB machine holds (synth
 * --layers N writes a scaled-down variant of the same layer shapes). */
static const mx_preset presets[] = {
    {
        .name = "qwen3-next-80b-a3b", .about = "Qwen3-Next-80B-A3B: 512 experts top-10 + shared expert, "
                                               "3 DeltaNet : 1 gated attention",
        .vocab = 151936, .hidden = 2048, .intermediate = 5120, .layers = 48, .heads = 16,
        .kv_heads = 2, .head_dim = 256, .experts = 512, .top_k = 10, .moe_intermediate = 512,
        .shared_intermediate = 512, .rope_theta = 1e7, .rms_eps = 1e-6, .norm_topk_prob = 1,
        .tied = 0, .max_position = 262144, .dtype = MX_BF16, .stacked = 1, .chatml_specials = 1,
        .qwen_tokenizer = 1, .partial_rotary = 0.25, .mixers = "DDDA", .linear_k_heads = 16,
        .linear_v_heads = 32, .linear_head_dim = 128, .conv_kernel = 4,
    },
    {
        .name = "qwen3-next-tiny", .about = "qwen3_next miniature: 16 experts top-4 + shared expert, "
                                           "DeltaNet and gated attention layers (tests)",
        .vocab = 1024, .hidden = 128, .intermediate = 256, .layers = 4, .heads = 4,
        .kv_heads = 2, .head_dim = 64, .experts = 16, .top_k = 4, .moe_intermediate = 64,
        .shared_intermediate = 128, .rope_theta = 1e7, .rms_eps = 1e-6, .norm_topk_prob = 1,
        .tied = 0, .max_position = 8192, .dtype = MX_BF16, .stacked = 1, .chatml_specials = 1,
        .qwen_tokenizer = 1, .partial_rotary = 0.25, .mixers = "DA", .linear_k_heads = 2,
        .linear_v_heads = 4, .linear_head_dim = 32, .conv_kernel = 4,
    },
    {0},
};

const mx_family mx_family_qwen3_next = {
    .model_type = "qwen3_next",
    .architecture = "Qwen3NextForCausalLM",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .shared_expert = MX_SHARED_GATED,
    .attn_out_gate = 1,
    .presets = presets,
    .synth_config = synth_config,
};
