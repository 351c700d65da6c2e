/* test_inspect.c - `mlxcel inspect --json` on every fixture: its facts are
 * checked against config.json and the safetensors headers, read here
 * independently (cJSON on config.json, the language model's keys under
 * text_config where it nests them; raw header bytes for sizes): dimensions,
 * expert layout, sizes, the KV cache, the kind and attention of every
 * layer, the router, norms, rope, and the quantization of tensor classes. */
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>

#include "format/safetensors.h"
#include "util/err.h"
#include "util/file.h"

static const char *const fixtures[] = {
    "qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed", "qwen3_moe_tiny", "mixtral_tiny", "olmoe_tiny",
    "dots1_tiny", "phimoe_tiny", "qwen3_vl_moe_tiny", "minimax_tiny", "gemma4_tiny",
};

static char *run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    if (buf)
        buf[n] = 0;
    int st = pclose(p);
    if (st != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* A key of the language model's config: text_config's when it nests one. */
static const cJSON *key(const cJSON *c, const char *k)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text_config");
    const cJSON *v = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, k) : NULL;
    return v ? v : cJSON_GetObjectItemCaseSensitive(c, k);
}

static double cnum(const cJSON *c, const char *k)
{
    const cJSON *v = key(c, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int flag(const cJSON *o, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* The layers, router, norms and rope of model type mt against what
 * config.json c says (and, per family, what its config leaves implicit:
 * the routing rule and norm kind a model type has). */
static void check_structure(const char *fx, const char *mt, const cJSON *o, const cJSON *c)
{
    const int L = (int)cnum(c, "num_hidden_layers");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(o, "layers");
    CHECKF(cJSON_GetArraySize(layers) == L, "%s: %d layer entries", fx, cJSON_GetArraySize(layers));
    const cJSON *types = key(c, "layer_types");
    const int first_dense = cnum(c, "first_k_dense_replace") > 0 ? (int)cnum(c, "first_k_dense_replace") : 0;
    const int parallel = cJSON_IsTrue(key(c, "enable_moe_block"));
    const double hd = cnum(c, "head_dim") > 0 ? cnum(c, "head_dim")
                                              : cnum(c, "hidden_size") / cnum(c, "num_attention_heads");
    int bad = 0;
    for (int l = 0; l < L; l++) {
        const cJSON *x = cJSON_GetArrayItem(layers, l);
        int dense = l < first_dense;
        const cJSON *mo = key(c, "mlp_only_layers");
        for (int i = 0; i < cJSON_GetArraySize(mo); i++)
            dense |= cJSON_GetArrayItem(mo, i)->valueint == l;
        const char *want_kind = dense ? "dense" : parallel ? "parallel" : "moe";
        const cJSON *ty = cJSON_GetArrayItem(types, l);
        int full = !cJSON_IsString(ty) || !strcmp(ty->valuestring, "full_attention");
        /* sliding layers: as the config's window; full layers with
         * global_head_dim: that head size and, K = V, the global kv heads */
        double want_hd = hd, want_kv = cnum(c, "num_key_value_heads"), window = 0;
        int k_eq_v = 0;
        if (cJSON_IsString(ty) && !full)
            window = cnum(c, "sliding_window");
        if (cJSON_IsString(ty) && full && cnum(c, "global_head_dim") > 0) {
            want_hd = cnum(c, "global_head_dim");
            k_eq_v = cJSON_IsTrue(key(c, "attention_k_eq_v"));
            if (k_eq_v)
                want_kv = cnum(c, "num_global_key_value_heads");
        }
        int ok = !strcmp(str(x, "kind"), want_kind) &&
                 !strcmp(str(x, "attention"), full ? "full" : "sliding") && num(x, "window") == window &&
                 num(x, "head_dim") == want_hd && num(x, "kv_heads") == want_kv &&
                 flag(x, "k_eq_v") == k_eq_v && num(x, "heads") == cnum(c, "num_attention_heads");
        if (!ok && bad++ < 3)
            fprintf(stderr, "%s layer %d: %s %s window %g hd %g kv %g k=v %d; want %s %s %g %g %g %d\n", fx,
                    l, str(x, "kind"), str(x, "attention"), num(x, "window"), num(x, "head_dim"),
                    num(x, "kv_heads"), flag(x, "k_eq_v"), want_kind, full ? "full" : "sliding", window,
                    want_hd, want_kv, k_eq_v);
    }
    CHECKF(bad == 0, "%s: %d layers described wrongly", fx, bad);

    /* the routing rule each model type has (its config names the knobs) */
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "router");
    const int sigmoid = !strcmp(mt, "dots1") || !strcmp(mt, "minimax_m2");
    const char *want_router = sigmoid ? "sigmoid" : !strcmp(mt, "phimoe") ? "sparsemixer" : "softmax_topk";
    CHECKF(!strcmp(str(r, "kind"), want_router), "%s: router %s, want %s", fx, str(r, "kind"), want_router);
    CHECK(num(r, "top_k") == (cnum(c, "num_experts_per_tok") > 0 ? cnum(c, "num_experts_per_tok")
                                                                : cnum(c, "top_k_experts")));
    CHECK(flag(r, "choice_bias") == sigmoid);
    CHECK(num(r, "n_group") == (cnum(c, "n_group") > 0 ? cnum(c, "n_group") : 1));
    CHECK(num(r, "topk_group") == (cnum(c, "topk_group") > 0 ? cnum(c, "topk_group") : num(r, "n_group")));
    if (sigmoid)
        CHECK(num(r, "scaling_factor") == (cnum(c, "routed_scaling_factor") > 0 ? cnum(c, "routed_scaling_factor") : 1));
    if (!strcmp(mt, "phimoe"))
        CHECK(fabs(num(r, "jitter") - cnum(c, "router_jitter_noise")) < 1e-6);
    CHECK(flag(r, "input_scale") == parallel && flag(r, "expert_scale") == parallel);
    /* mlx-lm keeps dots1's router a bare (unquantized) parameter */
    CHECK(flag(r, "quantized") == (strcmp(mt, "dots1") != 0));

    CHECK(!strcmp(str(o, "norm"), !strcmp(mt, "phimoe") ? "layernorm" : "rmsnorm"));
    CHECK(flag(o, "qkv_bias") == (cJSON_IsTrue(key(c, "attention_bias")) || !strcmp(mt, "qwen2_moe")));
    CHECK(flag(o, "o_bias") == cJSON_IsTrue(key(c, "attention_bias")));
    CHECK(flag(o, "lm_head_bias") == cJSON_IsTrue(key(c, "lm_head_bias")));
    CHECK(flag(o, "v_norm") == parallel);
    const char *act = cJSON_IsString(key(c, "hidden_activation")) ? key(c, "hidden_activation")->valuestring
                      : cJSON_IsString(key(c, "hidden_act"))      ? key(c, "hidden_act")->valuestring : "silu";
    CHECK(!strcmp(str(o, "activation"), !strcmp(act, "silu") ? "silu" : "gelu_tanh"));
    CHECK(num(o, "final_logit_softcap") == (cnum(c, "final_logit_softcapping") > 0 ? cnum(c, "final_logit_softcapping") : 0));

    /* rope: one per layer type where rope_parameters has one per type;
     * rotated dims from partial_rotary_factor / rotary_dim */
    const cJSON *ropes = cJSON_GetObjectItemCaseSensitive(o, "rope");
    const cJSON *rp = key(c, "rope_parameters");
    if (!cJSON_IsObject(rp))
        rp = key(c, "rope_scaling");
    const cJSON *per_type = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    CHECKF(cJSON_GetArraySize(ropes) == (per_type ? 2 : 1), "%s: %d ropes", fx, cJSON_GetArraySize(ropes));
    for (int i = 0; i < cJSON_GetArraySize(ropes); i++) {
        const cJSON *x = cJSON_GetArrayItem(ropes, i);
        const cJSON *p = per_type ? cJSON_GetObjectItemCaseSensitive(rp, i ? "full_attention" : "sliding_attention") : rp;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "rope_type");
        if (!cJSON_IsString(t))
            t = cJSON_GetObjectItemCaseSensitive(p, "type");
        const char *type = cJSON_IsString(t) ? t->valuestring : "default";
        double part = num(p, "partial_rotary_factor") > 0 ? num(p, "partial_rotary_factor")
                                                          : cnum(c, "partial_rotary_factor");
        double rhd = i ? cnum(c, "global_head_dim") : hd;
        double rot = part > 0 ? rhd * part : cnum(c, "rotary_dim") > 0 ? cnum(c, "rotary_dim") : rhd;
        CHECKF(!strcmp(str(x, "type"), type) && num(x, "head_dim") == rhd && num(x, "rotated_dims") == rot,
               "%s rope %d: %s hd %g rotated %g, want %s %g %g", fx, i, str(x, "type"), num(x, "head_dim"),
               num(x, "rotated_dims"), type, rhd, rot);
        if (!strcmp(type, "longrope"))
            CHECK(num(x, "original_max_position_embeddings") == cnum(c, "original_max_position_embeddings") &&
                  fabs(num(x, "short_mscale") - num(p, "short_mscale")) < 1e-6);
    }
}

int main(void)
{
    const char *root = test_fixtures();
    if (!root)
        return TEST_SKIP;
    const char *bin = getenv("MLXCEL_BIN");
    if (!bin)
        bin = "build/mlxcel";
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        char dir[1024], cmd[2200], path[1100];
        snprintf(dir, sizeof dir, "%s/%s", root, fixtures[i]);
        snprintf(cmd, sizeof cmd, "'%s' inspect -m '%s' --ctx 1000 --json", bin, dir);
        char *out = run(cmd);
        CHECKF(out != NULL, "%s failed", cmd);
        if (!out)
            continue;
        cJSON *o = cJSON_Parse(out);
        CHECKF(o != NULL, "inspect output is not JSON: %s", out);
        snprintf(path, sizeof path, "%s/config.json", dir);
        char *ctext = NULL;
        mx_err e = {0};
        CHECK_OK(mx_read_file(path, &ctext, NULL, &e), &e);
        cJSON *c = ctext ? cJSON_Parse(ctext) : NULL;
        if (!o || !c)
            goto next;
        const char *mt = cJSON_GetObjectItem(c, "model_type")->valuestring;
        CHECK(!strcmp(str(o, "model_type"), mt) && !strcmp(str(o, "family"), mt));
        static const char *same[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads"};
        for (size_t k = 0; k < sizeof same / sizeof *same; k++)
            CHECKF(num(o, same[k]) == cnum(c, same[k]), "%s: %s inspect %g config %g", fixtures[i],
                   same[k], num(o, same[k]), cnum(c, same[k]));
        double topk = cnum(c, "num_experts_per_tok") > 0 ? cnum(c, "num_experts_per_tok") : cnum(c, "top_k_experts");
        CHECKF(num(o, "num_experts_per_tok") == topk, "%s: top-k", fixtures[i]);
        double ne = cnum(c, "num_experts") > 0       ? cnum(c, "num_experts")
                    : cnum(c, "num_local_experts") > 0 ? cnum(c, "num_local_experts")
                                                       : cnum(c, "n_routed_experts");
        CHECKF(num(o, "num_experts") == ne, "%s: num_experts", fixtures[i]);
        double hd = cnum(c, "head_dim") > 0 ? cnum(c, "head_dim") : cnum(c, "hidden_size") / cnum(c, "num_attention_heads");
        CHECKF(num(o, "head_dim") == hd, "%s: head_dim", fixtures[i]);
        double dff = cnum(c, "moe_intermediate_size") > 0 ? cnum(c, "moe_intermediate_size") : cnum(c, "intermediate_size");
        CHECKF(num(o, "moe_intermediate_size") == dff, "%s: expert width", fixtures[i]);
        const cJSON *tie = key(c, "tie_word_embeddings");
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(o, "tie_word_embeddings")) == cJSON_IsTrue(tie));
        check_structure(fixtures[i], mt, o, c);

        /* layout: stacked iff any tensor name has switch_mlp */
        mx_st_set *st = NULL;
        CHECK_OK(mx_st_open_dir(dir, &st, &e), &e);
        if (st) {
            /* stacked: an expert tensor with a leading expert dimension */
            int stacked = 0;
            uint64_t bytes = 0;
            for (size_t t = 0; t < mx_st_count(st); t++) {
                const mx_tensor *x = mx_st_at(st, t);
                stacked |= x->ndim == 3 && x->shape[0] == (int64_t)ne;
                bytes += x->nbytes;
            }
            const char *lay = cJSON_GetObjectItem(o, "expert_layout")->valuestring;
            CHECKF(!strcmp(lay, stacked ? "stacked" : "per-expert"), "%s: layout %s", fixtures[i], lay);
            CHECKF(num(o, "tensors") == (double)mx_st_count(st), "%s: tensor count", fixtures[i]);
            /* every weight byte is a tensor byte; the headers add a little */
            CHECKF(num(o, "weight_bytes") == (double)bytes, "%s: weight bytes %g vs tensor bytes %llu",
                   fixtures[i], num(o, "weight_bytes"), (unsigned long long)bytes);
            CHECKF(num(o, "bytes_on_disk") > (double)bytes && num(o, "bytes_on_disk") < (double)bytes + 1e6,
                   "%s: bytes on disk %g", fixtures[i], num(o, "bytes_on_disk"));
            mx_st_close(st);
        }
        /* KV cache: 2 * sum over layers of kv_heads * head_dim * ctx * 4 bytes
         * (each layer's own geometry, as checked above) */
        double kv = 0;
        const cJSON *lay = cJSON_GetObjectItem(o, "layers");
        for (int l = 0; l < cJSON_GetArraySize(lay); l++)
            kv += 2.0 * num(cJSON_GetArrayItem(lay, l), "kv_heads") * num(cJSON_GetArrayItem(lay, l), "head_dim") * 1000 * 4;
        CHECKF(num(o, "kv_cache_bytes") == kv, "%s: kv bytes %g want %g", fixtures[i], num(o, "kv_cache_bytes"), kv);
        /* quantization of the routed experts' down projection: from the
         * config's override when there is one for layer 0, else default */
        const cJSON *q = cJSON_GetObjectItem(c, "quantization");
        int bits = (int)num(q, "bits");
        const char *blk = !strcmp(mt, "mixtral") ? "block_sparse_moe" : "mlp";
        char qkey[128];
        snprintf(qkey, sizeof qkey, "model.layers.0.%s.switch_mlp.down_proj", blk);
        if (cJSON_GetObjectItem(q, qkey))
            bits = (int)num(cJSON_GetObjectItem(q, qkey), "bits");
        const cJSON *qo = cJSON_GetObjectItem(o, "quantization");
        const cJSON *down = cJSON_GetObjectItem(qo, "experts.down");
        CHECKF(down && cJSON_GetArraySize(down) == 1 && num(cJSON_GetArrayItem(down, 0), "bits") == bits,
               "%s: experts.down bits", fixtures[i]);
        /* the routers: an 8-bit per-module override, the default bits, or
         * (dots1) not quantized at all, as the tensors in the file say */
        const cJSON *router = cJSON_GetObjectItem(qo, "router");
        int want_rbits = (int)num(q, "bits");
        for (const cJSON *it = q ? q->child : NULL; it; it = it->next)
            if (cJSON_IsObject(it) && (strstr(it->string, ".gate") || strstr(it->string, "router")) &&
                !strstr(it->string, "shared_expert_gate") && !strstr(it->string, "proj"))
                want_rbits = (int)num(it, "bits");
        if (!strncmp(mt, "gemma4", 6))   /* router.proj */
            for (const cJSON *it = q ? q->child : NULL; it; it = it->next)
                if (cJSON_IsObject(it) && strstr(it->string, "router.proj"))
                    want_rbits = (int)num(it, "bits");
        if (!strcmp(mt, "dots1"))
            want_rbits = 0;
        CHECKF(router && cJSON_GetArraySize(router) == 1 && num(cJSON_GetArrayItem(router, 0), "bits") == want_rbits,
               "%s: router bits %g, want %d", fixtures[i], num(cJSON_GetArrayItem(router, 0), "bits"), want_rbits);
        /* Gemma 4's MoE layers run a dense MLP too; the others only in
         * their dense layers */
        CHECK((cJSON_GetObjectItem(qo, "dense_mlp") != NULL) ==
              (cJSON_IsTrue(key(c, "enable_moe_block")) || cnum(c, "first_k_dense_replace") > 0 ||
               cJSON_GetArraySize(key(c, "mlp_only_layers")) > 0));
    next:
        cJSON_Delete(o);
        cJSON_Delete(c);
        free(ctext);
        free(out);
    }
    return test_summary();
}
