/* family_qwen3_next.c - Qwen3-Next (Qwen3NextForCausalLM): gated DeltaNet
 * linear-attention layers (layer_types "linear_attention", or all but
 * every full_attention_interval-th layer) interleaved with gated full
 * attention (q_proj twice as wide: per head [q | gate], output times
 * sigmoid(gate)), per-head q/k norms, partial rotary; the MoE block is
 * Qwen2-MoE's (softmax top-k, a sigmoid-gated shared expert).  The
 * checkpoint's RMSNorm weights are stored as 1 + w (mlx-lm's sanitize), so
 * they are plain weights here; the DeltaNet output norm's weight is used as
 * is. */
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

const mx_family mx_family_qwen3_next = {
    .model_type = "qwen3_next",
    .architecture = "Qwen3NextForCausalLM",
    .apply_defaults = defaults,
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .shared_expert = MX_SHARED_GATED,
    .attn_out_gate = 1,
};
