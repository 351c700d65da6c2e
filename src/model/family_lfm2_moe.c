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

/* LFM2's own keys: norm_eps, the short convolution, num_dense_layers, the
 * biased sigmoid router, layer_types from the preset's mixer letters ('C'
 * conv, 'A' full_attention). */
static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON_DeleteItemFromObjectCaseSensitive(c, "rms_norm_eps");
    cJSON_AddNumberToObject(c, "norm_eps", p->rms_eps);
    cJSON_AddNumberToObject(c, "num_experts", p->experts);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(c, "num_dense_layers", p->dense_layers);
    cJSON_AddBoolToObject(c, "norm_topk_prob", p->norm_topk_prob);
    cJSON_AddBoolToObject(c, "use_expert_bias", 1);
    cJSON_AddNumberToObject(c, "routed_scaling_factor", 1.0);
    cJSON_AddBoolToObject(c, "conv_bias", 0);
    cJSON_AddNumberToObject(c, "conv_L_cache", p->conv_kernel);
    cJSON *types = cJSON_AddArrayToObject(c, "layer_types");
    for (int l = 0; l < p->layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(mx_preset_mixer(p, l) == 'C'
                                                           ? "conv"
                                                           : "full_attention"));
}

/* LFM2-8B-A1B (LiquidAI/LFM2-8B-A1B's config.json): 8.3B parameters, 1.5B
 * active; attention at layers 2, 6, 10, 14, 18 and 21, short convolutions
 * elsewhere; the first two layers dense. */
static const mx_preset presets[] = {
    {
        .name = "lfm2-8b-a1b", .about = "LFM2-8B-A1B: 32 experts top-4, 18 short-convolution + "
                                        "6 attention layers, 2 dense",
        .vocab = 65536, .hidden = 2048, .intermediate = 7168, .layers = 24, .heads = 32,
        .kv_heads = 8, .head_dim = 64, .experts = 32, .top_k = 4, .moe_intermediate = 1792,
        .rope_theta = 1e6, .rms_eps = 1e-5, .norm_topk_prob = 1, .tied = 1,
        .max_position = 128000, .dtype = MX_BF16, .stacked = 1, .chatml_specials = 1,
        .mixers = "CCACCCACCCACCCACCCACCACC", .conv_kernel = 3, .dense_layers = 2,
    },
    {
        .name = "lfm2-moe-tiny", .about = "lfm2_moe miniature: 8 experts top-2, short-convolution and "
                                          "attention layers, 1 dense (tests)",
        .vocab = 1024, .hidden = 128, .intermediate = 256, .layers = 4, .heads = 4,
        .kv_heads = 2, .head_dim = 32, .experts = 8, .top_k = 2, .moe_intermediate = 64,
        .rope_theta = 1e6, .rms_eps = 1e-5, .norm_topk_prob = 1, .tied = 1,
        .max_position = 8192, .dtype = MX_BF16, .stacked = 1, .chatml_specials = 1,
        .mixers = "CCAC", .conv_kernel = 3, .dense_layers = 1,
    },
    {0},
};

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
    .presets = presets,
    .synth_config = synth_config,
};
