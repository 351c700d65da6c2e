/* srv_int.h - types shared by the server's files: a generation request
 * (srv_req), the scheduler (sched.c), JSON request/response helpers (api.c)
 * and the HTTP glue (http.c). */
#ifndef MX_SRV_INT_H
#define MX_SRV_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gen/gen.h"
#include "server/server.h"
#include "toolcall/toolcall.h"

#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_LEN 512
/* A chunked body over --max-body is read (and dropped) up to this many
 * bytes so that the client gets a 413; past it the connection is closed. */
#define SRV_MAX_DISCARD ((size_t)64 << 20)
/* Deepest nesting of arrays/objects accepted in a request body. */
#define SRV_MAX_JSON_DEPTH 64

#ifdef MLXCEL_VERSION
#define SRV_BUILD_INFO "mlxcel " MLXCEL_VERSION
#else
#define SRV_BUILD_INFO "mlxcel"
#endif

/* n (choices per prompt), prompts per completions request, and choices in
 * all (n x prompts). */
#define SRV_MAX_N 16
#define SRV_MAX_PROMPTS 16
#define SRV_MAX_CHOICES 64
/* logit_bias entries per request */
#define SRV_MAX_BIAS 1024

enum { SRV_CHAT, SRV_COMPLETION };

/* A generated token's log-probabilities, and where its text starts in the
 * choice's text (completions' text_offset). */
typedef struct srv_lp {
    mx_token_logprob lp;
    size_t off;
} srv_lp;

/* One choice of a request: its text and token log-probabilities so far. */
typedef struct srv_choice {
    char *text;
    size_t len, cap;
    srv_lp *lp;
    int n_lp, cap_lp;
    int n_gen;
    const char *finish;          /* set when done */
    int done;
} srv_choice;

/* One generation request.  The HTTP thread fills the input part and submits
 * it; after that, every field below `mu-guarded` is read and written under
 * the scheduler's mutex, and `cv` (with that mutex) signals new text or the
 * end.  Freed when its last reference is dropped (srv_req_release). */
typedef struct srv_req {
    /* input: written before submit, read-only afterwards */
    int kind;                    /* SRV_CHAT or SRV_COMPLETION */
    int stream, include_usage;
    int32_t *prompts[SRV_MAX_PROMPTS];   /* completions may give several */
    int n_prompt_of[SRV_MAX_PROMPTS];
    int n_prompts;
    int n_prompt;                /* prompt tokens of all prompts (usage) */
    int n;                       /* choices per prompt; choice k has prompt k / n */
    int n_choices;               /* n_prompts * n */
    mx_gen_opts gen;             /* choice k samples with seed gen.sample.seed + k */
    int32_t *bias_ids;           /* logit_bias (owned; gen.bias_* point here) */
    struct mx_grammar *grammar;  /* response_format / grammar / forced tool call (owned) */
    mx_tool_format tool_fmt;     /* parse the output's tool calls in this format (NONE: don't) */
    float *bias_vals;
    char *stops[SRV_MAX_STOPS];
    char id[48];                 /* "chatcmpl-..." / "cmpl-..." */
    long created;
    double t_submit;
    /* mu-guarded */
    int refs;
    int cancelled;               /* the client went away: stop generating */
    int done;                    /* finished: every choice, or err is set */
    srv_choice *ch;              /* [n_choices], generated one after another */
    int cur;                     /* the choice being generated */
    int n_gen, n_cached;         /* over all choices */
    int n_prefilled;             /* prompt tokens prefilled (not cached), all choices */
    double t_prefill, t_decode;  /* seconds, summed over the choices (timings) */
    int n_drafted, n_accepted;   /* prompt lookup's draft tokens, all choices (timings) */
    const char *finish;          /* the last choice's: "stop", "length", "cancelled" */
    int err_status;              /* nonzero: the request failed with this HTTP status */
    const char *err_code;        /* its OpenAI error code (NULL: none) */
    char err[256];
    pthread_cond_t cv;
    struct srv_req *next;        /* waiting queue link */
} srv_req;

srv_req *srv_req_new(void);
/* Frees a request nobody else holds (before it was submitted). */
void srv_req_free(srv_req *r);

/* ---- scheduler (sched.c) ---- */

typedef struct srv_slot {
    struct srv_sched *owner;
    mx_session *sess;            /* kept across requests: its cache is reused */
    srv_req *req;                /* NULL when free */
    mx_gen_req *gr;
    int state;                   /* SLOT_FREE, SLOT_PREFILL, SLOT_DECODE */
    int pf_pos;                  /* prompt tokens already in the cache */
    int32_t next;                /* token to feed (SLOT_DECODE) */
    double t_admit;
} srv_slot;

/* What /slots shows of a slot: copied by the scheduler under its mutex at
 * the end of every turn, so HTTP threads read a consistent snapshot. */
typedef struct srv_slot_info {
    int state;
    int n_cached;                /* tokens in the slot's KV cache */
    int n_prompt, n_gen;         /* of the request it runs (0 when free) */
    char req_id[48];
} srv_slot_info;

/* Totals for /metrics, under the scheduler's mutex. */
typedef struct srv_totals {
    unsigned long long requests;       /* generations finished */
    unsigned long long prompt_tokens;  /* prompt tokens prefilled (cache hits excluded) */
    unsigned long long cached_tokens;  /* prompt tokens found in a slot's cache */
    unsigned long long gen_tokens;     /* tokens generated */
    double t_prefill, t_decode;        /* seconds, summed over requests */
} srv_totals;

enum { SLOT_FREE, SLOT_PREFILL, SLOT_DECODE };

typedef struct srv_sched {
    mx_engine *g;
    int n_ctx, prefill_chunk;
    pthread_mutex_t mu;
    pthread_cond_t wake;         /* new work or stop */
    srv_req *qhead, *qtail;      /* FIFO of requests waiting for a slot */
    int n_queued, max_queue;
    srv_slot *slots;
    int n_slots, n_busy;         /* n_busy under mu */
    int stopping;
    int started;
    pthread_t th;
    /* batch buffers, scheduler thread only */
    float *logits;               /* [n_slots, vocab] */
    mx_seq **seqs;
    int32_t *toks;
    int *rows;
    int batch_mode;              /* 0 auto, 1 never batch, 2 always batch */
    double *t_batch;             /* [n_slots + 1]: seconds per batch step of n */
    double t_single;             /* seconds per single-token step */
    long n_decide;
    /* mu-guarded: published for /slots and /metrics */
    srv_slot_info *info;         /* [n_slots] */
    srv_totals totals;
} srv_sched;

int srv_sched_init(srv_sched *sc, mx_engine *g, int n_slots, int n_ctx, int max_queue,
                   int prefill_chunk, int batch_mode, mx_err *e);
/* Queues r (taking a reference for the scheduler).  Returns 0, or -1 when
 * the queue is full or the server is stopping (the caller answers 503). */
int srv_sched_submit(srv_sched *sc, srv_req *r);
/* Drops a reference; the last one frees r. */
void srv_req_release(srv_sched *sc, srv_req *r);
/* Marks r cancelled (the client went away). */
void srv_req_cancel(srv_sched *sc, srv_req *r);
/* Ends every queued and running request and joins the thread (requests
 * submitted afterwards are refused). */
void srv_sched_stop(srv_sched *sc);
/* Stops if needed, then frees the slots; no thread may use sc afterwards. */
void srv_sched_free(srv_sched *sc);
/* Snapshot for /health. */
void srv_sched_counts(srv_sched *sc, int *busy, int *queued);
/* Snapshot for /slots and /metrics: info[n_slots] and the totals. */
void srv_sched_snapshot(srv_sched *sc, srv_slot_info *info, srv_totals *tot, int *busy,
                        int *queued);

/* ---- JSON requests and responses (api.c) ---- */

/* The vocabulary's byte strings for constrained decoding, built at the
 * first request that needs them and kept. */
typedef struct srv_vocab {
    pthread_mutex_t mu;
    struct mx_grammar_vocab *v;
} srv_vocab;

typedef struct srv_ctx {
    mx_engine *g;
    const mx_server_opts *o;
    const char *model_id;
    srv_vocab *gv;
    mx_tool_format tool_fmt;     /* the chat template's tool-call format */
} srv_ctx;


/* An HTTP answer built by api.c: status and a malloc'ed JSON body. */
typedef struct srv_reply {
    int status;
    char *body;
} srv_reply;

/* The grammar vocabulary (built on first use); NULL with rep set. */
struct mx_grammar_vocab *srv_grammar_vocab(const srv_ctx *c, srv_reply *rep);

/* Fills rep with an OpenAI-style error {"error": {message, type, code}}. */
void srv_error(srv_reply *rep, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Parses and validates a completion request body into a new srv_req.
 * Returns it, or NULL with rep set to a 4xx/5xx error. */
srv_req *srv_parse_generation(const srv_ctx *c, int kind, const char *body, size_t len,
                              srv_reply *rep);
/* The non-streamed response of a finished request. */
void srv_completion_json(const srv_ctx *c, const srv_req *r, srv_reply *rep);
/* One SSE event "data: {...}\n\n" (malloc'ed) for choice k: text (may be
 * NULL) as the delta, the log-probabilities lp[n_lp] of its tokens, and
 * finish (or NULL); role_chunk for the first chat chunk of a choice. */
char *srv_chunk_sse(const srv_ctx *c, const srv_req *r, int k, const char *text, size_t len,
                    const srv_lp *lp, int n_lp, const char *finish, int role_chunk);
/* Tool calls completed in a stream: for each call[i] (the index-th of
 * choice k, index = first + i), a chunk with its id, type and name, and one
 * with its arguments (as OpenAI streams them: clients append the
 * arguments' pieces).  Ids the model did not give are made here. */
char *srv_tool_calls_sse(const srv_ctx *c, const srv_req *r, int k, const mx_tool_call *calls, int n,
                         int first);
/* A choice's finish_reason: "tool_calls" when it made calls and ended by
 * itself, else its own. */
const char *srv_finish_reason(const srv_req *r, const srv_choice *ch, int n_calls);
/* The usage-only chunk (stream_options.include_usage). */
char *srv_usage_sse(const srv_ctx *c, const srv_req *r, int n_gen);
/* An error event: {"error": {message, type, code}} (code may be NULL). */
char *srv_error_sse(const char *msg, const char *code);

void srv_models(const srv_ctx *c, srv_reply *rep);
/* GET /v1/models/{id}: the model, or 404. */
void srv_model_get(const srv_ctx *c, const char *id, srv_reply *rep);
/* GET /slots: info[n] as JSON. */
void srv_slots_json(const srv_ctx *c, const srv_slot_info *info, int n, srv_reply *rep);
/* GET /props (llama-server's): model, context, slots, template, defaults. */
void srv_props(const srv_ctx *c, srv_reply *rep);
/* POST /apply-template: {"messages", "tools"?, ...} -> {"prompt": text}. */
void srv_apply_template(const srv_ctx *c, const char *body, size_t len, srv_reply *rep);
void srv_tokenize(const srv_ctx *c, const char *body, size_t len, srv_reply *rep);
void srv_detokenize(const srv_ctx *c, const char *body, size_t len, srv_reply *rep);

/* ---- the chat page (webui.c) ---- */

/* A file of webui/, embedded by scripts/embed_webui.cmake. */
typedef struct srv_webui_file {
    const char *url;             /* "/" for index.html, else "/webui/<path>" */
    const char *type;            /* Content-Type */
    const unsigned char *data;
    size_t len;
} srv_webui_file;

extern const srv_webui_file srv_webui_files[];
extern const int srv_webui_n_files;

/* The embedded file served at url (a path without its query), or NULL. */
const srv_webui_file *srv_webui_find(const char *url);
/* A response with f's bytes and the page's headers (Content-Type,
 * Content-Security-Policy, ...); NULL when out of memory. */
struct MHD_Response *srv_webui_response(const srv_webui_file *f);

#endif
