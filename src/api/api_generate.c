/* api_generate.c - streaming generation: src/gen's step-wise request, with
 * the forward-pass lock taken per pass (not per generation) so that
 * contexts in other threads take turns token by token, and the caller's
 * callback runs outside the lock. */
#include <string.h>

#include "api/api_int.h"

void mlxcel_generate_options_init(mlxcel_generate_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->max_tokens = 256;
}

static int read_options(const mlxcel_generate_options *in, mlxcel_generate_options *o, const char *fn)
{
    mlxcel_generate_options_init(o);
    if (!in)
        return MLXCEL_OK;
    int rc = api_read_versioned(o, sizeof *o, in, "mlxcel_generate_options", fn);
    if (rc)
        return rc;
    if (o->max_tokens < -1)
        return api_fail(MLXCEL_EINVAL, fn, "options.max_tokens is %d: -1 (no limit) or a count",
                        o->max_tokens);
    if (o->n_stop && !o->stop)
        return api_fail(MLXCEL_EINVAL, fn, "options.stop is NULL but n_stop is %zu", o->n_stop);
    for (size_t i = 0; i < o->n_stop; i++)
        if (!o->stop[i] || !o->stop[i][0])
            return api_fail(MLXCEL_EINVAL, fn, "options.stop[%zu] is %s", i,
                            o->stop[i] ? "empty" : "NULL");
    return MLXCEL_OK;
}

static int finish_code(const char *why)
{
    if (!strcmp(why, "cancelled"))
        return MLXCEL_FINISH_CANCELLED;
    return !strcmp(why, "stop") ? MLXCEL_FINISH_STOP : MLXCEL_FINISH_LENGTH;
}

/* The request's passes: the uncached part of the prompt, then one token
 * per step until it finishes. */
static int run_request(mlxcel_context *c, mx_gen_req *r, mx_err *e)
{
    mx_model *model = c->m->g->model;
    api_forward_begin(c->m);
    int rc = mx_gen_req_prefill(r, e);
    api_forward_end();
    while (!rc) {
        int32_t next;
        int k = mx_gen_req_step(r, &next, e);   /* samples; calls the callback */
        if (k < 0)
            return -k;
        if (k > 0)
            break;
        api_forward_begin(c->m);
        rc = mx_forward(model, c->s->seq, &next, 1, mx_gen_req_logits(r), NULL, e);
        api_forward_end();
        if (!rc)
            mx_gen_req_fed(r, next);
    }
    return rc;
}

int mlxcel_generate(mlxcel_context *c, const int32_t *prompt, size_t n_prompt,
                    const mlxcel_generate_options *opts, mlxcel_token_callback cb, void *user,
                    int *finish)
{
    static const char fn[] = "mlxcel_generate";
    if (finish)
        *finish = MLXCEL_FINISH_STOP;
    mlxcel_context *cc = api_context(c, fn);
    if (!cc)
        return MLXCEL_EINVAL;
    mlxcel_generate_options o;
    int rc = read_options(opts, &o, fn);
    if (rc)
        return rc;
    if (!prompt || n_prompt == 0)
        return api_fail(MLXCEL_EINVAL, fn, "the prompt is empty");
    const int n_ctx = cc->s->seq->n_ctx;
    if (n_prompt >= (size_t)n_ctx)
        return api_fail(MLXCEL_ERANGE, fn, "the prompt has %zu tokens but the context holds %d",
                        n_prompt, n_ctx);
    mx_gen_opts go = {
        .max_tokens = o.max_tokens < 0 ? n_ctx : o.max_tokens,
        .sample = cc->sp,
        .stops = o.stop,
        .n_stops = o.n_stop,
        .ignore_eos = o.ignore_eos != 0,
        .keep_special = o.keep_special != 0,
    };
    mx_err e = {0};
    mx_gen_req *r = NULL;
    /* the request samples into its own logits: the context's are stale */
    cc->has_logits = 0;
    if (mx_gen_req_new(cc->m->g, cc->s, prompt, (int)n_prompt, &go, cb, user, &r, &e))
        return api_fail_err(fn, &e);
    rc = run_request(cc, r, &e);
    if (rc)
        rc = api_fail_err(fn, &e);
    else if (finish)
        *finish = finish_code(mx_gen_req_stats(r)->finish);
    mx_gen_req_free(r);
    return rc;
}
