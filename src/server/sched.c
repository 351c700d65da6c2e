/* sched.c - the scheduler thread: the only thread that touches the model.
 *
 * Each turn: admit at most one waiting request into a free slot, prefill at
 * most one chunk of one prompt (so a long prompt delays the others by one
 * chunk, not by its whole length), then one decode step for every decoding
 * slot at once through mx_forward_batch, and let each request sample and
 * emit its next token.  Requests wait in a bounded FIFO, so admission is
 * first come, first served. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "server/srv_int.h"
#include "util/clock.h"

srv_req *srv_req_new(void)
{
    srv_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (pthread_cond_init(&r->cv, NULL) != 0) {
        free(r);
        return NULL;
    }
    r->refs = 1;
    r->n = 1;
    r->n_choices = 1;
    r->finish = "stop";
    r->gen.stops = (const char *const *)r->stops;
    return r;
}

void srv_req_free(srv_req *r)
{
    for (size_t i = 0; i < SRV_MAX_STOPS; i++)
        free(r->stops[i]);
    for (int i = 0; i < r->n_prompts; i++)
        free(r->prompts[i]);
    for (int i = 0; r->ch && i < r->n_choices; i++) {
        free(r->ch[i].text);
        free(r->ch[i].lp);
    }
    free(r->ch);
    free(r->bias_ids);
    free(r->bias_vals);
    mx_grammar_free(r->grammar);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void srv_req_release(srv_sched *sc, srv_req *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&sc->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&sc->mu);
    if (last)
        srv_req_free(r);
}

void srv_req_cancel(srv_sched *sc, srv_req *r)
{
    pthread_mutex_lock(&sc->mu);
    r->cancelled = 1;
    pthread_mutex_unlock(&sc->mu);
}

void srv_sched_counts(srv_sched *sc, int *busy, int *queued)
{
    pthread_mutex_lock(&sc->mu);
    *busy = sc->n_busy;
    *queued = sc->n_queued;
    pthread_mutex_unlock(&sc->mu);
}

void srv_sched_snapshot(srv_sched *sc, srv_slot_info *info, srv_totals *tot, int *busy,
                        int *queued)
{
    pthread_mutex_lock(&sc->mu);
    if (info)
        memcpy(info, sc->info, sizeof *info * (size_t)sc->n_slots);
    if (tot)
        *tot = sc->totals;
    *busy = sc->n_busy;
    *queued = sc->n_queued;
    pthread_mutex_unlock(&sc->mu);
}

/* Copies the slots' state for /slots and /metrics; under mu, scheduler
 * thread (the only writer of the slots). */
static void publish(srv_sched *sc)
{
    for (int i = 0; i < sc->n_slots; i++) {
        const srv_slot *sl = &sc->slots[i];
        srv_slot_info *in = &sc->info[i];
        in->state = sl->state;
        in->n_cached = sl->sess ? sl->sess->seq->pos : 0;
        in->n_prompt = sl->req ? sl->req->n_prompt_of[sl->req->cur / sl->req->n] : 0;
        in->n_gen = sl->gr ? mx_gen_req_stats(sl->gr)->n_gen : 0;
        snprintf(in->req_id, sizeof in->req_id, "%s", sl->req ? sl->req->id : "");
    }
}

int srv_sched_submit(srv_sched *sc, srv_req *r)
{
    pthread_mutex_lock(&sc->mu);
    int free_slots = sc->n_slots - sc->n_busy;
    /* requests already queued are ahead of any free slot */
    if (sc->stopping || sc->n_queued - free_slots >= sc->max_queue) {
        pthread_mutex_unlock(&sc->mu);
        return -1;
    }
    r->refs++;
    r->next = NULL;
    if (sc->qtail)
        sc->qtail->next = r;
    else
        sc->qhead = r;
    sc->qtail = r;
    sc->n_queued++;
    pthread_cond_signal(&sc->wake);
    pthread_mutex_unlock(&sc->mu);
    return 0;
}

/* Appends a token's log-probabilities to the choice; -1 when out of memory. */
static int add_logprob(srv_choice *ch, const mx_token_logprob *lp)
{
    if (ch->n_lp == ch->cap_lp) {
        int cap = ch->cap_lp ? 2 * ch->cap_lp : 16;
        srv_lp *p = realloc(ch->lp, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        ch->lp = p;
        ch->cap_lp = cap;
    }
    ch->lp[ch->n_lp].lp = *lp;
    ch->lp[ch->n_lp].off = ch->len;
    ch->n_lp++;
    return 0;
}

static int add_text(srv_choice *ch, const char *text, size_t len)
{
    if (ch->len + len + 1 > ch->cap) {
        size_t cap = ch->cap ? ch->cap : 256;
        while (cap < ch->len + len + 1)
            cap *= 2;
        char *p = realloc(ch->text, cap);
        if (!p)
            return -1;
        ch->text = p;
        ch->cap = cap;
    }
    memcpy(ch->text + ch->len, text, len);
    ch->len += len;
    ch->text[ch->len] = 0;
    return 0;
}

/* Text (and log-probabilities) of the current choice, appended under the
 * lock; waiters are woken.  Returns 1 when the client has gone away (the
 * generation is then cancelled). */
static int on_text(void *ud, int32_t id, const char *text, size_t len)
{
    srv_slot *sl = ud;
    srv_req *r = sl->req;
    pthread_mutex_t *mu = &sl->owner->mu;
    const mx_token_logprob *lp = id >= 0 ? mx_gen_req_logprob(sl->gr) : NULL;
    pthread_mutex_lock(mu);
    srv_choice *ch = &r->ch[r->cur];
    int cancel = r->cancelled;
    if (!cancel && ((lp && add_logprob(ch, lp)) || (len && add_text(ch, text, len)))) {
        cancel = 1;
        r->err_status = 500;
        snprintf(r->err, sizeof r->err, "out of memory");
    }
    if (!cancel && (len || lp))
        pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(mu);
    return cancel;
}

/* Ends the slot's request: results under the lock, waiters woken, the slot
 * freed (its session and cache stay for the next request). */
/* Records the current choice's results (under mu).  The first choice of
 * each prompt counts its prompt (later ones find it cached). */
static void choice_results(srv_sched *sc, srv_req *r, const mx_gen_stats *st)
{
    srv_choice *ch = &r->ch[r->cur];
    ch->n_gen = st->n_gen;
    ch->finish = st->finish;
    ch->done = 1;
    r->n_gen += st->n_gen;
    r->finish = st->finish;
    int first = r->cur % r->n == 0;
    if (first)
        r->n_cached += st->n_cached;
    r->n_prefilled += st->n_prompt - st->n_cached;
    r->t_prefill += st->t_prefill;
    r->t_decode += st->t_decode > 0 ? st->t_decode : 0;
    r->n_drafted += st->n_drafted;
    r->n_accepted += st->n_accepted;
    sc->totals.prompt_tokens += (unsigned long long)(st->n_prompt - st->n_cached);
    if (first)
        sc->totals.cached_tokens += (unsigned long long)st->n_cached;
    sc->totals.gen_tokens += (unsigned long long)st->n_gen;
    sc->totals.t_prefill += st->t_prefill;
    sc->totals.t_decode += st->t_decode > 0 ? st->t_decode : 0;
}

static void slot_finish(srv_sched *sc, srv_slot *sl, int status, const char *code,
                        const char *msg)
{
    srv_req *r = sl->req;
    const mx_gen_stats *st = sl->gr ? mx_gen_req_stats(sl->gr) : NULL;
    pthread_mutex_lock(&sc->mu);
    if (st && !r->ch[r->cur].done)
        choice_results(sc, r, st);
    sc->totals.requests++;
    if (r->cancelled && !status)
        r->finish = "cancelled";
    if (status && !r->err_status) {
        r->err_status = status;
        r->err_code = code;
        snprintf(r->err, sizeof r->err, "%s", msg);
    }
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    sc->n_busy--;
    pthread_mutex_unlock(&sc->mu);
    mx_gen_req_free(sl->gr);
    sl->gr = NULL;
    sl->req = NULL;
    sl->state = SLOT_FREE;
    srv_req_release(sc, r);
}

/* A request that never got a slot (cancelled while waiting, or stopping). */
static void req_end_unadmitted(srv_sched *sc, srv_req *r, const char *finish)
{
    pthread_mutex_lock(&sc->mu);
    r->finish = finish;
    if (sc->stopping && !r->cancelled) {
        r->err_status = 503;
        r->err_code = "server_shutdown";
        snprintf(r->err, sizeof r->err, "the server is shutting down");
    }
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&sc->mu);
    srv_req_release(sc, r);
}

static int common_prefix(const mx_session *s, const srv_req *r)
{
    if (!s)
        return 0;
    const int32_t *p = r->prompts[r->cur / r->n];
    int np = r->n_prompt_of[r->cur / r->n], n = 0;
    while (n < s->seq->pos && n < np - 1 && s->ids[n] == p[n])
        n++;
    return n;
}

/* The free slot whose cache shares the longest prefix with the prompt (a
 * follow-up chat turn lands where its history already is). */
static int pick_slot(srv_sched *sc, const srv_req *r)
{
    int best = -1, best_n = -1;
    for (int i = 0; i < sc->n_slots; i++) {
        if (sc->slots[i].state != SLOT_FREE)
            continue;
        int n = common_prefix(sc->slots[i].sess, r);
        if (n > best_n) {
            best = i;
            best_n = n;
        }
    }
    return best;
}

/* Sets up the generation of the request's current choice in the slot.
 * The choices of a request run one after another in the same slot, so the
 * second and later choices of a prompt find it in the cache: the prompt is
 * prefilled once. */
static void start_choice(srv_sched *sc, srv_slot *sl)
{
    srv_req *r = sl->req;
    mx_err e = {0};
    mx_gen_opts o = r->gen;
    o.sample.seed += (uint64_t)r->cur;
    int p = r->cur / r->n;
    sl->state = SLOT_PREFILL;
    if (mx_gen_req_new(sc->g, sl->sess, r->prompts[p], r->n_prompt_of[p], &o, on_text, sl, &sl->gr,
                       &e)) {
        slot_finish(sc, sl, e.code == MX_ENOMEM ? 500 : 400, NULL, e.msg);
        return;
    }
    /* keep the cached prefix, drop the rest */
    sl->pf_pos = mx_seq_rewind(sl->sess->seq, common_prefix(sl->sess, r));
}

static void admit(srv_sched *sc, srv_slot *sl, srv_req *r)
{
    mx_err e = {0};
    sl->req = r;
    sl->state = SLOT_PREFILL;
    sl->t_admit = mx_now();
    if (!sl->sess && mx_session_new(sc->g, sc->n_ctx, &sl->sess, &e)) {
        slot_finish(sc, sl, 503, "server_busy", e.msg);
        return;
    }
    start_choice(sc, sl);
}

/* The current choice is finished: on to the next, or the request is. */
static void choice_finish(srv_sched *sc, srv_slot *sl)
{
    srv_req *r = sl->req;
    pthread_mutex_lock(&sc->mu);
    int more = r->cur + 1 < r->n_choices && !r->cancelled && !r->err_status;
    if (more) {
        choice_results(sc, r, mx_gen_req_stats(sl->gr));
        r->cur++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&sc->mu);
    if (!more) {
        slot_finish(sc, sl, 0, NULL, NULL);
        return;
    }
    mx_gen_req_free(sl->gr);
    sl->gr = NULL;
    start_choice(sc, sl);
}

/* Samples the request's next token; finishes it when done. */
static void slot_step(srv_sched *sc, srv_slot *sl)
{
    mx_err e = {0};
    int32_t next = 0;
    int k = mx_gen_req_step(sl->gr, &next, &e);
    if (k < 0)
        slot_finish(sc, sl, 500, NULL, e.msg);
    else if (k > 0)
        choice_finish(sc, sl);
    else {
        sl->next = next;
        sl->state = SLOT_DECODE;
    }
}

/* One chunk of one prompt.  Chunks before the last are fed straight into
 * the session (recorded in its ids), so mx_gen_req_prefill then finds them
 * cached and runs only the rest. */
static void prefill_one(srv_sched *sc)
{
    srv_slot *sl = NULL;
    for (int i = 0; i < sc->n_slots; i++)
        if (sc->slots[i].state == SLOT_PREFILL && (!sl || sc->slots[i].t_admit < sl->t_admit))
            sl = &sc->slots[i];
    if (!sl)
        return;
    srv_req *r = sl->req;
    mx_err e = {0};
    const int32_t *prompt = r->prompts[r->cur / r->n];
    int left = r->n_prompt_of[r->cur / r->n] - sl->pf_pos;
    if (left > sc->prefill_chunk + 1) {
        mx_session *s = sl->sess;
        int pos = s->seq->pos;
        if (mx_forward(sc->g->model, s->seq, prompt + pos, sc->prefill_chunk, NULL, NULL, &e)) {
            slot_finish(sc, sl, 500, NULL, e.msg);
            return;
        }
        memcpy(s->ids + pos, prompt + pos, sizeof *s->ids * (size_t)sc->prefill_chunk);
        sl->pf_pos = s->seq->pos;
        return;
    }
    if (mx_gen_req_prefill(sl->gr, &e)) {
        slot_finish(sc, sl, 500, NULL, e.msg);
        return;
    }
    slot_step(sc, sl);
}

/* Whether n sequences go through one mx_forward_batch or through n
 * single-token mx_forward calls.  Batching is the point (one pass over the
 * weights for all of them), but whether it pays depends on the kernels: a
 * batch step is timed against n single steps (moving averages, per batch
 * size), the faster is used, and the other is re-measured now and then so
 * the choice follows the machine and the load. */
static int use_batch(srv_sched *sc, int n)
{
    if (n == 1 || sc->batch_mode == 1)
        return 0;
    if (sc->batch_mode == 2)
        return 1;
    double tb = sc->t_batch[n], ts = sc->t_single;
    if (tb == 0)
        return 1;
    if (ts == 0)
        return 0;
    int batch = tb <= n * ts;
    if (++sc->n_decide % 32 == 0)
        batch = !batch;          /* re-measure the other way */
    return batch;
}

static void ewma(double *avg, double x) { *avg = *avg == 0 ? x : 0.8 * *avg + 0.2 * x; }

/* One token for every decoding slot. */
static void decode_all(srv_sched *sc)
{
    const int V = sc->g->model->vocab;
    int n = 0;
    for (int i = 0; i < sc->n_slots; i++) {
        srv_slot *sl = &sc->slots[i];
        if (sl->state != SLOT_DECODE)
            continue;
        sc->rows[n] = i;
        sc->seqs[n] = sl->sess->seq;
        sc->toks[n] = sl->next;
        n++;
    }
    if (!n)
        return;
    mx_err e = {0};
    srv_slot *alone = &sc->slots[sc->rows[0]];
    if (n == 1 && alone->req->gen.lookup > 0) {
        /* a request decoding alone: prompt lookup may feed a draft with its
         * token and emit several tokens (gen.h) */
        int32_t next = 0;
        int k = mx_gen_req_decode(alone->gr, alone->next, &next, &e);
        if (k < 0)
            slot_finish(sc, alone, 500, NULL, e.msg);
        else if (k > 0)
            choice_finish(sc, alone);
        else
            alone->next = next;
        return;
    }
    int rc = 0, batch = use_batch(sc, n);
    double t0 = mx_now();
    if (batch) {
        rc = mx_forward_batch(sc->g->model, sc->seqs, sc->toks, n, sc->logits, &e);
        if (!rc)
            ewma(&sc->t_batch[n], mx_now() - t0);
    } else {
        /* the single-token path (fused MoE), as mx_generate runs it */
        for (int j = 0; j < n && !rc; j++)
            rc = mx_forward(sc->g->model, sc->seqs[j], &sc->toks[j], 1, sc->logits + (size_t)j * V,
                            NULL, &e);
        if (!rc)
            ewma(&sc->t_single, (mx_now() - t0) / n);
    }
    for (int j = 0; j < n; j++) {
        srv_slot *sl = &sc->slots[sc->rows[j]];
        if (rc) {
            slot_finish(sc, sl, 500, NULL, e.msg);
            continue;
        }
        memcpy(mx_gen_req_logits(sl->gr), sc->logits + (size_t)j * V, sizeof(float) * (size_t)V);
        mx_gen_req_fed(sl->gr, sl->next);
        slot_step(sc, sl);
    }
}

/* Requests whose client went away: end them before spending compute. */
static void reap_cancelled(srv_sched *sc)
{
    for (int i = 0; i < sc->n_slots; i++) {
        srv_slot *sl = &sc->slots[i];
        if (sl->state == SLOT_FREE)
            continue;
        pthread_mutex_lock(&sc->mu);
        int c = sl->req->cancelled;
        pthread_mutex_unlock(&sc->mu);
        if (c)
            slot_finish(sc, sl, 0, NULL, NULL);
    }
}

static void *sched_main(void *arg)
{
    srv_sched *sc = arg;
    pthread_mutex_lock(&sc->mu);
    for (;;) {
        while (!sc->stopping && !sc->qhead && sc->n_busy == 0)
            pthread_cond_wait(&sc->wake, &sc->mu);
        if (sc->stopping)
            break;
        srv_req *r = NULL;
        if (sc->qhead && sc->n_busy < sc->n_slots) {
            r = sc->qhead;
            sc->qhead = r->next;
            if (!sc->qhead)
                sc->qtail = NULL;
            sc->n_queued--;
            r->next = NULL;
            if (r->cancelled) {
                pthread_mutex_unlock(&sc->mu);
                req_end_unadmitted(sc, r, "cancelled");
                pthread_mutex_lock(&sc->mu);
                continue;
            }
            sc->n_busy++;
        }
        pthread_mutex_unlock(&sc->mu);
        if (r)
            admit(sc, &sc->slots[pick_slot(sc, r)], r);
        reap_cancelled(sc);
        prefill_one(sc);
        decode_all(sc);
        pthread_mutex_lock(&sc->mu);
        publish(sc);
    }
    /* stopping: end what is queued and what runs (streams get their end) */
    while (sc->qhead) {
        srv_req *r = sc->qhead;
        sc->qhead = r->next;
        sc->n_queued--;
        pthread_mutex_unlock(&sc->mu);
        req_end_unadmitted(sc, r, "cancelled");
        pthread_mutex_lock(&sc->mu);
    }
    sc->qtail = NULL;
    pthread_mutex_unlock(&sc->mu);
    /* generations cut by the shutdown say so: an error (503
     * server_shutdown), never a finish_reason that looks like max_tokens */
    for (int i = 0; i < sc->n_slots; i++)
        if (sc->slots[i].state != SLOT_FREE)
            slot_finish(sc, &sc->slots[i], 503, "server_shutdown",
                        "the server is shutting down: the generation was cut short");
    pthread_mutex_lock(&sc->mu);
    publish(sc);
    pthread_mutex_unlock(&sc->mu);
    return NULL;
}

int srv_sched_init(srv_sched *sc, mx_engine *g, int n_slots, int n_ctx, int max_queue,
                   int prefill_chunk, int batch_mode, mx_err *e)
{
    memset(sc, 0, sizeof *sc);
    /* every slot may fill its whole context: refuse to start rather than
     * meet the OOM killer under load */
    int rc = mx_engine_check_memory(g, n_ctx, n_slots, e);
    if (rc)
        return rc;
    sc->batch_mode = batch_mode;
    sc->g = g;
    sc->n_ctx = n_ctx;
    sc->n_slots = n_slots;
    sc->max_queue = max_queue;
    sc->prefill_chunk = prefill_chunk > 0 ? prefill_chunk : 256;
    pthread_mutex_init(&sc->mu, NULL);
    pthread_cond_init(&sc->wake, NULL);
    sc->slots = calloc((size_t)n_slots, sizeof *sc->slots);
    sc->logits = malloc(sizeof(float) * (size_t)n_slots * (size_t)g->model->vocab);
    sc->seqs = calloc((size_t)n_slots, sizeof *sc->seqs);
    sc->toks = calloc((size_t)n_slots, sizeof *sc->toks);
    sc->rows = calloc((size_t)n_slots, sizeof *sc->rows);
    sc->t_batch = calloc((size_t)n_slots + 1, sizeof *sc->t_batch);
    sc->info = calloc((size_t)n_slots, sizeof *sc->info);
    if (!sc->slots || !sc->logits || !sc->seqs || !sc->toks || !sc->rows || !sc->t_batch ||
        !sc->info) {
        srv_sched_free(sc);
        return mx_fail(e, MX_ENOMEM, "out of memory for %d server slots", n_slots);
    }
    for (int i = 0; i < n_slots; i++)
        sc->slots[i].owner = sc;
    if (pthread_create(&sc->th, NULL, sched_main, sc) != 0) {
        srv_sched_free(sc);
        return mx_fail(e, MX_EIO, "cannot start the scheduler thread");
    }
    sc->started = 1;
    return MX_OK;
}

void srv_sched_stop(srv_sched *sc)
{
    if (!sc->started)
        return;
    pthread_mutex_lock(&sc->mu);
    sc->stopping = 1;
    pthread_cond_signal(&sc->wake);
    pthread_mutex_unlock(&sc->mu);
    pthread_join(sc->th, NULL);
    sc->started = 0;
}

void srv_sched_free(srv_sched *sc)
{
    srv_sched_stop(sc);
    if (sc->slots)
        for (int i = 0; i < sc->n_slots; i++)
            mx_session_free(sc->slots[i].sess);
    free(sc->slots);
    free(sc->logits);
    free(sc->seqs);
    free(sc->toks);
    free(sc->rows);
    free(sc->t_batch);
    free(sc->info);
    sc->info = NULL;
    sc->t_batch = NULL;
    sc->slots = NULL;
    sc->logits = NULL;
    sc->seqs = NULL;
    sc->toks = NULL;
    sc->rows = NULL;
    pthread_cond_destroy(&sc->wake);
    pthread_mutex_destroy(&sc->mu);
}
