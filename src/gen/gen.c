/* gen.c - engine loading and the generation loop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gen/gen.h"
#include "cuda/cuda.h"
#include "grammar/grammar.h"
#include "util/clock.h"
#include "util/sysinfo.h"

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
    if (!rc)
        rc = mx_device_select(g->model, NULL, e);   /* MLXCEL_DEVICE / --device */
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

/* Tokens one prefill call runs at most (the server's default chunk; the
 * CLI's prompts may run longer chunks, whose activations are still small
 * beside the KV cache they fill). */
#define MEM_CHUNK_TOKENS 256

mx_mem_need mx_engine_memory_need(const mx_engine *g, int n_ctx, int n_seqs)
{
    const mx_model *m = g->model;
    uint64_t seqs = n_seqs > 0 ? (uint64_t)n_seqs : 0, ctx = n_ctx > 0 ? (uint64_t)n_ctx : 0;
    mx_mem_need need = {.weights = mx_model_weight_bytes(m)};
    need.kv = seqs * (mx_model_kv_bytes(m, (int)ctx) + mx_model_state_floats(m) * sizeof(float) +
                      ctx * sizeof(int32_t));
    /* every sequence's logits (the server keeps one row per slot, the
     * sampler a copy), and per token of a chunk: the residual stream and
     * its norm, q/k/v/o, the FFN's activations, one row of logits */
    uint64_t per_token = sizeof(float) * (8ull * (uint64_t)m->d + (uint64_t)m->q_dim +
                                          2ull * (uint64_t)m->kv_dim + (uint64_t)m->vocab);
    need.scratch = seqs * 2ull * sizeof(float) * (uint64_t)m->vocab + MEM_CHUNK_TOKENS * per_token;
    return need;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int mx_engine_check_memory(const mx_engine *g, int n_ctx, int n_seqs, mx_err *e)
{
    static int warned;
    const char *src = NULL;
    uint64_t avail = mx_mem_available(&src);
    if (!avail)
        return MX_OK;   /* nothing known: nothing to say */
    mx_mem_need need = mx_engine_memory_need(g, n_ctx, n_seqs);
    uint64_t run = need.kv + need.scratch;
    if (run > avail)
        return mx_fail(e, MX_ENOMEM,
                       "not enough memory for %d sequence%s of %d tokens: the KV cache needs %llu bytes "
                       "(%.1f MiB) and scratch about %llu (%.1f MiB), %llu bytes in all, but %llu bytes "
                       "(%.1f MiB) are available (%s); lower --ctx-size%s",
                       n_seqs, n_seqs == 1 ? "" : "s", n_ctx, (unsigned long long)need.kv, mib(need.kv),
                       (unsigned long long)need.scratch, mib(need.scratch), (unsigned long long)run,
                       (unsigned long long)avail, mib(avail), src, n_seqs > 1 ? " or --parallel" : "");
    if (run + need.weights > avail && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        fprintf(stderr,
                "mlxcel: warning: the weights (%llu bytes, %.1f MiB) and the KV cache + scratch (%llu "
                "bytes, %.1f MiB) exceed the %llu bytes (%.1f MiB) available (%s); the KV cache fits, "
                "so this runs with the weights paged in from disk as they are used (mmap), which is "
                "slow\n",
                (unsigned long long)need.weights, mib(need.weights), (unsigned long long)run, mib(run),
                (unsigned long long)avail, mib(avail), src);
    return MX_OK;
}

int mx_session_new(const mx_engine *g, int n_ctx, mx_session **out, mx_err *e)
{
    *out = NULL;
    int crc = mx_engine_check_memory(g, n_ctx, 1, e);
    if (crc)
        return crc;
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

int mx_decode_greedy(mx_model *m, mx_seq *s, int32_t first, int n, int32_t *ids, mx_err *e)
{
    if (n <= 0)
        return mx_fail(e, MX_EINVAL, "decode: %d steps", n);
    if (s->m != m)
        return mx_fail(e, MX_EINVAL, "decode: sequence belongs to another model");
    if (first < 0 || first >= m->vocab)
        return mx_fail(e, MX_ERANGE, "decode: token id %d outside the vocabulary of %d", (int)first, m->vocab);
    if (s->pos + n > s->n_ctx)
        return mx_fail(e, MX_ERANGE, "context full: %d tokens in the cache + %d new > context size %d", s->pos, n,
                       s->n_ctx);
    if (m->backend && m->backend->greedy) {
        int rc = m->backend->greedy(m->backend_ctx, s, first, n, ids, e);
        if (rc >= 0) {
            if (!rc)
                s->pos += n;
            return rc;
        }
    }
    float *logits = malloc(sizeof(float) * (size_t)m->vocab);
    if (!logits)
        return mx_fail(e, MX_ENOMEM, "decode: out of memory for the logits");
    int rc = MX_OK;
    int32_t id = first;
    for (int i = 0; i < n && !rc; i++)
        if (!(rc = mx_forward(m, s, &id, 1, logits, NULL, e)))
            id = ids[i] = mx_argmax(logits, m->vocab);
    free(logits);
    return rc;
}

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

struct mx_gen_req {
    mx_engine *g;
    mx_session *s;
    int32_t *prompt;
    int n_prompt;
    mx_gen_opts o;
    mx_gen_cb cb;
    void *ud;
    float *logits;
    mx_sampler *smp;
    mx_stopper *stop;
    mx_tok_stream *ts;
    mx_gen_stats st;
    double t0, td;
    int finished;
    float *raw;                  /* (vocab) the logits before sampling, for logprobs */
    mx_grammar_state *gs;        /* the grammar's parse of the output, when constrained */
    mx_token_logprob lp;
    int lp_valid;
    /* prompt lookup */
    int lookup;                  /* on: opts.lookup > 0 and a model whose cache can be rewound */
    mx_lookup lk;
    int32_t draft[MX_LOOKUP_MAX];
    float *all;                  /* [(MX_LOOKUP_MAX + 1), vocab] a verify call's logits, made on first use */
};

void mx_gen_req_free(mx_gen_req *r)
{
    if (!r)
        return;
    mx_tok_stream_free(r->ts);
    mx_stopper_free(r->stop);
    mx_sampler_free(r->smp);
    mx_grammar_state_free(r->gs);
    free(r->logits);
    free(r->raw);
    free(r->all);
    free(r->prompt);
    free(r);
}

/* The sampler's filter: the grammar's mask over the vocabulary. */
static size_t grammar_filter(void *ud, float *logits, int32_t vocab)
{
    mx_gen_req *r = ud;
    return mx_grammar_mask(r->gs, logits, vocab);
}

int mx_gen_req_new(mx_engine *g, mx_session *s, const int32_t *prompt, int n_prompt,
                   const mx_gen_opts *o, mx_gen_cb cb, void *ud, mx_gen_req **out, mx_err *e)
{
    *out = NULL;
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
    mx_gen_req *r = calloc(1, sizeof *r);
    if (!r)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    r->g = g;
    r->s = s;
    r->o = *o;
    r->cb = cb;
    r->ud = ud;
    r->n_prompt = n_prompt;
    r->st.finish = "length";
    r->st.n_prompt = n_prompt;
    r->prompt = malloc(sizeof *prompt * (size_t)n_prompt);
    r->logits = malloc(sizeof(float) * (size_t)m->vocab);
    r->smp = mx_sampler_new(&o->sample, m->vocab);
    r->stop = o->n_stops ? mx_stopper_new(o->stops, o->n_stops) : NULL;
    r->ts = g->tok ? mx_tok_stream_new(g->tok, !o->keep_special) : NULL;
    r->raw = o->logprobs ? malloc(sizeof(float) * (size_t)m->vocab) : NULL;
    if (!r->prompt || !r->logits || !r->smp || (o->n_stops && !r->stop) || (g->tok && !r->ts) ||
        (o->logprobs && !r->raw) ||
        (o->n_bias && mx_sampler_set_bias(r->smp, o->bias_ids, o->bias_vals, o->n_bias))) {
        mx_gen_req_free(r);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    memcpy(r->prompt, prompt, sizeof *prompt * (size_t)n_prompt);
    /* off where a draft's call would not give one-token steps' bits: a
     * recurrent state cannot drop tokens, and a backend device (the GPU)
     * computes calls of several tokens with other kernels than one */
    r->lookup = o->lookup > 0 && mx_model_state_floats(m) == 0 && !m->backend;
    mx_lookup_init(&r->lk, o->lookup, o->lookup_always);
    if (o->grammar) {
        int rc = o->grammar_vocab ? mx_grammar_state_new(o->grammar, o->grammar_vocab, &r->gs, e)
                                  : mx_fail(e, MX_EINVAL, "a grammar needs the vocabulary's byte strings");
        if (rc) {
            mx_gen_req_free(r);
            return rc;
        }
        mx_sampler_set_filter(r->smp, grammar_filter, r);
    }
    *out = r;
    return MX_OK;
}

int mx_gen_req_prefill(mx_gen_req *r, mx_err *e)
{
    mx_session *s = r->s;
    /* Reuse what the cache already holds; always feed at least one token so
     * there are logits to sample from. */
    int common = 0;
    while (common < s->seq->pos && common < r->n_prompt - 1 && s->ids[common] == r->prompt[common])
        common++;
    /* a recurrent state cannot be rewound: such a model keeps the cache
     * only when the prompt extends it, else starts over */
    common = mx_seq_rewind(s->seq, common);
    r->st.n_cached = common;
    r->t0 = mx_now();
    int rc = feed(r->g, s, r->prompt + common, r->n_prompt - common, r->logits, e);
    if (rc)
        return rc;
    r->st.t_prefill = mx_now() - r->t0;
    if (r->o.dump_logits) {
        const size_t V = (size_t)r->g->model->vocab;
        FILE *f = fopen(r->o.dump_logits, "wb");
        int bad = !f || fwrite(r->logits, sizeof(float), V, f) != V;
        if (f && fclose(f) != 0)
            bad = 1;
        if (bad)
            return mx_fail(e, MX_EIO, "%s: cannot write logits", r->o.dump_logits);
    }
    r->td = mx_now();
    return MX_OK;
}

/* Sends text through the stop filter and the callback.  Returns 1 when a
 * stop string matched, -1 when the callback cancelled, else 0. */
static int emit(mx_gen_req *r, int32_t id, const char *text, size_t len)
{
    char *out = NULL;
    size_t n = 0;
    int hit = 0;
    if (r->stop && text) {
        hit = mx_stopper_feed(r->stop, text, len, &out, &n);
        text = out;
        len = n;
    }
    int cancel = r->cb ? r->cb(r->ud, id, text, len) : 0;
    free(out);
    return cancel ? -1 : hit;
}

/* End of generation without a stop string: flush what the detokenizer and
 * the stop filter held back. */
static int finish(mx_gen_req *r, const char *why, int flush, mx_err *e)
{
    r->finished = 1;
    r->st.finish = why;
    r->st.t_decode = mx_now() - r->td;
    if (!flush)
        return 1;
    char *rest = NULL, *tail = NULL;
    size_t nrest = 0, ntail = 0;
    if (r->ts && mx_tok_stream_flush(r->ts, &rest, &nrest, e))
        return -(e ? e->code : MX_EFORMAT);
    if (r->stop) {
        char *out = NULL;
        size_t n = 0;
        int hit = rest ? mx_stopper_feed(r->stop, rest, nrest, &out, &n) : 0;
        if (hit)
            r->st.finish = "stop";
        else
            mx_stopper_flush(r->stop, &tail, &ntail);
        free(rest);
        rest = out;
        nrest = n;
    }
    if (r->cb && nrest)
        r->cb(r->ud, -1, rest, nrest);
    if (r->cb && ntail)
        r->cb(r->ud, -1, tail, ntail);
    free(rest);
    free(tail);
    return 1;
}

/* Fills r->lp for token id from the logits saved before sampling. */
static void token_logprob(mx_gen_req *r, int32_t id)
{
    const float *x = r->raw;
    const int V = r->g->model->vocab;
    int k = r->o.top_logprobs < 0 ? 0 : r->o.top_logprobs;
    if (k > MX_MAX_TOP_LOGPROBS)
        k = MX_MAX_TOP_LOGPROBS;
    float mx = x[mx_argmax(x, V)];
    double sum = 0;
    mx_token_logprob *lp = &r->lp;
    lp->n_top = 0;
    for (int i = 0; i < V; i++) {
        float v = isnan(x[i]) ? -INFINITY : x[i];
        sum += exp((double)v - mx);
        /* insertion into the top k, best first (ties: lower id first) */
        if (k && (lp->n_top < k || v > lp->top_logprob[lp->n_top - 1])) {
            int j = lp->n_top < k ? lp->n_top++ : k - 1;
            while (j > 0 && v > lp->top_logprob[j - 1]) {
                lp->top_logprob[j] = lp->top_logprob[j - 1];
                lp->top_id[j] = lp->top_id[j - 1];
                j--;
            }
            lp->top_logprob[j] = v;
            lp->top_id[j] = i;
        }
    }
    float lse = mx + (float)log(sum);
    for (int j = 0; j < lp->n_top; j++)
        lp->top_logprob[j] -= lse;
    lp->id = id;
    lp->logprob = (isnan(x[id]) ? -INFINITY : x[id]) - lse;
}

/* mx_gen_req_step with the first n_hist ids of the session as the text so
 * far (a verify call's cache holds drafted tokens past them). */
static int step_at(mx_gen_req *r, int n_hist, int32_t *next, mx_err *e)
{
    if (r->finished)
        return 1;
    mx_session *s = r->s;
    if (r->o.max_tokens <= 0)
        return finish(r, "length", 1, e);
    if (r->raw)
        memcpy(r->raw, r->logits, sizeof(float) * (size_t)r->g->model->vocab);
    int32_t id = mx_sampler_sample(r->smp, r->logits, s->ids, (size_t)n_hist);
    if (id < 0) {
        r->finished = 1;
        r->st.finish = "error";
        mx_fail(e, MX_EINVAL, "no token is allowed here (the logit biases or the grammar rule out "
                              "every token)");
        return -MX_EINVAL;
    }
    mx_sampler_accept(r->smp, id);
    /* the mask allowed it, so the grammar takes it (eos only when complete) */
    if (r->gs && mx_grammar_accept_token(r->gs, id)) {
        r->finished = 1;
        r->st.finish = "error";
        mx_fail(e, MX_EINVAL, "grammar: token %d does not continue the output", (int)id);
        return -MX_EINVAL;
    }
    if (r->st.n_gen == 0)
        r->st.t_first = mx_now() - r->t0;
    if (!r->o.ignore_eos && mx_engine_is_eos(r->g, id))
        return finish(r, "stop", 1, e);
    r->st.n_gen++;
    char *piece = NULL;
    size_t plen = 0;
    /* Models pad their vocabulary past the tokenizer's (Qwen: 151936 rows,
     * 151646 tokens); such ids decode to nothing, as transformers does. */
    if (r->ts && id < mx_tok_vocab_size(r->g->tok) && mx_tok_stream_push(r->ts, id, &piece, &plen, e))
        return -(e ? e->code : MX_EFORMAT);
    if (r->raw) {
        token_logprob(r, id);
        r->lp_valid = 1;
    }
    int hit = emit(r, id, piece, plen);
    r->lp_valid = 0;
    free(piece);
    if (hit)
        return finish(r, hit > 0 ? "stop" : "cancelled", 0, e);
    /* a grammar whose sentence is complete and can go no further */
    if (r->gs && mx_grammar_finished(r->gs))
        return finish(r, "stop", 1, e);
    if (r->st.n_gen >= r->o.max_tokens || n_hist + 1 >= s->seq->n_ctx)
        return finish(r, "length", 1, e);
    *next = id;
    return 0;
}

/* Feeds next + draft[0..k) in one forward call, then samples from each
 * position's logits while the samples equal the draft (gen.h).  match:
 * the draft's n-gram length, for the cost model. */
static int verify(mx_gen_req *r, int32_t next, const int32_t *draft, int k, int match, int32_t *out,
                  mx_err *e)
{
    mx_session *s = r->s;
    mx_seq *q = s->seq;
    mx_model *m = r->g->model;
    const size_t V = (size_t)m->vocab;
    const int p0 = q->pos;
    if (k < 0 || k > MX_LOOKUP_MAX)
        return -mx_fail(e, MX_EINVAL, "lookup: a draft of %d tokens (at most %d)", k, MX_LOOKUP_MAX);
    if (r->finished)
        return 1;
    if (k && mx_model_state_floats(m))
        return -mx_fail(e, MX_EINVAL, "lookup: this model's recurrent state cannot drop rejected "
                                      "draft tokens");
    if (k && !r->all && !(r->all = malloc(sizeof(float) * V * (MX_LOOKUP_MAX + 1))))
        return -mx_fail(e, MX_ENOMEM, "lookup: out of memory for %d tokens' logits", MX_LOOKUP_MAX + 1);
    int32_t ids[MX_LOOKUP_MAX + 1];
    ids[0] = next;
    if (k)
        memcpy(ids + 1, draft, sizeof *ids * (size_t)k);
    double t0 = mx_now();
    mx_forward_trace tr = {.all_logits = r->all};
    int rc = mx_forward(m, q, ids, k + 1, k ? NULL : r->logits, k ? &tr : NULL, e);
    if (rc)
        return -rc;
    memcpy(s->ids + p0, ids, sizeof *ids * (size_t)(k + 1));
    const double t = mx_now() - t0;
    int i = 0, res;
    for (;; i++) {
        if (k)
            memcpy(r->logits, r->all + (size_t)i * V, sizeof(float) * V);
        res = step_at(r, p0 + i + 1, out, e);
        if (res != 0 || i == k || *out != draft[i])
            break;
    }
    /* the cache keeps what was fed and accepted: next and draft[0..i) */
    mx_seq_rewind(q, p0 + i + 1);
    if (k) {
        r->st.n_verify++;
        r->st.n_drafted += k;
        r->st.n_accepted += i;
    }
    /* compared: the i accepted, and a rejected one when the loop broke on it */
    const int checked = i + (res == 0 && i < k);
    mx_lookup_record(&r->lk, k + 1, t, match, checked, i);
    return res;
}

int mx_gen_req_step(mx_gen_req *r, int32_t *next, mx_err *e)
{
    return step_at(r, r->s->seq->pos, next, e);
}

int mx_gen_req_verify(mx_gen_req *r, int32_t next, const int32_t *draft, int k, int32_t *out,
                      mx_err *e)
{
    return verify(r, next, draft, k, 0, out, e);
}

int mx_gen_req_decode(mx_gen_req *r, int32_t next, int32_t *out, mx_err *e)
{
    int k = 0, match = 0;
    if (r->lookup && !r->finished) {
        mx_session *s = r->s;
        const int p0 = s->seq->pos;
        /* drafted tokens that can still be used: step i of a verify call
         * continues only while the context and max_tokens leave room */
        int room = s->seq->n_ctx - p0 - 2, left = r->o.max_tokens - r->st.n_gen - 1;
        int lim = room < left ? room : left;
        if (lim > r->lk.max_draft)
            lim = r->lk.max_draft;
        if (lim > 0) {
            s->ids[p0] = next;   /* where it will be fed; the context to look up in */
            int n = mx_lookup_draft(s->ids, p0 + 1, MX_LOOKUP_NGRAM, lim, r->draft, &match);
            if (n)
                k = mx_lookup_choose(&r->lk, match, n);
        }
    }
    return verify(r, next, r->draft, k, match, out, e);
}

void mx_gen_req_fed(mx_gen_req *r, int32_t id)
{
    mx_session *s = r->s;
    if (s->seq->pos > 0)
        s->ids[s->seq->pos - 1] = id;
}

float *mx_gen_req_logits(mx_gen_req *r) { return r->logits; }
mx_session *mx_gen_req_session(mx_gen_req *r) { return r->s; }
const mx_gen_stats *mx_gen_req_stats(const mx_gen_req *r) { return &r->st; }
const mx_token_logprob *mx_gen_req_logprob(const mx_gen_req *r)
{
    return r->lp_valid ? &r->lp : NULL;
}

int mx_generate(mx_engine *g, mx_session *s, const int32_t *prompt, int n_prompt,
                const mx_gen_opts *o, mx_gen_cb cb, void *ud, mx_gen_stats *st, mx_err *e)
{
    mx_gen_req *r = NULL;
    int rc = mx_gen_req_new(g, s, prompt, n_prompt, o, cb, ud, &r, e);
    if (!rc)
        rc = mx_gen_req_prefill(r, e);
    if (!rc) {
        int32_t next;
        int k = mx_gen_req_step(r, &next, e);
        while (k == 0)
            k = mx_gen_req_decode(r, next, &next, e);
        if (k < 0)
            rc = -k;
    }
    if (st)
        *st = r ? r->st : (mx_gen_stats){.finish = "error"};
    mx_gen_req_free(r);
    return rc;
}
