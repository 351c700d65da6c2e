/* test_inspect.c - `mlxcel inspect --json` on every fixture: its facts are
 * checked against config.json and the safetensors headers, read here
 * independently (cJSON on config.json; raw header bytes for sizes). */
#include "test.h"

#include <cjson/cJSON.h>
#include <stdint.h>

#include "format/safetensors.h"
#include "util/err.h"
#include "util/file.h"

static const char *const fixtures[] = {
    "qwen2_moe_tiny_chat", "qwen2_moe_gqa_mixed", "qwen3_moe_tiny", "mixtral_tiny", "olmoe_tiny",
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
        CHECK(!strcmp(cJSON_GetObjectItem(o, "model_type")->valuestring, mt));
        static const char *same[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads", "num_experts_per_tok"};
        for (size_t k = 0; k < sizeof same / sizeof *same; k++)
            CHECKF(num(o, same[k]) == num(c, same[k]), "%s: %s inspect %g config %g", fixtures[i],
                   same[k], num(o, same[k]), num(c, same[k]));
        double ne = num(c, "num_experts") > 0 ? num(c, "num_experts") : num(c, "num_local_experts");
        CHECKF(num(o, "num_experts") == ne, "%s: num_experts", fixtures[i]);
        double hd = num(c, "head_dim") > 0 ? num(c, "head_dim") : num(c, "hidden_size") / num(c, "num_attention_heads");
        CHECKF(num(o, "head_dim") == hd, "%s: head_dim", fixtures[i]);
        double dff = num(c, "moe_intermediate_size") > 0 ? num(c, "moe_intermediate_size") : num(c, "intermediate_size");
        CHECKF(num(o, "moe_intermediate_size") == dff, "%s: expert width", fixtures[i]);
        cJSON *tie = cJSON_GetObjectItem(c, "tie_word_embeddings");
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(o, "tie_word_embeddings")) == cJSON_IsTrue(tie));

        /* layout: stacked iff any tensor name has switch_mlp */
        mx_st_set *st = NULL;
        CHECK_OK(mx_st_open_dir(dir, &st, &e), &e);
        if (st) {
            int stacked = 0;
            uint64_t bytes = 0;
            for (size_t t = 0; t < mx_st_count(st); t++) {
                stacked |= strstr(mx_st_at(st, t)->name, "switch_mlp") != NULL;
                bytes += mx_st_at(st, t)->nbytes;
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
        /* KV cache: 2 * layers * kv_heads * head_dim * ctx * 4 bytes */
        double kv = 2.0 * num(c, "num_hidden_layers") * num(c, "num_key_value_heads") * hd * 1000 * 4;
        CHECKF(num(o, "kv_cache_bytes") == kv, "%s: kv bytes %g want %g", fixtures[i], num(o, "kv_cache_bytes"), kv);
        /* quantization of the routed experts' down projection: from the
         * config's override when there is one for layer 0, else default */
        const cJSON *q = cJSON_GetObjectItem(c, "quantization");
        int bits = (int)num(q, "bits");
        const char *blk = !strcmp(mt, "mixtral") ? "block_sparse_moe" : "mlp";
        char key[128];
        snprintf(key, sizeof key, "model.layers.0.%s.switch_mlp.down_proj", blk);
        if (cJSON_GetObjectItem(q, key))
            bits = (int)num(cJSON_GetObjectItem(q, key), "bits");
        const cJSON *down = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "quantization"), "experts.down");
        CHECKF(down && cJSON_GetArraySize(down) == 1 && num(cJSON_GetArrayItem(down, 0), "bits") == bits,
               "%s: experts.down bits", fixtures[i]);
    next:
        cJSON_Delete(o);
        cJSON_Delete(c);
        free(ctext);
        free(out);
    }
    return test_summary();
}
