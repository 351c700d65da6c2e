/* family_qwen3_moe.c - Qwen3-MoE (Qwen3MoeForCausalLM): per-head q_norm /
 * k_norm before RoPE, explicit head_dim, no bias, no shared expert. */
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

const struct mx_family mx_family_qwen3_moe = {
    .model_type = "qwen3_moe",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_HEAD,
    .moe_block = "mlp",
    .expert_proj = {"gate_proj", "up_proj", "down_proj"},
};
