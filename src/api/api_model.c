/* api_model.c - loading a model and what it tells about itself. */
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "quant/quant.h"

#define API_MAX_THREADS 256
#define API_DEFAULT_CTX 4096

void mlxcel_model_options_init(mlxcel_model_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->fused_moe = -1;
}

/* The options, checked; defaults for what the caller's struct lacks. */
static int read_options(const mlxcel_model_options *in, mlxcel_model_options *o, const char *fn)
{
    mlxcel_model_options_init(o);
    if (!in)
        return MLXCEL_OK;
    int rc = api_read_versioned(o, sizeof *o, in, "mlxcel_model_options", fn);
    if (rc)
        return rc;
    if (o->threads < 0 || o->threads > API_MAX_THREADS)
        return api_fail(MLXCEL_EINVAL, fn, "options.threads is %d: 0 (all CPUs) to %d", o->threads,
                        API_MAX_THREADS);
    if (o->context < 0)
        return api_fail(MLXCEL_EINVAL, fn, "options.context is %d: 0 (the model's) or a token count",
                        o->context);
    if (o->fused_moe < -1 || o->fused_moe > 1)
        return api_fail(MLXCEL_EINVAL, fn, "options.fused_moe is %d: -1 (environment), 0 or 1",
                        o->fused_moe);
    if (o->precision && strcmp(o->precision, "exact") != 0 && strcmp(o->precision, "fast") != 0)
        return api_fail(MLXCEL_EUNSUPPORTED, fn,
                        "options.precision \"%s\" is not supported (\"exact\" or \"fast\")",
                        o->precision);
    return MLXCEL_OK;
}

/* The context a model runs in by default: max_position_embeddings, capped
 * (a KV cache of the full trained length can be gigabytes). */
static int default_ctx(const mx_model *m)
{
    int mp = m->cfg.max_position_embeddings;
    return mp > 0 && mp < API_DEFAULT_CTX ? mp : API_DEFAULT_CTX;
}

int mlxcel_model_load(const char *dir, const mlxcel_model_options *opts, mlxcel_model **out)
{
    static const char fn[] = "mlxcel_model_load";
    if (!out)
        return api_fail(MLXCEL_EINVAL, fn, "out is NULL");
    *out = NULL;
    if (!dir)
        return api_fail(MLXCEL_EINVAL, fn, "dir is NULL");
    mlxcel_model_options o;
    int rc = read_options(opts, &o, fn);
    if (rc)
        return rc;
    mlxcel_model *m = calloc(1, sizeof *m);
    if (!m)
        return api_fail(MLXCEL_ENOMEM, fn, "out of memory");
    mx_err e = {0};
    if ((rc = mx_engine_load(dir, MX_TOKENIZER_OPTIONAL, &m->g, &e))) {
        free(m);
        return api_fail_err(fn, &e);
    }
    m->tag = API_MODEL_TAG;
    m->threads = o.threads;
    m->fused = o.fused_moe;
    m->precision = !o.precision ? -1 : strcmp(o.precision, "fast") ? MX_PRECISION_EXACT : MX_PRECISION_FAST;
    m->n_ctx = o.context ? o.context : default_ctx(m->g->model);
    *out = m;
    return MLXCEL_OK;
}

void mlxcel_model_free(mlxcel_model *m)
{
    if (!m || m->tag != API_MODEL_TAG)
        return;
    m->tag = 0;
    mx_engine_free(m->g);
    free(m);
}

/* ---- facts ----------------------------------------------------------------- */

#define MODEL_OR(ret)                          \
    const mlxcel_model *mm = api_model(m, fn); \
    if (!mm)                                   \
        return ret;                            \
    const mx_model *md = mm->g->model;         \
    (void)md

const char *mlxcel_model_family(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_family";
    MODEL_OR(NULL);
    return md->cfg.model_type;
}

int mlxcel_model_n_layers(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_layers";
    MODEL_OR(-1);
    return md->n_layers;
}

int mlxcel_model_n_vocab(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_vocab";
    MODEL_OR(-1);
    return md->vocab;
}

int mlxcel_model_n_ctx_train(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_ctx_train";
    MODEL_OR(-1);
    return md->cfg.max_position_embeddings > 0 ? md->cfg.max_position_embeddings : -1;
}

int mlxcel_model_n_ctx(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_ctx";
    MODEL_OR(-1);
    return mm->n_ctx;
}

int mlxcel_model_n_experts(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_experts";
    MODEL_OR(-1);
    return md->n_experts > 0 ? md->n_experts : 0;
}

int mlxcel_model_n_experts_used(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_experts_used";
    MODEL_OR(-1);
    return md->n_experts > 0 && md->top_k > 0 ? md->top_k : 0;
}

int mlxcel_model_has_tokenizer(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_has_tokenizer";
    MODEL_OR(-1);
    return mm->g->tok != NULL;
}

int32_t mlxcel_model_bos(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_bos";
    MODEL_OR(-1);
    int id = md->cfg.bos_token_id;
    return id >= 0 && id < md->vocab ? id : -1;
}

int mlxcel_model_n_eos(const mlxcel_model *m)
{
    static const char fn[] = "mlxcel_model_n_eos";
    MODEL_OR(-1);
    return mm->g->n_eos;
}

int32_t mlxcel_model_eos(const mlxcel_model *m, int i)
{
    static const char fn[] = "mlxcel_model_eos";
    MODEL_OR(-1);
    if (i < 0 || i >= mm->g->n_eos) {
        api_fail(MLXCEL_ERANGE, fn, "index %d is outside the %d end-of-sequence ids", i, mm->g->n_eos);
        return -1;
    }
    return mm->g->eos[i];
}

int mlxcel_model_is_eos(const mlxcel_model *m, int32_t id)
{
    static const char fn[] = "mlxcel_model_is_eos";
    MODEL_OR(-1);
    return mx_engine_is_eos(mm->g, id);
}
