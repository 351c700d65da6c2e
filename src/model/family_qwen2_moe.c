/* family_qwen2_moe.c - Qwen1.5-MoE / Qwen2-MoE (Qwen2MoeForCausalLM).
 * q/k/v with bias, a shared expert with a sigmoid gate, softmax top-k
 * routing renormalised only when norm_topk_prob; the default names. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Qwen2MoeConfig defaults */
    mx_default_int(&c->vocab_size, 151936);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 5632);
    mx_default_int(&c->num_hidden_layers, 24);
    mx_default_int(&c->num_attention_heads, 16);
    mx_default_int(&c->num_key_value_heads, c->num_attention_heads);
    mx_default_int(&c->max_position_embeddings, 32768);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 10000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->moe_intermediate_size, 1408);
    mx_default_int(&c->shared_expert_intermediate_size, 5632);
    mx_default_int(&c->num_experts_per_tok, 4);
    mx_default_int(&c->num_experts, 60);
    mx_default_int(&c->norm_topk_prob, 0);
    mx_default_int(&c->use_sliding_window, 0);
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "num_experts", p->experts);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(c, "shared_expert_intermediate_size", p->shared_intermediate);
    cJSON_AddNumberToObject(c, "decoder_sparse_step", 1);
    cJSON_AddArrayToObject(c, "mlp_only_layers");
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddBoolToObject(c, "use_sliding_window", 0);
    cJSON_AddNullToObject(c, "sliding_window");
    cJSON_AddNumberToObject(c, "max_window_layers", p->layers);
}

static const mx_preset presets[] = {
    {
        .name = "tiny", .about = "qwen2_moe miniature for tests and speed work (a few MB)",
        .vocab = 512, .hidden = 128, .intermediate = 256, .layers = 2, .heads = 4,
        .kv_heads = 2, .head_dim = 32, .experts = 8, .top_k = 2, .moe_intermediate = 128,
        .shared_intermediate = 256, .rope_theta = 1e6, .rms_eps = 1e-6, .qkv_bias = 1,
        .norm_topk_prob = 0, .tied = 0, .max_position = 4096, .dtype = MX_BF16, .stacked = 0,
        .chatml_specials = 1, .qwen_tokenizer = 1,
    },
    {
        .name = "qwen1.5-moe-a2.7b", .about = "Qwen1.5-MoE-A2.7B(-Chat): 60 experts top-4 + shared expert",
        .vocab = 151936, .hidden = 2048, .intermediate = 5632, .layers = 24, .heads = 16,
        .kv_heads = 16, .head_dim = 128, .experts = 60, .top_k = 4, .moe_intermediate = 1408,
        .shared_intermediate = 5632, .rope_theta = 1e6, .rms_eps = 1e-6, .qkv_bias = 1,
        .norm_topk_prob = 0, .tied = 0, .max_position = 8192, .dtype = MX_F16, .stacked = 0,
        .chatml_specials = 1, .qwen_tokenizer = 1,
    },
    {0},
};

const mx_family mx_family_qwen2_moe = {
    .model_type = "qwen2_moe",
    .architecture = "Qwen2MoeForCausalLM",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_NONE,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .shared_expert = MX_SHARED_GATED,
    .presets = presets,
    .synth_config = synth_config,
};
