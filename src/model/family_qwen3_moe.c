/* family_qwen3_moe.c - Qwen3-MoE (Qwen3MoeForCausalLM): per-head q_norm /
 * k_norm before RoPE, explicit head_dim, no bias, no shared expert. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Qwen3MoeConfig defaults */
    mx_default_int(&c->vocab_size, 151936);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 6144);
    mx_default_int(&c->num_hidden_layers, 24);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 4);
    mx_default_int(&c->max_position_embeddings, 32768);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 10000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->moe_intermediate_size, 768);
    mx_default_int(&c->num_experts_per_tok, 8);
    mx_default_int(&c->num_experts, 128);
    mx_default_int(&c->norm_topk_prob, 0);
    mx_default_int(&c->use_sliding_window, 0);
    mx_default_int(&c->shared_expert_intermediate_size, 0);
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "num_experts", p->experts);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(c, "decoder_sparse_step", 1);
    cJSON_AddArrayToObject(c, "mlp_only_layers");
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddBoolToObject(c, "use_sliding_window", 0);
    cJSON_AddNullToObject(c, "sliding_window");
    cJSON_AddNumberToObject(c, "max_window_layers", p->layers);
    cJSON_AddBoolToObject(c, "attention_bias", 0);
}

static const mx_preset presets[] = {
    {
        .name = "qwen3-30b-a3b", .about = "Qwen3-30B-A3B: 128 experts top-8, per-head q/k norms",
        .vocab = 151936, .hidden = 2048, .intermediate = 6144, .layers = 48, .heads = 32,
        .kv_heads = 4, .head_dim = 128, .experts = 128, .top_k = 8, .moe_intermediate = 768,
        .shared_intermediate = 0, .rope_theta = 1e6, .rms_eps = 1e-6, .qkv_bias = 0,
        .norm_topk_prob = 1, .tied = 0, .max_position = 40960, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 1,
    },
    {0},
};

const mx_family mx_family_qwen3_moe = {
    .model_type = "qwen3_moe",
    .architecture = "Qwen3MoeForCausalLM",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .presets = presets,
    .synth_config = synth_config,
};
