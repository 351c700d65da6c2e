/* config.c - config.json / generation_config.json parsing.
 *
 * Only reading and type-checking happens here: each known field is copied
 * into mx_config when present, left at MX_UNSET (or < 0 / "") when absent,
 * and a field of the wrong JSON type is an error naming the field and the
 * file.  Which defaults apply is the model family's business. */
#include "format/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/file.h"

/* MLX's defaults when a quantization block omits them. */
#define MLX_DEFAULT_BITS 4
#define MLX_DEFAULT_GROUP 64

/* Parses text as one JSON value; invalid JSON names the file, line and
 * column of the error. */
static int parse_json(const char *json, const char *path, cJSON **out, mx_err *e)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        size_t line = 1, col = 1;
        if (end) {
            for (const char *p = json; *p && p < end; p++) {
                if (*p == '\n') {
                    line++;
                    col = 1;
                } else {
                    col++;
                }
            }
        }
        return mx_fail(e, MX_ECONFIG, "%s: invalid JSON at line %zu, column %zu", path, line,
                       col);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mx_fail(e, MX_ECONFIG, "%s: top level is not a JSON object", path);
    }
    *out = root;
    return MX_OK;
}

static const cJSON *get(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* Integer-valued number within int range. */
static int as_int(const cJSON *v, int *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (d != floor(d) || d < INT_MIN || d > INT_MAX)
        return -1;
    *out = (int)d;
    return 0;
}

/* Non-negative integer field; null or absent leaves *out alone. */
static int get_count(const cJSON *o, const char *key, const char *path, int *out,
                     mx_err *e)
{
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    int x;
    if (as_int(v, &x) != 0 || x < 0)
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be a non-negative integer", path,
                       key);
    *out = x;
    return MX_OK;
}

/* Token id: any integer; negative values mean "none" and leave MX_UNSET. */
static int get_token(const cJSON *o, const char *key, const char *path, int *out,
                     mx_err *e)
{
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    int x;
    if (as_int(v, &x) != 0)
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be an integer token id", path,
                       key);
    *out = x < 0 ? MX_UNSET : x;
    return MX_OK;
}

/* Boolean (true/false, also 0/1 as some exporters write). */
static int get_bool(const cJSON *o, const char *key, const char *path, int *out,
                    mx_err *e)
{
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    int x;
    if (cJSON_IsBool(v))
        *out = cJSON_IsTrue(v) ? 1 : 0;
    else if (as_int(v, &x) == 0 && (x == 0 || x == 1))
        *out = x;
    else
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be true or false", path, key);
    return MX_OK;
}

/* Finite number >= 0 (eps, clip); null or absent leaves *out alone. */
static int get_double(const cJSON *o, const char *key, const char *path, double *out,
                      mx_err *e)
{
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be a non-negative number", path,
                       key);
    *out = v->valuedouble;
    return MX_OK;
}

static int get_string(const cJSON *o, const char *key, const char *path, char *out,
                      size_t cap, mx_err *e)
{
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    if (!cJSON_IsString(v))
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be a string", path, key);
    if (strlen(v->valuestring) >= cap)
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' is too long (%zu bytes, at most %zu)",
                       path, key, strlen(v->valuestring), cap - 1);
    strcpy(out, v->valuestring);
    return MX_OK;
}

static int add_eos(mx_config *c, int id, const char *path, mx_err *e)
{
    if (id < 0)
        return MX_OK;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == id)
            return MX_OK;
    if (c->n_eos >= MX_MAX_EOS)
        return mx_fail(e, MX_ECONFIG, "%s: more than %d distinct eos_token_id values", path,
                       MX_MAX_EOS);
    c->eos_token_ids[c->n_eos++] = id;
    return MX_OK;
}

/* eos_token_id: an integer, a list of integers, or null. */
static int get_eos(const cJSON *o, const char *path, mx_config *c, mx_err *e)
{
    const cJSON *v = get(o, "eos_token_id");
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    int id;
    if (as_int(v, &id) == 0)
        return add_eos(c, id, path, e);
    if (!cJSON_IsArray(v))
        return mx_fail(e, MX_ECONFIG, "%s: field 'eos_token_id' must be an integer or a list",
                       path);
    for (const cJSON *it = v->child; it; it = it->next) {
        if (as_int(it, &id) != 0)
            return mx_fail(e, MX_ECONFIG, "%s: field 'eos_token_id' has a non-integer entry",
                           path);
        int rc = add_eos(c, id, path, e);
        if (rc)
            return rc;
    }
    return MX_OK;
}

/* sliding_window: null => 0 (disabled), absent => MX_UNSET, else the size. */
static int get_window(const cJSON *o, const char *path, mx_config *c, mx_err *e)
{
    const cJSON *v = get(o, "sliding_window");
    if (!v)
        return MX_OK;
    if (cJSON_IsNull(v)) {
        c->sliding_window = 0;
        return MX_OK;
    }
    return get_count(o, "sliding_window", path, &c->sliding_window, e);
}

static int get_mlp_only(const cJSON *o, const char *path, mx_config *c, mx_err *e)
{
    const cJSON *v = get(o, "mlp_only_layers");
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    if (!cJSON_IsArray(v))
        return mx_fail(e, MX_ECONFIG, "%s: field 'mlp_only_layers' must be a list", path);
    int n = 0;
    for (const cJSON *it = v->child; it; it = it->next) {
        int x;
        if (as_int(it, &x) != 0 || x < 0)
            return mx_fail(e, MX_ECONFIG,
                           "%s: field 'mlp_only_layers' must hold non-negative integers", path);
        if (n >= MX_MAX_LAYERS)
            return mx_fail(e, MX_ECONFIG, "%s: field 'mlp_only_layers' has more than %d "
                                          "entries", path, MX_MAX_LAYERS);
        c->mlp_only_layers[n++] = x;
    }
    c->n_mlp_only_layers = n;
    return MX_OK;
}

/* A positive finite number field (rope_theta). */
static int get_positive(const cJSON *o, const char *key, const char *field,
                        const char *path, double *out, mx_err *e)
{
    const cJSON *v = get(o, key);
    if (!v || cJSON_IsNull(v))
        return MX_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble <= 0)
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be a positive number", path,
                       field);
    *out = v->valuedouble;
    return MX_OK;
}

/* RoPE: rope_theta at top level wins; else inside rope_parameters (HF
 * transformers 5) or rope_scaling (older configs), in that order.  rope_type
 * may be spelled `rope_type` or `type`. */
static int get_rope(const cJSON *o, const char *path, mx_config *c, mx_err *e)
{
    int rc = get_positive(o, "rope_theta", "rope_theta", path, &c->rope_theta, e);
    static const char *const blocks[] = {"rope_parameters", "rope_scaling"};
    int have_type = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        const cJSON *b = get(o, blocks[i]);
        if (!b || cJSON_IsNull(b))
            continue;
        if (!cJSON_IsObject(b))
            return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be an object", path, blocks[i]);
        char field[64];
        snprintf(field, sizeof field, "%s.rope_theta", blocks[i]);
        double theta = -1.0;
        rc = get_positive(b, "rope_theta", field, path, &theta, e);
        if (rc)
            return rc;
        if (c->rope_theta < 0)
            c->rope_theta = theta;
        const char *tk = get(b, "rope_type") ? "rope_type" : "type";
        const cJSON *tv = get(b, tk);
        if (!tv || cJSON_IsNull(tv))
            continue;
        if (!cJSON_IsString(tv) || strlen(tv->valuestring) >= sizeof c->rope_type)
            return mx_fail(e, MX_ECONFIG, "%s: field '%s.%s' must be a short string", path,
                           blocks[i], tk);
        if (!have_type++)
            strcpy(c->rope_type, tv->valuestring);
    }
    return rc;
}

static int override_cmp(const void *a, const void *b)
{
    return strcmp(((const mx_quant_override *)a)->module,
                  ((const mx_quant_override *)b)->module);
}

/* One {"bits": b, "group_size": g} object (either may be omitted and then
 * falls back to dflt_*). */
static int quant_pair(const cJSON *o, const char *path, const char *where, int dflt_bits,
                      int dflt_group, int *bits, int *group, mx_err *e)
{
    *bits = dflt_bits;
    *group = dflt_group;
    const cJSON *b = get(o, "bits"), *g = get(o, "group_size");
    if (b && (as_int(b, bits) != 0 || *bits <= 0 || *bits > 32))
        return mx_fail(e, MX_ECONFIG, "%s: field '%s.bits' must be an integer in 1..32", path,
                       where);
    if (g && (as_int(g, group) != 0 || *group <= 0))
        return mx_fail(e, MX_ECONFIG, "%s: field '%s.group_size' must be a positive integer",
                       path, where);
    return MX_OK;
}

static int get_quant(const cJSON *o, const char *path, mx_quant_config *q, mx_err *e)
{
    const char *bk = "quantization";
    const cJSON *qb = get(o, bk);
    if (!qb || cJSON_IsNull(qb)) {
        bk = "quantization_config";
        qb = get(o, bk);
    }
    if (!qb || cJSON_IsNull(qb))
        return MX_OK;
    if (!cJSON_IsObject(qb))
        return mx_fail(e, MX_ECONFIG, "%s: field '%s' must be an object", path, bk);
    /* HF's own quantization_config (GPTQ, AWQ, bitsandbytes...) describes
     * weights in a layout we cannot read. */
    const cJSON *qm = get(qb, "quant_method");
    if (qm)
        return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.quant_method '%s' is not MLX affine "
                                           "quantization", path, bk,
                       cJSON_IsString(qm) ? qm->valuestring : "?");
    const cJSON *mode = get(qb, "mode");
    if (mode && !(cJSON_IsString(mode) && strcmp(mode->valuestring, "affine") == 0))
        return mx_fail(e, MX_EUNSUPPORTED, "%s: %s.mode '%s' is not supported (only affine)",
                       path, bk, cJSON_IsString(mode) ? mode->valuestring : "?");
    int rc = quant_pair(qb, path, bk, MLX_DEFAULT_BITS, MLX_DEFAULT_GROUP, &q->bits,
                        &q->group_size, e);
    if (rc)
        return rc;
    q->present = 1;
    /* text_config's block replaces the top level's (parse_fields runs on
     * both): drop the overrides read before */
    for (int i = 0; i < q->n_overrides; i++)
        free(q->overrides[i].module);
    free(q->overrides);
    q->overrides = NULL;
    q->n_overrides = 0;
    int cap = cJSON_GetArraySize(qb);
    q->overrides = calloc((size_t)(cap ? cap : 1), sizeof *q->overrides);
    if (!q->overrides)
        return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
    for (const cJSON *it = qb->child; it; it = it->next) {
        if (!it->string || !(cJSON_IsObject(it) || cJSON_IsFalse(it)))
            continue;   /* bits, group_size, mode and other scalars */
        mx_quant_override *ov = &q->overrides[q->n_overrides];
        if (cJSON_IsFalse(it)) {
            ov->bits = 0;
            ov->group_size = 0;
        } else {
            char where[200];
            snprintf(where, sizeof where, "%s.%s", bk, it->string);
            rc = quant_pair(it, path, where, q->bits, q->group_size, &ov->bits,
                            &ov->group_size, e);
            if (rc)
                return rc;
        }
        if (!(ov->module = strdup(it->string)))
            return mx_fail(e, MX_ENOMEM, "%s: out of memory", path);
        q->n_overrides++;
    }
    /* Sorted so mx_quant_for can binary-search (mixed-bit recipes list
     * hundreds of modules). */
    if (q->n_overrides > 1)
        qsort(q->overrides, (size_t)q->n_overrides, sizeof *q->overrides, override_cmp);
    for (int i = 1; i < q->n_overrides; i++)
        if (strcmp(q->overrides[i - 1].module, q->overrides[i].module) == 0)
            return mx_fail(e, MX_ECONFIG, "%s: %s names module '%s' twice", path, bk,
                           q->overrides[i].module);
    return MX_OK;
}

static void config_init(mx_config *c)
{
    memset(c, 0, sizeof *c);
    int *ints[] = {
        &c->vocab_size, &c->hidden_size, &c->intermediate_size, &c->num_hidden_layers,
        &c->num_attention_heads, &c->num_key_value_heads, &c->head_dim,
        &c->max_position_embeddings, &c->tie_word_embeddings, &c->attention_bias,
        &c->sliding_window, &c->use_sliding_window, &c->max_window_layers, &c->num_experts,
        &c->num_experts_per_tok, &c->moe_intermediate_size,
        &c->shared_expert_intermediate_size, &c->decoder_sparse_step, &c->norm_topk_prob,
        &c->n_mlp_only_layers, &c->bos_token_id, &c->pad_token_id,
        &c->quant.bits, &c->quant.group_size,
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        *ints[i] = MX_UNSET;
    c->rms_norm_eps = -1.0;
    c->rope_theta = -1.0;
    c->clip_qkv = -1.0;
    strcpy(c->rope_type, "default");
}

/* The integer and boolean fields, by key. */
typedef struct field {
    const char *key;
    size_t off;
} field;
#define F(k) {#k, offsetof(mx_config, k)}
static const field counts[] = {
    F(vocab_size), F(hidden_size), F(intermediate_size), F(num_hidden_layers),
    F(num_attention_heads), F(num_key_value_heads), F(head_dim),
    F(max_position_embeddings), F(max_window_layers), F(num_experts_per_tok),
    F(moe_intermediate_size), F(shared_expert_intermediate_size),
    F(decoder_sparse_step), F(num_experts),
};
static const field bools[] = {
    F(tie_word_embeddings), F(attention_bias), F(use_sliding_window), F(norm_topk_prob),
};
#undef F

static int parse_fields(const cJSON *o, const char *path, mx_config *c, mx_err *e)
{
    int rc = MX_OK;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0] && !rc; i++)
        rc = get_count(o, counts[i].key, path, (int *)((char *)c + counts[i].off), e);
    for (size_t i = 0; i < sizeof bools / sizeof bools[0] && !rc; i++)
        rc = get_bool(o, bools[i].key, path, (int *)((char *)c + bools[i].off), e);
    if (!rc)
        rc = get_string(o, "model_type", path, c->model_type, sizeof c->model_type, e);
    if (!rc)
        rc = get_string(o, "hidden_act", path, c->hidden_act, sizeof c->hidden_act, e);
    if (!rc && !get(o, "hidden_act"))   /* some configs say hidden_activation */
        rc = get_string(o, "hidden_activation", path, c->hidden_act, sizeof c->hidden_act, e);
    if (!rc)
        rc = get_double(o, "rms_norm_eps", path, &c->rms_norm_eps, e);
    if (!rc)
        rc = get_double(o, "clip_qkv", path, &c->clip_qkv, e);
    if (!rc)
        rc = get_rope(o, path, c, e);
    if (!rc)
        rc = get_window(o, path, c, e);
    if (!rc)
        rc = get_mlp_only(o, path, c, e);
    if (!rc)
        rc = get_token(o, "bos_token_id", path, &c->bos_token_id, e);
    if (!rc)
        rc = get_token(o, "pad_token_id", path, &c->pad_token_id, e);
    if (!rc)
        rc = get_eos(o, path, c, e);
    if (!rc)
        rc = get_quant(o, path, &c->quant, e);
    return rc;
}

int mx_config_parse(const char *json, const char *path, mx_config *c, mx_err *e)
{
    if (!path)
        path = "config.json";
    config_init(c);
    if (!json)
        return mx_fail(e, MX_EINVAL, "%s: no text", path);
    cJSON *root;
    int rc = parse_json(json, path, &root, e);
    if (rc)
        return rc;
    rc = parse_fields(root, path, c, e);
    /* Multimodal checkpoints (Qwen3-VL, Gemma 4) nest the language model's
     * fields under text_config: they override the top level's, but the
     * top-level model_type names the family. */
    const cJSON *tc = get(root, "text_config");
    if (!rc && cJSON_IsObject(tc)) {
        char mt[sizeof c->model_type];
        memcpy(mt, c->model_type, sizeof mt);
        rc = parse_fields(tc, path, c, e);
        memcpy(c->model_type, mt, sizeof mt);
    }
    c->json = root;
    snprintf(c->path, sizeof c->path, "%s", path);
    if (rc) {
        /* Leave c freeable and free of half-parsed state. */
        mx_config_free(c);
        config_init(c);
    }
    return rc;
}

int mx_config_parse_generation(const char *json, const char *path, mx_config *c, mx_err *e)
{
    if (!path)
        path = "generation_config.json";
    if (!json)
        return mx_fail(e, MX_EINVAL, "%s: no text", path);
    cJSON *root;
    int rc = parse_json(json, path, &root, e);
    if (rc)
        return rc;
    /* A failure must leave c as it was: parse into a copy of the token
     * fields and commit at the end. */
    mx_config t = {0};
    t.bos_token_id = MX_UNSET;
    t.pad_token_id = c->pad_token_id;
    t.n_eos = c->n_eos;
    memcpy(t.eos_token_ids, c->eos_token_ids, sizeof t.eos_token_ids);
    rc = get_token(root, "bos_token_id", path, &t.bos_token_id, e);
    if (!rc && t.pad_token_id == MX_UNSET)
        rc = get_token(root, "pad_token_id", path, &t.pad_token_id, e);
    if (!rc)
        rc = get_eos(root, path, &t, e);
    cJSON_Delete(root);
    if (rc)
        return rc;
    /* HF generate() takes bos from generation_config when it names one. */
    if (t.bos_token_id != MX_UNSET)
        c->bos_token_id = t.bos_token_id;
    c->pad_token_id = t.pad_token_id;
    c->n_eos = t.n_eos;
    memcpy(c->eos_token_ids, t.eos_token_ids, sizeof t.eos_token_ids);
    return MX_OK;
}

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p)
        snprintf(p, a + b + 2, "%s%s%s", dir, a && dir[a - 1] == '/' ? "" : "/", name);
    return p;
}

int mx_config_load(const char *dir, mx_config *c, mx_err *e)
{
    config_init(c);
    char *cp = join(dir, "config.json"), *gp = join(dir, "generation_config.json");
    char *text = NULL;
    int rc = (cp && gp) ? MX_OK : mx_fail(e, MX_ENOMEM, "%s: out of memory", dir);
    if (!rc)
        rc = mx_read_file(cp, &text, NULL, e);
    if (!rc)
        rc = mx_config_parse(text, cp, c, e);
    free(text);
    text = NULL;
    if (!rc && access(gp, F_OK) == 0) {
        rc = mx_read_file(gp, &text, NULL, e);
        if (!rc)
            rc = mx_config_parse_generation(text, gp, c, e);
        free(text);
        if (rc) {
            mx_config_free(c);
            config_init(c);
        }
    }
    free(cp);
    free(gp);
    return rc;
}

void mx_config_free(mx_config *c)
{
    if (!c)
        return;
    cJSON_Delete(c->json);
    c->json = NULL;
    for (int i = 0; i < c->quant.n_overrides; i++)
        free(c->quant.overrides[i].module);
    free(c->quant.overrides);
    c->quant.overrides = NULL;
    c->quant.n_overrides = 0;
}

int mx_quant_for(const mx_quant_config *q, const char *module, int *bits, int *group_size)
{
    if (!q || !q->present) {
        *bits = 0;
        *group_size = 0;
        return 0;
    }
    const mx_quant_override *ov = NULL;
    if (module && q->n_overrides > 0) {
        mx_quant_override key = {.module = (char *)module};
        ov = bsearch(&key, q->overrides, (size_t)q->n_overrides, sizeof key, override_cmp);
    }
    *bits = ov ? ov->bits : q->bits;
    *group_size = ov ? ov->group_size : q->group_size;
    return *bits > 0;
}

int mx_config_apply_aliases(mx_config *c, const mx_config_alias *aliases, mx_err *e)
{
    for (const mx_config_alias *a = aliases; a && a->key; a++) {
        int *dst = NULL, is_bool = 0;
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            if (!strcmp(counts[i].key, a->key))
                dst = (int *)(void *)((char *)c + counts[i].off);
        for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++)
            if (!strcmp(bools[i].key, a->key))
                dst = (int *)(void *)((char *)c + bools[i].off), is_bool = 1;
        if (!dst)
            return mx_fail(e, MX_EINVAL, "config alias for unknown key '%s'", a->key);
        if (*dst != MX_UNSET || !c->json)
            continue;
        const cJSON *src = c->json, *tc = get(c->json, "text_config");
        if (cJSON_IsObject(tc) && get(tc, a->alias))
            src = tc;
        int rc = is_bool ? get_bool(src, a->alias, c->path, dst, e)
                         : get_count(src, a->alias, c->path, dst, e);
        if (rc)
            return rc;
    }
    return MX_OK;
}

const cJSON *mx_config_key(const mx_config *c, const char *key)
{
    if (!c->json)
        return NULL;
    const cJSON *tc = get(c->json, "text_config");
    const cJSON *v = cJSON_IsObject(tc) ? get(tc, key) : NULL;
    return v ? v : get(c->json, key);
}

double mx_config_number(const mx_config *c, const char *key, double dflt)
{
    const cJSON *v = mx_config_key(c, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}
