/* tok_json.h - a minimal JSON scanner for the huge parts of tokenizer.json
 * (see tok_json.c).  Internal to the tokenizer module. */
#ifndef MX_TOK_JSON_H
#define MX_TOK_JSON_H

#include "tokenizer/tok_internal.h"

const char *tok_json_ws(const char *p, const char *end);
/* Decodes the string at p (which must be '"') appending UTF-8 to out (may be
 * NULL to skip); returns the position after it, or NULL when malformed. */
const char *tok_json_string(const char *p, const char *end, tok_buf *out);
/* Position after the value at p, or NULL when malformed. */
const char *tok_json_skip(const char *p, const char *end);
/* Byte spans [start, end) of the values of model.vocab and model.merges
 * ({0, 0} when absent).  -1 when there is no top-level "model" member. */
int tok_json_model_parts(const char *s, size_t n, size_t vocab[2], size_t merges[2]);

#endif
