/* http.c - libmicrohttpd glue: routing, request bodies, authentication,
 * waiting for generations, server-sent-event streams, request logs, and
 * server start/stop.
 *
 * MHD runs one thread per connection, so a handler may simply block on its
 * request's condition variable while the scheduler generates.  Limits keep
 * hostile clients bounded: body size (413 when announced, the connection
 * dropped when a chunked body grows past it), connection count, idle
 * timeout, and MHD's own header-size limit. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "grammar/grammar.h"
#include "server/srv_int.h"
#include "util/clock.h"

/* Routes (see route()). */
enum { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE,
       R_APPLY_TEMPLATE, R_PROPS, R_SLOTS, R_METRICS, R_WEBUI, R_COUNT };

struct mx_server {
    mx_engine *g;
    mx_server_opts o;
    srv_ctx ctx;
    srv_vocab gv;
    srv_sched sc;
    struct MHD_Daemon *d;
    int port;
    double t_start;
    unsigned long requests[R_COUNT];   /* answered, by route (atomic adds) */
    unsigned long status[6];           /* answered, by status class 1xx..5xx; [0] dropped */
    int n_gen_conns;                   /* connections with a generation not yet answered */
};

/* Per-request state, from the first call of the access handler to the
 * request-completed callback. */
typedef struct conn_state {
    mx_server *srv;
    char method[16];
    char path[128];
    char *body;
    size_t len, cap;
    double t0;
    int route;
    int status;                  /* 0: dropped without a response */
    int too_large;               /* a chunked body passed --max-body: read, dropped, then 413 */
    size_t discarded;
    srv_req *req;                /* a generation (one reference) */
} conn_state;

/* A streamed response: SSE events produced on demand by the reader. */
typedef struct stream_state {
    mx_server *srv;
    srv_req *r;                  /* one reference */
    struct MHD_Connection *conn;
    char *pend;                  /* the event being sent */
    size_t plen, poff;
    int k;                       /* the choice being streamed */
    size_t sent;                 /* bytes of its text already sent */
    int sent_lp;                 /* and of its logprobs entries */
    int phase;                   /* 0 start of a choice, 1 text, 2 end, 3 done */
    mx_tool_parser tp;           /* with tools: the choice's calls and content */
} stream_state;

void mx_server_opts_defaults(mx_server_opts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 4;
    o->queue = 16;
    o->n_predict = 256;
    mx_sample_defaults(&o->sample);
    o->max_body = 1u << 20;
    o->timeout_s = 30;
    o->max_conns = 64;
    o->prefill_chunk = 256;
    o->webui = 1;
}

/* ---- responses ---- */

/* Headers every response gets: CORS when --cors-origin is set. */
static void common_headers(const mx_server *s, struct MHD_Response *resp)
{
    if (s->o.cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", s->o.cors_origin);
        if (strcmp(s->o.cors_origin, "*") != 0)
            MHD_add_response_header(resp, "Vary", "Origin");
    }
}

static enum MHD_Result send_body(conn_state *cs, struct MHD_Connection *conn, int status,
                                 char *body, const char *ctype)
{
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(n, body ? body : (char *)"", MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    common_headers(cs->srv, resp);
    if (status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES)
        cs->status = status;
    return ok;
}

static enum MHD_Result send_reply(conn_state *cs, struct MHD_Connection *conn, srv_reply *rep)
{
    if (!rep->body)
        srv_error(rep, 500, NULL, "out of memory");
    char *b = rep->body;
    rep->body = NULL;
    return send_body(cs, conn, rep->status, b, "application/json");
}

static enum MHD_Result send_error(conn_state *cs, struct MHD_Connection *conn, int status,
                                  const char *code, const char *msg)
{
    srv_reply rep = {0};
    srv_error(&rep, status, code, "%s", msg);
    return send_reply(cs, conn, &rep);
}

/* ---- streaming ---- */

static void ss_set(stream_state *ss, char *ev)
{
    free(ss->pend);
    ss->pend = ev;
    ss->plen = ev ? strlen(ev) : 0;
    ss->poff = 0;
}

/* MHD closes a connection whose last activity is older than the timeout
 * when the handler returns; a wait for tokens is not idleness, so the
 * timeout is lifted while waiting and set again (which restarts it) after. */
static void timeout_pause(struct MHD_Connection *conn)
{
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
}

static void timeout_resume(mx_server *s, struct MHD_Connection *conn)
{
    MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.timeout_s);
}

static void deadline_in(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (ms % 1000) * 1000000L;
    ts->tv_sec += ms / 1000 + ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* With tools (under the scheduler's mutex): feeds choice ch's text to the
 * stream's parser and makes *ev the events of what it released: a content
 * chunk (with the n_lp new logprobs entries) and two chunks per completed
 * call.  *ev stays NULL when nothing was released.  0, or -1 on failure. */
static int tool_events(stream_state *ss, const srv_choice *ch, int n_lp, int ended, char **ev)
{
    const srv_ctx *c = &ss->srv->ctx;
    const srv_req *r = ss->r;
    mx_tool_out out = {0};
    int first = ss->tp.n_calls;
    *ev = NULL;
    if (mx_tool_parse(&ss->tp, ch->text ? ch->text : "", ch->len, ended, &out)) {
        mx_tool_out_free(&out);
        return -1;
    }
    char *a = out.len || n_lp ? srv_chunk_sse(c, r, ss->k, out.len ? out.content : NULL, out.len,
                                              n_lp ? ch->lp + ss->sent_lp : NULL, n_lp, NULL, 0)
                              : NULL;
    char *b = out.n_calls ? srv_tool_calls_sse(c, r, ss->k, out.calls, out.n_calls, first) : NULL;
    int failed = ((out.len || n_lp) && !a) || (out.n_calls && !b);
    size_t na = a ? strlen(a) : 0, nb = b ? strlen(b) : 0;
    if (!failed && (a || b)) {
        if ((*ev = malloc(na + nb + 1))) {
            memcpy(*ev, a ? a : "", na);
            memcpy(*ev + na, b ? b : "", nb + 1);
        } else {
            failed = 1;
        }
    }
    free(a);
    free(b);
    mx_tool_out_free(&out);
    return failed ? -1 : 0;
}

/* The next event of the stream into ss->pend; 0 ok, -1 on failure.  The
 * choices of a request are generated one after another, so they are
 * streamed in turn: each its role chunk (chat), its text, its finish. */
static int next_event(stream_state *ss)
{
    mx_server *s = ss->srv;
    srv_req *r = ss->r;
    const srv_ctx *c = &s->ctx;
    if (ss->phase == 0) {
        ss->phase = 1;
        if (r->kind == SRV_CHAT) {
            ss_set(ss, srv_chunk_sse(c, r, ss->k, NULL, 0, NULL, 0, NULL, 1));
            return ss->pend ? 0 : -1;
        }
    }
    if (ss->phase == 1) {
        timeout_pause(ss->conn);
        pthread_mutex_lock(&s->sc.mu);
        srv_choice *ch = &r->ch[ss->k];
        char *ev = NULL;
        size_t n;
        int n_lp, more;
        for (;;) {
            while (ch->len == ss->sent && ch->n_lp == ss->sent_lp && !ch->done && !r->done) {
                struct timespec ts;
                deadline_in(&ts, 1000);
                pthread_cond_timedwait(&r->cv, &s->sc.mu, &ts);
            }
            n = ch->len - ss->sent;
            n_lp = ch->n_lp - ss->sent_lp;
            more = n || n_lp;
            if (!r->tool_fmt)
                break;
            /* content and calls as the parser releases them: it holds back
             * text that may be the start of a call until that is decided
             * (then there is nothing to send yet: wait for more), and lets
             * go of the rest when the choice ends */
            int ended = ch->done || r->done;
            if (tool_events(ss, ch, n_lp, ended, &ev)) {
                pthread_mutex_unlock(&s->sc.mu);
                timeout_resume(s, ss->conn);
                return -1;
            }
            ss->sent = ch->len;
            ss->sent_lp = ch->n_lp;
            more = ev != NULL;
            if (more || ended)
                break;
        }
        if (more && !r->tool_fmt) {
            ev = srv_chunk_sse(c, r, ss->k, n ? ch->text + ss->sent : NULL, n,
                               n_lp ? ch->lp + ss->sent_lp : NULL, n_lp, NULL, 0);
            ss->sent = ch->len;
            ss->sent_lp = ch->n_lp;
        } else if (more) {
            /* with tools, ev was made above */
        } else if (ch->done && !r->err_status && ss->k + 1 < r->n_choices) {
            /* this choice is complete and another follows */
            ev = srv_chunk_sse(c, r, ss->k, NULL, 0, NULL, 0, srv_finish_reason(r, ch, ss->tp.n_calls), 0);
            more = 1;
            ss->k++;
            ss->sent = 0;
            ss->sent_lp = 0;
            ss->phase = 0;
            mx_tool_parser_init(&ss->tp, r->tool_fmt);
        } else {
            ss->phase = 2;
        }
        pthread_mutex_unlock(&s->sc.mu);
        timeout_resume(s, ss->conn);
        if (more) {
            ss_set(ss, ev);
            return ev ? 0 : -1;
        }
    }
    /* done: the results are final, no lock needed */
    const srv_choice *ch = &r->ch[ss->k];
    char *a = r->err_status ? srv_error_sse(r->err, r->err_code)
                            : srv_chunk_sse(c, r, ss->k, NULL, 0, NULL, 0,
                                            srv_finish_reason(r, ch, ss->tp.n_calls), 0);
    char *u = !r->err_status && r->include_usage ? srv_usage_sse(c, r, r->n_gen) : NULL;
    static const char done[] = "data: [DONE]\n\n";
    size_t na = a ? strlen(a) : 0, nu = u ? strlen(u) : 0;
    char *ev = malloc(na + nu + sizeof done);
    if (ev) {
        memcpy(ev, a ? a : "", na);
        memcpy(ev + na, u ? u : "", nu);
        memcpy(ev + na + nu, done, sizeof done);
    }
    free(a);
    free(u);
    ss->phase = 3;
    ss_set(ss, ev);
    return ev ? 0 : -1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_state *ss = cls;
    (void)pos;
    while (ss->poff >= ss->plen) {
        if (ss->phase == 3)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (next_event(ss))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = ss->plen - ss->poff;
    if (n > max)
        n = max;
    memcpy(buf, ss->pend + ss->poff, n);
    ss->poff += n;
    return (ssize_t)n;
}

/* The response is gone (sent, or the connection closed): a stream that did
 * not finish means the client left, so its generation is cancelled. */
static void stream_free(void *cls)
{
    stream_state *ss = cls;
    srv_req_cancel(&ss->srv->sc, ss->r);
    srv_req_release(&ss->srv->sc, ss->r);
    free(ss->pend);
    free(ss);
}

static enum MHD_Result start_stream(conn_state *cs, struct MHD_Connection *conn, srv_req *r)
{
    mx_server *s = cs->srv;
    stream_state *ss = calloc(1, sizeof *ss);
    if (!ss)
        return send_error(cs, conn, 500, NULL, "out of memory");
    ss->srv = s;
    ss->r = r;
    ss->conn = conn;
    mx_tool_parser_init(&ss->tp, r->tool_fmt);
    pthread_mutex_lock(&s->sc.mu);
    r->refs++;
    pthread_mutex_unlock(&s->sc.mu);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, ss, stream_free);
    if (!resp) {
        stream_free(ss);
        return MHD_NO;
    }
    /* the charset named, as OpenAI's API does: clients that decode a text
     * type without one as Latin-1 (Python's requests, the DevTools
     * protocol) would garble the UTF-8 */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    common_headers(s, resp);
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES)
        cs->status = 200;
    return ok;
}

/* ---- generation requests ---- */

/* 1 when the client closed its end (checked while a request waits). */
static int peer_closed(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    char c;
    ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Waits for a non-streamed request; 0 when done, -1 when the client left. */
static int wait_done(mx_server *s, struct MHD_Connection *conn, srv_req *r)
{
    int gone = 0;
    timeout_pause(conn);
    pthread_mutex_lock(&s->sc.mu);
    while (!r->done) {
        struct timespec ts;
        deadline_in(&ts, 200);
        pthread_cond_timedwait(&r->cv, &s->sc.mu, &ts);
        if (r->done)
            break;
        pthread_mutex_unlock(&s->sc.mu);
        gone = peer_closed(conn);
        pthread_mutex_lock(&s->sc.mu);
        if (gone) {
            r->cancelled = 1;
            break;
        }
    }
    pthread_mutex_unlock(&s->sc.mu);
    timeout_resume(s, conn);
    return gone ? -1 : 0;
}

static enum MHD_Result generate(conn_state *cs, struct MHD_Connection *conn, int kind)
{
    mx_server *s = cs->srv;
    srv_reply rep = {0};
    srv_req *r = srv_parse_generation(&s->ctx, kind, cs->body, cs->len, &rep);
    if (!r)
        return send_reply(cs, conn, &rep);
    r->t_submit = mx_now();
    cs->req = r;
    __atomic_add_fetch(&s->n_gen_conns, 1, __ATOMIC_RELAXED);
    if (srv_sched_submit(&s->sc, r))
        return send_error(cs, conn, 503, "server_busy",
                          "the server is busy (all slots and the waiting queue are full); retry later");
    if (r->stream)
        return start_stream(cs, conn, r);
    if (wait_done(s, conn, r))
        return MHD_NO;
    if (r->err_status) {
        srv_error(&rep, r->err_status, r->err_code, "generation failed: %s", r->err);
        return send_reply(cs, conn, &rep);
    }
    srv_completion_json(&s->ctx, r, &rep);
    return send_reply(cs, conn, &rep);
}

/* ---- routing ---- */

/* The {id} of /v1/models/{id} (or /models/{id}), or NULL. */
static const char *model_id_of(const char *url)
{
    const char *p = !strncmp(url, "/v1/models/", 11) ? url + 11
                    : !strncmp(url, "/models/", 8)   ? url + 8
                                                     : NULL;
    return p && *p ? p : NULL;
}

/* The route of a path; *post: whether it takes POST (else GET/HEAD). */
static int route(const char *url, int *post)
{
    static const struct {
        const char *path;
        int id, post;
    } routes[] = {
        {"/health", R_HEALTH, 0},           {"/v1/health", R_HEALTH, 0},
        {"/v1/models", R_MODELS, 0},        {"/models", R_MODELS, 0},
        {"/v1/chat/completions", R_CHAT, 1}, {"/chat/completions", R_CHAT, 1},
        {"/v1/completions", R_COMPLETIONS, 1}, {"/completions", R_COMPLETIONS, 1},
        {"/tokenize", R_TOKENIZE, 1},       {"/detokenize", R_DETOKENIZE, 1},
        {"/apply-template", R_APPLY_TEMPLATE, 1},
        {"/props", R_PROPS, 0},             {"/slots", R_SLOTS, 0},
        {"/metrics", R_METRICS, 0},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            *post = routes[i].post;
            return routes[i].id;
        }
    if (model_id_of(url)) {
        *post = 0;
        return R_MODEL;
    }
    return R_NONE;
}

/* Constant-time comparison of the bearer token with the key. */
static int authorized(const mx_server *s, struct MHD_Connection *conn)
{
    if (!s->o.api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    while (*h == ' ')
        h++;
    size_t n = strlen(h), k = strlen(s->o.api_key);
    unsigned diff = (unsigned)(n ^ k);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)h[i] ^ (unsigned char)s->o.api_key[i % (k ? k : 1)];
    return diff == 0;
}

/* A CORS preflight (OPTIONS): 204 with what browsers may send.  No API
 * key is asked for: browsers never send credentials on a preflight. */
static enum MHD_Result preflight(conn_state *cs, struct MHD_Connection *conn, int post)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    const char *methods = post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, methods);
    common_headers(cs->srv, resp);
    if (cs->srv->o.cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods);
        const char *req_h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                        "Access-Control-Request-Headers");
        /* echo what the browser asks for (the SDKs send their own x-stainless-*
         * headers), else the usual ones */
        char hdrs[512];
        snprintf(hdrs, sizeof hdrs, "%s", req_h && strlen(req_h) < sizeof hdrs ? req_h
                                           : "Authorization, Content-Type");
        for (char *p = hdrs; *p; p++)
            if ((unsigned char)*p < 32 || *p == 127)
                *p = ' ';
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", hdrs);
        MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
    }
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES)
        cs->status = 204;
    return ok;
}

/* Checks made as soon as the headers are in, before reading any body. */
static enum MHD_Result first_call(conn_state *cs, struct MHD_Connection *conn, const char *url,
                                  const char *method)
{
    mx_server *s = cs->srv;
    int post = 0, r = route(url, &post);
    if (r == R_NONE && s->o.webui && srv_webui_find(url))
        r = R_WEBUI;
    cs->route = r;
    if (r == R_NONE)
        return send_error(cs, conn, 404, "not_found", "unknown endpoint");
    if (!strcmp(method, "OPTIONS"))
        return preflight(cs, conn, post);
    int get_like = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (post ? strcmp(method, "POST") != 0 : !get_like)
        return send_error(cs, conn, 405, "method_not_allowed",
                          post ? "this endpoint takes POST" : "this endpoint takes GET (or HEAD)");
    if (r == R_METRICS && !s->o.metrics)
        return send_error(cs, conn, 404, "not_found",
                          "metrics are off: start the server with --metrics");
    /* the page itself holds no secret: it asks for the key (webui.c) */
    if (r != R_HEALTH && r != R_WEBUI && !authorized(s, conn))
        return send_error(cs, conn, 401, "invalid_api_key",
                          "missing or wrong API key (Authorization: Bearer KEY)");
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || end == cl || n > s->o.max_body)
            return send_error(cs, conn, 413, "body_too_large", "the request body is too large");
    }
    return MHD_YES;
}

/* GET /slots: what each slot is doing and how much of its cache is used. */
static enum MHD_Result send_slots(conn_state *cs, struct MHD_Connection *conn)
{
    mx_server *s = cs->srv;
    srv_slot_info *info = calloc((size_t)s->sc.n_slots, sizeof *info);
    if (!info)
        return send_error(cs, conn, 500, NULL, "out of memory");
    int busy, queued;
    srv_sched_snapshot(&s->sc, info, NULL, &busy, &queued);
    srv_reply rep = {0};
    srv_slots_json(&s->ctx, info, s->sc.n_slots, &rep);
    free(info);
    return send_reply(cs, conn, &rep);
}

/* GET /metrics: Prometheus text exposition format (version 0.0.4). */
static enum MHD_Result send_metrics(conn_state *cs, struct MHD_Connection *conn)
{
    mx_server *s = cs->srv;
    int n = s->sc.n_slots, busy, queued;
    srv_slot_info *info = calloc((size_t)n, sizeof *info);
    if (!info)
        return send_error(cs, conn, 500, NULL, "out of memory");
    srv_totals t;
    srv_sched_snapshot(&s->sc, info, &t, &busy, &queued);
    long kv = 0;
    for (int i = 0; i < n; i++)
        kv += info[i].n_cached;
    free(info);
    size_t cap = 8192, len = 0;
    char *b = malloc(cap);
    if (!b)
        return send_error(cs, conn, 500, NULL, "out of memory");
#define M(type, name, help, fmt, ...)                                                          \
    len += (size_t)snprintf(b + len, len < cap ? cap - len : 0,                                \
                            "# HELP mlxcel_" name " " help "\n# TYPE mlxcel_" name " " type "\n" \
                            "mlxcel_" name fmt "\n", __VA_ARGS__)
    M("counter", "requests_total", "Generation requests finished.", " %llu", t.requests);
    M("counter", "prompt_tokens_total", "Prompt tokens prefilled (cache hits excluded).", " %llu",
      t.prompt_tokens);
    M("counter", "prompt_tokens_cached_total", "Prompt tokens found in a slot's KV cache.", " %llu",
      t.cached_tokens);
    M("counter", "tokens_predicted_total", "Tokens generated.", " %llu", t.gen_tokens);
    M("counter", "prompt_seconds_total", "Seconds spent prefilling, summed over requests.", " %.6f",
      t.t_prefill);
    M("counter", "tokens_predicted_seconds_total", "Seconds spent decoding, summed over requests.",
      " %.6f", t.t_decode);
    M("gauge", "prompt_tokens_seconds", "Average prefill throughput (tokens/s).", " %.3f",
      t.t_prefill > 0 ? (double)t.prompt_tokens / t.t_prefill : 0.0);
    M("gauge", "predicted_tokens_seconds", "Average decode throughput per request (tokens/s).",
      " %.3f", t.t_decode > 0 ? (double)t.gen_tokens / t.t_decode : 0.0);
    M("gauge", "requests_processing", "Requests holding a slot.", " %d", busy);
    M("gauge", "requests_deferred", "Requests waiting for a slot.", " %d", queued);
    M("gauge", "slots_total", "Slots (--parallel).", " %d", n);
    M("gauge", "kv_cache_tokens", "Tokens held in the slots' KV caches.", " %ld", kv);
    M("gauge", "kv_cache_usage_ratio", "Used fraction of the slots' KV caches.", " %.6f",
      (double)kv / ((double)n * s->o.n_ctx));
    M("counter", "http_requests_total", "HTTP requests answered, by status class.",
      "{code=\"2xx\"} %lu\nmlxcel_http_requests_total{code=\"4xx\"} %lu\n"
      "mlxcel_http_requests_total{code=\"5xx\"} %lu",
      __atomic_load_n(&s->status[2], __ATOMIC_RELAXED), __atomic_load_n(&s->status[4], __ATOMIC_RELAXED),
      __atomic_load_n(&s->status[5], __ATOMIC_RELAXED));
    M("gauge", "uptime_seconds", "Seconds since the server started.", " %.3f", mx_now() - s->t_start);
#undef M
    if (len >= cap) {
        free(b);
        return send_error(cs, conn, 500, NULL, "metrics buffer too small");
    }
    return send_body(cs, conn, 200, b, "text/plain; version=0.0.4; charset=utf-8");
}

/* GET / and /webui/...: the chat page's files (webui.c). */
static enum MHD_Result send_webui(conn_state *cs, struct MHD_Connection *conn, const char *url)
{
    const srv_webui_file *f = srv_webui_find(url);
    struct MHD_Response *resp = f ? srv_webui_response(f) : NULL;
    if (!resp)
        return send_error(cs, conn, f ? 500 : 404, NULL, f ? "out of memory" : "unknown endpoint");
    common_headers(cs->srv, resp);
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES)
        cs->status = 200;
    return ok;
}

static enum MHD_Result full_request(conn_state *cs, struct MHD_Connection *conn, const char *url)
{
    mx_server *s = cs->srv;
    int post = 0;
    srv_reply rep = {0};
    if (cs->route == R_WEBUI)
        return send_webui(cs, conn, url);
    switch (route(url, &post)) {
    case R_HEALTH: {
        int busy, queued;
        srv_sched_counts(&s->sc, &busy, &queued);
        char *b = malloc(128);
        if (!b)
            return MHD_NO;
        snprintf(b, 128, "{\"status\":\"ok\",\"slots_busy\":%d,\"slots_total\":%d,\"queued\":%d}", busy,
                 s->sc.n_slots, queued);
        return send_body(cs, conn, 200, b, "application/json");
    }
    case R_MODELS:
        srv_models(&s->ctx, &rep);
        return send_reply(cs, conn, &rep);
    case R_MODEL:
        srv_model_get(&s->ctx, model_id_of(url), &rep);
        return send_reply(cs, conn, &rep);
    case R_PROPS:
        srv_props(&s->ctx, &rep);
        return send_reply(cs, conn, &rep);
    case R_SLOTS:
        return send_slots(cs, conn);
    case R_METRICS:
        return send_metrics(cs, conn);
    case R_APPLY_TEMPLATE:
        srv_apply_template(&s->ctx, cs->body, cs->len, &rep);
        return send_reply(cs, conn, &rep);
    case R_CHAT:
        return generate(cs, conn, SRV_CHAT);
    case R_COMPLETIONS:
        return generate(cs, conn, SRV_COMPLETION);
    case R_TOKENIZE:
        srv_tokenize(&s->ctx, cs->body, cs->len, &rep);
        return send_reply(cs, conn, &rep);
    case R_DETOKENIZE:
        srv_detokenize(&s->ctx, cs->body, cs->len, &rep);
        return send_reply(cs, conn, &rep);
    default:
        return send_error(cs, conn, 404, "not_found", "unknown endpoint");
    }
}

/* Log-safe copy: printable ASCII only, bounded. */
static void safe_copy(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++)
        dst[i] = src[i] > 32 && src[i] < 127 ? src[i] : '?';
    dst[i] = 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    mx_server *s = cls;
    conn_state *cs = *con_cls;
    (void)version;
    if (!cs) {
        if (!(cs = calloc(1, sizeof *cs)))
            return MHD_NO;
        cs->srv = s;
        cs->t0 = mx_now();
        safe_copy(cs->method, sizeof cs->method, method);
        safe_copy(cs->path, sizeof cs->path, url);
        *con_cls = cs;
        return first_call(cs, conn, url, method);
    }
    if (cs->status) {
        *upload_size = 0;        /* an early error reply is queued; ignore the body */
        return MHD_YES;
    }
    if (cs->too_large) {
        /* an unannounced (chunked) body passed the limit: read the rest
         * without keeping it, then answer 413; one that goes on and on is
         * dropped */
        cs->discarded += *upload_size;
        if (!*upload_size)
            return send_error(cs, conn, 413, "body_too_large", "the request body is too large");
        *upload_size = 0;
        return cs->discarded > SRV_MAX_DISCARD ? MHD_NO : MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        if (n > s->o.max_body - cs->len) {
            cs->too_large = 1;
            free(cs->body);
            cs->body = NULL;
            cs->len = cs->cap = 0;
            cs->discarded = n;
            *upload_size = 0;
            return MHD_YES;
        }
        if (cs->len + n + 1 > cs->cap) {
            size_t cap = cs->cap ? cs->cap : 4096;
            while (cap < cs->len + n + 1)
                cap *= 2;
            char *p = realloc(cs->body, cap);
            if (!p)
                return MHD_NO;
            cs->body = p;
            cs->cap = cap;
        }
        memcpy(cs->body + cs->len, upload, n);
        cs->len += n;
        cs->body[cs->len] = 0;
        *upload_size = 0;
        return MHD_YES;
    }
    return full_request(cs, conn, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    mx_server *s = cls;
    conn_state *cs = *con_cls;
    (void)conn;
    if (!cs)
        return;
    *con_cls = NULL;
    int n_in = 0, n_out = 0, n_cached = 0;
    const char *finish = "";
    if (cs->req) {
        srv_req *r = cs->req;
        pthread_mutex_lock(&s->sc.mu);
        if (!r->done)
            r->cancelled = 1;
        n_in = r->n_prompt;
        n_out = r->n_gen;
        n_cached = r->n_cached;
        /* not done: cut short, unless it was refused (503) before running */
        finish = r->done ? r->finish : cs->status == 0 || cs->status == 200 ? "cancelled" : "";
        pthread_mutex_unlock(&s->sc.mu);
        /* a stream still running when the connection ends was cut short */
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && cs->status == 200 && r->stream)
            finish = "disconnected";
        if (r->done && r->err_code && !strcmp(r->err_code, "server_shutdown"))
            finish = "shutdown";
    }
    __atomic_add_fetch(&s->status[cs->status >= 100 && cs->status < 600 ? cs->status / 100 : 0], 1,
                       __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->requests[cs->route], 1, __ATOMIC_RELAXED);
    if (!s->o.quiet) {
        char st[8];
        snprintf(st, sizeof st, "%d", cs->status);
        fprintf(stderr, "serve: %s %s %s in=%d (cached %d) out=%d %.3fs%s%s%s\n", cs->method, cs->path,
                cs->status ? st : "-", n_in, n_cached, n_out, mx_now() - cs->t0, *finish ? " [" : "",
                finish, *finish ? "]" : "");
    }
    if (cs->req) {
        srv_req_release(&s->sc, cs->req);
        __atomic_sub_fetch(&s->n_gen_conns, 1, __ATOMIC_RELAXED);
    }
    free(cs->body);
    free(cs);
}

/* ---- start / stop ---- */

static int resolve(const char *host, int port, struct sockaddr_storage *ss, int *v6, mx_err *e)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc || !res)
        return mx_fail(e, MX_EINVAL, "--host %s: %s", host, rc ? gai_strerror(rc) : "no address");
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return MX_OK;
}

static const char *base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t i = n;
    while (i > 0 && path[i - 1] != '/')
        i--;
    static __thread char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(n - i), path + i);
    return buf;
}

int mx_server_start(mx_engine *g, const mx_server_opts *o, mx_server **out, mx_err *e)
{
    *out = NULL;
    if (!g->tok)
        return mx_fail(e, MX_EINVAL, "serve needs a checkpoint with tokenizer.json");
    if (o->n_ctx < 2 || o->parallel < 1 || o->queue < 0 || o->n_predict < 1)
        return mx_fail(e, MX_EINVAL, "serve: bad options (ctx %d, parallel %d, queue %d, n-predict %d)",
                       o->n_ctx, o->parallel, o->queue, o->n_predict);
    mx_server *s = calloc(1, sizeof *s);
    if (!s)
        return mx_fail(e, MX_ENOMEM, "out of memory");
    s->g = g;
    s->o = *o;
    s->t_start = mx_now();
    char *id = strdup(o->model_id ? o->model_id : base_name(g->model->dir ? g->model->dir : "model"));
    if (!id) {
        free(s);
        return mx_fail(e, MX_ENOMEM, "out of memory");
    }
    s->o.model_id = id;
    pthread_mutex_init(&s->gv.mu, NULL);
    /* the format of the template that renders requests with tools */
    const char *tt = mx_chat_template_tool_text(g->tmpl);
    s->ctx = (srv_ctx){.g = g, .o = &s->o, .model_id = id, .gv = &s->gv,
                       .tool_fmt = mx_tool_format_detect(tt ? tt : mx_chat_template_text(g->tmpl))};
    struct sockaddr_storage sa;
    int v6 = 0, rc = resolve(o->host ? o->host : "127.0.0.1", o->port, &sa, &v6, e);
    if (!rc)
        rc = srv_sched_init(&s->sc, g, o->parallel, o->n_ctx, o->queue, o->prefill_chunk, o->batch, e);
    if (rc) {
        free(id);
        free(s);
        return rc;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                     MHD_USE_ITC | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conns,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, 128u,
                            MHD_OPTION_END);
    if (!s->d) {
        srv_sched_free(&s->sc);
        free(id);
        free(s);
        return mx_fail(e, MX_EIO, "cannot listen on %s:%d (in use, or not a local address?)",
                       o->host ? o->host : "127.0.0.1", o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return MX_OK;
}

int mx_server_port(const mx_server *s) { return s->port; }
const char *mx_server_model_id(const mx_server *s) { return s->o.model_id; }

void mx_server_stop(mx_server *s)
{
    if (!s)
        return;
    /* no new connections; running requests end and their waiters answer */
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET)
        close(ls);
    srv_sched_stop(&s->sc);
    /* every generation has ended; give their connections a moment to send
     * the end (a stream's error event and [DONE], a waiter's 503) before
     * the sockets are closed */
    for (int i = 0; i < 300 && __atomic_load_n(&s->n_gen_conns, __ATOMIC_RELAXED) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(s->d);
    srv_sched_free(&s->sc);
    mx_grammar_vocab_free(s->gv.v);
    pthread_mutex_destroy(&s->gv.mu);
    free((char *)s->o.model_id);
    free(s);
}
