/* family_qwen3_vl_moe.c - the text path of Qwen3-VL-MoE
 * (Qwen3VLMoeForConditionalGeneration): the config nests the language
 * model under text_config, mlx-lm wraps qwen3_moe as `language_model`, so
 * every tensor is under language_model.model.* (lm_head under
 * language_model.lm_head); the layers are Qwen3-MoE's.  Text positions make
 * the interleaved MRoPE ordinary RoPE; images are not supported. */
#include <cjson/cJSON.h>

#include "model/family.h"

static void defaults(mx_config *c)
{
    /* transformers' Qwen3VLMoeTextConfig defaults */
    mx_default_int(&c->vocab_size, 151936);
    mx_default_int(&c->hidden_size, 2048);
    mx_default_int(&c->intermediate_size, 5632);
    mx_default_int(&c->num_hidden_layers, 24);
    mx_default_int(&c->num_attention_heads, 16);
    mx_default_int(&c->num_key_value_heads, 16);
    mx_default_int(&c->max_position_embeddings, 128000);
    mx_default_dbl(&c->rms_norm_eps, 1e-6);
    mx_default_dbl(&c->rope_theta, 5000000.0);
    mx_default_int(&c->tie_word_embeddings, 0);
    mx_default_int(&c->decoder_sparse_step, 1);
    mx_default_int(&c->moe_intermediate_size, 1408);
    mx_default_int(&c->num_experts_per_tok, 4);
    mx_default_int(&c->num_experts, 60);
    mx_default_int(&c->use_sliding_window, 0);
    mx_default_int(&c->shared_expert_intermediate_size, 0);
    /* transformers always renormalises the top-k weights here */
    c->norm_topk_prob = 1;
}

static void synth_config(const mx_preset *p, cJSON *c)
{
    cJSON *t = cJSON_AddObjectToObject(c, "text_config");
    cJSON_AddStringToObject(t, "model_type", "qwen3_vl_moe_text");
    cJSON_AddNumberToObject(t, "num_experts", p->experts);
    cJSON_AddNumberToObject(t, "moe_intermediate_size", p->moe_intermediate);
    cJSON_AddNumberToObject(t, "decoder_sparse_step", 1);
    cJSON_AddBoolToObject(t, "norm_topk_prob", 1);
    cJSON_AddNumberToObject(t, "head_dim", p->head_dim);
}

static const mx_config_alias aliases[] = {
    {"num_experts", "num_local_experts"},
    {0},
};

const mx_family mx_family_qwen3_vl_moe = {
    .model_type = "qwen3_vl_moe",
    .architecture = "Qwen3VLMoeForConditionalGeneration",
    .apply_defaults = defaults,
    .aliases = aliases,
    .names = {.model = "language_model.model", .lm_head = "language_model.lm_head"},
    .qk_norm = MX_QK_NORM_HEAD,
    .router = MX_ROUTER_SOFTMAX_TOPK,
    .synth_config = synth_config,
};
