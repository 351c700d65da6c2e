/* api_context.c - contexts: a sequence's KV cache, the ids in it, its last
 * logits and its sampler; prefill, decode, prefix reuse and sampling. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

/* ---- sampling parameters ---------------------------------------------------- */

void mlxcel_sampling_init(mlxcel_sampling *s)
{
    if (!s)
        return;
    mx_sample_params p;
    mx_sample_defaults(&p);
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    s->temperature = p.temperature;
    s->top_k = p.top_k;
    s->top_p = p.top_p;
    s->min_p = p.min_p;
    s->repeat_penalty = p.repeat_penalty;
    s->repeat_last_n = p.repeat_last_n;
    s->frequency_penalty = p.frequency_penalty;
    s->presence_penalty = p.presence_penalty;
    s->seed = p.seed;
}

static int read_sampling(const mlxcel_sampling *in, mx_sample_params *p, const char *fn)
{
    mlxcel_sampling s;
    mlxcel_sampling_init(&s);
    if (in) {
        int rc = api_read_versioned(&s, sizeof s, in, "mlxcel_sampling", fn);
        if (rc)
            return rc;
    }
    if (s.repeat_last_n < 0)
        return api_fail(MLXCEL_EINVAL, fn, "sampling.repeat_last_n is %d: must be >= 0",
                        s.repeat_last_n);
    if (!(s.repeat_penalty > 0))
        return api_fail(MLXCEL_EINVAL, fn, "sampling.repeat_penalty is %g: must be > 0 (1: off)",
                        (double)s.repeat_penalty);
    *p = (mx_sample_params){
        .temperature = s.temperature,
        .top_k = s.top_k,
        .top_p = s.top_p,
        .min_p = s.min_p,
        .repeat_penalty = s.repeat_penalty,
        .repeat_last_n = s.repeat_last_n,
        .frequency_penalty = s.frequency_penalty,
        .presence_penalty = s.presence_penalty,
        .seed = s.seed,
    };
    return MLXCEL_OK;
}

/* ---- life ------------------------------------------------------------------- */

static void destroy(mlxcel_context *c)
{
    c->tag = 0;
    mx_sampler_free(c->smp);
    mx_session_free(c->s);
    free(c->logits);
    free(c->work);
    free(c);
}

int mlxcel_context_new(mlxcel_model *m, int n_ctx, mlxcel_context **out)
{
    static const char fn[] = "mlxcel_context_new";
    if (!out)
        return api_fail(MLXCEL_EINVAL, fn, "out is NULL");
    *out = NULL;
    mlxcel_model *mm = api_model(m, fn);
    if (!mm)
        return MLXCEL_EINVAL;
    if (n_ctx < 0)
        return api_fail(MLXCEL_EINVAL, fn, "n_ctx is %d: 0 (the model's default) or a token count",
                        n_ctx);
    if (n_ctx == 0)
        n_ctx = mm->n_ctx;
    const size_t V = (size_t)mm->g->model->vocab;
    mlxcel_context *c = calloc(1, sizeof *c);
    if (!c)
        return api_fail(MLXCEL_ENOMEM, fn, "out of memory");
    c->m = mm;
    mx_sample_defaults(&c->sp);
    mx_err e = {0};
    int rc = mx_session_new(mm->g, n_ctx, &c->s, &e);
    if (rc)
        rc = api_fail_err(fn, &e);
    else if (!(c->logits = malloc(V * sizeof(float))) || !(c->work = malloc(V * sizeof(float))) ||
             !(c->smp = mx_sampler_new(&c->sp, (int32_t)V)))
        rc = api_fail(MLXCEL_ENOMEM, fn, "out of memory");
    if (rc) {
        destroy(c);
        return rc;
    }
    c->tag = API_CONTEXT_TAG;
    *out = c;
    return MLXCEL_OK;
}

void mlxcel_context_free(mlxcel_context *c)
{
    if (c && c->tag == API_CONTEXT_TAG)
        destroy(c);
}

/* ---- the cache ----------------------------------------------------------------- */

int mlxcel_context_n_ctx(const mlxcel_context *c)
{
    const mlxcel_context *cc = api_context(c, "mlxcel_context_n_ctx");
    return cc ? cc->s->seq->n_ctx : -1;
}

int mlxcel_context_n_tokens(const mlxcel_context *c)
{
    const mlxcel_context *cc = api_context(c, "mlxcel_context_n_tokens");
    return cc ? cc->s->seq->pos : -1;
}

int mlxcel_context_tokens(const mlxcel_context *c, int32_t *ids, size_t cap)
{
    static const char fn[] = "mlxcel_context_tokens";
    const mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return -1;
    if (!ids && cap) {
        api_fail(MLXCEL_EINVAL, fn, "ids is NULL but cap is %zu", cap);
        return -1;
    }
    const size_t n = (size_t)cc->s->seq->pos;
    if (cap)
        memcpy(ids, cc->s->ids, sizeof *ids * (cap < n ? cap : n));
    return (int)n;
}

int mlxcel_context_reset(mlxcel_context *c)
{
    mlxcel_context *cc = api_context(c, "mlxcel_context_reset");
    if (!cc)
        return MLXCEL_EINVAL;
    mx_session_reset(cc->s);
    cc->has_logits = 0;
    return MLXCEL_OK;
}

/* Runs checked ids through the model after the cache; records them. */
static int run(mlxcel_context *c, const int32_t *ids, size_t n, const char *fn)
{
    mx_session *s = c->s;
    const int at = s->seq->pos;
    mx_err e = {0};
    c->has_logits = 0;
    api_forward_begin(c->m);
    int rc = mx_forward(c->m->g->model, s->seq, ids, (int)n, c->logits, NULL, &e);
    api_forward_end();
    if (rc)
        return api_fail_err(fn, &e);
    /* memmove: a rewound recurrent model runs its own cached ids again */
    memmove(s->ids + at, ids, sizeof *ids * n);
    c->has_logits = 1;
    return MLXCEL_OK;
}

int mlxcel_context_keep(mlxcel_context *c, int n)
{
    static const char fn[] = "mlxcel_context_keep";
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    mx_seq *seq = cc->s->seq;
    if (n < 0 || n > seq->pos)
        return api_fail(MLXCEL_ERANGE, fn, "n is %d but the cache holds %d tokens", n, seq->pos);
    cc->has_logits = 0;
    /* a recurrent state cannot go back: it restarts, and the kept tokens
     * run again */
    int kept = mx_seq_rewind(seq, n);
    int rc = kept < n ? run(cc, cc->s->ids + kept, (size_t)(n - kept), fn) : MLXCEL_OK;
    cc->has_logits = 0;
    return rc;
}

/* Checks that ids[0..n) fit after `at` cached tokens and are in the
 * vocabulary, before anything changes. */
static int check_ids(const mlxcel_context *c, const int32_t *ids, size_t n, int at, const char *fn)
{
    if (!ids && n)
        return api_fail(MLXCEL_EINVAL, fn, "ids is NULL");
    const int n_ctx = c->s->seq->n_ctx;
    if (n > (size_t)(n_ctx - at))
        return api_fail(MLXCEL_ERANGE, fn, "context full: %d tokens in the cache + %zu new > context "
                                           "size %d", at, n, n_ctx);
    const int vocab = c->m->g->model->vocab;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return api_fail(MLXCEL_ERANGE, fn, "ids[%zu] = %d is outside the vocabulary (0..%d)", i,
                            (int)ids[i], vocab - 1);
    return MLXCEL_OK;
}

int mlxcel_context_prefill(mlxcel_context *c, const int32_t *ids, size_t n)
{
    static const char fn[] = "mlxcel_context_prefill";
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    int rc = check_ids(cc, ids, n, cc->s->seq->pos, fn);
    if (rc || n == 0)
        return rc;
    return run(cc, ids, n, fn);
}

int mlxcel_context_decode(mlxcel_context *c, int32_t id)
{
    static const char fn[] = "mlxcel_context_decode";
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    int rc = check_ids(cc, &id, 1, cc->s->seq->pos, fn);
    return rc ? rc : run(cc, &id, 1, fn);
}

int mlxcel_context_set_tokens(mlxcel_context *c, const int32_t *ids, size_t n, size_t *n_reused)
{
    static const char fn[] = "mlxcel_context_set_tokens";
    if (n_reused)
        *n_reused = 0;
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    if (n == 0)
        return api_fail(MLXCEL_EINVAL, fn, "no tokens (n must be >= 1)");
    int rc = check_ids(cc, ids, n, 0, fn);
    if (rc)
        return rc;
    /* the longest common prefix, leaving at least the last token to run
     * so that there are logits */
    mx_session *s = cc->s;
    size_t common = 0;
    while (common < (size_t)s->seq->pos && common + 1 < n && s->ids[common] == ids[common])
        common++;
    /* a model with recurrent layers may have to start over */
    common = (size_t)mx_seq_rewind(s->seq, (int)common);
    if (n_reused)
        *n_reused = common;
    return run(cc, ids + common, n - common, fn);
}

const float *mlxcel_context_logits(const mlxcel_context *c)
{
    const mlxcel_context *cc = api_context(c, "mlxcel_context_logits");
    return cc && cc->has_logits ? cc->logits : NULL;
}

/* ---- sampling ---------------------------------------------------------------- */

int mlxcel_context_set_sampling(mlxcel_context *c, const mlxcel_sampling *s)
{
    static const char fn[] = "mlxcel_context_set_sampling";
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    mx_sample_params p;
    int rc = read_sampling(s, &p, fn);
    if (rc)
        return rc;
    mx_sampler *smp = mx_sampler_new(&p, (int32_t)cc->m->g->model->vocab);
    if (!smp)
        return api_fail(MLXCEL_ENOMEM, fn, "out of memory");
    mx_sampler_free(cc->smp);
    cc->smp = smp;
    cc->sp = p;
    return MLXCEL_OK;
}

int mlxcel_context_sample(mlxcel_context *c, int32_t *id)
{
    static const char fn[] = "mlxcel_context_sample";
    if (!id)
        return api_fail(MLXCEL_EINVAL, fn, "id is NULL");
    *id = -1;
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    if (!cc->has_logits)
        return api_fail(MLXCEL_EINVAL, fn, "no logits to sample from: prefill or decode first");
    const int V = cc->m->g->model->vocab;
    memcpy(cc->work, cc->logits, sizeof(float) * (size_t)V);
    int32_t t = mx_sampler_sample(cc->smp, cc->work, cc->s->ids, (size_t)cc->s->seq->pos);
    if (t < 0)
        return api_fail(MLXCEL_ERANGE, fn, "no token can be drawn from these logits");
    mx_sampler_accept(cc->smp, t);
    *id = t;
    return MLXCEL_OK;
}
