/* test_config.c - config.json / generation_config.json parsing: the fixture
 * configs field by field (when MLXCEL_FIXTURES is set), inline variants
 * (rope forms, expert-count spellings, eos lists, quantization overrides)
 * and error cases that must name the field and the file. */
#include "format/config.h"
#include "model/family.h"
#include "test.h"

#include <unistd.h>

/* Parses, then applies the config-key aliases the family table declares
 * for the config's model_type (mixtral's, num_local_experts, when it names
 * none), as the loader does. */
static int aliases(mx_config *c, mx_err *e)
{
    const mx_family *f = mx_family_find(c->model_type[0] ? c->model_type : "mixtral");
    return f ? mx_config_apply_aliases(c, f->aliases, e) : MX_OK;
}

static int parse(const char *json, mx_config *c, mx_err *e)
{
    int rc = mx_config_parse(json, "inline.json", c, e);
    if (!rc && (rc = aliases(c, e)))
        mx_config_free(c);
    return rc;
}

/* Parses text that must fail with a message naming `field` and the file. */
static void expect_bad(const char *json, const char *field)
{
    mx_config c;
    mx_err e = {0};
    int rc = parse(json, &c, &e);
    CHECKF(rc != 0, "accepted: %s", json);
    CHECKF(strstr(e.msg, "inline.json") != NULL, "no file name: %s", e.msg);
    if (field)
        CHECKF(strstr(e.msg, field) != NULL, "no field '%s': %s", field, e.msg);
    CHECK(c.quant.n_overrides == 0 && c.quant.overrides == NULL);
    fprintf(stderr, "  expected error: %s\n", e.msg);
    mx_config_free(&c);
}

static void test_defaults(void)
{
    mx_config c;
    mx_err e = {0};
    CHECK_OK(parse("{}", &c, &e), &e);
    CHECK(c.model_type[0] == 0 && c.hidden_act[0] == 0);
    CHECK(c.vocab_size == MX_UNSET && c.hidden_size == MX_UNSET && c.head_dim == MX_UNSET);
    CHECK(c.rms_norm_eps < 0 && c.rope_theta < 0 && c.clip_qkv < 0);
    CHECK(strcmp(c.rope_type, "default") == 0);
    CHECK(c.tie_word_embeddings == MX_UNSET && c.attention_bias == MX_UNSET);
    CHECK(c.sliding_window == MX_UNSET && c.use_sliding_window == MX_UNSET);
    CHECK(c.num_experts == MX_UNSET && c.norm_topk_prob == MX_UNSET);
    CHECK(c.n_mlp_only_layers == MX_UNSET);
    CHECK(c.bos_token_id == MX_UNSET && c.pad_token_id == MX_UNSET && c.n_eos == 0);
    CHECK(!c.quant.present && c.quant.n_overrides == 0);
    int bits = 9, gs = 9;
    CHECK(mx_quant_for(&c.quant, "model.layers.0.mlp.gate", &bits, &gs) == 0 && bits == 0);
    mx_config_free(&c);
    mx_config_free(&c);   /* idempotent */
}

static void test_inline(void)
{
    mx_config c;
    mx_err e = {0};

    /* rope_scaling with `type`, num_local_experts, eos list, null window */
    CHECK_OK(parse("{\"model_type\":\"mixtral\",\"rope_scaling\":{\"type\":\"linear\","
                   "\"factor\":2.0,\"rope_theta\":5000},\"num_local_experts\":8,"
                   "\"eos_token_id\":[2,7,2],\"sliding_window\":null,\"clip_qkv\":8.0,"
                   "\"head_dim\":null,\"pad_token_id\":-1,\"mlp_only_layers\":[0,3]}",
                   &c, &e), &e);
    CHECK(strcmp(c.model_type, "mixtral") == 0);
    CHECK(strcmp(c.rope_type, "linear") == 0 && c.rope_theta == 5000.0);
    CHECK(c.num_experts == 8 && c.sliding_window == 0 && c.clip_qkv == 8.0);
    CHECK(c.head_dim == MX_UNSET && c.pad_token_id == MX_UNSET);
    CHECK(c.n_eos == 2 && c.eos_token_ids[0] == 2 && c.eos_token_ids[1] == 7);
    CHECK(c.n_mlp_only_layers == 2 && c.mlp_only_layers[1] == 3);
    /* generation_config: eos union, bos taken from it */
    CHECK_OK(mx_config_parse_generation("{\"bos_token_id\":1,\"eos_token_id\":[7,9],"
                                        "\"pad_token_id\":0,\"do_sample\":true}",
                                        "gen.json", &c, &e), &e);
    CHECK(c.n_eos == 3 && c.eos_token_ids[2] == 9);
    CHECK(c.bos_token_id == 1 && c.pad_token_id == 0);
    /* a failing generation config leaves c unchanged */
    CHECK_FAILS(mx_config_parse_generation("{\"eos_token_id\":[11,\"x\"]}", "gen.json", &c, &e),
                &e);
    CHECK(strstr(e.msg, "gen.json") && strstr(e.msg, "eos_token_id"));
    CHECK(c.n_eos == 3);
    CHECK_FAILS(mx_config_parse_generation("{", "gen.json", &c, &e), &e);
    CHECK_OK(mx_config_parse_generation("{\"eos_token_id\":null}", "gen.json", &c, &e), &e);
    CHECK(c.n_eos == 3 && c.bos_token_id == 1);
    mx_config_free(&c);

    /* top-level rope_theta wins; rope_parameters with rope_type */
    CHECK_OK(parse("{\"rope_theta\":1e6,\"rope_parameters\":{\"rope_type\":\"yarn\","
                   "\"rope_theta\":10}}", &c, &e), &e);
    CHECK(c.rope_theta == 1e6 && strcmp(c.rope_type, "yarn") == 0);
    mx_config_free(&c);
    /* rope_parameters before rope_scaling */
    CHECK_OK(parse("{\"rope_scaling\":{\"rope_type\":\"linear\",\"rope_theta\":3},"
                   "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":4}}", &c, &e),
             &e);
    CHECK(c.rope_theta == 4 && strcmp(c.rope_type, "default") == 0);
    mx_config_free(&c);
    CHECK_OK(parse("{\"rope_scaling\":null,\"rope_theta\":10000}", &c, &e), &e);
    CHECK(c.rope_theta == 10000 && strcmp(c.rope_type, "default") == 0);
    mx_config_free(&c);

    /* num_experts wins over num_local_experts; int eos; booleans as 0/1 */
    CHECK_OK(parse("{\"num_experts\":4,\"num_local_experts\":8,\"eos_token_id\":5,"
                   "\"tie_word_embeddings\":1,\"attention_bias\":true,"
                   "\"hidden_activation\":\"gelu\",\"sliding_window\":4096}", &c, &e), &e);
    CHECK(c.num_experts == 4 && c.n_eos == 1 && c.eos_token_ids[0] == 5);
    CHECK(c.tie_word_embeddings == 1 && c.attention_bias == 1);
    CHECK(strcmp(c.hidden_act, "gelu") == 0 && c.sliding_window == 4096);
    mx_config_free(&c);

    /* quantization: defaults, object overrides (inheriting missing keys),
     * `false` = not quantized, scalars such as "mode" ignored */
    CHECK_OK(parse("{\"quantization\":{\"group_size\":32,\"bits\":3,\"mode\":\"affine\","
                   "\"lm_head\":false,\"model.layers.0.mlp.gate\":{\"bits\":8},"
                   "\"model.embed_tokens\":{\"bits\":6,\"group_size\":128},"
                   "\"model.layers.1.mlp.gate\":true},"
                   "\"quantization_config\":{\"group_size\":64,\"bits\":4}}", &c, &e), &e);
    CHECK(c.quant.present && c.quant.bits == 3 && c.quant.group_size == 32);
    CHECK(c.quant.n_overrides == 3);
    int bits = -5, gs = -5;
    CHECK(mx_quant_for(&c.quant, "lm_head", &bits, &gs) == 0 && bits == 0);
    CHECK(mx_quant_for(&c.quant, "model.layers.0.mlp.gate", &bits, &gs) == 1 && bits == 8 &&
          gs == 32);
    CHECK(mx_quant_for(&c.quant, "model.embed_tokens", &bits, &gs) == 1 && bits == 6 &&
          gs == 128);
    CHECK(mx_quant_for(&c.quant, "model.layers.1.mlp.gate", &bits, &gs) == 1 && bits == 3);
    /* exact match only: no prefix or suffix matching */
    CHECK(mx_quant_for(&c.quant, "model.layers.0.mlp.gate_proj", &bits, &gs) == 1 &&
          bits == 3 && gs == 32);
    CHECK(mx_quant_for(&c.quant, "model.layers.0.mlp", &bits, &gs) == 1 && bits == 3);
    mx_config_free(&c);

    /* quantization_config fallback; missing bits/group_size take MLX defaults */
    CHECK_OK(parse("{\"quantization_config\":{\"bits\":8}}", &c, &e), &e);
    CHECK(c.quant.present && c.quant.bits == 8 && c.quant.group_size == 64);
    mx_config_free(&c);
    CHECK_OK(parse("{\"quantization\":null,\"quantization_config\":{\"group_size\":128}}", &c,
                   &e), &e);
    CHECK(c.quant.present && c.quant.bits == 4 && c.quant.group_size == 128);
    mx_config_free(&c);

    /* many overrides: lookup must still be exact */
    {
        char *js = malloc(200000);
        size_t k = (size_t)sprintf(js, "{\"quantization\":{\"bits\":4,\"group_size\":64");
        for (int i = 0; i < 2000; i++)
            k += (size_t)sprintf(js + k, ",\"model.layers.%d.mlp.experts.%d.down_proj\":"
                                         "{\"bits\":%d,\"group_size\":64}",
                                 i / 60, i % 60, 2 + i % 7);
        strcpy(js + k, "}}");
        CHECK_OK(parse(js, &c, &e), &e);
        CHECK(c.quant.n_overrides == 2000);
        int bad = 0;
        for (int i = 0; i < 2000; i++) {
            char m[96];
            snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d.down_proj", i / 60, i % 60);
            bad += !mx_quant_for(&c.quant, m, &bits, &gs) || bits != 2 + i % 7;
        }
        CHECK(bad == 0);
        mx_config_free(&c);
        free(js);
    }
}

static void test_errors(void)
{
    expect_bad("{\"hidden_size\":\"abc\"}", "hidden_size");
    expect_bad("{\"hidden_size\":1.5}", "hidden_size");
    expect_bad("{\"hidden_size\":-4}", "hidden_size");
    expect_bad("{\"num_hidden_layers\":1e12}", "num_hidden_layers");
    expect_bad("{\"vocab_size\":true}", "vocab_size");
    expect_bad("{\"tie_word_embeddings\":\"yes\"}", "tie_word_embeddings");
    expect_bad("{\"norm_topk_prob\":2}", "norm_topk_prob");
    expect_bad("{\"rms_norm_eps\":\"1e-6\"}", "rms_norm_eps");
    expect_bad("{\"rope_theta\":-1}", "rope_theta");
    expect_bad("{\"rope_theta\":0}", "rope_theta");
    expect_bad("{\"rope_parameters\":5}", "rope_parameters");
    expect_bad("{\"rope_parameters\":{\"rope_theta\":\"x\"}}", "rope_parameters.rope_theta");
    expect_bad("{\"rope_scaling\":{\"type\":3}}", "rope_scaling.type");
    expect_bad("{\"model_type\":7}", "model_type");
    expect_bad("{\"model_type\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
               "aaaaaaaa\"}", "model_type");
    expect_bad("{\"hidden_act\":[\"silu\"]}", "hidden_act");
    expect_bad("{\"sliding_window\":\"none\"}", "sliding_window");
    expect_bad("{\"num_local_experts\":-8}", "num_local_experts");
    expect_bad("{\"eos_token_id\":\"</s>\"}", "eos_token_id");
    expect_bad("{\"eos_token_id\":[1,2.5]}", "eos_token_id");
    expect_bad("{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", "eos_token_id");
    expect_bad("{\"bos_token_id\":{}}", "bos_token_id");
    expect_bad("{\"mlp_only_layers\":3}", "mlp_only_layers");
    expect_bad("{\"mlp_only_layers\":[1,-1]}", "mlp_only_layers");
    expect_bad("{\"quantization\":[]}", "quantization");
    expect_bad("{\"quantization\":{\"bits\":\"4\"}}", "quantization.bits");
    expect_bad("{\"quantization\":{\"bits\":0}}", "quantization.bits");
    expect_bad("{\"quantization\":{\"group_size\":-64}}", "quantization.group_size");
    expect_bad("{\"quantization\":{\"bits\":4,\"m.q\":{\"group_size\":\"a\"}}}",
               "quantization.m.q.group_size");
    expect_bad("{\"quantization\":{\"bits\":4,\"m.q\":{\"bits\":4},\"m.q\":false}}", "m.q");
    expect_bad("{\"quantization\":{\"bits\":4,\"mode\":\"mxfp4\"}}", "mode");
    expect_bad("{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}}",
               "quant_method");
    /* quantization errors after a successful override free what was built */
    expect_bad("{\"quantization\":{\"a\":{\"bits\":4},\"b\":{\"bits\":99}}}", "b.bits");
    /* invalid JSON names the file and the line */
    {
        mx_config c;
        mx_err e = {0};
        CHECK_FAILS(parse("{\n  \"hidden_size\": 12,\n  \"x\": [1,\n}", &c, &e), &e);
        CHECK(strstr(e.msg, "inline.json") && strstr(e.msg, "line 4"));
        CHECK_FAILS(parse("[1,2]", &c, &e), &e);
        CHECK_FAILS(parse("{} trailing", &c, &e), &e);
        CHECK_FAILS(parse("", &c, &e), &e);
        CHECK_FAILS(parse(NULL, &c, &e), &e);
        mx_config_free(&c);
    }
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_load(void)
{
    char dir[] = "/tmp/mx_cfg_test.XXXXXX", p[128], g[128];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        t_fail++;
        return;
    }
    snprintf(p, sizeof p, "%s/config.json", dir);
    snprintf(g, sizeof g, "%s/generation_config.json", dir);
    mx_config c;
    mx_err e = {0};
    CHECK_FAILS(mx_config_load(dir, &c, &e), &e);   /* no config.json */
    CHECK(strstr(e.msg, "config.json") != NULL);
    write_text(p, "{\"hidden_size\":64,\"eos_token_id\":2,\"quantization\":{\"bits\":4,"
                  "\"group_size\":64,\"lm_head\":{\"bits\":8}}}");
    CHECK_OK(mx_config_load(dir, &c, &e), &e);
    CHECK(c.hidden_size == 64 && c.n_eos == 1 && c.quant.n_overrides == 1);
    mx_config_free(&c);
    write_text(g, "{\"eos_token_id\":[2,3],\"bos_token_id\":1}");
    CHECK_OK(mx_config_load(dir, &c, &e), &e);
    CHECK(c.n_eos == 2 && c.eos_token_ids[1] == 3 && c.bos_token_id == 1);
    mx_config_free(&c);
    write_text(g, "{\"eos_token_id\":\"x\"}");
    CHECK_FAILS(mx_config_load(dir, &c, &e), &e);
    CHECK(strstr(e.msg, "generation_config.json") != NULL);
    CHECK(c.quant.overrides == NULL);
    mx_config_free(&c);
    write_text(p, "{\"hidden_size\":\"x\"}");
    CHECK_FAILS(mx_config_load(dir, &c, &e), &e);
    CHECK(strstr(e.msg, p) && strstr(e.msg, "hidden_size"));
    unlink(p);
    unlink(g);
    rmdir(dir);
}

static void load_fixture(const char *fx, const char *name, mx_config *c)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", fx, name);
    mx_err e = {0};
    CHECK_OK(mx_config_load(dir, c, &e), &e);
    CHECK_OK(aliases(c, &e), &e);
}

static void test_fixtures_configs(const char *fx)
{
    mx_config c;
    int bits, gs;

    load_fixture(fx, "qwen2_moe_tiny_chat", &c);
    CHECK(strcmp(c.model_type, "qwen2_moe") == 0);
    CHECK(c.vocab_size == 151936 && c.hidden_size == 128 && c.intermediate_size == 320);
    CHECK(c.num_hidden_layers == 3 && c.num_attention_heads == 4 && c.num_key_value_heads == 4);
    CHECK(c.head_dim == MX_UNSET && c.max_position_embeddings == 4096);
    CHECK(c.rms_norm_eps == 1e-6 && c.rope_theta == 1e6 && strcmp(c.rope_type, "default") == 0);
    CHECK(c.tie_word_embeddings == 0 && c.attention_bias == MX_UNSET && c.clip_qkv < 0);
    CHECK(strcmp(c.hidden_act, "silu") == 0);
    CHECK(c.sliding_window == 32768 && c.use_sliding_window == 0 && c.max_window_layers == 21);
    CHECK(c.num_experts == 8 && c.num_experts_per_tok == 4 && c.moe_intermediate_size == 192);
    CHECK(c.shared_expert_intermediate_size == 320 && c.decoder_sparse_step == 1);
    CHECK(c.norm_topk_prob == 0 && c.n_mlp_only_layers == 0);
    CHECK(c.bos_token_id == 151643 && c.n_eos == 1 && c.eos_token_ids[0] == 151645);
    CHECK(c.quant.present && c.quant.bits == 4 && c.quant.group_size == 64);
    CHECK(c.quant.n_overrides == 6);
    CHECK(mx_quant_for(&c.quant, "model.layers.2.mlp.shared_expert_gate", &bits, &gs) &&
          bits == 8 && gs == 64);
    CHECK(mx_quant_for(&c.quant, "model.layers.2.mlp.experts.3.up_proj", &bits, &gs) &&
          bits == 4 && gs == 64);
    mx_config_free(&c);

    load_fixture(fx, "qwen2_moe_gqa_mixed", &c);
    CHECK(strcmp(c.model_type, "qwen2_moe") == 0);
    CHECK(c.rope_theta == 10000.0 && strcmp(c.rope_type, "default") == 0);
    CHECK(c.tie_word_embeddings == 1 && c.num_attention_heads == 8 && c.num_key_value_heads == 2);
    CHECK(c.hidden_size == 256 && c.intermediate_size == 512 && c.vocab_size == 4096);
    CHECK(c.moe_intermediate_size == 320 && c.shared_expert_intermediate_size == 448);
    CHECK(c.num_experts == 16 && c.num_experts_per_tok == 4 && c.norm_topk_prob == 1);
    CHECK(c.sliding_window == MX_UNSET && c.use_sliding_window == 0);
    CHECK(c.n_eos == 0 && c.bos_token_id == MX_UNSET);
    CHECK(c.quant.n_overrides == 18);
    CHECK(mx_quant_for(&c.quant, "model.layers.0.mlp.switch_mlp.down_proj", &bits, &gs) &&
          bits == 6 && gs == 64);
    CHECK(mx_quant_for(&c.quant, "model.layers.0.mlp.switch_mlp.gate_proj", &bits, &gs) &&
          bits == 4);
    CHECK(mx_quant_for(&c.quant, "model.layers.1.self_attn.o_proj", &bits, &gs) && bits == 8);
    CHECK(mx_quant_for(&c.quant, "model.embed_tokens", &bits, &gs) && bits == 4);
    mx_config_free(&c);

    load_fixture(fx, "qwen3_moe_tiny", &c);
    CHECK(strcmp(c.model_type, "qwen3_moe") == 0);
    CHECK(c.head_dim == 64 && c.hidden_size == 128 && c.num_attention_heads == 4 &&
          c.num_key_value_heads == 2);
    CHECK(c.intermediate_size == 384 && c.moe_intermediate_size == 192);
    CHECK(c.shared_expert_intermediate_size == MX_UNSET);
    CHECK(c.num_experts == 16 && c.norm_topk_prob == 1 && c.attention_bias == 0);
    CHECK(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-6);
    CHECK(c.quant.n_overrides == 3);
    CHECK(mx_quant_for(&c.quant, "model.layers.1.mlp.gate", &bits, &gs) && bits == 8);
    mx_config_free(&c);

    load_fixture(fx, "mixtral_tiny", &c);
    CHECK(strcmp(c.model_type, "mixtral") == 0);
    CHECK(c.num_experts == 8 && c.num_experts_per_tok == 2 && c.sliding_window == 0);
    CHECK(c.hidden_size == 256 && c.intermediate_size == 320 && c.num_hidden_layers == 2);
    CHECK(c.num_attention_heads == 8 && c.num_key_value_heads == 2);
    CHECK(c.rms_norm_eps == 1e-5 && c.rope_theta == 1e6 && c.tie_word_embeddings == 0);
    CHECK(c.quant.present && c.quant.n_overrides == 0 && c.quant.bits == 4);
    mx_config_free(&c);

    load_fixture(fx, "olmoe_tiny", &c);
    CHECK(strcmp(c.model_type, "olmoe") == 0);
    CHECK(c.num_experts == 16 && c.num_experts_per_tok == 4 && c.norm_topk_prob == 0);
    CHECK(c.clip_qkv < 0 && c.attention_bias == 0 && c.rope_theta == 10000.0);
    CHECK(c.hidden_size == 128 && c.intermediate_size == 192 && c.num_key_value_heads == 4);
    CHECK(c.sliding_window == MX_UNSET);
    mx_config_free(&c);
}

/* text_config's quantization block replaces the top level's (found by
 * fuzz_config: the overrides of both were mixed and half of them unset). */
static void test_text_config_quant(void)
{
    const char *j = "{\"model_type\":\"qwen3_vl_moe\",\"quantization\":{\"bits\":4,\"group_size\":64,"
                    "\"a.gate\":{\"bits\":8}},\"text_config\":{\"quantization\":{\"bits\":4,"
                    "\"group_size\":32,\"b.gate\":{\"bits\":8},\"c.gate\":{\"bits\":6}}}}";
    mx_config c;
    mx_err e = {0};
    CHECK_OK(mx_config_parse(j, "t/config.json", &c, &e), &e);
    int bits = 0, gs = 0;
    CHECK(c.quant.n_overrides == 2);
    CHECK(mx_quant_for(&c.quant, "c.gate", &bits, &gs) && bits == 6 && gs == 32);
    CHECK(mx_quant_for(&c.quant, "a.gate", &bits, &gs) && bits == 4 && gs == 32);
    mx_config_free(&c);
}

int main(void)
{
    test_text_config_quant();
    test_defaults();
    test_inline();
    test_errors();
    test_load();
    const char *fx = getenv("MLXCEL_FIXTURES");
    if (fx && *fx && (fx = test_fixtures()))
        test_fixtures_configs(fx);
    else
        fprintf(stderr, "note: MLXCEL_FIXTURES unset; fixture checks skipped\n");
    return test_summary();
}
