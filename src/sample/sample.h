/* sample.h - choosing the next token from logits, and stop strings.
 *
 * Order of operations (as llama.cpp / HF do): logit biases -> the filter
 * hook (a grammar's mask) -> repetition penalty -> frequency/presence
 * penalties -> greedy if temp <= 0 -> temperature -> top-k -> top-p -> min-p
 * -> draw with a seeded PRNG.  A given seed and inputs always give the same
 * draw. */
#ifndef MX_SAMPLE_H
#define MX_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct mx_sample_params {
    float temperature;      /* <= 0: greedy */
    int top_k;              /* <= 0: off */
    float top_p;            /* >= 1: off */
    float min_p;            /* <= 0: off */
    float repeat_penalty;   /* 1: off */
    int repeat_last_n;      /* window of history the penalty looks at */
    float frequency_penalty;/* 0: off; OpenAI's: logit -= f * count(token), */
    float presence_penalty; /* 0: off;   -= p * (count > 0), counted over the
                               tokens accepted (mx_sampler_accept) */
    uint64_t seed;
} mx_sample_params;

void mx_sample_defaults(mx_sample_params *p);   /* temp 0.8 top_p 0.95 ... */

typedef struct mx_sampler mx_sampler;
mx_sampler *mx_sampler_new(const mx_sample_params *p, int32_t vocab);
void mx_sampler_free(mx_sampler *s);
/* Picks a token.  logits[vocab] may be modified.  history: ids so far
 * (for the repetition penalty).  Returns -1 when the filter allowed no
 * token. */
int32_t mx_sampler_sample(mx_sampler *s, float *logits, const int32_t *history, size_t nhist);

/* Additive biases for some tokens (OpenAI's logit_bias; -100 in practice
 * bans a token): copied.  Ids outside the vocabulary are ignored.  Returns
 * 0, or -1 when out of memory. */
int mx_sampler_set_bias(mx_sampler *s, const int32_t *ids, const float *bias, size_t n);

/* A hook run on the logits after the biases, before the penalties: it sets
 * the tokens it rules out to -INFINITY (a grammar's mask) and returns how
 * many remain allowed (0: none, the sample is then -1). */
typedef size_t (*mx_sample_filter_fn)(void *ud, float *logits, int32_t vocab);
void mx_sampler_set_filter(mx_sampler *s, mx_sample_filter_fn fn, void *ud);

/* Records a generated token for the frequency and presence penalties. */
void mx_sampler_accept(mx_sampler *s, int32_t id);
/* Greedy argmax (lowest id wins ties). */
int32_t mx_argmax(const float *logits, int32_t n);

/* Candidate set after the filters, for tests: writes ids allowed with
 * probability > 0 (sorted by id) and returns their count. */
size_t mx_sampler_candidates(mx_sampler *s, float *logits, const int32_t *history,
                             size_t nhist, int32_t *ids_out);

/* Stop strings over streamed text: text is held back while it could still be
 * the start of a stop string, so a partial stop never leaks. */
typedef struct mx_stopper mx_stopper;
mx_stopper *mx_stopper_new(const char *const *stops, size_t n);
void mx_stopper_free(mx_stopper *s);
/* Feeds new text; appends what is safe to emit to *out (malloc'ed, caller
 * frees).  Returns 1 when a stop string matched (the stop string and what
 * follows are dropped), else 0. */
int mx_stopper_feed(mx_stopper *s, const char *text, size_t len, char **out, size_t *outlen);
/* End of generation without a stop: the held-back text. */
void mx_stopper_flush(mx_stopper *s, char **out, size_t *outlen);

#endif
