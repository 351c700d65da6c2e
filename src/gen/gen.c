/* gen.c - engine loading and the generation loop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gen/gen.h"

static int file_exists(const char *dir, const char *name)
{
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

static void add_eos(mx_engine *g, int32_t id)
{
    if (id < 0 || mx_engine_is_eos(g, id) || g->n_eos >= MX_MAX_EOS_IDS)
        return;
    g->eos[g->n_eos++] = id;
}

int mx_engine_load(const char *dir, int tokenizer, mx_engine **out, mx_err *e)
{
    *out = NULL;
    mx_engine *g = calloc(1, sizeof *g);
    if (!g)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    int rc = mx_model_load(dir, &g->model, e);
    if (rc)
        goto fail;
    for (int i = 0; i < g->model->cfg.n_eos; i++)
        add_eos(g, g->model->cfg.eos_token_ids[i]);
    if (tokenizer != MX_TOKENIZER_NONE) {
        if (!file_exists(dir, "tokenizer.json")) {
            if (tokenizer == MX_TOKENIZER_REQUIRED) {
                rc = mx_fail(e, MX_EIO, "%s/tokenizer.json: not found (use --prompt-ids / --ids-only "
                                        "to run without a tokenizer)", dir);
                goto fail;
            }
        } else {
            if ((rc = mx_tok_load_dir(dir, &g->tok, e)))
                goto fail;
            if ((rc = mx_chat_template_load(dir, &g->tmpl, e)))
                goto fail;
            const char *eos = mx_chat_template_eos(g->tmpl);
            if (eos)
                add_eos(g, mx_tok_lookup(g->tok, eos));
        }
    }
    *out = g;
    return MX_OK;
fail:
    mx_engine_free(g);
    return rc;
}

void mx_engine_free(mx_engine *g)
{
    if (!g)
        return;
    mx_chat_template_free(g->tmpl);
    mx_tok_free(g->tok);
    mx_model_free(g->model);
    free(g);
}

int mx_engine_is_eos(const mx_engine *g, int32_t id)
{
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos[i] == id)
            return 1;
    return 0;
}

int mx_engine_encode(const mx_engine *g, const char *text, int32_t **ids, int *n, mx_err *e)
{
    if (!g->tok)
        return mx_fail(e, MX_EINVAL, "this checkpoint has no tokenizer.json: give token ids instead");
    size_t cnt = 0;
    int rc = mx_tok_encode(g->tok, text, strlen(text), 1, ids, &cnt, e);
    if (rc)
        return rc;
    *n = (int)cnt;
    return MX_OK;
}

int mx_engine_encode_chat(const mx_engine *g, const mx_chat_msg *msgs, size_t n_msgs,
                          int32_t **ids, int *n, char **rendered, mx_err *e)
{
    if (!g->tok)
        return mx_fail(e, MX_EINVAL, "this checkpoint has no tokenizer.json: chat needs one");
    char *text = NULL;
    int rc = mx_chat_render(g->tmpl, msgs, n_msgs, 1, &text, e);
    if (rc)
        return rc;
    rc = mx_engine_encode(g, text, ids, n, e);
    if (rendered)
        *rendered = text;
    else
        free(text);
    return rc;
}

int mx_session_new(const mx_engine *g, int n_ctx, mx_session **out, mx_err *e)
{
    *out = NULL;
    mx_session *s = calloc(1, sizeof *s);
    if (!s)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    int rc = mx_seq_new(g->model, n_ctx, &s->seq, e);
    s->ids = malloc(sizeof *s->ids * (size_t)n_ctx);
    if (!rc && !s->ids)
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
    if (rc) {
        mx_session_free(s);
        return rc;
    }
    s->cap = n_ctx;
    *out = s;
    return MX_OK;
}

void mx_session_free(mx_session *s)
{
    if (!s)
        return;
    mx_seq_free(s->seq);
    free(s->ids);
    free(s);
}

void mx_session_reset(mx_session *s) { mx_seq_reset(s->seq); }

/* Runs ids through the model, recording them as cached. */
static int feed(mx_engine *g, mx_session *s, const int32_t *ids, int n, float *logits, mx_err *e)
{
    int pos = s->seq->pos;
    int rc = mx_forward(g->model, s->seq, ids, n, logits, NULL, e);
    if (rc)
        return rc;
    memcpy(s->ids + pos, ids, sizeof *ids * (size_t)n);
    return MX_OK;
}

/* Sends text through the stop filter and the callback.  Returns 1 when a
 * stop string matched, -1 when the callback cancelled, else 0. */
static int emit(mx_gen_cb cb, void *ud, mx_stopper *stop, int32_t id, const char *text, size_t len)
{
    char *out = NULL;
    size_t n = 0;
    int hit = 0;
    if (stop && text) {
        hit = mx_stopper_feed(stop, text, len, &out, &n);
        text = out;
        len = n;
    }
    int cancel = cb ? cb(ud, id, text, len) : 0;
    free(out);
    return cancel ? -1 : hit;
}

int mx_generate(mx_engine *g, mx_session *s, const int32_t *prompt, int n_prompt,
                const mx_gen_opts *o, mx_gen_cb cb, void *ud, mx_gen_stats *st, mx_err *e)
{
    mx_gen_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    st->finish = "length";
    if (n_prompt <= 0)
        return mx_fail(e, MX_EINVAL, "the prompt is empty");
    if (n_prompt >= s->seq->n_ctx)
        return mx_fail(e, MX_ERANGE, "the prompt has %d tokens but the context holds %d", n_prompt,
                       s->seq->n_ctx);
    const mx_model *m = g->model;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->vocab)
            return mx_fail(e, MX_ERANGE, "prompt token id %d is outside the vocabulary (0..%d)",
                           prompt[i], m->vocab - 1);

    /* Reuse what the cache already holds; always feed at least one token so
     * there are logits to sample from. */
    int common = 0;
    while (common < s->seq->pos && common < n_prompt - 1 && s->ids[common] == prompt[common])
        common++;
    s->seq->pos = common;
    st->n_prompt = n_prompt;
    st->n_cached = common;

    float *logits = malloc(sizeof(float) * (size_t)m->vocab);
    mx_sampler *smp = mx_sampler_new(&o->sample, m->vocab);
    mx_stopper *stop = o->n_stops ? mx_stopper_new(o->stops, o->n_stops) : NULL;
    mx_tok_stream *ts = g->tok ? mx_tok_stream_new(g->tok, !o->keep_special) : NULL;
    int rc = MX_OK;
    if (!logits || !smp || (o->n_stops && !stop) || (g->tok && !ts)) {
        rc = mx_fail(e, MX_ENOMEM, "out of memory");
        goto done;
    }

    double t0 = mx_now();
    if ((rc = feed(g, s, prompt + common, n_prompt - common, logits, e)))
        goto done;
    st->t_prefill = mx_now() - t0;
    if (o->dump_logits) {
        FILE *f = fopen(o->dump_logits, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)m->vocab, f) != (size_t)m->vocab) {
            if (f)
                fclose(f);
            rc = mx_fail(e, MX_EIO, "%s: cannot write logits", o->dump_logits);
            goto done;
        }
        fclose(f);
    }

    double td = mx_now();
    int stopped = 0;
    while (st->n_gen < o->max_tokens) {
        int32_t id = mx_sampler_sample(smp, logits, s->ids, (size_t)s->seq->pos);
        if (st->n_gen == 0)
            st->t_first = mx_now() - t0;
        if (!o->ignore_eos && mx_engine_is_eos(g, id)) {
            st->finish = "stop";
            break;
        }
        st->n_gen++;
        char *piece = NULL;
        size_t plen = 0;
        if (ts && (rc = mx_tok_stream_push(ts, id, &piece, &plen, e)))
            goto done;
        int r = emit(cb, ud, stop, id, piece, plen);
        free(piece);
        if (r) {
            st->finish = r > 0 ? "stop" : "cancelled";
            stopped = 1;
            break;
        }
        if (st->n_gen >= o->max_tokens)
            break;
        if (s->seq->pos + 1 >= s->seq->n_ctx) {
            st->finish = "length";
            break;
        }
        if ((rc = feed(g, s, &id, 1, logits, e)))
            goto done;
    }
    st->t_decode = mx_now() - td;
    if (!stopped) {
        /* text held back by the detokenizer or the stop filter */
        char *rest = NULL, *tail = NULL;
        size_t nrest = 0, ntail = 0;
        if (ts && (rc = mx_tok_stream_flush(ts, &rest, &nrest, e)))
            goto done;
        int hit = 0;
        if (stop) {
            char *out = NULL;
            size_t n = 0;
            hit = rest ? mx_stopper_feed(stop, rest, nrest, &out, &n) : 0;
            if (!hit)
                mx_stopper_flush(stop, &tail, &ntail);
            free(rest);
            rest = out;
            nrest = n;
            if (hit)
                st->finish = "stop";
        }
        if (cb && nrest)
            cb(ud, -1, rest, nrest);
        if (cb && ntail)
            cb(ud, -1, tail, ntail);
        free(rest);
        free(tail);
    }
done:
    mx_tok_stream_free(ts);
    mx_stopper_free(stop);
    mx_sampler_free(smp);
    free(logits);
    return rc;
}
