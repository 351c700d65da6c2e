/* family_mixtral.c - Mixtral (MixtralForCausalLM): router
 * block_sparse_moe.gate, experts w1 (gate) / w3 (up) / w2 (down), softmax
 * top-2 always renormalised, optional sliding window. */
#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' MixtralConfig defaults */
    mx_default_int(&c->vocab_size, 32000);
    mx_default_int(&c->hidden_size, 4096);
    mx_default_int(&c->intermediate_size, 14336);
    mx_default_int(&c->num_hidden_layers, 32);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->max_position_embeddings, 4096 * 32);
    mx_default_dbl(&c->rms_norm_eps, 1e-5);
    mx_default_dbl(&c->rope_theta, 1e6);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->num_experts_per_tok, 2);
    mx_default_int(&c->num_experts, 8);
    /* Mixtral always renormalises the top-k weights. */
    c->norm_topk_prob = 1;
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->sliding_window, 0);
}

const struct mx_family mx_family_mixtral = {
    .model_type = "mixtral",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_NONE,
    .moe_block = "block_sparse_moe",
    .expert_proj = {"w1", "w3", "w2"},
};
