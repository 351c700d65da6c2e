/* sample.h - choosing the next token from logits, and stop strings.
 *
 * Order of operations (as llama.cpp / HF do): repetition penalty -> greedy if
 * temp <= 0 -> temperature -> top-k -> top-p -> min-p -> draw with a seeded
 * PRNG.  A given seed and inputs always give the same draw. */
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
    uint64_t seed;
} mx_sample_params;

void mx_sample_defaults(mx_sample_params *p);   /* temp 0.8 top_p 0.95 ... */

typedef struct mx_sampler mx_sampler;
mx_sampler *mx_sampler_new(const mx_sample_params *p, int32_t vocab);
void mx_sampler_free(mx_sampler *s);
/* Picks a token.  logits[vocab] may be modified.  history: ids so far. */
int32_t mx_sampler_sample(mx_sampler *s, float *logits, const int32_t *history, size_t nhist);
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
