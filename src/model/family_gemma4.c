/* family_gemma4.c - Gemma 4 text models (Gemma4ForCausalLM, model_type
 * gemma4_text; the multimodal gemma4 checkpoints hold the same tensors under
 * language_model.).  Sliding-window and full-attention layers of different
 * head sizes (full layers: global_head_dim, with attention_k_eq_v no v
 * projection and their own kv head count) and ropes (proportional on full
 * layers), q/k norms and a weightless v norm, attention scale 1, norms of
 * attention's and the feed-forward's outputs, the dense GeGLU MLP and the
 * routed experts in parallel on the same stream, each with its own norms,
 * a router reading rmsnorm(x) * scale / sqrt(d) with per-expert weight
 * scales, layer_scalar, embeddings times sqrt(d), tied output, a final
 * logit soft cap.  Images and audio are not supported. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Gemma4TextConfig defaults */
    mx_default_int(&c->vocab_size, 262144);
    mx_default_int(&c->hidden_size, 2816);
    mx_default_int(&c->intermediate_size, 2112);
    mx_default_int(&c->num_hidden_layers, 30);
    mx_default_int(&c->num_attention_heads, 16);
    mx_default_int(&c->num_key_value_heads, 8);
    mx_default_int(&c->head_dim, 256);
    mx_default_int(&c->max_position_embeddings, 131072);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 10000.0);   /* per layer type in rope_parameters */
    mx_default_int(&c->tie_word_embeddings, 1);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->num_experts_per_tok, 8);
    /* without the MoE block a Gemma 4 model is dense */
    const cJSON *moe = mx_config_key(c, "enable_moe_block");
    if (cJSON_IsFalse(moe))
        c->num_experts = 0;
    mx_default_int(&c->num_experts, 0);
    /* the router renormalises the top-k weights */
    c->norm_topk_prob = 1;
    c->shared_expert_intermediate_size = 0;
}

static const mx_config_alias aliases[] = {
    {"num_experts_per_tok", "top_k_experts"},
    {0},
};

/* One table of names for both rows; the multimodal one adds the
 * language_model. prefix. */
#define GEMMA4_NAMES(prefix)                                                              \
    {                                                                                     \
        .model = prefix "model", .lm_head = prefix "lm_head",                             \
        .attn_out_norm = "post_attention_layernorm", .ffn_norm = "pre_feedforward_layernorm", \
        .ffn_out_norm = "post_feedforward_layernorm",                                     \
        .mlp_out_norm = "post_feedforward_layernorm_1",                                   \
        .moe_in_norm = "pre_feedforward_layernorm_2",                                     \
        .moe_out_norm = "post_feedforward_layernorm_2", .layer_scalar = "layer_scalar",   \
        .moe = "", .router = "router.proj", .router_scale = "router.scale",               \
        .expert_scale = "router.per_expert_scale", .stacked = "experts.switch_glu",       \
    }

const mx_family mx_family_gemma4_text = {
    .model_type = "gemma4_text",
    .architecture = "Gemma4ForCausalLM",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = GEMMA4_NAMES(""),
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .parallel_dense = 1,
    .v_norm = 1,
    .attn_scale = 1.0f,
    .embed_scale = 1,
};

const mx_family mx_family_gemma4 = {
    .model_type = "gemma4",
    .architecture = "Gemma4ForConditionalGeneration",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = GEMMA4_NAMES("language_model."),
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .parallel_dense = 1,
    .v_norm = 1,
    .attn_scale = 1.0f,
    .embed_scale = 1,
};
