/* test_synth.c - synthetic checkpoints: the `tiny` preset written in every
 * layout / bit width / group size / scale dtype combination is read back with
 * the safetensors reader and the dequantizer, and must reproduce exactly the
 * weights synth meant to write; names, dtypes and shapes are checked against
 * the architecture; config.json, the index of a sharded checkpoint and
 * tokenizer.json are checked for consistency. */
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "chat/template.h"
#include "format/config.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "moe/moe.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "test.h"
#include "tokenizer/tokenizer.h"
#include "util/dtype.h"
#include "util/half.h"
#include "util/clock.h"
#include "util/file.h"

/* ---- temp dirs --------------------------------------------------------- */

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static char *make_tmp(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/mlxcel_synth_XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static float to_f32(const void *p, size_t i, mx_dtype t)
{
    switch (t) {
    case MX_F16: return mx_f16_to_f32(((const uint16_t *)p)[i]);
    case MX_BF16: return mx_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* ---- the shapes an architecture implies (written independently of the
 * plan, from the preset dimensions and mlx-lm's naming) ------------------ */

typedef struct expect {
    char name[160];
    mx_dtype dtype;
    int ndim;
    int64_t shape[3];
} expect;

typedef struct expect_list {
    expect *v;
    int n, cap;
} expect_list;

static void ex_add(expect_list *l, const char *name, mx_dtype t, int ndim, int64_t a, int64_t b,
                   int64_t c)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    expect *x = &l->v[l->n++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = t;
    x->ndim = ndim;
    x->shape[0] = a;
    x->shape[1] = b;
    x->shape[2] = c;
}

/* Quantized linear [E?, out, in] at bits/gs. */
static void ex_quant(expect_list *l, const char *m, int64_t E, int64_t out, int64_t in, int bits,
                     int gs, mx_dtype sdt)
{
    char n[160];
    int nd = E ? 3 : 2;
    int64_t s0 = E ? E : out, s1 = E ? out : in * bits / 32, s2 = E ? in * bits / 32 : 0;
    snprintf(n, sizeof n, "%s.weight", m);
    ex_add(l, n, MX_U32, nd, s0, s1, s2);
    s1 = E ? out : in / gs;
    s2 = E ? in / gs : 0;
    snprintf(n, sizeof n, "%s.scales", m);
    ex_add(l, n, sdt, nd, s0, s1, s2);
    snprintf(n, sizeof n, "%s.biases", m);
    ex_add(l, n, sdt, nd, s0, s1, s2);
}

/* tiny: qwen2_moe, vocab 512, hidden 128, 2 layers, 4 heads / 2 kv (dim 32),
 * 8 experts of width 128, shared expert 256, q/k/v bias, untied, bf16. */
static void expect_tiny(expect_list *l, int stacked, int bits, int gs, mx_dtype sdt)
{
    const mx_dtype md = MX_BF16;
    char m[160];
    ex_quant(l, "model.embed_tokens", 0, 512, 128, bits, gs, sdt);
    ex_quant(l, "lm_head", 0, 512, 128, bits, gs, sdt);
    ex_add(l, "model.norm.weight", md, 1, 128, 0, 0);
    for (int i = 0; i < 2; i++) {
        snprintf(m, sizeof m, "model.layers.%d.input_layernorm.weight", i);
        ex_add(l, m, md, 1, 128, 0, 0);
        snprintf(m, sizeof m, "model.layers.%d.post_attention_layernorm.weight", i);
        ex_add(l, m, md, 1, 128, 0, 0);
        static const char *const qkv[3] = {"q", "k", "v"};
        for (int k = 0; k < 3; k++) {
            int64_t out = k == 0 ? 128 : 64;
            snprintf(m, sizeof m, "model.layers.%d.self_attn.%s_proj", i, qkv[k]);
            ex_quant(l, m, 0, out, 128, bits, gs, sdt);
            snprintf(m, sizeof m, "model.layers.%d.self_attn.%s_proj.bias", i, qkv[k]);
            ex_add(l, m, md, 1, out, 0, 0);
        }
        snprintf(m, sizeof m, "model.layers.%d.self_attn.o_proj", i);
        ex_quant(l, m, 0, 128, 128, bits, gs, sdt);
        snprintf(m, sizeof m, "model.layers.%d.mlp.gate", i);
        ex_quant(l, m, 0, 8, 128, 8, 64, sdt);
        snprintf(m, sizeof m, "model.layers.%d.mlp.shared_expert_gate", i);
        ex_quant(l, m, 0, 1, 128, 8, 64, sdt);
        snprintf(m, sizeof m, "model.layers.%d.mlp.shared_expert.gate_proj", i);
        ex_quant(l, m, 0, 256, 128, bits, gs, sdt);
        snprintf(m, sizeof m, "model.layers.%d.mlp.shared_expert.up_proj", i);
        ex_quant(l, m, 0, 256, 128, bits, gs, sdt);
        snprintf(m, sizeof m, "model.layers.%d.mlp.shared_expert.down_proj", i);
        ex_quant(l, m, 0, 128, 256, bits, gs, sdt);
        if (stacked) {
            snprintf(m, sizeof m, "model.layers.%d.mlp.switch_mlp.gate_proj", i);
            ex_quant(l, m, 8, 128, 128, bits, gs, sdt);
            snprintf(m, sizeof m, "model.layers.%d.mlp.switch_mlp.up_proj", i);
            ex_quant(l, m, 8, 128, 128, bits, gs, sdt);
            snprintf(m, sizeof m, "model.layers.%d.mlp.switch_mlp.down_proj", i);
            ex_quant(l, m, 8, 128, 128, bits, gs, sdt);
        } else {
            for (int x = 0; x < 8; x++) {
                snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d.gate_proj", i, x);
                ex_quant(l, m, 0, 128, 128, bits, gs, sdt);
                snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d.up_proj", i, x);
                ex_quant(l, m, 0, 128, 128, bits, gs, sdt);
                snprintf(m, sizeof m, "model.layers.%d.mlp.experts.%d.down_proj", i, x);
                ex_quant(l, m, 0, 128, 128, bits, gs, sdt);
            }
        }
    }
}

/* ---- checks ------------------------------------------------------------ */

static void check_shapes(const mx_st_set *set, const expect_list *l)
{
    CHECKF(mx_st_count(set) == (size_t)l->n, "%zu tensors in file, %d expected",
           mx_st_count(set), l->n);
    for (int i = 0; i < l->n; i++) {
        const expect *x = &l->v[i];
        const mx_tensor *t = mx_st_find(set, x->name);
        CHECKF(t != NULL, "missing %s", x->name);
        if (!t)
            continue;
        int ok = t->dtype == x->dtype && t->ndim == x->ndim;
        for (int d = 0; ok && d < x->ndim; d++)
            ok = t->shape[d] == x->shape[d];
        CHECKF(ok, "%s: %s ndim %d [%lld %lld %lld], expected %s ndim %d [%lld %lld %lld]",
               x->name, mx_dtype_name(t->dtype), t->ndim, (long long)t->shape[0],
               (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)(t->ndim > 2 ? t->shape[2] : 0),
               mx_dtype_name(x->dtype), x->ndim, (long long)x->shape[0], (long long)x->shape[1],
               (long long)x->shape[2]);
    }
}

/* Every quantized row dequantizes to exactly what synth meant; every float
 * vector holds its expected values.  Also: the config's quantization block
 * names the bits/group each module was written with, some scales are
 * negative and rows have the intended spread. */
static void check_values(const mx_st_set *set, const mx_synth_plan *plan, const mx_config *cfg)
{
    int64_t rows_checked = 0, bad_rows = 0, neg_scales = 0, scales_seen = 0;
    int bad_spread = 0;
    for (size_t i = 0; i < plan->n; i++) {
        const mx_synth_tensor *pt = &plan->t[i];
        if (pt->kind == MX_SYNTH_QSCALES || pt->kind == MX_SYNTH_QBIASES)
            continue;
        const mx_tensor *t = mx_st_find(set, pt->name);
        if (!t)
            continue;   /* reported by check_shapes */
        float *want = malloc((size_t)pt->cols * sizeof *want);
        float *got = malloc((size_t)pt->cols * sizeof *got);
        mx_err e;
        if (pt->kind != MX_SYNTH_QWEIGHT) {
            /* a vector, or each row of an unquantized matrix */
            int same = 1;
            for (int64_t r = 0; r < pt->rows; r++) {
                CHECK_OK(mx_synth_expected_row(plan, pt->name, 0, r, want, &e), &e);
                for (int64_t c = 0; c < pt->cols; c++)
                    same &= to_f32(t->data, (size_t)(r * pt->cols + c), t->dtype) == want[c];
            }
            CHECKF(same, "%s: float values differ from expected", pt->name);
            CHECK(t->dtype == pt->dtype);
            if (pt->kind == MX_SYNTH_NORM)
                CHECKF(want[0] > 0.85f && want[0] < 1.15f, "%s: norm weight %g not near 1",
                       pt->name, want[0]);
            free(want);
            free(got);
            continue;
        }
        char sn[160], bn[160];
        snprintf(sn, sizeof sn, "%s.scales", pt->module);
        snprintf(bn, sizeof bn, "%s.biases", pt->module);
        const mx_tensor *ts = mx_st_find(set, sn), *tb = mx_st_find(set, bn);
        int cbits = 0, cgs = 0;
        int q = mx_quant_for(&cfg->quant, pt->module, &cbits, &cgs);
        CHECKF(q == 1 && cbits == pt->bits && cgs == pt->group_size,
               "%s: config says bits %d group %d, written %d/%d", pt->module, cbits, cgs,
               pt->bits, pt->group_size);
        for (int64_t m = 0; m < pt->nmat; m++) {
            mx_qmat qm;
            /* bits <= 0: infer from shapes, which must agree with the config */
            int rc = mx_qmat_from_tensors(t, ts, tb, -1, cgs, m, pt->module, &qm, &e);
            CHECK_OK(rc, &e);
            if (rc)
                break;
            CHECKF(qm.bits == pt->bits, "%s: inferred bits %d", pt->module, qm.bits);
            double sum2 = 0;
            for (int64_t r = 0; r < pt->rows; r++) {
                if (mx_synth_expected_row(plan, pt->module, m, r, want, &e) != MX_OK) {
                    CHECK_OK(e.code, &e);
                    break;
                }
                mx_qmat_row(&qm, r, got);
                rows_checked++;
                if (memcmp(want, got, (size_t)pt->cols * sizeof *got) != 0) {
                    if (bad_rows++ < 5)
                        fprintf(stderr, "%s[%lld][%lld]: dequantized row differs (%g vs %g)\n",
                                pt->module, (long long)m, (long long)r, got[0], want[0]);
                }
                /* spot check the element accessor too */
                if (mx_qmat_get(&qm, r, pt->cols - 1) != want[pt->cols - 1] && bad_rows++ < 5)
                    fprintf(stderr, "%s[%lld][%lld]: mx_qmat_get differs\n", pt->module,
                            (long long)m, (long long)r);
                for (int64_t c = 0; c < pt->cols; c++)
                    sum2 += (double)want[c] * want[c];
                int64_t ng = pt->cols / pt->group_size;
                for (int64_t g = 0; g < ng; g++) {
                    float s = to_f32(qm.scales, (size_t)(r * ng + g), qm.sdtype);
                    neg_scales += s < 0;
                    scales_seen++;
                }
            }
            /* rms of the weights ~ gain / sqrt(fan_in) */
            double rms = sqrt(sum2 / (double)(pt->rows * pt->cols));
            double target = pt->gain / sqrt((double)pt->cols);
            if (!(rms > 0.6 * target && rms < 1.6 * target) && bad_spread++ < 5)
                fprintf(stderr, "%s: rms %g, intended %g\n", pt->module, rms, target);
        }
        free(want);
        free(got);
    }
    CHECKF(bad_rows == 0, "%lld of %lld rows differ", (long long)bad_rows, (long long)rows_checked);
    CHECKF(bad_spread == 0, "%d matrices with the wrong spread", bad_spread);
    CHECKF(neg_scales > scales_seen / 10 && neg_scales < scales_seen / 2,
           "%lld negative scales of %lld", (long long)neg_scales, (long long)scales_seen);
    CHECK(rows_checked > 1000);
}

static void check_config(const char *dir, int bits, int gs)
{
    mx_config c;
    mx_err e;
    memset(&c, 0, sizeof c);
    int rc = mx_config_load(dir, &c, &e);
    CHECK_OK(rc, &e);
    if (rc)
        return;
    CHECK(!strcmp(c.model_type, "qwen2_moe"));
    CHECK(c.vocab_size == 512 && c.hidden_size == 128 && c.num_hidden_layers == 2);
    CHECK(c.num_attention_heads == 4 && c.num_key_value_heads == 2);
    CHECK(c.num_experts == 8 && c.num_experts_per_tok == 2);
    CHECK(c.moe_intermediate_size == 128 && c.shared_expert_intermediate_size == 256);
    CHECK(c.intermediate_size == 256);
    CHECK(c.norm_topk_prob == 0 && c.tie_word_embeddings == 0);
    CHECK(fabs(c.rope_theta - 1e6) < 1e-3 && fabs(c.rms_norm_eps - 1e-6) < 1e-12);
    CHECK(c.quant.present && c.quant.bits == bits && c.quant.group_size == gs);
    CHECK(c.n_eos >= 1 && c.eos_token_ids[0] == 511);
    int b = 0, g = 0;
    CHECK(mx_quant_for(&c.quant, "model.layers.1.mlp.gate", &b, &g) == 1 && b == 8 && g == 64);
    CHECK(mx_quant_for(&c.quant, "model.layers.1.mlp.shared_expert_gate", &b, &g) == 1 && b == 8);
    CHECK(mx_quant_for(&c.quant, "model.layers.1.mlp.shared_expert.gate_proj", &b, &g) == 1 &&
          b == bits && g == gs);
    mx_config_free(&c);
}

/* tokenizer.json: every id < vocab_size present exactly once (vocab + added
 * tokens), merges only join existing tokens into the token of id 256 + i,
 * specials at the top. */
static void check_tokenizer(const char *dir, int vocab)
{
    char path[4096], *text = NULL;
    size_t len;
    mx_err e;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK_OK(mx_read_file(path, &text, &len, &e), &e);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL);
    if (!root)
        return;
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON *v = cJSON_GetObjectItem(model, "vocab");
    cJSON *merges = cJSON_GetObjectItem(model, "merges");
    cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    CHECK(cJSON_IsObject(v) && cJSON_IsArray(merges) && cJSON_IsArray(added));
    char *seen = calloc((size_t)vocab, 1);
    int dup = 0, out_of_range = 0, n = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, v) {
        int id = it->valueint;
        n++;
        if (id < 0 || id >= vocab)
            out_of_range++;
        else
            dup += seen[id]++ > 0;
    }
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItem(it, "id")->valueint;
        n++;
        if (id < 0 || id >= vocab)
            out_of_range++;
        else
            dup += seen[id]++ > 0;
    }
    CHECKF(n == vocab && dup == 0 && out_of_range == 0, "%d tokens, %d dup, %d out of range",
           n, dup, out_of_range);
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 2), "content")->valuestring,
                  "<|im_end|>"));
    CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 2), "id")->valueint == vocab - 1);
    CHECK(cJSON_GetArraySize(merges) == vocab - 3 - 256);
    int bad = 0, i = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a = cJSON_GetArrayItem(it, 0)->valuestring;
        const char *b = cJSON_GetArrayItem(it, 1)->valuestring;
        char joined[256];
        snprintf(joined, sizeof joined, "%s%s", a, b);
        cJSON *ia = cJSON_GetObjectItem(v, a), *ib = cJSON_GetObjectItem(v, b);
        cJSON *ij = cJSON_GetObjectItem(v, joined);
        if (!ia || !ib || !ij || ij->valueint != 256 + i || ia->valueint >= ij->valueint ||
            ib->valueint >= ij->valueint)
            bad++;
        i++;
    }
    CHECKF(bad == 0, "%d bad merges", bad);
    /* byte tokens: "!" is 0 and the space maps to U+0120 (id 220), as in GPT-2 */
    CHECK(cJSON_GetObjectItem(v, "!")->valueint == 0);
    CHECK(cJSON_GetObjectItem(v, "\xc4\xa0")->valueint == 220);
    free(seen);
    cJSON_Delete(root);
}

typedef struct variant {
    mx_synth_layout layout;
    int bits, gs;
    int sdtype;   /* -1: model dtype (bf16) */
} variant;

static void run_variant(const variant *vr)
{
    char *dir = make_tmp();
    CHECK(dir != NULL);
    if (!dir)
        return;
    fprintf(stderr, "tiny %s bits %d group %d scales %s\n",
            vr->layout == MX_SYNTH_STACKED ? "stacked" : "per-expert", vr->bits, vr->gs,
            vr->sdtype < 0 ? "default" : mx_dtype_name((mx_dtype)vr->sdtype));
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    o.preset = "tiny";
    o.layout = vr->layout;
    o.bits = vr->bits;
    o.group_size = vr->gs;
    o.scale_dtype = vr->sdtype;
    o.seed = 7;
    mx_err e;
    int rc = mx_synth_write(&o, dir, &e);
    CHECK_OK(rc, &e);
    mx_synth_plan plan;
    mx_st_set *set = NULL;
    mx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (rc == MX_OK && mx_synth_plan_build(&o, &plan, &e) == MX_OK) {
        CHECK(plan.nshards == 1);
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        CHECK(access(p, F_OK) == 0);
        rc = mx_st_open_dir(dir, &set, &e);
        CHECK_OK(rc, &e);
        int crc = mx_config_load(dir, &cfg, &e);
        CHECK_OK(crc, &e);
        if (rc == MX_OK && crc == MX_OK) {
            expect_list l = {0};
            mx_dtype sdt = vr->sdtype < 0 ? MX_BF16 : (mx_dtype)vr->sdtype;
            expect_tiny(&l, vr->layout == MX_SYNTH_STACKED, vr->bits, vr->gs, sdt);
            check_shapes(set, &l);
            free(l.v);
            check_values(set, &plan, &cfg);
        }
        check_config(dir, vr->bits, vr->gs);
        mx_config_free(&cfg);
        mx_st_close(set);
        mx_synth_plan_free(&plan);
    }
    rm_tree(dir);
    free(dir);
}

/* Sharding and the index, replacing with --force, refusing without it,
 * determinism in the seed. */
static void check_shards(void)
{
    char *dir = make_tmp();
    CHECK(dir != NULL);
    if (!dir)
        return;
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    o.preset = "tiny";
    o.shard_bytes = 128 << 10;   /* ~0.7 MB model -> several shards */
    mx_err e;
    CHECK_OK(mx_synth_write(&o, dir, &e), &e);
    mx_synth_plan plan;
    CHECK_OK(mx_synth_plan_build(&o, &plan, &e), &e);
    CHECKF(plan.nshards >= 3, "%d shards", plan.nshards);
    char p[4096], fn[64];
    for (int k = 0; k < plan.nshards; k++) {
        mx_synth_shard_name(&plan, k, fn, sizeof fn);
        snprintf(p, sizeof p, "%s/%s", dir, fn);
        struct stat st;
        CHECKF(stat(p, &st) == 0, "missing %s", p);
        if (plan.nshards > 1 && k == 0) {
            char want[64];
            snprintf(want, sizeof want, "model-00001-of-%05d.safetensors", plan.nshards);
            CHECK(!strcmp(fn, want));
        }
    }
    /* the index maps every tensor to its shard and totals the data bytes */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    char *text = NULL;
    size_t len;
    CHECK_OK(mx_read_file(p, &text, &len, &e), &e);
    cJSON *idx = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(idx != NULL);
    if (idx) {
        cJSON *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size");
        CHECK(cJSON_IsNumber(ts) && (uint64_t)ts->valuedouble == plan.total_bytes);
        cJSON *map = cJSON_GetObjectItem(idx, "weight_map");
        CHECK(cJSON_GetArraySize(map) == (int)plan.n);
        cJSON_Delete(idx);
    }
    mx_st_set *set = NULL;
    CHECK_OK(mx_st_open_dir(dir, &set, &e), &e);
    if (set) {
        CHECK(mx_st_nfiles(set) == (size_t)plan.nshards);
        CHECK(mx_st_count(set) == plan.n);
        mx_config cfg;
        memset(&cfg, 0, sizeof cfg);
        CHECK_OK(mx_config_load(dir, &cfg, &e), &e);
        check_values(set, &plan, &cfg);
        mx_config_free(&cfg);
        mx_st_close(set);
    }
    check_tokenizer(dir, 512);

    /* a non-empty dir is refused without force */
    CHECK_FAILS(mx_synth_write(&o, dir, &e), &e);
    /* with force, a single-file rewrite leaves no stale shard or index */
    o.force = 1;
    o.shard_bytes = 0;
    o.seed = 99;
    CHECK_OK(mx_synth_write(&o, dir, &e), &e);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(access(p, F_OK) != 0);
    mx_synth_shard_name(&plan, 0, fn, sizeof fn);
    snprintf(p, sizeof p, "%s/%s", dir, fn);
    CHECK(access(p, F_OK) != 0);
    set = NULL;
    CHECK_OK(mx_st_open_dir(dir, &set, &e), &e);
    if (set) {
        CHECK(mx_st_nfiles(set) == 1 && mx_st_count(set) == plan.n);
        /* another seed gives other weights */
        mx_synth_plan p99;
        CHECK_OK(mx_synth_plan_build(&o, &p99, &e), &e);
        float a[128], b[128];
        CHECK_OK(mx_synth_expected_row(&plan, "model.layers.0.self_attn.q_proj", 0, 3, a, &e), &e);
        CHECK_OK(mx_synth_expected_row(&p99, "model.layers.0.self_attn.q_proj", 0, 3, b, &e), &e);
        CHECK(memcmp(a, b, sizeof a) != 0);
        mx_config cfg;
        memset(&cfg, 0, sizeof cfg);
        CHECK_OK(mx_config_load(dir, &cfg, &e), &e);
        check_values(set, &p99, &cfg);
        mx_config_free(&cfg);
        mx_synth_plan_free(&p99);
        mx_st_close(set);
    }
    /* errors name what is wrong */
    CHECK_FAILS(mx_synth_expected_row(&plan, "model.nope", 0, 0, (float[1]){0}, &e), &e);
    CHECK_FAILS(mx_synth_expected_row(&plan, "model.layers.0.self_attn.q_proj", 0, 999,
                                      (float[128]){0}, &e), &e);
    mx_synth_plan_free(&plan);
    rm_tree(dir);
    free(dir);
}

/* Every preset's config.json, tokenizer.json and tokenizer_config.json (no
 * weights): they load with the project's own parsers, the tokenizer covers
 * every id below vocab_size, text round-trips, the eos ids are the special
 * tokens and the chat template renders. */
static void check_preset_files(const char *preset)
{
    char *dir = make_tmp();
    CHECK(dir != NULL);
    if (!dir)
        return;
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    o.preset = preset;
    mx_synth_plan plan;
    mx_err e;
    if (mx_synth_plan_build(&o, &plan, &e) != MX_OK) {
        CHECKF(0, "%s: %s", preset, e.msg);
        rm_tree(dir);
        free(dir);
        return;
    }
    double t0 = mx_now();
    CHECK_OK(mx_synth_write_config(&plan, dir, &e), &e);
    CHECK_OK(mx_synth_write_tokenizer(&plan, dir, &e), &e);
    double t1 = mx_now();
    mx_config c;
    memset(&c, 0, sizeof c);
    int crc = mx_config_load(dir, &c, &e);
    CHECK_OK(crc, &e);
    mx_tokenizer *tok = NULL;
    int trc = mx_tok_load_dir(dir, &tok, &e);
    CHECK_OK(trc, &e);
    fprintf(stderr, "%s: files in %.2f s, tokenizer loads in %.2f s\n", preset, t1 - t0,
            mx_now() - t1);
    if (crc == MX_OK) {
        CHECK(!strcmp(c.model_type, plan.fam->model_type));
        CHECK_OK(mx_config_apply_aliases(&c, plan.fam->aliases, &e), &e);
        CHECK(c.vocab_size == plan.p->vocab && c.hidden_size == plan.p->hidden);
        CHECK(c.num_hidden_layers == plan.p->layers && c.num_experts == plan.p->experts);
        CHECK(c.num_experts_per_tok == plan.p->top_k);
        CHECK(c.norm_topk_prob == MX_UNSET || c.norm_topk_prob == plan.p->norm_topk_prob);
        CHECK(c.quant.present && c.quant.bits == 4 && c.quant.group_size == 64);
        CHECK(c.n_eos >= 1);
    }
    if (crc == MX_OK && trc == MX_OK) {
        int V = plan.p->vocab;
        CHECKF(mx_tok_vocab_size(tok) == V, "%s: tokenizer vocab %d, config %d", preset,
               mx_tok_vocab_size(tok), V);
        for (int i = 0; i < c.n_eos; i++)
            CHECK(mx_tok_is_special(tok, c.eos_token_ids[i]));
        /* every id decodes */
        int32_t *all = malloc((size_t)V * sizeof *all);
        for (int i = 0; i < V; i++)
            all[i] = i;
        char *text = NULL;
        size_t len = 0;
        CHECK_OK(mx_tok_decode(tok, all, (size_t)V, 0, &text, &len, &e), &e);
        CHECK(len >= (size_t)V);
        free(text);
        free(all);
        /* round trip, and merges make words shorter than their bytes */
        static const char sample[] = "Hello world, the quick brown fox jumps over 13 lazy dogs.\n"
                                     "Caf\xc3\xa9 \xe2\x82\xac" "5 tabs\tand  spaces";
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(mx_tok_encode(tok, sample, strlen(sample), 1, &ids, &n, &e), &e);
        size_t most = V >= 4096 ? strlen(sample) * 3 / 5 : strlen(sample) * 3 / 4;
        CHECKF(n > 10 && n < most, "%s: %zu tokens for %zu bytes", preset, n, strlen(sample));
        text = NULL;
        if (ids)
            CHECK_OK(mx_tok_decode(tok, ids, n, 0, &text, &len, &e), &e);
        CHECK(text && len == strlen(sample) && !memcmp(text, sample, len));
        free(text);
        free(ids);
        /* special tokens are matched in text */
        const char *sp = plan.p->chatml_specials ? "<|im_start|>user" : "<s>user";
        ids = NULL;
        CHECK_OK(mx_tok_encode(tok, sp, strlen(sp), 1, &ids, &n, &e), &e);
        CHECK(ids && n >= 2 && ids[0] == (plan.p->chatml_specials ? V - 2 : V - 2));
        free(ids);
    }
    mx_chat_template *ct = NULL;
    int rc = mx_chat_template_load(dir, &ct, &e);
    CHECK_OK(rc, &e);
    if (rc == MX_OK) {
        CHECK(!mx_chat_template_is_fallback(ct));
        CHECK(mx_chat_template_eos(ct) != NULL);
        mx_chat_msg m = {"user", "Hi"};
        char *out = NULL;
        CHECK_OK(mx_chat_render(ct, &m, 1, 1, &out, &e), &e);
        CHECK(out && strstr(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
        free(out);
        mx_chat_template_free(ct);
    }
    mx_tok_free(tok);
    mx_config_free(&c);
    mx_synth_plan_free(&plan);
    rm_tree(dir);
    free(dir);
}

/* Plans of the big presets (no I/O): exact published shapes of a few
 * tensors and sizes in the expected range. */
static void check_big_plans(void)
{
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    mx_synth_plan p;
    mx_err e;
    const mx_synth_tensor *t;

    o.preset = "qwen1.5-moe-a2.7b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECKF(p.total_bytes > 7.5e9 && p.total_bytes < 9e9, "qwen1.5 %.2f GB", p.total_bytes / 1e9);
    CHECK(p.nshards == 2);
    t = mx_synth_plan_find(&p, "model.layers.23.mlp.experts.59.down_proj.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 2048 && t->shape[1] == 1408 / 8);
    t = mx_synth_plan_find(&p, "model.layers.0.mlp.shared_expert_gate.weight");
    CHECK(t && t->shape[0] == 1 && t->shape[1] == 2048 / 4 && t->bits == 8);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.k_proj.bias");
    CHECK(t && t->dtype == MX_F16 && t->shape[0] == 2048);
    t = mx_synth_plan_find(&p, "model.embed_tokens.scales");
    CHECK(t && t->dtype == MX_F16 && t->shape[0] == 151936 && t->shape[1] == 32);
    mx_synth_plan_free(&p);

    o.preset = "qwen3-30b-a3b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    t = mx_synth_plan_find(&p, "model.layers.47.mlp.switch_mlp.up_proj.weight");
    CHECK(t && t->ndim == 3 && t->shape[0] == 128 && t->shape[1] == 768 && t->shape[2] == 256);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.q_proj.weight");
    CHECK(t && t->shape[0] == 4096 && t->shape[1] == 256);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.k_norm.weight");
    CHECK(t && t->shape[0] == 128 && t->dtype == MX_BF16);
    CHECK(!mx_synth_plan_find(&p, "model.layers.0.self_attn.q_proj.bias"));
    CHECKF(p.total_bytes > 15e9 && p.total_bytes < 18e9, "qwen3 %.2f GB", p.total_bytes / 1e9);
    mx_synth_plan_free(&p);

    /* the hybrids: DeltaNet and short-convolution layers beside attention */
    o.preset = "qwen3-next-80b-a3b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    t = mx_synth_plan_find(&p, "model.layers.0.linear_attn.in_proj_qkvz.weight");
    CHECK(t && t->shape[0] == 2 * 16 * 128 + 2 * 32 * 128 && t->shape[1] == 2048 / 8);
    t = mx_synth_plan_find(&p, "model.layers.0.linear_attn.conv1d.weight");
    CHECK(t && t->ndim == 3 && t->shape[0] == 2 * 16 * 128 + 32 * 128 && t->shape[1] == 4 &&
          t->shape[2] == 1 && t->dtype == MX_BF16);
    t = mx_synth_plan_find(&p, "model.layers.0.linear_attn.A_log");
    CHECK(t && t->shape[0] == 32);
    CHECK(!mx_synth_plan_find(&p, "model.layers.0.self_attn.q_proj.weight"));
    t = mx_synth_plan_find(&p, "model.layers.3.self_attn.q_proj.weight");   /* q and gate */
    CHECK(t && t->shape[0] == 2 * 16 * 256 && t->shape[1] == 2048 / 8);
    CHECK(!mx_synth_plan_find(&p, "model.layers.3.linear_attn.A_log"));
    t = mx_synth_plan_find(&p, "model.layers.47.mlp.switch_mlp.gate_proj.weight");
    CHECK(t && t->shape[0] == 512 && t->shape[1] == 512);
    CHECKF(p.total_bytes > 40e9 && p.total_bytes < 50e9, "qwen3-next %.2f GB", p.total_bytes / 1e9);
    mx_synth_plan_free(&p);

    o.preset = "lfm2-8b-a1b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    t = mx_synth_plan_find(&p, "model.layers.0.conv.in_proj.weight");
    CHECK(t && t->shape[0] == 3 * 2048 && t->shape[1] == 2048 / 8);
    t = mx_synth_plan_find(&p, "model.layers.0.conv.conv.weight");
    CHECK(t && t->ndim == 3 && t->shape[0] == 2048 && t->shape[1] == 3 && t->shape[2] == 1);
    CHECK(mx_synth_plan_find(&p, "model.layers.1.feed_forward.gate_proj.weight"));   /* dense */
    CHECK(!mx_synth_plan_find(&p, "model.layers.1.feed_forward.gate.weight"));
    t = mx_synth_plan_find(&p, "model.layers.2.feed_forward.expert_bias");
    CHECK(t && t->dtype == MX_F32 && t->shape[0] == 32);
    CHECK(mx_synth_plan_find(&p, "model.layers.21.self_attn.q_layernorm.weight"));
    CHECK(!mx_synth_plan_find(&p, "model.layers.22.self_attn.q_proj.weight"));
    CHECK(!mx_synth_plan_find(&p, "lm_head.weight"));   /* tied */
    CHECKF(p.total_bytes > 4.2e9 && p.total_bytes < 5.2e9, "lfm2 %.2f GB", p.total_bytes / 1e9);
    mx_synth_plan_free(&p);

    o.preset = "olmoe-1b-7b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.q_norm.weight");
    CHECK(t && t->shape[0] == 2048);
    t = mx_synth_plan_find(&p, "model.layers.15.mlp.switch_mlp.down_proj.scales");
    CHECK(t && t->shape[0] == 64 && t->shape[1] == 2048 && t->shape[2] == 16);
    mx_synth_plan_free(&p);

    o.preset = "mixtral-8x7b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    t = mx_synth_plan_find(&p, "model.layers.31.block_sparse_moe.experts.7.w2.weight");
    CHECK(t && t->shape[0] == 4096 && t->shape[1] == 14336 / 8);
    t = mx_synth_plan_find(&p, "model.layers.0.block_sparse_moe.gate.weight");
    CHECK(t && t->shape[0] == 8 && t->bits == 8);
    CHECKF(p.total_bytes > 24e9 && p.total_bytes < 28e9, "mixtral %.2f GB", p.total_bytes / 1e9);
    mx_synth_plan_free(&p);
    o.layout = MX_SYNTH_STACKED;
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    t = mx_synth_plan_find(&p, "model.layers.0.block_sparse_moe.switch_mlp.down_proj.weight");
    CHECK(t && t->shape[0] == 8 && t->shape[1] == 4096 && t->shape[2] == 14336 / 8);
    mx_synth_plan_free(&p);

    /* the five families of issue 15: the published shapes, each family's
     * own tensors (written independently of the plan, from the model cards
     * and mlx-lm's names) */
    o.layout = MX_SYNTH_LAYOUT_DEFAULT;
    o.preset = "dots.llm1";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECKF(p.total_bytes > 78e9 && p.total_bytes < 83e9, "dots.llm1 %.2f GB", p.total_bytes / 1e9);
    t = mx_synth_plan_find(&p, "model.layers.0.mlp.gate_proj.weight");   /* dense layer 0 */
    CHECK(t && t->shape[0] == 10944 && t->shape[1] == 4096 / 8);
    CHECK(!mx_synth_plan_find(&p, "model.layers.0.mlp.gate.weight"));
    t = mx_synth_plan_find(&p, "model.layers.1.mlp.gate.weight");        /* not quantized */
    CHECK(t && t->kind == MX_SYNTH_FMAT && t->dtype == MX_BF16 && t->shape[0] == 128 &&
          t->shape[1] == 4096);
    CHECK(!mx_synth_plan_find(&p, "model.layers.1.mlp.gate.scales"));
    t = mx_synth_plan_find(&p, "model.layers.61.mlp.gate.e_score_correction_bias");
    CHECK(t && t->dtype == MX_F32 && t->shape[0] == 128);
    t = mx_synth_plan_find(&p, "model.layers.61.mlp.experts.down_proj.weight");
    CHECK(t && t->shape[0] == 128 && t->shape[1] == 4096 && t->shape[2] == 1408 / 8);
    t = mx_synth_plan_find(&p, "model.layers.1.mlp.shared_experts.gate_proj.weight");
    CHECK(t && t->shape[0] == 2 * 1408);
    t = mx_synth_plan_find(&p, "model.layers.1.self_attn.k_norm.weight");
    CHECK(t && t->shape[0] == 128);
    CHECK(mx_config_number(p.cfg, "first_k_dense_replace", 0) == 1);
    mx_synth_plan_free(&p);

    o.preset = "phi-3.5-moe";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECKF(p.total_bytes > 22e9 && p.total_bytes < 25e9, "phi-3.5-moe %.2f GB", p.total_bytes / 1e9);
    t = mx_synth_plan_find(&p, "model.layers.31.block_sparse_moe.switch_mlp.gate_proj.weight");
    CHECK(t && t->shape[0] == 16 && t->shape[1] == 6400 && t->shape[2] == 4096 / 8);
    t = mx_synth_plan_find(&p, "model.layers.0.block_sparse_moe.gate.weight");   /* default bits */
    CHECK(t && t->bits == 4 && t->shape[0] == 16);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.o_proj.bias");
    CHECK(t && t->shape[0] == 4096);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.k_proj.bias");
    CHECK(t && t->shape[0] == 1024);
    t = mx_synth_plan_find(&p, "model.layers.0.post_attention_layernorm.bias");
    CHECK(t && t->shape[0] == 4096);
    CHECK(mx_synth_plan_find(&p, "model.norm.bias") != NULL);
    t = mx_synth_plan_find(&p, "lm_head.bias");
    CHECK(t && t->shape[0] == 32064);
    CHECK(!strcmp(p.cfg->rope_type, "longrope"));
    mx_synth_plan_free(&p);

    o.preset = "qwen3-vl-30b-a3b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECKF(p.total_bytes > 15e9 && p.total_bytes < 18e9, "qwen3-vl %.2f GB", p.total_bytes / 1e9);
    t = mx_synth_plan_find(&p, "language_model.model.layers.47.mlp.switch_mlp.up_proj.weight");
    CHECK(t && t->shape[0] == 128 && t->shape[1] == 768 && t->shape[2] == 2048 / 8);
    t = mx_synth_plan_find(&p, "language_model.lm_head.weight");
    CHECK(t && t->shape[0] == 151936);
    CHECK(mx_synth_plan_find(&p, "language_model.model.embed_tokens.weight") != NULL);
    CHECK(cJSON_IsObject(cJSON_GetObjectItem(p.cfg->json, "text_config")) &&
          !cJSON_GetObjectItem(p.cfg->json, "hidden_size"));
    mx_synth_plan_free(&p);

    o.preset = "minimax-m2";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECKF(p.total_bytes > 125e9 && p.total_bytes < 132e9, "minimax-m2 %.2f GB", p.total_bytes / 1e9);
    t = mx_synth_plan_find(&p, "model.layers.61.block_sparse_moe.e_score_correction_bias");
    CHECK(t && t->dtype == MX_F32 && t->shape[0] == 256);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.q_norm.weight");   /* full width */
    CHECK(t && t->shape[0] == 48 * 128);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.k_norm.weight");
    CHECK(t && t->shape[0] == 8 * 128);
    t = mx_synth_plan_find(&p, "model.layers.0.block_sparse_moe.switch_mlp.down_proj.weight");
    CHECK(t && t->shape[0] == 256 && t->shape[1] == 3072 && t->shape[2] == 1536 / 8);
    CHECK(mx_config_number(p.cfg, "rotary_dim", 0) == 64);
    mx_synth_plan_free(&p);

    o.preset = "gemma-4-26b-a4b";
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECKF(p.total_bytes > 13e9 && p.total_bytes < 15.5e9, "gemma-4 %.2f GB", p.total_bytes / 1e9);
    t = mx_synth_plan_find(&p, "model.layers.0.self_attn.v_proj.weight");   /* sliding */
    CHECK(t && t->shape[0] == 8 * 256);
    t = mx_synth_plan_find(&p, "model.layers.5.self_attn.q_proj.weight");   /* full: 512-wide heads */
    CHECK(t && t->shape[0] == 16 * 512);
    t = mx_synth_plan_find(&p, "model.layers.5.self_attn.k_proj.weight");
    CHECK(t && t->shape[0] == 2 * 512);
    CHECK(!mx_synth_plan_find(&p, "model.layers.5.self_attn.v_proj.weight"));   /* K = V */
    t = mx_synth_plan_find(&p, "model.layers.5.self_attn.q_norm.weight");
    CHECK(t && t->shape[0] == 512);
    t = mx_synth_plan_find(&p, "model.layers.29.experts.switch_glu.gate_proj.weight");
    CHECK(t && t->shape[0] == 128 && t->shape[1] == 704 && t->shape[2] == 2816 / 8);
    t = mx_synth_plan_find(&p, "model.layers.29.mlp.down_proj.weight");
    CHECK(t && t->shape[0] == 2816 && t->shape[1] == 2112 / 8);
    t = mx_synth_plan_find(&p, "model.layers.0.router.proj.weight");
    CHECK(t && t->bits == 8 && t->shape[0] == 128);
    t = mx_synth_plan_find(&p, "model.layers.0.router.per_expert_scale");
    CHECK(t && t->shape[0] == 128);
    CHECK(mx_synth_plan_find(&p, "model.layers.0.router.scale") != NULL);
    CHECK(mx_synth_plan_find(&p, "model.layers.0.layer_scalar") != NULL);
    CHECK(mx_synth_plan_find(&p, "model.layers.0.post_feedforward_layernorm_2.weight") != NULL);
    CHECK(!mx_synth_plan_find(&p, "lm_head.weight"));   /* tied */
    mx_synth_plan_free(&p);

    /* a scaled-down variant: the first layers of the real shape */
    o.preset = "minimax-m2";
    o.layers = 2;
    CHECK_OK(mx_synth_plan_build(&o, &p, &e), &e);
    CHECK(p.p->layers == 2 && p.cfg->num_hidden_layers == 2);
    CHECK(mx_synth_plan_find(&p, "model.layers.1.block_sparse_moe.switch_mlp.up_proj.weight") != NULL);
    CHECK(!mx_synth_plan_find(&p, "model.layers.2.block_sparse_moe.switch_mlp.up_proj.weight"));
    mx_synth_plan_free(&p);
    o.layers = -1;
    CHECK_FAILS(mx_synth_plan_build(&o, &p, &e), &e);
    o.layers = 0;

    /* bad options are errors, not crashes */
    o.preset = "nope";
    CHECK_FAILS(mx_synth_plan_build(&o, &p, &e), &e);
    o.preset = "tiny";
    o.bits = 7;
    CHECK_FAILS(mx_synth_plan_build(&o, &p, &e), &e);
    o.bits = 4;
    o.group_size = 48;
    CHECK_FAILS(mx_synth_plan_build(&o, &p, &e), &e);
}

/* ---- the families' miniatures: written, bound, run -------------------- */

/* Row r of a bound linear, as floats (quantized or not). */
static void linear_row(const mx_linear *l, int64_t r, float *out)
{
    if (l->quantized) {
        mx_qmat_row(&l->q, r, out);
        return;
    }
    for (int64_t c = 0; c < l->cols; c++)
        out[c] = mx_dtype_get(l->w, l->wdtype, r * l->cols + c);
}

/* The loader bound, under the family's names, exactly the rows synth meant
 * to write there: `name` row `row` of matrix `index`, n values. */
static int same_row(const mx_synth_plan *plan, const char *name, int64_t index, int64_t row,
                    const float *got, int64_t n)
{
    float *want = malloc((size_t)n * sizeof *want);
    mx_err e;
    int ok = want && mx_synth_expected_row(plan, name, index, row, want, &e) == MX_OK &&
             !memcmp(want, got, (size_t)n * sizeof *want);
    if (!ok)
        fprintf(stderr, "%s[%lld][%lld]: bound values differ from synth's\n", name,
                (long long)index, (long long)row);
    free(want);
    return ok;
}

static int same_linear_row(const mx_synth_plan *plan, const char *module, int64_t index,
                           const mx_linear *l, int64_t row)
{
    float *got = malloc((size_t)l->cols * sizeof *got);
    if (!got)
        return 0;
    linear_row(l, row, got);
    int ok = same_row(plan, module, index, row, got, l->cols);
    free(got);
    return ok;
}

/* What the loader bound in every layer, against the plan: layer kinds,
 * attention geometry, and rows of each kind of tensor. */
static void check_bound(const mx_synth_plan *plan, const mx_model *m)
{
    const mx_names *nm = &plan->fam->names;
    const mx_preset *P = plan->p;
    char pre[256], lay[64], n[400];
    int bad = 0, moe_layers = 0;
    for (int l = 0; l < m->n_layers; l++) {
        const mx_layer *L = &m->layers[l];
        snprintf(lay, sizeof lay, nm->layer, l);
        snprintf(pre, sizeof pre, "%s.%s", nm->model, lay);
        /* the layer's mixer as the preset's letters say, bound to its tensors */
        const char mixer = mx_preset_mixer(P, l);
        CHECKF(L->mixer == (mixer == 'D'   ? MX_MIXER_DELTANET
                            : mixer == 'C' ? MX_MIXER_SHORTCONV
                                           : MX_MIXER_ATTENTION),
               "%s layer %d: mixer %d for '%c'", P->name, l, (int)L->mixer, mixer);
        if (L->mixer == MX_MIXER_DELTANET) {
            const mx_deltanet *dn = &L->dn;
            CHECK(dn->nk == P->linear_k_heads && dn->nv == P->linear_v_heads &&
                  dn->dk == P->linear_head_dim && dn->dv == P->linear_head_dim &&
                  dn->K == P->conv_kernel);
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->deltanet, nm->dn_qkvz);
            bad += !same_linear_row(plan, n, 0, &dn->qkvz, dn->qkvz.rows - 1);
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->deltanet, nm->dn_out);
            bad += !same_linear_row(plan, n, 0, &dn->out, 0);
            snprintf(n, sizeof n, "%s.%s.%s.weight", pre, nm->deltanet, nm->dn_conv);
            bad += !same_row(plan, n, 0, dn->conv_dim - 1,
                             dn->conv_w + (size_t)(dn->conv_dim - 1) * dn->K, dn->K);
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->deltanet, nm->dn_a_log);
            bad += !same_row(plan, n, 0, 0, dn->A_log, dn->nv);
        } else if (L->mixer == MX_MIXER_SHORTCONV) {
            const mx_shortconv *sc = &L->sc;
            CHECK(sc->L == P->conv_kernel && !sc->conv_b);
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->shortconv, nm->sc_in);
            bad += !same_linear_row(plan, n, 0, &sc->in, sc->in.rows - 1);
            snprintf(n, sizeof n, "%s.%s.%s.weight", pre, nm->shortconv, nm->sc_conv);
            bad += !same_row(plan, n, 0, 1, sc->conv_w + sc->L, sc->L);
        } else {
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->attn, nm->attn_proj[0]);
            bad += !same_linear_row(plan, n, 0, &L->attn.q, L->attn.q.rows - 1);
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->attn, nm->attn_proj[3]);
            bad += !same_linear_row(plan, n, 0, &L->attn.o, 0);
        }
        snprintf(n, sizeof n, "%s.%s.weight", pre, nm->attn_norm);
        bad += !same_row(plan, n, 0, 0, L->attn_norm.w, P->hidden);
        if (plan->fam->norm == MX_NORM_LAYER) {
            snprintf(n, sizeof n, "%s.%s.bias", pre, nm->attn_norm);
            bad += !L->attn_norm.b || !same_row(plan, n, 0, 0, L->attn_norm.b, P->hidden);
        }
        /* a K = V layer has no v projection; its geometry is the full
         * layers' one */
        if (L->attn.k_eq_v) {
            snprintf(n, sizeof n, "%s.%s.%s.weight", pre, nm->attn, nm->attn_proj[2]);
            CHECKF(!mx_synth_plan_find(plan, n), "%s written on a K = V layer", n);
            CHECK(L->attn.head_dim == P->global_head_dim && L->attn.n_kv == P->global_kv_heads);
        }
        if (!L->is_moe || L->parallel) {
            snprintf(n, sizeof n, "%s.%s.%s", pre, nm->mlp, nm->mlp_proj[0]);
            bad += !same_linear_row(plan, n, 0, &L->mlp.gate, 1);
        }
        if (!L->is_moe)
            continue;
        moe_layers++;
        char blk[300];
        snprintf(blk, sizeof blk, "%s%s%s", pre, nm->moe[0] ? "." : "", nm->moe);
        const mx_moe_block *b = &L->moe;
        const int E = b->experts.n;
        snprintf(n, sizeof n, "%s.%s", blk, nm->router);
        bad += !same_linear_row(plan, n, 0, &b->router, E - 1);
        CHECK(b->router.quantized == (plan->fam->router_store != MX_ROUTER_FLOAT));
        if (b->experts.stacked)
            snprintf(n, sizeof n, "%s.%s.%s", blk, nm->stacked, nm->stacked_proj[2]);
        else {
            char ex[64];
            snprintf(ex, sizeof ex, nm->per_expert, E - 1);
            snprintf(n, sizeof n, "%s.%s.%s", blk, ex, nm->expert_proj[2]);
        }
        bad += !same_linear_row(plan, n, b->experts.stacked ? E - 1 : 0, &b->experts.down[E - 1], 3);
        if (nm->router_bias) {
            snprintf(n, sizeof n, "%s.%s", blk, nm->router_bias);
            bad += !b->rule.bias || !same_row(plan, n, 0, 0, b->rule.bias, E);
        }
        if (nm->expert_scale) {
            snprintf(n, sizeof n, "%s.%s", blk, nm->expert_scale);
            bad += !b->rule.expert_scale || !same_row(plan, n, 0, 0, b->rule.expert_scale, E);
        }
        CHECK(b->has_shared == (P->shared_intermediate > 0));
        if (b->has_shared) {
            snprintf(n, sizeof n, "%s.%s.%s", blk, nm->shared, nm->mlp_proj[1]);
            bad += !same_linear_row(plan, n, 0, &b->shared.up, 0);
        }
    }
    CHECKF(bad == 0, "%s: %d bound tensors differ from what synth wrote", P->name, bad);
    CHECKF(moe_layers == P->layers - P->first_dense - P->dense_layers, "%s: %d MoE layers",
           P->name, moe_layers);
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Prefill and greedy decode with the fused path on or off; the logits of
 * every step go to out[(1 + steps) * V].  Dispatch: the prompt on the
 * gather path, each decode step's MoE layers fused (when on). */
static void run_greedy(mx_model *m, const char *name, int fused, int steps, float *out)
{
    enum { T = 11 };
    int32_t prompt[T];
    for (int i = 0; i < T; i++)
        prompt[i] = (int32_t)((i * 131 + 7) % m->vocab);
    const int V = m->vocab;
    int moe_layers = 0;
    for (int l = 0; l < m->n_layers; l++)
        moe_layers += m->layers[l].is_moe;
    mx_err e;
    mx_seq *s = NULL;
    CHECK_OK(mx_seq_new(m, T + steps + 1, &s, &e), &e);
    if (!s)
        return;
    mx_moe_set_fused(fused);
    mx_moe_stats_reset();
    float *all = malloc(sizeof(float) * (size_t)T * V);
    mx_forward_trace tr = {.all_logits = all};
    CHECK_OK(mx_forward(m, s, prompt, T, out, &tr, &e), &e);
    CHECKF(all_finite(all, (size_t)T * V), "%s: prompt logits not finite", name);
    mx_moe_stats st;
    mx_moe_stats_get(&st);
    CHECKF(st.fused == 0 && st.gather == moe_layers, "%s: prefill dispatch fused=%ld gather=%ld",
           name, st.fused, st.gather);
    mx_moe_stats_reset();
    for (int i = 0; i < steps; i++) {
        int32_t next = 0;
        for (int v = 1; v < V; v++)
            if (out[(size_t)i * V + v] > out[(size_t)i * V + next])
                next = v;
        CHECK_OK(mx_forward(m, s, &next, 1, out + (size_t)(i + 1) * V, NULL, &e), &e);
    }
    CHECKF(all_finite(out, (size_t)(steps + 1) * V), "%s: decode logits not finite", name);
    mx_moe_stats_get(&st);
    long want = (long)moe_layers * steps;
    CHECKF(st.fused == (fused ? want : 0) && st.gather == (fused ? 0 : want),
           "%s fused=%d: decode dispatch fused=%ld gather=%ld, expected %ld MoE blocks", name,
           fused, st.fused, st.gather, want);
    mx_moe_set_fused(-1);
    free(all);
    mx_seq_free(s);
}

/* A family's miniature preset: written in the given layout, every tensor
 * read back equal to what synth meant, bound by the loader under the
 * family's names, run: finite logits, greedy decoding, fused dispatch on
 * every decode step's MoE layers, the same logits on both paths. */
static void check_family_tiny(const char *preset, mx_synth_layout layout)
{
    char *dir = make_tmp();
    CHECK(dir != NULL);
    if (!dir)
        return;
    fprintf(stderr, "%s %s\n", preset, layout == MX_SYNTH_PER_EXPERT ? "per-expert" : "stacked");
    mx_synth_opts o;
    mx_synth_opts_default(&o);
    o.preset = preset;
    o.layout = layout;
    o.seed = 3;
    mx_err e;
    mx_synth_plan plan;
    mx_model *m = NULL;
    mx_st_set *set = NULL;
    mx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = mx_synth_write(&o, dir, &e);
    CHECK_OK(rc, &e);
    if (rc || mx_synth_plan_build(&o, &plan, &e) != MX_OK)
        goto out;
    CHECK_OK(mx_st_open_dir(dir, &set, &e), &e);
    CHECK_OK(mx_config_load(dir, &cfg, &e), &e);
    if (set) {
        CHECK(mx_st_count(set) == plan.n);
        check_values(set, &plan, &cfg);
    }
    CHECK_OK(mx_model_load(dir, &m, &e), &e);
    if (m) {
        CHECK(!strcmp(m->fam->model_type, plan.fam->model_type));
        CHECK(m->n_layers == plan.p->layers && m->n_experts == plan.p->experts &&
              m->top_k == plan.p->top_k);
        check_bound(&plan, m);
        enum { STEPS = 6 };
        const size_t V = (size_t)m->vocab;
        float *fused = malloc(sizeof(float) * (STEPS + 1) * V);
        float *gather = malloc(sizeof(float) * (STEPS + 1) * V);
        run_greedy(m, preset, 1, STEPS, fused);
        run_greedy(m, preset, 0, STEPS, gather);
        /* the two paths compute the same sums in another order */
        double worst = 0, scale = 1e-30;
        for (size_t i = 0; i < (STEPS + 1) * V; i++) {
            worst = fmax(worst, fabs((double)fused[i] - gather[i]));
            scale = fmax(scale, fabs((double)gather[i]));
        }
        CHECKF(worst <= 1e-4 * scale, "%s: fused and gather logits differ by %g (of %g)", preset,
               worst, scale);
        free(fused);
        free(gather);
    }
    mx_synth_plan_free(&plan);
out:
    mx_model_free(m);
    mx_config_free(&cfg);
    mx_st_close(set);
    rm_tree(dir);
    free(dir);
}

int main(void)
{
    static const variant variants[] = {
        {MX_SYNTH_LAYOUT_DEFAULT, 4, 64, -1},
        {MX_SYNTH_STACKED, 4, 64, MX_F16},
        {MX_SYNTH_PER_EXPERT, 3, 32, MX_BF16},
        {MX_SYNTH_STACKED, 8, 128, MX_BF16},
        {MX_SYNTH_PER_EXPERT, 2, 128, MX_F16},
        {MX_SYNTH_STACKED, 5, 32, -1},
        {MX_SYNTH_PER_EXPERT, 6, 64, MX_F32},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        run_variant(&variants[i]);
    check_shards();
    check_big_plans();
    static const char *const tiny[] = {"dots1-tiny", "phimoe-tiny", "qwen3-vl-moe-tiny",
                                       "minimax-m2-tiny", "gemma4-tiny", "gemma4-mm-tiny",
                                       "qwen3-next-tiny", "lfm2-moe-tiny"};
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
        check_family_tiny(tiny[i], MX_SYNTH_STACKED);
        check_family_tiny(tiny[i], MX_SYNTH_PER_EXPERT);
    }
    const mx_family *fam;
    for (int f = 0; (fam = mx_family_at(f)); f++)
        for (const mx_preset *p = fam->presets; p && p->name; p++)
            check_preset_files(p->name);
    return test_summary();
}
