/* family_phimoe.c - Phi-3.5-MoE (PhimoeForCausalLM): LayerNorm with bias,
 * q/k/v/o and lm_head with bias, LongRoPE (short and long factors and
 * scales by sequence length), sparsemixer top-2 routing as transformers
 * computes it at inference (not mlx-lm's softmax over the top 2). */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' PhimoeConfig defaults */
    mx_default_int(&c->vocab_size, 32064);
    mx_default_int(&c->hidden_size, 4096);
    mx_default_int(&c->intermediate_size, 6400);
    mx_default_int(&c->num_hidden_layers, 32);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->max_position_embeddings, 4096 * 32);
    mx_default_dbl(&c->rms_norm_eps, 1e-5);
    mx_default_dbl(&c->rope_theta, 1e6);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->num_experts_per_tok, 2);
    mx_default_int(&c->num_experts, 16);
    mx_default_int(&c->decoder_sparse_step, 1);
    c->norm_topk_prob = 0;
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_AddNumberToObject(c, "num_local_experts", p->experts);
    cJSON_AddNumberToObject(c, "router_jitter_noise", 0.01);
    cJSON_AddBoolToObject(c, "attention_bias", 1);
    cJSON_AddBoolToObject(c, "lm_head_bias", 1);
    cJSON_AddNullToObject(c, "sliding_window");
}

static const mx_config_alias aliases[] = {
    {"num_experts", "num_local_experts"},
    {0},
};

const mx_family mx_family_phimoe = {
    .model_type = "phimoe",
    .architecture = "PhimoeForCausalLM",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.moe = "block_sparse_moe"},
    .norm = MX_NORM_LAYER,
    .router = MX_ROUTER_SPARSEMIXER,
    .synth_config = synth_config,
};
