/* family_lfm2_moe.c - LFM2-MoE (Lfm2MoeForCausalLM): short-convolution
 * layers (layer_types "conv": in_proj to B, C, x; out_proj(C * conv(B * x)))
 * interleaved with attention (per-head q/k layernorms, out_proj), the first
 * num_dense_layers layers dense, a sigmoid router choosing on score +
 * expert_bias and weighting by the unbiased scores, renormalised with a
 * 1e-6 guard and scaled; tied embeddings; the final norm is
 * embedding_norm. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Lfm2MoeConfig defaults; its eps is norm_eps */
    mx_default_dbl(&c->rms_norm_eps, mx_config_number(c, "norm_eps", 1e-5));
    mx_default_int(&c->vocab_size, 65536);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 7168);
    mx_default_int(&c->moe_intermediate_size, 1792);
    mx_default_int(&c->num_hidden_layers, 24);
    mx_default_int(&c->num_attention_heads, 32);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->max_position_embeddings, 128000);
    mx_default_dbl(&c->rope_theta, 1000000.0);
    mx_default_int(&c->tie_word_embeddings, 1);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->num_experts_per_tok, 4);
    mx_default_int(&c->num_experts, 32);
    mx_default_int(&c->norm_topk_prob, 1);
    c->shared_expert_intermediate_size = 0;
}

const mx_family mx_family_lfm2_moe = {
    .model_type = "lfm2_moe",
    .architecture = "Lfm2MoeForCausalLM",
    .apply_defaults = defaults,
    .names = {.attn_norm = "operator_norm", .ffn_norm = "ffn_norm", .final_norm = "embedding_norm",
              .attn_proj = {"q_proj", "k_proj", "v_proj", "out_proj"},
              .qk_norm = {"q_layernorm", "k_layernorm"}, .mlp = "feed_forward",
              .moe = "feed_forward", .router_bias = "expert_bias"},
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SIGMOID,
    .router_norm_eps = 1e-6f,
};
