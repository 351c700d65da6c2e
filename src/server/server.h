/* server.h - the OpenAI-compatible HTTP server behind `mlxcel serve`.
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models
 * (and /v1/models/{id}), GET /health, POST /tokenize, POST /detokenize,
 * POST /apply-template, GET /props, GET /slots, GET /metrics, and the chat
 * page at GET / (see docs/server.md).
 *
 * Threads: libmicrohttpd runs one thread per connection; those threads parse
 * and validate requests, tokenize, then hand a request to the scheduler and
 * wait on it.  ONE scheduler thread owns the model: each iteration it admits
 * one waiting request into a free slot (a slot = one mx_session whose KV cache
 * is kept for prefix reuse), prefills one chunk of one prompt, then runs a
 * single mx_forward_batch over the next tokens of every decoding request
 * (continuous batching: one pass over the weights serves all of them). */
#ifndef MX_SERVER_H
#define MX_SERVER_H

#include <stddef.h>

#include "gen/gen.h"

typedef struct mx_server_opts {
    const char *host;           /* default "127.0.0.1" */
    int port;                   /* 0: an ephemeral port (see mx_server_port) */
    const char *model_id;       /* name in /v1/models and responses */
    const char *api_key;        /* NULL: no authentication */
    int n_ctx;                  /* context per slot */
    int parallel;               /* slots decoding at once */
    int queue;                  /* requests allowed to wait for a slot */
    int n_predict;              /* max_tokens when a request gives none */
    mx_sample_params sample;    /* defaults for fields a request leaves out */
    size_t max_body;            /* request bodies above this get 413 */
    int timeout_s;              /* idle connection timeout */
    int max_conns;              /* concurrent connections */
    int prefill_chunk;          /* prompt tokens prefilled per scheduler turn */
    int quiet;                  /* no per-request log lines */
    int batch;                  /* decode steps: 0 auto (timed), 1 one call per
                                   sequence, 2 always one mx_forward_batch */
    const char *cors_origin;    /* Access-Control-Allow-Origin value; NULL: no CORS */
    int metrics;                /* serve GET /metrics (Prometheus text) */
    int webui;                  /* serve the chat page at GET / (default on) */
    int lookup;                 /* prompt lookup (gen.h) for a request decoding alone: draft
                                   up to this many tokens (0: off) */
    int lookup_always;          /* draft at every match (no cost model) */
} mx_server_opts;

void mx_server_opts_defaults(mx_server_opts *o);

typedef struct mx_server mx_server;

/* Starts listening and the scheduler.  The engine must outlive the server
 * and is used by it exclusively (the caller runs nothing on it meanwhile). */
int mx_server_start(mx_engine *g, const mx_server_opts *o, mx_server **out, mx_err *e);
/* The port actually bound (useful with port 0). */
int mx_server_port(const mx_server *s);
/* The model id the server reports. */
const char *mx_server_model_id(const mx_server *s);
/* Graceful stop: no new connections, running generations end (streams get
 * their final chunk), the threads are joined, everything is freed. */
void mx_server_stop(mx_server *s);

#endif
