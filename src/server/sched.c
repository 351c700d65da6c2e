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

#include "server/srv_int.h"

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
    r->finish = "stop";
    r->gen.stops = (const char *const *)r->stops;
    return r;
}

void srv_req_free(srv_req *r)
{
    for (size_t i = 0; i < SRV_MAX_STOPS; i++)
        free(r->stops[i]);
    free(r->prompt);
    free(r->text);
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
        in->n_prompt = sl->req ? sl->req->n_prompt : 0;
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

/* Text for a request, appended under the lock; waiters are woken.  Returns
 * 1 when the client has gone away (the generation is then cancelled). */
static int on_text(void *ud, int32_t id, const char *text, size_t len)
{
    srv_slot *sl = ud;
    srv_req *r = sl->req;
    pthread_mutex_t *mu = &sl->owner->mu;
    (void)id;
    pthread_mutex_lock(mu);
    int cancel = r->cancelled;
    if (!cancel && len) {
        if (r->len + len + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 256;
            while (cap < r->len + len + 1)
                cap *= 2;
            char *p = realloc(r->text, cap);
            if (!p) {
                cancel = 1;
                r->err_status = 500;
                snprintf(r->err, sizeof r->err, "out of memory");
            } else {
                r->text = p;
                r->cap = cap;
            }
        }
        if (!cancel) {
            memcpy(r->text + r->len, text, len);
            r->len += len;
            r->text[r->len] = 0;
            pthread_cond_broadcast(&r->cv);
        }
    }
    pthread_mutex_unlock(mu);
    return cancel;
}

/* Ends the slot's request: results under the lock, waiters woken, the slot
 * freed (its session and cache stay for the next request). */
static void slot_finish(srv_sched *sc, srv_slot *sl, int status, const char *code,
                        const char *msg)
{
    srv_req *r = sl->req;
    const mx_gen_stats *st = sl->gr ? mx_gen_req_stats(sl->gr) : NULL;
    pthread_mutex_lock(&sc->mu);
    if (st) {
        r->n_gen = st->n_gen;
        r->n_cached = st->n_cached;
        r->finish = st->finish;
        sc->totals.requests++;
        sc->totals.prompt_tokens += (unsigned long long)(st->n_prompt - st->n_cached);
        sc->totals.cached_tokens += (unsigned long long)st->n_cached;
        sc->totals.gen_tokens += (unsigned long long)st->n_gen;
        sc->totals.t_prefill += st->t_prefill;
        sc->totals.t_decode += st->t_decode > 0 ? st->t_decode : 0;
    }
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
    int n = 0;
    while (n < s->seq->pos && n < r->n_prompt - 1 && s->ids[n] == r->prompt[n])
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
    if (mx_gen_req_new(sc->g, sl->sess, r->prompt, r->n_prompt, &r->gen, on_text, sl, &sl->gr,
                       &e)) {
        slot_finish(sc, sl, e.code == MX_ENOMEM ? 500 : 400, NULL, e.msg);
        return;
    }
    /* keep the cached prefix, drop the rest */
    sl->pf_pos = common_prefix(sl->sess, r);
    sl->sess->seq->pos = sl->pf_pos;
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
        slot_finish(sc, sl, 0, NULL, NULL);
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
    int left = r->n_prompt - sl->pf_pos;
    if (left > sc->prefill_chunk + 1) {
        mx_session *s = sl->sess;
        int pos = s->seq->pos;
        if (mx_forward(sc->g->model, s->seq, r->prompt + pos, sc->prefill_chunk, NULL, NULL, &e)) {
            slot_finish(sc, sl, 500, NULL, e.msg);
            return;
        }
        memcpy(s->ids + pos, r->prompt + pos, sizeof *s->ids * (size_t)sc->prefill_chunk);
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
