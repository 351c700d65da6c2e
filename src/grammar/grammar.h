/* grammar.h - constrained decoding: a grammar (llama.cpp's GBNF notation,
 * or compiled from a JSON Schema) that the sampled text must follow.
 *
 * A grammar is a set of rules; matching keeps the set of parse stacks that
 * are still possible after the bytes so far (a pushdown automaton, run
 * nondeterministically).  For sampling, mx_grammar_mask() rules out every
 * token whose bytes cannot continue the text: the vocabulary's byte strings
 * are precomputed once into a trie (mx_grammar_vocab), walked against the
 * stacks so a shared prefix is matched once, and the resulting masks are
 * cached per parser state (inside a JSON string the state repeats).  Tokens
 * may span grammar boundaries and hold part of a UTF-8 character: matching
 * is per byte, with the partial character carried in the state. */
#ifndef MX_GRAMMAR_H
#define MX_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

struct cJSON;

typedef struct mx_grammar mx_grammar;

/* Parses GBNF text: `name ::= alternatives` rules, "literals" (escapes \n
 * \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), [character classes] with ranges and
 * ^negation, `.` (any character), ( groups ), | alternatives, the postfix
 * repetitions * + ? {m} {m,} {m,n}, and # comments.  The start rule is
 * `root`.  Errors name the line and what is wrong (an undefined rule, a
 * left-recursive rule, ...). */
int mx_grammar_parse(const char *text, size_t len, mx_grammar **out, mx_err *e);
void mx_grammar_free(mx_grammar *g);

/* GBNF for a JSON Schema (the subset in docs/server.md: type, properties,
 * required, additionalProperties false, items, prefixItems, minItems,
 * maxItems, enum, const, anyOf/oneOf, $ref into $defs/definitions,
 * minLength/maxLength, minimum/maximum are not enforced but accepted with
 * integers, string formats date, time, date-time, uuid).  A keyword outside
 * the subset is an error naming it (code MX_EINVAL).  *gbnf is malloc'ed. */
int mx_grammar_from_schema(const struct cJSON *schema, char **gbnf, mx_err *e);
/* Several schemas in one grammar: the GBNF text `rules` (it defines root
 * and may refer to the names; NULL for none), then `names[i] ::= <the
 * grammar of schemas[i]>` for each i, then the JSON primitives (ws,
 * json-string, json-value, ...).  Names must be GBNF rule names that
 * differ from the compiler's own (r<N>, json-*, ws).  Errors as
 * mx_grammar_from_schema's; *gbnf is malloc'ed. */
int mx_grammar_from_schemas(const char *rules, int n, const struct cJSON *const *schemas,
                            const char *const *names, char **gbnf, mx_err *e);
/* GBNF of any JSON object (response_format json_object). */
const char *mx_grammar_json_object_gbnf(void);

/* The vocabulary as byte strings, built once per tokenizer.  token_bytes
 * returns a token's bytes (as mx_tok_token_bytes does), or -1 for a token
 * the grammar may never produce (special tokens, padding ids).  The eos ids
 * are allowed exactly when the grammar is complete. */
typedef struct mx_grammar_vocab mx_grammar_vocab;
typedef int (*mx_token_bytes_fn)(void *ud, int32_t id, char *buf, size_t cap);
int mx_grammar_vocab_new(int32_t n_vocab, mx_token_bytes_fn token_bytes, void *ud,
                         const int32_t *eos, int n_eos, mx_grammar_vocab **out, mx_err *e);
void mx_grammar_vocab_free(mx_grammar_vocab *v);

/* A parse in progress over one output. */
typedef struct mx_grammar_state mx_grammar_state;
int mx_grammar_state_new(const mx_grammar *g, const mx_grammar_vocab *v, mx_grammar_state **out,
                         mx_err *e);
void mx_grammar_state_free(mx_grammar_state *s);
/* Sets logits[id] = -INFINITY for every token that cannot come next;
 * returns how many tokens remain allowed (eos included). */
size_t mx_grammar_mask(mx_grammar_state *s, float *logits, int32_t n_vocab);
/* Advances over token id (an eos id only when complete).  Returns 0, or -1
 * when the grammar does not allow it (the state is then unchanged). */
int mx_grammar_accept_token(mx_grammar_state *s, int32_t id);
/* Advances over bytes; 0, or -1 when not allowed (state unchanged). */
int mx_grammar_accept_bytes(mx_grammar_state *s, const char *b, size_t n);
/* 1 when the text so far is a complete sentence of the grammar. */
int mx_grammar_complete(const mx_grammar_state *s);
/* 1 when it is complete and nothing may follow (generation can stop). */
int mx_grammar_finished(const mx_grammar_state *s);

#endif
