/* family_olmoe.c - OLMoE (OlmoeForCausalLM): q_norm / k_norm over the full
 * projected width before the head split, softmax top-k not renormalised by
 * default, optional clip_qkv. */
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

const struct mx_family mx_family_olmoe = {
    .model_type = "olmoe",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_FULL,
    .moe_block = "mlp",
    .expert_proj = {"gate_proj", "up_proj", "down_proj"},
};
