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
#include <string.h>

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

/* The text model's own config.json keys: GELU, the MoE block, the two
 * attention geometries (sliding layers head_dim and kv_heads; full layers
 * global_head_dim and, K = V, num_global_key_value_heads), layer_types
 * (every full_every-th layer and the last one full), the two ropes, the
 * logit soft cap. */
static void synth_config_text(const mx_preset *p, cJSON *c)
{
    cJSON_DeleteItemFromObjectCaseSensitive(c, "hidden_act");
    cJSON_AddStringToObject(c, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "num_experts_per_tok");
    cJSON_AddBoolToObject(c, "enable_moe_block", 1);
    cJSON_AddNumberToObject(c, "num_experts", p->experts);
    cJSON_AddNumberToObject(c, "top_k_experts", p->top_k);
    cJSON_AddNumberToObject(c, "moe_intermediate_size", p->moe_intermediate);
    if (!cJSON_GetObjectItemCaseSensitive(c, "head_dim"))
        cJSON_AddNumberToObject(c, "head_dim", p->head_dim);
    cJSON_AddNumberToObject(c, "global_head_dim", p->global_head_dim);
    cJSON_AddBoolToObject(c, "attention_k_eq_v", p->global_kv_heads > 0);
    if (p->global_kv_heads > 0)
        cJSON_AddNumberToObject(c, "num_global_key_value_heads", p->global_kv_heads);
    cJSON_AddNumberToObject(c, "sliding_window", p->sliding_window);
    cJSON *types = cJSON_AddArrayToObject(c, "layer_types");
    for (int l = 0; l < p->layers; l++) {
        int full = p->full_every > 0 && ((l + 1) % p->full_every == 0 || l == p->layers - 1);
        cJSON_AddItemToArray(types, cJSON_CreateString(full ? "full_attention" : "sliding_attention"));
    }
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters");
    cJSON *sl = cJSON_AddObjectToObject(rp, "sliding_attention");
    cJSON_AddStringToObject(sl, "rope_type", "default");
    cJSON_AddNumberToObject(sl, "rope_theta", p->rope_theta);
    cJSON *fu = cJSON_AddObjectToObject(rp, "full_attention");
    cJSON_AddStringToObject(fu, "rope_type", "proportional");
    cJSON_AddNumberToObject(fu, "partial_rotary_factor", p->partial_rotary > 0 ? p->partial_rotary : 1.0);
    cJSON_AddNumberToObject(fu, "rope_theta", 1e6);
    cJSON_AddNumberToObject(c, "final_logit_softcapping", 30.0);
    cJSON_AddNumberToObject(c, "hidden_size_per_layer_input", 0);
    cJSON_AddNumberToObject(c, "num_kv_shared_layers", 0);
    cJSON_AddNumberToObject(c, "vocab_size_per_layer_input", p->vocab);
    cJSON_AddBoolToObject(c, "use_double_wide_mlp", 0);
    cJSON_AddBoolToObject(c, "attention_bias", 0);
}

/* The multimodal checkpoints: the same keys under text_config (with its own
 * model_type), the top level keeping the architecture. */
static void synth_config_mm(const mx_preset *p, cJSON *c)
{
    synth_config_text(p, c);
    cJSON *t = cJSON_CreateObject();
    for (cJSON *it = c->child, *next; it; it = next) {
        next = it->next;
        if (!strcmp(it->string, "architectures") || !strcmp(it->string, "model_type") ||
            !strcmp(it->string, "torch_dtype"))
            continue;
        cJSON_AddItemToObject(t, it->string, cJSON_DetachItemViaPointer(c, it));
    }
    cJSON_AddStringToObject(t, "model_type", "gemma4_text");
    cJSON_AddItemToObject(c, "text_config", t);
}

/* Gemma 4 26B-A4B (google/gemma-4-26B-A4B-it's text_config): 26B
 * parameters, 4B active; and miniatures of the same layout for tests, one
 * per row of the table. */
#define GEMMA4_26B                                                                         \
    .vocab = 262144, .hidden = 2816, .intermediate = 2112, .layers = 30, .heads = 16,     \
    .kv_heads = 8, .head_dim = 256, .experts = 128, .top_k = 8, .moe_intermediate = 704,  \
    .rope_theta = 1e4, .rms_eps = 1e-6, .norm_topk_prob = 1, .tied = 1,                    \
    .max_position = 262144, .dtype = MX_BF16, .stacked = 1, .chatml_specials = 1,          \
    .partial_rotary = 0.25, .sliding_window = 1024, .full_every = 6, .global_head_dim = 512, \
    .global_kv_heads = 2
#define GEMMA4_TINY                                                                        \
    .vocab = 1024, .hidden = 128, .intermediate = 128, .layers = 6, .heads = 4,            \
    .kv_heads = 2, .head_dim = 32, .experts = 8, .top_k = 2, .moe_intermediate = 64,      \
    .rope_theta = 1e4, .rms_eps = 1e-6, .norm_topk_prob = 1, .tied = 1,                    \
    .max_position = 8192, .dtype = MX_BF16, .stacked = 1, .chatml_specials = 1,            \
    .partial_rotary = 0.25, .sliding_window = 8, .full_every = 3, .global_head_dim = 64,   \
    .global_kv_heads = 1

static const mx_preset text_presets[] = {
    {.name = "gemma-4-26b-a4b", .about = "Gemma 4 26B-A4B (text): 128 experts top-8 beside a dense "
                                        "GeGLU MLP, sliding/full layers, K=V", GEMMA4_26B},
    {.name = "gemma4-tiny", .about = "gemma4_text miniature: 8 experts top-2 beside a dense MLP, "
                                    "2 of 6 layers full attention (tests)", GEMMA4_TINY},
    {0},
};

static const mx_preset mm_presets[] = {
    {.name = "gemma4-mm-tiny", .about = "gemma4 (multimodal names, text_config) miniature (tests)",
     GEMMA4_TINY},
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
    .presets = text_presets,
    .synth_config = synth_config_text,
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
    .presets = mm_presets,
    .synth_config = synth_config_mm,
};
