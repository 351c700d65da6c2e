/* family_olmoe.c - OLMoE (OlmoeForCausalLM): q_norm / k_norm over the full
 * projected width before the head split, softmax top-k not renormalised by
 * default, optional clip_qkv. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' OlmoeConfig defaults */
    mx_default_int(&c->vocab_size, 50304);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 2048);
    mx_default_int(&c->num_hidden_layers, 16);
    mx_default_int(&c->num_attention_heads, 16);
    mx_default_int(&c->num_key_value_heads, c->num_attention_heads);
    mx_default_int(&c->max_position_embeddings, 4096);
    mx_default_dbl(&c->rms_norm_eps, 1e-5);
    mx_default_dbl(&c->rope_theta, 10000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->num_experts_per_tok, 8);
    mx_default_int(&c->num_experts, 64);
    mx_default_int(&c->norm_topk_prob, 0);
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    mx_default_int(&c->decoder_sparse_step, 1);
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "num_experts", p->experts);
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddNullToObject(c, "clip_qkv");
    cJSON_AddBoolToObject(c, "attention_bias", 0);
}

static const mx_preset presets[] = {
    {
        .name = "olmoe-1b-7b", .about = "OLMoE-1B-7B: 64 experts top-8, full-width q/k norms",
        .vocab = 50304, .hidden = 2048, .intermediate = 1024, .layers = 16, .heads = 16,
        .kv_heads = 16, .head_dim = 128, .experts = 64, .top_k = 8, .moe_intermediate = 1024,
        .shared_intermediate = 0, .rope_theta = 10000.0, .rms_eps = 1e-5, .qkv_bias = 0,
        .norm_topk_prob = 0, .tied = 0, .max_position = 4096, .dtype = MX_BF16, .stacked = 1,
        .chatml_specials = 1, .qwen_tokenizer = 0,
    },
    {0},
};

const mx_family mx_family_olmoe = {
    .model_type = "olmoe",
    .architecture = "OlmoeForCausalLM",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_FULL,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .presets = presets,
    .synth_config = synth_config,
};
