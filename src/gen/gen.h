/* gen.h - text generation on top of the model: an engine (model + tokenizer
 * + chat template + EOS ids) and sessions (a sequence plus the ids already in
 * its KV cache), shared by the CLI, the chat REPL, the server and bench.
 *
 * mx_generate() reuses the longest prefix of the new prompt that is already
 * in the session's cache, prefills the rest, then samples, streams text
 * through the stream-safe detokenizer and the stop-string filter, and stops
 * at EOS, a stop string, max_tokens or a full context. */
#ifndef MX_GEN_H
#define MX_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "chat/template.h"
#include "model/model.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

#define MX_MAX_EOS_IDS 16

typedef struct mx_engine {
    mx_model *model;
    mx_tokenizer *tok;           /* NULL when the checkpoint has none */
    mx_chat_template *tmpl;      /* NULL when there is no tokenizer */
    int32_t eos[MX_MAX_EOS_IDS];
    int n_eos;
} mx_engine;

enum { MX_TOKENIZER_NONE, MX_TOKENIZER_OPTIONAL, MX_TOKENIZER_REQUIRED };

/* Loads the model, and the tokenizer + chat template per `tokenizer`.
 * EOS ids come from config.json, generation_config.json and the template's
 * eos_token. */
int mx_engine_load(const char *dir, int tokenizer, mx_engine **out, mx_err *e);
void mx_engine_free(mx_engine *g);
int mx_engine_is_eos(const mx_engine *g, int32_t id);

/* Text -> ids (special tokens in the text are recognised). */
int mx_engine_encode(const mx_engine *g, const char *text, int32_t **ids, int *n, mx_err *e);
/* Messages -> template -> ids.  The rendered text goes to *rendered when
 * that is not NULL (caller frees). */
int mx_engine_encode_chat(const mx_engine *g, const mx_chat_msg *msgs, size_t n_msgs,
                          int32_t **ids, int *n, char **rendered, mx_err *e);

/* Memory for n_seqs sequences of n_ctx tokens: the checkpoint's bytes
 * (mmap'ed, paged in from disk as they are used), the KV caches (filled as
 * positions are used, so a fresh sequence does not show them yet) with the
 * recurrent state of such layers and the ids each session keeps, and scratch (estimated: the logits of every
 * sequence and the activations of one prompt chunk). */
typedef struct mx_mem_need {
    uint64_t weights, kv, scratch;
} mx_mem_need;
mx_mem_need mx_engine_memory_need(const mx_engine *g, int n_ctx, int n_seqs);

/* Says up front whether n_seqs x n_ctx fits the memory this process can
 * still take (mx_mem_available: MemAvailable, the cgroup's limit, or
 * MLXCEL_MEM_AVAILABLE):
 *  - KV + scratch do not fit: MX_ENOMEM, the message giving needed and
 *    available bytes (rather than the OOM killer halfway through a reply);
 *  - they fit but not with the weights too: 0, with a warning on stderr
 *    (once per process) that the weights will be paged from disk (mmap),
 *    which is how a model bigger than RAM runs, slowly;
 *  - everything fits (or nothing is known about the machine): 0.
 * mx_session_new checks one sequence; the server checks all its slots. */
int mx_engine_check_memory(const mx_engine *g, int n_ctx, int n_seqs, mx_err *e);

typedef struct mx_session {
    mx_seq *seq;
    int32_t *ids;                /* tokens whose K/V are in seq (seq->pos of them) */
    int cap;
} mx_session;

int mx_session_new(const mx_engine *g, int n_ctx, mx_session **out, mx_err *e);
void mx_session_free(mx_session *s);
void mx_session_reset(mx_session *s);

#define MX_MAX_TOP_LOGPROBS 20

typedef struct mx_gen_opts {
    int max_tokens;
    mx_sample_params sample;
    const char *const *stops;
    size_t n_stops;
    int ignore_eos;
    int keep_special;            /* print special tokens in the text */
    const char *dump_logits;     /* write the prompt's last logits here (raw f32) */
    int logprobs;                /* compute mx_gen_req_logprob for every token */
    int top_logprobs;            /* with it, that many alternatives (<= MX_MAX_TOP_LOGPROBS) */
    const int32_t *bias_ids;     /* logit_bias: n_bias ids and their additive biases */
    const float *bias_vals;
    size_t n_bias;
    struct mx_grammar *grammar;  /* constrain the output to this grammar (NULL: free) */
    struct mx_grammar_vocab *grammar_vocab;  /* the vocabulary's byte strings for it */
    int lookup;                  /* prompt lookup: draft up to this many tokens (0: off; see below) */
    int lookup_always;           /* draft at every match instead of when the cost model says it pays */
} mx_gen_opts;

/* The log-probabilities of a generated token: log-softmax of the model's
 * logits (before biases, penalties, temperature or a grammar's mask), and
 * the top alternatives, most likely first (ties: lower id). */
typedef struct mx_token_logprob {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[MX_MAX_TOP_LOGPROBS];
    float top_logprob[MX_MAX_TOP_LOGPROBS];
} mx_token_logprob;

typedef struct mx_gen_stats {
    int n_prompt;                /* prompt tokens */
    int n_cached;                /* of which were already in the cache */
    int n_gen;                   /* tokens generated */
    double t_prefill, t_decode;  /* seconds */
    double t_first;              /* time to first token (from the call) */
    const char *finish;          /* "stop" (EOS or stop string) or "length" */
    int n_drafted, n_accepted;   /* prompt lookup: tokens drafted, and of them accepted */
    int n_verify;                /* forward calls that verified a draft */
} mx_gen_stats;

/* Called for every generated token with the text it completes (may be empty,
 * NULL without a tokenizer); a final call with id -1 carries text held back
 * until the end.  Return nonzero to cancel (finish = "cancelled"). */
typedef int (*mx_gen_cb)(void *ud, int32_t id, const char *text, size_t len);

int mx_generate(mx_engine *g, mx_session *s, const int32_t *prompt, int n_prompt,
                const mx_gen_opts *o, mx_gen_cb cb, void *ud, mx_gen_stats *st, mx_err *e);

/* n greedy steps of sequence s from token `first` (fed at s->pos): ids[i]
 * is mx_argmax of the logits after feeding `first` (i = 0) or ids[i - 1];
 * s->pos advances by n (after an error: by the steps the CPU completed,
 * or not at all on a GPU, whose cache past s->pos is then overwritten).  A device that can (CUDA: the argmax on the GPU,
 * the steps launched back to back) runs them without a round trip to the
 * host per token; otherwise one mx_forward and mx_argmax a step.  No
 * sampling, penalties, grammar or stops: `bench`'s decode. */
int mx_decode_greedy(mx_model *m, mx_seq *s, int32_t first, int n, int32_t *ids, mx_err *e);

/* The same generation, one step at a time, for callers that interleave
 * several requests (the server batches the decode steps of all active
 * requests into one mx_forward_batch):
 *
 *   mx_gen_req_new(...)                 validates, sets up sampler/stops/stream
 *   mx_gen_req_prefill(r)               runs the uncached part of the prompt
 *   while (!mx_gen_req_step(r, &next))  samples from mx_gen_req_logits(r),
 *       <forward `next` on mx_gen_req_session(r)->seq, logits into
 *        mx_gen_req_logits(r), then mx_gen_req_fed(r, next)>
 *   mx_gen_req_free(r)
 *
 * mx_gen_req_step returns 1 when finished (stats say why), 0 when `next`
 * must be fed, or an error code < 0 ... see gen.c.  The callback is called
 * from mx_gen_req_step. */
typedef struct mx_gen_req mx_gen_req;
int mx_gen_req_new(mx_engine *g, mx_session *s, const int32_t *prompt, int n_prompt,
                   const mx_gen_opts *o, mx_gen_cb cb, void *ud, mx_gen_req **out, mx_err *e);
int mx_gen_req_prefill(mx_gen_req *r, mx_err *e);
/* Samples the next token from the current logits and emits its text.
 * Returns 1 when the request is finished, 0 when *next must be fed through
 * the model, or a negative value on error (e filled). */
int mx_gen_req_step(mx_gen_req *r, int32_t *next, mx_err *e);
/* Records that `id` was fed (its K/V are now in the session's cache). */
void mx_gen_req_fed(mx_gen_req *r, int32_t id);
float *mx_gen_req_logits(mx_gen_req *r);           /* [vocab] */
mx_session *mx_gen_req_session(mx_gen_req *r);
const mx_gen_stats *mx_gen_req_stats(const mx_gen_req *r);
/* Feeds `next` (the token the last step returned) and samples the one after
 * it, as mx_gen_req_step does; returns the same values.  With opts.lookup
 * it drafts tokens by prompt lookup and verifies them in the same forward
 * call, so one call may emit several tokens (the callback runs for each). */
int mx_gen_req_decode(mx_gen_req *r, int32_t next, int32_t *out, mx_err *e);
/* The verification itself, with the caller's draft (tests): feeds `next`
 * and draft[0..k) in one forward call (k <= MX_LOOKUP_MAX), samples from
 * each position's logits in turn while the samples equal the draft, keeps
 * what was accepted in the cache and drops the rest.  A model with a
 * recurrent state cannot drop tokens: k > 0 is an error there. */
int mx_gen_req_verify(mx_gen_req *r, int32_t next, const int32_t *draft, int k, int32_t *out,
                      mx_err *e);
/* With opts.logprobs: the log-probabilities of the token the callback is
 * being called for (valid during the callback; NULL otherwise). */
const mx_token_logprob *mx_gen_req_logprob(const mx_gen_req *r);
void mx_gen_req_free(mx_gen_req *r);

/* ---- prompt lookup: speculative decoding without a draft model ----------
 *
 * Text often repeats what the context already holds (a passage quoted or
 * rewritten, code edited, a loop of a small model).  Before feeding the
 * next token, the longest suffix n-gram of the context that occurred
 * earlier gives a draft: the tokens that followed it.  The next token and
 * the draft go through the model in one forward call (for a memory-bound
 * model hardly dearer than one token), and the samples taken from each
 * position's logits in turn are kept while they equal the draft: each one
 * kept is a token generated without a forward call of its own.
 *
 * The output is exactly that of plain decoding, greedy or sampled: a
 * forward call of up to MX_BATCH_SMALL tokens computes each token's logits
 * with the same arithmetic as a one-token step (the same bits:
 * tests/test_lookup.c checks it on every fixture), the sampler draws once
 * per emitted token in the same order, and the cache keeps only what was
 * accepted (mx_seq_rewind).  Models with a recurrent state (Qwen3-Next,
 * LFM2) cannot drop tokens from it: lookup is off for them, and on a
 * backend device (src/cuda), whose calls of several tokens run other
 * kernels than one-token steps.
 *
 * When to draft is a cost model (mx_lookup_choose): the measured time of a
 * forward call of T tokens against the acceptance rate seen so far for
 * matches of that length, so text that does not repeat costs (almost)
 * nothing. */
#define MX_LOOKUP_MAX (MX_BATCH_SMALL - 1)   /* drafted tokens per call: next + draft <= 16 */
#define MX_LOOKUP_NGRAM 4                    /* the longest suffix n-gram looked up */

/* Up to max_draft tokens following the most recent earlier occurrence of
 * the longest suffix n-gram (1..max_ngram tokens) of ctx[0..n); a
 * continuation that reaches the end of ctx goes on from the draft itself
 * (a repeating cycle drafts its next turns).  Returns how many were
 * drafted (0 when the last token never occurred before) and the n-gram's
 * length in *match. */
int mx_lookup_draft(const int32_t *ctx, int n, int max_ngram, int max_draft, int32_t *draft,
                    int *match);

/* The cost model: forward times by number of tokens, and per match length
 * and draft position how often a drafted token was accepted once the ones
 * before it were (in a repeating stretch the first is the uncertain one and
 * the rest follow: one rate for all positions would undervalue long drafts). */
typedef struct mx_lookup {
    int max_draft;
    int always;                             /* no cost model: every match drafts max_draft */
    double t_fwd[MX_LOOKUP_MAX + 2];        /* [T] seconds of a forward call of T tokens (0: unknown) */
    int n_fwd[MX_LOOKUP_MAX + 2];           /* [T] calls timed */
    double hit[MX_LOOKUP_NGRAM + 1][MX_LOOKUP_MAX];    /* [match][i] draft[i] accepted, decaying */
    double tried[MX_LOOKUP_NGRAM + 1][MX_LOOKUP_MAX];  /* [match][i] draft[i] compared, decaying */
    int idle;                               /* matches passed over since the last draft */
    int probe_every;                        /* passed over before a one-token probe */
} mx_lookup;

void mx_lookup_init(mx_lookup *lk, int max_draft, int always);
/* How many of `avail` drafted tokens (an n-gram match of length `match`)
 * to verify: the k that maximises the expected tokens per second,
 * (1 + p0 + p0 p1 + ... + p0..p(k-1)) / time(k + 1), with pi the rate at
 * which draft[i] is accepted after draft[0..i); 0: a plain step.  After 64
 * matches passed over in a row one token is drafted, so a rate or a time
 * that was bad can recover; while drafting does not pay, the interval
 * doubles with each such probe (up to 1024). */
int mx_lookup_choose(mx_lookup *lk, int match, int avail);
/* A forward call of T tokens took `seconds`; of its drafted tokens (a
 * match of length `match`), `checked` were compared with a sample and the
 * first `accepted` of them were equal (a rejection ends the comparison). */
void mx_lookup_record(mx_lookup *lk, int T, double seconds, int match, int checked, int accepted);

#endif
